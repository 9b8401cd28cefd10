//! Partial results of tasks (issue 27): ordered JSON fragments a task appends while it works,
//! read over REST (`GET /api/v1/tasks/{id}?partial_after=SEQ`), MCP (`task_get` with
//! `partial_after`) and as `task.partial` Server-Sent Events; durable and tied to the task's
//! checkpoint (a `command` exporter `kill -9`ed mid-way resumes without a duplicate); bounded
//! (1 000 fragments keep the view within 64 KiB and count the dropped ones); appended by
//! `command` (`partial <json>` on stderr), `external` (`POST /api/v1/tasks/{id}/partial`) and
//! the built-in kinds (`archive` per member, `compress` per frame).

mod common;

use std::time::{Duration, Instant};

use common::*;
use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

type Client = RunningService<RoleClient, ClientConfig>;

async fn mcp_client(server: &Server) -> Client {
    let cfg = StreamableHttpClientTransportConfig::with_uri(server.url("/mcp"));
    ClientConfig::new(ClientCapabilities::default(), Implementation::new("ferry-tests", "0"))
        .serve(StreamableHttpClientTransport::from_config(cfg))
        .await
        .expect("MCP over HTTP connects")
}

/// `tool`'s structured result; it must validate against the tool's `outputSchema`.
async fn mcp_call(c: &Client, tool: &str, args: Value) -> Value {
    let Value::Object(a) = args else { panic!("args must be an object") };
    let r = c.call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(a)).await.unwrap_or_else(|e| panic!("{tool}: {e}"));
    let v = r.structured_content.clone().expect("structuredContent");
    let tools = c.list_all_tools().await.expect("tools/list");
    let schema = Value::Object(tools.iter().find(|t| t.name == tool).and_then(|t| t.output_schema.as_deref().cloned()).expect("outputSchema"));
    let validator = jsonschema::validator_for(&schema).expect("a valid schema");
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert!(errors.is_empty(), "{tool}: {errors:?}\n{v}");
    v
}

/// One Server-Sent Events message.
#[derive(Debug, Clone)]
struct Sse {
    id: String,
    event: String,
    data: Value,
}

/// Read SSE messages from `r` until `done` says the ones read so far suffice.
async fn read_sse_until(r: &mut reqwest::Response, buf: &mut String, secs: u64, done: impl Fn(&[Sse]) -> bool) -> Vec<Sse> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if !data.is_empty() {
                out.push(Sse { id, event, data: serde_json::from_str(&data).unwrap() });
            }
        }
        if done(&out) {
            return out;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out after {} SSE messages: {out:?}", out.len());
        match tokio::time::timeout(left, r.chunk()).await {
            Ok(Ok(Some(c))) => buf.push_str(&String::from_utf8_lossy(&c)),
            Ok(Ok(None)) => panic!("the event stream ended: {out:?}"),
            Ok(Err(e)) => panic!("reading the event stream: {e}"),
            Err(_) => panic!("timed out after {} SSE messages: {out:?}", out.len()),
        }
    }
}

fn partial_seqs(sse: &[Sse], task: &str) -> Vec<u64> {
    sse.iter().filter(|m| m.event == "task.partial" && m.data["data"]["task"] == task).map(|m| m.data["data"]["seq"].as_u64().unwrap()).collect()
}

fn fragments(view: &Value) -> Vec<(u64, Value)> {
    view["partial"]["fragments"]
        .as_array()
        .unwrap_or_else(|| panic!("no partial.fragments: {view}"))
        .iter()
        .map(|f| (f["seq"].as_u64().unwrap(), f["value"].clone()))
        .collect()
}

fn rows(range: std::ops::RangeInclusive<u64>) -> Vec<(u64, Value)> {
    range.map(|i| (i, json!({ "row": i }))).collect()
}

