//! Transcripts for TUS 1.0 core, creation and termination, with the status codes DESIGN §3
//! pins where the spec leaves a choice. Each test starts the real binary.

mod common;
use common::*;

#[tokio::test]
async fn options_advertises_every_extension_and_algorithm() {
    let s = Server::start(&["--max-size", "5GiB"]);
    let t = Tus::new(&s);
    let r = t.request("OPTIONS", "/files/", &[], None).await;
    // 200 with an empty body, as tusd answers (conformance suites written against it expect 200).
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-length"), Some("0"));
    assert_eq!(header(&r, "tus-version"), Some("1.0.0"));
    assert_eq!(header(&r, "tus-resumable"), Some("1.0.0"));
    assert_eq!(header(&r, "tus-max-size"), Some("5368709120"));
    assert_eq!(header(&r, "tus-checksum-algorithm"), Some("sha1,sha256,sha512,md5"));
    let ext: Vec<&str> = header(&r, "tus-extension").unwrap().split(',').collect();
    for e in [
        "creation",
        "creation-with-upload",
        "creation-defer-length",
        "expiration",
        "checksum",
        "checksum-trailer",
        "termination",
        "concatenation",
        "concatenation-unfinished",
    ] {
        assert!(ext.contains(&e), "{e} missing from {ext:?}");
    }
}

#[tokio::test]
async fn unsupported_version_is_412_on_every_method() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(10).await;
    for (m, u) in [
        ("POST", "/files/"),
        ("HEAD", url.as_str()),
        ("PATCH", url.as_str()),
        ("DELETE", url.as_str()),
        ("GET", url.as_str()),
        ("OPTIONS", "/files/"),
    ] {
        let r = t.request(m, u, &[("Tus-Resumable", "0.2.2"), ("Upload-Length", "5"), ("Content-Type", OCTET), ("Upload-Offset", "0")], None).await;
        assert_eq!(r.status(), 412, "{m}");
        assert_eq!(header(&r, "tus-version"), Some("1.0.0"), "{m}");
    }
    assert_eq!(t.offset(&url).await, 0, "nothing changed");
}

#[tokio::test]
async fn missing_version_is_412_on_writes_but_plain_http_on_reads() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(3).await;
    problem(t.request("POST", "/files/", &[("Upload-Length", "5")], None).await, 412, "invalid_argument").await;
    problem(t.request("PATCH", &url, &[("Content-Type", OCTET), ("Upload-Offset", "0")], Some(b"abc".to_vec())).await, 412, "invalid_argument").await;
    problem(t.request("DELETE", &url, &[], None).await, 412, "invalid_argument").await;
    // HEAD with Tus-Resumable: TUS 1.0 §HEAD, the offset.
    let r = t.head(&url).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "upload-offset"), Some("0"));
    assert_eq!(header(&r, "cache-control"), Some("no-store"));
    // GET without Tus-Resumable: a plain download (here: still incomplete → 409).
    let r = t.request("GET", &url, &[], None).await;
    assert_eq!(header(&r, "tus-resumable"), Some("1.0.0"));
    assert_eq!(header(&r, "upload-offset"), Some("0"));
    problem(r, 409, "upload_incomplete").await;
    // HEAD without it is a plain HTTP HEAD of that download: what GET answers, no body
    // (RFC 9110 §9.3.2), the TUS headers still there.
    let r = t.request("HEAD", &url, &[], None).await;
    assert_eq!(r.status(), 409);
    assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
    assert_eq!(header(&r, "upload-offset"), Some("0"));
    assert_eq!(header(&r, "tus-resumable"), Some("1.0.0"));
    assert!(r.bytes().await.unwrap().is_empty());
}

