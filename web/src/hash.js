// The request-a-file page's sha256 of the chosen file, in a dedicated Web Worker (issue 24):
// built into /assets/hash.js, started by app.js with `new Worker('/assets/hash.js')`.
//
// In:  one message `{ file: File, slice: bytes }` (a File is structured-cloned to the worker
//      without copying its bytes).
// Out: `{ sha256: '64 hex digits', bytes }` once the whole file is hashed, or `{ error: text }`.
//
// The worker reads the file itself, `slice` bytes at a time through `Blob.slice().arrayBuffer()`,
// and asks for the next slice before it hashes the current one, so reading and hashing overlap;
// the page's main thread never touches the bytes for hashing. The hash is hash-wasm's sha256
// (WebAssembly, shipped inline in this script: no fetch, so the page stays self-contained).
// Compiling it needs `'wasm-unsafe-eval'`, which only this script's own
// Content-Security-Policy grants (src/http/web.rs, WORKER_CSP), not the pages'.
import { createSHA256 } from 'hash-wasm'

self.onmessage = async (e) => {
  const { file, slice } = e.data || {}
  try {
    if (!(file instanceof Blob) || !(slice > 0)) throw new Error('expected { file, slice }')
    const h = await createSHA256()
    h.init()
    const read = (at) => (at < file.size ? file.slice(at, Math.min(file.size, at + slice)).arrayBuffer() : null)
    let next = read(0)
    for (let at = 0; next; at += slice) {
      const buf = await next
      next = read(at + slice)
      h.update(new Uint8Array(buf))
    }
    self.postMessage({ sha256: h.digest('hex'), bytes: file.size })
  } catch (err) {
    self.postMessage({ error: String((err && err.message) || err) })
  }
}
