'use strict'
// The scenario, run in the page: make a File of `size` deterministic bytes, upload it with
// Uppy's Tus plugin in `chunkSize` pieces, pause once two PATCHes have been answered, read the
// server's offset with a cross-origin HEAD, resume, and wait for completion.
const $ = (id) => document.getElementById(id)

function setState(text, cls) {
  $('state').textContent = text
  $('state').className = cls || ''
}

function makeBytes(size) {
  const words = new Uint32Array(Math.ceil(size / 4))
  let x = 0x9e3779b9
  for (let i = 0; i < words.length; i++) {
    // xorshift32
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    words[i] = x >>> 0
  }
  return new Uint8Array(words.buffer, 0, size)
}

async function sha256Hex(bytes) {
  const d = await crypto.subtle.digest('SHA-256', bytes)
  return Array.from(new Uint8Array(d), (b) => b.toString(16).padStart(2, '0')).join('')
}

window.runScenario = async function runScenario(endpoint, size, chunkSize) {
  $('origin').textContent = location.origin
  $('endpoint').textContent = endpoint
  const bytes = makeBytes(size)
  const sha256 = await sha256Hex(bytes)
  $('sha').textContent = sha256
  const { Uppy, Tus } = window.FerryUppy
  const uppy = new Uppy({ autoProceed: false })
  let patchesDone = 0
  let requestIds = 0
  let pausedOnce = false
  let resolvePaused
  const paused = new Promise((r) => { resolvePaused = r })
  uppy.use(Tus, {
    endpoint,
    chunkSize,
    retryDelays: [],
    removeFingerprintOnSuccess: true,
    // An X-Request-ID on every request: the CORS preflight must allow it, or the browser
    // blocks the upload (issue 9, item 4).
    addRequestId: true,
    onAfterResponse: (req) => {
      if (req.getHeader('X-Request-ID')) requestIds += 1
      if (req.getMethod() !== 'PATCH') return
      patchesDone += 1
      if (patchesDone === 2 && !pausedOnce) {
        pausedOnce = true
        const id = uppy.getFiles()[0].id
        uppy.pauseResume(id)
        resolvePaused(id)
      }
    },
  })
  uppy.on('upload-progress', (file, p) => {
    if (p.bytesTotal) $('bar').value = p.bytesUploaded / p.bytesTotal
  })
  const fileId = uppy.addFile({
    name: 'uppy-browser.bin',
    type: 'application/octet-stream',
    data: new File([bytes], 'uppy-browser.bin', { type: 'application/octet-stream' }),
  })
  $('file').textContent = `uppy-browser.bin, ${size} bytes`
  setState('uploading')
  const completed = uppy.upload()

  // Paused: what does the server have? (A cross-origin HEAD: Upload-Offset must be exposed.)
  await paused
  setState('paused')
  // The aborted request may still be finishing on the server: HEAD also ends it.
  const uploadUrl = () => uppy.getFile(fileId).tus && uppy.getFile(fileId).tus.uploadUrl
  let url = uploadUrl()
  for (let i = 0; i < 100 && !url; i++) {
    await new Promise((r) => setTimeout(r, 50))
    url = uploadUrl()
  }
  if (!url) throw new Error('no upload URL while paused')
  const head = await fetch(new URL(url, endpoint), { method: 'HEAD', headers: { 'Tus-Resumable': '1.0.0' } })
  const pausedAt = Number(head.headers.get('upload-offset'))
  $('paused').textContent = `${pausedAt} of ${size} bytes`

  setState('resuming')
  uppy.pauseResume(fileId)
  const result = await completed
  if (!result || result.failed.length || result.successful.length !== 1) {
    const err = result && result.failed[0] && result.failed[0].error
    throw new Error(`upload failed: ${err}`)
  }
  const finalUrl = result.successful[0].uploadURL
  $('url').textContent = finalUrl
  $('bar').value = 1
  setState('done ✓ (paused and resumed)', 'done')
  return { url: finalUrl, sha256, size, paused_at: pausedAt, patches: patchesDone, request_ids: requestIds, origin: location.origin }
}
