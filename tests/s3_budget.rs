//! The S3 store's memory budget (`[s3] max_buffer`) with slow clients (issue 47, point 2): the
//! real `ferry serve --blobs s3://…` with its default settings (16 MiB parts, a 512 MiB
//! budget) against a local S3 (moto).
//!
//! Many uploads that each hold a few bytes of an open part — a phone on a bad network sends
//! its first KiB and then stalls — must not keep a fast upload from being answered: the budget
//! is reserved as bytes arrive, never a whole part for one byte, and a writer that finds no room
//! waits a bounded time and is then told to retry, instead of waiting without bound. Before
//! issue 47, 34 such uploads took the whole budget (a part each at its first byte) and the fast
//! PATCH got no answer at all.
//!
//! No wall-clock assert on speed: the bounds below only turn a hang into a failure.

mod common;

use std::time::Duration;

use common::moto;
use common::*;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// Slow uploads held open at once: twice what the whole budget held at one part each.
const SLOW: usize = 64;

/// Feeds a stalled PATCH's body; the PATCH's answer.
type Stalled = (futures::channel::mpsc::Sender<Result<Vec<u8>, std::io::Error>>, tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>);

/// A PATCH at offset 0 of `url` declaring `declared` bytes whose body sends `first` and then
/// stays open (until the returned sender is dropped).
fn stalled_patch(tus: &Tus, url: &str, declared: usize, first: Vec<u8>) -> Stalled {
    let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    tx.try_send(Ok(first)).expect("room for the first piece");
    let req = tus
        .c
        .patch(url)
        .header("Tus-Resumable", "1.0.0")
        .header("Content-Type", OCTET)
        .header("Upload-Offset", "0")
        .header("Content-Length", declared.to_string())
        .body(reqwest::Body::wrap_stream(rx))
        .send();
    (tx, tokio::spawn(req))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_uploads_holding_open_parts_do_not_stall_a_fast_one() {
    let moto = moto::Moto::start("ferry", 5 * MIB as u64).await;
    moto.set_env();
    let server = Server::start(&["--blobs", "s3://ferry/uploads"]);
    let tus = Tus::new(&server);

    // Each slow upload declares 40 MiB (its bytes would fill two parts), sends 1 KiB, stalls.
    let mut slow = Vec::new();
    for i in 0..SLOW {
        let url = tus.create(40 * MIB as u64).await;
        slow.push(stalled_patch(&tus, &url, 40 * MIB, pseudo_random(KIB, i as u64)));
    }
    // Every slow upload's first KiB has reached the server, and holds a unit of the budget
    // (64 KiB), not a part (16 MiB).
    wait_bytes_received(&server, (SLOW * KIB) as u64).await;
    let held = buffer_bytes(&server).await;
    assert!(held <= (SLOW as u64) * 2 * ferry::blob::s3::BUDGET_UNIT, "{SLOW} uploads holding 1 KiB each reserve {held} bytes of the budget");

    // A fast upload of 20 MiB in one PATCH is answered, and completes.
    let data = pseudo_random(20 * MIB, 99);
    let url = tus.create(data.len() as u64).await;
    let fast = tokio::time::timeout(Duration::from_secs(60), tus.patch(&url, 0, data.clone(), &[])).await;
    let r = fast.expect("a fast PATCH beside 64 stalled uploads got no answer within 60 s (the S3 memory budget stalled it)");
    assert_eq!(r.status(), 204, "{:?}", r.text().await);
    assert_eq!(tus.download(&url).await, data, "the fast upload's bytes");

    // The stalled ones are still alive: each can go on from where it is.
    for (tx, pending) in slow {
        drop(tx);
        let _ = tokio::time::timeout(Duration::from_secs(30), pending).await;
    }
}

/// An upload created without a length (`Upload-Defer-Length`, as `ferry upload -` and
/// `pg_dump | …` make) is cut into parts of `[s3] deferred_part_size`: before, its part size
/// was derived from the largest upload the server accepts (1 TiB: 210 MiB parts, each held in
/// memory while it fills), so two or three such streams filled the budget. Once more parts
/// than S3 holds would be needed, the client is told so (413 naming the setting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_length_upload_is_cut_into_the_configured_part_size() {
    let moto = moto::Moto::start("ferry", 5 * MIB as u64).await;
    moto.set_env();
    let server = Server::start(&["--blobs", "s3://ferry/deferred", "--s3-part-size", "5MiB", "--s3-deferred-part-size", "6MiB"]);
    let tus = Tus::new(&server);
    let r = tus.post(&[("Upload-Defer-Length", "1")]).await;
    assert_eq!(r.status(), 201);
    let url = tus.abs(header(&r, "location").unwrap());
    let id = url.rsplit('/').next().unwrap().to_string();
    let data = pseudo_random(14 * MIB, 7);
    let r = tus.patch(&url, 0, data.clone(), &[]).await;
    assert_eq!(r.status(), 204, "{:?}", r.text().await);
    // Acknowledged: its two full parts are stored, the open part's 2 MiB wait in a tail.
    assert_eq!(moto.part_sizes("ferry", &format!("deferred/{id}")).await, [6 * MIB as u64, 6 * MIB as u64], "parts of the deferred part size");
    let r = tus.patch(&url, data.len() as u64, Vec::new(), &[("Upload-Length", &data.len().to_string())]).await;
    assert_eq!(r.status(), 204, "{:?}", r.text().await);
    assert_eq!(tus.download(&url).await, data);

    // An upload with a length is sized from it as before (its parts fit 5 000 slots: the floor).
    let declared = tus.create(14 * MIB as u64).await;
    let did = declared.rsplit('/').next().unwrap().to_string();
    assert_eq!(tus.patch(&declared, 0, data[..11 * MIB].to_vec(), &[]).await.status(), 204);
    assert_eq!(moto.part_sizes("ferry", &format!("deferred/{did}")).await, [5 * MIB as u64, 5 * MIB as u64], "parts of the floor");

    // Every S3 request is in /metrics by operation and outcome (issue 47).
    let metrics = client().get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for op in ["CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "GetObject", "PutObject"] {
        let line = format!("ferry_s3_request_duration_seconds_count{{operation=\"{op}\",outcome=\"2xx\"}} ");
        let n = metrics.lines().find_map(|l| l.strip_prefix(&line)).map(|v| v.parse::<u64>().unwrap());
        assert!(
            n.is_some_and(|n| n > 0),
            "{op} requests are counted: {:?}",
            metrics.lines().filter(|l| l.starts_with("ferry_s3_request")).collect::<Vec<_>>()
        );
    }
}

/// `ferry_s3_buffer_bytes` now.
async fn buffer_bytes(server: &Server) -> u64 {
    let metrics = client().get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let v = metrics.lines().find(|l| l.starts_with("ferry_s3_buffer_bytes ")).map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap());
    v.unwrap_or_else(|| panic!("ferry_s3_buffer_bytes is exported:\n{metrics}")) as u64
}
