//! PostgreSQL (several replicas) against SQLite (one server), measured in the same run:
//!
//! 1. **Task claim throughput**, catalog level: N `working` tasks, then claimers loop
//!    `claim_task` + `finish_task` until none is left. SQLite: one catalog, 4 claimers.
//!    PostgreSQL: two catalog handles (two pools — what two replicas hold), 4 claimers each.
//! 2. **`GET /api/v1/tasks/{id}` latency** under 64 concurrent pollers for a few seconds:
//!    one `ferry serve` on SQLite vs two on one PostgreSQL database (pollers alternate).
//! 3. **S2**: one upload of `BENCH_S2_BYTES` (default 1 GiB) in 8 MiB PATCHes over loopback,
//!    fsync on, SQLite vs PostgreSQL (catalog leases).
//!
//! Needs PostgreSQL (`FERRY_TEST_PG`, default the role `.ci/run` creates). Run:
//! `cargo bench --bench replicas`. Results go to stdout; benches/RESULTS.md keeps a copy.

#[path = "support/replicas.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry::catalog::{Catalog, NewTask, PostgresCatalog, SqliteCatalog, TaskEnd};
use support::{client, create_db, drop_db, env_u64, start_server};

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Tasks claimed and finished per second by `claimers` loops spread over `handles`.
async fn claim_throughput(handles: Vec<Arc<dyn Catalog>>, n: usize, claimers_per_handle: usize) -> f64 {
    for i in 0..n {
        let t = NewTask {
            id: format!("bench{i:08}"),
            principal: "bench".into(),
            kind: "noop".into(),
            args: "{}".into(),
            idempotency_key: None,
            ttl_ms: 3_600_000,
            now_ms: now_ms(),
        };
        handles[0].start_task(&t).await.unwrap();
    }
    let t0 = Instant::now();
    let mut loops = Vec::new();
    for (h, cat) in handles.iter().enumerate() {
        for w in 0..claimers_per_handle {
            let cat = cat.clone();
            loops.push(tokio::spawn(async move {
                let kinds = vec!["noop".to_string()];
                let mut done = 0usize;
                while let Some(t) = cat.claim_task(&format!("w{h}-{w}"), &kinds, 60_000).await.unwrap() {
                    assert!(cat.finish_task(&t.id, Some(t.fence), &TaskEnd::Completed("1".into()), now_ms()).await.unwrap());
                    done += 1;
                }
                done
            }));
        }
    }
    let mut total = 0;
    for l in loops {
        total += l.await.unwrap();
    }
    assert_eq!(total, n, "every task claimed once");
    n as f64 / t0.elapsed().as_secs_f64()
}

