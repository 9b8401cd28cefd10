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
    fn a_malformed_body_is_a_parse_error_and_other_refusals_keep_their_status() {
        let (s, c, m) = refusal(StatusCode::UNSUPPORTED_MEDIA_TYPE, "fail to deserialize request body key must be a string at line 1 column 2");
        assert_eq!((s, c), (StatusCode::BAD_REQUEST, -32700));
        assert!(m.contains("line 1 column 2"), "{m}");
        let (s, c, m) = refusal(StatusCode::UNSUPPORTED_MEDIA_TYPE, "Unsupported Media Type: Content-Type must be application/json");
        assert_eq!((s, c, m.as_str()), (StatusCode::UNSUPPORTED_MEDIA_TYPE, -32600, "Unsupported Media Type: Content-Type must be application/json"));
        assert_eq!(refusal(StatusCode::NOT_FOUND, "").2, "Not Found");
    }
}
