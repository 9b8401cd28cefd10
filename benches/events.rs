//! Events figures (issue #12): what the outbox and its consumers cost the upload path, and how
//! fast events reach a webhook receiver and a Server-Sent Events subscriber.
//!
//!     cargo bench --bench events
//!
//! The release `ferry` binary (`env!("CARGO_BIN_EXE_ferry")`, fs store, SQLite catalog) serves
//! `N` small uploads (creation-with-upload: one `POST /files/` carrying all of a 4 KiB body, so
//! each upload makes an `upload.created` and an `upload.finished` event) from 8 concurrent
//! clients, in two configurations measured alternately in the same run (A B A B A B, medians
//! of 3):
//!
//! - **A, no consumer:** no `[[webhooks]]`, nobody on `GET /api/v1/events`. The outbox rows are
//!   still written (they are part of the catalog transaction), so A is the upload path as
//!   every deployment pays it.
//! - **B, one webhook + one SSE subscriber:** a receiver in this process (axum, answers 204)
//!   and a streaming `GET /api/v1/events` reader.
//!
//! Printed: uploads/s for A and B and their ratio (the cost of delivering), then for B the
//! delivery rate (events/s from the first upload's start until the last event arrived, for the
//! webhook and the SSE stream separately) and the lag from the upload's `201` to its
//! `upload.finished` event arriving (p50, p99, max).
//!
//! Client, receiver and server share the machine (2 cores on the reference box): end-to-end
//! figures, read as ratios.
//!
//! Knobs: `FERRY_BENCH_EVENT_UPLOADS` (N, default 1000).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;

#[path = "support/mod.rs"]
mod support;
use futures::StreamExt;

const BODY: usize = 4096;
const CLIENTS: usize = 8;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().map(|v| v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))).unwrap_or(default)
}

/// Arrival instants of `upload.finished` events by upload id, and the count of every event.
#[derive(Default)]
struct Arrivals {
    finished: HashMap<String, Instant>,
    events: usize,
    last: Option<Instant>,
}

impl Arrivals {
    fn record(&mut self, event: &serde_json::Value) {
        let now = Instant::now();
        self.events += 1;
        self.last = Some(now);
        if event["type"] == "upload.finished" {
            if let Some(id) = event["data"]["upload"].as_str() {
                self.finished.entry(id.to_string()).or_insert(now);
            }
        }
    }
}

