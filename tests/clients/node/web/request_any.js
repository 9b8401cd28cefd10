'use strict'
// Requests for a file of any size (tests/web_pages.rs):
//   node web/request_any.js SPEC.json
// SPEC: {page_url (from `ferry request`), file, base (the dashboard), dash_file, dash_name, artifacts}.
// 1. Opens page_url with the upload throttled (Chromium's network emulation), sets `file`,
//    records what the page shows while sending ("Received so far", the line under the bar,
//    speed and time left), pauses, records it again, resumes, waits for the end.
// 2. Opens the dashboard, makes a request named dash_name with "Request a file", opens the
//    link it shows and uploads dash_file through it.
// Prints one JSON line with what it saw.
const fs = require('fs')
const { launch, watchedPage, waitState, text, shot, done } = require('./browser')

const THROTTLE = 8 * 1024 * 1024 // bytes per second of upload

async function main() {
  const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
  const browser = await launch()
  try {
    const { page, seen } = await watchedPage(browser, { width: 1000, height: 800 })
    await page.goto(spec.page_url)
    await waitState(page, ['ready'])
    const asked = { name: await text(page, 'up-name'), size: await text(page, 'up-size'), received: await text(page, 'up-received') }
    const cdp = await page.context().newCDPSession(page)
    await cdp.send('Network.enable')
    await cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: THROTTLE })
    // While sending: once a speed is shown and a third of the file is out, note what the page
    // says and pause (in the page, so nothing races the progress events).
    await page.evaluate(() => {
      window.__seen = []
      new MutationObserver((_, obs) => {
        const uploaded = Number(document.body.dataset.uploaded || 0)
        const sample = {
          uploaded,
          received: document.getElementById('up-received').textContent,
          pct: document.getElementById('pct').textContent,
          rate: document.getElementById('rate').textContent,
          bar: document.getElementById('bar').value,
        }
        window.__seen.push(sample)
        const total = document.getElementById('pick').files[0].size
        if (uploaded >= total / 3 && / left$/.test(sample.rate)) {
          obs.disconnect()
          window.__sending = sample
          document.getElementById('pause').click()
        }
      }).observe(document.body, { attributes: true, attributeFilter: ['data-uploaded'] })
    })
    await page.setInputFiles('#pick', spec.file)
    await waitState(page, ['paused'], 120000)
    const sending = await page.evaluate(() => window.__sending)
    await page.screenshot({ path: shot(spec.artifacts, 'web-request-any-paused.png'), fullPage: true })
    const paused = {
      uploaded: Number(await page.evaluate(() => document.body.dataset.uploaded)),
      received: await text(page, 'up-received'),
      pct: await text(page, 'pct'),
      rate: await text(page, 'rate'),
      status: await text(page, 'status'),
    }
    await cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: -1 })
    await page.click('#pause')
    await waitState(page, ['done'], 300000)
    const finished = {
      size: await text(page, 'up-size'),
      received: await text(page, 'up-received'),
      rate: await text(page, 'rate'),
      sha_local: await text(page, 'sha-local'),
      sha_server: await text(page, 'sha-server'),
      verdict: await text(page, 'verdict'),
      samples: await page.evaluate(() => window.__seen.length),
    }
    // A revisit of the finished request shows the server's sha256 only.
    await page.reload()
    await waitState(page, ['complete'])
    const revisit = { local_shown: await page.evaluate(() => !document.getElementById('sha-local').hidden), sha_server: await text(page, 'sha-server') }

    // The dashboard's "Request a file".
    const dash = await watchedPage(browser, { width: 1100, height: 900 })
    await dash.page.goto(spec.base + '/')
    await waitState(dash.page, ['ready'])
    await dash.page.fill('#request-name', spec.dash_name)
    await dash.page.click('#request button[type=submit]')
    await dash.page.waitForFunction(() => document.getElementById('share-url').value.includes('/share/'), null, { timeout: 30000 })
    const made = {
      link: await dash.page.evaluate(() => document.getElementById('share-url').value),
      what: await text(dash.page, 'share-what'),
      id: await dash.page.evaluate(() => document.body.dataset.requested),
      copy: await dash.page.evaluate(() => !!document.getElementById('share-copy')),
    }
    await dash.page.screenshot({ path: shot(spec.artifacts, 'web-dashboard-request.png'), fullPage: true })
    const other = await watchedPage(browser, { width: 390, height: 844 })
    await other.page.goto(made.link)
    await waitState(other.page, ['ready'])
    made.size = await text(other.page, 'up-size')
    made.name = await text(other.page, 'up-name')
    await other.page.setInputFiles('#pick', spec.dash_file)
    await waitState(other.page, ['done'], 300000)
    made.sha_server = await text(other.page, 'sha-server')
    made.received = await text(other.page, 'up-received')
    await other.page.screenshot({ path: shot(spec.artifacts, 'web-request-any-390x844.png'), fullPage: true })
    // The dashboard lists it by the time the page is done (live events or its poll).
    await dash.page.waitForFunction((id) => !!document.querySelector(`#files tr[data-id="${id}"]`) && document.querySelector(`#files tr[data-id="${id}"]`).textContent.includes('complete'), made.id, { timeout: 60000 })
    made.row = await dash.page.evaluate((id) => document.querySelector(`#files tr[data-id="${id}"]`).textContent, made.id)

    done({
      asked,
      sending,
      paused,
      finished,
      revisit,
      made,
      dialogs: seen.dialogs.concat(dash.seen.dialogs, other.seen.dialogs),
      errors: seen.errors.concat(dash.seen.errors, other.seen.errors),
    })
  } finally {
    await browser.close()
  }
}

main().then(() => process.exit(0))
