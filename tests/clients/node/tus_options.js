'use strict'
// Upload FILE with tus-js-client and the given options (JSON), counting the PATCH requests
// it sends: `node tus_options.js SERVER_BASE FILE '{"chunkSize":1048576}'`.
// "chunkSize": null means Infinity (tus-js-client's default: the whole file in one PATCH).
// Prints {"url": ..., "patches": N, "posts": N, "request_ids": N} (requests that carried
// X-Request-ID, which `addRequestId: true` adds), "draft_requests": N (requests that spoke the
// IETF draft: TUS_PROTOCOL=ietf-draft-03/05). Run by tests/interop_tus_js.rs.
const fs = require('fs')
const path = require('path')
const { tus, args, run, headOffset, done, fail, protocolOptions } = require('./common')

async function main() {
  const { endpoint, file, rest } = args()
  const options = JSON.parse(rest[0] || '{}')
  if (options.chunkSize === null) options.chunkSize = Infinity
  let patches = 0
  let posts = 0
  let requestIds = 0
  let draftRequests = 0
  const upload = new tus.Upload(fs.createReadStream(file), {
    ...protocolOptions(),
    endpoint,
    retryDelays: null, // no silent retries: any server error fails the test
    metadata: { filename: path.basename(file) },
    ...options,
    onBeforeRequest: (req) => {
      if (req.getMethod() === 'PATCH') patches += 1
      if (req.getMethod() === 'POST') posts += 1
      if (req.getHeader('X-Request-ID')) requestIds += 1
      if (req.getHeader('Upload-Draft-Interop-Version')) draftRequests += 1
    },
  })
  await run(upload)
  const size = fs.statSync(file).size
  // A final (concatenated) upload is joined by the server; HEAD shows its offset once done.
  let off = null
  for (let i = 0; i < 300 && off !== size; i++) {
    off = await headOffset(upload.url, endpoint).catch(() => null)
    if (off !== size) await new Promise((r) => setTimeout(r, 100))
  }
  if (off !== size) throw new Error(`final offset ${off} != size ${size}`)
  done({ url: upload.url, patches, posts, request_ids: requestIds, draft_requests: draftRequests })
}

main().catch(fail)
