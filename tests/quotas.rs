//! Per-principal quotas and retention (issue 13 item 4), driven as a user would: the real
//! binary over HTTP (TUS, the API) and MCP, with `[limits]` in ferry.toml. Also run with
//! `FERRY_TEST_CATALOG=postgres` by `.ci/run`: the use is counted by the catalog.
//!
//! Status choices (README "Limits"): bytes quota → 507 `quota_exceeded`; uploads in progress →
//! 429 `quota_exceeded`; both carry `quota: {name, limit, used, requested}` in the problem body.

mod common;

use std::time::Duration;

use common::{header, header_u64, json, problem, pseudo_random, sha256_hex, write_file, Api, Server, OCTET};
use serde_json::{json, Value};

/// `[[tokens]]` entries for (principal, token) pairs.
fn tokens(list: &[(&str, &str)]) -> String {
    list.iter().map(|(p, t)| format!("[[tokens]]\nprincipal = \"{p}\"\nsha256 = \"{}\"\n", sha256_hex(t.as_bytes()))).collect()
}

fn server_with(config: &str, args: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_file(dir.path(), "ferry.toml", config);
    let mut argv = vec!["--config", cfg.to_str().unwrap()];
    argv.extend_from_slice(args);
    let s = Server::start(&argv);
    (dir, s)
}

async fn create(api: &Api, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut h = vec![("Tus-Resumable", "1.0.0")];
    h.extend_from_slice(headers);
    api.send("POST", "/files/", &h, None).await
}

fn id_of(r: &reqwest::Response) -> String {
    header(r, "location").expect("Location").rsplit('/').next().unwrap().to_string()
}

async fn patch(api: &Api, id: &str, offset: u64, body: Vec<u8>, extra: &[(&str, &str)]) -> reqwest::Response {
    let o = offset.to_string();
    let mut h = vec![("Tus-Resumable", "1.0.0"), ("Content-Type", OCTET), ("Upload-Offset", o.as_str())];
    h.extend_from_slice(extra);
    api.send("PATCH", &format!("/files/{id}"), &h, Some(body)).await
}

fn quota(v: &Value) -> (String, u64, u64, u64) {
    let q = &v["quota"];
    (q["name"].as_str().unwrap_or_default().to_string(), q["limit"].as_u64().unwrap(), q["used"].as_u64().unwrap(), q["requested"].as_u64().unwrap())
}

#[tokio::test]
async fn bytes_quota_refuses_a_creation_that_does_not_fit_and_says_limit_and_use() {
    let (_d, s) = server_with("[limits]\nmax_bytes = 1000\n", &[]);
    let api = Api::new(&s);
    let first = create(&api, &[("Upload-Length", "600")]).await;
    assert_eq!(first.status(), 201);
    let first = id_of(&first);

    let over = create(&api, &[("Upload-Length", "500")]).await;
    assert_eq!(header(&over, "tus-resumable"), Some("1.0.0"), "a TUS answer");
    assert!(header(&over, "location").is_none() && header(&over, "retry-after").is_none());
    let v = problem(over, 507, "quota_exceeded").await;
    assert_eq!(quota(&v), ("bytes".into(), 1000, 600, 500), "{v}");
    assert_eq!(v["retryable"], false);
    assert!(v["detail"].as_str().unwrap().contains("600 of 1000 bytes"), "{v}");
    assert_eq!(json(api.get("/api/v1/files").await).await["files"].as_array().unwrap().len(), 1, "nothing was created");

    // Exactly up to the limit fits; deleting frees the room.
    assert_eq!(create(&api, &[("Upload-Length", "400")]).await.status(), 201);
    assert_eq!(create(&api, &[("Upload-Length", "1")]).await.status(), 507);
    let r = api.send("DELETE", &format!("/files/{first}"), &[("Tus-Resumable", "1.0.0")], None).await;
    assert_eq!(r.status(), 204);
    assert_eq!(create(&api, &[("Upload-Length", "600")]).await.status(), 201);

    // A concatenation's final reserves the sum of its parts.
    let (_d2, s2) = server_with("[limits]\nmax_bytes = 1000\n", &[]);
    let api = Api::new(&s2);
    let mut parts = Vec::new();
    for _ in 0..2 {
        let r = create(&api, &[("Upload-Length", "300"), ("Upload-Concat", "partial")]).await;
        assert_eq!(r.status(), 201);
        let id = id_of(&r);
        assert_eq!(patch(&api, &id, 0, pseudo_random(300, 1), &[]).await.status(), 204);
        parts.push(format!("/files/{id}"));
    }
    let fin = format!("final;{}", parts.join(" "));
    let v = problem(create(&api, &[("Upload-Concat", &fin)]).await, 507, "quota_exceeded").await;
    assert_eq!(quota(&v), ("bytes".into(), 1000, 600, 600), "{v}");
}

