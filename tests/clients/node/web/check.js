'use strict'
// The download page and refused links (tests/web_pages.rs):
//   node web/check.js SPEC.json
// SPEC: {"download": PAGE_URL, "tampered": URL, "expired": URL, "upload": PAGE_URL?, "artifacts": DIR,
//        "download_dir": DIR}. Prints what each page showed.
const fs = require('fs')
const path = require('path')
const { launch, watchedPage, waitState, text, shot, sha256File, done } = require('./browser')

async function main() {
  const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
  const browser = await launch()
  const out = { dialogs: [], errors: [] }
  try {
    for (const [viewport, suffix] of [[{ width: 1000, height: 700 }, ''], [{ width: 390, height: 844 }, '-390x844']]) {
      const { page, seen, ctx } = await watchedPage(browser, viewport)
      const res = await page.goto(spec.download)
      out.headers = res.headers()
      await waitState(page, ['ready'])
      out.download = {
        name: await text(page, 'dl-name'),
        size: await text(page, 'dl-size'),
        type: await text(page, 'dl-type'),
        sha256: await text(page, 'dl-sha'),
        expires: await text(page, 'dl-expires'),
        images: await page.evaluate(() => document.querySelectorAll('img').length),
      }
      await page.screenshot({ path: shot(spec.artifacts, `web-download${suffix}.png`), fullPage: true })
      if (!suffix) {
        const [download] = await Promise.all([page.waitForEvent('download'), page.click('#dl-button')])
        const saved = path.join(spec.download_dir, 'downloaded')
        await download.saveAs(saved)
        out.downloaded = { suggested: download.suggestedFilename(), sha256: sha256File(saved), failure: await download.failure() }
      }
      if (spec.upload) {
        await page.goto(spec.upload)
        await waitState(page, ['ready'])
        out.upload = { name: await text(page, 'up-name'), images: await page.evaluate(() => document.querySelectorAll('img').length) }
        await page.screenshot({ path: shot(spec.artifacts, `web-upload-xss${suffix}.png`), fullPage: true })
      }
      for (const kind of ['tampered', 'expired']) {
        await page.goto(spec[kind])
        await waitState(page, ['error'])
        out[kind] = { title: await text(page, 'problem-title'), detail: await text(page, 'problem-detail') }
        await page.screenshot({ path: shot(spec.artifacts, `web-${kind}${suffix}.png`), fullPage: true })
      }
      out.dialogs.push(...seen.dialogs)
      out.errors.push(...seen.errors)
      await ctx.close()
    }
    done(out)
  } finally {
    await browser.close()
  }
}

main()
