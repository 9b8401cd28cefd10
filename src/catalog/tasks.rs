//! Task rows (DESIGN §4) and the [`TaskCatalog`] methods every catalog backend provides.
//!
//! JSON values (arguments, results, checkpoints, input requests and responses) are stored and
//! returned as exact JSON text: what goes in comes back byte for byte.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::partials::{Appended, PartialPage};
use super::CatalogResult;

/// Task status, exactly as MCP names them. `completed`, `failed` and `cancelled` are terminal:
/// once set they never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Working => "working",
            TaskStatus::InputRequired => "input_required",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<TaskStatus> {
        Some(match s {
            "working" => TaskStatus::Working,
            "input_required" => TaskStatus::InputRequired,
            "completed" => TaskStatus::Completed,
            "failed" => TaskStatus::Failed,
            "cancelled" => TaskStatus::Cancelled,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled)
    }
}

/// Progress of a task: a fraction in `[0, 1]` when known, a message, and named counters
/// (e.g. `pages`, `items`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `null` reads as no counters (the OpenAPI document allows it).
    #[serde(default, deserialize_with = "null_as_empty", skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, u64>, D::Error> {
    let raw = <Option<BTreeMap<String, serde_json::Number>> as serde::Deserialize>::deserialize(d)?.unwrap_or_default();
    raw.into_iter()
        .map(|(k, n)| {
            whole_number(&n).map(|v| (k, v)).ok_or_else(|| serde::de::Error::custom(format!("counter values are whole numbers ≥ 0, got {n}")))
        })
        .collect()
}

/// A JSON number as a `u64` when it is a whole number ≥ 0, also when written with a zero
/// fraction (`15.0`): JSON Schema's `integer` (2020-12 validation §6.1.1) is any number with a
/// zero fractional part, and the OpenAPI document promises JSON Schema.
pub fn whole_number(n: &serde_json::Number) -> Option<u64> {
    n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 9_007_199_254_740_992.0).map(|f| f as u64))
}

/// Whether two arguments texts are the same request for an idempotency key: equal as JSON
/// values — whitespace, object key order and number spelling (`1`, `1.0`, `1e0`) do not matter;
/// array order does. Texts that are not JSON are compared as text. Catalogs store the exact
/// text either way (DESIGN §4); this decides only `Existing` vs `Conflict`.
pub fn same_args(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (serde_json::from_str::<serde_json::Value>(a), serde_json::from_str::<serde_json::Value>(b)) {
        (Ok(x), Ok(y)) => json_eq(&x, &y),
        _ => false,
    }
}

fn json_eq(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value::*;
    match (a, b) {
        (Number(x), Number(y)) => match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
            (Some(i), Some(j), _, _) => i == j,
            (_, _, Some(i), Some(j)) => i == j,
            // Integers of different signs/ranges differ; a float compares by value.
            _ if (x.is_f64() || y.is_f64()) => x.as_f64() == y.as_f64(),
            _ => false,
        },
        (Array(x), Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b)),
        (Object(x), Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w))),
        _ => a == b,
    }
}

/// One task's row.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    /// 26-char lowercase base32 id.
    pub id: String,
    pub principal: String,
    pub kind: String,
    /// Arguments, exact JSON text.
    pub args: String,
    pub idempotency_key: Option<String>,
    pub status: TaskStatus,
    pub status_message: Option<String>,
    pub progress: Progress,
    /// Last checkpoint the job persisted, JSON text.
    pub checkpoint: Option<String>,
    /// Outstanding and answered input requests: key → request, JSON object text.
    pub input_requests: String,
    /// Answers: key → response, JSON object text.
    pub input_responses: String,
    /// Result of a completed task, exact JSON text.
    pub result: Option<String>,
    /// Error of a failed task: JSON `{code, message}` text.
    pub error: Option<String>,
    /// The failed task this run retries (idempotency: failed → a new run).
    pub prior_failure: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// A terminal task is swept this long after it ended.
    pub ttl_ms: i64,
    pub lease_owner: Option<String>,
    pub lease_expires_ms: Option<i64>,
    pub fence: u64,
    /// How many times a worker started (or resumed) the job.
    pub runs: u64,
    /// The last partial result fragment number handed out (0: none; [`super::partials`]).
    pub partial_seq: u64,
    /// How many fragments were deleted to keep within the bounds.
    pub partial_dropped: u64,
    /// The fragment number the last checkpoint covered: a run resuming from it numbers its
    /// fragments from here.
    pub partial_mark: u64,
}

