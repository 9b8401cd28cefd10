//! What a refused or replayed request leaves behind (issue 23 items 4, 5 and 6), against the
//! real binary: a refusal of any creation — TUS, the IETF draft, MCP `file_upload_begin`, REST
//! tasks, a task's output file — leaves no upload, no blob, no event and no quota use, and names
//! no upload; a replayed creation or task start has no side effect (no hook call, no event, no
//! new task); and metadata that is not UTF-8 reaches every boundary byte for byte.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;
use futures::StreamExt;
use serde_json::{json, Value};

type McpClient = rmcp::service::RunningService<rmcp::RoleClient, rmcp::model::ClientConfig>;

const TOKEN: &str = "fy_refusals_alice_token";
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

struct HookServer {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

impl HookServer {
    fn start(dir: &Path) -> HookServer {
        let log = dir.join("hook.jsonl");
        let mut child = python_script("upload_hook.py", &["--log", log.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start upload_hook.py");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines.next().expect("hook exited before listening").unwrap();
        let port = line.strip_prefix("listening on ").expect("listening line").trim().parse().unwrap();
        std::thread::spawn(move || for _ in lines.by_ref() {});
        HookServer { child, port, log }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The requests the hook received, in order.
    fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

impl Drop for HookServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server_with(dir: &Path, toml: &str) -> Server {
    let cfg = write_file(dir, "ferry.toml", &format!("[[tokens]]\nprincipal = \"alice\"\nsha256 = \"{}\"\n\n{toml}", sha256_hex(TOKEN.as_bytes())));
    Server::start(&["--config", cfg.to_str().unwrap()])
}

fn md(pairs: &[(&str, &[u8])]) -> String {
    pairs.iter().map(|(k, v)| format!("{k} {}", B64.encode(v))).collect::<Vec<_>>().join(",")
}

/// Every file under the data directory's blob store, relative (the fs store: `DATA/blobs/`).
fn blob_files(s: &Server) -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, root, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let root = s.data.join("blobs");
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out.sort();
    out
}

/// One Server-Sent Event: its type and JSON data.
#[derive(Debug)]
struct Sse {
    event: String,
    data: Value,
}

/// Read `stream` until an event satisfies `last` (deadline 30 s); returns every event read.
async fn read_until(stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin), last: impl Fn(&Sse) -> bool) -> Vec<Sse> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut buf = String::new();
    let mut out = Vec::new();
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let mut ev = Sse { event: String::new(), data: Value::Null };
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    ev.event = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    ev.data = serde_json::from_str(v.trim()).unwrap_or(Value::Null);
                }
            }
            if ev.event.is_empty() {
                continue; // a keep-alive comment
            }
            let done = last(&ev);
            out.push(ev);
            if done {
                return out;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, stream.next()).await.expect("the awaited event within 30 s").expect("stream open").unwrap();
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
}

fn id_of(loc: &str) -> String {
    loc.trim_end_matches('/').rsplit('/').next().unwrap().split('?').next().unwrap().to_string()
}

/// A request body sent chunked (no Content-Length), so the server reads it only after the
/// upload exists.
fn chunked(data: Vec<u8>) -> reqwest::Body {
    reqwest::Body::wrap_stream(futures::stream::iter(data.chunks(7).map(|c| Ok::<_, std::io::Error>(c.to_vec())).collect::<Vec<_>>()))
}

async fn send_chunked(api: &Api, headers: &[(&str, &str)], data: Vec<u8>) -> reqwest::Response {
    let mut r = api.c.post(format!("{}/files/", api.base)).header("authorization", format!("Bearer {TOKEN}"));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.body(chunked(data)).send().await.expect("request")
}

async fn mcp_client(s: &Server) -> McpClient {
    use rmcp::model::*;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::ServiceExt;
    let cfg = StreamableHttpClientTransportConfig::with_uri(s.url("/mcp")).auth_header(TOKEN.to_string());
    ClientConfig::new(ClientCapabilities::default(), Implementation::new("refusals-test", "0"))
        .serve(rmcp::transport::StreamableHttpClientTransport::from_config(cfg))
        .await
        .expect("MCP connects")
}

