//! The curl recipes of the book's curl chapter (`docs/src/clients/curl.md`) and of the README's
//! five-minute tour, run exactly as printed: the test extracts every ```sh block of that text,
//! replaces only the two variable lines (`FERRY=…`, `f=…`) with its own server and file, runs
//! them as one bash script, and checks every byte by sha256. If the text changes, this test runs
//! the new text.

mod common;
use common::*;

use base64::Engine as _;
use std::process::{Command, Stdio};

/// The line of the first block that names the server, and the one that names the file.
const SERVER_LINE: &str = "FERRY=http://127.0.0.1:8080";
const FILE_LINE: &str = "f=big.iso";

/// The ```sh blocks of the book's curl chapter.
fn curl_recipes() -> Vec<String> {
    let blocks = book::blocks(&book::text("docs/src/clients/curl.md"), "sh");
    assert!(blocks.len() >= 4, "expected the curl recipes, found {} blocks", blocks.len());
    blocks
}

/// The ```sh blocks of the README's curl tour (under "## Five minutes with ferry", before the CLI).
fn readme_tour() -> Vec<String> {
    let tour = book::section(&book::text("README.md"), "## Five minutes with ferry");
    let curl = tour.split("**The CLI**").next().unwrap();
    let blocks = book::blocks(curl, "sh");
    assert!(blocks.len() >= 3, "expected the README's curl tour, found {} blocks", blocks.len());
    blocks
}

/// Replace the variable line starting like `line` (up to its `=`) with `name=value`.
fn substitute(script: &str, line: &str, value: &str) -> String {
    let name = line.split('=').next().unwrap();
    let mut found = false;
    let out: Vec<String> = script
        .lines()
        .map(|l| {
            if l.starts_with(line) {
                found = true;
                format!("{name}='{value}'")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(found, "the curl recipes no longer start with a `{line}` line");
    out.join("\n")
}

/// Run `blocks` as one bash script in `dir`, their `FERRY=…` and `f=…` lines naming `s` and
/// `file`; returns stdout, panics with the script and its output when it fails.
async fn run_recipes(what: &str, blocks: Vec<String>, s: &Server, file: &std::path::Path, dir: &std::path::Path) -> String {
    let script = substitute(&blocks.join("\n"), SERVER_LINE, &s.base);
    let script = substitute(&script, FILE_LINE, file.to_str().unwrap());
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(format!("set -euo pipefail\n{script}")).current_dir(dir).stdin(Stdio::null());
    for v in ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "https_proxy", "HTTPS_PROXY"] {
        cmd.env_remove(v);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed ({}):\n--- script\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}", out.status);
    stdout
}

#[tokio::test]
async fn readme_curl_recipes() {
    readme_curl_recipes_with(&[]).await;
}

/// The same recipes against a server whose `Location` is absolute (`--behind-proxy` builds it
/// from `Host`, as `--public-url` does from its URL): the recipes take either form.
#[tokio::test]
async fn readme_curl_recipes_with_absolute_locations() {
    readme_curl_recipes_with(&["--behind-proxy"]).await;
}

async fn readme_curl_recipes_with(args: &[&str]) {
    let ok = Command::new("curl").arg("--version").stdout(Stdio::null()).status().map(|s| s.success()).unwrap_or(false);
    assert!(ok, "curl not found on PATH; `bash .ci/run` installs it");
    let s = Server::start(args);
    if !args.is_empty() {
        let r = Tus::new(&s).post(&[("Upload-Length", "1")]).await;
        assert!(header(&r, "location").unwrap().starts_with("http://"), "absolute Location: {:?}", r.headers());
    }
    let dir = tempfile::tempdir().unwrap();
    let len = 3 * 1024 * 1024 + 4321;
    let data = pseudo_random(len, 31);
    let sha = sha256_hex(&data);
    let src = dir.path().join("source file.iso");
    std::fs::write(&src, &data).unwrap();

    let stdout = run_recipes("the curl chapter", curl_recipes(), &s, &src, dir.path()).await;

    // Both uploads (resumed, and one request with a checksum) are complete and match.
    let files = json(Api::new(&s).get("/api/v1/files").await).await;
    let files = files["files"].as_array().unwrap();
    assert_eq!(files.len(), if args.is_empty() { 2 } else { 3 }, "{files:?}");
    for f in files.iter().filter(|f| f["size"] != 1) {
        assert_eq!(f["complete"], true, "{f}");
        assert_eq!(f["sha256"], sha.as_str(), "{f}");
    }
    assert!(files.iter().any(|f| f["name"] == "source file.iso"), "the metadata filename: {files:?}");
    // Downloads: whole, a range, a continued partial file.
    assert_eq!(sha256_hex(&std::fs::read(dir.path().join("copy.iso")).unwrap()), sha);
    assert_eq!(std::fs::read(dir.path().join("first-kib.bin")).unwrap(), data[..1024]);
    assert_eq!(sha256_hex(&std::fs::read(dir.path().join("partial.iso")).unwrap()), sha);
    // The printed URL and Repr-Digest.
    assert!(stdout.contains(&s.url("/files/")), "{stdout}");
    let b64 = base64::engine::general_purpose::STANDARD.encode(hex::decode(&sha).unwrap());
    assert!(stdout.to_ascii_lowercase().contains("repr-digest") && stdout.contains(&format!("sha-256=:{b64}:")), "{stdout}");
}

/// The README's five-minute tour: one upload, cut after its first MiB and resumed, then
/// downloaded and compared with `cmp`.
#[tokio::test]
async fn readme_tour_uploads_and_resumes() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random(5 * 1024 * 1024 + 17, 37);
    let sha = sha256_hex(&data);
    let src = dir.path().join("big.iso");
    std::fs::write(&src, &data).unwrap();
    let stdout = run_recipes("the README's tour", readme_tour(), &s, &src, dir.path()).await;
    assert!(stdout.contains("the same bytes"), "{stdout}");
    let files = json(Api::new(&s).get("/api/v1/files").await).await;
    let files = files["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(files[0]["complete"], true, "{}", files[0]);
    assert_eq!(files[0]["sha256"], sha.as_str(), "{}", files[0]);
    assert_eq!(files[0]["name"], "big.iso");
    assert_eq!(sha256_hex(&std::fs::read(dir.path().join("copy.iso")).unwrap()), sha);
}
