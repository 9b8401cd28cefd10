//! The bytes quota under concurrency (issue 23 item 7): concurrent deferred-length PATCHes
//! (bodies of known and of unknown length), length declarations and task files of one
//! principal — on one server (SQLite) and spread over two replicas of one PostgreSQL catalog —
//! never together store more than `max_bytes`. Room is reserved in the catalog under the lock
//! creation takes, before any byte is accepted.

mod common;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use common::pg::TestDb;
use common::*;

const QUOTA: u64 = 1 << 20;
const LIMITS: &str = "[limits]\nmax_bytes = \"1MiB\"\n";

/// A PATCH whose body is fed by the test: nothing arrives until the test sends it, so every
/// PATCH of a round has started (and asked for its room) before any byte is stored. `length`
/// sets `Content-Length`; `None` streams it chunked.
fn held_patch(url: &str, length: Option<u64>) -> (tokio::sync::mpsc::Sender<Bytes>, tokio::task::JoinHandle<reqwest::Response>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let body = reqwest::Body::wrap_stream(futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok::<_, std::io::Error>))));
    let mut req = client().patch(url).header("Tus-Resumable", "1.0.0").header("Content-Type", OCTET).header("Upload-Offset", "0");
    if let Some(l) = length {
        req = req.header("Content-Length", l.to_string());
    }
    let req = req.body(body);
    (tx, tokio::spawn(async move { req.send().await.expect("PATCH answered") }))
}

/// Deferred-length uploads, created alternately on `servers`; their URLs on the server that
/// will PATCH them (the next one), so writers spread over every replica.
async fn deferred(servers: &[&Server], n: usize) -> Vec<String> {
    let mut urls = Vec::new();
    for i in 0..n {
        let t = Tus::new(servers[i % servers.len()]);
        let r = t.post(&[("Upload-Defer-Length", "1")]).await;
        assert_eq!(r.status(), 201);
        let path = header(&r, "location").unwrap().to_string();
        urls.push(Tus::new(servers[(i + 1) % servers.len()]).abs(&path));
    }
    urls
}

/// What the principal stores: the offset (or length) of every upload it has, as HEAD reads them.
async fn stored(server: &Server) -> u64 {
    let files = json(client().get(server.url("/api/v1/files?limit=1000")).send().await.unwrap()).await;
    files["files"].as_array().unwrap().iter().map(|f| f["size"].as_u64().unwrap_or_else(|| f["offset"].as_u64().unwrap())).sum()
}

/// Four rounds of the same race, each on fresh uploads: four deferred-length PATCHes of a whole
/// quota each (Content-Length known), then four streamed chunked, then four length
/// declarations, then a task file beside two PATCHes. Each round may fill the quota, never pass
/// it; between rounds the files are deleted.
async fn race(servers: &[&Server]) {
    let api = Api::new(servers[0]);
    let data = Bytes::from(pseudo_random(QUOTA as usize, 7));
    for chunked in [false, true] {
        let urls = deferred(servers, 4).await;
        let held: Vec<_> = urls.iter().map(|u| held_patch(u, (!chunked).then_some(QUOTA))).collect();
        // Every PATCH has started before any byte is sent.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut answers = Vec::new();
        for (tx, answer) in held {
            let d = data.clone();
            tokio::spawn(async move {
                for piece in d.chunks(64 << 10) {
                    if tx.send(Bytes::copy_from_slice(piece)).await.is_err() {
                        break;
                    }
                }
            });
            answers.push(answer);
        }
        let mut statuses = Vec::new();
        for a in answers {
            statuses.push(a.await.unwrap().status().as_u16());
        }
        let total = stored(servers[0]).await;
        assert!(
            total <= QUOTA,
            "{} PATCHes (chunked: {chunked}) stored {total} bytes, {:.2}x the quota of {QUOTA}: {statuses:?}",
            urls.len(),
            total as f64 / QUOTA as f64
        );
        assert!(statuses.iter().all(|s| *s == 204 || *s == 507), "{statuses:?}");
        assert!(statuses.contains(&507), "some were refused: {statuses:?}");
        clear(servers[0]).await;
    }
    // Length declarations: each declares 700 KiB at once; at most one fits.
    let urls = deferred(servers, 4).await;
    let declared = futures::future::join_all(urls.iter().map(|u| async move {
        client()
            .patch(u)
            .header("Tus-Resumable", "1.0.0")
            .header("Content-Type", OCTET)
            .header("Upload-Offset", "0")
            .header("Upload-Length", (700u64 << 10).to_string())
            .body(Vec::new())
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }))
    .await;
    assert_eq!(declared.iter().filter(|s| **s == 204).count(), 1, "one 700 KiB length fits a 1 MiB quota: {declared:?}");
    assert!(stored(servers[0]).await <= QUOTA);
    clear(servers[0]).await;
    // A task's file (a tar of an 400 KiB input) beside two PATCHes that want the rest and more.
    let input = api.upload(&data[..400 << 10], "in.bin").await;
    let urls = deferred(servers, 2).await;
    let held: Vec<_> = urls.iter().map(|u| held_patch(u, Some(QUOTA / 2))).collect();
    let task = api.start("archive", &format!("{{\"file_ids\":[\"{input}\"],\"format\":\"tar\"}}")).await;
    for (tx, _) in &held {
        for piece in data[..(QUOTA / 2) as usize].chunks(64 << 10) {
            let _ = tx.send(Bytes::copy_from_slice(piece)).await;
        }
    }
    for (_, a) in held {
        let st = a.await.unwrap().status().as_u16();
        assert!(st == 204 || st == 507, "{st}");
    }
    let t = api
        .wait_for(task["id"].as_str().unwrap(), 60, "a terminal status", |t| ["completed", "failed"].contains(&t["status"].as_str().unwrap_or("")))
        .await;
    let total = stored(servers[0]).await;
    assert!(total <= QUOTA, "the input, a task file and two PATCHes stored {total} bytes, past the quota of {QUOTA} (task {})", t["status"]);
}

/// Delete every file of the (only) principal.
async fn clear(server: &Server) {
    let files = json(client().get(server.url("/api/v1/files?limit=1000")).send().await.unwrap()).await;
    for f in files["files"].as_array().unwrap() {
        let id = f["id"].as_str().unwrap();
        let r = client().delete(server.url(&format!("/files/{id}"))).header("Tus-Resumable", "1.0.0").send().await.unwrap();
        assert_eq!(r.status(), 204, "DELETE {id}");
    }
}

fn config(dir: &Path) -> String {
    write_file(dir, "ferry.toml", LIMITS).to_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_on_one_server_never_pass_the_bytes_quota() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let s = Server::start(&["--config", &cfg]);
    race(&[&s]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_on_two_postgres_replicas_never_pass_the_bytes_quota() {
    let db = TestDb::create().await;
    let blobs = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let args = ["--config", &cfg, "--catalog", db.url.as_str(), "--blobs", blobs.path().to_str().unwrap(), "--leases", "catalog"];
    let (a, b) = (Server::start(&args), Server::start(&args));
    race(&[&a, &b]).await;
}
