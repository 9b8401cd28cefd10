//! Transcripts for the TUS extensions: checksum, checksum-trailer, creation-with-upload,
//! creation-defer-length, expiration, concatenation(-unfinished), and ferry's whole-upload
//! sha256 declared at creation.

mod common;
use base64::Engine as _;
use common::*;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn b64(d: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(d)
}

fn checksum(alg: &str, data: &[u8]) -> String {
    use digest::Digest;
    let d = match alg {
        "sha1" => sha1::Sha1::digest(data).to_vec(),
        "sha256" => sha2::Sha256::digest(data).to_vec(),
        "sha512" => sha2::Sha512::digest(data).to_vec(),
        "md5" => md5::Md5::digest(data).to_vec(),
        _ => unreachable!(),
    };
    format!("{alg} {}", b64(&d))
}

/// A checksummed chunk whose body pauses long enough for its first bytes to be handed to the
/// store (the quiet-body flush, after 1 s) and then fails its checksum: what was handed over is
/// cut again, the offset stays, and the right chunk then goes in whole.
#[tokio::test]
async fn a_chunk_that_pauses_then_fails_its_checksum_leaves_nothing_behind() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(600_000, 3);
    let url = t.create(data.len() as u64).await;
    let path = url.trim_start_matches(&s.base).to_string();
    let mut sock = std::net::TcpStream::connect(s.addr()).unwrap();
    let head = format!(
        "PATCH {path} HTTP/1.1\r\nHost: {}\r\nTus-Resumable: 1.0.0\r\nContent-Type: application/offset+octet-stream\r\n\
         Upload-Offset: 0\r\nUpload-Checksum: {}\r\nContent-Length: {}\r\n\r\n",
        s.addr(),
        checksum("sha256", b"something else"),
        data.len()
    );
    sock.write_all(head.as_bytes()).unwrap();
    sock.write_all(&data[..250_000]).unwrap();
    let id = url.rsplit('/').next().unwrap().to_string();
    if blobs_are_s3() {
        tokio::time::sleep(Duration::from_millis(2500)).await;
    } else {
        let mut stored = None;
        for _ in 0..200 {
            stored = s.blob_len(&id).await;
            if stored == Some(250_000) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(stored, Some(250_000), "the paused chunk's first bytes were handed to the store");
    }
    sock.write_all(&data[250_000..]).unwrap();
    let mut answer = [0u8; 12];
    sock.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 460", "{}", String::from_utf8_lossy(&answer));
    drop(sock);
    assert_eq!(t.offset(&url).await, 0, "the failed chunk added nothing");
    if !blobs_are_s3() {
        assert_eq!(s.blob_len(&id).await, Some(0), "the flushed bytes were cut again");
    }
    let r = t.patch(&url, 0, data.clone(), &[("Upload-Checksum", &checksum("sha256", &data))]).await;
    assert_eq!(r.status(), 204);
    assert_eq!(t.download(&url).await, data);
}

#[tokio::test]
async fn chunk_checksums_verify_and_mismatches_discard_the_chunk() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(4 * 300_000, 1);
    let url = t.create(data.len() as u64).await;
    for (i, alg) in ["sha1", "sha256", "sha512", "md5"].iter().enumerate() {
        let off = i * 300_000;
        let chunk = &data[off..off + 300_000];
        // A wrong checksum first: 460, the chunk is discarded, the offset stays.
        let wrong = checksum(alg, b"something else");
        let r = t.patch(&url, off as u64, chunk.to_vec(), &[("Upload-Checksum", &wrong)]).await;
        let v = problem(r, 460, "checksum_mismatch").await;
        assert_eq!(v["partial"]["cursor"], off as u64);
        assert_eq!(t.offset(&url).await, off as u64, "{alg}: offset unchanged");
        let right = checksum(alg, chunk);
        let r = t.patch(&url, off as u64, chunk.to_vec(), &[("Upload-Checksum", &right)]).await;
        assert_eq!(r.status(), 204, "{alg}");
    }
    assert_eq!(sha256_hex(&t.download(&url).await), sha256_hex(&data));
}

