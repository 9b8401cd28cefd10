//! The MCP server through the rmcp 3.11 client (Rust), over stdio and Streamable HTTP, against
//! the real binary: export by handle, receive by signed URL, native tasks (SEP-2663) answered
//! from the durable store (also after a restart), input requests as elicitation forms.
//!
//! Every tool result these tests see is validated against the `outputSchema` its tool declares
//! in `tools/list` (issue 9, item 1): success, each error, restarts, input requests, terminal
//! states.

mod common;

use std::time::Duration;

use common::{sha256_hex, write_file, write_script, Api, Server};
use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

type Client = RunningService<RoleClient, ClientConfig>;

fn client_info(tasks: bool) -> ClientConfig {
    let caps = if tasks { ClientCapabilities::builder().enable_tasks().build() } else { ClientCapabilities::default() };
    ClientConfig::new(caps, Implementation::new("ferry-tests", "0"))
}

async fn http_client(server: &Server, token: Option<&str>, tasks: bool) -> Client {
    let mut cfg = StreamableHttpClientTransportConfig::with_uri(server.url("/mcp"));
    if let Some(t) = token {
        cfg = cfg.auth_header(t.to_string());
    }
    client_info(tasks).serve(StreamableHttpClientTransport::from_config(cfg)).await.expect("MCP over HTTP connects")
}

