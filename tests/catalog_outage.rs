//! A PostgreSQL catalog that goes away mid-run (issue 10, DESIGN §9): requests get
//! `503 unavailable` with `retryable: true`, no acknowledged byte is lost, and ferry serves
//! again by itself once the database is back. The outage is a loopback TCP proxy between ferry
//! and PostgreSQL that the test cuts (connections reset, new ones refused) and restores on the
//! same port — what a network partition or a database restart looks like to ferry.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::pg::TestDb;
use common::proxy::TcpProxy;
use common::*;

/// A fresh test database reached through a loopback proxy the test can cut: (the database,
/// kept alive by the caller; the proxy; the catalog URL through it).
async fn proxied_catalog() -> (TestDb, TcpProxy, url::Url) {
    let db = TestDb::create().await;
    let mut url = url::Url::parse(&db.url).unwrap();
    let target: SocketAddr =
        format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432)).parse().expect("FERRY_TEST_PG names an IP address");
    let proxy = TcpProxy::start(target).await;
    url.set_port(Some(proxy.port)).unwrap();
    (db, proxy, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_that_goes_away_gives_503_and_ferry_recovers_when_it_returns() {
    let (_db, mut proxy, url) = proxied_catalog().await;
    let s = Server::start(&["--catalog", url.as_str()]);
    let tus = Tus::new(&s);
    let data = pseudo_random(1 << 20, 21);
    let upload = tus.create(data.len() as u64).await;
    assert_eq!(tus.patch(&upload, 0, data[..400_000].to_vec(), &[]).await.status(), 204);

    proxy.cut().await;
    // Creation and append are refused as retryable, never as an internal error.
    let p = problem(tus.post(&[("Upload-Length", "10")]).await, 503, "unavailable").await;
    assert_eq!(p["retryable"], true, "{p}");
    let r = tus.patch(&upload, 400_000, data[400_000..].to_vec(), &[]).await;
    assert!(r.headers().contains_key("retry-after"), "{:?}", r.headers());
    let p = problem(r, 503, "unavailable").await;
    assert_eq!(p["retryable"], true, "{p}");
    let ready = client().get(s.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503, "readyz says the catalog is away");

    proxy.restore().await;
    // Back by itself: the offset is what was acknowledged, and the upload completes.
    let offset = offset_once_back(&tus, &upload).await;
    assert_eq!(offset, 400_000, "no acknowledged byte lost, nothing unacknowledged kept");
    assert_eq!(tus.patch(&upload, 400_000, data[400_000..].to_vec(), &[]).await.status(), 204);
    assert_eq!(tus.download(&upload).await, data);
    assert_eq!(tus.post(&[("Upload-Length", "10")]).await.status(), 201);
}

/// A database that stops answering without closing its connections (a partition where packets
/// vanish, a stalled proxy; a three-replica break-it run saw requests held 25 and 90 s). A PATCH
/// is checkpointing every 64 KiB when the database goes silent, so its next statements go to a
/// connection in use, with no ping before them: it is answered `503 unavailable` (retryable)
/// while the database is still silent — every catalog call has a deadline — not held for the
/// outage. Once the database answers again, the checkpoints held meanwhile reach it and are
/// committed after the PATCH was answered: the bytes they cover were kept (not released as a
/// failed write's are), so the upload resumes from the offset HEAD gives — without them, the
/// next PATCH found the file shorter than its checkpoint and was refused — and the file is
/// exactly what was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_that_stops_answering_is_reported_not_waited_out() {
    let (_db, proxy, url) = proxied_catalog().await;
    let s = Server::start(&["--catalog", url.as_str(), "--checkpoint-every", "64KiB"]);
    let tus = Tus::new(&s);
    let data = pseudo_random(1 << 20, 25);
    let upload = tus.create(data.len() as u64).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(1);
    let body = reqwest::Body::wrap_stream(futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok::<_, std::io::Error>))));
    let patch = client()
        .patch(&upload)
        .header("Tus-Resumable", "1.0.0")
        .header("Content-Type", OCTET)
        .header("Upload-Offset", "0")
        .header("Content-Length", data.len().to_string())
        .body(body)
        .send();
    let patch = tokio::spawn(patch);
    let sender = {
        let data = data.clone();
        tokio::spawn(async move {
            for (i, piece) in data.chunks(64 << 10).enumerate() {
                if i == 6 {
                    // The database goes silent while the PATCH checkpoints.
                    proxy.hang(true);
                }
                if tx.send(bytes::Bytes::copy_from_slice(piece)).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            proxy
        })
    };
    // The database stays silent for up to 120 s; the PATCH must be answered before that.
    let answered = match tokio::time::timeout(Duration::from_secs(120), patch).await {
        Ok(r) => r.unwrap().unwrap_or_else(|e| panic!("the PATCH was not answered while the database was silent: {e}")),
        Err(_) => panic!("the PATCH was held for the whole outage"),
    };
    let proxy = sender.await.unwrap();
    let p = problem(answered, 503, "unavailable").await;
    assert_eq!(p["retryable"], true, "{p}");
    let create =
        tokio::time::timeout(Duration::from_secs(120), tus.post(&[("Upload-Length", "10")])).await.expect("a creation was held for the whole outage");
    problem(create, 503, "unavailable").await;
    proxy.hang(false);
    let offset = offset_once_back(&tus, &upload).await;
    assert!(offset <= data.len() as u64, "HEAD after the outage: {offset}");
    if offset < data.len() as u64 {
        assert_eq!(tus.patch(&upload, offset, data[offset as usize..].to_vec(), &[]).await.status(), 204);
    }
    assert_eq!(tus.download(&upload).await, data);
}

