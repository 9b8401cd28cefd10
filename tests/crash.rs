//! `kill -9` at random moments during a chunked upload of 256 MiB, 20 rounds: after every
//! restart HEAD never reports more than the durable, correct bytes, acknowledged bytes are
//! never lost, and the finished download's sha256 equals the source's. And what a `kill -9`
//! during creations leaves: blobs no row names are removed, every upload kept.

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use std::time::Duration;

const LEN: usize = 256 << 20;
const CHUNK: usize = 16 << 20;

/// Body bytes this server process has received (`ferry_bytes_received_total`; 0 if unreadable).
async fn received(s: &Server) -> u64 {
    let Ok(r) = client().get(s.url("/metrics")).send().await else { return 0 };
    let text = r.text().await.unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix("ferry_bytes_received_total ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Upload from the server's offset in CHUNK-sized PATCHes until done or an error; returns the
/// highest acknowledged offset.
async fn upload_from(t: &Tus, url: &str, data: &[u8], acked: &std::sync::atomic::AtomicU64) {
    let Ok(r) = t.c.head(url).header("Tus-Resumable", "1.0.0").send().await else { return };
    let mut off: usize = match r.headers().get("upload-offset") {
        Some(v) => v.to_str().unwrap().parse().unwrap(),
        None => return,
    };
    while off < data.len() {
        let end = (off + CHUNK).min(data.len());
        let body = bytes::Bytes::copy_from_slice(&data[off..end]);
        let r =
            t.c.patch(url)
                .header("Tus-Resumable", "1.0.0")
                .header("Content-Type", OCTET)
                .header("Upload-Offset", off.to_string())
                .body(body)
                .send()
                .await;
        match r {
            Ok(r) if r.status() == 204 => {
                off = r.headers()["upload-offset"].to_str().unwrap().parse().unwrap();
                acked.fetch_max(off as u64, std::sync::atomic::Ordering::SeqCst);
            }
            _ => return,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_kill9_rounds_during_a_256mib_upload() {
    let data = pseudo_random(LEN, 0xC0FFEE);
    let source_sha = sha256_hex(&data);
    // Checkpoints inside each 16 MiB PATCH too, so kills land between and within them.
    let args = ["--checkpoint-every", "4MiB"];
    let mut s = Server::start(&args);
    let t = Tus::new(&s);
    let url = t.create(LEN as u64).await;
    let path = url.trim_start_matches(&s.base).to_string();
    let id = path.rsplit('/').next().unwrap().to_string();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut offsets = Vec::new();

    for round in 0..20 {
        let t = Tus::new(&s);
        let u = t.abs(&path);
        let d = data.clone();
        let a = acked.clone();
        let client = tokio::spawn(async move { upload_from(&t, &u, &d, &a).await });
        // Kill once this process has received a random 1-20 MiB: the kill lands mid-upload
        // however fast this machine is (the deadline only guards against a stuck client).
        let target: u64 = rng.random_range(1..=20) << 20;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !client.is_finished() && tokio::time::Instant::now() < deadline && received(&s).await < target {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        s.kill9();
        let _ = client.await;
        s.restart();

        // The recorded offset covers only correct bytes. Bytes past it (written after the last
        // checkpoint) may still be on disk: they are garbage that the next writer's lease
        // repairs (recovery by the taker, not a blanket start-up pass), never data.
        let t = Tus::new(&s);
        let off = t.offset(&path).await;
        let stored = s.blob_len(&id).await.expect("the blob exists");
        assert!(stored >= off, "round {round}: the blob holds the recorded offset");
        assert!(s.blob_bytes(&id, 0..off).await == data[..off as usize], "round {round}: HEAD offset {off} covers only correct bytes");
        let acked_now = acked.load(std::sync::atomic::Ordering::SeqCst);
        assert!(off >= acked_now, "round {round}: acknowledged offset {acked_now} lost (HEAD {off})");
        offsets.push(off);
        if off == LEN as u64 {
            break;
        }
    }
    eprintln!("offsets after each restart: {offsets:?}");
    assert!(offsets.len() >= 10, "too few rounds were interrupted: {offsets:?}");
    let t = Tus::new(&s);
    let u = t.abs(&path);
    upload_from(&t, &u, &data, &acked).await;
    assert_eq!(s.blob_len(&id).await, Some(LEN as u64), "the writer cut the garbage before appending");
    let r = t.c.get(&u).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let digest = r.headers()["repr-digest"].to_str().unwrap().to_string();
    let body = r.bytes().await.unwrap();
    assert_eq!(sha256_hex(&body), source_sha);
    use base64::Engine as _;
    assert_eq!(digest, format!("sha-256=:{}:", base64::engine::general_purpose::STANDARD.encode(hex::decode(&source_sha).unwrap())));
}

/// Issue 48: a creation makes its blob, then its row; a `kill -9` in between leaves a blob (S3:
/// a `.created` marker) no row names and nothing queued. Such a blob — planted here exactly as
/// that kill leaves it, and whatever a storm of creations cut by `kill -9` left — is removed
/// by a later sweep once it has had no row for the grace, while every upload whose creation
/// was answered keeps its blob.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_a_killed_creation_left_without_a_row_is_removed_and_uploads_keep_theirs() {
    let args = ["--sweep-interval", "1s"];
    let mut s = Server::start(&args);
    // Creations cut by kill -9 at once: some may stop between the blob and the row.
    let mut answered = Vec::new();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for round in 0..3u64 {
        let url = s.url("/files/");
        let posts: Vec<_> = (0..40).map(|_| http.post(&url).header("Tus-Resumable", "1.0.0").header("Upload-Length", "10").send()).collect();
        let all = futures::future::join_all(posts);
        tokio::pin!(all);
        let _ = tokio::time::timeout(Duration::from_millis(20 + 15 * round), &mut all).await;
        s.restart_with(&args);
        let ids = all.await.into_iter().flatten().filter(|r| r.status() == 201);
        answered.extend(
            ids.filter_map(|r| r.headers().get("location").and_then(|l| l.to_str().ok()).and_then(|l| l.rsplit('/').next()).map(str::to_string)),
        );
    }
    let t = Tus::new(&s);
    let kept = t.create(10).await;
    answered.push(kept.rsplit('/').next().unwrap().to_string());
    let store = s.blob_store();
    let stray = "strays7rays7rays7rays7rays";
    store.create(stray).await.unwrap();
    let listed = |store: std::sync::Arc<dyn ferry::blob::BlobStore>| async move { store.inventory().await.unwrap().blobs };
    assert!(listed(store.clone()).await.contains(&stray.to_string()));
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    while listed(store.clone()).await.contains(&stray.to_string()) {
        assert!(std::time::Instant::now() < deadline, "the blob no row names was never removed");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let now = listed(store.clone()).await;
    for id in &answered {
        assert!(now.contains(id), "upload {id}, whose creation was answered, keeps its blob");
    }
    // Whatever is left has a row: HEAD knows every id.
    for id in now.iter().filter(|id| ferry::upload::is_valid_id(id)) {
        let r = t.request("HEAD", &format!("/files/{id}"), &[("Tus-Resumable", "1.0.0")], None).await;
        assert_ne!(r.status(), 404, "{id} is stored but no upload names it");
    }
}
