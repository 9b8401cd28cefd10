//! The MCP facade as a model and a person drive it (issue 13, items 12–16), against the real
//! binary: `file_upload_begin`'s curl lines run verbatim by bash and curl on a file of some MiB;
//! `archive_files` / `compress_file` refusing unknown or unfinished input files at the call; a
//! command's `params_schema` as `export_<name>`'s inputSchema and enforced at the call (MCP and
//! REST), and refused at start-up when it is not a schema; idempotency keys comparing
//! arguments as JSON values (SQLite, and PostgreSQL with `FERRY_TEST_CATALOG=postgres`); the
//! deprecated argument names still accepted; expiry times in errors as RFC 3339.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{json, problem, pseudo_random, sha256_hex, write_file, write_script, Api, Server};
use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

type Client = RunningService<RoleClient, ClientConfig>;

async fn connect(server: &Server, tasks: bool) -> Client {
    let caps = if tasks { ClientCapabilities::builder().enable_tasks().build() } else { ClientCapabilities::default() };
    let cfg = StreamableHttpClientTransportConfig::with_uri(server.url("/mcp"));
    ClientConfig::new(caps, Implementation::new("ferry-tests", "0"))
        .serve(StreamableHttpClientTransport::from_config(cfg))
        .await
        .expect("MCP over HTTP connects")
}

/// Call a tool; returns (structuredContent, isError). The result must validate against the
/// tool's outputSchema.
async fn call(c: &Client, name: &str, args: Value) -> (Value, bool) {
    let Value::Object(a) = args else { panic!("args must be an object") };
    let r = c.call_tool(CallToolRequestParams::new(name.to_string()).with_arguments(a)).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    let v = r.structured_content.clone().expect("structuredContent");
    let tools = c.list_all_tools().await.expect("tools/list");
    let tool = tools.iter().find(|t| t.name == name).unwrap();
    let schema = Value::Object(tool.output_schema.as_deref().cloned().unwrap());
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{name}: result does not match its outputSchema: {errors:?}\n{v}");
    (v, r.is_error == Some(true))
}

async fn ok(c: &Client, name: &str, args: Value) -> Value {
    let (v, err) = call(c, name, args).await;
    assert!(!err, "{name} failed: {v}");
    v
}

/// A failed call's `error` object, checked for the envelope and `code`.
async fn failed(c: &Client, name: &str, args: Value, code: &str) -> Value {
    let (v, err) = call(c, name, args).await;
    assert!(err, "{name} should have failed with {code}: {v}");
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(v["error"]["retryable"].is_boolean() && v["error"]["recoveryHint"].as_str().is_some_and(|h| !h.is_empty()), "{v}");
    v["error"].clone()
}

/// Run one shell line exactly as given, with `UPLOAD_URL` and `FILE` set; returns (success,
/// stdout + stderr).
async fn run_line(line: &str, upload_url: &str, file: &std::path::Path) -> (bool, String) {
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(line).env("UPLOAD_URL", upload_url).env("FILE", file).stdin(Stdio::null());
    for v in ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "https_proxy", "HTTPS_PROXY"] {
        cmd.env_remove(v);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("bash")).await.unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

async fn status(c: &Client, id: &str) -> Value {
    ok(c, "file_status", json!({ "file_id": id })).await["file"].clone()
}

/// Upload `data` through MCP (begin + in-band chunk) and return its id.
async fn small_file(c: &Client, name: &str, data: &[u8]) -> String {
    use base64::Engine as _;
    let b = ok(c, "file_upload_begin", json!({ "name": name, "size": data.len() })).await;
    let id = b["file"]["id"].as_str().unwrap().to_string();
    let data = base64::engine::general_purpose::STANDARD.encode(data);
    let f = ok(c, "file_upload_chunk", json!({ "file_id": id, "offset": 0, "data": data })).await;
    assert_eq!(f["file"]["complete"], true, "{f}");
    id
}