/// p50 and p99 of GET /api/v1/tasks/{id} with 64 pollers spread over `bases`.
async fn poll_latency(bases: &[String], secs: u64) -> (Duration, Duration, usize) {
    let c = client();
    let mut ids = Vec::new();
    for i in 0..64 {
        let base = &bases[i % bases.len()];
        let r = c
            .post(format!("{base}/api/v1/tasks"))
            .header("content-type", "application/json")
            .body(r#"{"kind":"external","args":{}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        ids.push(r.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string());
    }
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut pollers = Vec::new();
    for (i, id) in ids.into_iter().enumerate() {
        let (c, base) = (c.clone(), bases[(i + 1) % bases.len()].clone());
        pollers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let r = c.get(format!("{base}/api/v1/tasks/{id}")).send().await.unwrap();
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap();
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for p in pollers {
        all.extend(p.await.unwrap());
    }
    all.sort();
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
    (pct(0.50), pct(0.99), all.len())
}

/// Seconds to upload `len` bytes in 8 MiB PATCHes.
async fn s2(base: &str, len: u64) -> f64 {
    let c = client();
    let r = c.post(format!("{base}/files/")).header("Tus-Resumable", "1.0.0").header("Upload-Length", len.to_string()).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    let url = if loc.starts_with("http") { loc } else { format!("{base}{loc}") };
    let chunk = vec![0x5Au8; 8 << 20];
    let t0 = Instant::now();
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(chunk.len() as u64) as usize;
        let r = c
            .patch(&url)
            .header("Tus-Resumable", "1.0.0")
            .header("Content-Type", "application/offset+octet-stream")
            .header("Upload-Offset", off.to_string())
            .body(chunk[..n].to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
        off += n as u64;
    }
    t0.elapsed().as_secs_f64()
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let n = env_u64("BENCH_CLAIM_TASKS", 2000) as usize;
        let poll_secs = env_u64("BENCH_POLL_SECS", 5);
        let s2_bytes = env_u64("BENCH_S2_BYTES", 1 << 30);
        let tmp = tempfile::tempdir().unwrap();

        // 1. claims
        let sqlite: Arc<dyn Catalog> = Arc::new(SqliteCatalog::open(&tmp.path().join("claims.db")).await.unwrap());
        let sq = claim_throughput(vec![sqlite], n, 4).await;
        let (db, url) = create_db().await;
        let pg: Vec<Arc<dyn Catalog>> =
            vec![Arc::new(PostgresCatalog::connect(&url).await.unwrap()), Arc::new(PostgresCatalog::connect(&url).await.unwrap())];
        let pgt = claim_throughput(pg, n, 4).await;
        drop_db(&db).await;
        println!("## Task claims ({n} tasks, claim + finish each)\n");
        println!("| catalog | claimers | tasks/s |\n| --- | --- | --- |");
        println!("| SQLite, one catalog | 4 | {sq:.0} |\n| PostgreSQL, two handles | 2 × 4 | {pgt:.0} |");
        println!("\nratio PostgreSQL / SQLite: {:.2}\n", pgt / sq);

        // 2. GET latency
        let (mut one, base) = start_server(&tmp.path().join("sq"), &[], &[]);
        let (p50s, p99s, ns) = poll_latency(std::slice::from_ref(&base), poll_secs).await;
        let _ = one.kill();
        let _ = one.wait();
        let (db, url) = create_db().await;
        let (mut ra, ba) = start_server(&tmp.path().join("pa"), &["--catalog", &url], &[]);
        let (mut rb, bb) = start_server(&tmp.path().join("pb"), &["--catalog", &url], &[]);
        let (p50p, p99p, np) = poll_latency(&[ba, bb], poll_secs).await;
        for c in [&mut ra, &mut rb] {
            let _ = c.kill();
            let _ = c.wait();
        }
        drop_db(&db).await;
        println!("## GET /api/v1/tasks/{{id}}, 64 pollers, {poll_secs} s\n");
        println!("| setup | requests | p50 | p99 |\n| --- | --- | --- | --- |");
        println!("| one server, SQLite | {ns} | {p50s:.2?} | {p99s:.2?} |\n| two replicas, PostgreSQL | {np} | {p50p:.2?} | {p99p:.2?} |");
        println!("\nratio p99 PostgreSQL / SQLite: {:.2}; requests/s ratio: {:.2}\n", p99p.as_secs_f64() / p99s.as_secs_f64(), np as f64 / ns as f64);

        // 3. S2
        let (mut one, base) = start_server(&tmp.path().join("s2sq"), &[], &[]);
        let ts = s2(&base, s2_bytes).await;
        let _ = one.kill();
        let _ = one.wait();
        let (db, url) = create_db().await;
        let (mut p, base) = start_server(&tmp.path().join("s2pg"), &["--catalog", &url], &[]);
        let tp = s2(&base, s2_bytes).await;
        let _ = p.kill();
        let _ = p.wait();
        drop_db(&db).await;
        let mib = s2_bytes as f64 / (1 << 20) as f64;
        println!("## S2: {mib:.0} MiB in 8 MiB PATCHes, fsync on\n");
        println!("| catalog | seconds | MiB/s |\n| --- | --- | --- |");
        println!("| SQLite | {ts:.2} | {:.0} |\n| PostgreSQL (catalog leases) | {tp:.2} | {:.0} |", mib / ts, mib / tp);
        println!("\nratio throughput PostgreSQL / SQLite: {:.2}", ts / tp);
    });
}
