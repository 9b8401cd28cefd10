//! ferry on S3, measured in the same run, against a local moto server or (with `FERRY_TEST_S3_*`
//! set, as `.ci/garage.sh` writes them) a real S3 server such as Garage:
//!
//! 1. **One upload through ferry vs the same bytes written directly**: `BENCH_S3_BYTES` (default
//!    1 GiB) as one TUS upload in 8 MiB PATCHes (`BENCH_S3_PATCH_BYTES`) to `ferry serve --blobs s3://…` (SQLite catalog,
//!    fsync on), against the same bytes put with `object_store`'s `MultipartStore` directly in
//!    `BENCH_S3_PART_BYTES` parts (default 5 MiB, ferry's first part size), one part in flight.
//!    Ratio: ferry / direct throughput.
//! 2. **Three replicas vs one**: `BENCH_S3_UPLOADS` (default 64) concurrent uploads of
//!    `BENCH_S3_UPLOAD_BYTES` (default 16 MiB) each, spread round-robin over three `ferry serve`
//!    on one PostgreSQL database and one bucket, against the same uploads to one of them alone.
//!    Aggregate MiB/s.
//!
//! 3. **Slow clients and resumes against the memory budget** (issue 47): `BENCH_S3_SLOW`
//!    (default 64) uploads that each send 1 KiB of a declared 40 MiB and stall, then one fast
//!    20 MiB PATCH: how long it took to be answered (before issue 47: never, beyond 34). Then
//!    `BENCH_S3_RESUMES` (default 200) deferred-length uploads each left with
//!    `BENCH_S3_RESUME_TAIL` (default 6 MiB) in its open part, the server restarted (every tail
//!    now lives only in S3), and all resumed at once with 1 MiB more each: peak RSS against the
//!    idle baseline + `[s3] max_buffer` (512 MiB by default); the goal is ≤ 1.2×.
//!
//! For each: ferry's CPU seconds per GiB (user + system of every replica that took part, from
//! /proc/PID/stat) and peak RSS (`VmHWM`, reset before each measurement), and with
//! `BENCH_S3_PID` (the S3 server's PID) that server's CPU seconds per GiB too. moto is one Python
//! process holding every object in memory: on this machine it is likely the ceiling, and the
//! ratios say so rather than how ferry does on real S3; Garage stores to disk and checks every
//! signature.
//!
//! Needs PostgreSQL (`FERRY_TEST_PG`, default the role `.ci/run` creates), and `moto_server` in
//! the test clients' venv (`FERRY_PY_VENV`) or the S3 of `FERRY_TEST_S3_*`. Results go to stdout;
//! benches/RESULTS.md keeps a copy. Run:
//!
//! ```sh
//! cargo bench --bench s3                       # moto
//! eval "$(bash .ci/garage.sh)"                 # Garage on 127.0.0.1:3900, left running
//! BENCH_S3_PID=$(cat "${TMPDIR:-/tmp}/ferry-ci-garage/pid") cargo bench --bench s3
//! ```
//!
//! `BENCH_S3_ONLY=whole` runs section 1 alone, `BENCH_S3_ONLY=budget` section 3 alone.
//!
//! `FERRY_BENCH_BIN=target/release/ferry` measures that binary instead of the bench profile's:
//! with `cargo test --bench s3 --no-run` the bench itself builds in seconds on the tests'
//! dependencies (run the printed executable with `--bench`).

#[path = "../tests/common/moto.rs"]
mod moto;
#[path = "../tests/common/s3.rs"]
mod s3;
#[path = "support/replicas.rs"]
mod support;
#[path = "../tests/common/venv.rs"]
mod venv;

use std::process::Child;
use std::time::Instant;

use object_store::aws::AmazonS3Builder;
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};
use s3::TestS3;
use support::{client, cpu_seconds, create_db, drop_db, env_u64, reset_peak_rss, start_server, status_mib, stop};

const MIB: u64 = 1 << 20;
const GIB: f64 = (1u64 << 30) as f64;

