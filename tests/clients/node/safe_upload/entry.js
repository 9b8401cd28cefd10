// esbuild entry for the browser bundle used by index.html (built by run.js at test time).
import * as tus from 'tus-js-client'

window.tus = tus
