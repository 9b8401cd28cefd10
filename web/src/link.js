// The page of a link kept by the server (issue 51, `/l/{id}`): a share of several files (each
// downloadable, or all as one zip) or a request for several files (dropped at once, or a
// folder; each a resumable tus upload with its own progress). The message from the person who
// made the link comes first; a link with a passphrase asks for it before anything else. Like
// app.js, the HTML carries no data and everything is filled with textContent only.
import Uppy from '@uppy/core'
import Tus from '@uppy/tus'
import { $, setText, setState, formatBytes, shortBytes, formatTime, shown, CHUNK_SIZE } from './util.js'
import { startHashing } from './resume.js'

const id = decodeURIComponent(location.pathname.split('/')[2] || '')
const base = `/l/${encodeURIComponent(id)}`

function show(...sections) {
  for (const s of ['problem', 'lock', 'message-box', 'share', 'request']) $(s).hidden = !sections.includes(s)
  setText('status', '')
}

function problem(title, detail, state = 'error') {
  show('problem')
  setText('problem-title', title)
  setText('problem-detail', detail)
  setState(state)
}

/** What the page says of a link that cannot be used, by its state. */
const CLOSED = {
  revoked: ['This link was revoked', 'The person who sent it turned it off. Ask them for a new link if you still need the files.'],
  expired: ['This link has expired', 'Ask the person who sent it for a new link.'],
  used_up: ['This link has been used', 'It allowed a limited number of downloads, and they were all used. Ask the person who sent it to share the files again.'],
  full: ['This request is complete', 'It received all the files it asked for. Ask the person who sent it for a new link to send more.'],
}

async function fetchInfo() {
  let res
  try {
    res = await fetch(`${base}/info`, { cache: 'no-store' })
  } catch (e) {
    return { error: ['The server cannot be reached', 'Check your connection and reload this page.'] }
  }
  if (res.ok) return { info: await res.json() }
  if (res.status === 404) return { error: ['This link does not exist', 'It was mistyped or cut short. Copy the whole link again, or ask for a new one.'] }
  let detail = ''
  try {
    detail = (await res.json()).detail || ''
  } catch (_) {}
  return { error: [`The server answered ${res.status}`, detail || 'Try again in a moment.'] }
}

function lockPage() {
  show('lock')
  setState('locked')
  const go = async () => {
    const passphrase = $('passphrase').value
    if (!passphrase) return
    $('unlock').disabled = true
    let res
    try {
      res = await fetch(`${base}/unlock`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ passphrase }) })
    } catch (e) {
      res = null
    }
    $('unlock').disabled = false
    if (res && res.status === 204) return main()
    $('lock-problem').hidden = false
    if (!res) setText('lock-problem', 'The server cannot be reached. Check your connection and try again.')
    else if (res.status === 429) {
      const wait = res.headers.get('retry-after') || 'a few'
      setText('lock-problem', `Too many wrong passphrases. Wait ${wait} seconds, then try again.`)
      setState('slowed')
      return
    } else if (res.status === 403) setText('lock-problem', 'That passphrase is not right. Check it with the person who sent the link and type it again.')
    else setText('lock-problem', `The server answered ${res.status}. Reload the page and try again.`)
    setState('wrong')
  }
  $('unlock').onclick = go
  $('passphrase').onkeydown = (e) => {
    if (e.key === 'Enter') go()
  }
}

function showMessage(info) {
  if (info.message) setText('message', info.message)
  return info.message ? ['message-box'] : []
}

function el(tag, text, cls) {
  const e = document.createElement(tag)
  if (text != null) e.textContent = text
  if (cls) e.className = cls
  return e
}

