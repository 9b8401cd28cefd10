//! Resource exhaustion (DESIGN §9, issue 9 item 6) on a real small filesystem: the data dir is
//! a tmpfs of a few tens of MiB that the uploads overflow. Needs root (to mount); it fails
//! loudly, never skips, without it.
//!
//! What must hold when the disk fills: the client gets `507 insufficient_storage` with the
//! resume cursor; the bytes the disk took before it filled are kept (fsync + checkpoint) and
//! anything past the new durable offset is released at once; a running PATCH stops at the
//! free-space reserve, however little room was left when it began; POST and DELETE keep working;
//! `/readyz` says which store is in trouble; an `archive` task that fills the disk fails with a
//! clear error and new tasks start afterwards; and everything recovers without a restart once
//! space returns.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// A tmpfs mounted for one test, unmounted (lazily, so open files cannot block it) on drop.
struct SmallFs {
    dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl SmallFs {
    fn mount(size_mib: u64) -> SmallFs {
        let is_root = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false);
        assert!(
            is_root,
            "tests/exhaustion.rs needs root: it mounts a small tmpfs as the data directory \
             to fill the disk for real (CI runs `.ci/run` as root); run it as root"
        );
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("fs");
        std::fs::create_dir(&dir).unwrap();
        let st = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"]).arg(&dir).status().expect("run mount");
        assert!(st.success(), "mount -t tmpfs failed ({st}); this test needs root and tmpfs");
        SmallFs { dir, _parent: parent }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Grow (or shrink) the filesystem in place.
    fn resize(&self, size_mib: u64) {
        let st = Command::new("mount").args(["-o", &format!("remount,size={size_mib}m")]).arg(&self.dir).status().unwrap();
        assert!(st.success(), "remount failed");
    }

    /// `(available, total)` bytes, as `df` computes them.
    fn space(&self) -> (u64, u64) {
        let st = nix::sys::statvfs::statvfs(&self.dir).unwrap();
        let unit = st.fragment_size() as u64;
        (st.blocks_available() as u64 * unit, st.blocks() as u64 * unit)
    }

    /// Write a file of zeros until the disk is full (or `max` bytes); returns its size.
    fn fill(&self, name: &str, max: u64) -> u64 {
        use std::io::Write;
        let mut f = std::fs::File::create(self.path(name)).unwrap();
        let block = vec![0u8; 64 << 10];
        let mut n = 0;
        while n < max {
            match f.write(&block[..((max - n).min(block.len() as u64)) as usize]) {
                Ok(0) => break,
                Ok(w) => n += w as u64,
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(nix::libc::ENOSPC), "filling {name}: {e}");
                    break;
                }
            }
        }
        n
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

fn id_of(url: &str) -> String {
    url.trim_end_matches('/').rsplit('/').next().unwrap().to_string()
}

async fn readyz(s: &Server) -> (u16, Value) {
    let r = client().get(s.url("/readyz")).send().await.unwrap();
    let status = r.status().as_u16();
    (status, json(r).await)
}

fn failing_check(v: &Value, store: &str) -> String {
    let c = v["checks"].as_array().unwrap().iter().find(|c| c["store"] == store).unwrap_or_else(|| panic!("no {store} check in {v}"));
    assert_eq!(c["ok"], false, "{v}");
    c["reason"].as_str().unwrap().to_string()
}

/// Poll `/readyz` until it answers `want` (readiness is measured, so it follows the disk).
async fn wait_ready(s: &Server, want: u16) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, v) = readyz(s).await;
        if status == want {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "/readyz never answered {want}; last: {status} {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_full_disk_answers_507_releases_the_tail_and_resumes_when_space_returns() {
    let fs = SmallFs::mount(80);
    let data = fs.path("data");
    let s = Server::start_in(&data, &["--min-free-space", "0", "--checkpoint-every", "16MiB"]);
    let tus = Tus::new(&s);
    let (_, total) = fs.space();

    // 120 MiB into 80 MiB, in one PATCH: the disk fills part-way.
    let body = pseudo_random((120 * MIB) as usize, 9);
    let url = tus.create(body.len() as u64).await;
    let id = id_of(&url);
    let r = tus.patch(&url, 0, body.clone(), &[]).await;
    assert_eq!(r.status(), 507, "PATCH past the disk's end");
    assert!(header(&r, "retry-after").is_some(), "507 carries Retry-After");
    let offset_header = header_u64(&r, "upload-offset");
    let p = problem(r, 507, "insufficient_storage").await;
    assert_eq!(p["retryable"], true, "{p}");
    let cursor = p["partial"]["cursor"].as_u64().unwrap_or_else(|| panic!("no cursor: {p}"));
    assert_eq!(offset_header, Some(cursor));
    // What the disk took before it filled is kept (fsync + checkpoint, less 1 MiB given back so
    // the catalog can record it): far more than the last periodic checkpoint (one every
    // 16 MiB), which is all an older ferry kept.
    assert!(cursor < 80 * MIB, "cursor {cursor}");
    assert!(
        cursor > total.saturating_sub(8 * MIB) && cursor % (16 * MIB) != 0,
        "cursor {cursor}: the bytes written before the disk filled were not kept (filesystem of {total})"
    );

    // The truth: HEAD, the JSON view and the blob on disk all say `cursor`; what was past it
    // is released, so the filesystem holds little beyond the committed bytes.
    assert_eq!(tus.offset(&url).await, cursor);
    let api = Api::new(&s);
    assert_eq!(api.file(&id).await["offset"], cursor);
    assert_eq!(s.blob_len(&id).await, Some(cursor), "the blob was cut to the committed offset");
    let (avail, _) = fs.space();
    assert!(total - avail <= cursor + 8 * MIB, "bytes past the cursor still occupy the disk: used {} of {total}, cursor {cursor}", total - avail);

    // The room given back keeps the server working: a new (small) upload and a DELETE work.
    let small = tus.create(64 << 10).await;
    assert_eq!(tus.patch(&small, 0, pseudo_random(64 << 10, 1), &[]).await.status(), 204);
    assert_eq!(wait_ready(&s, 200).await["ready"], true);

    // Now fill the disk to the last byte from outside: readiness names the blob store, a new
    // upload gets 507 (not 500), and DELETE still works — and frees space.
    fs.fill("filler", u64::MAX);
    let v = wait_ready(&s, 503).await;
    assert_eq!(v["ready"], false);
    assert!(failing_check(&v, "blobs").contains("cannot write"), "{v}");
    let r = tus.post(&[("Upload-Length", "1048576")]).await;
    assert!(matches!(r.status().as_u16(), 507 | 201), "POST on a full disk: {}", r.status());
    if r.status() == 507 {
        problem(r, 507, "insufficient_storage").await;
    }
    let r = tus.request("DELETE", &small, &[("Tus-Resumable", "1.0.0")], None).await;
    assert_eq!(r.status(), 204, "DELETE on a full disk");
    assert_eq!(tus.head(&small).await.status(), 404);

    // The space returns (the filler goes, the filesystem grows): no restart, the upload
    // resumes at its cursor and completes with the right sha256.
    std::fs::remove_file(fs.path("filler")).unwrap();
    fs.resize(200);
    assert_eq!(wait_ready(&s, 200).await["ready"], true);
    let r = tus.patch(&url, cursor, body[cursor as usize..].to_vec(), &[]).await;
    assert_eq!(r.status(), 204, "resume after space returned");
    assert_stored_sha256(&s, &url, &sha256_hex(&body)).await;
    // Creation keeps working too.
    let again = tus.create(10).await;
    assert_eq!(tus.patch(&again, 0, b"0123456789".to_vec(), &[]).await.status(), 204);
}