async fn call_tool(c: &McpClient, name: &str, args: Value) -> Value {
    use rmcp::model::*;
    let Value::Object(args) = args else { panic!("arguments are an object") };
    let r = c.call_tool(CallToolRequestParams::new(name.to_string()).with_arguments(args)).await.expect(name);
    r.structured_content.unwrap_or(Value::Null)
}

/// Issue 23 item 4: walk the refusals of every creation path and check that nothing of them is
/// left — the upload list, the blob directory, the events outbox (read as SSE: the first event
/// after the walk is the sentinel's) and the principal's use (the sentinel fills the quota to
/// exactly its limit) — and that no refusal names an upload (`Location`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refused_creation_leaves_no_upload_blob_event_or_quota_use() {
    let dir = tempfile::tempdir().unwrap();
    let hook = HookServer::start(dir.path());
    let s = server_with(
        dir.path(),
        &format!("[limits]\nmax_bytes = 10000\nmax_uploads_in_progress = 5\n\n[hooks.pre_create]\nurl = \"{}\"\n", hook.url("/pre-create")),
    );
    let api = Api::with_token(&s, TOKEN);
    // One finished file before the walk: the input of a task below.
    let input = api.upload(&pseudo_random(6000, 1), "input.bin").await;
    let blobs_before = blob_files(&s);
    let events = api.send("GET", "/api/v1/events", &[("accept", "text/event-stream")], None).await;
    assert_eq!(events.status(), 200);
    let mut events = events.bytes_stream();

    let tus = |extra: &[(&'static str, String)]| {
        let mut h: Vec<(&str, String)> = vec![("Tus-Resumable", "1.0.0".into())];
        h.extend(extra.iter().cloned());
        h
    };
    let refused = |what: &str, r: &reqwest::Response, status: u16| {
        assert_eq!(r.status().as_u16(), status, "{what}");
        assert!(header(r, "location").is_none(), "{what}: a refusal names no upload");
        assert!(header(r, "upload-offset").is_none(), "{what}: nothing is left to resume");
    };
    let sha_of = |d: &[u8]| sha256_hex(d);
    fn ascii<'a>(h: &'a [(&'a str, String)]) -> Vec<(&'a str, &'a str)> {
        h.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }

    // --- TUS POST /files/: refused before anything exists.
    let r = Api::new(&s).send("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", "10")], None).await;
    refused("no token", &r, 401);
    let r = Api::with_token(&s, "fy_not_a_token").send("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", "10")], None).await;
    refused("a wrong token", &r, 401);
    let r = api.send("POST", "/files/", &[("Upload-Length", "10")], None).await;
    refused("no Tus-Resumable", &r, 412);
    let h = tus(&[("Upload-Length", "2000000000000".into())]);
    refused("longer than Tus-Max-Size", &api.send("POST", "/files/", &ascii(&h), None).await, 413);
    let h = tus(&[("Upload-Length", "10".into()), ("Upload-Metadata", "filename !!!".into())]);
    refused("malformed Upload-Metadata", &api.send("POST", "/files/", &ascii(&h), None).await, 400);
    let h = tus(&[("Upload-Length", "10".into()), ("Upload-Defer-Length", "1".into())]);
    refused("both lengths", &api.send("POST", "/files/", &ascii(&h), None).await, 400);
    let r = api
        .c
        .post(format!("{}/files/", api.base))
        .bearer_auth(TOKEN)
        .header("Tus-Resumable", "1.0.0")
        .header("Upload-Length", "10")
        .header("Idempotency-Key", "a, b, \"c\"")
        .send()
        .await
        .unwrap();
    refused("a malformed Idempotency-Key", &r, 400);
    let h = tus(&[("Upload-Length", "20000".into())]);
    refused("past the bytes quota", &api.send("POST", "/files/", &ascii(&h), None).await, 507);
    let h = tus(&[("Upload-Length", "10".into()), ("Upload-Metadata", md(&[("filename", b"setup.exe")]))]);
    refused("refused by the pre-create hook", &api.send("POST", "/files/", &ascii(&h), None).await, 403);
    let h = tus(&[("Upload-Concat", "final;/files/aaaaaaaaaaaaaaaaaaaaaaaaaa".into())]);
    refused("a final naming no partial upload", &api.send("POST", "/files/", &ascii(&h), None).await, 400);
    let h = tus(&[("Upload-Length", "5".into()), ("Content-Type", "text/plain".into())]);
    refused("a body of the wrong media type", &api.send("POST", "/files/", &ascii(&h), Some(b"hello".to_vec())).await, 415);
    let h = tus(&[("Upload-Length", "5".into()), ("Content-Type", OCTET.into()), ("Upload-Checksum", "crc32 AAAA".into())]);
    refused("an unknown checksum algorithm", &api.send("POST", "/files/", &ascii(&h), Some(b"hello".to_vec())).await, 400);

    // --- TUS creation-with-upload: refused after the upload was made, for its body.
    let bad_sha1 = format!(
        "sha1 {}",
        B64.encode({
            use sha1::Digest as _;
            sha1::Sha1::digest(b"not this")
        })
    );
    let h = tus(&[("Upload-Length", "5".into()), ("Content-Type", OCTET.into()), ("Upload-Checksum", bad_sha1)]);
    refused("a creation body failing its checksum", &api.send("POST", "/files/", &ascii(&h), Some(b"hello".to_vec())).await, 460);
    let h = tus(&[("Upload-Length", "5".into()), ("Content-Type", OCTET.into())]);
    refused("a creation body past Upload-Length", &send_chunked(&api, &ascii(&h), b"hello world".to_vec()).await, 413);
    let h =
        tus(&[("Upload-Length", "5".into()), ("Content-Type", OCTET.into()), ("Upload-Metadata", md(&[("sha256", sha_of(b"other").as_bytes())]))]);
    refused("a whole body failing the declared sha256", &api.send("POST", "/files/", &ascii(&h), Some(b"hello".to_vec())).await, 460);
    let h = tus(&[("Upload-Defer-Length", "1".into()), ("Content-Type", OCTET.into())]);
    refused("a deferred-length body past the quota", &api.send("POST", "/files/", &ascii(&h), Some(pseudo_random(5000, 2))).await, 507);
    let h = tus(&[("Upload-Length", "0".into()), ("Upload-Metadata", md(&[("sha256", sha_of(b"x").as_bytes())]))]);
    refused("an empty upload failing the declared sha256", &api.send("POST", "/files/", &ascii(&h), None).await, 460);

    // --- The IETF draft.
    let draft = |extra: &[(&'static str, String)]| {
        let mut h: Vec<(&str, String)> = vec![("Upload-Draft-Interop-Version", "8".into())];
        h.extend(extra.iter().cloned());
        h
    };
    let h = draft(&[("Upload-Complete", "?1".into()), ("Upload-Length", "10".into())]);
    refused("draft: content disagreeing with Upload-Length", &api.send("POST", "/files/", &ascii(&h), Some(vec![0; 11])).await, 400);
    let bad = format!("sha-256=:{}:", B64.encode(sha2_digest(b"something else")));
    let h = draft(&[("Upload-Complete", "?1".into()), ("Repr-Digest", bad.clone())]);
    refused("draft: content failing Repr-Digest", &api.send("POST", "/files/", &ascii(&h), Some(pseudo_random(3000, 3))).await, 400);
    let h = draft(&[("Upload-Complete", "?1".into()), ("Content-Digest", bad)]);
    refused("draft: content failing Content-Digest", &api.send("POST", "/files/", &ascii(&h), Some(pseudo_random(3000, 3))).await, 400);
    let h = draft(&[("Upload-Complete", "?1".into()), ("Upload-Length", "20".into())]);
    refused("draft: complete content short of Upload-Length", &send_chunked(&api, &ascii(&h), vec![4; 10]).await, 400);
    let h = draft(&[("Upload-Complete", "?0".into()), ("Upload-Metadata", md(&[("filename", b"virus.exe")]))]);
    refused("draft: refused by the pre-create hook", &api.send("POST", "/files/", &ascii(&h), None).await, 403);

    // --- MCP file_upload_begin.
    let c = mcp_client(&s).await;
    for (what, args, code) in [
        ("a URL lifetime out of range", json!({"name": "a.bin", "size": 10, "ttl_ms": 0}), "invalid_argument"),
        ("past the bytes quota", json!({"name": "a.bin", "size": 50000}), "quota_exceeded"),
        ("an empty name", json!({"name": "", "size": 10}), "invalid_argument"),
        ("a malformed sha256", json!({"name": "a.bin", "size": 10, "sha256": "xyz"}), "invalid_argument"),
        ("refused by the pre-create hook", json!({"name": "tool.exe", "size": 10}), "rejected"),
    ] {
        let out = call_tool(&c, "file_upload_begin", args).await;
        assert_eq!(out["error"]["code"], code, "MCP {what}: {out}");
    }
    let _ = c.cancel().await;

    // --- REST tasks: refused starts create no task.
    for (what, kind, args, status) in [
        ("an unknown kind", "nope", "{}", 400),
        ("arguments that do not parse", "archive", "{\"files\": 7}", 400),
        ("an input that is not the caller's", "archive", "{\"files\":[\"aaaaaaaaaaaaaaaaaaaaaaaaaa\"],\"format\":\"tar\"}", 404),
    ] {
        let r = api.start_raw(kind, args, None, None).await;
        assert_eq!(r.status().as_u16(), status, "REST {what}");
    }
    assert_eq!(api.start_raw("archive", &format!("{{\"files\":[\"{input}\"]}}"), None, Some(0)).await.status(), 400, "REST: ttl_ms 0");
    assert_eq!(json(api.get("/api/v1/tasks").await).await["tasks"].as_array().unwrap().len(), 0, "no task was created");

    // --- A task's output file past the quota: the task fails; its file leaves no trace.
    let t = api.start("archive", &format!("{{\"files\":[\"{input}\"],\"format\":\"tar\"}}")).await;
    let t = api.wait_status(t["id"].as_str().unwrap(), "failed", 60).await;
    assert_eq!(t["error"]["code"], "quota_exceeded", "{t}");

    // Nothing is left: the upload list, the blob directory.
    let files = json(api.get("/api/v1/files").await).await;
    let ids: Vec<&str> = files["files"].as_array().unwrap().iter().map(|f| f["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![input.as_str()], "only the file from before the walk: {files}");
    assert_eq!(blob_files(&s), blobs_before, "no blob of a refused creation is left");
    // No quota use: exactly the room left (10000 - 6000) is still there, and one byte more is not.
    let h = tus(&[("Upload-Length", "4000".into()), ("Upload-Metadata", md(&[("filename", b"sentinel.bin")]))]);
    let r = api.send("POST", "/files/", &ascii(&h), None).await;
    assert_eq!(r.status(), 201, "the whole remaining quota is free");
    let sentinel = id_of(header(&r, "location").unwrap());
    let v = problem(api.send("POST", "/files/", &ascii(&tus(&[("Upload-Length", "1".into())])), None).await, 507, "quota_exceeded").await;
    assert_eq!(v["quota"]["used"], 10000, "{v}");
    // No event: the walk wrote none but the failed task's own status changes; the next upload
    // event is the sentinel's creation.
    let seen = read_until(&mut events, |e| e.event == "upload.created" && e.data["data"]["upload"] == sentinel.as_str()).await;
    let stray: Vec<&Sse> = seen.iter().filter(|e| e.event != "task.status_changed").collect();
    assert_eq!(stray.len(), 1, "no event of a refused creation (only the sentinel's): {stray:?}");
    let task_events: Vec<&Sse> = seen.iter().filter(|e| e.event == "task.status_changed").collect();
    assert!(task_events.iter().all(|e| e.data["data"]["task"] == t["id"]), "task events are the failed archive's only: {task_events:?}");
}

fn sha2_digest(data: &[u8]) -> Vec<u8> {
    use sha2::Digest as _;
    sha2::Sha256::digest(data).to_vec()
}

/// Issue 23 item 5: a creation retried with the same `Idempotency-Key` (TUS and the draft) and
/// an identical final POSTed again are answered from the first attempt — the pre-create hook
/// (one that refuses a name it has seen) is not asked again, no event is written — and a task
/// start replayed with its key (REST and MCP) answers the same task even once its input is
/// gone: no new task, no new run, no event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_has_no_side_effects() {
    let dir = tempfile::tempdir().unwrap();
    let hook = HookServer::start(dir.path());
    let s = server_with(dir.path(), &format!("[hooks.pre_create]\nurl = \"{}\"\n", hook.url("/once-per-name")));
    let api = Api::with_token(&s, TOKEN);
    let events = api.send("GET", "/api/v1/events", &[("accept", "text/event-stream")], None).await;
    let mut events = events.bytes_stream();

    // TUS: the answer to the first request was lost; the client sends it again.
    let report = md(&[("filename", b"report.pdf")]);
    let h = [("Tus-Resumable", "1.0.0"), ("Upload-Length", "10"), ("Upload-Metadata", report.as_str()), ("Idempotency-Key", "\"k-tus-1\"")];
    let first = api.send("POST", "/files/", &h, None).await;
    assert_eq!(first.status(), 201);
    let again = api.send("POST", "/files/", &h, None).await;
    assert_eq!(again.status(), 201, "the retry is answered, not refused by the hook");
    assert_eq!(header(&again, "location"), header(&first, "location"), "with the first upload");
    // The same with the body along (creation-with-upload): the body is not appended twice.
    let note = md(&[("filename", b"note.txt")]);
    let h = [
        ("Tus-Resumable", "1.0.0"),
        ("Upload-Length", "5"),
        ("Content-Type", OCTET),
        ("Upload-Metadata", note.as_str()),
        ("Idempotency-Key", "k-tus-2"),
    ];
    let first_body = api.send("POST", "/files/", &h, Some(b"hello".to_vec())).await;
    assert_eq!(first_body.status(), 201);
    let again = api.send("POST", "/files/", &h, Some(b"hello".to_vec())).await;
    assert_eq!((again.status().as_u16(), header(&again, "location")), (201, header(&first_body, "location")));
    // The draft.
    let draft_md = md(&[("filename", b"draft.bin")]);
    let h = [
        ("Upload-Draft-Interop-Version", "8"),
        ("Upload-Complete", "?0"),
        ("Upload-Metadata", draft_md.as_str()),
        ("Idempotency-Key", "\"k-draft\""),
    ];
    let first_draft = api.send("POST", "/files/", &h, None).await;
    assert_eq!(first_draft.status(), 201);
    let again = api.send("POST", "/files/", &h, None).await;
    assert_eq!((again.status().as_u16(), header(&again, "location")), (201, header(&first_draft, "location")));
    // A final of a concatenation POSTed twice.
    let mut parts = Vec::new();
    for data in [&b"hello "[..], b"world"] {
        let len = data.len().to_string();
        let r = api.send("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", &len), ("Upload-Concat", "partial")], None).await;
        let loc = header(&r, "location").unwrap().to_string();
        let off = [("Tus-Resumable", "1.0.0"), ("Content-Type", OCTET), ("Upload-Offset", "0")];
        assert_eq!(api.send("PATCH", &loc, &off, Some(data.to_vec())).await.status(), 204);
        parts.push(loc);
    }
    let concat = format!("final;{} {}", parts[0], parts[1]);
    let joined = md(&[("filename", b"joined.txt")]);
    let h = [("Tus-Resumable", "1.0.0"), ("Upload-Concat", concat.as_str()), ("Upload-Metadata", joined.as_str())];
    let first_final = api.send("POST", "/files/", &h, None).await;
    assert_eq!(first_final.status(), 201);
    let again = api.send("POST", "/files/", &h, None).await;
    assert_eq!((again.status().as_u16(), header(&again, "location")), (201, header(&first_final, "location")));
    let named: Vec<String> = hook.calls().iter().filter_map(|c| c["request"]["upload"]["metadata"]["filename"].as_str().map(str::to_owned)).collect();
    assert_eq!(named, ["report.pdf", "note.txt", "draft.bin", "joined.txt"], "the hook was asked once per upload: {:?}", hook.calls());

    // Tasks: REST, with the key; its input is deleted before the replay.
    let input = api.upload(b"archive me", "in.txt").await;
    let args = format!("{{\"files\":[\"{input}\"],\"format\":\"tar\"}}");
    let r = api.start_raw("archive", &args, Some("k-task"), None).await;
    assert_eq!(r.status(), 201);
    let task = json(r).await;
    let task_id = task["id"].as_str().unwrap().to_string();
    api.wait_status(&task_id, "completed", 60).await;
    // MCP, with its own key, on the same input.
    let c = mcp_client(&s).await;
    let out = call_tool(&c, "archive_files", json!({"file_ids": [input], "idempotency_key": "k-mcp"})).await;
    let mcp_task = out["task_id"].as_str().unwrap_or_else(|| panic!("archive_files starts a task: {out}")).to_string();
    api.wait_status(&mcp_task, "completed", 60).await;
    let tasks_before = json(api.get("/api/v1/tasks").await).await["tasks"].as_array().unwrap().len();
    assert_eq!(api.send("DELETE", &format!("/files/{input}"), &[("Tus-Resumable", "1.0.0")], None).await.status(), 204);
    let r = api.start_raw("archive", &args, Some("k-task"), None).await;
    assert_eq!(r.status(), 200, "the replay names the task its key started");
    assert_eq!(json(r).await["id"], task_id.as_str());
    let out = call_tool(&c, "archive_files", json!({"file_ids": [input], "idempotency_key": "k-mcp"})).await;
    assert_eq!(out["task_id"], mcp_task.as_str(), "MCP: the same task: {out}");
    let _ = c.cancel().await;
    assert_eq!(json(api.get("/api/v1/tasks").await).await["tasks"].as_array().unwrap().len(), tasks_before, "no new task");

    // Events: one upload.created per upload, one status change per task change, nothing for
    // the replays. The sentinel's creation closes the stream.
    let sentinel =
        id_of(header(&api.send("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", "1")], None).await, "location").unwrap());
    let seen = read_until(&mut events, |e| e.event == "upload.created" && e.data["data"]["upload"] == sentinel.as_str()).await;
    let created: Vec<&str> = seen.iter().filter(|e| e.event == "upload.created").map(|e| e.data["data"]["upload"].as_str().unwrap()).collect();
    let unique: std::collections::HashSet<&&str> = created.iter().collect();
    assert_eq!(unique.len(), created.len(), "one upload.created per upload: {created:?}");
    // report, note, draft, 2 parts, final, input, 2 archives, sentinel.
    assert_eq!(created.len(), 10, "{created:?}");
    for t in [&task_id, &mcp_task] {
        let changes: Vec<&Value> = seen
            .iter()
            .filter(|e| e.event == "task.status_changed" && e.data["data"]["task"] == t.as_str())
            .map(|e| &e.data["data"]["status"])
            .collect();
        assert_eq!(changes, [&json!("working"), &json!("completed")], "task {t}: one run");
        // The run's partial results (one per archive member) are announced once, too.
        let partials = seen.iter().filter(|e| e.event == "task.partial" && e.data["data"]["task"] == t.as_str()).count();
        assert_eq!(partials, 1, "task {t}: one member, one task.partial");
    }
}