function sharePage(info) {
  show(...showMessage(info), 'share')
  const n = info.files.length
  setText('share-title', n === 1 ? 'A file is shared with you' : `${n} files are shared with you`)
  let limits = `This link works until ${formatTime(info.expires_at_ms)}.`
  if (info.max_downloads != null) {
    const left = Math.max(0, info.max_downloads - info.downloads)
    limits +=
      info.max_downloads === 1
        ? ' It is a one-time link: it can be downloaded once.'
        : ` It can be downloaded ${info.max_downloads} times (${left} left).`
    if (info.download_grant) limits += ' Your download is counted: for the next hour you can download each file here, and resume a download that stopped.'
    else limits += ' Your first download counts; then, for an hour, you can download each file here and resume.'
  }
  setText('share-limits', limits)
  $('zip').href = `${base}/zip`
  const list = $('files')
  const hashes = $('hashes')
  list.replaceChildren()
  hashes.replaceChildren()
  for (const f of info.files) {
    const li = el('li')
    if (f.gone) {
      li.append(el('span', 'A file that is no longer here', 'name'), el('span', 'It was deleted or expired.', 'meta'))
      list.append(li)
      continue
    }
    li.append(el('span', shown(f), 'name'))
    li.append(el('span', `${formatBytes(f.size)} · added ${formatTime(f.created_at)}`, 'meta'))
    if (f.complete) {
      const a = el('a', 'Download', 'button')
      a.href = `${base}/files/${encodeURIComponent(f.id)}?download=1`
      a.download = shown(f)
      a.dataset.file = f.id
      li.append(a)
      hashes.append(el('dt', shown(f)), el('dd', f.sha256 || '', 'hash'))
    } else {
      li.append(el('span', 'still being uploaded; reload later', 'hint'))
    }
    list.append(li)
  }
  setState('ready')
}

/** Every file of a dropped folder (webkitGetAsEntry), with its path inside it. */
async function walk(entry, prefix, out) {
  if (entry.isFile) {
    const file = await new Promise((resolve, reject) => entry.file(resolve, reject))
    out.push({ file, path: prefix + file.name })
  } else if (entry.isDirectory) {
    const reader = entry.createReader()
    for (;;) {
      const batch = await new Promise((resolve, reject) => reader.readEntries(resolve, reject))
      if (!batch.length) break
      for (const e of batch) await walk(e, `${prefix}${entry.name}/`, out)
    }
  }
}

function requestPage(info) {
  show(...showMessage(info), 'request')
  setText(
    'request-limits',
    `You can send up to ${info.files_left} more file${info.files_left === 1 ? '' : 's'} until ${formatTime(info.expires_at_ms)}. Each file is sent in pieces: if the connection drops, drop the same file again to continue where it stopped.`,
  )
  const uppy = new Uppy({ autoProceed: true })
  uppy.use(Tus, {
    endpoint: new URL(`${base}/files`, location.href).href,
    chunkSize: CHUNK_SIZE,
    retryDelays: [0, 1000, 3000, 5000, 10000, 20000, 30000],
    limit: 3,
    storeFingerprintForResuming: true,
    removeFingerprintOnSuccess: true,
  })
  const rows = new Map()
  let sent = 0
  let verified = 0
  let checking = Promise.resolve()
  const row = (file) => {
    let r = rows.get(file.id)
    if (!r) {
      const li = el('li')
      const bar = document.createElement('progress')
      bar.max = 1
      bar.value = 0
      const text = el('span', 'waiting…')
      li.append(el('span', file.meta.relativePath || file.name, 'name'), bar, text)
      li.dataset.name = file.meta.relativePath || file.name
      $('sending').append(li)
      r = { li, bar, text }
      rows.set(file.id, r)
    }
    return r
  }
  uppy.on('file-added', (file) => row(file))
  uppy.on('upload-progress', (file, p) => {
    if (!file || !p.bytesTotal) return
    const r = row(file)
    r.bar.value = p.bytesUploaded / p.bytesTotal
    r.text.textContent = `${((p.bytesUploaded * 100) / p.bytesTotal).toFixed(1)} % · ${shortBytes(p.bytesUploaded)} of ${shortBytes(p.bytesTotal)}`
    r.li.dataset.state = 'uploading'
  })
  uppy.on('upload-success', (file, response) => {
    const r = row(file)
    r.bar.value = 1
    r.text.textContent = `sent (${formatBytes(file.size)}); comparing fingerprints…`
    r.li.dataset.state = 'sent'
    sent += 1
    const url = response && response.uploadURL
    if (url) r.li.dataset.id = decodeURIComponent(new URL(url, location.href).pathname.split('/').pop())
    const data = file.data
    // One file hashed at a time: the fingerprints are compared as the files arrive.
    checking = checking.then(() => verify(r, data, url)).then((ok) => {
      if (ok) verified += 1
      if (verified === rows.size) {
        $('request-done').hidden = false
        setText('request-done', `✓ Done: ${verified} file${verified === 1 ? '' : 's'} arrived exactly as you have them.`)
        setState('done')
      }
    })
    setTimeout(() => uppy.removeFile(file.id), 0)
  })
  uppy.on('upload-error', (file, err) => {
    if (!file) return
    const r = row(file)
    const status = err && err.originalResponse && typeof err.originalResponse.getStatus === 'function' ? err.originalResponse.getStatus() : 0
    r.text.textContent =
      status === 410
        ? 'not taken: this link no longer takes files (it was revoked, expired, or took all it asked for).'
        : `stopped: ${(err && err.message) || err}. Drop the same file again to continue.`
    r.li.dataset.state = 'failed'
    setState('failed')
    setTimeout(() => uppy.removeFile(file.id), 0)
  })
  const add = (items) => {
    $('pick-problem').hidden = true
    for (const { file, path } of items) {
      try {
        uppy.addFile({ name: file.name, type: file.type || 'application/octet-stream', data: file, source: 'link', meta: { relativePath: path } })
      } catch (e) {
        $('pick-problem').hidden = false
        setText('pick-problem', `“${path}” was not added: ${e.message}`)
      }
    }
    setState('uploading')
  }
  const drop = $('drop')
  drop.addEventListener('dragover', (e) => {
    e.preventDefault()
    drop.classList.add('over')
  })
  drop.addEventListener('dragleave', () => drop.classList.remove('over'))
  drop.addEventListener('drop', async (e) => {
    e.preventDefault()
    drop.classList.remove('over')
    const entries = Array.from(e.dataTransfer.items || [])
      .map((i) => i.webkitGetAsEntry && i.webkitGetAsEntry())
      .filter(Boolean)
    if (entries.length) {
      const out = []
      for (const entry of entries) await walk(entry, '', out)
      add(out)
    } else add(Array.from(e.dataTransfer.files).map((file) => ({ file, path: file.name })))
  })
  $('pick').addEventListener('change', () => {
    add(Array.from($('pick').files).map((file) => ({ file, path: file.name })))
    $('pick').value = ''
  })
  $('pick-folder').addEventListener('change', () => {
    add(Array.from($('pick-folder').files).map((file) => ({ file, path: file.webkitRelativePath || file.name })))
    $('pick-folder').value = ''
  })
  setState('ready')
}

