// ferry's pages for people (issue 16): the request-a-file page (a signed upload link) and the
// download page (a signed download link). The HTML is the same for both and carries no data;
// this script reads the link's id and signature from its own URL, asks the server what the
// link is for (GET /share/{id}/info?…), and fills the page with textContent only — never
// innerHTML — so names and metadata always render as text.
import Uppy from '@uppy/core'
import Tus from '@uppy/tus'
import { sha256 } from '@noble/hashes/sha2.js'
import { bytesToHex } from '@noble/hashes/utils.js'

const $ = (id) => document.getElementById(id)
const setText = (id, value) => {
  $(id).textContent = value
}
const setState = (state) => {
  document.body.dataset.state = state
}

/** Upload PATCHes of this many bytes: each ends in a server checkpoint. */
const CHUNK_SIZE = 16 * 1024 * 1024
/** The local file is hashed in slices of this many bytes. */
const HASH_SLICE = 8 * 1024 * 1024

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

function formatTime(ms) {
  if (ms == null) return 'no limit'
  const d = new Date(ms)
  return `${d.toLocaleString()} (${d.toISOString()})`
}

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

async function hashFile(file, onProgress) {
  const h = sha256.create()
  for (let at = 0; at < file.size; at += HASH_SLICE) {
    const buf = await file.slice(at, Math.min(file.size, at + HASH_SLICE)).arrayBuffer()
    h.update(new Uint8Array(buf))
    onProgress(Math.min(file.size, at + HASH_SLICE))
  }
  return bytesToHex(h.digest())
}

