// Helpers shared by the link pages (app.js, link.js) and the dashboard (dashboard.js).

export const $ = (id) => document.getElementById(id)
export const setText = (id, value) => {
  $(id).textContent = value
}
export const setState = (state) => {
  document.body.dataset.state = state
}

/** Upload PATCHes of this many bytes: each ends in a server checkpoint. Uppy's tus plugin sends
 * each as a slice of the File (the browser streams it from disk: no copy in memory). 64 MiB
 * rather than 16: fewer requests and checkpoints per file (issue 24; benches/RESULTS.md). */
export const CHUNK_SIZE = 64 * 1024 * 1024
/** The local file is hashed in slices of this many bytes. */
export const HASH_SLICE = 8 * 1024 * 1024

/** `n` bytes in the largest binary unit it reaches: `[value, unit]`, unit `B` below 1 KiB. */
function scaled(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
  let v = n
  let i = 0
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024
    i += 1
  }
  return [v, units[i]]
}

/** `512 bytes`, `1 byte`, `1.50 MiB (1,572,864 bytes)`: a size with its exact count. */
export function formatBytes(n) {
  if (n == null) return 'not known yet'
  const exact = `${n.toLocaleString('en-US')} ${n === 1 ? 'byte' : 'bytes'}`
  const [v, unit] = scaled(n)
  return unit === 'B' ? exact : `${v.toFixed(v < 10 ? 2 : 1)} ${unit} (${exact})`
}

/** `812 B`, `3.4 MiB`: a size or a rate for a status line (never a fraction of a byte). */
export function shortBytes(n) {
  const [v, unit] = scaled(n)
  return unit === 'B' ? `${Math.round(n)} B` : `${v.toFixed(1)} ${unit}`
}

const WHEN = new Intl.DateTimeFormat(undefined, { dateStyle: 'full', timeStyle: 'short' })
const RELATIVE = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto' })

/** `Tuesday, December 8, 2026 at 1:40 AM (in 3 hours)`: a Unix time in ms as this browser's
 * locale writes it, in local time, with how far it is from now; `no limit` for none. */
export function formatTime(ms) {
  if (ms == null) return 'no limit'
  const secs = Math.round((ms - Date.now()) / 1000)
  const abs = Math.abs(secs)
  const [n, unit] = abs < 60 ? [secs, 'second'] : abs < 3600 ? [secs / 60, 'minute'] : abs < 2 * 86400 ? [secs / 3600, 'hour'] : [secs / 86400, 'day']
  return `${WHEN.format(new Date(ms))} (${RELATIVE.format(Math.round(n), unit)})`
}

/** A file's name as people may see it: the server's `display_name` (control and bidi
 * characters replaced by U+FFFD), else its id. */
export function shown(f) {
  return f.display_name || f.name || f.id
}