/// One TUS upload of `len` bytes of `fill` in PATCHes of `BENCH_S3_PATCH_BYTES` (default
/// 8 MiB); returns its URL and seconds.
async fn tus_upload(c: &reqwest::Client, base: &str, len: u64, fill: u8) -> (String, f64) {
    let r = c.post(format!("{base}/files/")).header("Tus-Resumable", "1.0.0").header("Upload-Length", len.to_string()).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    let url = if loc.starts_with("http") { loc } else { format!("{base}{loc}") };
    // No bigger than the upload: 64 concurrent uploads with `BENCH_S3_PATCH_BYTES` of 1 GiB
    // would otherwise hold 64 GiB of PATCH bodies.
    let chunk = bytes::Bytes::from(vec![fill; env_u64("BENCH_S3_PATCH_BYTES", 8 * MIB).min(len) as usize]);
    let t0 = Instant::now();
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(chunk.len() as u64) as usize;
        let r = c
            .patch(&url)
            .header("Tus-Resumable", "1.0.0")
            .header("Content-Type", "application/offset+octet-stream")
            .header("Upload-Offset", off.to_string())
            .body(chunk.slice(..n))
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            204 => off += n as u64,
            // What a TUS client does with a retryable refusal (S3 busy: 503; the upload still
            // held: 423; an offset to resume from: 409): ask for the offset, then go on.
            status @ (409 | 423 | 503) => {
                let body = r.text().await.unwrap_or_default();
                if RETRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 5 {
                    eprintln!("PATCH at {off} answered {status}, resuming: {body}");
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                let h = c.head(&url).header("Tus-Resumable", "1.0.0").send().await.unwrap();
                if h.status() == 200 {
                    off = h.headers()["upload-offset"].to_str().unwrap().parse().unwrap();
                }
            }
            status => panic!("PATCH at {off}: {status} {}", r.text().await.unwrap_or_default()),
        }
    }
    (url, t0.elapsed().as_secs_f64())
}

/// PATCHes answered with a retryable refusal and resumed, in all ([`tus_upload`]).
static RETRIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// TUS termination of `url` (not timed: keeps a real S3's disk from filling up).
async fn terminate(c: &reqwest::Client, url: &str) {
    let r = c.delete(url).header("Tus-Resumable", "1.0.0").send().await.unwrap();
    assert_eq!(r.status(), 204, "DELETE {url}");
}

/// The same bytes through `MultipartStore` directly, `part` bytes a part, one in flight; seconds.
async fn direct_upload(s3: &TestS3, len: u64, part: u64) -> f64 {
    let c = &s3.config;
    let store = AmazonS3Builder::new()
        .with_bucket_name(&s3.bucket)
        .with_endpoint(&c.endpoint)
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_access_key_id(&c.access_key_id)
        .with_secret_access_key(&c.secret_access_key)
        .with_region(&c.region)
        .build()
        .unwrap();
    let path = ObjectPath::from(s3.key("direct/object"));
    let part = bytes::Bytes::from(vec![0x5Au8; part as usize]);
    let t0 = Instant::now();
    let id = store.create_multipart(&path).await.unwrap();
    let mut parts = Vec::new();
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(part.len() as u64) as usize;
        parts.push(store.put_part(&path, &id, parts.len(), PutPayload::from(part.slice(..n))).await.unwrap());
        off += n as u64;
    }
    store.complete_multipart(&path, &id, parts).await.unwrap();
    let secs = t0.elapsed().as_secs_f64();
    store.delete(&path).await.unwrap();
    secs
}

/// What a measurement cost the processes that served it.
struct Cost {
    /// ferry's user + system seconds, all replicas.
    ferry_cpu: f64,
    /// The largest peak RSS of a replica, and the sum of them, MiB.
    max_rss: f64,
    sum_rss: f64,
    /// The S3 server's user + system seconds (`BENCH_S3_PID`).
    s3_cpu: Option<f64>,
}

/// Runs `work` and measures what it cost `pids` (ferry replicas) and the S3 server.
async fn measured<T>(pids: &[u32], s3_pid: Option<u32>, work: impl std::future::Future<Output = T>) -> (T, Cost) {
    for &p in pids {
        reset_peak_rss(p);
    }
    let cpu0: f64 = pids.iter().map(|&p| cpu_seconds(p)).sum();
    let s3_cpu0 = s3_pid.map(cpu_seconds);
    let out = work.await;
    let ferry_cpu = pids.iter().map(|&p| cpu_seconds(p)).sum::<f64>() - cpu0;
    let rss: Vec<f64> = pids.iter().map(|&p| status_mib(p, "VmHWM")).collect();
    let s3_cpu = s3_pid.zip(s3_cpu0).map(|(p, c0)| cpu_seconds(p) - c0);
    (out, Cost { ferry_cpu, max_rss: rss.iter().cloned().fold(0.0, f64::max), sum_rss: rss.iter().sum(), s3_cpu })
}

fn s3_cpu_per_gib(cpu: Option<f64>, bytes: u64) -> String {
    cpu.map(|c| format!("{:.2}", c / (bytes as f64 / GIB))).unwrap_or_else(|| "—".into())
}

