//! The eight faults of issue 22 ("Object stores as they really behave"), one test each, against
//! the real `ferry serve --blobs s3://…` on a PostgreSQL catalog with catalog leases, with a
//! strict-S3 fault proxy (tests/common/s3proxy.rs) between every replica and S3 — moto, or
//! with `FERRY_TEST_S3_BUCKET` a real S3 server (Garage in `.ci/run`; tests/common/s3.rs): R2's
//! equal-parts rule, refused completions, lifecycle aborts, held part uploads, a black-holed S3,
//! a replica killed while finishing, and the S3 state in the catalog's hot row.
//!
//! Needs PostgreSQL (`FERRY_TEST_PG`, see tests/common/pg.rs) and moto (tests/common/moto.rs) or
//! the S3 server `FERRY_TEST_S3_*` names.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::pg::TestDb;
use common::s3::TestS3;
use common::s3proxy::{Hold, HoldAt, Kind, S3Proxy};
use common::*;

const MIB: usize = 1 << 20;
const BUCKET: &str = "ferry";
const PREFIX: &str = "up";
/// Upload lease of the replicas.
const LEASE: Duration = Duration::from_secs(2);

/// Replicas on one catalog and one bucket, each talking to S3 through its own proxy.
struct Rig {
    // Dropped in this order: the replicas first, the database last.
    servers: Vec<Server>,
    proxies: Vec<S3Proxy>,
    s3: TestS3,
    db: TestDb,
}

impl Rig {
    async fn start(replicas: usize, extra: &[&str]) -> Rig {
        Rig::start_leased(replicas, LEASE, extra).await
    }

    /// As [`Rig::start`], with upload leases of `lease` (whole seconds).
    async fn start_leased(replicas: usize, lease: Duration, extra: &[&str]) -> Rig {
        let db = TestDb::create().await;
        let s3 = TestS3::start(BUCKET, 5 * MIB as u64).await;
        s3.set_env();
        // S3's smallest parts, so a few MiB make a multipart upload of several parts.
        std::env::set_var("FERRY_S3_PART_SIZE", "5MiB");
        let blobs = s3.url(PREFIX);
        let lease = format!("{}s", lease.as_secs());
        let mut args =
            vec!["--catalog", db.url.as_str(), "--blobs", &blobs, "--leases", "catalog", "--upload-lease", &lease, "--min-free-space", "0"];
        args.extend_from_slice(extra);
        let (mut servers, mut proxies) = (Vec::new(), Vec::new());
        for _ in 0..replicas {
            let proxy = S3Proxy::start(&s3.config.endpoint).await;
            // Each replica inherits the endpoint set when it starts (one test per process).
            std::env::set_var("AWS_ENDPOINT_URL", &proxy.url);
            servers.push(Server::start(&args));
            proxies.push(proxy);
        }
        Rig { servers, proxies, s3, db }
    }

    fn tus(&self, i: usize) -> Tus {
        Tus::new(&self.servers[i])
    }

    fn signal(&self, i: usize, sig: &str) {
        let ok = std::process::Command::new("kill").arg(format!("-{sig}")).arg(self.servers[i].child.id().to_string()).status().unwrap().success();
        assert!(ok, "kill -{sig}");
    }

    async fn sql_i64(&self, q: &str, id: &str) -> i64 {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&self.db.url).await.unwrap();
        let v: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(q.to_string())).bind(id).fetch_one(&mut c).await.unwrap_or_else(|e| panic!("{q}: {e}"));
        let _ = c.close().await;
        v
    }

    /// The bucket's keys that belong to upload `id`, and the bucket's unfinished multipart uploads.
    async fn leftovers(&self, id: &str) -> (Vec<String>, Vec<String>) {
        let mut keys: Vec<String> = self.s3.keys().await.into_iter().filter(|k| k.contains(id)).collect();
        keys.sort();
        (keys, self.s3.multipart_uploads().await)
    }
}

fn id_of(url: &str) -> String {
    url.trim_end_matches('/').rsplit('/').next().unwrap().to_string()
}

/// A PATCH whose body the test feeds piece by piece; the response arrives on the handle.
fn streaming_patch(url: &str, offset: u64) -> (tokio::sync::mpsc::Sender<Bytes>, tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let body = reqwest::Body::wrap_stream(futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok::<_, std::io::Error>))));
    let req =
        client().patch(url).header("Tus-Resumable", "1.0.0").header("Content-Type", OCTET).header("Upload-Offset", offset.to_string()).body(body);
    (tx, tokio::spawn(req.send()))
}

/// As [`streaming_patch`], with the body's length declared (`Content-Length: len`).
fn declared_patch(
    url: &str,
    offset: u64,
    len: usize,
) -> (tokio::sync::mpsc::Sender<Bytes>, tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let body = reqwest::Body::wrap_stream(futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok::<_, std::io::Error>))));
    let req = client()
        .patch(url)
        .header("Tus-Resumable", "1.0.0")
        .header("Content-Type", OCTET)
        .header("Upload-Offset", offset.to_string())
        .header("Content-Length", len.to_string())
        .body(body);
    (tx, tokio::spawn(req.send()))
}

/// HEAD until it answers 200 (423 while another replica holds the upload); returns the offset.
async fn offset_when_free(tus: &Tus, url: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let r = tus.head(url).await;
        if r.status() == 200 {
            return header_u64(&r, "upload-offset").expect("Upload-Offset");
        }
        assert!(matches!(r.status().as_u16(), 423 | 503), "HEAD {url}: {}", r.status());
        assert!(Instant::now() < deadline, "the upload stayed locked for 90 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// PATCH `data[from..]` in pieces of `piece` bytes; each must answer 204.
async fn patch_rest(tus: &Tus, url: &str, data: &[u8], from: usize, piece: usize) {
    let mut at = from;
    while at < data.len() {
        let end = (at + piece).min(data.len());
        let r = tus.patch(url, at as u64, data[at..end].to_vec(), &[]).await;
        assert_eq!(r.status(), 204, "PATCH {url} at {at}: {:?}", r.text().await);
        at = end;
    }
}

/// Poll `ok` every 100 ms for up to `secs` seconds.
async fn eventually<F: std::future::Future<Output = bool>>(secs: u64, mut ok: impl FnMut() -> F) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if ok().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ok().await
}

/// Every CompleteMultipartUpload S3 accepted had all parts but the last of one size, none
/// under 5 MiB.
fn assert_uniform_parts(proxy: &S3Proxy) {
    for (key, sizes) in proxy.completed() {
        if let Some((_, init)) = sizes.split_last() {
            assert!(init.windows(2).all(|w| w[0] == w[1]), "{key}: parts but the last of unequal sizes: {sizes:?}");
            assert!(init.iter().all(|&s| s >= 5 * MIB as u64), "{key}: a part but the last under 5 MiB: {sizes:?}");
        }
    }
}

/// Fault 1: parts of unequal sizes. Behind a store with R2's rule (every part but the last of
/// one size, S3's 5 MiB floor), a plain upload of several parts and a concatenation of
/// partials of unequal sizes both complete with the right bytes, and every completion S3 saw
/// had parts of one size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault1_uploads_and_concatenations_complete_behind_r2s_equal_parts_rule() {
    let rig = Rig::start(1, &[]).await;
    let proxy = &rig.proxies[0];
    proxy.set_strict(true);
    let tus = rig.tus(0);

    let data = pseudo_random(40 * MIB + 12_345, 0x11);
    let url = tus.create(data.len() as u64).await;
    patch_rest(&tus, &url, &data, 0, 3 * MIB + 17).await;
    assert_stored_sha256(&rig.servers[0], &url, &sha256_hex(&data)).await;

    // Partials of unequal sizes, each at least a part or smaller than one (s3.rs copies the
    // large ones inside S3, which makes parts of their sizes).
    let (fin, all) = concatenation(&tus, &[6 * MIB + 1, MIB + 3, 11 * MIB, 7 * MIB + 5, 200 * 1024], 0x12).await;
    let done = eventually(60, || async {
        let r = tus.head(&fin).await;
        !proxy.refused().is_empty() || (header(&r, "upload-offset").is_some() && header(&r, "upload-offset") == header(&r, "upload-length"))
    })
    .await;
    assert_eq!(proxy.refused(), Vec::<(String, String)>::new(), "S3 refused a CompleteMultipartUpload (R2's rule)");
    assert!(done, "the concatenation never completed");
    assert_stored_sha256(&rig.servers[0], &fin, &sha256_hex(&all)).await;
    assert_uniform_parts(proxy);
}

