//! Three `ferry serve` replicas on one PostgreSQL catalog and one S3 bucket (moto, or a prefix
//! of `FERRY_TEST_S3_BUCKET`: Garage in `.ci/run`, see tests/common/s3.rs), behind a round-robin
//! balancer, end to end (issue 11): real clients upload through the balancer and
//! every replica serves the downloads; a replica killed (`kill -9`) or frozen (`SIGSTOP`) in
//! the middle of a PATCH or of an `archive` task loses nothing while another finishes its work;
//! termination and expiry leave nothing behind in the bucket.
//!
//! The balancer (tests/common/balancer.rs) balances per HTTP *request*, not per connection: a
//! client that keeps one connection open still has each request served by the next replica,
//! so every chunk of an upload after the first is written by a replica that did not write the
//! previous one — it takes the lease over in the catalog, resumes from the committed part list
//! and tail, and continues the sha256 from the midstate. The replicas run with `--public-url`
//! naming the balancer, so `Location` and signed URLs point at it, as behind nginx.
//!
//! Needs PostgreSQL (`FERRY_TEST_PG`, see tests/common/pg.rs), moto (tests/common/moto.rs),
//! tus-js-client (tests/clients/node) — all installed by `.ci/run`.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::balancer::RoundRobin;
use common::pg::TestDb;
use common::s3::TestS3;
use common::*;
use futures::StreamExt;
use serde_json::Value;
use sha2::Digest;

const MIB: usize = 1 << 20;
const BUCKET: &str = "ferry";
/// Key prefix of the blobs in the bucket.
const PREFIX: &str = "up";

/// Three replicas, their catalog, their bucket and the balancer in front.
struct Cluster {
    // Dropped in this order: the replicas first, the database last.
    servers: Vec<Server>,
    proxy: RoundRobin,
    s3: TestS3,
    _db: TestDb,
}

impl Cluster {
    /// Start the S3, a fresh database and three replicas with `--leases catalog`, 2 s upload and
    /// task leases, and `extra` flags.
    async fn start(extra: &[&str]) -> Cluster {
        Cluster::start_public(extra, None).await
    }

    /// [`Cluster::start`] with `--public-url public` (another balancer in front) instead of
    /// this test balancer's URL.
    async fn start_public(extra: &[&str], public: Option<&str>) -> Cluster {
        let db = TestDb::create().await;
        let s3 = TestS3::start(BUCKET, 5 * MIB as u64).await;
        // The replicas inherit the AWS_* variables (nextest runs one test per process).
        s3.set_env();
        // S3's smallest parts, so a few MiB make a multipart upload.
        std::env::set_var("FERRY_S3_PART_SIZE", "5MiB");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let public = public.map(str::to_string).unwrap_or_else(|| format!("http://{}", listener.local_addr().unwrap()));
        let blobs = s3.url(PREFIX);
        let mut args = vec![
            "--catalog",
            db.url.as_str(),
            "--blobs",
            &blobs,
            "--leases",
            "catalog",
            "--upload-lease",
            "2s",
            "--task-lease",
            "2s",
            "--public-url",
            &public,
        ];
        args.extend_from_slice(extra);
        let servers: Vec<Server> = (0..3).map(|_| Server::start(&args)).collect();
        let proxy = RoundRobin::serve(listener, &servers.iter().map(|s| s.base.clone()).collect::<Vec<_>>());
        Cluster { servers, proxy, s3, _db: db }
    }

    /// A TUS client that talks to the balancer.
    fn tus(&self) -> Tus {
        Tus { c: client(), base: self.proxy.base.clone() }
    }

    /// `kill -9` replica `i` (the balancer stops sending it requests first, as a health check
    /// would).
    fn kill(&mut self, i: usize) {
        self.proxy.set_down(i);
        self.servers[i].kill9();
    }

    /// Start replica `i` again on its data dir and put it back into rotation.
    fn restart(&mut self, i: usize) {
        self.servers[i].restart();
        self.proxy.set_backend(i, &self.servers[i].base);
    }

    fn signal(&self, i: usize, sig: &str) {
        let ok = std::process::Command::new("kill").arg(format!("-{sig}")).arg(self.servers[i].child.id().to_string()).status().unwrap().success();
        assert!(ok, "kill -{sig}");
    }

    /// The bucket's keys that belong to upload `id`, and its unfinished multipart uploads.
    async fn leftovers(&self, id: &str) -> (Vec<String>, Vec<String>) {
        let keys = self.s3.keys().await.into_iter().filter(|k| k.contains(id)).collect();
        (keys, self.s3.multipart_uploads().await)
    }

    /// Download `path` through every replica directly: each must serve the same sha256.
    async fn assert_everywhere(&self, path: &str, sha: &str, len: u64) {
        let path = path.find("/files/").map(|i| &path[i..]).unwrap_or(path);
        for (i, s) in self.servers.iter().enumerate() {
            let (got, n) = download_sha256(&s.url(path)).await;
            assert_eq!((got.as_str(), n), (sha, len), "replica {i} serves {path}");
        }
    }
}

