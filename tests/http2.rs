//! HTTP/2 as clients speak it to the real binary: curl with `--http2-prior-knowledge` (h2c) on a
//! plain port and `--http2` (ALPN `h2`) over TLS creates, uploads, is cut off mid-PATCH,
//! resumes from the offset HEAD reports and downloads the file byte-exact; an early answer (a
//! 409 from the headers alone) reaches an HTTP/2 client as a reset stream, not a closed
//! connection, and the connection serves the next request; a header list over HTTP/1.1's head
//! limit is refused (431, the stream refused); many uploads share one connection. And the draft's `104 (Upload
//! Resumption Supported)`: over HTTP/1.1 a raw client reads the 104 with `Location` before it
//! sends the body, is cut off, resumes and finishes (interop 8 and 9); curl `-v` shows it; over
//! HTTP/2 there is none and the creation still answers. tus-js-client (Uppy) in Chromium
//! uploads over HTTPS and HTTP/2.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl (apt install openssl)");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A test CA and a certificate for 127.0.0.1 it signed: `ca.pem`, `server.pem`, `server.key`.
fn make_certificates(dir: &Path) {
    openssl(
        dir,
        &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ferry h2 test CA"],
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n").unwrap();
    openssl(dir, &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]);
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
}

/// curl with `proto` (`--http2-prior-knowledge` or `--http2`) in `dir`; its stdout. `-w` lines
/// end up in stdout too.
fn curl(dir: &Path, proto: &str, args: &[&str]) -> String {
    let out = Command::new("curl").args(["-sS", "--fail-with-body", "--cacert", "ca.pem", proto]).args(args).current_dir(dir).output().expect("curl");
    assert!(out.status.success(), "curl {args:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn header_of(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}

/// A reqwest client for `base`: HTTP/2 only (prior knowledge on http://, ALPN over https://
/// trusting `dir/ca.pem`).
fn h2_client(base: &str, dir: &Path) -> reqwest::Client {
    let b = reqwest::Client::builder().no_proxy().http2_prior_knowledge();
    if base.starts_with("https") {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(dir.join("ca.pem")).unwrap()).unwrap();
        b.tls_certs_only([ca]).build().unwrap()
    } else {
        b.build().unwrap()
    }
}

/// curl over HTTP/2 (`proto`) creates a TUS upload, a reqwest HTTP/2 PATCH is cut off midway
/// (its stream reset), curl HEADs the offset, PATCHes the rest and downloads: byte-exact, and
/// every curl answer was HTTP/2.
async fn upload_cut_resume_download(s: &Server, dir: &Path, proto: &str) {
    let base = s.base.as_str();
    let data = pseudo_random((6 << 20) + 12_345, 42);
    let total = data.len() as u64;
    let head = curl(
        dir,
        proto,
        &[
            "-D",
            "-",
            "-o",
            "/dev/null",
            "-X",
            "POST",
            &format!("{base}/files/"),
            "-H",
            "Tus-Resumable: 1.0.0",
            "-H",
            &format!("Upload-Length: {total}"),
        ],
    );
    assert!(head.starts_with("HTTP/2 201"), "{head}");
    let url = format!("{base}{}", header_of(&head, "location").expect("Location"));

    // A PATCH whose client goes away after 3 MiB: over HTTP/2 the stream is reset, the
    // connection lives on; the server keeps what it received.
    let c = h2_client(base, dir);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    let body = reqwest::Body::wrap_stream(futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) }));
    let patch = c
        .patch(&url)
        .header("Tus-Resumable", "1.0.0")
        .header("Content-Type", OCTET)
        .header("Upload-Offset", "0")
        .header("Content-Length", total.to_string())
        .body(body)
        .send();
    let patch = tokio::spawn(patch);
    tx.send(Ok(data[..3 << 20].to_vec())).await.unwrap();
    // The server's metrics say when the first MiB is written (a HEAD would stop the PATCH).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let text = c.get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
        let n: u64 = text.lines().find_map(|l| l.strip_prefix("ferry_bytes_received_total ")).map_or(0, |v| v.trim().parse().unwrap());
        if n >= 1 << 20 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the server received {n} bytes of the PATCH");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tx.send(Err(std::io::Error::other("the client is cut off"))).await.unwrap();
    drop(tx);
    assert!(patch.await.unwrap().is_err(), "the cut PATCH failed on the client");

    // The offset settles once the server let the reset PATCH go.
    let mut settled = None;
    while settled.is_none() {
        let head = curl(dir, proto, &["-I", &url, "-H", "Tus-Resumable: 1.0.0"]);
        assert!(head.starts_with("HTTP/2 200"), "{head}");
        let o: u64 = header_of(&head, "upload-offset").unwrap().parse().unwrap();
        let r = c.request(reqwest::Method::HEAD, &url).header("Tus-Resumable", "1.0.0").send().await.unwrap();
        assert_eq!(r.version(), reqwest::Version::HTTP_2);
        if header(&r, "upload-offset") == Some(o.to_string().as_str()) {
            settled = Some(o);
        }
    }
    let offset = settled.unwrap();
    assert!(offset > 0 && offset <= 3 << 20, "offset {offset}");
    std::fs::write(dir.join("rest.bin"), &data[offset as usize..]).unwrap();
    let out = curl(
        dir,
        proto,
        &[
            "-w",
            "%{http_version} %{http_code}",
            "-o",
            "/dev/null",
            "-X",
            "PATCH",
            &url,
            "-H",
            "Tus-Resumable: 1.0.0",
            "-H",
            &format!("Content-Type: {OCTET}"),
            "-H",
            &format!("Upload-Offset: {offset}"),
            "-T",
            "rest.bin",
        ],
    );
    assert_eq!(out, "2 204");
    let out = curl(dir, proto, &["-w", "%{http_version}", "-o", "copy.bin", &url]);
    assert_eq!(out, "2");
    assert_eq!(sha256_hex(&std::fs::read(dir.join("copy.bin")).unwrap()), sha256_hex(&data), "the download is byte-exact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_h2c_with_prior_knowledge_uploads_resumes_and_downloads() {
    let tmp = tempfile::tempdir().unwrap();
    make_certificates(tmp.path());
    let s = Server::start(&[]);
    upload_cut_resume_download(&s, tmp.path(), "--http2-prior-knowledge").await;
    // HTTP/1.1 on the same port is unchanged.
    let r = reqwest::Client::builder().no_proxy().http1_only().build().unwrap().get(s.url("/healthz")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.version()), (200, reqwest::Version::HTTP_11));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_http2_over_tls_by_alpn_uploads_resumes_and_downloads() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_certificates(dir);
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    let s = Server::start(&["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()]);
    assert!(s.base.starts_with("https://"), "{}", s.base);
    upload_cut_resume_download(&s, dir, "--http2").await;
    // A client that offers only http/1.1 by ALPN gets HTTP/1.1.
    let out = curl(dir, "--http1.1", &["-w", "%{http_version}", "-o", "/dev/null", &s.url("/healthz")]);
    assert_eq!(out, "1.1");
}

/// An answer from the headers alone (409: wrong offset) while the client still sends a large
/// body reaches an HTTP/2 client whole; the stream is reset, not the connection, which serves
/// the next requests; many uploads run at once on one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_answers_reset_the_stream_and_the_connection_serves_on() {
    let s = Server::start(&[]);
    let c = reqwest::Client::builder().no_proxy().http2_prior_knowledge().build().unwrap();
    let t = Tus { c: c.clone(), base: s.base.clone() };
    let url = t.create(64 << 20).await;
    let big = pseudo_random(32 << 20, 3);
    let r = t.patch(&url, 5, big, &[]).await;
    assert_eq!((r.status().as_u16(), r.version()), (409, reqwest::Version::HTTP_2));
    let p: serde_json::Value = r.json().await.unwrap();
    assert_eq!(p["code"], "offset_mismatch", "{p}");
    assert_eq!(t.offset(&url).await, 0);

    // Eight uploads at once over the one connection reqwest keeps for HTTP/2.
    let uploads = (0..8u64).map(|i| {
        let t = Tus { c: c.clone(), base: s.base.clone() };
        async move {
            let data = pseudo_random((2 << 20) + i as usize, 100 + i);
            let url = t.create(data.len() as u64).await;
            let r = t.patch(&url, 0, data.clone(), &[]).await;
            assert_eq!(r.status(), 204);
            assert_eq!(sha256_hex(&t.download(&url).await), sha256_hex(&data));
        }
    });
    futures::future::join_all(uploads).await;
}

