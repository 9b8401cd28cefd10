//! Transcript tests for the IETF resumable-upload draft (draft-ietf-httpbis-resumable-upload)
//! at its newest interop version (8), served beside TUS 1.0 on `/files/`: creation with and
//! without content, completion in one request, resume after a dropped connection (HEAD, then
//! append), release-on-request of a lingering append, the draft's problem types (mismatching
//! offset with the right offset, completed upload, inconsistent length), cancellation, limits,
//! digests, `kill -9` mid-upload, and a draft upload used by the rest of ferry (Range download,
//! the file API, an `archive` task).

mod common;
use common::*;
use std::time::Duration;

const V: &str = "8";
const PARTIAL: &str = "application/partial-upload";

/// A request speaking the draft at interop version `V` (no `Tus-Resumable`).
async fn draft(t: &Tus, method: &str, url: &str, headers: &[(&str, &str)], body: Option<Vec<u8>>) -> reqwest::Response {
    let mut h = vec![("Upload-Draft-Interop-Version", V)];
    h.extend_from_slice(headers);
    t.request(method, url, &h, body).await
}

/// POST /files/ with the draft's headers; returns the response.
async fn create(t: &Tus, headers: &[(&str, &str)], body: Option<Vec<u8>>) -> reqwest::Response {
    draft(t, "POST", "/files/", headers, body).await
}

/// Append `body` at `offset` with `Upload-Complete: complete`.
async fn append(t: &Tus, url: &str, offset: u64, complete: bool, body: Vec<u8>) -> reqwest::Response {
    let off = offset.to_string();
    draft(t, "PATCH", url, &[("Content-Type", PARTIAL), ("Upload-Offset", &off), ("Upload-Complete", if complete { "?1" } else { "?0" })], Some(body))
        .await
}

async fn head(t: &Tus, url: &str) -> reqwest::Response {
    draft(t, "HEAD", url, &[], None).await
}

fn location(t: &Tus, r: &reqwest::Response) -> String {
    t.abs(header(r, "location").expect("Location"))
}

/// The upload's state as HEAD reports it: (offset, complete).
async fn state(t: &Tus, url: &str) -> (u64, bool) {
    let r = head(t, url).await;
    assert_eq!(r.status(), 204, "HEAD {url}");
    assert_eq!(header(&r, "cache-control"), Some("no-store"));
    (header_u64(&r, "upload-offset").unwrap(), header(&r, "upload-complete") == Some("?1"))
}

fn sha256_b64(data: &[u8]) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(data))
}

#[tokio::test]
async fn creation_without_content_then_appends_then_complete() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(300_000, 1);
    let r = create(&t, &[("Upload-Complete", "?0")], None).await;
    assert_eq!(r.status(), 201);
    assert_eq!(header(&r, "upload-complete"), Some("?0"));
    assert_eq!(header(&r, "upload-offset"), Some("0"));
    assert_eq!(header(&r, "upload-length"), None, "the length is not known yet");
    let limit = header(&r, "upload-limit").expect("Upload-Limit on creation");
    assert!(limit.contains("max-size=1099511627776") && limit.contains("max-age="), "{limit}");
    assert_eq!(header(&r, "tus-resumable"), None, "a draft response carries no TUS headers");
    let url = location(&t, &r);
    let r = head(&t, &url).await;
    assert_eq!(r.status(), 204);
    assert_eq!((header(&r, "upload-offset"), header(&r, "upload-complete"), header(&r, "cache-control")), (Some("0"), Some("?0"), Some("no-store")));
    assert!(header(&r, "upload-limit").is_some_and(|l| l.contains("max-size=")));

    let r = append(&t, &url, 0, false, data[..100_000].to_vec()).await;
    assert_eq!(r.status(), 204);
    assert_eq!((header(&r, "upload-offset"), header(&r, "upload-complete")), (Some("100000"), Some("?0")));
    let r = append(&t, &url, 100_000, true, data[100_000..].to_vec()).await;
    assert_eq!(r.status(), 200, "the completing append answers with the file");
    assert_eq!(
        (header(&r, "upload-offset"), header(&r, "upload-complete"), header(&r, "upload-length")),
        (Some("300000"), Some("?1"), Some("300000"))
    );
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!((v["complete"].as_bool(), v["size"].as_u64()), (Some(true), Some(300_000)), "{v}");
    assert_eq!(v["sha256"], sha256_hex(&data));
    assert_eq!(state(&t, &url).await, (300_000, true));
    assert_eq!(t.download(&url).await, data);
}

