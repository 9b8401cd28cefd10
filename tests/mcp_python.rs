//! The MCP server (DESIGN §5–6, issue 4) driven by real MCP clients: the Python `mcp` 2.3.0
//! client over Streamable HTTP and over stdio (it launches `ferry serve --stdio` itself), and the
//! TypeScript `@modelcontextprotocol/sdk` 1.32.2 client over HTTP. curl moves the bytes to and
//! from the signed URLs the tools return.
//!
//! Each test starts its own server (or lets the client start it) on a fresh temporary data dir and
//! runs one scenario of `tests/clients/python/mcp_ferry.py` (or `tests/clients/mcp-ts/call_tool.mjs`)
//! as a subprocess; the test fails with the client's output when the script exits non-zero.
//!
//! The clients are installed by `.ci/run`. By hand:
//!   python3 -m venv ${TMPDIR:-/tmp}/ferry-python-venv     (or $FERRY_PY_VENV)
//!   ${TMPDIR:-/tmp}/ferry-python-venv/bin/pip install -r tests/clients/python/requirements-mcp.txt
//!   (cd tests/clients/mcp-ts && npm ci)
//! Overrides: `FERRY_PYTHON` (a python that can `import mcp`), `FERRY_NODE` (node executable).
//! A missing client makes the test FAIL, never skip.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ferry_bin, python_bin, sha256_hex, write_file, Server};
use serde_json::Value;

/// Per client run; a hung client must not hang the suite.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);

const INSTALL_HINT: &str = "install the MCP clients with `bash .ci/run` or by hand: a venv at \
    $FERRY_PY_VENV (default $TMPDIR/ferry-python-venv) with `pip install -r \
    tests/clients/python/requirements-mcp.txt`; `(cd tests/clients/mcp-ts && npm ci)`";

/// `[commands.*]` and `[fetch]` for the scenarios that run export programs:
/// `fail` exits 3 after writing `boom` to stderr; `slow` writes 7 bytes and sleeps (it is
/// `exec`ed, so cancelling the task kills the sleep itself); `ask` asks for input `name`
/// once, then prints `hello <answer as JSON>`.
const COMMANDS_TOML: &str = r#"
[commands.fail]
program = "/bin/sh"
args = ["-c", "echo boom >&2; exit 3"]
description = "always fails"

[commands.slow]
program = "/bin/sh"
args = ["-c", "printf partial; exec sleep 30"]

[commands.ask]
program = "/bin/sh"
args = [
  "-c",
  '''if [ -z "$FERRY_INPUT_NAME" ]; then echo 'input name {"message":"What is your name?"}' >&2; exit 0; fi; printf 'hello %s' "$FERRY_INPUT_NAME"''',
]

[fetch]
allow_hosts = ["127.0.0.1"]
"#;

/// Server flags of the `errors` scenario (with `--config` of [`COMMANDS_TOML`]).
const ERRORS_FLAGS: &[&str] = &["--mcp-max-chunk", "1024", "--max-size", "1MB", "--checkpoint-every", "64KiB"];

/// Server flags of the `expired` scenario.
const EXPIRED_FLAGS: &[&str] = &["--expire-after", "1s", "--sweep-interval", "100ms"];

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python_dir() -> PathBuf {
    manifest_dir().join("tests/clients/python")
}

/// [`common::loopback_command`] with its output captured, unbuffered and uncoloured.
fn loopback(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = common::loopback_command(program);
    cmd.env("NO_COLOR", "1").env("PYTHONUNBUFFERED", "1");
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

/// Run a client to completion (killed after [`CLIENT_TIMEOUT`]). It must exit 0 and print a
/// JSON object as its last `{` line, which is returned; otherwise panic with its output.
fn run_client(mut cmd: Command) -> Value {
    let what = format!("{cmd:?}");
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}; {INSTALL_HINT}"));
    // Drain both pipes on threads so a chatty client never blocks on a full pipe.
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut out_pipe, &mut s).ok();
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut err_pipe, &mut s).ok();
        s
    });
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the client") {
            break Some(s);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = String::from_utf8_lossy(&out_t.join().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&err_t.join().unwrap()).into_owned();
    let Some(status) = status else {
        panic!("{what} did not finish within {CLIENT_TIMEOUT:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
    };
    assert!(status.success(), "client failed ({status}): {what}\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line from {what}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON {line:?} from {what}: {e}"))
}

