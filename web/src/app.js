// ferry's pages for people (issue 16): the request-a-file page (a signed upload link) and the
// download page (a signed download link). The HTML is the same for both and carries no data;
// this script reads the link's id and signature from its own URL, asks the server what the
// link is for (GET /share/{id}/info?…), and fills the page with textContent only — never
// innerHTML — so names and metadata always render as text.
import Uppy from '@uppy/core'
import Tus from '@uppy/tus'
import { $, setText, setState, formatBytes, shortBytes, formatTime, shown, CHUNK_SIZE } from './util.js'
import { recall, startHashing, keeper } from './resume.js'
import { dashboard } from './dashboard.js'

function show(section) {
  for (const s of ['problem', 'upload', 'download']) $(s).hidden = s !== section
  setText('status', '')
}

function problem(title, detail) {
  show('problem')
  setText('problem-title', title)
  setText('problem-detail', detail)
  setState('error')
}

/** The link's parts: `/share/{id}?scope=…&expires=…&sig=…`. */
function link() {
  const parts = location.pathname.split('/')
  return { id: decodeURIComponent(parts[2] || ''), query: location.search }
}

async function fetchInfo({ id, query }) {
  let res
  try {
    res = await fetch(`/share/${encodeURIComponent(id)}/info${query}`, { cache: 'no-store' })
  } catch (e) {
    return { error: ['The server cannot be reached', 'Check your connection and reload this page.'] }
  }
  if (res.ok) return { info: await res.json() }
  let detail = ''
  try {
    detail = (await res.json()).detail || ''
  } catch (_) {}
  switch (res.status) {
    case 410:
      return { error: ['This link has expired', 'Ask the person who sent it for a new link.'] }
    case 403:
      return { error: ['This link is not valid', 'It was changed or cut short. Copy the whole link again, or ask for a new one.'] }
    case 404:
      return { error: ['This file is not here any more', 'It was deleted, or it expired unfinished. Ask for a new link.'] }
    default:
      return { error: [`The server answered ${res.status}`, detail || 'Try again in a moment.'] }
  }
}

/** Media types people know by another name, and the words for them. */
const KINDS = {
  'application/zip': 'ZIP archive',
  'application/x-tar': 'tar archive',
  'application/gzip': 'gzip-compressed file',
  'application/zstd': 'zstd-compressed file',
  'application/x-7z-compressed': '7-Zip archive',
  'application/pdf': 'PDF document',
  'application/json': 'JSON file',
  'application/octet-stream': 'binary file',
  'application/x-iso9660-image': 'disk image (ISO)',
  'application/msword': 'Word document',
  'application/vnd.openxmlformats-officedocument.wordprocessingml.document': 'Word document',
  'application/vnd.openxmlformats-officedocument.spreadsheetml.sheet': 'Excel spreadsheet',
  'text/plain': 'text file',
  'text/csv': 'CSV table',
}

/** `ZIP archive (application/zip)`; `image/png` → `PNG image (image/png)`; else the type. */
function kindOf(type) {
  if (!type) return 'not known'
  const bare = type.split(';')[0].trim().toLowerCase()
  let kind = KINDS[bare]
  const [top, sub] = bare.split('/')
  if (!kind && ['image', 'video', 'audio'].includes(top) && /^[a-z0-9.+-]+$/.test(sub || '')) kind = `${sub.replace(/^x-/, '').toUpperCase()} ${top}`
  return kind ? `${kind} (${type})` : type
}

function downloadPage(l, info) {
  const f = info.file
  show('download')
  setText('dl-name', shown(f))
  setText('dl-size', formatBytes(f.size))
  setText('dl-type', kindOf(f.media_type))
  setText('dl-sha', f.sha256 || 'not complete yet')
  setText('dl-expires', formatTime(info.expires_at_ms))
  const button = $('dl-button')
  if (!f.complete) {
    button.hidden = true
    setText('status', 'This file is still being uploaded; reload the page later.')
    setState('incomplete')
    return
  }
  const params = new URLSearchParams(l.query)
  params.set('download', '1')
  button.href = `/files/${encodeURIComponent(l.id)}?${params}`
  if (f.name) button.download = shown(f)
  setState('ready')
}

function uploadPage(l, info) {
  const f = info.file
  show('upload')
  setText('up-name', f.name ? shown(f) : 'any name')
  setText('up-size', f.size == null ? 'any size' : formatBytes(f.size))
  received(f.offset, f.size)
  setText('up-expires', formatTime(info.expires_at_ms))
  if (f.complete) {
    $('drop').hidden = true
    $('result').hidden = false
    setText('verdict', 'This upload is complete.')
    // This browser did not send it (or does not remember doing so): only the server's hash.
    $('sha-local-label').hidden = true
    $('sha-local').hidden = true
    setText('sha-server', f.sha256 || '')
    setState('complete')
    return
  }
  if (f.offset > 0) setText('drop-text', 'Part of the file is here already: choose the same file again to continue where it stopped.')
  const pick = $('pick')
  const drop = $('drop')
  drop.addEventListener('dragover', (e) => {
    e.preventDefault()
    drop.classList.add('over')
  })
  drop.addEventListener('dragleave', () => drop.classList.remove('over'))
  drop.addEventListener('drop', (e) => {
    e.preventDefault()
    drop.classList.remove('over')
    if (e.dataTransfer.files.length) start(l, info, e.dataTransfer.files[0])
  })
  pick.addEventListener('change', () => {
    if (pick.files.length) start(l, info, pick.files[0])
  })
  setState('ready')
}

