//! Interoperability with real TUS clients: tus-js-client (Node), tuspy (Python) and curl.
//!
//! Each test starts a real `ferry serve`, writes a pseudo-random source file, lets the client
//! upload it, then downloads the result and checks that its sha256 equals the source's and the
//! server's `Repr-Digest` header.
//!
//! The clients are installed by `.ci/run`. By hand:
//!   (cd tests/clients/node && npm ci)
//!   python3 -m venv ${TMPDIR:-/tmp}/ferry-python-venv     (or $FERRY_PY_VENV)
//!   ${TMPDIR:-/tmp}/ferry-python-venv/bin/pip install -r tests/clients/python/requirements.txt
//! Overrides: `FERRY_NODE_CLIENTS` (dir with the scripts and node_modules), `FERRY_NODE` (node
//! executable), `FERRY_PYTHON` (python executable that can `import tusclient`).
//! A missing client makes the test FAIL, never skip.

mod common;

use base64::Engine as _;
use common::{client, pseudo_random, python_bin, sha256_hex, Server, Tus};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Per client run; a hung client must not hang the suite.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);

/// 3 MiB plus an odd number of bytes: never a multiple of any chunk size used here.
const SRC_LEN: usize = 3 * 1024 * 1024 + 12_345;

const INSTALL_HINT: &str = "install the real clients with `bash .ci/run` (it runs the tests \
    too) or by hand: `(cd tests/clients/node && npm ci)`; a venv at $FERRY_PY_VENV (default \
    $TMPDIR/ferry-python-venv) with `pip install -r tests/clients/python/requirements.txt`; \
    `apt-get install -y curl`";

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn node_dir() -> PathBuf {
    std::env::var_os("FERRY_NODE_CLIENTS").map(PathBuf::from).unwrap_or_else(|| manifest_dir().join("tests/clients/node"))
}

fn node_bin() -> PathBuf {
    std::env::var_os("FERRY_NODE").map(PathBuf::from).unwrap_or_else(|| "node".into())
}

fn python_dir() -> PathBuf {
    manifest_dir().join("tests/clients/python")
}

/// A command with no proxy settings: everything here talks to loopback.
fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for var in ["http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        cmd.env_remove(var);
    }
    cmd.env("NO_PROXY", "*").env("no_proxy", "*");
    cmd.stdin(Stdio::null());
    cmd
}

/// Run `cmd` to completion (killed after `CLIENT_TIMEOUT`), on a blocking thread.
async fn run(mut cmd: Command) -> Output {
    let what = format!("{cmd:?}");
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}\n{INSTALL_HINT}"));
    let pid = child.id();
    let waiter = tokio::task::spawn_blocking(move || child.wait_with_output());
    match tokio::time::timeout(CLIENT_TIMEOUT, waiter).await {
        Ok(out) => out.unwrap().unwrap_or_else(|e| panic!("waiting for {what}: {e}")),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("{what} did not finish within {CLIENT_TIMEOUT:?}");
        }
    }
}

/// Run a client script; it must exit 0 and print one JSON object line with `url`.
async fn run_client(cmd: Command) -> serde_json::Value {
    let what = format!("{cmd:?}");
    let out = run(cmd).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "client failed ({}): {what}\n--- stdout\n{stdout}\n--- stderr\n{stderr}", out.status);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line from {what}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON {line:?} from {what}: {e}"));
    assert!(v["url"].is_string(), "no \"url\" in {line}");
    eprintln!("{what}\n  -> {line}");
    v
}

fn require_node() {
    let dir = node_dir();
    let ok = command(node_bin()).arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    assert!(ok, "Node.js not found (`{}`); install Node 20. {INSTALL_HINT}", node_bin().display());
    let pkg = dir.join("node_modules/tus-js-client/package.json");
    assert!(pkg.exists(), "tus-js-client is not installed: {} is missing. Run `npm ci` in {}. {INSTALL_HINT}", pkg.display(), dir.display());
}