/// Bytes that are not UTF-8, as issue 23 item 6 found them: `ff fe 00 61 62 63`.
const NOT_UTF8: &[u8] = b"\xff\xfe\x00abc";

/// Upload a small finished file whose metadata `filename` is [`NOT_UTF8`] and `note` is text.
async fn non_utf8_upload(api: &Api) -> (String, String) {
    let raw = md(&[("filename", NOT_UTF8), ("note", "héllo".as_bytes())]);
    let r = api.send("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", "3"), ("Upload-Metadata", &raw)], None).await;
    assert_eq!(r.status(), 201);
    let id = id_of(header(&r, "location").unwrap());
    let r = api
        .send("PATCH", &format!("/files/{id}"), &[("Tus-Resumable", "1.0.0"), ("Content-Type", OCTET), ("Upload-Offset", "0")], Some(b"abc".to_vec()))
        .await;
    assert_eq!(r.status(), 204);
    (id, raw)
}

fn want_json() -> Value {
    json!({"filename": {"base64": B64.encode(NOT_UTF8)}, "note": "héllo"})
}

/// The metadata `Upload-Metadata` (as HEAD answers it) decodes to, by key.
fn decoded(raw: &str) -> Vec<(String, Vec<u8>)> {
    raw.split(',')
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once(' ').unwrap_or((p, ""));
            (k.to_string(), B64.decode(v).unwrap())
        })
        .collect()
}

