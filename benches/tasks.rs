//! Task engine figures (issue #3's "Measure").
//!
//!     cargo bench --bench tasks
//!
//! 1. **Throughput on SQLite, in process.** The Rust API as `ferry serve` builds it
//!    (`SqliteCatalog` with WAL + `synchronous=FULL`, `FsBlobStore`, `UploadEngine`,
//!    `tasks::Engine`) with one registered no-op `Job`. N tasks are started (by 1 or 16
//!    concurrent starters) while the worker pool runs; the clock stops when every task is
//!    `completed` (checked by reading each task back). Reported: starts per second (start
//!    phase alone) and tasks created *and* completed per second (first start → last
//!    completion). Each configuration gets a fresh database.
//! 2. **`GET /api/v1/tasks/{id}` latency.** The release `ferry` binary
//!    (`env!("CARGO_BIN_EXE_ferry")`, default flags), 64 `external` tasks, 64 concurrent pollers
//!    each looping GET on its own task over keep-alive HTTP/1.1 for a fixed time after a
//!    warm-up; p50/p90/p99/max and requests per second. Run twice: idle server, and with 8
//!    producers POSTing progress to their tasks as fast as they can (catalog writes competing
//!    with the reads).
//!
//! Client and server share the machine (the reference box has 2 cores), so these are
//! end-to-end figures, not server-only ones.
//!
//! Knobs: `FERRY_BENCH_TASKS` (N, default 2000), `FERRY_BENCH_SECS` (polling time per run,
//! default 5), `FERRY_BENCH_ROUNDS` (latency rounds, default 1), `FERRY_BENCH_SKIP_THROUGHPUT=1`,
//! `FERRY_BENCH_BASE=/path/to/ferry`: an earlier build measured in the same run, alternating
//! with this one round by round (paired figures on a noisy machine; the p99 ratio is printed).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ferry::blob::FsBlobStore;
use ferry::catalog::{Catalog, SqliteCatalog};
use ferry::metrics::Metrics;
use ferry::tasks::{Engine, Job, JobContext, JobError, TaskConfig, TaskStatus};
use ferry::upload::{EngineConfig, UploadEngine};
use serde_json::value::RawValue;

#[path = "support/mod.rs"]
mod support;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().map(|v| v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))).unwrap_or(default)
}

/// A job that does nothing and returns `null`.
struct Noop;

#[async_trait]
impl Job for Noop {
    fn kind(&self) -> &str {
        "noop"
    }

    async fn run(&self, _ctx: &JobContext, _args: &RawValue, _checkpoint: Option<serde_json::Value>) -> Result<serde_json::Value, JobError> {
        Ok(serde_json::Value::Null)
    }
}

struct Throughput {
    workers: usize,
    starters: usize,
    n: usize,
    start_secs: f64,
    total_secs: f64,
}

async fn throughput(root: &Path, n: usize, workers: usize, starters: usize) -> Throughput {
    let dir = tempfile::Builder::new().prefix("tp-").tempdir_in(root).unwrap();
    let catalog: Arc<dyn Catalog> = Arc::new(SqliteCatalog::open(&dir.path().join("ferry.db")).await.unwrap());
    let blobs = FsBlobStore::open(&dir.path().join("blobs"), true).unwrap();
    let uploads = UploadEngine::new(catalog.clone(), Arc::new(blobs), EngineConfig::default(), Arc::new(Metrics::default()));
    let mut engine = Engine::new(catalog, uploads, TaskConfig { workers, ..TaskConfig::default() });
    engine.register(Arc::new(Noop));
    let engine = Arc::new(engine);
    let handles = engine.spawn();

    let t0 = Instant::now();
    let mut joins = Vec::new();
    for s in 0..starters {
        let engine = engine.clone();
        // Starter s starts tasks s, s + starters, s + 2 * starters, ...
        let mine: Vec<usize> = (s..n).step_by(starters).collect();
        joins.push(tokio::spawn(async move {
            let mut ids = Vec::with_capacity(mine.len());
            for i in mine {
                let args = format!("{{\"i\":{i}}}");
                ids.push(engine.start("bench", "noop", &args, None, None).await.expect("start").task.id);
            }
            ids
        }));
    }
    let mut ids = Vec::with_capacity(n);
    for j in joins {
        ids.extend(j.await.unwrap());
    }
    let start_secs = t0.elapsed().as_secs_f64();
    for id in &ids {
        loop {
            let t = engine.get("bench", id).await.expect("get");
            match t.status {
                TaskStatus::Completed => break,
                TaskStatus::Working => tokio::time::sleep(Duration::from_millis(1)).await,
                other => panic!("task {id} ended {other:?}"),
            }
        }
    }
    let total_secs = t0.elapsed().as_secs_f64();
    engine.shutdown();
    for h in handles {
        let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
    }
    Throughput { workers, starters, n: ids.len(), start_secs, total_secs }
}

/// `ferry serve` (release build) on a free port with a fresh data dir.
fn start_server(binary: &Path, data: &Path) -> (Child, String) {
    let mut child = Command::new(binary)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .env_remove("FERRY_LISTEN")
        .env_remove("FERRY_CONFIG")
        .env("RUST_LOG", "warn")
        .current_dir(data.parent().unwrap())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn ferry");
    let base = support::wait_listening(&mut child);
    (child, base)
}

