//! Two `ferry serve` processes on one PostgreSQL catalog and one shared blob directory (the fs
//! store on a shared path stands in for S3): every guarantee one server gives holds across
//! them (DESIGN §2 "Several replicas"). Each test gets a fresh database (tests/common/pg.rs).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::pg::TestDb;
use common::*;

/// Upload lease length: a dead holder is taken over after this long.
const LEASE: &str = "2s";

/// Start a replica: its own data dir, the shared catalog and blob directory.
fn replica(db: &TestDb, blobs: &Path, extra: &[&str]) -> Server {
    replica_with_lease(db, blobs, LEASE, extra)
}

fn replica_with_lease(db: &TestDb, blobs: &Path, lease: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--catalog", db.url.as_str(), "--blobs", blobs.to_str().unwrap(), "--leases", "catalog", "--upload-lease", lease];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// A PATCH whose body the test feeds piece by piece; the response arrives on the handle.
fn streaming_patch(url: &str, offset: u64) -> (tokio::sync::mpsc::Sender<Bytes>, tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let body = reqwest::Body::wrap_stream(futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok::<_, std::io::Error>))));
    let req =
        client().patch(url).header("Tus-Resumable", "1.0.0").header("Content-Type", OCTET).header("Upload-Offset", offset.to_string()).body(body);
    (tx, tokio::spawn(req.send()))
}

/// HEAD until it answers 200 (a HEAD waits for a dead holder's lease to expire, and answers 423
/// if that takes longer than its wait); returns the offset.
async fn offset_when_free(tus: &Tus, url: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = tus.head(url).await;
        if r.status() == 200 {
            return header_u64(&r, "upload-offset").expect("Upload-Offset");
        }
        assert_eq!(r.status(), 423, "HEAD {url}: only 200 or 423 (locked) expected");
        assert!(Instant::now() < deadline, "the upload stayed locked for a minute");
    }
}

