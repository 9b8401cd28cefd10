//! Events and webhooks (DESIGN §8; issue 12) against the real binary and a real receiver: a
//! Python server that verifies every delivery with the `standardwebhooks` package
//! (tests/clients/python/webhook_receiver.py), and Server-Sent Events on `/api/v1/events`.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// `whsec_` + base64 of a 32-byte key (Standard Webhooks' secret format).
const SECRET: &str = "whsec_ZmVycnktdGVzdC13ZWJob29rLXNlY3JldC0zMmJ5dGU=";

/// A running webhook_receiver.py; killed on drop.
struct Receiver {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Receiver {
    fn start(dir: &Path, name: &str, extra: &[&str]) -> Receiver {
        let log = dir.join(format!("{name}.jsonl"));
        let log_s = log.to_str().unwrap().to_string();
        let mut args = vec!["--secret", SECRET, "--log", &log_s];
        args.extend_from_slice(extra);
        let mut cmd = python_script("webhook_receiver.py", &args);
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("start webhook_receiver.py");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines.next().expect("receiver exited before listening").unwrap();
        let port = line.strip_prefix("listening on ").expect("listening line").trim().parse().unwrap();
        std::thread::spawn(move || for _ in lines.by_ref() {});
        Receiver { child, port, log }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// Every request the receiver logged so far.
    fn records(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Deliveries it acknowledged (2xx), in arrival order.
    fn accepted(&self) -> Vec<serde_json::Value> {
        self.records().into_iter().filter(|r| r["status"].as_u64().is_some_and(|s| (200..300).contains(&s))).collect()
    }

    /// Wait (generous deadline) until `done(accepted)` holds.
    async fn wait_accepted(&self, secs: u64, what: &str, done: impl Fn(&[serde_json::Value]) -> bool) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let acc = self.accepted();
            if done(&acc) {
                return acc;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the receiver logged:\n{}",
                self.records().iter().map(|r| r.to_string()).collect::<Vec<_>>().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn webhook_toml(name: &str, url: &str, extra: &str) -> String {
    format!("[[webhooks]]\nname = \"{name}\"\nurl = \"{url}\"\nsecret = \"{SECRET}\"\n{extra}\n")
}

/// Create and finish an upload of `data` (one PATCH); returns its id.
async fn upload(tus: &Tus, data: &[u8]) -> String {
    let url = tus.create(data.len() as u64).await;
    let r = tus.patch(&url, 0, data.to_vec(), &[]).await;
    assert_eq!(r.status(), 204, "final PATCH");
    url.trim_end_matches('/').rsplit('/').next().unwrap().to_string()
}

/// One change: (type, subject, task status — each status change of a task is its own change).
type Change = (String, String, String);

/// Change → the distinct webhook ids seen for it, over every request logged.
fn ids_per_change(records: &[serde_json::Value]) -> BTreeMap<Change, HashSet<String>> {
    let mut out: BTreeMap<Change, HashSet<String>> = BTreeMap::new();
    for r in records {
        let key = (
            r["type"].as_str().unwrap_or("?").to_string(),
            r["subject"].as_str().unwrap_or("?").to_string(),
            r["data"]["status"].as_str().unwrap_or("").to_string(),
        );
        out.entry(key).or_default().insert(r["id"].as_str().unwrap().to_string());
    }
    out
}

async fn metric(server: &Server, name: &str) -> Option<f64> {
    let text = client().get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with(' ')).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

/// A receiver that refuses the first 3 deliveries (503): every event still arrives, each
/// verified by `standardwebhooks`, every change under exactly one id (retries reuse it), and
/// the events of each upload and task in the order they happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_deliver_every_event_verified_once_in_order_despite_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(dir.path(), "refusing", &["--refuse-first", "3"]);
    let cfg = write_file(dir.path(), "ferry.toml", &webhook_toml("main", &rx.url(), ""));
    let server = Server::start(&["--config", cfg.to_str().unwrap()]);
    let tus = Tus::new(&server);
    let api = Api::new(&server);

    let mut expected: HashMap<String, Vec<&str>> = HashMap::new();
    for i in 0..4u64 {
        let id = upload(&tus, &pseudo_random(1000 + i as usize, i)).await;
        expected.insert(id, vec!["upload.created", "upload.finished"]);
    }
    // Terminated while unfinished.
    let url = tus.create(100).await;
    let r = tus.request("DELETE", &url, &[("Tus-Resumable", "1.0.0")], None).await;
    assert_eq!(r.status(), 204);
    expected.insert(url.rsplit('/').next().unwrap().to_string(), vec!["upload.created", "upload.terminated"]);
    let task = api.start("external", r#"{"job":"events"}"#).await;
    let task_id = task["id"].as_str().unwrap().to_string();
    assert_eq!(api.post(&format!("/api/v1/tasks/{task_id}/cancel"), "{}").await.status(), 200);
    expected.insert(task_id.clone(), vec!["task.status_changed", "task.status_changed"]);
    let total: usize = expected.values().map(Vec::len).sum();

    let accepted = rx.wait_accepted(120, "every event acknowledged", |acc| acc.len() >= total).await;
    let all = rx.records();
    assert!(all.iter().all(|r| r["verified"] == true), "every delivery verifies with standardwebhooks: {all:?}");
    assert_eq!(all.iter().filter(|r| r["status"] == 503).count(), 3, "the first 3 were refused");
    assert_eq!(accepted.len(), total, "each event acknowledged once: {accepted:?}");
    for ((ty, subject, status), ids) in ids_per_change(&all) {
        assert_eq!(ids.len(), 1, "{ty} {status} of {subject} arrived under {} ids: {ids:?}", ids.len());
    }
    let acked: HashSet<&str> = accepted.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(acked.len(), total, "no id acknowledged twice");
    for (subject, want) in &expected {
        let got: Vec<&str> = accepted.iter().filter(|r| r["subject"] == subject.as_str()).map(|r| r["type"].as_str().unwrap()).collect();
        assert_eq!(&got, want, "events of {subject} in order");
    }
    let task_statuses: Vec<&str> =
        accepted.iter().filter(|r| r["subject"] == task_id.as_str()).map(|r| r["data"]["status"].as_str().unwrap()).collect();
    assert_eq!(task_statuses, vec!["working", "cancelled"]);
    let finished: Vec<&serde_json::Value> = accepted.iter().filter(|r| r["type"] == "upload.finished").collect();
    for f in finished {
        assert!(f["data"]["sha256"].as_str().is_some_and(|h| h.len() == 64), "upload.finished carries the sha256: {f}");
        assert!(f["data"]["size"].as_u64().is_some_and(|s| s >= 1000), "and the size: {f}");
        assert_eq!(f["data"]["principal"], "local");
    }
    // Nothing left over, and the backlog metric agrees (eventually: it is refreshed per round).
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&server, "ferry_webhook_deliveries_pending").await != Some(0.0) {
        assert!(Instant::now() < deadline, "the pending gauge never came back to 0");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left = json(api.get("/api/v1/webhooks/deliveries").await).await;
    assert_eq!(left["deliveries"].as_array().unwrap().len(), 0, "{left}");
    assert!(metric(&server, "ferry_webhook_attempts_total{outcome=\"retry\"}").await.unwrap_or(0.0) >= 3.0);
}

/// `kill -9` right after the final PATCH's 204, 20 times: after each restart the
/// `upload.finished` event is delivered; every change arrives under exactly one id; an upload
/// whose last PATCH was refused (checksum mismatch: the change rolled back) never gets one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_after_the_final_patch_still_delivers_upload_finished_once() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(dir.path(), "crash", &[]);
    let cfg = write_file(dir.path(), "ferry.toml", &webhook_toml("crash", &rx.url(), ""));
    let mut server = Server::start(&["--config", cfg.to_str().unwrap()]);
    let mut finished = Vec::new();
    let mut refused = Vec::new();
    for round in 0..20u64 {
        let tus = Tus::new(&server);
        let data = pseudo_random(4096, round);
        // A change that is refused: the final PATCH carries a wrong checksum (460).
        let bad = tus.create(data.len() as u64).await;
        let r = tus.patch(&bad, 0, data.clone(), &[("Upload-Checksum", "sha1 AAAAAAAAAAAAAAAAAAAAAAAAAAA=")]).await;
        assert_eq!(r.status(), 460, "round {round}: checksum mismatch");
        refused.push(bad.rsplit('/').next().unwrap().to_string());
        finished.push(upload(&tus, &data).await);
        server.kill9();
        server.restart();
    }
    let acc = rx
        .wait_accepted(180, "upload.finished for all 20 uploads", |acc| {
            let done: HashSet<&str> = acc.iter().filter(|r| r["type"] == "upload.finished").filter_map(|r| r["subject"].as_str()).collect();
            finished.iter().all(|id| done.contains(id.as_str()))
        })
        .await;
    let all = rx.records();
    assert!(all.iter().all(|r| r["verified"] == true));
    for ((ty, subject, status), ids) in ids_per_change(&all) {
        assert_eq!(ids.len(), 1, "{ty} {status} of {subject} arrived under {} ids: {ids:?}", ids.len());
    }
    for id in &refused {
        assert!(
            !acc.iter().any(|r| r["subject"] == id.as_str() && r["type"] == "upload.finished"),
            "no upload.finished for {id}, whose final PATCH was refused"
        );
    }
    // A delivery cut off by the kill may arrive again under its one id (receivers deduplicate).
    let mut seen = HashSet::new();
    let acc: Vec<&serde_json::Value> = acc.iter().filter(|r| seen.insert(r["id"].as_str().unwrap().to_string())).collect();
    for id in &finished {
        let of: Vec<&str> = acc.iter().filter(|r| r["subject"] == id.as_str()).map(|r| r["type"].as_str().unwrap()).collect();
        assert_eq!(of, vec!["upload.created", "upload.finished"], "{id}");
    }
}

/// Receivers that hang, answer 500 forever, redirect, or close mid-body never hold up uploads
/// (nor a good receiver configured beside them); their deliveries stay pending with the reason,
/// visible at `GET /api/v1/webhooks/deliveries`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_receivers_never_block_uploads_and_show_up_as_pending() {
    let dir = tempfile::tempdir().unwrap();
    let modes = ["hang", "fail", "redirect", "close"];
    let bad: Vec<Receiver> = modes.iter().map(|m| Receiver::start(dir.path(), m, &["--mode", m])).collect();
    let good = Receiver::start(dir.path(), "good", &[]);
    let mut toml = String::new();
    for (m, rx) in modes.iter().zip(&bad) {
        toml.push_str(&webhook_toml(m, &rx.url(), "timeout = \"1s\"\nevents = [\"upload.finished\"]"));
    }
    toml.push_str(&webhook_toml("good", &good.url(), "events = [\"upload.*\"]"));
    // Not a URL at all on a closed port: connection refused.
    toml.push_str(&webhook_toml("refused", "http://127.0.0.1:9/nothing", "events = [\"upload.finished\"]"));
    let cfg = write_file(dir.path(), "ferry.toml", &toml);
    let server = Server::start(&["--config", cfg.to_str().unwrap()]);
    let tus = Tus::new(&server);
    let mut ids = Vec::new();
    for i in 0..20u64 {
        ids.push(upload(&tus, &pseudo_random(2048, i)).await);
    }
    // The good receiver gets all 40 events while the others misbehave.
    good.wait_accepted(120, "the good receiver's 40 events", |acc| acc.len() >= 40).await;
    // Every bad receiver was tried and every delivery to it is pending with a reason.
    let api = Api::new(&server);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = json(api.get("/api/v1/webhooks/deliveries?state=pending&limit=1000").await).await;
        let list = v["deliveries"].as_array().unwrap().clone();
        let tried: HashSet<&str> = list
            .iter()
            .filter(|d| d["attempts"].as_u64() >= Some(1) && d["last_error"].is_string())
            .map(|d| d["webhook"].as_str().unwrap())
            .collect();
        if ["hang", "fail", "redirect", "close", "refused"].iter().all(|w| tried.contains(w)) {
            let redirect = list.iter().find(|d| d["webhook"] == "redirect" && d["last_status"].is_u64()).expect("a redirect attempt");
            assert_eq!(redirect["last_status"], 307, "{redirect}");
            assert!(list.iter().filter(|d| d["webhook"] == "fail").any(|d| d["last_status"] == 500));
            assert!(list.iter().all(|d| d["event"]["type"] == "upload.finished" && d["state"] == "pending"), "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "not every bad receiver shows a failed attempt: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Per subject order holds each bad webhook's later events back, never the uploads: one more
    // upload still completes at once.
    upload(&tus, &pseudo_random(10, 99)).await;
    assert!(metric(&server, "ferry_webhook_deliveries_pending").await.unwrap_or(0.0) >= 80.0);
    assert!(bad.iter().all(|rx| rx.records().iter().all(|r| r["verified"] == true)));
}

/// One Server-Sent Events message.
#[derive(Debug, Clone)]
struct Sse {
    id: String,
    event: String,
    data: serde_json::Value,
}

/// Read SSE messages from `r` until `n` arrived (comments/keep-alives skipped).
async fn read_sse(r: &mut reqwest::Response, buf: &mut String, n: usize, secs: u64) -> Vec<Sse> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(secs);
    while out.len() < n {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if !data.is_empty() {
                out.push(Sse { id, event, data: serde_json::from_str(&data).unwrap() });
            }
        }
        if out.len() >= n {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out: {} of {n} SSE messages: {out:?}", out.len());
        match tokio::time::timeout(left, r.chunk()).await {
            Ok(Ok(Some(c))) => buf.push_str(&String::from_utf8_lossy(&c)),
            Ok(Ok(None)) => panic!("the event stream ended"),
            Ok(Err(e)) => panic!("reading the event stream: {e}"),
            Err(_) => panic!("timed out: {} of {n} SSE messages: {out:?}", out.len()),
        }
    }
    out
}

/// SSE: a client that disconnects and reconnects with `Last-Event-ID` misses nothing; another
/// principal's events never appear; an id the caller may not see is 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_resumes_with_last_event_id_and_shows_only_the_callers_events() {
    let dir = tempfile::tempdir().unwrap();
    let (alice_token, bob_token) = ("alice-token-0123456789", "bob-token-0123456789");
    let toml = format!(
        "[[tokens]]\nprincipal = \"alice\"\nsha256 = \"{}\"\n[[tokens]]\nprincipal = \"bob\"\nsha256 = \"{}\"\n",
        sha256_hex(alice_token.as_bytes()),
        sha256_hex(bob_token.as_bytes())
    );
    let cfg = write_file(dir.path(), "ferry.toml", &toml);
    let server = Server::start(&["--config", cfg.to_str().unwrap()]);
    let alice = Api::with_token(&server, alice_token);
    let bob = Api::with_token(&server, bob_token);

    let mut stream = alice.get("/api/v1/events").await;
    assert_eq!(stream.status(), 200);
    assert!(header(&stream, "content-type").is_some_and(|c| c.starts_with("text/event-stream")));
    let mut buf = String::new();
    let mut mine = Vec::new();
    for i in 0..3 {
        bob.upload(b"bob's bytes", "b.txt").await;
        mine.push(alice.upload(format!("alice {i}").as_bytes(), "a.txt").await);
    }
    let first = read_sse(&mut stream, &mut buf, 4, 60).await; // created+finished of the first two
    drop(stream);
    // While disconnected: more of alice's changes (and bob's).
    for i in 3..5 {
        bob.upload(b"bob again", "b.txt").await;
        mine.push(alice.upload(format!("alice {i}").as_bytes(), "a.txt").await);
    }
    let last_seen = first.last().unwrap().id.clone();
    let mut again = alice.send("GET", "/api/v1/events", &[("last-event-id", &last_seen)], None).await;
    assert_eq!(again.status(), 200);
    let mut buf2 = String::new();
    let rest = read_sse(&mut again, &mut buf2, 6, 60).await; // 3rd, 4th, 5th uploads
    let all: Vec<Sse> = first.into_iter().chain(rest).collect();
    let ids: HashSet<&str> = all.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids.len(), all.len(), "no event twice across the reconnect");
    let seq: Vec<(String, String)> = all.iter().map(|m| (m.event.clone(), m.data["data"]["upload"].as_str().unwrap().to_string())).collect();
    let want: Vec<(String, String)> =
        mine.iter().flat_map(|id| [("upload.created".to_string(), id.clone()), ("upload.finished".to_string(), id.clone())]).collect();
    assert_eq!(seq, want, "every one of alice's events, in order, none missed");
    assert!(all.iter().all(|m| m.data["data"]["principal"] == "alice" && m.data["id"] == m.id.as_str()), "only alice's events");

    // Bob's own stream from before: bob's events only; alice's ids are not his to resume from.
    let r = bob.send("GET", "/api/v1/events", &[("last-event-id", &last_seen)], None).await;
    problem(r, 404, "not_found").await;
    let r = alice.send("GET", "/api/v1/events", &[("last-event-id", "evt_00000000000000000000000000000000")], None).await;
    let p = problem(r, 404, "not_found").await;
    assert!(p["detail"].as_str().unwrap().contains("events are kept 1 day"), "the retention in words: {p}");
}

/// Events a webhook's cursor has not reached are never pruned, however old: the only server
/// configured with the webhook is down longer than the retention while another (here: the same
/// data dir started without the webhook) writes events and prunes; back up, the webhook gets
/// every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_a_webhook_has_not_reached_outlive_the_retention() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let rx = Receiver::start(dir.path(), "behind", &[]);
    let retention = "[events]\nretention = \"1s\"\n";
    let with_hook = write_file(dir.path(), "with-hook.toml", &format!("{retention}{}", webhook_toml("main", &rx.url(), "")));
    let without = write_file(dir.path(), "without.toml", retention);

