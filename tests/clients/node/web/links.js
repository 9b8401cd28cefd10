'use strict'
// The pages of links kept by the server (tests/web_links.rs, issue 51):
//   node web/links.js SPEC.json
// SPEC: {"request": URL, "files": [PATH…], "locked": URL, "passphrase": TEXT, "locked2": URL,
//        "share": URL (a one-time share), "artifacts": DIR, "download_dir": DIR}.
// Prints what each page showed and what arrived or was downloaded.
const fs = require('fs')
const path = require('path')
const { launch, watchedPage, waitState, text, shot, sha256File, done } = require('./browser')

/** Type `passphrase` and press Open; the state the page settles in. */
async function tryPassphrase(page, passphrase) {
  await page.evaluate(() => (document.body.dataset.state = 'trying'))
  await page.fill('#passphrase', passphrase)
  await page.click('#unlock')
  return waitState(page, ['wrong', 'slowed', 'ready'])
}

async function main() {
  const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
  const browser = await launch()
  const out = { dialogs: [], errors: [] }
  try {
    // A request for several files, fulfilled in one drop (here: one choice of several files).
    {
      const { page, seen, ctx } = await watchedPage(browser, { width: 390, height: 844 })
      await page.goto(spec.request)
      await waitState(page, ['ready'])
      out.request = { message: await text(page, 'message'), limits: await text(page, 'request-limits') }
      await page.setInputFiles('#pick', spec.files)
      await waitState(page, ['done'], 300000)
      out.request.rows = await page.evaluate(() =>
        Array.from(document.querySelectorAll('#sending li')).map((li) => ({ name: li.dataset.name, id: li.dataset.id, state: li.dataset.state, sha256: li.dataset.sha256 })),
      )
      out.request.done = await text(page, 'request-done')
      await page.screenshot({ path: shot(spec.artifacts, 'link-request-390x844.png'), fullPage: true })
      out.dialogs.push(...seen.dialogs)
      out.errors.push(...seen.errors)
      await ctx.close()
    }
    // A passphrase: refused when wrong, open when right; then repeated wrong tries are slowed.
    {
      const { page, seen, ctx } = await watchedPage(browser, { width: 1000, height: 700 })
      await page.goto(spec.locked)
      await waitState(page, ['locked'])
      out.locked = { states: [], shown_before: await page.evaluate(() => !document.getElementById('share').hidden) }
      for (const p of ['not it', 'still not it']) {
        out.locked.states.push(await tryPassphrase(page, p))
        out.locked.wrong = await text(page, 'lock-problem')
      }
      out.locked.states.push(await tryPassphrase(page, spec.passphrase))
      out.locked.message = await text(page, 'message')
      out.locked.files = await page.evaluate(() => document.querySelectorAll('#files li').length)
      await page.goto(spec.locked2)
      await waitState(page, ['locked'])
      for (let i = 0; i < 4 && out.locked.states[out.locked.states.length - 1] !== 'slowed'; i++) {
        out.locked.states.push(await tryPassphrase(page, `guess ${i}`))
      }
      out.locked.slowed = await text(page, 'lock-problem')
      await page.screenshot({ path: shot(spec.artifacts, 'link-slowed.png'), fullPage: true })
      out.dialogs.push(...seen.dialogs)
      out.errors.push(...seen.errors)
      await ctx.close()
    }
    // A one-time share of three files: this visitor downloads each; the next is told it is used.
    {
      const { page, seen, ctx } = await watchedPage(browser, { width: 1000, height: 700 })
      await page.goto(spec.share)
      await waitState(page, ['ready'])
      out.share = {
        title: await text(page, 'share-title'),
        message: await text(page, 'message'),
        limits: await text(page, 'share-limits'),
        names: await page.evaluate(() => Array.from(document.querySelectorAll('#files .name')).map((e) => e.textContent)),
        zip: await page.evaluate(() => document.getElementById('zip').getAttribute('href')),
        hashes_shown: await page.evaluate(() => document.getElementById('check').open),
        downloads: [],
      }
      await page.screenshot({ path: shot(spec.artifacts, 'link-share.png'), fullPage: true })
      const buttons = await page.$$('#files a[data-file]')
      for (let i = 0; i < buttons.length; i++) {
        const [download] = await Promise.all([page.waitForEvent('download'), buttons[i].click()])
        const saved = path.join(spec.download_dir, `got-${i}`)
        await download.saveAs(saved)
        out.share.downloads.push({ suggested: download.suggestedFilename(), sha256: sha256File(saved), failure: await download.failure() })
      }
      out.dialogs.push(...seen.dialogs)
      out.errors.push(...seen.errors)
      await ctx.close()
      const other = await watchedPage(browser, { width: 390, height: 844 })
      const res = await other.page.goto(spec.share)
      out.used = { status: res.status(), state: await waitState(other.page, ['used_up']) }
      out.used.title = await text(other.page, 'problem-title')
      out.used.detail = await text(other.page, 'problem-detail')
      await other.page.screenshot({ path: shot(spec.artifacts, 'link-used-390x844.png'), fullPage: true })
      await other.ctx.close()
    }
    done(out)
  } finally {
    await browser.close()
  }
}

main()