/// A final over deferred-length parts (concatenation-unfinished) is stored beside its parts:
/// declaring a part's length that makes them never fit the bytes quota together is refused (507,
/// nothing stored), rather than leaving a final that can never be built and a part that cannot
/// be deleted.
#[tokio::test]
async fn a_declared_part_length_cannot_make_a_final_that_never_fits_the_bytes_quota() {
    let (_d, s) = server_with("[limits]\nmax_bytes = 1000\n", &[]);
    let api = Api::new(&s);
    let d = id_of(&create(&api, &[("Upload-Defer-Length", "1"), ("Upload-Concat", "partial")]).await);
    let r = create(&api, &[("Upload-Concat", &format!("final;/files/{d} /files/{d} /files/{d}"))]).await;
    assert_eq!(r.status(), 201);
    let fin = id_of(&r);
    let v = problem(patch(&api, &d, 0, vec![0; 400], &[("Upload-Length", "400")]).await, 507, "quota_exceeded").await;
    let detail = v["detail"].as_str().unwrap();
    assert!(detail.contains(&fin) && detail.contains("1200 bytes") && detail.contains("quota of 1000 bytes"), "{v}");
    assert_eq!((v["retryable"].as_bool(), v["partial"]["cursor"].as_u64()), (Some(false), Some(0)), "{v}");
    assert_eq!(quota(&v), ("bytes".into(), 1000, 0, 400), "{v}");
    // 250 × 3 beside 250 fits.
    assert_eq!(patch(&api, &d, 0, vec![1; 250], &[("Upload-Length", "250")]).await.status(), 204);
    let f = api.file(&fin).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut f = f;
    while f["complete"] != true {
        assert!(std::time::Instant::now() < deadline, "never built: {f}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        f = api.file(&fin).await;
    }
    assert_eq!(f["size"], 750, "{f}");
}

/// A final that passed every check but can never fit beside its parts (the quota was lowered
/// since) fails for good: 409 `quota_exceeded`, not retryable, and its part can be deleted.
#[tokio::test]
async fn a_final_that_can_never_fit_the_lowered_quota_fails_for_good() {
    let (d, mut s) = server_with("[limits]\nmax_bytes = 5000\n", &[]);
    let api = Api::new(&s);
    let part = id_of(&create(&api, &[("Upload-Defer-Length", "1"), ("Upload-Concat", "partial")]).await);
    let fin = id_of(&create(&api, &[("Upload-Concat", &format!("final;/files/{part} /files/{part}"))]).await);
    assert_eq!(patch(&api, &part, 0, vec![3; 300], &[("Upload-Length", "600")]).await.status(), 204);
    let lower = write_file(d.path(), "lower.toml", "[limits]\nmax_bytes = 1500\n");
    s.restart_with(&["--config", lower.to_str().unwrap()]);
    let api = Api::new(&s);
    assert_eq!(patch(&api, &part, 300, vec![3; 300], &[]).await.status(), 204);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let v = loop {
        let r = api.get(&format!("/files/{fin}")).await;
        let status = r.status().as_u16();
        let v = json(r).await;
        if v["code"] != "upload_incomplete" {
            assert_eq!(status, 409, "{v}");
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "the final never failed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(v["code"], "quota_exceeded", "{v}");
    assert!(v["detail"].as_str().unwrap().contains("1200 bytes") && v["detail"].as_str().unwrap().contains("1500"), "{v}");
    assert_eq!(v["retryable"], false, "{v}");
    let r = api.send("DELETE", &format!("/files/{part}"), &[("Tus-Resumable", "1.0.0")], None).await;
    assert_eq!(r.status(), 204);
}

/// A final that fits the quota beside its parts but not beside the principal's other files
/// waits for room (its task's error says the true use), and is built once room returns.
#[tokio::test]
async fn a_final_waiting_for_quota_room_says_the_true_use_and_is_built_once_room_returns() {
    let (_d, s) = server_with("[limits]\nmax_bytes = 1000\n", &[]);
    let api = Api::new(&s);
    let other = id_of(&create(&api, &[("Upload-Length", "700")]).await);
    let d = id_of(&create(&api, &[("Upload-Defer-Length", "1"), ("Upload-Concat", "partial")]).await);
    let r = create(&api, &[("Upload-Concat", &format!("final;/files/{d} /files/{d}"))]).await;
    let fin = id_of(&r);
    assert_eq!(patch(&api, &d, 0, vec![2; 150], &[("Upload-Length", "150")]).await.status(), 204);
    let tasks = json(api.get("/api/v1/tasks").await).await;
    let task = tasks["tasks"].as_array().unwrap().iter().find(|t| t["kind"] == "concat").cloned().expect("a concat task");
    let task = api.wait_status(task["id"].as_str().unwrap(), "failed", 10).await;
    let msg = task["error"]["message"].as_str().unwrap();
    assert!(msg.contains("850 of 1000 bytes stored; this needs 300 more"), "{task}");
    // Its parts are all uploaded: the final says it is being built, not that it waits for them.
    let v = problem(api.get(&format!("/files/{fin}")).await, 409, "upload_incomplete").await;
    assert!(v["detail"].as_str().unwrap().contains("all 2 of its parts are uploaded"), "{v}");

    let r = api.send("DELETE", &format!("/files/{other}"), &[("Tus-Resumable", "1.0.0")], None).await;
    assert_eq!(r.status(), 204);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let f = api.file(&fin).await;
        if f["complete"] == true {
            assert_eq!(f["size"], 300, "{f}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never built: {f}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn uploads_in_progress_quota_answers_429_until_one_finishes() {
    let (_d, s) = server_with("[limits]\nmax_uploads_in_progress = 2\n", &[]);
    let api = Api::new(&s);
    let a = id_of(&create(&api, &[("Upload-Length", "10")]).await);
    let _b = id_of(&create(&api, &[("Upload-Defer-Length", "1")]).await);
    let over = create(&api, &[("Upload-Length", "10")]).await;
    let v = problem(over, 429, "quota_exceeded").await;
    assert_eq!(quota(&v), ("uploads_in_progress".into(), 2, 2, 1), "{v}");
    assert!(v["recovery_hint"].as_str().unwrap().contains("unfinished"), "{v}");

    // Finishing one makes room; a finished file does not count.
    assert_eq!(patch(&api, &a, 0, vec![7; 10], &[]).await.status(), 204);
    assert_eq!(create(&api, &[("Upload-Length", "10")]).await.status(), 201);
    assert_eq!(create(&api, &[("Upload-Length", "10")]).await.status(), 429);
}

#[tokio::test]
async fn deferred_length_crossing_the_quota_mid_upload_keeps_what_fits_and_says_so() {
    let (_d, s) = server_with("[limits]\nmax_bytes = 1000\n", &[]);
    let api = Api::new(&s);
    // 300 bytes stored in a finished file.
    let done = id_of(&create(&api, &[("Upload-Length", "300")]).await);
    assert_eq!(patch(&api, &done, 0, pseudo_random(300, 2), &[]).await.status(), 204);

    let data = pseudo_random(900, 3);
    let up = id_of(&create(&api, &[("Upload-Defer-Length", "1")]).await);
    assert_eq!(patch(&api, &up, 0, data[..500].to_vec(), &[]).await.status(), 204);
    // 500 more do not fit: 200 do (300 + 500 + 200 = 1000).
    let r = patch(&api, &up, 500, data[500..].to_vec(), &[]).await;
    assert_eq!(header_u64(&r, "upload-offset"), Some(700), "the durable offset, where to resume");
    let v = problem(r, 507, "quota_exceeded").await;
    assert_eq!(v["partial"]["cursor"], 700, "{v}");
    let (name, limit, used, requested) = quota(&v);
    assert_eq!((name.as_str(), limit, used), ("bytes", 1000, 1000), "{v}");
    assert!(requested >= 1, "{v}");

    // The stored bytes are intact: HEAD says 700, and declaring that length finishes the file
    // with exactly the first 700 bytes.
    let head = api.send("HEAD", &format!("/files/{up}"), &[("Tus-Resumable", "1.0.0")], None).await;
    assert_eq!(header_u64(&head, "upload-offset"), Some(700));
    // A length past the quota is refused before any byte is read, the offset unchanged.
    let v = problem(patch(&api, &up, 700, Vec::new(), &[("Upload-Length", "900")]).await, 507, "quota_exceeded").await;
    assert_eq!(v["partial"]["cursor"], 700, "{v}");
    let r = patch(&api, &up, 700, Vec::new(), &[("Upload-Length", "700")]).await;
    assert_eq!(r.status(), 204);
    let got = api.send("GET", &format!("/files/{up}"), &[], None).await.bytes().await.unwrap();
    assert_eq!(sha256_hex(&got), sha256_hex(&data[..700]));
}

#[tokio::test]
async fn per_principal_overrides_and_mcp_file_upload_begin() {
    let (alice_t, bob_t) = ("fy_alice_quota_token", "fy_bob_quota_token");
    let config = format!(
        "{}[limits]\nmax_bytes = \"1KiB\"\n\n[limits.principals.alice]\nmax_bytes = \"unlimited\"\nmax_uploads_in_progress = 1\n",
        tokens(&[("alice", alice_t), ("bob", bob_t)])
    );
    let (_d, s) = server_with(&config, &[]);
    let (alice, bob) = (Api::with_token(&s, alice_t), Api::with_token(&s, bob_t));
    assert_eq!(create(&alice, &[("Upload-Length", "1000000")]).await.status(), 201, "alice has no bytes limit");
    let v = problem(create(&alice, &[("Upload-Length", "1")]).await, 429, "quota_exceeded").await;
    assert_eq!(quota(&v), ("uploads_in_progress".into(), 1, 1, 1));
    let v = problem(create(&bob, &[("Upload-Length", "2000")]).await, 507, "quota_exceeded").await;
    assert_eq!(quota(&v), ("bytes".into(), 1024, 0, 2000), "bob has the default; alice's bytes are not his");

    // MCP: the same refusal as data, with the numbers, valid against the tool's outputSchema.
    use rmcp::model::*;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::ServiceExt;
    let cfg = StreamableHttpClientTransportConfig::with_uri(s.url("/mcp")).auth_header(bob_t.to_string());
    let c = ClientConfig::new(ClientCapabilities::default(), Implementation::new("quota-test", "0"))
        .serve(rmcp::transport::StreamableHttpClientTransport::from_config(cfg))
        .await
        .expect("MCP connects");
    let Value::Object(args) = json!({"name": "big.bin", "size": 5000}) else { unreachable!() };
    let r = c.call_tool(CallToolRequestParams::new("file_upload_begin".to_string()).with_arguments(args)).await.expect("file_upload_begin");
    assert_eq!(r.is_error, Some(true));
    let out = r.structured_content.expect("structuredContent");
    assert_eq!(out["error"]["code"], "quota_exceeded", "{out}");
    assert_eq!(out["error"]["quota"], json!({"name": "bytes", "limit": 1024, "used": 0, "requested": 5000}), "{out}");
    let tools = c.list_all_tools().await.unwrap();
    let schema = Value::Object(tools.iter().find(|t| t.name == "file_upload_begin").unwrap().output_schema.as_deref().cloned().unwrap());
    let validator = jsonschema::validator_for(&schema).unwrap();
    assert!(validator.is_valid(&out), "the refusal fits file_upload_begin's outputSchema: {out}");
    let _ = c.cancel().await;
}

#[tokio::test]
async fn a_task_output_past_the_quota_fails_the_task_and_frees_its_bytes() {
    let (_d, s) = server_with("[limits]\nmax_bytes = \"20MiB\"\n", &[]);
    let api = Api::new(&s);
    // 12 MiB stored; a tar of it needs > 8 MiB more.
    let data = pseudo_random(12 << 20, 4);
    let id = api.upload(&data, "a.bin").await;
    let task = api.start("archive", &format!(r#"{{"files":["{id}"],"format":"tar"}}"#)).await;
    let t = api.wait_status(task["id"].as_str().unwrap(), "failed", 120).await;
    assert_eq!(t["error"]["code"], "quota_exceeded", "{t}");
    // Its partial output was removed: only the input is left, and it still downloads whole.
    let files = json(api.get("/api/v1/files").await).await;
    assert_eq!(files["files"].as_array().unwrap().len(), 1, "{files}");
    assert_eq!(sha256_hex(&api.download(&id).await), sha256_hex(&data));
}

/// Poll `GET /files/{id}` until it answers `status` (deadline 60 s).
async fn wait_gone(api: &Api, id: &str) -> u16 {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let st = api.send("GET", &format!("/files/{id}"), &[], None).await.status().as_u16();
        if st == 410 || st == 404 {
            return st;
        }
        assert!(std::time::Instant::now() < deadline, "file {id} still answers {st} after 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn retention_removes_finished_files_after_their_time_with_the_expiry_event() {
    let (alice_t, bob_t) = ("fy_alice_ret_token", "fy_bob_ret_token");
    let config = format!(
        "{}[limits]\nretain_finished = \"2s\"\n\n[limits.principals.alice]\nretain_finished = \"never\"\n",
        tokens(&[("alice", alice_t), ("bob", bob_t)])
    );
    let (_d, s) = server_with(&config, &["--sweep-interval", "200ms"]);
    let (alice, bob) = (Api::with_token(&s, alice_t), Api::with_token(&s, bob_t));
    // Bob's event stream from now on (SSE), to see the expiry machinery's event.
    let events = bob.send("GET", "/api/v1/events", &[("accept", "text/event-stream")], None).await;
    assert_eq!(events.status(), 200);

    let kept = alice.upload(b"alice keeps this", "keep.txt").await;
    let gone = bob.upload(b"bob's file is removed after 2 s", "gone.txt").await;
    let unfinished = id_of(&create(&bob, &[("Upload-Length", "10")]).await);
    assert_eq!(bob.send("GET", &format!("/files/{gone}"), &[], None).await.status(), 200);
    let f = json(bob.get(&format!("/api/v1/files/{gone}")).await).await;
    assert!(f.to_string().contains("expires"), "the file view says when it is removed: {f}");

    assert_eq!(wait_gone(&bob, &gone).await, 410, "removed by retention: 410 while the tombstone is kept");
    // The event the expiry sweeper emits, with the file's id.
    let mut stream = events.bytes_stream();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut text = String::new();
    use futures::StreamExt;
    while !(text.contains("upload.expired") && text.contains(&gone)) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let chunk = tokio::time::timeout(left, stream.next()).await.expect("upload.expired within 30 s").expect("stream open").unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    // Alice's file (retain_finished = "never") and bob's unfinished upload are untouched.
    assert_eq!(alice.send("GET", &format!("/files/{kept}"), &[], None).await.status(), 200);
    let head = bob.send("HEAD", &format!("/files/{unfinished}"), &[("Tus-Resumable", "1.0.0")], None).await;
    assert_eq!(head.status(), 200);
    let metrics = reqwest::get(s.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "ferry_uploads_retention_removed_total 1"), "{metrics}");
}