/// `n` concurrent uploads of `each` bytes spread round-robin over `bases`; aggregate MiB/s.
/// Terminates them afterwards (not timed).
async fn concurrent_uploads(bases: &[String], n: usize, each: u64) -> f64 {
    let c = client();
    let t0 = Instant::now();
    let jobs: Vec<_> = (0..n)
        .map(|i| {
            let (c, base) = (c.clone(), bases[i % bases.len()].clone());
            tokio::spawn(async move { tus_upload(&c, &base, each, i as u8).await.0 })
        })
        .collect();
    let mut urls = Vec::new();
    for j in jobs {
        urls.push(j.await.unwrap());
    }
    let rate = (n as u64 * each) as f64 / MIB as f64 / t0.elapsed().as_secs_f64();
    for url in urls {
        terminate(&c, &url).await;
    }
    rate
}

/// `n` uploads that each send 1 KiB of a declared 40 MiB and stall, then one 20 MiB PATCH:
/// the seconds it took to be answered (204), and the stalled requests (kept open while held).
async fn slow_then_fast(base: &str, n: usize) -> (f64, Vec<(tokio::sync::mpsc::Sender<bytes::Bytes>, tokio::task::JoinHandle<()>)>) {
    let c = client();
    let create = |len: u64| {
        let c = c.clone();
        let base = base.to_string();
        async move {
            let r = c.post(format!("{base}/files/")).header("Tus-Resumable", "1.0.0").header("Upload-Length", len.to_string()).send().await.unwrap();
            let loc = r.headers()["location"].to_str().unwrap().to_string();
            if loc.starts_with("http") {
                loc
            } else {
                format!("{base}{loc}")
            }
        }
    };
    let mut stalled = Vec::new();
    for _ in 0..n {
        let url = create(40 * MIB).await;
        let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(2);
        tx.send(bytes::Bytes::from(vec![1u8; 1024])).await.unwrap();
        let body =
            reqwest::Body::wrap_stream(futures::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx)) },
            ));
        let req = c
            .patch(&url)
            .header("Tus-Resumable", "1.0.0")
            .header("Content-Type", "application/offset+octet-stream")
            .header("Upload-Offset", "0")
            .header("Content-Length", (40 * MIB).to_string())
            .body(body)
            .send();
        stalled.push((tx, tokio::spawn(async move { drop(req.await) })));
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let url = create(20 * MIB).await;
    let t0 = Instant::now();
    let r = c
        .patch(&url)
        .header("Tus-Resumable", "1.0.0")
        .header("Content-Type", "application/offset+octet-stream")
        .header("Upload-Offset", "0")
        .body(vec![2u8; 20 * MIB as usize])
        .timeout(std::time::Duration::from_secs(120))
        .send()
        .await;
    let secs = t0.elapsed().as_secs_f64();
    match r {
        Ok(r) if r.status() == 204 => {}
        Ok(r) => eprintln!("the fast PATCH answered {}", r.status()),
        Err(e) => eprintln!("the fast PATCH got no answer: {e}"),
    }
    (secs, stalled)
}

/// `n` deferred-length uploads, 16 at a time, each sent `tail` bytes (less than a part: they
/// stay in its open part, durable as tail segments); their URLs.
async fn deferred_tails(base: &str, n: usize, tail: u64) -> Vec<String> {
    use futures::StreamExt;
    let c = client();
    let body = bytes::Bytes::from(vec![3u8; tail as usize]);
    futures::stream::iter(0..n)
        .map(|_| {
            let (c, base, body) = (c.clone(), base.to_string(), body.clone());
            async move {
                let r = c.post(format!("{base}/files/")).header("Tus-Resumable", "1.0.0").header("Upload-Defer-Length", "1").send().await.unwrap();
                assert_eq!(r.status(), 201);
                let loc = r.headers()["location"].to_str().unwrap().to_string();
                let url = if loc.starts_with("http") { loc } else { format!("{base}{loc}") };
                let r = c
                    .patch(&url)
                    .header("Tus-Resumable", "1.0.0")
                    .header("Content-Type", "application/offset+octet-stream")
                    .header("Upload-Offset", "0")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 204);
                url
            }
        })
        .buffer_unordered(16)
        .collect()
        .await
}

