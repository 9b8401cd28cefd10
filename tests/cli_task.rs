//! `ferry task start|get|list|cancel` against the real server, with kind `external`: output
//! JSON, idempotency keys, `--wait` over the live events stream (and its polling fallback) with
//! its exit codes, errors (detail + hint on stderr, exit codes) and bearer tokens.

mod common;
use common::*;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

/// `ferry task ARGS…` against `server` (no token, no proxy).
fn ferry_task(server: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferry"));
    c.arg("task").args(args).env("FERRY_SERVER", server).env_remove("FERRY_TOKEN");
    for v in ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "https_proxy", "HTTPS_PROXY"] {
        c.env_remove(v);
    }
    c.stdin(Stdio::null());
    c
}

fn run(server: &str, args: &[&str]) -> Output {
    ferry_task(server, args).output().expect("run ferry task")
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exit code")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// stdout as one JSON document; the command must have succeeded.
fn ok_json(o: &Output) -> Value {
    assert_eq!(code(o), 0, "stderr: {}", stderr(o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.lines().count(), 1, "one JSON line expected: {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[tokio::test]
async fn start_get_list_cancel_and_idempotency() {
    let s = Server::start(&[]);
    let base = s.base.as_str();

    // start: the task JSON, working.
    let args = r#"{"n":12345678901234567890,"a":[null,0,"",false,{"x":1.5}]}"#;
    let t = ok_json(&run(base, &["start", "external", "--args", args]));
    let id = t["id"].as_str().unwrap().to_string();
    assert_eq!(t["kind"], "external");
    assert_eq!(t["status"], "working");
    // The arguments reached the server byte for byte.
    let stored = client().get(s.url(&format!("/api/v1/tasks/{id}/args"))).send().await.unwrap().text().await.unwrap();
    assert_eq!(stored, args);

    // --args-file, and `-` for stdin.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("args.json");
    std::fs::write(&path, "[1, 2, 3]\n").unwrap();
    let t2 = ok_json(&run(base, &["start", "external", "--args-file", path.to_str().unwrap()]));
    let stored = client().get(s.url(&format!("/api/v1/tasks/{}/args", t2["id"].as_str().unwrap()))).send().await.unwrap().text().await.unwrap();
    assert_eq!(stored, "[1, 2, 3]");
    let mut child = ferry_task(base, &["start", "external", "--args-file", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(br#"{"from":"stdin"}"#).unwrap();
    }
    let t3 = ok_json(&child.wait_with_output().unwrap());
    assert_eq!(t3["status"], "working");

    // get
    let g = ok_json(&run(base, &["get", &id]));
    assert_eq!(g["id"], id.as_str());
    assert_eq!(g["status"], "working");

    // list (newest first) and --limit
    let l = ok_json(&run(base, &["list"]));
    let ids: Vec<&str> = l["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.contains(&id.as_str()));
    let l = ok_json(&run(base, &["list", "--limit", "1"]));
    assert_eq!(l["tasks"].as_array().unwrap().len(), 1);

    // Idempotency key: the same key and arguments → the same task, not a second run.
    let k1 = ok_json(&run(base, &["start", "external", "--args", r#"{"v":1}"#, "--idempotency-key", "export-2024-06"]));
    let k2 = ok_json(&run(base, &["start", "external", "--args", r#"{"v":1}"#, "--idempotency-key", "export-2024-06"]));
    assert_eq!(k1["id"], k2["id"]);
    assert_eq!(k2["idempotency_key"], "export-2024-06");
    // … with different arguments → conflict: exit 2, detail and hint on stderr, nothing on stdout.
    let o = run(base, &["start", "external", "--args", r#"{"v":2}"#, "--idempotency-key", "export-2024-06"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(o.stdout.is_empty());
    let e = stderr(&o);
    assert!(e.contains("Idempotency-Key already names task") && e.contains("conflict"), "{e}");
    assert!(e.contains("hint: Use a new Idempotency-Key"), "{e}");
    let l = ok_json(&run(base, &["list"]));
    assert_eq!(l["tasks"].as_array().unwrap().len(), 4, "one task for the key");

    // cancel: cancelled; again: unchanged.
    let c = ok_json(&run(base, &["cancel", &id]));
    assert_eq!(c["status"], "cancelled");
    let c = ok_json(&run(base, &["cancel", &id]));
    assert_eq!(c["status"], "cancelled");
    assert_eq!(ok_json(&run(base, &["get", &id]))["status"], "cancelled");
    // Cancelling a completed task leaves it completed.
    let r = client()
        .post(s.url(&format!("/api/v1/tasks/{}/complete", k1["id"].as_str().unwrap())))
        .body(r#"{"result":{"ok":true}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let c = ok_json(&run(base, &["cancel", k1["id"].as_str().unwrap()]));
    assert_eq!(c["status"], "completed");
    // The key of a completed task → the same answer.
    let k3 = ok_json(&run(base, &["start", "external", "--args", r#"{"v":1}"#, "--idempotency-key", "export-2024-06"]));
    assert_eq!(k3["id"], k1["id"]);
    assert_eq!(k3["result"], serde_json::json!({"ok": true}));
}

#[tokio::test]
async fn errors_and_exit_codes() {
    let s = Server::start(&[]);
    let base = s.base.as_str();

    // Unknown id → 404: exit 3 (not found, as for files), detail + hint.
    let o = run(base, &["get", "aaaaaaaaaaaaaaaaaaaaaaaaaa"]);
    assert_eq!(code(&o), 3);
    let e = stderr(&o);
    assert!(e.contains("no task with this id") && e.contains("hint: "), "{e}");
    assert_eq!(code(&run(base, &["cancel", "aaaaaaaaaaaaaaaaaaaaaaaaaa"])), 3);
    assert_eq!(code(&run(base, &["get", "--wait", "aaaaaaaaaaaaaaaaaaaaaaaaaa"])), 3);

    // Unknown kind → 400: exit 2, the hint lists the kinds.
    let o = run(base, &["start", "no-such-kind"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("external"), "{}", stderr(&o));

    // Usage errors: bad JSON, both --args and --args-file, missing id, --limit 0.
    let o = run(base, &["start", "external", "--args", "{not json"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("not JSON"), "{}", stderr(&o));
    assert_eq!(code(&run(base, &["start", "external", "--args", "1", "--args-file", "x"])), 2);
    assert_eq!(code(&run(base, &["get"])), 2);
    assert_eq!(code(&run(base, &["list", "--limit", "0"])), 2);
    assert_eq!(code(&run(base, &["start", "external", "--args-file", "/nonexistent/args.json"])), 2);

    // No server there → exit 5 at once (as every client command), with a hint.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let o = run(&dead, &["list"]);
    assert_eq!(code(&o), 5);
    assert!(stderr(&o).contains("cannot connect to") && stderr(&o).contains("hint: "), "{}", stderr(&o));
    // --server beats FERRY_SERVER.
    let o = ferry_task(&dead, &["--server", base, "list"]).output().unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    // The help documents the exit codes.
    let o = run(base, &["start", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(
        help.contains("Exit codes") && help.contains("8  task start --wait, task get --wait, task respond --wait: the task was cancelled"),
        "{help}"
    );
}

/// Start `--wait` in the background, let `finish` end the task over REST, return the output.
async fn wait_until(s: &Server, key: &str, finish: impl AsyncFnOnce(&str)) -> Output {
    let child = ferry_task(&s.base, &["start", "external", "--idempotency-key", key, "--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Find the task through the same key: 200 if the CLI started it, 201 if we did (the CLI
    // then joins ours, which is just as good).
    let r = client().post(s.url("/api/v1/tasks")).header("idempotency-key", key).body(r#"{"kind":"external"}"#).send().await.unwrap();
    assert!(r.status() == 200 || r.status() == 201);
    let v: Value = r.json().await.unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(300)).await;
    finish(&id).await;
    // Never hang the suite on a CLI that does not notice the end.
    let pid = child.id();
    let out = tokio::time::timeout(Duration::from_secs(60), tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())).await;
    match out {
        Ok(o) => o.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("`ferry task start --wait` did not exit after task {id} ended");
        }
    }
}

#[tokio::test]
async fn wait_exit_codes() {
    let s = Server::start(&[]);
    let post = |path: String, body: &'static str| {
        let url = s.url(&path);
        async move {
            let r = client().post(url).body(body).send().await.unwrap();
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        }
    };

    // Completed → 0, the final JSON on stdout.
    let o = wait_until(&s, "w-complete", async |id| {
        post(format!("/api/v1/tasks/{id}/progress"), r#"{"fraction":0.5,"counters":{"pages":3}}"#).await;
        post(format!("/api/v1/tasks/{id}/complete"), r#"{"result":{"rows":42}}"#).await;
    })
    .await;
    let v = ok_json(&o);
    assert_eq!(v["status"], "completed");
    assert_eq!(v["result"]["rows"], 42);

    // Failed → 7.
    let o = wait_until(&s, "w-fail", async |id| post(format!("/api/v1/tasks/{id}/fail"), r#"{"message":"upstream said no"}"#).await).await;
    assert_eq!(code(&o), 7, "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["status"], "failed");
    assert_eq!(v["error"]["message"], "upstream said no");

    // Cancelled (with the CLI) → 8.
    let base = s.base.clone();
    let o = wait_until(&s, "w-cancel", async |id| {
        let c = run(&base, &["cancel", id]);
        assert_eq!(code(&c), 0);
    })
    .await;
    assert_eq!(code(&o), 8, "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["status"], "cancelled");

    // A completed task's key returns the same task at once.
    let o = run(&s.base, &["start", "external", "--idempotency-key", "w-complete", "--wait"]);
    assert_eq!(ok_json(&o)["result"]["rows"], 42);
}

#[tokio::test]
async fn bearer_token() {
    let token = "fy_cli_test_token";
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ferry.toml");
    std::fs::write(&cfg, format!("[[tokens]]\nprincipal = \"cli\"\nsha256 = \"{}\"\n", sha256_hex(token.as_bytes()))).unwrap();
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);

    let o = run(&s.base, &["list"]);
    assert_eq!(code(&o), 6, "401: authentication, as for the file commands");
    assert!(stderr(&o).contains("bearer token") && stderr(&o).contains("hint: "), "{}", stderr(&o));

    let t = ok_json(&ferry_task(&s.base, &["start", "external"]).env("FERRY_TOKEN", token).output().unwrap());
    let id = t["id"].as_str().unwrap();
    let g = ok_json(&run(&s.base, &["--token", token, "get", id]));
    assert_eq!(g["id"], id);
    // A wrong token is refused.
    assert_eq!(code(&run(&s.base, &["--token", "fy_wrong", "get", id])), 6);
}

/// Spawn `ferry task ARGS…` with stderr read line by line on a thread.
fn spawn_task(server: &str, args: &[&str]) -> (std::process::Child, StderrLines) {
    let mut child = ferry_task(server, args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let lines = StderrLines::take(&mut child);
    (child, lines)
}

/// Wait for the child (killed after 60 s) and return its output.
async fn finish(child: std::process::Child) -> Output {
    let pid = child.id();
    match tokio::time::timeout(Duration::from_secs(60), tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())).await {
        Ok(o) => o.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("`ferry task … --wait` did not exit after the task ended");
        }
    }
}

/// Issue 12 item 4: `task get --wait` follows `GET /api/v1/events`: once it says it is
/// following the stream it reads the task only when an event names it, and it ends on the
/// task's status event (named on stderr) with the task's final JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_wait_follows_live_events() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let id = api.start("external", "{}").await["id"].as_str().unwrap().to_string();
    let other = api.start("external", "{}").await["id"].as_str().unwrap().to_string();
    let (child, rx) = spawn_task(&s.base, &["get", "--wait", &id]);
    tokio::task::block_in_place(|| rx.until("following live events"));
    // Another task's status event does not end the wait.
    let r = client().post(s.url(&format!("/api/v1/tasks/{other}/cancel"))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = client().post(s.url(&format!("/api/v1/tasks/{id}/complete"))).body(r#"{"result":{"rows":3}}"#).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let o = finish(child).await;
    let rest = tokio::task::block_in_place(|| rx.rest());
    let v = ok_json(&o);
    assert_eq!((v["id"].as_str(), v["status"].as_str(), v["result"]["rows"].as_u64()), (Some(id.as_str()), Some("completed"), Some(3)));
    assert!(rest.iter().any(|l| l.contains(&format!("task {id} is completed (event evt_"))), "{rest:?}");
    assert!(!rest.iter().any(|l| l.contains("polling")), "{rest:?}");

    // A task that is already finished: printed at once, with its exit code (cancelled: 8).
    let o = run(&s.base, &["get", "--wait", &other]);
    assert_eq!(code(&o), 8, "{}", stderr(&o));
}

/// Where the events stream is unavailable (here a proxy answers 503 for it), `--wait` says so
/// and polls the task instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_wait_polls_without_the_stream() {
    let s = Server::start(&[]);
    let proxy = proxy::HttpFaultProxy::start(&s.base).await;
    proxy.set(Some(std::sync::Arc::new(|_: &http::Method, pq: &str| pq.starts_with("/api/v1/events"))));
    let id = Api::new(&s).start("external", "{}").await["id"].as_str().unwrap().to_string();
    let (child, rx) = spawn_task(&proxy.url, &["get", "--wait", &id]);
    let seen = tokio::task::block_in_place(|| rx.until("polling task"));
    assert!(seen.iter().any(|l| l.contains("no live events (GET /api/v1/events answered HTTP 503)")), "{seen:?}");
    let r = client().post(s.url(&format!("/api/v1/tasks/{id}/fail"))).body(r#"{"message":"no"}"#).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let o = finish(child).await;
    assert_eq!(code(&o), 7, "failed: {}", stderr(&o));
    assert!(proxy.seen().iter().filter(|r| r.starts_with(&format!("GET /api/v1/tasks/{id}"))).count() >= 2, "{:?}", proxy.seen());
}

/// Issue 48 kind 6: an input request is answered with the CLI, not curl. `task get --wait`
/// names the command; `task respond` sends JSON or `--text`; a key the task is not waiting for
/// (exit 3) and an answer outside the request's schema (exit 2) change nothing; an accepted
/// answer lets the task finish, and `--wait` follows it to the end.
#[tokio::test]
async fn input_requests_are_answered_with_task_respond() {
    let dir = tempfile::tempdir().unwrap();
    let script = write_script(
        dir.path(),
        "ask.sh",
        concat!(
            "if [ -z \"$FERRY_INPUT_DEST_NAME\" ]; then\n",
            "  echo 'input dest.name {\"message\":\"Which table?\",\"schema\":{\"type\":\"string\"}}' >&2\n",
            "  exit 0\n",
            "fi\n",
            "printf 'table=%s\\n' \"$FERRY_INPUT_DEST_NAME\"\n",
        ),
    );
    let cfg = write_file(dir.path(), "ferry.toml", &format!("[commands.ask]\nprogram = \"{}\"\n", script.display()));
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let base = s.base.as_str();
    let t = ok_json(&run(base, &["start", "command", "--args", r#"{"command":"ask"}"#]));
    let id = t["id"].as_str().unwrap().to_string();

    // `get --wait` stops at nothing but says which command answers.
    let waiting = ferry_task(base, &["get", &id, "--wait"]).stderr(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let api = Api::new(&s);
    api.wait_status(&id, "input_required", 30).await;

    let o = run(base, &["respond", &id, "other.key", "--text", "x"]);
    assert_eq!(code(&o), 3, "{}", stderr(&o));
    assert!(stderr(&o).contains("not waiting for input \"other.key\"") && stderr(&o).contains("dest.name"), "{}", stderr(&o));
    let o = run(base, &["respond", &id, "dest.name", "42"]);
    assert_eq!(code(&o), 2, "an answer outside the schema: {}", stderr(&o));
    assert!(stderr(&o).contains("dest.name"), "{}", stderr(&o));
    let o = run(base, &["respond", &id, "dest.name", "orders"]);
    assert_eq!(code(&o), 2, "text that is not JSON: {}", stderr(&o));
    assert!(stderr(&o).contains("--text"), "{}", stderr(&o));
    assert_eq!(api.task(&id).await["status"], "input_required", "nothing changed");

    let a = ok_json(&run(base, &["respond", &id, "dest.name", "--text", "orders"]));
    assert_eq!(a["accepted"], true, "{a}");
    assert_eq!(a["task"]["input_requests"], serde_json::json!({}), "{a}");

    let o = tokio::task::spawn_blocking(move || waiting.wait_with_output().unwrap()).await.unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("ferry task respond {id} dest.name")), "{}", stderr(&o));
    let done: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    let file = done["result"]["file"]["id"].as_str().unwrap();
    assert_eq!(String::from_utf8_lossy(&api.download(file).await), "table=\"orders\"\n");

    // Answering a finished task: refused (409, exit 2); `--wait` after an answer follows the end.
    let o = run(base, &["respond", &id, "dest.name", "--text", "users"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let t = ok_json(&run(base, &["start", "command", "--args", r#"{"command":"ask"}"#]));
    let id = t["id"].as_str().unwrap().to_string();
    api.wait_status(&id, "input_required", 30).await;
    let o = run(base, &["respond", &id, "dest.name", r#""users""#, "--wait"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let last: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["status"], "completed", "{out}");
}
