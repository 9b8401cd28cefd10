//! Test support: start the real `ferry` binary on port 0 with a temporary data dir, and talk
//! to it over HTTP. Every black-box test goes through [`Server`].
#![allow(dead_code)]

pub mod balancer;
pub mod book;
pub mod cli;
pub mod logged;
pub mod moto;
pub mod pg;
pub mod proxy;
pub mod s3;
pub mod s3proxy;
pub mod s3strict;
pub mod venv;
pub use venv::venv_bin;

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
    /// The PostgreSQL database this server's catalog lives in (`FERRY_TEST_CATALOG=postgres`).
    pub pg_db: Option<String>,
    /// The `s3://bucket/` this server's bytes live in (`FERRY_TEST_BLOBS=s3`).
    pub s3_blobs: Option<String>,
    _tmp: Option<tempfile::TempDir>,
}

/// Whether the servers tests start keep their bytes in S3 (`FERRY_TEST_BLOBS=s3`, with an S3
/// endpoint in `FERRY_TEST_S3_ENDPOINT`, e.g. the moto server `.ci/run` starts; `.ci/run`
/// reruns the TUS and task suites so, and once more against Garage: see [`s3::S3Config`]).
pub fn blobs_are_s3() -> bool {
    match std::env::var("FERRY_TEST_BLOBS").as_deref() {
        Ok("s3") => true,
        Ok("" | "fs") | Err(_) => false,
        Ok(other) => panic!("FERRY_TEST_BLOBS={other:?}: use s3 or fs"),
    }
}

/// The test S3 of `FERRY_TEST_BLOBS=s3` (`FERRY_TEST_S3_*`).
fn test_s3() -> s3::S3Config {
    s3::S3Config::from_env().expect("FERRY_TEST_BLOBS=s3 needs FERRY_TEST_S3_ENDPOINT (an S3 such as moto_server or Garage; .ci/run starts both)")
}

/// The `AWS_*` variables that point ferry (and [`Server::blob_store`]) at the test S3.
fn test_s3_env() -> Vec<(&'static str, String)> {
    test_s3().env()
}

/// With `FERRY_TEST_BLOBS=s3`, the `s3://bucket/prefix/` of the server on `data`, the same for
/// every start on that data dir (kept in `DATA/test-bucket`): a prefix of its own in
/// `FERRY_TEST_S3_BUCKET` when that is set (a real S3 lets only its key create buckets), else a
/// new empty bucket, created unsigned (moto allows that).
fn test_bucket(data: &Path, args: &[&str]) -> Option<String> {
    if !blobs_are_s3() || args.iter().any(|a| a.starts_with("--blobs")) {
        return None;
    }
    std::fs::create_dir_all(data).expect("create data dir");
    let marker = data.join("test-bucket");
    if let Ok(url) = std::fs::read_to_string(&marker) {
        return Some(url.trim().to_string());
    }
    let config = test_s3();
    let url = match &config.shared_bucket {
        Some(bucket) => format!("s3://{bucket}/{}", s3::unique_root()),
        None => {
            let bucket = s3::unique_root().trim_end_matches('/').to_string();
            let create = format!("{}/{bucket}", config.endpoint);
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async move {
                    let r = reqwest::Client::builder().no_proxy().build().unwrap().put(&create).send().await.expect("reach FERRY_TEST_S3_ENDPOINT");
                    assert!(r.status().is_success(), "creating bucket {create}: {}", r.status());
                })
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
            format!("s3://{bucket}/")
        }
    };
    std::fs::write(&marker, &url).expect("write DATA/test-bucket");
    Some(url)
}

/// Whether the servers tests start put their catalog in PostgreSQL
/// (`FERRY_TEST_CATALOG=postgres`; `.ci/run` reruns the TUS and task suites so).
pub fn catalog_is_postgres() -> bool {
    match std::env::var("FERRY_TEST_CATALOG").as_deref() {
        Ok("postgres") => true,
        Ok("" | "sqlite") | Err(_) => false,
        Ok(other) => panic!("FERRY_TEST_CATALOG={other:?}: use postgres or sqlite"),
    }
}