#[tokio::test]
async fn unknown_or_malformed_checksum_is_400_and_stores_nothing() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(10).await;
    for bad in ["crc32 AAAAAA==", "sha1", "sha1 !!!", "sha1 AAAAAAAAAAAAAAAAAAAAAAAAAAA-", "sha1  2jmj7l5rSw0yVb/vlWAYkK/YBwk="] {
        let r = t.patch(&url, 0, b"hello".to_vec(), &[("Upload-Checksum", bad)]).await;
        problem(r, 400, "invalid_argument").await;
    }
    assert_eq!(t.offset(&url).await, 0);
}

/// A checksum whose base64 is valid but whose digest has the wrong length for its algorithm is
/// a checksum that does not match (460, chunk discarded), not a malformed one (400) — as a
/// header on PATCH, as a trailer, and on a creation-with-upload body.
#[tokio::test]
async fn a_wrong_length_digest_is_a_mismatch_everywhere_a_checksum_is_read() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(10).await;
    // The reported input: sha1 with 21 bytes of valid base64.
    for wrong in ["sha1 AAAAAAAAAAAAAAAAAAAAAAAAAAAA", "sha256 AAAA", &format!("md5 {}", b64(&[0u8; 20])), &format!("sha512 {}", b64(&[0u8; 32]))] {
        let r = t.patch(&url, 0, b"hello".to_vec(), &[("Upload-Checksum", wrong)]).await;
        assert_eq!(header(&r, "upload-offset"), Some("0"), "{wrong}");
        let v = problem(r, 460, "checksum_mismatch").await;
        assert_eq!(v["partial"]["cursor"], 0, "{wrong}");
        assert_eq!(t.offset(&url).await, 0, "{wrong}: the chunk was discarded");
    }
    assert_eq!(t.patch(&url, 0, b"hello".to_vec(), &[("Upload-Checksum", &checksum("sha1", b"hello"))]).await.status(), 204);

    // As a trailer.
    let path = url.trim_start_matches(&s.base).to_string();
    let (st, text) = chunked_patch_with_trailer(&s.addr(), &path, 5, b"world", "Upload-Checksum: sha1 AAAAAAAAAAAAAAAAAAAAAAAAAAAA\r\n");
    assert_eq!(st, 460, "{text}");
    assert_eq!(t.offset(&url).await, 5);
    let (st, _) = chunked_patch_with_trailer(&s.addr(), &path, 5, b"world", "Upload-Checksum: sha1 !!!!\r\n");
    assert_eq!(st, 400, "a trailer that is not base64 is malformed");
    assert_eq!(t.offset(&url).await, 5);

    // On a creation-with-upload body: a mismatch as everywhere, and the refused creation leaves
    // no upload and names none (issue 23 item 4).
    let r = t
        .request(
            "POST",
            "/files/",
            &[("Tus-Resumable", "1.0.0"), ("Upload-Length", "5"), ("Content-Type", OCTET), ("Upload-Checksum", "sha1 AAAA")],
            Some(b"hello".to_vec()),
        )
        .await;
    assert!(header(&r, "location").is_none(), "a refused creation names no upload");
    assert!(header(&r, "upload-offset").is_none(), "nothing is left to resume");
    let v = problem(r, 460, "checksum_mismatch").await;
    assert_eq!(v["title"], "Checksum Mismatch", "TUS 1.0 §Checksum's name for 460");
    assert!(v.get("partial").is_none() && v["recovery_hint"].as_str().unwrap().contains("send the creation request again"), "{v}");
    let files = t.c.get(s.url("/api/v1/files")).send().await.unwrap().json::<serde_json::Value>().await.unwrap();
    assert_eq!(files["files"].as_array().unwrap().len(), 1, "only the first upload: {files}");
}

