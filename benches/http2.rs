//! HTTP/2 against HTTP/1.1 on the real `ferry` binary (issue 49): the same uploads over each,
//! the ratios from one run.
//!
//!     cargo bench --bench http2                 # release build of ferry
//!     cargo bench --profile dev --bench http2   # the dev build (dependencies at opt-level 2)
//!
//! Scenarios (each on a fresh `ferry serve` with a fresh data dir under `target/tmp`, removed
//! afterwards; the default `--durability full`: sha256 and fdatasync every 64 MiB):
//!
//! 1. **8 concurrent uploads** of `FERRY_BENCH_H2_MIB` MiB each (default 256): eight TUS
//!    creations, then eight PATCHes at once — over ONE HTTP/2 connection (reqwest with
//!    `http2_prior_knowledge`, which multiplexes every request on one connection) against over
//!    EIGHT HTTP/1.1 connections (reqwest `http1_only`, whose pool opens one per request in
//!    flight).
//! 2. **One upload** of `FERRY_BENCH_H2_BIG_MIB` MiB (default 1024) over HTTP/2 and over
//!    HTTP/1.1.
//!
//! The client streams 1 MiB `Bytes` slices of a prepared 64 MiB pseudo-random buffer (no
//! copies). The clock runs from sending the PATCHes to the last 204; the server's CPU is
//! utime + stime from /proc/PID/stat before and after, per GiB received. Printed: MB/s and CPU
//! s/GiB per protocol, and the ratios HTTP/2 ÷ HTTP/1.1 (speed: higher is better; CPU/GiB:
//! lower is better). The goals: speed ≥ 0.95×, CPU/GiB ≤ 1.05×. One run, HTTP/1.1
//! first; the machine's noise is the caveat.
//!
//! `harness = false`: a plain `main`. The `ferry` binary is `env!("CARGO_BIN_EXE_ferry")`, built
//! with the profile the bench is.

#[path = "support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;

const MIB: u64 = 1 << 20;
const CHUNK: u64 = MIB;
const POOL: u64 = 64 * MIB;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

/// utime + stime of `pid` in seconds (/proc/PID/stat; USER_HZ is 100).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("").split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// A `ferry serve` on a fresh data dir; killed and its data removed on drop.
struct Server {
    child: Child,
    base: String,
    data: PathBuf,
}

impl Server {
    fn start(dir: &Path, name: &str) -> Server {
        let data = dir.join(name);
        let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(&data)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start ferry");
        let base = support::wait_listening(&mut child);
        Server { child, base, data }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// `size` bytes as 1 MiB zero-copy slices of `pool`, as a request body.
fn body(pool: &Bytes, size: u64) -> reqwest::Body {
    let mut parts = Vec::with_capacity((size / CHUNK + 1) as usize);
    let mut done = 0;
    while done < size {
        let len = CHUNK.min(size - done);
        let off = (done % POOL) as usize;
        parts.push(Ok::<_, std::io::Error>(pool.slice(off..off + len as usize)));
        done += len;
    }
    reqwest::Body::wrap_stream(futures::stream::iter(parts))
}

#[derive(Clone, Copy, PartialEq)]
enum Proto {
    Http1,
    Http2,
}

impl Proto {
    fn client(self) -> reqwest::Client {
        let b = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(3600));
        match self {
            Proto::Http1 => b.http1_only(),
            Proto::Http2 => b.http2_prior_knowledge(),
        }
        .build()
        .unwrap()
    }
}

struct Sample {
    elapsed: Duration,
    server_cpu: f64,
    bytes: u64,
}

impl Sample {
    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.elapsed.as_secs_f64()
    }

    fn cpu_per_gib(&self) -> f64 {
        self.server_cpu / (self.bytes as f64 / (1u64 << 30) as f64)
    }
}

/// `n` uploads of `size` bytes at once over `proto`, on a fresh server.
async fn run(dir: &Path, pool: &Bytes, proto: Proto, n: usize, size: u64) -> Sample {
    let s = Server::start(dir, &format!("{}-{n}x{size}", if proto == Proto::Http1 { "h1" } else { "h2" }));
    let c = proto.client();
    let mut urls = Vec::new();
    for _ in 0..n {
        let r = c
            .post(format!("{}/files/", s.base))
            .header("Tus-Resumable", "1.0.0")
            .header("Upload-Length", size.to_string())
            .send()
            .await
            .expect("create");
        assert_eq!(r.status(), 201, "create");
        let loc = r.headers()["location"].to_str().unwrap().to_string();
        urls.push(if loc.starts_with("http") { loc } else { format!("{}{loc}", s.base) });
    }
    let cpu0 = cpu_seconds(s.child.id());
    let t0 = Instant::now();
    let patches = urls.iter().map(|url| {
        let req = c
            .patch(url)
            .header("Tus-Resumable", "1.0.0")
            .header("Content-Type", "application/offset+octet-stream")
            .header("Upload-Offset", "0")
            .header("Content-Length", size.to_string())
            .body(body(pool, size));
        async move {
            let r = req.send().await.expect("PATCH");
            assert_eq!((r.status().as_u16(), r.version() == reqwest::Version::HTTP_2), (204, proto == Proto::Http2), "PATCH");
        }
    });
    futures::future::join_all(patches).await;
    let elapsed = t0.elapsed();
    let server_cpu = cpu_seconds(s.child.id()) - cpu0;
    Sample { elapsed, server_cpu, bytes: size * n as u64 }
}

fn row(scenario: &str, h1: &Sample, h2: &Sample) -> String {
    format!(
        "| {scenario} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
        h1.mb_per_s(),
        h2.mb_per_s(),
        h2.mb_per_s() / h1.mb_per_s(),
        h1.cpu_per_gib(),
        h2.cpu_per_gib(),
        h2.cpu_per_gib() / h1.cpu_per_gib()
    )
}

#[tokio::main]
async fn main() {
    let each = env_u64("FERRY_BENCH_H2_MIB", 256) * MIB;
    let big = env_u64("FERRY_BENCH_H2_BIG_MIB", 1024) * MIB;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tmp/bench-http2");
    std::fs::create_dir_all(&dir).unwrap();
    let pool = Bytes::from(support::pseudo_random(POOL as usize, 49));

    let many = (run(&dir, &pool, Proto::Http1, 8, each).await, run(&dir, &pool, Proto::Http2, 8, each).await);
    let one = (run(&dir, &pool, Proto::Http1, 1, big).await, run(&dir, &pool, Proto::Http2, 1, big).await);
    let _ = std::fs::remove_dir_all(&dir);

    println!("| scenario | HTTP/1.1 MB/s | HTTP/2 MB/s | speed h2÷h1 | HTTP/1.1 CPU s/GiB | HTTP/2 CPU s/GiB | CPU/GiB h2÷h1 |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    println!("{}", row(&format!("8 × {} MiB at once (8 HTTP/1.1 connections vs 1 HTTP/2 connection)", each / MIB), &many.0, &many.1));
    println!("{}", row(&format!("1 × {} MiB", big / MIB), &one.0, &one.1));
}
