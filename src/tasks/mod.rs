//! The durable task engine (DESIGN §4): jobs that run in the background, survive crashes and
//! produce files.
//!
//! A task is a catalog row. [`Engine::start`] commits it (honouring an idempotency key) and
//! answers at once; a pool of workers claims runnable tasks under a lease (owner, expiry,
//! fencing token) renewed by heartbeat, and runs the task's [`Job`] from its last checkpoint.
//! Cancellation is cooperative; input requests park the task until answered.
//!
//! Embedding: implement [`Job`], register it with [`Engine::register`], and start tasks with
//! [`Engine::start`]. See `examples/paged_export.rs`.

use async_trait::async_trait;
use serde_json::value::RawValue;

mod context;
mod engine;
pub mod kinds;
pub mod schema_check;
pub mod settings;

pub use crate::catalog::{Progress, TaskRecord, TaskStatus};
pub use context::JobContext;
pub use engine::{Engine, Started, TaskConfig};

/// How long a client should wait between two polls of a task that has not ended, ms (REST
/// `poll_after_ms`, MCP `poll_after_ms` and `pollIntervalMs`).
pub const POLL_AFTER_MS: u64 = 1_000;

/// The longest a finished task may be kept, ms: 366 days (`ttl_ms` of a start, REST or the
/// library API, is 1 to this). A task is a status to poll, not an archive: its files outlive it
/// (they are kept until deleted), and a year and a day covers a yearly job's result.
pub const MAX_TASK_TTL_MS: i64 = 366 * 24 * 3600 * 1000;

/// The one refusal of a `ttl_ms` outside 1 to [`MAX_TASK_TTL_MS`], whatever its size (400
/// `invalid_argument`); `place` names it where it was sent (`body/ttl_ms`, a JSON pointer in a
/// REST body; `ttl_ms`), `got` is the value as sent.
pub fn ttl_out_of_range(place: &str, got: &str) -> crate::error::Refusal {
    crate::error::Refusal::bad_request(
        format!("{place} must be a whole number of milliseconds from 1 to {MAX_TASK_TTL_MS} (366 days); got {got}"),
        "Send a ttl_ms in that range, or omit it for the server's default (24 h unless configured).",
    )
}

/// How a job run ended other than with a result.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The job failed; `message` is shown to the task's owner (no secrets).
    #[error("{message}")]
    Failed { message: String },
    /// The job is waiting for input ([`JobContext::need_input`]); it resumes when answered.
    #[error("waiting for input")]
    Parked,
    /// The job stopped because the task was cancelled or the server is shutting down.
    #[error("cancelled")]
    Cancelled,
    /// The lease was lost (another worker owns the task now) or storage failed.
    #[error("internal: {0}")]
    Internal(String),
    /// A resource ran out (DESIGN §9): the disk is full or reached the server's free-space
    /// reserve (507 `insufficient_storage`), or a store was briefly unavailable (503). The task
    /// fails with that code — its unfinished files are removed, freeing their space — and can
    /// be started again once the resource returns.
    #[error("{0}")]
    Exhausted(crate::error::Refusal),
    /// Something the job needs is still held by an earlier run of the same task that has not
    /// stopped yet — its output file's writer (423 `locked`), e.g. a run whose lease was taken
    /// over while it was slow. Not a failure: the task is released after a short pause and
    /// runs again once the earlier run lets go.
    #[error("busy: {0}")]
    Busy(String),
}

impl JobError {
    /// A failure with a message for the task's owner.
    pub fn failed(message: impl Into<String>) -> Self {
        JobError::Failed { message: message.into() }
    }
}