/// A declared whole-file sha256 (metadata `sha256`, `Repr-Digest`) is checked when the upload
/// completes; one that could never match is refused at creation, before any byte is sent, as an
/// invalid value (400) whose detail says so — apart from one that is not hex at all.
#[tokio::test]
async fn a_declared_sha256_of_the_wrong_length_is_refused_at_creation() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let short = "ab".repeat(31);
    let v =
        problem(t.post(&[("Upload-Length", "1"), ("Upload-Metadata", &format!("sha256 {}", b64(short.as_bytes())))]).await, 400, "invalid_argument")
            .await;
    assert!(v["detail"].as_str().unwrap().contains("62 hex digits"), "{v}");
    let v =
        problem(t.post(&[("Upload-Length", "1"), ("Upload-Metadata", &format!("sha256 {}", b64(b"not hex")))]).await, 400, "invalid_argument").await;
    assert!(v["detail"].as_str().unwrap().contains("not hexadecimal"), "{v}");
    let v =
        problem(t.post(&[("Upload-Length", "1"), ("Repr-Digest", &format!("sha-256=:{}:", b64(&[1u8; 31])))]).await, 400, "invalid_argument").await;
    assert!(v["detail"].as_str().unwrap().contains("32 bytes"), "{v}");
    let listed = t.c.get(s.url("/api/v1/files")).send().await.unwrap().json::<serde_json::Value>().await.unwrap();
    assert_eq!(listed["files"].as_array().map(Vec::len), Some(0), "nothing was created");
}

/// Send a raw HTTP/1.1 request (for trailers, which reqwest cannot send) and return the
/// status code and the whole response text.
fn raw(addr: &str, request: &[u8]) -> (u16, String) {
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    sock.write_all(request).unwrap();
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    while !String::from_utf8_lossy(&buf).contains("\r\n\r\n") {
        let n = sock.read(&mut tmp).unwrap();
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    (status, text)
}

fn chunked_patch_with_trailer(addr: &str, path: &str, offset: u64, body: &[u8], trailer: &str) -> (u16, String) {
    let mut req = format!(
        "PATCH {path} HTTP/1.1\r\nHost: {addr}\r\nTus-Resumable: 1.0.0\r\nContent-Type: application/offset+octet-stream\r\n\
         Upload-Offset: {offset}\r\nTrailer: Upload-Checksum\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    for part in body.chunks(1000) {
        req.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        req.extend_from_slice(part);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(format!("0\r\n{trailer}\r\n").as_bytes());
    raw(addr, &req)
}

#[tokio::test]
async fn checksum_trailer_is_verified() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(5_000, 2);
    let url = t.create(5_000).await;
    let path = url.trim_start_matches(&s.base).to_string();
    let (st, _) = chunked_patch_with_trailer(&s.addr(), &path, 0, &data[..2_500], &format!("Upload-Checksum: {}\r\n", checksum("sha256", b"nope")));
    assert_eq!(st, 460, "a wrong trailer checksum discards the chunk");
    assert_eq!(t.offset(&url).await, 0);
    let (st, _) = chunked_patch_with_trailer(&s.addr(), &path, 0, &data[..2_500], "");
    assert_eq!(st, 400, "an announced trailer that never arrives");
    assert_eq!(t.offset(&url).await, 0);
    let (st, text) =
        chunked_patch_with_trailer(&s.addr(), &path, 0, &data[..2_500], &format!("Upload-Checksum: {}\r\n", checksum("md5", &data[..2_500])));
    assert_eq!(st, 204, "{text}");
    let (st, _) =
        chunked_patch_with_trailer(&s.addr(), &path, 2_500, &data[2_500..], &format!("Upload-Checksum: {}\r\n", checksum("sha1", &data[2_500..])));
    assert_eq!(st, 204);
    assert_eq!(t.download(&url).await, data);
}

#[tokio::test]
async fn creation_with_upload_stores_the_first_chunk() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let r =
        t.request("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", "11"), ("Content-Type", OCTET)], Some(b"hello".to_vec())).await;
    assert_eq!(r.status(), 201);
    assert_eq!(header(&r, "upload-offset"), Some("5"));
    let url = t.abs(header(&r, "location").unwrap());
    assert_eq!(t.patch(&url, 5, b" world".to_vec(), &[]).await.status(), 204);
    assert_eq!(t.download(&url).await, b"hello world");
    // A body with the wrong media type is refused before anything is created.
    let r = t
        .request("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", "5"), ("Content-Type", "text/plain")], Some(b"hello".to_vec()))
        .await;
    problem(r, 415, "invalid_argument").await;
    // A creation body with a failing checksum is refused whole: no upload is left, and the
    // answer names none (issue 23 item 4; tests/refusals.rs walks every such refusal).
    let r = t
        .request(
            "POST",
            "/files/",
            &[("Tus-Resumable", "1.0.0"), ("Upload-Length", "5"), ("Content-Type", OCTET), ("Upload-Checksum", &checksum("sha1", b"x"))],
            Some(b"hello".to_vec()),
        )
        .await;
    assert!(header(&r, "location").is_none(), "a refused creation names no upload");
    problem(r, 460, "checksum_mismatch").await;
    let files = t.c.get(s.url("/api/v1/files")).send().await.unwrap().json::<serde_json::Value>().await.unwrap();
    assert_eq!(files["files"].as_array().unwrap().len(), 1, "only the first upload: {files}");
}

