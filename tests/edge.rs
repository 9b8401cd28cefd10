//! The HTTP edge: CORS, proxies and Location, health, readiness and metrics.

mod common;
use common::*;

/// Every request header the installed tus-js-client (the browser client Uppy wraps) can set,
/// read from its source (`setHeader('Name', …)`), so a newer client that sends more fails here.
fn tus_js_client_request_headers() -> Vec<String> {
    let dir = manifest_dir().join("tests/clients/node/node_modules/tus-js-client/lib.es5");
    assert!(dir.exists(), "tus-js-client is not installed: run `bash .ci/run` or `(cd tests/clients/node && npm ci)`");
    let mut names = std::collections::BTreeSet::new();
    for entry in walk(&dir) {
        let text = std::fs::read_to_string(entry).unwrap_or_default();
        for part in text.split("setHeader(").skip(1) {
            let quoted = part.trim_start();
            let Some(q) = quoted.chars().next().filter(|c| *c == '\'' || *c == '"') else { continue };
            if let Some(name) = quoted[1..].split(q).next().filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')) {
                names.insert(name.to_ascii_lowercase());
            }
        }
    }
    names.into_iter().collect()
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.extension().is_some_and(|x| x == "js") {
            out.push(p);
        }
    }
    out
}

/// A preflight exactly as a browser sends it for tus-js-client with `addRequestId: true`, and
/// for every other header tus-js-client and the IETF draft clients send.
#[tokio::test]
async fn cors_preflight_allows_what_browser_tus_clients_send() {
    // Any origin, as configured (`*`): without tokens the default is the server's own only.
    let s = Server::start(&["--cors-allow-origins", "*"]);
    let t = Tus::new(&s);
    let sent = tus_js_client_request_headers();
    for h in ["x-request-id", "upload-draft-interop-version", "upload-complete", "x-http-method-override", "tus-resumable", "upload-metadata"] {
        assert!(sent.iter().any(|n| n == h), "the tus-js-client scan found {sent:?}, not {h}");
    }
    let mut wanted: Vec<String> = sent.clone();
    wanted.extend(["authorization", "upload-checksum", "upload-incomplete", "idempotency-key", "content-type"].map(String::from));
    for (method, request_headers) in [("POST", "tus-resumable,upload-length,upload-metadata,x-request-id".to_string()), ("PATCH", wanted.join(","))] {
        let r = t
            .request(
                "OPTIONS",
                "/files/",
                &[("Origin", "http://app.example"), ("Access-Control-Request-Method", method), ("Access-Control-Request-Headers", &request_headers)],
                None,
            )
            .await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "access-control-allow-origin"), Some("*"));
        let allowed: Vec<String> = header(&r, "access-control-allow-headers").unwrap().split(',').map(|h| h.trim().to_ascii_lowercase()).collect();
        for h in request_headers.split(',') {
            assert!(allowed.iter().any(|a| a == h), "{h} not allowed: {allowed:?}");
        }
        assert!(header(&r, "access-control-allow-methods").unwrap().contains(method));
    }
    let r = t
        .request(
            "POST",
            "/files/",
            &[("Origin", "http://app.example"), ("Tus-Resumable", "1.0.0"), ("Upload-Length", "1"), ("X-Request-ID", "4f0a")],
            None,
        )
        .await;
    assert_eq!(r.status(), 201);
    let exposed = header(&r, "access-control-expose-headers").unwrap().to_ascii_lowercase();
    for h in [
        "location",
        "upload-offset",
        "upload-length",
        "tus-resumable",
        "upload-expires",
        "repr-digest",
        "etag",
        "content-range",
        "upload-complete",
        "upload-draft-interop-version",
    ] {
        assert!(exposed.contains(h), "{h} not exposed: {exposed}");
    }
}

async fn preflight(t: &Tus, origin: &str) -> reqwest::Response {
    let h = [
        ("Origin", origin),
        ("Access-Control-Request-Method", "POST"),
        ("Access-Control-Request-Headers", "tus-resumable,upload-length,x-request-id,x-upload-tag"),
    ];
    t.request("OPTIONS", "/files/", &h, None).await
}