fn require_python() {
    let py = python_bin();
    let out = command(&py).args(["-c", "import tusclient, importlib.metadata as m; print(m.version('tuspy'))"]).output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("`{}` cannot import tusclient (tuspy): {}\n{INSTALL_HINT}", py.display(), String::from_utf8_lossy(&o.stderr)),
        Err(e) => panic!("Python venv with tuspy not found at `{}` ({e}).\n{INSTALL_HINT}", py.display()),
    }
}

fn require_curl() {
    let ok = command("curl").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    assert!(ok, "curl not found on PATH. {INSTALL_HINT}");
}

/// A pseudo-random source file in its own temp dir.
struct Source {
    _dir: tempfile::TempDir,
    path: PathBuf,
    data: Vec<u8>,
}

fn source(len: usize, seed: u64) -> Source {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("source-{seed}.bin"));
    let data = pseudo_random(len, seed);
    std::fs::write(&path, &data).unwrap();
    Source { _dir: dir, path, data }
}

/// Resolve an upload URL a client printed against the server (relative or absolute), and
/// check it points at this server's `/files/`.
fn resolve(server: &Server, url: &str) -> String {
    let abs = if url.starts_with("http://") || url.starts_with("https://") {
        url.to_string()
    } else if url.starts_with('/') {
        server.url(url)
    } else {
        server.url(&format!("/files/{url}"))
    };
    assert!(abs.starts_with(&server.url("/files/")), "upload URL {url:?} (resolved {abs}) is not under {}", server.url("/files/"));
    abs
}

/// Decode the sha-256 member of a `Repr-Digest` header to hex.
fn repr_digest_sha256_hex(header: &str) -> String {
    let member =
        header.split(',').map(str::trim).find_map(|m| m.strip_prefix("sha-256=")).unwrap_or_else(|| panic!("no sha-256 in Repr-Digest {header:?}"));
    let b64 = member
        .strip_prefix(':')
        .and_then(|m| m.strip_suffix(':'))
        .unwrap_or_else(|| panic!("Repr-Digest sha-256 is not a byte sequence (:…:): {header:?}"));
    let raw = base64::engine::general_purpose::STANDARD.decode(b64).unwrap_or_else(|e| panic!("Repr-Digest {header:?} is not base64: {e}"));
    assert_eq!(raw.len(), 32, "Repr-Digest sha-256 of {} bytes: {header:?}", raw.len());
    hex::encode(raw)
}

/// GET the finished upload; its bytes, sha256 and `Repr-Digest` must all match the source.
async fn verify_download(server: &Server, url: &str, src: &Source) {
    let url = resolve(server, url);
    // A final (concatenated) upload is built by a background task: wait for it.
    Tus::new(server).wait_complete(&url).await;
    let resp = client().get(&url).send().await.expect("GET upload");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.bytes().await.expect("GET body");
    assert_eq!(status, 200, "GET {url}: {status}; body starts {:?}", String::from_utf8_lossy(&body[..body.len().min(300)]));
    assert_eq!(body.len(), src.data.len(), "GET {url}: length");
    let want = sha256_hex(&src.data);
    assert_eq!(sha256_hex(&body), want, "GET {url}: content differs from the source");
    let digest = headers.get("repr-digest").unwrap_or_else(|| panic!("GET {url}: no Repr-Digest header; headers: {headers:?}")).to_str().unwrap();
    assert_eq!(repr_digest_sha256_hex(digest), want, "GET {url}: Repr-Digest {digest:?} != source sha256");
}

fn node_script(name: &str, server: &Server, src: &Source, extra: &[&str]) -> Command {
    let dir = node_dir();
    let mut cmd = command(node_bin());
    cmd.current_dir(&dir).arg(dir.join(name)).arg(&server.base).arg(&src.path).args(extra);
    cmd
}