/// A webhook receiver on a free loopback port: records every POSTed event, answers 204.
async fn start_receiver(arrivals: Arc<Mutex<Arrivals>>) -> String {
    let app = axum::Router::new().route(
        "/hook",
        post(move |body: axum::body::Bytes| {
            let arrivals = arrivals.clone();
            async move {
                let event: serde_json::Value = serde_json::from_slice(&body).expect("webhook body is JSON");
                arrivals.lock().unwrap().record(&event);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/hook")
}

/// `ferry serve` (release build) with `config` on a free port and a fresh data dir.
fn start_server(dir: &Path, config: &str) -> (Child, String) {
    let cfg = dir.join("ferry.toml");
    std::fs::write(&cfg, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .arg("--data")
        .arg(dir.join("data"))
        .env_remove("FERRY_LISTEN")
        .env_remove("FERRY_CONFIG")
        .env("RUST_LOG", "warn")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn ferry");
    let base = support::wait_listening(&mut child);
    (child, base)
}

/// Reads `GET /api/v1/events` until dropped, recording every event's `data:` line.
async fn subscribe(base: &str, arrivals: Arc<Mutex<Arrivals>>) {
    let c = reqwest::Client::builder().no_proxy().build().unwrap();
    let r = c.get(format!("{base}/api/v1/events")).header("accept", "text/event-stream").send().await.unwrap();
    assert_eq!(r.status(), 200, "GET /api/v1/events");
    tokio::spawn(async move {
        let mut stream = r.bytes_stream();
        let mut buf = Vec::new();
        while let Some(Ok(chunk)) = stream.next().await {
            buf.extend_from_slice(&chunk);
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                if let Some(data) = line.strip_prefix(b"data:") {
                    let event: serde_json::Value = serde_json::from_slice(data.trim_ascii()).expect("SSE data is JSON");
                    arrivals.lock().unwrap().record(&event);
                }
            }
        }
    });
}

/// `n` uploads of `BODY` bytes from `CLIENTS` concurrent clients; returns (elapsed, the instant
/// each upload's 201 arrived by upload id).
async fn upload_all(base: &str, n: usize) -> (Duration, HashMap<String, Instant>) {
    let c = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(64).build().unwrap();
    let body = bytes::Bytes::from(vec![0x5a_u8; BODY]);
    let t0 = Instant::now();
    let mut joins = Vec::new();
    for k in 0..CLIENTS {
        let (c, url, body) = (c.clone(), format!("{base}/files/"), body.clone());
        joins.push(tokio::spawn(async move {
            let mut done = Vec::new();
            for _ in (k..n).step_by(CLIENTS) {
                let r = c
                    .post(&url)
                    .header("tus-resumable", "1.0.0")
                    .header("upload-length", BODY.to_string())
                    .header("content-type", "application/offset+octet-stream")
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201, "creation-with-upload");
                assert_eq!(r.headers()["upload-offset"], BODY.to_string().as_str(), "the whole body was taken");
                let at = Instant::now();
                let loc = r.headers()["location"].to_str().unwrap().trim_end_matches('/').to_string();
                done.push((loc.rsplit('/').next().unwrap().to_string(), at));
            }
            done
        }));
    }
    let mut out = HashMap::new();
    for j in joins {
        out.extend(j.await.unwrap());
    }
    (t0.elapsed(), out)
}

struct Delivery {
    events_per_sec: f64,
    lag: Vec<Duration>,
}

/// Waits (≤ 120 s) until `arrivals` holds `upload.finished` for every upload in `sent`.
async fn drained(what: &str, arrivals: &Mutex<Arrivals>, t0: Instant, sent: &HashMap<String, Instant>) -> Delivery {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        {
            let a = arrivals.lock().unwrap();
            if sent.keys().all(|id| a.finished.contains_key(id)) {
                let mut lag: Vec<Duration> = sent.iter().map(|(id, at)| a.finished[id].saturating_duration_since(*at)).collect();
                lag.sort();
                let secs = a.last.unwrap().duration_since(t0).as_secs_f64();
                return Delivery { events_per_sec: a.events as f64 / secs, lag };
            }
            assert!(Instant::now() < deadline, "{what}: {} of {} upload.finished events after 120 s", a.finished.len(), sent.len());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let n = env_u64("FERRY_BENCH_EVENT_UPLOADS", 1000) as usize;
    let root = tempfile::Builder::new().prefix("ferry-events-bench-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("bench temp dir");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);

    let (mut plain, mut consumed) = (Vec::new(), Vec::new());
    let (mut hook_rates, mut sse_rates, mut hook_lag, mut sse_lag) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..3 {
        // A: no consumer.
        let dir = tempfile::Builder::new().prefix("a-").tempdir_in(root.path()).unwrap();
        let (mut child, base) = start_server(dir.path(), "");
        let (took, _) = rt.block_on(upload_all(&base, n));
        plain.push(n as f64 / took.as_secs_f64());
        let _ = child.kill();
        let _ = child.wait();

        // B: one webhook receiver and one SSE subscriber.
        let dir = tempfile::Builder::new().prefix("b-").tempdir_in(root.path()).unwrap();
        let (hook, sse) = (Arc::new(Mutex::new(Arrivals::default())), Arc::new(Mutex::new(Arrivals::default())));
        let url = rt.block_on(start_receiver(hook.clone()));
        let config = format!("[[webhooks]]\nname = \"bench\"\nurl = \"{url}\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n");
        let (mut child, base) = start_server(dir.path(), &config);
        rt.block_on(subscribe(&base, sse.clone()));
        let t0 = Instant::now();
        let (took, sent) = rt.block_on(upload_all(&base, n));
        consumed.push(n as f64 / took.as_secs_f64());
        let h = rt.block_on(drained("webhook", &hook, t0, &sent));
        let s = rt.block_on(drained("SSE", &sse, t0, &sent));
        eprintln!(
            "round {round}: A {:.0} uploads/s, B {:.0} uploads/s; webhook {:.0} events/s, SSE {:.0} events/s",
            plain[round], consumed[round], h.events_per_sec, s.events_per_sec
        );
        hook_rates.push(h.events_per_sec);
        sse_rates.push(s.events_per_sec);
        hook_lag.extend(h.lag);
        sse_lag.extend(s.lag);
        let _ = child.kill();
        let _ = child.wait();
    }
    hook_lag.sort();
    sse_lag.sort();

    let (a, b) = (median(plain), median(consumed));
    println!("## Events: outbox delivery cost and rate ({n} uploads of {BODY} B per run, {CLIENTS} clients, A/B alternated, medians of 3)\n");
    println!("| configuration | uploads/s | vs A |");
    println!("|---|---:|---:|");
    println!("| A: no consumer (outbox rows still written) | {a:.0} | 1.00× |");
    println!("| B: one webhook + one SSE subscriber | {b:.0} | {:.2}× |", b / a);
    println!("\n| B's consumer | events/s (2 per upload) | lag p50 | lag p99 | lag max |");
    println!("|---|---:|---:|---:|---:|");
    for (label, rates, lag) in [("webhook (Standard Webhooks POST, 204)", hook_rates, &hook_lag), ("SSE GET /api/v1/events", sse_rates, &sse_lag)] {
        println!("| {label} | {:.0} | {} | {} | {} |", median(rates), ms(pct(lag, 0.5)), ms(pct(lag, 0.99)), ms(*lag.last().unwrap()));
    }
    println!("\nlag: from the upload's 201 at the client to its upload.finished event arriving at the consumer.");
}