#[tokio::test]
async fn deferred_length_is_declared_once() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let r = t.post(&[("Upload-Defer-Length", "1")]).await;
    assert_eq!(r.status(), 201);
    let url = t.abs(header(&r, "location").unwrap());
    let h = t.head(&url).await;
    assert_eq!(header(&h, "upload-defer-length"), Some("1"));
    assert!(header(&h, "upload-length").is_none());
    assert_eq!(t.patch(&url, 0, b"abc".to_vec(), &[]).await.status(), 204);
    problem(t.patch(&url, 3, b"d".to_vec(), &[("Upload-Length", "2")]).await, 400, "invalid_argument").await;
    let r = t.patch(&url, 3, b"def".to_vec(), &[("Upload-Length", "9")]).await;
    assert_eq!(r.status(), 204);
    assert_eq!(header(&r, "upload-length"), Some("9"));
    // The same length again is accepted; a different one is not.
    assert_eq!(t.patch(&url, 6, b"g".to_vec(), &[("Upload-Length", "9")]).await.status(), 204);
    problem(t.patch(&url, 7, b"h".to_vec(), &[("Upload-Length", "10")]).await, 400, "invalid_argument").await;
    assert_eq!(t.patch(&url, 7, b"hi".to_vec(), &[]).await.status(), 204);
    assert_eq!(t.download(&url).await, b"abcdefghi");
}

#[tokio::test]
async fn expired_uploads_answer_410_then_404_and_lose_their_bytes() {
    let s = Server::start(&["--expire-after", "1s", "--sweep-interval", "200ms"]);
    let t = Tus::new(&s);
    let url = t.create(10).await;
    let r = t.patch(&url, 0, b"abc".to_vec(), &[]).await;
    let expires = httpdate::parse_http_date(header(&r, "upload-expires").expect("Upload-Expires on PATCH")).unwrap();
    assert!(expires > std::time::SystemTime::now() - Duration::from_secs(1));
    let id = url.rsplit('/').next().unwrap().to_string();
    let done = t.create(1).await;
    assert_eq!(t.patch(&done, 0, b"x".to_vec(), &[]).await.status(), 204);

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = t.head(&url).await;
        if r.status() == 410 && s.blob_len(&id).await.is_none() {
            break;
        }
        assert!(Instant::now() < deadline, "never expired: {}", r.status());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    problem(t.patch(&url, 3, b"d".to_vec(), &[]).await, 410, "upload_expired").await;
    loop {
        if t.head(&url).await.status() == 404 {
            break;
        }
        assert!(Instant::now() < deadline, "tombstone never forgotten");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(t.download(&done).await, b"x", "finished uploads never expire");
    let metrics = t.c.get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("ferry_uploads_expired_total 1"), "{metrics}");
}