/// The database itself refuses ferry (`ALLOW_CONNECTIONS false`, its connections ended: "database
/// … is not currently accepting connections", SQLSTATE 55000) — as an administrator closing it
/// for maintenance does. Requests get `503 unavailable`, retryable, not `500 internal`; once it
/// accepts connections again the upload resumes from the acknowledged offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_refuses_connections_gives_503_and_ferry_recovers() {
    use sqlx::{Connection, Executor};
    let db = TestDb::create().await;
    let s = Server::start(&["--catalog", db.url.as_str()]);
    let tus = Tus::new(&s);
    let data = pseudo_random(1 << 20, 22);
    let upload = tus.create(data.len() as u64).await;
    assert_eq!(tus.patch(&upload, 0, data[..400_000].to_vec(), &[]).await.status(), 204);

    let mut admin = sqlx::PgConnection::connect(&common::pg::admin_url()).await.unwrap();
    admin.execute(sqlx::AssertSqlSafe(format!("ALTER DATABASE \"{}\" ALLOW_CONNECTIONS false", db.name))).await.unwrap();
    assert!(common::pg::terminate_backends(&db.name).await >= 1, "ferry had connections");
    // The first requests may meet the pool's ended connections; the later ones open new ones,
    // which the database refuses: every answer is a 503.
    for i in 0..12 {
        let r = tus.head(&upload).await;
        assert_eq!(r.status(), 503, "HEAD {i} while the database refuses connections");
        assert!(r.headers().contains_key("retry-after"), "{:?}", r.headers());
    }
    let r = tus.patch(&upload, 400_000, data[400_000..].to_vec(), &[]).await;
    let p = problem(r, 503, "unavailable").await;
    assert_eq!(p["retryable"], true, "{p}");
    let p = problem(tus.post(&[("Upload-Length", "10")]).await, 503, "unavailable").await;
    assert_eq!(p["retryable"], true, "{p}");
    assert!(catalog_reason(&s).await.contains("not currently accepting connections"));

    admin.execute(sqlx::AssertSqlSafe(format!("ALTER DATABASE \"{}\" ALLOW_CONNECTIONS true", db.name))).await.unwrap();
    let offset = offset_once_back(&tus, &upload).await;
    assert_eq!(offset, 400_000, "no acknowledged byte lost, nothing unacknowledged kept");
    // The refused PATCH's lease is given back or runs out: the upload completes.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let st = tus.patch(&upload, 400_000, data[400_000..].to_vec(), &[]).await.status();
        if st == 204 {
            break;
        }
        assert!(st == 423 || st == 503, "PATCH after the database came back: {st}");
        assert!(Instant::now() < deadline, "the upload never resumed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(tus.download(&upload).await, data);
}