/// `[cors]` in ferry.toml: exact origins instead of `*`, extra allowed and exposed headers; an
/// origin not listed is refused (403, preflight included) and creates nothing. Flags replace it.
#[tokio::test]
async fn cors_origins_and_headers_are_configurable() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_file(
        dir.path(),
        "ferry.toml",
        "[cors]\nallow_origins = [\"https://app.example\"]\nallow_headers = [\"X-Upload-Tag\"]\nexpose_headers = [\"X-Trace\"]\n",
    );
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let t = Tus::new(&s);
    let r = preflight(&t, "https://app.example").await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "access-control-allow-origin"), Some("https://app.example"));
    assert!(r.headers().get_all("vary").iter().any(|v| v.to_str().unwrap_or("").to_ascii_lowercase().contains("origin")), "Vary: Origin for caches");
    let allowed = header(&r, "access-control-allow-headers").unwrap().to_ascii_lowercase();
    assert!(allowed.contains("x-upload-tag") && allowed.contains("x-request-id"), "{allowed}");
    let r = t
        .request(
            "POST",
            "/files/",
            &[("Origin", "https://app.example"), ("Tus-Resumable", "1.0.0"), ("Upload-Length", "1"), ("X-Upload-Tag", "a")],
            None,
        )
        .await;
    assert_eq!(r.status(), 201);
    assert_eq!(header(&r, "access-control-allow-origin"), Some("https://app.example"));
    assert!(header(&r, "access-control-expose-headers").unwrap().to_ascii_lowercase().contains("x-trace"));

    // Another origin: refused outright, preflight included, and nothing is created.
    let r = preflight(&t, "https://evil.example").await;
    assert!(r.headers().get("access-control-allow-origin").is_none());
    problem(r, 403, "unauthorized").await;
    let r = t.request("POST", "/files/", &[("Origin", "https://evil.example"), ("Tus-Resumable", "1.0.0"), ("Upload-Length", "1")], None).await;
    problem(r, 403, "unauthorized").await;
    // A page on ferry's own origin, and clients that send no Origin (curl), are not affected.
    let own = format!("http://{}", s.addr());
    assert_eq!(t.request("POST", "/files/", &[("Origin", &own), ("Tus-Resumable", "1.0.0"), ("Upload-Length", "1")], None).await.status(), 201);
    assert_eq!(t.post(&[("Upload-Length", "1")]).await.status(), 201);
    let files = json(t.c.get(s.url("/api/v1/files")).send().await.unwrap()).await;
    assert_eq!(files["files"].as_array().unwrap().len(), 3, "the refused origin created nothing");
    drop(s);

    // Flags (and FERRY_CORS_ALLOW_ORIGINS) replace the file's list.
    let s = Server::start(&["--config", cfg.to_str().unwrap(), "--cors-allow-origins", "https://a.example,https://b.example"]);
    let t = Tus::new(&s);
    let r = t.request("OPTIONS", "/files/", &[("Origin", "https://b.example"), ("Access-Control-Request-Method", "PATCH")], None).await;
    assert_eq!(header(&r, "access-control-allow-origin"), Some("https://b.example"));
    problem(
        t.request("OPTIONS", "/files/", &[("Origin", "https://app.example"), ("Access-Control-Request-Method", "PATCH")], None).await,
        403,
        "unauthorized",
    )
    .await;
}