/// `ferry serve --stdio` as a child process of the client, on a fresh data dir.
async fn stdio_client(data: &std::path::Path, tasks: bool) -> Client {
    let mut cmd = tokio::process::Command::new(common::ferry_bin());
    cmd.args(["serve", "--stdio", "--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .env("RUST_LOG", "warn")
        .env_remove("FERRY_LISTEN")
        .env(common::TEST_MIN_FREE_SPACE.0, common::TEST_MIN_FREE_SPACE.1);
    let transport = TokioChildProcess::new(cmd).expect("spawn ferry --stdio");
    client_info(tasks).serve(transport).await.expect("MCP over stdio connects")
}

/// Assert that `structured` validates against the `outputSchema` tool `name` declares.
async fn assert_valid(c: &Client, name: &str, structured: &Value) {
    let tools = c.list_all_tools().await.expect("tools/list");
    let tool = tools.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no tool {name}"));
    let schema = Value::Object(tool.output_schema.as_deref().cloned().unwrap_or_else(|| panic!("{name} has no outputSchema")));
    let validator = jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{name}: its outputSchema is not a valid JSON Schema: {e}"));
    let errors: Vec<String> = validator.iter_errors(structured).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "{name}: result does not match its outputSchema: {errors:?}\nresult: {structured}");
}

/// Call a tool and return (structuredContent, isError, content); the result must validate
/// against the tool's outputSchema.
async fn call(c: &Client, name: &str, args: Value) -> (Value, bool, Vec<ContentBlock>) {
    let Value::Object(a) = args else { panic!("args must be an object") };
    let r = c.call_tool(CallToolRequestParams::new(name.to_string()).with_arguments(a)).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_valid(c, name, r.structured_content.as_ref().expect("every result has structuredContent")).await;
    let text = r.content.first().and_then(|b| b.as_text()).map(|t| t.text.clone()).unwrap_or_default();
    let structured = r.structured_content.clone().expect("every result has structuredContent");
    assert_eq!(serde_json::from_str::<Value>(&text).ok(), Some(structured.clone()), "text content mirrors structuredContent");
    (structured, r.is_error == Some(true), r.content)
}

async fn ok(c: &Client, name: &str, args: Value) -> Value {
    let (v, err, _) = call(c, name, args).await;
    assert!(!err, "{name} failed: {v}");
    v
}

/// Upload `data` to the signed URL `file_upload_begin` returns, with plain reqwest and no token.
async fn upload_by_url(c: &Client, name: &str, data: &[u8]) -> String {
    let begin = ok(c, "file_upload_begin", json!({ "name": name, "size": data.len(), "media_type": "text/plain" })).await;
    // The one result above 1 KiB: it carries two ready shell lines (`curl`, `curl_resume`).
    assert!(begin.to_string().len() < 1536, "small result: {begin}");
    let url = begin["upload_url"].as_str().unwrap();
    assert!(url.contains("scope=upload") && url.contains("sig="), "{url}");
    // The request-a-file page for a person carries the same signature (tests/web_pages.rs).
    assert_eq!(begin["page_url"].as_str(), Some(url.replacen("/files/", "/share/", 1).as_str()), "{begin}");
    let r = reqwest::Client::new()
        .patch(url)
        .header("Tus-Resumable", "1.0.0")
        .header("Upload-Offset", "0")
        .header("Content-Type", "application/offset+octet-stream")
        .body(data.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204, "PATCH to the signed URL");
    begin["file"]["id"].as_str().unwrap().to_string()
}

/// Poll a native task with `tasks/get` until it is terminal or needs input.
async fn poll_native(c: &Client, id: &str) -> DetailedTask {
    for _ in 0..600 {
        let t = c.peer().get_task(GetTaskParams::new(id.to_string())).await.expect("tasks/get").task;
        if t.status() != TaskStatus::Working {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("task {id} still working after 30 s");
}

/// The export scenario: archive an uploaded file as a native task, then fetch the archive by
/// its signed URL and check its sha256.
async fn export_as_native_task(c: &Client) {
    let data = common::pseudo_random(300_000, 7);
    let src = upload_by_url(c, "src.txt", &data).await;
    let status = ok(c, "file_status", json!({ "file_id": src })).await;
    assert_eq!(status["file"]["sha256"], sha256_hex(&data));
    assert_eq!(status["file"]["complete"], true);

    let args = json!({ "file_ids": [src], "format": "tar" });
    let Value::Object(a) = args else { unreachable!() };
    let created = match c.peer().call_tool_once(CallToolRequestParams::new("archive_files").with_arguments(a)).await.unwrap() {
        CallToolResponse::Task(t) => t,
        other => panic!("expected a CreateTaskResult, got {other:?}"),
    };
    assert_eq!(created.task.poll_interval_ms, Some(1000));
    let done = poll_native(c, &created.task.task_id).await;
    let TaskPayload::Completed { result } = done.payload else { panic!("not completed: {done:?}") };
    let result: CallToolResult = serde_json::from_value(Value::Object(result)).unwrap();
    let v = result.structured_content.unwrap();
    assert_valid(c, "archive_files", &v).await;
    assert_eq!(v["status"], "completed");
    let url = v["download_url"].as_str().unwrap();
    assert!(result
        .content
        .iter()
        .any(|b| matches!(b, ContentBlock::ResourceLink(r) if r.uri == format!("ferry://files/{}", v["file"]["id"].as_str().unwrap()))));
    let body = reqwest::get(url).await.unwrap();
    assert_eq!(body.status(), 200);
    let bytes = body.bytes().await.unwrap();
    assert_eq!(sha256_hex(&bytes), v["file"]["sha256"].as_str().unwrap());
    assert_eq!(bytes.len() as u64, v["file"]["size"].as_u64().unwrap());
    // The tar holds the source bytes after its 512-byte header.
    assert_eq!(&bytes[512..512 + data.len()], &data[..]);
}

#[tokio::test]
async fn export_and_receive_over_http_with_native_tasks() {
    let server = Server::start(&[]);
    let c = http_client(&server, None, true).await;
    let tools = c.list_all_tools().await.unwrap();
    let envelope = json!({ "status": "failed", "error": { "code": "offset_mismatch", "message": "expected offset 131072, got 0", "retryable": true,
        "recoveryHint": "Re-send this chunk starting at offset 131072.", "partial": { "cursor": 131072 } } });
    for t in &tools {
        let schema = Value::Object(t.output_schema.as_deref().cloned().unwrap_or_else(|| panic!("{} has no outputSchema", t.name)));
        assert_eq!(schema["type"], "object", "{}: MCP requires an object schema", t.name);
        let v = jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{}: invalid outputSchema: {e}", t.name));
        assert!(v.is_valid(&envelope), "{} schema admits the failure envelope", t.name);
        assert!(
            !v.is_valid(&json!({ "status": "failed", "error": { "code": "no_such_code", "message": "m", "retryable": true, "recoveryHint": "h" } })),
            "{}: unknown codes are refused",
            t.name
        );
        assert!(t.annotations.is_some(), "{} has annotations", t.name);
    }
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for n in [
        "file_upload_begin",
        "file_upload_chunk",
        "file_status",
        "file_download_url",
        "file_read_chunk",
        "file_list",
        "file_delete",
        "task_get",
        "task_respond",
        "task_cancel",
        "task_list",
        "archive_files",
        "compress_file",
        "fetch_url",
    ] {
        assert!(names.contains(&n), "missing tool {n}");
    }
    let delete = tools.iter().find(|t| t.name == "file_delete").unwrap().annotations.clone().unwrap();
    assert_eq!((delete.destructive_hint, delete.read_only_hint), (Some(true), Some(false)));
    export_as_native_task(&c).await;
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn export_and_receive_over_stdio_with_native_tasks() {
    let tmp = tempfile::tempdir().unwrap();
    let c = stdio_client(&tmp.path().join("data"), true).await;
    export_as_native_task(&c).await;
    // In-band chunks for clients without HTTP.
    let begin = ok(&c, "file_upload_begin", json!({ "name": "b.txt", "size": 11 })).await;
    let id = begin["file"]["id"].as_str().unwrap();
    ok(&c, "file_upload_chunk", json!({ "file_id": id, "offset": 0, "data": "aGVsbG8g" })).await;
    let (bad, err, _) = call(&c, "file_upload_chunk", json!({ "file_id": id, "offset": 0, "data": "d29ybGQ=" })).await;
    assert!(err);
    assert_eq!(bad["error"]["code"], "offset_mismatch");
    assert_eq!(bad["error"]["partial"]["cursor"], 6);
    let done = ok(&c, "file_upload_chunk", json!({ "file_id": id, "offset": 6, "data": "d29ybGQ=" })).await;
    assert_eq!(done["file"]["sha256"], sha256_hex(b"hello world"));
    let read = ok(&c, "file_read_chunk", json!({ "file_id": id, "offset": 6 })).await;
    assert_eq!((read["data"].as_str(), read["eof"].as_bool()), (Some("world"), Some(true)));
    let res = c.read_resource(ReadResourceRequestParams::new(format!("ferry://files/{id}"))).await.unwrap();
    match &res.contents[0] {
        ResourceContents::TextResourceContents { text, .. } => assert_eq!(text, "hello world"),
        other => panic!("expected text, got {other:?}"),
    }
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn a_task_started_over_mcp_survives_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    // Honours FERRY_CHECKPOINT as a resumable program must: the kill may land before or after
    // checkpoint `one` commits, and the file holds each part once either way.
    let script = write_script(
        tmp.path(),
        "slow.sh",
        "if [ \"$FERRY_CHECKPOINT\" != one ]; then printf 'part one\\n'; echo 'checkpoint 9 one' >&2; fi\nsleep 2\nprintf 'part two\\n'\n",
    );
    let cfg =
        write_file(tmp.path(), "ferry.toml", &format!("[commands.report]\nprogram = \"{}\"\ndescription = \"a slow report\"\n", script.display()));
    let mut server = Server::start(&["--config", cfg.to_str().unwrap(), "--task-lease", "1s"]);
    let c = http_client(&server, None, false).await;
    let started = ok(&c, "export_report", json!({ "idempotency_key": "r1" })).await;
    assert_eq!((started["status"].as_str(), started["poll_with"].as_str()), (Some("working"), Some("task_get")));
    assert!(started["poll_after_ms"].as_u64().is_some());
    let id = started["task_id"].as_str().unwrap().to_string();
    drop(c);
    server.kill9();
    server.restart();
    let c = http_client(&server, None, true).await;
    let got = ok(&c, "task_get", json!({ "task_id": id, "wait_ms": 20000 })).await;
    assert_eq!(got["status"], "completed", "{got}");
    let url = got["download_url"].as_str().unwrap();
    assert_eq!(reqwest::get(url).await.unwrap().text().await.unwrap(), "part one\npart two\n");
    // The same task through the native tasks API, and the same key joins it.
    let native = c.peer().get_task(GetTaskParams::new(id.clone())).await.unwrap().task;
    assert_eq!(native.status(), TaskStatus::Completed);
    let Value::Object(a) = json!({ "idempotency_key": "r1" }) else { unreachable!() };
    match c.peer().call_tool_once(CallToolRequestParams::new("export_report").with_arguments(a)).await.unwrap() {
        CallToolResponse::Task(t) => assert_eq!(t.task.task_id, id, "the same key joins the same task"),
        other => panic!("expected a task, got {other:?}"),
    }
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn input_requests_are_elicitation_forms_and_answers_resume_the_task() {
    let tmp = tempfile::tempdir().unwrap();
    let script = write_script(
        tmp.path(),
        "ask.sh",
        "if [ -z \"$FERRY_INPUT_TITLE\" ]; then echo 'input title {\"message\":\"Title of the report?\"}' \
         >&2; exit 0; fi\nprintf 'title=%s\\n' \"$FERRY_INPUT_TITLE\"\n",
    );
    let cfg = write_file(tmp.path(), "ferry.toml", &format!("[commands.ask]\nprogram = \"{}\"\n", script.display()));
    let server = Server::start(&["--config", cfg.to_str().unwrap()]);
    let c = http_client(&server, None, true).await;
    let created = match c.peer().call_tool_once(CallToolRequestParams::new("export_ask")).await.unwrap() {
        CallToolResponse::Task(t) => t.task.task_id,
        other => panic!("expected a task, got {other:?}"),
    };
    let t = poll_native(&c, &created).await;
    let TaskPayload::InputRequired { input_requests } = t.payload else { panic!("expected input_required: {t:?}") };
    let req = serde_json::to_value(&input_requests["title"]).unwrap();
    assert_eq!(req["method"], "elicitation/create");
    assert_eq!(req["params"]["message"], "Title of the report?");
    assert!(req["params"]["requestedSchema"]["properties"]["answer"].is_object(), "{req}");
    // The facade shows the same question.
    let facade = ok(&c, "task_get", json!({ "task_id": created })).await;
    assert_eq!(facade["status"], "input_required");
    assert_eq!(facade["input_requests"]["title"]["message"], "Title of the report?");

    let answers = [("title".to_string(), json!({ "action": "accept", "content": { "answer": "Q3" } }))].into_iter().collect();
    c.peer().update_task(UpdateTaskParams::new(created.clone(), answers)).await.unwrap();
    let t = poll_native(&c, &created).await;
    let TaskPayload::Completed { result } = t.payload else { panic!("expected completed: {t:?}") };
    let url = result["structuredContent"]["download_url"].as_str().unwrap();
    assert_eq!(reqwest::get(url).await.unwrap().text().await.unwrap(), "title=\"Q3\"\n", "FERRY_INPUT_TITLE carries the JSON answer");
    c.cancel().await.unwrap();
}

#[tokio::test]
async fn principals_are_isolated_and_signed_urls_open_one_file() {
    let tmp = tempfile::tempdir().unwrap();
    let (alice, bob) = ("fy_alice_token_for_tests", "fy_bob_token_for_tests");
    let toml = format!(
        "[[tokens]]\nprincipal = \"alice\"\nsha256 = \"{}\"\n[[tokens]]\nprincipal = \"bob\"\nsha256 = \"{}\"\n",
        sha256_hex(alice.as_bytes()),
        sha256_hex(bob.as_bytes())
    );
    let cfg = write_file(tmp.path(), "ferry.toml", &toml);
    let server = Server::start(&["--config", cfg.to_str().unwrap()]);
    // No token: 401 before MCP is reached.
    let r = reqwest::Client::new().post(server.url("/mcp")).header("content-type", "application/json").body("{}").send().await.unwrap();
    common::problem(r, 401, "unauthorized").await;

    let a = http_client(&server, Some(alice), false).await;
    let b = http_client(&server, Some(bob), false).await;
    let fa = upload_by_url(&a, "a.txt", b"alice's bytes").await;
    let fb = upload_by_url(&b, "b.txt", b"bob's bytes").await;
    let task = ok(&a, "archive_files", json!({ "file_ids": [fa] })).await["task_id"].as_str().unwrap().to_string();
    for (tool, args) in [
        ("file_status", json!({ "file_id": fa })),
        ("file_delete", json!({ "file_id": fa })),
        ("task_get", json!({ "task_id": task })),
        ("task_cancel", json!({ "task_id": task })),
    ] {
        let (v, err, _) = call(&b, tool, args).await;
        assert!(err && v["error"]["code"] == "not_found", "bob {tool}: {v}");
    }
    // Refused at the call, as for an id nobody has: nothing of alice's file shows.
    let (t, err, _) = call(&b, "archive_files", json!({ "file_ids": [fa] })).await;
    assert!(err && t["status"] == "failed" && t["error"]["code"] == "not_found", "bob cannot archive alice's file: {t}");
    assert!(!t["error"]["message"].as_str().unwrap().contains("alice"), "{t}");

    let dl = ok(&a, "file_download_url", json!({ "file_id": fa })).await;
    let url = dl["download_url"].as_str().unwrap().to_string();
    assert_eq!(dl["page_url"].as_str(), Some(url.replacen("/files/", "/share/", 1).as_str()), "{dl}");
    assert_eq!(reqwest::get(&url).await.unwrap().text().await.unwrap(), "alice's bytes");
    // The same signature on bob's file id does not open it.
    let forged = url.replace(&fa, &fb);
    common::problem(reqwest::get(&forged).await.unwrap(), 403, "unauthorized").await;
    // An upload-scope URL does not download (a file with bytes still to come: a complete
    // one gets no upload link).
    let api = Api::with_token(&server, alice);
    let r = api.send("POST", "/files/", &[("tus-resumable", "1.0.0"), ("upload-length", "10")], None).await;
    assert_eq!(r.status(), 201);
    let open = r.headers()["location"].to_str().unwrap().rsplit('/').next().unwrap().to_string();
    let up = common::json(api.post(&format!("/api/v1/files/{open}/share"), r#"{"scope":"upload"}"#).await).await["url"].as_str().unwrap().to_string();
    common::problem(reqwest::get(&up).await.unwrap(), 403, "unauthorized").await;
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
}

/// A client that records `notifications/progress`.
#[derive(Clone, Default)]
struct ProgressRecorder(std::sync::Arc<std::sync::Mutex<Vec<ProgressNotificationParam>>>);

impl rmcp::ClientHandler for ProgressRecorder {
    async fn on_progress(&self, params: ProgressNotificationParam, _ctx: rmcp::service::NotificationContext<RoleClient>) {
        self.0.lock().unwrap().push(params);
    }

    fn get_info(&self) -> ClientConfig {
        client_info(false)
    }
}

#[tokio::test]
async fn task_get_long_polls_and_reports_progress() {
    let tmp = tempfile::tempdir().unwrap();
    let script = write_script(
        tmp.path(),
        "steps.sh",
        "for i in 1 2 3 4; do echo \"progress 0.$((i*2)) step $i\" >&2; printf 'line %s\\n' $i; sleep 0.4; done\n",
    );
    let cfg = write_file(tmp.path(), "ferry.toml", &format!("[commands.steps]\nprogram = \"{}\"\n", script.display()));
    let server = Server::start(&["--config", cfg.to_str().unwrap()]);
    let recorder = ProgressRecorder::default();
    let transport = StreamableHttpClientTransport::from_config(StreamableHttpClientTransportConfig::with_uri(server.url("/mcp")));
    let c = recorder.clone().serve(transport).await.unwrap();
    let Value::Object(a) = json!({}) else { unreachable!() };
    let started = c.call_tool(CallToolRequestParams::new("export_steps").with_arguments(a)).await.unwrap();
    let id = started.structured_content.unwrap()["task_id"].as_str().unwrap().to_string();
    let Value::Object(a) = json!({ "task_id": id, "wait_ms": 30000 }) else { unreachable!() };
    let mut params = CallToolRequestParams::new("task_get").with_arguments(a);
    params.set_progress_token(ProgressToken(NumberOrString::String("poll-1".into())));
    let done = c.call_tool(params).await.unwrap().structured_content.unwrap();
    let tools = c.list_all_tools().await.unwrap();
    let schema = Value::Object(tools.iter().find(|t| t.name == "task_get").unwrap().output_schema.as_deref().cloned().unwrap());
    assert!(jsonschema::is_valid(&schema, &done), "task_get result matches its outputSchema: {done}");
    assert_eq!(done["status"], "completed", "the long poll returns when the task ends: {done}");
    let seen = recorder.0.lock().unwrap().clone();
    assert!(!seen.is_empty(), "progress notifications were sent");
    assert!(seen.iter().all(|p| p.progress_token == seen[0].progress_token), "one token: {seen:?}");
    assert!(seen.iter().any(|p| p.message.as_deref().is_some_and(|m| m.starts_with("step "))), "the job's progress messages come through: {seen:?}");
    let values: Vec<f64> = seen.iter().map(|p| p.progress).collect();
    assert!(seen.iter().all(|p| p.total == Some(1.0) && (0.0..=1.0).contains(&p.progress)), "progress is a fraction of 1: {seen:?}");
    assert!(values.windows(2).all(|w| w[0] <= w[1]), "progress never goes back: {values:?}");
    c.cancel().await.unwrap();
}

/// Issue 9, item 1, the exact input: a job tool started with an `idempotency_key`, cancelled,
/// then called again with the same key. The new run names the prior one in `prior_failure`
/// (a task id, as REST shows it) and every result — started, cancelled, restarted — validates
/// against the tool's outputSchema (`call` checks), over the facade and as a native task.
#[tokio::test]
async fn a_restart_after_cancel_matches_the_output_schema() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_file(tmp.path(), "ferry.toml", "[commands.slow]\nprogram = \"/bin/sh\"\nargs = [\"-c\", \"printf partial; exec sleep 30\"]\n");
    let server = Server::start(&["--config", cfg.to_str().unwrap()]);
    let c = http_client(&server, None, false).await;
    let first = ok(&c, "export_slow", json!({ "idempotency_key": "k1" })).await;
    let first_id = first["task_id"].as_str().unwrap().to_string();
    let cancelled = ok(&c, "task_cancel", json!({ "task_id": first_id })).await;
    assert_eq!(cancelled["status"], "cancelled");
    let (got, err, _) = call(&c, "task_get", json!({ "task_id": first_id })).await;
    assert!(err && got["status"] == "cancelled" && got["error"]["code"] == "cancelled", "{got}");
    let again = ok(&c, "export_slow", json!({ "idempotency_key": "k1" })).await;
    assert_ne!(again["task_id"], first["task_id"], "a new run: {again}");
    assert_eq!(again["prior_failure"], first_id.as_str(), "names the cancelled run: {again}");
    // REST shows the same prior_failure.
    let rest = Api::new(&server).task(again["task_id"].as_str().unwrap()).await;
    assert_eq!(rest["prior_failure"], again["prior_failure"]);
    ok(&c, "task_cancel", json!({ "task_id": again["task_id"] })).await;
    // The same with the native tasks extension: the restarted task's view validates too.
    let n = http_client(&server, None, true).await;
    let Value::Object(a) = json!({ "idempotency_key": "k1" }) else { unreachable!() };
    let created = match n.peer().call_tool_once(CallToolRequestParams::new("export_slow").with_arguments(a)).await.unwrap() {
        CallToolResponse::Task(t) => t.task.task_id,
        other => panic!("expected a task, got {other:?}"),
    };
    let (v, _, _) = call(&n, "task_get", json!({ "task_id": created })).await;
    assert_eq!(v["prior_failure"], again["task_id"], "{v}");
    let (v, _, _) = call(&n, "task_cancel", json!({ "task_id": created })).await;
    assert_eq!(v["status"], "cancelled");
    c.cancel().await.unwrap();
    n.cancel().await.unwrap();
}

/// Issue 9, item 2: one view of a file and one of "a file a task produced". An upload with
/// `filename a.png, mimetype image/png` has the same media type in REST file info, in the
/// download's Content-Type and in MCP handles; an `external` task completed over REST with
/// that file gives MCP `task_get` the same handle and a signed download URL, as built-in kinds
/// do.
#[tokio::test]
async fn one_file_view_and_one_task_result_view_for_rest_mcp_and_downloads() {
    use base64::Engine as _;
    let server = Server::start(&[]);
    let api = Api::new(&server);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let data = b"\x89PNG not really".to_vec();
    let md = format!("filename {},mimetype {}", b64("a.png"), b64("image/png"));
    let len = data.len().to_string();
    let r = api.send("POST", "/files/", &[("Tus-Resumable", "1.0.0"), ("Upload-Length", &len), ("Upload-Metadata", &md)], None).await;
    assert_eq!(r.status(), 201);
    let id = common::header(&r, "location").unwrap().rsplit('/').next().unwrap().to_string();
    let off = [("Tus-Resumable", "1.0.0"), ("Content-Type", "application/offset+octet-stream"), ("Upload-Offset", "0")];
    assert_eq!(api.send("PATCH", &format!("/files/{id}"), &off, Some(data.clone())).await.status(), 204);

    let info = api.file(&id).await;
    let dl = api.get(&format!("/files/{id}")).await;
    assert_eq!(dl.status(), 200);
    assert_eq!(info["media_type"], "image/png", "{info}");
    assert_eq!(common::header(&dl, "content-type"), info["media_type"].as_str(), "REST info and the download agree");
    assert_eq!(info["name"], "a.png");
    assert!(common::header(&dl, "content-disposition").unwrap().contains("a.png"));

    let c = http_client(&server, None, false).await;
    let status = ok(&c, "file_status", json!({ "file_id": id })).await;
    assert_eq!((&status["file"]["media_type"], &status["file"]["name"]), (&info["media_type"], &info["name"]));
    let listed = ok(&c, "file_list", json!({})).await;
    assert_eq!(listed["files"][0], status["file"]);

    // An external task completed with the file over REST.
    let tid = api.start("external", "{}").await["id"].as_str().unwrap().to_string();
    let r = api.post(&format!("/api/v1/tasks/{tid}/complete"), &format!(r#"{{"result":{{"rows":3}},"files":["{id}"]}}"#)).await;
    assert_eq!(r.status(), 200);
    let rest = api.task(&tid).await;
    let stored = &rest["result"]["files"][0];
    let got = ok(&c, "task_get", json!({ "task_id": tid })).await;
    assert_eq!(got["status"], "completed");
    for k in ["id", "name", "media_type", "size", "sha256"] {
        assert_eq!(got["file"][k], stored[k], "{k}: MCP {got} REST {rest}");
    }
    assert_eq!(got["result"], json!({ "rows": 3 }), "the producer's own result: {got}");
    let url = got["download_url"].as_str().expect("a signed download URL, as for built-in kinds");
    let bytes = reqwest::get(url).await.unwrap().bytes().await.unwrap();
    assert_eq!(&bytes[..], &data[..]);
    c.cancel().await.unwrap();
}

/// Issue 9, item 2: one allow-list check. REST `POST /api/v1/tasks` kind `fetch` and MCP
/// `fetch_url` accept and refuse the same URLs with the same code: ports, IPv6 literals,
/// uppercase hosts, userinfo tricks.
#[tokio::test]
async fn rest_and_mcp_fetch_the_same_urls() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_file(
        tmp.path(),
        "ferry.toml",
        "[fetch]\nallow_hosts = [\"allowed.invalid\", \"ported.invalid:8080\", \"[::1]:9\", \"127.0.0.1:80\"]\n",
    );
    let server = Server::start(&["--config", cfg.to_str().unwrap()]);
    let api = Api::new(&server);
    let c = http_client(&server, None, false).await;
    let cases: &[(&str, Option<&str>)] = &[
        ("http://allowed.invalid/x", None),
        ("http://ALLOWED.invalid:1234/x", None),
        ("http://user:pw@allowed.invalid/x", None),
        ("http://ported.invalid:8080/x", None),
        ("http://ported.invalid/x", Some("unauthorized")),
        ("http://ported.invalid:8081/x", Some("unauthorized")),
        ("http://[::1]:9/x", None),
        ("http://[0:0:0:0:0:0:0:1]:9/x", None),
        ("http://[::1]:10/x", Some("unauthorized")),
        ("http://127.0.0.1/x", None),
        ("http://127.0.0.1:80/x", None),
        ("http://127.0.0.1:81/x", Some("unauthorized")),
        ("http://allowed.invalid@evil.invalid/x", Some("unauthorized")),
        ("http://allowed.invalid:80@evil.invalid/x", Some("unauthorized")),
        ("http://evil.invalid#@allowed.invalid/", Some("unauthorized")),
        ("http://allowed.invalid.evil.invalid/", Some("unauthorized")),
        ("https://allowed.invalid/x", None),
        ("https://ported.invalid/x", Some("unauthorized")),
        ("ftp://allowed.invalid/x", Some("invalid_argument")),
        ("not a url", Some("invalid_argument")),
    ];
    for (url, want) in cases {
        let args = json!({ "url": url }).to_string();
        let r = api.start_raw("fetch", &args, None, None).await;
        let rest_code = if r.status().is_success() { None } else { Some(common::json(r).await["code"].as_str().unwrap().to_string()) };
        let (v, err, _) = call(&c, "fetch_url", json!({ "url": url })).await;
        let mcp_code = err.then(|| v["error"]["code"].as_str().unwrap().to_string());
        assert_eq!(rest_code.as_deref(), *want, "REST {url}");
        assert_eq!(mcp_code.as_deref(), *want, "MCP {url}: {v}");
    }
    c.cancel().await.unwrap();
}

/// `file_upload_begin`'s `sha256` is checked against its inputSchema (64 hex digits) before
/// anything runs: hex of the wrong length and non-hex are both `invalid_argument` naming
/// `arguments/sha256` (issue 23, kind 3).
#[tokio::test]
async fn a_declared_sha256_is_checked_as_tus_checks_it() {
    let server = Server::start(&[]);
    let c = http_client(&server, None, false).await;
    for (sha, detail) in [("ab".repeat(31), "arguments/sha256"), ("zz".repeat(32), "arguments/sha256")] {
        let (v, err, _) = call(&c, "file_upload_begin", json!({ "name": "a.txt", "size": 1, "sha256": sha })).await;
        assert!(err, "{v}");
        assert_eq!(v["error"]["code"], "invalid_argument", "{v}");
        assert!(v["error"]["message"].as_str().unwrap_or("").contains(detail), "{v}");
    }
    // A media_type that is none is refused rather than stored as application/octet-stream.
    let (v, err, _) = call(&c, "file_upload_begin", json!({ "name": "a.txt", "size": 1, "media_type": "not a type" })).await;
    assert!(err && v["error"]["code"] == "invalid_argument" && v["error"]["retryable"] == false, "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("not a media type"), "{v}");
    let (v, err, _) = call(&c, "file_upload_begin", json!({ "name": "a.txt", "size": 1, "media_type": "text/csv; charset=utf-8" })).await;
    assert!(!err, "{v}");
    c.cancel().await.unwrap();
}

/// An upload created over the IETF resumable-upload draft (issue 15) is an ordinary file for
/// MCP: `file_status` shows it complete, with its size and sha256.
#[tokio::test]
async fn a_draft_upload_is_visible_to_file_status() {
    let server = Server::start(&[]);
    let api = Api::new(&server);
    let data = common::pseudo_random(200_000, 15);
    let r = api.send("POST", "/files/", &[("Upload-Draft-Interop-Version", "8"), ("Upload-Complete", "?0")], Some(data[..50_000].to_vec())).await;
    assert_eq!(r.status(), 201);
    let id = common::header(&r, "location").unwrap().rsplit('/').next().unwrap().to_string();
    let h = [
        ("Upload-Draft-Interop-Version", "8"),
        ("Content-Type", "application/partial-upload"),
        ("Upload-Offset", "50000"),
        ("Upload-Complete", "?1"),
    ];
    assert_eq!(api.send("PATCH", &format!("/files/{id}"), &h, Some(data[50_000..].to_vec())).await.status(), 200);
    let c = http_client(&server, None, false).await;
    let status = ok(&c, "file_status", json!({ "file_id": id })).await;
    assert_eq!(status["file"]["sha256"], sha256_hex(&data), "{status}");
    assert_eq!(status["file"]["size"], 200_000, "{status}");
}

/// Issue 23 kind 12: `file_request` asks a person for a file of any size in one call: its
/// `page_url` opens a page that says "any size" (deferred length behind it), and a file of a
/// size nobody declared before goes in through the same request (its signed `upload_url`,
/// as the page sends it: `Upload-Length` on the first PATCH) and arrives under the name.
/// Bad arguments make nothing.
#[tokio::test]
async fn file_request_makes_a_page_link_for_a_file_of_any_size() {
    let server = Server::start(&[]);
    let c = http_client(&server, None, false).await;
    let tools = c.list_all_tools().await.unwrap();
    let t = tools.iter().find(|t| t.name == "file_request").expect("a file_request tool");
    assert_eq!(t.annotations.as_ref().unwrap().read_only_hint, Some(false));
    let r = ok(&c, "file_request", json!({ "name": "signed-contract.pdf", "ttl_ms": 3_600_000 })).await;
    let id = r["file"]["id"].as_str().unwrap().to_string();
    assert!(r["file"]["size"].is_null(), "{r}");
    let page = r["page_url"].as_str().expect("a page_url");
    assert!(page.starts_with(&server.url(&format!("/share/{id}?scope=upload&expires="))), "{page}");
    let (path, query) = page.split_once('?').unwrap();
    let info: Value = common::client().get(format!("{path}/info?{query}")).send().await.unwrap().json().await.unwrap();
    assert_eq!(info["scope"], "upload", "{info}");
    assert!(info["file"]["size"].is_null(), "the page asks for any size: {info}");
    assert_eq!(info["file"]["name"], "signed-contract.pdf");
    // The person's file, 123457 bytes, sent as the page sends it.
    let data = common::pseudo_random(123_457, 9);
    let url = r["upload_url"].as_str().unwrap();
    let res = common::client()
        .patch(url)
        .header("tus-resumable", "1.0.0")
        .header("content-type", "application/offset+octet-stream")
        .header("upload-offset", "0")
        .header("upload-length", data.len().to_string())
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    let status = ok(&c, "file_status", json!({ "file_id": id })).await;
    assert_eq!((status["file"]["size"].as_u64(), status["file"]["sha256"].as_str()), (Some(123_457), Some(sha256_hex(&data).as_str())), "{status}");
    assert_eq!(status["file"]["media_type"], "application/pdf", "guessed from the name: {status}");
    // A refused call leaves no upload behind.
    let before = Api::new(&server).get("/api/v1/files").await.json::<Value>().await.unwrap()["files"].as_array().unwrap().len();
    for bad in [json!({ "name": "" }), json!({ "name": "x", "ttl_ms": 0 }), json!({ "name": "x", "size": 5 })] {
        let (v, err, _) = call(&c, "file_request", bad.clone()).await;
        assert!(err && v["error"]["code"] == "invalid_argument", "{bad}: {v}");
    }
    let after = Api::new(&server).get("/api/v1/files").await.json::<Value>().await.unwrap()["files"].as_array().unwrap().len();
    assert_eq!(before, after, "refused requests made no upload");
    c.cancel().await.unwrap();
}

/// Issue 23 kind 17: a client closing its legacy session (`DELETE /mcp`) gets `204`, which the
/// Python SDK accepts (it logged "Session termination failed: 202" on every close).
#[tokio::test]
async fn closing_a_session_answers_204() {
    let server = Server::start(&[]);
    let init = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "ferry-tests", "version": "0" } } });
    let r = common::client()
        .post(server.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let session = common::header(&r, "mcp-session-id").expect("a legacy session").to_string();
    let _ = r.bytes().await;
    let closed = common::client()
        .delete(server.url("/mcp"))
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 204, "{:?}", closed.text().await);
}

/// Issue 23 kind 17: `ferry serve --stdio` writes no INFO lines (an MCP host shows each stderr
/// line of its server as a log entry, often as an error); warnings still show, and `RUST_LOG`
/// still chooses.
#[tokio::test]
async fn serve_stdio_is_quiet_on_stderr() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(common::ferry_bin())
        .args(["serve", "--stdio", "--listen", "127.0.0.1:0", "--data"])
        .arg(tmp.path().join("data"))
        .env_remove("RUST_LOG")
        .env_remove("FERRY_LISTEN")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("listening on http://127.0.0.1:"), "{err}");
    assert!(!err.contains(" INFO "), "no INFO lines under --stdio: {err}");
}

/// What the transport refuses before any tool runs is a JSON-RPC error a client can read
/// (`id` null), not a line of text: a malformed body is a parse error (400, -32700); a wrong
/// Content-Type or a call without a session keeps its status as an invalid request (-32600).
#[tokio::test]
async fn transport_refusals_are_json_rpc_errors() {
    let s = Server::start(&[]);
    let c = common::client();
    let post = |ct: Option<&'static str>, body: &'static str| {
        let mut r = c.post(s.url("/mcp")).header("Accept", "application/json, text/event-stream").body(body);
        if let Some(ct) = ct {
            r = r.header("Content-Type", ct);
        }
        r.send()
    };
    for (ct, body, status, code) in [
        (Some("application/json"), "{not json", 400, -32700),
        (None, r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#, 415, -32600),
        (Some("application/json"), r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#, 400, -32600),
    ] {
        let r = post(ct, body).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{body}");
        assert_eq!(common::header(&r, "content-type"), Some("application/json"), "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!((v["jsonrpc"].as_str(), v["id"].is_null(), v["error"]["code"].as_i64()), (Some("2.0"), true, Some(code)), "{v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty(), "{v}");
    }
}
