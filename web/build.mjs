// Rebuild web/dist (embedded in the ferry binary by src/http/web.rs) from web/src:
//   cd web && npm ci && npm run build
// The output is deterministic, so CI checks `git diff --exit-code web/dist` after a rebuild.
import { build } from 'esbuild'
import { copyFileSync, mkdirSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))
const dist = join(here, 'dist')
mkdirSync(dist, { recursive: true })
// The page's script, and the request-a-file page's hashing worker (src/hash.js →
// /assets/hash.js: a classic worker script, WebAssembly sha256 inline).
for (const name of ['app.js', 'link.js', 'hash.js']) {
  await build({
    entryPoints: [join(here, 'src', name)],
    outfile: join(dist, name),
    bundle: true,
    minify: true,
    format: 'iife',
    platform: 'browser',
    target: ['chrome111', 'firefox115', 'safari16'],
    legalComments: 'eof',
    charset: 'utf8',
    logLevel: 'warning',
  })
}
await build({
  entryPoints: [join(here, 'src/app.css')],
  outfile: join(dist, 'app.css'),
  bundle: true,
  minify: true,
  logLevel: 'warning',
})
copyFileSync(join(here, 'src/page.html'), join(dist, 'page.html'))
copyFileSync(join(here, 'src/dash.html'), join(dist, 'dash.html'))
copyFileSync(join(here, 'src/link.html'), join(dist, 'link.html'))
