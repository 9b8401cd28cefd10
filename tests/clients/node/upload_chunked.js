'use strict'
// Plain upload of a file in small (256 KiB) PATCH chunks.
const fs = require('fs')
const path = require('path')
const { tus, KiB, args, run, done, fail } = require('./common')

async function main() {
  const { endpoint, file } = args()
  let chunks = 0
  const upload = new tus.Upload(fs.createReadStream(file), {
    endpoint,
    chunkSize: 256 * KiB,
    retryDelays: null, // no silent retries: any server error fails the test
    metadata: { filename: path.basename(file), filetype: 'application/octet-stream' },
    onChunkComplete: () => {
      chunks += 1
    },
  })
  await run(upload)
  done({ url: upload.url, chunks })
}

main().catch(fail)
