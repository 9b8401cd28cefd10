'use strict'
// The request-a-file page, interrupted (tests/web_pages.rs):
//   node web/request.js PAGE_URL FILE ARTIFACT_DIR
// Opens the page, sets FILE on the input, pauses once part of it is sent and prints
// {"event":"paused","uploaded":N}; then waits for a line on stdin (the test kills -9 ferry and
// restarts it meanwhile), reloads the page, sets the same file again and waits for the end.
// Prints {"sha_local","sha_server","verdict","received_after_reload","dialogs",…}.
const readline = require('readline')
const { launch, watchedPage, waitState, text, shot, done } = require('./browser')

async function main() {
  const [pageUrl, file, artifacts] = process.argv.slice(2)
  const rl = readline.createInterface({ input: process.stdin })
  const lines = rl[Symbol.asyncIterator]()
  const browser = await launch()
  try {
    const { page, seen } = await watchedPage(browser, { width: 1000, height: 800 })
    const first = await page.goto(pageUrl)
    const csp = first.headers()['content-security-policy']
    await waitState(page, ['ready'])
    const asked = { name: await text(page, 'up-name'), size: await text(page, 'up-size'), expires: await text(page, 'up-expires') }
    // Pause as soon as some bytes are out (in the page, so a fast loopback cannot outrun it).
    await page.evaluate(() => {
      new MutationObserver((_, obs) => {
        if (Number(document.body.dataset.uploaded || 0) >= 4 * 1024 * 1024) {
          obs.disconnect()
          document.getElementById('pause').click()
        }
      }).observe(document.body, { attributes: true, attributeFilter: ['data-uploaded'] })
    })
    await page.setInputFiles('#pick', file)
    await waitState(page, ['paused'])
    const uploaded = Number(await page.evaluate(() => document.body.dataset.uploaded))
    done({ event: 'paused', uploaded })
    await lines.next() // ferry was killed and restarted
    rl.close()
    await page.reload()
    await waitState(page, ['ready'])
    const receivedAfterReload = await text(page, 'up-received')
    const dropText = await text(page, 'drop-text')
    await page.setInputFiles('#pick', file)
    await waitState(page, ['done'], 300000)
    await page.screenshot({ path: shot(artifacts, 'web-request.png'), fullPage: true })
    const phone = await watchedPage(browser, { width: 390, height: 844 })
    await phone.page.goto(pageUrl)
    await waitState(phone.page, ['complete'])
    await phone.page.screenshot({ path: shot(artifacts, 'web-request-390x844.png'), fullPage: true })
    done({
      event: 'done',
      csp,
      asked,
      sha_local: await text(page, 'sha-local'),
      sha_server: await text(page, 'sha-server'),
      verdict: await text(page, 'verdict'),
      received_after_reload: receivedAfterReload,
      drop_text: dropText,
      dialogs: seen.dialogs.concat(phone.seen.dialogs),
      errors: seen.errors,
    })
  } finally {
    await browser.close()
  }
}

main().then(() => process.exit(0))
