//! `ferry check` (the real binary) and the `check` task kind against damage done behind
//! ferry's back: a flipped byte in a stored blob, a deleted blob or object, an orphan blob and
//! (S3, on moto) an orphan multipart upload. Checks the findings, the exit code, the JSON
//! summary, `--repair-catalog` (downloads answer `500 damaged`, and a restored file is served
//! again), the task's result and the `ferry_check_*` metrics.

mod common;

use std::process::Command;

use common::moto;
use common::*;
use serde_json::Value;

/// `ferry check` with `args` on the stores of `server` (its data dir, its PostgreSQL catalog
/// when the suite runs on one, `blobs` when given): (exit code, stdout JSON when `--json`).
fn check(server: &Server, blobs: Option<&str>, env: &[(&str, String)], args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(ferry_bin());
    cmd.arg("check").arg("--quiet").arg("--data").arg(&server.data);
    if let Ok(text) = std::fs::read_to_string(server.data.join("test-catalog")) {
        cmd.arg("--catalog").arg(text.trim().split_once(' ').unwrap().1);
    }
    if let Some(b) = blobs {
        cmd.arg("--blobs").arg(b);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    // A check that hangs (it once did on a FIFO among the blobs) fails the test instead.
    let out = output_within(cmd.args(args).env_remove("FERRY_CONFIG"), CHECK_DEADLINE);
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// How long one `ferry check` of these small stores may take before the test calls it hung.
const CHECK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

fn report(out: &(i32, String, String)) -> Value {
    serde_json::from_str(out.1.trim()).unwrap_or_else(|e| panic!("not one JSON object ({e}): {out:?}"))
}

fn ids(v: &Value) -> Vec<String> {
    let mut out: Vec<String> =
        v.as_array().unwrap().iter().map(|m| m.get("id").and_then(Value::as_str).or(m.as_str()).unwrap().to_string()).collect();
    out.sort();
    out
}

async fn metric(server: &Server, line_start: &str) -> u64 {
    let text = client().get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(line_start).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {line_start} in /metrics"))
}

fn blob_path(server: &Server, id: &str) -> std::path::PathBuf {
    server.data.join("blobs").join(&id[..2]).join(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_finds_a_flipped_byte_a_deleted_blob_and_an_orphan_on_fs() {
    if blobs_are_s3() {
        return; // this test damages files under DATA/blobs; the S3 test below covers S3
    }
    let server = Server::start(&[]);
    let api = Api::new(&server);
    let (a_bytes, b_bytes, c_bytes) = (pseudo_random(300_000, 1), pseudo_random(70_000, 2), pseudo_random(5_000, 3));
    let a = api.upload(&a_bytes, "a.bin").await;
    let b = api.upload(&b_bytes, "b.bin").await;
    let c = api.upload(&c_bytes, "c.bin").await;
    // An unfinished upload is not checked (it has no sha256 yet) and is no orphan.
    let tus = Tus::new(&server);
    let _unfinished = tus.create(100).await;

    let clean = check(&server, None, &[], &["--json"]);
    assert_eq!(clean.0, 0, "{clean:?}");
    let r = report(&clean);
    assert_eq!((r["files_checked"].as_u64(), r["ok"].as_u64()), (Some(3), Some(3)), "{r}");
    assert_eq!(r["bytes_read"].as_u64(), Some((a_bytes.len() + b_bytes.len() + c_bytes.len()) as u64));

    // Behind ferry's back: flip one byte of a, delete b, leave a blob no catalog row names.
    let mut damaged = a_bytes.clone();
    damaged[123_456] ^= 0x20;
    std::fs::write(blob_path(&server, &a), &damaged).unwrap();
    std::fs::remove_file(blob_path(&server, &b)).unwrap();
    let orphan = "orphanorphanorphanorphan22";
    std::fs::create_dir_all(blob_path(&server, orphan).parent().unwrap()).unwrap();
    std::fs::write(blob_path(&server, orphan), b"left behind").unwrap();

    let found = check(&server, None, &[], &["--json"]);
    assert_eq!(found.0, 4, "damage is exit 4: {found:?}");
    let r = report(&found);
    assert_eq!(ids(&r["mismatched"]), vec![a.clone()], "{r}");
    assert_eq!(r["mismatched"][0]["expected_sha256"], sha256_hex(&a_bytes));
    assert_eq!(r["mismatched"][0]["actual_sha256"], sha256_hex(&damaged));
    assert_eq!(ids(&r["missing"]), vec![b.clone()], "{r}");
    assert_eq!((r["missing"][0]["size"].as_u64(), r["missing"][0]["stored"].as_u64()), (Some(b_bytes.len() as u64), Some(0)));
    assert_eq!((r["files_checked"].as_u64(), r["ok"].as_u64()), (Some(3), Some(1)));
    assert_eq!(r["orphans_searched"], true);
    assert_eq!(ids(&r["orphan_blobs"]), vec![orphan.to_string()]);
    assert_eq!(r["marked_damaged"], serde_json::json!([]), "without --repair-catalog nothing is marked");
    // Without --repair-catalog the damaged file is still served (as it is stored).
    assert_eq!(api.download(&a).await, damaged);

    // Plain output: one line per finding.
    let plain = check(&server, None, &[], &[]);
    assert_eq!(plain.0, 4);
    assert!(
        plain.1.contains(&format!("mismatch\t{a}"))
            && plain.1.contains(&format!("missing\t{b}"))
            && plain.1.contains(&format!("orphan-blob\t{orphan}")),
        "{plain:?}"
    );

    // Named ids: only those, no orphan search; the whole one alone is exit 0.
    let one = check(&server, None, &[], &["--json", &c]);
    assert_eq!(one.0, 0, "{one:?}");
    assert_eq!(report(&one)["orphans_searched"], false);
    let unknown = check(&server, None, &[], &["--json", "aaaaaaaaaaaaaaaaaaaaaaaaaa"]);
    assert_eq!(unknown.0, 2, "an unknown id is exit 2: {unknown:?}");
    assert_eq!(report(&unknown)["skipped"], serde_json::json!([{ "id": "aaaaaaaaaaaaaaaaaaaaaaaaaa", "reason": "unknown" }]));
    let bad = check(&server, None, &[], &["not-an-id"]);
    assert_eq!(bad.0, 2, "{bad:?}");

    // The check task finds the same, and /metrics counts it.
    let t = api.start("check", r#"{"orphans": true, "rate": 100000000}"#).await;
    let done = api.wait_status(t["task_id"].as_str().or(t["id"].as_str()).unwrap(), "completed", 60).await;
    let tr = &done["result"];
    assert_eq!(ids(&tr["mismatched"]), vec![a.clone()], "{done}");
    assert_eq!(ids(&tr["missing"]), vec![b.clone()], "{done}");
    assert_eq!((tr["files_checked"].as_u64(), tr["ok"].as_u64(), tr["orphan_blobs"].as_u64()), (Some(3), Some(1), Some(1)), "{done}");
    assert_eq!(metric(&server, "ferry_check_findings_total{kind=\"sha256_mismatch\"}").await, 1);
    assert_eq!(metric(&server, "ferry_check_findings_total{kind=\"missing\"}").await, 1);
    assert_eq!(metric(&server, "ferry_check_findings_total{kind=\"orphan_blob\"}").await, 1);
    assert_eq!(metric(&server, "ferry_check_files_total").await, 3);
    assert_eq!(metric(&server, "ferry_check_read_bytes_total").await, (a_bytes.len() + c_bytes.len()) as u64);
    // A task with bad args is refused at the start.
    assert_eq!(api.start_raw("check", r#"{"rate": "fast"}"#, None, None).await.status(), 400);

    // --repair-catalog: both marked; downloads answer 500 damaged; the bytes are untouched.
    let repaired = check(&server, None, &[], &["--json", "--repair-catalog"]);
    assert_eq!(repaired.0, 4, "{repaired:?}");
    assert_eq!(ids(&report(&repaired)["marked_damaged"]), {
        let mut v = vec![a.clone(), b.clone()];
        v.sort();
        v
    });
    let r = api.send("GET", &format!("/files/{a}"), &[], None).await;
    let p = problem(r, 500, "damaged").await;
    assert_eq!(p["retryable"], false, "{p}");
    problem(api.send("GET", &format!("/files/{b}"), &[], None).await, 500, "damaged").await;
    assert_eq!(std::fs::read(blob_path(&server, &a)).unwrap(), damaged, "repair never rewrites bytes");
    assert!(blob_path(&server, orphan).exists(), "orphans are never removed");
    assert_eq!(api.download(&c).await, c_bytes, "whole files are served as before");

    // The operator restores a from a backup: the next repairing check clears its mark.
    std::fs::write(blob_path(&server, &a), &a_bytes).unwrap();
    let again = check(&server, None, &[], &["--json", "--repair-catalog", &a]);
    assert_eq!(again.0, 0, "{again:?}");
    assert_eq!(report(&again)["cleared_damage"], serde_json::json!([a.clone()]));
    assert_eq!(api.download(&a).await, a_bytes);
    // Deleting the damaged file takes its mark with it.
    assert_eq!(api.send("DELETE", &format!("/files/{b}"), &[("Tus-Resumable", "1.0.0")], None).await.status(), 204);
    std::fs::remove_file(blob_path(&server, orphan)).unwrap();
    let last = check(&server, None, &[], &["--json"]);
    assert_eq!(last.0, 0, "{last:?}");
}

/// A blob cut short, and a FIFO put where a blob was (break-it round 3): a download answers
/// `500 damaged` (not retryable: the bytes are gone, not briefly away) before any check has
/// marked them, a FIFO never holds up the server's threads (a plain `open` of it waits for a
/// writer), and `ferry check` finishes, reporting both `missing` with what is left, and marks
/// both with `--repair-catalog`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_cut_short_or_a_fifo_in_its_place_is_missing_and_holds_nothing_up() {
    if blobs_are_s3() {
        return; // damages files under DATA/blobs
    }
    let server = Server::start(&[]);
    let api = Api::new(&server);
    let (a_bytes, b_bytes, c_bytes) = (pseudo_random(300_000, 11), pseudo_random(70_000, 12), pseudo_random(5_000, 13));
    let a = api.upload(&a_bytes, "a.bin").await;
    let b = api.upload(&b_bytes, "b.bin").await;
    let c = api.upload(&c_bytes, "c.bin").await;
    std::fs::OpenOptions::new().write(true).open(blob_path(&server, &a)).unwrap().set_len(100_000).unwrap();
    std::fs::remove_file(blob_path(&server, &b)).unwrap();
    nix::unistd::mkfifo(&blob_path(&server, &b), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();

    let within = std::time::Duration::from_secs(20);
    for id in [&a, &b] {
        let r =
            tokio::time::timeout(within, api.send("GET", &format!("/files/{id}"), &[], None)).await.expect("a download of a damaged blob answers");
        let p = problem(r, 500, "damaged").await;
        assert_eq!(p["retryable"], false, "{p}");
    }
    // More downloads of the FIFO than the server has worker threads: it still answers others.
    let fifo = format!("/files/{b}");
    let many: Vec<_> = (0..8).map(|_| api.send("GET", &fifo, &[], None)).collect();
    for r in tokio::time::timeout(within, futures::future::join_all(many)).await.expect("every download of the FIFO answers") {
        assert_eq!(r.status(), 500);
    }
    assert_eq!(tokio::time::timeout(within, api.download(&c)).await.expect("other files are served"), c_bytes);

    let out = check(&server, None, &[], &["--json", "--repair-catalog"]);
    assert_eq!(out.0, 4, "damage is exit 4: {out:?}");
    let r = report(&out);
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(ids(&r["missing"]), both, "{r}");
    for m in r["missing"].as_array().unwrap() {
        let stored = if m["id"] == a.as_str() { 100_000 } else { 0 };
        assert_eq!(m["stored"].as_u64(), Some(stored), "{r}");
    }
    assert_eq!(ids(&r["marked_damaged"]), both, "{r}");
    assert_eq!(ids(&r["unchecked"]), Vec::<String>::new(), "{r}");
    problem(api.send("GET", &format!("/files/{a}"), &[], None).await, 500, "damaged").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_finds_a_flipped_byte_a_deleted_object_and_orphans_on_s3() {
    let moto = moto::Moto::start("ferry", 5 << 20).await;
    moto.set_env();
    let blobs = "s3://ferry/uploads";
    let server = Server::start(&["--blobs", blobs, "--s3-part-size", "5MiB"]);
    let api = Api::new(&server);
    // One larger than a part (a multipart upload when it was written), one smaller (one PUT).
    let (a_bytes, b_bytes, c_bytes) = (pseudo_random(6 << 20, 4), pseudo_random(40_000, 5), pseudo_random(1_000, 6));
    let a = api.upload(&a_bytes, "a.bin").await;
    let b = api.upload(&b_bytes, "b.bin").await;
    let c = api.upload(&c_bytes, "c.bin").await;
    let env = moto.env();
    let clean = check(&server, Some(blobs), &env, &["--json"]);
    assert_eq!(clean.0, 0, "{clean:?}");
    assert_eq!(report(&clean)["ok"].as_u64(), Some(3));

    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let object = |id: &str| format!("{}/ferry/uploads/{id}", moto.endpoint);
    let mut damaged = a_bytes.clone();
    damaged[5_000_000] ^= 1;
    assert!(http.put(object(&a)).body(damaged.clone()).send().await.unwrap().status().is_success());
    // Delete b's object behind the catalog's back (the test vouches; moto refuses unsigned DELETEs).
    let store = ferry::blob::S3BlobStore::from_url(blobs, ferry::blob::s3::MIN_PART).unwrap();
    ferry::blob::BlobStore::delete(&store, &ferry::blob::Unreferenced::vouched(b.as_str())).await.unwrap();
    let orphan = "orphanorphanorphanorphan33";
    assert!(http.put(object(orphan)).body("left behind").send().await.unwrap().status().is_success());
    let stray = "straystraystraystraystray4";
    let mp = moto.create_multipart("ferry", &format!("uploads/{stray}")).await;

    let found = check(&server, Some(blobs), &env, &["--json"]);
    assert_eq!(found.0, 4, "{found:?}");
    let r = report(&found);
    assert_eq!(ids(&r["mismatched"]), vec![a.clone()], "{r}");
    assert_eq!(r["mismatched"][0]["actual_sha256"], sha256_hex(&damaged));
    assert_eq!(ids(&r["missing"]), vec![b.clone()], "{r}");
    assert_eq!(ids(&r["orphan_blobs"]), vec![orphan.to_string()], "{r}");
    assert_eq!(r["orphan_multiparts"], serde_json::json!([{ "id": stray, "upload_id": mp }]), "{r}");

    let t = api.start("check", r#"{"orphans": true}"#).await;
    let done = api.wait_status(t["task_id"].as_str().or(t["id"].as_str()).unwrap(), "completed", 60).await;
    let tr = &done["result"];
    assert_eq!(ids(&tr["mismatched"]), vec![a.clone()], "{done}");
    assert_eq!(ids(&tr["missing"]), vec![b.clone()], "{done}");
    assert_eq!((tr["orphan_blobs"].as_u64(), tr["orphan_multiparts"].as_u64()), (Some(1), Some(1)), "{done}");
    assert_eq!(metric(&server, "ferry_check_findings_total{kind=\"orphan_multipart\"}").await, 1);

    let repaired = check(&server, Some(blobs), &env, &["--json", "--repair-catalog"]);
    assert_eq!(repaired.0, 4, "{repaired:?}");
    problem(api.send("GET", &format!("/files/{a}"), &[], None).await, 500, "damaged").await;
    assert_eq!(api.download(&c).await, c_bytes);
    assert_eq!(moto.multipart_uploads("ferry").await, vec![mp], "orphan multipart uploads are reported, never aborted");
}

/// Issue 48 kind 4: `ferry check` run again and again beside a server that is creating,
/// finishing and deleting uploads all the while never calls a live upload an orphan (a
/// creation makes its blob a moment before its row), nor a file deleted while it was read
/// damaged: every run exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_beside_a_busy_server_finds_no_orphan_and_no_damage() {
    let server = Server::start(&[]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..6u64 {
        let (tus, stop) = (Tus::new(&server), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let data = pseudo_random(4096, w * 1_000_000 + n);
                let url = tus.create(data.len() as u64).await;
                if n.is_multiple_of(2) {
                    assert_eq!(tus.patch(&url, 0, data, &[]).await.status(), 204);
                    if n.is_multiple_of(4) {
                        tus.request("DELETE", &url, &[], None).await;
                    }
                }
            }
            n
        }));
    }
    for run in 0..8 {
        let out = {
            let s = &server;
            tokio::task::block_in_place(|| check(s, None, &[], &["--json"]))
        };
        let r = report(&out);
        assert_eq!(r["orphan_blobs"], serde_json::json!([]), "run {run}: a live upload reported as an orphan: {out:?}");
        assert_eq!((r["mismatched"].clone(), r["missing"].clone()), (serde_json::json!([]), serde_json::json!([])), "run {run}: {out:?}");
        assert_eq!(out.0, 0, "run {run}: {out:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut made = 0;
    for w in workers {
        made += w.await.unwrap();
    }
    assert!(made > 50, "the server was busy: {made} uploads created");
}

/// Issue 48 kind 4: bytes no upload needs beside whole files — a blob longer than its file
/// (fs), and on S3 a finished upload's leftover `.created` marker — are reported (exit 9), and
/// the file itself is still whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_blob_longer_than_its_file_and_s3_leftovers() {
    let server = Server::start(&[]);
    let api = Api::new(&server);
    let a = api.upload(&pseudo_random(10_000, 7), "a.bin").await;
    use std::io::Write;
    std::fs::OpenOptions::new().append(true).open(blob_path(&server, &a)).unwrap().write_all(b"more").unwrap();
    let out = check(&server, None, &[], &["--json"]);
    assert_eq!(out.0, 9, "{out:?}");
    let r = report(&out);
    assert_eq!((r["ok"].as_u64(), r["longer"].clone()), (Some(1), serde_json::json!([{ "id": a, "size": 10_000, "stored": 10_004 }])), "{r}");

    let moto = moto::Moto::start("ferry", 5 << 20).await;
    moto.set_env();
    let blobs = "s3://ferry/left";
    let server = Server::start(&["--blobs", blobs, "--s3-part-size", "5MiB"]);
    let api = Api::new(&server);
    let b = api.upload(&pseudo_random(40_000, 8), "b.bin").await;
    let env = moto.env();
    assert_eq!(check(&server, Some(blobs), &env, &["--json"]).0, 0);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    assert!(http.put(format!("{}/ferry/left/{b}.created", moto.endpoint)).body("").send().await.unwrap().status().is_success());
    let out = check(&server, Some(blobs), &env, &["--json"]);
    assert_eq!(out.0, 9, "{out:?}");
    let r = report(&out);
    assert_eq!(
        (r["ok"].as_u64(), r["leftovers"].clone(), r["orphan_blobs"].clone()),
        (Some(1), serde_json::json!([b]), serde_json::json!([])),
        "{r}"
    );
}

/// `ferry check` against a store that is not the catalog's (a forgotten or mistyped `--blobs`):
/// it refuses, as `ferry serve` does, instead of calling every file missing — and with
/// `--repair-catalog`, marking every intact file damaged (found by a break-it run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_refuses_a_store_that_is_not_the_catalogs() {
    if blobs_are_s3() {
        return; // the other store below is a directory
    }
    let server = Server::start(&[]);
    let api = Api::new(&server);
    let id = api.upload(&pseudo_random(50_000, 21), "kept.bin").await;
    let other = tempfile::tempdir().unwrap();
    for args in [&[][..], &["--repair-catalog"][..]] {
        let (code, _, err) = check(&server, Some(other.path().to_str().unwrap()), &[], args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains("is not the one this catalog's uploads are in"), "{args:?}: {err}");
    }
    assert_eq!(api.download(&id).await, pseudo_random(50_000, 21), "no file was marked damaged");
    let (code, _, err) = check(&server, None, &[], &[]);
    assert_eq!(code, 0, "the catalog's own store checks clean: {err}");
}

/// How a test takes a store away: moto's state reset (the bucket and every object gone, as
/// after the bucket was deleted or misnamed), or the blob directory moved away (a disk not
/// mounted; moved back by [`Gone::back`]).
enum Gone {
    Bucket { endpoint: String },
    Dir { dir: std::path::PathBuf, moved: std::path::PathBuf },
}

impl Gone {
    async fn away(&self) {
        match self {
            Gone::Bucket { endpoint } => {
                let http = reqwest::Client::builder().no_proxy().build().unwrap();
                assert!(http.post(format!("{endpoint}/moto-api/reset")).send().await.unwrap().status().is_success());
                assert_eq!(http.head(format!("{endpoint}/ferry")).send().await.unwrap().status(), 404, "the bucket is gone");
            }
            Gone::Dir { dir, moved } => std::fs::rename(dir, moved).unwrap(),
        }
    }

    /// The store back as it was; `false` when this way cannot bring it back (moto keeps
    /// nothing of what it held).
    fn back(&self) -> bool {
        match self {
            Gone::Bucket { .. } => false,
            Gone::Dir { dir, moved } => {
                std::fs::rename(moved, dir).unwrap();
                true
            }
        }
    }
}

/// Issue 48: a store that is gone is not damage. With the bucket gone (or, on fs, the blob
/// directory), a download of a finished file answers the store's refusal (502
/// `store_refused`) — never 500 `damaged` — and marks nothing; a `check` task with
/// `repair_catalog` stops instead of calling every file missing and marking it; `ferry check
/// --repair-catalog` refuses the store (exit 1, nothing `missing`). No file's view says
/// damaged, and once the directory is back every file is served whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_gone_is_not_damage_and_marks_nothing() {
    let moto = moto::Moto::start("ferry", 5 << 20).await;
    moto.set_env();
    let blobs = "s3://ferry/uploads";
    let mut cases = vec![(Server::start(&["--blobs", blobs, "--s3-part-size", "5MiB"]), Some(blobs))];
    if !blobs_are_s3() {
        cases.push((Server::start(&[]), None));
    }
    for (server, blobs) in cases {
        let api = Api::new(&server);
        let mut files = Vec::new();
        for (i, n) in [40_000usize, 1_000].into_iter().enumerate() {
            let bytes = pseudo_random(n, 30 + i as u64);
            let id = api.upload(&bytes, &format!("f{i}.bin")).await;
            // Read once: on S3 that makes the object whole (a finish may be left to the first
            // read), so the objects kept below are the whole store.
            assert_eq!(api.download(&id).await, bytes);
            files.push((id, bytes));
        }
        let gone = match blobs {
            Some(_) => Gone::Bucket { endpoint: moto.endpoint.clone() },
            None => Gone::Dir { dir: server.data.join("blobs"), moved: server.data.join("blobs-unmounted") },
        };
        gone.away().await;
        for (id, _) in &files {
            let r = api.send("GET", &format!("/files/{id}"), &[], None).await;
            let status = r.status().as_u16();
            let p = json(r).await;
            assert!(status == 502 && p["code"] == "store_refused", "{blobs:?}: a store that is gone is no damage: {status} {p}");
        }
        let t = api.start("check", r#"{"repair_catalog": true}"#).await;
        let t = api.wait_status(t["task_id"].as_str().or(t["id"].as_str()).unwrap(), "failed", 60).await;
        assert!(t["result"]["missing"].as_array().is_none_or(|m| m.is_empty()), "{t}");
        let env = if blobs.is_some() { moto.env() } else { Vec::new() };
        let cli = check(&server, blobs, &env, &["--json", "--repair-catalog"]);
        assert_eq!(cli.0, 1, "{blobs:?}: a store that is gone is not checked: {cli:?}");
        assert!(!cli.1.contains("\"missing\":[{"), "{cli:?}");
        for (id, _) in &files {
            let v = json(api.send("GET", &format!("/api/v1/files/{id}"), &[], None).await).await;
            assert!(v["damaged"].is_null(), "{blobs:?}: nothing was marked: {v}");
        }
        if gone.back() {
            for (id, bytes) in &files {
                assert_eq!(&api.download(id).await, bytes, "{blobs:?}: {id} was never marked damaged");
            }
        }
    }
}