/// A task to start.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub id: String,
    pub principal: String,
    pub kind: String,
    /// Exact JSON text (validated by the caller).
    pub args: String,
    pub idempotency_key: Option<String>,
    pub ttl_ms: i64,
    pub now_ms: i64,
}

/// What [`TaskCatalog::start_task`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum StartOutcome {
    /// A new task row was committed.
    Created(TaskRecord),
    /// The key names a running or completed task with the same arguments: that task.
    Existing(TaskRecord),
    /// The key named a failed or cancelled task: a new run was created; `prior` is the old id.
    Retried { task: TaskRecord, prior: String },
    /// The key names a task with different arguments (its id).
    Conflict(String),
}

/// A job's report: any of progress, checkpoint.
#[derive(Debug, Clone, Default)]
pub struct TaskUpdate {
    pub progress: Option<Progress>,
    /// JSON text.
    pub checkpoint: Option<String>,
    /// With a checkpoint: the partial result fragment number it covers (stored as the task's
    /// `partial_mark`; `None` leaves the mark as it was).
    pub partial_mark: Option<u64>,
    pub now_ms: i64,
}

/// How a task ended.
#[derive(Debug, Clone)]
pub enum TaskEnd {
    /// Result, exact JSON text.
    Completed(String),
    /// Error `{code, message}` JSON text.
    Failed(String),
}

/// Task storage. Every state change is one atomic transaction.
#[async_trait]
pub trait TaskCatalog: Send + Sync {
    /// Start a task, honouring its idempotency key per (principal, kind, key) as DESIGN §4:
    /// running or completed with the same `args` ([`same_args`]: equal as JSON values) →
    /// `Existing`; failed or cancelled → `Retried` (a new run); other `args` → `Conflict`.
    /// The new row keeps `new.args` as sent. Atomic: concurrent starts with
    /// one key create at most one run. The row is committed when this returns.
    async fn start_task(&self, new: &NewTask) -> CatalogResult<StartOutcome>;

    /// The task's row, or `None` (unknown or swept).
    async fn get_task(&self, id: &str) -> CatalogResult<Option<TaskRecord>>;

    /// The task idempotency key `key` of (`principal`, `kind`) names now, if any (a read: a
    /// replayed start is answered from it without side effects).
    async fn task_by_key(&self, principal: &str, kind: &str, key: &str) -> CatalogResult<Option<TaskRecord>>;

    /// A principal's tasks, newest first, at most `limit`.
    async fn list_tasks(&self, principal: &str, limit: u32) -> CatalogResult<Vec<TaskRecord>>;

    /// Claim one `working` task of one of `kinds` whose lease is free or expired
    /// (`lease_expires_ms <= database now`): sets the lease (`owner`, database now +
    /// `lease_ms`), increments the fence and `runs`, and returns it. Atomic across processes:
    /// of concurrent claimers exactly one gets a given task (PostgreSQL: `FOR UPDATE SKIP
    /// LOCKED`). Lease times are on the **database** clock.
    async fn claim_task(&self, owner: &str, kinds: &[String], lease_ms: i64) -> CatalogResult<Option<TaskRecord>>;

    /// Extend a held lease to database now + `lease_ms`; returns the task's status (so a
    /// worker learns of a cancellation). `Fenced` if the lease was lost (fence moved on).
    async fn renew_lease(&self, id: &str, fence: u64, lease_ms: i64) -> CatalogResult<TaskStatus>;

    /// Persist progress and/or a checkpoint. With `fence = Some`, only while that lease is
    /// current (`Fenced` otherwise); with `None` (an external producer), while not terminal.
    /// `Conflict`-free: a terminal task answers `Fenced`.
    async fn update_task(&self, id: &str, fence: Option<u64>, update: &TaskUpdate) -> CatalogResult<()>;

    /// Append partial result fragment `value` (JSON text, checked by the caller with
    /// [`super::partials::check_fragment`]) to a `working` or `input_required` task, at
    /// `now_ms`, in one transaction with its `task.partial` event. With `fence = Some`, only
    /// while that lease is current, numbered `seq` by the job: a `seq` at or below the task's
    /// `partial_seq` is [`Appended::Replayed`] (nothing stored); with `fence = None` (an
    /// external producer), numbered `partial_seq + 1` (`seq` is ignored). Past the bounds the
    /// oldest fragments are deleted and counted in `partial_dropped`
    /// ([`super::partials::keep_from`]). `Fenced` if the lease was lost or the task is
    /// terminal; `NotFound` if unknown.
    async fn append_partial(&self, id: &str, fence: Option<u64>, seq: u64, value: &str, now_ms: i64) -> CatalogResult<Appended>;

