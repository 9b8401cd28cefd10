'use strict'
// Upload throughput of the pages in Chromium vs tus-js-client in Node (issues 16, 24):
//   node web/bench.js FERRY_BINARY SIZE_MIB [PASSES]
// Starts FERRY_BINARY (`serve` on a free loopback port, a temporary data dir, no tokens), writes
// one file of SIZE_MIB random MiB, and uploads it through each client in turn, PASSES times
// (default 2), every other pass in reverse order (A B C C B A …) so a trend in the machine's load
// falls on every client alike. The clients:
//   page:V = the request-a-file page (Uppy + @uppy/tus) in Debian's Chromium via playwright-core:
//       an upload-scope page_url, the file set on the page's input; timed from setting the file
//       to the page's "All bytes sent" (the page also hashes the file while it sends, as it
//       does for people; `verified_seconds` runs until it showed the sha256 comparison);
//   dash:V = the dashboard at `/` (Uppy + @uppy/tus, creating its own upload): timed from
//       setting the file on its input until its row says the file was sent;
//   node = tus-js-client in Node (a file stream, chunkSize FERRY_BENCH_NODE_CHUNK_MIB, default
//       16) into an upload created the same way; timed from start() to onSuccess; `node:N`
//       the same with chunkSize N MiB (ratios are against `node`).
// V names the bundle: `server` (what FERRY_BINARY embeds), or each NAME=DIR of
// FERRY_BENCH_PAGES (comma-separated), whose DIR/app.js (and DIR/hash.js, when there) the
// browser gets instead (DevTools Fetch interception of those two requests only), so two builds of the pages meet the same server in
// one run — e.g. `before=DIR` with DIR holding `git show main:web/dist/app.js`.
// FERRY_BENCH_CLIENTS (comma-separated, default every one) picks clients.
// Every round checks the sha256 ferry stored, then deletes the upload. Prints one JSON line:
// {"size", "rounds": [{"client", "seconds", "mb_s", "load": [1-min load average before, after],
// "verified_seconds"}…], "median_mb_s": {client: MB/s}, "ratio": {client: its median ÷ node's}}.
const fs = require('fs')
const os = require('os')
const path = require('path')
const crypto = require('crypto')
const { spawn } = require('child_process')
const tus = require('tus-js-client')
const { launch, watchedPage, waitState } = require('./browser')

const CHUNK = 16 * 1024 * 1024
const NODE_CHUNK = Number(process.env.FERRY_BENCH_NODE_CHUNK_MIB || 16) * 1024 * 1024
// What ferry sends with /assets/hash.js (src/http/web.rs WORKER_CSP), for a swapped hash.js.
const WORKER_CSP = "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

/** A page (and its context) whose /assets/app.js and /assets/hash.js come from `dir` (null: the
 * server's), with what watchedPage records. The swap uses the DevTools protocol's
 * Fetch domain with URL patterns, so only those two requests stop in the bench; playwright's
 * own `route` would pause every request, the uploads' PATCHes too, and slow them down. */
async function variantPage(browser, dir) {
  const watched = await watchedPage(browser, { width: 1000, height: 800 })
  if (!dir) return watched
  const bodies = {}
  for (const name of ['app.js', 'hash.js']) {
    const file = path.join(dir, name)
    if (fs.existsSync(file)) bodies[name] = fs.readFileSync(file).toString('base64')
  }
  const cdp = await watched.ctx.newCDPSession(watched.page)
  cdp.on('Fetch.requestPaused', (e) => {
    const name = new URL(e.request.url).pathname.split('/').pop()
    const headers = [
      { name: 'content-type', value: 'text/javascript; charset=utf-8' },
      { name: 'cache-control', value: 'no-store' },
      { name: 'content-security-policy', value: WORKER_CSP },
    ]
    cdp.send('Fetch.fulfillRequest', { requestId: e.requestId, responseCode: 200, responseHeaders: headers, body: bodies[name] }).catch(() => {})
  })
  await cdp.send('Fetch.enable', { patterns: Object.keys(bodies).map((n) => ({ urlPattern: `*/assets/${n}` })) })
  return watched
}

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

