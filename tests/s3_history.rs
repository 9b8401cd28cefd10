//! The history check of issue 22: three `ferry serve` replicas on one PostgreSQL catalog and
//! one S3 bucket (moto), behind a per-request round-robin balancer, while several clients
//! upload at once and the replicas are `kill -9`ed, frozen (`SIGSTOP`) for longer than a lease
//! and woken, and cut from S3 and from PostgreSQL (a TCP proxy between each replica and each
//! service). Every offset any 2xx acknowledged (a PATCH's 204, a HEAD's 200) is recorded.
//! At the end: every file's bytes are exactly what its client sent (so every acknowledged
//! offset was a prefix of the final file), no offset a client was told ever went backwards,
//! no multipart upload is left in the bucket, and S3 refused no completion (the replicas reach
//! moto through the strict-S3 proxy of tests/common/s3proxy.rs, R2's rule on).
//!
//! Bounded in time (the clients have a deadline, each fault a fixed length) and without
//! wall-clock asserts: the clients retry whatever is refused, as TUS clients do.
//!
//! Needs PostgreSQL (`FERRY_TEST_PG`, see tests/common/pg.rs) and moto (tests/common/moto.rs) or
//! the S3 server `FERRY_TEST_S3_*` names (Garage in `.ci/run`; tests/common/s3.rs).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::balancer::RoundRobin;
use common::pg::TestDb;
use common::proxy::TcpProxy;
use common::s3::TestS3;
use common::s3proxy::S3Proxy;
use common::*;

const MIB: usize = 1 << 20;
const BUCKET: &str = "ferry";
const LEASE: Duration = Duration::from_secs(2);
const CLIENTS: usize = 4;

/// What one client was told about its upload, in order.
#[derive(Debug, Default)]
struct History {
    url: Option<String>,
    /// (what answered, the offset it acknowledged).
    acks: Vec<(String, u64)>,
    /// An acknowledged offset below an earlier one: (earlier, later, what answered).
    backwards: Vec<(u64, u64, String)>,
    done: bool,
}

