//! Task status pushed to MCP clients (issue 27, src/mcp/push.rs), seen by the official Python
//! `mcp` 2.3.0 client with the tasks extension (`tests/clients/python/mcp_ferry.py task_push`):
//! a task that asks for input and is answered gives one `notifications/tasks` per transition —
//! working → input_required → working → completed — on the client's `subscriptions/listen`
//! stream, over Streamable HTTP and stdio, through a server restart (`kill -9`; the client
//! listens again on the new process), and from another replica (the stream is on one replica,
//! the task's changes are made by the other; PostgreSQL, `FERRY_TEST_PG`).
//!
//! Every check is the client's: the script exits non-zero naming what differed.

mod common;

use std::path::Path;
use std::time::Duration;

use common::pg::TestDb;
use common::*;
use serde_json::Value;

/// `ask` asks for input `name` once, then prints `hello <answer as JSON>`.
const ASK_TOML: &str = r#"
[commands.ask]
program = "/bin/sh"
args = [
  "-c",
  '''if [ -z "$FERRY_INPUT_NAME" ]; then echo 'input name {"message":"What is your name?"}' >&2; exit 0; fi; printf 'hello %s' "$FERRY_INPUT_NAME"''',
]
"#;

/// Per client run.
const CLIENT_SECS: u64 = 300;

fn config() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = write_file(dir.path(), "ferry.toml", ASK_TOML);
    (dir, p.to_str().unwrap().to_string())
}

fn push_script(data: &Path, extra: &[&str]) -> std::process::Command {
    let mut args = vec!["task_push", "--data", data.to_str().unwrap()];
    args.extend_from_slice(extra);
    let mut cmd = python_script("mcp_ferry.py", &args);
    cmd.env("PYTHONUNBUFFERED", "1");
    cmd
}

/// The four transitions, each with its own event id.
fn check_pushed(v: &Value) {
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["result"]["statuses"], serde_json::json!(["working", "input_required", "working", "completed"]), "{v}");
    let ids: std::collections::BTreeSet<&str> = v["result"]["events"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(ids.len(), 4, "{v}");
}

#[tokio::test]
async fn python_http_client_is_told_every_status_of_a_task_that_asks_for_input() {
    let (_cfg, path) = config();
    let s = Server::start(&["--config", &path]);
    let v = run_json_client(push_script(&s.data, &["--url", &s.url("/mcp")]), CLIENT_SECS).await;
    assert_eq!(v["transport"], "http");
    check_pushed(&v);
}

#[tokio::test]
async fn python_stdio_client_is_told_every_status_of_a_task_that_asks_for_input() {
    let (_cfg, path) = config();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let ferry = ferry_bin();
    let cmd = push_script(&data, &["--ferry", ferry.to_str().unwrap(), "--", "--config", &path]);
    let v = run_json_client(cmd, CLIENT_SECS).await;
    assert_eq!(v["transport"], "stdio");
    check_pushed(&v);
}

/// The server is `kill -9`ed while the task waits for input and started again on the same
/// address and data; the client listens again and is told the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_is_told_the_statuses_after_a_server_restart() {
    let (_cfg, path) = config();
    let mut s = Server::start(&["--config", &path]);
    let gate = tempfile::tempdir().unwrap();
    let cmd = push_script(&s.data, &["--url", &s.url("/mcp"), "--gate", gate.path().to_str().unwrap()]);
    let client = tokio::spawn(run_json_client(cmd, CLIENT_SECS));
    let asked = gate.path().join("restart");
    let mut restarted = false;
    while !client.is_finished() {
        if !restarted && asked.exists() {
            s.restart_same_port();
            std::fs::write(gate.path().join("restart.done"), b"").unwrap();
            restarted = true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let v = client.await.expect("client task");
    assert!(restarted, "the client asked for the restart: {v}");
    check_pushed(&v);
}

/// Two replicas on one PostgreSQL catalog: the client's listen stream is on replica B; it starts
/// and answers the task through replica A, whose worker (or B's) runs it. Every change reaches
/// the stream on B through the outbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_listening_on_one_replica_is_told_the_changes_made_on_another() {
    let (_cfg, path) = config();
    let db = TestDb::create().await;
    let blobs = tempfile::tempdir().unwrap();
    let replica =
        || Server::start(&["--catalog", db.url.as_str(), "--blobs", blobs.path().to_str().unwrap(), "--leases", "catalog", "--config", &path]);
    let (a, b) = (replica(), replica());
    let cmd = push_script(&a.data, &["--url", &a.url("/mcp"), "--url2", &b.url("/mcp")]);
    let v = run_json_client(cmd, CLIENT_SECS).await;
    check_pushed(&v);
}

