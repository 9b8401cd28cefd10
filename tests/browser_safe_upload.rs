//! The safe browser upload flows (README "Uploads from a web page"), in headless Chromium on a
//! page of another origin, against a server with tokens:
//! 1. the backend (this test, with a full token) creates the upload and a share with scope
//!    `upload`; the page gets only that signed URL and tus-js-client resumes it with `uploadUrl`;
//!    no request the browser sends carries an Authorization header;
//! 2. the backend hands the page a short-lived token of scope `upload`; the page creates its own
//!    upload with it (the PATCHes go to the signed Location ferry answers), and the same token is
//!    refused when the page tries to read or delete another file.
//!
//! Both files arrive byte-exact (sha256 computed in the page with `crypto.subtle`) and belong to
//! the backend's principal. Needs Chromium and `tests/clients/node/node_modules` (`bash .ci/run`).

mod common;

use std::process::Command;

use common::logged::LoggedServer;
use common::*;

fn create_token(cfg: &std::path::Path, name: &str, extra: &[&str]) -> String {
    let out = Command::new(ferry_bin()).args(["token", "create", name, "--config", cfg.to_str().unwrap()]).args(extra).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_uploads_with_a_signed_url_or_an_upload_scoped_token_only() {
    let chromium = std::env::var("FERRY_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(std::path::Path::new(&chromium).exists(), "Chromium not found at {chromium}: `bash .ci/run` installs it (`apt-get install -y chromium`)");
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_file(tmp.path(), "ferry.toml", "");
    let full = create_token(&cfg, "shop", &[]);
    let scoped = create_token(&cfg, "shop", &["--scope", "upload", "--ttl", "1h"]);
    let s = LoggedServer::start(&tmp.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    let backend = Api { c: client(), base: s.base.clone(), token: Some(full.clone()) };

    // The backend's own file, which the page must not be able to read or delete.
    let private = pseudo_random(10_000, 3);
    let other_id = backend.upload(&private, "private.bin").await;

    // Flow 1: the backend creates the upload and shares only its signed upload URL.
    let size: usize = 700 * 1024 + 5;
    let r = backend
        .send(
            "POST",
            "/files/",
            &[("Tus-Resumable", "1.0.0"), ("Upload-Length", &size.to_string()), ("Upload-Metadata", "filename cGFnZS5iaW4=")],
            None,
        )
        .await;
    assert_eq!(r.status(), 201);
    let id = header(&r, "location").unwrap().trim_start_matches("/files/").to_string();
    let share = json(backend.post(&format!("/api/v1/files/{id}/share"), r#"{"scope":"upload","ttl_ms":3600000}"#).await).await;
    let signed_url = share["url"].as_str().unwrap().to_string();

    let params = serde_json::json!({ "base": s.base, "signedUrl": signed_url, "scopedToken": scoped, "otherId": other_id, "size": size });
    let out = run_json_client(node_script("safe_upload/run.js", &[&params.to_string()]), 300).await;
    assert!(out["origin"].as_str().unwrap() != s.base, "cross-origin for real");

    // Flow 1: the bytes arrived, and the browser sent no Authorization at all for them.
    let got = backend.download(&id).await;
    assert_eq!(sha256_hex(&got), out["signed"]["sha256"].as_str().unwrap());
    let requests = out["requests"].as_array().unwrap();
    let flow1: Vec<_> = requests.iter().filter(|r| r["url"].as_str().unwrap().contains(&id)).collect();
    assert!(flow1.iter().any(|r| r["method"] == "PATCH"), "{requests:?}");
    assert!(flow1.iter().all(|r| r["authorization"].is_null()), "a request of the signed-URL flow carried a token: {flow1:?}");
    assert_eq!(out["page_html_has_token"], false);

    // Flow 2: the page's own upload belongs to the backend's principal and is byte-exact.
    let url2 = out["scoped"]["url"].as_str().unwrap();
    assert!(url2.contains("scope=upload"), "PATCHed through the signed Location: {url2}");
    let id2 = url2.rsplit("/files/").next().unwrap().split('?').next().unwrap();
    assert_eq!(sha256_hex(&backend.download(id2).await), out["scoped"]["sha256"].as_str().unwrap());
    assert_eq!(backend.file(id2).await["name"], "from-page.bin");
    // …and the token could neither read nor delete the backend's other file.
    assert_eq!(out["refused"]["read"], 403, "{out}");
    assert_eq!(out["refused"]["delete"], 403, "{out}");
    assert_eq!(sha256_hex(&backend.download(&other_id).await), sha256_hex(&private));
}