/// A database at its connection limit (`CONNECTION LIMIT 0`, SQLSTATE 53300): the pool keeps
/// retrying such a refusal until its wait runs out, so its own error only says it timed out.
/// `/readyz` names the cause all the same, within its 3 s bound, and ferry recovers once the
/// limit is lifted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_connection_limit_the_database_enforces() {
    use sqlx::{Connection, Executor};
    let db = TestDb::create().await;
    let s = Server::start(&["--catalog", db.url.as_str()]);
    let tus = Tus::new(&s);
    let upload = tus.create(10).await;
    let mut admin = sqlx::PgConnection::connect(&common::pg::admin_url()).await.unwrap();
    admin.execute(sqlx::AssertSqlSafe(format!("ALTER DATABASE \"{}\" CONNECTION LIMIT 0", db.name))).await.unwrap();
    assert!(common::pg::terminate_backends(&db.name).await >= 1, "ferry had connections");
    // Every probe names the limit, the first ones too (which meet pooled connections the
    // termination ended), each within readyz's bound.
    for probe in 0..4 {
        let asked = Instant::now();
        let reason = catalog_reason(&s).await;
        assert!(reason.contains("too many connections"), "probe {probe}: {reason}");
        assert!(asked.elapsed() < Duration::from_secs(4), "probe {probe} answered within readyz's bound: {:?}", asked.elapsed());
    }
    admin.execute(sqlx::AssertSqlSafe(format!("ALTER DATABASE \"{}\" CONNECTION LIMIT -1", db.name))).await.unwrap();
    assert_eq!(offset_once_back(&tus, &upload).await, 0);
}

/// `/readyz` answers 503, and the reason its catalog check gives.
async fn catalog_reason(s: &Server) -> String {
    let ready = client().get(s.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503, "readyz while the database refuses connections");
    let body: serde_json::Value = ready.json().await.unwrap();
    let check = body["checks"].as_array().unwrap().iter().find(|c| c["store"] == "catalog").cloned().unwrap_or_default();
    check["reason"].as_str().unwrap_or_else(|| panic!("no catalog reason in {body}")).to_string()
}