#[tokio::test]
async fn creation_with_content_complete_in_one_request() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(1 << 20, 2);
    let len = data.len().to_string();
    let r = create(&t, &[("Upload-Complete", "?1"), ("Upload-Length", &len), ("Content-Type", "image/png")], Some(data.clone())).await;
    assert_eq!(r.status(), 201);
    assert_eq!((header(&r, "upload-complete"), header(&r, "upload-offset")), (Some("?1"), Some(len.as_str())));
    let repr = header(&r, "repr-digest").unwrap().to_string();
    assert_eq!(repr, format!("sha-256=:{}:", sha256_b64(&data)));
    let url = location(&t, &r);
    assert_stored_sha256(&s, &url, &sha256_hex(&data)).await;

    // An empty representation: ?1 and no content.
    let r = create(&t, &[("Upload-Complete", "?1")], None).await;
    assert_eq!(r.status(), 201);
    assert_eq!((header(&r, "upload-complete"), header(&r, "upload-length")), (Some("?1"), Some("0")));
}

#[tokio::test]
async fn creation_with_partial_content_then_append() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(200_000, 3);
    let r = create(&t, &[("Upload-Complete", "?0"), ("Upload-Length", "200000")], Some(data[..50_000].to_vec())).await;
    assert_eq!(r.status(), 201);
    assert_eq!(
        (header(&r, "upload-offset"), header(&r, "upload-complete"), header(&r, "upload-length")),
        (Some("50000"), Some("?0"), Some("200000"))
    );
    let url = location(&t, &r);
    let r = append(&t, &url, 50_000, true, data[50_000..].to_vec()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(t.download(&url).await, data);
}

#[tokio::test]
async fn chunked_content_with_unknown_length_completes_at_its_end() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(500_000, 4);
    let r = create(&t, &[("Upload-Complete", "?0")], None).await;
    let url = location(&t, &r);
    // No Content-Length (a stream): the end of the body is the end of the upload.
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> = data.chunks(64 << 10).map(|c| Ok(c.to_vec())).collect();
    let r =
        t.c.patch(&url)
            .header("Upload-Draft-Interop-Version", V)
            .header("Content-Type", PARTIAL)
            .header("Upload-Offset", "0")
            .header("Upload-Complete", "?1")
            .body(reqwest::Body::wrap_stream(futures::stream::iter(pieces)))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "upload-length"), Some("500000"));
    assert_eq!(t.download(&url).await, data);
}

#[tokio::test]
async fn offset_mismatch_is_the_drafts_problem_type_with_the_right_offset() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let r = create(&t, &[("Upload-Complete", "?0"), ("Upload-Length", "1000")], Some(vec![7; 100])).await;
    let url = location(&t, &r);
    let r = append(&t, &url, 50, false, vec![1; 10]).await;
    assert_eq!(header(&r, "upload-offset"), Some("100"), "the right offset in Upload-Offset");
    let p = problem(r, 409, "offset_mismatch").await;
    assert_eq!(p["type"], "https://iana.org/assignments/http-problem-types#mismatching-upload-offset");
    assert_eq!((p["expected-offset"].as_u64(), p["provided-offset"].as_u64()), (Some(100), Some(50)), "{p}");
    assert_eq!((p["retryable"].as_bool(), p["partial"]["cursor"].as_u64()), (Some(true), Some(100)));
    assert_eq!(state(&t, &url).await, (100, false), "nothing was appended");
}

#[tokio::test]
async fn appending_to_a_completed_upload_is_refused() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let r = create(&t, &[("Upload-Complete", "?1")], Some(vec![9; 64])).await;
    assert_eq!(header(&r, "upload-complete"), Some("?1"));
    let url = location(&t, &r);
    // Empty append: completed-upload.
    let p = problem(append(&t, &url, 64, true, Vec::new()).await, 400, "conflict").await;
    assert_eq!(p["type"], "https://iana.org/assignments/http-problem-types#completed-upload");
    assert_eq!(p["retryable"], false);
    // With content: an inconsistent length.
    let p = problem(append(&t, &url, 64, false, vec![1; 8]).await, 400, "invalid_argument").await;
    assert_eq!(p["type"], "https://iana.org/assignments/http-problem-types#inconsistent-upload-length");
    assert_eq!(t.download(&url).await, vec![9; 64], "the upload is unchanged");
}

