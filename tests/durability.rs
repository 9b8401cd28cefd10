//! Dropped connections, stalled clients and racing writers: what arrived is kept, bytes
//! never interleave, and a newcomer learns the true offset.

mod common;
use common::*;
use std::io::Write;
use std::time::Duration;

/// Open a raw PATCH announcing `total` bytes and send only `sent` of `data`.
fn partial_patch(addr: &str, path: &str, offset: u64, data: &[u8], total: usize) -> std::net::TcpStream {
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    let head = format!(
        "PATCH {path} HTTP/1.1\r\nHost: {addr}\r\nTus-Resumable: 1.0.0\r\nContent-Type: application/offset+octet-stream\r\n\
         Upload-Offset: {offset}\r\nContent-Length: {total}\r\n\r\n"
    );
    sock.write_all(head.as_bytes()).unwrap();
    sock.write_all(data).unwrap();
    sock.flush().unwrap();
    sock
}

async fn wait_for_offset(t: &Tus, url: &str, want: u64) -> u64 {
    let mut last = 0;
    for _ in 0..100 {
        last = t.offset(url).await;
        if last == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    last
}

#[tokio::test]
async fn dropped_connection_keeps_what_arrived_and_resumes_byte_exact() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(1 << 20, 11);
    let url = t.create(data.len() as u64).await;
    let path = url.trim_start_matches(&s.base).to_string();
    let sock = partial_patch(&s.addr(), &path, 0, &data[..400_000], data.len());
    wait_bytes_received(&s, 400_000).await;
    drop(sock); // the client dies mid-body
    assert_eq!(wait_for_offset(&t, &url, 400_000).await, 400_000, "HEAD reports what was kept");
    assert_eq!(t.patch(&url, 400_000, data[400_000..].to_vec(), &[]).await.status(), 204);
    assert_eq!(sha256_hex(&t.download(&url).await), sha256_hex(&data));
}

#[tokio::test]
async fn a_silently_dead_client_is_taken_over_by_head() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(1 << 20, 12);
    let url = t.create(data.len() as u64).await;
    let path = url.trim_start_matches(&s.base).to_string();
    // The socket stays open and sends nothing more: no FIN, no RST.
    let _sock = partial_patch(&s.addr(), &path, 0, &data[..300_000], data.len());
    wait_bytes_received(&s, 300_000).await;
    let r = t.head(&url).await;
    assert_eq!(r.status(), 200, "HEAD takes the upload over instead of waiting forever");
    assert_eq!(header_u64(&r, "upload-offset"), Some(300_000));
    assert_eq!(t.patch(&url, 300_000, data[300_000..].to_vec(), &[]).await.status(), 204);
    assert_eq!(t.download(&url).await, data);
}

#[tokio::test]
async fn a_stalled_body_is_checkpointed_after_the_idle_timeout() {
    let s = Server::start(&["--idle-timeout", "500ms"]);
    let t = Tus::new(&s);
    let url = t.create(1 << 20).await;
    let path = url.trim_start_matches(&s.base).to_string();
    let _sock = partial_patch(&s.addr(), &path, 0, &[5u8; 100_000], 1 << 20);
    let mut in_flight = String::new();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        in_flight = t.c.get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
        if in_flight.contains("ferry_patches_in_flight 0") && in_flight.contains("ferry_bytes_received_total 100000") {
            break;
        }
    }
    assert!(in_flight.contains("ferry_patches_in_flight 0"), "{in_flight}");
    assert_eq!(t.offset(&url).await, 100_000);
}