fn tuspy(server: &Server, src: &Source, extra: &[&str]) -> Command {
    let mut cmd = command(python_bin());
    cmd.current_dir(python_dir()).arg(python_dir().join("tuspy_upload.py")).arg(&server.base).arg(&src.path).args(extra);
    cmd
}

// ---------------------------------------------------------------- tus-js-client (Node)

#[tokio::test]
async fn tus_js_client_chunked_upload() {
    require_node();
    let server = Server::start(&[]);
    let src = source(SRC_LEN, 11);
    let out = run_client(node_script("upload_chunked.js", &server, &src, &[])).await;
    // 256 KiB chunks: 13 PATCHes for 3 MiB + 12 345 bytes.
    assert_eq!(out["chunks"], 13, "{out}");
    verify_download(&server, out["url"].as_str().unwrap(), &src).await;
}

#[tokio::test]
async fn tus_js_client_abort_and_resume() {
    require_node();
    let server = Server::start(&[]);
    let src = source(SRC_LEN, 12);
    let out = run_client(node_script("abort_resume.js", &server, &src, &[])).await;
    let resumed = out["resumed_from"].as_u64().unwrap_or(0);
    assert!(resumed > 0, "resume restarted from 0: {out}");
    verify_download(&server, out["url"].as_str().unwrap(), &src).await;
}

/// One PATCH for the whole file (chunkSize Infinity), cut mid-body by `abort()`: the server
/// must keep what it received, and the resumed upload continues from there.
#[tokio::test]
async fn tus_js_client_abort_mid_patch_and_resume() {
    require_node();
    let server = Server::start(&[]);
    // Big enough that the abort (~100 ms into the body) lands mid-request.
    let src = source(64 * 1024 * 1024 + 4_321, 15);
    let out = run_client(node_script("abort_resume.js", &server, &src, &["Infinity"])).await;
    let kept = out["server_offset"].as_u64().unwrap_or(0);
    assert!(kept > 0 && kept < src.data.len() as u64, "{out}");
    assert_eq!(out["resumed_from"], kept, "{out}");
    verify_download(&server, out["url"].as_str().unwrap(), &src).await;
}

#[tokio::test]
async fn tus_js_client_deferred_length_stream() {
    require_node();
    let server = Server::start(&[]);
    let src = source(SRC_LEN, 13);
    let out = run_client(node_script("deferred.js", &server, &src, &[])).await;
    verify_download(&server, out["url"].as_str().unwrap(), &src).await;
}

#[tokio::test]
async fn tus_js_client_parallel_uploads_concatenation() {
    require_node();
    let server = Server::start(&[]);
    let src = source(SRC_LEN, 14);
    let out = run_client(node_script("parallel.js", &server, &src, &[])).await;
    verify_download(&server, out["url"].as_str().unwrap(), &src).await;
}

// ---------------------------------------------------------------- tuspy (Python)

#[tokio::test]
async fn tuspy_sha1_checksum_256k_chunks() {
    require_python();
    let server = Server::start(&[]);
    let src = source(SRC_LEN, 21);
    let out = run_client(tuspy(&server, &src, &["--chunk-size", "262144"])).await;
    verify_download(&server, out["url"].as_str().unwrap(), &src).await;
}

#[tokio::test]
async fn tuspy_sha1_checksum_odd_chunks() {
    require_python();
    let server = Server::start(&[]);
    let src = source(SRC_LEN, 22);
    let out = run_client(tuspy(&server, &src, &["--chunk-size", "1000003"])).await;
    verify_download(&server, out["url"].as_str().unwrap(), &src).await;
}

#[tokio::test]
async fn tuspy_single_request_no_checksum() {
    require_python();
    let server = Server::start(&[]);
    let src = source(SRC_LEN, 23);
    let out = run_client(tuspy(&server, &src, &["--chunk-size", "1073741824", "--no-checksum"])).await;
    verify_download(&server, out["url"].as_str().unwrap(), &src).await;
}

