"""A webhook receiver for tests/events.rs: verifies every delivery with the `standardwebhooks`
package (the Standard Webhooks reference library) and logs each request as one JSON line.

    webhook_receiver.py --secret whsec_... --log FILE [--refuse-first N] [--mode MODE]

Prints `listening on PORT` once it accepts. MODE is how it answers:
  ok        2xx (after refusing the first N deliveries with 503)
  fail      500 forever
  hang      never answers (holds the connection)
  redirect  307 to /elsewhere (a receiver that moved)
  close     sends headers promising a body, then closes mid-body
Every request is logged: {"n", "id", "timestamp", "verified", "error", "status", "type",
"subject", "data"}; `subject` is data.upload or data.task.
"""

import argparse
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook, WebhookVerificationError


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secret", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--refuse-first", type=int, default=0)
    ap.add_argument("--mode", default="ok", choices=["ok", "fail", "hang", "redirect", "close"])
    args = ap.parse_args()
    hook = Webhook(args.secret)
    lock = threading.Lock()
    state = {"n": 0}
    log = open(args.log, "a", buffering=1)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            verified, error, payload = False, None, {}
            try:
                payload = hook.verify(body, headers)
                verified = True
            except WebhookVerificationError as e:
                error = str(e)
            with lock:
                state["n"] += 1
                n = state["n"]
            if not verified:
                status = 400
            elif args.mode == "ok":
                status = 503 if n <= args.refuse_first else 204
            elif args.mode == "fail":
                status = 500
            elif args.mode == "redirect":
                status = 307
            else:
                status = 200
            data = payload.get("data", {}) if isinstance(payload, dict) else {}
            record = {
                "n": n,
                "id": headers.get("webhook-id"),
                "timestamp": headers.get("webhook-timestamp"),
                "verified": verified,
                "error": error,
                "status": status,
                "type": payload.get("type") if isinstance(payload, dict) else None,
                "subject": data.get("upload") or data.get("task"),
                "data": data,
                "mode": args.mode,
            }
            with lock:
                log.write(json.dumps(record) + "\n")
            if args.mode == "hang" and verified:
                time.sleep(3600)
                return
            if args.mode == "close" and verified:
                self.send_response(200)
                self.send_header("content-length", "1000")
                self.end_headers()
                self.wfile.write(b"partial")
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.send_response(status)
            if status == 307:
                self.send_header("location", "/elsewhere")
            self.send_header("content-length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
