"""A pre-create / pre-finish hook server for tests/events.rs (ferry's HTTP hook protocol).

    upload_hook.py --log FILE

Prints `listening on PORT`. Routes:
  POST /pre-create   refuses filenames ending in .exe (403 + {"message"}); renames
                     `rename-me.txt` to `renamed.txt` and adds `checked: yes` (metadata change)
  POST /pre-finish   refuses uploads whose filename contains "virus" (422 + {"message"})
  POST /pre-finish-once   answers 500 to its first request, then as /pre-finish
  POST /pre-finish-gated  answers 500 while the file named by --down exists, else as /pre-finish
  POST /slow         sleeps 30 s before allowing (past any test timeout)
  POST /broken       answers 200 with a body that is not JSON
  POST /echo         allows, answering the metadata it was given as the new metadata
  POST /once-per-name  refuses (409) a filename it has allowed before: a hook with memory,
                     which a replayed creation must not ask again
Every request body is logged as one JSON line.
"""

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--down", help="a file whose existence makes /pre-finish-gated fail")
    args = ap.parse_args()
    calls = {"once": 0}
    seen_names = set()
    log = open(args.log, "a", buffering=1)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def answer(self, status, obj=None, raw=None):
            body = raw if raw is not None else (json.dumps(obj).encode() if obj is not None else b"")
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
            with lock:
                log.write(json.dumps({"path": self.path, "request": req}) + "\n")
            md = req.get("upload", {}).get("metadata", {}) or {}
            name = md.get("filename") or ""
            if not isinstance(name, str):
                name = ""  # a value that is not UTF-8 arrives as {"base64": ...}
            if self.path == "/echo":
                return self.answer(200, {"metadata": md})
            if self.path == "/once-per-name":
                with lock:
                    again = name in seen_names
                    seen_names.add(name)
                if again and name:
                    return self.answer(409, {"message": f"{name} exists already"})
                return self.answer(200, {})
            if self.path == "/pre-create":
                if name.endswith(".exe"):
                    return self.answer(403, {"message": f"executables are not accepted: {name}"})
                if name == "rename-me.txt":
                    md = dict(md, filename="renamed.txt", checked="yes")
                    return self.answer(200, {"metadata": md})
                return self.answer(200, {})
            if self.path == "/pre-finish-once":
                with lock:
                    calls["once"] += 1
                    first = calls["once"] == 1
                if first:
                    return self.answer(500, {"message": "scanner restarting"})
            if self.path == "/pre-finish-gated" and args.down and os.path.exists(args.down):
                return self.answer(500, {"message": "scanner down"})
            if self.path.startswith("/pre-finish"):
                if "virus" in name:
                    return self.answer(422, {"message": f"{name} failed the virus scan"})
                return self.answer(204)
            if self.path == "/slow":
                time.sleep(30)
                return self.answer(200, {})
            if self.path == "/broken":
                return self.answer(200, raw=b"<html>not json</html>")
            return self.answer(404, {"message": "no such hook"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