#[tokio::test]
async fn concatenation_of_finished_partials() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let mut urls = Vec::new();
    for part in [&b"hello "[..], b"big ", b"world"] {
        let len = part.len().to_string();
        let r = t.post(&[("Upload-Length", &len), ("Upload-Concat", "partial")]).await;
        assert_eq!(r.status(), 201);
        let url = t.abs(header(&r, "location").unwrap());
        assert_eq!(header(&t.head(&url).await, "upload-concat"), Some("partial"));
        assert_eq!(t.patch(&url, 0, part.to_vec(), &[]).await.status(), 204);
        urls.push(url);
    }
    // Parts may be named by absolute or relative URL, and repeated.
    let rel = urls[1].trim_start_matches(&s.base).to_string();
    let concat = format!("final;{} {} {} {}", urls[0], rel, urls[2], urls[1]);
    let r = t.post(&[("Upload-Concat", &concat), ("Upload-Metadata", "filename aGVsbG8udHh0")]).await;
    assert_eq!(r.status(), 201);
    let fin = t.abs(header(&r, "location").unwrap());
    let h = t.wait_complete(&fin).await;
    // Answered as this server's relative URLs, whatever form the request used.
    let ids: Vec<&str> = urls.iter().map(|u| u.rsplit('/').next().unwrap()).collect();
    let answered = format!("final;/files/{} /files/{} /files/{} /files/{}", ids[0], ids[1], ids[2], ids[1]);
    assert_eq!(header(&h, "upload-concat"), Some(answered.as_str()));
    assert_eq!((header(&h, "upload-offset"), header(&h, "upload-length")), (Some("19"), Some("19")));
    assert_eq!(t.download(&fin).await, b"hello big worldbig ");
    problem(t.patch(&fin, 19, b"x".to_vec(), &[]).await, 403, "conflict").await;
    problem(t.post(&[("Upload-Concat", "final;/files/aaaaaaaaaaaaaaaaaaaaaaaaaa")]).await, 400, "invalid_argument").await;
    let plain = t.create(1).await;
    problem(t.post(&[("Upload-Concat", &format!("final;{plain}"))]).await, 400, "invalid_argument").await;
    problem(t.post(&[("Upload-Concat", &format!("final;{}", urls[0])), ("Upload-Length", "6")]).await, 400, "invalid_argument").await;
}

#[tokio::test]
async fn concatenation_unfinished_completes_when_the_parts_do() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let a = {
        let r = t.post(&[("Upload-Length", "3"), ("Upload-Concat", "partial")]).await;
        t.abs(header(&r, "location").unwrap())
    };
    let b = {
        let r = t.post(&[("Upload-Defer-Length", "1"), ("Upload-Concat", "partial")]).await;
        t.abs(header(&r, "location").unwrap())
    };
    let r = t.post(&[("Upload-Concat", &format!("final;{a} {b}"))]).await;
    assert_eq!(r.status(), 201);
    let fin = t.abs(header(&r, "location").unwrap());
    let h = t.head(&fin).await;
    assert!(header(&h, "upload-offset").is_none(), "no Upload-Offset before the concatenation finished");
    assert!(header(&h, "upload-length").is_none(), "length not computable yet");
    // Nothing is sent to a final: its problem names its parts, with no offset to resume from.
    let p = problem(t.c.get(&fin).send().await.unwrap(), 409, "upload_incomplete").await;
    assert!(p["detail"].as_str().unwrap().contains("once each of its 2 parts is uploaded"), "{p}");
    assert!(p["recovery_hint"].as_str().unwrap().contains("Finish the parts"), "{p}");
    assert!(p.get("partial").is_none(), "{p}");
    assert_eq!(t.patch(&a, 0, b"abc".to_vec(), &[]).await.status(), 204);
    assert_eq!(t.patch(&b, 0, b"de".to_vec(), &[("Upload-Length", "2")]).await.status(), 204);
    let h = t.wait_complete(&fin).await;
    assert_eq!((header(&h, "upload-offset"), header(&h, "upload-length")), (Some("5"), Some("5")));
    assert_eq!(t.download(&fin).await, b"abcde");
}

