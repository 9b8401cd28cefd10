//! A download that follows an upload still arriving (issue 51) on the real `ferry` binary,
//! against a plain download of the finished file, in one run.
//!
//!     cargo bench --bench follow                 # release build of ferry
//!     cargo bench --profile dev --bench follow   # the dev build (dependencies at opt-level 2)
//!
//! One fresh `ferry serve` (data under `target/tmp`, removed afterwards), `FERRY_BENCH_FOLLOW_MIB`
//! MiB (default 1024) per upload, each sent as one PATCH of 1 MiB `Bytes` slices of a prepared
//! 64 MiB pseudo-random buffer:
//!
//! 1. **upload alone**: the upload with no reader (its server CPU is the baseline of 2).
//! 2. **upload + follower**: a follower (`GET ?follow=1`, HTTP/1.1 with `TE: trailers`) started
//!    when the upload is created, before its first byte; the PATCH is sent, and the follower
//!    reads to the end and checks the `Repr-Digest` trailer is there. Measured: the time from
//!    the PATCH's 204 to the follower's last frame (the goal: under 1 s), and the
//!    follow's server CPU = this scenario's minus scenario 1's.
//! 3. **plain download** of scenario 1's finished file (`GET`, HTTP/1.1): its server CPU.
//!
//! Server CPU is utime + stime from /proc/PID/stat around each scenario. Printed: the lag, CPU
//! s/GiB of the follow and of the plain download, and their ratio (the goal: ≤ 1.1×). One run;
//! the machine's noise (two cores shared with other builds) is the caveat, and the follow's CPU
//! is a difference of two measurements, so it carries both their noise.
//!
//! `harness = false`: a plain `main`.

#[path = "support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt as _;

const MIB: u64 = 1 << 20;
const POOL: u64 = 64 * MIB;

/// utime + stime of `pid` in seconds (/proc/PID/stat; USER_HZ is 100).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("").split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

struct Server {
    child: Child,
    base: String,
    data: PathBuf,
}

impl Server {
    fn start(data: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start ferry");
        let base = support::wait_listening(&mut child);
        Server { child, base, data: data.to_path_buf() }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

fn body(pool: &Bytes, size: u64) -> reqwest::Body {
    let parts: Vec<_> = (0..size.div_ceil(MIB))
        .map(|i| {
            let (off, len) = ((i * MIB % POOL) as usize, MIB.min(size - i * MIB) as usize);
            Ok::<_, std::io::Error>(pool.slice(off..off + len))
        })
        .collect();
    reqwest::Body::wrap_stream(futures::stream::iter(parts))
}

async fn create(c: &reqwest::Client, s: &Server, size: u64) -> String {
    let r = c.post(format!("{}/files/", s.base)).header("Tus-Resumable", "1.0.0").header("Upload-Length", size.to_string()).send().await.unwrap();
    assert_eq!(r.status(), 201, "create");
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    if loc.starts_with("http") {
        loc
    } else {
        format!("{}{loc}", s.base)
    }
}

async fn patch(c: &reqwest::Client, url: &str, pool: &Bytes, size: u64) {
    let r = c
        .patch(url)
        .header("Tus-Resumable", "1.0.0")
        .header("Content-Type", "application/offset+octet-stream")
        .header("Upload-Offset", "0")
        .header("Content-Length", size.to_string())
        .body(body(pool, size))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204, "PATCH");
}

/// Read `url` (with `query`) to its end: (bytes, whether a `Repr-Digest` trailer came, when
/// the last frame arrived).
async fn read_all(c: &reqwest::Client, url: &str, query: &str) -> (u64, bool, Instant) {
    let r = c.get(format!("{url}{query}")).header("TE", "trailers").send().await.unwrap();
    assert!(r.status().is_success(), "GET {}", r.status());
    let mut body = http::Response::from(r).into_body();
    let (mut n, mut trailer) = (0u64, false);
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("the body ends cleanly");
        match frame.into_data() {
            Ok(b) => n += b.len() as u64,
            Err(f) => trailer |= f.trailers_ref().is_some_and(|t| t.contains_key("repr-digest")),
        }
    }
    (n, trailer, Instant::now())
}

#[tokio::main]
async fn main() {
    let mib: u64 = std::env::var("FERRY_BENCH_FOLLOW_MIB").map_or(1024, |v| v.trim().parse().expect("FERRY_BENCH_FOLLOW_MIB: a number"));
    let size = mib * MIB;
    let gib = size as f64 / (1u64 << 30) as f64;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tmp/bench-follow");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pool = Bytes::from(support::pseudo_random(POOL as usize, 51));
    let s = Server::start(&dir.join("data"));
    let pid = s.child.id();
    let c = reqwest::Client::builder().no_proxy().http1_only().timeout(Duration::from_secs(3600)).build().unwrap();

    // 1. The upload alone.
    let alone = create(&c, &s, size).await;
    let cpu0 = cpu_seconds(pid);
    patch(&c, &alone, &pool, size).await;
    let upload_cpu = cpu_seconds(pid) - cpu0;

    // 2. The upload with a follower from its first byte.
    let url = create(&c, &s, size).await;
    let cpu0 = cpu_seconds(pid);
    let follower = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move { read_all(&c, &url, "?follow=1").await }
    });
    patch(&c, &url, &pool, size).await;
    let last_204 = Instant::now();
    let (got, trailer, ended) = follower.await.unwrap();
    let both_cpu = cpu_seconds(pid) - cpu0;
    assert_eq!((got, trailer), (size, true), "the follower got every byte and the trailer");
    let lag = ended.saturating_duration_since(last_204);
    let follow_cpu = both_cpu - upload_cpu;

    // 3. A plain download of the finished file.
    let cpu0 = cpu_seconds(pid);
    let (got, _, _) = read_all(&c, &alone, "").await;
    let download_cpu = cpu_seconds(pid) - cpu0;
    assert_eq!(got, size);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);

    println!("| measure ({mib} MiB) | value |");
    println!("| --- | ---: |");
    println!("| upload alone: server CPU s/GiB | {:.3} |", upload_cpu / gib);
    println!("| upload + follower: server CPU s/GiB | {:.3} |", both_cpu / gib);
    println!("| follow: server CPU s/GiB (the difference) | {:.3} |", follow_cpu / gib);
    println!("| plain download of the finished file: server CPU s/GiB | {:.3} |", download_cpu / gib);
    println!("| follow ÷ plain download, CPU/GiB (goal ≤ 1.1) | {:.2} |", follow_cpu / download_cpu);
    println!("| last 204 → follower's end (goal < 1 s) | {:.3} s |", lag.as_secs_f64());
}