#[tokio::test]
async fn tuspy_resume_from_url_storage() {
    require_python();
    let server = Server::start(&[]);
    let src = source(SRC_LEN, 24);
    let out = run_client(tuspy(&server, &src, &["--chunk-size", "262144", "--resume-after", "3"])).await;
    assert_eq!(out["resumed_from"], 3 * 262_144, "{out}");
    verify_download(&server, out["url"].as_str().unwrap(), &src).await;
}

#[tokio::test]
async fn tuspy_async_uploader() {
    require_python();
    let server = Server::start(&[]);
    let src = source(SRC_LEN, 25);
    let out = run_client(tuspy(&server, &src, &["--chunk-size", "524288", "--async"])).await;
    verify_download(&server, out["url"].as_str().unwrap(), &src).await;
}

#[tokio::test]
async fn tuspy_wrong_checksum_is_refused_with_460() {
    require_python();
    let server = Server::start(&[]);
    let src = source(SRC_LEN, 26);
    let out = run_client(tuspy(&server, &src, &["--chunk-size", "262144", "--corrupt-checksum"])).await;
    assert_eq!(out["rejected_status"], 460, "{out}");
    assert_eq!(out["offset_after"], 0, "the refused chunk was kept: {out}");
    resolve(&server, out["url"].as_str().unwrap());
}

// ---------------------------------------------------------------- curl