/// Fault 1, the size: an upload declared at 500 GiB uploads parts large enough that 10 000 of
/// them hold it (S3's part limit), all of one size — not 5 MiB parts that double every 1 000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault1_parts_are_sized_so_ten_thousand_hold_the_declared_length() {
    let rig = Rig::start(1, &[]).await;
    let proxy = &rig.proxies[0];
    let tus = rig.tus(0);
    let declared: u64 = 500 << 30;
    // Each part has two part numbers (by the writer's fence parity, so a writer that lost its
    // lease and the one that took over never share one): 5 000 parts must hold the upload.
    let at_least = declared.div_ceil(5_000);
    let url = tus.create(declared).await;
    let id = id_of(&url);
    // More than one such part, in PATCHes of 16 MiB.
    let data = pseudo_random(at_least as usize + 8 * MIB, 0x13);
    let mut at = 0;
    while at < data.len() {
        let end = (at + 16 * MIB).min(data.len());
        assert_eq!(tus.patch(&url, at as u64, data[at..end].to_vec(), &[]).await.status(), 204, "PATCH at {at}");
        at = end;
    }
    let parts: Vec<u64> =
        proxy.seen().iter().filter(|s| s.kind == Kind::UploadPart && s.key.contains(&id) && s.status == 200).map(|s| s.len).collect();
    assert!(!parts.is_empty(), "a part was uploaded");
    assert!(
        parts.iter().all(|&p| p >= at_least && p == parts[0]),
        "parts of {declared} bytes must be at least {at_least} bytes, of one size: {parts:?}"
    );
    assert_eq!(tus.request("DELETE", &url, &[("Tus-Resumable", "1.0.0")], None).await.status(), 204);
}

/// Fault 2: "finished" before the object exists. S3 refuses CompleteMultipartUpload: the
/// last PATCH is never acknowledged with a 2xx, no `upload.finished` event is emitted, and a
/// later GET answers no 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault2_a_refused_completion_is_never_acknowledged_nor_announced() {
    let rig = Rig::start(1, &[]).await;
    let tus = rig.tus(0);
    let data = pseudo_random(11 * MIB + 5, 0x21);
    let url = tus.create(data.len() as u64).await;
    let id = id_of(&url);
    let first = 6 * MIB + 7;
    assert_eq!(tus.patch(&url, 0, data[..first].to_vec(), &[]).await.status(), 204);

    rig.proxies[0].refuse_complete(true);
    let r = tus.patch(&url, first as u64, data[first..].to_vec(), &[]).await;
    let status = r.status();
    let body = r.text().await.unwrap_or_default();
    assert!(!status.is_success(), "the last PATCH was acknowledged ({status}) though S3 refused the completion: {body}");
    assert!(!rig.proxies[0].refused().is_empty(), "the completion was attempted and refused");
    let finished = rig.sql_i64("SELECT count(*) FROM events WHERE type = 'upload.finished' AND subject = $1", &id).await;
    assert_eq!(finished, 0, "upload.finished was emitted for bytes nobody can read");
    let r = client().get(&url).send().await.unwrap();
    let get = r.status();
    assert_ne!(get.as_u16(), 500, "GET after a refused completion");
    if get.is_success() {
        assert_eq!(sha256_hex(&r.bytes().await.unwrap()), sha256_hex(&data), "a 200 serves the right bytes");
    }
}

/// Fault 3: a lifecycle rule aborts the upload's multipart upload behind ferry's back. The
/// PATCH that needs it answers 409 or 503 with an `Upload-Offset` that is still readable (never
/// a 500), and a client resuming from there finishes with the right sha256.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault3_a_lifecycle_aborted_multipart_upload_rolls_back_and_the_client_resumes() {
    let rig = Rig::start(1, &[]).await;
    let tus = rig.tus(0);
    let data = pseudo_random(16 * MIB + 3, 0x31);
    let url = tus.create(data.len() as u64).await;
    let id = id_of(&url);
    let first = 6 * MIB + 7;
    assert_eq!(tus.patch(&url, 0, data[..first].to_vec(), &[]).await.status(), 204);

    let aborted = rig.proxies[0].lifecycle_abort(&id, &rig.s3.config).await;
    assert_eq!(aborted.len(), 1, "the upload has one multipart upload: {aborted:?}");
    // Fills the next part: needs the multipart upload.
    let r = tus.patch(&url, first as u64, data[first..first + 5 * MIB].to_vec(), &[]).await;
    let status = r.status().as_u16();
    let at = header_u64(&r, "upload-offset");
    let body = r.text().await.unwrap_or_default();
    assert!(matches!(status, 409 | 503), "a PATCH on an aborted multipart upload: {status} {body}");
    let at = at.unwrap_or_else(|| panic!("no Upload-Offset in the {status}: {body}"));
    assert!(at <= first as u64, "Upload-Offset {at} names more than was acknowledged ({first})");
    let head = offset_when_free(&tus, &url).await;
    assert_eq!(head, at, "HEAD agrees with the offset the refusal named");
    patch_rest(&tus, &url, &data, head as usize, 4 * MIB + 1).await;
    assert_stored_sha256(&rig.servers[0], &url, &sha256_hex(&data)).await;
}

/// Fault 4: tails re-read at every PATCH. A client sending many small PATCHes to the one
/// replica that holds the upload makes it read no tail segment back from S3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault4_small_patches_to_one_holder_read_no_tail_back() {
    let rig = Rig::start(1, &[]).await;
    let tus = rig.tus(0);
    let data = pseudo_random(12 * MIB + 5, 0x41);
    let url = tus.create(data.len() as u64).await;
    let id = id_of(&url);
    patch_rest(&tus, &url, &data, 0, 512 * 1024).await;
    assert_stored_sha256(&rig.servers[0], &url, &sha256_hex(&data)).await;
    let proxy = &rig.proxies[0];
    let puts = proxy.count(Kind::Put, &format!("{id}.tail/"));
    let gets = proxy.count(Kind::Get, &format!("{id}.tail/"));
    eprintln!("{} PATCHes: {puts} tail PUTs, {gets} tail GETs, {} UploadParts", data.len().div_ceil(512 * 1024), proxy.count(Kind::UploadPart, &id));
    assert_eq!(gets, 0, "tail segments read back while one replica held the upload");
}