/// With `FERRY_TEST_CATALOG=postgres`, the catalog URL of the server on `data`: the same
/// database for every start on that data dir (a restart reuses it), a fresh one the first
/// time. The URL is kept in `DATA/test-catalog`.
fn test_catalog(data: &Path, args: &[&str]) -> Option<(String, String)> {
    if !catalog_is_postgres() || args.iter().any(|a| a.starts_with("--catalog")) {
        return None;
    }
    std::fs::create_dir_all(data).expect("create data dir");
    let marker = data.join("test-catalog");
    if let Ok(text) = std::fs::read_to_string(&marker) {
        let (name, url) = text.trim().split_once(' ').expect("DATA/test-catalog: NAME URL");
        return Some((name.to_string(), url.to_string()));
    }
    let db = pg::TestDb::create_blocking();
    std::fs::write(&marker, format!("{} {}", db.name, db.url)).expect("write DATA/test-catalog");
    // Kept for restarts of this data dir; dropped by the next test run once this process is gone.
    let out = (db.name.clone(), db.url.clone());
    std::mem::forget(db);
    Some(out)
}

/// The free-space reserve of every server the tests start (`FERRY_MIN_FREE_SPACE`, which a
/// `--min-free-space` flag overrides): the tests share a disk with the rest of the machine,
/// whose free space is not theirs to count on. ferry's default (5 %, at most 1 GiB) made 30
/// tests answer 507 once a CI machine had 1.0 GiB free. tests/exhaustion.rs fills a disk of
/// its own to test the reserve itself.
pub const TEST_MIN_FREE_SPACE: (&str, &str) = ("FERRY_MIN_FREE_SPACE", "32MiB");