fn signal(server: &Server, sig: &str) {
    let ok = std::process::Command::new("kill").arg(format!("-{sig}")).arg(server.child.id().to_string()).status().unwrap().success();
    assert!(ok, "kill -{sig}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_of_one_upload_alternate_between_two_replicas() {
    let db = TestDb::create().await;
    let blobs = tempfile::tempdir().unwrap();
    let (a, b) = (replica(&db, blobs.path(), &[]), replica(&db, blobs.path(), &[]));
    let (ta, tb) = (Tus::new(&a), Tus::new(&b));
    let data = pseudo_random(8 << 20, 11);
    let url_a = ta.create(data.len() as u64).await;
    let path = url_a.trim_start_matches(&a.base).to_string();
    let url_b = tb.abs(&path);
    let chunk = 256 << 10;
    for (i, piece) in data.chunks(chunk).enumerate() {
        let off = (i * chunk) as u64;
        let (this, other, other_url, this_url) = if i % 2 == 0 { (&ta, &tb, &url_b, &url_a) } else { (&tb, &ta, &url_a, &url_b) };
        let r = this.patch(this_url, off, piece.to_vec(), &[]).await;
        assert_eq!(r.status(), 204, "chunk {i} on replica {}", if i % 2 == 0 { "A" } else { "B" });
        assert_eq!(header_u64(&r, "upload-offset"), Some(off + piece.len() as u64));
        assert_eq!(other.offset(other_url).await, off + piece.len() as u64, "the other replica sees the new offset at once");
    }
    let want = sha256_hex(&data);
    assert_stored_sha256(&a, &path, &want).await;
    assert_stored_sha256(&b, &path, &want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_on_one_replica_stops_a_patch_held_on_the_other() {
    let db = TestDb::create().await;
    let blobs = tempfile::tempdir().unwrap();
    let (a, b) = (replica_with_lease(&db, blobs.path(), "60s", &[]), replica_with_lease(&db, blobs.path(), "60s", &[]));
    let (ta, tb) = (Tus::new(&a), Tus::new(&b));
    let data = pseudo_random(4 << 20, 12);
    let url_a = ta.create(data.len() as u64).await;
    let path = url_a.trim_start_matches(&a.base).to_string();
    let (tx, patch) = streaming_patch(&url_a, 0);
    tx.send(Bytes::copy_from_slice(&data[..1 << 20])).await.unwrap();
    wait_bytes_received(&a, 1 << 20).await;
    // The lease is 60 s: only release-on-request (NOTIFY from B to A) can free it in time.
    let r = tb.head(&tb.abs(&path)).await;
    assert_eq!(r.status(), 200, "HEAD on B took the upload over from the PATCH held on A");
    let off = header_u64(&r, "upload-offset").unwrap();
    assert_eq!(off, 1 << 20, "A checkpointed every byte it had received before letting go");
    let ended = tokio::time::timeout(Duration::from_secs(30), patch).await.expect("the PATCH on A ended when asked");
    drop(ended);
    drop(tx);
    let r = tb.patch(&tb.abs(&path), off, data[off as usize..].to_vec(), &[]).await;
    assert_eq!(r.status(), 204);
    assert_stored_sha256(&a, &path, &sha256_hex(&data)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_the_writer_hands_the_upload_to_the_other_replica_twenty_times() {
    let db = TestDb::create().await;
    let blobs = tempfile::tempdir().unwrap();
    let extra = ["--checkpoint-every", "256KiB"];
    let mut servers = [replica(&db, blobs.path(), &extra), replica(&db, blobs.path(), &extra)];
    let data = pseudo_random(48 << 20, 13);
    let url = Tus::new(&servers[0]).create(data.len() as u64).await;
    let path = url.trim_start_matches(&servers[0].base).to_string();
    let mut acknowledged = 0u64;
    for round in 0..20 {
        let (w, other) = (round % 2, 1 - round % 2);
        let tus = Tus::new(&servers[w]);
        let off = offset_when_free(&tus, &tus.abs(&path)).await;
        assert!(off >= acknowledged, "round {round}: offset went back from {acknowledged} to {off}: acknowledged bytes lost");
        acknowledged = off;
        let before = bytes_received(&servers[w]).await;
        let (tx, patch) = streaming_patch(&tus.abs(&path), off);
        let rest = data[off as usize..].to_vec();
        let feeder = tokio::spawn(async move {
            for piece in rest.chunks(64 << 10) {
                if tx.send(Bytes::copy_from_slice(piece)).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        wait_bytes_received(&servers[w], before + (1 << 20)).await;
        servers[w].kill9();
        feeder.abort();
        let _ = patch.await;
        // The other replica takes the lease once it expires, repairs the blob, and the client
        // resumes there.
        let t2 = Tus::new(&servers[other]);
        let taken = offset_when_free(&t2, &t2.abs(&path)).await;
        assert!(taken >= acknowledged, "round {round}: the taker reports {taken} < {acknowledged}");
        acknowledged = taken;
        servers[w].restart();
    }
    let tus = Tus::new(&servers[0]);
    let off = offset_when_free(&tus, &tus.abs(&path)).await;
    assert!(off >= acknowledged);
    assert!(off > 0, "the rounds made progress");
    let r = tus.patch(&tus.abs(&path), off, data[off as usize..].to_vec(), &[]).await;
    assert_eq!(r.status(), 204);
    let want = sha256_hex(&data);
    assert_stored_sha256(&servers[0], &path, &want).await;
    assert_stored_sha256(&servers[1], &path, &want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_writer_never_adds_bytes_after_its_lease_expired() {
    let db = TestDb::create().await;
    let blobs = tempfile::tempdir().unwrap();
    let extra = ["--checkpoint-every", "256KiB"];
    let (a, b) = (replica(&db, blobs.path(), &extra), replica(&db, blobs.path(), &extra));
    let (ta, tb) = (Tus::new(&a), Tus::new(&b));
    let data = pseudo_random(4 << 20, 14);
    let url_a = ta.create(data.len() as u64).await;
    let path = url_a.trim_start_matches(&a.base).to_string();
    let (tx, patch) = streaming_patch(&url_a, 0);
    tx.send(Bytes::copy_from_slice(&data[..1 << 20])).await.unwrap();
    wait_bytes_received(&a, 1 << 20).await;
    signal(&a, "STOP");
    // What A will find in its socket once it runs again: bytes that are not the file's.
    let garbage = tokio::spawn(async move {
        for _ in 0..16 {
            if tx.send(Bytes::from(vec![0xEE; 64 << 10])).await.is_err() {
                break;
            }
        }
        tx
    });
    // B takes the lease once A's expired, but A still has the blob file open on the shared
    // directory (it may be between its lease check and a write): B cannot write (503,
    // retryable, nothing written) until A lets go.
    let off = offset_when_free(&tb, &tb.abs(&path)).await;
    assert!(off <= 1 << 20);
    let r = tb.patch(&tb.abs(&path), off, data[off as usize..].to_vec(), &[]).await;
    assert_eq!(r.status(), 503, "B wrote to the file the paused writer still had open");
    assert_eq!(header_u64(&r, "upload-offset"), Some(off), "the 503 names the durable offset");
    signal(&a, "CONT");
    // A wakes with a stale lease and more bytes in its socket; end its request and let it try.
    let tx = tokio::time::timeout(Duration::from_secs(30), garbage).await.expect("A reads its socket again").unwrap();
    drop(tx);
    let late = tokio::time::timeout(Duration::from_secs(30), patch).await.expect("A's PATCH ends").unwrap();
    if let Ok(r) = late {
        assert_ne!(r.status(), 204, "the paused writer's PATCH must not succeed");
    }
    // A let go: B resumes from the durable offset and finishes.
    let off = offset_when_free(&tb, &tb.abs(&path)).await;
    assert!(off <= 1 << 20);
    let r = tb.patch(&tb.abs(&path), off, data[off as usize..].to_vec(), &[]).await;
    assert_eq!(r.status(), 204, "B finished the upload once A let go");
    let want = sha256_hex(&data);
    assert_stored_sha256(&b, &path, &want).await;
    assert_stored_sha256(&a, &path, &want).await;
    assert_eq!(tb.offset(&tb.abs(&path)).await, data.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sweeping_and_running_tasks_never_run_a_task_twice_or_expire_a_finished_upload() {
    let db = TestDb::create().await;
    let blobs = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs.log");
    let running = dir.path().join("running");
    std::fs::create_dir_all(&running).unwrap();
    // mkdir is atomic: a second run of one task while the first is running finds the
    // directory and logs DOUBLE.
    let script = write_script(
        dir.path(),
        "probe.sh",
        &format!(
            "mkdir '{r}/'\"$FERRY_TASK_ID\" 2>/dev/null || echo \"DOUBLE $FERRY_TASK_ID\" >> '{log}'\n\
             echo \"start $FERRY_TASK_ID\" >> '{log}'\nsleep 0.1\necho out\nrmdir '{r}/'\"$FERRY_TASK_ID\"\n",
            r = running.display(),
            log = log.display()
        ),
    );
    let cfg = write_file(dir.path(), "ferry.toml", &format!("[commands.probe]\nprogram = \"{}\"\n", script.display()));
    let extra = ["--config", cfg.to_str().unwrap(), "--task-workers", "4", "--expire-after", "2s", "--sweep-interval", "100ms"];
    let (a, b) = (replica(&db, blobs.path(), &extra), replica(&db, blobs.path(), &extra));
    // Finished uploads, made on both replicas; the sweepers on both run every 100 ms.
    let mut files = Vec::new();
    for (i, s) in [&a, &b, &a, &b].into_iter().enumerate() {
        let data = pseudo_random(100_000 + i, 20 + i as u64);
        files.push((Api::new(s).upload(&data, "f.bin").await, sha256_hex(&data)));
    }
    // An unfinished upload with no progress: the sweepers expire it; when they have, the
    // finished ones (older than --expire-after by then) must still be whole.
    let idle = Tus::new(&a).create(1000).await;
    let (api_a, api_b) = (Api::new(&a), Api::new(&b));
    let mut tasks = Vec::new();
    for i in 0..40 {
        let api = if i % 2 == 0 { &api_a } else { &api_b };
        let v = api.start("command", r#"{"command":"probe"}"#).await;
        tasks.push(v["id"].as_str().unwrap().to_string());
    }
    for id in &tasks {
        let v = api_a.wait_status(id, "completed", 120).await;
        assert_eq!(v["runs"], 1, "task {id} ran once: {v}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("DOUBLE"), "a task ran twice at the same time:\n{text}");
    for id in &tasks {
        assert_eq!(text.lines().filter(|l| *l == format!("start {id}")).count(), 1, "task {id} started once:\n{text}");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while Tus::new(&b).head(&idle.replace(&a.base, &b.base)).await.status() == 200 {
        assert!(Instant::now() < deadline, "the idle upload never expired: the sweepers are not running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (id, sha) in &files {
        for s in [&a, &b] {
            assert_eq!(sha256_hex(&Api::new(s).download(id).await), *sha, "finished upload {id} survived both sweepers");
        }
    }
}

/// Three replicas behind a per-request round-robin balancer (tests/common/balancer.rs), no
/// sticky sessions: an MCP client that opens a session (the rmcp client's `initialize`, MCP
/// before 2026-07-28) has its consecutive calls served by different replicas. The session's
/// state — the client's capabilities, which decide that a job tool answers with a native task —
/// comes from the catalog wherever the call lands (src/mcp/sessions.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_calls_of_one_session_are_served_by_every_replica() {
    use rmcp::model::*;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;
    use serde_json::{json, Value};

    let db = TestDb::create().await;
    let blobs = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let public = format!("http://{}", listener.local_addr().unwrap());
    // Every replica declares the same commands (tests/clients/mcp-ts/call_tool.mjs runs `export_fail`).
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = cfg_dir.path().join("ferry.toml");
    std::fs::write(&cfg, "[commands.fail]\nprogram = \"/bin/false\"\n").unwrap();
    let cfg = cfg.to_str().unwrap().to_string();
    let servers: Vec<Server> = (0..3).map(|_| replica(&db, blobs.path(), &["--public-url", &public, "--config", &cfg])).collect();
    let proxy = balancer::RoundRobin::serve(listener, &servers.iter().map(|s| s.base.clone()).collect::<Vec<_>>());

    let caps = ClientCapabilities::builder().enable_tasks().build();
    let transport = StreamableHttpClientTransport::from_config(StreamableHttpClientTransportConfig::with_uri(proxy.url("/mcp")));
    let c =
        ClientConfig::new(caps, Implementation::new("ferry-replica-tests", "0")).serve(transport).await.expect("MCP session through the balancer");
    let call = |name: &'static str, args: Value| {
        let c = &c;
        async move {
            let Value::Object(a) = args else { unreachable!() };
            let r = c.call_tool(CallToolRequestParams::new(name).with_arguments(a)).await.unwrap_or_else(|e| panic!("{name}: {e}"));
            let v = r.structured_content.expect("structuredContent");
            assert_ne!(r.is_error, Some(true), "{name} failed: {v}");
            v
        }
    };
    // A file uploaded to its signed URL (through the balancer too), then looked at by every replica.
    let data = pseudo_random(700_000, 31);
    let begin = call("file_upload_begin", json!({ "name": "r.bin", "size": data.len() })).await;
    let url = begin["upload_url"].as_str().unwrap();
    assert!(url.starts_with(&public), "signed URLs name the balancer (--public-url): {url}");
    let r = client()
        .patch(url)
        .header("Tus-Resumable", "1.0.0")
        .header("Content-Type", OCTET)
        .header("Upload-Offset", "0")
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let id = begin["file"]["id"].as_str().unwrap().to_string();
    for _ in 0..3 {
        let st = call("file_status", json!({ "file_id": id })).await;
        assert_eq!(st["file"]["sha256"], sha256_hex(&data).as_str(), "{st}");
    }
    // A job tool: the client declared the tasks extension at initialize, on one replica only.
    for round in 0..3 {
        let Value::Object(a) = json!({ "file_ids": [id], "format": "tar", "name": format!("r{round}.tar") }) else { unreachable!() };
        let created = match c.peer().call_tool_once(CallToolRequestParams::new("archive_files").with_arguments(a)).await.unwrap() {
            CallToolResponse::Task(t) => t,
            other => panic!("round {round}: expected a CreateTaskResult (the session's capabilities), got {other:?}"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let done = loop {
            let t = c.peer().get_task(GetTaskParams::new(created.task.task_id.clone())).await.expect("tasks/get").task;
            if t.status() != TaskStatus::Working {
                break t;
            }
            assert!(Instant::now() < deadline, "task still working after 60 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(matches!(done.payload, TaskPayload::Completed { .. }), "round {round}: {done:?}");
    }
    c.cancel().await.unwrap();

    let posts: Vec<_> = proxy.served().into_iter().filter(|s| s.path.starts_with("/mcp") && s.method == "POST").collect();
    assert!(posts.iter().all(|s| s.status < 400), "every MCP request succeeded: {posts:?}");
    let replicas: std::collections::BTreeSet<usize> = posts.iter().map(|s| s.replica).collect();
    assert_eq!(replicas.len(), 3, "the session's calls went to every replica: {posts:?}");

    // The TypeScript SDK (MCP 2025-11-25, sessions) through the same balancer.
    let dir = manifest_dir().join("tests/clients/mcp-ts");
    assert!(
        dir.join("node_modules/@modelcontextprotocol/sdk/package.json").exists(),
        "tests/clients/mcp-ts/node_modules is not installed: run .ci/run"
    );
    let before = proxy.served().len();
    let node = std::env::var_os("FERRY_NODE").unwrap_or_else(|| "node".into());
    let mut cmd = loopback_command(node);
    cmd.current_dir(&dir).arg(dir.join("call_tool.mjs")).arg(proxy.url("/mcp"));
    let v = run_json_client(cmd, 120).await;
    assert_eq!(v["protocol"], "2025-11-25", "{v}");
    assert_eq!(v["ok"]["size"], 3, "{v}");
    let ts: Vec<_> = proxy.served().into_iter().skip(before).filter(|s| s.path.starts_with("/mcp") && s.method == "POST").collect();
    assert_eq!(ts.iter().map(|s| s.replica).collect::<std::collections::BTreeSet<_>>().len(), 3, "{ts:?}");
}

/// Issue 25 item 5: a `task_get` long-poll on one replica wakes when another replica changes the
/// task, through the outbox head (the change commits an event; each replica's head watcher
/// sees it), not through a poll: the long-poll's budget (8 s) is shorter than the waiter's
/// fallback poll (`ferry::events::WAIT_FALLBACK`, 10 s), and a long-poll that nothing woke
/// answers with what it last read. So `completed` in the answer can only come from the wake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_on_one_replica_wakes_when_another_replica_ends_the_task() {
    use rmcp::model::*;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;
    use serde_json::{json, Value};

    const WAIT_MS: u64 = 8_000;
    assert!(Duration::from_millis(WAIT_MS) < ferry::events::WAIT_FALLBACK, "the budget must end before the fallback poll");
    let db = TestDb::create().await;
    let blobs = tempfile::tempdir().unwrap();
    let (a, b) = (replica(&db, blobs.path(), &[]), replica(&db, blobs.path(), &[]));
    let task = Api::new(&a).start("external", r#"{"job":"wake"}"#).await;
    let id = task["id"].as_str().unwrap().to_string();
    assert_eq!(task["status"], "working", "{task}");

    let transport = StreamableHttpClientTransport::from_config(StreamableHttpClientTransportConfig::with_uri(a.url("/mcp")));
    let c = ClientConfig::new(ClientCapabilities::default(), Implementation::new("ferry-replica-tests", "0"))
        .serve(transport)
        .await
        .expect("MCP on replica A");
    let Value::Object(args) = json!({ "task_id": id, "wait_ms": WAIT_MS }) else { unreachable!() };
    let poll = tokio::spawn(async move {
        let r = c.call_tool(CallToolRequestParams::new("task_get").with_arguments(args)).await.expect("task_get");
        let _ = c.cancel().await;
        r.structured_content.expect("structuredContent")
    });
    // Let the long-poll make its first read (if it has not, it reads `completed` at once and the
    // test proves less, but never fails for it), then end the task on replica B.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = Api::new(&b).post(&format!("/api/v1/tasks/{id}/complete"), r#"{"result":{"rows":1}}"#).await;
    assert_eq!(r.status(), 200, "complete on replica B");
    let got = poll.await.unwrap();
    assert_eq!(got["status"], "completed", "the long-poll on A was woken by B's change within its budget: {got}");
}

/// Issue 48 kind 1: tus-js-client (Node, the whole file in one PATCH, retries on) through a
/// round-robin balancer in front of two replicas, its upload taken over mid-PATCH three times
/// by a HEAD on the replica not holding it. Each time the PATCH still sending gets its 423
/// through the balancer, and the client resumes; the upload finishes whole. (The replica used
/// to close the connection with the rest of the body unread: the reset destroyed the 423 on
/// its way and tus-js-client hung, neither succeeding nor failing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tus_js_client_through_a_balancer_finishes_an_upload_taken_over_mid_patch() {
    use common::balancer::RoundRobin;
    let db = TestDb::create().await;
    let blobs = tempfile::tempdir().unwrap();
    // A long lease: only a release request (a HEAD on the other replica) frees it in time.
    let servers = [replica_with_lease(&db, blobs.path(), "60s", &[]), replica_with_lease(&db, blobs.path(), "60s", &[])];
    let lb = RoundRobin::start(&[servers[0].base.clone(), servers[1].base.clone()]).await;
    lb.slow_request_bodies(Duration::from_millis(4));
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random(40 << 20, 48);
    let file = dir.path().join("taken-over.bin");
    std::fs::write(&file, &data).unwrap();
    let options = r#"{"chunkSize":null,"retryDelays":[0,100,200,400,800,1000,1000,1000,1000,1000]}"#;
    let client = tokio::spawn(run_json_client(node_script("tus_options.js", &[&lb.base, file.to_str().unwrap(), options]), 180));
    let mut takeovers = 0;
    let mut seen: Option<(usize, String, u64)> = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    while takeovers < 3 && !client.is_finished() {
        assert!(Instant::now() < deadline, "no PATCH to take over within two minutes ({takeovers} taken over)");
        tokio::time::sleep(Duration::from_millis(10)).await;
        let Some((holder, path)) = lb.in_flight_paths("PATCH").into_iter().next() else { continue };
        let received = bytes_received(&servers[holder]).await;
        match &seen {
            Some((h, p, at)) if *h == holder && *p == path => {
                // This PATCH has sent 2 MiB more: take its upload over from the other replica.
                if received >= at + (2 << 20) {
                    let other = &servers[1 - holder];
                    let path_only = path.split('?').next().unwrap();
                    let r = Tus::new(other).head(&other.url(path_only)).await;
                    if r.status() == 200 {
                        takeovers += 1;
                    }
                    seen = None;
                    // Wait for this PATCH to end before looking for the next one.
                    let ended = Instant::now() + Duration::from_secs(30);
                    while lb.in_flight_paths("PATCH").iter().any(|(h, p)| *h == holder && *p == path) {
                        assert!(Instant::now() < ended, "the PATCH taken over on replica {holder} never ended");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            _ => seen = Some((holder, path, received)),
        }
    }
    let out = client.await.unwrap();
    assert_eq!(takeovers, 3, "the upload was taken over mid-PATCH three times: {out}");
    let locked = lb.served().iter().filter(|r| r.method == "PATCH" && r.status == 423).count();
    assert!(locked >= 3, "each PATCH taken over was answered 423 through the balancer: {:?}", lb.served());
    assert!(out["patches"].as_u64().unwrap() >= 4, "tus-js-client resumed after each 423: {out}");
    let url = out["url"].as_str().unwrap();
    let path = &url[url.find("/files/").unwrap()..];
    assert_stored_sha256(&servers[0], &servers[0].url(path), &sha256_hex(&data)).await;
}
