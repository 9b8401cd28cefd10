// Live events for the dashboard: `GET /api/v1/events` (Server-Sent Events) read with fetch, not
// EventSource — EventSource cannot send an Authorization header, and the token must never be
// in a URL. The stream is parsed by `eventsource-parser`; after a drop it reconnects with
// `Last-Event-ID` (the server replays what was missed), backing off 1 s, 2 s, 4 s… up to 30 s.
import { EventSourceParserStream } from 'eventsource-parser/stream'

/** Longest wait between two reconnection attempts, ms. */
export const MAX_BACKOFF_MS = 30000

/** Reconnection delay after `failures` consecutive failures (1, 2, …), ms. */
export function backoff(failures) {
  return Math.min(1000 * 2 ** Math.max(0, failures - 1), MAX_BACKOFF_MS)
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/**
 * Follow `url` until `signal` aborts or the server answers 401.
 *
 * - `headers()` → the request headers (Authorization) for each attempt;
 * - `onOpen({resumed})` when a stream is open (`resumed`: it replays from the last id seen,
 *   so nothing was missed; otherwise the caller should re-read the state it shows);
 * - `onEvent({id, event, data})` for each message;
 * - `onDown(failures, error)` after each failed or ended attempt (1, 2, …; reset by an open
 *   stream that lasted);
 * - `onUnauthorized()` on 401 (then it stops).
 */
export async function follow(url, { headers, onOpen, onEvent, onDown, onUnauthorized, signal }) {
  let lastId = null
  let failures = 0
  while (!signal || !signal.aborted) {
    let openedAt = 0
    try {
      const h = { accept: 'text/event-stream', ...headers() }
      if (lastId) h['last-event-id'] = lastId
      const res = await fetch(url, { headers: h, cache: 'no-store', signal })
      if (res.status === 401) return onUnauthorized()
      if (res.status === 404 && lastId) {
        // The id is past the server's retention: start from now (the caller re-reads state).
        lastId = null
        continue
      }
      if (!res.ok || !res.body) throw new Error(`the event stream answered ${res.status}`)
      openedAt = Date.now()
      onOpen({ resumed: lastId != null })
      const reader = res.body.pipeThrough(new TextDecoderStream()).pipeThrough(new EventSourceParserStream()).getReader()
      for (;;) {
        const { value, done } = await reader.read()
        if (done) break
        // The server's own `error` message (a catalog error): reconnect from the last id.
        if (value.event === 'error') throw new Error(`the server ended the stream: ${value.data}`)
        if (value.id) lastId = value.id
        onEvent(value)
      }
      throw new Error('the event stream ended')
    } catch (e) {
      if (signal && signal.aborted) return
      // A stream that stayed open a while was a success: start the backoff over.
      failures = openedAt && Date.now() - openedAt > 10000 ? 1 : failures + 1
      onDown(failures, e)
      await sleep(backoff(failures))
    }
  }
}