/// Path of the compiled `ferry` binary under test.
/// Run `cmd` to its end with stdout and stderr captured, as `Command::output` does, but fail
/// the test (killing the process) if it has not ended within `within`: a command that hangs
/// (`ferry check` or `ferry serve` waiting on a FIFO once did) is a finding, not a stuck run.
pub fn output_within(cmd: &mut Command, within: Duration) -> std::process::Output {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let pid = child.id().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(within) {
        Ok(out) => out.expect("wait for the command"),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            panic!("{cmd:?} did not end within {within:?}");
        }
    }
}

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
        Server::start_under(&[], data, args)
    }

    /// Start under a wrapper command, e.g. `["prlimit", "--nofile=1024:20000", "--"]`.
    pub fn start_under(wrapper: &[&str], data: &Path, args: &[&str]) -> Server {
        Server::start_listening(wrapper, data, "127.0.0.1:0", args)
    }

    /// Start listening on `listen` (e.g. the address a killed server had).
    fn start_listening(wrapper: &[&str], data: &Path, listen: &str, args: &[&str]) -> Server {
        let catalog = test_catalog(data, args);
        let bucket = test_bucket(data, args);
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(ferry_bin());
                c
            }
            None => Command::new(ferry_bin()),
        };
        if let Some((_, url)) = &catalog {
            // From the environment, not argv: the URL carries a password.
            cmd.env("FERRY_CATALOG", url);
        } else {
            cmd.env_remove("FERRY_CATALOG");
        }
        if let Some(url) = &bucket {
            cmd.envs(test_s3_env()).env("FERRY_BLOBS", url);
        }
        cmd.arg("serve")
            .arg("--listen")
            .arg(listen)
            .arg("--data")
            .arg(data)
            .args(args)
            .env_remove("FERRY_LISTEN")
            .env(TEST_MIN_FREE_SPACE.0, TEST_MIN_FREE_SPACE.1)
            .env("RUST_LOG", std::env::var("FERRY_TEST_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("spawn ferry");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let base = loop {
            let line = lines.next().expect("ferry exited before listening").expect("read ferry stdout");
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
            pg_db: catalog.map(|c| c.0),
            s3_blobs: bucket,
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

    /// Kill -9 and start again on the same data dir and the same address, so URLs a client
    /// holds (a browser's page) stay valid.
    pub fn restart_same_port(&mut self) {
        self.kill9();
        let (args, addr) = (self.extra_args.clone(), self.addr());
        let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let tmp = self._tmp.take();
        let mut s = Server::start_listening(&[], &self.data.clone(), &addr, &argv);
        s._tmp = tmp;
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

impl Server {
    /// The blob store this server keeps its bytes in, opened by the test (the fs store under
    /// `DATA/blobs`, or the test bucket): tests check the storage invariant through the
    /// BlobStore API, so they hold on every store.
    pub fn blob_store(&self) -> std::sync::Arc<dyn ferry::blob::BlobStore> {
        match &self.s3_blobs {
            Some(url) => {
                for (k, v) in test_s3_env() {
                    std::env::set_var(k, v);
                }
                std::sync::Arc::new(ferry::blob::S3BlobStore::from_url(url, ferry::blob::s3::MIN_PART).expect("open the test bucket"))
            }
            None => std::sync::Arc::new(ferry::blob::FsBlobStore::open(&self.data.join("blobs"), false).expect("open DATA/blobs")),
        }
    }

    /// The stored length of upload `id`'s bytes (`None`: the store holds nothing for it).
    pub async fn blob_len(&self, id: &str) -> Option<u64> {
        self.blob_store().len(id).await.expect("BlobStore::len")
    }

    /// Bytes `range` of upload `id` as the blob store holds them.
    pub async fn blob_bytes(&self, id: &str, range: std::ops::Range<u64>) -> Vec<u8> {
        use futures::TryStreamExt;
        let chunks: Vec<bytes::Bytes> = self.blob_store().read(id, range).await.expect("BlobStore::read").try_collect().await.expect("read blob");
        chunks.concat()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server's `ferry_bytes_received_total` (upload body bytes it has taken in and written).
pub async fn bytes_received(server: &Server) -> u64 {
    counter(server, "ferry_bytes_received_total").await
}

/// The server's `ferry_task_bytes_written_total`: bytes its task runs wrote to output files.
pub async fn task_bytes_written(server: &Server) -> u64 {
    counter(server, "ferry_task_bytes_written_total").await
}

async fn counter(server: &Server, name: &str) -> u64 {
    let text = client().get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' '))).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Wait until the server has received at least `at_least` upload body bytes (its metrics never
/// interrupt an upload): the observable event tests wait on instead of sleeping. A byte counted
/// there is written and is kept by whatever ends the PATCH. Panics after 60 s.
pub async fn wait_bytes_received(server: &Server, at_least: u64) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let n = bytes_received(server).await;
        if n >= at_least {
            return n;
        }
        assert!(std::time::Instant::now() < deadline, "the server received {n} bytes, not {at_least}, within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A blocking-free reqwest client with no proxy (tests talk to loopback only). With
/// `FERRY_TEST_HTTP2=1` it speaks HTTP/2 with prior knowledge (h2c), so a suite built on it
/// ([`Tus`], [`Api`]) reruns over HTTP/2 (`.ci/run` reruns the TUS and draft suites so).
pub fn client() -> reqwest::Client {
    let b = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(600));
    if over_http2() { b.http2_prior_knowledge() } else { b }.build().unwrap()
}

/// Whether tests speak HTTP/2 to the servers they start (`FERRY_TEST_HTTP2=1`).
pub fn over_http2() -> bool {
    std::env::var("FERRY_TEST_HTTP2").is_ok_and(|v| v == "1")
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
        if loc.starts_with("http") {
            loc.to_string()
        } else {
            format!("{}{}", self.base, loc)
        }
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

// ---------------------------------------------------------------------------------------------
// Task engine helpers (tests/tasks_api.rs, tests/tasks_crash.rs)

impl Server {
    /// Kill -9 and start again on the same data dir with other extra args (e.g. a shorter
    /// `--task-lease`). The temp dir stays owned by `self`.
    pub fn restart_with(&mut self, args: &[&str]) {
        self.kill9();
        let tmp = self._tmp.take();
        let mut s = Server::start_in(&self.data.clone(), args);
        s._tmp = tmp;
        std::mem::swap(self, &mut s);
        std::mem::forget(s);
    }
}

/// Write `text` to `dir/name` and return the path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Write an executable `/bin/sh` script to `dir/name` and return its path.
pub fn write_script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = write_file(dir, name, &format!("#!/bin/sh\n{body}"));
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// A JSON API client for `/api/v1`, optionally with a bearer token.
#[derive(Clone)]
pub struct Api {
    pub c: reqwest::Client,
    pub base: String,
    pub token: Option<String>,
}

impl Api {
    pub fn new(server: &Server) -> Api {
        Api { c: client(), base: server.base.clone(), token: None }
    }

    pub fn with_token(server: &Server, token: &str) -> Api {
        Api { c: client(), base: server.base.clone(), token: Some(token.to_string()) }
    }

    /// Any request; `path` is absolute (`/api/v1/...`, `/files/...`). Adds the bearer token.
    pub async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Option<Vec<u8>>) -> reqwest::Response {
        let url = if path.starts_with("http") { path.to_string() } else { format!("{}{}", self.base, path) };
        let mut r = self.c.request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), url);
        if let Some(t) = &self.token {
            r = r.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        if let Some(b) = body {
            r = r.body(b);
        }
        r.send().await.expect("request")
    }

    /// POST a JSON body given as text.
    pub async fn post(&self, path: &str, body: &str) -> reqwest::Response {
        self.send("POST", path, &[("content-type", "application/json")], Some(body.as_bytes().to_vec())).await
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.send("GET", path, &[], None).await
    }

    /// `POST /api/v1/tasks` with `{"kind":KIND,"args":ARGS[,"ttl_ms":N]}` (args as exact text).
    pub async fn start_raw(&self, kind: &str, args: &str, key: Option<&str>, ttl_ms: Option<i64>) -> reqwest::Response {
        let ttl = ttl_ms.map(|t| format!(",\"ttl_ms\":{t}")).unwrap_or_default();
        let body = format!("{{\"kind\":{},\"args\":{args}{ttl}}}", serde_json::to_string(kind).unwrap());
        let mut h = vec![("content-type", "application/json")];
        if let Some(k) = key {
            h.push(("idempotency-key", k));
        }
        self.send("POST", "/api/v1/tasks", &h, Some(body.into_bytes())).await
    }

    /// Start a task and expect 201; returns the task view.
    pub async fn start(&self, kind: &str, args: &str) -> serde_json::Value {
        let r = self.start_raw(kind, args, None, None).await;
        assert_eq!(r.status(), 201, "start {kind}");
        json(r).await
    }

    /// `GET /api/v1/tasks/{id}`, expecting 200.
    pub async fn task(&self, id: &str) -> serde_json::Value {
        let r = self.get(&format!("/api/v1/tasks/{id}")).await;
        assert_eq!(r.status(), 200, "GET task {id}");
        json(r).await
    }

    /// Poll the task until `done(view)` holds or `secs` pass (then panic with the last view).
    pub async fn wait_for(&self, id: &str, secs: u64, what: &str, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.task(id).await;
            if done(&v) {
                return v;
            }
            assert!(std::time::Instant::now() < deadline, "task {id}: timed out waiting for {what}; last view: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Poll until the task reaches `status` (panics early if it reaches another terminal one).
    pub async fn wait_status(&self, id: &str, status: &str, secs: u64) -> serde_json::Value {
        let v = self
            .wait_for(id, secs, status, |v| {
                let s = v["status"].as_str().unwrap();
                s == status || matches!(s, "completed" | "failed" | "cancelled")
            })
            .await;
        assert_eq!(v["status"], status, "{v}");
        v
    }

    /// `GET /api/v1/files/{id}`, expecting 200.
    pub async fn file(&self, id: &str) -> serde_json::Value {
        let r = self.get(&format!("/api/v1/files/{id}")).await;
        assert_eq!(r.status(), 200, "GET file {id}");
        json(r).await
    }

    /// Download `/files/{id}` whole.
    pub async fn download(&self, id: &str) -> Vec<u8> {
        let r = self.get(&format!("/files/{id}")).await;
        assert_eq!(r.status(), 200, "download {id}");
        r.bytes().await.unwrap().to_vec()
    }

    /// Upload `data` with TUS (creation, then PATCHes of up to 32 MiB) under `filename`;
    /// returns the upload id.
    pub async fn upload(&self, data: &[u8], filename: &str) -> String {
        use base64::Engine as _;
        let md = format!("filename {}", base64::engine::general_purpose::STANDARD.encode(filename));
        let len = data.len().to_string();
        let r = self.send("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", &len), ("Upload-Metadata", &md)], None).await;
        assert_eq!(r.status(), 201, "create upload");
        let loc = header(&r, "location").unwrap().to_string();
        let id = loc.trim_end_matches('/').rsplit('/').next().unwrap().to_string();
        let mut off = 0usize;
        while off < data.len() || data.is_empty() {
            let end = (off + (32 << 20)).min(data.len());
            let o = off.to_string();
            let r = self
                .send(
                    "PATCH",
                    &format!("/files/{id}"),
                    &[("Tus-Resumable", "1.0.0"), ("Content-Type", OCTET), ("Upload-Offset", &o)],
                    Some(data[off..end].to_vec()),
                )
                .await;
            assert_eq!(r.status(), 204, "PATCH {id} at {off}");
            off = end;
            if data.is_empty() {
                break;
            }
        }
        id
    }
}

/// The response body as JSON.
pub async fn json(r: reqwest::Response) -> serde_json::Value {
    let b = r.bytes().await.unwrap();
    serde_json::from_slice(&b).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&b)))
}

