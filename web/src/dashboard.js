// The dashboard at `/` (issue 16 item 3): a principal's files and tasks through the JSON API.
//
// - The token is pasted once and kept in this tab's sessionStorage only; it goes in an
//   Authorization header, never in a URL (so the live stream is read with fetch, see live.js).
// - Live: `GET /api/v1/events` (SSE) tells the page when a file or task changed; the page then
//   re-reads `/api/v1/files` and `/api/v1/tasks`. Progress (a task's fraction, an upload's
//   offset) is not an event, so while something is in flight the page also re-reads the lists,
//   every 2 s doubling to 30 s while nothing changes. When the stream cannot be had (twice in a
//   row), the page polls with the same backoff (1 s → 30 s) and keeps trying the stream.
// - Uploads: drop files (or choose them), Uppy's tus plugin sends them to `/files/` in 64 MiB
//   PATCHes with the token's header; a file dropped again after a closed tab continues.
// - Every name and value is put in the page with textContent (never innerHTML).
import Uppy from '@uppy/core'
import Tus from '@uppy/tus'
import { $, setText, setState, formatBytes, CHUNK_SIZE } from './util.js'
import { follow, backoff, MAX_BACKOFF_MS } from './live.js'

/** The API's largest page of files or tasks (`limit` 1–1000). */
const LIST_MAX = 1000

const TOKEN_KEY = 'ferry-token'
/** How many events the activity list keeps. */
const ACTIVITY_MAX = 30

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY)
  return token ? { authorization: `Bearer ${token}` } : {}
}

class Unauthorized extends Error {}

async function problemText(res) {
  try {
    const p = await res.json()
    return [p.detail, p.recovery_hint || p.hint].filter(Boolean).join(' ')
  } catch (_) {
    return ''
  }
}

async function api(method, path, body) {
  const headers = { ...authHeaders() }
  if (body != null) headers['content-type'] = 'application/json'
  const res = await fetch(path, { method, headers, body: body == null ? undefined : JSON.stringify(body), cache: 'no-store' })
  if (res.status === 401) throw new Unauthorized('the token is not valid')
  if (!res.ok) throw new Error(`${res.status} ${await problemText(res)}`.trim())
  return res.json()
}

function el(tag, textValue, cls) {
  const e = document.createElement(tag)
  if (textValue != null) e.textContent = textValue
  if (cls) e.className = cls
  return e
}

function button(label, onClick, cls) {
  const b = el('button', label, cls)
  b.type = 'button'
  b.addEventListener('click', onClick)
  return b
}

function row(cells) {
  const tr = el('tr')
  for (const c of cells) {
    const td = el('td')
    if (c instanceof Node) td.append(c)
    else td.textContent = c == null ? '' : String(c)
    tr.append(td)
  }
  return tr
}

/** UTF-8, base64 (a TUS metadata value). */
function base64Utf8(text) {
  let bin = ''
  for (const b of new TextEncoder().encode(text)) bin += String.fromCharCode(b)
  return btoa(bin)
}