    /// The task's kept fragments with `seq > after`, oldest first, with `dropped` and `next`
    /// from the same read. `NotFound` if unknown.
    async fn task_partials(&self, id: &str, after: u64) -> CatalogResult<PartialPage>;

    /// Record an input request `key` → `request` (JSON text) and move the task to
    /// `input_required`, releasing the lease. `Fenced` if the lease was lost.
    async fn park_for_input(&self, id: &str, fence: u64, key: &str, request: &str, now_ms: i64) -> CatalogResult<()>;

    /// Store `response` (JSON text) for an outstanding request `key`. Returns false (and
    /// changes nothing) when `key` is not outstanding or the task is terminal. When no request
    /// remains unanswered the task goes back to `working` for a worker to resume.
    async fn respond_input(&self, id: &str, key: &str, response: &str, now_ms: i64) -> CatalogResult<bool>;

    /// End a task. Only while not terminal and (with `fence = Some`) while that lease is
    /// current; returns false when the end was discarded (e.g. the task was cancelled).
    async fn finish_task(&self, id: &str, fence: Option<u64>, end: &TaskEnd, now_ms: i64) -> CatalogResult<bool>;

    /// Cancel a non-terminal task (terminal at once); a terminal task is left unchanged.
    /// Returns the row after the call; `NotFound` if unknown.
    async fn cancel_task(&self, id: &str, now_ms: i64) -> CatalogResult<TaskRecord>;

    /// Release a held lease without changing the status (graceful shutdown), so another
    /// worker can resume the task at once.
    async fn release_task(&self, id: &str, fence: u64) -> CatalogResult<()>;

    /// Delete terminal tasks whose `updated_at_ms + ttl_ms <= now_ms`, and their idempotency
    /// keys (only keys that still name a deleted task). Compare-and-set: one statement whose
    /// condition is re-checked at delete time, so it is safe on every replica at once and never
    /// touches a task that is not terminal. Returns how many were deleted.
    async fn sweep_tasks(&self, now_ms: i64) -> CatalogResult<u64>;

    /// How many tasks there are of each (kind, status) (for `/metrics`), and of those
    /// `working` how many no worker holds now (no lease, or an expired one on the database
    /// clock): the queue. One aggregate; kinds and statuses with no task are absent.
    async fn task_counts(&self) -> CatalogResult<Vec<TaskCount>>;
}

/// One row of [`TaskCatalog::task_counts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskCount {
    pub kind: String,
    /// `working`, `input_required`, `completed`, `failed` or `cancelled`.
    pub status: String,
    pub count: u64,
    /// Of `count`, the tasks waiting for a worker (only `working` ones can be).
    pub waiting: u64,
}

/// A [`TaskCount`] from a row with columns `kind`, `status`, `n` and `waiting` (either catalog).
pub(super) fn row_to_task_count<R>(r: &R) -> CatalogResult<TaskCount>
where
    R: sqlx::Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    i64: for<'q> sqlx::Decode<'q, R::Database> + sqlx::Type<R::Database>,
    String: for<'q> sqlx::Decode<'q, R::Database> + sqlx::Type<R::Database>,
{
    Ok(TaskCount {
        kind: r.try_get("kind")?,
        status: r.try_get("status")?,
        count: r.try_get::<i64, _>("n")?.max(0) as u64,
        waiting: r.try_get::<i64, _>("waiting")?.max(0) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::same_args;

    #[test]
    fn arguments_are_compared_as_json_values() {
        assert!(same_args(r#"{"a":1}"#, r#"{ "a": 1 }"#));
        assert!(same_args(r#"{"a":1,"b":[true,null]}"#, r#"{"b":[true,null],"a":1.0}"#));
        assert!(same_args("1e2", "100"));
        assert!(!same_args(r#"{"a":[1,2]}"#, r#"{"a":[2,1]}"#));
        assert!(!same_args(r#"{"a":1}"#, r#"{"a":"1"}"#));
        assert!(!same_args(r#"{"a":1}"#, r#"{"a":1,"b":null}"#));
        assert!(!same_args("-1", "18446744073709551615"));
        assert!(same_args("not json", "not json") && !same_args("not json", "not  json"));
    }
}
