//! Upload throughput and memory of the real `ferry` binary (issue #2's figures).
//!
//!     cargo bench --bench upload
//!
//! What it measures (all data in a temp dir under `target/tmp`, i.e. on the same filesystem
//! as the checkout; everything is removed at the end):
//!
//! 1. `ferry serve` (release build, `--durability full`, the default) receiving ONE PATCH of
//!    1 GiB of pseudo-random bytes over loopback HTTP/1.1. The client streams 1 MiB `Bytes`
//!    slices of a prepared 64 MiB buffer from memory (no copies on the client side), and the
//!    clock runs from sending the PATCH to receiving its 204 (so it includes ferry's final
//!    fdatasync + catalog commit). The server's sha256 is checked afterwards (HEAD
//!    `Repr-Digest`) against the baseline's.
//! 2. The baseline in the same process: the same bytes, same 1 MiB chunks, hashed with sha2
//!    0.11 `Sha256` and `write_all`-ed to a file, `fdatasync` every 64 MiB (ferry's default
//!    checkpoint interval) and at the end. No HTTP, no catalog.
//! 3. Peak server RSS (`VmHWM` of the ferry child from /proc/PID/status, read just before
//!    the child is killed) during ONE 4 GiB PATCH with `--durability full`. Goal: <= 64 MiB.
//! 4. The 1 GiB PATCH again with `--durability relaxed`, for context.
//!
//! Rounds alternate baseline, ferry full, ferry relaxed (3 rounds); the table shows medians
//! (and min..max) because the reference machine has 2 noisy cores. Every ferry run uses a
//! fresh server process and data dir, so per-run `VmHWM` is that run's peak.
//!
//! Knobs (environment): `FERRY_BENCH_MIB` (size of runs 1, 2, 4; default 1024),
//! `FERRY_BENCH_BIG_MIB` (run 3; default 4096, 0 skips it), `FERRY_BENCH_ROUNDS` (default 3).
//!
//! `harness = false`: this is a plain `main`, not criterion (criterion's minimum of 10
//! samples of a 1 GiB upload would take far too long). The `ferry` binary is located with
//! `env!("CARGO_BIN_EXE_ferry")`, which cargo sets for benches too and builds with the bench
//! profile (= release), i.e. `target/release/ferry`.

#[path = "support/mod.rs"]
mod support;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::pseudo_random;

use base64::Engine as _;
use bytes::Bytes;
use sha2::{Digest, Sha256};

const MIB: u64 = 1 << 20;
/// Client/baseline chunk size.
const CHUNK: u64 = MIB;
/// The prepared pseudo-random buffer the chunks are sliced from (cyclically).
const POOL: u64 = 64 * MIB;
/// Baseline fdatasync interval = ferry's default `--checkpoint-every`.
const SYNC_EVERY: u64 = 64 * MIB;
/// USER_HZ of /proc/PID/stat times (100 on every Linux ABI).
const TICKS_PER_SEC: f64 = 100.0;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// `size` bytes as CHUNK-sized zero-copy slices of `pool`.
fn chunks(pool: &Bytes, size: u64) -> Vec<Bytes> {
    let mut out = Vec::with_capacity((size / CHUNK + 1) as usize);
    let mut done = 0;
    while done < size {
        let len = CHUNK.min(size - done);
        let off = (done % POOL) as usize;
        out.push(pool.slice(off..off + len as usize));
        done += len;
    }
    out
}

fn mb_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

/// utime + stime of a process in seconds, from /proc/PID/stat.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the `(comm)`, which may contain spaces: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / TICKS_PER_SEC
}

/// A field of /proc/PID/status in KiB (e.g. VmHWM).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Baseline: sha256 + write + fdatasync, no HTTP.

struct Sample {
    elapsed: Duration,
    /// Peak RSS of the server, KiB (ferry runs only).
    hwm_kib: u64,
    server_cpu: f64,
    client_cpu: f64,
}

fn baseline(dir: &Path, pool: &Bytes, size: u64) -> (Sample, [u8; 32]) {
    let path = dir.join("baseline.bin");
    let parts = chunks(pool, size);
    let cpu0 = cpu_seconds("self");
    let t0 = Instant::now();
    let mut f = File::create(&path).expect("create baseline file");
    let mut h = Sha256::new();
    let mut since_sync = 0;
    for c in &parts {
        h.update(c);
        f.write_all(c).expect("write baseline file");
        since_sync += c.len() as u64;
        if since_sync >= SYNC_EVERY {
            f.sync_data().expect("fdatasync");
            since_sync = 0;
        }
    }
    f.sync_data().expect("fdatasync");
    let digest: [u8; 32] = h.finalize().into();
    let elapsed = t0.elapsed();
    let cpu = cpu_seconds("self") - cpu0;
    drop(f);
    std::fs::remove_file(&path).expect("remove baseline file");
    (Sample { elapsed, hwm_kib: 0, server_cpu: 0.0, client_cpu: cpu }, digest)
}