#[tokio::test]
async fn patch_content_type_offset_and_overflow_rules() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(10).await;
    let r =
        t.request("PATCH", &url, &[("Tus-Resumable", "1.0.0"), ("Content-Type", "text/plain"), ("Upload-Offset", "0")], Some(b"abc".to_vec())).await;
    problem(r, 415, "invalid_argument").await;
    let r = t.request("PATCH", &url, &[("Tus-Resumable", "1.0.0"), ("Content-Type", OCTET)], Some(b"abc".to_vec())).await;
    problem(r, 400, "invalid_argument").await;
    for bad in ["+5", "-1", "18446744073709551616", "123456789012345678901234567890", "0x0", "1e3", "1 2", ""] {
        let r = t.request("PATCH", &url, &[("Tus-Resumable", "1.0.0"), ("Content-Type", OCTET), ("Upload-Offset", bad)], Some(b"abc".to_vec())).await;
        problem(r, 400, "invalid_argument").await;
    }
    assert_eq!(t.patch(&url, 0, b"abcd".to_vec(), &[]).await.status(), 204);
    let r = t.patch(&url, 0, b"zz".to_vec(), &[]).await;
    assert_eq!(header_u64(&r, "upload-offset"), Some(4), "409 names the right offset");
    let v = problem(r, 409, "offset_mismatch").await;
    assert_eq!(v["partial"]["cursor"], 4);
    assert!(v["detail"].as_str().unwrap().contains('4'));
    // Past Upload-Length: 413 and nothing stored, with a Content-Length ...
    problem(t.patch(&url, 4, vec![1; 7], &[]).await, 413, "size_exceeded").await;
    assert_eq!(t.offset(&url).await, 4);
    // ... and with a chunked body that only overflows mid-stream.
    let body = reqwest::Body::wrap_stream(futures::stream::iter(vec![Ok::<_, std::io::Error>(vec![2u8; 3]), Ok(vec![3u8; 4])]));
    let r =
        t.c.patch(&url).header("Tus-Resumable", "1.0.0").header("Content-Type", OCTET).header("Upload-Offset", "4").body(body).send().await.unwrap();
    problem(r, 413, "size_exceeded").await;
    assert_eq!(t.offset(&url).await, 4, "offset unchanged");
    assert_eq!(t.patch(&url, 4, b"efghij".to_vec(), &[]).await.status(), 204);
    assert_eq!(t.download(&url).await, b"abcdefghij");
}

#[tokio::test]
async fn creation_length_rules() {
    let s = Server::start(&["--max-size", "1000"]);
    let t = Tus::new(&s);
    problem(t.post(&[("Upload-Length", "10"), ("Upload-Defer-Length", "1")]).await, 400, "invalid_argument").await;
    problem(t.post(&[]).await, 400, "invalid_argument").await;
    problem(t.post(&[("Upload-Defer-Length", "2")]).await, 400, "invalid_argument").await;
    problem(t.post(&[("Upload-Length", "-1")]).await, 400, "invalid_argument").await;
    problem(t.post(&[("Upload-Length", "1001")]).await, 413, "size_exceeded").await;
    problem(t.post(&[("Upload-Length", "10"), ("Upload-Metadata", "a YQ==,a Yg==")]).await, 400, "invalid_argument").await;
    problem(t.post(&[("Upload-Length", "10"), ("Upload-Metadata", "a not*base64")]).await, 400, "invalid_argument").await;
    let r = t.post(&[("Upload-Length", "1000"), ("Upload-Metadata", "filename bXkgZmlsZS50eHQ=,empty")]).await;
    assert_eq!(r.status(), 201);
    let loc = header(&r, "location").unwrap().to_string();
    assert!(loc.starts_with("/files/"), "relative Location by default: {loc}");
    let id = loc.trim_start_matches("/files/");
    assert!(id.len() == 26 && id.bytes().all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b)), "{id}");
    assert!(header(&r, "upload-expires").is_some(), "Upload-Expires on creation");
    let h = t.head(&loc).await;
    assert_eq!(header(&h, "upload-metadata"), Some("filename bXkgZmlsZS50eHQ=,empty"), "metadata kept verbatim, empty values too");
    assert_eq!(header(&h, "upload-length"), Some("1000"));
}

#[tokio::test]
async fn zero_length_upload_is_complete_at_creation() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(0).await;
    let h = t.head(&url).await;
    assert_eq!((header(&h, "upload-offset"), header(&h, "upload-length")), (Some("0"), Some("0")));
    assert!(header(&h, "upload-expires").is_none(), "a finished upload does not expire");
    let r = t.c.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "repr-digest"), Some("sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:"));
    assert!(r.bytes().await.unwrap().is_empty());
}

