//! Tool results: small JSON objects, and failures as data (DESIGN §5).
//!
//! A failure a model can repair is
//! `{"status":"failed","error":{"code","message","retryable","recoveryHint","partial":{"cursor"}}}`
//! with `isError: true`; `code` is one of [`ErrorCode::ALL`], the same words as HTTP problem
//! bodies. Every tool's `outputSchema` ([`output_schema`]) admits both its success shape and
//! this envelope, because some clients validate error results too.

use ferry_tus::{ErrorCode, TusError};
use rmcp::model::{CallToolResult, ContentBlock as Content};
use serde_json::{json, Map, Value};

/// The error object of the failure envelope.
pub fn error_object(e: &TusError) -> Value {
    let mut err = json!({
        "code": e.code.as_str(),
        "message": e.detail,
        "retryable": e.code.retryable(),
        "recoveryHint": e.recovery_hint,
    });
    if let Some(c) = e.cursor {
        err["partial"] = json!({ "cursor": c });
    }
    err
}

/// `{"status":"failed","error":{…}}` as an `isError` tool result.
pub fn failure(e: &TusError) -> CallToolResult {
    result(json!({ "status": "failed", "error": error_object(e) }), Vec::new(), true)
}

/// A tool result: `structured` as `structuredContent` and as the text of the first content
/// block (for clients that only read text), then `extra` blocks (e.g. resource links).
pub fn result(structured: Value, extra: Vec<Content>, is_error: bool) -> CallToolResult {
    let mut content = vec![Content::text(structured.to_string())];
    content.extend(extra);
    let mut r = if is_error { CallToolResult::error(content) } else { CallToolResult::success(content) };
    r.structured_content = Some(structured);
    r
}

/// A `resource_link` content block for a file (`ferry://files/{id}`).
pub fn resource_link(id: &str, name: &str, media_type: &str, size: Option<u64>) -> Content {
    let mut v = json!({ "type": "resource_link", "uri": file_uri(id), "name": name, "mimeType": media_type });
    if let Some(s) = size {
        v["size"] = json!(s);
    }
    serde_json::from_value(v).expect("resource_link content shape")
}

/// The MCP resource URI of a file.
pub fn file_uri(id: &str) -> String {
    format!("ferry://files/{id}")
}

/// The id named by a `ferry://files/{id}` URI.
pub fn id_from_uri(uri: &str) -> Option<&str> {
    uri.strip_prefix("ferry://files/").filter(|id| crate::upload::is_valid_id(id))
}

/// The JSON Schema of the failure envelope's `error` object.
fn error_schema() -> Value {
    let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    json!({
        "type": "object",
        "description": "Why the call failed and the one next step that repairs it.",
        "properties": {
            "code": { "type": "string", "enum": codes },
            "message": { "type": "string" },
            "retryable": { "type": "boolean", "description": "Whether the same call may succeed later unchanged." },
            "recoveryHint": { "type": "string", "description": "The next step to take." },
            "partial": {
                "type": "object",
                "properties": { "cursor": { "type": "integer", "minimum": 0, "description": "Byte offset (or checkpoint) to resume from." } }
            }
        },
        "required": ["code", "message", "retryable", "recoveryHint"]
    })
}

/// An `outputSchema`: an object with `status`, the tool's own `properties` (all optional, so
/// the failure envelope fits too), and `error`.
pub fn output_schema(properties: Value) -> Map<String, Value> {
    let mut props = match properties {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    props.insert("status".into(), json!({ "type": "string", "description": "`ok`, a task status, or `failed` (then see `error`)." }));
    props.insert("error".into(), error_schema());
    match json!({ "type": "object", "properties": props, "required": ["status"] }) {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_shape_and_cursor() {
        let e = TusError::new(409, ErrorCode::OffsetMismatch, "expected offset 131072, got 0", "Re-send this chunk starting at offset 131072.").with_cursor(131072);
        let r = failure(&e);
        assert_eq!(r.is_error, Some(true));
        let v = r.structured_content.unwrap();
        assert_eq!(v["status"], "failed");
        assert_eq!(v["error"]["code"], "offset_mismatch");
        assert_eq!(v["error"]["retryable"], true);
        assert_eq!(v["error"]["partial"]["cursor"], 131072);
        assert!(v.to_string().len() < 1024);
    }

    #[test]
    fn uri_round_trip() {
        let id = crate::upload::new_id();
        assert_eq!(id_from_uri(&file_uri(&id)), Some(id.as_str()));
        assert_eq!(id_from_uri("ferry://files/../x"), None);
    }
}
