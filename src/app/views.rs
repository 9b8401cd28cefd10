//! The one view of each concept every transport shows (DESIGN §1 "one definition per
//! concept"): a file ([`FileView`], and its compact [`FileSummary`] in MCP results), and the
//! files a task produced ([`TaskOutput`]). Names and media types come from
//! [`crate::upload::describe`], the same function the download's `Content-Type` uses.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::catalog::{Damage, UploadRecord};
use crate::upload::{describe_raw, FileHandle};

/// Path prefix of the TUS upload collection (and of downloads).
pub const FILES_PATH: &str = "/files/";

/// What the API says about a file (an upload): `GET /api/v1/files/{id}`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = File)]
pub struct FileView {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `name` as it may be shown to people: control characters (terminal escapes, BEL, line
    /// breaks) and bidirectional overrides replaced by U+FFFD (`crate::names::display_name`;
    /// the download's `Content-Disposition` offers this name too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// The `Content-Type` `GET /files/{id}` serves.
    pub media_type: String,
    /// Total bytes, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Bytes stored so far.
    pub offset: u64,
    /// All bytes are in.
    pub complete: bool,
    /// Every byte is stored but the server has not finished the upload yet (its pre-finish
    /// hook or a store could not answer): it completes by itself; ask again later.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub finishing: bool,
    /// Lowercase hex, once complete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The stored bytes of this complete file are damaged: `ferry check` found them so, or a
    /// read found them missing. Downloads answer 500 `damaged`. Absent while none is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damaged: Option<DamageView>,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms after which an unfinished upload is swept, or a finished file is removed by its
    /// owner's retention (`retain_finished`); absent when neither applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// Relative URL for GET (download) and TUS requests.
    pub url: String,
    /// The upload's metadata (`Upload-Metadata`, decoded), by key: key →
    /// value: the text when it is UTF-8, `{"base64": "…"}` (the exact bytes) when it is not,
    /// `null` for a key sent without one.
    #[schema(value_type = Object)]
    pub metadata: serde_json::Map<String, Value>,
}

/// What is known to be wrong with a complete file's stored bytes ([`FileView::damaged`]).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Damage)]
pub struct DamageView {
    /// `sha256_mismatch` (the bytes are there but hash to something else) or `missing` (the
    /// bytes, or some at the end, are gone).
    #[schema(example = "missing")]
    pub kind: String,
    /// Unix ms it was found.
    pub found_at: i64,
}

impl FileView {
    /// The view with its damage mark ([`crate::upload::UploadEngine::damage`]), if any.
    pub fn damaged(mut self, d: Option<&Damage>) -> Self {
        self.damaged = d.map(|d| DamageView { kind: d.kind.clone(), found_at: d.found_at_ms });
        self
    }
}

/// The view of an upload record (no damage mark: see [`FileView::damaged`]).
pub fn file_view(r: &UploadRecord) -> FileView {
    let d = describe_raw(&r.metadata);
    FileView {
        id: r.id.clone(),
        display_name: d.name.as_deref().map(crate::names::display_name),
        name: d.name,
        media_type: d.media_type.to_string(),
        size: r.length,
        offset: r.offset,
        complete: r.is_finished(),
        finishing: crate::upload::finishing::awaits_finish(r),
        sha256: r.sha256.map(hex::encode),
        damaged: None,
        created_at: r.created_at_ms,
        expires_at: r.expires_at_ms,
        url: format!("{FILES_PATH}{}", r.id),
        metadata: metadata_map(&r.metadata),
    }
}

/// `Upload-Metadata` text as a JSON object (see [`FileView::metadata`]); unparsable text
/// (never stored: creation checks it) gives an empty object.
fn metadata_map(raw: &str) -> serde_json::Map<String, Value> {
    crate::upload::metadata_json(raw)
}

/// A compact file handle (MCP results): [`FileView`] without timestamps and URL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FileSummary {
    /// File id (26 characters).
    pub id: String,
    /// File name, from the upload's metadata.
    pub name: Option<String>,
    /// Media type (what a download serves as `Content-Type`).
    pub media_type: String,
    /// Total bytes, when known.
    pub size: Option<u64>,
    /// Bytes stored so far.
    pub offset: u64,
    /// All bytes are in.
    pub complete: bool,
    /// sha256 of the bytes, lowercase hex, once complete.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

impl From<FileView> for FileSummary {
    fn from(v: FileView) -> Self {
        FileSummary { id: v.id, name: v.name, media_type: v.media_type, size: v.size, offset: v.offset, complete: v.complete, sha256: v.sha256 }
    }
}

/// The handle of a finished file a task produced, as stored in the task's result (built-in
/// kinds write `{"file": handle, …}`, an `external` producer's files become
/// `{"files": [handle…], "result": …}`). `None` while the upload is unfinished.
pub fn produced_file(r: &UploadRecord) -> Option<FileHandle> {
    let (Some(size), Some(sha)) = (r.length, r.sha256) else { return None };
    if !r.is_finished() {
        return None;
    }
    let d = describe_raw(&r.metadata);
    Some(FileHandle {
        id: r.id.clone(),
        name: d.name.unwrap_or_else(|| r.id.clone()),
        media_type: d.media_type.to_string(),
        size,
        sha256: hex::encode(sha),
    })
}

/// A task's result split into the files it produced and everything else.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskOutput {
    /// Ids of the produced files, in order: `result.file.id`, then `result.files[].id`.
    pub files: Vec<String>,
    /// The rest of the result: without `file`/`files`; an `external` task's own `result`
    /// when that is all that is left. `None` when nothing is left.
    pub rest: Option<Value>,
}

