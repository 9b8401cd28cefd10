'use strict'
// Start an upload in small chunks, abort() it after >30% progress, then resume it the way a
// real app does: a new tus.Upload for the same file finds the stored URL (FileUrlStorage +
// findPreviousUploads + resumeFromPreviousUpload) and continues. Asserts the resume did not
// restart from 0.
//   node abort_resume.js SERVER_BASE FILE [CHUNK_SIZE]   (bytes, or "Infinity": one PATCH, so
//   the abort cuts a request mid-body and the server must keep what it got)
const fs = require('fs')
const os = require('os')
const path = require('path')
const { tus, KiB, args, run, headOffset, done, fail, protocolOptions } = require('./common')

async function main() {
  const { endpoint, file, rest } = args()
  const chunkSize = rest[0] === undefined ? 128 * KiB : Number(rest[0])
  if (Number.isNaN(chunkSize)) throw new Error(`bad CHUNK_SIZE ${rest[0]}`)
  const size = fs.statSync(file).size
  const storeDir = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-tus-js-'))
  const urlStorage = new tus.FileUrlStorage(path.join(storeDir, 'uploads.json'))
  const common = {
    ...protocolOptions(),
    endpoint,
    chunkSize,
    retryDelays: null,
    urlStorage,
    storeFingerprintForResuming: true,
    removeFingerprintOnSuccess: true,
    metadata: { filename: path.basename(file) },
  }

  // Run 1: abort once more than 30% has been sent.
  const first = new tus.Upload(fs.createReadStream(file), { ...common })
  const aborted = await new Promise((resolve, reject) => {
    let stopping = false
    let events = 0
    first.options.onProgress = (sent, total) => {
      if (sent > 0) events += 1
      // Progress is throttled (one call per 100 ms): in single-PATCH mode abort on the first
      // call after the leading one, i.e. ~100 ms into the body; otherwise past 30%.
      const due = chunkSize === Infinity ? events >= 2 : sent > 0.3 * total
      if (!stopping && due) {
        stopping = true
        first.abort().then(() => resolve(sent), reject)
      }
    }
    first.options.onSuccess = () => reject(new Error('upload finished before it could be aborted'))
    first.options.onError = reject
    first.start()
  })
  const firstUrl = first.url
  if (!firstUrl) throw new Error('no upload URL after the first run')

  // What the server kept (it may keep part of the PATCH that was cut).
  const serverOffset = await headOffset(firstUrl, endpoint)
  if (!(serverOffset > 0 && serverOffset < size)) {
    throw new Error(`after abort the server offset is ${serverOffset} (size ${size}, ${aborted} sent)`)
  }

  // Run 2: a fresh Upload object that finds the previous one in the URL storage.
  const second = new tus.Upload(fs.createReadStream(file), { ...common })
  const previous = await second.findPreviousUploads()
  if (previous.length !== 1) throw new Error(`expected 1 stored upload, found ${previous.length}`)
  if (new URL(previous[0].uploadUrl, endpoint).href !== new URL(firstUrl, endpoint).href) {
    throw new Error(`stored URL ${previous[0].uploadUrl} != first run's ${firstUrl}`)
  }
  second.resumeFromPreviousUpload(previous[0])
  let firstProgress = null
  second.options.onProgress = (sent) => {
    if (firstProgress === null) firstProgress = sent
  }
  await run(second)
  if (new URL(second.url, endpoint).href !== new URL(firstUrl, endpoint).href) {
    throw new Error(`resume created a new upload ${second.url} instead of continuing ${firstUrl}`)
  }
  if (firstProgress === null || firstProgress < serverOffset) {
    throw new Error(`resumed upload restarted: first progress ${firstProgress}, server had ${serverOffset}`)
  }
  const finalOffset = await headOffset(second.url, endpoint)
  if (finalOffset !== size) throw new Error(`final offset ${finalOffset} != size ${size}`)
  fs.rmSync(storeDir, { recursive: true, force: true })
  done({ url: second.url, aborted_at: aborted, server_offset: serverOffset, resumed_from: firstProgress })
}

main().catch(fail)
