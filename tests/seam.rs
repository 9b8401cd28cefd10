//! The storage seam across time and processes (DESIGN §2 "Several replicas"): an upload that is
//! receiving bytes is alive, whatever the sweeper thinks of its expiry; a restarted server holds
//! `DATA/lock`, so it resumes what its previous incarnation held at once, and the progress it
//! reports never goes backwards.

mod common;
use common::*;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// Send a PATCH of `chunks` × `chunk` bytes at offset 0, one chunk every `every`, then return
/// the response's status line and headers.
fn trickle_patch(addr: &str, path: &str, chunk: usize, chunks: usize, every: Duration) -> String {
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    let head = format!(
        "PATCH {path} HTTP/1.1\r\nHost: {addr}\r\nTus-Resumable: 1.0.0\r\nContent-Type: application/offset+octet-stream\r\n\
         Upload-Offset: 0\r\nContent-Length: {}\r\n\r\n",
        chunk * chunks
    );
    sock.write_all(head.as_bytes()).unwrap();
    for i in 0..chunks {
        // Pacing the client, not waiting for the server: nothing is asserted after a sleep.
        std::thread::sleep(every);
        if sock.write_all(&vec![b'a' + (i % 26) as u8; chunk]).is_err() {
            break; // the server answered early; read what it said
        }
    }
    sock.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match sock.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

async fn trickle_outlives_expiry(extra: &[&str]) {
    // Issue 9 item 3: 100 B every 0.5 s for 8 s, with uploads expiring 3 s after their last
    // change and a sweep every second. Nothing else touches the upload.
    let mut args = vec!["--expire-after", "3s", "--sweep-interval", "1s"];
    args.extend_from_slice(extra);
    let s = Server::start(&args);
    let t = Tus::new(&s);
    let url = t.create(1600).await;
    let path = url.trim_start_matches(&s.base).to_string();
    let addr = s.addr();
    let answer = tokio::task::spawn_blocking(move || trickle_patch(&addr, &path, 100, 16, Duration::from_millis(500))).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 204"), "the slow PATCH was not cut off: {answer}");
    assert!(answer.to_ascii_lowercase().contains("upload-offset: 1600"), "{answer}");
    let body = t.download(&url).await;
    assert_eq!(body.len(), 1600);
    let metrics = client().get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("ferry_uploads_expired_total 0"), "nothing expired:\n{metrics}");
}

#[tokio::test]
async fn a_trickling_patch_outlives_expire_after() {
    trickle_outlives_expiry(&[]).await;
}

#[tokio::test]
async fn a_trickling_patch_outlives_expire_after_with_catalog_leases() {
    trickle_outlives_expiry(&["--leases", "catalog", "--upload-lease", "1s"]).await;
}

#[tokio::test]
async fn an_idle_unfinished_upload_still_expires() {
    // The other half of the CAS sweep: with nobody writing, expiry happens (410 while the
    // tombstone is kept).
    let s = Server::start(&["--expire-after", "1s", "--sweep-interval", "200ms"]);
    let t = Tus::new(&s);
    let url = t.create(100).await;
    assert_eq!(t.patch(&url, 0, vec![1; 10], &[]).await.status(), 204);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = client().get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
        if m.contains("ferry_uploads_expired_total 1") {
            break;
        }
        assert!(Instant::now() < deadline, "the sweeper never expired an idle upload");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(t.head(&url).await.status(), 410);
}

