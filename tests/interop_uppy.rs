//! Uppy (`@uppy/core` 6 + `@uppy/tus` 6) in headless Chromium, on a page served from another
//! origin than ferry (so every request is a real CORS request): upload a generated file,
//! pause after two PATCHes, read the server's offset with a cross-origin HEAD, resume,
//! finish, with `addRequestId: true` (an `X-Request-ID` on every request, which the preflight
//! must allow). The stored file's sha256 must equal the one the page computed
//! (`crypto.subtle`), and so must `Repr-Digest`. A screenshot of the page is saved to
//! `target/test-artifacts/uppy-chromium.png`.
//!
//! Needs Debian's Chromium at /usr/bin/chromium (or `FERRY_CHROMIUM`) and
//! `tests/clients/node/node_modules`; `bash .ci/run` installs both. The test never installs
//! anything itself, and fails (does not skip) without them.

mod common;
use common::*;

#[tokio::test]
async fn uppy_in_chromium_cross_origin_pause_resume() {
    let chromium = std::env::var("FERRY_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(std::path::Path::new(&chromium).exists(), "Chromium not found at {chromium}: `bash .ci/run` installs it (`apt-get install -y chromium`)");
    assert!(
        manifest_dir().join("tests/clients/node/node_modules/@uppy/tus/package.json").exists(),
        "Uppy is not installed: run `bash .ci/run` or `(cd tests/clients/node && npm ci)`"
    );
    // A server without tokens takes browser uploads only from its own pages and the origins
    // it lists: the page's origin is listed, as a developer opens it for a dev server.
    let page_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let page_origin = format!("http://127.0.0.1:{page_port}");
    let s = Server::start(&["--cors-allow-origins", &page_origin]);
    let shot = manifest_dir().join("target/test-artifacts/uppy-chromium.png");
    let _ = std::fs::remove_file(&shot);
    let size = 6 * 1024 * 1024 + 123;
    let mut run = node_script("uppy/run.js", &[&s.base, shot.to_str().unwrap(), &size.to_string(), &(512 * 1024).to_string()]);
    run.env("PAGE_PORT", page_port.to_string());
    let out = run_json_client(run, 300).await;
    eprintln!("uppy: {out}");
    // Cross-origin for real.
    let origin = out["origin"].as_str().unwrap();
    assert!(origin == page_origin && origin != s.base, "page origin {origin} vs ferry {}", s.base);
    // Paused mid-way: the server had part of the file, not all of it.
    let paused = out["paused_at"].as_u64().unwrap();
    assert!(paused >= 2 * 512 * 1024 && paused < size, "paused at {paused} of {size}");
    assert_eq!(out["size"], size);
    // Every answered request carried X-Request-ID (the POST and each PATCH at least): the
    // browser's preflight allowed it.
    assert!(out["request_ids"].as_u64().unwrap() > out["patches"].as_u64().unwrap(), "{out}");
    let sha = out["sha256"].as_str().unwrap();
    assert_eq!(sha.len(), 64);
    assert_stored_sha256(&s, out["url"].as_str().unwrap(), sha).await;
    let png = std::fs::read(&shot).expect("screenshot saved");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG: {}", shot.display());
}
