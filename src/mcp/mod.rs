//! The MCP facade (DESIGN §5) on rmcp: tools that hand a model handles, sizes, hashes,
//! progress and repairable failures — never the bytes.
//!
//! One file of ~1 500 lines because rmcp's `#[tool_router]` wants every tool of the server in one
//! `impl` block; arguments, results, envelopes, sessions and push live in their own files.
//!
//! Served at `/mcp` (Streamable HTTP, behind the same bearer auth as REST; the principal comes
//! from the request) and over stdio (`ferry serve --stdio`, principal `local`).
//!
//! Job tools (`archive_files`, `compress_file`, `fetch_url`, `export_<name>`) start durable
//! tasks. A request that declares the tasks extension (`io.modelcontextprotocol/tasks`,
//! SEP-2663) gets a `CreateTaskResult`, and `tasks/get`, `tasks/update` and `tasks/cancel` are
//! answered from ferry's task store, so they survive restarts. Other clients get
//! `{task_id, status, poll_with: "task_get", poll_after_ms}` at once and poll `task_get`.
//! Arguments a job can check before it runs — input files that are unknown or unfinished, a
//! command's `params_schema` — are refused at the call as a tool error, and no task is made.
//!
//! Task status notifications (`notifications/tasks`) are pushed on the client's
//! `subscriptions/listen` stream when it declares the tasks extension, from whichever replica
//! made the change ([`push`]); `tasks/get` and `task_get`'s long-poll still work.
//!
//! Input requests of a task: a job's request may carry `message` (text for the person) and
//! `schema` (a flat JSON Schema object of the answer). Native tasks show each as an
//! elicitation form (`inputRequests`); an accepted form's `content` becomes the response —
//! the value of its single `answer` field when the request had no `schema`.

mod args;
pub mod envelope;
mod push;
pub use push::FerryService;
mod request;
pub mod results;
pub mod sessions;
mod tools;
mod transport_errors;
mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{ErrorCode, Next, Refusal};
use base64::Engine as _;
use ferry_tus::{CreationHeaders, PatchHeaders, UploadMetadata};
use futures::StreamExt;
use rmcp::model::*;
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::{ErrorData as McpError, ServerHandler};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::app::views::{file_view, FileSummary};
use crate::app::{AppState, McpConfig, Principal, LOCAL_PRINCIPAL};
use crate::catalog::{TaskRecord, TaskStatus as FerryStatus, UploadRecord};
use crate::signing::Scope;
use crate::tasks::POLL_AFTER_MS;
use crate::upload::now_ms;
use args::*;
use envelope::{failure, file_uri, resource_link, result};
use results::*;
use tools::JobTool;

/// rmcp's Streamable HTTP transport for `/mcp`: MCP 2026-07-28 stateless, and sessions for
/// clients of older protocol versions whose state lives in the catalog ([`sessions`]), so
/// every replica behind a load balancer serves every request. Its own refusals (a malformed
/// body, no session) are JSON-RPC errors ([`transport_errors`]).
pub fn streamable_http_service(
    state: &AppState,
) -> impl tower::Service<axum::extract::Request, Response = axum::response::Response, Error = std::convert::Infallible, Future: Send> + Clone + Send {
    let mcp = FerryMcp::new(state.clone(), (*state.mcp).clone());
    // Room for a chunk several times the limit, so an oversized one gets `chunk_too_large`
    // from the tool rather than a bare 413 from the transport.
    let max_body = (state.mcp.max_chunk as usize).saturating_mul(4).saturating_add(1 << 20);
    let mut cfg = rmcp::transport::StreamableHttpServerConfig::default()
        .with_cancellation_token(state.http.shutdown.child_token())
        .with_max_request_body_bytes(max_body);
    cfg.session_store = Some(Arc::new(sessions::CatalogSessions::new(state.engine.catalog.clone())));
    cfg = if state.http.allowed_hosts.is_empty() { cfg.disable_allowed_hosts() } else { cfg.with_allowed_hosts(state.http.allowed_hosts.clone()) };
    let rmcp = rmcp::transport::StreamableHttpService::new(move || Ok(mcp.for_session()), Arc::new(LocalSessionManager::default()), cfg);
    let rmcp = tower::Layer::layer(&axum::middleware::from_fn_with_state(state.events.clone(), push::note_listen_start), rmcp);
    let rmcp = tower::Layer::layer(&axum::middleware::from_fn(transport_errors::removed_methods), rmcp);
    transport_errors::json_rpc_refusals(rmcp)
}

/// Longest `task_get` long-poll, ms.
pub const MAX_WAIT_MS: u64 = 50_000;
/// Largest `file_read_chunk` read, bytes.
pub const MAX_READ_CHUNK: u64 = 65_536;
/// Largest file `resources/read` inlines as text, bytes.
pub const MAX_RESOURCE_TEXT: u64 = 65_536;
/// How often a `task_get` long-poll with a progress token reads the task for progress (which,
/// unlike a status change, commits no event to wake it).
const PROGRESS_EVERY: Duration = Duration::from_millis(200);
/// Lifetime of the signed upload URL `file_upload_begin` returns, ms (24 h).
const UPLOAD_URL_TTL_MS: u64 = 24 * 3600 * 1000;
/// Lifetime of download URLs in results, ms (1 h).
const DOWNLOAD_URL_TTL_MS: u64 = 3600 * 1000;

/// The rmcp server handler. Cheap to clone: one per HTTP request or stdio session.
#[derive(Clone)]
pub struct FerryMcp {
    state: AppState,
    cfg: Arc<McpConfig>,
    tools: Arc<Vec<Tool>>,
    jobs: Arc<Vec<JobTool>>,
    /// Each tool's compiled `inputSchema`: arguments are checked against it before the tool
    /// runs (issue 23, kind 3).
    inputs: Arc<BTreeMap<String, jsonschema::Validator>>,
    /// The connection's own state: its log level and resource watches ([`watch::Session`]).
    session: Arc<watch::Session>,
}

/// The one resource template: a file by id.
pub const FILE_TEMPLATE: &str = "ferry://files/{id}";

/// A tool's outcome before it becomes a `CallToolResult`.
type Outcome = Result<CallToolResult, Refusal>;

fn invalid(detail: impl Into<String>, hint: impl Into<String>) -> Refusal {
    Refusal::bad_request(detail, hint.into())
}

/// Deserialize tool arguments, or `invalid_argument` naming what is wrong. Every number a
/// tool takes is a whole number (bytes, ms, counts) that fits 64 bits; JSON allows larger
/// ones, which arrive as floating point, and such a one is named by its path rather than by
/// serde's "invalid type: floating point" (break-it, session 9).
fn args<T: DeserializeOwned>(tool: &str, a: &Option<JsonObject>) -> Result<T, Refusal> {
    let v = Value::Object(a.clone().unwrap_or_default());
    // The call's arguments already passed the tool's `inputSchema` (`check_arguments`), which
    // states every bound smaller than 64 bits: a number past 64 bits here is in a field whose
    // bound is the 64-bit range.
    T::deserialize(&v).map_err(|e| match crate::app::schema_check::number_past_64_bits(&v, None) {
        Some(m) => invalid(format!("{tool}: arguments{m}"), format!("Call {tool} with a whole number within the range its inputSchema gives there.")),
        None => invalid(format!("{tool}: {e}"), format!("Call {tool} with the arguments its inputSchema lists.")),
    })
}

/// A compact file handle (≈200 bytes) and its `resource_link`, from one view of the record.
fn handle(r: &UploadRecord) -> (FileSummary, ContentBlock) {
    let v = FileSummary::from(file_view(r));
    let link = resource_link(&r.id, v.name.as_deref().unwrap_or(&r.id), &v.media_type, v.size);
    (v, link)
}

/// `{"status":"ok","file":…}` with the file's resource link.
fn file_out(r: &UploadRecord) -> CallToolResult {
    let (file, link) = handle(r);
    result(&FileOut { status: OkStatus::Ok, file }, vec![link], false)
}

impl FerryMcp {
    pub fn new(state: AppState, cfg: McpConfig) -> FerryMcp {
        let (tools, jobs) = tools::catalogue(&cfg.commands, cfg.max_chunk);
        let inputs = tools
            .iter()
            .filter_map(|t| match jsonschema::validator_for(&Value::Object(t.input_schema.as_ref().clone())) {
                Ok(v) => Some((t.name.to_string(), v)),
                Err(e) => {
                    // A command's params_schema that is not a schema: the command job refuses
                    // every start of it with the reason.
                    tracing::warn!(tool = %t.name, error = %e, "inputSchema is not a valid JSON Schema; arguments are not checked against it");
                    None
                }
            })
            .collect();
        FerryMcp { state, cfg: Arc::new(cfg), tools: Arc::new(tools), jobs: Arc::new(jobs), inputs: Arc::new(inputs), session: watch::new_session() }
    }

    /// This server for a new connection (an HTTP session or a stateless request): everything
    /// shared but the connection's own state ([`watch::Session`]).
    pub fn for_session(&self) -> FerryMcp {
        FerryMcp { session: watch::new_session(), ..self.clone() }
    }

