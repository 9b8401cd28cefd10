//! Test support: start the real `ferry` binary on port 0 with a temporary data dir, and talk
//! to it over HTTP. Every black-box test goes through [`Server`].
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `ferry serve` process. Killed (SIGKILL) on drop.
pub struct Server {
    pub child: Child,
    /// e.g. `http://127.0.0.1:41234` (no trailing slash).
    pub base: String,
    pub data: PathBuf,
    pub extra_args: Vec<String>,
    _tmp: Option<tempfile::TempDir>,
}

/// Path of the compiled `ferry` binary under test.
pub fn ferry_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ferry"))
}

impl Server {
    /// Start with a fresh temporary data dir.
    pub fn start(args: &[&str]) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("data");
        let mut s = Server::start_in(&data, args);
        s._tmp = Some(tmp);
        s
    }

    /// Start on an existing (or new) data dir, e.g. to restart after a crash.
    pub fn start_in(data: &Path, args: &[&str]) -> Server {
        let mut cmd = Command::new(ferry_bin());
        cmd.arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data")
            .arg(data)
            .args(args)
            .env_remove("FERRY_LISTEN")
            .env("RUST_LOG", std::env::var("FERRY_TEST_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("spawn ferry");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let base = loop {
            let line = lines
                .next()
                .expect("ferry exited before listening")
                .expect("read ferry stdout");
            if let Some(rest) = line.strip_prefix("listening on ") {
                break rest.trim().trim_end_matches('/').to_string();
            }
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines.by_ref() {});
        Server {
            child,
            base,
            data: data.to_path_buf(),
            extra_args: args.iter().map(|s| s.to_string()).collect(),
            _tmp: None,
        }
    }

    /// `kill -9` the process and wait for it to be gone.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kill -9 and start again on the same data dir (new port).
    pub fn restart(&mut self) {
        self.kill9();
        let args: Vec<String> = self.extra_args.clone();
        let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let tmp = self._tmp.take();
        let mut s = Server::start_in(&self.data.clone(), &argv);
        s._tmp = tmp;
        // Replace self without running Drop on the dead child.
        std::mem::swap(self, &mut s);
        std::mem::forget(s);
    }

    /// Send SIGTERM and wait for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        self.child.wait().expect("wait")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// The `host:port` part of the base URL.
    pub fn addr(&self) -> String {
        self.base.trim_start_matches("http://").to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking-free reqwest client with no proxy (tests talk to loopback only).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap()
}

/// Deterministic pseudo-random bytes (xorshift), so sources are reproducible without storing them.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut x = seed | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// A TUS client for transcript tests: every request carries `Tus-Resumable: 1.0.0` unless
/// the test passes its own headers to [`Tus::request`].
pub struct Tus {
    pub c: reqwest::Client,
    pub base: String,
}

pub const OCTET: &str = "application/offset+octet-stream";

impl Tus {
    pub fn new(server: &Server) -> Tus {
        Tus { c: client(), base: server.base.clone() }
    }

    /// Absolute URL of a `Location` value or path.
    pub fn abs(&self, loc: &str) -> String {
        if loc.starts_with("http") { loc.to_string() } else { format!("{}{}", self.base, loc) }
    }

    /// Any request with exactly the given headers.
    pub async fn request(&self, method: &str, url: &str, headers: &[(&str, &str)], body: Option<Vec<u8>>) -> reqwest::Response {
        let mut r = self.c.request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), self.abs(url));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        if let Some(b) = body {
            r = r.body(b);
        }
        r.send().await.expect("request")
    }

    /// POST /files/ with `Tus-Resumable` and the given headers.
    pub async fn post(&self, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut h = vec![("Tus-Resumable", "1.0.0")];
        h.extend_from_slice(headers);
        self.request("POST", "/files/", &h, None).await
    }

    /// Create an upload of `len` bytes; returns its absolute URL.
    pub async fn create(&self, len: u64) -> String {
        let len = len.to_string();
        let r = self.post(&[("Upload-Length", &len)]).await;
        assert_eq!(r.status(), 201, "create: {:?}", r.text().await);
        self.abs(r.headers()["location"].to_str().unwrap())
    }

    /// PATCH `body` at `offset` with extra headers.
    pub async fn patch(&self, url: &str, offset: u64, body: Vec<u8>, extra: &[(&str, &str)]) -> reqwest::Response {
        let off = offset.to_string();
        let mut h = vec![("Tus-Resumable", "1.0.0"), ("Content-Type", OCTET), ("Upload-Offset", off.as_str())];
        h.extend_from_slice(extra);
        self.request("PATCH", url, &h, Some(body)).await
    }

    pub async fn head(&self, url: &str) -> reqwest::Response {
        self.request("HEAD", url, &[("Tus-Resumable", "1.0.0")], None).await
    }

    /// The `Upload-Offset` HEAD reports.
    pub async fn offset(&self, url: &str) -> u64 {
        let r = self.head(url).await;
        assert_eq!(r.status(), 200, "HEAD {url}");
        header_u64(&r, "upload-offset").expect("Upload-Offset")
    }

    /// GET the whole file.
    pub async fn download(&self, url: &str) -> Vec<u8> {
        let r = self.c.get(self.abs(url)).send().await.unwrap();
        assert_eq!(r.status(), 200, "GET {url}");
        r.bytes().await.unwrap().to_vec()
    }
}

pub fn header<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

pub fn header_u64(r: &reqwest::Response, name: &str) -> Option<u64> {
    header(r, name).map(|v| v.parse().unwrap())
}

/// Assert an RFC 9457 problem body with our `code`, and return it.
pub async fn problem(r: reqwest::Response, status: u16, code: &str) -> serde_json::Value {
    assert_eq!(r.status().as_u16(), status, "status");
    assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).expect("problem+json body");
    assert_eq!(v["code"], code, "{v}");
    assert!(v["retryable"].is_boolean(), "{v}");
    assert!(v["recovery_hint"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    v
}
