// esbuild entry for the browser bundle used by index.html (built by run.js at test time).
import Uppy from '@uppy/core'
import Tus from '@uppy/tus'

window.FerryUppy = { Uppy, Tus }