/// Issue 48: a refusal's hint names what the operator may list in `[cors] allow_origins`, and
/// never `null` — the origin of sandboxed iframes and file:// pages, which any page can give
/// itself, so listing it would admit every page — nor a value that is no origin (the setting
/// refuses it). Those are told to serve the page from an origin of its own and list that. A web
/// origin is named as the setting keeps it (lowercase, without the default port). The same on
/// a tokenless server and on one with a list of origins; preflights included.
#[tokio::test]
async fn a_refused_origins_hint_never_offers_null_or_what_is_no_origin() {
    let hint = |v: serde_json::Value| v["recovery_hint"].as_str().unwrap_or_default().to_string();
    for args in [&[][..], &["--cors-allow-origins", "https://app.example"][..]] {
        let s = Server::start(args);
        let t = Tus::new(&s);
        for origin in ["null", "evil.example/upload", "file:///home/me/page.html"] {
            for r in [
                t.request("POST", "/files/", &[("Origin", origin), ("Tus-Resumable", "1.0.0"), ("Upload-Length", "1")], None).await,
                preflight(&t, origin).await,
            ] {
                let h = hint(problem(r, 403, "unauthorized").await);
                assert!(!h.contains("--cors-allow-origins ") && !h.contains("add it"), "{args:?} {origin}: {h}");
                assert!(h.contains("serve the page from a web origin of its own") && h.contains("allow_origins"), "{args:?} {origin}: {h}");
                if origin == "null" {
                    assert!(h.contains("do not list it") && h.contains("sandboxed"), "{h}");
                }
            }
        }
        let r = t.request("POST", "/files/", &[("Origin", "HTTP://Evil.Example:80"), ("Tus-Resumable", "1.0.0"), ("Upload-Length", "1")], None).await;
        let h = hint(problem(r, 403, "unauthorized").await);
        assert!(h.contains("--cors-allow-origins http://evil.example,") || h.contains("--cors-allow-origins http://evil.example "), "{args:?}: {h}");
        assert_eq!(
            json(t.c.get(s.url("/api/v1/files")).send().await.unwrap()).await["files"].as_array().unwrap().len(),
            0,
            "nothing refused was created"
        );
    }
}

/// Issue 48 kind 10: a server without tokens takes browser uploads only from its own pages and
/// the origins it lists. Any web page the developer's browser visits used to be able to create
/// and PATCH uploads on a tokenless loopback ferry (`Origin: http://evil.example`,
/// `Upload-Length: 1000000000` → 201) and fill its disk. Every upload route is closed to a
/// foreign origin — TUS creation, PATCH, HEAD, DELETE, the preflight, the IETF draft's requests
/// — with a 403 that says how to open it; clients that send no `Origin` (curl, tuspy, the CLI)
/// and the server's own pages are unaffected, a listed origin or `*` opens it, and a server
/// with tokens keeps admitting any origin by default (a page needs a token to upload).
#[tokio::test]
async fn a_tokenless_server_takes_browser_uploads_only_from_its_own_and_listed_origins() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let evil = "http://evil.example";
    let tus = [("Tus-Resumable", "1.0.0")];
    let url = t.create(10).await;
    let path = url.strip_prefix(&s.base).unwrap().to_string();
    let refused = |r: reqwest::Response, what: &'static str| async move {
        let v = problem(r, 403, "unauthorized").await;
        let detail = v["detail"].as_str().unwrap();
        assert!(detail.contains(evil) && detail.contains("no tokens"), "{what}: {v}");
        let hint = v["recovery_hint"].as_str().unwrap();
        assert!(hint.contains("allow_origins") && hint.contains("--cors-allow-origins http://evil.example"), "{what}: {v}");
    };
    let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&'static str, &'static str)> {
        [("Origin", evil)].into_iter().chain(tus).chain(extra.iter().copied()).collect()
    };
    refused(t.request("POST", "/files/", &with(&[("Upload-Length", "1000000000")]), None).await, "creation").await;
    refused(preflight(&t, evil).await, "preflight").await;
    let patch = with(&[("Content-Type", OCTET), ("Upload-Offset", "0")]);
    refused(t.request("PATCH", &path, &patch, Some(b"abc".to_vec())).await, "PATCH").await;
    assert_eq!(t.request("HEAD", &path, &with(&[]), None).await.status(), 403, "HEAD (no body to read)");
    refused(t.request("DELETE", &path, &with(&[]), None).await, "DELETE").await;
    let draft = [("Origin", evil), ("Upload-Draft-Interop-Version", "6"), ("Upload-Complete", "?1"), ("Content-Type", OCTET)];
    refused(t.request("POST", "/files/", &draft, Some(b"abc".to_vec())).await, "draft creation").await;
    let files = json(t.c.get(s.url("/api/v1/files")).send().await.unwrap()).await;
    assert_eq!(files["files"].as_array().unwrap().len(), 1, "no refused request created anything: {files}");
    assert_eq!(t.offset(&url).await, 0, "the refused PATCH wrote nothing");

    // No Origin (curl, tuspy, the CLI) and the server's own pages: unaffected.
    let own = format!("http://{}", s.addr());
    assert_eq!(
        t.request("POST", "/files/", &[("Origin", own.as_str()), ("Tus-Resumable", "1.0.0"), ("Upload-Length", "1")], None).await.status(),
        201
    );
    assert_eq!(t.patch(&url, 0, b"0123456789".to_vec(), &[]).await.status(), 204);
    drop(s);

    // Opened: a listed origin, or `*`.
    let s = Server::start(&["--cors-allow-origins", "http://localhost:5173"]);
    let t = Tus::new(&s);
    let r = t.request("POST", "/files/", &[("Origin", "http://localhost:5173"), ("Tus-Resumable", "1.0.0"), ("Upload-Length", "1")], None).await;
    assert_eq!(r.status(), 201);
    problem(t.request("POST", "/files/", &with(&[("Upload-Length", "1")]), None).await, 403, "unauthorized").await;
    drop(s);
    let s = Server::start(&["--cors-allow-origins", "*"]);
    let t = Tus::new(&s);
    assert_eq!(t.request("POST", "/files/", &with(&[("Upload-Length", "1")]), None).await.status(), 201);
    drop(s);

    // A server with tokens: any origin by default, with a token.
    let dir = tempfile::tempdir().unwrap();
    let token = "fy_edge_origin_token";
    let cfg = write_file(dir.path(), "ferry.toml", &format!("[[tokens]]\nprincipal = \"alice\"\nsha256 = \"{}\"\n", sha256_hex(token.as_bytes())));
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let r = client()
        .post(s.url("/files/"))
        .header("Origin", evil)
        .header("Authorization", format!("Bearer {token}"))
        .header("Tus-Resumable", "1.0.0")
        .header("Upload-Length", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
}

