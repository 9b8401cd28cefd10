//! The tool catalogue (DESIGN §5): names, input schemas, output schemas and annotations.

use std::sync::Arc;

use rmcp::model::{Tool, ToolAnnotations};
use serde_json::{json, Map, Value};

use super::results::{output_schema, BeginOut, DeletedOut, FileOut, ListOut, ReadOut, RespondOut, TaskListOut, TaskOut, UrlOut};

/// What a tool does to state, for its annotations (MCP `ToolAnnotations`).
#[derive(Clone, Copy)]
struct Hints {
    read_only: bool,
    destructive: bool,
    idempotent: bool,
    open_world: bool,
}

const READ: Hints = Hints { read_only: true, destructive: false, idempotent: true, open_world: false };
const WRITE: Hints = Hints { read_only: false, destructive: false, idempotent: false, open_world: false };
/// Starting a job with an `idempotency_key` is idempotent; without one it is not, so the hint
/// stays false.
const JOB: Hints = WRITE;
const DESTROY: Hints = Hints { read_only: false, destructive: true, idempotent: true, open_world: false };

fn tool(name: String, title: &str, description: String, input: Value, output: Map<String, Value>, h: Hints) -> Tool {
    let input = match input {
        Value::Object(m) => m,
        _ => unreachable!("input schemas are objects"),
    };
    let mut t = Tool::new(name, description, Arc::new(input));
    t.title = Some(title.to_string());
    t.output_schema = Some(Arc::new(output));
    t.annotations =
        Some(ToolAnnotations::from_raw(Some(title.to_string()), Some(h.read_only), Some(h.destructive), Some(h.idempotent), Some(h.open_world)));
    t
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false })
}

fn file_id() -> Value {
    json!({ "type": "string", "description": "File id (26 characters), from a handle or file_list." })
}

fn task_id() -> Value {
    json!({ "type": "string", "description": "Task id, from the tool that started it or task_list." })
}

fn idempotency_key() -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": 255,
        "description": "Retry-safe key: the same key and arguments join the same task instead of starting another."
    })
}

/// The inputSchema of `export_<name>`: `params` is the command's `params_schema` when it
/// declares one (required when that schema requires members; its `$defs`/`definitions` move
/// to the root, where its `#/$defs/…` references then point), else any object.
fn export_input(params_schema: Option<&Value>) -> Value {
    const DESC: &str = "Parameters passed to the export program as FERRY_PARAMS (JSON).";
    let Some(Value::Object(schema)) = params_schema else {
        return object(json!({ "params": { "type": "object", "description": DESC }, "idempotency_key": idempotency_key() }), &[]);
    };
    let mut params = schema.clone();
    params.remove("$schema");
    params.remove("$id");
    let defs: Vec<(String, Value)> = ["$defs", "definitions"].into_iter().filter_map(|k| params.remove(k).map(|v| (k.to_string(), v))).collect();
    params.entry("description").or_insert_with(|| json!(DESC));
    let requires = params.get("required").and_then(Value::as_array).is_some_and(|r| !r.is_empty());
    let mut input =
        object(json!({ "params": Value::Object(params), "idempotency_key": idempotency_key() }), if requires { &["params"] } else { &[] });
    for (k, v) in defs {
        input[k] = v;
    }
    input
}

/// One job tool: which task kind it starts and how its MCP arguments map to the kind's.
#[derive(Debug, Clone)]
pub struct JobTool {
    pub name: String,
    pub kind: &'static str,
    /// For `export_<name>`: the configured command.
    pub command: Option<String>,
}