/// `mcp_ferry.py SCENARIO --data DATA …` with the venv's python.
fn scenario(name: &str, data: &Path) -> Command {
    let mut cmd = loopback(python_bin());
    cmd.current_dir(python_dir()).arg(python_dir().join("mcp_ferry.py")).arg(name).arg("--data").arg(data);
    cmd
}

/// Run `name` over Streamable HTTP against `server` (plus extra script args).
fn over_http(name: &str, server: &Server, extra: &[&str]) -> Value {
    let mut cmd = scenario(name, &server.data);
    cmd.arg("--url").arg(server.url("/mcp")).args(extra);
    let v = run_client(cmd);
    assert_eq!(v["transport"], "http", "{v}");
    assert_eq!(v["scenario"], name, "{v}");
    v
}

/// Run `name` over stdio: the Python client launches `ferry serve --stdio --listen
/// 127.0.0.1:0 --data DIR SERVER-ARGS…` itself, on a fresh temporary data dir.
fn over_stdio(name: &str, server_args: &[&str]) -> Value {
    over_stdio_with(name, server_args, &[])
}

/// [`over_stdio`] with extra script args.
fn over_stdio_with(name: &str, server_args: &[&str], extra: &[&str]) -> Value {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut cmd = scenario(name, &data);
    cmd.args(extra).arg("--ferry").arg(ferry_bin()).arg("--").args(server_args);
    cmd.env("RUST_LOG", std::env::var("FERRY_TEST_LOG").unwrap_or_else(|_| "warn".into()));
    let v = run_client(cmd);
    assert_eq!(v["transport"], "stdio", "{v}");
    assert_eq!(v["scenario"], name, "{v}");
    v
}

/// A temp dir holding `ferry.toml` with `toml`; returns (dir, path as a string).
fn config(toml: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = write_file(dir.path(), "ferry.toml", toml);
    (dir, p.to_str().unwrap().to_string())
}

