//! Misleading messages and validation gaps a new user found (fix-p3), against the real binary:
//! a declared sha256 and a digest field say what is wrong; a task's `ttl_ms` has one bound and
//! one message; client JSON that other readers cannot take as written (`"\ud800"`, `1e999`) is
//! refused by pointer; unknown body members are refused by name; a signed URL with a repeated
//! signed parameter is refused; `X-HTTP-Method-Override` works on the TUS endpoints only; and
//! the MCP answers for a complete upload, a requested upload not yet sent, a `task_respond`
//! that answers nothing, and `tools/call` params of the wrong shape.

mod common;

use base64::Engine as _;
use common::{problem, Api, Server};
use rmcp::model::*;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

type Client = RunningService<RoleClient, ClientConfig>;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

async fn connect(server: &Server) -> Client {
    let cfg = StreamableHttpClientTransportConfig::with_uri(server.url("/mcp"));
    ClientConfig::new(ClientCapabilities::default(), Implementation::new("ferry-tests", "0"))
        .serve(StreamableHttpClientTransport::from_config(cfg))
        .await
        .expect("MCP over HTTP connects")
}

async fn call(c: &Client, name: &str, args: Value) -> (Value, bool) {
    let Value::Object(a) = args else { panic!("args must be an object") };
    let r = c.call_tool(CallToolRequestParams::new(name.to_string()).with_arguments(a)).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    (r.structured_content.clone().expect("structuredContent"), r.is_error == Some(true))
}

async fn create(api: &Api, metadata: &str, extra: &[(&str, &str)]) -> reqwest::Response {
    let mut h = vec![("Tus-Resumable", "1.0.0"), ("Upload-Length", "3"), ("Upload-Metadata", metadata)];
    h.extend_from_slice(extra);
    api.send("POST", "/files/", &h, None).await
}

#[tokio::test]
async fn digests_say_what_is_wrong() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let v = problem(create(&api, &format!("sha256 {}", B64.encode("abc")), &[]).await, 400, "invalid_argument").await;
    let d = v["detail"].as_str().unwrap();
    assert!(d.contains("has 3 hex digits") && d.contains("64 hexadecimal digits"), "{v}");
    let v = problem(create(&api, &format!("sha256 {}", B64.encode(format!("{}z", "a".repeat(63)))), &[]).await, 400, "invalid_argument").await;
    assert!(v["detail"].as_str().unwrap().contains("character 64 is 'z'"), "{v}");
    // A digest field whose value is not base64 says so; base64 of the wrong length keeps the length.
    let v = problem(create(&api, "", &[("Repr-Digest", "sha-256=:garbage:")]).await, 400, "invalid_argument").await;
    assert!(v["detail"].as_str().unwrap().contains("not base64"), "{v}");
    let v = problem(create(&api, "", &[("Repr-Digest", "sha-256=:AAAA:")]).await, 400, "invalid_argument").await;
    assert!(v["detail"].as_str().unwrap().contains("must be 32 bytes"), "{v}");
}