/** `sha-256=:base64:` → hex, or null. */
function digestHex(header) {
  const m = /sha-256=:([^:]+):/.exec(header || '')
  if (!m) return null
  return Array.from(atob(m[1]), (c) => c.charCodeAt(0).toString(16).padStart(2, '0')).join('')
}

/** Compares the file's sha256 with the one the server stored (HEAD of the file: its
 * `Repr-Digest`, polled until the upload is finished); says which on the file's row. */
async function verify(r, data, url) {
  const local = await startHashing(data).whole
  let server = null
  for (let delay = 100; url && !server && delay < 60000; delay *= 2) {
    try {
      const res = await fetch(new URL(url, location.href).pathname, { method: 'HEAD', cache: 'no-store' })
      server = res.ok ? digestHex(res.headers.get('repr-digest')) : null
    } catch (_) {}
    if (!server) await new Promise((ok) => setTimeout(ok, delay))
  }
  r.li.dataset.sha256 = server || ''
  if (local.err || !server) {
    r.text.textContent = `sent; the fingerprints could not be compared (${local.err ? local.err.message : 'the server did not report one'}).`
    r.li.dataset.state = 'unverified'
    return false
  }
  const same = local.sha === server
  r.text.textContent = same ? '✓ arrived exactly (its fingerprint, sha256, matches your file)' : '✗ the fingerprints differ: send this file again.'
  r.li.dataset.state = same ? 'stored' : 'mismatch'
  return same
}

async function main() {
  if (!id) return problem('This link is not valid', 'It was cut short. Copy the whole link again.')
  const { info, error } = await fetchInfo()
  if (error) return problem(...error)
  const closed = CLOSED[info.state]
  // A used-up share still works for the visitor whose download was counted (for an hour).
  if (closed && !(info.state === 'used_up' && info.download_grant)) {
    return problem(closed[0], info.why ? `${closed[1]} (${info.why}.)` : closed[1], info.state)
  }
  if (info.locked) return lockPage()
  document.body.dataset.kind = info.kind
  if (info.kind === 'share') return sharePage(info)
  return requestPage(info)
}

main()