/// A body that goes quiet does not keep its bytes in memory waiting for a full write batch
/// (2 MiB): they reach the blob store within about a second while the PATCH is still open (so
/// 1 000 slow uploads hold a second of their bytes, not a batch each), and the PATCH then
/// finishes as usual. fs store only: the S3 store copies a part's bytes by design.
#[tokio::test]
async fn a_quiet_body_hands_its_bytes_to_the_store_before_a_batch_fills() {
    if blobs_are_s3() {
        return;
    }
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(1 << 20, 13);
    let url = t.create(data.len() as u64).await;
    let path = url.trim_start_matches(&s.base).to_string();
    let id = path.rsplit('/').next().unwrap().to_string();
    let mut sock = partial_patch(&s.addr(), &path, 0, &data[..300_000], data.len());
    let mut stored = None;
    for _ in 0..200 {
        stored = s.blob_len(&id).await;
        if stored == Some(300_000) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(stored, Some(300_000), "the quiet body's bytes were handed to the store");
    sock.write_all(&data[300_000..]).unwrap();
    let mut answer = [0u8; 12];
    std::io::Read::read_exact(&mut sock, &mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 204", "{}", String::from_utf8_lossy(&answer));
    drop(sock);
    assert_eq!(t.download(&url).await, data);
}

#[tokio::test]
async fn racing_patches_never_interleave() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let len = 4usize << 20;
    let x = pseudo_random(len, 21);
    let y = pseudo_random(len, 22);
    let url = t.create(len as u64).await;
    // A streams X slowly in 64 KiB pieces.
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Vec<u8>, std::io::Error>>();
    let xs = x.clone();
    let feeder = std::thread::spawn(move || {
        for piece in xs.chunks(64 << 10) {
            if tx.unbounded_send(Ok(piece.to_vec())).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let c = t.c.clone();
    let u = url.clone();
    let a = tokio::spawn(async move {
        c.patch(&u)
            .header("Tus-Resumable", "1.0.0")
            .header("Content-Type", OCTET)
            .header("Upload-Offset", "0")
            .body(reqwest::Body::wrap_stream(rx))
            .send()
            .await
    });
    // Once A has stored some bytes, B sends Y from offset 0: A is asked to stop, keeps what it
    // wrote, B learns the offset.
    wait_bytes_received(&s, 256 << 10).await;
    let r = t.patch(&url, 0, y.clone(), &[]).await;
    let k = if r.status() == 409 {
        header_u64(&r, "upload-offset").unwrap()
    } else {
        panic!("B expected 409 after A stored bytes, got {}", r.status());
    };
    assert!(k > 0 && k < len as u64, "A kept a prefix: {k}");
    if let Ok(Ok(resp)) = a.await {
        assert!(resp.status().is_client_error(), "A was stopped: {}", resp.status());
    }
    let r = t.patch(&url, k, y[k as usize..].to_vec(), &[]).await;
    assert_eq!(r.status(), 204);
    feeder.join().unwrap();
    let got = t.download(&url).await;
    let mut want = x[..k as usize].to_vec();
    want.extend_from_slice(&y[k as usize..]);
    assert!(got == want, "bytes are X[..k] + Y[k..], never interleaved");
}

/// The file under `dir` whose name is `id` (a blob of the fs store).
fn blob_file(dir: &std::path::Path, id: &str) -> Option<std::path::PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = blob_file(&p, id) {
                return Some(f);
            }
        } else if p.file_name().is_some_and(|n| n == id) {
            return Some(p);
        }
    }
    None
}

/// Relaxed durability after a power cut (issue 48, kind 9): a file system that persisted the
/// blob's size before its data leaves zeros where the client's bytes were. The first resume
/// after the restart checks the stored bytes against the checkpointed sha256 midstate and,
/// as they differ, starts the upload again from 0 (409, cursor 0) instead of taking the zeros
/// for the client's bytes; intact bytes pass the same check and resume where they were.
#[tokio::test]
async fn relaxed_durability_resumes_only_bytes_that_match_the_checkpoint() {
    if blobs_are_s3() {
        // Relaxed durability is the file store's: S3 acknowledges only what it stored.
        return;
    }
    let data: Vec<u8> = (0..(3u32 << 20)).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let half = 1u64 << 20;
    let mut s = Server::start(&["--durability", "relaxed"]);
    let t = Tus::new(&s);
    let (damaged, intact) = (t.create(data.len() as u64).await, t.create(data.len() as u64).await);
    for url in [&damaged, &intact] {
        assert_eq!(t.patch(url, 0, data[..half as usize].to_vec(), &[]).await.status(), 204);
    }
    s.restart_same_port();
    // What a size-before-data file system leaves: the length stands, a block of it is zeros.
    let id = damaged.trim_end_matches('/').rsplit('/').next().unwrap();
    let file = blob_file(&s.data.join("blobs"), id).expect("the blob file");
    let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(8192)).unwrap();
    f.write_all(&[0u8; 4096]).unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(&file).unwrap().len(), half, "the size survived");

    let t = Tus::new(&s);
    let r = t.patch(&damaged, half, data[half as usize..].to_vec(), &[]).await;
    assert_eq!(r.status(), 409, "zeros are not taken for the client's bytes");
    assert_eq!(r.headers()["upload-offset"], "0");
    let p: serde_json::Value = r.json().await.unwrap();
    assert_eq!((p["code"].as_str(), p["partial"]["cursor"].as_u64()), (Some("offset_mismatch"), Some(0)), "{p}");
    assert_eq!(t.offset(&damaged).await, 0);
    assert_eq!(t.patch(&damaged, 0, data.clone(), &[]).await.status(), 204);

    // Intact bytes resume where they were.
    assert_eq!(t.patch(&intact, half, data[half as usize..].to_vec(), &[]).await.status(), 204);
    for url in [&damaged, &intact] {
        let got = client().get(url.as_str()).send().await.unwrap();
        assert_eq!(got.status(), 200);
        assert_eq!(sha256_hex(&got.bytes().await.unwrap()), sha256_hex(&data), "{url}");
    }
}