let busy = false

/** Says why `file` was not taken, next to the drop zone; the input forgets it, and the person
 * can choose again. */
function refuse(why) {
  setText('pick-problem', why)
  $('pick-problem').hidden = false
  $('pick').value = ''
  $('drop').hidden = false
  setText('status', '')
  setState('refused')
}

async function start(l, info, file) {
  const f = info.file
  if (busy) return
  if (f.size != null && file.size !== f.size) {
    return refuse(`“${file.name}” has ${formatBytes(file.size)}; this request asks for exactly ${formatBytes(f.size)}. Choose the right file.`)
  }
  busy = true
  $('pick-problem').hidden = true
  $('drop').hidden = true
  // Hashing starts before anything is sent and runs beside the send (the worker's own thread);
  // its whole-file answer is awaited only once every byte is sent.
  const hashing = startHashing(file)
  const kept = f.offset > 0 ? recall(l.id) : null
  if (f.offset > 0 && !(await sameFile(f, file, hashing, kept))) {
    hashing.stop()
    busy = false
    return
  }
  send(l, info, file, hashing, kept)
}

/** Part of the file arrived already: is `file` the one it came from? With what this browser
 * kept (`kept`, see resume.js), the first `kept.at` bytes of `file` are hashed and compared, and
 * a different file is refused (nothing is sent; the link stays as it was). Without it, the page
 * cannot check: it says so and lets the person confirm — refusing would strand everyone who
 * began in another browser, and the fingerprints compared at the end still show a wrong file. */
async function sameFile(f, file, hashing, kept) {
  let why = 'this browser did not send it (or no longer remembers doing so)'
  if (kept) {
    setState('checking')
    setText('status', `Checking that “${file.name}” is the file you started with (reading its first ${formatBytes(kept.at)})…`)
    const sha = kept.at <= file.size ? await hashing.prefix(kept.at) : 'shorter'
    setText('status', '')
    if (sha === kept.sha256) return true
    if (sha) {
      refuse(`“${file.name}” is not the file whose first ${formatBytes(kept.at)} already arrived: that was “${kept.name}”, ${formatBytes(kept.size)}. Nothing was sent. Choose that file to continue.`)
      return false
    }
    why = 'this browser could not read the file you chose to compare it'
  }
  setText('confirm-text', `Part of the file has arrived already (${formatBytes(f.offset)}), but ${why}, so this page cannot check that “${file.name}” is the same file. Continue only if it is exactly the file you started with: the rest of another file would be joined onto what arrived, and this link could not take the right file afterwards. If you are not sure, ask the person who sent you this link for a new one.`)
  $('confirm').hidden = false
  setState('confirm')
  const yes = await new Promise((resolve) => {
    $('confirm-yes').onclick = () => resolve(true)
    $('confirm-no').onclick = () => resolve(false)
  })
  $('confirm').hidden = true
  if (!yes) {
    $('pick').value = ''
    $('drop').hidden = false
    setState('ready')
  }
  return yes
}

/** Sends `file` into the upload with Uppy's tus plugin, keeps the sha256 of what was sent (see
 * resume.js), and ends comparing the file's fingerprint with the one the server stored. */
