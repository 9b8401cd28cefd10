//! File names as response headers and as text for people (the tester's faults: a 1200-character
//! name made ~5 KB of response headers that nginx refused with 502; names carrying terminal
//! escapes and bidi overrides were passed on raw). Metadata is bounded at creation with a
//! problem naming the limit; `Content-Disposition` stays within its bound for long names of any
//! script; names shown to people have control and bidi characters replaced by U+FFFD.

mod common;
use common::*;

use base64::Engine as _;

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Bytes of every response header, as HTTP/1.1 writes them (`name: value\r\n`).
fn header_bytes(r: &reqwest::Response) -> usize {
    r.headers().iter().map(|(k, v)| k.as_str().len() + 2 + v.len() + 2).sum()
}

/// Create an upload named `name` the way tus-js-client and Uppy do (the name twice, plus a
/// type), upload `data`, and return its URL.
async fn upload_named(t: &Tus, name: &str, data: &[u8]) -> String {
    let md = format!("filename {},name {},filetype {},relativePath {}", b64(name), b64(name), b64("application/pdf"), b64("null"));
    let len = data.len().to_string();
    let r = t.post(&[("Upload-Length", &len), ("Upload-Metadata", &md)]).await;
    assert_eq!(r.status(), 201, "create {name:?}: {:?}", r.text().await);
    let url = t.abs(header(&r, "location").unwrap());
    assert_eq!(t.patch(&url, 0, data.to_vec(), &[]).await.status(), 204);
    url
}

/// The longest names ferry accepts (255 characters: ASCII, 3-byte CJK, 4-byte emoji, one
/// full of escapes) keep every HEAD, GET and `?download=1` answer under 6 KiB of headers,
/// the Content-Disposition under 1 KiB; one character more, or 4 KiB of metadata more, is
/// refused at creation with 400 naming the limit.
#[tokio::test]
async fn long_names_keep_response_headers_within_their_bound() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let names = [
        format!("{}.pdf", "a".repeat(251)),
        format!("{}.pdf", "履".repeat(251)),
        format!("{}.pdf", "😀".repeat(251)),
        format!("{}x.pdf", "\u{1b}\u{202e}".repeat(125)),
    ];
    for name in &names {
        assert_eq!(name.chars().count(), 255);
        let url = upload_named(&t, name, b"%PDF-1.7 tiny").await;
        let head = t.head(&url).await;
        assert_eq!(head.status(), 200);
        assert!(header_bytes(&head) < 6 * 1024, "HEAD headers are {} bytes for {name:?}", header_bytes(&head));
        for get in [url.clone(), format!("{url}?download=1")] {
            let r = t.c.get(&get).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let cd = header(&r, "content-disposition").expect("Content-Disposition");
            assert!(cd.len() < 1024, "Content-Disposition is {} bytes: {cd}", cd.len());
            assert!(cd.contains(".pdf"), "the extension is kept: {cd}");
            assert!(header_bytes(&r) < 6 * 1024, "GET headers are {} bytes", header_bytes(&r));
        }
    }

    // One character over: refused before anything is stored, naming the limit.
    let md = format!("filename {}", b64(&"é".repeat(256)));
    let p = problem(t.post(&[("Upload-Length", "5"), ("Upload-Metadata", &md)]).await, 400, "invalid_argument").await;
    assert!(p["detail"].as_str().unwrap().contains("at most 255"), "{p}");
    // More than 4 KiB of metadata in all (each value short): refused, naming 4096.
    let many: Vec<String> = (0..60).map(|i| format!("k{i} {}", b64(&"x".repeat(60)))).collect();
    let p = problem(t.post(&[("Upload-Length", "5"), ("Upload-Metadata", &many.join(","))]).await, 400, "invalid_argument").await;
    assert!(p["detail"].as_str().unwrap().contains("4096"), "{p}");
    let files = json(Api::new(&s).get("/api/v1/files?limit=1000").await).await;
    assert_eq!(files["files"].as_array().unwrap().len(), names.len(), "nothing was created by the refused requests");
}

/// A name with a terminal escape, BEL and a right-to-left override ("invoice", U+202E, "gnp.exe"
/// reads "invoiceexe.png"): the download's Content-Disposition (both `filename` and `filename*`)
/// carries none of them, the API's `display_name` shows U+FFFD in their place, and `name` keeps
/// the bytes as sent.
#[tokio::test]
async fn hostile_names_are_never_passed_on_raw() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let name = "invoice\u{202e}gnp.exe\u{7}\u{1b}[2J";
    let url = upload_named(&t, name, b"MZ").await;
    let r = t.c.get(format!("{url}?download=1")).send().await.unwrap();
    let cd = header(&r, "content-disposition").unwrap().to_string();
    for raw in ["%E2%80%AE", "%07", "%1B", "\u{1b}", "\u{7}"] {
        assert!(!cd.contains(raw), "{raw:?} in {cd}");
    }
    assert!(cd.contains("%EF%BF%BD"), "U+FFFD stands in their place: {cd}");
    let id = url.rsplit('/').next().unwrap();
    let f = Api::new(&s).file(id).await;
    assert_eq!(f["name"], name, "the name as sent");
    assert_eq!(f["display_name"], "invoice\u{fffd}gnp.exe\u{fffd}\u{fffd}[2J", "{f}");
}

/// `/favicon.ico` (every browser asks for it on the pages) answers 204 without a token on a
/// server with tokens (not 401, nor a 404 in every page's console), and 404 with `--no-web`.
#[tokio::test]
async fn favicon_is_a_plain_204_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ferry.toml");
    let out = std::process::Command::new(ferry_bin()).args(["token", "create", "alice", "--config"]).arg(&cfg).output().unwrap();
    assert!(out.status.success());
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let r = client().get(s.url("/favicon.ico")).send().await.unwrap();
    assert_eq!(r.status(), 204);
    problem(client().get(s.url("/api/v1/files")).send().await.unwrap(), 401, "unauthorized").await;
    let api_only = Server::start(&["--config", cfg.to_str().unwrap(), "--no-web"]);
    problem(client().get(api_only.url("/favicon.ico")).send().await.unwrap(), 404, "not_found").await;
}
