"""ferry's MCP server driven by the real Python `mcp` client (PyPI `mcp` 2.3.0), for tests/mcp_python.rs.

Usage:
  mcp_ferry.py SCENARIO --data DIR --url http://127.0.0.1:PORT/mcp [--token T] [--token2 T2]
  mcp_ferry.py SCENARIO --data DIR --ferry /path/to/ferry [-- SERVER ARGS...]

With --url the client speaks Streamable HTTP to a server the test started (DIR is that server's
data directory). With --ferry the client launches `ferry serve --stdio --listen 127.0.0.1:0
--data DIR SERVER-ARGS...` itself (StdioServerParameters) and speaks MCP over its stdin/stdout;
the bytes still go over HTTP, to the address in the signed URLs the tools return.

Scenarios: export, receive, errors, expired, principals (HTTP only), native_tasks,
task_output_locked (--gate FILE), subscribe, task_push (--url2 URL: listen on another replica; --gate DIR:
restart handshake).

Every check raises AssertionError naming what differed; the script exits non-zero with the
traceback, and prints one JSON summary line on success. curl moves the bytes (no token: signed
URLs only).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import io
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx2
import mcp_types as mt
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict

# DESIGN §5: every code, and whether the same call may succeed later unchanged
# (ferry_tus::ErrorCode::retryable).
RETRYABLE = {
    "offset_mismatch": True,
    "checksum_mismatch": True,
    "size_exceeded": False,
    "chunk_too_large": True,
    "upload_incomplete": True,
    "upload_expired": False,
    "not_found": False,
    "conflict": False,
    "locked": True,
    "invalid_argument": False,
    "unauthorized": False,
    "task_failed": False,
    "cancelled": False,
    "damaged": False,
    "internal": True,
}

# A valid-looking file/task id (26 base32 characters) that names nothing.
UNKNOWN_ID = "aaaaaaaaaaaaaaaaaaaaaaaaaa"

# Bounded polling: a stuck server fails the script instead of hanging it (the Rust side also
# kills it). Never a timing assertion.
POLL_ROUNDS = 600


class Args:
    scenario: str
    data: str
    url: str | None
    url2: str | None
    token: str | None
    token2: str | None
    ferry: str | None
    gate: str | None
    hold: bool
    server_args: list[str]


ARGS = Args()
SEEN_CODES: set[str] = set()


# ---------------------------------------------------------------------------------------------
# Small helpers


def check(cond: Any, what: str, value: Any = None) -> None:
    if not cond:
        raise AssertionError(f"{what}: {json.dumps(value, default=str)[:4000] if value is not None else ''}")


def sha256_hex(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def pseudo_random(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def sc(r: mt.CallToolResult) -> dict[str, Any]:
    """The structured content of a tool result, checked against its text mirror."""
    s = r.structured_content
    check(isinstance(s, dict), "structuredContent is an object", r.model_dump(by_alias=True))
    check(r.content and r.content[0].type == "text", "first content block is text", r.model_dump(by_alias=True))
    check(json.loads(r.content[0].text) == s, "text block mirrors structuredContent", r.model_dump(by_alias=True))
    check(len(r.content[0].text) < 4096, "result stays small", len(r.content[0].text))
    return s


def ok(r: mt.CallToolResult, what: str) -> dict[str, Any]:
    s = sc(r)
    check(not r.is_error, f"{what}: isError is false", s)
    check(s.get("status") != "failed" and "error" not in s, f"{what}: no failure envelope", s)
    return s


def envelope(r: mt.CallToolResult, code: str, what: str, cursor: int | None = None, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Assert the DESIGN §5 failure envelope with `code`; returns the error object."""
    s = sc(r)
    check(r.is_error, f"{what}: isError is true", s)
    check(s.get("status") in ("failed", "cancelled"), f"{what}: status", s)
    e = s.get("error")
    check(isinstance(e, dict), f"{what}: error object", s)
    check(e.get("code") == code, f"{what}: error.code is {code}", s)
    check(isinstance(e.get("retryable"), bool), f"{what}: error.retryable is a bool", s)
    check(e["retryable"] is RETRYABLE[code], f"{what}: error.retryable for {code}", s)
    check(isinstance(e.get("recoveryHint"), str) and e["recoveryHint"].strip(), f"{what}: error.recoveryHint", s)
    check(isinstance(e.get("message"), str) and e["message"].strip(), f"{what}: error.message", s)
    if cursor is not None:
        check(isinstance(e.get("partial"), dict) and e["partial"].get("cursor") == cursor, f"{what}: error.partial.cursor == {cursor}", s)
    for word in extra:
        check(word in e["message"], f"{what}: error.message mentions {word!r}", s)
    SEEN_CODES.add(code)
    return e


def links(r: mt.CallToolResult) -> list[dict[str, Any]]:
    return [c.model_dump(by_alias=True, exclude_none=True) for c in r.content if c.type == "resource_link"]


def check_link(r: mt.CallToolResult, fid: str, size: int | None, mime: str | None, name: str | None, what: str) -> None:
    ls = [l for l in links(r) if l.get("uri") == f"ferry://files/{fid}"]
    check(len(ls) == 1, f"{what}: one resource_link to ferry://files/{fid}", links(r))
    l = ls[0]
    if size is not None:
        check(l.get("size") == size, f"{what}: resource_link size", l)
    if mime is not None:
        check(l.get("mimeType") == mime, f"{what}: resource_link mimeType", l)
    if name is not None:
        check(l.get("name") == name, f"{what}: resource_link name", l)


def curl_call(*args: str) -> tuple[int, dict[str, str], bytes]:
    """Run curl (no proxy; no token unless the args add one); returns (status, lower-cased headers, body)."""
    with tempfile.TemporaryDirectory() as d:
        hdr, out = os.path.join(d, "h"), os.path.join(d, "b")
        cmd = ["curl", "-sS", "--noproxy", "*", "-D", hdr, "-o", out, *args]
        p = subprocess.run(cmd, capture_output=True, timeout=300)
        check(p.returncode == 0, f"curl {args} exit status", p.stderr.decode(errors="replace"))
        status, headers = parse_headers(hdr)
        return status, headers, open(out, "rb").read() if os.path.exists(out) else b""


