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
            .env(
                "RUST_LOG",
                std::env::var("FERRY_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
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
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
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