#[tokio::test]
async fn task_ttl_has_one_bound_and_one_message() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    for ttl in ["0", "-1", "31622400001", "9223372036854775807", "18446744073709551615", "18446744073709551616", "1e999"] {
        let body = format!(r#"{{"kind":"external","args":null,"ttl_ms":{ttl}}}"#);
        let r = api.send("POST", "/api/v1/tasks", &[("content-type", "application/json")], Some(body.into_bytes())).await;
        let v = problem(r, 400, "invalid_argument").await;
        assert_eq!(v["detail"], format!("body/ttl_ms must be a whole number of milliseconds from 1 to 31622400000 (366 days); got {ttl}"), "{v}");
    }
    let r = api
        .send("POST", "/api/v1/tasks", &[("content-type", "application/json")], Some(br#"{"kind":"external","ttl_ms":31622400000}"#.to_vec()))
        .await;
    assert_eq!(r.status(), 201);
    let doc: Value = api.send("GET", "/api/v1/openapi.json", &[], None).await.json().await.unwrap();
    assert_eq!(doc["components"]["schemas"]["StartTask"]["properties"]["ttl_ms"]["maximum"], 31622400000i64);
}

#[tokio::test]
async fn client_json_other_readers_cannot_take_is_refused_by_pointer() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    for (args, at) in [(r#"{"a":["\ud800"]}"#, "body/args/a/0"), (r#"{"n":1e999}"#, "body/args/n")] {
        let body = format!(r#"{{"kind":"external","args":{args}}}"#);
        let r = api.send("POST", "/api/v1/tasks", &[("content-type", "application/json")], Some(body.into_bytes())).await;
        let v = problem(r, 400, "invalid_argument").await;
        assert!(v["detail"].as_str().unwrap().contains(at), "{v}");
    }
    // A result and a fragment of an external task are checked the same way.
    let r = api.send("POST", "/api/v1/tasks", &[("content-type", "application/json")], Some(br#"{"kind":"external"}"#.to_vec())).await;
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let r = api
        .send("POST", &format!("/api/v1/tasks/{id}/complete"), &[("content-type", "application/json")], Some(br#"{"result":{"x":-1e400}}"#.to_vec()))
        .await;
    assert!(problem(r, 400, "invalid_argument").await["detail"].as_str().unwrap().contains("body/result/x"));
    let r = api
        .send("POST", &format!("/api/v1/tasks/{id}/partial"), &[("content-type", "application/json")], Some(br#"{"fragment":"\udc00"}"#.to_vec()))
        .await;
    assert!(problem(r, 400, "invalid_argument").await["detail"].as_str().unwrap().contains("body/fragment"));
    // Unknown members are refused by name, in every body.
    for (path, body) in [
        ("input", r#"{"key":"k","response":1,"extra":1}"#),
        ("fail", r#"{"message":"m","extra":1}"#),
        ("complete", r#"{"result":1,"extra":1}"#),
        ("partial", r#"{"fragment":1,"extra":1}"#),
        ("progress", r#"{"fraction":0.5,"extra":1}"#),
    ] {
        let r =
            api.send("POST", &format!("/api/v1/tasks/{id}/{path}"), &[("content-type", "application/json")], Some(body.as_bytes().to_vec())).await;
        let v = problem(r, 400, "invalid_argument").await;
        assert!(v["detail"].as_str().unwrap().contains("extra"), "{path}: {v}");
    }
    // The deprecated `files` of complete is still a member.
    let r = api
        .send("POST", &format!("/api/v1/tasks/{id}/complete"), &[("content-type", "application/json")], Some(br#"{"result":1,"files":[]}"#.to_vec()))
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

#[tokio::test]
async fn signed_urls_refuse_repeated_parameters_and_override_is_tus_only() {
    let s = Server::start(&[]);
    let api = Api::new(&s);
    let r = create(&api, "", &[]).await;
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    let id = loc.rsplit('/').next().unwrap().to_string();
    let shared: Value = api
        .send("POST", &format!("/api/v1/files/{id}/share"), &[("content-type", "application/json")], Some(br#"{"scope":"upload"}"#.to_vec()))
        .await
        .json()
        .await
        .unwrap();
    let url = shared["url"].as_str().unwrap().to_string();
    let plain = reqwest::Client::new();
    let r = plain.head(&url).header("Tus-Resumable", "1.0.0").send().await.unwrap();
    assert_eq!(r.status(), 200);
    for extra in ["scope=download", "scope=upload", "expires=1", "sig=AAAA"] {
        let r = plain.get(format!("{url}&{extra}")).send().await.unwrap();
        assert_eq!(r.status(), 403, "{extra}");
        let body = r.text().await.unwrap();
        assert!(body.contains("repeats its"), "{extra}: {body}");
    }
    // TUS: POST + override PATCH appends.
    let r = api
        .send(
            "POST",
            &loc,
            &[
                ("X-HTTP-Method-Override", "PATCH"),
                ("Tus-Resumable", "1.0.0"),
                ("Content-Type", "application/offset+octet-stream"),
                ("Upload-Offset", "0"),
            ],
            Some(b"abc".to_vec()),
        )
        .await;
    assert_eq!(r.status(), 204);
    // Elsewhere it is refused, not obeyed.
    let r = api.send("POST", "/api/v1/tasks", &[("X-HTTP-Method-Override", "GET")], None).await;
    assert!(problem(r, 400, "invalid_argument").await["detail"].as_str().unwrap().contains("X-HTTP-Method-Override"));
    let r = api.send("POST", &loc, &[("X-HTTP-Method-Override", "OPTIONS"), ("Tus-Resumable", "1.0.0")], None).await;
    problem(r, 400, "invalid_argument").await;
}

#[tokio::test]
async fn mcp_answers_name_the_next_step() {
    let s = Server::start(&[]);
    let c = connect(&s).await;
    // A complete upload takes no more bytes: said as such, with the calls that read it.
    let b = call(&c, "file_upload_begin", json!({ "name": "a.txt", "size": 3 })).await.0;
    let id = b["file"]["id"].as_str().unwrap().to_string();
    assert!(!call(&c, "file_upload_chunk", json!({ "file_id": id, "offset": 0, "data": B64.encode("abc") })).await.1);
    let (v, err) = call(&c, "file_upload_chunk", json!({ "file_id": id, "offset": 3, "data": B64.encode("d") })).await;
    assert!(err, "{v}");
    assert_eq!(v["error"]["code"], "conflict", "{v}");
    assert_eq!(v["error"]["retryable"], false, "{v}");
    let hint = v["error"]["recoveryHint"].as_str().unwrap();
    assert!(hint.contains("complete") && hint.contains("file_status") && hint.contains("file_read_chunk"), "{hint}");
    // A requested upload not sent yet: wait and poll, do not send.
    let r = call(&c, "file_request", json!({ "name": "contract.pdf" })).await.0;
    let rid = r["file"]["id"].as_str().unwrap().to_string();
    let (v, err) = call(&c, "file_read_chunk", json!({ "file_id": rid })).await;
    assert!(err && v["error"]["code"] == "upload_incomplete", "{v}");
    let hint = v["error"]["recoveryHint"].as_str().unwrap();
    assert!(hint.contains("file_status") && hint.contains("wait") && !hint.contains("file_upload_chunk"), "{hint}");
    // One the model began itself: send the rest.
    let b = call(&c, "file_upload_begin", json!({ "name": "b.txt", "size": 3 })).await.0;
    let (v, _) = call(&c, "file_read_chunk", json!({ "file_id": b["file"]["id"] })).await;
    assert!(v["error"]["recoveryHint"].as_str().unwrap().contains("file_upload_chunk"), "{v}");
    // task_respond that answers nothing is an error naming what the task waits for.
    let api = Api::new(&s);
    let t: Value = api
        .send("POST", "/api/v1/tasks", &[("content-type", "application/json")], Some(br#"{"kind":"external"}"#.to_vec()))
        .await
        .json()
        .await
        .unwrap();
    let (v, err) = call(&c, "task_respond", json!({ "task_id": t["id"], "key": "nope", "response": 1 })).await;
    assert!(err, "{v}");
    assert_eq!(v["error"]["code"], "invalid_argument", "{v}");
    assert_eq!(v["error"]["retryable"], false, "{v}");
    assert!(v["error"]["recoveryHint"].as_str().unwrap().contains("waits for no input"), "{v}");
}

#[tokio::test]
async fn tools_call_with_params_of_the_wrong_shape_is_invalid_params() {
    let s = Server::start(&[]);
    let http = reqwest::Client::new();
    let post = |body: Value, session: Option<String>| {
        let mut r = http.post(s.url("/mcp")).header("content-type", "application/json").header("accept", "application/json, text/event-stream");
        if let Some(id) = session {
            r = r.header("mcp-session-id", id);
        }
        r.body(body.to_string()).send()
    };
    let init = json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": { "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "t", "version": "0" } }
    });
    let r = post(init, None).await.unwrap();
    let session = r.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_string());
    let _ = r.text().await;
    let _ = post(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }), session.clone()).await.unwrap().text().await;
    let r = post(json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": { "name": "file_list", "arguments": "str" } }), session)
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    assert!(text.contains("-32602") && !text.contains("-32601"), "{text}");
}
