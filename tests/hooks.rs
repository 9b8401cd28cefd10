//! Pre-create and pre-finish hooks (DESIGN §8; issue 12) against the real binary, a real hook
//! server (tests/clients/python/upload_hook.py) and tus-js-client.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;

struct HookServer {
    child: Child,
    port: u16,
}

impl HookServer {
    fn start(dir: &Path) -> HookServer {
        let log = dir.join("hook.jsonl");
        let down = dir.join("hook-down");
        let mut child = python_script("upload_hook.py", &["--log", log.to_str().unwrap(), "--down", down.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start upload_hook.py");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines.next().expect("hook exited before listening").unwrap();
        let port = line.strip_prefix("listening on ").expect("listening line").trim().parse().unwrap();
        std::thread::spawn(move || for _ in lines.by_ref() {});
        HookServer { child, port }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for HookServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn md(pairs: &[(&str, &str)]) -> String {
    use base64::Engine as _;
    pairs.iter().map(|(k, v)| format!("{k} {}", base64::engine::general_purpose::STANDARD.encode(v))).collect::<Vec<_>>().join(",")
}

fn start(dir: &Path, toml: &str) -> Server {
    let cfg = write_file(dir, "ferry.toml", toml);
    Server::start(&["--config", cfg.to_str().unwrap()])
}

/// A pre-create hook that refuses `.exe` names: tus-js-client gets the hook's status and
/// message; nothing is created. The same hook renames a file: HEAD shows the new metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_create_hook_refuses_exe_for_tus_js_client_and_can_change_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let hook = HookServer::start(dir.path());
    let server = start(dir.path(), &format!("[hooks.pre_create]\nurl = \"{}\"\n", hook.url("/pre-create")));
    let file = dir.path().join("payload.bin");
    std::fs::write(&file, pseudo_random(100_000, 3)).unwrap();
    let out = run_json_client(node_script("expect_rejected.js", &[&server.base, file.to_str().unwrap(), "setup.exe"]), 120).await;
    assert_eq!(out["status"], 403, "{out}");
    let body: serde_json::Value = serde_json::from_str(out["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["code"], "rejected", "{body}");
    assert_eq!(body["detail"], "executables are not accepted: setup.exe", "{body}");
    let api = Api::new(&server);
    assert_eq!(json(api.get("/api/v1/files").await).await["files"].as_array().unwrap().len(), 0, "nothing was created");

    // Allowed and renamed by the hook.
    let tus = Tus::new(&server);
    let r = tus.post(&[("Upload-Length", "5"), ("Upload-Metadata", &md(&[("filename", "rename-me.txt")]))]).await;
    assert_eq!(r.status(), 201);
    let url = tus.abs(header(&r, "location").unwrap());
    let head = tus.head(&url).await;
    let got = header(&head, "upload-metadata").unwrap().to_string();
    let mut pairs: Vec<&str> = got.split(',').collect();
    pairs.sort();
    let mut want_pairs = md(&[("filename", "renamed.txt"), ("checked", "yes")]);
    want_pairs = {
        let mut v: Vec<&str> = want_pairs.split(',').collect();
        v.sort();
        v.join(",")
    };
    assert_eq!(pairs.join(","), want_pairs, "HEAD shows the hook's metadata");
    // Other names pass untouched.
    let r = tus.post(&[("Upload-Length", "5"), ("Upload-Metadata", &md(&[("filename", "ok.txt")]))]).await;
    assert_eq!(r.status(), 201);
}

/// A hook that sleeps past its timeout: the creation is refused (503 `unavailable`, the
/// default policy) long before the hook would answer; with `on_failure = "allow"` it goes on.
/// A hook answering something that is not JSON is broken: 502 `hook_invalid`, not retryable,
/// with the reason (asking again gets the same answer; issue 23, kind 16).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_broken_pre_create_hook_follows_the_failure_policy() {
    let dir = tempfile::tempdir().unwrap();
    let hook = HookServer::start(dir.path());
    let server = start(dir.path(), &format!("[hooks.pre_create]\nurl = \"{}\"\ntimeout = \"2s\"\n", hook.url("/slow")));
    let tus = Tus::new(&server);
    let began = Instant::now();
    let r = tus.post(&[("Upload-Length", "5")]).await;
    let took = began.elapsed();
    problem(r, 503, "unavailable").await;
    // The hook sleeps 30 s; the 2 s timeout (+ a generous margin for a loaded machine) holds.
    assert!(took < Duration::from_secs(12), "refused after {took:?}, not within the 2 s timeout");
    drop(server);

    let server = start(dir.path(), &format!("[hooks.pre_create]\nurl = \"{}\"\ntimeout = \"1s\"\non_failure = \"allow\"\n", hook.url("/slow")));
    assert_eq!(Tus::new(&server).post(&[("Upload-Length", "5")]).await.status(), 201, "allow policy: created anyway");
    drop(server);

    let server = start(dir.path(), &format!("[hooks.pre_create]\nurl = \"{}\"\n", hook.url("/broken")));
    let p = problem(Tus::new(&server).post(&[("Upload-Length", "5")]).await, 502, "hook_invalid").await;
    assert_eq!(p["retryable"], false, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("not a JSON object"), "the reason: {p}");
    assert_eq!(json(Api::new(&server).get("/api/v1/files").await).await["files"].as_array().unwrap().len(), 0, "nothing was created");
}

/// A pre-finish hook (a virus scan) that refuses: the final PATCH gets the hook's status and
/// message, the upload is failed (404 after) and its bytes are gone; an accepted upload finishes
/// with the sha256 the hook was shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_finish_hook_refusal_fails_the_upload_and_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let hook = HookServer::start(dir.path());
    let server = start(dir.path(), &format!("[hooks.pre_finish]\nurl = \"{}\"\n", hook.url("/pre-finish")));
    let tus = Tus::new(&server);
    let data = pseudo_random(70_000, 9);

    let r = tus.post(&[("Upload-Length", "70000"), ("Upload-Metadata", &md(&[("filename", "virus.txt")]))]).await;
    let bad = tus.abs(header(&r, "location").unwrap());
    let r = tus.patch(&bad, 0, data[..30_000].to_vec(), &[]).await;
    assert_eq!(r.status(), 204, "a PATCH that does not finish is not asked about");
    let r = tus.patch(&bad, 30_000, data[30_000..].to_vec(), &[]).await;
    let p = problem(r, 422, "rejected").await;
    assert_eq!(p["detail"], "virus.txt failed the virus scan");
    assert_eq!(tus.head(&bad).await.status(), 404, "the failed upload is gone");

    let r = tus.post(&[("Upload-Length", "70000"), ("Upload-Metadata", &md(&[("filename", "clean.txt")]))]).await;
    let good = tus.abs(header(&r, "location").unwrap());
    assert_eq!(tus.patch(&good, 0, data.clone(), &[]).await.status(), 204);
    assert_stored_sha256(&server, &good, &sha256_hex(&data)).await;
    let log = std::fs::read_to_string(dir.path().join("hook.jsonl")).unwrap();
    let asked: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let clean = asked.iter().find(|a| a["request"]["upload"]["metadata"]["filename"] == "clean.txt").expect("the hook saw clean.txt");
    assert_eq!(clean["request"]["upload"]["sha256"], sha256_hex(&data));
    assert_eq!(clean["request"]["upload"]["size"], 70_000);
}

/// How many times the hook log shows a request to `path`.
fn hook_calls(dir: &Path, path: &str) -> usize {
    let log = std::fs::read_to_string(dir.join("hook.jsonl")).unwrap_or_default();
    log.lines().filter(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["path"] == path).count()
}

/// The tester's case (issue: a failed pre-finish hook left the upload stuck while clients
/// reported success): the hook answers 500 once, then 200. tus-js-client, with its usual retries,
/// gets 503 for the PATCH, asks HEAD — which finishes the upload, asking the hook again — and
/// reports success only once the server really has the finished file with its sha256.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tus_js_client_finishes_an_upload_whose_pre_finish_hook_failed_once() {
    let dir = tempfile::tempdir().unwrap();
    let hook = HookServer::start(dir.path());
    let server = start(dir.path(), &format!("[hooks.pre_finish]\nurl = \"{}\"\n", hook.url("/pre-finish-once")));
    let data = pseudo_random(3_000_000, 21);
    let file = dir.path().join("scan-me.bin");
    std::fs::write(&file, &data).unwrap();
    let out = run_json_client(node_script("tus_options.js", &[&server.base, file.to_str().unwrap(), r#"{"retryDelays":[0,1000,3000]}"#]), 120).await;
    let url = out["url"].as_str().unwrap().to_string();
    let id = url.rsplit('/').next().unwrap().to_string();
    // Finished on the server, not only "offset = length": complete, with its sha256.
    let view = Api::new(&server).file(&id).await;
    assert_eq!(view["complete"], true, "{view}");
    assert_eq!(view["sha256"], sha256_hex(&data), "{view}");
    assert_stored_sha256(&server, &url, &sha256_hex(&data)).await;
    assert_eq!(hook_calls(dir.path(), "/pre-finish-once"), 2, "asked once, failed; asked again by the client's HEAD");
}

/// A hook that stays down: every byte is kept and no client is told the upload is done — HEAD
/// answers 423 + Retry-After without `Upload-Offset` (tus-js-client and tuspy retry on that),
/// a download 503 + Retry-After, the JSON view `finishing` — across a `kill -9` and restart.
/// Once the hook is back the server finishes the upload by itself (nobody asks for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_pre_finish_hook_is_down_is_finished_by_the_server_once_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let down = dir.path().join("hook-down");
    std::fs::write(&down, b"down").unwrap();
    let hook = HookServer::start(dir.path());
    let mut server = start(dir.path(), &format!("[hooks.pre_finish]\nurl = \"{}\"\n", hook.url("/pre-finish-gated")));
    let data = pseudo_random(3_000_000, 22);
    let tus = Tus::new(&server);
    let url = tus.create(data.len() as u64).await;
    let id = url.rsplit('/').next().unwrap().to_string();
    let p = problem(tus.patch(&url, 0, data.clone(), &[]).await, 503, "unavailable").await;
    assert_eq!(p["partial"]["cursor"], 3_000_000, "{p}");

    for round in ["before the restart", "after a kill -9 and restart"] {
        let tus = Tus::new(&server);
        let url = tus.abs(&format!("/files/{id}"));
        let r = tus.head(&url).await;
        assert_eq!(r.status(), 423, "HEAD {round}");
        assert!(header(&r, "upload-offset").is_none(), "HEAD {round} must not show an offset clients take for done");
        assert_eq!(header(&r, "retry-after"), Some("2"), "HEAD {round}");
        let r = client().get(&url).send().await.unwrap();
        assert_eq!(header(&r, "retry-after"), Some("2"), "GET {round}");
        let p = problem(r, 503, "unavailable").await;
        assert!(p["detail"].as_str().unwrap().contains("still finishing"), "{p}");
        let view = Api::new(&server).file(&id).await;
        assert_eq!(
            (view["complete"].clone(), view["finishing"].clone(), view["offset"].clone()),
            (false.into(), true.into(), 3_000_000.into()),
            "{round}: {view}"
        );
        if round.starts_with("before") {
            server.restart();
        }
    }

    // The hook is back: the background finisher completes the upload. Watch the list (which
    // never finishes anything itself), not HEAD or the file's view.
    let asked_before = hook_calls(dir.path(), "/pre-finish-gated");
    std::fs::remove_file(&down).unwrap();
    let api = Api::new(&server);
    let deadline = Instant::now() + Duration::from_secs(60);
    let view = loop {
        let files = json(api.get("/api/v1/files").await).await;
        let f = files["files"].as_array().unwrap().iter().find(|f| f["id"] == id.as_str()).cloned().expect("the upload is listed");
        if f["complete"] == true {
            break f;
        }
        assert!(Instant::now() < deadline, "the server never finished the upload by itself: {f}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(view["sha256"], sha256_hex(&data), "{view}");
    assert!(view.get("finishing").is_none(), "{view}");
    assert!(hook_calls(dir.path(), "/pre-finish-gated") > asked_before, "the hook was asked again");
    assert_stored_sha256(&server, &format!("/files/{id}"), &sha256_hex(&data)).await;
}

/// `ferry upload` against a pre-finish hook that is down when the last byte arrives: the CLI
/// does not exit with "no sha256" — it waits (retryable) until the server has finished the
/// upload, then prints the URL and the sha256, which match the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_waits_for_an_upload_the_server_is_still_finishing() {
    let dir = tempfile::tempdir().unwrap();
    let down = dir.path().join("hook-down");
    std::fs::write(&down, b"down").unwrap();
    let hook = HookServer::start(dir.path());
    let server = start(dir.path(), &format!("[hooks.pre_finish]\nurl = \"{}\"\n", hook.url("/pre-finish-gated")));
    let data = pseudo_random(2_000_000, 23);
    let file = dir.path().join("report.bin");
    std::fs::write(&file, &data).unwrap();
    let mut cmd = std::process::Command::new(ferry_bin());
    cmd.args(["upload", file.to_str().unwrap(), "--retry-for", "2m", "-q"])
        .env("FERRY_SERVER", &server.base)
        .env("FERRY_CACHE_DIR", dir.path().join("cache"))
        .env_remove("FERRY_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("run ferry upload");
    // The hook was asked (and failed) at least twice: the CLI's last PATCH and a later retry.
    let deadline = Instant::now() + Duration::from_secs(60);
    while hook_calls(dir.path(), "/pre-finish-gated") < 2 {
        assert!(Instant::now() < deadline, "the pre-finish hook was never asked twice");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::remove_file(&down).unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "ferry upload: {stdout} {}", String::from_utf8_lossy(&out.stderr));
    let (url, sha) = stdout.trim().split_once('\t').unwrap_or_else(|| panic!("URL<TAB>SHA256: {stdout}"));
    assert_eq!(sha, sha256_hex(&data));
    assert_stored_sha256(&server, url, &sha256_hex(&data)).await;
}

/// A pre-finish hook whose answer is not JSON is broken, not away: the final PATCH gets 502
/// `hook_invalid` (not retryable) with the reason, every byte is kept (the cursor is the full
/// offset), and HEAD says the server is still finishing it (issue 23, kind 16).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_finish_hook_answering_invalidly_is_not_retryable_and_keeps_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let hook = HookServer::start(dir.path());
    let server = start(dir.path(), &format!("[hooks.pre_finish]\nurl = \"{}\"\n", hook.url("/broken")));
    let tus = Tus::new(&server);
    let url = tus.create(5).await;
    let p = problem(tus.patch(&url, 0, b"hello".to_vec(), &[]).await, 502, "hook_invalid").await;
    assert_eq!(p["retryable"], false, "{p}");
    assert_eq!(p["partial"]["cursor"], 5, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("pre-finish") && p["detail"].as_str().unwrap().contains("not a JSON object"), "{p}");
    let id = url.rsplit('/').next().unwrap().to_string();
    let view = Api::new(&server).file(&id).await;
    assert_eq!((view["offset"].clone(), view["complete"].clone()), (5.into(), false.into()), "the bytes are kept: {view}");
}