/// The fault-5 scene on two replicas: A commits part 1 and a tail, then streams more stale
/// bytes until its UploadPart of part 2 is held by A's proxy (`at`: the request, or its
/// answer); A is frozen (SIGSTOP) past its lease; B takes over at A's last commit and writes
/// the client's bytes over the same range (204). A is still frozen, its part still held.
struct Takeover {
    rig: Rig,
    b: Tus,
    url_b: String,
    id: String,
    good: Vec<u8>,
    until: usize,
    hold: Hold,
    pending: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
    feeder: tokio::task::JoinHandle<()>,
}

impl Takeover {
    async fn stage(at: HoldAt, seed: u64) -> Takeover {
        let rig = Rig::start(2, &[]).await;
        let (a, b) = (rig.tus(0), rig.tus(1));
        let len = 14 * MIB + 99;
        // What the client sends B, and what the stale PATCH on A carries after `first`.
        let good = pseudo_random(len, seed);
        let stale = pseudo_random(len, seed + 1);
        let url = a.create(len as u64).await;
        let id = id_of(&url);
        let url_b = b.abs(&format!("/files/{id}"));
        let first = 6 * MIB + 7;
        assert_eq!(a.patch(&url, 0, good[..first].to_vec(), &[]).await.status(), 204);
        // A fills part 2 (bytes 5..10 MiB) and 300 000 bytes more; its UploadPart is held.
        let until = 10 * MIB + 300_000;
        let hold = rig.proxies[0].hold(Kind::UploadPart, &id, at);
        let (tx, pending) = streaming_patch(&url, first as u64);
        let body = stale[first..until].to_vec();
        let feeder = tokio::spawn(async move {
            for piece in body.chunks(256 << 10) {
                if tx.send(Bytes::copy_from_slice(piece)).await.is_err() {
                    break;
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(60), hold.arrived()).await.expect("A uploads part 2");
        rig.signal(0, "STOP");
        let off = offset_when_free(&b, &url_b).await;
        assert_eq!(off, first as u64, "B resumes from A's last commit");
        assert_eq!(b.patch(&url_b, first as u64, good[first..until].to_vec(), &[]).await.status(), 204);
        Takeover { rig, b, url_b, id, good, until, hold, pending, feeder }
    }

    /// Let A's part go on and A run again: its PATCH is never acknowledged.
    async fn wake_a(&mut self) {
        self.hold.release();
        self.rig.signal(0, "CONT");
        let late = tokio::time::timeout(Duration::from_secs(60), &mut self.pending).await.expect("A's PATCH ends").unwrap();
        self.feeder.abort();
        if let Ok(r) = late {
            assert!(!r.status().is_success(), "the writer that lost its lease had its PATCH acknowledged: {}", r.status());
        }
    }

    /// B's commit stands; B finishes the upload, and the file holds exactly what B was sent.
    async fn finish_on_b(&self) {
        finish_as_acknowledged(&self.b, &self.url_b, &self.good, self.until).await;
    }
}

/// Fault 5: a writer that lost its lease still writes. Replica A's upload of part 2 is held in
/// the network (it reaches S3 only later) while A is frozen past its lease; replica B takes
/// over and writes the client's bytes; then A's part lands and A wakes. A's PATCH is not
/// acknowledged, and the finished file holds exactly what B was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault5_a_part_that_lands_after_a_takeover_is_never_part_of_the_file() {
    let mut t = Takeover::stage(HoldAt::Request, 0x51).await;
    // A's part reaches S3 after B's, then A runs again.
    t.wake_a().await;
    t.finish_on_b().await;
}

/// Fault 5, the answer held: replica A's UploadPart of part 2 reaches S3 at once but its answer
/// is held while A is frozen past its lease; replica B takes over and writes the client's bytes
/// over the same range. When A gets its answer and wakes, it has lost the lease: it makes no
/// change to the bucket at all (no tail PUT, no DELETE, no part), and the finished file holds
/// exactly what B was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault5_a_writer_that_lost_its_lease_changes_nothing_in_the_bucket() {
    let mut t = Takeover::stage(HoldAt::Response, 0x53).await;
    // A gets its answer (its part was replaced by B's since) and runs again.
    let mark = t.rig.proxies[0].seen().len();
    t.wake_a().await;
    let writes: Vec<String> = t.rig.proxies[0].seen()[mark..]
        .iter()
        .filter(|s| s.key.contains(&t.id) && !matches!(s.kind, Kind::Get | Kind::Head | Kind::List | Kind::ListMultipart))
        .map(|s| format!("{:?} {}?{}", s.kind, s.key, s.query))
        .collect();
    assert_eq!(writes, Vec::<String>::new(), "the writer that lost its lease changed the bucket");
    t.finish_on_b().await;
}

/// Wait until every UploadPart of upload `id` that `proxy` saw has been answered (held ones
/// released and forwarded included).
async fn parts_landed(proxy: &S3Proxy, id: &str) {
    let landed =
        eventually(60, || async { proxy.seen().iter().filter(|s| s.kind == Kind::UploadPart && s.key.contains(id)).all(|s| s.status != 0) }).await;
    assert!(landed, "the held parts reached S3: {:?}", proxy.seen());
}

/// The commit at `until` stands; the rest of `good` finishes the upload through `tus`, and the
/// file reads back as exactly `good`.
async fn finish_as_acknowledged(tus: &Tus, url: &str, good: &[u8], until: usize) {
    let off = offset_when_free(tus, url).await;
    assert_eq!(off, until as u64, "the last acknowledged commit stands");
    let r = tus.patch(url, off, good[until..].to_vec(), &[]).await;
    assert_eq!(r.status(), 204, "last PATCH: {:?}", r.text().await);
    let r = client().get(url).send().await.unwrap();
    assert_eq!(r.status(), 200, "GET of the finished file");
    let got = r.bytes().await.unwrap();
    assert!(got.len() == good.len() && sha256_hex(&got) == sha256_hex(good), "the finished file holds bytes a stale writer sent");
}

/// A stale writer on replica `i`: its PATCH of `url` from `from` carries `bytes` (other than
/// the client's) until its UploadPart is held in the network; then the replica is frozen
/// (SIGSTOP). Returns the hold, the PATCH and its feeder.
async fn frozen_with_a_part_held(
    rig: &Rig,
    i: usize,
    url: &str,
    from: usize,
    bytes: Vec<u8>,
) -> (Hold, tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>, tokio::task::JoinHandle<()>) {
    let hold = rig.proxies[i].hold(Kind::UploadPart, &id_of(url), HoldAt::Request);
    let (tx, pending) = streaming_patch(url, from as u64);
    let feeder = tokio::spawn(async move {
        for piece in bytes.chunks(256 << 10) {
            if tx.send(Bytes::copy_from_slice(piece)).await.is_err() {
                break;
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(60), hold.arrived()).await.expect("the stale writer uploads part 2");
    rig.signal(i, "STOP");
    (hold, pending, feeder)
}

/// Fault 5 twice in a row (the chain two numbers per part could not cover): replica A's
/// UploadPart of part 2 is held in the network while A is frozen past its lease; replica B
/// takes over and does the same; replica C takes over and writes the client's bytes (204).
/// Then both stale parts reach S3 and A and B wake: neither PATCH is acknowledged, and the
/// file holds exactly what C was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault5_a_chain_of_two_takeovers_with_parts_on_their_way_never_mixes_parts() {
    let rig = Rig::start(3, &[]).await;
    let (a, b, c) = (rig.tus(0), rig.tus(1), rig.tus(2));
    let len = 14 * MIB + 99;
    let good = pseudo_random(len, 0x71);
    let url = a.create(len as u64).await;
    let id = id_of(&url);
    let (url_b, url_c) = (b.abs(&format!("/files/{id}")), c.abs(&format!("/files/{id}")));
    let first = 6 * MIB + 7;
    assert_eq!(a.patch(&url, 0, good[..first].to_vec(), &[]).await.status(), 204);
    let until = 10 * MIB + 300_000;
    let stale_a = frozen_with_a_part_held(&rig, 0, &url, first, pseudo_random(len, 0x72)[first..until].to_vec()).await;
    assert_eq!(offset_when_free(&b, &url_b).await, first as u64, "B resumes from A's last commit");
    let stale_b = frozen_with_a_part_held(&rig, 1, &url_b, first, pseudo_random(len, 0x73)[first..until].to_vec()).await;
    assert_eq!(offset_when_free(&c, &url_c).await, first as u64, "C resumes from A's last commit");
    assert_eq!(c.patch(&url_c, first as u64, good[first..until].to_vec(), &[]).await.status(), 204);
    // Both stale parts reach S3, and A and B run again.
    for (i, (hold, pending, feeder)) in [stale_a, stale_b].into_iter().enumerate() {
        hold.release();
        rig.signal(i, "CONT");
        let late = tokio::time::timeout(Duration::from_secs(60), pending).await.expect("the stale PATCH ends").unwrap();
        feeder.abort();
        if let Ok(r) = late {
            assert!(!r.status().is_success(), "a writer that lost its lease had its PATCH acknowledged: {}", r.status());
        }
    }
    for proxy in &rig.proxies[..2] {
        parts_landed(proxy, &id).await;
    }
    finish_as_acknowledged(&c, &url_c, &good, until).await;
}

/// A part number is sent once (the three-replica break-it run's rollback to 0). The client's
/// PATCH is writing part 2 when its UploadPart is held in the network; the client sends the
/// same range again, the first PATCH's writer is asked to let go and is cut while its part is
/// still on its way, and the second PATCH sends part 2 again (204). Only then does the first
/// part reach S3 (in the old numbering, under the number the second one used: S3 keeps the
/// last upload of a number, so the completion failed with `InvalidPart` or held stale
/// bytes). The upload finishes with exactly the bytes acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_that_lands_after_its_writer_let_go_never_replaces_the_part_sent_again() {
    let rig = Rig::start(1, &[]).await;
    let tus = rig.tus(0);
    let proxy = &rig.proxies[0];
    let len = 14 * MIB + 99;
    let (good, stale) = (pseudo_random(len, 0x61), pseudo_random(len, 0x62));
    let url = tus.create(len as u64).await;
    let id = id_of(&url);
    let first = 6 * MIB + 7;
    assert_eq!(tus.patch(&url, 0, good[..first].to_vec(), &[]).await.status(), 204);
    // The first PATCH fills part 2 (bytes 5..10 MiB) with other bytes; its UploadPart is held.
    let until = 10 * MIB + 300_000;
    let hold = proxy.hold(Kind::UploadPart, &id, HoldAt::Request);
    let (tx, pending) = streaming_patch(&url, first as u64);
    for piece in stale[first..until].chunks(256 << 10) {
        tx.send(Bytes::copy_from_slice(piece)).await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(60), hold.arrived()).await.expect("the first PATCH uploads part 2");
    // The client sends the range again: the first writer is cut, its part still on its way.
    let r = tus.patch(&url, first as u64, good[first..until].to_vec(), &[]).await;
    assert_eq!(r.status(), 204, "the second PATCH: {:?}", r.text().await);
    drop(tx);
    let late = tokio::time::timeout(Duration::from_secs(60), pending).await.expect("the first PATCH ends").unwrap();
    if let Ok(r) = late {
        assert!(!r.status().is_success(), "the writer that was cut had its PATCH acknowledged: {}", r.status());
    }
    // Now the first writer's part reaches S3; the upload finishes with the bytes acknowledged.
    hold.release();
    parts_landed(proxy, &id).await;
    finish_as_acknowledged(&tus, &url, &good, until).await;
}

/// S3's connection dropped in the middle of an UploadPart (issue 22, "bad input stays as it
/// is"): the PATCH is either acknowledged (object_store retried the part) or refused with a
/// retryable 503 naming the durable offset; nothing acknowledged is lost and the upload
/// finishes with the right sha256.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_upload_cut_mid_body_loses_nothing() {
    let rig = Rig::start(1, &[]).await;
    let tus = rig.tus(0);
    let data = pseudo_random(13 * MIB + 11, 0x91);
    let url = tus.create(data.len() as u64).await;
    let id = id_of(&url);
    let first = MIB + 1;
    assert_eq!(tus.patch(&url, 0, data[..first].to_vec(), &[]).await.status(), 204);
    rig.proxies[0].cut_next_part(2 * MIB as u64);
    let r = tus.patch(&url, first as u64, data[first..first + 6 * MIB].to_vec(), &[]).await;
    let status = r.status().as_u16();
    let at = header_u64(&r, "upload-offset");
    assert!(matches!(status, 204 | 503), "PATCH whose part upload was cut: {status} {:?}", r.text().await);
    let cut = rig.proxies[0].seen().iter().filter(|s| s.kind == Kind::UploadPart && s.key.contains(&id) && s.status == 0).count();
    assert_eq!(cut, 1, "one UploadPart was cut");
    let head = offset_when_free(&tus, &url).await;
    match status {
        204 => assert_eq!((at, head), (Some((first + 6 * MIB) as u64), (first + 6 * MIB) as u64)),
        _ => assert!(at.is_some_and(|o| o >= first as u64) && head >= first as u64, "the durable offset: {at:?}, HEAD {head}"),
    }
    patch_rest(&tus, &url, &data, head as usize, 4 * MIB).await;
    assert_stored_sha256(&rig.servers[0], &url, &sha256_hex(&data)).await;
}

/// Streamed parts (issue 24 goal 4): when a PATCH's declared length covers a whole part, the
/// part's UploadPart begins while the part is still being received — S3 sees it with 2 of its
/// 5 MiB in — and each part is sent once. A streamed part S3 cuts mid-body is sent again whole
/// and the PATCH is still acknowledged; the file reads back right and every completion had
/// parts of one size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_is_sent_while_it_is_received_and_again_whole_if_its_stream_is_cut() {
    let rig = Rig::start(1, &[]).await;
    let tus = rig.tus(0);
    let data = pseudo_random(17 * MIB + 5, 0x27);
    let url = tus.create(data.len() as u64).await;
    let id = id_of(&url);
    let parts =
        |status: u16| rig.proxies[0].seen().iter().filter(|s| s.kind == Kind::UploadPart && s.key.contains(&id) && s.status == status).count();
    let (tx, pending) = declared_patch(&url, 0, 10 * MIB);
    let mut pieces = data[..10 * MIB].chunks(MIB);
    for piece in pieces.by_ref().take(2) {
        tx.send(Bytes::copy_from_slice(piece)).await.unwrap();
    }
    let early = eventually(10, || async { rig.proxies[0].count(Kind::UploadPart, &id) >= 1 }).await;
    assert!(early, "part 1's UploadPart began with 2 of its 5 MiB received: {:?}", rig.proxies[0].seen());
    for piece in pieces {
        tx.send(Bytes::copy_from_slice(piece)).await.unwrap();
    }
    drop(tx);
    let r = pending.await.unwrap().unwrap();
    assert_eq!((r.status().as_u16(), header_u64(&r, "upload-offset")), (204, Some(10 * MIB as u64)));
    assert_eq!(parts(200), 2, "two parts, each sent once: {:?}", rig.proxies[0].seen());

