//! The CLI under test: `ferry ARGS…` as a child process with its own URL store, and a
//! loopback TCP proxy with a byte budget per direction that makes interruptions deterministic
//! (the test waits until the server has what the budget let through, kills the CLI, lifts the
//! budget and re-runs the command).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// `ferry ARGS…` against `server`, with its own URL store in `cache`, no token, no proxy.
pub fn ferry(server: &str, cache: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(ferry_bin());
    c.args(args).env("FERRY_SERVER", server).env("FERRY_CACHE_DIR", cache).env_remove("FERRY_TOKEN");
    for v in ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "https_proxy", "HTTPS_PROXY"] {
        c.env_remove(v);
    }
    c.stdin(Stdio::null());
    c
}

pub fn out(c: &mut Command) -> Output {
    c.output().expect("run ferry")
}

/// Run to completion on a blocking thread, so the test's own proxy tasks keep running.
pub async fn out_async(mut c: Command) -> Output {
    tokio::task::spawn_blocking(move || c.output().expect("run ferry")).await.unwrap()
}

pub fn code(o: &Output) -> i32 {
    o.status.code().expect("exit code")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The one JSON line of a successful `--json` run.
pub fn ok_json(o: &Output) -> Value {
    assert_eq!(code(o), 0, "stderr: {}", stderr(o));
    let s = stdout(o);
    assert_eq!(s.lines().count(), 1, "one line expected: {s}");
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// A pseudo-random file of `len` bytes in `dir`; returns its path and sha256.
pub fn source(dir: &Path, name: &str, len: usize, seed: u64) -> (PathBuf, String) {
    let data = pseudo_random(len, seed);
    let p = dir.join(name);
    std::fs::write(&p, &data).unwrap();
    (p, sha256_hex(&data))
}

/// GET the file the CLI uploaded and check its bytes' sha256.
pub async fn server_sha256(url: &str) -> String {
    let r = client().get(url).send().await.unwrap();
    assert_eq!(r.status(), 200, "GET {url}");
    sha256_hex(&r.bytes().await.unwrap())
}

/// One value of the server's Prometheus text.
pub async fn metric(s: &Server, name: &str) -> u64 {
    let text = client().get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok())).unwrap_or(0.0) as u64
}

/// Poll `cond` every 20 ms; panic with `what` after 60 s.
pub async fn wait_until<F: std::future::Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// A loopback TCP proxy with a byte budget per direction.

/// Bytes one direction may still forward; `u64::MAX` means no limit.
pub struct Gate {
    limit: AtomicU64,
    used: AtomicU64,
    notify: tokio::sync::Notify,
}

impl Gate {
    pub fn new(limit: u64) -> Arc<Gate> {
        Arc::new(Gate { limit: AtomicU64::new(limit), used: AtomicU64::new(0), notify: tokio::sync::Notify::new() })
    }

    pub fn open(&self) {
        self.limit.store(u64::MAX, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Wait until at least one byte may pass; returns how many (at most `want`).
    pub async fn take(&self, want: u64) -> u64 {
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

pub struct Proxy {
    pub base: String,
    pub up: Arc<Gate>,
    pub down: Arc<Gate>,
}

/// Forward `from` to `to`, each byte only once `gate` allows it.
pub async fn pump(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, gate: Arc<Gate>) {
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
    pub async fn start(target: String, up: u64, down: u64) -> Proxy {
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
pub fn kill9(child: &mut std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}