    let mut hooked = Server::start_in(&data, &["--config", with_hook.to_str().unwrap()]);
    let first = upload(&Tus::new(&hooked), b"before the outage").await;
    rx.wait_accepted(60, "the first upload's events", |acc| acc.len() >= 2).await;
    hooked.terminate();

    // The webhook's server is down; another writes events that outlive the retention, and prunes
    // (at start-up, and every 10 minutes).
    let mut other = Server::start_in(&data, &["--config", without.to_str().unwrap()]);
    let tus = Tus::new(&other);
    let mut missed = Vec::new();
    for i in 0..3 {
        missed.push(upload(&tus, &pseudo_random(500 + i, i as u64)).await);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    other.restart(); // prunes at start
    tokio::time::sleep(Duration::from_millis(1500)).await;
    other.terminate();

    let _hooked = Server::start_in(&data, &["--config", with_hook.to_str().unwrap()]);
    let acc = rx.wait_accepted(60, "the events written while the webhook's server was down", |acc| acc.len() >= 2 + 2 * missed.len()).await;
    for id in missed.iter().chain([&first]) {
        let types: Vec<&str> = acc.iter().filter(|r| r["subject"] == id.as_str()).map(|r| r["type"].as_str().unwrap()).collect();
        assert_eq!(types, vec!["upload.created", "upload.finished"], "events of {id}");
    }
}

/// An idle SSE follower makes no catalog query: 200 followers on a PostgreSQL catalog leave
/// the `events` table's scan count where the head watcher alone puts it (one read per 25 ms),
/// not the 5 reads per second each that a timed-out wait used to make; they still get the next
/// event at once. The stream says `X-Accel-Buffering: no`, so nginx does not hold events back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sse_followers_do_not_query_the_catalog() {
    let db = common::pg::TestDb::create().await;
    let catalog = format!("--catalog={}", db.url);
    let server = Server::start(&[&catalog]);
    let api = Api::new(&server);
    let followers = 200;
    let mut streams = Vec::new();
    for _ in 0..followers {
        let r = api.get("/api/v1/events").await;
        assert_eq!(r.status(), 200);
        streams.push(r);
    }
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let scans = || async {
        let n: i64 = sqlx::query_scalar("SELECT COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'events'")
            .fetch_one(&pool)
            .await
            .unwrap();
        n
    };
    tokio::time::sleep(Duration::from_secs(3)).await; // every follower is waiting
    let before = scans().await;
    let window = Duration::from_secs(5);
    tokio::time::sleep(window).await;
    let used = scans().await - before;
    // The head watcher reads 40 times a second; 200 polling followers would read 1 000 times a
    // second. The slack covers statistics the database reports late (the followers' first reads).
    let budget = (window.as_secs() * 40) as i64 + 3 * followers;
    assert!(used < budget, "{used} scans of `events` in {window:?} with {followers} idle followers (budget {budget})");
    assert_eq!(header(&streams[0], "x-accel-buffering"), Some("no"), "the stream asks proxies not to buffer it");
    let id = api.upload(b"wakes every follower", "w.txt").await;
    for r in streams.iter_mut().take(20) {
        let mut buf = String::new();
        let got = read_sse(r, &mut buf, 1, 30).await;
        assert_eq!((got[0].event.as_str(), got[0].data["data"]["upload"].as_str()), ("upload.created", Some(id.as_str())));
    }
    pool.close().await;
}

/// One metadata shape everywhere (issue 48, kind 13): one upload whose `Upload-Metadata` has a
/// text value, a value that is not UTF-8 and a key without a value; the REST file view, the
/// pre-create and pre-finish hooks, the SSE events and the webhook deliveries (upload.created,
/// upload.finished) all report the same decoded map — text as a string, other bytes as
/// `{"base64": …}`, no value as `null` — never the raw `Upload-Metadata` text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_surface_reports_the_same_metadata_map() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(dir.path(), "md", &[]);
    let hook_log = dir.path().join("hook.jsonl");
    let mut hook = python_script("upload_hook.py", &["--log", hook_log.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start upload_hook.py");
    let mut lines = BufReader::new(hook.stdout.take().unwrap()).lines();
    let hook_port: u16 = lines.next().unwrap().unwrap().strip_prefix("listening on ").unwrap().trim().parse().unwrap();
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let toml = format!(
        "{}[hooks.pre_create]\nurl = \"http://127.0.0.1:{hook_port}/echo\"\n[hooks.pre_finish]\nurl = \"http://127.0.0.1:{hook_port}/pre-finish\"\n",
        webhook_toml("md", &rx.url(), "")
    );
    let cfg = write_file(dir.path(), "ferry.toml", &toml);
    let server = Server::start(&["--config", cfg.to_str().unwrap()]);
    let api = Api::new(&server);
    let tus = Tus::new(&server);
    let mut stream = api.get("/api/v1/events").await;
    assert_eq!(stream.status(), 200);

    // "a.bin" as text, bytes ff fe 00 61 (not UTF-8), and a key with no value.
    let metadata = "filename YS5iaW4=,blob //4AYQ==,flag";
    let want = serde_json::json!({ "filename": "a.bin", "blob": { "base64": "//4AYQ==" }, "flag": null });
    let r = tus.post(&[("Upload-Length", "3"), ("Upload-Metadata", metadata)]).await;
    assert_eq!(r.status(), 201, "{:?}", r.text().await);
    let url = tus.abs(r.headers()["location"].to_str().unwrap());
    assert_eq!(tus.patch(&url, 0, b"abc".to_vec(), &[]).await.status(), 204);
    let id = url.trim_end_matches('/').rsplit('/').next().unwrap().to_string();

    let mut surfaces: Vec<(String, serde_json::Value)> = Vec::new();
    surfaces.push(("REST file view".into(), json(api.get(&format!("/api/v1/files/{id}")).await).await["metadata"].clone()));
    let mut buf = String::new();
    for e in read_sse(&mut stream, &mut buf, 2, 30).await {
        surfaces.push((format!("SSE {}", e.event), e.data["data"]["metadata"].clone()));
    }
    for d in rx.wait_accepted(30, "upload.created and upload.finished", |acc| acc.len() >= 2).await {
        surfaces.push((format!("webhook {}", d["type"]), d["data"]["metadata"].clone()));
    }
    for line in std::fs::read_to_string(&hook_log).unwrap().lines() {
        let call: serde_json::Value = serde_json::from_str(line).unwrap();
        surfaces.push((format!("hook {}", call["path"]), call["request"]["upload"]["metadata"].clone()));
    }
    let _ = hook.kill();
    let _ = hook.wait();
    let named: Vec<&str> = surfaces.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(surfaces.len(), 7, "REST, 2 SSE events, 2 webhooks, 2 hooks: {named:?}");
    for (surface, got) in &surfaces {
        assert_eq!(got, &want, "{surface} reports another shape of the metadata");
    }
}
