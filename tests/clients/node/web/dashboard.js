'use strict'
// The dashboard at `/` (tests/web_pages.rs):  node web/dashboard.js SPEC.json
// SPEC: {"base", "token", "artifacts", "upload_file", "evil_name"}.
//
// Steps, each ending in one JSON line on stdout; between some of them the test acts and writes
// a line on stdin:
//   login     — token login; what the page shows; a share link made with a 15-minute expiry;
//               a second page whose event stream is blocked (it must fall back to polling)
//   answered  — the `ask` task's input form filled in and sent; its bar at 50 % (stdin: go)
//   tasks     — the `ask` task's bar at 100 %; the `slow` task cancelled from the page
//   uploads   — a file dropped (DataTransfer on the drop zone, named `evil_name`) and one set on
//               the file input; both appear with their sha256 from the event stream, no reload
//               (stdin: the test uploaded a file as another principal meanwhile)
//   end       — a file deleted through the page; what the page shows at the end (another
//               principal's files and events never); the polling page's view; dialogs seen
const fs = require('fs')
const crypto = require('crypto')
const readline = require('readline')
const { launch, watchedPage, waitState, shot, done } = require('./browser')

const T = 120000

async function login(page, spec) {
  await page.goto(spec.base + '/')
  await waitState(page, ['login'])
  await page.fill('#token', spec.token)
  await page.click('#login button[type=submit]')
  await waitState(page, ['ready'])
}

const rowOf = (page, name) =>
  page.evaluate((n) => {
    for (const tr of document.querySelectorAll('#files tr')) {
      if (tr.children[0].textContent === n) return { id: tr.dataset.id, name: tr.children[0].textContent, sha256: tr.children[3].textContent, state: tr.children[2].textContent }
    }
    return null
  }, name)

let pageErrors = []

