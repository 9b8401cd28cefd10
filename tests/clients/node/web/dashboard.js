'use strict'
// The dashboard at `/` (tests/web_pages.rs):  node web/dashboard.js SPEC.json
// SPEC: {"base", "token", "artifacts"}. Logs in with the token, prints what the page shows
// ({"event":"login"…}), waits for a stdin line (the test moves a task to 100 %), waits for the
// bar to follow, cancels the other running task through the page, prints {"event":"end"…}.
const fs = require('fs')
const readline = require('readline')
const { launch, watchedPage, waitState, shot, done } = require('./browser')

async function main() {
  const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
  const rl = readline.createInterface({ input: process.stdin })
  const lines = rl[Symbol.asyncIterator]()
  const browser = await launch()
  try {
    const { page, seen } = await watchedPage(browser, { width: 1200, height: 800 })
    await page.goto(spec.base + '/')
    await waitState(page, ['login'])
    await page.fill('#token', spec.token)
    await page.click('#login button[type=submit]')
    await waitState(page, ['ready'])
    await page.waitForFunction(() => document.querySelectorAll('#files tr').length >= 1 && document.querySelectorAll('#tasks tr').length >= 2)
    // Share the first (complete) file from the page.
    await page.click('#files tr button')
    await page.waitForFunction(() => document.getElementById('share-out').textContent.includes('/share/'))
    await page.screenshot({ path: shot(spec.artifacts, 'web-dashboard.png'), fullPage: true })
    done({
      event: 'login',
      url: page.url(),
      stored_in_session: await page.evaluate(() => sessionStorage.getItem('ferry-token') !== null && localStorage.length === 0),
      page: await page.evaluate(() => document.getElementById('dash').textContent),
      share: await page.evaluate(() => document.getElementById('share-out').textContent),
    })
    await lines.next()
    rl.close()
    await page.waitForFunction(() => Array.from(document.querySelectorAll('#tasks progress')).some((p) => p.value === 1), null, { timeout: 60000 })
    const bars = await page.evaluate(() => Array.from(document.querySelectorAll('#tasks progress')).map((p) => p.value))
    // Cancel the task whose bar is not full (the page asks nothing for cancel; delete asks).
    // (In the page: the tables re-render on each change, so element handles go stale.)
    await page.evaluate(() => {
      for (const tr of document.querySelectorAll('#tasks tr')) {
        const b = tr.querySelector('button')
        if (tr.querySelector('progress').value < 1 && b) b.click()
      }
    })
    // Delete asks first: dismissed (the watcher dismisses dialogs), so nothing is deleted.
    await page.evaluate(() => {
      const buttons = document.querySelectorAll('#files tr button')
      buttons[buttons.length - 1].click()
    })
    const phone = await watchedPage(browser, { width: 390, height: 844 })
    await phone.page.goto(spec.base + '/')
    await waitState(phone.page, ['login'])
    await phone.page.screenshot({ path: shot(spec.artifacts, 'web-dashboard-390x844.png'), fullPage: true })
    done({ event: 'end', bars, dialogs: seen.dialogs })
  } finally {
    await browser.close()
  }
}

main().then(() => process.exit(0))