#[tokio::test]
async fn inconsistent_lengths_are_refused() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    // Creation: Upload-Length disagrees with the content of an Upload-Complete: ?1 request.
    let p = problem(create(&t, &[("Upload-Complete", "?1"), ("Upload-Length", "10")], Some(vec![0; 11])).await, 400, "invalid_argument").await;
    assert_eq!(p["type"], "https://iana.org/assignments/http-problem-types#inconsistent-upload-length");
    // Append: another Upload-Length than recorded.
    let r = create(&t, &[("Upload-Complete", "?0"), ("Upload-Length", "100")], None).await;
    let url = location(&t, &r);
    let r = draft(
        &t,
        "PATCH",
        &url,
        &[("Content-Type", PARTIAL), ("Upload-Offset", "0"), ("Upload-Complete", "?0"), ("Upload-Length", "99")],
        Some(vec![1; 10]),
    )
    .await;
    let p = problem(r, 400, "invalid_argument").await;
    assert_eq!(p["type"], "https://iana.org/assignments/http-problem-types#inconsistent-upload-length");
    // Append with Upload-Complete: ?1 whose content does not reach the length.
    let p = problem(append(&t, &url, 0, true, vec![1; 10]).await, 400, "invalid_argument").await;
    assert_eq!(p["type"], "https://iana.org/assignments/http-problem-types#inconsistent-upload-length");
    // Content past the length.
    let p = problem(append(&t, &url, 0, false, vec![1; 101]).await, 400, "invalid_argument").await;
    assert_eq!(p["type"], "https://iana.org/assignments/http-problem-types#inconsistent-upload-length");
    assert_eq!(state(&t, &url).await, (0, false), "no refused byte was stored");
    // A streamed ?1 body that ends short: its bytes are kept, the problem names the offset.
    let r =
        t.c.patch(&url)
            .header("Upload-Draft-Interop-Version", V)
            .header("Content-Type", PARTIAL)
            .header("Upload-Offset", "0")
            .header("Upload-Complete", "?1")
            .body(reqwest::Body::wrap_stream(futures::stream::iter(vec![Ok::<_, std::io::Error>(vec![5u8; 40])])))
            .send()
            .await
            .unwrap();
    let p = problem(r, 400, "invalid_argument").await;
    assert_eq!((p["type"].as_str().unwrap().ends_with("#inconsistent-upload-length"), p["partial"]["cursor"].as_u64()), (true, Some(40)), "{p}");
    assert_eq!(state(&t, &url).await, (40, false));
}

#[tokio::test]
async fn cancellation_removes_the_upload() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let r = create(&t, &[("Upload-Complete", "?0")], Some(vec![3; 1000])).await;
    let url = location(&t, &r);
    let r = draft(&t, "DELETE", &url, &[], None).await;
    assert_eq!(r.status(), 204);
    assert_eq!(head(&t, &url).await.status(), 404, "HEAD after cancellation");
    problem(append(&t, &url, 1000, false, vec![1]).await, 404, "not_found").await;
}

#[tokio::test]
async fn limits_are_announced_and_enforced() {
    let s = Server::start(&["--max-size", "1000"]);
    let t = Tus::new(&s);
    let r = t.request("OPTIONS", "/files/", &[], None).await;
    assert!(header(&r, "accept-patch").is_some_and(|a| a.contains("application/partial-upload")), "OPTIONS Accept-Patch");
    assert!(header(&r, "upload-limit").is_some_and(|l| l.contains("max-size=1000")));
    assert_eq!(header(&r, "upload-draft-interop-versions"), Some("5, 6, 8, 9"));
    // Creation above max-size: 413 with Upload-Limit.
    let r = create(&t, &[("Upload-Complete", "?0"), ("Upload-Length", "1001")], None).await;
    assert_eq!(header(&r, "upload-limit"), Some("max-size=1000"));
    problem(r, 413, "size_exceeded").await;
    // A deferred upload whose content runs past max-size.
    let r = create(&t, &[("Upload-Complete", "?0")], Some(vec![0; 600])).await;
    let url = location(&t, &r);
    let r = append(&t, &url, 600, false, vec![0; 401]).await;
    assert_eq!(header(&r, "upload-limit"), Some("max-size=1000"));
    problem(r, 413, "size_exceeded").await;
    assert_eq!(state(&t, &url).await, (600, false));
}