/// Every tool, in the order `tools/list` shows them. `commands`: name, description and
/// `params_schema` of each `[commands.NAME]`; `max_chunk`: largest decoded `file_upload_chunk` (bytes).
pub fn catalogue(commands: &[crate::app::CommandTool], max_chunk: u64) -> (Vec<Tool>, Vec<JobTool>) {
    let mut tools = vec![
        tool(
            "file_upload_begin".into(),
            "Begin a file upload",
            "Create an upload and get a signed TUS URL that curl, tus-js-client or a person can send the bytes \
             to without a token (PATCH with Upload-Offset), or send small chunks with file_upload_chunk. \
             Returns the file handle; file_status shows progress and the sha256 when complete."
                .into(),
            object(
                json!({
                    "name": { "type": "string", "minLength": 1, "maxLength": 255, "description": "File name." },
                    "size": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "Total bytes; omit if unknown (then the first chunk sender declares it)."
                    },
                    "media_type": {
                        "type": "string",
                        "description": "e.g. application/pdf (default: guessed from name's extension, else application/octet-stream)."
                    },
                    "sha256": {
                        "type": "string",
                        "pattern": "^[0-9a-fA-F]{64}$",
                        "description": "Expected sha256 of the whole file (hex); a mismatch at completion resets the upload."
                    },
                    "ttl_ms": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 604800000,
                        "description": "Lifetime of the signed upload URL, ms (default 24 h)."
                    },
                    "url_ttl_ms": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 604800000,
                        "deprecated": true,
                        "description": "Deprecated name of ttl_ms."
                    }
                }),
                &["name"],
            ),
            output_schema::<BeginOut>(),
            WRITE,
        ),
        tool(
            "file_upload_chunk".into(),
            "Send a chunk in-band",
            format!(
                "Append base64 bytes at a byte offset of an upload (for clients without HTTP). Decoded \
                 size at most {max_chunk} bytes. On offset_mismatch, resend from error.partial.cursor."
            ),
            object(
                json!({
                    "file_id": file_id(),
                    "offset": { "type": "integer", "minimum": 0, "description": "Byte offset this chunk starts at (the file's current offset)." },
                    "data": { "type": "string", "contentEncoding": "base64", "description": "The chunk, standard base64." },
                    "size": { "type": "integer", "minimum": 0, "description": "Total bytes, if the upload was begun without a size." }
                }),
                &["file_id", "offset", "data"],
            ),
            output_schema::<FileOut>(),
            WRITE,
        ),
        tool(
            "file_status".into(),
            "File status",
            "A file's handle: size, offset received so far, complete, sha256 (hex) once complete. Never interrupts an upload in progress.".into(),
            object(json!({ "file_id": file_id() }), &["file_id"]),
            output_schema::<FileOut>(),
            READ,
        ),
        tool(
            "file_download_url".into(),
            "Signed download URL",
            "A URL that downloads the file without a token (curl, a browser; supports Range) until it expires. \
             For a file still arriving (an upload in progress, a task's output being written) the URL follows it: \
             bytes as they arrive, ending when the file is complete (follows: true)."
                .into(),
            object(
                json!({
                    "file_id": file_id(),
                    "ttl_ms": { "type": "integer", "minimum": 1, "maximum": 604800000, "description": "Lifetime of the URL, ms (default 1 h)." }
                }),
                &["file_id"],
            ),
            output_schema::<UrlOut>(),
            READ,
        ),
        tool(
            "file_read_chunk".into(),
            "Read part of a file",
            "Read a bounded byte range of a finished file: text (UTF-8) or base64. For whole or large files use file_download_url.".into(),
            object(
                json!({
                    "file_id": file_id(),
                    "offset": { "type": "integer", "minimum": 0, "description": "First byte (default 0)." },
                    "length": { "type": "integer", "minimum": 1, "maximum": super::MAX_READ_CHUNK, "description": "Bytes to read (default 4096)." },
                    "encoding": { "type": "string", "enum": ["text", "base64"], "description": "text (default; fails on invalid UTF-8) or base64." }
                }),
                &["file_id"],
            ),
            output_schema::<ReadOut>(),
            READ,
        ),
        tool(
            "file_list".into(),
            "List files",
            "Your files, newest first: handles with size, complete, sha256.".into(),
            object(json!({ "limit": { "type": "integer", "minimum": 1, "maximum": 100, "description": "At most this many (default 20)." } }), &[]),
            output_schema::<ListOut>(),
            READ,
        ),
        tool(
            "file_delete".into(),
            "Delete a file",
            "Delete a file or abandon an upload, with its bytes. Cannot be undone.".into(),
            object(json!({ "file_id": file_id() }), &["file_id"]),
            output_schema::<DeletedOut>(),
            DESTROY,
        ),
        tool(
            "task_get".into(),
            "Task status",
            "A task's status, progress, questions (input_requests), partial results appended so far (partial.fragments; pass \
             partial.next as partial_after to read only newer ones) and, when completed, its result with file handles and a download \
             URL. wait_ms long-polls until it changes state (sends progress notifications when the call has a progress token)."
                .into(),
            object(
                json!({
                    "task_id": task_id(),
                    "wait_ms": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": super::MAX_WAIT_MS,
                        "description": "Wait up to this long for the task to finish or need input (default 0)."
                    },
                    "partial_after": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "Show only partial result fragments numbered above this: the \
                                        partial.next of the last result read (default 0: every kept fragment)."
                    }
                }),
                &["task_id"],
            ),
            output_schema::<TaskOut>(),
            READ,
        ),
        tool(
            "task_respond".into(),
            "Answer a task's question",
            "Answer an input request of a task in input_required; the task then continues.".into(),
            object(
                json!({
                    "task_id": task_id(),
                    "key": { "type": "string", "description": "The input_requests key." },
                    "response": { "description": "The answer (any JSON)." }
                }),
                &["task_id", "key", "response"],
            ),
            output_schema::<RespondOut>(),
            WRITE,
        ),
        tool(
            "task_cancel".into(),
            "Cancel a task",
            "Stop a task; cancelled is final. Cancelling a finished task changes nothing.".into(),
            object(json!({ "task_id": task_id() }), &["task_id"]),
            output_schema::<TaskOut>(),
            DESTROY,
        ),
        tool(
            "task_list".into(),
            "List tasks",
            "Your tasks, newest first.".into(),
            object(json!({ "limit": { "type": "integer", "minimum": 1, "maximum": 100, "description": "At most this many (default 20)." } }), &[]),
            output_schema::<TaskListOut>(),
            READ,
        ),
    ];
    tools.insert(1, super::request::tool());
    let mut jobs = vec![
        JobTool { name: "archive_files".into(), kind: "archive", command: None },
        JobTool { name: "compress_file".into(), kind: "compress", command: None },
        JobTool { name: "fetch_url".into(), kind: "fetch", command: None },
    ];
    tools.push(tool(
        "archive_files".into(),
        "Archive files",
        "Start a task that packs finished files into one tar or zip file. Returns \
         a task to poll with task_get; its result is the archive's file handle."
            .into(),
        object(
            json!({
                "file_ids": {
                    "type": "array",
                    "items": { "type": "string" },
                    "minItems": 1,
                    "maxItems": 10000,
                    "description": "Ids of your finished files to pack, in order; unknown or unfinished ids are refused at the call."
                },
                "format": { "type": "string", "enum": ["tar", "zip"], "description": "default tar" },
                "name": { "type": "string", "description": "Archive file name." },
                "idempotency_key": idempotency_key()
            }),
            &["file_ids"],
        ),
        output_schema::<TaskOut>(),
        JOB,
    ));
    tools.push(tool(
        "compress_file".into(),
        "Compress a file",
        "Start a task that compresses a finished file with zstd or gzip into a new file.".into(),
        object(
            json!({
                "file_id": file_id(),
                "format": { "type": "string", "enum": ["zstd", "gzip"], "description": "default zstd" },
                "level": { "type": "integer", "description": "zstd 1-19, gzip 0-9." },
                "idempotency_key": idempotency_key()
            }),
            &["file_id"],
        ),
        output_schema::<TaskOut>(),
        JOB,
    ));
    tools.push(tool(
        "fetch_url".into(),
        "Import a URL",
        "Start a task that downloads an http URL (hosts allow-listed by the operator) into a new file, resuming with Range after interruptions."
            .into(),
        object(json!({ "url": { "type": "string" }, "name": { "type": "string" }, "idempotency_key": idempotency_key() }), &["url"]),
        output_schema::<TaskOut>(),
        Hints { open_world: true, ..JOB },
    ));
    for crate::app::CommandTool { name, description, params_schema } in commands {
        let tool_name = format!("export_{name}");
        let desc = format!(
            "Start the `{name}` export{}. Returns a task to poll with task_get; its result is the exported file's handle.",
            description.as_deref().map(|d| format!(": {d}")).unwrap_or_default()
        );
        tools.push(tool(tool_name.clone(), &format!("Export {name}"), desc, export_input(params_schema.as_ref()), output_schema::<TaskOut>(), JOB));
        jobs.push(JobTool { name: tool_name, kind: "command", command: Some(name.clone()) });
    }
    (tools, jobs)
}
