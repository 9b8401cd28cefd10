'use strict'
// Upload throughput, Chromium vs Node (issue 16 "Measure"):
//   node web/bench.js FERRY_BINARY SIZE_MIB [ROUNDS]
// Starts FERRY_BINARY (`serve` on a free loopback port, a temporary data dir), writes one file
// of SIZE_MIB random MiB, and uploads it ROUNDS times (default 4) in the order A B B A …:
//   A = the request-a-file page (Uppy + @uppy/tus, 16 MiB PATCHes) in Debian's Chromium via
//       playwright-core: an upload-scope page_url, the file set on the page's input; timed from
//       setting the file to the page's "All bytes sent" (the page also hashes the file while
//       it sends, as it does for people);
//   B = tus-js-client in Node (a file stream, the same 16 MiB chunkSize) into an upload created
//       the same way; timed from start() to onSuccess.
// Every round checks the sha256 ferry stored, then deletes the upload. Prints one JSON line:
// {"size", "rounds": [{"client", "seconds", "mb_s", "load": [1-min load average before, after],
// "verified_seconds" (Chromium: until the page showed the sha256 comparison)}…], "median_mb_s",
// "ratio" (Chromium's median MB/s ÷ Node's)}.
const fs = require('fs')
const os = require('os')
const path = require('path')
const crypto = require('crypto')
const { spawn } = require('child_process')
const tus = require('tus-js-client')
const { launch, watchedPage, waitState } = require('./browser')

const CHUNK = 16 * 1024 * 1024

function startFerry(bin, data) {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, ['serve', '--listen', '127.0.0.1:0', '--data', data], { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, RUST_LOG: 'warn' } })
    let buf = ''
    child.stdout.on('data', (d) => {
      buf += d
      const m = buf.match(/listening on (\S+)/)
      if (m) resolve({ child, base: m[1].replace(/\/+$/, '') })
    })
    child.on('exit', (code) => reject(new Error(`ferry exited (${code}) before listening`)))
  })
}

async function writeFile(file, size) {
  const h = crypto.createHash('sha256')
  const fd = fs.openSync(file, 'w')
  for (let at = 0; at < size; at += CHUNK) {
    const b = crypto.randomBytes(Math.min(CHUNK, size - at))
    h.update(b)
    fs.writeSync(fd, b)
  }
  fs.closeSync(fd)
  return h.digest('hex')
}

async function create(base, size, name) {
  const res = await fetch(`${base}/files/`, {
    method: 'POST',
    headers: { 'tus-resumable': '1.0.0', 'upload-length': String(size), 'upload-metadata': `filename ${Buffer.from(name).toString('base64')}` },
  })
  if (res.status !== 201) throw new Error(`create: ${res.status}`)
  return new URL(res.headers.get('location'), base).href
}

async function fileInfo(base, id) {
  return (await fetch(`${base}/api/v1/files/${id}`)).json()
}

async function viaChromium(browser, base, url, file) {
  const id = url.split('/').pop()
  const share = await (await fetch(`${base}/api/v1/files/${id}/share`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"scope":"upload","ttl_ms":3600000}' })).json()
  const { page, ctx } = await watchedPage(browser, { width: 1000, height: 800 })
  await page.goto(share.page_url)
  await waitState(page, ['ready'])
  const t0 = process.hrtime.bigint()
  await page.setInputFiles('#pick', file)
  await page.waitForFunction(() => document.getElementById('status').textContent.startsWith('All bytes sent') || ['done', 'failed', 'mismatch'].includes(document.body.dataset.state), null, {
    timeout: 3600000,
    polling: 50,
  })
  const t1 = process.hrtime.bigint()
  await waitState(page, ['done'], 3600000)
  const t2 = process.hrtime.bigint()
  await ctx.close()
  return { seconds: Number(t1 - t0) / 1e9, verified_seconds: Number(t2 - t0) / 1e9 }
}

function viaNode(url, file, size) {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint()
    const up = new tus.Upload(fs.createReadStream(file), {
      uploadUrl: url,
      uploadSize: size,
      chunkSize: CHUNK,
      retryDelays: [0, 1000, 3000],
      onSuccess: () => resolve({ seconds: Number(process.hrtime.bigint() - t0) / 1e9 }),
      onError: reject,
    })
    up.start()
  })
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2
}

async function main() {
  const [bin, mib, roundsArg] = process.argv.slice(2)
  const size = Number(mib) * 1024 * 1024
  const rounds = Number(roundsArg || 4)
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-web-bench-'))
  const file = path.join(tmp, 'upload.bin')
  let ferry
  let browser
  try {
    const sha = await writeFile(file, size)
    ferry = await startFerry(bin, path.join(tmp, 'data'))
    browser = await launch()
    const order = Array.from({ length: rounds }, (_, i) => (i % 4 === 0 || i % 4 === 3 ? 'chromium' : 'node'))
    const out = []
    for (const client of order) {
      const url = await create(ferry.base, size, 'upload.bin')
      const load = os.loadavg()[0]
      const t = client === 'chromium' ? await viaChromium(browser, ferry.base, url, file) : await viaNode(url, file, size)
      const seconds = t.seconds
      const id = url.split('/').pop()
      const info = await fileInfo(ferry.base, id)
      if (info.sha256 !== sha) throw new Error(`${client}: stored sha256 ${info.sha256}, file ${sha}`)
      await fetch(url, { method: 'DELETE', headers: { 'tus-resumable': '1.0.0' } })
      const row = { client, seconds: +seconds.toFixed(3), mb_s: +(size / seconds / 1e6).toFixed(1), load: [+load.toFixed(2), +os.loadavg()[0].toFixed(2)] }
      // The page's own end: its sha256 of the file (computed while sending) compared with ferry's.
      if (t.verified_seconds) row.verified_seconds = +t.verified_seconds.toFixed(3)
      out.push(row)
      process.stderr.write(`${JSON.stringify(out[out.length - 1])}\n`)
    }
    const med = (c) => median(out.filter((r) => r.client === c).map((r) => r.mb_s))
    const m = { chromium: med('chromium'), node: med('node') }
    process.stdout.write(`${JSON.stringify({ size, rounds: out, median_mb_s: m, ratio: +(m.chromium / m.node).toFixed(3), cpus: os.cpus().length })}\n`)
  } finally {
    if (browser) await browser.close()
    if (ferry) ferry.child.kill('SIGTERM')
    fs.rmSync(tmp, { recursive: true, force: true })
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error('FAILED:', e && e.stack ? e.stack : e)
    process.exit(1)
  },
)
