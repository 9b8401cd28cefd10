//! The shapes of tool results, as Rust types: each tool's `outputSchema` is generated from the
//! same type its results are serialised from ([`output_schema`]), so a result cannot break its
//! own schema in any state — success, every error code, a restarted task, input requests, or a
//! terminal task (issue 9, item 1).
//!
//! Every schema is `anyOf` the tool's own shape and [`Failure`] (the DESIGN §5 envelope),
//! because some clients validate error results too. Task-shaped results ([`TaskOut`]) carry
//! the envelope's `error` themselves when the task failed or was cancelled.

use std::collections::BTreeMap;

use crate::error::{ErrorCode, Refusal};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::app::views::FileSummary;
use crate::catalog::{Progress, TaskStatus};

/// `status` of a result that is not about a task.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OkStatus {
    /// The call did what was asked.
    Ok,
}

/// `status` of a failed call.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailedStatus {
    /// The call failed; see `error`.
    Failed,
}

/// A task's status, as MCP names them; `completed`, `failed` and `cancelled` are terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl From<TaskStatus> for TaskState {
    fn from(s: TaskStatus) -> Self {
        match s {
            TaskStatus::Working => TaskState::Working,
            TaskStatus::InputRequired => TaskState::InputRequired,
            TaskStatus::Completed => TaskState::Completed,
            TaskStatus::Failed => TaskState::Failed,
            TaskStatus::Cancelled => TaskState::Cancelled,
        }
    }
}

fn error_code_schema(_: &mut SchemaGenerator) -> Schema {
    let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    schemars::json_schema!({ "type": "string", "enum": codes, "description": "Stable error code (the same words as HTTP problem bodies)." })
}

/// Durable progress of a failed call: where to resume.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Partial {
    /// Byte offset (or checkpoint) to resume from.
    pub cursor: u64,
}

/// Why a call failed and the one next step that repairs it (DESIGN §5).
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorObject {
    #[schemars(schema_with = "error_code_schema")]
    pub code: String,
    pub message: String,
    /// Whether the same call may succeed later unchanged.
    pub retryable: bool,
    /// The next step to take.
    #[serde(rename = "recoveryHint")]
    pub recovery_hint: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial: Option<Partial>,
    /// For `quota_exceeded`: which quota, its limit and the current use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaOut>,
}

/// A per-principal quota that refused a call (`error.quota`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaOut {
    /// `bytes` (bytes stored) or `uploads_in_progress` (unfinished uploads).
    pub name: String,
    /// The configured limit (bytes, or a count).
    pub limit: u64,
    /// The current use without this call (bytes, or a count).
    pub used: u64,
    /// What the call needed on top (bytes, or 1 upload).
    pub requested: u64,
}

impl ErrorObject {
    /// The envelope of `e` with its hint as the MCP layer words it (`hint`).
    pub fn of(e: &Refusal, hint: String) -> Self {
        ErrorObject {
            code: e.code.as_str().to_string(),
            message: e.detail.clone(),
            retryable: e.code.retryable(),
            recovery_hint: hint,
            partial: e.cursor.map(|cursor| Partial { cursor }),
            quota: e.quota.as_deref().map(|q| QuotaOut { name: q.name.to_string(), limit: q.limit, used: q.used, requested: q.requested }),
        }
    }
}

/// `{"status":"failed","error":{…}}`: a call that failed (DESIGN §5).
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Failure {
    pub status: FailedStatus,
    pub error: ErrorObject,
}

/// `file_status`, `file_upload_chunk`: one file's handle.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileOut {
    pub status: OkStatus,
    pub file: FileSummary,
}