#[tokio::test]
async fn file_upload_begin_curl_lines_run_verbatim_on_a_file_of_some_mib() {
    let s = Server::start(&[]);
    let c = connect(&s, false).await;
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random(5 * 1024 * 1024 + 12_345, 77);
    let sha = sha256_hex(&data);
    let real = dir.path().join("the export.bin");
    std::fs::write(&real, &data).unwrap();
    // The file is reached through a symlink: `stat -L` must measure the target.
    let file = dir.path().join("link to export.bin");
    std::os::unix::fs::symlink(&real, &file).unwrap();

    // 1. Whole file with the `curl` line.
    let b = ok(&c, "file_upload_begin", json!({ "name": "export.bin", "size": data.len() })).await;
    let url = b["upload_url"].as_str().unwrap().to_string();
    assert_eq!(b.to_string().matches(&url).count(), 1, "the signed URL appears once in the result: {b}");
    let curl = b["curl"].as_str().unwrap();
    assert!(curl.contains("-T \"$FILE\"") && !curl.contains("--data-binary") && curl.contains("--fail-with-body"), "{curl}");
    let (good, out) = run_line(curl, &url, &file).await;
    assert!(good, "the curl line failed:\n{curl}\n{out}");
    let f = status(&c, b["file"]["id"].as_str().unwrap()).await;
    assert_eq!((f["complete"].as_bool(), f["sha256"].as_str()), (Some(true), Some(sha.as_str())), "{f}");
    // Run again on the finished upload: curl fails loudly, showing ferry's problem body.
    let (good, out) = run_line(curl, &url, &file).await;
    assert!(!good && out.contains("\"code\""), "a refused PATCH must make the line fail with the problem body: {out}");

    // 2. Interrupted after 1 MiB (sent by another client), then `curl_resume` sends the rest.
    let b = ok(&c, "file_upload_begin", json!({ "name": "export.bin", "size": data.len() })).await;
    let url = b["upload_url"].as_str().unwrap().to_string();
    let r = reqwest::Client::new()
        .patch(&url)
        .header("Tus-Resumable", "1.0.0")
        .header("Upload-Offset", "0")
        .header("Content-Type", "application/offset+octet-stream")
        .body(data[..1 << 20].to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let resume = b["curl_resume"].as_str().unwrap();
    let (good, out) = run_line(resume, &url, &file).await;
    assert!(good, "the curl_resume line failed:\n{resume}\n{out}");
    let f = status(&c, b["file"]["id"].as_str().unwrap()).await;
    assert_eq!((f["complete"].as_bool(), f["sha256"].as_str()), (Some(true), Some(sha.as_str())), "{f}");

    // 3. Size unknown at begin: the lines declare Upload-Length from the file (through the link).
    let b = ok(&c, "file_upload_begin", json!({ "name": "export.bin" })).await;
    let url = b["upload_url"].as_str().unwrap().to_string();
    let resume = b["curl_resume"].as_str().unwrap();
    assert!(resume.contains("stat -L"), "{resume}");
    let (good, out) = run_line(resume, &url, &file).await;
    assert!(good, "curl_resume from offset 0 with a deferred length failed:\n{resume}\n{out}");
    let f = status(&c, b["file"]["id"].as_str().unwrap()).await;
    assert_eq!((f["size"].as_u64(), f["sha256"].as_str()), (Some(data.len() as u64), Some(sha.as_str())), "{f}");
    let b = ok(&c, "file_upload_begin", json!({ "name": "export.bin" })).await;
    let (good, out) = run_line(b["curl"].as_str().unwrap(), b["upload_url"].as_str().unwrap(), &file).await;
    assert!(good, "{out}");
    assert_eq!(status(&c, b["file"]["id"].as_str().unwrap()).await["sha256"], sha.as_str());
}

#[tokio::test]
async fn archive_and_compress_refuse_unknown_and_unfinished_files_at_the_call() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    for native in [false, true] {
        let c = connect(&s, native).await;
        let good = small_file(&c, "a.txt", b"hello").await;
        let (u1, u2) = ("aaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbb");
        let before = ok(&c, "task_list", json!({})).await["tasks"].as_array().unwrap().len();

        // Also a native-tasks client gets a tool error at the call, not a task that fails later.
        let e = failed(&c, "archive_files", json!({ "file_ids": [good, u1, u2], "idempotency_key": "k1" }), "not_found").await;
        assert_eq!(e["retryable"], false, "{e}");
        for text in [e["message"].as_str().unwrap(), e["recoveryHint"].as_str().unwrap()] {
            assert!(text.contains(u1) && text.contains(u2) && !text.contains(&good), "names exactly the unknown ids: {e}");
        }
        let e = failed(&c, "compress_file", json!({ "file_id": u1 }), "not_found").await;
        assert!(e["recoveryHint"].as_str().unwrap().contains(u1), "{e}");

        // An upload still in progress: upload_incomplete with its offset as the cursor.
        let b = ok(&c, "file_upload_begin", json!({ "name": "half.bin", "size": 10 })).await;
        let half = b["file"]["id"].as_str().unwrap().to_string();
        ok(&c, "file_upload_chunk", json!({ "file_id": half, "offset": 0, "data": "aGVsbG8=" })).await;
        let e = failed(&c, "archive_files", json!({ "file_ids": [good, half] }), "upload_incomplete").await;
        assert_eq!(e["partial"]["cursor"], 5, "{e}");
        assert!(e["message"].as_str().unwrap().contains(&half), "{e}");
        let after = ok(&c, "task_list", json!({})).await["tasks"].as_array().unwrap().len();
        assert_eq!(before, after, "no task was created by a refused call");

        // The same over REST; and the deprecated argument names still work.
        let p = problem(api.start_raw("archive", &format!(r#"{{"file_ids":["{u1}"],"format":"tar"}}"#), None, None).await, 404, "not_found").await;
        assert!(p["detail"].as_str().unwrap().contains(u1), "{p}");
        problem(api.start_raw("compress", &format!(r#"{{"file":"{u2}","format":"zstd"}}"#), None, None).await, 404, "not_found").await;
        let t = api.start("archive", &format!(r#"{{"files":["{good}"],"format":"tar"}}"#)).await;
        assert_eq!(api.wait_status(t["id"].as_str().unwrap(), "completed", 30).await["status"], "completed");
        let t = api.start("compress", &format!(r#"{{"file":"{good}","format":"gzip"}}"#)).await;
        api.wait_status(t["id"].as_str().unwrap(), "completed", 30).await;
        // The MCP job tools pass today's names on.
        if !native {
            let t = ok(&c, "archive_files", json!({ "file_ids": [good] })).await;
            let args = json(api.get(&format!("/api/v1/tasks/{}/args", t["task_id"].as_str().unwrap())).await).await;
            assert_eq!(args["file_ids"], json!([good]), "{args}");
        }
    }
}

#[tokio::test]
async fn deprecated_names_on_input_and_download_url_on_output() {
    let s = Server::start(&[]);
    let c = connect(&s, false).await;
    // `url_ttl_ms` (deprecated) and `ttl_ms` both set the upload URL's lifetime.
    for arg in ["url_ttl_ms", "ttl_ms"] {
        let b = ok(&c, "file_upload_begin", json!({ "name": "x", "size": 1, arg: 60_000 })).await;
        let exp = humantime::parse_rfc3339(b["expires_at"].as_str().unwrap()).unwrap();
        let left = exp.duration_since(std::time::SystemTime::now()).unwrap_or_default();
        assert!(left <= Duration::from_secs(61), "{arg}: {b}");
    }
    failed(&c, "file_upload_begin", json!({ "name": "x", "url_ttl_ms": 1000, "ttl_ms": 1000 }), "invalid_argument").await;
    let id = small_file(&c, "d.txt", b"bytes").await;
    let u = ok(&c, "file_download_url", json!({ "file_id": id })).await;
    let url = u["download_url"].as_str().unwrap();
    assert!(u.get("url").is_none(), "{u}");
    assert_eq!(reqwest::get(url).await.unwrap().bytes().await.unwrap().as_ref(), b"bytes");
    // The external producer's `/complete` takes `file_ids` (and the old `files`).
    let api = Api::new(&s);
    for body in [format!(r#"{{"file_ids":["{id}"]}}"#), format!(r#"{{"files":["{id}"]}}"#)] {
        let t = api.start("external", "{}").await;
        let done = json(api.post(&format!("/api/v1/tasks/{}/complete", t["id"].as_str().unwrap()), &body).await).await;
        assert_eq!(done["result"]["files"][0]["id"], id.as_str(), "{body}: {done}");
    }
}

#[tokio::test]
async fn a_declared_params_schema_is_the_input_schema_and_is_enforced_at_the_call() {
    let tmp = tempfile::tempdir().unwrap();
    let script = write_script(tmp.path(), "orders.sh", "printf '%s' \"$FERRY_PARAMS\"\n");
    let toml = format!(
        r##"[commands.orders]
program = "{}"
description = "orders of one month"

[commands.orders.params_schema]
type = "object"
required = ["month"]
additionalProperties = false
properties.month = {{ type = "string", pattern = "^[0-9]{{4}}-(0[1-9]|1[0-2])$", description = "YYYY-MM" }}
properties.limit = {{ "$ref" = "#/$defs/count" }}
"$defs".count = {{ type = "integer", minimum = 1 }}

[commands.free]
program = "{}"
"##,
        script.display(),
        script.display()
    );
    let cfg = write_file(tmp.path(), "ferry.toml", &toml);
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let c = connect(&s, false).await;

    // tools/list: the schema is the `params` of export_orders, required; its $defs at the root.
    let tools = c.list_all_tools().await.unwrap();
    let t = tools.iter().find(|t| t.name == "export_orders").expect("export_orders");
    let input = Value::Object((*t.input_schema).clone());
    let params = &input["properties"]["params"];
    assert_eq!(params["required"], json!(["month"]), "{input}");
    assert_eq!(params["properties"]["month"]["pattern"], "^[0-9]{4}-(0[1-9]|1[0-2])$", "{input}");
    assert_eq!(params["additionalProperties"], false, "{input}");
    assert!(input["required"].as_array().unwrap().contains(&json!("params")), "{input}");
    assert_eq!(input["$defs"]["count"]["minimum"], 1, "{input}");
    // The inputSchema is itself a JSON Schema under which good arguments pass and bad ones fail.
    let v = jsonschema::validator_for(&input).expect("inputSchema is a valid schema");
    assert!(v.is_valid(&json!({ "params": { "month": "2026-11", "limit": 5 } })));
    assert!(!v.is_valid(&json!({ "params": { "month": "2026-11", "limit": 0 } })));
    assert!(!v.is_valid(&json!({})));
    // A command without a schema keeps `params` an optional object.
    let free = tools.iter().find(|t| t.name == "export_free").unwrap();
    assert_eq!(free.input_schema["properties"]["params"]["type"], "object");
    assert!(free.input_schema["required"].as_array().unwrap().is_empty());

    // Bad params are refused at the call, each violation named with its place.
    let e = failed(&c, "export_orders", json!({ "params": { "month": "2026-13", "limit": 0, "x": 1 } }), "invalid_argument").await;
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("params/month") && m.contains("params/limit") && m.contains("'x'"), "{e}");
    let e = failed(&c, "export_orders", json!({}), "invalid_argument").await;
    // The inputSchema requires `params` when its schema requires members.
    assert!(e["message"].as_str().unwrap().contains("\"params\" is a required property"), "absent params: {e}");
    assert!(ok(&c, "task_list", json!({})).await["tasks"].as_array().unwrap().is_empty(), "no task was created");
    // REST is held to the same schema. This one has a `$ref`, so the OpenAPI document cannot
    // carry it: args it admits that the kind's own check refuses are 422 (issue 48, kind 5).
    let api = Api::new(&s);
    let p = problem(api.start_raw("command", r#"{"command":"orders","params":{"month":"soon"}}"#, None, None).await, 422, "invalid_argument").await;
    assert!(p["detail"].as_str().unwrap().contains("params/month"), "{p}");

    // Good params run, and reach the program as FERRY_PARAMS.
    let started = ok(&c, "export_orders", json!({ "params": { "month": "2026-11", "limit": 5 } })).await;
    let done = ok(&c, "task_get", json!({ "task_id": started["task_id"], "wait_ms": 30000 })).await;
    assert_eq!(done["status"], "completed", "{done}");
    let body: Value = reqwest::get(done["download_url"].as_str().unwrap()).await.unwrap().json().await.unwrap();
    assert_eq!(body, json!({ "month": "2026-11", "limit": 5 }));
}

/// `ferry serve` with `toml` as its config: exits at start-up; returns its stderr.
fn refused_config(toml: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_file(tmp.path(), "ferry.toml", toml);
    let mut child = Command::new(common::ferry_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--config", cfg.to_str().unwrap(), "--data"])
        .arg(tmp.path().join("data"))
        .env_remove("FERRY_CATALOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(!st.success(), "ferry serve must refuse this config");
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            return err;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("ferry serve started with an invalid params_schema");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_invalid_params_schema_stops_start_up_with_one_clear_line() {
    let err = refused_config(
        "[commands.orders]\nprogram = \"/bin/true\"\n[commands.orders.params_schema]\ntype = \"object\"\nproperties.month = { type = \"text\" }\n",
    );
    assert!(err.contains("[commands.orders] params_schema") && err.contains("not a valid JSON Schema"), "{err}");
    let err = refused_config("[commands.orders]\nprogram = \"/bin/true\"\n[commands.orders.params_schema]\ntype = \"array\"\n");
    assert!(err.contains("[commands.orders] params_schema") && err.contains("object"), "{err}");
}

#[tokio::test]
async fn idempotency_keys_compare_arguments_as_json_values() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let c = connect(&s, false).await;
    let f = small_file(&c, "a.txt", b"one").await;
    let g = small_file(&c, "b.txt", b"two").await;

    let first_text = format!(r#"{{"file_ids":["{f}","{g}"],"format":"tar","name":"n.tar"}}"#);
    let r = api.start_raw("archive", &first_text, Some("nightly"), None).await;
    assert_eq!(r.status(), 201);
    let first = json(r).await;
    let id = first["id"].as_str().unwrap();
    // Other whitespace and member order: the same request.
    let reformatted = format!("{{ \"name\" : \"n.tar\",\n  \"format\": \"tar\",\n  \"file_ids\": [ \"{f}\", \"{g}\" ] }}");
    let r = api.start_raw("archive", &reformatted, Some("nightly"), None).await;
    assert_eq!(r.status(), 200, "reformatted JSON joins the task");
    assert_eq!(json(r).await["id"], id);
    // The stored arguments are the first text, byte for byte.
    assert_eq!(api.get(&format!("/api/v1/tasks/{id}/args")).await.text().await.unwrap(), first_text);
    // Another member order inside an array is another request.
    let swapped = format!(r#"{{"file_ids":["{g}","{f}"],"format":"tar","name":"n.tar"}}"#);
    problem(api.start_raw("archive", &swapped, Some("nightly"), None).await, 422, "conflict").await;

    // Numbers by value: 1 and 1.0 are the same (an `external` task takes any JSON).
    let r = api.start_raw("external", r#"{"rows":1,"opts":{"a":[1,2],"b":null}}"#, Some("ext"), None).await;
    assert_eq!(r.status(), 201);
    let ext = json(r).await["id"].clone();
    let r = api.start_raw("external", r#"{"opts":{"b":null,"a":[1.0,2e0]},"rows":1.0}"#, Some("ext"), None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(json(r).await["id"], ext);
    problem(api.start_raw("external", r#"{"rows":"1","opts":{"a":[1,2],"b":null}}"#, Some("ext"), None).await, 422, "conflict").await;

    // Across transports: a REST start and an MCP call with the same key and arguments are one task.
    let rest_text = format!(r#"{{ "format": "tar", "file_ids": ["{f}"] }}"#);
    let r = api.start_raw("archive", &rest_text, Some("shared"), None).await;
    assert_eq!(r.status(), 201);
    let rest_id = json(r).await["id"].clone();
    let over_mcp = ok(&c, "archive_files", json!({ "file_ids": [f], "format": "tar", "idempotency_key": "shared" })).await;
    assert_eq!(over_mcp["task_id"], rest_id, "{over_mcp}");
    let e = failed(&c, "archive_files", json!({ "file_ids": [f], "format": "zip", "idempotency_key": "shared" }), "conflict").await;
    assert!(e["message"].as_str().unwrap().contains(rest_id.as_str().unwrap()), "{e}");
}

#[tokio::test]
async fn expiry_times_in_errors_are_rfc3339() {
    let s = Server::start(&[]);
    let c = connect(&s, false).await;
    let id = small_file(&c, "e.txt", b"soon gone").await;
    let u = ok(&c, "file_download_url", json!({ "file_id": id, "ttl_ms": 1 })).await;
    let url = u["download_url"].as_str().unwrap().to_string();
    let expires_at = u["expires_at"].as_str().unwrap().to_string();
    let page_info = url.replacen("/files/", "/share/", 1).replacen('?', "/info?", 1);
    // Wait for the link to expire (the signature's expiry is whole seconds).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let body = loop {
        let r = reqwest::get(&url).await.unwrap();
        if r.status() == 403 {
            break r.json::<Value>().await.unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "the 1 ms link still works after 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains(&expires_at), "the expiry is the RFC 3339 time file_download_url gave: {detail} vs {expires_at}");
    assert!(!detail.contains("unix"), "{detail}");
    humantime::parse_rfc3339(detail.rsplit(' ').next().unwrap()).expect("ends with an RFC 3339 time");
    // The page's info endpoint (410 for an expired link) says the same.
    let r = reqwest::get(&page_info).await.unwrap();
    assert_eq!(r.status(), 410);
    let v: Value = r.json().await.unwrap();
    assert!(v["detail"].as_str().unwrap().contains(&expires_at), "{v}");
}

/// Arguments are checked against the tool's inputSchema before the tool runs (issue 23, kind
/// 3): a value the schema forbids is an `invalid_argument` naming the argument's JSON pointer,
/// and nothing is stored (`file_upload_begin` with `ttl_ms: 0` used to leave an upload behind).
/// A host outside fetch_url's allow list names the call to make instead (kind 13).
#[tokio::test]
async fn arguments_outside_the_input_schema_are_refused_before_anything_is_stored() {
    let s = Server::start(&[]);
    let c = connect(&s, false).await;
    for (tool, args, at) in [
        ("file_upload_begin", json!({ "name": "a.bin", "size": 5, "ttl_ms": 0 }), "/ttl_ms"),
        ("file_upload_begin", json!({ "name": "a.bin", "size": 5, "sha256": "zz" }), "/sha256"),
        ("file_upload_begin", json!({ "name": "", "size": 5 }), "/name"),
        ("file_upload_begin", json!({ "name": "a.bin", "size": -1 }), "/size"),
        ("archive_files", json!({ "file_ids": [], "idempotency_key": "k" }), "/file_ids"),
        ("compress_file", json!({ "file_id": "a", "format": "xz" }), "/format"),
        ("task_get", json!({ "task_id": "a", "wait_ms": 60000 }), "/wait_ms"),
        ("fetch_url", json!({ "url": "http://127.0.0.1:9/", "idempotency_key": "" }), "/idempotency_key"),
    ] {
        let e = failed(&c, tool, args.clone(), "invalid_argument").await;
        let m = e["message"].as_str().unwrap();
        assert!(m.contains(&format!("arguments{at}")), "{tool} {args}: names the place: {e}");
        assert_eq!(e["retryable"], false, "{e}");
        assert!(e["recoveryHint"].as_str().unwrap().contains(tool), "{e}");
    }
    // A JSON integer past 64 bits fits `"type": "integer"` but no field: named by its
    // pointer, not by serde's "invalid type: floating point" (break-it, session 9).
    let huge: Value = serde_json::from_str(r#"{ "name": "a.bin", "size": 18446744073709551616 }"#).unwrap();
    let e = failed(&c, "file_upload_begin", huge, "invalid_argument").await;
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("arguments/size") && m.contains("outside the whole numbers") && !m.contains("floating point"), "{e}");
    assert!(e["recoveryHint"].as_str().unwrap().contains("file_upload_begin"), "{e}");
    assert_eq!(ok(&c, "file_list", json!({})).await["files"], json!([]), "nothing was stored");
    assert_eq!(ok(&c, "task_list", json!({})).await["tasks"], json!([]), "no task was started");

    // Outside the allow list (none configured): the hint names file_upload_begin and its arguments.
    let e = failed(&c, "fetch_url", json!({ "url": "http://example.com/f.bin" }), "unauthorized").await;
    let hint = e["recoveryHint"].as_str().unwrap();
    assert!(hint.contains("file_upload_begin") && hint.contains("name") && hint.contains("size"), "{e}");
}