fn is_sha256_hex(v: &Value) -> bool {
    v.as_str().is_some_and(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
}

// ---------------------------------------------------------------------------------------------
// export: file_upload_begin → curl PATCH to the signed URL → archive_files → task_get (wait_ms)
// → handle + download_url → curl GET without a token; sha256 and tar contents match.

fn check_export(v: &Value) {
    let h = &v["result"]["archive"];
    assert!(is_sha256_hex(&h["sha256"]) && h["size"].as_u64().is_some_and(|s| s > 300_000), "{v}");
    assert_eq!(h["complete"], true, "{v}");
}

#[test]
fn python_http_export_archive_and_curl_download() {
    let s = Server::start(&[]);
    check_export(&over_http("export", &s, &[]));
}

#[test]
fn python_stdio_export_archive_and_curl_download() {
    check_export(&over_stdio("export", &[]));
}

// ---------------------------------------------------------------------------------------------
// receive: file_upload_begin (sha256 declared) → curl PATCH → file_status complete with the
// sha256; in-band file_upload_chunk of 1000 bytes with one repaired offset_mismatch;
// resource_link blocks; resources/read of text, large and binary files.

#[test]
fn python_http_receive_curl_chunks_and_resources() {
    let s = Server::start(&[]);
    let v = over_http("receive", &s, &[]);
    assert!(v["result"]["big"].is_string() && v["result"]["chunked"].is_string(), "{v}");
}

#[test]
fn python_stdio_receive_curl_chunks_and_resources() {
    let v = over_stdio("receive", &[]);
    assert!(v["result"]["big"].is_string() && v["result"]["chunked"].is_string(), "{v}");
}

// ---------------------------------------------------------------------------------------------
// errors: every DESIGN §5 code (upload_expired below) with code, retryable, recoveryHint and
// partial.cursor where an offset is known. `locked` cannot come out of an MCP tool (an in-band
// chunk never stalls and a PATCH lets go when asked), so it is checked where it arises: the
// in-flight curl PATCH that an in-band chunk takes over ends with 423 `locked`.

const ALL_BUT_EXPIRED: &[&str] = &[
    "cancelled",
    "checksum_mismatch",
    "chunk_too_large",
    "conflict",
    "damaged",
    "internal",
    "invalid_argument",
    "locked",
    "not_found",
    "offset_mismatch",
    "size_exceeded",
    "task_failed",
    "unauthorized",
    "upload_incomplete",
];

fn check_errors(v: &Value) {
    let codes: Vec<&str> = v["result"]["codes"].as_array().expect("codes").iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(codes, ALL_BUT_EXPIRED, "{v}");
    let locked = &v["result"]["locked"];
    assert_eq!(locked["problem"]["code"], "locked", "{v}");
    assert!(locked["kept"].as_u64().is_some_and(|k| k > 0 && k < 900_000), "{v}");
}

#[test]
fn python_http_every_error_code() {
    let (_cfg, path) = config(COMMANDS_TOML);
    let mut args = vec!["--config", path.as_str()];
    args.extend_from_slice(ERRORS_FLAGS);
    let s = Server::start(&args);
    check_errors(&over_http("errors", &s, &[]));
}

#[test]
fn python_stdio_every_error_code() {
    let (_cfg, path) = config(COMMANDS_TOML);
    let mut args = vec!["--config", path.as_str()];
    args.extend_from_slice(ERRORS_FLAGS);
    check_errors(&over_stdio("errors", &args));
}

#[test]
fn python_http_upload_expired() {
    let s = Server::start(EXPIRED_FLAGS);
    let v = over_http("expired", &s, &[]);
    assert!(v["result"]["expired"].is_string(), "{v}");
}

#[test]
fn python_stdio_upload_expired() {
    let v = over_stdio("expired", EXPIRED_FLAGS);
    assert!(v["result"]["expired"].is_string(), "{v}");
}

// ---------------------------------------------------------------------------------------------
// principals (HTTP): bob cannot see or touch alice's files and tasks (not_found); /mcp without a
// token is 401; a signed URL for file A with B's id in its path is 403 `unauthorized`.

#[test]
fn python_http_principals_and_signed_urls() {
    let (alice, bob) = ("alice-token-3f9c0d", "bob-token-81ae77");
    let toml = format!(
        "[[tokens]]\nprincipal = \"alice\"\nsha256 = \"{}\"\n\n[[tokens]]\nprincipal = \"bob\"\nsha256 = \"{}\"\n",
        sha256_hex(alice.as_bytes()),
        sha256_hex(bob.as_bytes())
    );
    let (_cfg, path) = config(&toml);
    let s = Server::start(&["--config", &path]);
    let v = over_http("principals", &s, &["--token", alice, "--token2", bob]);
    assert_ne!(v["result"]["a"], v["result"]["b"], "{v}");
}

// ---------------------------------------------------------------------------------------------
// native tasks (SEP-2663) through a Python client extension: CreateTaskResult, tasks/get until
// completed (inlining the same CallToolResult as task_get), tasks/update answering an input
// request, tasks/cancel. Over HTTP each tasks/* request carries `Mcp-Name: <taskId>`.

fn check_native(v: &Value) {
    assert!(is_sha256_hex(&v["result"]["archive"]["sha256"]), "{v}");
    assert_eq!(v["result"]["ask"], "hello \"ferry\"", "{v}");
}

#[test]
fn python_http_native_tasks() {
    let (_cfg, path) = config(COMMANDS_TOML);
    let s = Server::start(&["--config", &path]);
    check_native(&over_http("native_tasks", &s, &[]));
}

#[test]
fn python_stdio_native_tasks() {
    let (_cfg, path) = config(COMMANDS_TOML);
    check_native(&over_stdio("native_tasks", &["--config", &path]));
}

// ---------------------------------------------------------------------------------------------
// task_output_locked: while an export task is writing its output file, file_upload_chunk and
// file_delete on that file answer `locked`, and the task's output stays its own. The export
// program prints `partial`, waits for a gate file (and stops waiting when the test's temp dir
// is gone, or after a minute, so it never outlives a failed test), then prints `more`.

/// A config with `[commands.gated]` waiting for `gate`; returns (dir, config path, gate path).
fn gated_config() -> (tempfile::TempDir, String, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let toml = format!(
        "[commands.gated]\nprogram = \"/bin/sh\"\nargs = [\"-c\", \"printf partial; i=0; while [ -d '{}' ] && [ ! -e \
         '{}' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; printf more\"]\noutput_name = \"gated.out\"\n",
        dir.path().display(),
        gate.display()
    );
    let p = write_file(dir.path(), "ferry.toml", &toml);
    (dir, p.to_str().unwrap().to_string(), gate)
}

/// Opens the gate when dropped, so the export program ends even when the test fails.
struct Gate(PathBuf);

impl Drop for Gate {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, b"");
    }
}

