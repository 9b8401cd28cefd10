//! The generated OpenAPI document at `/api/v1/openapi.json`, fetched from the real binary:
//! it is OpenAPI 3.x JSON, lists every /api/v1 route, describes errors as problem+json, and
//! every operation it lists is actually routed by the server.

mod common;
use common::*;

use serde_json::Value;

/// Every route of `/api/v1` (method, path as documented).
const ROUTES: &[(&str, &str)] = &[
    ("post", "/api/v1/tasks"),
    ("get", "/api/v1/tasks"),
    ("get", "/api/v1/tasks/{id}"),
    ("get", "/api/v1/tasks/{id}/args"),
    ("post", "/api/v1/tasks/{id}/input"),
    ("post", "/api/v1/tasks/{id}/cancel"),
    ("post", "/api/v1/tasks/{id}/progress"),
    ("post", "/api/v1/tasks/{id}/complete"),
    ("post", "/api/v1/tasks/{id}/fail"),
    ("get", "/api/v1/files"),
    ("get", "/api/v1/files/{id}"),
    ("post", "/api/v1/files/{id}/share"),
    ("get", "/api/v1/openapi.json"),
];

async fn fetch(s: &Server) -> Value {
    let r = client().get(s.url("/api/v1/openapi.json")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let ct = r.headers().get("content-type").unwrap().to_str().unwrap().to_string();
    assert!(ct.starts_with("application/json"), "{ct}");
    let text = r.text().await.unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Follow a local `$ref` (`#/components/...`).
fn deref<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let ptr = r.strip_prefix('#').expect("local $ref");
            deref(doc, doc.pointer(ptr).unwrap_or_else(|| panic!("dangling $ref {r}")))
        }
        None => v,
    }
}

#[tokio::test]
async fn document_is_openapi_3_and_lists_every_route() {
    let s = Server::start(&[]);
    let doc = fetch(&s).await;
    let version = doc["openapi"].as_str().expect("openapi version");
    assert!(version.starts_with("3."), "{version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());

    let paths = doc["paths"].as_object().expect("paths");
    for (method, path) in ROUTES {
        let op = paths.get(*path).and_then(|p| p.get(*method)).unwrap_or_else(|| panic!("{method} {path} missing"));
        assert!(op["operationId"].is_string(), "{method} {path} has no operationId");
        let responses = op["responses"].as_object().unwrap();
        assert!(responses.keys().any(|k| k.starts_with('2')), "{method} {path} has no success response");
        let default = deref(&doc, &responses["default"]);
        assert!(default["content"]["application/problem+json"].is_object(), "{method} {path}: default is not problem+json");
    }
    // Nothing documented that the list above does not know of.
    let documented: usize = paths.values().map(|p| ["get", "post", "put", "patch", "delete"].iter().filter(|m| p.get(**m).is_some()).count()).sum();
    assert_eq!(documented, ROUTES.len(), "documented operations: {:?}", paths.keys().collect::<Vec<_>>());

    // Idempotency-Key header and limit query parameter.
    let start = &paths["/api/v1/tasks"]["post"];
    assert!(start["parameters"].as_array().unwrap().iter().any(|p| p["name"] == "Idempotency-Key" && p["in"] == "header"));
    assert!(start["requestBody"]["content"]["application/json"]["schema"].is_object());
    assert!(start["responses"]["409"]["content"]["application/problem+json"].is_object());
    let list = &paths["/api/v1/tasks"]["get"];
    assert!(list["parameters"].as_array().unwrap().iter().any(|p| p["name"] == "limit" && p["in"] == "query"));
    for p in ["/api/v1/tasks/{id}/input", "/api/v1/tasks/{id}/progress", "/api/v1/tasks/{id}/complete", "/api/v1/tasks/{id}/fail"] {
        assert!(paths[p]["post"]["requestBody"]["content"]["application/json"]["schema"].is_object(), "{p} has no request body");
    }

    // Shapes: task view, file view, problem.
    let schemas = &doc["components"]["schemas"];
    let task = &schemas["Task"]["properties"];
    for f in ["id", "kind", "status", "progress", "input_requests", "result", "error", "idempotency_key", "created_at", "updated_at", "ttl_ms", "poll_after_ms"] {
        assert!(task.get(f).is_some(), "Task.{f} missing");
    }
    let statuses = &deref(&doc, &task["status"])["enum"];
    for st in ["working", "input_required", "completed", "failed", "cancelled"] {
        assert!(statuses.as_array().unwrap().iter().any(|v| v == st), "status {st} missing: {statuses}");
    }
    let file = &schemas["File"]["properties"];
    for f in ["id", "name", "media_type", "size", "offset", "complete", "sha256", "url"] {
        assert!(file.get(f).is_some(), "File.{f} missing");
    }
    let problem = &schemas["Problem"];
    for f in ["type", "title", "status", "detail", "code", "retryable", "recovery_hint", "partial"] {
        assert!(problem["properties"].get(f).is_some(), "Problem.{f} missing");
    }
    let codes = &deref(&doc, &problem["properties"]["code"])["enum"];
    for c in ["not_found", "conflict", "invalid_argument", "unauthorized", "upload_incomplete"] {
        assert!(codes.as_array().unwrap().iter().any(|v| v == c), "code {c} missing: {codes}");
    }
    let partial = &problem["properties"]["partial"];
    let partial = partial.get("oneOf").and_then(|o| o.as_array()).map(|o| &o[0]).unwrap_or(partial);
    assert!(deref(&doc, partial)["properties"]["cursor"].is_object(), "partial.cursor missing");

    // Bearer auth.
    let bearer = &doc["components"]["securitySchemes"]["bearer"];
    assert_eq!(bearer["type"], "http");
    assert_eq!(bearer["scheme"], "bearer");
    assert!(doc["security"].as_array().unwrap().iter().any(|s| s.get("bearer").is_some()));

    // Every $ref resolves.
    fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r);
                }
                m.values().for_each(|x| refs(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(!all.is_empty());
    for r in all {
        assert!(doc.pointer(r.trim_start_matches('#')).is_some(), "dangling $ref {r}");
    }
}

/// The document and the router agree: every documented operation reaches a handler (not the
/// router's 404 fallback or its 405).
#[tokio::test]
async fn every_documented_operation_is_routed() {
    let s = Server::start(&[]);
    let doc = fetch(&s).await;
    let c = client();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "post"] {
            if item.get(method).is_none() {
                continue;
            }
            let url = s.url(&path.replace("{id}", "aaaaaaaaaaaaaaaaaaaaaaaaaa"));
            let req = if method == "get" { c.get(&url) } else { c.post(&url).header("content-type", "application/json").body("{}") };
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let body = r.text().await.unwrap();
            assert_ne!(status, 405, "{method} {path}: {body}");
            assert!(!body.contains("no such route"), "{method} {path} is not routed: {body}");
        }
    }
}
