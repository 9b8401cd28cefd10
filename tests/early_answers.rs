//! Issue 48 kinds 1 and 12: every answer sent before its request's body was read reaches a
//! client that keeps sending, and the refusals hyper makes below ferry's handlers explain
//! themselves like every other refusal.
//!
//! An early answer used to be followed by a close with the rest of the body unread: the kernel
//! then resets the connection, the client's next write fails with a broken pipe, and the answer
//! can be destroyed on its way (tus-js-client behind a round-robin balancer hung, neither
//! succeeding nor failing, when an upload was taken over mid-PATCH). Now the server closes
//! lingering: the client reads the whole answer and the end of the stream, and its sending ends
//! without an error. Each test here sends its whole body as fast as the socket takes it while
//! reading the answer, and fails on a reset.

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// What a client that keeps sending saw: the answer, and how its sending and reading ended.
#[derive(Debug)]
struct Seen {
    status: u16,
    headers: std::collections::HashMap<String, String>,
    body: Vec<u8>,
    /// The error that ended the sending, if it did not end with every byte sent.
    send_error: Option<String>,
    /// The error that ended reading after the answer (a reset), if any; `None` for a clean end
    /// of the stream (or the connection kept open).
    read_error: Option<String>,
}

/// Send `head`, then `body_len` bytes as fast as the socket takes them, reading the answer
/// meanwhile. After `pause_at` bytes the sending waits for `resume` (the test takes the upload
/// over meanwhile). Bounded waits: a hang fails, no timing is asserted.
async fn send_whole_body(addr: &str, head: String, body_len: usize, pause_at: Option<(usize, tokio::sync::oneshot::Receiver<()>)>) -> Seen {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await.map_err(|e| e.to_string())?;
        let piece = vec![b'x'; 64 << 10];
        let mut sent = 0;
        let mut pause = pause_at;
        while sent < body_len {
            if let Some((at, _)) = &pause {
                if sent >= *at {
                    let (_, resume) = pause.take().unwrap();
                    let _ = resume.await;
                }
            }
            let n = piece.len().min(body_len - sent).min(pause.as_ref().map_or(usize::MAX, |(at, _)| at - sent));
            wr.write_all(&piece[..n]).await.map_err(|e| format!("after {sent} of {body_len} bytes: {e}"))?;
            sent += n;
        }
        // Done sending a body: the server may close once it has read everything. (A client
        // that half-closes right after an oversized head gets no answer from hyper at all: it
        // sees an incomplete message, not a large one.)
        if body_len > 0 {
            let _ = wr.shutdown().await;
        }
        Ok::<_, String>(wr)
    });
    let mut rd = tokio::io::BufReader::new(rd);
    let read = async {
        let mut line = String::new();
        rd.read_line(&mut line).await.map_err(|e| e.to_string())?;
        let status = line.split(' ').nth(1).ok_or_else(|| format!("no status line: {line:?}"))?.parse::<u16>().map_err(|e| e.to_string())?;
        let mut headers = std::collections::HashMap::new();
        loop {
            line.clear();
            rd.read_line(&mut line).await.map_err(|e| e.to_string())?;
            let Some((k, v)) = line.trim_end().split_once(':') else { break };
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
        let mut body = Vec::new();
        if headers.get("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
            loop {
                line.clear();
                rd.read_line(&mut line).await.map_err(|e| e.to_string())?;
                let n = usize::from_str_radix(line.trim(), 16).map_err(|e| format!("chunk size {line:?}: {e}"))?;
                let mut chunk = vec![0; n + 2];
                rd.read_exact(&mut chunk).await.map_err(|e| e.to_string())?;
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        } else {
            body.resize(headers.get("content-length").map_or(0, |n| n.parse().unwrap()), 0);
            rd.read_exact(&mut body).await.map_err(|e| e.to_string())?;
        }
        Ok::<_, String>((status, headers, body))
    };
    let (status, headers, body) = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("no answer within a minute")
        .unwrap_or_else(|e| panic!("reading the answer: {e}"));
    let send_error = tokio::time::timeout(Duration::from_secs(60), writer).await.expect("the body was not taken within a minute").unwrap().err();
    // What follows the answer: the end of the stream, a reset, or (a kept-alive connection) nothing.
    let mut rest = [0u8; 1024];
    let read_error = match tokio::time::timeout(Duration::from_secs(20), rd.read(&mut rest)).await {
        Ok(Ok(_)) | Err(_) => None,
        Ok(Err(e)) => Some(e.to_string()),
    };
    Seen { status, headers, body, send_error, read_error }
}

fn assert_answered(seen: &Seen, status: u16, what: &str) -> serde_json::Value {
    assert_eq!(seen.status, status, "{what}: {}", String::from_utf8_lossy(&seen.body));
    assert_eq!(seen.headers.get("content-type").map(String::as_str), Some("application/problem+json"), "{what}: {:?}", seen.headers);
    let v: serde_json::Value = serde_json::from_slice(&seen.body).unwrap_or_else(|e| panic!("{what}: problem body: {e}"));
    assert_eq!(v["status"], status, "{what}: {v}");
    assert!(v["detail"].as_str().is_some_and(|d| !d.is_empty()) && v["recovery_hint"].as_str().is_some_and(|h| !h.is_empty()), "{what}: {v}");
    assert_eq!(seen.send_error, None, "{what}: the client could not send its whole body after the answer (the server closed without reading it)");
    assert_eq!(seen.read_error, None, "{what}: the connection was reset after the answer");
    v
}

fn patch_head(addr: &str, path: &str, extra: &str, len: usize) -> String {
    format!("PATCH {path} HTTP/1.1\r\nHost: {addr}\r\nTus-Resumable: 1.0.0\r\nContent-Type: {OCTET}\r\n{extra}Content-Length: {len}\r\n\r\n")
}

/// An upload taken over mid-PATCH (a HEAD from a second connection): the PATCH still sending
/// gets its 423 and can send the rest of its body, five times in a row; nothing of what
/// followed the takeover is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_taken_over_mid_body_reads_its_423_while_it_keeps_sending() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    const LEN: usize = 24 << 20;
    let url = t.create(256 << 20).await;
    let path = url.strip_prefix(&s.base).unwrap().to_string();
    for round in 0..5 {
        let offset = t.offset(&url).await;
        let (resume, paused) = tokio::sync::oneshot::channel();
        let before = bytes_received(&s).await;
        let head = patch_head(&s.addr(), &path, &format!("Upload-Offset: {offset}\r\n"), LEN);
        let patch = tokio::spawn({
            let addr = s.addr();
            async move { send_whole_body(&addr, head, LEN, Some((1 << 20, paused))).await }
        });
        wait_bytes_received(&s, before + (1 << 20)).await;
        // The takeover: a TUS HEAD asks the PATCH to stop and answers the offset it kept.
        let r = t.head(&url).await;
        assert_eq!(r.status(), 200, "round {round}: the HEAD took the upload over");
        let kept = header_u64(&r, "upload-offset").unwrap();
        assert_eq!(kept, offset + (1 << 20), "round {round}");
        let _ = resume.send(());
        let seen = patch.await.unwrap();
        let v = assert_answered(&seen, 423, &format!("round {round}: the PATCH taken over"));
        assert_eq!(v["code"], "locked", "{v}");
        assert_eq!(seen.headers.get("upload-offset").map(String::as_str), Some(kept.to_string().as_str()));
        assert_eq!(t.offset(&url).await, kept, "round {round}: nothing after the takeover was stored");
    }
}

