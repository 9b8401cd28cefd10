'use strict'
// Upload with `uploadLengthDeferred: true` from a plain Readable (size unknown to the client):
// POST carries Upload-Defer-Length: 1 and the length is sent on the last PATCH.
const fs = require('fs')
const { PassThrough } = require('stream')
const { tus, KiB, args, run, headOffset, done, fail, protocolOptions } = require('./common')

async function main() {
  const { endpoint, file } = args()
  // Pipe through a PassThrough so tus-js-client sees a generic stream (not a file it could stat).
  const source = fs.createReadStream(file, { highWaterMark: 64 * KiB }).pipe(new PassThrough())
  const upload = new tus.Upload(source, {
    ...protocolOptions(),
    endpoint,
    chunkSize: 192 * KiB, // required for streams; not a power of two on purpose
    uploadLengthDeferred: true,
    retryDelays: null,
    metadata: { filename: 'deferred.bin' },
  })
  await run(upload)
  const size = fs.statSync(file).size
  const off = await headOffset(upload.url, endpoint)
  if (off !== size) throw new Error(`final offset ${off} != size ${size}`)
  done({ url: upload.url })
}

main().catch(fail)
