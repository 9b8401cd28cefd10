//! The real `ferry serve --blobs s3://…` against a local S3 (moto): uneven PATCHes, a kill -9
//! mid-PATCH and resume, whole and ranged downloads, termination aborting the multipart
//! upload, and a clear start-up failure for a bucket it cannot write.

mod common;

use std::time::{Duration, Instant};

use common::moto;
use common::*;
use ferry::catalog::Catalog;

const MIB: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_kill9_resume_download_terminate_on_s3() {
    let moto = moto::Moto::start("ferry", 5 * MIB as u64).await;
    moto.set_env();
    let mut server = Server::start(&["--blobs", "s3://ferry/uploads", "--checkpoint-every", "3MiB", "--s3-part-size", "5MiB"]);
    let tus = Tus::new(&server);
    let data = pseudo_random(29 * MIB + 4_321, 11);
    let url = tus.create(data.len() as u64).await;
    let path = url.split_once("/files/").map(|(_, p)| format!("/files/{p}")).unwrap();

    // Uneven PATCHes, some shorter than a part (5 MiB): tails at the end of each.
    let mut at = 0usize;
    for len in [3 * MIB + 7, 700_001, 6 * MIB, 1_000] {
        let r = tus.patch(&url, at as u64, data[at..at + len].to_vec(), &[]).await;
        assert_eq!(r.status(), 204, "PATCH at {at}");
        at += len;
        assert_eq!(tus.offset(&url).await, at as u64);
    }

    // A PATCH whose body stalls after 8 MiB: wait until a checkpoint inside it is committed,
    // then kill -9 the server with the request still open.
    let (tx, rx) = futures::channel::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(2);
    let body = reqwest::Body::wrap_stream(rx);
    let off = at.to_string();
    let req =
        tus.c.patch(&url).header("Tus-Resumable", "1.0.0").header("Content-Type", OCTET).header("Upload-Offset", off.as_str()).body(body).send();
    let pending = tokio::spawn(req);
    let mut tx = tx;
    let id = path.rsplit('/').next().unwrap().to_string();
    let catalog = ferry::catalog::SqliteCatalog::open(&server.data.join("ferry.db")).await.unwrap();
    // A checkpoint inside a PATCH is committed once its sync is done and more bytes arrive.
    let mut checkpointed = at as u64;
    for chunk in data[at..at + 8 * MIB].chunks(256 * 1024) {
        if futures::SinkExt::send(&mut tx, Ok(chunk.to_vec())).await.is_err() {
            let r = pending.await.unwrap().expect("PATCH");
            panic!("the PATCH ended early: {} {:?}", r.status(), r.text().await);
        }
        // HEAD would ask the PATCH to stop (it takes the lease over): read the catalog instead.
        checkpointed = catalog.get_upload(&id).await.unwrap().expect("upload row").offset;
        if checkpointed >= (at + 3 * MIB) as u64 {
            break;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while checkpointed < (at + 3 * MIB) as u64 {
        assert!(Instant::now() < deadline, "no checkpoint inside the PATCH (offset {checkpointed})");
        tokio::time::sleep(Duration::from_millis(50)).await;
        checkpointed = catalog.get_upload(&id).await.unwrap().expect("upload row").offset;
    }
    server.kill9();
    drop(tx);
    let _ = pending.await;
    server.restart();
    let tus = Tus::new(&server);
    let url = tus.abs(&path);
    let resumed = tus.offset(&url).await;
    assert!(resumed >= checkpointed, "acknowledged offset {checkpointed} survived the kill (now {resumed})");
    assert!(resumed as usize <= at + 8 * MIB);

    // Resume to the end in uneven PATCHes.
    let mut at = resumed as usize;
    for len in [2 * MIB + 1, 5 * MIB, 123] {
        let len = len.min(data.len() - at);
        let r = tus.patch(&url, at as u64, data[at..at + len].to_vec(), &[]).await;
        assert_eq!(r.status(), 204);
        at += len;
    }
    let r = tus.patch(&url, at as u64, data[at..].to_vec(), &[]).await;
    assert_eq!(r.status(), 204);
    assert_eq!(tus.offset(&url).await, data.len() as u64);

    // Whole and ranged downloads (ranged GETs on the completed object), sha256 matches.
    let got = tus.download(&url).await;
    assert_eq!(got.len(), data.len());
    assert_eq!(sha256_hex(&got), sha256_hex(&data));
    for (a, b) in [(5 * MIB - 10, 5 * MIB + 10), (0, 1), (data.len() - 100, data.len() - 1), (12 * MIB, 23 * MIB)] {
        let r = tus.c.get(&url).header("Range", format!("bytes={a}-{b}")).send().await.unwrap();
        assert_eq!(r.status(), 206, "Range {a}-{b}");
        assert_eq!(r.bytes().await.unwrap().as_ref(), &data[a..=b], "Range {a}-{b}");
    }
    assert_eq!(moto.multipart_uploads("ferry").await, Vec::<String>::new(), "the finished upload left no multipart upload");
    let keys = moto.keys("ferry").await;
    assert_eq!(
        keys.iter().filter(|k| k.contains(&id)).collect::<Vec<_>>(),
        vec![&format!("uploads/{id}")],
        "only the object itself remains: {keys:?}"
    );

    // Terminate an unfinished upload that has a multipart upload and a tail: both go.
    let url2 = tus.create(20 * MIB as u64).await;
    let r = tus.patch(&url2, 0, data[..7 * MIB + 5].to_vec(), &[]).await;
    assert_eq!(r.status(), 204);
    assert_eq!(moto.multipart_uploads("ferry").await.len(), 1, "one multipart upload while unfinished");
    let r = tus.request("DELETE", &url2, &[("Tus-Resumable", "1.0.0")], None).await;
    assert_eq!(r.status(), 204);
    assert_eq!(moto.multipart_uploads("ferry").await, Vec::<String>::new(), "terminate aborted the multipart upload");
    let id2 = url2.rsplit('/').next().unwrap().to_string();
    let keys = moto.keys("ferry").await;
    assert!(!keys.iter().any(|k| k.contains(&id2)), "terminate left objects behind: {keys:?}");
}

/// `ferry serve` checks the bucket at start-up and fails with one clear line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_bucket_it_cannot_write() {
    let moto = moto::Moto::start("exists", 5 * MIB as u64).await;
    let dir = tempfile::tempdir().unwrap();
    // `ferry serve` on `blobs` with moto's environment and `env` on top: (stdout, stderr) of a
    // start that must fail.
    let refused = |blobs: &str, env: (&str, &str)| {
        let out = std::process::Command::new(ferry_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(dir.path())
            .args(["--blobs", blobs])
            .envs(moto.env())
            .env(env.0, env.1)
            .output()
            .unwrap();
        assert!(!out.status.success());
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (stdout, err) = refused("s3://missing-bucket/x", ("AWS_SECRET_ACCESS_KEY", "s3cr3t-never-printed"));
    assert!(err.contains("cannot write to the blob store s3://missing-bucket/x: its bucket does not exist"), "{err}");
    assert!(!err.contains("s3cr3t"), "{err}");
    assert!(!stdout.contains("listening on"));
    // A plain-http endpoint without AWS_ALLOW_HTTP=true: said at once, with the fix.
    let (_, err) = refused("s3://exists/x", ("AWS_ALLOW_HTTP", "false"));
    assert!(err.contains("is plain http: set AWS_ALLOW_HTTP=true"), "{err}");
}

/// TUS concatenation on S3: the final's parts all have one size (R2's rule); a part inside one
/// partial is copied inside S3 (UploadPartCopy), a part that spans partials passes through
/// ferry; the final's bytes and sha256 are right and nothing but the objects remains in the
/// bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concatenation_on_s3_copies_large_partials_inside_s3() {
    let moto = moto::Moto::start("ferry", 5 * MIB as u64).await;
    // A forwarding proxy in front of moto, to see which requests ferry sends.
    let proxy = common::proxy::HttpFaultProxy::start(&moto.endpoint).await;
    moto.set_env();
    std::env::set_var("AWS_ENDPOINT_URL", &proxy.url);
    let server = Server::start(&["--blobs", "s3://ferry/c", "--s3-part-size", "5MiB"]);
    let tus = Tus::new(&server);
    // Parts of the final, 5 MiB each but the last: 1. inside the first partial, copied; 2. the
    // first's last MiB, the second and the head of the third, streamed; 3. inside the third,
    // copied; 4. the rest of the third and the fourth, streamed as the short last part.
    let sizes = [6 * MIB + 1, MIB + 3, 11 * MIB, 200 * 1024];
    let mut urls = Vec::new();
    let mut all = Vec::new();
    for (i, n) in sizes.iter().enumerate() {
        let part = pseudo_random(*n, 40 + i as u64);
        let r = tus.post(&[("Upload-Length", &n.to_string()), ("Upload-Concat", "partial")]).await;
        assert_eq!(r.status(), 201);
        let url = tus.abs(header(&r, "location").unwrap());
        assert_eq!(tus.patch(&url, 0, part.clone(), &[]).await.status(), 204);
        all.extend_from_slice(&part);
        urls.push(url);
    }
    let before = proxy.seen().len();
    let r = tus.post(&[("Upload-Concat", &format!("final;{}", urls.join(" ")))]).await;
    assert_eq!(r.status(), 201);
    let fin = tus.abs(header(&r, "location").unwrap());
    assert_stored_sha256(&server, &fin, &sha256_hex(&all)).await;
    let fin_id = fin.rsplit('/').next().unwrap().to_string();
    let sent: Vec<String> = proxy.seen()[before..].iter().filter(|l| l.contains(&fin_id)).cloned().collect();
    let copies = sent.iter().filter(|l| l.starts_with("PUT ") && l.contains("partNumber=") && l.ends_with(" copy-source")).count();
    let uploaded = sent.iter().filter(|l| l.starts_with("PUT ") && l.contains("partNumber=") && !l.ends_with(" copy-source")).count();
    assert_eq!((copies, uploaded), (2, 2), "two parts copied inside S3, two streamed: {sent:#?}");

    // A single partial: copied whole, nothing streamed.
    let r = tus.post(&[("Upload-Concat", &format!("final;{}", urls[0]))]).await;
    let one = tus.abs(header(&r, "location").unwrap());
    assert_stored_sha256(&server, &one, &sha256_hex(&all[..sizes[0]])).await;

    let mut ids: Vec<String> = urls.iter().chain([&fin, &one]).map(|u| u.rsplit('/').next().unwrap().to_string()).collect();
    ids.sort();
    assert_eq!(moto.multipart_uploads("ferry").await, Vec::<String>::new(), "no multipart upload left");
    let mut keys = moto.keys("ferry").await;
    keys.sort();
    assert_eq!(keys, ids.iter().map(|id| format!("c/{id}")).collect::<Vec<_>>(), "only the objects remain");
}
