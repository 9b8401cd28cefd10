//! The book's "Waiting for a task from Python or JavaScript" blocks (docs/src/tasks.md), run
//! exactly as printed —
//! only the `FERRY` and `TASK` lines are replaced — against the real binary (Python with
//! `requests` from the test clients' venv, Node's own `fetch`). Each must subscribe to the
//! live events stream, read the task, and end on the event that made the task terminal.
//!
//! To know when a block is waiting on the stream, a prelude that is not part of the block logs
//! every answer its HTTP library returns (Python: `requests.get`, Node: `fetch`) on stderr. The
//! test ends the task only after the block has read the task once after subscribing, so the
//! block can only end by reading the status event; its second read of the task proves it
//! reacted to that event.

mod common;
use common::*;

use std::process::Stdio;
use std::time::Duration;

/// The ```LANG block of the book's "## Waiting for a task from Python or JavaScript".
fn readme_block(lang: &str) -> String {
    let section = book::section(&book::text("docs/src/tasks.md"), "## Waiting for a task from Python or JavaScript");
    book::blocks(&section, lang).into_iter().next().unwrap_or_else(|| panic!("no ```{lang} block in the section"))
}

/// Replace the line that assigns `name` (`NAME = …` or `const NAME = …`) with `value`.
fn substitute(block: &str, name: &str, value: &str, js: bool) -> String {
    let mut found = false;
    let out: Vec<String> = block
        .lines()
        .map(|l| {
            let head = if js { format!("const {name} = ") } else { format!("{name} = ") };
            if l.starts_with(&head) {
                found = true;
                if js {
                    format!("const {name} = '{value}'")
                } else {
                    format!("{name} = \"{value}\"")
                }
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(found, "the book's block has no `{name} = …` line:\n{block}");
    out.join("\n")
}

const PY_PRELUDE: &str = r#"import sys, requests
_get = requests.get
def _logged(url, *a, **k):
    r = _get(url, *a, **k)
    print("GOT " + url, file=sys.stderr, flush=True)
    return r
requests.get = _logged
"#;

const JS_PRELUDE: &str = r#"const _fetch = globalThis.fetch
globalThis.fetch = async (url, opts) => { const r = await _fetch(url, opts); process.stderr.write('GOT ' + url + '\n'); return r }
"#;

/// Run `program script` with the book's block for `lang`, end task `id` with `finish` once the
/// block has read the task after subscribing, and return the task JSON it printed.
async fn run_block(s: &Server, lang: &str, id: &str, other: Option<&str>, finish: &str, body: &str) -> serde_json::Value {
    let js = lang == "js";
    let block = substitute(&substitute(&readme_block(lang), "FERRY", &s.base, js), "TASK", id, js);
    let dir = tempfile::tempdir().unwrap();
    let (script, mut cmd) = if js {
        let p = dir.path().join("wait.mjs");
        std::fs::write(&p, format!("{JS_PRELUDE}{block}")).unwrap();
        (p, loopback_command(std::env::var_os("FERRY_NODE").unwrap_or_else(|| "node".into())))
    } else {
        let p = dir.path().join("wait.py");
        std::fs::write(&p, format!("{PY_PRELUDE}{block}")).unwrap();
        (p, loopback_command(python_bin()))
    };
    let mut child = cmd.arg(&script).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let rx = StderrLines::take(&mut child);
    let task_url = format!("{}/api/v1/tasks/{id}", s.base);
    let events_url = format!("{}/api/v1/events", s.base);
    let mut log = Vec::new();
    // Subscribed, then read the task: now only an event can tell it the task ended.
    while !log.iter().any(|l: &String| l == &format!("GOT {task_url}")) {
        let line = tokio::task::block_in_place(|| rx.next()).unwrap_or_else(|| panic!("{lang}: no read of the task; stderr so far: {log:?}"));
        log.push(line);
    }
    assert_eq!(
        log.iter().find(|l| l.starts_with("GOT ")).map(String::as_str),
        Some(format!("GOT {events_url}").as_str()),
        "{lang}: subscribe first: {log:?}"
    );
    if let Some(o) = other {
        // Another task's status event passes by without ending the wait.
        let r = Api::new(s).post(&format!("/api/v1/tasks/{o}/cancel"), "").await;
        assert_eq!(r.status(), 200);
    }
    let r = Api::new(s).post(&format!("/api/v1/tasks/{id}/{finish}"), body).await;
    assert_eq!(r.status(), 200);
    let pid = child.id();
    let out = tokio::time::timeout(Duration::from_secs(60), tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())).await;
    let out = match out {
        Ok(o) => o.unwrap(),
        Err(_) => {
            let _ = std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("{lang}: the book's block did not end after the task did");
        }
    };
    log.extend(tokio::task::block_in_place(|| rx.rest()));
    assert!(out.status.success(), "{lang}: {}\n{log:?}", out.status);
    let reads = log.iter().filter(|l| **l == format!("GOT {task_url}")).count();
    assert_eq!(reads, 2, "{lang}: one read after subscribing, one on the status event: {log:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{lang}: not JSON ({e}): {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_block_ends_on_the_status_event() {
    let s = Server::start(&[]);
    let id = Api::new(&s).start("external", r#"{"job":"readme-python"}"#).await["id"].as_str().unwrap().to_string();
    let other = Api::new(&s).start("external", "{}").await["id"].as_str().unwrap().to_string();
    let t = run_block(&s, "python", &id, Some(&other), "complete", r#"{"result":{"rows":7}}"#).await;
    assert_eq!(t["status"], "completed");
    assert_eq!(t["result"]["rows"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_block_ends_on_the_status_event() {
    let s = Server::start(&[]);
    let id = Api::new(&s).start("external", r#"{"job":"readme-js"}"#).await["id"].as_str().unwrap().to_string();
    let other = Api::new(&s).start("external", "{}").await["id"].as_str().unwrap().to_string();
    let t = run_block(&s, "js", &id, Some(&other), "fail", r#"{"message":"upstream said no"}"#).await;
    assert_eq!(t["status"], "failed");
    assert_eq!(t["error"]["message"], "upstream said no");
}
