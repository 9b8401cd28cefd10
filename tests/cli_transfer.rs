//! `ferry upload|download|ls|status|rm|share` against the real server: round trips verified by
//! sha256, resume after the client is killed mid-transfer (SIGKILL), `--parallel`
//! concatenation, signed URLs, and the documented exit codes.
//!
//! Interruptions are made deterministic with a small loopback proxy between the CLI and the
//! server that forwards only a byte budget and then holds the rest: the test waits until the
//! server has what the budget let through, kills the CLI, lifts the budget and re-runs the
//! same command. Nothing depends on how fast this machine is.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `ferry ARGS…` against `server`, with its own URL store in `cache`, no token, no proxy.
fn ferry(server: &str, cache: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(ferry_bin());
    c.args(args).env("FERRY_SERVER", server).env("FERRY_CACHE_DIR", cache).env_remove("FERRY_TOKEN");
    for v in ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "https_proxy", "HTTPS_PROXY"] {
        c.env_remove(v);
    }
    c.stdin(Stdio::null());
    c
}

fn out(c: &mut Command) -> Output {
    c.output().expect("run ferry")
}

/// Run to completion on a blocking thread, so the test's own proxy tasks keep running.
async fn out_async(mut c: Command) -> Output {
    tokio::task::spawn_blocking(move || c.output().expect("run ferry")).await.unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exit code")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The one JSON line of a successful `--json` run.
fn ok_json(o: &Output) -> Value {
    assert_eq!(code(o), 0, "stderr: {}", stderr(o));
    let s = stdout(o);
    assert_eq!(s.lines().count(), 1, "one line expected: {s}");
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// A pseudo-random file of `len` bytes in `dir`; returns its path and sha256.
fn source(dir: &Path, name: &str, len: usize, seed: u64) -> (PathBuf, String) {
    let data = pseudo_random(len, seed);
    let p = dir.join(name);
    std::fs::write(&p, &data).unwrap();
    (p, sha256_hex(&data))
}

/// GET the file the CLI uploaded and check its bytes' sha256.
async fn server_sha256(url: &str) -> String {
    let r = client().get(url).send().await.unwrap();
    assert_eq!(r.status(), 200, "GET {url}");
    sha256_hex(&r.bytes().await.unwrap())
}

/// One value of the server's Prometheus text.
async fn metric(s: &Server, name: &str) -> u64 {
    let text = client().get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok())).unwrap_or(0.0) as u64
}

/// Poll `cond` every 20 ms; panic with `what` after 60 s.
async fn wait_until<F: std::future::Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// A loopback TCP proxy with a byte budget per direction.

/// Bytes one direction may still forward; `u64::MAX` means no limit.
struct Gate {
    limit: AtomicU64,
    used: AtomicU64,
    notify: tokio::sync::Notify,
}

impl Gate {
    fn new(limit: u64) -> Arc<Gate> {
        Arc::new(Gate { limit: AtomicU64::new(limit), used: AtomicU64::new(0), notify: tokio::sync::Notify::new() })
    }

    fn open(&self) {
        self.limit.store(u64::MAX, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Wait until at least one byte may pass; returns how many (at most `want`).
    async fn take(&self, want: u64) -> u64 {
        loop {
            let notified = self.notify.notified();
            let used = self.used.load(Ordering::SeqCst);
            let limit = self.limit.load(Ordering::SeqCst);
            if used < limit {
                let n = want.min(limit - used);
                self.used.fetch_add(n, Ordering::SeqCst);
                return n;
            }
            notified.await;
        }
    }
}

struct Proxy {
    base: String,
    up: Arc<Gate>,
    down: Arc<Gate>,
}

/// Forward `from` to `to`, each byte only once `gate` allows it.
async fn pump(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, gate: Arc<Gate>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut at = 0;
        while at < n {
            let k = gate.take((n - at) as u64).await as usize;
            if to.write_all(&buf[at..at + k]).await.is_err() {
                return;
            }
            at += k;
        }
    }
    let _ = to.shutdown().await;
}

impl Proxy {
    /// A proxy to `target` (`host:port`) that forwards at most `up` bytes to the server and
    /// `down` bytes back, then holds the rest until [`Gate::open`].
    async fn start(target: String, up: u64, down: u64) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (upg, downg) = (Gate::new(up), Gate::new(down));
        let (u, d) = (upg.clone(), downg.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else { continue };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, u.clone()));
                tokio::spawn(pump(sr, cw, d.clone()));
            }
        });
        Proxy { base, up: upg, down: downg }
    }
}

