//! The real `ferry serve --blobs s3://…` when S3 fails (issue 11 "Bad input"): S3 cut off
//! mid-upload (a loopback TCP proxy that drops every connection and refuses new ones), S3
//! shedding load (a proxy answering `503 SlowDown`), and a bucket that refuses writes (moto
//! enforcing an IAM Deny of `s3:PutObject`). S3 away: the client gets `503 unavailable` with
//! `retryable: true`, `Retry-After` and the last durable offset; a bucket that refuses for good
//! (403): `502 store_refused`, not retryable, naming the status. Either way nothing acknowledged
//! is lost, `/readyz` reports the blob store down, and the upload resumes once S3 is back.

mod common;

use std::time::{Duration, Instant};

use common::moto::Moto;
use common::proxy::{complete_multipart_upload, every_request, HttpFaultProxy, TcpProxy};
use common::*;

const MIB: usize = 1 << 20;

/// Point this process's (and so ferry's) `AWS_*` at `moto`, through `endpoint`.
fn s3_env(moto: &Moto, endpoint: &str) {
    moto.set_env();
    // S3's smallest parts, so a few MiB make a multipart upload.
    std::env::set_var("FERRY_S3_PART_SIZE", "5MiB");
    std::env::set_var("AWS_ENDPOINT_URL", endpoint);
}

/// A 503 `unavailable` that says to retry, when, and from which offset.
async fn assert_unavailable(r: reqwest::Response, offset: Option<u64>) {
    if !r.headers().contains_key("retry-after") {
        let status = r.status();
        panic!("no Retry-After on a {status}: {}", r.text().await.unwrap_or_default());
    }
    let at = header_u64(&r, "upload-offset");
    let p = problem(r, 503, "unavailable").await;
    assert_eq!(p["retryable"], true, "{p}");
    if let Some(o) = offset {
        assert_eq!(at, Some(o), "Upload-Offset names the last durable offset: {p}");
        assert_eq!(p["partial"]["cursor"], o, "{p}");
    }
}

/// Wait until `/readyz` answers `status`; returns its body.
async fn wait_ready(s: &Server, status: u16) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = client().get(s.url("/readyz")).send().await.unwrap();
        if r.status() == status {
            return json(r).await;
        }
        assert!(Instant::now() < deadline, "/readyz never answered {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn blobs_check(ready: &serde_json::Value) -> serde_json::Value {
    ready["checks"].as_array().unwrap().iter().find(|c| c["store"] == "blobs").cloned().expect("a blobs check")
}

/// Nothing of `ids` is left in the bucket but their finished objects.
async fn assert_only_objects(moto: &Moto, bucket: &str, prefix: &str, ids: &[&str]) {
    assert_eq!(moto.multipart_uploads(bucket).await, Vec::<String>::new(), "no multipart upload left");
    let mut keys = moto.keys(bucket).await;
    keys.sort();
    let mut want: Vec<String> = ids.iter().map(|id| format!("{prefix}/{id}")).collect();
    want.sort();
    assert_eq!(keys, want, "only the finished objects remain");
}

