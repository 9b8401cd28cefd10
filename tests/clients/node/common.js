'use strict'
// Shared helpers for the tus-js-client interop scripts (run by tests/real_clients.rs).
// Every script: node SCRIPT.js SERVER_BASE FILE  ->  prints {"url": ...} on success, exits 1 otherwise.
const tus = require('tus-js-client')

const KiB = 1024

function args() {
  const [base, file, ...rest] = process.argv.slice(2)
  if (!base || !file) {
    console.error(`usage: node ${require('path').basename(process.argv[1])} SERVER_BASE FILE`)
    process.exit(2)
  }
  return { base: base.replace(/\/+$/, ''), endpoint: base.replace(/\/+$/, '') + '/files/', file, rest }
}

// The protocol tus-js-client speaks: TUS 1.0 by default, or the IETF draft when the test sets
// TUS_PROTOCOL=ietf-draft-03 (Upload-Draft-Interop-Version 5) or ietf-draft-05 (6).
const PROTOCOL = process.env.TUS_PROTOCOL || 'tus-v1'
const INTEROP = { 'ietf-draft-03': '5', 'ietf-draft-05': '6' }[PROTOCOL]

// Options every script passes to tus.Upload for the protocol.
function protocolOptions() {
  return { protocol: PROTOCOL }
}

// Run `upload.start()` and resolve with the upload when it succeeds.
function run(upload) {
  return new Promise((resolve, reject) => {
    upload.options.onSuccess = () => resolve(upload)
    upload.options.onError = (err) => reject(err)
    upload.start()
  })
}

// HEAD the upload (URL resolved against `base` if relative) and return its Upload-Offset.
async function headOffset(url, base) {
  url = new URL(url, base).href
  const headers = INTEROP ? { 'Upload-Draft-Interop-Version': INTEROP } : { 'Tus-Resumable': '1.0.0' }
  const res = await fetch(url, { method: 'HEAD', headers })
  if (res.status !== 200 && res.status !== 204) throw new Error(`HEAD ${url}: status ${res.status}`)
  const off = res.headers.get('upload-offset')
  if (off == null || !/^\d+$/.test(off)) throw new Error(`HEAD ${url}: bad Upload-Offset ${off}`)
  return Number(off)
}

function done(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n')
}

function fail(err) {
  console.error('FAILED:', err && err.stack ? err.stack : err)
  if (err && err.originalResponse) {
    const r = err.originalResponse
    try {
      console.error(`response: ${r.getStatus()} ${r.getBody()}`)
    } catch (_) {}
  }
  process.exit(1)
}

process.on('unhandledRejection', fail)

module.exports = { tus, KiB, args, run, headOffset, done, fail, protocolOptions, PROTOCOL }
