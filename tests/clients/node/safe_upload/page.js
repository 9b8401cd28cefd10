'use strict'
// The two safe flows, run in the page (see run.js). The page never holds a full token:
// - signedUrl: the backend created the upload and handed the page only its signed upload URL
//   (scope=upload); tus-js-client resumes it with `uploadUrl` (HEAD, then PATCH).
// - scopedToken: the backend handed the page a short-lived token of scope `upload`; the page
//   creates its own upload with it (POST /files/), and ferry answers a signed Location that the
//   PATCHes use. The page then tries to read another file with that token: it must be refused.
const $ = (id) => document.getElementById(id)

function makeBytes(size, seed) {
  const words = new Uint32Array(Math.ceil(size / 4))
  let x = seed >>> 0 || 0x9e3779b9
  for (let i = 0; i < words.length; i++) {
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

function upload(file, options) {
  return new Promise((resolve, reject) => {
    const u = new window.tus.Upload(file, {
      chunkSize: 256 * 1024,
      retryDelays: null,
      ...options,
      onProgress: (sent, total) => {
        $('bar').value = sent / total
      },
      onSuccess: () => resolve(u),
      onError: (e) => reject(new Error(String(e))),
    })
    u.start()
  })
}

window.runScenario = async function runScenario(p) {
  const out = {}
  $('state').textContent = 'uploading (signed URL)'
  const a = makeBytes(p.size, 1)
  const up = await upload(new Blob([a]), { uploadUrl: p.signedUrl })
  out.signed = { url: up.url, sha256: await sha256Hex(a) }

  $('state').textContent = 'uploading (upload-scoped token)'
  const b = makeBytes(p.size + 17, 2)
  const auth = { Authorization: 'Bearer ' + p.scopedToken }
  const created = await upload(new Blob([b]), { endpoint: p.endpoint, headers: auth, metadata: { filename: 'from-page.bin' } })
  out.scoped = { url: created.url, sha256: await sha256Hex(b) }
  // The same token cannot read another file of its principal, nor delete it.
  const read = await fetch(p.endpoint + p.otherId, { headers: auth })
  const del = await fetch(p.endpoint + p.otherId, { method: 'DELETE', headers: { ...auth, 'Tus-Resumable': '1.0.0' } })
  out.refused = { read: read.status, delete: del.status }
  $('state').textContent = 'done'
  return out
}