/// Hooks: the pre-create and pre-finish hooks are handed the bytes exactly (`{"base64": …}`),
/// and metadata a pre-create hook answers back is stored exactly as it said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_get_and_give_back_metadata_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let hook = HookServer::start(dir.path());
    let s = server_with(
        dir.path(),
        &format!("[hooks.pre_create]\nurl = \"{}\"\n\n[hooks.pre_finish]\nurl = \"{}\"\n", hook.url("/echo"), hook.url("/pre-finish")),
    );
    let api = Api::with_token(&s, TOKEN);
    let (id, _) = non_utf8_upload(&api).await;
    let calls = hook.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    for c in &calls {
        assert_eq!(c["request"]["upload"]["metadata"], want_json(), "{}: {c}", c["path"]);
    }
    let head = api.send("HEAD", &format!("/files/{id}"), &[("Tus-Resumable", "1.0.0")], None).await;
    let got = decoded(header(&head, "upload-metadata").expect("Upload-Metadata"));
    assert!(got.contains(&("filename".to_string(), NOT_UTF8.to_vec())), "the echoed metadata is stored byte for byte: {got:?}");
    assert!(got.contains(&("note".to_string(), "héllo".as_bytes().to_vec())), "{got:?}");
}

/// REST: `GET /api/v1/files/{id}` (and the list) give the value that is not UTF-8 as
/// `{"base64": …}`, the text as text; no U+FFFD anywhere.
#[tokio::test]
async fn the_rest_file_view_is_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with(dir.path(), "");
    let api = Api::with_token(&s, TOKEN);
    let (id, _) = non_utf8_upload(&api).await;
    let f = json(api.get(&format!("/api/v1/files/{id}")).await).await;
    assert_eq!(f["metadata"], want_json(), "{f}");
    assert!(!f.to_string().contains('\u{fffd}'), "{f}");
    let list = json(api.get("/api/v1/files").await).await;
    assert_eq!(list["files"][0]["metadata"], want_json(), "{list}");
}

