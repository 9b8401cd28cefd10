'use strict'
// Upload FILE with tus-js-client expecting the server to refuse it (a pre-create or pre-finish
// hook): `node expect_rejected.js SERVER_BASE FILE [NAME]`. Prints {"status", "body", "message"}
// of the refusal tus-js-client reports; exits 1 if the upload succeeds. Run by tests/events.rs.
const fs = require('fs')
const path = require('path')
const { tus, args, done, fail } = require('./common')

async function main() {
  const { endpoint, file, rest } = args()
  const name = rest[0] || path.basename(file)
  const err = await new Promise((resolve, reject) => {
    const upload = new tus.Upload(fs.createReadStream(file), {
      endpoint,
      retryDelays: null,
      metadata: { filename: name },
      onSuccess: () => reject(new Error('the upload succeeded; expected a refusal')),
      onError: resolve,
    })
    upload.start()
  })
  const res = err.originalResponse
  done({ status: res ? res.getStatus() : null, body: res ? res.getBody() : null, message: String(err.message || err) })
}

main().catch(fail)