/// Split a stored task result (JSON text).
pub fn task_output(result: Option<&str>) -> TaskOutput {
    let v: Value = result.and_then(|r| serde_json::from_str(r).ok()).unwrap_or(Value::Null);
    let Value::Object(mut m) = v else {
        return TaskOutput { files: Vec::new(), rest: Some(v).filter(|v| !v.is_null()) };
    };
    let id_of = |f: &Value| f.get("id").and_then(Value::as_str).map(str::to_owned);
    let mut files = Vec::new();
    if let Some(id) = m.get("file").and_then(id_of) {
        files.push(id);
        m.remove("file");
    }
    if let Some(Value::Array(list)) = m.get("files") {
        let ids: Vec<String> = list.iter().filter_map(id_of).collect();
        if ids.len() == list.len() {
            files.extend(ids);
            m.remove("files");
        }
    }
    let rest = match m.len() {
        0 => None,
        1 if !files.is_empty() && m.contains_key("result") => m.remove("result").filter(|v| !v.is_null()),
        _ => Some(Value::Object(m)),
    };
    TaskOutput { files, rest }
}

/// Why a task failed, as every transport shows it: a catalogue code (`task_failed` when the
/// stored one is not in the catalogue, e.g. written by another version) and a message. The
/// stored text is the engine's `{"code", "message"}`; `None` when there is none.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskError {
    pub code: &'static str,
    pub message: String,
}

/// The [`TaskError`] of a task's stored error text.
pub fn task_error(stored: Option<&str>) -> Option<TaskError> {
    let e: Value = serde_json::from_str(stored?).unwrap_or_default();
    let code = e
        .get("code")
        .and_then(Value::as_str)
        .and_then(|c| crate::error::ErrorCode::ALL.into_iter().find(|k| k.as_str() == c))
        .unwrap_or(crate::error::ErrorCode::TaskFailed);
    let message = e.get("message").and_then(Value::as_str).unwrap_or("the task failed").to_string();
    Some(TaskError { code: code.as_str(), message })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_and_external_results_name_their_files_alike() {
        let built_in = task_output(Some(r#"{"file":{"id":"a","name":"x.tar"},"members":2}"#));
        assert_eq!(built_in, TaskOutput { files: vec!["a".into()], rest: Some(serde_json::json!({"members": 2})) });
        let external = task_output(Some(r#"{"files":[{"id":"a"},{"id":"b"}],"result":{"rows":3}}"#));
        assert_eq!(external, TaskOutput { files: vec!["a".into(), "b".into()], rest: Some(serde_json::json!({"rows": 3})) });
        let bare = task_output(Some(r#"{"files":[{"id":"a"}],"result":null}"#));
        assert_eq!(bare, TaskOutput { files: vec!["a".into()], rest: None });
        // An archive's *arguments* name files by id strings: not produced files.
        assert_eq!(task_output(Some(r#"{"files":["a"]}"#)).files, Vec::<String>::new());
        assert_eq!(task_output(Some("7")), TaskOutput { files: vec![], rest: Some(serde_json::json!(7)) });
        assert_eq!(task_output(None), TaskOutput { files: vec![], rest: None });
    }
}
