//! Tool results: small JSON objects, and failures as data (DESIGN §5).
//!
//! A failure a model can repair is
//! `{"status":"failed","error":{"code","message","retryable","recoveryHint","partial":{"cursor"}}}`
//! with `isError: true`; `code` is one of `ErrorCode::ALL`, the same words as HTTP problem
//! bodies. The shapes are Rust types in [`super::results`], which also generate every tool's
//! `outputSchema`.

use crate::error::Refusal;
use rmcp::model::{CallToolResult, ContentBlock as Content};
use serde::Serialize;
use serde_json::json;

use super::results::{ErrorObject, FailedStatus, Failure};

/// `{"status":"failed","error":{…}}` as an `isError` tool result; `hint` is the next step in
/// this facade's words (`mcp::for_model`).
pub fn failure(e: &Refusal, hint: String) -> CallToolResult {
    result(&Failure { status: FailedStatus::Failed, error: ErrorObject::of(e, hint) }, Vec::new(), true)
}

/// A tool result: `out` as `structuredContent` and as the text of the first content block (for
/// clients that only read text), then `extra` blocks (e.g. resource links).
pub fn result<T: Serialize>(out: &T, extra: Vec<Content>, is_error: bool) -> CallToolResult {
    let structured = serde_json::to_value(out).expect("tool results serialise");
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ErrorCode, Next};

    #[test]
    fn envelope_shape_and_cursor() {
        let e = Refusal::new(409, ErrorCode::OffsetMismatch, "expected offset 131072, got 0", Next::ByCode).with_cursor(131072);
        let r = failure(&e, "Re-send this chunk starting at offset 131072.".into());
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