/// SIGKILL a child and reap it.
fn kill9(child: &mut std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn upload_download_ls_status_rm() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (src, sha) = source(dir.path(), "hello world.bin", 5 * 1024 * 1024 + 7, 1);

    // Upload: one line `URL<TAB>SHA256`.
    let o = out(ferry(&s.base, &cache, &["upload", src.to_str().unwrap(), "--meta", "owner=tests"]).arg("--chunk-size").arg("1MiB"));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let line = stdout(&o);
    let (url, printed) = line.trim_end().split_once('\t').unwrap_or_else(|| panic!("URL<TAB>SHA256 expected: {line:?}"));
    assert_eq!(printed, sha);
    assert!(url.starts_with(&s.url("/files/")), "{url}");
    assert_eq!(server_sha256(url).await, sha);
    let id = url.rsplit('/').next().unwrap().to_string();
    // Not a terminal: plain progress lines on stderr.
    assert!(stderr(&o).contains(" bytes ("), "no progress lines: {}", stderr(&o));

    // The same command again: the remembered upload is complete, nothing is re-sent.
    let again = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", src.to_str().unwrap()])));
    assert_eq!(again["url"], url);
    assert_eq!(again["sent"], 0);
    assert_eq!(again["sha256"], sha.as_str());
    // --fresh starts a new upload.
    let fresh = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "--fresh", "-q", src.to_str().unwrap()])));
    assert_ne!(fresh["url"], url);
    assert_eq!(fresh["sent"], 5 * 1024 * 1024 + 7);

    // status: the server's JSON, with the metadata name.
    let st = ok_json(&out(&mut ferry(&s.base, &cache, &["status", &id])));
    assert_eq!(st["sha256"], sha.as_str());
    assert_eq!(st["complete"], true);
    assert_eq!(st["name"], "hello world.bin");

    // ls: a table, and --json.
    let o = out(&mut ferry(&s.base, &cache, &["ls"]));
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).lines().any(|l| l.starts_with(&id) && l.contains("complete") && l.ends_with("hello world.bin")), "{}", stdout(&o));
    let l = ok_json(&out(&mut ferry(&s.base, &cache, &["ls", "--json"])));
    assert_eq!(l["files"].as_array().unwrap().len(), 2);

    // download: by id into a directory, named from Content-Disposition; then by URL.
    let dl = dir.path().join("dl");
    std::fs::create_dir(&dl).unwrap();
    let o = out(ferry(&s.base, &cache, &["download", &id]).current_dir(&dl));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("hello world.bin\t{sha}\n"));
    assert_eq!(sha256_hex(&std::fs::read(dl.join("hello world.bin")).unwrap()), sha);
    // It exists now: refused (2) without --force.
    let o = out(ferry(&s.base, &cache, &["download", &id]).current_dir(&dl));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let target = dl.join("by-url.bin");
    let d = ok_json(&out(&mut ferry(&s.base, &cache, &["download", "--json", url, "-o", target.to_str().unwrap()])));
    assert_eq!(d["sha256"], sha.as_str());
    assert_eq!(d["received"], 5 * 1024 * 1024 + 7);
    assert_eq!(sha256_hex(&std::fs::read(&target).unwrap()), sha);
    // To stdout.
    let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", "-", "-q"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(sha256_hex(&o.stdout), sha);

    // rm: gone (status 3), and the next upload of the file starts a new one.
    let o = out(&mut ferry(&s.base, &cache, &["rm", &id]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = out(&mut ferry(&s.base, &cache, &["status", &id]));
    assert_eq!(code(&o), 3, "{}", stderr(&o));
    assert!(stderr(&o).contains("not_found"), "{}", stderr(&o));
    let o = out(&mut ferry(&s.base, &cache, &["rm", &id]));
    assert_eq!(code(&o), 3);
    let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", dl.join("x").to_str().unwrap()]));
    assert_eq!(code(&o), 3);
}

#[tokio::test]
async fn upload_parallel_concatenation_and_empty_file() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (src, sha) = source(dir.path(), "p.bin", 9 * 1024 * 1024 + 3, 2);
    let v = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "--parallel", "4", "--chunk-size", "1MiB", src.to_str().unwrap()])));
    assert_eq!(v["sha256"], sha.as_str());
    assert_eq!(v["sent"], 9 * 1024 * 1024 + 3);
    let url = v["url"].as_str().unwrap();
    assert_eq!(server_sha256(url).await, sha);
    // The final upload names its 4 parts.
    let h = Tus::new(&s).head(url).await;
    let concat = header(&h, "upload-concat").unwrap().to_string();
    assert!(concat.starts_with("final;") && concat.split(' ').count() == 4, "{concat}");
    // Re-run: remembered, verified, nothing sent.
    let again = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "--parallel", "4", src.to_str().unwrap()])));
    assert_eq!((again["url"].as_str(), again["sent"].as_u64()), (Some(url), Some(0)));

    // An empty file: complete at creation, sha256 of nothing.
    let (empty, esha) = source(dir.path(), "empty", 0, 3);
    let v = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "--parallel", "3", empty.to_str().unwrap()])));
    assert_eq!(v["sha256"], esha.as_str());
    let target = dir.path().join("empty.out");
    let d = ok_json(&out(&mut ferry(&s.base, &cache, &["download", "--json", v["id"].as_str().unwrap(), "-o", target.to_str().unwrap()])));
    assert_eq!(d["size"], 0);
    assert_eq!(std::fs::read(&target).unwrap().len(), 0);
}