#[tokio::test]
async fn interop_versions_and_protocol_selection() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    // An interop version ferry does not serve.
    let r = t.request("POST", "/files/", &[("Upload-Draft-Interop-Version", "7"), ("Upload-Complete", "?0")], None).await;
    let p = problem(r, 400, "invalid_argument").await;
    assert!(p["recovery_hint"].as_str().unwrap().contains("5, 6, 8, 9"), "{p}");
    // Missing Upload-Complete on a draft creation.
    problem(create(&t, &[], None).await, 400, "invalid_argument").await;
    // Version 6: an append needs application/partial-upload; version 5 takes any type.
    for (v, ct, want) in [("6", "application/offset+octet-stream", 415), ("6", PARTIAL, 204), ("5", "application/octet-stream", 204)] {
        let r = t.request("POST", "/files/", &[("Upload-Draft-Interop-Version", v), ("Upload-Complete", "?0")], None).await;
        let url = location(&t, &r);
        let r = t
            .request(
                "PATCH",
                &url,
                &[("Upload-Draft-Interop-Version", v), ("Content-Type", ct), ("Upload-Offset", "0"), ("Upload-Complete", "?0")],
                Some(vec![1; 10]),
            )
            .await;
        assert_eq!(r.status().as_u16(), want, "version {v}, {ct}");
        // Version 6 says its lifetime as `expires`; version 5 has no Upload-Limit.
        let h = t.request("HEAD", &url, &[("Upload-Draft-Interop-Version", v)], None).await;
        match v {
            "6" => assert!(header(&h, "upload-limit").is_some_and(|l| l.contains("expires="))),
            _ => assert_eq!(header(&h, "upload-limit"), None),
        }
    }
    // The same upload over TUS: a draft upload is an ordinary ferry upload.
    let r = create(&t, &[("Upload-Complete", "?0"), ("Upload-Length", "20")], Some(vec![4; 10])).await;
    let url = location(&t, &r);
    assert_eq!(t.offset(&url).await, 10);
    assert_eq!(t.patch(&url, 10, vec![4; 10], &[]).await.status(), 204);
    assert_eq!(state(&t, &url).await, (20, true));
    // Without the draft header a request is TUS exactly as before: no Tus-Resumable → 412.
    assert_eq!(t.request("POST", "/files/", &[("Upload-Complete", "?0")], None).await.status(), 412);
}

#[tokio::test]
async fn digests_are_checked() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(100_000, 5);
    let good = format!("sha-256=:{}:", sha256_b64(&data));
    let bad = format!("sha-256=:{}:", sha256_b64(b"something else"));
    // Content-Digest of one request: a mismatch discards the content.
    let r = create(&t, &[("Upload-Complete", "?0")], None).await;
    let url = location(&t, &r);
    let r = draft(
        &t,
        "PATCH",
        &url,
        &[("Content-Type", PARTIAL), ("Upload-Offset", "0"), ("Upload-Complete", "?1"), ("Content-Digest", &bad)],
        Some(data.clone()),
    )
    .await;
    let p = problem(r, 400, "checksum_mismatch").await;
    assert!(p["detail"].as_str().unwrap().contains("Content-Digest"), "{p}");
    assert_eq!(state(&t, &url).await, (0, false));
    // A malformed Content-Digest is named as such.
    let r = draft(
        &t,
        "PATCH",
        &url,
        &[("Content-Type", PARTIAL), ("Upload-Offset", "0"), ("Upload-Complete", "?1"), ("Content-Digest", "sha-256=:AAAA:")],
        Some(data.clone()),
    )
    .await;
    let p = problem(r, 400, "invalid_argument").await;
    assert!(p["detail"].as_str().unwrap().starts_with("invalid Content-Digest"), "{p}");
    assert_eq!(state(&t, &url).await, (0, false));
    let r = draft(
        &t,
        "PATCH",
        &url,
        &[("Content-Type", PARTIAL), ("Upload-Offset", "0"), ("Upload-Complete", "?1"), ("Content-Digest", &good)],
        Some(data.clone()),
    )
    .await;
    assert_eq!(r.status(), 200);
    // Repr-Digest of the whole representation, declared at creation.
    let r = create(&t, &[("Upload-Complete", "?1"), ("Repr-Digest", &bad)], Some(data.clone())).await;
    problem(r, 400, "checksum_mismatch").await;
    let r = create(&t, &[("Upload-Complete", "?1"), ("Repr-Digest", &good)], Some(data.clone())).await;
    assert_eq!((r.status().as_u16(), header(&r, "repr-digest")), (201, Some(good.as_str())));
}

