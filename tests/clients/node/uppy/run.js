'use strict'
// Uppy in headless Chromium, on a page served from another origin than ferry (so CORS is
// real): upload a generated file, pause, resume, finish; take a screenshot.
//   node uppy/run.js SERVER_BASE SCREENSHOT.png [SIZE] [CHUNK_SIZE]
// Prints {"url", "sha256", "size", "paused_at", "patches", "origin", "protocols"} on success.
// The browser is Debian's chromium (FERRY_CHROMIUM overrides /usr/bin/chromium), driven by
// playwright-core; nothing is downloaded. Run by tests/interop_uppy.rs.
const fs = require('fs')
const http = require('http')
const path = require('path')
const esbuild = require('esbuild')
const { chromium } = require('playwright-core')

const LAUNCH_FLAGS = [
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
]

async function bundle() {
  const out = await esbuild.build({
    entryPoints: [path.join(__dirname, 'entry.js')],
    bundle: true,
    format: 'iife',
    platform: 'browser',
    target: 'chrome120',
    write: false,
    logLevel: 'silent',
  })
  return out.outputFiles[0].contents
}

// A static server for the page on its own loopback port (a different origin than ferry):
// PAGE_PORT when set (the test lists that origin in ferry's `--cors-allow-origins`), else any.
function servePage(files) {
  const server = http.createServer((req, res) => {
    const name = new URL(req.url, 'http://x').pathname.replace(/^\//, '') || 'index.html'
    const body = files[name]
    if (!body) {
      res.writeHead(404).end('not found')
      return
    }
    const type = name.endsWith('.html') ? 'text/html; charset=utf-8' : 'text/javascript; charset=utf-8'
    res.writeHead(200, { 'content-type': type, 'cache-control': 'no-store' }).end(body)
  })
  return new Promise((resolve) => server.listen(Number(process.env.PAGE_PORT || 0), '127.0.0.1', () => resolve(server)))
}

async function main() {
  const [base, screenshot, sizeArg, chunkArg] = process.argv.slice(2)
  if (!base || !screenshot) {
    console.error('usage: node uppy/run.js SERVER_BASE SCREENSHOT.png [SIZE] [CHUNK_SIZE]')
    process.exit(2)
  }
  const size = Number(sizeArg || 6 * 1024 * 1024 + 123)
  const chunkSize = Number(chunkArg || 512 * 1024)
  const endpoint = base.replace(/\/+$/, '') + '/files/'
  const executablePath = process.env.FERRY_CHROMIUM || '/usr/bin/chromium'
  if (!fs.existsSync(executablePath)) {
    throw new Error(`Chromium not found at ${executablePath}: install it with \`apt-get install -y chromium\` (bash .ci/run does)`)
  }
  const files = {
    'index.html': fs.readFileSync(path.join(__dirname, 'index.html')),
    'page.js': fs.readFileSync(path.join(__dirname, 'page.js')),
    'bundle.js': await bundle(),
  }
  const pageServer = await servePage(files)
  const pageOrigin = `http://127.0.0.1:${pageServer.address().port}`
  if (new URL(pageOrigin).origin === new URL(endpoint).origin) throw new Error('the page must not share ferry\'s origin')
  const browser = await chromium.launch({ executablePath, headless: true, args: LAUNCH_FLAGS })
  const logs = []
  try {
    // TRUST_ANY_CERT=1: ferry serves HTTPS with a test CA's certificate (tests/http2.rs).
    const page = await browser.newPage({ viewport: { width: 1000, height: 520 }, ignoreHTTPSErrors: process.env.TRUST_ANY_CERT === '1' })
    // The protocol each answer from ferry came over (`h2`, `http/1.1`), as Chromium's network
    // layer reports it (DevTools protocol: Network.responseReceived).
    const protocols = []
    const cdp = await page.context().newCDPSession(page)
    await cdp.send('Network.enable')
    cdp.on('Network.responseReceived', (e) => {
      if (e.response.url.startsWith(endpoint)) protocols.push(e.response.protocol)
    })
    page.on('console', (m) => logs.push(`console.${m.type()}: ${m.text()}`))
    page.on('pageerror', (e) => logs.push(`pageerror: ${e.message}`))
    page.on('requestfailed', (r) => logs.push(`requestfailed: ${r.method()} ${r.url()} ${r.failure() && r.failure().errorText}`))
    await page.goto(`${pageOrigin}/index.html`)
    let result
    try {
      result = await page.evaluate(([e, s, c]) => window.runScenario(e, s, c), [endpoint, size, chunkSize])
    } finally {
      fs.mkdirSync(path.dirname(path.resolve(screenshot)), { recursive: true })
      await page.screenshot({ path: screenshot, fullPage: true })
    }
    process.stdout.write(JSON.stringify({ ...result, protocols }) + '\n')
  } catch (err) {
    console.error(logs.join('\n'))
    throw err
  } finally {
    await browser.close()
    pageServer.close()
  }
}

main().catch((err) => {
  console.error('FAILED:', err && err.stack ? err.stack : err)
  process.exit(1)
})