struct Latency {
    label: &'static str,
    samples: Vec<Duration>,
    secs: f64,
    writes: u64,
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

async fn poll_latency(base: &str, label: &'static str, pollers: usize, writers: usize, secs: u64) -> Latency {
    let c = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(256).build().unwrap();
    let mut ids = Vec::new();
    for i in 0..pollers.max(writers) {
        let r = c
            .post(format!("{base}/api/v1/tasks"))
            .header("content-type", "application/json")
            .body(format!("{{\"kind\":\"external\",\"args\":{{\"i\":{i}}}}}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    let warm = Instant::now() + Duration::from_secs(1);
    let end = warm + Duration::from_secs(secs);
    let mut writer_joins = Vec::new();
    for id in ids.iter().take(writers) {
        let (c, url) = (c.clone(), format!("{base}/api/v1/tasks/{id}/progress"));
        writer_joins.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < end {
                let body = format!("{{\"fraction\":0.5,\"message\":\"step {n}\",\"counters\":{{\"n\":{n}}}}}");
                let r = c.post(&url).header("content-type", "application/json").body(body).send().await.unwrap();
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap();
                if Instant::now() >= warm {
                    n += 1;
                }
            }
            n
        }));
    }
    let mut joins = Vec::new();
    for id in ids.iter().take(pollers) {
        let (c, url) = (c.clone(), format!("{base}/api/v1/tasks/{id}"));
        joins.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(20_000);
            loop {
                let t = Instant::now();
                if t >= end {
                    break;
                }
                let r = c.get(&url).send().await.unwrap();
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap();
                if t >= warm {
                    out.push(t.elapsed());
                }
            }
            out
        }));
    }
    let mut samples = Vec::new();
    for j in joins {
        samples.extend(j.await.unwrap());
    }
    let mut writes = 0;
    for j in writer_joins {
        writes += j.await.unwrap();
    }
    samples.sort();
    Latency { label, samples, secs: secs as f64, writes }
}

fn main() {
    let n = env_u64("FERRY_BENCH_TASKS", 2000) as usize;
    let secs = env_u64("FERRY_BENCH_SECS", 5);
    let root = tempfile::Builder::new().prefix("ferry-tasks-bench-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("bench temp dir");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();

    if std::env::var("FERRY_BENCH_SKIP_THROUGHPUT").is_err() {
        println!("## Task engine throughput (no-op job, SQLite WAL synchronous=FULL, in process)\n");
        println!("| workers | starters | tasks | start phase | starts/s | created+completed/s |");
        println!("|--------:|---------:|------:|------------:|---------:|--------------------:|");
        for (workers, starters) in [(1, 1), (4, 1), (4, 16), (16, 16)] {
            let t = rt.block_on(throughput(root.path(), n, workers, starters));
            println!(
                "| {} | {} | {} | {:.2} s | {:.0} | {:.0} |",
                t.workers,
                t.starters,
                t.n,
                t.start_secs,
                t.n as f64 / t.start_secs,
                t.n as f64 / t.total_secs
            );
        }
    }

    let rounds = env_u64("FERRY_BENCH_ROUNDS", 1);
    let this = std::path::PathBuf::from(env!("CARGO_BIN_EXE_ferry"));
    let mut builds = vec![("this build", this)];
    if let Some(b) = std::env::var_os("FERRY_BENCH_BASE") {
        builds.push(("base", b.into()));
    }
    println!("\n## GET /api/v1/tasks/{{id}} latency, 64 concurrent pollers ({secs} s after 1 s warm-up, release binary, {rounds} round(s))\n");
    println!("| build | load | round | requests | req/s | p50 | p90 | p99 | max | progress writes/s |");
    println!("|-------|------|------:|---------:|------:|----:|----:|----:|----:|------------------:|");
    let mut p99s: std::collections::HashMap<(usize, &str), Vec<f64>> = Default::default();
    for round in 0..rounds {
        for (label, writers) in [("idle", 0), ("+8 progress writers", 8)] {
            // Alternate which build goes first, round by round.
            let order: Vec<usize> = if round % 2 == 0 { (0..builds.len()).collect() } else { (0..builds.len()).rev().collect() };
            for b in order {
                let (name, binary) = &builds[b];
                let data = tempfile::Builder::new().prefix("lat-").tempdir_in(root.path()).unwrap();
                let (mut child, base) = start_server(binary, &data.path().join("data"));
                let l = rt.block_on(poll_latency(&base, label, 64, writers, secs));
                let _ = child.kill();
                let _ = child.wait();
                let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
                p99s.entry((b, label)).or_default().push(pct(&l.samples, 0.99).as_secs_f64() * 1e3);
                println!(
                    "| {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {:.0} |",
                    name,
                    l.label,
                    round + 1,
                    l.samples.len(),
                    l.samples.len() as f64 / l.secs,
                    ms(pct(&l.samples, 0.50)),
                    ms(pct(&l.samples, 0.90)),
                    ms(pct(&l.samples, 0.99)),
                    ms(*l.samples.last().unwrap()),
                    l.writes as f64 / l.secs
                );
            }
        }
    }
    if builds.len() > 1 {
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!("\n| load | p99 this build (median of rounds) | p99 base | this ÷ base |");
        println!("|------|---:|---:|---:|");
        for label in ["idle", "+8 progress writers"] {
            let a = median(p99s[&(0, label)].clone());
            let b = median(p99s[&(1, label)].clone());
            println!("| {label} | {a:.2} ms | {b:.2} ms | {:.2} |", a / b);
        }
    }
}
