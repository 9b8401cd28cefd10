// The request-a-file page's sha256 of the chosen file, in a dedicated Web Worker (issue 24):
// built into /assets/hash.js, started by app.js with `new Worker('/assets/hash.js')`.
//
// In:  one message `{ file: File, slice: bytes, every: bytes }` (a File is structured-cloned to
//      the worker without copying its bytes).
// Out: `{ prefix: '64 hex digits', at: n }` for every `every` bytes read — the sha256 of the
//      file's first `at` bytes, `at` a multiple of `every` below the file's size (issue 48: the
//      page keeps one, and after a reload checks the chosen file against it);
//      then `{ sha256: '64 hex digits', bytes }` once the whole file is hashed, or `{ error: text }`.
//
// The worker reads the file itself, `slice` bytes at a time through `Blob.slice().arrayBuffer()`,
// and asks for the next slice before it hashes the current one, so reading and hashing overlap;
// the page's main thread never touches the bytes for hashing. A prefix's digest is taken from a
// copy of the running state (hash-wasm's save(), digest(), load()), so the whole-file hash goes
// on unchanged. The hash is hash-wasm's sha256 (WebAssembly, shipped inline in this script: no
// fetch, so the page stays self-contained). Compiling it needs `'wasm-unsafe-eval'`, which only
// this script's own Content-Security-Policy grants (src/http/web.rs, WORKER_CSP), not the pages'.
import { createSHA256 } from 'hash-wasm'

self.onmessage = async (e) => {
  const { file, slice, every } = e.data || {}
  try {
    if (!(file instanceof Blob) || !(slice > 0) || !(every > 0)) throw new Error('expected { file, slice, every }')
    const h = await createSHA256()
    h.init()
    const read = (at) => (at < file.size ? file.slice(at, Math.min(file.size, at + slice)).arrayBuffer() : null)
    let next = read(0)
    for (let at = 0; next; at += slice) {
      const bytes = new Uint8Array(await next)
      next = read(at + slice)
      // Hashed in pieces that end on the `every` marks, each mark's digest posted.
      for (let i = 0; i < bytes.length; ) {
        const mark = (Math.floor((at + i) / every) + 1) * every
        const end = Math.min(bytes.length, mark - at)
        h.update(bytes.subarray(i, end))
        i = end
        if (at + i === mark && mark < file.size) {
          const state = h.save()
          self.postMessage({ prefix: h.digest('hex'), at: mark })
          h.load(state)
        }
      }
    }
    self.postMessage({ sha256: h.digest('hex'), bytes: file.size })
  } catch (err) {
    self.postMessage({ error: String((err && err.message) || err) })
  }
}
