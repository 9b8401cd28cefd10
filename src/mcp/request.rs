//! `file_request`: ask a person for a file of any size in one call. It creates an upload of
//! deferred length (the page sets `Upload-Length` when the person picks the file) and returns
//! the page link to give them — the MCP side of `ferry request` and the dashboard's
//! "Request a file".

use std::sync::Arc;

use rmcp::model::{Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::envelope::result;
use super::results::{output_schema, OkStatus};
use super::{handle, invalid, FerryMcp, Outcome};
use crate::app::views::FileSummary;
use crate::signing::Scope;
use crate::upload::now_ms;

/// Default lifetime of a request's links, ms (7 days, the longest a signed link lives).
const REQUEST_TTL_MS: u64 = crate::signing::MAX_URL_TTL_MS;

/// The tool's name.
pub const NAME: &str = "file_request";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestArg {
    name: String,
    media_type: Option<String>,
    ttl_ms: Option<u64>,
}

/// `file_request`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestOut {
    pub status: OkStatus,
    /// The upload the person's file goes into (size `null` until they pick it).
    pub file: FileSummary,
    /// The page to give the person: they open it in a browser and drop a file of any size in;
    /// it shows the sha256 the server stored. Absent when the server runs with `--no-web`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_url: Option<String>,
    /// The same request as a signed TUS URL, for a program (PATCH with `Upload-Length` on the
    /// first chunk).
    pub upload_url: String,
    /// RFC 3339: when both links stop working.
    pub expires_at: String,
}

/// The tool's catalogue entry.
pub fn tool() -> Tool {
    let input = json!({
        "type": "object",
        "properties": {
            "name": { "type": "string", "minLength": 1, "maxLength": 255, "description": "Name the received file gets, e.g. signed-contract.pdf." },
            "media_type": { "type": "string", "description": "e.g. application/pdf (default application/octet-stream)." },
            "ttl_ms": {
                "type": "integer",
                "minimum": 1,
                "maximum": crate::signing::MAX_URL_TTL_MS,
                "description": "Lifetime of the links, ms (default 7 days, the longest)."
            }
        },
        "required": ["name"],
        "additionalProperties": false
    });
    let serde_json::Value::Object(input) = input else { unreachable!("an object") };
    let title = "Request a file from a person";
    let mut t = Tool::new(
        NAME,
        "Ask a person for a file whose size you need not know: returns page_url, a page they open in a browser to drop the file in \
         (any size; it resumes after interruptions and shows the sha256). Poll file_status with the returned file id to see it arrive.",
        Arc::new(input),
    );
    t.title = Some(title.to_string());
    t.output_schema = Some(Arc::new(output_schema::<RequestOut>()));
    t.annotations = Some(ToolAnnotations::from_raw(Some(title.to_string()), Some(false), Some(false), Some(false), Some(false)));
    t
}

impl FerryMcp {
    pub(super) async fn file_request(&self, p: &str, a: &Option<rmcp::model::JsonObject>) -> Outcome {
        let a: RequestArg = super::args(NAME, a)?;
        let ttl = a.ttl_ms.unwrap_or(REQUEST_TTL_MS);
        if !(1..=crate::signing::MAX_URL_TTL_MS).contains(&ttl) {
            return Err(invalid("ttl_ms must be from 1 to 604800000 (7 days)", "Omit ttl_ms for 7 days."));
        }
        let rec = self.create_named(p, &a.name, None, a.media_type.as_deref(), None, true).await?;
        let signed = self.state.links.signed(Scope::Upload, &rec.id, ttl, now_ms());
        let (file, link) = handle(&rec);
        let out = RequestOut {
            status: OkStatus::Ok,
            file,
            page_url: signed.page_url,
            upload_url: signed.url,
            expires_at: crate::upload::rfc3339(signed.expires_at_ms),
        };
        Ok(result(&out, vec![link], false))
    }
}
