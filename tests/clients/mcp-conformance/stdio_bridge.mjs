// The MCP conformance suite speaks Streamable HTTP only; this bridge lets it reach an MCP
// server on stdio (tests/mcp_conformance.rs: `ferry serve --stdio`). Usage:
//   node stdio_bridge.mjs PROGRAM ARGS...
// prints `bridge listening on http://127.0.0.1:PORT/mcp`, then for every HTTP session (an
// `initialize` POST) starts PROGRAM ARGS... (`{n}` in an argument becomes the session's number,
// e.g. for a data directory of its own) and relays JSON-RPC between the two unchanged:
// a POSTed message goes to the process's stdin as one line; the process's answer to it (same
// id), and the notifications it sends while the request is open, come back on that POST's
// event stream. Requests without a session (MCP 2026-07-28, stateless) share one process.
// It adds nothing of its own to the messages: what the suite checks is what the process said.
import { spawn } from 'node:child_process';
import http from 'node:http';
import readline from 'node:readline';
import { randomUUID } from 'node:crypto';

const [program, ...args] = process.argv.slice(2);
if (!program) {
  console.error('usage: stdio_bridge.mjs PROGRAM ARGS...');
  process.exit(2);
}

let started = 0;

class Connection {
  constructor() {
    const n = String(++started);
    this.child = spawn(program, args.map((a) => a.replaceAll('{n}', n)), { stdio: ['pipe', 'pipe', 'inherit'] });
    this.open = new Map(); // JSON-RPC id (as JSON) -> the POST's response stream
    this.child.on('exit', () => {
      for (const res of this.open.values()) res.end();
      this.open.clear();
    });
    readline.createInterface({ input: this.child.stdout }).on('line', (line) => {
      let msg;
      try {
        msg = JSON.parse(line);
      } catch {
        return; // not a JSON-RPC line
      }
      if (msg.method === undefined && msg.id !== undefined) {
        const key = JSON.stringify(msg.id);
        const res = this.open.get(key);
        if (!res) return;
        this.open.delete(key);
        event(res, msg);
        res.end();
      } else {
        // A notification: to the newest open request (the one it is about, in these runs).
        const res = [...this.open.values()].at(-1);
        if (res) event(res, msg);
      }
    });
  }

  send(msg) {
    this.child.stdin.write(JSON.stringify(msg) + '\n');
  }

  close() {
    this.child.kill();
  }
}

function event(res, msg) {
  res.write(`event: message\ndata: ${JSON.stringify(msg)}\n\n`);
}

const sessions = new Map();
let stateless;

const server = http.createServer((req, res) => {
  const sid = req.headers['mcp-session-id'];
  if (req.method === 'DELETE') {
    sessions.get(sid)?.close();
    sessions.delete(sid);
    res.writeHead(200).end();
    return;
  }
  if (req.method !== 'POST') {
    res.writeHead(405, { allow: 'POST, DELETE' }).end();
    return;
  }
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    let msg;
    try {
      msg = JSON.parse(Buffer.concat(chunks).toString());
    } catch (e) {
      res.writeHead(400, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32700, message: `Parse error: ${e.message}` } }));
      return;
    }
    let conn;
    const headers = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' };
    if (sid !== undefined) {
      conn = sessions.get(sid);
      if (!conn) {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32600, message: 'unknown session' } }));
        return;
      }
    } else if (msg.method === 'initialize') {
      const id = randomUUID();
      conn = new Connection();
      sessions.set(id, conn);
      headers['mcp-session-id'] = id;
    } else {
      stateless ??= new Connection();
      conn = stateless;
    }
    if (msg.method !== undefined && msg.id !== undefined) {
      res.writeHead(200, headers);
      conn.open.set(JSON.stringify(msg.id), res);
      conn.send(msg);
    } else {
      conn.send(msg);
      res.writeHead(202).end();
    }
  });
});

server.listen(0, '127.0.0.1', () => {
  console.log(`bridge listening on http://127.0.0.1:${server.address().port}/mcp`);
});

function shutdown() {
  for (const c of sessions.values()) c.close();
  stateless?.close();
  process.exit(0);
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