#[test]
fn python_http_task_output_is_locked() {
    let (_cfg, path, gate) = gated_config();
    let _open_on_exit = Gate(gate.clone());
    let s = Server::start(&["--config", &path]);
    let v = over_http("task_output_locked", &s, &["--gate", gate.to_str().unwrap()]);
    assert!(v["result"]["file"].is_string(), "{v}");
}

#[test]
fn python_stdio_task_output_is_locked() {
    let (_cfg, path, gate) = gated_config();
    let _open_on_exit = Gate(gate.clone());
    let v = over_stdio_with("task_output_locked", &["--config", &path], &["--gate", gate.to_str().unwrap()]);
    assert!(v["result"]["file"].is_string(), "{v}");
}

// ---------------------------------------------------------------------------------------------
// TypeScript SDK 1.32.2: callTool validates structuredContent against the outputSchema even
// when isError is true; ferry's failure envelopes must fit, so no -32602 is thrown.

#[test]
fn typescript_sdk_call_tool_failing_and_succeeding() {
    let dir = manifest_dir().join("tests/clients/mcp-ts");
    assert!(
        dir.join("node_modules/@modelcontextprotocol/sdk/package.json").exists(),
        "tests/clients/mcp-ts/node_modules is not installed: {INSTALL_HINT}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_file(tmp.path(), "ferry.toml", "[commands.fail]\nprogram = \"/bin/false\"\n");
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let node = std::env::var_os("FERRY_NODE").unwrap_or_else(|| "node".into());
    let mut cmd = loopback(node);
    cmd.current_dir(&dir).arg(dir.join("call_tool.mjs")).arg(s.url("/mcp"));
    let v = run_client(cmd);
    assert_eq!(v["protocol"], "2025-11-25", "{v}");
    for (key, code) in [("failing", "not_found"), ("offset", "offset_mismatch")] {
        let e = &v[key]["error"];
        assert_eq!(e["code"], code, "{v}");
        assert!(e["retryable"].is_boolean() && e["recoveryHint"].as_str().is_some_and(|h| !h.is_empty()), "{v}");
    }
    assert_eq!(v["offset"]["error"]["partial"]["cursor"], 0, "{v}");
    assert_eq!(v["refused"]["error"]["code"], "not_found", "{v}");
    assert_eq!(v["task"]["error"]["code"], "task_failed", "{v}");
    assert_eq!(v["ok"]["size"], 3, "{v}");
}

// ---------------------------------------------------------------------------------------------
// subscribe (issue 49): file_request → completion/complete of its id → subscriptions/listen on
// ferry://files/{id} → a person's TUS upload (curl, two PATCHes) → notifications/resources/updated
// until file_status says complete, with the sha256 of what was sent; no polling in between.

fn check_subscribe(v: &Value) {
    assert!(v["result"]["updates"].as_u64().is_some_and(|n| n >= 1), "{v}");
    assert!(is_sha256_hex(&v["result"]["sha256"]), "{v}");
}

#[test]
fn python_http_subscribed_to_a_requested_file_is_told_when_it_finishes() {
    let s = Server::start(&[]);
    check_subscribe(&over_http("subscribe", &s, &[]));
}

#[test]
fn python_stdio_subscribed_to_a_requested_file_is_told_when_it_finishes() {
    check_subscribe(&over_stdio("subscribe", &[]));
}
