// @tus/server + @tus/file-store on loopback, for benches/peers/run.
// usage: node tus-server.js PORT DATA_DIR   (PORT 0 picks a free one; prints "listening on http://ADDR")
import http from 'node:http';
import { Server } from '@tus/server';
import { FileStore } from '@tus/file-store';

const [port, directory] = process.argv.slice(2);
if (!port || !directory) {
  console.error('usage: node tus-server.js PORT DATA_DIR');
  process.exit(2);
}
const tus = new Server({ path: '/files', datastore: new FileStore({ directory }) });
const srv = http.createServer((req, res) => tus.handle(req, res));
// Node's defaults (300 s request timeout) would cut a slow 1 GiB PATCH; the run bounds time itself.
srv.requestTimeout = 0;
// @tus/server 2.4.5 on Node 20.20 throws "ReadableStream is already closed" (undici) after every
// GET it serves, which would end the process; the bench logs it and keeps serving (the run counts
// these lines and says so in the table).
process.on('uncaughtException', (e) => console.error(`uncaughtException (kept running): ${e.code ?? ''} ${e.message}`));
srv.listen(Number(port), "127.0.0.1", () => console.log(`listening on http://127.0.0.1:${srv.address().port}`));