#[tokio::test]
async fn unknown_and_malformed_ids_are_404_without_offset() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    for u in ["/files/aaaaaaaaaaaaaaaaaaaaaaaaaa", "/files/..%2f..%2fetc%2fpasswd", "/files/x", "/files/AAAAAAAAAAAAAAAAAAAAAAAAAA"] {
        for m in ["HEAD", "GET", "DELETE"] {
            let r = t.request(m, u, &[("Tus-Resumable", "1.0.0")], None).await;
            assert_eq!(r.status(), 404, "{m} {u}");
            assert!(header(&r, "upload-offset").is_none());
        }
        let r = t.patch(u, 0, b"x".to_vec(), &[]).await;
        assert!(header(&r, "upload-offset").is_none());
        problem(r, 404, "not_found").await;
    }
}

#[tokio::test]
async fn termination_removes_record_and_bytes() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(10).await;
    assert_eq!(t.patch(&url, 0, b"hello".to_vec(), &[]).await.status(), 204);
    let id = url.rsplit('/').next().unwrap().to_string();
    assert!(s.blob_len(&id).await.is_some(), "the store holds the upload");
    let r = t.request("DELETE", &url, &[("Tus-Resumable", "1.0.0")], None).await;
    assert_eq!(r.status(), 204);
    assert_eq!(s.blob_len(&id).await, None, "bytes removed");
    assert_eq!(t.head(&url).await.status(), 404);
    problem(t.patch(&url, 5, b"x".to_vec(), &[]).await, 404, "not_found").await;
    problem(t.request("DELETE", &url, &[("Tus-Resumable", "1.0.0")], None).await, 404, "not_found").await;
}

#[tokio::test]
async fn method_override_is_honoured() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(3).await;
    let r = t
        .request(
            "POST",
            &url,
            &[("X-HTTP-Method-Override", "PATCH"), ("Tus-Resumable", "1.0.0"), ("Content-Type", OCTET), ("Upload-Offset", "0")],
            Some(b"abc".to_vec()),
        )
        .await;
    assert_eq!(r.status(), 204);
    assert_eq!(t.download(&url).await, b"abc");
    let r = t.request("POST", &url, &[("X-HTTP-Method-Override", "DELETE"), ("Tus-Resumable", "1.0.0")], None).await;
    assert_eq!(r.status(), 204);
    assert_eq!(t.head(&url).await.status(), 404);
}

#[tokio::test]
async fn finished_upload_accepts_an_empty_patch_and_refuses_more() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(2).await;
    assert_eq!(t.patch(&url, 0, b"ab".to_vec(), &[]).await.status(), 204);
    let r = t.patch(&url, 2, vec![], &[]).await;
    assert_eq!(r.status(), 204);
    assert_eq!(header(&r, "upload-offset"), Some("2"));
    let v = problem(t.patch(&url, 2, b"c".to_vec(), &[]).await, 413, "size_exceeded").await;
    assert_eq!(v["detail"], "the upload already holds all of its 2 bytes; nothing more can be appended", "{v}");
    assert!(v["recovery_hint"].as_str().unwrap().starts_with("Nothing more can be sent to this upload"), "{v}");
    // The same without a Content-Length (chunked): found while reading, told alike.
    let body = reqwest::Body::wrap_stream(futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"c"))]));
    let r =
        t.c.patch(&url).header("Tus-Resumable", "1.0.0").header("Content-Type", OCTET).header("Upload-Offset", "2").body(body).send().await.unwrap();
    let v = problem(r, 413, "size_exceeded").await;
    assert!(v["detail"].as_str().unwrap().starts_with("the upload already holds all of its 2 bytes"), "{v}");
    assert!(v["recovery_hint"].as_str().unwrap().starts_with("Nothing more can be sent to this upload"), "{v}");
    assert_eq!(t.download(&url).await, b"ab");
}