async function viaPage(browser, dir, base, url, file) {
  const id = url.split('/').pop()
  const share = await (await fetch(`${base}/api/v1/files/${id}/share`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"scope":"upload","ttl_ms":3600000}' })).json()
  const { page, ctx, seen } = await variantPage(browser, dir)
  await page.goto(share.page_url)
  await waitState(page, ['ready'])
  const t0 = process.hrtime.bigint()
  await page.setInputFiles('#pick', file)
  await page.waitForFunction(() => document.getElementById('status').textContent.startsWith('All bytes sent') || ['done', 'failed', 'mismatch', 'unverified'].includes(document.body.dataset.state), null, {
    timeout: 3600000,
    polling: 50,
  })
  const t1 = process.hrtime.bigint()
  await waitState(page, ['done'], 3600000)
  const t2 = process.hrtime.bigint()
  await ctx.close()
  if (seen.errors.length) throw new Error(`page errors: ${seen.errors}`)
  return { id, seconds: Number(t1 - t0) / 1e9, verified_seconds: Number(t2 - t0) / 1e9 }
}

async function viaDashboard(browser, dir, base, file) {
  const { page, ctx, seen } = await variantPage(browser, dir)
  await page.goto(`${base}/`)
  await waitState(page, ['ready'])
  const t0 = process.hrtime.bigint()
  await page.setInputFiles('#pick', file)
  await page.waitForFunction(() => Array.from(document.querySelectorAll('#uploads li')).some((li) => ['sent', 'stored', 'failed'].includes(li.dataset.state)), null, { timeout: 3600000, polling: 50 })
  const t1 = process.hrtime.bigint()
  const row = await page.evaluate(() => {
    const li = document.querySelector('#uploads li')
    return { state: li.dataset.state, id: li.dataset.id, text: li.textContent }
  })
  await ctx.close()
  if (row.state === 'failed' || !row.id) throw new Error(`dashboard upload: ${JSON.stringify(row)}`)
  if (seen.errors.length) throw new Error(`dashboard errors: ${seen.errors}`)
  return { id: row.id, seconds: Number(t1 - t0) / 1e9 }
}

function viaNode(url, file, size, chunk) {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint()
    const up = new tus.Upload(fs.createReadStream(file), {
      uploadUrl: url,
      uploadSize: size,
      chunkSize: chunk,
      retryDelays: [0, 1000, 3000],
      onSuccess: () => resolve({ id: url.split('/').pop(), seconds: Number(process.hrtime.bigint() - t0) / 1e9 }),
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
  const [bin, mib, passesArg] = process.argv.slice(2)
  const size = Number(mib) * 1024 * 1024
  const passes = Number(passesArg || 2)
  const variants = [['server', null]].concat(
    (process.env.FERRY_BENCH_PAGES || '')
      .split(',')
      .filter(Boolean)
      .map((v) => {
        const [name, dir] = v.split('=')
        return [name, path.resolve(dir)]
      }),
  )
  let clients = variants.flatMap(([v]) => [`page:${v}`, `dash:${v}`]).concat(['node'])
  if (process.env.FERRY_BENCH_CLIENTS) clients = process.env.FERRY_BENCH_CLIENTS.split(',')
  const dirOf = (client) => {
    const v = variants.find(([n]) => n === client.split(':')[1])
    if (!v) throw new Error(`no bundle ${client}`)
    return v[1]
  }
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-web-bench-'))
  const file = path.join(tmp, 'upload.bin')
  let ferry
  let browser
  try {
    const sha = await writeFile(file, size)
    ferry = await startFerry(bin, path.join(tmp, 'data'))
    browser = await launch()
    const order = Array.from({ length: passes }, (_, i) => (i % 2 ? [...clients].reverse() : clients)).flat()
    const out = []
    for (const client of order) {
      const load = os.loadavg()[0]
      let t
      if (client.startsWith('dash:')) t = await viaDashboard(browser, dirOf(client), ferry.base, file)
      else {
        const url = await create(ferry.base, size, 'upload.bin')
        t = client.startsWith('node') ? await viaNode(url, file, size, client.includes(':') ? Number(client.split(':')[1]) * 1024 * 1024 : NODE_CHUNK) : await viaPage(browser, dirOf(client), ferry.base, url, file)
      }
      const info = await fileInfo(ferry.base, t.id)
      if (info.sha256 !== sha) throw new Error(`${client}: stored sha256 ${info.sha256}, file ${sha}`)
      await fetch(`${ferry.base}/files/${t.id}`, { method: 'DELETE', headers: { 'tus-resumable': '1.0.0' } })
      const row = { client, seconds: +t.seconds.toFixed(3), mb_s: +(size / t.seconds / 1e6).toFixed(1), load: [+load.toFixed(2), +os.loadavg()[0].toFixed(2)] }
      // The page's own end: its sha256 of the file (computed while sending) compared with ferry's.
      if (t.verified_seconds) row.verified_seconds = +t.verified_seconds.toFixed(3)
      out.push(row)
      process.stderr.write(`${JSON.stringify(row)}\n`)
    }
    const median_mb_s = Object.fromEntries(clients.map((c) => [c, median(out.filter((r) => r.client === c).map((r) => r.mb_s))]))
    const ratio = Object.fromEntries(clients.filter((c) => c !== 'node' && clients.includes('node')).map((c) => [c, +(median_mb_s[c] / median_mb_s.node).toFixed(3)]))
    const verified = Object.fromEntries(clients.filter((c) => c.startsWith('page:')).map((c) => [c, median(out.filter((r) => r.client === c).map((r) => r.verified_seconds))]))
    process.stdout.write(`${JSON.stringify({ size, node_chunk: NODE_CHUNK, rounds: out, median_mb_s, ratio, median_verified_seconds: verified, cpus: os.cpus().length })}\n`)
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