#[tokio::test]
async fn forwarded_headers_are_ignored_unless_behind_proxy() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let r = t.post(&[("Upload-Length", "1"), ("X-Forwarded-Host", "evil.example"), ("X-Forwarded-Proto", "https")]).await;
    assert!(header(&r, "location").unwrap().starts_with("/files/"));

    let s = Server::start(&["--behind-proxy"]);
    let t = Tus::new(&s);
    let r = t.post(&[("Upload-Length", "1"), ("X-Forwarded-Host", "files.example"), ("X-Forwarded-Proto", "https")]).await;
    assert!(header(&r, "location").unwrap().starts_with("https://files.example/files/"));
    let r = t.post(&[("Upload-Length", "1"), ("Forwarded", "for=1.2.3.4;proto=https;host=\"up.example:8443\", for=5.6.7.8")]).await;
    assert!(header(&r, "location").unwrap().starts_with("https://up.example:8443/files/"));
    let r = t.post(&[("Upload-Length", "1"), ("X-Forwarded-Host", "bad host/x")]).await;
    assert!(!header(&r, "location").unwrap().contains("bad"), "an invalid host is not echoed");
    let long = format!("{}.example", "a".repeat(5000));
    let r = t.post(&[("Upload-Length", "1"), ("X-Forwarded-Host", &long)]).await;
    assert!(header(&r, "location").unwrap().starts_with("/files/"), "a host longer than a host name is not echoed");

    // Behind the proxy, a final may name its parts by the forwarded host's URLs, not another's.
    let r =
        t.post(&[("Upload-Length", "1"), ("Upload-Concat", "partial"), ("X-Forwarded-Host", "files.example"), ("X-Forwarded-Proto", "https")]).await;
    let part = header(&r, "location").unwrap().to_string();
    assert!(part.starts_with("https://files.example/files/"), "{part}");
    let fwd = [("X-Forwarded-Host", "files.example"), ("X-Forwarded-Proto", "https")];
    let r = t.post(&[&[("Upload-Concat", format!("final;{part}").as_str())][..], &fwd[..]].concat()).await;
    assert_eq!(r.status(), 201);
    let other = part.replace("files.example", "evil.example");
    let r = t.post(&[&[("Upload-Concat", format!("final;{other}").as_str())][..], &fwd[..]].concat()).await;
    problem(r, 400, "invalid_argument").await;
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    assert_eq!(t.c.get(s.url("/healthz")).send().await.unwrap().status(), 200);
    assert_eq!(t.c.get(s.url("/readyz")).send().await.unwrap().status(), 200);
    let url = t.create(4).await;
    assert_eq!(t.patch(&url, 0, b"abcd".to_vec(), &[]).await.status(), 204);
    let _ = t.patch(&url, 0, b"x".to_vec(), &[]).await;
    let del = t.create(1).await;
    t.request("DELETE", &del, &[("Tus-Resumable", "1.0.0")], None).await;
    let m = t.c.get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for line in [
        "ferry_uploads_created_total 2",
        "ferry_uploads_finished_total 1",
        "ferry_uploads_terminated_total 1",
        "ferry_bytes_received_total 4",
        "ferry_patches_in_flight 0",
        "ferry_http_requests_total{status=\"201\"} 2",
        "ferry_http_requests_total{status=\"409\"} 1",
    ] {
        assert!(m.contains(line), "{line} missing in\n{m}");
    }
    let r = t.c.get(s.url("/nope")).send().await.unwrap();
    problem(r, 404, "not_found").await;
}