/// One curl call: status code, response headers (lower-cased names; last value wins), and the
/// body written to `body_out` if given.
async fn curl(args: &[&str], body_out: Option<&Path>) -> (u16, HashMap<String, String>) {
    let tmp = tempfile::tempdir().unwrap();
    let hdr = tmp.path().join("headers");
    let mut cmd = command("curl");
    cmd.args(["-sS", "--noproxy", "*", "--max-time", "120", "-D"])
        .arg(&hdr)
        .arg("-o")
        .arg(body_out.map(Path::to_path_buf).unwrap_or_else(|| "/dev/null".into()))
        .args(["-w", "%{http_code}"])
        .args(args);
    let what = format!("{cmd:?}");
    let out = run(cmd).await;
    assert!(out.status.success(), "{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    let code: u16 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let raw = std::fs::read_to_string(&hdr).unwrap();
    // With `Expect: 100-continue` the dump holds two header blocks; keep the last one.
    let last_block = raw.trim_end().rsplit("\r\n\r\n").next().unwrap_or("");
    let headers = last_block.lines().filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
    eprintln!("{what}\n  -> {code}");
    (code, headers)
}

/// curl sends `Expect: 100-continue` before a body over 1 MiB and waits for the `100` (RFC 9110
/// §10.1.1). A PATCH the server refuses from its headers — an offset that moved, a body past
/// the upload's length, an upload already complete — is answered without asking for the body:
/// curl uploads none of its 8 MiB (`%{size_upload}` = 0) and the upload is as it was.
#[tokio::test]
async fn curl_is_not_asked_for_a_body_that_is_refused() {
    require_curl();
    let server = Server::start(&[]);
    let src = source(8 << 20, 33);
    let t = Tus::new(&server);
    let url = t.create(1000).await;
    let done = t.create(3).await;
    assert_eq!(t.patch(&done, 0, b"abc".to_vec(), &[]).await.status(), 204);
    let body = format!("@{}", src.path.display());
    for (what, target, offset, status) in
        [("an offset that moved", &url, "7", "409"), ("past the length", &url, "0", "413"), ("a complete upload", &done, "3", "413")]
    {
        let mut cmd = command("curl");
        cmd.args(["-sS", "--noproxy", "*", "--max-time", "120", "-o", "/dev/null", "-w", "%{http_code} %{size_upload}", "-X", "PATCH"])
            .args(["-H", "Tus-Resumable: 1.0.0", "-H", "Content-Type: application/offset+octet-stream", "-H", &format!("Upload-Offset: {offset}")])
            .args(["--data-binary", &body, target]);
        let out = run(cmd).await;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{status} 0"),
            "{what}: status and bytes curl uploaded ({})",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(t.offset(&url).await, 0);
    assert_eq!(t.download(&done).await, b"abc");
}

#[tokio::test]
async fn curl_create_two_patches_and_range_download() {
    require_curl();
    let server = Server::start(&[]);
    let src = source(SRC_LEN, 31);
    let n = src.data.len();
    let split = 1_500_007; // > 1 MiB, so curl sends `Expect: 100-continue` too
    let dir = src.path.parent().unwrap().to_path_buf();
    let part1 = dir.join("part1");
    let part2 = dir.join("part2");
    std::fs::write(&part1, &src.data[..split]).unwrap();
    std::fs::write(&part2, &src.data[split..]).unwrap();

    // Create.
    let len_hdr = format!("Upload-Length: {n}");
    let (code, h) = curl(&["-X", "POST", "-H", "Tus-Resumable: 1.0.0", "-H", &len_hdr, &server.url("/files/")], None).await;
    assert_eq!(code, 201, "POST /files/: {h:?}");
    let location = h.get("location").unwrap_or_else(|| panic!("no Location: {h:?}")).clone();
    let url = resolve(&server, &location);

    // Two PATCHes.
    let mut offset = 0;
    for part in [&part1, &part2] {
        let off_hdr = format!("Upload-Offset: {offset}");
        let data = format!("@{}", part.display());
        let (code, h) = curl(
            &[
                "-X",
                "PATCH",
                "-H",
                "Tus-Resumable: 1.0.0",
                "-H",
                &off_hdr,
                "-H",
                "Content-Type: application/offset+octet-stream",
                "--data-binary",
                &data,
                &url,
            ],
            None,
        )
        .await;
        offset += std::fs::metadata(part).unwrap().len();
        assert_eq!(code, 204, "PATCH {url} at {off_hdr}: {h:?}");
        assert_eq!(h.get("upload-offset").map(String::as_str), Some(offset.to_string().as_str()), "{h:?}");

        // HEAD agrees.
        let (code, h) = curl(&["-I", "-H", "Tus-Resumable: 1.0.0", &url], None).await;
        assert_eq!(code, 200, "HEAD {url}: {h:?}");
        assert_eq!(h.get("upload-offset").map(String::as_str), Some(offset.to_string().as_str()), "{h:?}");
        assert_eq!(h.get("upload-length").map(String::as_str), Some(n.to_string().as_str()), "{h:?}");
    }

    // Range download with `curl -r`.
    let (lo, hi) = (1_000_003usize, 2_345_678usize);
    let range_file = dir.join("range");
    let range = format!("{lo}-{hi}");
    let (code, h) = curl(&["-r", &range, &url], Some(&range_file)).await;
    assert_eq!(code, 206, "GET -r {range}: {h:?}");
    assert_eq!(h.get("content-range").map(String::as_str), Some(format!("bytes {lo}-{hi}/{n}").as_str()), "{h:?}");
    let got = std::fs::read(&range_file).unwrap();
    assert!(got == src.data[lo..=hi], "range {range}: {} bytes differ from the source", got.len());

    // Suffix range: the last 777 bytes.
    let (code, h) = curl(&["-r", "-777", &url], Some(&range_file)).await;
    assert_eq!(code, 206, "GET -r -777: {h:?}");
    assert!(std::fs::read(&range_file).unwrap() == src.data[n - 777..], "suffix range differs");

    // Whole file with curl, then the common check (sha256 + Repr-Digest) over reqwest.
    let full = dir.join("full");
    let (code, h) = curl(&[&url], Some(&full)).await;
    assert_eq!(code, 200, "GET {url}: {h:?}");
    assert_eq!(sha256_hex(&std::fs::read(&full).unwrap()), sha256_hex(&src.data));
    let digest = h.get("repr-digest").unwrap_or_else(|| panic!("no Repr-Digest: {h:?}"));
    assert_eq!(repr_digest_sha256_hex(digest), sha256_hex(&src.data));
    verify_download(&server, &location, &src).await;
}