/// Kill `ferry upload` (SIGKILL) once the server has part of the file, re-run it: it resumes
/// from the server's offset (sends less than the file), and the result verifies.
async fn kill_and_resume_upload(chunk_size: Option<&str>) {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let size = 64 * 1024 * 1024 + 11;
    let (src, sha) = source(dir.path(), "big.bin", size, 4);
    // 8 MiB reach the server, then the proxy holds every further byte.
    let proxy = Proxy::start(s.addr(), 8 << 20, u64::MAX).await;
    let mut args = vec!["upload", "--json", src.to_str().unwrap()];
    if let Some(c) = chunk_size {
        args.extend(["--chunk-size", c]);
    }
    let mut first = ferry(&proxy.base, &cache, &args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    // The server has at least 1 MiB of it (counted as its PATCH handler receives bytes).
    wait_until("1 MiB at the server", || async { metric(&s, "ferry_bytes_received_total").await >= 1 << 20 }).await;
    kill9(&mut first);
    proxy.up.open();

    let o = out_async(ferry(&proxy.base, &cache, &args)).await;
    let v = ok_json(&o);
    let resumed = v["resumed_from"].as_u64().unwrap();
    let sent = v["sent"].as_u64().unwrap();
    assert!(resumed > 0, "the re-run started over: {v}\n{}", stderr(&o));
    assert!(sent < size as u64, "the re-run sent {sent} of {size} bytes: {v}");
    assert_eq!(resumed + sent, size as u64, "{v}");
    assert!(stderr(&o).contains("resuming"), "{}", stderr(&o));
    assert_eq!(v["sha256"], sha.as_str());
    assert_eq!(server_sha256(&s.url(&format!("/files/{}", v["id"].as_str().unwrap()))).await, sha);
}

#[tokio::test]
async fn upload_killed_midway_resumes_chunked() {
    kill_and_resume_upload(Some("1MiB")).await;
}

#[tokio::test]
async fn upload_killed_midway_resumes_single_patch() {
    kill_and_resume_upload(None).await;
}

/// Kill `ferry download` once part of the file is on disk, re-run it: Range + If-Range
/// continue the `.part` file, and the result verifies.
#[tokio::test]
async fn download_killed_midway_resumes() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let size = 64 * 1024 * 1024 + 13;
    let data = pseudo_random(size, 5);
    let sha = sha256_hex(&data);
    let id = Api::new(&s).upload(&data, "down.bin").await;
    drop(data);
    let proxy = Proxy::start(s.addr(), u64::MAX, 8 << 20).await;
    let target = dir.path().join("down.bin");
    let part = dir.path().join("down.bin.part");
    let args = ["download", "--json", id.as_str(), "-o", target.to_str().unwrap()];
    let mut first = ferry(&proxy.base, &cache, &args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_until("1 MiB in the .part file", || async { std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0) >= 1 << 20 }).await;
    kill9(&mut first);
    let kept = std::fs::metadata(&part).unwrap().len();
    assert!(kept < size as u64);
    assert!(!target.exists());
    proxy.down.open();

    let o = out_async(ferry(&proxy.base, &cache, &args)).await;
    let v = ok_json(&o);
    assert_eq!(v["resumed_from"], kept, "{v}");
    assert!(v["received"].as_u64().unwrap() < size as u64, "{v}");
    assert_eq!(v["received"].as_u64().unwrap() + kept, size as u64, "{v}");
    assert_eq!(v["sha256"], sha.as_str());
    assert_eq!(sha256_hex(&std::fs::read(&target).unwrap()), sha);
    assert!(!part.exists() && !dir.path().join("down.bin.part.json").exists());
}