/// One client: create, then HEAD + PATCH chunks until the upload is whole, retrying every
/// refusal; records every 2xx offset.
async fn client_run(base: String, data: Arc<Vec<u8>>, chunk: usize, h: Arc<Mutex<History>>, progress: Arc<AtomicU64>, deadline: Instant) {
    let tus = Tus { c: reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(20)).build().unwrap(), base };
    let len = data.len() as u64;
    let url = loop {
        assert!(Instant::now() < deadline, "the upload was never created");
        if let Ok(r) = tus.c.post(tus.abs("/files/")).header("Tus-Resumable", "1.0.0").header("Upload-Length", len.to_string()).send().await {
            if r.status() == 201 {
                break tus.abs(header(&r, "location").unwrap());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    h.lock().unwrap().url = Some(url.clone());
    let ack = |what: String, off: u64| {
        let mut h = h.lock().unwrap();
        if let Some(&(_, prev)) = h.acks.iter().max_by_key(|a| a.1) {
            if off < prev {
                h.backwards.push((prev, off, what.clone()));
            }
        }
        h.acks.push((what, off));
    };
    let mut last = 0u64;
    while Instant::now() < deadline {
        let Ok(r) = tus.c.head(&url).header("Tus-Resumable", "1.0.0").send().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if r.status() != 200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let off = header_u64(&r, "upload-offset").expect("HEAD 200 has Upload-Offset");
        ack("HEAD 200".into(), off);
        progress.fetch_add(off.saturating_sub(last), Ordering::SeqCst);
        last = last.max(off);
        if off == len {
            h.lock().unwrap().done = true;
            return;
        }
        let end = (off as usize + chunk).min(data.len());
        let sent = tus
            .c
            .patch(&url)
            .header("Tus-Resumable", "1.0.0")
            .header("Content-Type", OCTET)
            .header("Upload-Offset", off.to_string())
            .body(data[off as usize..end].to_vec())
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {
                let at = header_u64(&r, "upload-offset").expect("a 2xx PATCH has Upload-Offset");
                ack(format!("PATCH {off}..{end} {}", r.status()), at);
                progress.fetch_add(at.saturating_sub(last), Ordering::SeqCst);
                last = last.max(at);
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
        // A client's pace: the faults land across the whole upload.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `url` with its port replaced by `port`.
fn with_port(url: &str, port: u16) -> String {
    let mut u = url::Url::parse(url).unwrap();
    u.set_port(Some(port)).unwrap();
    u.to_string()
}

fn signal(s: &Server, sig: &str) {
    let ok = std::process::Command::new("kill").arg(format!("-{sig}")).arg(s.child.id().to_string()).status().unwrap().success();
    assert!(ok, "kill -{sig}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_under_kill_freeze_and_partitions_keeps_every_acknowledged_byte() {
    let db = TestDb::create().await;
    let moto = TestS3::start(BUCKET, 5 * MIB as u64).await;
    moto.set_env();
    let blobs = moto.url("up");
    let pg_addr = {
        let u = url::Url::parse(&db.url).unwrap();
        format!("{}:{}", u.host_str().unwrap(), u.port().unwrap_or(5432)).parse().unwrap()
    };
    // Every replica reaches S3 through its own TCP proxy (to cut), all of them through one
    // strict-S3 proxy (R2's equal-parts rule and S3's 5 MiB floor on every completion).
    let strict = S3Proxy::start(&moto.config.endpoint).await;
    strict.set_strict(true);
    let moto_addr = strict.url.trim_start_matches("http://").parse().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let public = format!("http://{}", listener.local_addr().unwrap());
    let lease = format!("{}s", LEASE.as_secs());
    let (mut s3s, mut pgs, mut servers) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        let s3 = TcpProxy::start(moto_addr).await;
        let pg = TcpProxy::start(pg_addr).await;
        let catalog = with_port(&db.url, pg.port);
        std::env::set_var("AWS_ENDPOINT_URL", s3.http_url());
        let args = [
            "--catalog",
            catalog.as_str(),
            "--blobs",
            blobs.as_str(),
            "--leases",
            "catalog",
            "--upload-lease",
            &lease,
            "--task-lease",
            &lease,
            "--public-url",
            &public,
            "--min-free-space",
            "0",
        ];
        servers.push(Server::start(&args));
        s3s.push(s3);
        pgs.push(pg);
    }
    let lb = RoundRobin::serve(listener, &servers.iter().map(|s| s.base.clone()).collect::<Vec<_>>());

    // The clients: files of 20–32 MiB (several parts each), odd chunk sizes.
    let deadline = Instant::now() + Duration::from_secs(240);
    let progress = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let data = Arc::new(pseudo_random((20 + 4 * c) * MIB + 777 * c, 0x4157 + c as u64));
        let h = Arc::new(Mutex::new(History::default()));
        let chunk = 700 * 1024 + 4099 * c;
        let task = tokio::spawn(client_run(lb.base.clone(), data.clone(), chunk, h.clone(), progress.clone(), deadline));
        clients.push((data, h, task));
    }

    // The faults, each replica in turn, each after the clients made some progress.
    let faults = ["kill", "stop", "cut-s3", "cut-pg"];
    let mut rounds = 0;
    for round in 0..12 {
        let at = progress.load(Ordering::SeqCst);
        let wait = Instant::now() + Duration::from_secs(30);
        while progress.load(Ordering::SeqCst) < at + MIB as u64 && Instant::now() < wait && !clients.iter().all(|c| c.2.is_finished()) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if clients.iter().all(|c| c.2.is_finished()) {
            break;
        }
        let i = round % 3;
        let fault = faults[round % faults.len()];
        eprintln!("round {round}: {fault} replica {i} ({} MiB acknowledged so far)", progress.load(Ordering::SeqCst) >> 20);
        match fault {
            "kill" => {
                lb.set_down(i);
                servers[i].kill9();
                tokio::time::sleep(Duration::from_millis(500)).await;
                servers[i].restart();
                lb.set_backend(i, &servers[i].base.clone());
            }
            "stop" => {
                signal(&servers[i], "STOP");
                lb.set_down(i);
                tokio::time::sleep(LEASE * 2).await;
                signal(&servers[i], "CONT");
                lb.set_backend(i, &servers[i].base.clone());
            }
            "cut-s3" => {
                s3s[i].cut().await;
                tokio::time::sleep(LEASE * 2).await;
                s3s[i].restore().await;
            }
            "cut-pg" => {
                pgs[i].cut().await;
                tokio::time::sleep(LEASE * 2).await;
                pgs[i].restore().await;
            }
            _ => unreachable!(),
        }
        rounds += 1;
    }
    assert!(rounds >= faults.len(), "only {rounds} faults landed before the clients finished: the test needs slower clients");

    let mut report = Vec::new();
    for (c, (data, h, task)) in clients.iter_mut().enumerate() {
        if let Err(e) = task.await {
            std::panic::resume_unwind(e.into_panic());
        }
        let h = h.lock().unwrap();
        report.push(format!("client {c}: {} acks, done {}", h.acks.len(), h.done));
        assert!(h.done, "client {c} did not finish within the deadline: last acks {:?}", &h.acks[h.acks.len().saturating_sub(5)..]);
        assert!(h.backwards.is_empty(), "client {c}: acknowledged offsets went backwards: {:?}", h.backwards);
        assert!(h.acks.iter().all(|a| a.1 <= data.len() as u64), "client {c}: an offset past the length");
    }
    eprintln!("{}", report.join("\n"));

    // Every replica serves every file as its client sent it.
    for (c, (data, h, _)) in clients.iter().enumerate() {
        let url = h.lock().unwrap().url.clone().unwrap();
        let path = &url[url.find("/files/").unwrap()..];
        for (i, s) in servers.iter().enumerate() {
            let until = Instant::now() + Duration::from_secs(60);
            let body = loop {
                let r = client().get(s.url(path)).send().await.unwrap();
                if r.status() == 200 {
                    break r.bytes().await.unwrap();
                }
                assert!(matches!(r.status().as_u16(), 423 | 503) && Instant::now() < until, "client {c}'s file from replica {i}: {}", r.status());
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            assert_eq!(body.len(), data.len(), "client {c}'s file from replica {i}: length");
            assert!(sha256_hex(&body) == sha256_hex(data), "client {c}'s file from replica {i} differs from the bytes its client sent");
        }
    }
    assert_eq!(strict.refused(), Vec::<(String, String)>::new(), "S3 refused completions (R2's rule)");
    // Nothing unfinished stays in the bucket.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mpus = moto.multipart_uploads().await;
        if mpus.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "multipart uploads left in the bucket: {mpus:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(lb);
    drop(servers);
}
