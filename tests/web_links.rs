//! The pages of links kept by the server (issue 51) in Debian's Chromium via playwright-core,
//! against the real binary: a request for three files is fulfilled in one choice, each file
//! arriving sha256-exact and listed on the link; a passphrase link refuses wrong passphrases,
//! opens with the right one, and slows repeated wrong tries; a one-time share of three files
//! downloads each exactly for its first visitor and tells the next one it was used.
//! Screenshots go to `target/test-artifacts/link-*.png`.
//!
//! Needs /usr/bin/chromium (or `FERRY_CHROMIUM`) and `tests/clients/node/node_modules`, as
//! web_pages.rs does. Fails (does not skip) without them.

mod common;
use common::*;

async fn make(api: &Api, body: serde_json::Value) -> serde_json::Value {
    let r = api.post("/api/v1/links", &body.to_string()).await;
    assert_eq!(r.status(), 201, "create link {body}");
    json(r).await
}

#[tokio::test]
async fn request_passphrase_and_one_time_share_pages_in_chromium() {
    let chromium = std::env::var("FERRY_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(std::path::Path::new(&chromium).exists(), "Chromium not found at {chromium}: `bash .ci/run` installs it");
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let dir = tempfile::tempdir().unwrap();

    let request = make(&api, serde_json::json!({ "kind": "request", "message": "Please send the three reports.\nThanks!", "max_files": 3 })).await;
    let sizes = [5 << 20, 300_001, 17];
    let mut paths = Vec::new();
    let mut sums = std::collections::BTreeMap::new();
    for (i, n) in sizes.iter().enumerate() {
        let data = pseudo_random(*n, 60 + i as u64);
        let p = dir.path().join(format!("report-{i}.bin"));
        std::fs::write(&p, &data).unwrap();
        sums.insert(format!("report-{i}.bin"), sha256_hex(&data));
        paths.push(p);
    }

    let secret = api.upload(b"behind a passphrase", "secret.txt").await;
    let locked = make(&api, serde_json::json!({ "kind": "share", "files": [secret], "message": "the key", "passphrase": "open sesame" })).await;
    let locked2 = make(&api, serde_json::json!({ "kind": "share", "files": [secret], "passphrase": "something else" })).await;

    let shared: Vec<Vec<u8>> = (0..3).map(|i| pseudo_random(200_000 * (i + 1), 70 + i as u64)).collect();
    let mut ids = Vec::new();
    for (i, d) in shared.iter().enumerate() {
        ids.push(api.upload(d, &format!("export-{i}.csv")).await);
    }
    let share = make(&api, serde_json::json!({ "kind": "share", "files": ids, "message": "Your exports.", "max_downloads": 1 })).await;

    let spec = serde_json::json!({
        "request": request["url"], "files": paths, "locked": locked["url"], "passphrase": "open sesame", "locked2": locked2["url"],
        "share": share["url"], "artifacts": manifest_dir().join("target/test-artifacts"), "download_dir": dir.path(),
    });
    let spec_path = dir.path().join("spec.json");
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let out = run_json_client(node_script("web/links.js", &[spec_path.to_str().unwrap()]), 600).await;
    eprintln!("links: {out}");
    assert_eq!(out["dialogs"], serde_json::json!([]));
    assert!(!out["errors"].as_array().unwrap().iter().any(|e| e.as_str().unwrap().contains("pageerror")), "{out}");

    // The request: the message first, each file exact on the server, recorded on the link.
    assert_eq!(out["request"]["message"], "Please send the three reports.\nThanks!");
    let rows = out["request"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{out}");
    let link = json(api.get(&format!("/api/v1/links/{}", request["id"].as_str().unwrap())).await).await;
    for row in rows {
        let name = row["name"].as_str().unwrap();
        assert_eq!(row["state"], "stored", "{row}");
        assert_eq!(row["sha256"], sums[name].as_str(), "{name}: the page's fingerprint");
        let id = row["id"].as_str().unwrap();
        assert_eq!(api.file(id).await["sha256"], sums[name].as_str(), "{name}: the server's file");
        assert!(link["files"].as_array().unwrap().iter().any(|f| f == id), "{id} is on the link: {link}");
    }
    assert_eq!(link["state"], "full");

    // The passphrase: nothing shown before; wrong, wrong, right; then slowed.
    let l = &out["locked"];
    assert_eq!(l["shown_before"], false);
    let states: Vec<&str> = l["states"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    assert_eq!(&states[..3], ["wrong", "wrong", "ready"], "{l}");
    assert_eq!(states.last(), Some(&"slowed"), "{l}");
    assert!(l["wrong"].as_str().unwrap().contains("not right"), "{l}");
    assert!(l["slowed"].as_str().unwrap().contains("Wait"), "{l}");
    assert_eq!(l["message"], "the key");
    assert_eq!(l["files"], 1);

    // The one-time share: three exact downloads for the first visitor, "used" for the next.
    let sh = &out["share"];
    assert_eq!(sh["title"], "3 files are shared with you");
    assert_eq!(sh["message"], "Your exports.");
    assert!(sh["limits"].as_str().unwrap().contains("one-time link"), "{sh}");
    assert_eq!(sh["names"], serde_json::json!(["export-0.csv", "export-1.csv", "export-2.csv"]));
    assert_eq!(sh["hashes_shown"], false, "no raw hash unless asked");
    assert!(sh["zip"].as_str().unwrap().ends_with("/zip"));
    let got: Vec<&str> = sh["downloads"].as_array().unwrap().iter().map(|d| d["sha256"].as_str().unwrap()).collect();
    let want: Vec<String> = shared.iter().map(|d| sha256_hex(d)).collect();
    assert_eq!(got, want, "{sh}");
    assert_eq!(out["used"]["status"], 410);
    assert_eq!(out["used"]["title"], "This link has been used");
    assert!(out["used"]["detail"].as_str().unwrap().contains("share the files again"), "{}", out["used"]);
}
