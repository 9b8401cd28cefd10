//! Arguments of the MCP tools, as their input schemas (tools.rs) describe them. Unknown
//! fields are refused, so a misspelt argument is an `invalid_argument`, not silently ignored.

use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileArg {
    pub(super) file_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TaskArg {
    pub(super) task_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TaskGetArg {
    pub(super) task_id: String,
    pub(super) wait_ms: Option<u64>,
    pub(super) partial_after: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RespondArg {
    pub(super) task_id: String,
    pub(super) key: String,
    pub(super) response: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListArg {
    pub(super) limit: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BeginArg {
    pub(super) name: String,
    pub(super) size: Option<u64>,
    pub(super) media_type: Option<String>,
    pub(super) sha256: Option<String>,
    /// `url_ttl_ms` is the deprecated name.
    #[serde(alias = "url_ttl_ms")]
    pub(super) ttl_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ChunkArg {
    pub(super) file_id: String,
    pub(super) offset: u64,
    pub(super) data: String,
    pub(super) size: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UrlArg {
    pub(super) file_id: String,
    pub(super) ttl_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReadArg {
    pub(super) file_id: String,
    pub(super) offset: Option<u64>,
    pub(super) length: Option<u64>,
    pub(super) encoding: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ArchiveArg {
    pub(super) file_ids: Vec<String>,
    pub(super) format: Option<String>,
    pub(super) name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CompressArg {
    pub(super) file_id: String,
    pub(super) format: Option<String>,
    pub(super) level: Option<i32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FetchArg {
    pub(super) url: String,
    pub(super) name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExportArg {
    pub(super) params: Option<Value>,
}