def parse_headers(path: str) -> tuple[int, dict[str, str]]:
    # Keep the last response block (curl may print a 100 Continue first).
    text = open(path, "rb").read().decode("latin-1")
    blocks = [b for b in text.replace("\r\n", "\n").split("\n\n") if b.strip()]
    lines = blocks[-1].split("\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers


def tus_patch(url: str, offset: int, data: bytes, *extra: str) -> tuple[int, dict[str, str], bytes]:
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
        path = f.name
    try:
        return curl_call("-X", "PATCH", "-H", "Tus-Resumable: 1.0.0", "-H", "Content-Type: application/offset+octet-stream",
                         "-H", f"Upload-Offset: {offset}", *extra, "--data-binary", f"@{path}", url)
    finally:
        os.unlink(path)


def http_get(url: str, *extra: str) -> tuple[int, dict[str, str], bytes]:
    return curl_call(*extra, url)


def problem(status: int, headers: dict[str, str], body: bytes, want_status: int, code: str, what: str) -> dict[str, Any]:
    """An HTTP problem body (RFC 9457) with ferry's code."""
    check(status == want_status, f"{what}: HTTP status {want_status}", {"status": status, "body": body.decode(errors="replace")})
    check(headers.get("content-type", "").startswith("application/problem+json"), f"{what}: problem+json", headers)
    v = json.loads(body)
    check(v.get("code") == code, f"{what}: problem code {code}", v)
    check(isinstance(v.get("retryable"), bool) and v["retryable"] is RETRYABLE[code], f"{what}: problem retryable", v)
    check(isinstance(v.get("recovery_hint"), str) and v["recovery_hint"].strip(), f"{what}: problem recovery_hint", v)
    return v


def file_id_of_url(url: str) -> str:
    path = urllib.parse.urlsplit(url).path
    m = re.fullmatch(r"/files/([a-z0-9]{26})", path)
    check(m, "signed URL path is /files/{id}", url)
    return m.group(1)


# ---------------------------------------------------------------------------------------------
# Native tasks (SEP-2663) as a client extension: the SDK has no built-in support.


class TaskCreated(mt.Result):
    """`CreateTaskResult` (`resultType: "task"`) a job tool answers when the request declares the extension."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"]
    task_id: str
    status: str
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class TaskIdParams(mt.RequestParams):
    task_id: str


class UpdateTaskParams(mt.RequestParams):
    task_id: str
    input_responses: dict[str, Any]


class GetTaskRequest(mt.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class CancelTaskRequest(mt.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


class UpdateTaskRequest(mt.Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param = "taskId"


class AnyResult(mt.Result):
    model_config = ConfigDict(extra="allow")


TASK_LOG: list[dict[str, Any]] = []


async def tasks_get(session: Any, task_id: str) -> dict[str, Any]:
    r = await session.send_request(GetTaskRequest(params=TaskIdParams(task_id=task_id)), AnyResult)
    d = r.model_dump(by_alias=True, exclude_none=True)
    check(d.get("taskId") == task_id, "tasks/get answers for the task asked", d)
    TASK_LOG.append(d)
    return d


async def poll_task(session: Any, task_id: str, until: tuple[str, ...]) -> dict[str, Any]:
    for _ in range(POLL_ROUNDS):
        d = await tasks_get(session, task_id)
        if d["status"] in until:
            return d
        check(d["status"] in ("working", "input_required"), "tasks/get status", d)
        await asyncio.sleep(max(0.05, min((d.get("pollIntervalMs") or 100) / 1000, 0.2)))
    raise AssertionError(f"task {task_id} never reached {until}: {TASK_LOG[-1]}")


async def resolve_task(created: TaskCreated, ctx: ClaimContext) -> mt.CallToolResult:
    """Poll tasks/get until the task is terminal; a completed task inlines the CallToolResult."""
    TASK_LOG.append(created.model_dump(by_alias=True, exclude_none=True))
    d = await poll_task(ctx.session, created.task_id, ("completed", "failed", "cancelled"))
    if d["status"] == "completed":
        return mt.CallToolResult.model_validate(d["result"])
    raise AssertionError(f"task {created.task_id} ended {d['status']}: {d}")


class TasksExtension(ClientExtension):
    identifier = "io.modelcontextprotocol/tasks"

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskCreated, resolve=resolve_task)]


# ---------------------------------------------------------------------------------------------
# Connecting


def validating(c: Client) -> Client:
    """Validate error results against the tool's outputSchema too (issue 9 item 1).

    The `mcp` client validates structured content of successful results itself and skips
    `isError` ones; DESIGN §5 promises every result fits, so this checks those as well.
    """
    plain = c.call_tool

    async def call_tool(name: str, arguments: dict[str, Any] | None = None, *args: Any, **kwargs: Any) -> mt.CallToolResult:
        r = await plain(name, arguments, *args, **kwargs)
        if isinstance(r, mt.CallToolResult) and r.is_error:
            await c.session.validate_tool_result(name, r)
        return r

    c.call_tool = call_tool  # type: ignore[method-assign]
    return c


@asynccontextmanager
async def connect_to(url: str, extensions: list[ClientExtension] | None = None):
    """A Streamable HTTP client of `url` (another replica), no token."""
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(60.0, read=120.0), trust_env=False) as hc:
        async with Client(streamable_http_client(url, http_client=hc), extensions=extensions, cache=None) as c:
            yield validating(c)


@asynccontextmanager
async def connect(token: str | None = None, extensions: list[ClientExtension] | None = None):
    if ARGS.url:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0, read=120.0), trust_env=False) as hc:
            async with Client(streamable_http_client(ARGS.url, http_client=hc), extensions=extensions, cache=None) as c:
                yield validating(c)
    else:
        check(token is None, "stdio has no tokens")
        params = StdioServerParameters(
            command=ARGS.ferry,
            args=["serve", "--stdio", "--listen", "127.0.0.1:0", "--data", ARGS.data, *ARGS.server_args],
            env={"RUST_LOG": os.environ.get("FERRY_TEST_LOG", "warn"), "NO_COLOR": "1"},
            cwd=os.path.dirname(os.path.abspath(ARGS.data)),
        )
        async with Client(params, extensions=extensions, cache=None) as c:
            yield validating(c)


async def begin(c: Client, name: str, data: bytes | None = None, size: int | None = None, media_type: str | None = None, declare_sha: bool = True) -> dict[str, Any]:
    a: dict[str, Any] = {"name": name}
    if size is not None or data is not None:
        a["size"] = size if size is not None else len(data)
    if media_type:
        a["media_type"] = media_type
    if data is not None and declare_sha:
        a["sha256"] = sha256_hex(data)
    r = await c.call_tool("file_upload_begin", a)
    s = ok(r, f"file_upload_begin {name}")
    f = s["file"]
    check(isinstance(f.get("id"), str) and len(f["id"]) == 26, "handle id", s)
    check(f.get("complete") is False and f.get("offset") == 0 and f.get("name") == name, "fresh handle", s)
    check(s.get("method") == "PATCH" and s["headers"].get("Tus-Resumable") == "1.0.0", "upload instructions", s)
    check("scope=upload" in s["upload_url"] and file_id_of_url(s["upload_url"]) == f["id"], "signed upload_url names the file", s)
    check('-T "$FILE" "$UPLOAD_URL"' in s.get("curl", "") and '"$UPLOAD_URL"' in s.get("curl_resume", ""), "curl lines send FILE to $UPLOAD_URL", s)
    check(json.dumps(s).count(s["upload_url"]) == 1, "the signed upload URL appears once in the result", s)
    check_link(r, f["id"], a.get("size"), media_type or "application/octet-stream", name, "file_upload_begin")
    return s


async def upload_chunks(c: Client, fid: str, data: bytes, chunk: int, start: int = 0) -> dict[str, Any]:
    off = start
    s: dict[str, Any] = {}
    while off < len(data):
        piece = data[off:off + chunk]
        r = await c.call_tool("file_upload_chunk", {"file_id": fid, "offset": off, "data": b64(piece)})
        s = ok(r, f"file_upload_chunk at {off}")
        off += len(piece)
        check(s["file"]["offset"] == off, "offset after the chunk", s)
    return s


async def status(c: Client, fid: str) -> dict[str, Any]:
    r = await c.call_tool("file_status", {"file_id": fid})
    return ok(r, "file_status")["file"]


async def complete_file(c: Client, name: str, data: bytes, media_type: str | None = None) -> str:
    s = await begin(c, name, data, media_type=media_type)
    fid = s["file"]["id"]
    await upload_chunks(c, fid, data, 1 << 20)
    f = await status(c, fid)
    check(f["complete"] and f["sha256"] == sha256_hex(data), "in-band upload complete", f)
    return fid


async def wait_task(c: Client, task_id: str, until: tuple[str, ...] = ("completed", "failed", "cancelled")) -> mt.CallToolResult:
    for _ in range(POLL_ROUNDS):
        r = await c.call_tool("task_get", {"task_id": task_id, "wait_ms": 2000})
        s = sc(r)
        check(s.get("task_id") == task_id, "task_get names the task", s)
        if s["status"] in until:
            return r
        check(s["status"] in ("working", "input_required") and s.get("poll_with") == "task_get", "task_get while running", s)
    raise AssertionError(f"task {task_id} never reached {until}")


def started(r: mt.CallToolResult, kind: str, what: str) -> str:
    s = sc(r)
    check(not r.is_error, f"{what}: started", s)
    check(s.get("kind") == kind and isinstance(s.get("task_id"), str), f"{what}: task handle", s)
    if s["status"] in ("working", "input_required"):
        check(s.get("poll_with") == "task_get" and isinstance(s.get("poll_after_ms"), int), f"{what}: facade says how to poll", s)
    return s["task_id"]


def get_url(url: str, want: bytes | None = None, sha: str | None = None, what: str = "GET") -> bytes:
    status, headers, body = http_get(url)
    check(status == 200, f"{what}: HTTP 200 without a token", {"status": status, "body": body[:500].decode(errors="replace")})
    if sha is not None:
        check(sha256_hex(body) == sha, f"{what}: sha256 of the download", {"got": sha256_hex(body), "want": sha})
        want_digest = "sha-256=:" + base64.b64encode(bytes.fromhex(sha)).decode() + ":"
        check(headers.get("repr-digest") == want_digest, f"{what}: Repr-Digest", headers)
    if want is not None:
        check(body == want, f"{what}: downloaded bytes", len(body))
    return body


# ---------------------------------------------------------------------------------------------
# Scenarios


async def scenario_export() -> dict[str, Any]:
    """Upload a source with curl to the signed URL, archive it, download the archive with curl."""
    src = pseudo_random(300_000 + 17, 1)
    async with connect() as c:
        b = await begin(c, "source.bin", src)
        fid = b["file"]["id"]
        status_, headers, body = tus_patch(b["upload_url"], 0, src)
        check(status_ == 204 and headers.get("upload-offset") == str(len(src)), "curl PATCH to the signed upload URL", [status_, headers, body.decode(errors="replace")])
        f = await status(c, fid)
        check(f["complete"] and f["size"] == len(src) and f["sha256"] == sha256_hex(src), "source complete", f)

        r = await c.call_tool("archive_files", {"file_ids": [fid], "name": "export.tar"})
        task_id = started(r, "archive", "archive_files")
        r = await wait_task(c, task_id)
        s = ok(r, "archive task")
        check(s["status"] == "completed", "archive completed", s)
        h = s["file"]
        check(h["complete"] is True and h["name"] == "export.tar" and h["media_type"] == "application/x-tar", "archive handle", s)
        check(re.fullmatch(r"[0-9a-f]{64}", h.get("sha256", "")) and isinstance(h.get("size"), int), "archive handle has sha256 and size", s)
        check("scope=download" in s["download_url"] and file_id_of_url(s["download_url"]) == h["id"], "download_url names the archive", s)
        check_link(r, h["id"], h["size"], "application/x-tar", "export.tar", "archive task result")

        tar_bytes = get_url(s["download_url"], sha=h["sha256"], what="archive download_url")
        check(len(tar_bytes) == h["size"], "archive size", len(tar_bytes))
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as t:
            members = t.getmembers()
            check([m.name for m in members] == ["source.bin"], "tar members", [m.name for m in members])
            check(t.extractfile(members[0]).read() == src, "tar holds the source bytes")

        # The same file again through file_download_url, and a range of it.
        r = await c.call_tool("file_download_url", {"file_id": h["id"], "ttl_ms": 60_000})
        u = ok(r, "file_download_url")
        check(u["file"]["sha256"] == h["sha256"] and file_id_of_url(u["download_url"]) == h["id"], "file_download_url handle", u)
        get_url(u["download_url"], want=tar_bytes, what="file_download_url")
        st, hd, part = http_get(u["download_url"], "-r", "512-1023")
        check(st == 206 and part == tar_bytes[512:1024], "Range request on the signed URL", [st, hd])

        # The result is stable: task_get again answers the same handle.
        again = ok(await c.call_tool("task_get", {"task_id": task_id}), "task_get again")
        check(again["file"] == h, "task_get is stable", again)
    return {"archive": h}


async def scenario_receive() -> dict[str, Any]:
    """A person/program uploads with curl; in-band chunks; resources/read."""
    big = pseudo_random(200_000 + 3, 2)
    small = pseudo_random(10_000 + 7, 3)
    text = "ferry says hello\nsecond line: ünïcödé\n"
    async with connect() as c:
        # 1. curl to the signed upload URL, sha256 declared.
        b = await begin(c, "big.bin", big)
        fid = b["file"]["id"]
        check(b["file"]["size"] == len(big), "declared size", b)
        check((await status(c, fid))["offset"] == 0, "nothing received yet")
        st, hd, body = tus_patch(b["upload_url"], 0, big)
        check(st == 204 and hd.get("upload-offset") == str(len(big)), "curl PATCH", [st, hd, body.decode(errors="replace")])
        r = await c.call_tool("file_status", {"file_id": fid})
        f = ok(r, "file_status")["file"]
        check(f["complete"] is True and f["offset"] == len(big) and f["size"] == len(big), "complete after curl", f)
        check(f["sha256"] == sha256_hex(big), "sha256 the server computed", f)
        check_link(r, fid, len(big), "application/octet-stream", "big.bin", "file_status")

        # 2. In-band chunks of 1000 bytes, one sent at a wrong offset and repaired from the cursor.
        b2 = await begin(c, "small.bin", small)
        f2 = b2["file"]["id"]
        await upload_chunks(c, f2, small[:3000], 1000)
        r = await c.call_tool("file_upload_chunk", {"file_id": f2, "offset": 2000, "data": b64(small[2000:3000])})
        e = envelope(r, "offset_mismatch", "chunk resent at an old offset", cursor=3000)
        cur = e["partial"]["cursor"]
        r = await c.call_tool("file_upload_chunk", {"file_id": f2, "offset": cur, "data": b64(small[cur:cur + 1000])})
        check(ok(r, "repaired in one call")["file"]["offset"] == cur + 1000, "repair advanced the offset", sc(r))
        last = await upload_chunks(c, f2, small, 1000, start=cur + 1000)
        check(last["file"]["complete"] is True and last["file"]["sha256"] == sha256_hex(small), "chunked upload complete", last)
        f = await status(c, f2)
        check(f["sha256"] == sha256_hex(small) and f["size"] == len(small), "file_status after chunks", f)
        get_url(ok(await c.call_tool("file_download_url", {"file_id": f2}), "download url")["download_url"], want=small, sha=sha256_hex(small), what="chunked file")

        # 3. Resources: a small text file is read inline; large or binary files point to a URL.
        f3 = await complete_file(c, "note.txt", text.encode(), media_type="text/plain")
        res = await c.read_resource(f"ferry://files/{f3}")
        check(len(res.contents) == 1, "one content", res.model_dump(by_alias=True))
        rc = res.contents[0]
        check(getattr(rc, "text", None) == text and str(rc.uri) == f"ferry://files/{f3}" and rc.mime_type == "text/plain", "resources/read text", res.model_dump(by_alias=True))
        rr = ok(await c.call_tool("file_read_chunk", {"file_id": f3, "offset": 6, "length": 4}), "file_read_chunk")
        check(rr.get("data") == "says" and rr.get("next_offset") == 10 and rr.get("eof") is False, "file_read_chunk text", rr)
        rr = ok(await c.call_tool("file_read_chunk", {"file_id": f2, "offset": 0, "length": 16, "encoding": "base64"}), "file_read_chunk base64")
        check(base64.b64decode(rr["data"]) == small[:16], "file_read_chunk base64 bytes", rr)

        for what, rid, want, size in (("large", fid, big, len(big)), ("binary", f2, small, len(small))):
            try:
                res = await c.read_resource(f"ferry://files/{rid}")
                raise AssertionError(f"resources/read of a {what} file returned contents: {res.model_dump(by_alias=True)}")
            except MCPError as e:
                d = e.data
                check(isinstance(d, dict) and isinstance(d.get("download_url"), str), f"resources/read {what}: error data has download_url", {"code": e.code, "message": e.message, "data": d})
                check("download" in e.message, f"resources/read {what}: message points to the download", e.message)
                check(file_id_of_url(d["download_url"]) == rid and d.get("size") == size, f"resources/read {what}: data", d)
                get_url(d["download_url"], want=want, what=f"resources/read {what} download_url")

        listed = await c.list_resources()
        uris = {str(r.uri) for r in listed.resources}
        check({f"ferry://files/{x}" for x in (fid, f2, f3)} <= uris, "resources/list has the files", sorted(uris))
        fl = ok(await c.call_tool("file_list", {}), "file_list")
        check({fid, f2, f3} <= {x["id"] for x in fl["files"]}, "file_list has the files", fl)
    return {"big": fid, "chunked": f2, "text": f3}


def blob_path(fid: str) -> str:
    return os.path.join(ARGS.data, "blobs", fid[:2], fid)


async def scenario_errors() -> dict[str, Any]:
    """Every DESIGN §5 code but upload_expired (scenario `expired`), each repaired where it can be.

    The server runs with --mcp-max-chunk 1024 --max-size 1MB --checkpoint-every 64KiB and
    [commands.fail] (exits 3), [commands.slow] (sleeps), [fetch] allow_hosts = ["127.0.0.1"].
    """
    out: dict[str, Any] = {}
    async with connect() as c:
        tool = c.call_tool
        data = pseudo_random(2500, 4)

        # offset_mismatch → cursor = the right offset; repaired in one call.
        b = await begin(c, "e.bin", data)
        fid = b["file"]["id"]
        r = await tool("file_upload_chunk", {"file_id": fid, "offset": 100, "data": b64(data[100:200])})
        e = envelope(r, "offset_mismatch", "chunk at a wrong offset", cursor=0)
        r = await tool("file_upload_chunk", {"file_id": fid, "offset": e["partial"]["cursor"], "data": b64(data[:1000])})
        check(ok(r, "repair from cursor")["file"]["offset"] == 1000, "repaired", sc(r))

        # chunk_too_large: more than --mcp-max-chunk decoded bytes.
        r = await tool("file_upload_chunk", {"file_id": fid, "offset": 1000, "data": b64(data[1000:2500])})
        e = envelope(r, "chunk_too_large", "1500-byte in-band chunk", extra=("1024",))
        check((await status(c, fid))["offset"] == 1000, "an oversized chunk changes nothing")
        r = await tool("file_read_chunk", {"file_id": fid})
        envelope(r, "upload_incomplete", "file_read_chunk on an unfinished file", cursor=1000)

        # A download URL for an unfinished upload follows it (issue 51): bytes as they arrive.
        u = ok(await tool("file_download_url", {"file_id": fid}), "file_download_url on an unfinished upload")
        check(u["follows"] is True and "follow=1" in u["download_url"], "the URL of an unfinished file follows it", u)

        # size_exceeded: a chunk past the declared size, and a size above --max-size.
        r = await tool("file_upload_chunk", {"file_id": fid, "offset": 1000, "data": b64(data[1000:2000])})
        ok(r, "chunk up to 2000")
        r = await tool("file_upload_chunk", {"file_id": fid, "offset": 2000, "data": b64(data[2000:2500] + b"0123456789")})
        envelope(r, "size_exceeded", "chunk past the declared size", cursor=2000)
        r = await tool("file_upload_begin", {"name": "huge.bin", "size": 2_000_000})
        envelope(r, "size_exceeded", "size above --max-size")
        last = ok(await tool("file_upload_chunk", {"file_id": fid, "offset": 2000, "data": b64(data[2000:])}), "last chunk")
        check(last["file"]["complete"] and last["file"]["sha256"] == sha256_hex(data), "complete after the repairs", last)
        # file_read_chunk reads at most 64 KiB per call, as its inputSchema says: a larger length
        # is refused by the schema check, naming the argument.
        e = envelope(await tool("file_read_chunk", {"file_id": fid, "length": 1 << 20}), "invalid_argument", "file_read_chunk of 1 MiB")
        check("arguments/length" in e["message"], "the refusal names arguments/length", e)
        rr = ok(await tool("file_read_chunk", {"file_id": fid, "offset": 2400, "length": 1000, "encoding": "base64"}), "read the tail")
        check(base64.b64decode(rr["data"]) == data[2400:] and rr.get("eof") is True, "file_read_chunk tail", rr)

        # checksum_mismatch: the declared sha256 ≠ the bytes → reset to 0; the right bytes then complete.
        good = pseudo_random(900, 5)
        bad = bytes([good[0] ^ 1]) + good[1:]
        b = await begin(c, "c.bin", good)
        cid = b["file"]["id"]
        r = await tool("file_upload_chunk", {"file_id": cid, "offset": 0, "data": b64(bad)})
        envelope(r, "checksum_mismatch", "completing with the wrong bytes", cursor=0)
        f = await status(c, cid)
        check(f["offset"] == 0 and f["complete"] is False, "reset to offset 0", f)
        f = ok(await tool("file_upload_chunk", {"file_id": cid, "offset": 0, "data": b64(good)}), "resend")["file"]
        check(f["complete"] and f["sha256"] == sha256_hex(good), "the right bytes complete", f)

        # not_found: unknown file ids (valid and malformed) and task ids.
        for name, a in (("file_status", {"file_id": UNKNOWN_ID}), ("file_status", {"file_id": "../etc/passwd"}),
                        ("file_download_url", {"file_id": UNKNOWN_ID}), ("file_delete", {"file_id": UNKNOWN_ID}),
                        ("file_upload_chunk", {"file_id": UNKNOWN_ID, "offset": 0, "data": b64(b"x")}),
                        ("task_get", {"task_id": UNKNOWN_ID}), ("task_cancel", {"task_id": UNKNOWN_ID}),
                        ("task_respond", {"task_id": UNKNOWN_ID, "key": "k", "response": 1})):
            envelope(await tool(name, a), "not_found", f"{name} {a}")
        # A job naming an unknown input file is refused at the call, naming it.
        envelope(await tool("archive_files", {"file_ids": [UNKNOWN_ID]}), "not_found", "archive of an unknown file", extra=(UNKNOWN_ID,))

        # conflict: the same idempotency_key with other arguments.
        r1 = await tool("archive_files", {"file_ids": [fid], "idempotency_key": "same-key"})
        t1 = started(r1, "archive", "archive with a key")
        r2 = await tool("archive_files", {"file_ids": [fid], "idempotency_key": "same-key"})
        check(started(r2, "archive", "same key, same args") == t1, "same key and arguments join the task", sc(r2))
        r3 = await tool("archive_files", {"file_ids": [fid, cid], "idempotency_key": "same-key"})
        envelope(r3, "conflict", "same key, other arguments", extra=(t1,))

        # invalid_argument: a missing required argument, bad base64, an unknown argument, a bad type.
        envelope(await tool("file_upload_chunk", {"file_id": fid, "offset": 0}), "invalid_argument", "missing data", extra=("data",))
        envelope(await tool("file_upload_chunk", {"file_id": cid, "offset": 0, "data": "***not base64***"}), "invalid_argument", "bad base64")
        envelope(await tool("file_status", {"file_id": fid, "bogus": 1}), "invalid_argument", "unknown argument", extra=("bogus",))
        envelope(await tool("task_get", {"task_id": t1, "wait_ms": "soon"}), "invalid_argument", "wrong type")
        envelope(await tool("archive_files", {"file_ids": [fid], "idempotency_key": 7}), "invalid_argument", "non-string idempotency key")

        # unauthorized: fetch_url to a host outside [fetch] allow_hosts (refused before any connection).
        r = await tool("fetch_url", {"url": "http://not-allowed.invalid/big.iso"})
        envelope(r, "unauthorized", "fetch_url to a host not allow-listed", extra=("not-allowed.invalid",))

        # task_failed: export_fail's program exits 3 after writing "boom" to stderr.
        r = await tool("export_fail", {})
        tid = started(r, "command", "export_fail")
        r = await wait_task(c, tid)
        s = sc(r)
        check(s["status"] == "failed", "export_fail failed", s)
        envelope(r, "task_failed", "export_fail", extra=("boom", "3"))

        # cancelled: task_cancel on a running export.
        r = await tool("export_slow", {"idempotency_key": "slow-1"})
        tid = started(r, "command", "export_slow")
        for _ in range(POLL_ROUNDS):
            s = sc(await tool("task_get", {"task_id": tid, "wait_ms": 200}))
            if s.get("progress", {}).get("counters", {}).get("output_bytes", 0) > 0:
                break
        check(s["status"] == "working", "export_slow is running", s)
        r = await tool("task_cancel", {"task_id": tid})
        check(sc(r)["status"] == "cancelled", "task_cancel answers cancelled", sc(r))
        check(not r.is_error and "error" not in sc(r), "a successful task_cancel is not an error", sc(r))
        r = await tool("task_get", {"task_id": tid})
        check(sc(r)["status"] == "cancelled", "task_get after cancel", sc(r))
        envelope(r, "cancelled", "task_get of a cancelled task")
        r = await tool("task_cancel", {"task_id": tid})
        check(sc(r)["status"] == "cancelled", "cancelling again changes nothing", sc(r))
        tl = ok(await tool("task_list", {}), "task_list")
        check({"task_id": tid, "kind": "command", "status": "cancelled"} in tl["tasks"], "task_list shows the cancelled task", tl)

        # Issue 9 item 1: the same idempotency_key after a cancel starts a new run that names the
        # cancelled one in prior_failure (a task id); the client validates every result against
        # the tool's outputSchema, so a mismatch raises here.
        r = await tool("export_slow", {"idempotency_key": "slow-1"})
        again = ok(r, "export_slow restarted with the same key")
        check(again["task_id"] != tid and again.get("prior_failure") == tid, "the restart names the cancelled run", again)
        r = await tool("task_cancel", {"task_id": again["task_id"]})
        check(sc(r)["status"] == "cancelled", "cancel the restarted run", sc(r))
        r = await tool("task_get", {"task_id": again["task_id"]})
        envelope(r, "cancelled", "task_get of the restarted, cancelled task")
        check(sc(r).get("prior_failure") == tid, "task_get keeps prior_failure", sc(r))

        # damaged: the blob of a finished file is gone from disk (found on reading it).
        did = await complete_file(c, "victim.txt", b"soon gone\n", media_type="text/plain")
        ok(await tool("file_read_chunk", {"file_id": did}), "read before the blob is removed")
        os.remove(blob_path(did))
        r = await tool("file_read_chunk", {"file_id": did})
        out["damaged_hint"] = envelope(r, "damaged", "file_read_chunk of a file whose blob is gone")["recoveryHint"]

        # internal: a failure ferry cannot name — the blob's path is a symbolic link to itself,
        # so opening it fails with ELOOP.
        iid = await complete_file(c, "looped.txt", b"looped\n", media_type="text/plain")
        os.remove(blob_path(iid))
        os.symlink(os.path.basename(blob_path(iid)), blob_path(iid))
        r = await tool("file_read_chunk", {"file_id": iid})
        out["internal_hint"] = envelope(r, "internal", "file_read_chunk of a blob that cannot be opened")["recoveryHint"]

        # locked: an in-flight PATCH holds the upload; file_upload_chunk asks it to let go. The
        # PATCH ends with 423 `locked` (what arrived is kept, its offset in the body); the MCP
        # call then sees the new offset as offset_mismatch and repairs from its cursor.
        out["locked"] = await locked_by_takeover(c)

        # Every code but upload_expired (its own scenario) came back as a tool result; locked
        # came back as the taken-over PATCH's problem body.
        missing = set(RETRYABLE) - SEEN_CODES - {"upload_expired", "locked"}
        check(not missing, "codes not produced", sorted(missing))
    out["codes"] = sorted(SEEN_CODES)
    return out


async def locked_by_takeover(c: Client) -> dict[str, Any]:
    size = 900_000
    data = pseudo_random(size, 6)
    b = await begin(c, "slow.bin", data)
    fid, url = b["file"]["id"], b["upload_url"]
    with tempfile.TemporaryDirectory() as d:
        src, hdr, out = (os.path.join(d, n) for n in ("src", "h", "o"))
        open(src, "wb").write(data)
        proc = subprocess.Popen(
            ["curl", "-sS", "--noproxy", "*", "-X", "PATCH", "-H", "Tus-Resumable: 1.0.0",
             "-H", "Content-Type: application/offset+octet-stream", "-H", "Upload-Offset: 0",
             "--limit-rate", "64K", "--data-binary", f"@{src}", "-D", hdr, "-o", out, url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            # Wait until the PATCH has checkpointed something (file_status never interrupts it).
            for _ in range(POLL_ROUNDS):
                f = await status(c, fid)
                if f["offset"] > 0 or proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            check(proc.poll() is None, "the slow PATCH is still in flight", f)
            r = await c.call_tool("file_upload_chunk", {"file_id": fid, "offset": 0, "data": b64(data[:100])})
            e = envelope(r, "offset_mismatch", "in-band chunk at 0 while a PATCH was writing")
            kept = e["partial"]["cursor"]
            check(kept > 0, "the PATCH's bytes were kept", e)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        curl_err = proc.stderr.read().decode(errors="replace")
        check(os.path.exists(hdr) and os.path.getsize(hdr) > 0, "the slow PATCH got a response (curl exit status %s)" % proc.returncode, curl_err)
        st, hd = parse_headers(hdr)
        body = open(out, "rb").read() if os.path.exists(out) else b""
    check(st != 204, "the PATCH was asked to stop", [st, hd])
    v = problem(st, hd, body, 423, "locked", "PATCH taken over")
    check(v.get("partial", {}).get("cursor") == kept and hd.get("upload-offset") == str(kept), "the 423 carries the kept offset", [v, hd])
    SEEN_CODES.add("locked")
    f = await status(c, fid)
    check(f["offset"] == kept, "file_status shows the kept offset", f)
    st, hd, body = tus_patch(url, kept, data[kept:])
    check(st == 204 and hd.get("upload-offset") == str(size), "resume from the cursor with curl", [st, hd, body.decode(errors="replace")])
    f = await status(c, fid)
    check(f["complete"] and f["sha256"] == sha256_hex(data), "complete with the right sha256 after the takeover", f)
    return {"kept": kept, "problem": v}


async def scenario_task_output_locked() -> dict[str, Any]:
    """A file a running task is writing is locked against other writers (DESIGN §5 `locked`).

    The server has [commands.gated]: it prints `partial`, waits until the file named by --gate
    exists, then prints `more` and exits 0 (output_name `gated.out`).
    """
    check(ARGS.gate, "task_output_locked needs --gate")
    async with connect() as c:
        tid = started(await c.call_tool("export_gated", {}), "command", "export_gated")
        for _ in range(POLL_ROUNDS):
            s = sc(await c.call_tool("task_get", {"task_id": tid, "wait_ms": 200}))
            if s.get("progress", {}).get("counters", {}).get("output_bytes", 0) > 0 or s["status"] != "working":
                break
        check(s["status"] == "working", "export_gated is running", s)
        files = [f for f in ok(await c.call_tool("file_list", {}), "file_list")["files"] if f.get("name") == "gated.out"]
        check(len(files) == 1 and files[0]["complete"] is False, "the task's output file is listed, unfinished", files)
        fid = files[0]["id"]
        off = (await status(c, fid))["offset"]

        # Another writer: an in-band chunk at the file's offset, and a delete.
        r = await c.call_tool("file_upload_chunk", {"file_id": fid, "offset": off, "data": b64(b"INJECTED")})
        envelope(r, "locked", "file_upload_chunk into the output of a running task")
        r = await c.call_tool("file_delete", {"file_id": fid})
        envelope(r, "locked", "file_delete of the output of a running task")

        open(ARGS.gate, "w").close()
        r = await wait_task(c, tid)
        s = ok(r, "export_gated after the gate opened")
        check(s["status"] == "completed" and s["file"]["id"] == fid, "the task completed its own file", s)
        got = get_url(s["download_url"], sha=s["file"]["sha256"], what="export_gated output")
        check(got == b"partialmore", "the task's output holds only the task's bytes", got)
    return {"file": fid}


async def scenario_expired() -> dict[str, Any]:
    """--expire-after 1s: an unfinished upload expires; its tools say upload_expired."""
    async with connect() as c:
        b = await begin(c, "late.bin", size=10)
        fid = b["file"]["id"]
        for _ in range(POLL_ROUNDS):
            r = await c.call_tool("file_status", {"file_id": fid})
            if r.is_error:
                break
            await asyncio.sleep(0.1)
        envelope(r, "upload_expired", "file_status after expiry")
        r = await c.call_tool("file_upload_chunk", {"file_id": fid, "offset": 0, "data": b64(b"0123456789")})
        e = envelope(r, "upload_expired", "file_upload_chunk after expiry")
        check("file_upload_begin" in e["recoveryHint"], "the hint names the next tool", e)
        envelope(await c.call_tool("file_download_url", {"file_id": fid}), "upload_expired", "file_download_url after expiry")
        st, hd, body = tus_patch(b["upload_url"], 0, b"0123456789")
        problem(st, hd, body, 410, "upload_expired", "PATCH to the signed URL after expiry")
        fl = ok(await c.call_tool("file_list", {}), "file_list")
        check(fid not in {x["id"] for x in fl["files"]}, "expired uploads are not listed", fl)
    return {"expired": fid}


async def scenario_principals() -> dict[str, Any]:
    """HTTP with tokens for alice (--token) and bob (--token2)."""
    check(ARGS.url and ARGS.token and ARGS.token2, "principals needs --url --token --token2")
    # No token: 401 before MCP.
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
    st, hd, body = curl_call("-X", "POST", "-H", "Content-Type: application/json", "-H", "Accept: application/json, text/event-stream", "--data-binary", init, ARGS.url)
    problem(st, hd, body, 401, "unauthorized", "POST /mcp without a token")
    check(hd.get("www-authenticate", "").lower().startswith("bearer"), "WWW-Authenticate: Bearer", hd)
    st, hd, body = curl_call("-X", "POST", "-H", "Authorization: Bearer not-a-token", "-H", "Content-Type: application/json", "-H", "Accept: application/json, text/event-stream", "--data-binary", init, ARGS.url)
    problem(st, hd, body, 401, "unauthorized", "POST /mcp with an unknown token")
    try:
        async with connect() as c:
            await c.list_tools()
        raise AssertionError("the Python client connected to /mcp without a token")
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001 - the SDK reports the 401 as MCPError(-32603, "Server returned an error response")
        check("MCPError" in repr(e), "the client without a token fails to connect", repr(e)[:2000])

    a_data, b_data = b"alice's first file\n", b"alice's second file\n"
    async with connect(ARGS.token) as alice:
        fa = await complete_file(alice, "a.txt", a_data, media_type="text/plain")
        fb = await complete_file(alice, "b.txt", b_data, media_type="text/plain")
        tid = started(await alice.call_tool("archive_files", {"file_ids": [fa]}), "archive", "alice's archive")
        done = ok(await wait_task(alice, tid), "alice's archive")
        url_a = ok(await alice.call_tool("file_download_url", {"file_id": fa}), "download url")["download_url"]

    async with connect(ARGS.token2) as bob:
        for name, a in (("file_status", {"file_id": fa}), ("file_download_url", {"file_id": fa}),
                        ("file_read_chunk", {"file_id": fa}), ("file_delete", {"file_id": fa}),
                        ("file_upload_chunk", {"file_id": fa, "offset": 0, "data": b64(b"x")}),
                        ("task_get", {"task_id": tid}), ("task_cancel", {"task_id": tid}),
                        ("task_respond", {"task_id": tid, "key": "k", "response": 1})):
            envelope(await bob.call_tool(name, a), "not_found", f"bob: {name} of alice's")
        # bob's archive of alice's file is refused like one of an unknown file (nothing of hers leaks).
        e = envelope(await bob.call_tool("archive_files", {"file_ids": [fa]}), "not_found", "bob archives alice's file", extra=(fa,))
        check("a.txt" not in e["message"], "the failure does not name alice's file", e)
        check(not ok(await bob.call_tool("file_list", {}), "bob file_list")["files"], "bob lists no files")
        check(all(t["task_id"] != tid for t in ok(await bob.call_tool("task_list", {}), "bob task_list")["tasks"]), "bob does not list alice's task")
        try:
            await bob.read_resource(f"ferry://files/{fa}")
            raise AssertionError("bob read alice's file as a resource")
        except MCPError as e:
            check("download_url" not in json.dumps(e.data or {}), "no URL leaks to bob", e.data)
        check(f"ferry://files/{fa}" not in {str(r.uri) for r in (await bob.list_resources()).resources}, "bob lists no resources of alice")

    async with connect(ARGS.token) as alice:
        f = await status(alice, fa)
        check(f["complete"] and f["sha256"] == sha256_hex(a_data), "alice's file is untouched", f)
        check(ok(await alice.call_tool("task_get", {"task_id": tid}), "alice task_get")["file"] == done["file"], "alice's task is untouched")

    # Signed URLs: the URL opens its own file without a token, and no other.
    get_url(url_a, want=a_data, sha=sha256_hex(a_data), what="alice's signed URL")
    parts = urllib.parse.urlsplit(url_a)
    swapped = urllib.parse.urlunsplit(parts._replace(path=f"/files/{fb}"))
    st, hd, body = http_get(swapped)
    problem(st, hd, body, 403, "unauthorized", "file A's signature on file B's path")
    check(b_data not in body, "file B's bytes do not leak")
    q = urllib.parse.parse_qs(parts.query)
    sig = q["sig"][0]
    tampered = url_a.replace(f"sig={sig}", "sig=" + ("A" if sig[0] != "A" else "B") + sig[1:])
    problem(*http_get(tampered), 403, "unauthorized", "tampered signature")
    later = url_a.replace(f"expires={q['expires'][0]}", f"expires={int(q['expires'][0]) + 3600}")
    problem(*http_get(later), 403, "unauthorized", "extended expiry")
    st, hd, body = curl_call("-X", "PATCH", "-H", "Tus-Resumable: 1.0.0", "-H", "Content-Type: application/offset+octet-stream", "-H", f"Upload-Offset: {len(a_data)}", "--data-binary", "x", url_a)
    problem(st, hd, body, 403, "unauthorized", "PATCH with a download-scoped URL")
    st, hd, body = http_get(f"{parts.scheme}://{parts.netloc}/files/{fa}")
    problem(st, hd, body, 401, "unauthorized", "GET without a token or signature")
    return {"a": fa, "b": fb, "task": tid}


async def scenario_native_tasks() -> dict[str, Any]:
    """SEP-2663 through a client extension: CreateTaskResult, tasks/get, tasks/update, tasks/cancel.

    The server has [commands.slow] (sleeps) and [commands.ask] (asks for input `name`).
    """
    src = pseudo_random(50_000, 7)
    out: dict[str, Any] = {}
    async with connect(extensions=[TasksExtension()]) as c:
        fid = await complete_file(c, "native.bin", src)

        # archive_files → CreateTaskResult (seen raw with allow_claimed) → tasks/get → completed.
        created = await c.session.call_tool("archive_files", {"file_ids": [fid], "name": "native.tar"}, allow_claimed=True)
        check(isinstance(created, TaskCreated), "archive_files answers a CreateTaskResult", created.model_dump(by_alias=True))
        task_id = created.task_id
        check(created.status in ("working", "completed") and created.poll_interval_ms, "seed task state", created.model_dump(by_alias=True))
        done = await poll_task(c.session, task_id, ("completed", "failed", "cancelled"))
        check(done["status"] == "completed" and done.get("resultType", "complete") == "complete", "tasks/get: completed", done)
        inlined = mt.CallToolResult.model_validate(done["result"])
        facade = await c.call_tool("task_get", {"task_id": task_id})
        s_in, s_fa = sc(inlined), ok(facade, "task_get facade")
        check(not inlined.is_error and s_in["status"] == "completed", "inlined result", s_in)
        strip = lambda s: {k: v for k, v in s.items() if k != "download_url"}  # noqa: E731 - the URL's expiry moves with time
        check(strip(s_in) == strip(s_fa), "tasks/get inlines the same CallToolResult as task_get", {"native": s_in, "facade": s_fa})
        check(file_id_of_url(s_in["download_url"]) == file_id_of_url(s_fa["download_url"]) == s_in["file"]["id"], "both download URLs name the archive")
        check(links(inlined) == links(facade), "same resource_link blocks", [links(inlined), links(facade)])
        tar_bytes = get_url(s_in["download_url"], sha=s_in["file"]["sha256"], what="native task download_url")
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as t:
            check(t.extractfile("native.bin").read() == src, "archive made through a native task holds the source")
        out["archive"] = s_in["file"]

        # Client.call_tool resolves the claim transparently (the resolver polls tasks/get).
        n = len(TASK_LOG)
        r = await c.call_tool("archive_files", {"file_ids": [fid], "format": "zip"})
        s = ok(r, "archive via the claim resolver")
        check(s["status"] == "completed" and s["file"]["media_type"] == "application/zip", "zip archive", s)
        check(any(d.get("resultType") == "task" for d in TASK_LOG[n:]), "the resolver saw a CreateTaskResult", TASK_LOG[n:])

        # Input request: tasks/get shows it as an elicitation form; tasks/update answers it.
        created = await c.session.call_tool("export_ask", {}, allow_claimed=True)
        check(isinstance(created, TaskCreated), "export_ask answers a CreateTaskResult")
        d = await poll_task(c.session, created.task_id, ("input_required", "completed", "failed", "cancelled"))
        check(d["status"] == "input_required", "export_ask needs input", d)
        req = d.get("inputRequests", {}).get("name")
        check(req and req.get("method") == "elicitation/create" and req["params"].get("message") == "What is your name?", "input request as an elicitation form", d)
        check("answer" in req["params"]["requestedSchema"].get("properties", {}), "form asks for `answer`", req)
        f = ok(await c.call_tool("task_get", {"task_id": created.task_id}), "facade sees the question")
        check(f["status"] == "input_required" and "name" in f.get("input_requests", {}), "task_get input_requests", f)
        await c.session.send_request(UpdateTaskRequest(params=UpdateTaskParams(task_id=created.task_id, input_responses={"name": {"action": "accept", "content": {"answer": "ferry"}}})), AnyResult)
        d = await poll_task(c.session, created.task_id, ("completed", "failed", "cancelled"))
        check(d["status"] == "completed", "answered task completes", d)
        res = sc(mt.CallToolResult.model_validate(d["result"]))
        got = get_url(res["download_url"], sha=res["file"]["sha256"], what="export_ask output")
        check(got == b'hello "ferry"', "the program saw the answer", got)
        out["ask"] = got.decode()

        # tasks/cancel on a running export.
        created = await c.session.call_tool("export_slow", {}, allow_claimed=True)
        check(isinstance(created, TaskCreated), "export_slow answers a CreateTaskResult")
        d = await tasks_get(c.session, created.task_id)
        check(d["status"] == "working", "export_slow is working", d)
        await c.session.send_request(CancelTaskRequest(params=TaskIdParams(task_id=created.task_id)), AnyResult)
        d = await poll_task(c.session, created.task_id, ("cancelled", "completed", "failed"))
        check(d["status"] == "cancelled" and "result" not in d, "tasks/get after tasks/cancel", d)
        envelope(await c.call_tool("task_get", {"task_id": created.task_id}), "cancelled", "task_get of a task cancelled with tasks/cancel")

        # Unknown task → JSON-RPC error, not a result.
        try:
            await tasks_get(c.session, UNKNOWN_ID)
            raise AssertionError("tasks/get of an unknown task answered")
        except MCPError as e:
            check(e.code == -32602 and (e.data or {}).get("error", {}).get("code") == "not_found", "tasks/get unknown: invalid params with the envelope", {"code": e.code, "data": e.data})
    return out


# ---------------------------------------------------------------------------------------------
# Task status pushed (issue 27): `notifications/tasks` on a `subscriptions/listen` stream.


class TaskStatusParams(mt.NotificationParams):
    """`notifications/tasks` params: the task as tasks/get shows it (SEP-2663)."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str


PUSHED: list[dict[str, Any]] = []
PUSHED_CHANGED = asyncio.Event()


async def on_task_status(params: TaskStatusParams) -> None:
    PUSHED.append(params.model_dump(by_alias=True, exclude_none=True))
    PUSHED_CHANGED.set()


OBSERVED: list[dict[str, Any]] = []


async def on_observed(params: TaskStatusParams) -> None:
    OBSERVED.append(params.model_dump(by_alias=True, exclude_none=True))


class ObserverExtension(ClientExtension):
    """Binds `notifications/tasks` without declaring the tasks extension: must receive none."""

    identifier = "io.ferry.tests/observer"

    def notifications(self):
        return [NotificationBinding(method="notifications/tasks", params_type=TaskStatusParams, handler=on_observed)]


class PushedTasksExtension(TasksExtension):
    """The tasks extension, also observing `notifications/tasks` (a binding: the SDK's core tables do not define it)."""

    def notifications(self):
        return [NotificationBinding(method="notifications/tasks", params_type=TaskStatusParams, handler=on_task_status)]


async def pushed_until(task_id: str, statuses: list[str]) -> list[dict[str, Any]]:
    """Wait (bounded) until the notifications of `task_id` number len(statuses); check their statuses in order."""
    for _ in range(POLL_ROUNDS):
        mine = [n for n in PUSHED if n["taskId"] == task_id]
        if len(mine) >= len(statuses):
            check([n["status"] for n in mine] == statuses, f"notifications/tasks of {task_id} in order", mine)
            return mine
        PUSHED_CHANGED.clear()
        try:
            await asyncio.wait_for(PUSHED_CHANGED.wait(), 0.5)
        except asyncio.TimeoutError:
            pass
    raise AssertionError(f"expected notifications {statuses} for {task_id}, got {[n for n in PUSHED if n['taskId'] == task_id]}")


async def wait_gate(name: str) -> None:
    """Tell the test `name` happened (file GATE/name) and wait for GATE/name.done (bounded)."""
    open(os.path.join(ARGS.gate, name), "w").close()
    done = os.path.join(ARGS.gate, name + ".done")
    for _ in range(POLL_ROUNDS * 2):
        if os.path.exists(done):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the test never answered {name}")


async def scenario_task_push() -> dict[str, Any]:
    """A task that asks for input and is answered: one `notifications/tasks` per transition
    (working → input_required → working → completed), each like tasks/get's view, with the
    subscription id and a distinct `io.ferry/event` in `_meta`.

    --url2: the listen stream is on that replica, the calls on --url. --gate DIR: after
    input_required, the server is restarted (GATE/restart → GATE/restart.done) and the client
    listens again; the answer's transitions arrive on the new stream. --gate DIR --hold: before
    listening, the client asks the test to hold the outbox (GATE/hold → GATE/hold.done) and
    marks the acknowledgment's arrival (GATE/acked); the task is created the moment it arrives.
    """
    listen_url = ARGS.url2 or ARGS.url
    async with contextlib.AsyncExitStack() as stack:
        c = await stack.enter_async_context(connect(extensions=[PushedTasksExtension()]))
        lc = c if listen_url == ARGS.url else await stack.enter_async_context(connect_to(listen_url, extensions=[PushedTasksExtension()]))
        if ARGS.hold:
            await wait_gate("hold")
        sub = await stack.enter_async_context(lc.listen())
        if ARGS.hold:
            open(os.path.join(ARGS.gate, "acked"), "w").close()
        check(sub.honored is not None, "listen acknowledged")
        if ARGS.url and not ARGS.url2 and not ARGS.gate:
            # A client of the same principal without the tasks extension, listening too.
            oc = await stack.enter_async_context(connect_to(ARGS.url, extensions=[ObserverExtension()]))
            await stack.enter_async_context(oc.listen())
        created = await c.session.call_tool("export_ask", {}, allow_claimed=True)
        check(isinstance(created, TaskCreated), "export_ask answers a CreateTaskResult", created.model_dump(by_alias=True))
        tid = created.task_id
        first = await pushed_until(tid, ["working", "input_required"])
        req = first[1].get("inputRequests", {}).get("name")
        check(req and req.get("method") == "elicitation/create", "input_required notification carries the form", first[1])
        if ARGS.gate and not ARGS.hold:
            # The stream dies with the server; re-listen on the new one (no replay, as the SDK says).
            try:
                await stack.aclose()
            except Exception:  # noqa: BLE001 - the old stream's end after a kill is not under test
                pass
            await wait_gate("restart")
            stack = contextlib.AsyncExitStack()
            await stack.__aenter__()
            c = await stack.enter_async_context(connect(extensions=[PushedTasksExtension()]))
            lc = c
            await stack.enter_async_context(lc.listen())
        d = await tasks_get(c.session, tid)
        check(d["status"] == "input_required", "still waiting for input", d)
        await c.session.send_request(UpdateTaskRequest(params=UpdateTaskParams(task_id=tid, input_responses={"name": {"action": "accept", "content": {"answer": "push"}}})), AnyResult)
        got = await pushed_until(tid, ["working", "input_required", "working", "completed"])
        last = got[-1]
        res = sc(mt.CallToolResult.model_validate(last["result"]))
        check(res["status"] == "completed" and res["file"]["id"], "the completed notification inlines the result", last)
        check(get_url(res["download_url"], sha=res["file"]["sha256"], what="pushed result") == b'hello "push"', "the program saw the answer")
        ids = [n.get("_meta", {}).get("io.ferry/event") for n in got]
        check(all(isinstance(i, str) and i.startswith("evt_") for i in ids) and len(set(ids)) == 4, "each notification names its own event", got)
        check(all(n.get("_meta", {}).get("io.modelcontextprotocol/subscriptionId") is not None for n in got), "each carries the subscription id", got)
        check(OBSERVED == [], "a client without the tasks extension is sent no notifications/tasks", OBSERVED)
        await stack.aclose()
    return {"task": tid, "statuses": [n["status"] for n in got], "events": ids}


async def scenario_listen_refused() -> dict[str, Any]:
    """A listen whose start in the outbox cannot be read (--gate DIR: the test closes the
    database at GATE/close and opens it again at GATE/reopen): acknowledged, then ended with an
    error carrying ferry's envelope, `unavailable` and retryable; once the database is back, a
    listen is acknowledged and carries a task's statuses."""
    from mcp.client.subscriptions import SubscriptionLost

    async with contextlib.AsyncExitStack() as stack:
        c = await stack.enter_async_context(connect(extensions=[PushedTasksExtension()]))
        await wait_gate("close")
        lost: BaseException | None = None
        async with c.listen() as sub:
            try:
                async for _ in sub:
                    pass
            except SubscriptionLost as e:
                lost = e
        check(lost is not None, "the listen ended with an error")
        cause = lost.__cause__ if lost is not None else None
        check(isinstance(cause, MCPError), "the error is the server's", repr(cause))
        err = ((cause.data if isinstance(cause, MCPError) else None) or {}).get("error", {})
        check(err.get("code") == "unavailable" and err.get("retryable") is True, "unavailable, retryable", err)
        check("subscriptions/listen" in err.get("recoveryHint", ""), "the hint says to listen again", err)
        await wait_gate("reopen")
        # As the error says: listen again, and retry what is refused as retryable (each pooled
        # connection the database ended fails one request, then is replaced).
        for _ in range(POLL_ROUNDS):
            try:
                async with c.listen() as sub:
                    created = await c.session.call_tool("export_ask", {}, allow_claimed=True)
                    if not isinstance(created, TaskCreated):
                        refused = (getattr(created, "structured_content", None) or {}).get("error", {})
                        check(refused.get("retryable") is True, "only a retryable refusal after the database is back", created.model_dump(by_alias=True))
                        await asyncio.sleep(0.5)
                        continue
                    got = await pushed_until(created.task_id, ["working", "input_required"])
                    break
            except SubscriptionLost as e:
                cause = e.__cause__
                again = ((cause.data if isinstance(cause, MCPError) else None) or {}).get("error", {})
                check(again.get("retryable") is True, "only a retryable end after the database is back", again)
                await asyncio.sleep(0.5)
        else:
            raise AssertionError("never listened again")
    return {"error": err, "statuses": [n["status"] for n in got]}


async def scenario_subscribe() -> dict[str, Any]:
    """A model asks a person for a file (file_request), completes its id from a prefix
    (completion/complete on ferry://files/{id}), subscribes to it (subscriptions/listen with
    resourceSubscriptions) and waits without polling: the person's TUS upload (two PATCHes to the
    signed upload_url, the length declared on the first) is told as notifications/resources/updated,
    the last when it finished."""
    data = pseudo_random(300_000, 49)
    async with connect() as c:
        req = ok(await c.call_tool("file_request", {"name": "contract.pdf", "media_type": "application/pdf"}), "file_request")
        fid, url = req["file"]["id"], req["upload_url"]
        uri = f"ferry://files/{fid}"
        done = await c.complete(mt.ResourceTemplateReference(type="ref/resource", uri="ferry://files/{id}"), {"name": "id", "value": fid[:3]})
        check(fid in done.completion.values, "completion/complete offers the file id from its prefix", done.model_dump(by_alias=True))
        async with c.listen(resource_subscriptions=[uri]) as sub:
            check(uri in (sub.honored.resource_subscriptions or []), "the listen honours the file's URI", sub.honored.model_dump(by_alias=True))

            def person() -> None:
                half = len(data) // 2
                for off, chunk, extra in ((0, data[:half], ["-H", f"Upload-Length: {len(data)}"]), (half, data[half:], [])):
                    with tempfile.NamedTemporaryFile() as f:
                        f.write(chunk)
                        f.flush()
                        st, _, body = curl_call("-X", "PATCH", "-H", "Tus-Resumable: 1.0.0", "-H", "Content-Type: application/offset+octet-stream",
                                                "-H", f"Upload-Offset: {off}", *extra, "--data-binary", f"@{f.name}", url)
                        check(st == 204, f"the person's PATCH at {off}", body.decode(errors="replace"))

            upload = asyncio.create_task(asyncio.to_thread(person))
            updates = 0
            status: dict[str, Any] = {}

            async def wait_finished() -> None:
                nonlocal updates, status
                async for event in sub:
                    if getattr(event, "uri", None) != uri:
                        continue
                    updates += 1
                    status = ok(await c.call_tool("file_status", {"file_id": fid}), "file_status after an update")
                    if status["file"]["complete"]:
                        return

            await asyncio.wait_for(wait_finished(), timeout=120)
            await upload
        check(status["file"]["sha256"] == sha256_hex(data), "the finished file's sha256", status)
        return {"file_id": fid, "updates": updates, "sha256": status["file"]["sha256"]}


SCENARIOS = {
    "export": scenario_export,
    "receive": scenario_receive,
    "errors": scenario_errors,
    "expired": scenario_expired,
    "principals": scenario_principals,
    "native_tasks": scenario_native_tasks,
    "task_output_locked": scenario_task_output_locked,
    "task_push": scenario_task_push,
    "listen_refused": scenario_listen_refused,
    "subscribe": scenario_subscribe,
}


def parse_args() -> None:
    argv = sys.argv[1:]
    server_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, server_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--data", required=True)
    p.add_argument("--url")
    p.add_argument("--url2")
    p.add_argument("--token")
    p.add_argument("--token2")
    p.add_argument("--ferry")
    p.add_argument("--gate")
    p.add_argument("--hold", action="store_true")
    ns = p.parse_args(argv)
    if bool(ns.url) == bool(ns.ferry):
        p.error("give exactly one of --url and --ferry")
    ARGS.scenario, ARGS.data, ARGS.url, ARGS.token, ARGS.token2, ARGS.ferry = ns.scenario, ns.data, ns.url, ns.token, ns.token2, ns.ferry
    ARGS.server_args = server_args
    ARGS.gate = ns.gate
    ARGS.hold = ns.hold
    ARGS.url2 = ns.url2


async def main() -> None:
    parse_args()
    result = await SCENARIOS[ARGS.scenario]()
    print(json.dumps({"scenario": ARGS.scenario, "transport": "http" if ARGS.url else "stdio", "ok": True, "result": result}, default=str))


if __name__ == "__main__":
    asyncio.run(main())