/// Stream `data[from..]` as one append whose body is fed piece by piece; returns the request's
/// task and the sender (drop it, or the task, to cut the connection).
fn streaming_append(t: &Tus, url: &str, from: usize, data: &[u8]) -> tokio::task::JoinHandle<Result<reqwest::Response, reqwest::Error>> {
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Vec<u8>, std::io::Error>>();
    let piece_data = data[from..].to_vec();
    std::thread::spawn(move || {
        for piece in piece_data.chunks(64 << 10) {
            if tx.unbounded_send(Ok(piece.to_vec())).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let c = t.c.clone();
    let u = url.to_string();
    let off = from.to_string();
    tokio::spawn(async move {
        c.patch(&u)
            .header("Upload-Draft-Interop-Version", V)
            .header("Content-Type", PARTIAL)
            .header("Upload-Offset", off)
            .header("Upload-Complete", "?1")
            .body(reqwest::Body::wrap_stream(rx))
            .send()
            .await
    })
}

#[tokio::test]
async fn resume_after_a_dropped_connection_with_head_then_append() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(4 << 20, 6);
    let len = data.len().to_string();
    let r = create(&t, &[("Upload-Complete", "?0"), ("Upload-Length", &len)], None).await;
    let url = location(&t, &r);
    let a = streaming_append(&t, &url, 0, &data);
    wait_bytes_received(&s, 512 << 10).await;
    a.abort(); // the connection drops mid-body
    let _ = a.await;
    // HEAD: the durable offset (the server keeps what arrived).
    let (off, complete) = state(&t, &url).await;
    assert!(off > 0 && off < data.len() as u64 && !complete, "offset {off}");
    let r = append(&t, &url, off, true, data[off as usize..].to_vec()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(t.download(&url).await, data, "byte-exact after the resume");
}

#[tokio::test]
async fn a_new_request_releases_an_append_that_is_still_open() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(8 << 20, 7);
    let len = data.len().to_string();
    let r = create(&t, &[("Upload-Complete", "?0"), ("Upload-Length", &len)], None).await;
    let url = location(&t, &r);
    // The old append lingers (its body keeps trickling in): HEAD asks it to stop, and answers
    // the offset it checkpointed — which the next append must be able to use.
    let a = streaming_append(&t, &url, 0, &data);
    wait_bytes_received(&s, 512 << 10).await;
    let (off, _) = state(&t, &url).await;
    assert!(off >= 512 << 10 && off < data.len() as u64, "offset {off}");
    if let Ok(Ok(resp)) = a.await {
        assert!(!resp.status().is_success(), "the old append was stopped: {}", resp.status());
    }
    let r = append(&t, &url, off, true, data[off as usize..].to_vec()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(t.download(&url).await, data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_a_draft_upload_then_resume_with_head() {
    let data = pseudo_random(32 << 20, 8);
    let mut s = Server::start(&["--checkpoint-every", "1MiB"]);
    let t = Tus::new(&s);
    let len = data.len().to_string();
    let r = create(&t, &[("Upload-Complete", "?0"), ("Upload-Length", &len)], None).await;
    let path = header(&r, "location").unwrap().to_string();
    let url = location(&t, &r);
    let a = streaming_append(&t, &url, 0, &data);
    wait_bytes_received(&s, 4 << 20).await;
    s.kill9();
    let _ = a.await;
    s.restart();
    let t = Tus::new(&s);
    let url = t.abs(&path);
    let (off, complete) = state(&t, &url).await;
    assert!(off < data.len() as u64 && !complete, "offset {off}");
    let r = append(&t, &url, off, true, data[off as usize..].to_vec()).await;
    assert_eq!(r.status(), 200);
    assert_stored_sha256(&s, &url, &sha256_hex(&data)).await;
    assert_eq!(t.download(&url).await, data, "byte-exact after kill -9 and resume");
}

#[tokio::test]
async fn a_draft_upload_is_an_ordinary_ferry_file() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(1 << 20, 9);
    let md = "filename ZHJhZnQuYmlu"; // "draft.bin"
    let r = create(&t, &[("Upload-Complete", "?1"), ("Upload-Metadata", md)], Some(data.clone())).await;
    let url = location(&t, &r);
    let id = url.rsplit('/').next().unwrap().to_string();
    // Range download.
    let r = t.c.get(&url).header("Range", "bytes=1000-1999").send().await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(header(&r, "content-range"), Some("bytes 1000-1999/1048576"));
    assert_eq!(r.bytes().await.unwrap().to_vec(), data[1000..2000].to_vec());
    // The file API (the view MCP's file_status shares) knows its name and sha256.
    let api = Api::new(&s);
    let f = api.file(&id).await;
    assert_eq!(
        (f["name"].as_str(), f["sha256"].as_str(), f["complete"].as_bool()),
        (Some("draft.bin"), Some(sha256_hex(&data).as_str()), Some(true)),
        "{f}"
    );
    // An archive task takes it as input.
    let task = api.start("archive", &serde_json::json!({ "files": [id], "format": "tar" }).to_string()).await;
    let done = api.wait_status(task["id"].as_str().unwrap(), "completed", 120).await;
    let archive = done["result"]["file"]["id"].as_str().unwrap_or_else(|| panic!("archive file handle: {done}")).to_string();
    let bytes = api.download(&archive).await;
    let mut ar = tar::Archive::new(&bytes[..]);
    let mut members = Vec::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut buf).unwrap();
        members.push((name, buf));
    }
    assert_eq!(members, vec![("draft.bin".to_string(), data)], "the archive holds the draft upload byte for byte");
}

/// Interop version 9 (draft -12 and later): a draft client at 9 creates, appends and finishes as
/// at 8; `GET` of the upload retrieves the offset as `HEAD` does (at 8 `GET` stays the download,
/// 409 while unfinished); a browser may send `Incremental` (CORS preflight allows it).
#[tokio::test]
async fn interop_9_retrieves_the_offset_with_get_and_allows_incremental() {
    let s = Server::start(&["--cors-allow-origins", "*"]);
    let t = Tus::new(&s);
    let data = pseudo_random(100_000, 90);
    let len = data.len().to_string();
    let nine = [("Upload-Draft-Interop-Version", "9")];
    let r = t.request("POST", "/files/", &[nine[0], ("Upload-Complete", "?0"), ("Upload-Length", &len), ("Incremental", "?1")], None).await;
    assert_eq!(r.status(), 201);
    let url = location(&t, &r);
    let r = t
        .request(
            "PATCH",
            &url,
            &[nine[0], ("Upload-Offset", "0"), ("Upload-Complete", "?0"), ("Content-Type", PARTIAL), ("Incremental", "?1")],
            Some(data[..40_000].to_vec()),
        )
        .await;
    assert_eq!(r.status(), 204);
    let r = t.request("GET", &url, &nine, None).await;
    assert_eq!(r.status(), 204, "GET at interop 9 is offset retrieval");
    assert_eq!((header(&r, "upload-offset"), header(&r, "upload-complete")), (Some("40000"), Some("?0")));
    assert_eq!(header(&r, "cache-control"), Some("no-store"));
    let r = t.request("GET", &url, &[("Upload-Draft-Interop-Version", "8")], None).await;
    assert_eq!(r.status(), 409, "GET at interop 8 is the download, refused while unfinished");
    let r = t
        .request(
            "PATCH",
            &url,
            &[nine[0], ("Upload-Offset", "40000"), ("Upload-Complete", "?1"), ("Content-Type", PARTIAL)],
            Some(data[40_000..].to_vec()),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(t.download(&url).await, data);
    let r = t
        .request(
            "OPTIONS",
            "/files/",
            &[
                ("Origin", "http://app.example"),
                ("Access-Control-Request-Method", "PATCH"),
                ("Access-Control-Request-Headers", "upload-draft-interop-version,incremental"),
            ],
            None,
        )
        .await;
    let allowed = header(&r, "access-control-allow-headers").unwrap_or_default().to_ascii_lowercase();
    assert!(allowed.split(',').any(|h| h.trim() == "incremental"), "{allowed}");
}