    // The next part's stream is cut 1 MiB in: the part goes again whole.
    rig.proxies[0].cut_next_part(MIB as u64);
    let r = tus.patch(&url, 10 * MIB as u64, data[10 * MIB..15 * MIB].to_vec(), &[]).await;
    assert_eq!((r.status().as_u16(), header_u64(&r, "upload-offset")), (204, Some(15 * MIB as u64)), "{:?}", rig.proxies[0].seen());
    assert_eq!((parts(0), parts(200)), (1, 3), "one stream cut, its part then stored whole: {:?}", rig.proxies[0].seen());
    patch_rest(&tus, &url, &data, 15 * MIB, 4 * MIB).await;
    assert_stored_sha256(&rig.servers[0], &url, &sha256_hex(&data)).await;
    assert_uniform_parts(&rig.proxies[0]);
}

/// An upload for the parts-in-flight cases (`--s3-parts-in-flight 2`): `FIRST` bytes stored
/// (part 1 and a few bytes, so its multipart upload exists), then S3 black-holed.
struct InFlight {
    rig: Rig,
    tus: Tus,
    data: Vec<u8>,
    url: String,
    id: String,
}

impl InFlight {
    /// Where the first PATCH ends; the next body fills parts 2 and 3 (bytes 5..15 MiB).
    const FIRST: usize = 5 * MIB + 3;

