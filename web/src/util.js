// Helpers shared by the link pages (app.js) and the dashboard (dashboard.js).

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

export function formatBytes(n) {
  if (n == null) return 'not known yet'
  const units = ['bytes', 'KiB', 'MiB', 'GiB', 'TiB']
  let v = n
  let i = 0
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024
    i += 1
  }
  const exact = `${n.toLocaleString('en-US')} bytes`
  return i === 0 ? exact : `${v.toFixed(v < 10 ? 2 : 1)} ${units[i]} (${exact})`
}