/// Pages: a signed link's page reads `GET /share/{id}/info`, the same view.
#[tokio::test]
async fn the_share_page_info_is_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with(dir.path(), "");
    let api = Api::with_token(&s, TOKEN);
    let (id, _) = non_utf8_upload(&api).await;
    let share = json(api.post(&format!("/api/v1/files/{id}/share"), "{}").await).await;
    let page = share["page_url"].as_str().unwrap_or_else(|| panic!("a page link: {share}"));
    let (_, query) = page.split_once('?').expect("a signed query");
    let info = json(client().get(s.url(&format!("/share/{id}/info?{query}"))).send().await.unwrap()).await;
    assert_eq!(info["file"]["metadata"], want_json(), "{info}");
    // The file is complete: an upload link to it could take nothing and is refused, naming
    // the download share instead.
    let p = common::problem(api.post(&format!("/api/v1/files/{id}/share"), r#"{"scope":"upload"}"#).await, 409, "conflict").await;
    assert!(p["recovery_hint"].as_str().unwrap().contains(r#""scope":"download""#), "{p}");
}

/// Events (SSE, and the webhook body, which is the same JSON): the metadata is the decoded
/// map the API and hooks show (issue 48, kind 13), its bytes exact: a value that is not UTF-8
/// as `{"base64": …}` of exactly those bytes.
#[tokio::test]
async fn events_carry_the_metadata_as_the_api_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with(dir.path(), "");
    let api = Api::with_token(&s, TOKEN);
    let events = api.send("GET", "/api/v1/events", &[("accept", "text/event-stream")], None).await;
    let mut events = events.bytes_stream();
    let (id, _raw) = non_utf8_upload(&api).await;
    let seen = read_until(&mut events, |e| e.event == "upload.finished" && e.data["data"]["upload"] == id.as_str()).await;
    for e in seen.iter().filter(|e| e.data["data"]["upload"] == id.as_str()) {
        assert_eq!(e.data["data"]["metadata"], want_json(), "{}: {:?}", e.event, e.data);
    }
}

/// MCP: a file handle never shows a name that is not UTF-8 re-encoded (no U+FFFD); it names
/// the file only when its name is text.
#[tokio::test]
async fn mcp_file_handles_are_never_lossy() {
    let dir = tempfile::tempdir().unwrap();
    let s = server_with(dir.path(), "");
    let api = Api::with_token(&s, TOKEN);
    let (id, _) = non_utf8_upload(&api).await;
    let c = mcp_client(&s).await;
    for (tool, args) in [("file_status", json!({"file_id": id})), ("file_list", json!({}))] {
        let out = call_tool(&c, tool, args).await;
        assert_eq!(out["status"], "ok", "{tool}: {out}");
        assert!(!out.to_string().contains('\u{fffd}'), "{tool}: {out}");
    }
    let _ = c.cancel().await;
}

/// One HTTP/1.1 response read from `r`: (status, lower-cased headers, body by Content-Length;
/// none for an answer to HEAD).
async fn read_response<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R, to_head: bool) -> (u16, std::collections::HashMap<String, String>, Vec<u8>) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut line = String::new();
    r.read_line(&mut line).await.unwrap();
    let status = line.split(' ').nth(1).unwrap_or_else(|| panic!("no status line: {line:?}")).parse().unwrap();
    let mut headers = std::collections::HashMap::new();
    loop {
        line.clear();
        r.read_line(&mut line).await.unwrap();
        let Some((k, v)) = line.trim_end().split_once(':') else { break };
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
    let mut body = vec![0; if to_head { 0 } else { headers.get("content-length").map_or(0, |n| n.parse().unwrap()) }];
    r.read_exact(&mut body).await.unwrap();
    (status, headers, body)
}

/// A PATCH refused from its headers alone (an offset that moved, a body past the upload's
/// length, an upload already complete) is answered before its body arrives: a client that
/// trickles its 32 MiB body (never idle long enough for a server to give up waiting) reads the
/// answer while it has sent almost nothing, then sends the rest, which the server reads and
/// drops, so the connection serves the next request; nothing of the body is stored. (A client
/// that waits for `100 Continue` is not asked for its body at all:
/// `real_clients.rs::curl_is_not_asked_for_a_body_that_is_refused`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_refused_from_its_headers_is_answered_before_its_body() {
    use tokio::io::AsyncWriteExt;
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(1000).await;
    let done = t.create(3).await;
    assert_eq!(t.patch(&done, 0, b"abc".to_vec(), &[]).await.status(), 204);
    const LEN: usize = 32 << 20;
    let stream = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    let (rd, mut wr) = stream.into_split();
    let mut rd = tokio::io::BufReader::new(rd);
    for (what, target, offset, status) in
        [("an offset that moved", &url, 7, 409), ("past the length", &url, 0, 413), ("a complete upload", &done, 3, 413)]
    {
        let path = target.strip_prefix(&s.base).unwrap().to_string();
        let head = format!(
            "PATCH {path} HTTP/1.1\r\nHost: {}\r\nTus-Resumable: 1.0.0\r\nContent-Type: \
             {OCTET}\r\nUpload-Offset: {offset}\r\nContent-Length: {LEN}\r\n\r\n",
            s.addr()
        );
        wr.write_all(head.as_bytes()).await.unwrap();
        // The body trickles (1 KiB every 100 ms) until the answer is read, then the rest goes.
        let answered = tokio_util::sync::CancellationToken::new();
        let sender = {
            let answered = answered.clone();
            tokio::spawn(async move {
                let mut sent = 0;
                while sent < LEN && !answered.is_cancelled() {
                    wr.write_all(&[b'x'; 1024]).await.unwrap();
                    sent += 1024;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                wr.write_all(&vec![b'x'; LEN - sent]).await.unwrap();
                (wr, sent)
            })
        };
        // A hang guard, not a timing check: a server that waits for the body never answers here.
        let (code, h, problem) = tokio::time::timeout(std::time::Duration::from_secs(120), read_response(&mut rd, false))
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer before the body"));
        answered.cancel();
        assert_eq!(code, status, "{what}: {}", String::from_utf8_lossy(&problem));
        let expected_offset = if target == &done { "3" } else { "0" };
        if status == 409 {
            assert_eq!(h.get("upload-offset").map(String::as_str), Some(expected_offset), "{what}: the answer names the offset to resume from");
        }
        let (back, trickled) = sender.await.unwrap();
        wr = back;
        assert!(trickled < LEN, "{what}: answered only after the whole body");
        wr.write_all(format!("HEAD {path} HTTP/1.1\r\nHost: {}\r\nTus-Resumable: 1.0.0\r\n\r\n", s.addr()).as_bytes()).await.unwrap();
        let (code, h, _) = read_response(&mut rd, true).await;
        assert_eq!((code, h.get("upload-offset").map(String::as_str)), (200, Some(expected_offset)), "{what}: nothing of the body was kept");
    }
    assert_eq!(t.download(&done).await, b"abc");
}
