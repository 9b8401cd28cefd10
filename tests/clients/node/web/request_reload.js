'use strict'
// The request-a-file page checks the file chosen after a reload (tests/web_pages.rs, issue 48
// kind 7):
//   node web/request_reload.js SPEC.json
// SPEC: {"page_url", "a": PATH, "b": PATH (same size as a, other bytes), "artifacts": DIR}.
// 1. Sends A through the page and pauses once 4 MiB are out; waits until the page kept the
//    fingerprint of what it sent. Prints {"event":"paused","uploaded","kept"} and waits for a
//    line on stdin.
// 2. Reloads and chooses B: the page must refuse it before sending anything. Then a second
//    browser (a fresh profile: nothing kept) chooses B: the page must say it cannot check and
//    ask; the test answers "Choose another file". Prints {"event":"refused",…} (the words shown,
//    the PATCH requests made since the reload) and waits for a line on stdin.
// 3. Chooses A in the reloaded page, which must finish with matching fingerprints. Prints
//    {"event":"done",…}.
const fs = require('fs')
const readline = require('readline')
const { launch, watchedPage, waitState, text, shot, done } = require('./browser')

async function main() {
  const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
  const rl = readline.createInterface({ input: process.stdin })
  const lines = rl[Symbol.asyncIterator]()
  const browser = await launch()
  try {
    // en-US, so the test can read the link's expiry in words.
    const viewport = { width: 1000, height: 800 }
    const { page, seen } = await watchedPage(browser, viewport, await browser.newContext({ viewport, locale: 'en-US' }))
    await page.goto(spec.page_url)
    await waitState(page, ['ready'])
    const expires = await text(page, 'up-expires')
    await page.evaluate(() => {
      new MutationObserver((_, obs) => {
        if (Number(document.body.dataset.uploaded || 0) >= 4 * 1024 * 1024) {
          obs.disconnect()
          document.getElementById('pause').click()
        }
      }).observe(document.body, { attributes: true, attributeFilter: ['data-uploaded'] })
    })
    await page.setInputFiles('#pick', spec.a)
    await waitState(page, ['paused'])
    const kept = () => page.evaluate(() => Object.entries(localStorage).filter(([k]) => k.startsWith('ferry.request.')).map(([k, v]) => ({ key: k, ...JSON.parse(v) })))
    await page.waitForFunction(() => Object.keys(localStorage).some((k) => k.startsWith('ferry.request.')), null, { timeout: 60000 })
    done({ event: 'paused', uploaded: Number(await page.evaluate(() => document.body.dataset.uploaded)), kept: await kept() })
    await lines.next()

    const patches = []
    page.on('request', (r) => r.method() === 'PATCH' && patches.push(r.url()))
    await page.reload()
    await waitState(page, ['ready'])
    const received = await text(page, 'up-received')
    await page.setInputFiles('#pick', spec.b)
    await waitState(page, ['refused'])
    const refused = { problem: await text(page, 'pick-problem'), drop_shown: await page.evaluate(() => !document.getElementById('drop').hidden) }
    await page.screenshot({ path: shot(spec.artifacts, 'web-request-refused.png'), fullPage: true })

    // Another browser, which kept nothing: it cannot check, says so, and asks.
    const other = await watchedPage(browser, { width: 390, height: 844 })
    other.page.on('request', (r) => r.method() === 'PATCH' && patches.push(r.url()))
    await other.page.goto(spec.page_url)
    await waitState(other.page, ['ready'])
    await other.page.setInputFiles('#pick', spec.b)
    await waitState(other.page, ['confirm'])
    const asked = await text(other.page, 'confirm-text')
    await other.page.screenshot({ path: shot(spec.artifacts, 'web-request-confirm-390x844.png'), fullPage: true })
    await other.page.click('#confirm-no')
    await waitState(other.page, ['ready'])
    const declined = { drop_shown: await other.page.evaluate(() => !document.getElementById('drop').hidden), status: await text(other.page, 'status') }
    done({ event: 'refused', received, refused, asked, declined, patches, kept: await kept() })
    await lines.next()
    rl.close()

    await page.setInputFiles('#pick', spec.a)
    await waitState(page, ['done'], 300000)
    await page.screenshot({ path: shot(spec.artifacts, 'web-request-resumed.png'), fullPage: true })
    done({
      event: 'done',
      expires,
      size: await text(page, 'up-size'),
      verdict: await text(page, 'verdict'),
      sha_local: await text(page, 'sha-local'),
      sha_server: await text(page, 'sha-server'),
      fingerprints_open: await page.evaluate(() => document.getElementById('fingerprints').open),
      problem_shown: await page.evaluate(() => !document.getElementById('pick-problem').hidden),
      kept: await kept(),
      dialogs: seen.dialogs.concat(other.seen.dialogs),
      errors: seen.errors.concat(other.seen.errors),
    })
  } finally {
    await browser.close()
  }
}

main().then(() => process.exit(0))