    async fn start(seed: u64) -> InFlight {
        // A lease far longer than S3's deadline for a part (15 s), so the PATCH keeps it while
        // it waits on the black hole even when the catalog is slow (a loaded CI: a renewal
        // took 1.3 s and a 2 s lease ran out, answering 409 instead of S3's 503).
        let rig = Rig::start_leased(1, Duration::from_secs(60), &["--s3-parts-in-flight", "2"]).await;
        let tus = rig.tus(0);
        let data = pseudo_random(16 * MIB + 9, seed);
        let url = tus.create(data.len() as u64).await;
        let id = id_of(&url);
        assert_eq!(tus.patch(&url, 0, data[..Self::FIRST].to_vec(), &[]).await.status(), 204);
        rig.proxies[0].set_black_hole(true);
        InFlight { rig, tus, data, url, id }
    }

    /// The chunk sent after the first PATCH: two whole parts and a few bytes of a third.
    fn chunk(&self) -> &[u8] {
        &self.data[Self::FIRST..15 * MIB + 7]
    }

    /// Two UploadParts of the upload wait in the black hole at once.
    async fn two_parts_in_the_hole(&self) {
        let both = eventually(30, || async { self.rig.proxies[0].in_hole(Some(Kind::UploadPart), &self.id) >= 2 }).await;
        assert!(both, "two parts on their way at once: {:?}", self.rig.proxies[0].seen());
    }

    /// `r` answered `status` with the first PATCH's offset.
    async fn answered(r: reqwest::Response, status: u16, why: &str) {
        let (got, at) = (r.status().as_u16(), header_u64(&r, "upload-offset"));
        let text = r.text().await.unwrap_or_default();
        assert_eq!(got, status, "{why}: {text}");
        assert_eq!(at, Some(Self::FIRST as u64), "the durable offset is the first PATCH's: {text}");
    }

    /// S3 answers again: HEAD says the first PATCH's offset (nothing of the parts S3 never
    /// stored), the rest goes from there, and the stored object's sha256 is the data's.
    async fn resume_and_check(self) {
        self.rig.proxies[0].set_black_hole(false);
        let head = offset_when_free(&self.tus, &self.url).await;
        assert_eq!(head, Self::FIRST as u64, "what the first PATCH stored, nothing of the parts S3 never stored");
        patch_rest(&self.tus, &self.url, &self.data, head as usize, self.data.len()).await;
        assert_stored_sha256(&self.rig.servers[0], &self.url, &sha256_hex(&self.data)).await;
        assert_uniform_parts(&self.rig.proxies[0]);
    }
}

/// Sends `chunk` as one streamed PATCH body at `offset`, in 256 KiB pieces, leaving it open.
async fn stream_open(
    url: &str,
    offset: usize,
    chunk: &[u8],
) -> (tokio::sync::mpsc::Sender<Bytes>, tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>) {
    let (tx, pending) = streaming_patch(url, offset as u64);
    for piece in chunk.chunks(256 << 10) {
        tx.send(Bytes::copy_from_slice(piece)).await.unwrap();
    }
    (tx, pending)
}

/// `[s3] parts_in_flight` (issue 24 goal 4): in one long PATCH the next part is sent while the
/// one before is still on its way — two UploadParts of the upload wait in a black-holed S3 at
/// once while the body is still open. Neither is stored: the PATCH answers 503 with the
/// durable offset (what the first PATCH stored, never a byte of the parts that failed), and a
/// client resuming from HEAD once S3 is back finishes with the right sha256.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_in_flight_overlap_and_parts_lost_among_them_lose_nothing() {
    let f = InFlight::start(0x24).await;
    let (tx, pending) = stream_open(&f.url, InFlight::FIRST, f.chunk()).await;
    f.two_parts_in_the_hole().await;
    drop(tx);
    let r = tokio::time::timeout(Duration::from_secs(90), pending).await.expect("the PATCH ends once S3 gives up").unwrap().unwrap();
    InFlight::answered(r, 503, "a PATCH whose parts S3 never stored").await;
    f.resume_and_check().await;
}

/// A client gone mid-body while two of its parts wait in a black-holed S3: the checkpoint that
/// would keep what arrived waits for those parts, S3 gives up on them (503 inside the server),
/// and what the PATCH wrote is released: the upload stays at what the first PATCH stored, no
/// byte of a part S3 never stored is counted, and a client resuming from HEAD finishes with
/// the right sha256.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_parts_are_in_flight_loses_nothing() {
    let f = InFlight::start(0x25).await;
    let (tx, pending) = stream_open(&f.url, InFlight::FIRST, f.chunk()).await;
    f.two_parts_in_the_hole().await;
    // The client goes away with the body unfinished; the server gives up on the parts after
    // their deadline (10 s + 1 s a MiB), with nobody asking it to let go meanwhile.
    pending.abort();
    drop(tx);
    tokio::time::sleep(Duration::from_secs(20)).await;
    f.resume_and_check().await;
}

/// A chunk whose `Upload-Checksum` does not match, sent while S3 is silent: its body fills two
/// parts that wait in the black hole when the mismatch is found. Throwing the chunk away waits
/// for them; once S3 gives up on them their bytes are back in the open part and the rewind goes
/// on over them, so the client gets the checksum's 460 (not a 503 about S3) with the offset it
/// had, and the upload finishes right once S3 answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checksum_mismatch_with_parts_in_flight_answers_460_and_keeps_the_offset() {
    use base64::Engine;
    use sha2::Digest;
    let f = InFlight::start(0x26).await;
    let wrong = format!("sha256 {}", base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(b"other bytes")));
    let patch = {
        let (tus, url, chunk) = (f.rig.tus(0), f.url.clone(), f.chunk().to_vec());
        tokio::spawn(async move { tus.patch(&url, InFlight::FIRST as u64, chunk, &[("Upload-Checksum", &wrong)]).await })
    };
    f.two_parts_in_the_hole().await;
    let r = tokio::time::timeout(Duration::from_secs(90), patch).await.expect("the PATCH ends once S3 gives up").unwrap();
    InFlight::answered(r, 460, "the chunk's checksum did not match").await;
    f.resume_and_check().await;
}