#[tokio::test]
async fn graceful_shutdown_keeps_a_streaming_patch() {
    let mut s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(10 << 20).await;
    // Stream 1 MiB, then stall; SIGTERM must checkpoint what arrived.
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Vec<u8>, std::io::Error>>();
    tx.unbounded_send(Ok(vec![7u8; 1 << 20])).unwrap();
    let body = reqwest::Body::wrap_stream(rx);
    let c = t.c.clone();
    let u = url.clone();
    let pending = tokio::spawn(async move {
        c.patch(&u).header("Tus-Resumable", "1.0.0").header("Content-Type", OCTET).header("Upload-Offset", "0").body(body).send().await
    });
    wait_bytes_received(&s, 1 << 20).await;
    assert!(s.terminate().success(), "clean exit");
    drop(tx);
    // The stopped PATCH is told what was kept (the offset), and when to come back.
    let r = pending.await.unwrap().expect("the PATCH is answered before the server exits");
    assert!(r.headers().contains_key("retry-after"), "{:?}", r.headers());
    assert_eq!(header_u64(&r, "upload-offset"), Some(1 << 20));
    let p = problem(r, 503, "locked").await;
    assert!(p["detail"].as_str().unwrap().contains("offset 1048576"), "{p}");
    let data = s.data.clone();
    let s2 = Server::start_in(&data, &[]);
    let t2 = Tus::new(&s2);
    let path = url.trim_start_matches(&s.base).to_string();
    assert_eq!(t2.offset(&path).await, 1 << 20);
}

#[test]
fn non_loopback_listen_needs_tokens_or_an_explicit_opt_out() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(ferry_bin())
        .args(["serve", "--listen", "0.0.0.0:0", "--data"])
        .arg(dir.path().join("d"))
        .current_dir(dir.path())
        .env_remove("FERRY_INSECURE_NO_AUTH")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ferry token create") && err.contains("--insecure-no-auth"), "{err}");
}

#[tokio::test]
async fn token_create_then_bearer_auth() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ferry.toml");
    let out = std::process::Command::new(ferry_bin()).args(["token", "create", "alice", "--config"]).arg(&cfg).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let stored = std::fs::read_to_string(&cfg).unwrap();
    assert!(!stored.contains(&token), "only the hash is stored");
    assert!(stored.contains("principal = \"alice\""));
    let bad = std::process::Command::new(ferry_bin()).args(["token", "create", "no spaces", "--config"]).arg(&cfg).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));

    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let t = Tus::new(&s);
    let r = t.post(&[("Upload-Length", "1")]).await;
    assert_eq!(header(&r, "www-authenticate"), Some("Bearer"));
    problem(r, 401, "unauthorized").await;
    let auth = format!("Bearer {token}");
    problem(t.post(&[("Upload-Length", "1"), ("Authorization", "Bearer fy_wrong")]).await, 401, "unauthorized").await;
    let r = t.post(&[("Upload-Length", "1"), ("Authorization", &auth)]).await;
    assert_eq!(r.status(), 201);
    assert_eq!(t.request("OPTIONS", "/files/", &[], None).await.status(), 200, "discovery needs no token");
    assert_eq!(t.c.get(s.url("/healthz")).send().await.unwrap().status(), 200);
}

