//! The task engine over REST (`/api/v1/tasks`, `/api/v1/files`), black-box against the real
//! binary: idempotency, exact JSON, the `external` producer, cancellation, input requests
//! across a restart, principals, TTL, and the files `archive` / `compress` produce.

mod common;
use common::*;

use std::io::Read;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::{json, Value};

/// The id of a task view.
fn id(v: &Value) -> String {
    v["id"].as_str().expect("task id").to_string()
}

/// A temp dir with a `ferry.toml` holding `toml`; returns (dir, `--config` path as a string).
fn config(toml: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = write_file(dir.path(), "ferry.toml", toml);
    (dir, p.to_str().unwrap().to_string())
}

// ---------------------------------------------------------------------------------------------
// 1. Idempotency

#[tokio::test]
async fn idempotency_key_rules() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let args = r#"{"job":"export","n":1}"#;

    // Same key, same args → the same task: 201, then 200.
    let r = api.start_raw("external", args, Some("k-same"), None).await;
    assert_eq!(r.status(), 201);
    let loc = header(&r, "location").expect("Location").to_string();
    let first = json(r).await;
    assert_eq!(loc, format!("/api/v1/tasks/{}", id(&first)));
    let r = api.start_raw("external", args, Some("k-same"), None).await;
    assert_eq!(r.status(), 200, "a retry joins the running task");
    let again = json(r).await;
    assert_eq!(id(&first), id(&again));
    assert_eq!(again["idempotency_key"], "k-same");
    assert!(first.get("args").is_none(), "status payloads never carry arguments: {first}");

    // The same key with different arguments → 422 conflict (the idempotency-key draft), naming nothing new.
    let r = api.start_raw("external", r#"{"job":"export","n":2}"#, Some("k-same"), None).await;
    let p = problem(r, 422, "conflict").await;
    assert!(p["detail"].as_str().unwrap().contains(&id(&first)), "{p}");

    // The same key for another kind is another namespace.
    let r = api.start_raw("compress", r#"{"file_id":"nope","format":"zstd"}"#, Some("k-same"), None).await;
    problem(r, 404, "not_found").await; // another namespace: not a conflict (the file is unknown)

    // 16 concurrent starts with one key → exactly one task.
    let starts = (0..16).map(|_| {
        let api = api.clone();
        async move {
            let r = api.start_raw("external", r#"{"job":"race"}"#, Some("k-race"), None).await;
            let status = r.status().as_u16();
            (status, id(&json(r).await))
        }
    });
    let answers = futures::future::join_all(starts).await;
    let ids: std::collections::BTreeSet<&str> = answers.iter().map(|(_, i)| i.as_str()).collect();
    assert_eq!(ids.len(), 1, "one task for one key: {answers:?}");
    assert_eq!(answers.iter().filter(|(s, _)| *s == 201).count(), 1, "exactly one start created it: {answers:?}");
    assert_eq!(answers.iter().filter(|(s, _)| *s == 200).count(), 15, "{answers:?}");
    let list = json(api.get("/api/v1/tasks?limit=1000").await).await;
    let with_key: Vec<&Value> = list["tasks"].as_array().unwrap().iter().filter(|t| t["idempotency_key"] == "k-race").collect();
    assert_eq!(with_key.len(), 1, "the list holds exactly one task with the key: {list}");
    assert_eq!(with_key[0]["runs"], 0, "external tasks are never run by workers");

    // Failed → a new run that names the failure.
    let failed = id(&first);
    let r = api.post(&format!("/api/v1/tasks/{failed}/fail"), r#"{"message":"upstream said no"}"#).await;
    assert_eq!(r.status(), 200);
    let v = json(r).await;
    assert_eq!(v["status"], "failed");
    assert_eq!(v["error"]["code"], "task_failed");
    assert_eq!(v["error"]["message"], "upstream said no");
    assert_eq!(v["error"]["retryable"], false, "{v}");
    assert!(v["error"]["recovery_hint"].as_str().unwrap().contains("POST /api/v1/tasks"), "{v}");
    let r = api.start_raw("external", args, Some("k-same"), None).await;
    assert_eq!(r.status(), 201, "a failed task is retried as a new one");
    let retry = json(r).await;
    assert_ne!(id(&retry), failed);
    assert_eq!(retry["status"], "working");
    assert_eq!(retry["prior_failure"], failed.as_str());
    assert_eq!(api.task(&failed).await["status"], "failed", "the failed task stays failed");

    // Completed → the same answer, every time.
    let r = api.post(&format!("/api/v1/tasks/{}/complete", id(&retry)), r#"{"result":{"rows":7}}"#).await;
    assert_eq!(r.status(), 200);
    for _ in 0..2 {
        let r = api.start_raw("external", args, Some("k-same"), None).await;
        assert_eq!(r.status(), 200, "completed → the same answer");
        let v = json(r).await;
        assert_eq!(id(&v), id(&retry));
        assert_eq!(v["status"], "completed");
        assert_eq!(v["result"], json!({"rows":7}));
        assert_eq!(v["prior_failure"], failed.as_str());
    }
    // ... and different args are still a conflict.
    problem(api.start_raw("external", r#"{"job":"export","n":3}"#, Some("k-same"), None).await, 422, "conflict").await;

    // Cancelled is also retried as a new task.
    let c = api.start_raw("external", "1", Some("k-cancel"), None).await;
    let c = id(&json(c).await);
    assert_eq!(json(api.post(&format!("/api/v1/tasks/{c}/cancel"), "").await).await["status"], "cancelled");
    let r = api.start_raw("external", "1", Some("k-cancel"), None).await;
    assert_eq!(r.status(), 201);
    assert_ne!(id(&json(r).await), c);

    // Bad keys and unknown kinds.
    problem(api.start_raw("external", "1", Some(&"k".repeat(256)), None).await, 400, "invalid_argument").await;
    problem(api.start_raw("no-such-kind", "1", Some("k"), None).await, 400, "invalid_argument").await;
}

// ---------------------------------------------------------------------------------------------
// 2. Exact JSON text

/// The raw text of `field` in a JSON object body, exactly as the server wrote it.
fn raw_field(body: &str, field: &str) -> String {
    let m: std::collections::HashMap<String, Box<RawValue>> = serde_json::from_str(body).unwrap();
    m.get(field).unwrap_or_else(|| panic!("no {field} in {body}")).get().to_string()
}

#[tokio::test]
async fn args_and_results_round_trip_as_exact_json_text() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let shapes = [
        r#"{"a":null,"b":"","c":0,"d":false,"e":[[null,1,[18446744073709551615, 9007199254740993]]],"f":{"x":-0.0}}"#,
        r#"[null,"",0,false,[],{},[[[null]]],-9223372036854775808,123456789012345678901234567890,0.1000000000000000055511151231257827]"#,
        r#"{"dup":1,"dup":2,"esc":"\u00e9\n\"\\\/","é":"ü","big":1.0E+2,"neg":-0}"#,
        r#"{ "spaced" : [ 1 , 2 ] , "nested": { "deeper": [ null ] } }"#,
        "null",
        r#""""#,
        "0",
        "false",
    ];
    for args in shapes {
        let v = api.start("external", args).await;
        let tid = id(&v);
        // The arguments come back byte for byte.
        let r = api.get(&format!("/api/v1/tasks/{tid}/args")).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "content-type"), Some("application/json"));
        assert_eq!(r.text().await.unwrap(), args, "args of {tid}");

        // A result of the same shapes comes back byte for byte inside the task view.
        let r = api.post(&format!("/api/v1/tasks/{tid}/complete"), &format!("{{\"result\":{args}}}")).await;
        assert_eq!(r.status(), 200);
        let body = r.text().await.unwrap();
        assert_eq!(raw_field(&body, "result"), args, "complete answer: {body}");
        let body = api.get(&format!("/api/v1/tasks/{tid}")).await.text().await.unwrap();
        assert_eq!(raw_field(&body, "status"), "\"completed\"");
        assert_eq!(raw_field(&body, "result"), args, "GET: {body}");
        // And in the list.
        let list = api.get("/api/v1/tasks?limit=1000").await.text().await.unwrap();
        let list: std::collections::HashMap<String, Vec<std::collections::HashMap<String, Box<RawValue>>>> = serde_json::from_str(&list).unwrap();
        let t = list["tasks"].iter().find(|t| t["id"].get() == format!("\"{tid}\"")).expect("listed");
        assert_eq!(t["result"].get(), args);
    }
    // Not JSON → 400, nothing created.
    // (Counted without parsing the values: 1e400 above is valid JSON but out of f64 range.)
    let count = || async {
        let body = api.get("/api/v1/tasks?limit=1000").await.text().await.unwrap();
        let l: std::collections::HashMap<String, Vec<Box<RawValue>>> = serde_json::from_str(&body).unwrap();
        l["tasks"].len()
    };
    let before = count().await;
    let r = api.post("/api/v1/tasks", r#"{"kind":"external","args":[1,}"#).await;
    problem(r, 400, "invalid_argument").await;
    let after = count().await;
    assert_eq!(before, after);
}

// ---------------------------------------------------------------------------------------------
// 3. The external producer

#[tokio::test]
async fn external_producer_reports_progress_attaches_a_file_and_completes_once() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let t = api.start("external", r#"{"export":"orders"}"#).await;
    let tid = id(&t);
    assert_eq!(t["status"], "working");
    assert!(t["poll_after_ms"].as_u64().is_some(), "{t}");

    let r = api
        .post(&format!("/api/v1/tasks/{tid}/progress"), r#"{"fraction":0.25,"message":"exported 250 rows","counters":{"rows":250,"pages":3}}"#)
        .await;
    assert_eq!(r.status(), 200);
    let v = api.task(&tid).await;
    assert_eq!(v["progress"]["fraction"], 0.25);
    assert_eq!(v["progress"]["message"], "exported 250 rows");
    assert_eq!(v["progress"]["counters"], json!({"rows":250,"pages":3}));
    problem(api.post(&format!("/api/v1/tasks/{tid}/progress"), r#"{"fraction":1.5}"#).await, 400, "invalid_argument").await;

    // The producer uploads its file with TUS; an unfinished one cannot be attached.
    let data = pseudo_random(3 << 20, 11);
    let file = api.upload(&data, "orders.jsonl").await;
    let partial = {
        let r = api.send("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", "10")], None).await;
        header(&r, "location").unwrap().rsplit('/').next().unwrap().to_string()
    };
    let r = api.post(&format!("/api/v1/tasks/{tid}/complete"), &format!(r#"{{"result":{{"rows":1000}},"files":["{partial}"]}}"#)).await;
    problem(r, 409, "upload_incomplete").await;
    problem(api.post(&format!("/api/v1/tasks/{tid}/complete"), r#"{"files":["no-such-file"]}"#).await, 422, "not_found").await;
    assert_eq!(api.task(&tid).await["status"], "working", "a refused complete changes nothing");

    let r = api.post(&format!("/api/v1/tasks/{tid}/complete"), &format!(r#"{{"result":{{"rows":1000,"ok":true}},"files":["{file}"]}}"#)).await;
    assert_eq!(r.status(), 200);
    let v = json(r).await;
    assert_eq!(v["status"], "completed");
    assert!(v.get("poll_after_ms").is_none(), "no polling hint once terminal: {v}");
    let v = api.task(&tid).await;
    assert_eq!(v["result"]["result"], json!({"rows":1000,"ok":true}));
    let files = v["result"]["files"].as_array().unwrap();
    assert_eq!(files.len(), 1);
    let f = &files[0];
    assert_eq!(f["id"], file.as_str());
    assert_eq!(f["name"], "orders.jsonl");
    assert_eq!(f["size"], data.len() as u64);
    assert_eq!(f["sha256"], sha256_hex(&data).as_str());
    // One shape of "a file a task produced": the handle built-in kinds store.
    let keys: Vec<&str> = f.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["id", "media_type", "name", "sha256", "size"], "{f}");
    assert_eq!(api.download(&file).await, data);

    // Terminal: a second complete, a fail, and progress are conflicts; nothing changes.
    problem(api.post(&format!("/api/v1/tasks/{tid}/complete"), r#"{"result":2}"#).await, 409, "conflict").await;
    problem(api.post(&format!("/api/v1/tasks/{tid}/fail"), r#"{"message":"late"}"#).await, 409, "conflict").await;
    problem(api.post(&format!("/api/v1/tasks/{tid}/progress"), r#"{"fraction":0.5}"#).await, 409, "conflict").await;
    let after = api.task(&tid).await;
    assert_eq!(after["status"], "completed");
    assert_eq!(after["result"], v["result"]);
    assert_eq!(after["progress"], v["progress"]);

    // A cancelled external task refuses reports too.
    let c = id(&api.start("external", "{}").await);
    api.post(&format!("/api/v1/tasks/{c}/cancel"), "").await;
    problem(api.post(&format!("/api/v1/tasks/{c}/progress"), r#"{"fraction":0.5}"#).await, 409, "conflict").await;
    problem(api.post(&format!("/api/v1/tasks/{c}/complete"), r#"{"result":1}"#).await, 409, "conflict").await;
    assert_eq!(api.task(&c).await["status"], "cancelled");

    // Tasks run by ferry do not take reports from outside.
    let a = id(&api.start("archive", &format!(r#"{{"files":["{file}"],"format":"tar"}}"#)).await);
    // A state conflict (409), not a malformed request (issue 48, kind 5): every report alike.
    problem(api.post(&format!("/api/v1/tasks/{a}/complete"), r#"{"result":1}"#).await, 409, "conflict").await;
    problem(api.post(&format!("/api/v1/tasks/{a}/progress"), r#"{"fraction":0.5}"#).await, 409, "conflict").await;
    problem(api.post(&format!("/api/v1/tasks/{a}/fail"), r#"{"message":"no"}"#).await, 409, "conflict").await;
}

// ---------------------------------------------------------------------------------------------
// 4. Cancellation

#[tokio::test]
async fn cancel_archive_while_working_stays_cancelled() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let big = api.upload(&pseudo_random(160 << 20, 5), "big.bin").await;
    let args = format!(r#"{{"files":["{big}","{big}"],"format":"tar"}}"#);

    let t = api.start("archive", &args).await;
    let tid = id(&t);
    // Cancel mid-way: once it has archived some bytes.
    let total = 2 * (160u64 << 20);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = api.task(&tid).await;
        assert_eq!(v["status"], "working", "it finished before we could cancel it: {v}");
        let bytes = v["progress"]["counters"]["bytes"].as_u64().unwrap_or(0);
        if bytes > 0 {
            assert!(bytes < total, "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "no progress within 60 s: {v}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = api.post(&format!("/api/v1/tasks/{tid}/cancel"), "").await;
    assert_eq!(r.status(), 200);
    let v = json(r).await;
    assert_eq!(v["status"], "cancelled", "cancelled is terminal at once: {v}");
    let cancelled_progress = api.task(&tid).await["progress"].clone();
    assert!(cancelled_progress["counters"]["bytes"].as_u64().unwrap() < total, "cancelled mid-way: {cancelled_progress}");

    // The same archive, uncancelled, started after: once it is done, the cancelled one would
    // have been done too.
    let reference = id(&api.start("archive", &args).await);
    let done = api.wait_status(&reference, "completed", 120).await;
    assert!(done["result"]["file"]["sha256"].is_string());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let v = api.task(&tid).await;
    assert_eq!(v["status"], "cancelled", "a late result is discarded: {v}");
    assert!(v.get("result").is_none(), "{v}");
    assert_eq!(v["progress"]["counters"]["bytes"], cancelled_progress["counters"]["bytes"], "no progress after cancel: {v}");
    // Cancelling again changes nothing.
    assert_eq!(json(api.post(&format!("/api/v1/tasks/{tid}/cancel"), "").await).await["status"], "cancelled");

    // Cancel after completion → still completed, result intact.
    let r = api.post(&format!("/api/v1/tasks/{reference}/cancel"), "").await;
    assert_eq!(r.status(), 200);
    let v = json(r).await;
    assert_eq!(v["status"], "completed");
    assert_eq!(v["result"], done["result"]);
    assert_eq!(api.task(&reference).await["status"], "completed");

    // Unknown ids.
    problem(api.post("/api/v1/tasks/no-such-task/cancel", "").await, 404, "not_found").await;
}

#[tokio::test]
async fn cancel_command_kills_the_program_and_stays_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("finished");
    let script = write_script(
        dir.path(),
        "slow.sh",
        &format!(
            "i=0\nwhile [ $i -lt 40 ]; do\n  i=$((i+1))\n  echo \"row $i\"\n  echo \"progress 0.$((i \
             * 2)) row $i\" >&2\n  echo \"count rows $i\" >&2\n  sleep 0.1\ndone\ntouch '{}'\n",
            marker.display()
        ),
    );
    let cfg = write_file(dir.path(), "ferry.toml", &format!("[commands.slow]\nprogram = \"{}\"\n", script.display()));
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let api = Api::new(&s);
    let started = Instant::now();
    let tid = id(&api.start("command", r#"{"command":"slow"}"#).await);
    api.wait_for(&tid, 30, "rows > 2", |v| v["progress"]["counters"]["rows"].as_u64().unwrap_or(0) > 2).await;
    let v = json(api.post(&format!("/api/v1/tasks/{tid}/cancel"), "").await).await;
    assert_eq!(v["status"], "cancelled");
    // Wait past when the program would have finished (40 × 0.1 s after it started).
    while started.elapsed() < Duration::from_secs(6) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(api.task(&tid).await["status"], "cancelled");
    }
    assert!(!marker.exists(), "cancellation kills the program");
    let v = api.task(&tid).await;
    assert_eq!(v["status"], "cancelled");
    assert!(v.get("result").is_none(), "{v}");
}

/// Whether process `pid` is still running (a zombie, reaped by nobody yet, is not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

/// Issue 48 kind 8: a `command` task's program gets the few variables every program needs and
/// those its `[commands.NAME]` names in `env` — never the rest of the server's environment
/// (its S3 keys, a catalog URL with a password, any token) — and cancelling it ends its whole
/// process group: a `sleep` it started in the background does not outlive the cancel.
#[tokio::test]
async fn command_programs_get_no_server_secrets_and_nothing_they_start_outlives_a_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("background.pid");
    let env = write_script(dir.path(), "env.sh", "env\n");
    let bg = write_script(dir.path(), "bg.sh", &format!("sleep 300 &\necho $! > '{}'\necho 'progress 0.5 started' >&2\nwait\n", pidfile.display()));
    let cfg = write_file(
        dir.path(),
        "ferry.toml",
        &format!("[commands.env]\nprogram = \"{}\"\nenv = [\"FERRY_TEST_PASSED\"]\n[commands.bg]\nprogram = \"{}\"\n", env.display(), bg.display()),
    );
    let secrets = ["SEKRIT_TOKEN=hunter2", "AWS_SECRET_ACCESS_KEY_FOR_TEST=hunter3", "FERRY_TEST_PASSED=yes", "LC_TIME=C"];
    let wrapper: Vec<&str> = std::iter::once("env").chain(secrets).collect();
    let s = Server::start_under(&wrapper, &dir.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    let api = Api::new(&s);

    let tid = id(&api.start("command", r#"{"command":"env"}"#).await);
    let done = api.wait_status(&tid, "completed", 30).await;
    let file = done["result"]["file"]["id"].as_str().unwrap_or_else(|| panic!("{done}")).to_string();
    let text = String::from_utf8(api.download(&file).await).unwrap();
    let names: Vec<&str> = text.lines().filter_map(|l| l.split_once('=').map(|(k, _)| k)).collect();
    for want in ["PATH", "FERRY_TEST_PASSED", "LC_TIME", "FERRY_TASK_ID", "FERRY_PARAMS"] {
        assert!(names.contains(&want), "{want} reaches the program: {text}");
    }
    for name in &names {
        let ferry_own = ["FERRY_TASK_ID", "FERRY_PARAMS", "FERRY_CHECKPOINT", "FERRY_OFFSET", "FERRY_TEST_PASSED"].contains(name);
        assert!(
            !name.starts_with("AWS_") && *name != "SEKRIT_TOKEN" && (ferry_own || !name.starts_with("FERRY_")),
            "the server's {name} reached the program: {text}"
        );
    }

    let tid = id(&api.start("command", r#"{"command":"bg"}"#).await);
    api.wait_for(&tid, 30, "the program started its background sleep", |v| v["progress"]["fraction"].as_f64().is_some()).await;
    let pid: u32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert!(alive(pid), "the background sleep runs");
    assert_eq!(json(api.post(&format!("/api/v1/tasks/{tid}/cancel"), "").await).await["status"], "cancelled");
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!alive(pid), "a process the program started (pid {pid}) outlived the cancel");
}

/// Wait until none of `pids` runs (at most 10 s); the ones still running.
async fn still_running(pids: &[u32]) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pids.iter().copied().filter(|p| alive(*p)).collect()
}

/// Issue 48: a `command` task's program, and what it started, do not outlive a server killed
/// with `kill -9`. The program's process group is recorded in the task's checkpoint when it
/// starts; after a restart, a cancel of the task (no run holds it) ends that group, and so does
/// the task's next run before it starts the program again — which then runs alone. (The
/// restarted server resumes its data dir's tasks at once, so the first cancel may meet the
/// next run instead: the group ends either way.)
#[tokio::test]
async fn a_command_killed_with_its_server_is_ended_by_the_cancel_or_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    // Each run appends its own pid and its background sleep's to its task's file, then waits
    // (writing nothing, so a closed stdout does not end it).
    let bg = write_script(
        dir.path(),
        "bg.sh",
        &format!("sleep 300 &\necho \"$$ $!\" >> '{}/pids-'\"$FERRY_TASK_ID\"\necho 'progress 0.5 started' >&2\nwait\n", dir.path().display()),
    );
    let cfg = write_file(dir.path(), "ferry.toml", &format!("[commands.bg]\nprogram = \"{}\"\n", bg.display()));
    let args = ["--config", cfg.to_str().unwrap(), "--task-lease", "2s"];
    let runs = |task: &str| -> Vec<Vec<u32>> {
        std::fs::read_to_string(dir.path().join(format!("pids-{task}")))
            .unwrap_or_default()
            .lines()
            .map(|l| l.split_whitespace().map(|p| p.parse().unwrap()).collect())
            .collect()
    };
    let mut s = Server::start_in(&dir.path().join("data"), &args);

    // Killed, restarted, cancelled.
    let api = Api::new(&s);
    let tid = id(&api.start("command", r#"{"command":"bg"}"#).await);
    api.wait_for(&tid, 30, "the program started its background sleep", |v| v["progress"]["fraction"].as_f64().is_some()).await;
    let first = runs(&tid).pop().unwrap();
    s.kill9();
    assert!(first.iter().all(|p| alive(*p)), "kill -9 of the server leaves the program's group running: {first:?}");
    // The restarted server may run the task again at once (it resumes what its data dir's
    // previous process held) or take the cancel first: either ends the group.
    s.restart_with(&args);
    let api = Api::new(&s);
    assert_eq!(json(api.post(&format!("/api/v1/tasks/{tid}/cancel"), "").await).await["status"], "cancelled");
    assert_eq!(still_running(&first).await, Vec::<u32>::new(), "the cancel after the restart ended the group left running");

    // Killed, restarted, run again once its lease ran out.
    let tid = id(&api.start("command", r#"{"command":"bg"}"#).await);
    api.wait_for(&tid, 30, "the program started its background sleep", |v| v["progress"]["fraction"].as_f64().is_some()).await;
    let old = runs(&tid).pop().unwrap();
    s.kill9();
    assert!(old.iter().all(|p| alive(*p)), "{old:?}");
    s.restart_with(&args);
    let api = Api::new(&s);
    let deadline = Instant::now() + Duration::from_secs(60);
    while runs(&tid).len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let new = runs(&tid).pop().unwrap();
    assert_ne!(new, old, "the task ran again after the restart");
    assert_eq!(still_running(&old).await, Vec::<u32>::new(), "the run before the restart ended before the next one started");
    assert!(new.iter().all(|p| alive(*p)), "the new run is not ended by its own record: {new:?}");
    assert_eq!(json(api.post(&format!("/api/v1/tasks/{tid}/cancel"), "").await).await["status"], "cancelled");
    assert_eq!(still_running(&new).await, Vec::<u32>::new());
}

/// The ids the server's blob store holds now.
async fn stored_ids(s: &Server) -> std::collections::BTreeSet<String> {
    s.blob_store().inventory().await.expect("inventory").blobs.into_iter().collect()
}

/// Issue 48 kind 11: a task that fails after writing most of its output, or is cancelled while
/// it waits (for input, here) with its output half written, leaves no unfinished upload behind
/// — not one "97.5 % uploaded" until it expires a week later.
#[tokio::test]
async fn a_failed_or_cancelled_task_leaves_no_output_behind() {
    let dir = tempfile::tempdir().unwrap();
    let write = "head -c 3000000 /dev/zero\necho 'checkpoint 3000000 half' >&2\n";
    let fail = write_script(dir.path(), "fail.sh", &format!("{write}sleep 0.5\nexit 3\n"));
    let ask = write_script(
        dir.path(),
        "ask.sh",
        &format!("[ -n \"$FERRY_INPUT_GO\" ] && exit 0\n{write}sleep 0.5\necho 'input go {{\"message\":\"go on?\"}}' >&2\nexit 0\n"),
    );
    let cfg = write_file(
        dir.path(),
        "ferry.toml",
        &format!("[commands.fail]\nprogram = \"{}\"\n[commands.ask]\nprogram = \"{}\"\n", fail.display(), ask.display()),
    );
    let s = Server::start_in(&dir.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    let api = Api::new(&s);
    let before = stored_ids(&s).await;
    let left = |now: std::collections::BTreeSet<String>| now.difference(&before).cloned().collect::<Vec<_>>();

    let tid = id(&api.start("command", r#"{"command":"fail"}"#).await);
    api.wait_status(&tid, "failed", 30).await;
    assert_eq!(left(stored_ids(&s).await), Vec::<String>::new(), "a failed task's output is removed");

    let tid = id(&api.start("command", r#"{"command":"ask"}"#).await);
    api.wait_status(&tid, "input_required", 30).await;
    assert_eq!(left(stored_ids(&s).await).len(), 1, "the half-written output waits with its task");
    assert_eq!(json(api.post(&format!("/api/v1/tasks/{tid}/cancel"), "").await).await["status"], "cancelled");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !left(stored_ids(&s).await).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left(stored_ids(&s).await), Vec::<String>::new(), "a task cancelled while it waited for input keeps no output");
}

// ---------------------------------------------------------------------------------------------
// 5. input_required across a restart

#[tokio::test]
async fn input_required_survives_a_restart_and_completes_when_answered() {
    let dir = tempfile::tempdir().unwrap();
    let script = write_script(
        dir.path(),
        "ask.sh",
        concat!(
            "if [ -z \"$FERRY_INPUT_DEST_NAME\" ]; then\n",
            "  echo 'input dest.name {\"message\":\"Which table?\",\"schema\":{\"type\":\"string\"}}' >&2\n",
            "  exit 0\n",
            "fi\n",
            "printf 'params=%s\\n' \"$FERRY_PARAMS\"\n",
            "printf 'table=%s\\n' \"$FERRY_INPUT_DEST_NAME\"\n",
        ),
    );
    let cfg = write_file(
        dir.path(),
        "ferry.toml",
        &format!("[commands.ask]\nprogram = \"{}\"\noutput_name = \"answer.txt\"\nmedia_type = \"text/plain\"\n", script.display()),
    );
    let mut s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let api = Api::new(&s);
    let tid = id(&api.start("command", r#"{"command":"ask","params":{"n":1}}"#).await);
    let v = api.wait_status(&tid, "input_required", 30).await;
    assert_eq!(v["input_requests"], json!({"dest.name": {"message":"Which table?","schema":{"type":"string"}}}), "{v}");
    assert!(v["poll_after_ms"].is_u64());

    s.restart();
    let api = Api::new(&s);
    let v = api.task(&tid).await;
    assert_eq!(v["status"], "input_required", "still waiting after a restart: {v}");
    assert_eq!(v["input_requests"]["dest.name"]["message"], "Which table?");

    // A key that is not outstanding is ignored.
    let r = api.post(&format!("/api/v1/tasks/{tid}/input"), r#"{"key":"other","response":1}"#).await;
    assert_eq!(r.status(), 200);
    let a = json(r).await;
    assert_eq!(a["accepted"], false, "{a}");
    assert_eq!(a["task"]["status"], "input_required");

    // An answer outside the request's schema (a string): 400 naming the place, nothing stored
    // (issue 23, kind 3).
    let r = api.post(&format!("/api/v1/tasks/{tid}/input"), r#"{"key":"dest.name","response":42}"#).await;
    let p = problem(r, 400, "invalid_argument").await;
    assert!(p["detail"].as_str().unwrap().contains("response") && p["detail"].as_str().unwrap().contains("dest.name"), "{p}");
    let v = api.task(&tid).await;
    assert_eq!(v["status"], "input_required", "{v}");
    assert!(v["input_requests"]["dest.name"].is_object(), "still outstanding: {v}");

    let r = api.post(&format!("/api/v1/tasks/{tid}/input"), r#"{"key":"dest.name","response":"orders"}"#).await;
    assert_eq!(r.status(), 200);
    let a = json(r).await;
    assert_eq!(a["accepted"], true, "{a}");
    assert_eq!(a["task"]["status"], "working");
    assert_eq!(a["task"]["input_requests"], json!({}), "answered requests are no longer outstanding");

    let v = api.wait_status(&tid, "completed", 30).await;
    let f = &v["result"]["file"];
    let body = api.download(f["id"].as_str().unwrap()).await;
    assert_eq!(String::from_utf8_lossy(&body), "params={\"n\":1}\ntable=\"orders\"\n");
    assert_eq!(f["name"], "answer.txt");
    assert_eq!(f["media_type"], "text/plain");
    assert_eq!(f["sha256"], sha256_hex(&body).as_str());
    assert_eq!(v["result"]["exit_code"], 0);

    // Answering after the end: 409, and the task is unchanged.
    let r = api.post(&format!("/api/v1/tasks/{tid}/input"), r#"{"key":"dest.name","response":"users"}"#).await;
    problem(r, 409, "conflict").await;
    assert_eq!(api.task(&tid).await["status"], "completed");
}

// ---------------------------------------------------------------------------------------------
// 6. Principals

fn token_config(tokens: &[(&str, &str)]) -> String {
    tokens.iter().map(|(p, t)| format!("[[tokens]]\nprincipal = \"{p}\"\nsha256 = \"{}\"\n", sha256_hex(t.as_bytes()))).collect()
}

#[tokio::test]
async fn another_principals_tasks_and_files_do_not_exist() {
    let (alice_t, bob_t) = ("fy_alice_secret_token", "fy_bob_secret_token");
    let (_dir, cfg) = config(&token_config(&[("alice", alice_t), ("bob", bob_t)]));
    let s = Server::start(&["--config", &cfg]);
    let alice = Api::with_token(&s, alice_t);
    let bob = Api::with_token(&s, bob_t);
    let anon = Api::new(&s);
    let wrong = Api::with_token(&s, "fy_not_a_token");

    let data = pseudo_random(100_000, 3);
    let file = alice.upload(&data, "alice.bin").await;
    let unfinished = {
        let r = alice.send("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", "10")], None).await;
        assert_eq!(r.status(), 201);
        header(&r, "location").unwrap().rsplit('/').next().unwrap().to_string()
    };
    let r = alice.start_raw("external", r#"{"secret":"alice's"}"#, Some("shared-key"), None).await;
    assert_eq!(r.status(), 201);
    let task = id(&json(r).await);

    // Every task route as bob → 404, as if the task did not exist.
    let routes: Vec<(&str, String, &str)> = vec![
        ("GET", format!("/api/v1/tasks/{task}"), ""),
        ("GET", format!("/api/v1/tasks/{task}/args"), ""),
        ("POST", format!("/api/v1/tasks/{task}/input"), r#"{"key":"k","response":1}"#),
        ("POST", format!("/api/v1/tasks/{task}/cancel"), ""),
        ("POST", format!("/api/v1/tasks/{task}/progress"), r#"{"fraction":0.5,"message":"bob was here"}"#),
        ("POST", format!("/api/v1/tasks/{task}/complete"), r#"{"result":"bob's"}"#),
        ("POST", format!("/api/v1/tasks/{task}/fail"), r#"{"message":"bob's"}"#),
        ("GET", format!("/api/v1/files/{file}"), ""),
        ("GET", format!("/files/{file}"), ""),
        ("GET", format!("/api/v1/files/{unfinished}"), ""),
    ];
    for (m, path, body) in &routes {
        let r = bob.send(m, path, &[("content-type", "application/json"), ("Tus-Resumable", "1.0.0")], Some(body.as_bytes().to_vec())).await;
        problem(r, 404, "not_found").await;
        // An id that really does not exist answers the same.
        let r = bob
            .send(
                m,
                &path.replace(&task, "nonexistent").replace(&file, "nonexistent").replace(&unfinished, "nonexistent"),
                &[("content-type", "application/json"), ("Tus-Resumable", "1.0.0")],
                Some(body.as_bytes().to_vec()),
            )
            .await;
        problem(r, 404, "not_found").await;
    }
    // TUS routes on alice's files as bob.
    for id in [&file, &unfinished] {
        let r = bob.send("HEAD", &format!("/files/{id}"), &[("Tus-Resumable", "1.0.0")], None).await;
        assert_eq!(r.status(), 404, "HEAD {id}");
        let r = bob
            .send(
                "PATCH",
                &format!("/files/{id}"),
                &[("Tus-Resumable", "1.0.0"), ("Content-Type", OCTET), ("Upload-Offset", "0")],
                Some(b"bob".to_vec()),
            )
            .await;
        problem(r, 404, "not_found").await;
        let r = bob.send("DELETE", &format!("/files/{id}"), &[("Tus-Resumable", "1.0.0")], None).await;
        problem(r, 404, "not_found").await;
        let r = bob.send("GET", &format!("/files/{id}"), &[("Range", "bytes=0-9")], None).await;
        problem(r, 404, "not_found").await;
    }
    // Bob cannot attach alice's file to his own task, nor archive or compress it.
    let own = id(&bob.start("external", "{}").await);
    problem(bob.post(&format!("/api/v1/tasks/{own}/complete"), &format!(r#"{{"files":["{file}"]}}"#)).await, 422, "not_found").await;
    assert_eq!(bob.task(&own).await["status"], "working");
    // Refused at the start as for an id nobody has: nothing of alice's file shows.
    let p = problem(bob.start_raw("archive", &format!(r#"{{"file_ids":["{file}"],"format":"zip"}}"#), None, None).await, 404, "not_found").await;
    assert!(!p.to_string().contains("alice"), "{p}");
    problem(bob.start_raw("compress", &format!(r#"{{"file_id":"{file}","format":"gzip"}}"#), None, None).await, 404, "not_found").await;
    // Bob's idempotency key namespace is his own.
    let r = bob.start_raw("external", r#"{"secret":"alice's"}"#, Some("shared-key"), None).await;
    assert_eq!(r.status(), 201);
    assert_ne!(id(&json(r).await), task);

    // Lists: each sees only their own.
    let bl = json(bob.get("/api/v1/tasks?limit=1000").await).await;
    let bob_ids: Vec<&str> = bl["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert!(!bob_ids.contains(&task.as_str()), "{bl}");
    assert_eq!(bob_ids.len(), 2, "his external task and the keyed one; the refused archive and compress created none: {bl}");
    let bf = json(bob.get("/api/v1/files?limit=1000").await).await;
    let bob_files: Vec<&str> = bf["files"].as_array().unwrap().iter().map(|f| f["id"].as_str().unwrap()).collect();
    assert!(!bob_files.contains(&file.as_str()) && !bob_files.contains(&unfinished.as_str()), "{bf}");
    let al = json(alice.get("/api/v1/tasks?limit=1000").await).await;
    let alice_ids: Vec<&str> = al["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(alice_ids, vec![task.as_str()], "{al}");
    let af = json(alice.get("/api/v1/files?limit=1000").await).await;
    let alice_files: std::collections::BTreeSet<&str> = af["files"].as_array().unwrap().iter().map(|f| f["id"].as_str().unwrap()).collect();
    assert_eq!(alice_files, [file.as_str(), unfinished.as_str()].into_iter().collect(), "{af}");

    // Nothing bob did changed alice's task or files.
    let v = alice.task(&task).await;
    assert_eq!(v["status"], "working");
    assert!(v["progress"].get("message").is_none_or(|m| m.is_null()), "{v}");
    assert_eq!(alice.get(&format!("/api/v1/tasks/{task}/args")).await.text().await.unwrap(), r#"{"secret":"alice's"}"#);
    assert_eq!(alice.download(&file).await, data);
    assert_eq!(alice.file(&unfinished).await["offset"], 0);

    // No token, or an unknown one → 401 unauthorized, on every kind of route.
    let no_auth: Vec<(&str, String)> = vec![
        ("GET", "/api/v1/tasks".into()),
        ("POST", "/api/v1/tasks".into()),
        ("GET", format!("/api/v1/tasks/{task}")),
        ("GET", format!("/api/v1/tasks/{task}/args")),
        ("POST", format!("/api/v1/tasks/{task}/cancel")),
        ("POST", format!("/api/v1/tasks/{task}/complete")),
        ("GET", "/api/v1/files".into()),
        ("GET", format!("/api/v1/files/{file}")),
        ("GET", format!("/files/{file}")),
        ("POST", "/files/".into()),
        ("PATCH", format!("/files/{unfinished}")),
        ("DELETE", format!("/files/{file}")),
    ];
    for (m, path) in &no_auth {
        for who in [&anon, &wrong] {
            let r = who
                .send(
                    m,
                    path,
                    &[("content-type", "application/json"), ("Tus-Resumable", "1.0.0"), ("Upload-Length", "1")],
                    Some(br#"{"kind":"external","args":1}"#.to_vec()),
                )
                .await;
            assert_eq!(header(&r, "www-authenticate"), Some("Bearer"), "{m} {path}");
            problem(r, 401, "unauthorized").await;
        }
    }
    let r = anon.send("HEAD", &format!("/files/{file}"), &[("Tus-Resumable", "1.0.0")], None).await;
    assert_eq!(r.status(), 401);
    // ... and still nothing changed.
    assert_eq!(alice.task(&task).await["status"], "working");
    assert_eq!(alice.download(&file).await, data);
    assert_eq!(json(alice.get("/api/v1/tasks?limit=1000").await).await["tasks"].as_array().unwrap().len(), 1);
}

// ---------------------------------------------------------------------------------------------
// 7. TTL

#[tokio::test]
async fn terminal_tasks_are_swept_after_their_ttl() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let r = api.start_raw("external", r#"{"short":true}"#, Some("ttl-key"), Some(500)).await;
    assert_eq!(r.status(), 201);
    let short = json(r).await;
    assert_eq!(short["ttl_ms"], 500);
    let short = id(&short);
    let long = api.start("external", "{}").await;
    assert_eq!(long["ttl_ms"], 24 * 3600 * 1000, "default ttl is 24 h");
    let long = id(&long);
    let running = id(&json(api.start_raw("external", "{}", None, Some(500)).await).await);
    for t in [&short, &long] {
        assert_eq!(api.post(&format!("/api/v1/tasks/{t}/complete"), r#"{"result":1}"#).await.status(), 200);
    }
    problem(api.start_raw("external", "{}", None, Some(0)).await, 400, "invalid_argument").await;

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = api.get(&format!("/api/v1/tasks/{short}")).await;
        if r.status() == 404 {
            problem(r, 404, "not_found").await;
            break;
        }
        assert_eq!(r.status(), 200);
        assert!(Instant::now() < deadline, "task with ttl_ms 500 was never swept");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    problem(api.get(&format!("/api/v1/tasks/{short}/args")).await, 404, "not_found").await;
    problem(api.post(&format!("/api/v1/tasks/{short}/cancel"), "").await, 404, "not_found").await;
    let list = json(api.get("/api/v1/tasks").await).await;
    assert!(!list.to_string().contains(&short), "{list}");
    // The key is free again: a new task, not a retry of anything.
    let r = api.start_raw("external", r#"{"short":true}"#, Some("ttl-key"), Some(500)).await;
    assert_eq!(r.status(), 201);
    let v = json(r).await;
    assert_ne!(id(&v), short);
    assert!(v.get("prior_failure").is_none(), "{v}");
    // Non-terminal and long-lived tasks stay.
    assert_eq!(api.task(&long).await["status"], "completed");
    assert_eq!(api.task(&running).await["status"], "working", "ttl counts only once terminal");
}

// ---------------------------------------------------------------------------------------------
// 8. Files produced by jobs

async fn wait_result_file(api: &Api, tid: &str) -> (Value, Vec<u8>) {
    let v = api.wait_status(tid, "completed", 120).await;
    let f = v["result"]["file"].clone();
    let fid = f["id"].as_str().expect("result file id");
    let bytes = api.download(fid).await;
    assert_eq!(f["size"], bytes.len() as u64, "{f}");
    assert_eq!(f["sha256"], sha256_hex(&bytes).as_str(), "result sha256 = sha256 of the download");
    let info = api.file(fid).await;
    assert_eq!(info["complete"], true);
    assert_eq!(info["sha256"], f["sha256"]);
    assert_eq!(info["size"], f["size"]);
    // Ranged download of the produced file.
    if bytes.len() > 100 {
        let r = api.send("GET", &format!("/files/{fid}"), &[("Range", "bytes=10-99")], None).await;
        assert_eq!(r.status(), 206);
        assert_eq!(&r.bytes().await.unwrap()[..], &bytes[10..100]);
    }
    (v, bytes)
}

#[tokio::test]
async fn archive_tar_and_zip_hold_the_uploaded_files() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let a = pseudo_random(1_000_003, 21);
    let b = b"hello, archive\n".repeat(1000);
    let empty: Vec<u8> = Vec::new();
    let ia = api.upload(&a, "data/a.bin").await;
    let ib = api.upload(&b, "b.txt").await;
    let ie = api.upload(&empty, "empty").await;
    let expected: Vec<(&str, &[u8])> = vec![("data/a.bin", &a), ("b.txt", &b), ("empty", &empty)];

    // tar
    let t = id(&api.start("archive", &format!(r#"{{"files":["{ia}","{ib}","{ie}"],"format":"tar","name":"both.tar"}}"#)).await);
    let (v, bytes) = wait_result_file(&api, &t).await;
    assert_eq!(v["result"]["members"], 3);
    assert_eq!(v["result"]["file"]["name"], "both.tar");
    assert_eq!(v["result"]["file"]["media_type"], "application/x-tar");
    assert_eq!(v["progress"]["counters"]["bytes"], (a.len() + b.len()) as u64, "{v}");
    let mut ar = tar::Archive::new(&bytes[..]);
    let mut got = Vec::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        let mut buf = Vec::new();
        e.read_to_end(&mut buf).unwrap();
        got.push((name, buf));
    }
    assert_eq!(got.len(), 3);
    for ((name, data), (en, ed)) in got.iter().zip(&expected) {
        assert_eq!(name, en);
        assert_eq!(&data[..], *ed, "tar member {name}");
    }

    // zip
    let z = id(&api.start("archive", &format!(r#"{{"files":["{ia}","{ib}","{ie}"],"format":"zip"}}"#)).await);
    let (v, bytes) = wait_result_file(&api, &z).await;
    assert_eq!(v["result"]["file"]["name"], "archive.zip");
    assert_eq!(v["result"]["file"]["media_type"], "application/zip");
    let mut zr = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    assert_eq!(zr.len(), 3);
    for (i, (en, ed)) in expected.iter().enumerate() {
        let mut f = zr.by_index(i).unwrap();
        assert_eq!(f.name().unwrap(), *en);
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).unwrap(); // checks the crc32 too
        assert_eq!(&buf[..], *ed, "zip member {en}");
    }

    // The same file twice: names are made unique.
    let d = id(&api.start("archive", &format!(r#"{{"files":["{ib}","{ib}"],"format":"zip"}}"#)).await);
    let (_, bytes) = wait_result_file(&api, &d).await;
    let zr = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    let names: Vec<String> = zr.file_names().map(|n| n.unwrap().into_owned()).collect();
    assert_eq!(names.len(), 2);
    assert_ne!(names[0], names[1]);

    // Archives are deterministic: the same members give the same bytes.
    let t2 = id(&api.start("archive", &format!(r#"{{"files":["{ia}","{ib}","{ie}"],"format":"tar","name":"both.tar"}}"#)).await);
    let (v2, _) = wait_result_file(&api, &t2).await;
    assert_eq!(v2["result"]["file"]["sha256"], api.task(&t).await["result"]["file"]["sha256"]);

    // Bad arguments and missing files are refused before a task exists.
    problem(api.start_raw("archive", r#"{"files":[],"format":"tar"}"#, None, None).await, 400, "invalid_argument").await;
    problem(api.start_raw("archive", &format!(r#"{{"files":["{ia}"],"format":"rar"}}"#), None, None).await, 400, "invalid_argument").await;
    let p = problem(api.start_raw("archive", r#"{"file_ids":["missing"],"format":"tar"}"#, None, None).await, 404, "not_found").await;
    assert!(p["detail"].as_str().unwrap().contains("missing"), "{p}");
}

#[tokio::test]
async fn compress_zstd_and_gzip_decompress_to_the_input() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    // Compressible but not trivial: random words.
    let words = pseudo_random(3 << 20, 8);
    let input: Vec<u8> = words.iter().map(|b| b"abcdefgh \n"[(*b % 10) as usize]).collect();
    let fid = api.upload(&input, "words.txt").await;

    let z = id(&api.start("compress", &format!(r#"{{"file":"{fid}","format":"zstd"}}"#)).await);
    let (v, bytes) = wait_result_file(&api, &z).await;
    assert_eq!(v["result"]["input_bytes"], input.len() as u64);
    assert_eq!(v["result"]["file"]["media_type"], "application/zstd");
    assert!(bytes.len() < input.len());
    assert_eq!(zstd::decode_all(&bytes[..]).unwrap(), input);

    let g = id(&api.start("compress", &format!(r#"{{"file":"{fid}","format":"gzip","level":9}}"#)).await);
    let (v, bytes) = wait_result_file(&api, &g).await;
    assert_eq!(v["result"]["file"]["media_type"], "application/gzip");
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(&bytes[..]).read_to_end(&mut out).unwrap();
    assert_eq!(out, input);

    // An empty input still gives a valid stream.
    let e = api.upload(&[], "empty").await;
    let t = id(&api.start("compress", &format!(r#"{{"file":"{e}","format":"zstd"}}"#)).await);
    let (_, bytes) = wait_result_file(&api, &t).await;
    assert_eq!(zstd::decode_all(&bytes[..]).unwrap(), Vec::<u8>::new());

    problem(api.start_raw("compress", &format!(r#"{{"file":"{fid}","format":"gzip","level":42}}"#), None, None).await, 400, "invalid_argument").await;
}

// ---------------------------------------------------------------------------------------------
// Progress reported last before a job completes

/// Progress reports are throttled (one write per 250 ms); the engine flushes the last one when
/// the job returns, so the final counters are never lost.
#[tokio::test]
async fn final_progress_is_kept_when_a_job_completes() {
    let dir = tempfile::tempdir().unwrap();
    let script =
        write_script(dir.path(), "quick.sh", "echo 'count rows 1' >&2\necho 'count rows 2' >&2\necho 'progress 1 all done' >&2\necho done\n");
    let cfg = write_file(dir.path(), "ferry.toml", &format!("[commands.quick]\nprogram = \"{}\"\n", script.display()));
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let api = Api::new(&s);
    let tid = id(&api.start("command", r#"{"command":"quick"}"#).await);
    let v = api.wait_status(&tid, "completed", 30).await;
    let p = &v["progress"];
    assert_eq!((&p["fraction"], &p["message"], &p["counters"]["rows"]), (&json!(1.0), &json!("all done"), &json!(2)), "{v}");
}

#[tokio::test]
async fn oversized_bodies_and_bad_limits_get_problems() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let big = format!(r#"{{"kind":"external","args":{{"blob":"{}"}}}}"#, "a".repeat(2 << 20));
    problem(api.post("/api/v1/tasks", &big).await, 413, "size_exceeded").await;
    for q in ["limit=-1", "limit=abc", "limit=0", "limit=5000"] {
        let r = reqwest::Client::new().get(s.url(&format!("/api/v1/tasks?{q}"))).send().await.unwrap();
        problem(r, 400, "invalid_argument").await;
    }
    let tid = id(&api.start("external", "{}").await);
    let answer = format!(r#"{{"key":"k","response":"{}"}}"#, "a".repeat(100_000));
    problem(api.post(&format!("/api/v1/tasks/{tid}/input"), &answer).await, 413, "size_exceeded").await;
    // A counter past 64 bits is named by its pointer, not by serde's "floating point".
    let r = api.post(&format!("/api/v1/tasks/{tid}/progress"), r#"{"counters":{"rows":18446744073709551616}}"#).await;
    let p = problem(r, 400, "invalid_argument").await;
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.contains("body/counters/rows") && !detail.contains("floating point"), "{p}");
}

/// Issue 47: a task whose output is larger than any one part or buffer — 2 GiB of a program's
/// stdout, its length unknown until the program ends (a deferred-length upload cut into
/// `[s3] deferred_part_size` parts) — completes, and the stored file is its exact bytes. Run in
/// the S3 reruns (moto, then Garage); on local files the same path is the one every other
/// command test takes, so the fs passes skip it rather than write 2 GiB four times.
#[tokio::test]
async fn a_two_gib_command_output_completes_on_s3() {
    if !blobs_are_s3() {
        eprintln!("skipped: FERRY_TEST_BLOBS is not s3");
        return;
    }
    const LEN: u64 = 2 << 30;
    let dir = tempfile::tempdir().unwrap();
    let produce = format!("yes 'ferry 2 GiB task output, line after line' | head -c {LEN}");
    let script = write_script(dir.path(), "big.sh", &format!("{produce}\n"));
    let want = {
        let out = std::process::Command::new("sh").arg("-c").arg(format!("{produce} | sha256sum")).output().unwrap();
        String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap().to_string()
    };
    let cfg = write_file(dir.path(), "ferry.toml", &format!("[commands.big]\nprogram = \"{}\"\n", script.display()));
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let api = Api::new(&s);
    let tid = id(&api.start("command", r#"{"command":"big"}"#).await);
    let v = api.wait_status(&tid, "completed", 900).await;
    let f = &v["result"]["file"];
    assert_eq!(f["size"], LEN, "{v}");
    assert_eq!(f["sha256"], want.as_str(), "{v}");
    let fid = f["id"].as_str().unwrap();
    // The stored bytes, read back whole (streamed, not held), and a range across a part boundary.
    let mut r = api.get(&format!("/files/{fid}")).await;
    assert_eq!(r.status(), 200);
    let (mut hash, mut read) = (<sha2::Sha256 as sha2::Digest>::new(), 0u64);
    while let Some(chunk) = r.chunk().await.unwrap() {
        sha2::Digest::update(&mut hash, &chunk);
        read += chunk.len() as u64;
    }
    assert_eq!(read, LEN);
    assert_eq!(hex::encode(sha2::Digest::finalize(hash)), want);
    let at = (64u64 << 20) - 3;
    let r = api.send("GET", &format!("/files/{fid}"), &[("Range", &format!("bytes={at}-{}", at + 5))], None).await;
    assert_eq!(r.status(), 206);
    let line = b"ferry 2 GiB task output, line after line\n";
    let want_range: Vec<u8> = (at..at + 6).map(|i| line[(i % line.len() as u64) as usize]).collect();
    assert_eq!(&r.bytes().await.unwrap()[..], &want_range[..]);
}