/// The upload's offset from the first HEAD answered 200 once the catalog is back (90 s at most).
async fn offset_once_back(tus: &Tus, upload: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let r = tus.head(upload).await;
        if r.status() == 200 {
            return header_u64(&r, "upload-offset").unwrap();
        }
        assert!(Instant::now() < deadline, "ferry never recovered: HEAD answers {}", r.status());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A server stopped by SIGTERM lets PostgreSQL go quietly: its release-request listener (the
/// `LISTEN` connection of catalog leases) ends with the pool instead of reconnecting to a pool
/// that is closing — which held the exit for ≈ 5 s and logged "lost its connection;
/// reconnecting" every 500 ms until shutdown's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_the_release_listener_without_reconnecting() {
    let db = TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    let mut s = common::logged::LoggedServer::start(&dir.path().join("data"), &["--catalog", db.url.as_str()]);
    // Serving: an upload written through a catalog lease, so the listener is in use.
    let c = client();
    let r = c.post(s.url("/files/")).header("Tus-Resumable", "1.0.0").header("Upload-Length", "3").send().await.unwrap();
    assert_eq!(r.status(), 201);
    let upload = r.headers()["location"].to_str().unwrap().to_string();
    let upload = if upload.starts_with("http") { upload } else { s.url(&upload) };
    let r = c
        .patch(&upload)
        .header("Tus-Resumable", "1.0.0")
        .header("Content-Type", OCTET)
        .header("Upload-Offset", "0")
        .body("abc")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let before = s.log().len();
    let (status, log) = s.terminate();
    assert!(status.success(), "exit {status}; log:\n{}", log.join("\n"));
    let noisy: Vec<&String> = log[before..].iter().filter(|l| l.contains("reconnecting") || l.contains("WARN") || l.contains("ERROR")).collect();
    assert!(noisy.is_empty(), "warnings at shutdown: {noisy:#?}");
}

/// A task whose run meets the catalog away for a moment (DESIGN §9: a database restart, a
/// network blip) is not failed for good: it keeps its output file and checkpoint, pauses, and
/// runs again from its checkpoint once the catalog answers. (Three replicas on a database that
/// went away for 1.5–3 s saw compress and archive tasks fail for good.) The command below writes
/// a line and a checkpoint, waits for the test to cut the catalog, then stores a partial result
/// — a catalog write that fails — and ends with a second line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waits_out_a_catalog_that_is_away_for_a_moment() {
    let (_db, mut proxy, url) = proxied_catalog().await;
    let dir = tempfile::tempdir().unwrap();
    let (waiting, go) = (dir.path().join("waiting"), dir.path().join("go"));
    let script = write_script(
        dir.path(),
        "two_lines.sh",
        &format!(
            r#"if [ -z "$FERRY_CHECKPOINT" ]; then
  echo "line 1"
  echo "checkpoint 7 one" >&2
  touch '{waiting}'
  while [ ! -f '{go}' ]; do sleep 0.05; done
fi
echo 'partial {{"after":"line 1"}}' >&2
echo "line 2"
"#,
            waiting = waiting.display(),
            go = go.display()
        ),
    );
    let cfg = write_file(dir.path(), "ferry.toml", &format!("[commands.two]\nprogram = \"{}\"\noutput_name = \"two.txt\"\n", script.display()));
    let mut s = common::logged::LoggedServer::start(&dir.path().join("data"), &["--catalog", url.as_str(), "--config", cfg.to_str().unwrap()]);
    let c = client();
    let t: serde_json::Value = c
        .post(s.url("/api/v1/tasks"))
        .json(&serde_json::json!({ "kind": "command", "args": { "command": "two" } }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tid = t["id"].as_str().unwrap_or_else(|| panic!("{t}")).to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !waiting.exists() {
        assert!(Instant::now() < deadline, "the command did not reach its wait in 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The checkpoint line was read before the wait began; give ferry a moment to store it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.cut().await;
    std::fs::write(&go, b"").unwrap();
    s.wait_log(&["task paused", "catalog or a store is unavailable"], 120);
    proxy.restore().await;
    let deadline = Instant::now() + Duration::from_secs(120);
    let v = loop {
        if let Ok(r) = c.get(s.url(&format!("/api/v1/tasks/{tid}"))).send().await {
            if let Ok(v) = r.json::<serde_json::Value>().await {
                if ["completed", "failed", "cancelled"].contains(&v["status"].as_str().unwrap_or("")) {
                    break v;
                }
            }
        }
        assert!(Instant::now() < deadline, "task {tid} not finished within 120 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(v["status"], "completed", "{v}");
    assert!(v["runs"].as_u64().unwrap() >= 2, "it ran again after the pause: {v}");
    let out = v["result"]["file"]["id"].as_str().unwrap_or_else(|| panic!("{v}"));
    let body = c.get(s.url(&format!("/files/{out}"))).send().await.unwrap().bytes().await.unwrap();
    assert_eq!(&body[..], b"line 1\nline 2\n", "the second run went on from the checkpoint");
}
