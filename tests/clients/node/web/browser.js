'use strict'
// Shared by the page scripts (tests/web_pages.rs): Debian's chromium via playwright-core.
const fs = require('fs')
const path = require('path')
const crypto = require('crypto')
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

async function launch() {
  const executablePath = process.env.FERRY_CHROMIUM || '/usr/bin/chromium'
  if (!fs.existsSync(executablePath)) {
    throw new Error(`Chromium not found at ${executablePath}: install it with \`apt-get install -y chromium\` (bash .ci/run does)`)
  }
  return chromium.launch({ executablePath, headless: true, args: LAUNCH_FLAGS })
}

// A page that records what a test must see: console errors, page errors, CSP violations and
// every dialog (an XSS would open one: it is dismissed and counted).
async function watchedPage(browser, viewport, context) {
  const ctx = context || (await browser.newContext({ viewport, acceptDownloads: true }))
  const page = await ctx.newPage()
  // `seen.accept = true` accepts dialogs (a confirm() the test means to answer yes) until reset.
  const seen = { dialogs: [], errors: [], accept: false }
  page.on('dialog', async (d) => {
    seen.dialogs.push(`${d.type()}: ${d.message()}`)
    await (seen.accept ? d.accept() : d.dismiss()).catch(() => {})
  })
  page.on('pageerror', (e) => seen.errors.push(`pageerror: ${e.message}`))
  page.on('console', (m) => {
    if (m.type() === 'error') seen.errors.push(`console.error: ${m.text()}`)
  })
  return { page, seen, ctx }
}

// Wait until <body data-state> is one of `states`; fail at once on an unexpected end state.
async function waitState(page, states, timeout = 120000) {
  await page.waitForFunction(
    (want) => want.includes(document.body.dataset.state) || ['error', 'failed', 'mismatch'].includes(document.body.dataset.state),
    states,
    { timeout },
  )
  const state = await page.evaluate(() => document.body.dataset.state)
  if (!states.includes(state)) {
    const status = await page.evaluate(() => document.getElementById('status').textContent + ' ' + (document.getElementById('problem-title').textContent || ''))
    throw new Error(`page state ${state}, wanted ${states}: ${status}`)
  }
  return state
}

const text = (page, id) => page.evaluate((i) => document.getElementById(i).textContent, id)

function shot(dir, name) {
  fs.mkdirSync(dir, { recursive: true })
  return path.join(dir, name)
}

function sha256File(file) {
  return crypto.createHash('sha256').update(fs.readFileSync(file)).digest('hex')
}

function done(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n')
}

process.on('unhandledRejection', (e) => {
  console.error('FAILED:', e && e.stack ? e.stack : e)
  process.exit(1)
})

module.exports = { launch, watchedPage, waitState, text, shot, sha256File, done }