impl From<crate::error::Refusal> for JobError {
    fn from(e: crate::error::Refusal) -> Self {
        match e.code {
            crate::error::ErrorCode::NotFound
            | crate::error::ErrorCode::InvalidArgument
            | crate::error::ErrorCode::UploadIncomplete
            | crate::error::ErrorCode::UploadExpired => JobError::failed(e.detail),
            crate::error::ErrorCode::InsufficientStorage | crate::error::ErrorCode::Unavailable | crate::error::ErrorCode::QuotaExceeded => {
                JobError::Exhausted(e)
            }
            crate::error::ErrorCode::Locked => JobError::Busy(e.detail),
            _ => JobError::Internal(e.to_string()),
        }
    }
}

/// A kind of background work. Runs as bounded steps between cancellable waits: check
/// [`JobContext::is_cancelled`] (or await [`JobContext::cancelled`]) between steps, and call
/// [`JobContext::checkpoint`] after each durable step so a crash resumes from there.
#[async_trait]
pub trait Job: Send + Sync + 'static {
    /// The kind name tasks are started with, e.g. `"archive"`.
    fn kind(&self) -> &str;

    /// Whether workers run this kind. `false` for kinds driven from outside (`external`).
    fn runnable(&self) -> bool {
        true
    }

    /// The JSON Schema of this kind's arguments, or `None` for any JSON. It is both what the
    /// OpenAPI document publishes as `args` of `POST /api/v1/tasks` for this kind and the first
    /// check of every start ([`crate::tasks::Engine::start`], REST and MCP alike), so the two
    /// cannot disagree (issue 23, kind 2); [`Job::validate`] then checks only what the
    /// schema already demands, in the kind's own words.
    fn args_schema(&self) -> Option<serde_json::Value> {
        None
    }

    /// Check arguments before a task is created; the message becomes an `invalid_argument`.
    fn validate(&self, _args: &RawValue) -> Result<(), String> {
        Ok(())
    }

    /// The refusal callers see for arguments this kind does not accept, before a task is
    /// created: by default [`Job::validate`]'s message as 400 `invalid_argument`. A kind
    /// overrides it to answer with another code (`fetch`: 403 `unauthorized` for a host
    /// outside the allow list).
    fn check(&self, args: &RawValue) -> Result<(), crate::error::Refusal> {
        self.validate(args).map_err(|m| {
            crate::error::Refusal::bad_request(format!("invalid args for {}: {m}", self.kind()), "Fix the arguments and start the task again.")
        })
    }

    /// Check, before a task is created, what the arguments name for `principal` — the input
    /// files of `archive` and `compress` exist, are the caller's and are complete — so a
    /// start naming an unknown file is refused at the call (404 `not_found` listing the ids),
    /// not reported later as a failed task. Runs after [`Job::check`]; default: nothing to
    /// check.
    async fn check_inputs(&self, _principal: &str, _args: &RawValue, _uploads: &crate::upload::UploadEngine) -> Result<(), crate::error::Refusal> {
        Ok(())
    }

    /// End what a run of task `task_id` that no process holds any more (its server was killed)
    /// may have left running outside the server, as its `checkpoint` (the last value given to
    /// [`JobContext::checkpoint`], JSON text) records it: called when such a task is
    /// cancelled. A run that resumes the task does the same itself first. Default: nothing.
    fn release(&self, _task_id: &str, _checkpoint: Option<&str>) {}

    /// Run the job, or resume it from `checkpoint` (the last value given to
    /// [`JobContext::checkpoint`]). Returns the task's result.
    async fn run(&self, ctx: &JobContext, args: &RawValue, checkpoint: Option<serde_json::Value>) -> Result<serde_json::Value, JobError>;
}

/// The keys of the input requests task `t` waits for (asked, not answered), in key order;
/// empty unless it is `input_required`.
pub fn outstanding_input_keys(t: &TaskRecord) -> Vec<String> {
    if t.status != TaskStatus::InputRequired {
        return Vec::new();
    }
    let requests: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&t.input_requests).unwrap_or_default();
    let answered: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&t.input_responses).unwrap_or_default();
    requests.keys().filter(|k| !answered.contains_key(*k)).cloned().collect()
}
