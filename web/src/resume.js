// The request-a-file page's memory of what it sent (issue 48 kind 7). TUS cannot rewind, and an
// upload link allows only HEAD and PATCH: a file chosen after a reload is appended at the
// server's offset, so a different file of the same size would be spliced onto the bytes that
// arrived from the first. The page therefore keeps, per upload, the sha256 of the first bytes it
// sent (in this browser's localStorage), and before resuming hashes the same range of the
// chosen file; the page refuses the file when they differ.
import { HASH_SLICE } from './util.js'

/** The worker posts the sha256 of the first `n × MARK` bytes as it passes each mark. */
export const MARK = 1024 * 1024

const key = (id) => `ferry.request.${id}`

/** What this browser sent into upload `id`: `{ name, size, at, sha256 }` — the sha256 (hex) of
 * the first `at` bytes of the file `name` of `size` bytes — or null when it kept nothing (another
 * browser sent them, storage was cleared or is off, or less than one mark was sent). */
export function recall(id) {
  try {
    const k = JSON.parse(localStorage.getItem(key(id)) || 'null')
    const ok = k && typeof k.name === 'string' && Number.isSafeInteger(k.size) && Number.isSafeInteger(k.at) && k.at > 0 && /^[0-9a-f]{64}$/.test(k.sha256)
    return ok ? k : null
  } catch (_) {
    return null
  }
}

/** Forget upload `id` (it is complete: nothing is left to resume). */
export function forget(id) {
  try {
    localStorage.removeItem(key(id))
  } catch (_) {}
}

/** Hash `file` in the worker of /assets/hash.js (web/src/hash.js), which reads the file itself:
 * hashing neither blocks nor shares this thread with the upload.
 * - `whole`: resolves `{ sha }` (the whole file's sha256, hex) or `{ err }` (the worker could not
 *   start or read the file, or was stopped); never rejects.
 * - `onPrefix(f)`: `f(at, sha)` for each mark passed, and for the whole file (`at` = its size).
 * - `prefix(at)`: the sha256 of the first `at` bytes, or null if the worker ends without it.
 * - `stop()`: ends the worker. */
export function startHashing(file) {
  const listeners = []
  let settle
  const whole = new Promise((resolve) => (settle = resolve))
  let worker = null
  const end = (v) => {
    if (worker) worker.terminate()
    settle(v)
  }
  try {
    worker = new Worker('/assets/hash.js')
    worker.onmessage = (e) => {
      const d = e.data || {}
      if (d.prefix) for (const f of listeners) f(d.at, d.prefix)
      else if (d.sha256) {
        for (const f of listeners) f(d.bytes, d.sha256)
        end({ sha: d.sha256 })
      } else end({ err: new Error(d.error || 'no answer') })
    }
    worker.onerror = (e) => {
      e.preventDefault()
      end({ err: new Error(e.message || 'the hashing script did not load') })
    }
    worker.postMessage({ file, slice: HASH_SLICE, every: MARK })
  } catch (err) {
    end({ err })
  }
  return {
    whole,
    onPrefix: (f) => listeners.push(f),
    prefix: (at) =>
      new Promise((resolve) => {
        listeners.push((a, sha) => a === at && resolve(sha))
        whole.then(() => resolve(null))
      }),
    stop: () => end({ err: new Error('stopped') }),
  }
}

/** Keeps, for upload `id`, the sha256 of the longest start of `file` that is both hashed and
 * sent (a mark at or below the bytes sent), so that a later choice can be checked against it.
 * `sent(n)` is told the bytes sent so far; `kept` is what was kept before, if anything. */
export function keeper(id, file, hashing, kept) {
  const marks = []
  let sent = 0
  let at = kept ? kept.at : 0
  let finished = false
  const advance = () => {
    if (finished) return
    let best = null
    while (marks.length && marks[0].at <= sent) best = marks.shift()
    if (!best || best.at <= at) return
    at = best.at
    try {
      localStorage.setItem(key(id), JSON.stringify({ name: file.name, size: file.size, at, sha256: best.sha }))
    } catch (_) {}
  }
  hashing.onPrefix((a, sha) => {
    marks.push({ at: a, sha })
    advance()
  })
  return {
    sent(n) {
      sent = n
      advance()
    },
    /** The upload completed: forget what was kept, and keep nothing the hashing (which may
     * lag behind the bytes sent) reports after. */
    done() {
      finished = true
      forget(id)
    },
  }
}