/// Fault 6: a replica killed while finishing (after CompleteMultipartUpload, before its
/// clean-up). The next touch of the upload (or a sweep) removes the `.created`, `.mpu/` and
/// `.tail/` objects: only the finished object remains, and it reads back right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault6_a_replica_killed_while_finishing_leaves_nothing_behind() {
    let mut rig = Rig::start(1, &["--sweep-interval", "200ms"]).await;
    let tus = rig.tus(0);
    let data = pseudo_random(11 * MIB + 5, 0x61);
    let url = tus.create(data.len() as u64).await;
    let id = id_of(&url);
    let first = 6 * MIB + 7;
    assert_eq!(tus.patch(&url, 0, data[..first].to_vec(), &[]).await.status(), 204);

    // Everything after the completion vanishes; then the replica is killed.
    rig.proxies[0].black_hole_after_complete();
    let last = tokio::spawn({
        let (c, url, body) = (tus.c.clone(), url.clone(), data[first..].to_vec());
        async move {
            c.patch(&url)
                .header("Tus-Resumable", "1.0.0")
                .header("Content-Type", OCTET)
                .header("Upload-Offset", first.to_string())
                .body(body)
                .send()
                .await
        }
    });
    assert!(eventually(60, || async { !rig.proxies[0].completed().is_empty() }).await, "the multipart upload was completed");
    rig.servers[0].kill9();
    let _ = last.await;
    rig.proxies[0].set_black_hole(false);
    rig.servers[0].restart();

    // The client comes back: it finishes what is not acknowledged, then reads the file.
    let tus = rig.tus(0);
    let url = tus.abs(&format!("/files/{id}"));
    let off = offset_when_free(&tus, &url).await;
    patch_rest(&tus, &url, &data, off as usize, data.len()).await;
    assert_stored_sha256(&rig.servers[0], &url, &sha256_hex(&data)).await;
    let clean = eventually(30, || async {
        let (keys, mpus) = rig.leftovers(&id).await;
        keys == vec![format!("{PREFIX}/{id}")] && mpus.is_empty()
    })
    .await;
    let (keys, mpus) = rig.leftovers(&id).await;
    assert!(clean, "left behind after a touch and 30 s of sweeps: keys {keys:?}, multipart uploads {mpus:?}");
}

/// Fault 7: a hung S3 blocks takeover. Replica A's path to S3 is black-holed while it holds a
/// PATCH that fills a part; replica B takes the upload over within about one lease (not the
/// ≈ 25 s of A's S3 waits) and finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault7_a_replica_cut_from_s3_lets_another_take_over_within_about_a_lease() {
    let rig = Rig::start(2, &[]).await;
    let (a, b) = (rig.tus(0), rig.tus(1));
    let data = pseudo_random(12 * MIB + 1, 0x71);
    let url = a.create(data.len() as u64).await;
    let id = id_of(&url);
    let url_b = b.abs(&format!("/files/{id}"));
    let first = MIB;
    assert_eq!(a.patch(&url, 0, data[..first].to_vec(), &[]).await.status(), 204);

    let (tx, pending) = streaming_patch(&url, first as u64);
    let received = bytes_received(&rig.servers[0]).await;
    tx.send(Bytes::copy_from_slice(&data[first..first + MIB])).await.unwrap();
    wait_bytes_received(&rig.servers[0], received + MIB as u64).await;
    rig.proxies[0].set_black_hole(true);
    // Enough to fill part 1: A's next write to S3 (a tail segment or the part) goes into the
    // hole.
    let rest = data[first + MIB..first + 6 * MIB].to_vec();
    let feeder = tokio::spawn(async move {
        for piece in rest.chunks(256 << 10) {
            if tx.send(Bytes::copy_from_slice(piece)).await.is_err() {
                break;
            }
        }
        tx
    });
    let hung = eventually(60, || async { rig.proxies[0].in_hole(None, &id) > 0 }).await;
    assert!(hung, "A's requests for the upload reached the hole: {:?}", rig.proxies[0].seen());
    let t = Instant::now();
    let off = offset_when_free(&b, &url_b).await;
    let took = t.elapsed();
    eprintln!("B took the upload over {:.1} s after A's S3 hung (lease {} s)", took.as_secs_f64(), LEASE.as_secs());
    assert!(
        off <= (first + MIB) as u64,
        "B resumed at {off}, past what A had received when S3 hung; A: {:?}, B: {:?}",
        rig.proxies[0].seen(),
        rig.proxies[1].seen()
    );
    patch_rest(&b, &url_b, &data, off as usize, data.len()).await;
    assert_stored_sha256(&rig.servers[1], &url_b, &sha256_hex(&data)).await;
    rig.proxies[0].set_black_hole(false);
    drop(feeder);
    let _ = pending.await;
    assert!(took < 5 * LEASE, "B waited {:.1} s for an upload whose holder was stuck on S3 (lease {} s)", took.as_secs_f64(), LEASE.as_secs());
}

/// Fault 8, finished uploads: what HEAD, GET and lists select of a finished upload (its
/// catalog row's `blob_state`) keeps no per-part data — the completed object is all a read
/// needs, so a finished upload of two parts and one of seven carry the same (empty) state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault8_a_finished_upload_keeps_no_part_list_in_its_row() {
    let rig = Rig::start(1, &[]).await;
    let tus = rig.tus(0);
    let data = pseudo_random(31 * MIB + 7, 0x81);
    let q = "SELECT octet_length(blob_state)::BIGINT FROM uploads WHERE id = $1";
    let (small, large) = (&data[..6 * MIB + 7], &data[..]);
    let (f1, f2) = (tus.create(small.len() as u64).await, tus.create(large.len() as u64).await);
    patch_rest(&tus, &f1, small, 0, small.len()).await;
    // Part by part, so the unfinished row does carry the parts before the last PATCH.
    assert_eq!(tus.patch(&f2, 0, large[..12 * MIB].to_vec(), &[]).await.status(), 204);
    assert!(rig.sql_i64(q, &id_of(&f2)).await > 0, "an unfinished upload's row names its parts");
    patch_rest(&tus, &f2, large, 12 * MIB, large.len()).await;
    assert_stored_sha256(&rig.servers[0], &f1, &sha256_hex(small)).await;
    assert_stored_sha256(&rig.servers[0], &f2, &sha256_hex(large)).await;
    let (f_few, f_many) = (rig.sql_i64(q, &id_of(&f1)).await, rig.sql_i64(q, &id_of(&f2)).await);
    assert!(rig.proxies[0].count(Kind::UploadPart, &id_of(&f2)) >= 7, "seven parts or more were uploaded");
    assert_eq!((f_few, f_many), (0, 0), "a finished upload's hot row keeps per-part data");
    // Every read still serves every byte, ranges included.
    let got = client().get(f2.clone()).header("Range", "bytes=5242870-5242889").send().await.unwrap();
    assert_eq!(got.status(), 206);
    assert_eq!(&got.bytes().await.unwrap()[..], &large[5_242_870..5_242_890]);
}