/// Each answer a PATCH or a creation gets before its body is read (412, 415, 409, 413, 404,
/// 403, 401, a 413 mid-body, 460, and hyper's own 400 with a body following) reaches a client
/// that sends its whole body, and the connection ends without a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_early_answer_reaches_a_client_that_keeps_sending() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let addr = s.addr();
    const LEN: usize = 16 << 20;
    let url = t.create(1000).await;
    let path = url.strip_prefix(&s.base).unwrap().to_string();
    let small = t.create(10).await;
    let small = small.strip_prefix(&s.base).unwrap().to_string();
    let cases: Vec<(&str, String, u16)> = vec![
        (
            "a TUS version not spoken",
            format!(
                "PATCH {path} HTTP/1.1\r\nHost: {addr}\r\nTus-Resumable: 0.2.2\r\n\
                 Content-Type: {OCTET}\r\nUpload-Offset: 0\r\nContent-Length: {LEN}\r\n\r\n"
            ),
            412,
        ),
        (
            "a wrong Content-Type",
            format!(
                "PATCH {path} HTTP/1.1\r\nHost: {addr}\r\nTus-Resumable: 1.0.0\r\n\
                 Content-Type: text/plain\r\nUpload-Offset: 0\r\nContent-Length: {LEN}\r\n\r\n"
            ),
            415,
        ),
        ("an offset that moved", patch_head(&addr, &path, "Upload-Offset: 7\r\n", LEN), 409),
        ("a body past the length", patch_head(&addr, &path, "Upload-Offset: 0\r\n", LEN), 413),
        ("no such upload", patch_head(&addr, "/files/nosuchuploadnosuchupload0", "Upload-Offset: 0\r\n", LEN), 404),
        ("a foreign web page", patch_head(&addr, &path, "Upload-Offset: 0\r\nOrigin: http://evil.example\r\n", LEN), 403),
        (
            "a creation too large",
            format!(
                "POST /files/ HTTP/1.1\r\nHost: {addr}\r\nTus-Resumable: 1.0.0\r\nUpload-Length: \
                 99999999999999999\r\nContent-Type: {OCTET}\r\nContent-Length: {LEN}\r\n\r\n"
            ),
            413,
        ),
        (
            "chunked past the length",
            format!(
                "PATCH {small} HTTP/1.1\r\nHost: {addr}\r\nTus-Resumable: 1.0.0\r\n\
                 Content-Type: {OCTET}\r\nUpload-Offset: 0\r\nTransfer-Encoding: chunked\r\n\r\n"
            ),
            413,
        ),
        (
            "a malformed header before the body",
            format!("PATCH {path} HTTP/1.1\r\nHost: {addr}\r\nTus-Resumable: 1.0.0\r\nbad header line\r\nContent-Length: {LEN}\r\n\r\n"),
            400,
        ),
        (
            "an invalid Content-Length",
            format!("PATCH {path} HTTP/1.1\r\nHost: {addr}\r\nTus-Resumable: 1.0.0\r\nContent-Length: {LEN}x\r\n\r\n"),
            400,
        ),
    ];
    for (what, head, status) in cases {
        // A chunked body is sent as one endless chunk: its length says more than the upload takes.
        let head = if head.contains("chunked") { format!("{head}{:x}\r\n", LEN) } else { head };
        let seen = send_whole_body(&addr, head, LEN, None).await;
        assert_answered(&seen, status, what);
    }
    // A refusal from a token-protected server (401) too.
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_file(dir.path(), "ferry.toml", &format!("[[tokens]]\nprincipal = \"p\"\nsha256 = \"{}\"\n", sha256_hex(b"fy_early_token")));
    let s2 = Server::start(&["--config", cfg.to_str().unwrap()]);
    let head = format!(
        "POST /files/ HTTP/1.1\r\nHost: {}\r\nTus-Resumable: 1.0.0\r\nUpload-Length: {LEN}\r\nContent-Type: {OCTET}\r\nContent-Length: {LEN}\r\n\r\n",
        s2.addr()
    );
    assert_answered(&send_whole_body(&s2.addr(), head, LEN, None).await, 401, "no token");
    assert_eq!(t.offset(&url).await, 0, "nothing of the refused bodies was stored");
}