/// A shell job that prints `n` lines, reports progress every 10 lines and checkpoints only
/// every 200, so the progress clients saw is ahead of the checkpoint a resumed run restarts
/// from. Logs each start to `log`.
fn slow_lines_script(dir: &std::path::Path, log: &std::path::Path, n: u64) -> std::path::PathBuf {
    write_script(
        dir,
        "lines.sh",
        &format!(
            r#"echo "start ${{FERRY_CHECKPOINT:-none}}" >> '{log}'
i=${{FERRY_CHECKPOINT:-0}}
n=0
while [ $i -lt {n} ]; do
  i=$((i+1))
  line="line $i of {n}"
  printf '%s\n' "$line"
  n=$((n + ${{#line}} + 1))
  if [ $((i % 200)) -eq 0 ]; then
    echo "checkpoint $n $i" >&2
  fi
  if [ $((i % 10)) -eq 0 ]; then
    printf 'progress 0.%03d wrote %d lines\n' $((i * 999 / {n})) $i >&2
    sleep 0.02
  fi
done
"#,
            log = log.display()
        ),
    )
}

#[tokio::test]
async fn a_restarted_server_resumes_its_tasks_at_once_and_progress_never_goes_back() {
    const N: u64 = 4000;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs.log");
    let script = slow_lines_script(dir.path(), &log, N);
    let cfg = write_file(dir.path(), "ferry.toml", &format!("[commands.lines]\nprogram = \"{}\"\noutput_name = \"lines.txt\"\n", script.display()));
    let cfg = cfg.to_str().unwrap();
    // A long lease: a restart that waited for it would not resume within the deadline below.
    let args = ["--config", cfg, "--task-lease", "120s"];
    let mut s = Server::start(&args);
    let api = Api::new(&s);
    let tid = api.start("command", r#"{"command":"lines"}"#).await["id"].as_str().unwrap().to_string();

    // Wait until progress is past a checkpoint that is not on the same line (so a resumed run
    // restarts behind what clients saw), then kill.
    let deadline = Instant::now() + Duration::from_secs(120);
    let seen = loop {
        let v = api.task(&tid).await;
        assert_eq!(v["status"], "working", "the job ended before it could be interrupted: {v}");
        let f = v["progress"]["fraction"].as_f64().unwrap_or(0.0);
        let lines = (f * N as f64 / 0.999) as u64;
        if (1000..N - 1000).contains(&lines) && lines % 200 >= 60 && std::fs::read_to_string(&log).is_ok() {
            break f;
        }
        assert!(Instant::now() < deadline, "no progress within 120 s: {v}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    s.kill9();
    let seen = seen.max(api_fraction_after_kill(&s, &tid).await);

    s.restart_with(&args);
    let api = Api::new(&s);
    // Resumed at once: a second run starts and the task completes long before a 120 s lease
    // could have expired (the deadline is this test's own, far below it).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = seen;
    loop {
        let v = api.task(&tid).await;
        if let Some(f) = v["progress"]["fraction"].as_f64() {
            assert!(f >= last, "reported progress went backwards: {f} after {last}: {v}");
            last = f;
        }
        if v["status"] == "completed" {
            assert!(v["runs"].as_u64().unwrap() >= 2, "{v}");
            break;
        }
        assert_eq!(v["status"], "working", "{v}");
        assert!(Instant::now() < deadline, "the restarted server did not resume its own task at once (lease 120 s): {v}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let starts = std::fs::read_to_string(&log).unwrap();
    assert!(starts.lines().count() >= 2 && !starts.lines().last().unwrap().ends_with("none"), "resumed from a checkpoint: {starts}");
}

/// The progress fraction of `tid` as last stored (what clients could have seen last), read
/// through the catalog API from the dead server's data dir.
async fn api_fraction_after_kill(s: &Server, tid: &str) -> f64 {
    use ferry::catalog::TaskCatalog;
    let cat = ferry::catalog::SqliteCatalog::open(&s.data.join("ferry.db")).await.unwrap();
    cat.get_task(tid).await.unwrap().and_then(|t| t.progress.fraction).unwrap_or(0.0)
}

#[tokio::test]
async fn a_restarted_server_takes_its_own_upload_leases_back_at_once() {
    // With catalog leases of 120 s, a PATCH in flight at `kill -9` leaves a lease that would
    // block the upload for two minutes; the restarted server (same DATA, same owner id)
    // reclaims it, so HEAD answers at once with the durable offset and the upload resumes.
    let args = ["--leases", "catalog", "--upload-lease", "120s"];
    let mut s = Server::start(&args);
    let t = Tus::new(&s);
    let data = pseudo_random(1 << 20, 21);
    let url = t.create(data.len() as u64).await;
    let path = url.trim_start_matches(&s.base).to_string();
    assert_eq!(t.patch(&url, 0, data[..1000].to_vec(), &[]).await.status(), 204);
    // A PATCH that holds the lease and stays open.
    let mut sock = std::net::TcpStream::connect(s.addr()).unwrap();
    let head = format!(
        "PATCH {path} HTTP/1.1\r\nHost: {}\r\nTus-Resumable: 1.0.0\r\nContent-Type: \
         application/offset+octet-stream\r\nUpload-Offset: 1000\r\nContent-Length: {}\r\n\r\n",
        s.addr(),
        data.len() - 1000
    );
    sock.write_all(head.as_bytes()).unwrap();
    sock.write_all(&data[1000..5000]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = client().get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
        if m.contains("ferry_bytes_received_total 5000") {
            break;
        }
        assert!(Instant::now() < deadline, "the server never received the held PATCH's bytes");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.kill9();
    drop(sock);
    s.restart_with(&args);
    let t = Tus::new(&s);
    let url = t.abs(&path);
    let r = t.head(&url).await;
    assert_eq!(r.status(), 200, "HEAD after a restart is not locked out by the dead process's lease");
    let off = header_u64(&r, "upload-offset").unwrap();
    assert_eq!(off, 1000, "the bytes of the killed PATCH were never checkpointed");
    assert_eq!(t.patch(&url, off, data[off as usize..].to_vec(), &[]).await.status(), 204);
    assert_eq!(sha256_hex(&t.download(&url).await), sha256_hex(&data));
}