    /// The caller: the principal the HTTP auth middleware resolved, else `local` (stdio).
    fn principal(ctx: &RequestContext<RoleServer>) -> String {
        ctx.extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<Principal>())
            .map(|p| p.0.clone())
            .unwrap_or_else(|| LOCAL_PRINCIPAL.to_string())
    }

    async fn dispatch(&self, p: &str, req: &CallToolRequestParams, ctx: &RequestContext<RoleServer>) -> Outcome {
        let a = &req.arguments;
        match req.name.as_ref() {
            "file_upload_begin" => self.upload_begin(p, args(&req.name, a)?).await,
            "file_upload_chunk" => self.upload_chunk(p, args(&req.name, a)?).await,
            request::NAME => self.file_request(p, a).await,
            "file_status" => {
                let FileArg { file_id } = args(&req.name, a)?;
                // Finishes an upload whose bytes are all stored first; while it cannot, the
                // answer is `locked` (retryable) with the reason.
                let r = self.state.engine.get_finished_or_finish(p, &file_id).await?;
                Ok(file_out(&r))
            }
            "file_download_url" => self.download_url(p, args(&req.name, a)?).await,
            "file_read_chunk" => self.read_chunk(p, args(&req.name, a)?).await,
            "file_list" => {
                let ListArg { limit } = args(&req.name, a)?;
                let files = self.state.engine.list(p, list_limit(limit)?).await?;
                Ok(result(&ListOut { status: OkStatus::Ok, files: files.iter().map(|r| handle(r).0).collect() }, vec![], false))
            }
            "file_delete" => {
                let FileArg { file_id } = args(&req.name, a)?;
                self.state.engine.terminate(p, &file_id).await?;
                Ok(result(&DeletedOut { status: OkStatus::Ok, deleted: file_id }, vec![], false))
            }
            "task_get" => {
                let TaskGetArg { task_id, wait_ms, partial_after } = args(&req.name, a)?;
                if wait_ms.is_some_and(|w| w > MAX_WAIT_MS) {
                    return Err(invalid(
                        format!("wait_ms must be at most {MAX_WAIT_MS}"),
                        "Call task_get again after each wait; 50000 ms is the longest single wait.",
                    ));
                }
                let token = req.progress_token().or_else(|| ctx.meta.get_progress_token());
                let t = self.wait_task(p, &task_id, wait_ms.unwrap_or(0).min(MAX_WAIT_MS), token, ctx).await?;
                self.task_result_after(p, &t, partial_after).await
            }
            "task_respond" => {
                let RespondArg { task_id, key, response } = args(&req.name, a)?;
                let (accepted, t) = self.state.tasks.respond(p, &task_id, &key, &response.to_string()).await?;
                if !accepted {
                    return Err(not_outstanding(&t, &key));
                }
                Ok(result(&RespondOut { status: t.status.into(), task_id: t.id, accepted }, vec![], false))
            }
            "task_cancel" => {
                let TaskArg { task_id } = args(&req.name, a)?;
                let t = self.state.tasks.cancel(p, &task_id).await?;
                if t.status == FerryStatus::Cancelled {
                    // The call did what was asked: not an error.
                    return Ok(result(&TaskOut::new(TaskState::Cancelled, &t.id, &t.kind), vec![], false));
                }
                self.task_result(p, &t).await
            }
            "task_list" => {
                let ListArg { limit } = args(&req.name, a)?;
                let tasks = self.state.tasks.list(p, list_limit(limit)?).await?;
                let tasks = tasks.into_iter().map(|t| TaskBrief { task_id: t.id, kind: t.kind, status: t.status.into() }).collect();
                Ok(result(&TaskListOut { status: OkStatus::Ok, tasks }, vec![], false))
            }
            _ => Err(invalid(format!("unknown tool {:?}", req.name), "Call tools/list for the tools this server has.")),
        }
    }

    /// A new upload of `size` bytes (`None`: deferred length, declared by the first chunk
    /// sender) named `name`: the one creation of `file_upload_begin` and `file_request`.
    /// `requested`: a person will send it through a link (`file_request`), marked in its metadata
    /// ([`crate::names::REQUESTED_METADATA_KEY`]).
    async fn create_named(
        &self,
        p: &str,
        name: &str,
        size: Option<u64>,
        media_type: Option<&str>,
        sha256: Option<&str>,
        requested: bool,
    ) -> Result<UploadRecord, Refusal> {
        if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
            return Err(invalid("name must be 1 to 255 bytes without control characters", "Pass a plain file name such as report.pdf."));
        }
        if let Some(h) = &sha256 {
            // The same check as metadata `sha256` on POST /files/ (not hex vs. the wrong length).
            ferry_tus::parse_declared_sha256(h)?;
        }
        if let Some(t) = media_type.filter(|t| t.trim().parse::<mime::Mime>().is_err()) {
            // A value the file's views would silently replace with application/octet-stream.
            return Err(invalid(
                format!("media_type {t:?} is not a media type (RFC 9110 §8.3.1: type/subtype)"),
                "Pass e.g. application/pdf or text/csv, or leave media_type out.",
            ));
        }
        let mut md = UploadMetadata::new();
        let bad = |e: ferry_tus::ParseError| invalid(e.to_string(), "Use a plain file name and media type.");
        md.insert("filename", Some(name.to_string().into_bytes())).map_err(bad)?;
        // None given: guessed from the name (`report.csv` → text/csv), as `ferry upload` does.
        let media_type = media_type.map(str::to_string).unwrap_or_else(|| crate::names::guess_media_type(name).to_string());
        md.insert("filetype", Some(media_type.into_bytes())).map_err(bad)?;
        if let Some(h) = &sha256 {
            md.insert("sha256", Some(h.to_ascii_lowercase().into_bytes())).map_err(bad)?;
        }
        if requested {
            md.insert(crate::names::REQUESTED_METADATA_KEY, Some(b"1".to_vec())).map_err(bad)?;
        }
        let md_raw = md.to_string();
        let length = size.map(|s| s.to_string());
        let ch = CreationHeaders {
            upload_length: length.as_deref(),
            upload_defer_length: size.is_none().then_some("1"),
            upload_metadata: Some(&md_raw),
            upload_concat: None,
            upload_checksum: None,
            repr_digest: None,
            content_type: None,
            content_length: None,
            has_body: false,
        };
        let limits = crate::app::limits::creation_limits(&self.state.engine);
        let plan = ferry_tus::plan_creation(&ch, &limits)?;
        self.state.engine.create(p, &plan, &md_raw).await
    }

    async fn upload_begin(&self, p: &str, a: BeginArg) -> Outcome {
        let ttl = a.ttl_ms.unwrap_or(UPLOAD_URL_TTL_MS);
        if !(1..=crate::signing::MAX_URL_TTL_MS).contains(&ttl) {
            return Err(invalid("ttl_ms must be from 1 to 604800000 (7 days)", "Omit ttl_ms for 24 hours."));
        }
        let rec = self.create_named(p, &a.name, a.size, a.media_type.as_deref(), a.sha256.as_deref(), false).await?;
        let signed = self.state.links.signed(Scope::Upload, &rec.id, ttl, now_ms());
        let mut headers: BTreeMap<String, String> =
            [("Tus-Resumable", "1.0.0"), ("Content-Type", "application/offset+octet-stream"), ("Upload-Offset", "<current offset, 0 at first>")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        if a.size.is_none() {
            headers.insert("Upload-Length".into(), "<total bytes, on the first PATCH>".into());
        }
        let (curl, curl_resume) = curl_lines(a.size.is_none());
        let (file, link) = handle(&rec);
        let out = BeginOut {
            status: OkStatus::Ok,
            file,
            upload_url: signed.url,
            page_url: signed.page_url,
            method: "PATCH".into(),
            headers,
            expires_at: crate::upload::rfc3339(signed.expires_at_ms),
            max_inline_chunk: self.cfg.max_chunk,
            curl,
            curl_resume,
        };
        Ok(result(&out, vec![link], false))
    }

    async fn upload_chunk(&self, p: &str, a: ChunkArg) -> Outcome {
        // base64 is 4/3 of the bytes: refuse before decoding anything oversized.
        let max = self.cfg.max_chunk;
        let too_large = |n: u64| {
            Refusal::new(
                413,
                ErrorCode::ChunkTooLarge,
                format!("the chunk decodes to {n} bytes; at most {max} are accepted in-band"),
                format!("Split it into chunks of at most {max} bytes, or PATCH the upload_url from file_upload_begin."),
            )
        };
        if (a.data.len() as u64) / 4 * 3 > max + 2 {
            return Err(too_large((a.data.len() as u64) / 4 * 3));
        }
        let data = base64::engine::general_purpose::STANDARD.decode(a.data.trim()).map_err(|e| {
            invalid(format!("data is not standard base64: {e}"), "Encode the chunk with standard base64 (RFC 4648 §4, with padding).")
        })?;
        if data.len() as u64 > max {
            return Err(too_large(data.len() as u64));
        }
        let offset = a.offset.to_string();
        let len = data.len().to_string();
        let length = a.size.map(|s| s.to_string());
        let max_size = self.state.engine.config().max_size;
        let decide = move |state: &ferry_tus::UploadState| {
            let ph = PatchHeaders {
                content_type: Some("application/offset+octet-stream"),
                upload_offset: Some(&offset),
                upload_length: length.as_deref(),
                upload_checksum: None,
                content_length: Some(&len),
                trailer: None,
            };
            ferry_tus::plan_patch(state, &ph, max_size).map_err(Refusal::from)
        };
        let rec = self.state.engine.append(p.to_string(), a.file_id, decide, crate::upload::WholeChunk::from(data)).await.map_err(|mut e| {
            // TUS answers bytes sent to a complete upload 413 (nothing may pass Upload-Length);
            // to a model it is the state of the file, not the size of the chunk: `conflict`.
            if matches!(e.next, Next::AlreadyComplete) {
                e.code = ErrorCode::Conflict;
                e.status = 409;
                e.detail = format!("{}; the upload is complete", e.detail);
            }
            e
        })?;
        Ok(file_out(&rec))
    }

    /// The finished file `id`, or `upload_incomplete` with its offset as the cursor.
    async fn finished(&self, p: &str, id: &str) -> Result<UploadRecord, Refusal> {
        let r = self.state.engine.get_finished_or_finish(p, id).await?;
        if !r.is_finished() {
            let mut e = self.state.engine.not_complete_now(&r).await;
            if crate::names::is_requested(&r.metadata) && matches!(e.next, Next::Say(_)) {
                // A person sends it through the link file_request gave: nothing for the model
                // to send; wait and poll.
                e.next = Next::Say(
                    format!(
                        "A person is sending this file through the link from file_request ({} of {} bytes so far): \
                         wait, and poll {} (every 30 s or so) until its status is complete; then call this again.",
                        r.offset,
                        r.length.map_or_else(|| "an unknown number of".to_string(), |l| l.to_string()),
                        call("file_status")
                    )
                    .into(),
                );
                e.retry_after = Some(30);
            }
            return Err(e);
        }
        Ok(r)
    }

    /// A signed URL of file `a.file_id`; of an unfinished one (still arriving, or a task's
    /// output being written), a URL that follows it (`&follow=1`: the bytes as they are
    /// committed, then the file's sha256 as a trailer) and `follows: true`.
    async fn download_url(&self, p: &str, a: UrlArg) -> Outcome {
        let r = match self.finished(p, &a.file_id).await {
            Err(e) if e.code == ErrorCode::UploadIncomplete => self.state.engine.get(p, &a.file_id).await?,
            r => r?,
        };
        let ttl = a.ttl_ms.unwrap_or(DOWNLOAD_URL_TTL_MS);
        if !(1..=crate::signing::MAX_URL_TTL_MS).contains(&ttl) {
            return Err(invalid("ttl_ms must be from 1 to 604800000 (7 days)", "Omit ttl_ms for one hour."));
        }
        let s = self.state.links.signed(Scope::Download, &r.id, ttl, now_ms());
        let follows = !r.is_finished();
        let (download_url, page_url) = if follows { (format!("{}&follow=1", s.url), None) } else { (s.url, s.page_url) };
        let (file, link) = handle(&r);
        Ok(result(
            &UrlOut { status: OkStatus::Ok, download_url, page_url, follows, expires_at: crate::upload::rfc3339(s.expires_at_ms), file },
            vec![link],
            false,
        ))
    }

    /// Up to `max` bytes of a finished file from `offset`.
    async fn read_bytes(&self, r: &UploadRecord, offset: u64, max: u64) -> Result<Vec<u8>, Refusal> {
        let size = r.length.unwrap_or(r.offset);
        let end = offset.saturating_add(max).min(size);
        let mut out = Vec::with_capacity((end - offset.min(end)) as usize);
        if offset < end {
            let mut s = self.state.engine.read(r, offset..end).await?;
            while let Some(chunk) = s.next().await {
                out.extend_from_slice(&chunk.map_err(|e| crate::upload::internal("reading the file", e))?);
            }
        }
        Ok(out)
    }

    async fn read_chunk(&self, p: &str, a: ReadArg) -> Outcome {
        let r = self.finished(p, &a.file_id).await?;
        let size = r.length.unwrap_or(r.offset);
        let offset = a.offset.unwrap_or(0);
        let length = a.length.unwrap_or(4096);
        if length == 0 {
            return Err(invalid("length must be at least 1 byte", "Omit length to read 4096 bytes."));
        }
        if length > MAX_READ_CHUNK {
            return Err(Refusal::new(
                413,
                ErrorCode::ChunkTooLarge,
                format!("length must be 1 to {MAX_READ_CHUNK} bytes"),
                "Read in smaller pieces, or use file_download_url for the whole file.",
            ));
        }
        if offset > size {
            return Err(invalid(format!("offset {offset} is past the end of the file ({size} bytes)"), format!("Read from an offset below {size}."))
                .with_cursor(size));
        }
        let bytes = self.read_bytes(&r, offset, length).await?;
        let n = bytes.len() as u64;
        let (encoding, data) = match a.encoding.as_deref().unwrap_or("text") {
            "base64" => (Encoding::Base64, base64::engine::general_purpose::STANDARD.encode(&bytes)),
            "text" => match String::from_utf8(bytes) {
                Ok(s) => (Encoding::Text, s),
                Err(e) => {
                    // A multi-byte character cut at the end of the range is not an error.
                    let valid = e.utf8_error().valid_up_to();
                    if e.utf8_error().error_len().is_none() && valid > 0 {
                        let b = e.into_bytes();
                        let s = String::from_utf8(b[..valid].to_vec()).expect("valid prefix");
                        let next = offset + valid as u64;
                        let out = ReadOut {
                            status: OkStatus::Ok,
                            offset,
                            length: valid as u64,
                            next_offset: next,
                            eof: next >= size,
                            encoding: Encoding::Text,
                            data: s,
                        };
                        return Ok(result(&out, vec![], false));
                    }
                    return Err(invalid(
                        format!("bytes at {} are not UTF-8 text", offset + valid as u64),
                        "Call file_read_chunk again with encoding \"base64\".",
                    )
                    .with_cursor(offset + valid as u64));
                }
            },
            other => return Err(invalid(format!("encoding {other:?} is not text or base64"), "Use encoding \"text\" or \"base64\".")),
        };
        let next = offset + n;
        Ok(result(&ReadOut { status: OkStatus::Ok, offset, length: n, next_offset: next, eof: next >= size, encoding, data }, vec![], false))
    }

    /// Start the job behind a job tool; `Err` for arguments or idempotency problems.
    async fn start_job(&self, p: &str, job: &JobTool, a: &Option<JsonObject>) -> Result<TaskRecord, Refusal> {
        let mut a = a.clone().unwrap_or_default();
        let key = match a.remove("idempotency_key") {
            Some(Value::String(k)) => Some(k),
            Some(_) => return Err(invalid("idempotency_key must be a string", "Send a short string key, or omit it.")),
            None => None,
        };
        let job_args = match job.kind {
            "archive" => {
                let ArchiveArg { file_ids, format, name } = args(&job.name, &Some(a))?;
                json!({ "file_ids": file_ids, "format": format.unwrap_or_else(|| "tar".into()), "name": name })
            }
            "compress" => {
                let CompressArg { file_id, format, level } = args(&job.name, &Some(a))?;
                json!({ "file_id": file_id, "format": format.unwrap_or_else(|| "zstd".into()), "level": level })
            }
            "fetch" => {
                let FetchArg { url, name } = args(&job.name, &Some(a))?;
                json!({ "url": url, "name": name })
            }
            _ => {
                let ExportArg { params } = args(&job.name, &Some(a))?;
                json!({ "command": job.command, "params": params.unwrap_or_else(|| json!({})) })
            }
        };
        let mut job_args = job_args;
        if let Value::Object(m) = &mut job_args {
            m.retain(|_, v| !v.is_null());
        }
        let started = self.state.tasks.start(p, job.kind, &job_args.to_string(), key.as_deref(), None).await?;
        Ok(started.task)
    }

    /// Re-read a task until it is terminal, needs input, or `wait_ms` passed; sends
    /// `notifications/progress` on changes, and at least every [`watch::HEARTBEAT`], when the
    /// call carried a progress token; logs a failure or an input request it ends on
    /// (`notifications/message`, [`watch`]).
    #[allow(deprecated)] // LoggingLevel: see the ServerHandler impl
    async fn wait_task(
        &self,
        p: &str,
        id: &str,
        wait_ms: u64,
        token: Option<ProgressToken>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<TaskRecord, Refusal> {
        let t = self.wait_task_status(p, id, wait_ms, token, ctx).await?;
        match t.status {
            FerryStatus::Failed => {
                let why = t.error.as_deref().or(t.status_message.as_deref()).unwrap_or("no reason recorded");
                self.log(ctx, LoggingLevel::Warning, json!({ "task_id": t.id, "kind": t.kind, "status": "failed", "message": why })).await;
            }
            FerryStatus::InputRequired => {
                let keys: Vec<String> = outstanding(&t).into_keys().collect();
                self.log(ctx, LoggingLevel::Notice, json!({ "task_id": t.id, "kind": t.kind, "status": "input_required", "input_requests": keys }))
                    .await;
            }
            _ => {}
        }
        Ok(t)
    }

    async fn wait_task_status(
        &self,
        p: &str,
        id: &str,
        wait_ms: u64,
        token: Option<ProgressToken>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<TaskRecord, Refusal> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
        let mut last = None;
        let mut beat = watch::Heartbeat::new();
        // Subscribed before the first read, so a status change after it wakes the wait (every
        // status change commits an event; progress does not, so with a progress token the task
        // is also read every PROGRESS_EVERY).
        let mut changes = self.state.events.changes();
        loop {
            let t = self.state.tasks.get(p, id).await?;
            if let Some(tok) = &token {
                let snap = (t.progress.fraction, t.progress.message.clone(), t.progress.counters.clone());
                // `progress` is the job's fraction of 1 and never goes back (MCP requires it to
                // increase: a heartbeat raises it by the least step); counters, for jobs without
                // a fraction, go into the message.
                if let Some(sent) = beat.next(t.progress.fraction, last.as_ref() != Some(&snap)) {
                    let counters = t.progress.counters.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
                    let message = match (&t.progress.message, counters.is_empty()) {
                        (Some(m), _) => Some(m.clone()),
                        (None, false) => Some(counters),
                        (None, true) => None,
                    };
                    let _ = ctx.peer.notify_progress(watch::progress(tok, sent, Some(1.0), message)).await;
                    last = Some(snap);
                }
            }
            if t.status != FerryStatus::Working || tokio::time::Instant::now() >= deadline || ctx.ct.is_cancelled() {
                return Ok(t);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let at_most = if token.is_some() { left.min(PROGRESS_EVERY).min(beat.due_in()) } else { left };
            tokio::select! {
                woken = changes.wait(at_most) => {
                    // Nothing changed up to the deadline: the last read is the answer.
                    if woken == crate::events::Woken::TimedOut && tokio::time::Instant::now() >= deadline {
                        return Ok(t);
                    }
                }
                _ = ctx.ct.cancelled() => return Ok(t),
            }
        }
    }

    /// The facade's view of a task ([`task_out`]), with handles of the files it produced
    /// (built-in kinds' `file`, an `external` task's `files`) read from the live records, each
    /// with a signed download URL.
    async fn task_result(&self, p: &str, t: &TaskRecord) -> Outcome {
        self.task_result_after(p, t, None).await
    }

    /// [`FerryMcp::task_result`] with the partial results numbered above `after` (shown when
    /// the task has any, or `after` is given).
    async fn task_result_after(&self, p: &str, t: &TaskRecord, after: Option<u64>) -> Outcome {
        let mut produced = Vec::new();
        let mut extra = Vec::new();
        if t.status == FerryStatus::Completed {
            for id in &crate::app::views::task_output(t.result.as_deref()).files {
                if let Ok(r) = self.state.engine.get(p, id).await {
                    let s = self.state.links.signed(Scope::Download, id, DOWNLOAD_URL_TTL_MS, now_ms());
                    let (file, link) = handle(&r);
                    produced.push(ProducedFile { file, download_url: s.url });
                    extra.push(link);
                }
            }
        }
        let (mut v, is_error) = task_out(t, produced);
        if t.partial_seq > 0 || after.is_some() {
            v.partial = Some(PartialOut::of(&self.state.tasks.partials(t, after.unwrap_or(0)).await?));
        }
        Ok(result(&v, extra, is_error))
    }

    /// The SEP-2663 view of a task, for `tasks/get`.
    async fn detailed(&self, p: &str, t: &TaskRecord) -> Result<DetailedTask, McpError> {
        let mut task = Task::new(t.id.clone(), TaskStatus::Working, crate::upload::rfc3339(t.created_at_ms), crate::upload::rfc3339(t.updated_at_ms));
        task.ttl_ms = Some(t.ttl_ms.max(0) as u64);
        task.poll_interval_ms = Some(POLL_AFTER_MS);
        task.status_message = t.status_message.clone().or_else(|| t.progress.message.clone());
        let payload = match t.status {
            FerryStatus::Working => TaskPayload::Working,
            FerryStatus::InputRequired => {
                let mut reqs = InputRequests::new();
                for (k, r) in outstanding(t) {
                    reqs.insert(k, elicitation(&r)?);
                }
                TaskPayload::InputRequired { input_requests: reqs }
            }
            FerryStatus::Completed | FerryStatus::Failed => {
                let r = self.task_result(p, t).await.map_err(|e| McpError::internal_error(e.detail, None))?;
                let Value::Object(m) = serde_json::to_value(&r).map_err(|e| McpError::internal_error(e.to_string(), None))? else {
                    return Err(McpError::internal_error("tool result is not an object", None));
                };
                if t.status == FerryStatus::Completed {
                    TaskPayload::Completed { result: m }
                } else {
                    let data = r.structured_content.unwrap_or_default();
                    let msg = data["error"]["message"].as_str().unwrap_or("the task failed").to_string();
                    let Value::Object(error) = json!({ "code": -32000, "message": msg, "data": data }) else { unreachable!() };
                    TaskPayload::Failed { error }
                }
            }
            FerryStatus::Cancelled => TaskPayload::Cancelled,
        };
        Ok(DetailedTask::new(task, payload))
    }

    /// The call's arguments against the tool's `inputSchema`, before anything runs: a
    /// refusal names each place that does not fit by its JSON pointer (`arguments/ttl_ms`).
    fn check_arguments(&self, req: &CallToolRequestParams) -> Result<(), Refusal> {
        let Some(v) = self.inputs.get(req.name.as_ref()) else { return Ok(()) };
        let args = Value::Object(req.arguments.clone().unwrap_or_default());
        crate::app::schema_check::check(v, &args, "arguments").map_err(|m| {
            let at = crate::app::schema_check::first_pointer(v, &args).unwrap_or_default();
            let what = if at.is_empty() { "the arguments".to_string() } else { format!("arguments{at}") };
            invalid(format!("{}: {m}", req.name), format!("Fix {what} as the inputSchema of {} says, then call {}.", req.name, call(&req.name)))
        })
    }

    fn is_job_tool(&self, name: &str) -> Option<&JobTool> {
        self.jobs.iter().find(|j| j.name == name)
    }
}

/// `invalid_argument` (not retryable as it was sent) for an answer to `key`, which is not an
/// input request task `t` is waiting for: the hint names the keys it waits for (or says there
/// is none, and whether `key` was answered already), so the next call can be the right one.
fn not_outstanding(t: &TaskRecord, key: &str) -> Refusal {
    let open = crate::tasks::outstanding_input_keys(t);
    let answered = serde_json::from_str::<serde_json::Map<String, Value>>(&t.input_responses).is_ok_and(|m| m.contains_key(key));
    let why = if answered { "was answered already" } else { "is not one of its input requests" };
    let detail = format!("task {} is not waiting for input {key:?}: that key {why}", t.id);
    let hint = match open.as_slice() {
        [] => format!("Task {} waits for no input now (status {}): nothing to answer; poll it with {}.", t.id, t.status.as_str(), call("task_get")),
        keys => {
            let list = keys.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ");
            format!(
                "Call task_respond with task_id {:?} and key {} (the outstanding input request{}; {} shows its message and schema).",
                t.id,
                list,
                if keys.len() > 1 { "s, one call each" } else { "" },
                call("task_get")
            )
        }
    };
    invalid(detail, hint)
}

/// How a hint names the call that starts task `t` again: its job tool and arguments, or, for
/// kinds no tool starts (`external`, an embedder's), the REST call.
fn restart(t: &TaskRecord) -> String {
    match t.kind.as_str() {
        "archive" => call("archive_files"),
        "compress" => call("compress_file"),
        "fetch" => call("fetch_url"),
        "command" => match serde_json::from_str::<Value>(&t.args).ok().and_then(|a| a.get("command").and_then(Value::as_str).map(str::to_owned)) {
            Some(c) => call(&format!("export_{c}")),
            None => call("export_NAME"),
        },
        k => format!("POST /api/v1/tasks with kind {k:?} and its args, as it was started"),
    }
}

/// The facade's view of a task — status, progress, questions, result or failure envelope —
/// and whether it is an error result (`failed`, `cancelled`). `produced`: handles of the files
/// the task produced that still exist. Pure, so every state a record can hold is checked
/// against the tools' `outputSchema` (tests below).
fn task_out(t: &TaskRecord, produced: Vec<ProducedFile>) -> (TaskOut, bool) {
    let mut v = TaskOut::new(t.status.into(), &t.id, &t.kind);
    if t.progress != Default::default() {
        v.progress = Some((&t.progress).into());
    }
    v.prior_failure = t.prior_failure.clone();
    match t.status {
        FerryStatus::Working => {
            v.poll_with = Some("task_get".into());
            v.poll_after_ms = Some(POLL_AFTER_MS);
        }
        FerryStatus::InputRequired => {
            v.input_requests = Some(outstanding(t));
            v.poll_with = Some("task_get".into());
            v.poll_after_ms = Some(POLL_AFTER_MS);
        }
        FerryStatus::Completed => {
            let out = crate::app::views::task_output(t.result.as_deref());
            if let Some(first) = produced.first() {
                v.file = Some(first.file.clone());
                v.download_url = Some(first.download_url.clone());
            }
            if produced.len() > 1 {
                v.files = Some(produced);
            }
            v.result = out.rest;
        }
        FerryStatus::Failed => {
            let e = crate::app::views::task_error(t.error.as_deref());
            let message = e.as_ref().map_or_else(|| "the task failed".to_string(), |e| e.message.clone());
            let code = e.and_then(|e| ErrorCode::ALL.into_iter().find(|k| k.as_str() == e.code)).unwrap_or(ErrorCode::TaskFailed);
            let again = restart(t);
            let hint = match code {
                ErrorCode::Internal => format!("Start the task again ({again}, a new idempotency_key); the failure was on the server's side."),
                ErrorCode::QuotaExceeded => format!(
                    "The task's output would exceed the storage quota; its partial output was removed. \
                     Delete files that are no longer needed ({}), then start the task again ({again}).",
                    call("file_delete")
                ),
                ErrorCode::InsufficientStorage | ErrorCode::Unavailable => format!(
                    "The server ran out of disk space (or another resource) while running the task; its partial output \
                     was removed. Start the task again later ({again}; the same idempotency_key starts a new run)."
                ),
                _ => format!(
                    "Read error.message, fix the arguments or inputs it names, and start \
                     the task again ({again}; the same idempotency_key starts a new run)."
                ),
            };
            let mut err = Refusal::new(500, code, message, Next::ByCode);
            err.cursor = t.checkpoint.as_deref().and_then(checkpoint_cursor);
            v.error = Some(ErrorObject::of(&err, hint));
            return (v, true);
        }
        FerryStatus::Cancelled => {
            let mut err = Refusal::new(409, ErrorCode::Cancelled, format!("task {} was cancelled", t.id), Next::ByCode);
            err.cursor = t.checkpoint.as_deref().and_then(checkpoint_cursor);
            let hint = format!("Start the task again if its result is still needed ({}; the same idempotency_key starts a new run).", restart(t));
            v.error = Some(ErrorObject::of(&err, hint));
            return (v, true);
        }
    }
    (v, false)
}

/// The shell lines `file_upload_begin` returns: send the whole file, and resume after an
/// interruption (HEAD for the server's offset, then PATCH the rest from there). They read the
/// signed URL from `$UPLOAD_URL` and the file from `$FILE`, so the URL appears once in the
/// result (`upload_url`). `-T "$FILE"` streams the file (`--data-binary @FILE` would read it
/// into curl's memory); the signed URL's path ends with the id, not `/`, so curl appends no
/// file name to it. `--fail-with-body` makes an HTTP error exit non-zero with the problem body
/// shown (`-f` for the HEAD, which has no body); `stat -L` follows a symlinked FILE. With
/// both lines the result is about 1.2 KiB, the one result above 1 KiB. With `deferred` (no size given at begin), the
/// first PATCH declares `Upload-Length`.
fn curl_lines(deferred: bool) -> (String, String) {
    const H: &str = "-H 'Tus-Resumable: 1.0.0' -H 'Content-Type: application/offset+octet-stream'";
    let len = if deferred { " -H \"Upload-Length: $(stat -L -c %s \"$FILE\")\"" } else { "" };
    let send = format!("curl -sS --fail-with-body -X PATCH {H} -H 'Upload-Offset: 0'{len} -T \"$FILE\" \"$UPLOAD_URL\"");
    let resume = format!(
        "off=$(curl -sSfI -H 'Tus-Resumable: 1.0.0' \"$UPLOAD_URL\" | tr -d '\\r' | sed -n 's/^upload-offset: *//Ip') && [ -n \"$off\" ] && \
tail -c +$((off + 1)) \"$FILE\" | curl -sS --fail-with-body -X PATCH {H} -H \"Upload-Offset: $off\"{len} -T - \"$UPLOAD_URL\""
    );
    (send, resume)
}

/// `limit` of the list tools: 1 to 100, default 20.
fn list_limit(limit: Option<u32>) -> Result<u32, Refusal> {
    match limit {
        None => Ok(20),
        Some(n) if (1..=100).contains(&n) => Ok(n),
        Some(n) => Err(invalid(format!("limit must be 1 to 100, got {n}"), "Omit limit for the newest 20.")),
    }
}

/// Outstanding input requests of a task: key → request.
fn outstanding(t: &TaskRecord) -> BTreeMap<String, Value> {
    let reqs: BTreeMap<String, Value> = serde_json::from_str(&t.input_requests).unwrap_or_default();
    let answered: BTreeMap<String, Value> = serde_json::from_str(&t.input_responses).unwrap_or_default();
    reqs.into_iter().filter(|(k, _)| !answered.contains_key(k)).collect()
}

/// The byte cursor in a job checkpoint (`{"cursor": {"offset": N, …}}`), when it has one.
fn checkpoint_cursor(cp: &str) -> Option<u64> {
    let v: Value = serde_json::from_str(cp).ok()?;
    v.get("cursor").and_then(|c| c.get("offset")).and_then(Value::as_u64)
}

/// An input request as an elicitation form (module docs).
fn elicitation(request: &Value) -> Result<InputRequest, McpError> {
    let message = request.get("message").and_then(Value::as_str).map(str::to_owned).unwrap_or_else(|| format!("The task asks: {request}"));
    let schema = match request.get("schema") {
        Some(s @ Value::Object(_)) => s.clone(),
        _ => {
            json!({
                "type": "object",
                "properties": { "answer": { "type": "string", "description": "Your answer (JSON or text)." } },
                "required": ["answer"]
            })
        }
    };
    serde_json::from_value(json!({ "method": "elicitation/create", "params": { "mode": "form", "message": message, "requestedSchema": schema } }))
        .map_err(|e| McpError::internal_error(format!("input request does not fit an elicitation form: {e}"), None))
}

/// The response to store for an elicitation result: `None` when declined or cancelled.
fn response_of(request: &Value, elicit: &Value) -> Option<Value> {
    if elicit.get("action").and_then(Value::as_str) != Some("accept") {
        return None;
    }
    let content = elicit.get("content").cloned().unwrap_or(json!({}));
    if request.get("schema").is_some_and(Value::is_object) {
        return Some(content);
    }
    let answer = content.get("answer").cloned().unwrap_or(Value::Null);
    Some(match answer {
        Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
        other => other,
    })
}

/// How a hint names a call: the tool and the arguments to pass (issue 23, kind 13).
fn call(tool: &str) -> String {
    let args = match tool {
        "file_upload_begin" => "name and size",
        "file_request" => "name",
        "file_upload_chunk" => "file_id, offset and data",
        "file_status" | "file_download_url" | "file_delete" => "file_id",
        "file_read_chunk" => "file_id, offset and length",
        "file_list" | "task_list" => "limit (optional)",
        "task_get" | "task_cancel" => "task_id",
        "task_respond" => "task_id, key and response",
        "archive_files" => "file_ids",
        "compress_file" => "file_id",
        "fetch_url" => "url",
        t if t.starts_with("export_") => "params",
        _ => return format!("{tool} with the arguments its inputSchema lists"),
    };
    format!("{tool} with {args}")
}

/// Whether a hint already names a call of this facade (a tool and its arguments), as the
/// hints job kinds give for their input files do.
fn names_a_call(hint: &str) -> bool {
    [
        "file_list",
        "file_status",
        "file_upload_begin",
        "file_upload_chunk",
        "file_download_url",
        "file_read_chunk",
        "task_get",
        "task_list",
        "task_respond",
    ]
    .iter()
    .any(|t| hint.contains(t))
}

/// The recovery hint of `e` for a model that called `tool`, worded from its code and the
/// context its engine gave ([`Next`]): it names MCP tools and their arguments, never HTTP
/// requests and headers — every hint a model gets names the next call (issue 23, kind 13).
/// Words are taken as they are only when this layer wrote them (they name one of its calls).
fn for_model(e: &Refusal, tool: &str) -> String {
    let on_task = tool.starts_with("task_");
    let on_file = tool.starts_with("file_");
    let creating = matches!(tool, "file_upload_begin" | "file_request");
    let again = call(tool);
    // This facade's own words: a refusal built in mcp/ names the call to make.
    let own = match &e.next {
        Next::Say(s) if names_a_call(s) => Some(s.to_string()),
        _ => None,
    };
    match e.code {
        ErrorCode::NotFound if on_task => {
            format!("Check the task_id: {} shows your tasks (finished tasks are kept for their ttl).", call("task_list"))
        }
        ErrorCode::NotFound if on_file => format!("Check the file_id: {} shows your files.", call("file_list")),
        // A job's input files: the hint names them and the calls that check them.
        ErrorCode::NotFound | ErrorCode::UploadIncomplete => match &e.next {
            Next::UnknownFiles { ids, many } => {
                let (what, them) = if *many { ("ids", "them") } else { ("id", "it") };
                format!(
                    "No file of yours has the {what} {ids} (never created, deleted, or expired): \
                     check {them} with {}, and call {again} again with ids of finished files.",
                    call("file_list")
                )
            }
            Next::UnfinishedFiles { ids } => format!(
                "Finish uploading {ids} ({} shows the offset; {} sends the rest), then call {again} again.",
                call("file_status"),
                call("file_upload_chunk")
            ),
            Next::AwaitParts => format!(
                "This file is a concatenation the server builds once each of its parts is uploaded: finish \
                 the parts ({} shows each one's offset; {} sends the rest), then call {again} again.",
                call("file_status"),
                call("file_upload_chunk")
            ),
            _ if own.is_some() => own.unwrap_or_default(),
            _ if e.code == ErrorCode::UploadIncomplete => {
                format!("Finish the upload first ({} from error.partial.cursor), then call {again}.", call("file_upload_chunk"))
            }
            _ => format!("Check the ids: {} shows your files and {} your tasks; then call {again}.", call("file_list"), call("task_list")),
        },
        ErrorCode::ChunkTooLarge if own.is_some() => own.unwrap_or_default(),
        ErrorCode::ChunkTooLarge => format!("Send less per call: {again}, in smaller pieces."),
        ErrorCode::UploadExpired => format!("The upload expired unfinished and its bytes are gone: begin again with {}.", call("file_upload_begin")),
        ErrorCode::Locked => format!(
            "Another writer holds this file; wait a few seconds, then call {again} (the same arguments); {} shows the offset.",
            call("file_status")
        ),
        ErrorCode::ChecksumMismatch => format!(
            "The bytes did not match the declared sha256, so the upload was reset to \
             offset 0: send the right file again from offset 0 ({} with offset 0).",
            call("file_upload_chunk")
        ),
        ErrorCode::SizeExceeded if tool == "task_respond" => {
            format!("Call {again} with a shorter response, or upload the data as a file ({}) and answer with its file_id.", call("file_upload_begin"))
        }
        ErrorCode::SizeExceeded | ErrorCode::Conflict if matches!(e.next, Next::AlreadyComplete) => format!(
            "The upload is complete: every byte is stored and nothing more is sent. {} shows its size \
             and sha256; read it with {} or share it with {}; for other bytes begin a new upload ({}).",
            call("file_status"),
            call("file_read_chunk"),
            call("file_download_url"),
            call("file_upload_begin")
        ),
        ErrorCode::SizeExceeded => {
            format!(
                "Send no more than the declared size, or begin a new upload with the right size ({}), within the server's limit.",
                call("file_upload_begin")
            )
        }
        ErrorCode::OffsetMismatch => {
            format!(
                "Re-send the chunk starting at error.partial.cursor: {} with offset = error.partial.cursor ({} shows the offset).",
                call("file_upload_chunk"),
                call("file_status")
            )
        }
        ErrorCode::Conflict if on_file => format!("The file cannot take this change; check it with {}.", call("file_status")),
        ErrorCode::Conflict if on_task => {
            format!("The task already ended and cannot change: {} shows how it ended; start a new task if needed.", call("task_get"))
        }
        ErrorCode::Conflict => format!(
            "This idempotency_key already names a task with other arguments: call \
             {again} and a new idempotency_key (or the original arguments with this key)."
        ),
        ErrorCode::InvalidArgument => match &e.next {
            Next::Say(s) if names_a_call(s) || s.contains(tool) => s.to_string(),
            _ => format!("Fix the argument error.message names, then call {again}."),
        },
        ErrorCode::Unauthorized if tool == "fetch_url" => format!(
            "Ask the operator to add the host to [fetch] allow_hosts in ferry.toml and call {again} \
             again, or upload the file yourself: {} gives an upload_url to send its bytes to.",
            call("file_upload_begin")
        ),
        ErrorCode::Unauthorized => {
            format!("This is not allowed for your token (error.message says why): ask the operator for access, then call {again}.")
        }
        // A call that creates a file has none to show when it is refused: naming file_status
        // would send the model after an id that does not exist.
        ErrorCode::HookInvalid if creating => {
            format!(
                "The server's upload hook is broken (error.message says how) and answers every such call alike: \
                 tell the user to report it to the operator; no file was created ({} lists the files there are).",
                call("file_list")
            )
        }
        ErrorCode::HookInvalid => format!(
            "The server's upload hook is broken (error.message says how) and answers every such \
             call alike: tell the user to report it to the operator; {} shows what was kept.",
            call("file_status")
        ),
        ErrorCode::StoreRefused if creating => {
            format!(
                "The server's storage refused this for good (error.message names what it refused): tell the \
                 user to report it to the operator; no file was created ({} lists the files there are).",
                call("file_list")
            )
        }
        ErrorCode::StoreRefused => format!(
            "The server's storage refused this for good (error.message names what it refused): tell the \
             user to report it to the operator; nothing stored was lost, and {} shows what was kept.",
            call("file_status")
        ),
        ErrorCode::Damaged => format!(
            "The server's copy of this file is damaged and will not be served: tell \
             the user to upload it again ({}) or to ask the operator to restore it.",
            call("file_upload_begin")
        ),
        ErrorCode::Rejected => {
            format!("The server's policy refused this (error.message says why): change what it names and call {again}, or ask the operator.")
        }
        ErrorCode::TaskFailed | ErrorCode::Cancelled => format!("Start the task again with {again}."),
        ErrorCode::Internal => {
            format!(
                "Retry once ({again}, the same arguments); if it fails again the server has a storage \
                 or database problem: report it to the operator (details are in the server log)."
            )
        }
        ErrorCode::InsufficientStorage if creating => {
            format!(
                "The server's disk is full and no file was created: wait at least 30 s, \
                 then call {again} (the same arguments); tell the user if it persists."
            )
        }
        ErrorCode::InsufficientStorage => format!(
            "The server's disk is full (nothing acknowledged was lost): wait at least 30 s, \
             then check {} and resume from error.partial.cursor; tell the user if it persists.",
            call("file_status")
        ),
        ErrorCode::Unavailable => {
            format!("The server was briefly out of resources and changed nothing: wait a few seconds, then call {again} (the same arguments).")
        }
        ErrorCode::QuotaExceeded if e.quota.as_ref().is_some_and(|q| q.name == "uploads_in_progress") => format!(
            "Too many unfinished uploads (error.quota has the limit and the count): finish one or delete it ({}; {} shows them), then call {again}.",
            call("file_delete"),
            call("file_list")
        ),
        ErrorCode::QuotaExceeded => format!(
            "The storage quota is full (error.quota has the limit and the bytes used): delete files that \
             are no longer needed ({}), or ask the user to raise the quota; nothing acknowledged was lost.",
            call("file_delete")
        ),
    }
}

/// A tool failure: `e` with its hint for a model that called `tool`.
fn tool_failure(e: &Refusal, tool: &str) -> CallToolResult {
    failure(e, for_model(e, tool))
}

fn mcp_err(e: Refusal) -> McpError {
    let hint = for_model(&e, "task_get");
    mcp_err_with_hint(&e, hint)
}

/// A JSON-RPC error for `e` carrying ferry's failure envelope (`code`, `retryable`,
/// `recoveryHint` = `hint`) as its `data`: `invalid_params` for a missing or malformed
/// argument, `internal_error` otherwise.
fn mcp_err_with_hint(e: &Refusal, hint: String) -> McpError {
    let data = Some(serde_json::to_value(Failure { status: FailedStatus::Failed, error: ErrorObject::of(e, hint) }).expect("serialises"));
    match e.code {
        ErrorCode::NotFound | ErrorCode::InvalidArgument => McpError::invalid_params(e.detail.clone(), data),
        _ => McpError::internal_error(e.detail.clone(), data),
    }
}

const INSTRUCTIONS: &str = "ferry moves big files by handle. Files: file_upload_begin gives a signed TUS URL a person or program uploads to \
(file_status shows progress and sha256); file_download_url gives a URL curl downloads without a token. Jobs (archive_files, compress_file, \
fetch_url, export_*) return a task: poll task_get (wait_ms long-polls), answer input_requests with task_respond. Failures carry \
error.code, retryable, recoveryHint (the next step) and partial.cursor (where to resume).";

// Logging (`LoggingLevel`, `logging/setLevel`) is SEP-2577-deprecated in rmcp; MCP 2026-07-28
// still defines it, and ferry serves it ([`watch`]).
#[allow(deprecated)]
impl ServerHandler for FerryMcp {
    fn get_info(&self) -> ServerConfig {
        let caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_logging()
            .enable_completions()
            .enable_tasks()
            .build();
        ServerConfig::new(caps).with_server_info(Implementation::new("ferry", env!("CARGO_PKG_VERSION"))).with_instructions(INSTRUCTIONS)
    }

    /// rmcp reads a request whose method it knows but whose `params` do not fit that method's
    /// shape (`tools/call` with `"arguments":"str"`) as a custom request, whose default answer
    /// is -32601 method not found. A method MCP defines is found: its params are what is wrong,
    /// so the answer is -32602 invalid params (JSON-RPC 2.0 §5.1) saying so. A method MCP
    /// removed (`tasks/list`, `tasks/result`; `initialize` on a 2026-07-28 request) is not
    /// found, whatever its params ([`transport_errors::is_removed`]).
    async fn on_custom_request(&self, request: CustomRequest, ctx: RequestContext<RoleServer>) -> Result<CustomResult, McpError> {
        const KNOWN: [&str; 14] = [
            "initialize",
            "ping",
            "tools/call",
            "tools/list",
            "resources/list",
            "resources/read",
            "resources/templates/list",
            "resources/subscribe",
            "resources/unsubscribe",
            "logging/setLevel",
            "completion/complete",
            "tasks/get",
            "tasks/update",
            "tasks/cancel",
        ];
        let method = request.method.clone();
        if transport_errors::is_removed(&method, ctx.meta.protocol_version().as_ref().map(|v| v.as_str())) {
            return Err(transport_errors::removed(&method));
        }
        if KNOWN.contains(&method.as_str()) {
            let what = if method == "tools/call" {
                "params of tools/call must be an object {\"name\": string, \"arguments\": object}: \
                 arguments is a JSON object of the tool's inputSchema"
            } else {
                "params do not fit this method (see the MCP schema)"
            };
            return Err(McpError::invalid_params(format!("{method}: {what}"), Some(json!({ "method": method }))));
        }
        Err(McpError::new(rmcp::model::ErrorCode::METHOD_NOT_FOUND, method, None))
    }

    async fn list_tools(&self, _r: Option<PaginatedRequestParams>, _ctx: RequestContext<RoleServer>) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(&self, req: CallToolRequestParams, ctx: RequestContext<RoleServer>) -> Result<CallToolResponse, McpError> {
        if !self.tools.iter().any(|t| t.name == req.name) {
            return Err(McpError::invalid_params(format!("unknown tool {:?}", req.name), None));
        }
        if let Err(e) = self.check_arguments(&req) {
            return Ok(CallToolResponse::Complete(tool_failure(&e, &req.name)));
        }
        let p = Self::principal(&ctx);
        let native = ctx.client_capabilities().is_some_and(|c| c.supports_tasks());
        // task_get reports its task's progress itself (wait_task); every other call that runs
        // long gets a heartbeat when the client gave a progress token.
        let token = (req.name != "task_get").then(|| req.progress_token().or_else(|| ctx.meta.get_progress_token())).flatten();
        let answer = watch::with_heartbeat(token, &req.name, &ctx, async {
            Ok(match self.is_job_tool(&req.name) {
                Some(job) => match self.start_job(&p, job, &req.arguments).await {
                    Ok(t) if native => return Ok(Ok(CallToolResponse::Task(CreateTaskResult::new(self.detailed(&p, &t).await?.task)))),
                    Ok(t) => self.task_result(&p, &t).await,
                    Err(e) => Err(e),
                },
                None => self.dispatch(&p, &req, &ctx).await,
            }
            .map_or_else(Err, |r| Ok(CallToolResponse::Complete(r))))
        })
        .await;
        let refused = match answer? {
            Ok(response) => return Ok(response),
            Err(e) => e,
        };
        self.log_refusal(&ctx, &req.name, &refused).await;
        Ok(CallToolResponse::Complete(tool_failure(&refused, &req.name)))
    }

    /// `subscriptions/listen` opens a stream for task status notifications ([`push`]) and
    /// `notifications/resources/updated` of the `ferry://files/{id}` it names
    /// ([`watch`]); no list-changed category is offered (ferry's lists change with every
    /// upload; poll them).
    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        let uris = requested.resource_subscriptions.as_deref().map(Self::acceptable_uris).filter(|u| !u.is_empty());
        let mut accepted = SubscriptionFilter::default();
        accepted.resource_subscriptions = uris;
        Some(accepted)
    }

    async fn subscribe(&self, req: SubscribeRequestParams, ctx: RequestContext<RoleServer>) -> Result<(), McpError> {
        self.subscribe_session(req, ctx).await
    }

    async fn unsubscribe(&self, req: UnsubscribeRequestParams, _ctx: RequestContext<RoleServer>) -> Result<(), McpError> {
        self.unsubscribe_session(req);
        Ok(())
    }

    async fn set_level(&self, req: SetLevelRequestParams, _ctx: RequestContext<RoleServer>) -> Result<(), McpError> {
        self.set_session_level(req);
        Ok(())
    }

    async fn complete(&self, req: CompleteRequestParams, ctx: RequestContext<RoleServer>) -> Result<CompleteResult, McpError> {
        self.complete_ids(req, ctx).await
    }

    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), McpError> {
        self.listen_stream(context).await
    }

    async fn get_task(&self, req: GetTaskParams, ctx: RequestContext<RoleServer>) -> Result<GetTaskResult, McpError> {
        let p = Self::principal(&ctx);
        let t = self.state.tasks.get(&p, &req.task_id).await.map_err(mcp_err)?;
        Ok(GetTaskResult::new(self.detailed(&p, &t).await?))
    }

    async fn update_task(&self, req: UpdateTaskParams, ctx: RequestContext<RoleServer>) -> Result<(), McpError> {
        let p = Self::principal(&ctx);
        let t = self.state.tasks.get(&p, &req.task_id).await.map_err(mcp_err)?;
        let open = outstanding(&t);
        for (key, elicit) in &req.input_responses {
            let Some(request) = open.get(key) else { continue };
            match response_of(request, elicit) {
                Some(v) => {
                    self.state.tasks.respond(&p, &t.id, key, &v.to_string()).await.map_err(mcp_err)?;
                }
                None => {
                    self.state.tasks.cancel(&p, &t.id).await.map_err(mcp_err)?;
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    async fn cancel_task(&self, req: CancelTaskParams, ctx: RequestContext<RoleServer>) -> Result<(), McpError> {
        let p = Self::principal(&ctx);
        self.state.tasks.cancel(&p, &req.task_id).await.map_err(mcp_err)?;
        Ok(())
    }

    async fn list_resources(&self, _r: Option<PaginatedRequestParams>, ctx: RequestContext<RoleServer>) -> Result<ListResourcesResult, McpError> {
        let p = Self::principal(&ctx);
        let files = self.state.engine.list(&p, 100).await.map_err(mcp_err)?;
        let resources: Vec<Resource> = files
            .iter()
            .filter(|r| r.is_finished())
            .filter_map(|r| match handle(r).1 {
                ContentBlock::ResourceLink(res) => Some(res),
                _ => None,
            })
            .collect();
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _r: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let t: ResourceTemplate = serde_json::from_value(json!({
            "uriTemplate": FILE_TEMPLATE, "name": "file",
            "description": "A ferry file by id: reading returns a text preview of small text files; others point to file_download_url.",
        }))
        .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        Ok(ListResourceTemplatesResult::with_all_items(vec![t]))
    }

    async fn read_resource(&self, req: ReadResourceRequestParams, ctx: RequestContext<RoleServer>) -> Result<ReadResourceResponse, McpError> {
        let p = Self::principal(&ctx);
        let Some(id) = envelope::id_from_uri(&req.uri) else {
            return Err(watch::not_found(&req.uri, format!("{} is not a ferry file URI (ferry://files/ID)", req.uri)));
        };
        let r = match self.finished(&p, id).await {
            Ok(r) => r,
            Err(e) if e.code == ErrorCode::NotFound => return Err(watch::not_found(&req.uri, format!("no file {id}"))),
            Err(e) => return Err(mcp_err(e)),
        };
        let v = file_view(&r);
        let size = v.size.unwrap_or(r.offset);
        let too_big = size > MAX_RESOURCE_TEXT;
        let text = if too_big { None } else { self.read_bytes(&r, 0, size).await.ok().and_then(|b| String::from_utf8(b).ok()) };
        match text {
            Some(text) => {
                let c = ResourceContents::TextResourceContents { uri: file_uri(id), mime_type: Some(v.media_type), text, meta: None };
                Ok(ReadResourceResponse::Complete(ReadResourceResult::new(vec![c])))
            }
            None => {
                let s = self.state.links.signed(Scope::Download, id, DOWNLOAD_URL_TTL_MS, now_ms());
                let why = if too_big {
                    format!("{size} bytes, more than the {MAX_RESOURCE_TEXT}-byte preview limit")
                } else {
                    "not UTF-8 text".to_string()
                };
                Err(McpError::invalid_params(
                    format!("file {id} is {why}; download it from the URL in data.download_url (or call file_download_url)"),
                    Some(json!({ "download_url": s.url, "size": size, "sha256": v.sha256, "mimeType": v.media_type })),
                ))
            }
        }
    }
}

#[cfg(test)]
mod schema_tests {
    //! Every result a tool can give validates against the `outputSchema` that tool declares
    //! (issue 23, kind 1): task views are built by [`task_out`] — the function the tools use —
    //! from generated task records in every state, file handles from generated upload records,
    //! failures from every error code with and without `partial` and `quota`.
    use super::*;
    use crate::app::arb;
    use proptest::prelude::*;

    /// The declared `outputSchema` of every tool, compiled once.
    static SCHEMAS: std::sync::LazyLock<BTreeMap<String, jsonschema::Validator>> = std::sync::LazyLock::new(|| {
        let (tools, _) = tools::catalogue(&[], 1 << 20);
        tools
            .iter()
            .map(|t| {
                let schema = Value::Object(t.output_schema.as_ref().expect("every tool declares an outputSchema").as_ref().clone());
                (t.name.to_string(), jsonschema::validator_for(&schema).expect("a valid JSON Schema"))
            })
            .collect()
    });

    fn check(tool: &str, r: &CallToolResult) -> Result<(), TestCaseError> {
        let v = r.structured_content.as_ref().expect("structured");
        let errors: Vec<String> = SCHEMAS[tool].iter_errors(v).map(|e| format!("{}: {e}", e.instance_path())).collect();
        prop_assert!(errors.is_empty(), "{tool} result breaks its outputSchema: {errors:?}\n{v}");
        Ok(())
    }

    /// Whether `hint` names a call: a tool of `tools` with one of its arguments (any argument
    /// for tools that take only optional ones).
    fn names_call(hint: &str, tools: &[Tool]) -> bool {
        tools.iter().any(|t| {
            let props: Vec<&String> = t.input_schema.get("properties").and_then(Value::as_object).map(|p| p.keys().collect()).unwrap_or_default();
            let required = t.input_schema.get("required").and_then(Value::as_array).is_some_and(|r| !r.is_empty());
            hint.contains(t.name.as_ref()) && (!required || props.iter().any(|p| hint.contains(p.as_str())))
        })
    }

    /// Contexts the engines give (every [`Next`]) and words of the protocol crate, as TUS
    /// speaks them: `for_model` must word each as the next call of this facade.
    fn engine_contexts() -> Vec<Next> {
        let mut all = crate::error::tests_support::contexts();
        all.extend(
            [
                "Ask the operator to add the host to [fetch] allow_hosts in ferry.toml, or upload the file instead.",
                "Send a shorter answer, or upload the data as a file and answer with its id.",
                "Send a valid Upload-Offset header.",
            ]
            .map(Next::from),
        );
        all
    }

    /// Every hint a model can get names the next call — the tool and the arguments to pass —
    /// and says retry only for a retryable code (issue 23, kinds 13 and 15).
    #[test]
    fn every_hint_names_the_next_call() {
        let orders = crate::app::CommandTool { name: "orders".into(), description: None, params_schema: None };
        let (tools, _) = tools::catalogue(&[orders], 1 << 20);
        let mut wrong = Vec::new();
        for t in &tools {
            for code in ErrorCode::ALL {
                for engine in engine_contexts() {
                    for quota in [None, Some("bytes"), Some("uploads_in_progress")] {
                        let mut e = Refusal::new(400, code, "detail", engine.clone());
                        e.quota = quota.map(|name| Box::new(crate::error::QuotaDetail { name, limit: 1, used: 1, requested: 1 }));
                        let hint = for_model(&e, &t.name);
                        if !names_call(&hint, &tools) {
                            wrong.push(format!("{} {}: {hint:?} names no call", t.name, code.as_str()));
                        }
                        // A call that creates a file and was refused by what stores it has no
                        // file to check (issue 48: store_refused named file_status).
                        let store_said_no = matches!(
                            code,
                            ErrorCode::StoreRefused
                                | ErrorCode::HookInvalid
                                | ErrorCode::InsufficientStorage
                                | ErrorCode::QuotaExceeded
                                | ErrorCode::Unavailable
                                | ErrorCode::Internal
                                | ErrorCode::Rejected
                        );
                        if store_said_no
                            && matches!(t.name.as_ref(), "file_upload_begin" | "file_request")
                            && e.cursor.is_none()
                            && hint.contains("file_status")
                        {
                            wrong.push(format!("{} {}: {hint:?} names file_status, but no file was created", t.name, code.as_str()));
                        }
                        if crate::error_catalogue_tests::says_retry(&hint) && !code.retryable() {
                            wrong.push(format!("{} {}: {hint:?} says retry, but the code is not retryable", t.name, code.as_str()));
                        }
                    }
                }
            }
        }
        wrong.dedup();
        assert!(wrong.is_empty(), "{} hints:\n{}", wrong.len(), wrong.join("\n"));
    }

    const TASK_TOOLS: [&str; 5] = ["task_get", "task_cancel", "archive_files", "compress_file", "fetch_url"];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn every_task_view_fits_its_schema(t in arb::task_record(), files in proptest::collection::vec(arb::upload_record(), 0..3)) {
            let produced: Vec<ProducedFile> =
                files.iter().map(|r| ProducedFile { file: handle(r).0, download_url: format!("http://h/files/{}?sig=x", r.id) }).collect();
            let (v, is_error) = task_out(&t, produced);
            prop_assert_eq!(is_error, matches!(t.status, FerryStatus::Failed | FerryStatus::Cancelled));
            if let (Some(e), false) = (&v.error, t.kind == "external") {
                let orders = crate::app::CommandTool { name: "orders".into(), description: None, params_schema: None };
                let (tools, _) = tools::catalogue(&[orders], 1 << 20);
                let t2 = TaskRecord { args: r#"{"command":"orders"}"#.into(), ..t.clone() };
                let hint = if t.kind == "command" { task_out(&t2, vec![]).0.error.unwrap().recovery_hint } else { e.recovery_hint.clone() };
                prop_assert!(names_call(&hint, &tools), "{hint:?} names no call");
            }
            let r = result(&v, vec![], is_error);
            for tool in TASK_TOOLS {
                check(tool, &r)?;
            }
            // With partial results beside the final result (issue 27), cut to a page with `more`.
            let value = serde_json::value::RawValue::from_string(serde_json::to_string(&t.progress).unwrap()).unwrap();
            let page = crate::catalog::PartialPage {
                fragments: (1..=40).map(|seq| crate::catalog::Fragment { seq: t.runs + seq, at_ms: t.created_at_ms, value: value.clone() }).collect(),
                dropped: t.runs,
                next: t.runs + 40,
            };
            let mut with = v.clone();
            with.partial = Some(PartialOut::of(&page));
            let r = result(&with, vec![], is_error);
            for tool in TASK_TOOLS {
                check(tool, &r)?;
            }
            // task_cancel's answer for the task it just cancelled; task_respond; task_list.
            check("task_cancel", &result(&TaskOut::new(TaskState::Cancelled, &t.id, &t.kind), vec![], false))?;
            check("task_respond", &result(&RespondOut { status: t.status.into(), task_id: t.id.clone(), accepted: t.runs % 2 == 0 }, vec![], false))?;
            let brief = TaskBrief { task_id: t.id.clone(), kind: t.kind.clone(), status: t.status.into() };
            check("task_list", &result(&TaskListOut { status: OkStatus::Ok, tasks: vec![brief] }, vec![], false))?;
        }

        #[test]
        fn every_file_result_fits_its_schema(r in arb::upload_record(), page in proptest::option::of("[a-z]{1,5}")) {
            check("file_status", &file_out(&r))?;
            check("file_upload_chunk", &file_out(&r))?;
            check("file_list", &result(&ListOut { status: OkStatus::Ok, files: vec![handle(&r).0] }, vec![], false))?;
            let url = UrlOut {
                status: OkStatus::Ok,
                download_url: "u".into(),
                page_url: page.clone(),
                follows: false,
                expires_at: "t".into(),
                file: handle(&r).0,
            };
            check("file_download_url", &result(&url, vec![], false))?;
            let (curl, curl_resume) = curl_lines(r.length.is_none());
            let begin = BeginOut {
                status: OkStatus::Ok, file: handle(&r).0, upload_url: "u".into(), page_url: page, method: "PATCH".into(),
                headers: BTreeMap::new(), expires_at: "t".into(), max_inline_chunk: 1, curl, curl_resume,
            };
            check("file_upload_begin", &result(&begin, vec![], false))?;
        }

        #[test]
        fn every_failure_fits_every_schema(
            code in proptest::sample::select(ErrorCode::ALL.to_vec()),
            cursor in proptest::option::of(any::<u64>()),
            quota in proptest::option::of((any::<u64>(), any::<u64>(), any::<u64>())),
        ) {
            let mut e = Refusal::new(400, code, "detail", Next::ByCode);
            e.cursor = cursor;
            e.quota = quota.map(|(limit, used, requested)| Box::new(crate::error::QuotaDetail { name: "bytes", limit, used, requested }));
            let (tools, _) = tools::catalogue(&[], 1 << 20);
            for t in &tools {
                check(&t.name, &tool_failure(&e, &t.name))?;
            }
        }
    }
}