#[tokio::test]
async fn an_archive_task_that_fills_the_disk_fails_cleanly_and_tasks_start_afterwards() {
    let fs = SmallFs::mount(80);
    let data = fs.path("data");
    let s = Server::start_in(&data, &["--min-free-space", "0"]);
    let api = Api::new(&s);
    // Two 28 MiB files: their archive (56 MiB more) cannot fit next to them.
    let a = api.upload(&pseudo_random((28 * MIB) as usize, 1), "a.bin").await;
    let b = api.upload(&pseudo_random((28 * MIB) as usize, 2), "b.bin").await;
    let (_, total) = fs.space();

    for round in 0..2 {
        let t = api.start("archive", &format!(r#"{{"files":["{a}","{b}"],"format":"tar"}}"#)).await;
        let id = t["id"].as_str().unwrap().to_string();
        let v = api.wait_status(&id, "failed", 120).await;
        assert_eq!(v["error"]["code"], "insufficient_storage", "round {round}: {v}");
        // The partial archive was removed: the disk holds the two files and little else.
        let (avail, _) = fs.space();
        assert!(total - avail <= 56 * MIB + 8 * MIB, "round {round}: the failed archive still occupies the disk: used {}", total - avail);
    }

    // New tasks start and run (a stuck catalog transaction made every POST /api/v1/tasks 500).
    let tiny = api.upload(b"hello", "tiny.txt").await;
    for _ in 0..3 {
        let t = api.start("archive", &format!(r#"{{"files":["{tiny}"],"format":"tar"}}"#)).await;
        let v = api.wait_status(t["id"].as_str().unwrap(), "completed", 60).await;
        assert_eq!(v["status"], "completed", "{v}");
    }
    assert_eq!(readyz(&s).await.0, 200);
}

#[tokio::test]
async fn the_free_space_reserve_refuses_with_507_before_the_disk_is_full() {
    let fs = SmallFs::mount(80);
    let data = fs.path("data");
    let s = Server::start_in(&data, &["--min-free-space", "40MiB"]);
    let tus = Tus::new(&s);
    let api = Api::new(&s);

    // A creation whose Upload-Length cannot fit above the reserve: 507 at once.
    let r = tus.post(&[("Upload-Length", &(50 * MIB).to_string())]).await;
    let p = problem(r, 507, "insufficient_storage").await;
    assert!(p["detail"].as_str().unwrap().contains("reserve"), "{p}");
    // One that fits goes through.
    let url = tus.create(10 * MIB).await;
    assert_eq!(tus.patch(&url, 0, pseudo_random((10 * MIB) as usize, 3), &[]).await.status(), 204);
    assert_eq!(readyz(&s).await.0, 200);

    // Something else eats into the reserve: not ready (naming the reserve), new uploads and
    // PATCHes get 507 with the cursor, and task files are refused too.
    let half = pseudo_random((4 * MIB) as usize, 4);
    let part = tus.create(8 * MIB).await;
    assert_eq!(tus.patch(&part, 0, half.clone(), &[]).await.status(), 204);
    let (avail, _) = fs.space();
    fs.fill("filler", avail - 30 * MIB);
    let v = wait_ready(&s, 503).await;
    assert!(failing_check(&v, "free_space").contains("reserve"), "{v}");
    problem(tus.post(&[("Upload-Length", "1")]).await, 507, "insufficient_storage").await;
    let r = tus.patch(&part, 4 * MIB, half.clone(), &[]).await;
    let p = problem(r, 507, "insufficient_storage").await;
    assert_eq!(p["partial"]["cursor"], 4 * MIB, "{p}");
    let t = api.start("archive", &format!(r#"{{"files":["{}"],"format":"tar"}}"#, id_of(&url))).await;
    let v = api.wait_status(t["id"].as_str().unwrap(), "failed", 60).await;
    assert_eq!(v["error"]["code"], "insufficient_storage", "{v}");

    // The filler goes: ready again by itself, and the upload completes.
    std::fs::remove_file(fs.path("filler")).unwrap();
    wait_ready(&s, 200).await;
    assert_eq!(tus.patch(&part, 4 * MIB, half, &[]).await.status(), 204);
}

#[tokio::test]
async fn the_cli_gives_up_after_retry_for_on_a_full_disk_and_its_progress_never_goes_back() {
    let fs = SmallFs::mount(64);
    let data = fs.path("data");
    let s = Server::start_in(&data, &["--min-free-space", "0", "--checkpoint-every", "8MiB"]);
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("big.bin");
    std::fs::write(&file, pseudo_random((100 * MIB) as usize, 5)).unwrap();
    let cache = tempfile::tempdir().unwrap();

    let mut cmd = Command::new(ferry_bin());
    cmd.args(["upload", "--retry-for", "3s", "--chunk-size", "16MiB"]).arg(&file);
    cmd.env("FERRY_SERVER", &s.base).env("FERRY_CACHE_DIR", cache.path()).env_remove("FERRY_TOKEN").env_remove("http_proxy").env_remove("HTTP_PROXY");
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    // It must end by itself (it used to retry forever); the deadline only guards the test.
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("ferry upload --retry-for 3s was still retrying after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(5), "exit code 5 (gave up): {err}");
    assert!(err.contains("gave up"), "{err}");
    assert!(err.contains("insufficient_storage") || err.contains("507") || err.contains("full"), "{err}");
    // Plain progress lines `ferry: big.bin: N/TOTAL bytes …` never go backwards.
    let mut last = 0u64;
    for line in err.lines().filter(|l| l.starts_with("ferry: big.bin: ") && l.contains(" bytes (")) {
        let n: u64 = line["ferry: big.bin: ".len()..].split('/').next().unwrap().parse().unwrap();
        assert!(n >= last, "progress went back from {last} to {n}:\n{err}");
        last = n;
    }
}

/// The tester's case: a 50 MiB filesystem with the default reserve (5 %), free space filled
/// down to ~6 MiB above the reserve, then one 20 MiB PATCH. The PATCH stops at the reserve with
/// `507` and keeps what arrived (it used to write on until the disk was full, then throw every
/// byte away); the free space never drops below the reserve; the upload resumes at the cursor
/// once space returns. The IETF draft's append, on the same path, stops the same way.
#[tokio::test]
async fn a_running_patch_stops_at_the_reserve_and_keeps_what_arrived() {
    let fs = SmallFs::mount(50);
    let data = fs.path("data");
    // ferry's default reserve on a disk this small (5 %), named: the tests' own is 32 MiB.
    let s = Server::start_in(&data, &["--min-free-space", "5%"]);
    let tus = Tus::new(&s);
    let body = pseudo_random((20 * MIB) as usize, 31);
    let url = tus.create(body.len() as u64).await;
    let id = id_of(&url);
    let (avail, total) = fs.space();
    let reserve = total / 20;
    fs.fill("filler", avail - reserve - 6 * MIB);

    let r = tus.patch(&url, 0, body.clone(), &[]).await;
    assert_eq!(r.status(), 507, "a PATCH running into the reserve");
    let p = problem(r, 507, "insufficient_storage").await;
    let cursor = p["partial"]["cursor"].as_u64().unwrap_or_else(|| panic!("no cursor: {p}"));
    assert!(cursor >= MIB, "the bytes that arrived before the reserve were kept: cursor {cursor} ({p})");
    assert!(cursor <= 6 * MIB, "cursor {cursor} runs into the reserve");
    let (avail, _) = fs.space();
    assert!(avail + MIB >= reserve, "the PATCH ate into the reserve: {avail} bytes free, reserve {reserve}");
    assert_eq!(tus.offset(&url).await, cursor);
    assert_eq!(s.blob_len(&id).await, Some(cursor));

    // The IETF draft's append stops at the reserve too, keeping what it already has.
    let r = client()
        .patch(&url)
        .header("Upload-Draft-Interop-Version", "8")
        .header("Upload-Complete", "?0")
        .header("Content-Type", "application/partial-upload")
        .header("Upload-Offset", cursor.to_string())
        .body(body[cursor as usize..].to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 507, "draft append into the reserve");
    let p = json(r).await;
    let draft_cursor = p["partial"]["cursor"].as_u64().unwrap_or_else(|| panic!("no cursor: {p}"));
    assert!(draft_cursor >= cursor, "{p}");
    assert_eq!(tus.offset(&url).await, draft_cursor);

    // Space returns: the upload resumes from the cursor and completes intact.
    std::fs::remove_file(fs.path("filler")).unwrap();
    let r = tus.patch(&url, draft_cursor, body[draft_cursor as usize..].to_vec(), &[]).await;
    assert_eq!(r.status(), 204, "resume after space returned");
    assert_stored_sha256(&s, &url, &sha256_hex(&body)).await;
}

/// A body streamed slowly in 64 KiB pieces (so PATCHes sent at once overlap), as a PATCH at
/// `offset` of `data`.
async fn slow_patch(url: String, offset: u64, data: Vec<u8>) -> reqwest::Result<reqwest::Response> {
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> = data.chunks(64 << 10).map(|c| Ok(c.to_vec())).collect();
    let body = futures::StreamExt::then(futures::stream::iter(pieces), |p| async move {
        tokio::time::sleep(Duration::from_millis(2)).await;
        p
    });
    client()
        .patch(url)
        .header("Tus-Resumable", "1.0.0")
        .header("Content-Type", "application/offset+octet-stream")
        .header("Upload-Offset", offset.to_string())
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
}

/// The least free space seen while `work` runs (measured every 5 ms).
async fn least_free_during<T>(fs: &SmallFs, work: impl std::future::Future<Output = T>) -> (u64, T) {
    let least = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
    let (stop, dir) = (tokio_util::sync::CancellationToken::new(), fs.dir.clone());
    let watcher = {
        let (least, stop) = (least.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let st = nix::sys::statvfs::statvfs(&dir).unwrap();
                least.fetch_min(st.blocks_available() as u64 * st.fragment_size() as u64, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let out = work.await;
    stop.cancel();
    watcher.await.unwrap();
    (least.load(std::sync::atomic::Ordering::SeqCst), out)
}

/// Twenty PATCHes sent at once into 40 MiB of room above the reserve (a break-it run: each
/// writer measured free space on its own and used half the room *it* saw, so together they
/// filled the disk to 0 and got "the disk is full" instead of the reserve). They stop together
/// at the reserve, each with its cursor, and every upload then completes byte for byte.
#[tokio::test]
async fn patches_sent_at_once_stop_together_at_the_reserve() {
    let fs = SmallFs::mount(100);
    let data = fs.path("data");
    let s = Server::start_in(&data, &["--min-free-space", "16MiB"]);
    let tus = Tus::new(&s);
    let (avail, _) = fs.space();
    fs.fill("filler", avail - 56 * MIB);
    let mut uploads = Vec::new();
    for i in 0..20u64 {
        uploads.push((tus.create(8 * MIB).await, pseudo_random((8 * MIB) as usize, 100 + i)));
    }
    let sends = uploads.iter().map(|(url, body)| slow_patch(tus.abs(url), 0, body.clone()));
    let (least, answers) = least_free_during(&fs, futures::future::join_all(sends)).await;
    let mut refused = 0;
    for r in answers {
        let r = r.unwrap();
        if r.status() == 507 {
            let p = problem(r, 507, "insufficient_storage").await;
            assert!(p["detail"].as_str().unwrap().contains("reserve"), "refused at the reserve, not by a full disk: {p}");
            refused += 1;
        } else {
            assert_eq!(r.status(), 204);
        }
    }
    assert!(refused > 0, "160 MiB cannot fit into 40 MiB");
    assert!(least >= 12 * MIB, "free space fell to {least} bytes, far into the 16 MiB reserve");

    std::fs::remove_file(fs.path("filler")).unwrap();
    fs.resize(300);
    wait_ready(&s, 200).await;
    for (url, body) in &uploads {
        let at = tus.offset(url).await;
        if at < 8 * MIB {
            assert_eq!(tus.patch(url, at, body[at as usize..].to_vec(), &[]).await.status(), 204);
        }
        assert!(tus.download(url).await == *body, "{url} is not what was sent");
    }
}

/// A server killed mid-PATCH leaves bytes past the committed offset in the upload's file; the
/// next writer cuts them off. When the disk is below the reserve, that room is the upload's
/// own: a PATCH resuming it is accepted up to the reserve instead of refused at once (a
/// break-it run: 507 "nearly full" at offset 0 while its own 40 MiB of cut-off bytes held the
/// disk).
#[tokio::test]
async fn a_resumed_upload_reuses_the_room_its_cut_off_bytes_held() {
    let fs = SmallFs::mount(100);
    let data = fs.path("data");
    let mut s = Server::start_in(&data, &["--min-free-space", "16MiB", "--checkpoint-every", "1GiB"]);
    let tus = Tus::new(&s);
    let body = pseudo_random((60 * MIB) as usize, 9);
    let url = tus.create(60 * MIB).await;
    let sending = tokio::spawn(slow_patch(tus.abs(&url), 0, body.clone()));
    wait_bytes_received(&s, 40 * MIB).await;
    s.kill9();
    let _ = sending.await;
    s.restart_same_port();
    assert_eq!(tus.offset(&url).await, 0, "nothing was committed");
    let (avail, _) = fs.space();
    fs.fill("filler", avail.saturating_sub(8 * MIB));
    let r = tus.patch(&url, 0, body.clone(), &[]).await;
    let p = problem(r, 507, "insufficient_storage").await;
    let kept = p["partial"]["cursor"].as_u64().unwrap();
    assert!(kept >= 16 * MIB, "the PATCH could use the room its own cut-off bytes held, but kept {kept} bytes: {p}");
    let (free, _) = fs.space();
    assert!(free >= 12 * MIB, "free space fell to {free} bytes, far into the 16 MiB reserve");

    std::fs::remove_file(fs.path("filler")).unwrap();
    wait_ready(&s, 200).await;
    assert_eq!(tus.offset(&url).await, kept);
    assert_eq!(tus.patch(&url, kept, body[kept as usize..].to_vec(), &[]).await.status(), 204);
    assert!(tus.download(&url).await == body);
}

/// A concatenation copies its parts on a directory store: that copy shares the reserve with
/// every other writer (a break-it run: a `ferry upload --parallel 8` join beside other uploads
/// took free space 53 MB into an 80 MiB reserve, the copy being checked only when the final was
/// created). Here the room shrinks between the final's creation and its build: the build stops at
/// the reserve, and the final is built once space returns.
#[tokio::test]
async fn a_concatenation_copy_stops_at_the_reserve_and_is_built_later() {
    let fs = SmallFs::mount(100);
    let data = fs.path("data");
    let s = Server::start_in(&data, &["--min-free-space", "16MiB"]);
    let tus = Tus::new(&s);
    let (a_bytes, b_bytes) = (pseudo_random((16 * MIB) as usize, 41), pseudo_random((16 * MIB) as usize, 42));
    let partial = |len: u64| {
        let tus = &tus;
        async move {
            let r = tus.post(&[("Upload-Length", &len.to_string()), ("Upload-Concat", "partial")]).await;
            tus.abs(header(&r, "location").unwrap())
        }
    };
    let (a, b) = (partial(16 * MIB).await, partial(16 * MIB).await);
    assert_eq!(tus.patch(&a, 0, a_bytes.clone(), &[]).await.status(), 204);
    let r = tus.post(&[("Upload-Concat", &format!("final;{a} {b}"))]).await;
    assert_eq!(r.status(), 201, "32 MiB fit when the final is created");
    let fin = tus.abs(header(&r, "location").unwrap());
    // Something else takes the room: 20 MiB left above the reserve, B's 16 MiB fit, the copy's
    // 32 MiB do not.
    let (avail, _) = fs.space();
    fs.fill("filler", avail - 36 * MIB);
    // The build starts once the last part is stored, in the background: watch for a while.
    let (least, r) = least_free_during(&fs, async {
        let r = tus.patch(&b, 0, b_bytes.clone(), &[]).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        r
    })
    .await;
    assert_eq!(r.status(), 204, "the last part is stored");
    assert!(least >= 15 * MIB, "free space fell to {least} bytes, into the 16 MiB reserve");
    assert!(header(&tus.head(&fin).await, "upload-offset").is_none(), "the final is not built yet");

    std::fs::remove_file(fs.path("filler")).unwrap();
    wait_ready(&s, 200).await;
    tus.wait_complete(&fin).await;
    let whole: Vec<u8> = a_bytes.iter().chain(b_bytes.iter()).copied().collect();
    assert!(tus.download(&fin).await == whole);
}

/// `ferry upload --parallel` on a disk that holds the parts but not the join's copy (break-it
/// round 3: four unnamed parts were left behind with a generic hint): the parts are named
/// after the file, the 507 says they are kept and how to either join them later or remove
/// them, and a re-run once there is room joins the stored parts without sending them again.
#[tokio::test]
async fn a_parallel_upload_whose_join_does_not_fit_keeps_named_parts_and_says_what_next() {
    use common::cli::{code, ferry, ok_json, out, source, stderr};
    let fs = SmallFs::mount(56);
    let data = fs.path("data");
    let s = Server::start_in(&data, &["--min-free-space", "4MiB"]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (src, sha) = source(dir.path(), "big.bin", (28 * MIB) as usize, 61);
    let args = ["upload", "--json", "-q", "--parallel", "4", "--retry-for", "1s", src.to_str().unwrap()];
    let o = out(&mut ferry(&s.base, &cache, &args));
    assert_ne!(code(&o), 0, "28 MiB twice do not fit on 56 MiB: {}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("507") && err.contains("The 4 parts are stored and kept") && err.contains("without --parallel"), "{err}");

    let l = ok_json(&out(&mut ferry(&s.base, &cache, &["ls", "--json"])));
    let mut names: Vec<String> = l["files"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap_or_default().to_string()).collect();
    names.sort();
    assert_eq!(names, (1..=4).map(|k| format!("big.bin.part{k}of4")).collect::<Vec<_>>(), "{l}");
    let rm = err.split("`ferry rm ").nth(1).and_then(|r| r.split('`').next()).unwrap_or_else(|| panic!("no ferry rm line: {err}"));
    assert_eq!(rm.split(' ').count(), 4, "{err}");
    for id in rm.split(' ') {
        assert!(l["files"].as_array().unwrap().iter().any(|f| f["id"] == id), "{id} is not one of the parts: {l}");
    }

    fs.resize(120);
    wait_ready(&s, 200).await;
    let v = ok_json(&out(&mut ferry(&s.base, &cache, &args)));
    assert_eq!((v["sha256"].as_str(), v["sent"].as_u64()), (Some(sha.as_str()), Some(0)), "the stored parts are joined, not sent again: {v}");
}
