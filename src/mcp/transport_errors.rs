//! What a client gets when the MCP transport (rmcp's streamable HTTP service) refuses a
//! request before any tool runs: a malformed body, a wrong `Content-Type`, a missing or unknown
//! session. rmcp answers those with a `text/plain` sentence; here they become JSON-RPC 2.0
//! error objects (JSON-RPC 2.0 §5.1: `-32700` parse error, `-32600` invalid request) with no
//! `id` (MCP 2025-06-18 §Transports, Streamable HTTP: "the HTTP response body MAY comprise a
//! JSON-RPC error response that has no id"), so every answer of `/mcp` is JSON a client can read.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{header, HeaderValue, Response, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt as _;

/// Largest transport refusal read to reword it, bytes (rmcp's sentences are a line).
const MAX_REFUSAL_TEXT: usize = 16 << 10;
/// Largest body of a request for a removed method read for its `id`, bytes.
const MAX_REMOVED_BODY: usize = 64 << 10;
/// The first protocol version without `initialize` (stateless lifecycle, SEP-2575).
const STATELESS_VERSION: &str = "2026-07-28";

/// Methods a request of MCP 2026-07-28 or later cannot call (SEP-2575: no handshake, no
/// session, so no session-wide level or subscription; `subscriptions/listen` and `_meta`
/// carry them instead).
const REMOVED_STATELESS: [&str; 5] = ["initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"];

/// Whether `method` is one MCP removed, for a request of protocol `version` (`None`: not
/// stated): `tasks/list` and `tasks/result` (the tasks extension, SEP-2663, dropped them), and
/// [`REMOVED_STATELESS`] from 2026-07-28 on. Such a request is answered -32601 before any
/// other check of it ([`removed`], [`removed_methods`]).
pub fn is_removed(method: &str, version: Option<&str>) -> bool {
    matches!(method, "tasks/list" | "tasks/result") || (REMOVED_STATELESS.contains(&method) && version.is_some_and(|v| v >= STATELESS_VERSION))
}

fn header_text(req: &axum::extract::Request, name: &str) -> Option<String> {
    req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// The -32601 answer to a removed method (JSON-RPC 2.0 §5.1 "Method not found").
pub fn removed(method: &str) -> rmcp::ErrorData {
    rmcp::ErrorData::new(
        rmcp::model::ErrorCode::METHOD_NOT_FOUND,
        format!("{method}: MCP removed this method"),
        Some(serde_json::json!({ "method": method })),
    )
}

/// Middleware before rmcp's Streamable HTTP service: a request whose `Mcp-Method` header
/// (SEP-2243) names a removed method ([`is_removed`], with `MCP-Protocol-Version`) is answered
/// 404 with a -32601 error (MCP 2026-07-28, Transports: "a method the server does not
/// implement"), before rmcp checks its headers, `_meta` or params. The body is read (at most
/// [`MAX_REMOVED_BODY`]) only for the error's `id`. Other requests pass untouched.
pub async fn removed_methods(req: axum::extract::Request, next: axum::middleware::Next) -> Response<Body> {
    let (method, version) = (header_text(&req, "mcp-method"), header_text(&req, "mcp-protocol-version"));
    let Some(method) = method.filter(|m| is_removed(m, version.as_deref())) else {
        return next.run(req).await;
    };
    let body = http_body_util::Limited::new(req.into_body(), MAX_REMOVED_BODY).collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let id = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| v.get("id").cloned()).unwrap_or(serde_json::Value::Null);
    let e = removed(&method);
    let body = serde_json::json!({ "jsonrpc": "2.0", "id": id, "error": { "code": e.code.0, "message": e.message, "data": e.data } });
    let mut res = Response::new(Body::from(body.to_string()));
    *res.status_mut() = StatusCode::NOT_FOUND;
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

/// `svc` with its plain-text client errors (4xx) answered as JSON-RPC errors; every other
/// answer (JSON, event streams, 2xx/5xx) passes through untouched and unbuffered.
pub fn json_rpc_refusals<S, Req, B>(svc: S) -> impl tower::Service<Req, Response = Response<Body>, Error = Infallible, Future: Send> + Clone + Send
where
    S: tower::Service<Req, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    tower::ServiceExt::and_then(svc, |res: Response<B>| async move { Ok(reword(res).await) })
}

async fn reword<B>(res: Response<B>) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let (mut parts, body) = res.into_parts();
    let media = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let json_or_stream = media.starts_with("application/json") || media.starts_with("text/event-stream");
    if !parts.status.is_client_error() || json_or_stream {
        return Response::from_parts(parts, Body::new(body));
    }
    let text = match http_body_util::Limited::new(body, MAX_REFUSAL_TEXT).collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).trim().to_string(),
        Err(_) => String::new(),
    };
    let (status, code, message) = refusal(parts.status, &text);
    parts.status = status;
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let body = serde_json::json!({ "jsonrpc": "2.0", "id": null, "error": { "code": code, "message": message } });
    Response::from_parts(parts, Body::from(body.to_string()))
}

/// The status, JSON-RPC error code and message for a transport refusal `text` sent with
/// `status`: a body that is not a JSON-RPC message is a parse error (400, `-32700`); anything
/// else keeps its status as an invalid request (`-32600`).
fn refusal(status: StatusCode, text: &str) -> (StatusCode, i64, String) {
    let message = if text.is_empty() { status.canonical_reason().unwrap_or("refused").to_string() } else { text.to_string() };
    if text.starts_with("fail to deserialize") {
        return (StatusCode::BAD_REQUEST, -32700, format!("Parse error: the body is not a JSON-RPC 2.0 message ({message})"));
    }
    (status, -32600, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_methods_are_the_protocols() {
        for v in [None, Some("2025-11-25"), Some("2026-07-28")] {
            assert!(is_removed("tasks/list", v) && is_removed("tasks/result", v), "{v:?}");
            assert!(!is_removed("tasks/get", v) && !is_removed("tools/call", v), "{v:?}");
        }
        for m in ["initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"] {
            assert!(is_removed(m, Some("2026-07-28")), "{m}");
            assert!(!is_removed(m, Some("2025-11-25")) && !is_removed(m, None), "{m}");
        }
        assert_eq!(removed("tasks/list").code, rmcp::model::ErrorCode::METHOD_NOT_FOUND);
    }

    #[test]
    fn a_malformed_body_is_a_parse_error_and_other_refusals_keep_their_status() {
        let (s, c, m) = refusal(StatusCode::UNSUPPORTED_MEDIA_TYPE, "fail to deserialize request body key must be a string at line 1 column 2");
        assert_eq!((s, c), (StatusCode::BAD_REQUEST, -32700));
        assert!(m.contains("line 1 column 2"), "{m}");
        let (s, c, m) = refusal(StatusCode::UNSUPPORTED_MEDIA_TYPE, "Unsupported Media Type: Content-Type must be application/json");
        assert_eq!((s, c, m.as_str()), (StatusCode::UNSUPPORTED_MEDIA_TYPE, -32600, "Unsupported Media Type: Content-Type must be application/json"));
        assert_eq!(refusal(StatusCode::NOT_FOUND, "").2, "Not Found");
    }
}