async function main() {
  const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
  const rl = readline.createInterface({ input: process.stdin })
  const lines = rl[Symbol.asyncIterator]()
  const browser = await launch()
  try {
    const { page, seen } = await watchedPage(browser, { width: 1280, height: 900 })
    pageErrors = seen.errors
    // Every request for the event stream, with the Last-Event-ID it carried.
    const eventRequests = []
    page.on('request', async (r) => {
      if (!r.url().endsWith('/api/v1/events')) return
      const h = await r.allHeaders()
      eventRequests.push({ last_event_id: h['last-event-id'] || null, authorization: !!h.authorization, url: r.url() })
    })
    let navigations = 0
    page.on('framenavigated', (f) => {
      if (f === page.mainFrame()) navigations += 1
    })
    await login(page, spec)
    await page.waitForFunction(() => document.body.dataset.live === 'stream', null, { timeout: T })
    await page.waitForFunction(() => document.querySelectorAll('#tasks tr[data-id]').length >= 2 && document.querySelector('#tasks form.input-request'), null, { timeout: T })

    // A second tab whose event stream never connects: it must keep up by polling.
    const polling = await watchedPage(browser, { width: 1000, height: 800 })
    await polling.page.route('**/api/v1/events', (route) => route.abort())
    await login(polling.page, spec)
    await polling.page.waitForFunction(() => document.body.dataset.live === 'polling', null, { timeout: T })

    // A share link with a chosen expiry (15 minutes) for the first complete file.
    await page.selectOption('#ttl', '900000')
    await page.evaluate(() => {
      for (const tr of document.querySelectorAll('#files tr')) {
        const b = Array.from(tr.querySelectorAll('button')).find((x) => x.textContent === 'Share')
        if (b) return b.click()
      }
    })
    await page.waitForFunction(() => document.getElementById('share-url').value.includes('/share/'), null, { timeout: T })
    await page.screenshot({ path: shot(spec.artifacts, 'web-dashboard.png'), fullPage: true })
    done({
      event: 'login',
      url: page.url(),
      token_in_session: await page.evaluate((t) => sessionStorage.getItem('ferry-token') === t, spec.token),
      token_elsewhere: await page.evaluate(
        (t) => Object.keys(localStorage).some((k) => k.includes(t) || (localStorage.getItem(k) || '').includes(t)) || document.cookie.includes(t) || location.href.includes(t),
        spec.token,
      ),
      page: await page.evaluate(() => document.getElementById('dash').textContent),
      share: await page.evaluate(() => document.getElementById('share-url').value),
      question: await page.evaluate(() => document.querySelector('#tasks form.input-request .question').textContent),
      polling_live: await polling.page.evaluate(() => document.body.dataset.live),
    })

    // Answer the input request through the form.
    await page.selectOption('#tasks form.input-request select[name=colour]', { label: 'green' })
    await page.fill('#tasks form.input-request input[name=rows]', '7')
    await page.click('#tasks form.input-request button[type=submit]')
    const taskRows = () =>
      page.evaluate(() =>
        Array.from(document.querySelectorAll('#tasks tr[data-id]')).map((r) => ({ id: r.dataset.id, status: r.dataset.status, bar: r.querySelector('progress').value, text: r.textContent })),
      )
    await page.waitForFunction(
      () => Array.from(document.querySelectorAll('#tasks tr[data-id]')).some((r) => r.dataset.status === 'working' && r.querySelector('progress').value === 0.5),
      null,
      { timeout: T },
    )
    done({ event: 'answered', rows: await taskRows(), forms_left: await page.evaluate(() => document.querySelectorAll('#tasks form.input-request').length) })
    await lines.next() // the test let the task finish

    await page.waitForFunction(
      () => Array.from(document.querySelectorAll('#tasks tr[data-id]')).some((r) => r.dataset.status === 'completed' && r.querySelector('progress').value === 1),
      null,
      { timeout: T },
    )
    // Cancel the task that is still working (the page asks nothing for cancel).
    await page.evaluate(() => {
      for (const tr of document.querySelectorAll('#tasks tr[data-id]')) {
        const b = Array.from(tr.querySelectorAll('button')).find((x) => x.textContent === 'Cancel')
        if (tr.dataset.status === 'working' && b) b.click()
      }
    })
    await page.waitForFunction(() => Array.from(document.querySelectorAll('#tasks tr[data-id]')).some((r) => r.dataset.status === 'cancelled'), null, { timeout: T })
    done({ event: 'tasks', rows: await taskRows() })

    // Uploads: one file dropped on the drop zone, one chosen with the file input.
    const dropped = crypto.randomBytes(2 * 1024 * 1024 + 5)
    const droppedSha = crypto.createHash('sha256').update(dropped).digest('hex')
    const dt = await page.evaluateHandle(
      ({ name, b64 }) => {
        const bin = atob(b64)
        const bytes = new Uint8Array(bin.length)
        for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i)
        const d = new DataTransfer()
        d.items.add(new File([bytes], name, { type: 'text/plain' }))
        return d
      },
      { name: spec.evil_name, b64: dropped.toString('base64') },
    )
    await page.dispatchEvent('#drop', 'dragover', { dataTransfer: dt })
    await page.dispatchEvent('#drop', 'drop', { dataTransfer: dt })
    await page.setInputFiles('#pick', spec.upload_file)
    const chosen = require('path').basename(spec.upload_file)
    const finished = (name) =>
      page.waitForFunction(
        (n) => {
          const tr = Array.from(document.querySelectorAll('#files tr')).find((r) => r.children[0].textContent === n)
          if (!tr || !/^[0-9a-f]{64}$/.test(tr.children[3].textContent)) return false
          return Array.from(document.querySelectorAll('#activity li[data-type="upload.finished"]')).some((li) => li.dataset.subject === tr.dataset.id && li.dataset.sha256 === tr.children[3].textContent)
        },
        name,
        { timeout: 300000 },
      )
    await finished(spec.evil_name)
    await finished(chosen)
    await page.waitForFunction(() => document.querySelectorAll('#uploads li[data-state="stored"]').length === 2, null, { timeout: T })
    await page.screenshot({ path: shot(spec.artifacts, 'web-dashboard-uploads.png'), fullPage: true })
    done({
      event: 'uploads',
      dropped: { ...(await rowOf(page, spec.evil_name)), sha_local: droppedSha },
      chosen: await rowOf(page, chosen),
      images: await page.evaluate(() => document.querySelectorAll('#dash img').length),
      upload_rows: await page.evaluate(() => Array.from(document.querySelectorAll('#uploads li')).map((li) => ({ name: li.dataset.name, state: li.dataset.state, bar: li.querySelector('progress').value, text: li.textContent }))),
      navigations,
    })
    await lines.next() // another principal uploaded; ferry was killed (-9) and restarted; a file was added
    rl.close()
    // The stream reconnects with Last-Event-ID and replays what happened while it was down.
    await page.waitForFunction(
      (n) => {
        const tr = Array.from(document.querySelectorAll('#files tr')).find((r) => r.children[0].textContent === n)
        return tr && document.body.dataset.live === 'stream' && document.querySelector(`#activity li[data-type="upload.finished"][data-subject="${tr.dataset.id}"]`)
      },
      'after-restart.txt',
      { timeout: T },
    )
    const resumed = { requests: eventRequests, gap_file: await rowOf(page, 'after-restart.txt') }

    // Delete the chosen file through the page: confirm() is accepted this once.
    seen.accept = true
    await page.evaluate((n) => {
      const tr = Array.from(document.querySelectorAll('#files tr')).find((r) => r.children[0].textContent === n)
      Array.from(tr.querySelectorAll('button')).find((x) => x.textContent === 'Delete').click()
    }, chosen)
    await page.waitForFunction((n) => !Array.from(document.querySelectorAll('#files tr')).some((r) => r.children[0].textContent === n), chosen, { timeout: T })
    seen.accept = false
    await page.waitForFunction(() => document.querySelector('#activity li[data-type="upload.terminated"]'), null, { timeout: T })
    // The polling tab caught up with everything without a stream.
    await polling.page.waitForFunction(
      ({ a, b }) => {
        const names = Array.from(document.querySelectorAll('#files tr')).map((r) => r.children[0].textContent)
        return names.includes(a) && !names.includes(b) && Array.from(document.querySelectorAll('#tasks tr[data-id]')).some((r) => r.dataset.status === 'cancelled')
      },
      { a: spec.evil_name, b: chosen },
      { timeout: T },
    )
    const phone = await watchedPage(browser, { width: 390, height: 844 })
    await login(phone.page, spec)
    await phone.page.screenshot({ path: shot(spec.artifacts, 'web-dashboard-390x844.png'), fullPage: true })
    done({
      event: 'end',
      page: await page.evaluate(() => document.body.textContent),
      activity: await page.evaluate(() => Array.from(document.querySelectorAll('#activity li')).map((li) => ({ type: li.dataset.type, subject: li.dataset.subject, id: li.dataset.eventId }))),
      live: await page.evaluate(() => document.body.dataset.live),
      resumed,
      polling: { live: await polling.page.evaluate(() => document.body.dataset.live), page: await polling.page.evaluate(() => document.body.textContent) },
      navigations,
      dialogs: seen.dialogs.concat(polling.seen.dialogs, phone.seen.dialogs),
      errors: seen.errors.concat(phone.seen.errors),
    })
  } catch (e) {
    // What the page showed when a step failed, for the test's log.
    for (const p of browser.contexts().flatMap((c) => c.pages())) {
      const state = await p
        .evaluate(() => ['status', 'live', 'uploads', 'files', 'tasks', 'activity'].map((id) => `${id}: ${(document.getElementById(id) || {}).textContent}`).join('\n'))
        .catch((err) => String(err))
      console.error(`page ${p.url()}:\n${state}`)
    }
    console.error(`errors: ${JSON.stringify(pageErrors)}`)
    throw e
  } finally {
    await browser.close()
  }
}

main().then(() => process.exit(0))