/// Fault 8, unfinished uploads: what a read selects of an unfinished upload does not grow
/// with the number of parts (still open: the part list of an upload being written is in its
/// row, up to 5 000 × ≈ 46 bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault8_reads_of_an_unfinished_upload_fetch_no_per_part_data() {
    let rig = Rig::start(1, &[]).await;
    let tus = rig.tus(0);
    let len = 40 * MIB + 3;
    let data = pseudo_random(len, 0x81);
    let few = tus.create(len as u64).await;
    let many = tus.create(len as u64).await;
    assert_eq!(tus.patch(&few, 0, data[..6 * MIB + 7].to_vec(), &[]).await.status(), 204);
    assert_eq!(tus.patch(&many, 0, data[..31 * MIB + 7].to_vec(), &[]).await.status(), 204);
    let q = "SELECT octet_length(blob_state)::BIGINT FROM uploads WHERE id = $1";
    let (s_few, s_many) = (rig.sql_i64(q, &id_of(&few)).await, rig.sql_i64(q, &id_of(&many)).await);
    // (Two multipart ids may differ in length by a byte or so; one part inline was 42 bytes.)
    assert!(s_many.abs_diff(s_few) <= 8, "the hot row's S3 state grows with the parts of an unfinished upload: {s_few} → {s_many} bytes");
    // The part list is beside the row, one entry per part, and a writer still gets it whole.
    let parts = "SELECT count(*)::BIGINT FROM upload_blob_entries WHERE upload_id = $1";
    let part_bytes = "SELECT COALESCE(sum(octet_length(entry)), 0)::BIGINT FROM upload_blob_entries WHERE upload_id = $1";
    let (n_few, n_many) = (rig.sql_i64(parts, &id_of(&few)).await, rig.sql_i64(parts, &id_of(&many)).await);
    assert_eq!((n_few, n_many), (1, 6), "one entry per uploaded 5 MiB part");
    let beside = rig.sql_i64(part_bytes, &id_of(&many)).await;
    // Version 3 kept each part inline (with a 4-byte length more, and a 4-byte count), and no
    // 9-byte frame.
    eprintln!(
        "an unfinished upload of {n_many} parts: a read selects {s_many} bytes \
         of S3 state (it was {} inline); {beside} bytes of parts beside the row",
        s_many - 9 + 4 + beside + 4 * n_many
    );
    patch_rest(&tus, &many, &data, 31 * MIB + 7, 4 * MIB).await;
    assert_stored_sha256(&rig.servers[0], &many, &sha256_hex(&data)).await;
    assert_eq!(rig.sql_i64(parts, &id_of(&many)).await, 0, "a finished upload keeps no part beside its row either");
}

/// The proxy itself: a request reaches the upstream as ferry sent it — `Host` (which SigV4
/// signs) and the signed headers unchanged, the body byte for byte — so signatures stay valid
/// in front of a store that checks them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fault_proxy_forwards_requests_as_they_came() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = upstream.local_addr().unwrap();
    let got = tokio::spawn(async move {
        let (mut c, _) = upstream.accept().await.unwrap();
        let mut buf = Vec::new();
        loop {
            let mut chunk = [0u8; 65536];
            let n = c.read(&mut chunk).await.unwrap();
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                let len: usize = head.lines().find_map(|l| l.strip_prefix("content-length: ")).map(|v| v.trim().parse().unwrap()).unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    c.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.unwrap();
                    return buf;
                }
            }
            assert!(n > 0, "the proxy closed the connection early");
        }
    });
    let proxy = S3Proxy::start(&format!("http://{addr}")).await;
    let body = pseudo_random(300_000, 0xA1);
    let r = client()
        .put(format!("{}/ferry/up/x?partNumber=1&uploadId=abc", proxy.url))
        .header("host", "bucket.s3.example.com")
        .header("x-amz-content-sha256", sha256_hex(&body))
        .header(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=k/20260101/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256, Signature=00",
        )
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let raw = got.await.unwrap();
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..end]).to_string();
    assert!(head.starts_with("PUT /ferry/up/x?partNumber=1&uploadId=abc HTTP/1.1\r\n"), "{head}");
    let has = |h: &str| head.lines().any(|l| l.eq_ignore_ascii_case(h));
    assert!(has("host: bucket.s3.example.com"), "Host kept: {head}");
    assert!(has(&format!("x-amz-content-sha256: {}", sha256_hex(&body))), "{head}");
    assert!(
        has("authorization: AWS4-HMAC-SHA256 Credential=k/20260101/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256, Signature=00"),
        "{head}"
    );
    assert!(raw[end + 4..] == body[..], "the body byte for byte");
    assert_eq!(proxy.count(Kind::UploadPart, "ferry/up/x"), 1);
}

/// One replica; an upload of `len` bytes (seeded `seed`) of which the first `first` are sent and
/// acknowledged: the rig, a client, the bytes and the upload's URL.
async fn begun(len: usize, first: usize, seed: u64) -> (Rig, Tus, Vec<u8>, String) {
    let rig = Rig::start(1, &[]).await;
    let tus = rig.tus(0);
    let data = pseudo_random(len, seed);
    let url = tus.create(data.len() as u64).await;
    assert_eq!(tus.patch(&url, 0, data[..first].to_vec(), &[]).await.status(), 204);
    (rig, tus, data, url)
}

/// Builds `sizes` partials on `tus` and their final; returns the final's URL and its bytes.
async fn concatenation(tus: &Tus, sizes: &[usize], seed: u64) -> (String, Vec<u8>) {
    let (mut urls, mut all) = (Vec::new(), Vec::new());
    for (i, n) in sizes.iter().enumerate() {
        let part = pseudo_random(*n, seed + i as u64);
        let r = tus.post(&[("Upload-Length", &n.to_string()), ("Upload-Concat", "partial")]).await;
        assert_eq!(r.status(), 201);
        let u = tus.abs(header(&r, "location").unwrap());
        assert_eq!(tus.patch(&u, 0, part.clone(), &[]).await.status(), 204);
        all.extend_from_slice(&part);
        urls.push(u);
    }
    let r = tus.post(&[("Upload-Concat", &format!("final;{}", urls.join(" ")))]).await;
    assert_eq!(r.status(), 201);
    (tus.abs(header(&r, "location").unwrap()), all)
}

/// Issue 47, point 4: S3 errors are decided by status and code. A store that answers
/// `411 MissingContentLength` to a body-less PUT without `Content-Length` (AWS does) builds a
/// concatenation (ferry's UploadPartCopy says `Content-Length: 0`); a store without
/// UploadPartCopy (`501 NotImplemented`) builds it too, the parts streamed through ferry — not
/// a final "being built" for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concatenations_complete_on_a_store_that_wants_lengths_and_on_one_without_part_copy() {
    let rig = Rig::start(1, &[]).await;
    let proxy = &rig.proxies[0];
    proxy.set_strict(true);
    proxy.require_content_length(true);
    let tus = rig.tus(0);
    let sizes = [6 * MIB + 1, MIB + 3, 11 * MIB];

    let (fin, all) = concatenation(&tus, &sizes, 0x71).await;
    let done = eventually(60, || async { header(&tus.head(&fin).await, "upload-offset") == Some(all.len().to_string().as_str()) }).await;
    assert!(
        done,
        "the concatenation on a store that wants Content-Length never completed: {:?}",
        proxy.seen().iter().filter(|s| s.status >= 400).collect::<Vec<_>>()
    );
    assert_stored_sha256(&rig.servers[0], &fin, &sha256_hex(&all)).await;
    assert!(proxy.seen().iter().any(|s| s.kind == Kind::UploadPartCopy && s.status == 200), "parts were copied inside S3");
    assert!(proxy.seen().iter().all(|s| s.status != 411), "every PUT and POST said its length");

    proxy.refuse_copy(Some((501, "NotImplemented")));
    let (fin, all) = concatenation(&tus, &sizes, 0x81).await;
    let done = eventually(60, || async { header(&tus.head(&fin).await, "upload-offset") == Some(all.len().to_string().as_str()) }).await;
    assert!(done, "the concatenation on a store without UploadPartCopy never completed");
    assert_eq!(tus.download(&fin).await, all);
    assert!(proxy.seen().iter().any(|s| s.kind == Kind::UploadPartCopy && s.status == 501), "the store refused a copy");
    assert_uniform_parts(proxy);
}