/// Secrets that protect nothing stop start-up with one line naming what is wrong (never the
/// secret): an empty or short webhook key (`whsec_` alone), one byte repeated, a `url_secret`
/// that is empty or all zeros, a token entry whose hash is the empty token's.
#[test]
fn empty_or_weak_secrets_stop_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[[webhooks]]\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_\"\n", "0-byte key"),
        ("[[webhooks]]\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_c2hvcnQ=\"\n", "5-byte key"),
        ("[[webhooks]]\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"\n", "one byte repeated"),
        ("url_secret = \"\"\n", "64 hex digits"),
        ("url_secret = \"0000000000000000000000000000000000000000000000000000000000000000\"\n", "one byte repeated"),
        ("[[tokens]]\nprincipal = \"alice\"\nsha256 = \"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\"\n", "empty token"),
    ];
    for (i, (text, why)) in cases.iter().enumerate() {
        let cfg = dir.path().join(format!("f{i}.toml"));
        std::fs::write(&cfg, text).unwrap();
        let out = std::process::Command::new(ferry_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(dir.path().join(format!("d{i}")))
            .arg("--config")
            .arg(&cfg)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "accepted: {text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{text}: {err}");
    }
}

/// `ferry token create NAME --config /etc/ferry/ferry.toml` on a machine without /etc/ferry:
/// the file is "created if missing", its directories too.
#[test]
fn token_create_makes_the_config_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("etc/ferry/ferry.toml");
    let out = std::process::Command::new(ferry_bin()).args(["token", "create", "alice", "--config"]).arg(&cfg).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read_to_string(&cfg).unwrap().contains("principal = \"alice\""));
}

/// hyper has no reason phrase for 460 and wrote `HTTP/1.1 460 <none>`; ferry sets TUS's
/// `Checksum Mismatch` (as tusd does) through hyper's `ReasonPhrase` extension.
#[tokio::test]
async fn checksum_mismatch_has_a_reason_phrase() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(3).await;
    let path = url.trim_start_matches(&s.base).to_string();
    let mut conn = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    let req = format!(
        "PATCH {path} HTTP/1.1\r\nHost: {}\r\nTus-Resumable: 1.0.0\r\nContent-Type: {OCTET}\r\nUpload-Offset: 0\r\n\
         Upload-Checksum: sha1 AAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        s.addr()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.unwrap();
    let status_line = String::from_utf8_lossy(&answer).lines().next().unwrap_or("").to_string();
    assert_eq!(status_line, "HTTP/1.1 460 Checksum Mismatch");
}

/// Issue 23 kind 17: a clean stop (SIGTERM) closes the SQLite catalog, so no `ferry.db-wal` or
/// `ferry.db-shm` is left beside it; what was stored is there after a restart.
#[tokio::test]
async fn a_clean_stop_leaves_no_wal_files() {
    if catalog_is_postgres() {
        return; // Nothing beside a PostgreSQL catalog; the SQLite run covers this.
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut s = Server::start_in(&data, &[]);
    let data_bytes = pseudo_random(20_000_000, 3);
    let id = Api::new(&s).upload(&data_bytes, "kept.bin").await;
    assert_eq!(Api::new(&s).download(&id).await, data_bytes);
    // A few seconds of a server at rest (its sweeper, finisher and pool at work), as after any use.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(data.join("ferry.db-wal").exists(), "SQLite runs in WAL mode while serving");
    assert!(s.terminate().success());
    for f in ["ferry.db-wal", "ferry.db-shm"] {
        assert!(!data.join(f).exists(), "{f} left after a clean stop");
    }
    let s = Server::start_in(&data, &[]);
    assert_eq!(Api::new(&s).download(&id).await, data_bytes);
}