/// A corrupted blob on the server: the download's sha256 differs from `Repr-Digest` → 4, and
/// the partial file is removed.
#[tokio::test]
async fn download_verification_failure_exits_4() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let data = pseudo_random(300_000, 6);
    let id = Api::new(&s).upload(&data, "c.bin").await;
    // Flip a byte of the stored blob behind the server's back.
    let blob = walk(&s.data.join("blobs")).into_iter().find(|p| p.file_name().unwrap().to_string_lossy().contains(&id)).expect("blob file");
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    let target = dir.path().join("c.bin");
    let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", target.to_str().unwrap()]));
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    assert!(stderr(&o).contains("sha256 mismatch"), "{}", stderr(&o));
    assert!(!target.exists() && !dir.path().join("c.bin.part").exists());
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (src, _) = source(dir.path(), "f.bin", 1000, 7);
    // Nobody listens on port 1: 5 after --retry-for.
    let o = out(&mut ferry("http://127.0.0.1:1", &cache, &["upload", "--retry-for", "1s", src.to_str().unwrap()]));
    assert_eq!(code(&o), 5, "{}", stderr(&o));
    assert!(stderr(&o).contains("gave up after") && stderr(&o).contains("hint: "), "{}", stderr(&o));
    let o = out(&mut ferry("http://127.0.0.1:1", &cache, &["download", "--retry-for", "500ms", "abc"]));
    assert_eq!(code(&o), 5, "{}", stderr(&o));
    // Usage: a bad --server, bad flags.
    assert_eq!(code(&out(&mut ferry("ftp://x", &cache, &["ls"]))), 2);
    assert_eq!(code(&out(&mut ferry("http://127.0.0.1:1", &cache, &["upload", "--parallel", "0", src.to_str().unwrap()]))), 2);
    assert_eq!(code(&out(&mut ferry("http://127.0.0.1:1", &cache, &["upload", "--meta", "novalue", src.to_str().unwrap()]))), 2);
    // A local file that does not exist: 3.
    let s = Server::start(&[]);
    let o = out(&mut ferry(&s.base, &cache, &["upload", dir.path().join("missing").to_str().unwrap()]));
    assert_eq!(code(&o), 3, "{}", stderr(&o));

    // Tokens: none → 6 with a hint; the right one works.
    let token = "fy_cli_transfer_token";
    let cfg = dir.path().join("ferry.toml");
    std::fs::write(&cfg, format!("[[tokens]]\nprincipal = \"cli\"\nsha256 = \"{}\"\n", sha256_hex(token.as_bytes()))).unwrap();
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let o = out(&mut ferry(&s.base, &cache, &["ls"]));
    assert_eq!(code(&o), 6, "{}", stderr(&o));
    assert!(stderr(&o).contains("hint: "), "{}", stderr(&o));
    let o = out(&mut ferry(&s.base, &cache, &["upload", "-q", src.to_str().unwrap()]));
    assert_eq!(code(&o), 6, "{}", stderr(&o));
    let o = out(ferry(&s.base, &cache, &["upload", "-q", src.to_str().unwrap()]).env("FERRY_TOKEN", token));
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    // The exit codes are documented in --help.
    let o = out(&mut ferry(&s.base, &cache, &["--help"]));
    for needle in ["Exit codes", "4  verification failed", "5  network", "6  authentication"] {
        assert!(stdout(&o).contains(needle), "--help lacks {needle:?}: {}", stdout(&o));
    }
}

/// `ferry share`: a signed download URL that works without the token, until it expires.
#[tokio::test]
async fn share_prints_a_signed_url() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let token = "fy_cli_share_token";
    let cfg = dir.path().join("ferry.toml");
    std::fs::write(&cfg, format!("[[tokens]]\nprincipal = \"cli\"\nsha256 = \"{}\"\n", sha256_hex(token.as_bytes()))).unwrap();
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let (src, sha) = source(dir.path(), "shared.bin", 200_000, 8);
    let v = ok_json(&out(ferry(&s.base, &cache, &["upload", "--json", "-q", src.to_str().unwrap()]).env("FERRY_TOKEN", token)));
    let id = v["id"].as_str().unwrap();
    let o = out(ferry(&s.base, &cache, &["share", id, "--ttl", "1h"]).env("FERRY_TOKEN", token));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let url = stdout(&o).trim().to_string();
    assert!(url.starts_with(&s.url(&format!("/files/{id}?"))), "{url}");
    // No token needed: plain GET, and `ferry download URL` with no token.
    assert_eq!(server_sha256(&url).await, sha);
    let target = dir.path().join("via-share.bin");
    let d = ok_json(&out(&mut ferry(&s.base, &cache, &["download", "--json", &url, "-o", target.to_str().unwrap()])));
    assert_eq!(d["sha256"], sha.as_str());
    // --json: the server's answer.
    let o = out(ferry(&s.base, &cache, &["share", id, "--ttl", "10m", "--json"]).env("FERRY_TOKEN", token));
    let j: Value = serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&o)));
    assert_eq!(j["scope"], "download");
    assert!(j["expires_at_ms"].as_u64().is_some(), "{j}");
    // Unknown file: 3.
    let o = out(ferry(&s.base, &cache, &["share", "nosuchfile", "--ttl", "1h"]).env("FERRY_TOKEN", token));
    assert_eq!(code(&o), 3, "{}", stderr(&o));
}