/// A header list larger than HTTP/1.1's head limit (408 KiB) is refused over HTTP/2 too: the
/// h2 crate answers 431 and refuses the stream (`REFUSED_STREAM`, so curl retries it and gives
/// up: "Connection died"); the connection serves the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_list_over_the_limit_is_refused_and_the_connection_serves_on() {
    let s = Server::start(&[]);
    let c = reqwest::Client::builder().no_proxy().http2_prior_knowledge().build().unwrap();
    assert_eq!(c.get(s.url("/healthz")).send().await.unwrap().status(), 200);
    // One 4000-byte field sent 120 times: HPACK sends it once and indexes the repeats, so the
    // header block is small while the list it decodes to (RFC 9113 §6.5.2) is 480 KB.
    let mut r = c.get(s.url("/healthz"));
    for _ in 0..120 {
        r = r.header("X-Filler", "a".repeat(4000));
    }
    match r.send().await {
        Ok(r) => assert_eq!(r.status(), 431),
        Err(e) => assert!(format!("{e:?}").contains("REFUSED_STREAM"), "{e:?}"),
    }
    let r = c.get(s.url("/healthz")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.version()), (200, reqwest::Version::HTTP_2));
}

/// Read an HTTP/1.1 head (up to its blank line) from `conn`; bytes after it stay in `rest`.
async fn read_head(conn: &mut tokio::net::TcpStream, rest: &mut Vec<u8>) -> String {
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&rest[..end + 4]).into_owned();
            rest.drain(..end + 4);
            return head;
        }
        let n = tokio::time::timeout(std::time::Duration::from_secs(30), conn.read(&mut buf)).await.expect("an answer within 30 s").unwrap();
        assert!(n > 0, "the server closed before a whole head: {}", String::from_utf8_lossy(rest));
        rest.extend_from_slice(&buf[..n]);
    }
}