/// Issue 48 kind 12: the refusals hyper makes before any handler runs carry ferry's
/// problem+json body naming the cause, like every other refusal: more than 100 headers, a head
/// too large, a target too long, a malformed request line or header, a Content-Length that is
/// not a length or several that differ, a Transfer-Encoding that does not end in chunked.
#[tokio::test]
async fn refusals_below_the_handlers_explain_themselves() {
    let s = Server::start(&[]);
    let addr = s.addr();
    let many: String = (0..101).map(|i| format!("X-Extra-{i}: v\r\n")).collect();
    // 2 MiB in 90 fields: over the 408 KiB hyper reads whatever its reads' sizes (a head a
    // little over can fit in one read and parse).
    let big = "a".repeat(24 << 10);
    let huge: String = (0..90).map(|i| format!("X-Big-{i}: {big}\r\n")).collect();
    let long_target = format!("/files/{}", "a".repeat(70_000));
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("more than 100 headers", format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n{many}\r\n"), 431, "102 header fields"),
        ("a head too large", format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n{huge}\r\n"), 431, "larger than"),
        ("a target too long", format!("GET {long_target} HTTP/1.1\r\nHost: {addr}\r\n\r\n"), 414, "longer than"),
        ("a malformed request line", format!("GET /healthz HTTP/9.9\r\nHost: {addr}\r\n\r\n"), 400, "request line"),
        ("a malformed header", format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nno colon here\r\n\r\n"), 400, "header line 2"),
        (
            "a Content-Length that is not a length",
            format!("PATCH /files/x HTTP/1.1\r\nHost: {addr}\r\nContent-Length: ten\r\n\r\n"),
            400,
            "Content-Length",
        ),
        (
            "two Content-Lengths that differ",
            format!("PATCH /files/x HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"),
            400,
            "Content-Length",
        ),
        (
            "a Transfer-Encoding without chunked",
            format!("PATCH /files/x HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: gzip\r\n\r\n"),
            400,
            "Transfer-Encoding",
        ),
    ];
    for (what, head, status, says) in cases {
        let seen = send_whole_body(&addr, head, 0, None).await;
        let v = assert_answered(&seen, status, what);
        assert_eq!(v["code"], "invalid_argument", "{what}: {v}");
        assert!(v["detail"].as_str().unwrap().contains(says), "{what}: {v}");
        assert_eq!(seen.headers.get("connection").map(String::as_str), Some("close"), "{what}");
    }
    // axum's own refusals (an extractor's rejection: a path segment that is not UTF-8) too.
    for path in ["/files/%FF", "/api/v1/files/%FF", "/api/v1/tasks/%FF/args"] {
        let r = client().get(s.url(path)).header("Tus-Resumable", "1.0.0").send().await.unwrap();
        let v = problem(r, 400, "invalid_argument").await;
        assert!(v["detail"].as_str().unwrap().contains("Invalid URL"), "{path}: {v}");
    }
    // A request that parses is answered as before, on a connection that stays open.
    let r = client().get(s.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}