/// `file_upload_begin`: the handle and how to send the bytes.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BeginOut {
    pub status: OkStatus,
    pub file: FileSummary,
    /// Signed TUS URL: PATCH the bytes here without a token.
    pub upload_url: String,
    /// A page for a person (absent when the server runs with `--no-web`): open it in a browser
    /// to drop the file in; it uploads into this upload and shows the sha256.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_url: Option<String>,
    /// `PATCH`.
    pub method: String,
    /// Headers to send with each PATCH (placeholders in angle brackets).
    pub headers: BTreeMap<String, String>,
    /// RFC 3339: when `upload_url` stops working.
    pub expires_at: String,
    /// Largest decoded `file_upload_chunk` chunk, bytes.
    pub max_inline_chunk: u64,
    /// A shell line that sends the whole file with curl, streaming it (`-T`): run it with
    /// `UPLOAD_URL` set to `upload_url` and `FILE` to the file's path.
    pub curl: String,
    /// A shell line that resumes an interrupted upload: HEAD for the server's offset, then
    /// PATCH the rest of `FILE` from there (same variables as `curl`).
    pub curl_resume: String,
}

/// `file_download_url`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UrlOut {
    pub status: OkStatus,
    /// Signed URL: GET (with Range) without a token until `expires_at`.
    pub download_url: String,
    /// A download page for a person (name, size, sha256, a download button); absent when the
    /// server runs with `--no-web`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_url: Option<String>,
    /// True when the file is not finished yet: the URL follows it (`follow=1`), sending the
    /// bytes as they arrive and ending once the file is complete, with its sha256 as the
    /// `Repr-Digest` trailer (curl: send `TE: trailers`); it fails, never ends short, if the
    /// file is abandoned. Absent for a finished file.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub follows: bool,
    /// RFC 3339.
    pub expires_at: String,
    pub file: FileSummary,
}

/// `text` or `base64`.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    Text,
    Base64,
}

/// `file_read_chunk`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadOut {
    pub status: OkStatus,
    /// First byte read.
    pub offset: u64,
    /// Bytes read.
    pub length: u64,
    /// Where the next read starts.
    pub next_offset: u64,
    /// `next_offset` is the end of the file.
    pub eof: bool,
    pub encoding: Encoding,
    pub data: String,
}

/// `file_list`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListOut {
    pub status: OkStatus,
    pub files: Vec<FileSummary>,
}

/// `file_delete`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeletedOut {
    pub status: OkStatus,
    /// The deleted file's id.
    pub deleted: String,
}

/// `task_respond`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RespondOut {
    pub status: TaskState,
    pub task_id: String,
    /// False when the key was not outstanding (the answer was ignored).
    pub accepted: bool,
}

/// One task of `task_list`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskBrief {
    pub task_id: String,
    pub kind: String,
    pub status: TaskState,
}

/// `task_list`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskListOut {
    pub status: OkStatus,
    pub tasks: Vec<TaskBrief>,
}

/// Progress of a task: a fraction in [0, 1] when known, a message, named counters.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProgressOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
}

impl From<&Progress> for ProgressOut {
    fn from(p: &Progress) -> Self {
        ProgressOut { fraction: p.fraction, message: p.message.clone(), counters: p.counters.clone() }
    }
}

/// A file a task produced: its handle and a signed download URL.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProducedFile {
    pub file: FileSummary,
    /// Signed URL (1 h): GET without a token.
    pub download_url: String,
}

/// A task's view: job tools, `task_get`, `task_cancel`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskOut {
    pub status: TaskState,
    pub task_id: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressOut>,
    /// Id of the failed or cancelled task this run retries (same `idempotency_key`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prior_failure: Option<String>,
    /// `task_get`, while the task is not terminal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_with: Option<String>,
    /// Suggested wait before polling again, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_after_ms: Option<u64>,
    /// Questions to answer with task_respond, by key (`input_required`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_requests: Option<BTreeMap<String, Value>>,
    /// The (first) file the task produced (`completed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<FileSummary>,
    /// Signed download URL of `file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub download_url: Option<String>,
    /// Every file the task produced, when it produced more than one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<Vec<ProducedFile>>,
    /// The rest of the job's result (`completed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why the task failed or was cancelled (`failed`, `cancelled`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorObject>,
    /// Partial results the task appended while it worked (when it has any, or `partial_after`
    /// was given): small JSON fragments, separate from `result`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial: Option<PartialOut>,
}