/** The `filename` of a TUS `Upload-Metadata` string (events carry it raw), or ''. */
function metadataName(raw) {
  if (typeof raw !== 'string') return ''
  for (const pair of raw.split(',')) {
    const [k, v] = pair.trim().split(' ')
    if (k !== 'filename' || !v) continue
    try {
      const bin = atob(v)
      return new TextDecoder('utf-8', { fatal: false }).decode(Uint8Array.from(bin, (c) => c.charCodeAt(0))).replace(/[\u0000-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/g, '\ufffd')
    } catch (_) {
      return ''
    }
  }
  return ''
}

function bar(fraction) {
  const p = el('progress')
  p.max = 1
  if (fraction != null) p.value = fraction
  return p
}

const pct = (fraction) => `${(fraction * 100).toFixed(1)} %`

/** A field of an input form from one JSON-schema property (MCP elicitation's subset). */
function field(name, prop, required) {
  const label = el('label', null, 'field')
  label.append(el('span', prop.title || prop.description || name))
  let input
  if (Array.isArray(prop.enum)) {
    input = el('select')
    for (const v of prop.enum) {
      const o = el('option', String(v))
      o.value = JSON.stringify(v)
      input.append(o)
    }
    input.dataset.kind = 'enum'
  } else if (prop.type === 'boolean') {
    input = el('input')
    input.type = 'checkbox'
    input.dataset.kind = 'boolean'
    if (prop.default === true) input.checked = true
  } else if (prop.type === 'number' || prop.type === 'integer') {
    input = el('input')
    input.type = 'number'
    input.step = prop.type === 'integer' ? '1' : 'any'
    input.dataset.kind = prop.type
    if (prop.default != null) input.value = String(prop.default)
  } else {
    input = el('input')
    input.type = 'text'
    input.dataset.kind = 'string'
    if (prop.default != null) input.value = String(prop.default)
  }
  input.name = name
  if (required && input.type !== 'checkbox') input.required = true
  label.append(input)
  return label
}

/** The answer a form holds: an object per the schema, or one free answer (JSON if it parses). */
function formValue(form, schema) {
  const inputs = Array.from(form.querySelectorAll('input, select'))
  const value = (i) => {
    switch (i.dataset.kind) {
      case 'enum':
        return JSON.parse(i.value)
      case 'boolean':
        return i.checked
      case 'integer':
        return i.value === '' ? null : parseInt(i.value, 10)
      case 'number':
        return i.value === '' ? null : Number(i.value)
      default:
        return i.value
    }
  }
  if (!schema) {
    const text = inputs[0].value
    try {
      return JSON.parse(text)
    } catch (_) {
      return text
    }
  }
  const out = {}
  for (const i of inputs) {
    const v = value(i)
    if (v !== null && !(i.dataset.kind === 'string' && v === '' && !i.required)) out[i.name] = v
  }
  return out
}

/**
 * The form that answers a task's input request `key`: the request's `message`, and a field per
 * property of its `schema` (as MCP elicitation shows it), else one free `answer` field.
 */
function inputForm(task, key, request, onAnswered) {
  const form = el('form', null, 'input-request')
  form.dataset.task = task.id
  form.dataset.key = key
  const message = request && typeof request === 'object' && typeof request.message === 'string' ? request.message : `The task asks (${key}): ${JSON.stringify(request)}`
  form.append(el('p', message, 'question'))
  const schema = request && typeof request === 'object' && request.schema && typeof request.schema === 'object' && request.schema.properties ? request.schema : null
  if (schema) {
    const required = new Set(Array.isArray(schema.required) ? schema.required : [])
    for (const [name, prop] of Object.entries(schema.properties)) form.append(field(name, prop || {}, required.has(name)))
  } else {
    form.append(field('answer', { title: 'Your answer (JSON or text)' }, true))
  }
  const send = el('button', 'Answer')
  send.type = 'submit'
  const note = el('span', '', 'form-note')
  form.append(send, note)
  form.addEventListener('submit', async (e) => {
    e.preventDefault()
    send.disabled = true
    note.textContent = ' Sending…'
    try {
      const out = await api('POST', `/api/v1/tasks/${encodeURIComponent(task.id)}/input`, { key, response: formValue(form, schema) })
      note.textContent = out.accepted ? ' Answered.' : ' This question was answered already.'
      form.dataset.answered = 'true'
      onAnswered()
    } catch (err) {
      note.textContent = ` Not sent: ${err.message}`
      send.disabled = false
    }
  })
  return form
}

export async function dashboard() {
  const login = $('login')
  let tried = false
  let files = []
  let tasks = []
  let snapshot = ''
  let started = false
  let live = 'connecting'
  let pollTimer = null
  let pollDelay = 1000
  let refreshing = null
  let again = false
  let debounce = null
  const forms = new Map() // `${task}/${key}` → its form, kept across re-renders (typed values stay)
  const uploads = new Map() // Uppy file id → its row in #uploads

  const setLive = (state, text) => {
    live = state
    document.body.dataset.live = state
    setText('live', text)
    $('live').className = `live ${state}`
  }

  const showLogin = () => {
    $('dash').hidden = true
    login.hidden = false
    setText('status', tried ? 'That token is not valid.' : '')
    setState('login')
  }

  const activity = (e) => {
    let data = {}
    try {
      data = JSON.parse(e.data).data || {}
    } catch (_) {}
    const subject = data.upload || data.task || ''
    const f = files.find((x) => x.id === subject)
    const t = tasks.find((x) => x.id === subject)
    // A file not listed yet (its upload.created comes before the list is re-read) is named by
    // the event's own metadata.
    const named = f ? f.display_name || f.name : metadataName(data.metadata)
    const what = named || (t ? `${t.kind} task` : data.kind ? `${data.kind} task` : subject)
    const parts = [new Date().toLocaleTimeString(), e.event, what]
    if (data.status) parts.push(data.previous_status ? `${data.previous_status} → ${data.status}` : data.status)
    if (data.size != null && e.event === 'upload.finished') parts.push(formatBytes(data.size))
    if (data.sha256) parts.push(`sha256 ${data.sha256}`)
    const li = el('li', parts.join(' · '))
    li.dataset.type = e.event
    li.dataset.eventId = e.id
    li.dataset.subject = subject
    if (data.sha256) li.dataset.sha256 = data.sha256
    $('activity').prepend(li)
    while ($('activity').children.length > ACTIVITY_MAX) $('activity').lastChild.remove()
    document.body.dataset.events = String(Number(document.body.dataset.events || 0) + 1)
  }

  // ---- rendering ----

  const showLink = (what, out) => {
    setText('share-what', `${what}, until ${new Date(out.expires_at_ms).toLocaleString()}:`)
    $('share-url').value = out.page_url || out.url
    $('share-out').hidden = false
    setText('share-copy', 'Copy')
    $('share-url').select()
  }

  const share = (f, scope) => async () => {
    try {
      const out = await api('POST', `/api/v1/files/${encodeURIComponent(f.id)}/share`, { scope, ttl_ms: Number($('ttl').value) })
      const what = scope === 'download' ? 'Download page' : 'Upload page'
      showLink(`${what} for “${f.display_name || f.name || f.id}”`, out)
    } catch (e) {
      if (e instanceof Unauthorized) return showLogin()
      setText('status', `Could not make a link: ${e.message}`)
    }
  }

  // Your own file, downloaded through a short-lived signed link (a plain link cannot carry the token).
  const download = (f) => async () => {
    try {
      const out = await api('POST', `/api/v1/files/${encodeURIComponent(f.id)}/share`, { scope: 'download', ttl_ms: 15 * 60 * 1000 })
      const u = new URL(out.url, location.href)
      u.searchParams.set('download', '1')
      location.assign(u.href)
    } catch (e) {
      if (e instanceof Unauthorized) return showLogin()
      setText('status', `Could not download: ${e.message}`)
    }
  }

  // "Request a file": an upload of any size (deferred length, TUS creation-defer-length) named
  // NAME and marked `requested` (as `ferry request` and MCP file_request mark theirs: a model
  // reading it before it is sent is told to wait for the person), and its upload page for the
  // person asked.
  const request = async (name) => {
    const res = await fetch('/files/', {
      method: 'POST',
      headers: { 'tus-resumable': '1.0.0', 'upload-defer-length': '1', 'upload-metadata': `filename ${base64Utf8(name)},requested ${btoa('1')}`, ...authHeaders() },
    })
    if (res.status === 401) return showLogin()
    if (res.status !== 201) throw new Error(`${res.status} ${await problemText(res)}`.trim())
    const id = decodeURIComponent(new URL(res.headers.get('location'), location.href).pathname.split('/').filter(Boolean).pop())
    const out = await api('POST', `/api/v1/files/${encodeURIComponent(id)}/share`, { scope: 'upload', ttl_ms: Number($('ttl').value) })
    showLink(`Request page for “${name}” (any size): send it to the person`, out)
    document.body.dataset.requested = id
    refreshSoon()
  }

  const remove = (f) => async () => {
    if (!confirm(`Delete “${f.display_name || f.name || f.id}”? This cannot be undone.`)) return
    const res = await fetch(`/files/${encodeURIComponent(f.id)}`, { method: 'DELETE', headers: { 'tus-resumable': '1.0.0', ...authHeaders() } })
    if (res.status === 401) return showLogin()
    if (!res.ok && res.status !== 404) setText('status', `Could not delete “${f.display_name || f.name || f.id}”: ${res.status} ${await problemText(res)}`)
    refreshSoon()
  }

  const fileRows = () =>
    files.map((f) => {
      const state = el('span')
      if (f.complete) state.textContent = 'complete'
      else if (f.size) state.append(bar(f.offset / f.size), el('span', ` ${pct(f.offset / f.size)} · ${formatBytes(f.offset)}`))
      else state.textContent = `${formatBytes(f.offset)} so far`
      const actions = el('span', null, 'actions')
      if (f.complete) actions.append(button('Download', download(f)), button('Share', share(f, 'download')))
      else actions.append(button('Request upload', share(f, 'upload')))
      actions.append(button('Delete', remove(f), 'danger'))
      const tr = row([f.display_name || f.name || f.id, formatBytes(f.size), state, el('span', f.sha256 || '', 'hash'), new Date(f.created_at).toLocaleString(), actions])
      tr.dataset.id = f.id
      tr.children[0].className = 'name'
      tr.children[2].className = 'state'
      return tr
    })

  const taskRows = () =>
    tasks.flatMap((t) => {
      const progress = el('span')
      const fraction = t.progress && t.progress.fraction != null ? t.progress.fraction : t.status === 'completed' ? 1 : null
      progress.append(bar(fraction), el('span', fraction != null ? ` ${pct(fraction)}` : ''))
      if (t.progress && t.progress.message) progress.append(el('span', ` ${t.progress.message}`))
      let status = t.status
      if (t.status_message) status += `: ${t.status_message}`
      if (t.status === 'failed' && t.error) status += `: ${t.error.message || JSON.stringify(t.error)}`
      // The file a finished task made, by name (built-in kinds: `file`; external: `files`).
      const made = t.status === 'completed' && t.result ? [t.result.file, ...(Array.isArray(t.result.files) ? t.result.files : [])].filter((x) => x && x.id) : []
      if (made.length) status += ` → ${made.map((x) => { const f = files.find((y) => y.id === x.id); return (f && (f.display_name || f.name)) || x.name || x.id }).join(', ')}`
      const actions = el('span', null, 'actions')
      if (t.status === 'working' || t.status === 'input_required') {
        actions.append(
          button('Cancel', async () => {
            try {
              await api('POST', `/api/v1/tasks/${encodeURIComponent(t.id)}/cancel`, {})
            } catch (e) {
              if (e instanceof Unauthorized) return showLogin()
              setText('status', `Could not cancel: ${e.message}`)
            }
            refreshSoon()
          }),
        )
      }
      const tr = row([t.kind, status, progress, new Date(t.created_at).toLocaleString(), actions])
      tr.dataset.id = t.id
      tr.dataset.status = t.status
      const out = [tr]
      const keys = Object.keys(t.input_requests || {})
      if (t.status === 'input_required' && keys.length) {
        const cell = el('td')
        cell.colSpan = 5
        for (const key of keys) {
          const id = `${t.id}/${key}`
          const request = t.input_requests[key]
          let form = forms.get(id)
          if (!form || form.dataset.request !== JSON.stringify(request) || form.dataset.answered) {
            form = inputForm(t, key, request, refreshSoon)
            form.dataset.request = JSON.stringify(request)
            forms.set(id, form)
          }
          cell.append(form)
        }
        const formRow = el('tr', null, 'input-row')
        formRow.dataset.task = t.id
        formRow.append(cell)
        out.push(formRow)
      }
      return out
    })

  // A sent upload's line says so once ferry lists the file as complete, with its sha256.
  const markStored = () => {
    for (const li of document.querySelectorAll('#uploads li[data-state="sent"]')) {
      const f = files.find((x) => x.id === li.dataset.id)
      if (!f || !f.complete) continue
      li.dataset.state = 'stored'
      li.lastChild.textContent = ` ✓ stored (${formatBytes(f.size)}), sha256 ${f.sha256}`
    }
  }

  const render = () => {
    // Forms of questions no longer outstanding are dropped.
    const open = new Set(tasks.filter((t) => t.status === 'input_required').flatMap((t) => Object.keys(t.input_requests || {}).map((k) => `${t.id}/${k}`)))
    for (const k of forms.keys()) if (!open.has(k)) forms.delete(k)
    // A form being typed into is moved into the new rows: give it its focus and caret back.
    const focused = document.activeElement && document.activeElement.closest && document.activeElement.closest('form.input-request') ? document.activeElement : null
    const caret = focused && focused.type === 'text' ? [focused.selectionStart, focused.selectionEnd] : null
    $('files').replaceChildren(...fileRows())
    $('tasks').replaceChildren(...taskRows())
    if (focused && focused.isConnected) {
      focused.focus()
      if (caret) focused.setSelectionRange(caret[0], caret[1])
    }
    markStored()
    $('files-empty').hidden = files.length > 0
    $('tasks-empty').hidden = tasks.length > 0
    $('files-more').hidden = files.length < LIST_MAX
    $('tasks-more').hidden = tasks.length < LIST_MAX
  }

  // ---- reading state: after each event, and by polling when needed ----

  const inFlight = () => tasks.some((t) => t.status === 'working') || files.some((f) => !f.complete)

  const schedulePoll = () => {
    clearTimeout(pollTimer)
    pollTimer = null
    // With a live stream only progress needs polling; without one, everything does.
    if (live === 'stream' && !inFlight()) return
    pollTimer = setTimeout(refresh, pollDelay)
  }

  const refreshSoon = () => {
    clearTimeout(debounce)
    debounce = setTimeout(refresh, 100)
  }

  const refresh = async () => {
    if (refreshing) {
      again = true
      return refreshing
    }
    refreshing = (async () => {
      try {
        // The API's largest page; a full page means older ones exist (said under the list).
        const [f, t] = await Promise.all([api('GET', `/api/v1/files?limit=${LIST_MAX}`), api('GET', `/api/v1/tasks?limit=${LIST_MAX}`)])
        const next = JSON.stringify([f, t])
        const floor = live === 'stream' ? 2000 : 1000
        // Unchanged: back off (doubling to 30 s); changed: back to the shortest delay.
        pollDelay = next === snapshot ? Math.min(Math.max(pollDelay, floor) * 2, MAX_BACKOFF_MS) : floor
        if (next !== snapshot) {
          snapshot = next
          files = f.files
          tasks = t.tasks
          render()
        }
        $('dash').hidden = false
        login.hidden = true
        $('logout').hidden = !sessionStorage.getItem(TOKEN_KEY)
        if ($('status').dataset.unreachable) {
          delete $('status').dataset.unreachable
          setText('status', '')
        }
        setState('ready')
        if (!started) {
          started = true
          startLive()
          startUploads()
        }
        schedulePoll()
      } catch (e) {
        if (e instanceof Unauthorized) {
          sessionStorage.removeItem(TOKEN_KEY)
          return showLogin()
        }
        setText('status', `The server cannot be reached (${e.message}); trying again…`)
        $('status').dataset.unreachable = 'true'
        pollDelay = Math.min(pollDelay * 2, MAX_BACKOFF_MS)
        clearTimeout(pollTimer)
        pollTimer = setTimeout(refresh, pollDelay)
      }
    })()
    try {
      await refreshing
    } finally {
      refreshing = null
      if (again) {
        again = false
        refresh()
      }
    }
  }

  const startLive = () => {
    setLive('connecting', 'Connecting…')
    follow('/api/v1/events', {
      headers: authHeaders,
      onOpen: () => {
        setLive('stream', 'Live')
        // Anything that changed before the stream opened is read now; later changes arrive as events.
        refresh()
      },
      onEvent: (e) => {
        activity(e)
        refreshSoon()
      },
      onDown: (failures, err) => {
        console.warn(`event stream: ${err && err.message}; retrying in ${backoff(failures)} ms`)
        if (failures >= 2) setLive('polling', 'Not live: re-reading every few seconds')
        pollDelay = 1000
        schedulePoll()
      },
      onUnauthorized: () => {
        sessionStorage.removeItem(TOKEN_KEY)
        showLogin()
      },
    })
  }

  // ---- uploads by drag and drop (Uppy + tus) ----

  const startUploads = () => {
    const uppy = new Uppy({ autoProceed: true })
    uppy.use(Tus, {
      endpoint: new URL('/files/', location.href).href,
      headers: authHeaders(),
      chunkSize: CHUNK_SIZE,
      retryDelays: [0, 1000, 3000, 5000, 10000, 20000, 30000],
      // A file dropped again (same name, size and date) after a closed tab continues.
      storeFingerprintForResuming: true,
      removeFingerprintOnSuccess: true,
    })
    const uploadRow = (file) => {
      let r = uploads.get(file.id)
      if (!r) {
        const li = el('li')
        const name = el('span', file.name, 'name')
        const b = bar(0)
        const text = el('span', ' waiting…')
        li.append(name, b, text)
        li.dataset.name = file.name
        $('uploads').prepend(li)
        r = { li, bar: b, text }
        uploads.set(file.id, r)
      }
      return r
    }
    uppy.on('file-added', (file) => uploadRow(file))
    uppy.on('upload-progress', (file, p) => {
      if (!file || !p.bytesTotal) return
      const r = uploadRow(file)
      r.bar.value = p.bytesUploaded / p.bytesTotal
      r.text.textContent = ` ${pct(p.bytesUploaded / p.bytesTotal)} · ${formatBytes(p.bytesUploaded)} of ${formatBytes(p.bytesTotal)}`
      r.li.dataset.state = 'uploading'
    })
    uppy.on('upload-success', (file, response) => {
      const r = uploadRow(file)
      r.bar.value = 1
      r.text.textContent = ` sent (${formatBytes(file.size)}); ferry checks its sha256…`
      r.li.dataset.state = 'sent'
      if (response && response.uploadURL) r.li.dataset.id = decodeURIComponent(new URL(response.uploadURL, location.href).pathname.split('/').pop())
      markStored()
      // Forget the file (so the same file can be sent again later) only once the tus plugin
      // has let go of the upload: removing it during this event would terminate it (DELETE).
      setTimeout(() => uppy.removeFile(file.id), 0)
      refreshSoon()
    })
    uppy.on('upload-error', (file, err) => {
      if (!file) return
      const r = uploadRow(file)
      r.text.textContent = ` stopped: ${(err && err.message) || err}. Drop the same file again to continue.`
      r.li.dataset.state = 'failed'
      // The plugin has let go of the upload already (no DELETE); its URL stays in local storage
      // under the file's fingerprint, so dropping the same file again resumes it.
      setTimeout(() => uppy.removeFile(file.id), 0)
    })
    const add = (list) => {
      for (const data of Array.from(list)) {
        try {
          uppy.addFile({ name: data.name, type: data.type || 'application/octet-stream', data, source: 'dashboard' })
        } catch (e) {
          setText('status', `“${data.name}” was not added: ${e.message}`)
        }
      }
    }
    const drop = $('drop')
    const pick = $('pick')
    drop.addEventListener('dragover', (e) => {
      e.preventDefault()
      drop.classList.add('over')
    })
    drop.addEventListener('dragleave', () => drop.classList.remove('over'))
    drop.addEventListener('drop', (e) => {
      e.preventDefault()
      drop.classList.remove('over')
      if (e.dataTransfer && e.dataTransfer.files.length) add(e.dataTransfer.files)
    })
    pick.addEventListener('change', () => {
      add(pick.files)
      pick.value = ''
    })
  }

  // ---- login ----

  login.addEventListener('submit', (e) => {
    e.preventDefault()
    tried = true
    sessionStorage.setItem(TOKEN_KEY, $('token').value.trim())
    $('token').value = ''
    login.hidden = true
    // The stream and the uploader were set up with the old token: start over with the new one.
    if (started) return location.reload()
    refresh()
  })
  $('logout').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY)
    location.reload()
  })
  $('share-url').addEventListener('focus', () => $('share-url').select())
  $('share-copy').addEventListener('click', async () => {
    $('share-url').select()
    try {
      await navigator.clipboard.writeText($('share-url').value)
    } catch (_) {
      document.execCommand('copy')
    }
    setText('share-copy', 'Copied')
  })
  $('request').addEventListener('submit', async (e) => {
    e.preventDefault()
    const name = $('request-name').value.trim()
    if (!name) return
    try {
      await request(name)
      $('request-name').value = ''
    } catch (err) {
      if (err instanceof Unauthorized) return showLogin()
      setText('status', `Could not make a request: ${err.message}`)
    }
  })
  refresh()
}