impl Tus {
    /// Poll HEAD until the upload is complete (a final upload is built by a `concat` task in
    /// the background); returns the HEAD response. Panics after 30 s.
    pub async fn wait_complete(&self, url: &str) -> reqwest::Response {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let r = self.head(url).await;
            let off = header(&r, "upload-offset").map(str::to_owned);
            if off.is_some() && off.as_deref() == header(&r, "upload-length") {
                return r;
            }
            assert!(std::time::Instant::now() < deadline, "upload {url} never completed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Interoperability helpers (tests/interop_*.rs): run a real client as a subprocess.

/// The repository root.
pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A command with no proxy settings (everything talks to loopback) and no stdin; a `ferry
/// serve` it starts (a Python or Node MCP client does) keeps [`TEST_MIN_FREE_SPACE`].
pub fn loopback_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for var in ["http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        cmd.env_remove(var);
    }
    cmd.env("NO_PROXY", "*").env("no_proxy", "*").env(TEST_MIN_FREE_SPACE.0, TEST_MIN_FREE_SPACE.1).stdin(Stdio::null());
    cmd
}

/// `node tests/clients/node/SCRIPT ARGS…` (node from `FERRY_NODE`, default `node`), run in
/// that directory so `require` finds its node_modules. Panics if tus-js-client is missing.
pub fn node_script(script: &str, args: &[&str]) -> Command {
    let dir = manifest_dir().join("tests/clients/node");
    assert!(
        dir.join("node_modules/tus-js-client/package.json").exists(),
        "tests/clients/node/node_modules is not installed: run `bash .ci/run` or `(cd tests/clients/node && npm ci)`"
    );
    let node = std::env::var_os("FERRY_NODE").unwrap_or_else(|| "node".into());
    let mut cmd = loopback_command(node);
    cmd.current_dir(&dir).arg(dir.join(script)).args(args);
    cmd
}

/// The Python that runs test clients: `FERRY_PYTHON`, else [`python_venv`]'s.
pub fn python_bin() -> PathBuf {
    std::env::var_os("FERRY_PYTHON").map(PathBuf::from).unwrap_or_else(|| venv_bin("python"))
}

/// `python tests/clients/python/SCRIPT ARGS…` with [`python_bin`].
pub fn python_script(script: &str, args: &[&str]) -> Command {
    let dir = manifest_dir().join("tests/clients/python");
    let py = python_bin();
    let mut cmd = loopback_command(py);
    cmd.current_dir(&dir).arg(dir.join(script)).args(args);
    cmd
}

/// Run a client to completion (killed after `secs`); it must exit 0 and print a JSON object
/// as its last `{` line, which is returned.
pub async fn run_json_client(mut cmd: Command, secs: u64) -> serde_json::Value {
    let what = format!("{cmd:?}");
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let pid = child.id();
    let waiter = tokio::task::spawn_blocking(move || child.wait_with_output());
    let out = match tokio::time::timeout(Duration::from_secs(secs), waiter).await {
        Ok(o) => o.unwrap().unwrap(),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("{what} did not finish within {secs} s");
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "client failed ({}): {what}\n--- stdout\n{stdout}\n--- stderr\n{stderr}", out.status);
    let line =
        stdout.lines().rev().find(|l| l.trim_start().starts_with('{')).unwrap_or_else(|| panic!("no JSON line from {what}\n{stdout}\n{stderr}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON {line:?} from {what}: {e}"))
}

/// Wait until the upload at `url` (absolute, or relative to the server) is complete, then
/// GET it: its sha256 and the `Repr-Digest` header must both equal `sha256_hex`.
pub async fn assert_stored_sha256(server: &Server, url: &str, sha256_hex_want: &str) {
    use base64::Engine as _;
    let tus = Tus::new(server);
    let url = tus.abs(url);
    assert!(url.starts_with(&server.url("/files/")), "{url} is not an upload of this server");
    tus.wait_complete(&url).await;
    let r = client().get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200, "GET {url}");
    let digest = header(&r, "repr-digest").map(str::to_owned);
    let body = r.bytes().await.unwrap();
    assert_eq!(sha256_hex(&body), sha256_hex_want, "GET {url}: the stored bytes differ");
    let want = format!("sha-256=:{}:", base64::engine::general_purpose::STANDARD.encode(hex::decode(sha256_hex_want).unwrap()));
    assert_eq!(digest.as_deref(), Some(want.as_str()), "GET {url}: Repr-Digest");
}

/// A child's stderr, read line by line on a thread so a test can wait for a line while the
/// child runs and still see every line it wrote once it has exited.
pub struct StderrLines(std::sync::mpsc::Receiver<String>);

impl StderrLines {
    /// Take `child`'s piped stderr. Panics if stderr was not `Stdio::piped()`.
    pub fn take(child: &mut Child) -> StderrLines {
        let err = child.stderr.take().expect("stderr is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        StderrLines(rx)
    }

    /// The next line, waiting at most 60 s; `None` once stderr is closed or nothing came.
    pub fn next(&self) -> Option<String> {
        self.0.recv_timeout(Duration::from_secs(60)).ok()
    }

    /// Lines up to and including the first containing `needle`; panics after 60 s without one.
    pub fn until(&self, needle: &str) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let l = self.next().unwrap_or_else(|| panic!("no stderr line with {needle:?}; so far: {seen:?}"));
            let done = l.contains(needle);
            seen.push(l);
            if done {
                return seen;
            }
        }
    }

    /// Every line still to come, up to the end of stderr: call it once the child has exited,
    /// so lines the reader thread has not passed on yet are not lost (at most 60 s).
    pub fn rest(&self) -> Vec<String> {
        std::iter::from_fn(|| self.next()).collect()
    }
}