/// Issue 47, point 4: a store's refusal for good (`403 AccessDenied`: a bucket policy, wrong
/// credentials) reaches the client as a named failure at once — 502 `store_refused`, not
/// retryable — and loses nothing: once the store takes writes again the upload resumes from
/// the offset it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_refusing_for_good_is_named_to_the_client_and_loses_nothing() {
    let (rig, tus, data, url) = begun(3 * MIB + 11, MIB, 0x91).await;
    let proxy = &rig.proxies[0];
    // The next tail segment's PUT is refused for good.
    proxy.fail_next(Kind::Put, 1, 403, "AccessDenied");
    let r = tus.patch(&url, MIB as u64, data[MIB..2 * MIB].to_vec(), &[]).await;
    assert_eq!(r.status(), 502);
    let body = r.text().await.unwrap();
    assert!(body.contains("store_refused") && body.contains("403 AccessDenied"), "{body}");
    assert!(
        !body.contains("<Error>") && !body.contains(&format!("/{PREFIX}/")) && !body.contains("127.0.0.1"),
        "no raw store answer reaches the client: {body}"
    );
    let at = offset_when_free(&tus, &url).await;
    assert_eq!(at, MIB as u64, "the acknowledged offset is kept");
    patch_rest(&tus, &url, &data, at as usize, MIB).await;
    assert_stored_sha256(&rig.servers[0], &url, &sha256_hex(&data)).await;
}

/// Issue 47, point 4: one `404 NoSuchUpload` from UploadPart is not proof that the multipart
/// upload is gone: ferry confirms with ListMultipartUploads before it rolls anything back, so a
/// stray 404 costs a retry (503), never the bytes already acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_404_from_upload_part_is_confirmed_before_anything_is_rolled_back() {
    let first = 6 * MIB + 7;
    let (rig, tus, data, url) = begun(16 * MIB + 3, first, 0xa1).await;
    let proxy = &rig.proxies[0];
    proxy.fail_next(Kind::UploadPart, 1, 404, "NoSuchUpload");
    let r = tus.patch(&url, first as u64, data[first..first + 5 * MIB].to_vec(), &[]).await;
    let status = r.status().as_u16();
    assert!(status == 204 || status == 503, "a stray 404 on a part: {status} {:?}", r.text().await);
    let at = offset_when_free(&tus, &url).await;
    assert!(at >= first as u64, "nothing acknowledged was rolled back (offset {at}, acknowledged {first})");
    patch_rest(&tus, &url, &data, at as usize, 4 * MIB + 1).await;
    assert_stored_sha256(&rig.servers[0], &url, &sha256_hex(&data)).await;
}

/// Issue 47, point 6: a client polling HEAD while the server finishes an upload (its last part
/// still on its way to S3) never cuts the finish — before, each HEAD took the upload over, the
/// finish was cut after 2 s and the last part sent again, so a client asking every
/// `Retry-After` kept a slow store from ever finishing it. Now HEAD answers 423 (retry) while
/// the finish holds the upload, and the last part is sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_while_an_upload_is_finished_never_cut_the_finish() {
    let (rig, tus, data, url) = begun(11 * MIB + 5, 10 * MIB, 0xc1).await;
    let proxy = &rig.proxies[0];
    let id = id_of(&url);
    let parts_before = proxy.count(Kind::UploadPart, &id);
    // The next part sent is the last one, at the finish: S3 stores it, its answer is held.
    let hold = proxy.hold(Kind::UploadPart, &id, HoldAt::Response);
    let last = tokio::spawn({
        let (tus, url, rest) = (Tus::new(&rig.servers[0]), url.clone(), data[10 * MIB..].to_vec());
        async move { tus.patch(&url, 10 * MIB as u64, rest, &[]).await }
    });
    tokio::time::timeout(Duration::from_secs(60), hold.arrived()).await.expect("the last part reached S3");
    // A client polls HEAD meanwhile (faster than Retry-After: 2 s asks).
    for _ in 0..8 {
        let h = tokio::time::timeout(Duration::from_secs(30), tus.head(&url)).await.expect("HEAD is answered while the finish is under way");
        let status = h.status().as_u16();
        assert!(status == 423 || status == 200, "HEAD during the finish: {status} {:?}", h.text().await);
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    hold.release();
    let r = tokio::time::timeout(Duration::from_secs(60), last).await.expect("the last PATCH is answered").unwrap();
    assert_eq!(r.status(), 204, "the finish was not cut: {:?}", r.text().await);
    assert_eq!(
        proxy.count(Kind::UploadPart, &id) - parts_before,
        1,
        "the last part was sent once: {:?}",
        proxy.seen().iter().filter(|s| s.kind == Kind::UploadPart).collect::<Vec<_>>()
    );
    assert_stored_sha256(&rig.servers[0], &url, &sha256_hex(&data)).await;
}

/// Issue 47, point 5: S3 may take minutes to assemble a CompleteMultipartUpload of thousands of
/// parts. A completion whose answer is slow (here: held 15 s, longer than the 10 s ferry gave
/// one before issue 47) is waited out — never sent a second time while the first may still be
/// under way — and the upload finishes with its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_completion_is_waited_out_never_sent_twice() {
    let (rig, _, data, url) = begun(11 * MIB + 5, 6 * MIB, 0xb1).await;
    let proxy = &rig.proxies[0];
    let id = id_of(&url);
    let hold = proxy.hold(Kind::Complete, &id, HoldAt::Response);
    let last = tokio::spawn({
        let (tus, url, rest) = (Tus::new(&rig.servers[0]), url.clone(), data[6 * MIB..].to_vec());
        async move { tus.patch(&url, 6 * MIB as u64, rest, &[]).await }
    });
    tokio::time::timeout(Duration::from_secs(60), hold.arrived()).await.expect("the completion reached S3");
    tokio::time::sleep(Duration::from_secs(15)).await;
    hold.release();
    let r = tokio::time::timeout(Duration::from_secs(60), last).await.expect("the last PATCH is answered").unwrap();
    assert_eq!(r.status(), 204, "{:?}", r.text().await);
    assert_eq!(
        proxy.count(Kind::Complete, &id),
        1,
        "one CompleteMultipartUpload, waited out: {:?}",
        proxy.seen().iter().filter(|s| s.kind == Kind::Complete).collect::<Vec<_>>()
    );
    assert_stored_sha256(&rig.servers[0], &url, &sha256_hex(&data)).await;
}