/// GET `url` streaming: (sha256 hex, bytes).
async fn download_sha256(url: &str) -> (String, u64) {
    let r = client().get(url).send().await.unwrap();
    assert_eq!(r.status(), 200, "GET {url}");
    let mut h = sha2::Sha256::new();
    let mut n = 0u64;
    let mut s = r.bytes_stream();
    while let Some(c) = s.next().await {
        let c = c.unwrap();
        n += c.len() as u64;
        h.update(&c);
    }
    (hex::encode(h.finalize()), n)
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

/// HEAD through the balancer until it answers 200 (a HEAD waits for a dead holder's lease to
/// expire and answers 423 if that takes longer than its wait); returns the offset.
async fn offset_when_free(tus: &Tus, url: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = tus.head(url).await;
        if r.status() == 200 {
            return header_u64(&r, "upload-offset").expect("Upload-Offset");
        }
        assert!(matches!(r.status().as_u16(), 423 | 502), "HEAD {url}: {}", r.status());
        assert!(Instant::now() < deadline, "the upload stayed locked for a minute");
    }
}

/// The replica that holds the open PATCH of upload `id` (the balancer knows where it sent it).
async fn patch_holder(proxy: &RoundRobin, id: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let [i] = proxy.in_flight("PATCH", id)[..] {
            return i;
        }
        assert!(Instant::now() < deadline, "no PATCH of {id} in flight");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A pseudo-random file of `len` bytes in `dir`; returns its path and sha256.
fn source(dir: &Path, name: &str, len: usize, seed: u64) -> (std::path::PathBuf, String) {
    let data = pseudo_random(len, seed);
    let p = dir.join(name);
    std::fs::write(&p, &data).unwrap();
    (p, sha256_hex(&data))
}

/// tus-js-client (5 MiB and 1 MiB chunks, 3 parallel uploads joined by concatenation) and
/// `ferry upload --parallel 4` upload 256 MiB each through the balancer; every replica
/// serves each file with the right sha256.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_upload_256_mib_through_three_replicas() {
    let c = Cluster::start(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let len = 256 * MIB;
    let (path, sha) = source(dir.path(), "big.bin", len, 0x256);
    let mut urls = Vec::new();
    for (opts, name) in
        [(r#"{"parallelUploads":3,"chunkSize":5242880}"#, "tus-js 5 MiB"), (r#"{"parallelUploads":3,"chunkSize":1048576}"#, "tus-js 1 MiB")]
    {
        let t = Instant::now();
        let out = run_json_client(node_script("tus_options.js", &[&c.proxy.base, path.to_str().unwrap(), opts]), 900).await;
        eprintln!("{name}: 256 MiB uploaded through 3 replicas in {:.1} s", t.elapsed().as_secs_f64());
        assert_eq!(out["posts"], 4, "3 partial uploads and the final one: {out}");
        urls.push((name, out["url"].as_str().unwrap().to_string()));
    }
    let cache = dir.path().join("cache");
    let t = Instant::now();
    let mut cmd = std::process::Command::new(ferry_bin());
    cmd.args(["upload", "--json", "--parallel", "4", path.to_str().unwrap()])
        .env("FERRY_SERVER", &c.proxy.base)
        .env("FERRY_CACHE_DIR", &cache)
        .env_remove("FERRY_TOKEN");
    let o = tokio::task::spawn_blocking(move || loopback_command_output(cmd)).await.unwrap();
    assert!(o.status.success(), "ferry upload: {}", String::from_utf8_lossy(&o.stderr));
    eprintln!("ferry upload --parallel 4: 256 MiB through 3 replicas in {:.1} s", t.elapsed().as_secs_f64());
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["sha256"], sha.as_str());
    urls.push(("ferry upload", v["url"].as_str().unwrap().to_string()));

    let t = Instant::now();
    for (name, url) in &urls {
        assert!(url.starts_with(&c.proxy.base), "{name}: the upload URL names the balancer: {url}");
        c.assert_everywhere(url, &sha, len as u64).await;
    }
    eprintln!("9 downloads of 256 MiB (3 files × 3 replicas) in {:.1} s", t.elapsed().as_secs_f64());

    // Per-request balancing: the PATCHes went to every replica.
    let served = c.proxy.served();
    let patches: Vec<_> = served.iter().filter(|s| s.method == "PATCH").collect();
    assert!(patches.iter().all(|s| s.status == 204), "every PATCH succeeded: {:?}", patches.iter().filter(|s| s.status != 204).collect::<Vec<_>>());
    assert_eq!(patches.iter().map(|s| s.replica).collect::<BTreeSet<_>>().len(), 3);
    // Finished uploads keep no multipart upload.
    assert_eq!(c.s3.multipart_uploads().await, Vec::<String>::new());
}

/// `std::process::Command::output` with no proxy variables (the client talks to loopback).
fn loopback_command_output(mut cmd: std::process::Command) -> std::process::Output {
    for v in ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "https_proxy", "HTTPS_PROXY"] {
        cmd.env_remove(v);
    }
    cmd.stdin(std::process::Stdio::null()).output().expect("run ferry")
}

/// 20 rounds: a PATCH streams through the balancer, the replica holding it is killed once it
/// has taken in at least 2 MiB more, and the client resumes through the balancer — on another
/// replica, after the dead holder's lease expired. No acknowledged byte is lost, the final
/// sha256 is right on every replica, and no multipart upload is left in the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_the_patch_holder_twenty_times_resumes_on_another_replica() {
    let mut c = Cluster::start(&["--checkpoint-every", "1MiB"]).await;
    let tus = c.tus();
    let data = pseudo_random(64 * MIB + 12_345, 0x20);
    let url = tus.create(data.len() as u64).await;
    let id = id_of(&url);
    let mut acknowledged = 0u64;
    let mut holders = Vec::new();
    for round in 0..20 {
        let off = offset_when_free(&tus, &url).await;
        assert!(off >= acknowledged, "round {round}: the offset went back from {acknowledged} to {off}: acknowledged bytes lost");
        acknowledged = off;
        // Each replica in turn holds the PATCH (the rotation alone would repeat a pattern).
        c.proxy.aim(round % 3);
        let (tx, patch) = streaming_patch(&url, off);
        let rest = data[off as usize..].to_vec();
        let feeder = tokio::spawn(async move {
            for piece in rest.chunks(64 << 10) {
                if tx.send(Bytes::copy_from_slice(piece)).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let w = patch_holder(&c.proxy, &id).await;
        let before = bytes_received(&c.servers[w]).await;
        wait_bytes_received(&c.servers[w], before + 2 * MIB as u64).await;
        c.kill(w);
        holders.push(w);
        feeder.abort();
        let _ = patch.await;
        // The next request goes to another replica; the dead one comes back for later rounds.
        let taken = offset_when_free(&tus, &url).await;
        assert!(taken >= acknowledged, "round {round}: the taker reports {taken} < {acknowledged}");
        acknowledged = taken;
        c.restart(w);
    }
    assert_eq!(holders.iter().collect::<BTreeSet<_>>().len(), 3, "the PATCHes were held by every replica: {holders:?}");
    eprintln!("PATCH holders killed, round by round: {holders:?}");
    let off = offset_when_free(&tus, &url).await;
    assert!(off >= acknowledged && off > 10 * MIB as u64, "the rounds made progress across parts: {off}");
    let r = tus.patch(&url, off, data[off as usize..].to_vec(), &[]).await;
    assert_eq!(r.status(), 204);
    c.assert_everywhere(&url, &sha256_hex(&data), data.len() as u64).await;
    let (keys, mpus) = c.leftovers(&id).await;
    assert_eq!(keys, vec![format!("{PREFIX}/{id}")], "only the finished object remains");
    assert_eq!(mpus, Vec::<String>::new(), "no multipart upload is left");
}

/// The replica holding a PATCH is frozen (`SIGSTOP`) after it took in 7 MiB (a whole part
/// uploaded); the client resumes through the balancer on another replica and finishes; the
/// frozen one wakes (`SIGCONT`) with a stale lease and bytes in its socket that are not the
/// file's. Its late bytes are never part of the file: every replica serves the right sha256,
/// and nothing it wrote late is left in the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_the_patch_holder_its_late_parts_are_never_referenced() {
    let c = Cluster::start(&["--checkpoint-every", "1MiB"]).await;
    let tus = c.tus();
    let data = pseudo_random(23 * MIB + 999, 0x57);
    let url = tus.create(data.len() as u64).await;
    let id = id_of(&url);
    let (tx, patch) = streaming_patch(&url, 0);
    for piece in data[..7 * MIB].chunks(256 << 10) {
        tx.send(Bytes::copy_from_slice(piece)).await.unwrap();
    }
    let a = patch_holder(&c.proxy, &id).await;
    wait_bytes_received(&c.servers[a], 7 * MIB as u64).await;
    c.signal(a, "STOP");
    c.proxy.set_down(a);
    // What A will find in its socket once it runs again: bytes that are not the file's,
    // enough to fill more parts.
    let garbage = tokio::spawn(async move {
        for _ in 0..48 {
            if tx.send(Bytes::from(vec![0xEE; 256 << 10])).await.is_err() {
                break;
            }
        }
        tx
    });
    let off = offset_when_free(&tus, &url).await;
    assert!(off <= 7 * MIB as u64, "resumed from a checkpoint A committed: {off}");
    eprintln!("A froze after 7 MiB; the upload resumed at {off}");
    let r = tus.patch(&url, off, data[off as usize..].to_vec(), &[]).await;
    assert_eq!(r.status(), 204, "another replica finished the upload while A was frozen");
    c.signal(a, "CONT");
    let tx = tokio::time::timeout(Duration::from_secs(60), garbage).await.expect("A reads its socket again").unwrap();
    drop(tx);
    let late = tokio::time::timeout(Duration::from_secs(60), patch).await.expect("A's PATCH ends").unwrap();
    if let Ok(r) = late {
        assert_ne!(r.status(), 204, "the frozen writer's PATCH must not succeed");
    }
    c.proxy.set_backend(a, &c.servers[a].base.clone());
    c.assert_everywhere(&url, &sha256_hex(&data), data.len() as u64).await;
    let (keys, mpus) = c.leftovers(&id).await;
    assert_eq!(keys, vec![format!("{PREFIX}/{id}")], "only the finished object remains");
    assert_eq!(mpus, Vec::<String>::new(), "no multipart upload is left");
}

/// `kill -9` of the replica running a 220 MiB `archive` task: another replica takes the task
/// over when its lease expires and resumes it from its checkpoint — the same output file,
/// progress never below the checkpoint — and the archive equals the reference built here
/// from the inputs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_the_archive_runner_another_replica_resumes_from_the_checkpoint() {
    let mut c = Cluster::start(&[]).await;
    let api = Api { c: client(), base: c.proxy.base.clone(), token: None };
    let a = pseudo_random(110 * MIB, 0xA1);
    let b = pseudo_random(110 * MIB + 12_345, 0xB2);
    let ia = api.upload(&a, "first.bin").await;
    let ib = api.upload(&b, "second.bin").await;
    let inputs = [(&a, "first.bin"), (&b, "second.bin")];
    let total = (a.len() + b.len()) as u64;
    let mut baseline = Vec::new();
    for s in &c.servers {
        baseline.push(task_bytes_written(s).await);
    }
    let args = format!(r#"{{"files":["{ia}","{ib}"],"format":"tar","name":"big.tar"}}"#);
    let t0 = Instant::now();
    let task = api.start("archive", &args).await;
    let tid = task["id"].as_str().unwrap().to_string();

    // The runner is the replica whose received bytes grow (the archive is written through the
    // upload path). Kill it once the archive is durable past byte 0 and progress went on
    // past that point (progress > durable offset: a checkpoint was committed before it).
    let deadline = Instant::now() + Duration::from_secs(300);
    let (runner, durable, partial_id) = loop {
        let v = api.task(&tid).await;
        assert_eq!(v["status"], "working", "the archive ended before it could be interrupted: {v}");
        let progress = v["progress"]["counters"]["bytes"].as_u64().unwrap_or(0);
        let list = json(api.get("/api/v1/files?limit=100").await).await;
        let out = list["files"].as_array().unwrap().iter().find(|f| f["name"] == "big.tar").cloned();
        if let Some(f) = out {
            let durable = f["offset"].as_u64().unwrap();
            if durable > 0 && progress > durable && progress < total - 32 * MIB as u64 {
                let mut grew = Vec::new();
                for (i, s) in c.servers.iter().enumerate() {
                    if task_bytes_written(s).await > baseline[i] {
                        grew.push(i);
                    }
                }
                assert_eq!(grew.len(), 1, "one replica writes the archive: {grew:?}");
                break (grew[0], durable, f["id"].as_str().unwrap().to_string());
            }
        }
        assert!(Instant::now() < deadline, "no checkpoint within 300 s: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    c.kill(runner);
    eprintln!("killed replica {runner} at archive offset {durable} of {total} bytes, {:.1} s after the start", t0.elapsed().as_secs_f64());
    let mut after = Vec::new();
    for (i, s) in c.servers.iter().enumerate() {
        after.push(if i == runner { 0 } else { task_bytes_written(s).await });
    }

    // Another replica resumes it; progress never goes below the checkpoint.
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut lowest = u64::MAX;
    let v = loop {
        let v = api.task(&tid).await;
        if v["status"] != "working" {
            break v;
        }
        if let Some(p) = v["progress"]["counters"]["bytes"].as_u64() {
            lowest = lowest.min(p);
        }
        assert!(Instant::now() < deadline, "not done within 300 s after the kill: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("archive of {total} bytes done {:.1} s after the start", t0.elapsed().as_secs_f64());
    assert_eq!(v["status"], "completed", "{v}");
    assert!(v["runs"].as_u64().unwrap() >= 2, "resumed by a new run: {v}");
    assert!(lowest >= durable.saturating_sub(4096), "progress went back to {lowest}, below the checkpoint at {durable}: the run started over");
    let f = &v["result"]["file"];
    assert_eq!(f["id"], partial_id.as_str(), "the resumed run finished the same file (a run from zero creates a new one)");
    let mut resumer = Vec::new();
    for (i, s) in c.servers.iter().enumerate() {
        if i != runner && task_bytes_written(s).await > after[i] {
            resumer.push(i);
        }
    }
    assert_eq!(resumer.len(), 1, "another replica finished it: {resumer:?}");
    // It wrote only what came after the checkpoint (a restart from zero would write it all).
    let written = task_bytes_written(&c.servers[resumer[0]]).await - after[resumer[0]];
    let archive_len = f["size"].as_u64().unwrap();
    assert!(written <= archive_len - durable, "the resumer wrote {written} bytes; the archive has {archive_len}, durable {durable}");

    // The reference: the tar built here from the inputs (headers as the archive has them,
    // checked by the tar crate: names and sizes), streamed into sha256.
    let (sha, n) = download_sha256(&c.proxy.url(&format!("/files/{partial_id}"))).await;
    assert_eq!((f["sha256"].as_str(), f["size"].as_u64()), (Some(sha.as_str()), Some(n)));
    let head = client().get(c.proxy.url(&format!("/files/{partial_id}"))).header("Range", "bytes=0-511").send().await.unwrap().bytes().await.unwrap();
    let second_at = 512 + a.len() + (512 - a.len() % 512) % 512;
    let head2 = client()
        .get(c.proxy.url(&format!("/files/{partial_id}")))
        .header("Range", format!("bytes={second_at}-{}", second_at + 511))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let mut reference = sha2::Sha256::new();
    let mut ref_len = 0u64;
    for ((data, name), hdr) in inputs.iter().zip([head, head2]) {
        let h = tar::Header::from_byte_slice(&hdr);
        assert_eq!(h.path().unwrap().to_str(), Some(*name));
        assert_eq!(h.size().unwrap(), data.len() as u64);
        assert_eq!(h.cksum().unwrap(), {
            let mut sum: u32 = hdr.iter().map(|&b| b as u32).sum();
            sum -= hdr[148..156].iter().map(|&b| b as u32).sum::<u32>();
            sum + 8 * b' ' as u32
        });
        let pad = (512 - data.len() % 512) % 512;
        reference.update(&hdr);
        reference.update(data);
        reference.update(vec![0u8; pad]);
        ref_len += 512 + data.len() as u64 + pad as u64;
    }
    reference.update([0u8; 1024]);
    ref_len += 1024;
    assert_eq!((hex::encode(reference.finalize()), ref_len), (sha, n), "the resumed archive = the reference tar");
}

/// Termination through the balancer, and expiry by the sweepers of three replicas, leave no
/// object and no multipart upload of the upload in the bucket — also when the upload was
/// written by several replicas (parts, tail segments).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_and_expired_uploads_leave_nothing_in_the_bucket() {
    let c = Cluster::start(&["--expire-after", "5s", "--sweep-interval", "200ms"]).await;
    let tus = c.tus();
    let data = pseudo_random(13 * MIB + 7, 0x7E);
    let mut urls = Vec::new();
    for round in 0..2 {
        let url = tus.create(40 * MIB as u64).await;
        // Three PATCHes, each on the next replica: two parts and a tail.
        let mut at = 0;
        for len in [3 * MIB, 4 * MIB, 6 * MIB + 7] {
            let r = tus.patch(&url, at as u64, data[at..at + len].to_vec(), &[]).await;
            assert_eq!(r.status(), 204, "PATCH at {at}");
            at += len;
        }
        let (keys, mpus) = c.leftovers(&id_of(&url)).await;
        assert!(keys.iter().any(|k| k.contains(".tail/")), "a tail segment exists: {keys:?}");
        assert!(!mpus.is_empty(), "a multipart upload exists");
        // And one no marker names: what a writer killed between CreateMultipartUpload and
        // writing its marker leaves.
        let orphan = c.s3.create_multipart(&format!("{PREFIX}/{}", id_of(&url))).await;
        assert!(c.s3.multipart_uploads().await.contains(&orphan));
        if round == 0 {
            // Terminate the first (on whichever replica the DELETE lands).
            let r = tus.request("DELETE", &url, &[("Tus-Resumable", "1.0.0")], None).await;
            assert_eq!(r.status(), 204);
            let (keys, mpus) = c.leftovers(&id_of(&url)).await;
            assert_eq!(keys, Vec::<String>::new(), "termination left objects behind");
            assert_eq!(mpus, Vec::<String>::new(), "termination left a multipart upload");
        }
        urls.push(url);
    }
    // The second expires: no more bytes arrive, a sweeper tombstones it and aborts its blob.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = tus.head(&urls[1]).await.status().as_u16();
        if st == 410 || st == 404 {
            break;
        }
        assert!(Instant::now() < deadline, "the idle upload never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The sweeper tombstones first, then removes the blob: wait for that to be done.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (keys, mpus) = c.leftovers(&id_of(&urls[1])).await;
        if keys.is_empty() && mpus.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "expiry left objects {keys:?} and multipart uploads {mpus:?} behind");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all = c.s3.keys().await;
    assert!(!all.iter().any(|k| urls.iter().any(|u| k.contains(&id_of(u)))), "{all:?}");
}

/// The nginx configuration of the book's "Several replicas" walk-through
/// (docs/src/operating/replicas.md), a whole `nginx.conf`, run for real (Debian's nginx,
/// installed by `.ci/run`) in front of three replicas, only its ports replaced: `nginx -t`
/// accepts it, tus-js-client uploads through it with 1 MiB chunks and 3 parallel uploads (every
/// replica takes PATCHes), the TypeScript MCP SDK keeps its session through it, and downloads
/// through it stream the right bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_books_nginx_configuration_balances_three_replicas() {
    let block = book_nginx_conf();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let public = format!("http://127.0.0.1:{port}");
    let c = Cluster::start_public(&[], Some(&public)).await;
    let nginx = Nginx::start(&block, port, &c).await;
    let prefix = nginx.dir.path();
    let len = 24 * MIB + 333;
    let (path, sha) = source(prefix, "n.bin", len, 0x9);
    let out =
        run_json_client(node_script("tus_options.js", &[&public, path.to_str().unwrap(), r#"{"parallelUploads":3,"chunkSize":1048576}"#]), 300).await;
    let url = out["url"].as_str().unwrap();
    assert!(url.starts_with(&public), "{url}");
    c.assert_everywhere(url, &sha, len as u64).await;
    assert_eq!(download_sha256(url).await, (sha.clone(), len as u64), "a download through nginx");
    for (i, s) in c.servers.iter().enumerate() {
        assert!(bytes_received(s).await > 0, "nginx sent PATCHes to replica {i}");
    }

    let mcp = manifest_dir().join("tests/clients/mcp-ts");
    let node = std::env::var_os("FERRY_NODE").unwrap_or_else(|| "node".into());
    let mut cmd = loopback_command(node);
    cmd.current_dir(&mcp).arg(mcp.join("call_tool.mjs")).arg(format!("{public}/mcp"));
    let v = run_json_client(cmd, 120).await;
    assert_eq!(v["ok"]["size"], 3, "the TypeScript MCP SDK through nginx: {v}");

    // The longest name ferry accepts, in a script whose UTF-8 is 3 bytes a character, sent as
    // Uppy does (twice): HEAD (which answers the metadata back), GET and `?download=1` through
    // nginx, several times each — every replica answers them (no 502 "upstream sent too big
    // header"), and none is taken out of rotation by them (no "no live upstreams").
    let tus = Tus { c: client(), base: public.clone() };
    let name = format!("{}.pdf", "報告書".repeat(83) + "xx");
    assert_eq!(name.chars().count(), 255);
    let b64 = |s: &str| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, s);
    let md = format!("filename {},name {},filetype {}", b64(&name), b64(&name), b64("application/pdf"));
    let r = tus.post(&[("Upload-Length", "5"), ("Upload-Metadata", &md)]).await;
    assert_eq!(r.status(), 201, "a long name through nginx: {:?}", r.text().await);
    let long = tus.abs(header(&r, "location").unwrap());
    assert_eq!(tus.patch(&long, 0, b"%PDF-".to_vec(), &[]).await.status(), 204);
    for _ in 0..6 {
        let r = tus.head(&long).await;
        assert_eq!(r.status(), 200, "HEAD through nginx");
        assert!(header(&r, "upload-metadata").is_some_and(|m| m.contains(&b64(&name))));
        for get in [long.clone(), format!("{long}?download=1")] {
            let r = client().get(&get).send().await.unwrap();
            assert_eq!(r.status(), 200, "GET {get} through nginx");
            assert_eq!(r.bytes().await.unwrap().as_ref(), b"%PDF-");
        }
    }
    assert_eq!(client().get(format!("{public}/healthz")).send().await.unwrap().status(), 200);

    // The dashboard's Share through nginx on a port other than 80: the page's Origin (the
    // public URL, port included) is ferry's own; another origin is refused.
    let id = long.rsplit('/').next().unwrap();
    let share = |origin: String| {
        client()
            .post(format!("{public}/api/v1/files/{id}/share"))
            .header("origin", origin)
            .header("content-type", "application/json")
            .body(r#"{"scope":"download","ttl_ms":60000}"#)
            .send()
    };
    assert!(share(public.clone()).await.unwrap().status().is_success(), "Share from the dashboard through nginx");
    assert_eq!(share("http://evil.example".into()).await.unwrap().status(), 403);
}

/// nginx (Debian's, installed by `.ci/run`; `FERRY_NGINX` names another) running `conf`, the
/// book's `nginx.conf` with its ports replaced: listening on `port`, balancing `c`'s replicas.
/// SIGTERM to its master when dropped (a SIGKILL would orphan its workers).
struct Nginx {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl Nginx {
    async fn start(block: &str, port: u16, c: &Cluster) -> Nginx {
        let public = format!("http://127.0.0.1:{port}");
        let mut conf = replace_port(block, "127.0.0.1:8088", &format!("127.0.0.1:{port}"));
        for (i, s) in c.servers.iter().enumerate() {
            conf = replace_port(&conf, &format!("127.0.0.1:808{}", i + 1), &s.addr());
        }
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path();
        // nginx started as root runs its workers as its compiled-in user: let them through.
        std::fs::set_permissions(prefix, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::write(prefix.join("nginx.conf"), conf).unwrap();
        let nginx = std::env::var("FERRY_NGINX").unwrap_or_else(|_| "/usr/sbin/nginx".into());
        assert!(Path::new(&nginx).exists(), "{nginx} is missing: run .ci/run (apt-get install nginx) or set FERRY_NGINX");
        let conf_path = prefix.join("nginx.conf");
        let t =
            std::process::Command::new(&nginx).arg("-t").arg("-c").arg(&conf_path).arg("-p").arg(prefix).arg("-e").arg("error.log").output().unwrap();
        assert!(t.status.success(), "nginx -t: {}", String::from_utf8_lossy(&t.stderr));
        let child = std::process::Command::new(&nginx)
            .arg("-c")
            .arg(&conf_path)
            .arg("-p")
            .arg(prefix)
            .arg("-e")
            .arg("error.log")
            .arg("-g")
            .arg("daemon off;")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let nginx = Nginx { dir, child };
        let deadline = Instant::now() + Duration::from_secs(30);
        while client().get(format!("{public}/healthz")).send().await.map(|r| r.status() != 200).unwrap_or(true) {
            assert!(Instant::now() < deadline, "nginx did not answer on {public}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        nginx
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

/// Issue 48 kind 1's "done when": tus-js-client (Node, retries on, the whole file in one
/// PATCH, as reported) through the book's nginx in front of three replicas finishes every
/// upload while the replicas are killed (`kill -9`, restarted on their ports) and stopped
/// (SIGSTOP for 3 s) in turn: no client hangs (exits without a result), none fails, and each
/// file is whole on every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tus_js_client_through_nginx_finishes_every_upload_through_a_kill_and_stop_storm() {
    let block = book_nginx_conf();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let public = format!("http://127.0.0.1:{port}");
    let mut c = Cluster::start_public(&[], Some(&public)).await;
    let nginx = Nginx::start(&block, port, &c).await;
    let opts = r#"{"chunkSize":null,"retryDelays":[0,250,500,1000,2000,3000,5000,5000,5000,5000,5000,5000,5000,5000,5000,5000]}"#;
    let files: Vec<(std::path::PathBuf, String)> =
        (0..6).map(|i| source(nginx.dir.path(), &format!("s{i}.bin"), 48 * MIB + 1000 * i, 0x40 + i as u64)).collect();
    let clients = futures::future::join_all(
        files.iter().map(|(path, _)| run_json_client(node_script("tus_options.js", &[&public, path.to_str().unwrap(), opts]), 600)),
    );
    tokio::pin!(clients);
    let mut round = 0usize;
    let outs = loop {
        tokio::select! {
            outs = &mut clients => break outs,
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
        let i = round % 3;
        if round.is_multiple_of(2) {
            c.servers[i].restart_same_port();
        } else {
            c.signal(i, "STOP");
            tokio::time::sleep(Duration::from_secs(3)).await;
            c.signal(i, "CONT");
        }
        round += 1;
    };
    assert!(round >= 3, "the storm hit the replicas while the clients ran ({round} rounds)");
    for (out, (_, sha)) in outs.iter().zip(&files) {
        let url = out["url"].as_str().unwrap_or_else(|| panic!("a client finished without its upload: {out}"));
        let len = files.iter().find(|(_, s)| s == sha).map(|(p, _)| std::fs::metadata(p).unwrap().len()).unwrap();
        c.assert_everywhere(url, sha, len).await;
    }
}

/// The ```nginx block of the book's "Several replicas" chapter.
fn book_nginx_conf() -> String {
    let blocks = book::blocks(&book::text("docs/src/operating/replicas.md"), "nginx");
    assert_eq!(blocks.len(), 1, "the replicas chapter has one nginx.conf");
    blocks.into_iter().next().unwrap()
}

/// `text` with every `from` (an `IP:PORT` the book uses) replaced by `to`; panics when the text
/// does not name `from`.
fn replace_port(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "the book's walk-through names {from}");
    text.replace(from, to)
}

/// The book's "Several replicas" walk-through (docs/src/operating/replicas.md, "## The
/// walk-through"), run as written: its ```sh blocks in order as one bash script, with the
/// `nginx.conf` block saved as `$W/nginx.conf` where the text says so, only the lines that name
/// this machine's resources replaced — the work directory (`W=`), the catalog
/// (`export FERRY_CATALOG=`), the bucket (`export FERRY_BLOBS=`), the S3 endpoint and its
/// credentials (`export AWS_…`) — and the ports 8081–8083 and 8088 swapped for free ones. The
/// installed `ferry` is the binary under test. Three replicas start on PostgreSQL and S3, nginx
/// starts in front of them, `ferry upload` sends 50 MB through it in 8 MiB PATCHes and checks
/// the sha256; every replica received bytes. The chapter's stop block ends it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_books_replica_walk_through_runs_as_written() {
    let chapter = book::text("docs/src/operating/replicas.md");
    let walk = book::section(&chapter, "## The walk-through");
    let sh = book::blocks(&walk, "sh");
    assert_eq!(sh.len(), 3, "the walk-through: start the replicas, start nginx and upload, stop");
    let nginx = std::env::var("FERRY_NGINX").unwrap_or_else(|_| "/usr/sbin/nginx".into());
    assert!(Path::new(&nginx).exists(), "{nginx} is missing: run .ci/run (apt-get install nginx) or set FERRY_NGINX");

    let db = TestDb::create().await;
    let s3 = TestS3::start(BUCKET, 5 * MIB as u64).await;
    let ports: Vec<u16> = (0..4).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()).collect();
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("ferry-replicas");
    // nginx started as root runs its workers as its compiled-in user: let them through.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let aws: Vec<String> = s3.env().into_iter().map(|(k, v)| format!("{k}='{v}'")).collect();
    let lines = [
        ("W=", format!("W='{}'", w.display())),
        ("export FERRY_CATALOG=", format!("export FERRY_CATALOG='{}'", db.url)),
        ("export FERRY_BLOBS=", format!("export FERRY_BLOBS='{}'", s3.url(PREFIX))),
        ("export AWS_", format!("export {}", aws.join(" "))),
    ];
    let mut start = sh[0].clone();
    for (head, line) in &lines {
        start = replace_line(&start, head, line);
    }
    let conf = book_nginx_conf();
    assert!(!conf.contains("\nNGINX_CONF\n"));
    let script = format!(
        "set -euo pipefail\nexport PATH='{bin}':/usr/sbin:/usr/bin:/sbin:/bin\n\
         {start}\ncat >\"$W/nginx.conf\" <<'NGINX_CONF'\n{conf}NGINX_CONF\n{rest}",
        bin = ferry_bin().parent().unwrap().display(),
        rest = sh[1],
    );
    let script = swap_ports(&script, &ports);
    let stop = swap_ports(&format!("W='{}'\nexport PATH=/usr/sbin:/usr/bin:/sbin:/bin\n{}", w.display(), sh[2]), &ports);

    let run = |script: String, secs: u32| {
        let mut cmd = std::process::Command::new("timeout");
        cmd.arg(secs.to_string()).arg("bash").arg("-c").arg(script).stdin(std::process::Stdio::null());
        for v in ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "https_proxy", "HTTPS_PROXY", "FERRY_TOKEN", "FERRY_SERVER"] {
            cmd.env_remove(v);
        }
        cmd.env("HOME", dir.path()).env("FERRY_CACHE_DIR", dir.path().join("cache"));
        tokio::task::spawn_blocking(move || cmd.output().unwrap())
    };
    let out = run(script.clone(), 300).await.unwrap();
    // Before stopping: what each replica received.
    let mut received = Vec::new();
    for port in &ports[..3] {
        let text = match client().get(format!("http://127.0.0.1:{port}/metrics")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let n = text.lines().find_map(|l| l.strip_prefix("ferry_bytes_received_total ")).and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0);
        received.push(n as u64);
    }
    let stopped = run(stop, 60).await.unwrap();
    let logs: String = std::fs::read_dir(&w)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
                .map(|e| format!("--- {}\n{}", e.path().display(), std::fs::read_to_string(e.path()).unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the walk-through failed ({}):\n--- script\n{script}\n--- stdout\n{stdout}\n--- stderr\n{}\n{logs}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stopped.status.success(), "the stop block: {}", String::from_utf8_lossy(&stopped.stderr));

    let data = std::fs::read(w.join("big.bin")).unwrap();
    assert_eq!(data.len(), 50_000_000);
    let sha = hex::encode(sha2::Sha256::digest(&data));
    let public = format!("http://127.0.0.1:{}/files/", ports[3]);
    let line = stdout.lines().find(|l| l.starts_with(&public)).unwrap_or_else(|| panic!("no upload URL under {public} in {stdout:?}"));
    assert!(line.ends_with(&format!("\t{sha}")), "{line}");
    for (i, n) in received.iter().enumerate() {
        assert!(*n > 0, "replica {i} received no bytes through nginx: {received:?}\n{logs}");
    }
}

/// `text` with its line starting with `head` replaced by `line`; panics when there is none.
fn replace_line(text: &str, head: &str, line: &str) -> String {
    assert!(text.lines().any(|l| l.starts_with(head)), "the walk-through has no line starting with {head:?}:\n{text}");
    text.lines().map(|l| if l.starts_with(head) { line.to_string() } else { l.to_string() }).collect::<Vec<_>>().join("\n") + "\n"
}

/// `text` with the walk-through's ports 8081, 8082, 8083 and 8088 (as whole numbers) replaced
/// by `ports`, in one pass, so a new port that contains an old one is left alone.
fn swap_ports(text: &str, ports: &[u16]) -> String {
    const BOOK: [&str; 4] = ["8081", "8082", "8083", "8088"];
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let before_digit = i > 0 && bytes[i - 1].is_ascii_digit();
        let hit = (!before_digit)
            .then(|| BOOK.iter().position(|p| text[i..].starts_with(p) && !bytes.get(i + p.len()).is_some_and(u8::is_ascii_digit)))
            .flatten();
        match hit {
            Some(k) => {
                out.push_str(&ports[k].to_string());
                i += BOOK[k].len();
            }
            None => {
                let c = text[i..].chars().next().unwrap();
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    out
}