/// A task's partial results as a tool result shows them: at most [`MCP_PARTIAL_BYTES`] of
/// fragments per result; `more` says there are newer ones to read with `partial_after: next`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PartialOut {
    /// Fragments numbered above `partial_after`, oldest first.
    pub fragments: Vec<FragmentOut>,
    /// How many of the task's fragments were dropped (past 256 or 64 KiB, oldest first).
    pub dropped: u64,
    /// Pass as `partial_after` to task_get to read only newer fragments.
    pub next: u64,
    /// True when fragments newer than `next` were left out of this result (call task_get again
    /// with `partial_after: next`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub more: bool,
}

/// One partial result fragment.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FragmentOut {
    /// 1, 2, 3… per task.
    pub seq: u64,
    /// When it was appended, Unix ms.
    pub at_ms: i64,
    /// The fragment, any JSON.
    pub value: Value,
}

/// The most fragment text one tool result carries, bytes (at least one fragment is shown).
pub const MCP_PARTIAL_BYTES: usize = 4096;

impl PartialOut {
    /// `page` cut to [`MCP_PARTIAL_BYTES`].
    pub fn of(page: &crate::catalog::PartialPage) -> PartialOut {
        let mut used = 0;
        let mut fragments = Vec::new();
        for f in &page.fragments {
            used += crate::catalog::partials::view_cost(f.value.get().len());
            if !fragments.is_empty() && used > MCP_PARTIAL_BYTES {
                break;
            }
            fragments.push(FragmentOut { seq: f.seq, at_ms: f.at_ms, value: serde_json::from_str(f.value.get()).unwrap_or(Value::Null) });
        }
        let more = fragments.len() < page.fragments.len();
        let next = if more { fragments.last().map_or(page.next, |f| f.seq) } else { page.next };
        PartialOut { fragments, dropped: page.dropped, next, more }
    }
}

impl TaskOut {
    /// A task view with only its status, id and kind.
    pub fn new(status: TaskState, task_id: &str, kind: &str) -> Self {
        TaskOut {
            status,
            task_id: task_id.to_string(),
            kind: kind.to_string(),
            progress: None,
            prior_failure: None,
            poll_with: None,
            poll_after_ms: None,
            input_requests: None,
            file: None,
            download_url: None,
            files: None,
            result: None,
            error: None,
            partial: None,
        }
    }
}

/// A tool's result: its own shape, or the failure envelope (only its schema is used).
#[allow(dead_code)]
#[derive(Serialize, JsonSchema)]
#[serde(untagged)]
enum Reply<T> {
    Ok(T),
    Failed(Failure),
}

/// The `outputSchema` of a tool whose results are `T` (or [`Failure`]): generated by schemars,
/// every subschema inlined (no `$ref`, so validators of any draft read it), with a root
/// `"type": "object"` as MCP requires, and without `$schema` and the integer `format`s
/// (`uint64`…) that some validators refuse as unknown.
pub fn output_schema<T: JsonSchema>() -> Map<String, Value> {
    // The serialize contract: a member serde skips when empty (`skip_serializing_if`) is
    // optional in the schema, as it is in the results (issue 23: `progress.counters`).
    let settings = schemars::generate::SchemaSettings::draft2020_12().for_serialize().with(|s| {
        s.inline_subschemas = true;
        s.meta_schema = None;
    });
    let schema = settings.into_generator().into_root_schema_for::<Reply<T>>();
    let mut v = schema.to_value();
    clean(&mut v);
    let Value::Object(mut m) = v else { unreachable!("a root schema is an object") };
    m.remove("title");
    m.insert("type".into(), json!("object"));
    m
}

/// Drop `format` annotations of numbers (`uint64`, `double`…): not JSON Schema formats.
fn clean(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if m.get("format").and_then(Value::as_str).is_some_and(|f| f.starts_with("int") || f.starts_with("uint") || f == "double" || f == "float")
            {
                m.remove("format");
            }
            m.values_mut().for_each(clean);
        }
        Value::Array(a) => a.iter_mut().for_each(clean),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_are_objects_without_refs() {
        for s in [output_schema::<TaskOut>(), output_schema::<FileOut>(), output_schema::<ReadOut>()] {
            assert_eq!(s["type"], "object");
            let text = serde_json::to_string(&s).unwrap();
            assert!(!text.contains("$ref") && !text.contains("$schema") && !text.contains("uint64"), "{text}");
        }
    }
}