/// Every upload in `urls` (at offset `at`) resumed at once with 1 MiB more, as a TUS client
/// does: a refused PATCH (503 while the budget is spent) is retried after `Retry-After`.
async fn resume_all(urls: &[String], at: u64) {
    let c = client();
    let jobs: Vec<_> = urls
        .iter()
        .map(|url| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move {
                let end = at + MIB;
                let mut off = at;
                for _ in 0..60 {
                    let r = c
                        .patch(&url)
                        .header("Tus-Resumable", "1.0.0")
                        .header("Content-Type", "application/offset+octet-stream")
                        .header("Upload-Offset", off.to_string())
                        .body(vec![4u8; (end - off) as usize])
                        .send()
                        .await
                        .unwrap();
                    match r.status().as_u16() {
                        204 => return,
                        409 | 423 | 503 => {
                            RETRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                            let h = c.head(&url).header("Tus-Resumable", "1.0.0").send().await.unwrap();
                            if let Some(o) = h.headers().get("upload-offset").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok()) {
                                off = o;
                            }
                            if off >= end {
                                return;
                            }
                        }
                        s => panic!("resuming {url}: {s}"),
                    }
                }
                panic!("resuming {url}: refused 60 times");
            })
        })
        .collect();
    for j in jobs {
        j.await.unwrap();
    }
}