// ---------------------------------------------------------------------------------------
// ferry: a child `ferry serve`, one POST + one PATCH.

/// A running `ferry serve`; SIGKILLed on drop.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(data: &Path, durability: &str) -> Server {
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_ferry"));
        let mut cmd = Command::new(&bin);
        cmd.arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data")
            .arg(data)
            .arg("--durability")
            .arg(durability)
            // No ./ferry.toml or FERRY_* from the caller's environment may change the setup.
            .current_dir(data.parent().expect("data dir has a parent"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("FERRY_") {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let base = support::wait_listening(&mut child);
        Server { child, base }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn ferry_upload(client: &reqwest::Client, base: &str, pid: u32, pool: &Bytes, size: u64, expect: Option<[u8; 32]>) -> Sample {
    let res = client
        .post(format!("{base}/files/"))
        .header("Tus-Resumable", "1.0.0")
        .header("Upload-Length", size.to_string())
        .send()
        .await
        .expect("POST /files/");
    assert_eq!(res.status().as_u16(), 201, "POST: {:?}", res.text().await);
    let loc = res.headers().get("location").expect("Location").to_str().unwrap().to_string();
    let url = if loc.starts_with("http") { loc } else { format!("{base}{loc}") };

    let body = reqwest::Body::wrap_stream(futures::stream::iter(chunks(pool, size).into_iter().map(Ok::<Bytes, std::io::Error>)));
    let (s_cpu0, c_cpu0) = (cpu_seconds(&pid.to_string()), cpu_seconds("self"));
    let t0 = Instant::now();
    let res = client
        .patch(&url)
        .header("Tus-Resumable", "1.0.0")
        .header("Upload-Offset", "0")
        .header("Content-Type", "application/offset+octet-stream")
        .header("Content-Length", size.to_string())
        .body(body)
        .send()
        .await
        .expect("PATCH");
    let status = res.status().as_u16();
    let offset = res.headers().get("upload-offset").and_then(|v| v.to_str().ok()).map(str::to_string);
    let _ = res.bytes().await;
    let elapsed = t0.elapsed();
    let (server_cpu, client_cpu) = (cpu_seconds(&pid.to_string()) - s_cpu0, cpu_seconds("self") - c_cpu0);
    assert_eq!(status, 204, "PATCH status");
    assert_eq!(offset.as_deref(), Some(size.to_string().as_str()), "PATCH Upload-Offset");

    // The server hashed what the baseline hashed.
    if let Some(d) = expect {
        let res = client.head(&url).header("Tus-Resumable", "1.0.0").send().await.expect("HEAD");
        let rd = res.headers().get("repr-digest").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let b64 = base64::engine::general_purpose::STANDARD.encode(d);
        assert!(rd.contains(&b64), "server sha256 {rd:?} != baseline sha256 {b64}");
    }
    Sample { elapsed, hwm_kib: status_kib(pid, "VmHWM"), server_cpu, client_cpu }
}

fn ferry_run(
    rt: &tokio::runtime::Runtime,
    client: &reqwest::Client,
    root: &Path,
    durability: &str,
    pool: &Bytes,
    size: u64,
    expect: Option<[u8; 32]>,
) -> Sample {
    let dir = tempfile::Builder::new().prefix("run-").tempdir_in(root).expect("run dir");
    let server = Server::start(&dir.path().join("data"), durability);
    let sample = rt.block_on(ferry_upload(client, &server.base, server.child.id(), pool, size, expect));
    drop(server);
    drop(dir);
    sample
}

// ---------------------------------------------------------------------------------------

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn row(name: &str, size: u64, s: &[Sample], base_median: Option<f64>) -> String {
    let rates: Vec<f64> = s.iter().map(|x| mb_per_s(size, x.elapsed)).collect();
    let (lo, hi) = rates.iter().fold((f64::MAX, 0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    let m = median(rates);
    let ratio = base_median.map_or("-".to_string(), |b| format!("{:.2}x", m / b));
    let rss = if s[0].hwm_kib > 0 { format!("{:.1}", median(s.iter().map(|x| x.hwm_kib as f64).collect()) / 1024.0) } else { "-".into() };
    let cpu = if s[0].hwm_kib > 0 {
        format!("{:.2} / {:.2}", median(s.iter().map(|x| x.server_cpu).collect()), median(s.iter().map(|x| x.client_cpu).collect()))
    } else {
        format!("- / {:.2}", median(s.iter().map(|x| x.client_cpu).collect()))
    };
    format!("{name:<48} {m:>8.0} {:>13} {ratio:>7} {rss:>9} {cpu:>13}", format!("{lo:.0}..{hi:.0}"))
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing useful either.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let size = env_u64("FERRY_BENCH_MIB", 1024) * MIB;
    let big = env_u64("FERRY_BENCH_BIG_MIB", 4096) * MIB;
    let rounds = env_u64("FERRY_BENCH_ROUNDS", 3).max(1) as usize;

    let root = tempfile::Builder::new().prefix("ferry-bench-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("bench temp dir");
    let pool = Bytes::from(pseudo_random(POOL as usize, 0x5eed));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = reqwest::Client::builder().no_proxy().http1_only().timeout(Duration::from_secs(900)).build().unwrap();

    eprintln!(
        "ferry bench: {} MiB x {rounds} rounds (baseline, ferry full, ferry relaxed), then one {} MiB PATCH; data in {}",
        size / MIB,
        big / MIB,
        root.path().display()
    );
    let (mut base, mut full, mut relaxed) = (Vec::new(), Vec::new(), Vec::new());
    for r in 1..=rounds {
        let (b, digest) = baseline(root.path(), &pool, size);
        eprintln!("  round {r}: baseline       {:>6.0} MB/s", mb_per_s(size, b.elapsed));
        base.push(b);
        let f = ferry_run(&rt, &client, root.path(), "full", &pool, size, Some(digest));
        eprintln!("  round {r}: ferry full     {:>6.0} MB/s  VmHWM {:.1} MiB", mb_per_s(size, f.elapsed), f.hwm_kib as f64 / 1024.0);
        full.push(f);
        let x = ferry_run(&rt, &client, root.path(), "relaxed", &pool, size, Some(digest));
        eprintln!("  round {r}: ferry relaxed  {:>6.0} MB/s  VmHWM {:.1} MiB", mb_per_s(size, x.elapsed), x.hwm_kib as f64 / 1024.0);
        relaxed.push(x);
    }
    let big_sample = (big > 0).then(|| {
        let s = ferry_run(&rt, &client, root.path(), "full", &pool, big, None);
        eprintln!("  big: ferry full {} MiB  {:>6.0} MB/s  VmHWM {:.1} MiB", big / MIB, mb_per_s(big, s.elapsed), s.hwm_kib as f64 / 1024.0);
        s
    });

    let base_median = median(base.iter().map(|s| mb_per_s(size, s.elapsed)).collect());
    let gib = |b: u64| if b.is_multiple_of(1 << 30) { format!("{} GiB", b >> 30) } else { format!("{} MiB", b / MIB) };
    println!();
    println!("$ cargo bench --bench upload   # {} runs x {rounds}, alternating; 1 MiB chunks; MB = 10^6 B; medians", gib(size));
    println!("{:<48} {:>8} {:>13} {:>7} {:>9} {:>13}", "measurement", "MB/s", "min..max", "ratio", "RSS MiB", "CPU s srv/cli");
    println!("{}", row(&format!("baseline: sha256+write+fdatasync/64MiB {}", gib(size)), size, &base, None));
    println!("{}", row(&format!("ferry PATCH {} loopback, durability full", gib(size)), size, &full, Some(base_median)));
    println!("{}", row(&format!("ferry PATCH {} loopback, durability relaxed", gib(size)), size, &relaxed, Some(base_median)));
    if let Some(s) = big_sample {
        let mib = s.hwm_kib as f64 / 1024.0;
        println!("{}", row(&format!("ferry PATCH {} (one PATCH), full", gib(big)), big, std::slice::from_ref(&s), Some(base_median)));
        println!(
            "peak server RSS (VmHWM) over one {} PATCH: {mib:.1} MiB (goal <= 64 MiB: {})",
            gib(big),
            if mib <= 64.0 { "met" } else { "NOT met" }
        );
    }
    drop(root);
}