function downloadPage(l, info) {
  const f = info.file
  show('download')
  setText('dl-name', shown(f))
  setText('dl-size', formatBytes(f.size))
  setText('dl-type', f.media_type)
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
  setText('up-received', f.size ? `${formatBytes(f.offset)} (${((f.offset * 100) / f.size).toFixed(1)} %)` : formatBytes(f.offset))
  setText('up-expires', formatTime(info.expires_at_ms))
  if (f.complete) {
    $('drop').hidden = true
    $('result').hidden = false
    setText('verdict', 'This upload is complete.')
    setText('sha-local', '—')
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

let started = false

function start(l, info, file) {
  const f = info.file
  if (started) return
  if (f.size != null && file.size !== f.size) {
    setText('status', `“${file.name}” has ${formatBytes(file.size)}; this request asks for exactly ${formatBytes(f.size)}. Choose the right file.`)
    $('status').className = 'bad'
    return
  }
  started = true
  $('status').className = ''
  $('drop').hidden = true
  $('progress').hidden = false
  setText('status', `Sending “${file.name}”…`)
  const hashing = hashFile(file, () => {})
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
  uppy.on('upload-progress', (_file, p) => {
    if (!p.bytesTotal) return
    $('bar').value = p.bytesUploaded / p.bytesTotal
    setText('pct', `${((p.bytesUploaded * 100) / p.bytesTotal).toFixed(1)} %`)
    setText('bytes', `${formatBytes(p.bytesUploaded)} of ${formatBytes(p.bytesTotal)}`)
    document.body.dataset.uploaded = String(p.bytesUploaded)
  })
  $('pause').addEventListener('click', () => {
    paused = uppy.pauseResume(fileId)
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
      setText('status', 'All bytes sent. Comparing checksums…')
      const [local, server] = await Promise.all([hashing, serverSha(l)])
      setText('up-received', `${formatBytes(file.size)} (100 %)`)
      $('result').hidden = false
      setText('sha-local', local)
      setText('sha-server', server || 'not reported')
      const same = local === server
      setText('verdict', same ? '✓ Done: the server has exactly your file (sha256 matches).' : '✗ The checksums differ: the server did not receive your file intact.')
      $('verdict').className = same ? 'ok' : 'bad'
      setText('status', '')
      setState(same ? 'done' : 'mismatch')
    },
    (err) => failed(err, info),
  )
}

/** A file's name as people may see it: the server's `display_name` (control and bidi
 * characters replaced by U+FFFD), else its id. */
function shown(f) {
  return f.display_name || f.name || f.id
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

// ---- The dashboard at `/`: the principal's files and tasks through the JSON API. ----

const TOKEN_KEY = 'ferry-token'

async function api(method, path, body) {
  const headers = { 'content-type': 'application/json' }
  const token = sessionStorage.getItem(TOKEN_KEY)
  if (token) headers.authorization = `Bearer ${token}`
  const res = await fetch(path, { method, headers, body: body == null ? undefined : JSON.stringify(body), cache: 'no-store' })
  if (res.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY)
    throw Object.assign(new Error('the token is not valid'), { unauthorized: true })
  }
  if (!res.ok) {
    let detail = ''
    try {
      detail = (await res.json()).detail || ''
    } catch (_) {}
    throw new Error(`${res.status} ${detail}`)
  }
  return res.json()
}

function el(tag, textValue, cls) {
  const e = document.createElement(tag)
  if (textValue != null) e.textContent = textValue
  if (cls) e.className = cls
  return e
}

function button(label, onClick) {
  const b = el('button', label)
  b.type = 'button'
  b.addEventListener('click', onClick)
  return b
}

function row(cells) {
  const tr = el('tr')
  for (const c of cells) {
    const td = el('td')
    if (c instanceof Node) td.append(c)
    else td.textContent = c == null ? '' : String(c)
    tr.append(td)
  }
  return tr
}

function fileRows(files, refresh) {
  return files.map((f) => {
    const state = f.complete ? 'complete' : f.size ? `${((f.offset * 100) / f.size).toFixed(1)} % uploaded` : `${f.offset} bytes uploaded`
    const actions = el('span')
    const share = (scope) => async () => {
      const out = await api('POST', `/api/v1/files/${encodeURIComponent(f.id)}/share`, { scope, ttl_ms: Number($('ttl').value) })
      setText('share-out', `${scope} page for ${shown(f)}: ${out.page_url || out.url}`)
    }
    if (f.complete) actions.append(button('Share', share('download')))
    else actions.append(button('Request upload', share('upload')))
    actions.append(
      button('Delete', async () => {
        if (!confirm(`Delete ${shown(f)}?`)) return
        const token = sessionStorage.getItem(TOKEN_KEY)
        const headers = { 'tus-resumable': '1.0.0' }
        if (token) headers.authorization = `Bearer ${token}`
        await fetch(`/files/${encodeURIComponent(f.id)}`, { method: 'DELETE', headers })
        refresh()
      }),
    )
    return row([shown(f), formatBytes(f.size), state, f.sha256 || '', new Date(f.created_at).toLocaleString(), actions])
  })
}

function taskRows(tasks, refresh) {
  return tasks.map((t) => {
    const bar = el('progress')
    bar.max = 1
    if (t.progress && t.progress.fraction != null) bar.value = t.progress.fraction
    else if (t.status === 'completed') bar.value = 1
    const progress = el('span')
    progress.append(bar, el('span', t.progress && t.progress.message ? ` ${t.progress.message}` : ''))
    const actions = el('span')
    if (t.status === 'working' || t.status === 'input_required') {
      actions.append(
        button('Cancel', async () => {
          await api('POST', `/api/v1/tasks/${encodeURIComponent(t.id)}/cancel`, {})
          refresh()
        }),
      )
    }
    return row([t.kind, t.status_message ? `${t.status}: ${t.status_message}` : t.status, progress, actions])
  })
}

/** Lists show the newest LIST_STEP items, LIST_STEP more per "Show more", up to the API's cap. */
const LIST_STEP = 100
const LIST_MAX = 999

/** The "older ones exist" hint under a list: a button while the API can give more. */
function more(id, hasMore, count, what, onMore) {
  const p = $(id)
  p.hidden = !hasMore
  if (!hasMore) return
  const text = count >= LIST_MAX ? `The newest ${count} ${what} are shown; older ones exist (the API lists at most 1000 at once).` : `The newest ${count} ${what} are shown; older ones exist. `
  p.replaceChildren(el('span', text))
  if (count < LIST_MAX) p.append(button('Show more', onMore))
}

async function dashboard() {
  const login = $('login')
  let tried = false
  login.addEventListener('submit', (e) => {
    e.preventDefault()
    tried = true
    sessionStorage.setItem(TOKEN_KEY, $('token').value.trim())
    $('token').value = ''
    login.hidden = true
    poll(0)
  })
  $('logout').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY)
    location.reload()
  })
  let timer = null
  let delay = 1000
  let last = ''
  let shownFiles = LIST_STEP
  let shownTasks = LIST_STEP
  const poll = async (wait) => {
    clearTimeout(timer)
    timer = setTimeout(refresh, wait)
  }
  const refresh = async () => {
    try {
      // One more than shown, to know whether older ones exist.
      const [files, tasks] = await Promise.all([api('GET', `/api/v1/files?limit=${shownFiles + 1}`), api('GET', `/api/v1/tasks?limit=${shownTasks + 1}`)])
      const snapshot = JSON.stringify([files, tasks])
      // Polling backs off while nothing changes (1 s → 30 s), and speeds up again on a change.
      delay = snapshot === last ? Math.min(delay * 2, 30000) : 1000
      if (snapshot !== last) {
        last = snapshot
        $('files').replaceChildren(...fileRows(files.files.slice(0, shownFiles), () => poll(0)))
        $('tasks').replaceChildren(...taskRows(tasks.tasks.slice(0, shownTasks), () => poll(0)))
        more('files-more', files.files.length > shownFiles, shownFiles, 'files', () => {
          shownFiles = Math.min(shownFiles + LIST_STEP, LIST_MAX)
          last = ''
          poll(0)
        })
        more('tasks-more', tasks.tasks.length > shownTasks, shownTasks, 'tasks', () => {
          shownTasks = Math.min(shownTasks + LIST_STEP, LIST_MAX)
          last = ''
          poll(0)
        })
      }
      $('dash').hidden = false
      $('logout').hidden = !sessionStorage.getItem(TOKEN_KEY)
      setText('status', '')
      setState('ready')
      poll(delay)
    } catch (e) {
      if (e.unauthorized) {
        $('dash').hidden = true
        login.hidden = false
        setText('status', tried ? 'That token is not valid.' : '')
        setState('login')
        return
      }
      setText('status', `The server cannot be reached (${e.message}); trying again…`)
      delay = Math.min(delay * 2, 30000)
      poll(delay)
    }
  }
  poll(0)
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