/// A `command` exporter writes 5 rows and a fragment per row, checkpointing after row 2; the
/// first run waits after the third fragment (stored, not yet covered by a checkpoint) and the
/// server is `kill -9`ed there. The resumed run starts after row 2 and writes fragments 3–5
/// again: the task ends with exactly fragments 1–5, in order, and one `task.partial` event each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_killed_after_its_third_fragment_resumes_without_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let script = write_script(
        dir.path(),
        "rows.sh",
        &format!(
            r#"i=${{FERRY_CHECKPOINT:-0}}
n=0
while [ $i -lt 5 ]; do
  i=$((i+1))
  line="row $i"
  printf '%s\n' "$line"
  n=$((n + ${{#line}} + 1))
  echo "partial {{\"row\":$i}}" >&2
  if [ $i -eq 2 ]; then echo "checkpoint $n 2" >&2; fi
  if [ $i -eq 3 ] && [ -z "$FERRY_CHECKPOINT" ]; then
    j=0; while [ ! -e '{gate}' ] && [ -d '{dir}' ] && [ $j -lt 1200 ]; do sleep 0.05; j=$((j+1)); done
  fi
done
"#,
            gate = gate.display(),
            dir = dir.path().display()
        ),
    );
    let cfg = write_file(dir.path(), "ferry.toml", &format!("[commands.rows]\nprogram = \"{}\"\noutput_name = \"rows.txt\"\n", script.display()));
    let cfg = cfg.to_str().unwrap();
    let mut s = Server::start(&["--config", cfg, "--task-lease", "2s"]);
    let api = Api::new(&s);
    let mut stream = api.get("/api/v1/events").await;
    assert_eq!(stream.status(), 200);
    let tid = api.start("command", r#"{"command":"rows"}"#).await["id"].as_str().unwrap().to_string();

    let before = api.wait_for(&tid, 60, "three fragments", |v| v["partial"]["next"] == 3).await;
    assert_eq!(fragments(&before), rows(1..=3), "{before}");
    assert_eq!((before["partial"]["dropped"].as_u64(), before["status"].as_str()), (Some(0), Some("working")));
    let mut buf = String::new();
    let first = read_sse_until(&mut stream, &mut buf, 60, |m| partial_seqs(m, &tid).len() == 3).await;
    assert_eq!(partial_seqs(&first, &tid), vec![1, 2, 3]);
    drop(stream);
    s.kill9();
    std::fs::write(&gate, b"").unwrap(); // the orphaned first run ends

    s.restart_with(&["--config", cfg, "--task-lease", "1s"]);
    let api = Api::new(&s);
    let done = api.wait_status(&tid, "completed", 120).await;
    assert!(done["runs"].as_u64().unwrap() >= 2, "{done}");
    assert_eq!(fragments(&done), rows(1..=5), "exactly five fragments in order, no duplicate: {done}");
    assert_eq!((done["partial"]["next"].as_u64(), done["partial"]["dropped"].as_u64()), (Some(5), Some(0)));
    assert_eq!(done["result"]["exit_code"], 0, "the final result stays separate: {done}");
    let out = api.download(done["result"]["file"]["id"].as_str().unwrap()).await;
    assert_eq!(out, b"row 1\nrow 2\nrow 3\nrow 4\nrow 5\n");

    // REST: only newer ones after a cursor; a bad cursor is refused.
    let newer = api.task(&format!("{tid}?partial_after=3")).await;
    assert_eq!(fragments(&newer), rows(4..=5), "{newer}");
    assert_eq!(newer["partial"]["next"], 5);
    assert!(fragments(&api.task(&format!("{tid}?partial_after=5")).await).is_empty());
    problem(api.get(&format!("/api/v1/tasks/{tid}?partial_after=-1")).await, 400, "invalid_argument").await;
    problem(api.get(&format!("/api/v1/tasks/{tid}?partial_after=x")).await, 400, "invalid_argument").await;

    // MCP task_get: the same fragments, and partial_after.
    let c = mcp_client(&s).await;
    let all = mcp_call(&c, "task_get", json!({ "task_id": tid })).await;
    assert_eq!(fragments(&all), rows(1..=5), "{all}");
    assert_eq!(all["status"], "completed");
    let after = mcp_call(&c, "task_get", json!({ "task_id": tid, "partial_after": 4 })).await;
    assert_eq!(fragments(&after), rows(5..=5), "{after}");
    assert_eq!(after["partial"]["next"], 5);
    let _ = c.cancel().await;

    // SSE: every task.partial, with an id, from the one before the crash on; no seq twice.
    let last_seen = first.iter().rev().find(|m| m.event == "task.partial").unwrap().id.clone();
    let mut again = api.send("GET", "/api/v1/events", &[("last-event-id", &last_seen)], None).await;
    assert_eq!(again.status(), 200);
    let mut buf = String::new();
    let rest = read_sse_until(&mut again, &mut buf, 60, |m| {
        m.iter().any(|e| e.event == "task.status_changed" && e.data["data"]["task"] == tid && e.data["data"]["status"] == "completed")
    })
    .await;
    assert_eq!(partial_seqs(&rest, &tid), vec![4, 5], "the resumed run's replay of fragment 3 is no event: {rest:?}");
    let all: Vec<&Sse> = first.iter().chain(&rest).filter(|m| m.event == "task.partial").collect();
    assert!(all.iter().all(|m| m.id.starts_with("evt_") && m.data["id"] == m.id.as_str()), "{all:?}");
    assert_eq!(all.iter().map(|m| m.id.as_str()).collect::<std::collections::BTreeSet<_>>().len(), 5);
    assert_eq!(all.iter().map(|m| m.data["data"]["value"].clone()).collect::<Vec<_>>(), rows(1..=5).into_iter().map(|r| r.1).collect::<Vec<_>>());
}

/// An `external` producer appends 1 000 fragments of ~200 bytes: the view keeps the newest,
/// stays within 64 KiB and says how many were dropped; `partial_after` pages; bad fragments and
/// fragments to a finished task are refused and change nothing.
#[tokio::test]
async fn a_thousand_external_fragments_keep_the_view_within_64_kib() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let tid = api.start("external", r#"{"what":"scan"}"#).await["id"].as_str().unwrap().to_string();
    let pad = "x".repeat(180);
    for i in 1..=1000u64 {
        let r = api.post(&format!("/api/v1/tasks/{tid}/partial"), &json!({ "fragment": { "i": i, "pad": pad } }).to_string()).await;
        assert_eq!(r.status(), 200, "append {i}");
        if i == 1 || i == 1000 {
            let v = json(r).await;
            assert_eq!(v["partial"]["next"], i, "{v}");
            assert_eq!(fragments(&v).iter().map(|f| f.0).collect::<Vec<_>>(), vec![i], "the answer shows the new fragment: {v}");
        }
    }
    let r = api.get(&format!("/api/v1/tasks/{tid}")).await;
    let text = r.text().await.unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let p = &v["partial"];
    let p_text = serde_json::to_string(p).unwrap();
    let kept = p["fragments"].as_array().unwrap();
    eprintln!("1000 fragments: {} kept, {} dropped, partial view {} bytes, task view {} bytes", kept.len(), p["dropped"], p_text.len(), text.len());
    assert!(p_text.len() <= 64 * 1024, "partial view of {} bytes", p_text.len());
    assert!(!kept.is_empty() && kept.len() <= 256);
    assert_eq!(p["dropped"].as_u64().unwrap() + kept.len() as u64, 1000, "{p_text:.300}");
    assert_eq!(p["next"], 1000);
    let seqs: Vec<u64> = kept.iter().map(|f| f["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1001 - kept.len() as u64..=1000).collect::<Vec<_>>(), "the newest are kept, in order");
    assert_eq!(kept.last().unwrap()["value"], json!({ "i": 1000, "pad": pad }));
    assert_eq!(fragments(&api.task(&format!("{tid}?partial_after=998")).await).iter().map(|f| f.0).collect::<Vec<_>>(), vec![999, 1000]);

    // Refusals change nothing.
    let url = format!("/api/v1/tasks/{tid}/partial");
    problem(api.post(&url, r#"{"fragment": "#).await, 400, "invalid_argument").await;
    problem(api.post(&url, r#"{"value": 1}"#).await, 400, "invalid_argument").await;
    problem(api.post(&url, &json!({ "fragment": "y".repeat(17 * 1024) }).to_string()).await, 413, "size_exceeded").await;
    // Nesting no reader of stored JSON takes (SQLite's JSON stops at 1 000 levels): 400 naming
    // the limit, for fragments, results and start args alike; 64 levels are fine.
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    for body in [format!("{{\"fragment\":{}}}", nested(1001)), format!("{{\"result\":{}}}", nested(1001))] {
        let to = if body.contains("fragment") { url.clone() } else { format!("/api/v1/tasks/{tid}/complete") };
        let p = problem(api.post(&to, &body).await, 400, "invalid_argument").await;
        assert!(p["detail"].as_str().unwrap().contains("at most 64 levels"), "{p}");
    }
    let p =
        problem(api.post("/api/v1/tasks", &format!("{{\"kind\":\"external\",\"args\":{}}}", nested(100_000))).await, 400, "invalid_argument").await;
    assert!(p["detail"].as_str().unwrap().contains("nests"), "{p}");
    assert_eq!(api.post(&url, &format!("{{\"fragment\":{}}}", nested(63))).await.status(), 200, "63 levels inside the body's own");
    assert_eq!(api.task(&tid).await["partial"]["next"], 1001);
    problem(api.post("/api/v1/tasks/aaaaaaaaaaaaaaaaaaaaaaaaaa/partial", r#"{"fragment": 1}"#).await, 404, "not_found").await;
    assert_eq!(api.task(&tid).await["partial"]["next"], 1001);
    // Only an external task takes fragments from outside.
    let archive_input = api.upload(b"abc", "a.txt").await;
    let r = api.start_raw("archive", &json!({ "file_ids": [archive_input], "format": "tar" }).to_string(), None, None).await;
    let (st, body) = (r.status(), r.text().await.unwrap());
    assert_eq!(st, 201, "{body}");
    let other = serde_json::from_str::<Value>(&body).unwrap()["id"].as_str().unwrap().to_string();
    problem(api.post(&format!("/api/v1/tasks/{other}/partial"), r#"{"fragment": 1}"#).await, 409, "conflict").await;
    // A finished task takes no more; its fragments stay readable.
    assert_eq!(api.post(&format!("/api/v1/tasks/{tid}/complete"), r#"{"result":{"rows":1000}}"#).await.status(), 200);
    problem(api.post(&url, r#"{"fragment": 1}"#).await, 409, "conflict").await;
    let v = api.task(&tid).await;
    assert_eq!((v["status"].as_str(), v["result"]["rows"].as_u64(), v["partial"]["next"].as_u64()), (Some("completed"), Some(1000), Some(1001)));

    // MCP: a task_get result carries at most 4 KiB of fragments and says there are more.
    let c = mcp_client(&s).await;
    let page = mcp_call(&c, "task_get", json!({ "task_id": tid, "partial_after": 900 })).await;
    let got = fragments(&page);
    assert!(!got.is_empty() && got[0].0 == 901, "{page}");
    assert_eq!(page["partial"]["more"], true, "{page}");
    assert_eq!(page["partial"]["next"], got.last().unwrap().0);
    assert!(serde_json::to_string(&page).unwrap().len() < 6 * 1024);
    let _ = c.cancel().await;
}

/// Built-in kinds: `archive` appends one fragment per member (name, size), `compress` one per
/// frame; both keep their result separate.
#[tokio::test]
async fn archive_and_compress_append_a_fragment_per_member_and_frame() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let a = api.upload(b"first file", "first.txt").await;
    let b = api.upload(&pseudo_random(70_000, 5), "second.bin").await;
    let tid = api.start("archive", &json!({ "file_ids": [a, b], "format": "zip" }).to_string()).await["id"].as_str().unwrap().to_string();
    let v = api.wait_status(&tid, "completed", 60).await;
    let f = fragments(&v);
    assert_eq!(f.len(), 2, "{v}");
    assert_eq!(f[0].1, json!({ "member": 0, "name": "first.txt", "size": 10, "file_id": a }));
    assert_eq!(f[1].1, json!({ "member": 1, "name": "second.bin", "size": 70_000, "file_id": b }));
    assert_eq!(v["result"]["members"], 2);

    let tid = api.start("compress", &json!({ "file_id": b, "format": "gzip" }).to_string()).await["id"].as_str().unwrap().to_string();
    let v = api.wait_status(&tid, "completed", 60).await;
    let f = fragments(&v);
    assert_eq!(f.len(), 1, "one frame for 70 000 bytes: {v}");
    assert_eq!((f[0].1["frame"].as_u64(), f[0].1["input_offset"].as_u64(), f[0].1["input_bytes"].as_u64()), (Some(0), Some(0), Some(70_000)));
    assert_eq!(f[0].1["output_end"], v["result"]["file"]["size"], "{v}");
}