/// A draft client at interop `v` over HTTP/1.1 creates with content, reads the 104's
/// `Location` before sending any of it, sends half and is cut off, then retrieves the offset
/// and appends the rest: the file is whole.
async fn creation_104_cut_and_resume(s: &Server, v: &str) {
    let data = pseudo_random(3 << 20, 9);
    let mut conn = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    let head = format!(
        "POST /files/ HTTP/1.1\r\nHost: {}\r\nUpload-Draft-Interop-Version: {v}\r\nUpload-Complete: ?1\r\nContent-Length: {}\r\n\r\n",
        s.addr(),
        data.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut rest = Vec::new();
    let interim = read_head(&mut conn, &mut rest).await;
    assert!(interim.starts_with("HTTP/1.1 104 Upload Resumption Supported\r\n"), "{interim}");
    let loc = header_of(&interim, "location").expect("Location in the 104");
    assert_eq!(header_of(&interim, "upload-draft-interop-version").as_deref(), Some(v));
    assert!(header_of(&interim, "upload-limit").is_some_and(|l| l.contains("max-size=")), "{interim}");
    let before = bytes_received(s).await;
    conn.write_all(&data[..1 << 20]).await.unwrap();
    wait_bytes_received(s, before + (1 << 20)).await;
    drop(conn);
    let t = Tus::new(s);
    let url = t.abs(&loc);
    // The creation's request is over once the lease is released; the offset stays.
    let offset = loop {
        let r = t.request("HEAD", &url, &[("Upload-Draft-Interop-Version", v)], None).await;
        if header(&r, "upload-complete") == Some("?0") {
            break header_u64(&r, "upload-offset").unwrap();
        }
    };
    assert_eq!(offset, 1 << 20);
    let off = offset.to_string();
    let r = t
        .request(
            "PATCH",
            &url,
            &[
                ("Upload-Draft-Interop-Version", v),
                ("Upload-Offset", off.as_str()),
                ("Upload-Complete", "?1"),
                ("Content-Type", "application/partial-upload"),
            ],
            Some(data[offset as usize..].to_vec()),
        )
        .await;
    assert!(r.status().is_success(), "append at {offset}: {} {:?}", r.status(), r.text().await);
    assert_eq!(sha256_hex(&t.download(&url).await), sha256_hex(&data));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_at_interop_8_and_9_gets_104_with_location_before_its_body() {
    let s = Server::start(&[]);
    for v in ["8", "9"] {
        creation_104_cut_and_resume(&s, v).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_shows_the_104_and_http2_creations_answer_without_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s = Server::start(&[]);
    std::fs::write(dir.join("body.bin"), pseudo_random(100_000, 1)).unwrap();
    let run = |proto: &str| {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-v",
                proto,
                "-o",
                "/dev/null",
                "-X",
                "POST",
                &s.url("/files/"),
                "-H",
                "Upload-Draft-Interop-Version: 9",
                "-H",
                "Upload-Complete: ?1",
                "--data-binary",
                "@body.bin",
            ])
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let v = run("--http1.1");
    let at_104 = v.find("< HTTP/1.1 104").unwrap_or_else(|| panic!("curl -v shows no 104: {v}"));
    let at_final = v.find("< HTTP/1.1 201").unwrap_or_else(|| panic!("no 201: {v}"));
    assert!(at_104 < at_final && v[at_104..at_final].to_ascii_lowercase().contains("< location: /files/"), "{v}");
    // Over HTTP/2 hyper cannot send one (the book says so); the creation answers as ever.
    let v = run("--http2-prior-knowledge");
    assert!(!v.contains(" 104"), "{v}");
    assert!(v.contains("< HTTP/2 201"), "{v}");
}

/// tus-js-client (through Uppy's `@uppy/tus`) in headless Chromium uploads to ferry over HTTPS
/// and HTTP/2 (ALPN `h2`, as Chromium's network layer reports every answer), cross-origin,
/// pausing and resuming; the stored file is the one the page hashed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tus_js_client_in_chromium_uploads_over_h2_with_tls() {
    let chromium = std::env::var("FERRY_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(Path::new(&chromium).exists(), "Chromium not found at {chromium}: `bash .ci/run` installs it");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_certificates(dir);
    let page_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let page_origin = format!("http://127.0.0.1:{page_port}");
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    let s = Server::start(&["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap(), "--cors-allow-origins", &page_origin]);
    let shot = dir.join("uppy-h2.png");
    let size = 6 * 1024 * 1024 + 7;
    let mut run = node_script("uppy/run.js", &[&s.base, shot.to_str().unwrap(), &size.to_string(), &(512 * 1024).to_string()]);
    run.env("PAGE_PORT", page_port.to_string()).env("TRUST_ANY_CERT", "1");
    let out = run_json_client(run, 300).await;
    let protocols: Vec<&str> = out["protocols"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    assert!(protocols.len() > 4 && protocols.iter().all(|p| *p == "h2"), "answers from ferry came over {protocols:?}");
    let c = h2_client(&s.base, dir);
    let r = c.get(out["url"].as_str().unwrap()).send().await.unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(sha256_hex(&r.bytes().await.unwrap()), out["sha256"].as_str().unwrap());
}
