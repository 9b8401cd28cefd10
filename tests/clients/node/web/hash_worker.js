'use strict'
// The request-a-file page's sha256 comes from its Web Worker (tests/web_pages.rs, issue 24):
//   node web/hash_worker.js SPEC.json
// SPEC: {"file": PATH, "intact": PAGE_URL, "altered": PAGE_URL, "no_worker": PAGE_URL}, three
// upload pages for the same FILE. Each sends FILE through the page, unchanged but for:
//   intact    — nothing: the page's own hash must match the server's;
//   altered   — the page's info request answers a different sha256 once the upload is
//               complete (the bytes the server stored are right: only what the page is told
//               differs), so the page must show the mismatch;
//   no_worker — /assets/hash.js answers 404: the page has no other way to hash, so it must say
//               it could not compute the sha256 (and still show the server's).
// Prints {"intact": {...}, "altered": {...}, "no_worker": {...}}, each with what the page showed
// (state, verdict, sha_local, sha_server), the workers it started (their URLs), the
// Content-Security-Policy of the page and of the worker's script, and the console errors
// (a CSP violation is one).
const fs = require('fs')
const { launch, watchedPage, waitState, text, done } = require('./browser')

async function run(browser, pageUrl, file, tweak) {
  const { page, seen, ctx } = await watchedPage(browser, { width: 1000, height: 800 })
  const workers = []
  page.on('worker', (w) => workers.push(new URL(w.url()).pathname))
  let workerCsp = null
  ctx.on('response', (r) => {
    if (new URL(r.url()).pathname === '/assets/hash.js') workerCsp = r.headers()['content-security-policy'] || ''
  })
  if (tweak) await tweak(ctx)
  const res = await page.goto(pageUrl)
  await waitState(page, ['ready'])
  await page.setInputFiles('#pick', file)
  await page.waitForFunction(() => ['done', 'mismatch', 'unverified', 'failed', 'error'].includes(document.body.dataset.state), null, { timeout: 300000 })
  const out = {
    state: await page.evaluate(() => document.body.dataset.state),
    verdict: await text(page, 'verdict'),
    sha_local: await text(page, 'sha-local'),
    sha_server: await text(page, 'sha-server'),
    workers,
    page_csp: res.headers()['content-security-policy'],
    worker_csp: workerCsp,
    errors: seen.errors,
    dialogs: seen.dialogs,
  }
  await ctx.close()
  return out
}

async function main() {
  const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
  const browser = await launch()
  try {
    const intact = await run(browser, spec.intact, spec.file)
    const altered = await run(browser, spec.altered, spec.file, (ctx) =>
      ctx.route('**/share/*/info?*', async (route) => {
        const res = await route.fetch()
        const body = await res.json()
        if (body.file && body.file.complete && body.file.sha256) body.file.sha256 = body.file.sha256.replace(/^./, (c) => (c === '0' ? '1' : '0'))
        await route.fulfill({ response: res, json: body })
      }),
    )
    const noWorker = await run(browser, spec.no_worker, spec.file, (ctx) => ctx.route('**/assets/hash.js', (route) => route.fulfill({ status: 404, body: 'not here' })))
    done({ intact, altered, no_worker: noWorker })
  } finally {
    await browser.close()
  }
}

main().then(() => process.exit(0))