#[tokio::test]
async fn declared_sha256_is_checked_at_completion() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(100_000, 3);
    let good = sha256_hex(&data);
    let md = format!("sha256 {}", b64(good.as_bytes()));
    let r = t.post(&[("Upload-Length", "100000"), ("Upload-Metadata", &md)]).await;
    let url = t.abs(header(&r, "location").unwrap());
    assert_eq!(t.patch(&url, 0, data[..50_000].to_vec(), &[]).await.status(), 204);
    let r = t.patch(&url, 50_000, data[50_000..].to_vec(), &[]).await;
    assert_eq!(r.status(), 204);
    assert_eq!(header(&r, "repr-digest").unwrap(), format!("sha-256=:{}:", b64(&hex::decode(&good).unwrap())));

    // Repr-Digest on the POST, and bytes that do not match: 460 and back to offset 0.
    let digest = format!("sha-256=:{}:", b64(&hex::decode(&good).unwrap()));
    let r = t.post(&[("Upload-Length", "100000"), ("Repr-Digest", &digest)]).await;
    let url = t.abs(header(&r, "location").unwrap());
    let mut corrupt = data.clone();
    corrupt[99_999] ^= 1;
    assert_eq!(t.patch(&url, 0, corrupt[..60_000].to_vec(), &[]).await.status(), 204);
    let v = problem(t.patch(&url, 60_000, corrupt[60_000..].to_vec(), &[]).await, 460, "checksum_mismatch").await;
    assert_eq!(v["partial"]["cursor"], 0);
    assert_eq!(t.offset(&url).await, 0, "reset to offset 0");
    assert_eq!(t.patch(&url, 0, data.clone(), &[]).await.status(), 204);
    assert_eq!(t.download(&url).await, data);
    problem(t.post(&[("Upload-Length", "1"), ("Upload-Metadata", &format!("sha256 {}", b64(b"zz")))]).await, 400, "invalid_argument").await;
}

#[tokio::test]
async fn unannounced_or_conflicting_trailers_are_refused() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(10).await;
    let path = url.trim_start_matches(&s.base).to_string();
    let wrong = format!("Upload-Checksum: {}\r\n", checksum("sha256", b"x"));
    let req = format!(
        "PATCH {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTus-Resumable: 1.0.0\r\nContent-Type: {OCTET}\r\n\
         Upload-Offset: 0\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n{wrong}\r\n"
    );
    let (st, _) = raw(&s.addr(), req.as_bytes());
    assert_eq!(st, 400, "an unannounced trailer cannot be verified");
    let good = checksum("sha256", b"hello");
    let req = format!(
        "PATCH {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTus-Resumable: 1.0.0\r\nContent-Type: {OCTET}\r\nUpload-Offset: 0\r\nUpload-Checksum: \
         {good}\r\nTrailer: Upload-Checksum\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n{wrong}\r\n"
    );
    let (st, _) = raw(&s.addr(), req.as_bytes());
    assert_eq!(st, 400, "header and trailer disagree");
    assert_eq!(t.offset(&url).await, 0);
}

#[tokio::test]
async fn a_part_an_unfinished_final_waits_on_is_not_terminated() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let a = {
        let r = t.post(&[("Upload-Length", "3"), ("Upload-Concat", "partial")]).await;
        t.abs(header(&r, "location").unwrap())
    };
    let fin = {
        let r = t.post(&[("Upload-Concat", &format!("final;{a}"))]).await;
        t.abs(header(&r, "location").unwrap())
    };
    // Terminating the part would leave the final waiting forever: refused, nothing deleted.
    let p = problem(t.request("DELETE", &a, &[("Tus-Resumable", "1.0.0")], None).await, 409, "conflict").await;
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.contains("is a part of final upload") && detail.contains(fin.rsplit('/').next().unwrap()), "{p}");
    assert!(p["recovery_hint"].as_str().unwrap().contains("terminate the final upload first"), "{p}");
    assert_eq!(header_u64(&t.head(&a).await, "upload-offset"), Some(0), "the part is still there");
    // The part is finished: the final completes with its bytes, and now the part may go.
    assert_eq!(t.patch(&a, 0, b"abc".to_vec(), &[]).await.status(), 204);
    assert_eq!(t.wait_complete(&fin).await.status(), 200);
    assert_eq!(t.request("DELETE", &a, &[("Tus-Resumable", "1.0.0")], None).await.status(), 204);
    assert_eq!(t.c.get(&fin).send().await.unwrap().bytes().await.unwrap().as_ref(), b"abc");
}