/// rmcp acknowledges a `subscriptions/listen` before ferry's handler runs, and a client may
/// start a task the moment it reads that acknowledgment. So the stream's start in the outbox must
/// be known before the acknowledgment: here the outbox is locked (`LOCK TABLE events`: even a
/// read of its head waits) when the client listens, and the acknowledgment must not arrive
/// until it is released. The client then creates its task at once and must be told all four
/// statuses (a start read after the acknowledgment could skip the first of them).
async fn listen_is_acknowledged_only_once_its_start_is_known(http: bool) {
    use sqlx::{Connection, Executor};
    let (_cfg, path) = config();
    let db = TestDb::create().await;
    let gate = tempfile::tempdir().unwrap();
    let gate_arg = gate.path().to_str().unwrap().to_string();
    let server = http.then(|| Server::start(&["--catalog", db.url.as_str(), "--config", &path]));
    let tmp = tempfile::tempdir().unwrap();
    let cmd = match &server {
        Some(s) => push_script(&s.data, &["--url", &s.url("/mcp"), "--gate", &gate_arg, "--hold"]),
        None => {
            let data = tmp.path().join("data");
            let ferry = ferry_bin();
            push_script(
                &data,
                &["--gate", &gate_arg, "--hold", "--ferry", ferry.to_str().unwrap(), "--", "--catalog", db.url.as_str(), "--config", &path],
            )
        }
    };
    let client = tokio::spawn(run_json_client(cmd, CLIENT_SECS));
    let deadline = std::time::Instant::now() + Duration::from_secs(CLIENT_SECS);
    while !gate.path().join("hold").exists() {
        assert!(!client.is_finished(), "the client ended before asking for the hold");
        assert!(std::time::Instant::now() < deadline, "the client never asked for the hold");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut pg = sqlx::PgConnection::connect(&db.url).await.unwrap();
    pg.execute("BEGIN").await.unwrap();
    pg.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE").await.unwrap();
    std::fs::write(gate.path().join("hold.done"), b"").unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let acked_while_held = gate.path().join("acked").exists();
    pg.execute("COMMIT").await.unwrap();
    assert!(!acked_while_held, "the listen was acknowledged while its start in the outbox could not be read");
    let v = client.await.expect("client task");
    assert!(gate.path().join("acked").exists(), "{v}");
    check_pushed(&v);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_listen_is_acknowledged_only_once_its_start_is_known() {
    listen_is_acknowledged_only_once_its_start_is_known(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_listen_is_acknowledged_only_once_its_start_is_known() {
    listen_is_acknowledged_only_once_its_start_is_known(false).await;
}

/// A listen whose start in the outbox cannot be read — the database closed to connections
/// (`ALLOW_CONNECTIONS false`, its connections ended) — is acknowledged and then ends with an
/// error carrying `unavailable`, retryable; once the database is open again, listening works and
/// carries a task's statuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_is_told_to_listen_again_when_the_start_cannot_be_read() {
    use sqlx::{Connection, Executor};
    let (_cfg, path) = config();
    let db = TestDb::create().await;
    let s = Server::start(&["--catalog", db.url.as_str(), "--config", &path]);
    let gate = tempfile::tempdir().unwrap();
    let mut args = vec!["listen_refused", "--data", s.data.to_str().unwrap()];
    let url = s.url("/mcp");
    args.extend_from_slice(&["--url", &url, "--gate", gate.path().to_str().unwrap()]);
    let mut cmd = python_script("mcp_ferry.py", &args);
    cmd.env("PYTHONUNBUFFERED", "1");
    let client = tokio::spawn(run_json_client(cmd, CLIENT_SECS));
    let mut admin = sqlx::PgConnection::connect(&common::pg::admin_url()).await.unwrap();
    let allow = |on: bool| sqlx::AssertSqlSafe(format!("ALTER DATABASE \"{}\" ALLOW_CONNECTIONS {on}", db.name));
    let mut closed = false;
    while !client.is_finished() {
        if !closed && gate.path().join("close").exists() {
            admin.execute(allow(false)).await.unwrap();
            common::pg::terminate_backends(&db.name).await;
            std::fs::write(gate.path().join("close.done"), b"").unwrap();
            closed = true;
        }
        if closed && gate.path().join("reopen").exists() && !gate.path().join("reopen.done").exists() {
            admin.execute(allow(true)).await.unwrap();
            // Past a second idle, ferry pings a pooled connection before use: the ones the
            // database ended are replaced rather than failing the client's next requests.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            std::fs::write(gate.path().join("reopen.done"), b"").unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    admin.execute(allow(true)).await.unwrap();
    let v = client.await.expect("client task");
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["result"]["error"]["code"], "unavailable", "{v}");
    assert_eq!(v["result"]["statuses"], serde_json::json!(["working", "input_required"]), "{v}");
}