function send(l, info, file, hashing, kept) {
  const f = info.file
  $('progress').hidden = false
  setText('status', `Sending “${file.name}”…`)
  const memory = keeper(l.id, file, hashing, kept)
  const uploadUrl = new URL(`/files/${encodeURIComponent(l.id)}${l.query}`, location.href).href
  const uppy = new Uppy({ autoProceed: false, allowMultipleUploadBatches: false })
  uppy.use(Tus, {
    uploadUrl,
    chunkSize: CHUNK_SIZE,
    retryDelays: [0, 1000, 3000, 5000, 10000, 20000, 30000],
    uploadLengthDeferred: f.size == null,
    storeFingerprintForResuming: false,
    removeFingerprintOnSuccess: true,
  })
  const fileId = uppy.addFile({ name: file.name, type: file.type || 'application/octet-stream', data: file, source: 'page' })
  let paused = false
  const speed = rateMeter()
  uppy.on('upload-progress', (_file, p) => {
    if (!p.bytesTotal) return
    $('bar').value = p.bytesUploaded / p.bytesTotal
    received(p.bytesUploaded, p.bytesTotal)
    if (!paused) setText('rate', speed.sample(p.bytesUploaded, p.bytesTotal))
    document.body.dataset.uploaded = String(p.bytesUploaded)
    memory.sent(p.bytesUploaded)
  })
  $('pause').addEventListener('click', () => {
    paused = uppy.pauseResume(fileId)
    speed.reset()
    setText('rate', paused ? 'paused' : 'starting…')
    setText('pause', paused ? 'Resume' : 'Pause')
    setText('status', paused ? 'Paused. You can close this page: choose the same file again later to continue.' : `Sending “${file.name}”…`)
    setState(paused ? 'paused' : 'uploading')
  })
  setState('uploading')
  uppy.upload().then(
    async (result) => {
      if (!result || result.failed.length || !result.successful.length) {
        const err = result && result.failed[0] && result.failed[0].error
        return failed(err, info)
      }
      $('pause').hidden = true
      memory.done()
      setText('status', 'All bytes sent. Comparing fingerprints…')
      const [local, server] = await Promise.all([hashing.whole, serverSha(l)])
      setText('up-size', formatBytes(file.size))
      received(file.size, file.size)
      setText('rate', speed.summary())
      $('result').hidden = false
      setText('sha-server', server || 'not reported')
      setText('status', '')
      if (local.err) {
        setText('sha-local', `not computed: ${local.err.message || local.err}`)
        setText('verdict', 'All bytes were sent, but this browser could not compute your file’s fingerprint (sha256): compare the server’s below with what sha256sum (Linux), shasum -a 256 (macOS) or Get-FileHash (Windows) says of your file.')
        $('fingerprints').open = true
        $('verdict').className = 'bad'
        return setState('unverified')
      }
      setText('sha-local', local.sha)
      const same = local.sha === server
      setText('verdict', same ? '✓ Done: the server has exactly your file (its fingerprint, sha256, matches yours).' : '✗ The fingerprints (sha256) differ: the server did not receive your file intact.')
      $('verdict').className = same ? 'ok' : 'bad'
      setState(same ? 'done' : 'mismatch')
    },
    (err) => failed(err, info),
  )
}

/** "Received so far" and the percentage under the bar: one number, from one place. */
function received(bytes, total) {
  const pct = total ? `${((bytes * 100) / total).toFixed(1)} %` : ''
  setText('up-received', total ? `${formatBytes(bytes)} of ${formatBytes(total)} (${pct})` : formatBytes(bytes))
  setText('pct', total ? `${pct} · ${shortBytes(bytes)} of ${shortBytes(total)}` : shortBytes(bytes))
}

/** `45 s`, `3 min 20 s`, `2 h 05 min`. */
function duration(secs) {
  const s = Math.max(1, Math.round(secs))
  if (s < 60) return `${s} s`
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')} min`
}

/** Speed over the last few seconds of sending and the time left at that speed. */
function rateMeter() {
  const WINDOW_MS = 5000
  let samples = []
  let first = null
  return {
    reset() {
      samples = []
    },
    sample(bytes, total) {
      const now = performance.now()
      if (!first) first = { t: now, bytes }
      samples.push({ t: now, bytes })
      while (samples.length > 2 && now - samples[0].t > WINDOW_MS) samples.shift()
      const a = samples[0]
      const secs = (now - a.t) / 1000
      if (secs < 0.2 || bytes <= a.bytes) return 'measuring speed…'
      const rate = (bytes - a.bytes) / secs
      return `${shortBytes(rate)}/s · about ${duration((total - bytes) / rate)} left`
    },
    /** The average speed of the whole send, for the end. */
    summary() {
      const last = samples[samples.length - 1]
      if (!first || !last || last.t - first.t < 1) return 'sent'
      return `sent at ${shortBytes((last.bytes - first.bytes) / ((last.t - first.t) / 1000))}/s on average`
    },
  }
}

/** The HTTP status behind a tus-js-client error, if it had an answer. */
function statusOf(err) {
  const res = err && err.originalResponse
  return res && typeof res.getStatus === 'function' ? res.getStatus() : 0
}

function failed(err, info) {
  const expired = info && info.expires_at_ms != null && Date.now() >= info.expires_at_ms
  if (expired || statusOf(err) === 410) {
    setText(
      'status',
      expired
        ? `This link expired at ${formatTime(info.expires_at_ms)}, so the upload stopped. Ask the person who sent it for a new link: choosing the same file there continues where this one stopped.`
        : `The server no longer accepts this link (${(err && err.message) || err}). Ask the person who sent it for a new link: choosing the same file there continues where this one stopped.`,
    )
    $('status').className = 'bad'
    setState('expired')
    return
  }
  setText('status', `The upload stopped: ${(err && err.message) || err}. Reload the page and choose the same file to continue.`)
  $('status').className = 'bad'
  setState('failed')
}

/** The sha256 the server computed: polled until the upload shows complete. */
async function serverSha(l) {
  for (let delay = 100; ; delay = Math.min(delay * 2, 2000)) {
    const { info } = await fetchInfo(l)
    if (info && info.file.complete) return info.file.sha256
    await new Promise((r) => setTimeout(r, delay))
  }
}

async function main() {
  if (location.pathname === '/') return dashboard()
  const l = link()
  if (!l.id || !l.query) return problem('This link is not valid', 'It was cut short. Copy the whole link again.')
  const { info, error } = await fetchInfo(l)
  if (error) return problem(...error)
  if (info.scope === 'upload') return uploadPage(l, info)
  return downloadPage(l, info)
}

main()