/// Sections 1 and 2 (see the module's docs).
async fn whole_and_replicas(tmp: &tempfile::TempDir, bytes: u64, part: u64, uploads: usize, each: u64, s3_pid: Option<u32>, label: &str) {
    let mib = bytes as f64 / MIB as f64;
    // 1. ferry vs object_store directly; on moto, one each so neither pays for the other's memory.

    let s = TestS3::start("direct", 5 * MIB).await;
    let (direct, direct_cost) = measured(&[], s3_pid, direct_upload(&s, bytes, part)).await;
    drop(s);
    let s = TestS3::start("ferry", 5 * MIB).await;
    let (srv, base) = start_server(&tmp.path().join("one"), &["--blobs", &s.url("bench")], &s.env());
    let ((url, through), cost) = measured(&[srv.id()], s3_pid, tus_upload(&client(), &base, bytes, 0x5A)).await;
    terminate(&client(), &url).await;
    stop(srv);
    drop(s);
    println!("## One upload of {mib:.0} MiB to S3 ({label}): through ferry vs object_store directly\n");
    println!("| path | seconds | MiB/s | ferry CPU s/GiB | ferry peak RSS MiB | S3 server CPU s/GiB |\n| --- | --- | --- | --- | --- | --- |");
    println!(
        "| object_store MultipartStore, {} MiB parts | {direct:.2} | {:.0} | — | — | {} |",
        part / MIB,
        mib / direct,
        s3_cpu_per_gib(direct_cost.s3_cpu, bytes)
    );
    println!(
        "| ferry, TUS PATCHes of {} MiB, SQLite catalog | {through:.2} | {:.0} | {:.2} | {:.0} | {} |",
        env_u64("BENCH_S3_PATCH_BYTES", 8 * MIB) / MIB,
        mib / through,
        cost.ferry_cpu / (bytes as f64 / GIB),
        cost.max_rss,
        s3_cpu_per_gib(cost.s3_cpu, bytes)
    );
    println!("\nratio throughput ferry / direct: {:.2}\n", direct / through);
    println!("PATCHes refused (503/423/409) and resumed: {}\n", RETRIES.swap(0, std::sync::atomic::Ordering::Relaxed));
    if std::env::var("BENCH_S3_ONLY").is_ok_and(|v| v == "whole") {
        return;
    }

    // 2. three replicas vs one, PostgreSQL + one bucket.
    let s = TestS3::start("replicas", 5 * MIB).await;
    let (db, url) = create_db().await;
    let blobs = s.url("bench");
    let args = ["--catalog", url.as_str(), "--blobs", blobs.as_str()];
    let servers: Vec<(Child, String)> = (0..3).map(|i| start_server(&tmp.path().join(format!("r{i}")), &args, &s.env())).collect();
    let bases: Vec<String> = servers.iter().map(|(_, b)| b.clone()).collect();
    let pids: Vec<u32> = servers.iter().map(|(c, _)| c.id()).collect();
    let (one, one_cost) = measured(&pids[..1], s3_pid, concurrent_uploads(&bases[..1], uploads, each)).await;
    let (three, three_cost) = measured(&pids, s3_pid, concurrent_uploads(&bases, uploads, each)).await;
    for (c, _) in servers {
        stop(c);
    }
    drop_db(&db).await;
    drop(s);
    let total = uploads as u64 * each;
    println!("## {uploads} concurrent uploads of {} MiB to S3 ({label}), PostgreSQL catalog, one bucket\n", each / MIB);
    println!(
        "| replicas | aggregate MiB/s | ferry CPU s/GiB (all replicas) | peak RSS MiB \
         (largest replica / sum) | S3 server CPU s/GiB |\n| --- | --- | --- | --- | --- |"
    );
    for (name, rate, c) in [("1", one, &one_cost), ("3 (round-robin)", three, &three_cost)] {
        println!(
            "| {name} | {rate:.0} | {:.2} | {:.0} / {:.0} | {} |",
            c.ferry_cpu / (total as f64 / GIB),
            c.max_rss,
            c.sum_rss,
            s3_cpu_per_gib(c.s3_cpu, total)
        );
    }
    println!("\nratio three / one: {:.2}", three / one);
    println!("PATCHes refused (503/423/409) and resumed, both runs: {}", RETRIES.swap(0, std::sync::atomic::Ordering::Relaxed));
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let bytes = env_u64("BENCH_S3_BYTES", 1 << 30);
        let part = env_u64("BENCH_S3_PART_BYTES", 5 * MIB);
        let uploads = env_u64("BENCH_S3_UPLOADS", 64) as usize;
        let each = env_u64("BENCH_S3_UPLOAD_BYTES", 16 * MIB);
        let s3_pid = std::env::var("BENCH_S3_PID").ok().map(|p| p.trim().parse::<u32>().expect("BENCH_S3_PID is a PID"));
        let label = match s3::S3Config::shared() {
            Some(c) => format!("{}, bucket {}", c.endpoint, c.shared_bucket.unwrap()),
            None => "moto".to_string(),
        };
        let tmp = tempfile::tempdir().unwrap();

        // `BENCH_S3_ONLY=budget`: section 3 alone; `BENCH_S3_ONLY=whole`: section 1 alone.
        let only = std::env::var("BENCH_S3_ONLY").unwrap_or_default();
        if only != "budget" {
            whole_and_replicas(&tmp, bytes, part, uploads, each, s3_pid, &label).await;
        }
        if only == "whole" {
            return;
        }
        // 3. slow clients, then resumes after a restart, against the memory budget.
        let s = TestS3::start("budget", 5 * MIB).await;
        let dir = tmp.path().join("budget");
        let args = ["--blobs", &s.url("bench")];
        let (srv, base) = start_server(&dir, &args, &s.env());
        let slow = env_u64("BENCH_S3_SLOW", 64) as usize;
        let (fast_secs, stalled) = slow_then_fast(&base, slow).await;
        drop(stalled);
        let resumes = env_u64("BENCH_S3_RESUMES", 200) as usize;
        let tail = env_u64("BENCH_S3_RESUME_TAIL", 6 * MIB);
        let urls = deferred_tails(&base, resumes, tail).await;
        stop(srv);
        let (srv, base) = start_server(&dir, &args, &s.env());
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let idle = status_mib(srv.id(), "VmRSS");
        let urls: Vec<String> = urls.into_iter().map(|u| format!("{base}{}", &u[u.find("/files/").unwrap()..])).collect();
        let ((), cost) = measured(&[srv.id()], s3_pid, resume_all(&urls, tail)).await;
        let metrics = client().get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
        let metric =
            |name: &str| metrics.lines().find(|l| l.starts_with(&format!("{name} "))).and_then(|l| l.rsplit(' ').next()).unwrap_or("0").to_string();
        stop(srv);
        drop(s);
        let budget = 512.0;
        println!("\n## The S3 memory budget ({label}, default settings: 16 MiB parts, max_buffer 512 MiB)\n");
        println!("{slow} uploads each holding 1 KiB of an open part, then one 20 MiB PATCH: answered in {fast_secs:.2} s\n");
        println!(
            "{resumes} deferred-length uploads with {} MiB tails each ({:.0} MiB of tails), resumed at once after a restart: idle RSS {idle:.0} \
             MiB, peak {:.0} MiB; (peak − idle) / max_buffer = {:.2}; reservations that waited {}, gave up (503, resumed) {}; ferry CPU {:.1} s",
            tail / MIB,
            (resumes as u64 * tail) as f64 / MIB as f64,
            cost.max_rss,
            (cost.max_rss - idle) / budget,
            metric("ferry_s3_buffer_waits"),
            metric("ferry_s3_buffer_refused"),
            cost.ferry_cpu
        );
        println!("PATCHes refused (503/423/409) and resumed: {}", RETRIES.swap(0, std::sync::atomic::Ordering::Relaxed));
    });
}
