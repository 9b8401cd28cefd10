'use strict'
// tus-js-client's parallelUploads: the file is split into partial uploads
// (Upload-Concat: partial) sent side by side, then one final upload
// (Upload-Concat: final;<urls>) joins them: the concatenation extension.
const fs = require('fs')
const path = require('path')
const { tus, KiB, args, run, headOffset, done, fail } = require('./common')

async function main() {
  const { endpoint, file } = args()
  const upload = new tus.Upload(fs.createReadStream(file), {
    endpoint,
    parallelUploads: 3,
    chunkSize: 256 * KiB,
    retryDelays: null,
    metadata: { filename: path.basename(file) },
  })
  await run(upload)
  const size = fs.statSync(file).size
  // The server builds the final upload from its parts; HEAD shows Upload-Offset once done.
  let off = null
  for (let i = 0; i < 300 && off === null; i++) {
    off = await headOffset(upload.url, endpoint).catch(() => null)
    if (off === null) await new Promise((r) => setTimeout(r, 100))
  }
  if (off !== size) throw new Error(`final upload offset ${off} != size ${size}`)
  done({ url: upload.url })
}

main().catch(fail)
