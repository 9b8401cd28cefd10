//! Protections a new user's attack found missing: browsers on other origins, DNS rebinding,
//! two servers on one data directory, and readers interrupting writers.

mod common;

use common::{client, problem, Server, Tus};

const OCTET: &str = "application/offset+octet-stream";

#[tokio::test]
async fn other_origins_cannot_drive_the_api_or_mcp_nor_upload_to_a_tokenless_server() {
    let s = Server::start(&[]);
    let c = client();
    // A "simple" cross-origin POST (no preflight in a browser) is refused before it runs.
    let r = c
        .post(s.url("/api/v1/tasks"))
        .header("origin", "http://evil.example")
        .header("content-type", "text/plain")
        .body(r#"{"kind":"archive","args":{}}"#)
        .send()
        .await
        .unwrap();
    problem(r, 403, "unauthorized").await;
    let r = c.get(s.url("/api/v1/files")).header("origin", "http://evil.example").send().await.unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    problem(r, 403, "unauthorized").await;
    let r = c.post(s.url("/mcp")).header("origin", "http://evil.example").header("content-type", "application/json").body("{}").send().await.unwrap();
    problem(r, 403, "unauthorized").await;
    // No CORS preflight approval for the API.
    let r = c
        .request(reqwest::Method::OPTIONS, s.url("/api/v1/tasks"))
        .header("origin", "http://evil.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none(), "{:?}", r.headers());
    // Same origin is fine.
    let r = c.get(s.url("/api/v1/files")).header("origin", format!("http://{}", s.addr())).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // Without tokens, TUS is closed to pages on other origins too (issue 48 kind 10), unless
    // they are listed (tests/edge.rs: `[cors] allow_origins`, `*`, a server with tokens).
    let r = c
        .request(reqwest::Method::OPTIONS, s.url("/files/"))
        .header("origin", "http://app.example")
        .header("access-control-request-method", "PATCH")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none(), "{:?}", r.headers());
    problem(r, 403, "unauthorized").await;
    let r = c
        .post(s.url("/files/"))
        .header("origin", "http://app.example")
        .header("tus-resumable", "1.0.0")
        .header("upload-length", "1")
        .send()
        .await
        .unwrap();
    problem(r, 403, "unauthorized").await;
    let r = c
        .post(s.url("/files/"))
        .header("origin", format!("http://{}", s.addr()))
        .header("tus-resumable", "1.0.0")
        .header("upload-length", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "the server's own pages upload");
}

#[tokio::test]
async fn without_tokens_only_this_servers_host_names_are_served() {
    let s = Server::start(&["--public-url", "http://files.internal:9000"]);
    let c = client();
    for (host, ok) in [("127.0.0.1", true), ("localhost:1234", true), ("files.internal", true), ("evil.example", false), ("evil.example:80", false)] {
        let r = c.get(s.url("/api/v1/files")).header("host", host).send().await.unwrap();
        if ok {
            assert_eq!(r.status(), 200, "{host}");
        } else {
            problem(r, 403, "unauthorized").await;
        }
    }
}

#[test]
fn a_second_server_on_the_same_data_dir_is_refused() {
    let first = Server::start(&[]);
    let out = std::process::Command::new(common::ferry_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(&first.data)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another ferry process is serving the data directory"), "{err}");
}

#[tokio::test]
async fn a_plain_head_does_not_interrupt_an_upload() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(2 << 20).await;
    let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Vec<u8>, std::io::Error>>();
    tx.unbounded_send(Ok(vec![1u8; 1 << 20])).unwrap();
    let c = t.c.clone();
    let u = t.abs(&url);
    let patch = tokio::spawn(async move {
        c.patch(&u)
            .header("Tus-Resumable", "1.0.0")
            .header("Content-Type", OCTET)
            .header("Upload-Offset", "0")
            .body(reqwest::Body::wrap_stream(rx))
            .send()
            .await
            .unwrap()
            .status()
    });
    // Wait until the server has received the first MiB (its metrics never interrupt).
    common::wait_bytes_received(&s, 1 << 20).await;
    // A plain HEAD (no Tus-Resumable) reads, as the GET it mirrors (409: unfinished); the
    // PATCH goes on.
    let r = client().head(t.abs(&url)).send().await.unwrap();
    assert_eq!(r.status(), 409);
    tx.unbounded_send(Ok(vec![2u8; 1 << 20])).unwrap();
    drop(tx);
    assert_eq!(patch.await.unwrap(), 204, "the PATCH was not stopped by the reader");
    assert_eq!(t.offset(&url).await, 2 << 20);
}

/// Behind nginx with `proxy_set_header Host $host` the port is gone from `Host`, but the
/// dashboard's page was loaded from `--public-url` (port included) and sends that as `Origin`:
/// ferry takes its own public origin as same-origin — the dashboard's Share works — and still
/// refuses every other origin, the public host on another port or scheme included (an Origin
/// naming exactly the `Host` sent stays same-origin, as before). The TUS
/// endpoints with an `[cors] allow_origins` list take it too.
#[tokio::test]
async fn the_public_url_origin_is_ferrys_own_when_a_proxy_drops_the_port() {
    let s = Server::start(&["--public-url", "http://files.example.com:8443/", "--cors-allow-origins", "https://app.example"]);
    let c = client();
    let t = Tus::new(&s);
    let r = t.post(&[("Upload-Length", "3")]).await;
    assert_eq!(r.status(), 201);
    let id = r.headers()["location"].to_str().unwrap().rsplit('/').next().unwrap().to_string();
    let share = |origin: &'static str| {
        c.post(s.url(&format!("/api/v1/files/{id}/share")))
            .header("host", "files.example.com")
            .header("origin", origin)
            .header("content-type", "application/json")
            .body(r#"{"scope":"upload","ttl_ms":60000}"#)
            .send()
    };
    let ok = share("http://files.example.com:8443").await.unwrap();
    assert!(ok.status().is_success(), "the public URL's origin: {}", ok.status());
    for foreign in ["http://evil.example", "https://files.example.com:8443", "http://files.example.com:8444"] {
        problem(share(foreign).await.unwrap(), 403, "unauthorized").await;
    }
    // TUS with an allow list: the public origin is ferry's own, a stranger is refused.
    let r = c
        .post(s.url("/files/"))
        .header("host", "files.example.com")
        .header("origin", "http://files.example.com:8443")
        .header("tus-resumable", "1.0.0")
        .header("upload-length", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = c
        .post(s.url("/files/"))
        .header("host", "files.example.com")
        .header("origin", "http://evil.example")
        .header("tus-resumable", "1.0.0")
        .header("upload-length", "1")
        .send()
        .await
        .unwrap();
    problem(r, 403, "unauthorized").await;
}
