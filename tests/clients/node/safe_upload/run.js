'use strict'
// Headless Chromium on a page served from another origin than ferry: the safe browser-upload
// flows of page.js. Records every request the browser sends to ferry, so the test can check
// which ones carried an Authorization header.
//   node safe_upload/run.js PARAMS_JSON
// PARAMS_JSON: {"base", "signedUrl", "scopedToken", "otherId", "size"}.
// Prints {"signed", "scoped", "refused", "requests": [{method, url, authorization}], "origin"}.
const fs = require('fs')
const http = require('http')
const path = require('path')
const esbuild = require('esbuild')
const { chromium } = require('playwright-core')

const LAUNCH_FLAGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync']

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
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)))
}

async function main() {
  const params = JSON.parse(process.argv[2])
  params.endpoint = params.base.replace(/\/+$/, '') + '/files/'
  const executablePath = process.env.FERRY_CHROMIUM || '/usr/bin/chromium'
  if (!fs.existsSync(executablePath)) throw new Error(`Chromium not found at ${executablePath}: apt-get install -y chromium (bash .ci/run does)`)
  const files = {
    'index.html': fs.readFileSync(path.join(__dirname, 'index.html')),
    'page.js': fs.readFileSync(path.join(__dirname, 'page.js')),
    'bundle.js': await bundle(),
  }
  const pageServer = await servePage(files)
  const origin = `http://127.0.0.1:${pageServer.address().port}`
  if (origin === new URL(params.endpoint).origin) throw new Error('the page must not share ferry\'s origin')
  const browser = await chromium.launch({ executablePath, headless: true, args: LAUNCH_FLAGS })
  const logs = []
  const requests = []
  try {
    const page = await browser.newPage()
    page.on('console', (m) => logs.push(`console.${m.type()}: ${m.text()}`))
    page.on('pageerror', (e) => logs.push(`pageerror: ${e.message}`))
    page.on('request', (r) => {
      if (r.url().startsWith(params.base)) requests.push({ method: r.method(), url: r.url(), authorization: r.headers()['authorization'] || null })
    })
    await page.goto(`${origin}/index.html`)
    const html = await page.content()
    const result = await page.evaluate((p) => window.runScenario(p), params)
    result.requests = requests
    result.origin = origin
    result.page_html_has_token = html.includes('fy_')
    process.stdout.write(JSON.stringify(result) + '\n')
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