#[tokio::test]
async fn duplicated_headers_are_refused_not_guessed() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(10).await;
    let r =
        t.c.patch(&url)
            .header("Tus-Resumable", "1.0.0")
            .header("Content-Type", OCTET)
            .header("Upload-Offset", "0")
            .header("Upload-Offset", "5")
            .body("abc")
            .send()
            .await
            .unwrap();
    let v = problem(r, 400, "invalid_argument").await;
    assert_eq!(v["detail"], "the Upload-Offset header was sent 2 times; it carries one value", "{v}");
    assert_eq!(v["recovery_hint"], "Send Upload-Offset once.");
    let r =
        t.c.post(s.url("/files/")).header("Tus-Resumable", "1.0.0").header("Upload-Length", "5").header("Upload-Length", "6").send().await.unwrap();
    let v = problem(r, 400, "invalid_argument").await;
    assert!(v["detail"].as_str().unwrap().starts_with("the Upload-Length header was sent 2 times"), "{v}");
    // The draft's headers too, on a creation that would carry bytes: nothing is created.
    let r =
        t.c.post(s.url("/files/"))
            .header("Upload-Draft-Interop-Version", "6")
            .header("Upload-Complete", "?1")
            .header("Upload-Complete", "?0")
            .body("abc")
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), 400);
    assert!(header(&r, "location").is_none());
    assert_eq!(t.offset(&url).await, 0);
    let files = t.c.get(s.url("/api/v1/files")).send().await.unwrap().json::<serde_json::Value>().await.unwrap();
    assert_eq!(files["files"].as_array().unwrap().len(), 1, "{files}");
    // The task API's Idempotency-Key, by the same words.
    let r =
        t.c.post(s.url("/api/v1/tasks"))
            .header("Idempotency-Key", "k1")
            .header("Idempotency-Key", "k1")
            .body(r#"{"kind":"external","args":{}}"#)
            .send()
            .await
            .unwrap();
    let v = problem(r, 400, "invalid_argument").await;
    assert_eq!(v["detail"], "the Idempotency-Key header was sent 2 times; it carries one value", "{v}");
    // Host (RFC 9112 §3.2): none, or two, is 400 before anything reads it; nothing is listed
    // or created.
    use std::io::{Read, Write};
    for req in [
        "GET /api/v1/files HTTP/1.1\r\nConnection: close\r\n\r\n".to_string(),
        format!(
            "POST /files/ HTTP/1.1\r\nHost: {}\r\nHost: evil.example\r\nTus-Resumable: 1.0.0\r\nUpload-Length: 5\r\nConnection: close\r\n\r\n",
            s.addr()
        ),
    ] {
        let mut sock = std::net::TcpStream::connect(s.addr()).unwrap();
        sock.write_all(req.as_bytes()).unwrap();
        let mut text = String::new();
        sock.read_to_string(&mut text).unwrap();
        assert!(text.starts_with("HTTP/1.1 400"), "{req:?}: {text}");
        assert!(text.contains("Host header") && !text.contains("\"files\""), "{text}");
    }
    let files = t.c.get(s.url("/api/v1/files")).send().await.unwrap().json::<serde_json::Value>().await.unwrap();
    assert_eq!(files["files"].as_array().unwrap().len(), 1, "{files}");
}

#[tokio::test]
async fn wrong_methods_get_a_problem_body() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(1).await;
    problem(t.request("PUT", &url, &[], None).await, 405, "invalid_argument").await;
    problem(t.request("POST", &url, &[("Tus-Resumable", "1.0.0")], None).await, 405, "invalid_argument").await;
}

#[tokio::test]
async fn a_malformed_chunked_body_is_400_and_keeps_what_arrived() {
    use std::io::{Read, Write};
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(10).await;
    let path = url.trim_start_matches(&s.base).to_string();
    let mut sock = std::net::TcpStream::connect(s.addr()).unwrap();
    let req = format!(
        "PATCH {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTus-Resumable: 1.0.0\r\nContent-Type: \
         {OCTET}\r\nUpload-Offset: 0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n"
    );
    sock.write_all(req.as_bytes()).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 2048];
    let n = sock.read(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("invalid_argument"), "{text}");
    assert_eq!(t.offset(&url).await, 3);
}