fn id_of(url: &str) -> &str {
    url.rsplit('/').next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_cut_off_mid_upload_gives_503_and_the_upload_resumes_when_it_returns() {
    let moto = Moto::start("ferry", 5 * MIB as u64).await;
    let target = moto.endpoint.trim_start_matches("http://").parse().unwrap();
    let mut proxy = TcpProxy::start(target).await;
    s3_env(&moto, &proxy.http_url());
    // A sweep every second: it removes the bytes of an upload deleted while S3 was away.
    let s = Server::start(&["--blobs", "s3://ferry/up", "--sweep-interval", "1s"]);
    let tus = Tus::new(&s);
    let data = pseudo_random(12 * MIB + 123, 5);
    let url = tus.create(data.len() as u64).await;
    // One part (5 MiB) and a tail.
    let first = 6 * MIB + 7;
    assert_eq!(tus.patch(&url, 0, data[..first].to_vec(), &[]).await.status(), 204);
    let small = pseudo_random(300_000, 6);
    let done = tus.create(small.len() as u64).await;
    assert_eq!(tus.patch(&done, 0, small.clone(), &[]).await.status(), 204);

    // S3 goes away while a PATCH body streams in: 2 MiB have arrived, then the cut, then 4 MiB
    // more, which fill a part whose upload fails.
    let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    let req = tus
        .c
        .patch(&url)
        .header("Tus-Resumable", "1.0.0")
        .header("Content-Type", OCTET)
        .header("Upload-Offset", first.to_string())
        .body(reqwest::Body::wrap_stream(rx))
        .send();
    let pending = tokio::spawn(req);
    let received = bytes_received(&s).await;
    let mut sent = first;
    for chunk in data[first..first + 2 * MIB].chunks(256 * 1024) {
        futures::SinkExt::send(&mut tx, Ok(chunk.to_vec())).await.expect("the server reads the body");
        sent += chunk.len();
    }
    wait_bytes_received(&s, received + 2 * MIB as u64).await;
    proxy.cut().await;
    for chunk in data[sent..sent + 4 * MIB].chunks(256 * 1024) {
        // The server reads the rest of a body it refused, so its client reads the answer.
        if futures::SinkExt::send(&mut tx, Ok(chunk.to_vec())).await.is_err() {
            break;
        }
    }
    drop(tx);
    assert_unavailable(pending.await.unwrap().expect("an answer, not a reset connection"), Some(first as u64)).await;
    // A PATCH that fills the next part and one that would only add to the tail: both 503.
    assert_unavailable(tus.patch(&url, first as u64, data[first..first + 4 * MIB].to_vec(), &[]).await, Some(first as u64)).await;
    assert_unavailable(tus.patch(&url, first as u64, data[first..first + 1000].to_vec(), &[]).await, Some(first as u64)).await;
    // HEAD needs only the catalog: the acknowledged offset, nothing more.
    assert_eq!(tus.offset(&url).await, first as u64);
    // Creation, and reads of a finished upload: 503 too, never a 500.
    assert_unavailable(tus.post(&[("Upload-Length", "10")]).await, None).await;
    assert_unavailable(client().get(&done).send().await.unwrap(), None).await;
    assert_unavailable(client().get(&done).header("Range", "bytes=10-20").send().await.unwrap(), None).await;
    // Termination works: the row goes first and queues its bytes for removal in the same
    // transaction (issue 48), so nothing is left that no record names; the bytes go once S3
    // is back (below).
    assert_eq!(tus.request("DELETE", &done, &[("Tus-Resumable", "1.0.0")], None).await.status(), 204);
    assert_eq!(tus.head(&done).await.status(), 404);
    let ready = wait_ready(&s, 503).await;
    assert_eq!(blobs_check(&ready)["ok"], false, "{ready}");

    proxy.restore().await;
    wait_ready(&s, 200).await;
    assert_eq!(tus.offset(&url).await, first as u64, "no acknowledged byte lost, nothing unacknowledged kept");
    let mut at = first;
    for len in [4 * MIB, 1000, data.len() - first - 4 * MIB - 1000] {
        assert_eq!(tus.patch(&url, at as u64, data[at..at + len].to_vec(), &[]).await.status(), 204, "PATCH at {at}");
        at += len;
    }
    assert_stored_sha256(&s, &url, &sha256_hex(&data)).await;

    // S3 goes away in the middle of a download: the client gets every byte, or an error —
    // never a short body that ends as if it were complete.
    let mut r = client().get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header_u64(&r, "content-length"), Some(data.len() as u64));
    let mut got = Vec::new();
    while got.len() < MIB {
        got.extend_from_slice(&r.chunk().await.expect("first MiB").expect("more body"));
    }
    proxy.cut().await;
    let outcome = loop {
        match r.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    eprintln!("download cut off after {} of {} bytes: {outcome:?}", got.len(), data.len());
    match outcome {
        Ok(()) => assert!(got == data, "a body that ended cleanly is whole ({} of {} bytes)", got.len(), data.len()),
        Err(e) => assert!(got.len() < data.len(), "the cut was signalled: {e}"),
    }
    proxy.restore().await;
    wait_ready(&s, 200).await;
    // The sweeper removed what the DELETE during the outage could not.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while moto.keys("ferry").await.iter().any(|k| k.contains(id_of(&done))) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_only_objects(&moto, "ferry", "up", &[id_of(&url)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_answering_503_slowdown_gives_503_and_a_completion_it_interrupts_is_finished_by_the_next_reader() {
    let moto = Moto::start("ferry", 5 * MIB as u64).await;
    let proxy = HttpFaultProxy::start(&moto.endpoint).await;
    s3_env(&moto, &proxy.url);
    let mut s = Server::start(&["--blobs", "s3://ferry/up"]);
    let tus = Tus::new(&s);
    let data = pseudo_random(11 * MIB + 5, 7);
    let url = tus.create(data.len() as u64).await;
    let first = 6 * MIB + 7;
    assert_eq!(tus.patch(&url, 0, data[..first].to_vec(), &[]).await.status(), 204);

    // Every S3 request answered 503 SlowDown (after object_store's own bounded retries).
    proxy.set(Some(every_request()));
    assert_unavailable(tus.patch(&url, first as u64, data[first..first + 2 * MIB].to_vec(), &[]).await, Some(first as u64)).await;
    assert!(proxy.refused() > 0);
    let ready = wait_ready(&s, 503).await;
    assert_eq!(blobs_check(&ready)["ok"], false, "{ready}");
    proxy.set(None);
    wait_ready(&s, 200).await;
    assert_eq!(tus.offset(&url).await, first as u64);

    // Only CompleteMultipartUpload refused: complete, then commit — the last PATCH is not
    // acknowledged as done while the object cannot be read (503; every byte is durable, so
    // Upload-Offset is the end), and HEAD says "still finishing, ask again" (423 +
    // Retry-After), never Upload-Offset = Upload-Length.
    proxy.set(Some(complete_multipart_upload()));
    assert_unavailable(tus.patch(&url, first as u64, data[first..].to_vec(), &[]).await, Some(data.len() as u64)).await;
    assert_eq!(moto.multipart_uploads("ferry").await.len(), 1, "not completed yet");
    let head = tus.request("HEAD", &url, &[("Tus-Resumable", "1.0.0")], None).await;
    assert_eq!(head.status(), 423, "{:?}", head.headers());
    assert!(head.headers().contains_key("retry-after"));
    // Another process (a restart here; any replica) completes it on the first read.
    s.restart();
    assert_unavailable(client().get(s.url(&format!("/files/{}", id_of(&url)))).send().await.unwrap(), None).await;
    proxy.set(None);
    assert_stored_sha256(&s, &format!("/files/{}", id_of(&url)), &sha256_hex(&data)).await;
    assert_only_objects(&moto, "ferry", "up", &[id_of(&url)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_that_refuses_writes_is_named_to_the_client_and_the_upload_resumes_when_it_accepts_them() {
    let moto = Moto::start("ferry", 5 * MIB as u64).await;
    // moto enforcing IAM: ferry signs as a user that may use S3, until a Deny is added.
    let keys = run_json_client(python_script("moto_iam.py", &[&moto.endpoint, "setup"]), 60).await;
    let admin = [keys["admin"][0].as_str().unwrap(), keys["admin"][1].as_str().unwrap()];
    moto.set_env();
    std::env::set_var("AWS_ACCESS_KEY_ID", keys["ferry"][0].as_str().unwrap());
    std::env::set_var("AWS_SECRET_ACCESS_KEY", keys["ferry"][1].as_str().unwrap());
    let s = Server::start(&["--blobs", "s3://ferry/up"]);
    let tus = Tus::new(&s);
    let data = pseudo_random(8 * MIB + 99, 8);
    let url = tus.create(data.len() as u64).await;
    let first = 5 * MIB + 1;
    assert_eq!(tus.patch(&url, 0, data[..first].to_vec(), &[]).await.status(), 204);

    run_json_client(python_script("moto_iam.py", &[&moto.endpoint, "deny-writes", admin[0], admin[1]]), 60).await;
    // A refusal for good (issue 47: decided by status, 403): named, not retryable, nothing lost.
    for r in [tus.patch(&url, first as u64, data[first..].to_vec(), &[]).await, tus.post(&[("Upload-Length", "10")]).await] {
        let p = problem(r, 502, "store_refused").await;
        assert_eq!(p["retryable"], false, "{p}");
        assert!(p["detail"].as_str().unwrap().contains("403"), "the store's status is named: {p}");
    }
    let ready = wait_ready(&s, 503).await;
    assert_eq!(blobs_check(&ready)["ok"], false, "{ready}");
    assert_eq!(tus.offset(&url).await, first as u64);

    run_json_client(python_script("moto_iam.py", &[&moto.endpoint, "allow-writes", admin[0], admin[1]]), 60).await;
    wait_ready(&s, 200).await;
    assert_eq!(tus.patch(&url, first as u64, data[first..].to_vec(), &[]).await.status(), 204);
    assert_stored_sha256(&s, &url, &sha256_hex(&data)).await;
}

/// An upload that expires while S3 is away is swept all the same (410), and its multipart
/// upload, tail and markers are removed once S3 is back: the sweeper keeps the tombstone until
/// its bytes are gone, so nothing is left in the bucket that no row names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_expires_while_s3_is_away_leaves_nothing_in_the_bucket() {
    let moto = Moto::start("ferry", 5 * MIB as u64).await;
    let target = moto.endpoint.trim_start_matches("http://").parse().unwrap();
    let mut proxy = TcpProxy::start(target).await;
    s3_env(&moto, &proxy.http_url());
    let s = Server::start(&["--blobs", "s3://ferry/up", "--expire-after", "2s", "--sweep-interval", "200ms"]);
    let tus = Tus::new(&s);
    let url = tus.create(10 * MIB as u64).await;
    assert_eq!(tus.patch(&url, 0, pseudo_random(6 * MIB + 7, 9), &[]).await.status(), 204);
    assert_eq!(moto.multipart_uploads("ferry").await.len(), 1);

    proxy.cut().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = client().get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
        let expired: u64 = text.lines().find_map(|l| l.strip_prefix("ferry_uploads_expired_total ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        if expired >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the sweeper never expired the upload");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(tus.head(&url).await.status(), 410);

    proxy.restore().await;
    let id = id_of(&url).to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (mpus, keys) = (moto.multipart_uploads("ferry").await, moto.keys("ferry").await);
        if mpus.is_empty() && !keys.iter().any(|k| k.contains(&id)) {
            break;
        }
        assert!(Instant::now() < deadline, "the expired upload's bytes stayed in the bucket: {mpus:?} {keys:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// S3 that hangs (moto stopped with `SIGSTOP`: connections are accepted, nothing answers), the
/// tester's case: `/readyz` answers "not ready" within its probe bound (3 s) instead of after
/// object_store's 30 s request timeout, so a prober with a few seconds' timeout sees an answer;
/// a PATCH gets `503 unavailable` with `Retry-After` and the durable offset within the README's
/// bound (10 s, plus 1 s per MiB sent) instead of ~37 s; and however many probes were cut short,
/// at most one probe object (the fixed `.ferry-probe` key) is in the bucket afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_s3_is_not_ready_within_seconds_and_a_patch_gets_503_within_the_documented_bound() {
    let moto = Moto::start("ferry", 5 * MIB as u64).await;
    s3_env(&moto, &moto.endpoint.clone());
    // `--min-free-space 0`: this test is about S3, not the local disk of a shared machine.
    let s = Server::start(&["--blobs", "s3://ferry/up", "--min-free-space", "0"]);
    let tus = Tus::new(&s);
    let data = pseudo_random(300_000, 11);
    let url = tus.create(data.len() as u64).await;
    assert_eq!(tus.patch(&url, 0, data[..1000].to_vec(), &[]).await.status(), 204);
    wait_ready(&s, 200).await;

    moto.freeze();
    // Generous client bounds, far below what a hung S3 cost before (30 s per probe, ~37 s per
    // PATCH): a timeout here fails the test.
    let probe_client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(12)).build().unwrap();
    for _ in 0..3 {
        let r = probe_client.get(s.url("/readyz")).send().await.expect("/readyz answers while S3 hangs");
        assert_eq!(r.status(), 503);
        let body = json(r).await;
        let blobs = blobs_check(&body);
        assert_eq!(blobs["ok"], false, "{body}");
        assert!(blobs["reason"].as_str().unwrap().contains("did not answer within 3 s"), "{body}");
    }
    let patch_client = Tus { c: reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(25)).build().unwrap(), base: s.base.clone() };
    let r = patch_client.patch(&url, 1000, data[1000..2000].to_vec(), &[]).await;
    assert_unavailable(r, Some(1000)).await;

    moto.thaw();
    wait_ready(&s, 200).await;
    assert_eq!(tus.offset(&url).await, 1000, "nothing unacknowledged kept");
    assert_eq!(tus.patch(&url, 1000, data[1000..].to_vec(), &[]).await.status(), 204);
    assert_stored_sha256(&s, &url, &sha256_hex(&data)).await;
    let probes: Vec<String> = moto.keys("ferry").await.into_iter().filter(|k| k.contains(".ferry-probe")).collect();
    assert!(probes.len() <= 1 && probes.iter().all(|k| k == "up/.ferry-probe"), "probe objects left behind: {probes:?}");
}
