//! The task catalog's statements, each written once for SQLite and PostgreSQL (the marks are
//! in `dialect.rs`). `sqlite_tasks.rs` and `postgres_tasks.rs` bind them in the same order.
//! What stays per backend: claiming (one `UPDATE … FOR UPDATE SKIP LOCKED` on PostgreSQL, a
//! select and an update inside `BEGIN IMMEDIATE` on SQLite, with the kinds as an array or as
//! JSON), sweeping (`= ANY(array)` of the deleted ids), and the idempotency key's advisory lock.

use super::dialect::{sql, Stmt};
use super::sql::task_columns;

/// id → the task row; on PostgreSQL locked for the rest of the transaction (SQLite's
/// `BEGIN IMMEDIATE` already holds the only write lock).
pub(super) const TASK_FOR_UPDATE: Stmt = sql!("SELECT ", task_columns!(), " FROM tasks WHERE id = ?{pg: FOR UPDATE}");

/// id → the task row.
pub(super) const GET_TASK: Stmt = sql!("SELECT ", task_columns!(), " FROM tasks WHERE id = ?");

/// (id, principal, kind, args, idempotency_key, prior_failure, now_ms, ttl_ms) → the new row.
pub(super) const INSERT_TASK: Stmt = sql!(
    "INSERT INTO tasks (id, principal, kind, args, idempotency_key, status, prior_failure, created_at_ms, updated_at_ms, ttl_ms) \
     VALUES (?1, ?2, ?3, ?4, ?5, 'working', ?6, ?7, ?7, ?8) RETURNING ",
    task_columns!()
);

/// (principal, kind, key) → task_id.
pub(super) const TASK_BY_KEY: Stmt = sql!("SELECT task_id FROM task_keys WHERE principal = ? AND kind = ? AND key = ?");

/// (principal, kind, key, task_id): the key names this task from now on.
pub(super) const PUT_TASK_KEY: Stmt = sql!(
    "INSERT INTO task_keys (principal, kind, key, task_id) VALUES (?, ?, ?, ?) \
     ON CONFLICT (principal, kind, key) DO UPDATE SET task_id = excluded.task_id"
);

/// (principal, limit).
pub(super) const LIST_TASKS: Stmt = sql!("SELECT ", task_columns!(), " FROM tasks WHERE principal = ? ORDER BY created_at_ms DESC, id LIMIT ?");

/// (lease_ms, id, fence) → status.
pub(super) const RENEW_TASK_LEASE: Stmt = sql!("UPDATE tasks SET lease_expires_ms = {now} + ? WHERE id = ? AND fence = ? RETURNING status");

/// (progress, checkpoint, partial_mark, now_ms, id, fence or NULL).
pub(super) const UPDATE_TASK: Stmt = sql!(
    "UPDATE tasks SET progress = COALESCE(?1, progress), checkpoint = COALESCE(?2, checkpoint), \
     partial_mark = COALESCE(?3, partial_mark), updated_at_ms = ?4 \
     WHERE id = ?5 AND status IN ('working', 'input_required') AND (?6{pg:::bigint} IS NULL OR fence = ?6)"
);

/// (task_id, seq, at_ms, value).
pub(super) const INSERT_PARTIAL: Stmt = sql!("INSERT INTO task_partials (task_id, seq, at_ms, value) VALUES (?, ?, ?, ?)");

/// (task_id, limit) → (seq, bytes of the value) from the newest.
pub(super) const PARTIAL_SIZES: Stmt = sql!(
    "SELECT seq, CAST({sqlite:length(CAST(value AS BLOB))}{pg:octet_length(value)} AS BIGINT) FROM task_partials \
     WHERE task_id = ? ORDER BY seq DESC LIMIT ?"
);

/// (task_id, from): fragments before `from` go.
pub(super) const DROP_PARTIALS: Stmt = sql!("DELETE FROM task_partials WHERE task_id = ? AND seq < ?");

/// (partial_seq, dropped, now_ms, id).
pub(super) const SET_PARTIAL_SEQ: Stmt =
    sql!("UPDATE tasks SET partial_seq = ?, partial_dropped = partial_dropped + ?, updated_at_ms = ? WHERE id = ?");

/// (after, id) → a page of fragments (`partials::PageRow`).
pub(super) const PARTIAL_PAGE: Stmt = sql!(
    "SELECT t.partial_seq, t.partial_dropped, p.seq, p.at_ms, p.value FROM tasks t \
     LEFT JOIN task_partials p ON p.task_id = t.id AND p.seq > ? WHERE t.id = ? ORDER BY p.seq"
);

/// (input_requests, now_ms, id).
pub(super) const PARK: Stmt = sql!(
    "UPDATE tasks SET status = 'input_required', input_requests = ?, lease_owner = NULL, lease_expires_ms = NULL, \
     updated_at_ms = ? WHERE id = ?"
);

/// (input_responses, status, now_ms, id).
pub(super) const RESPOND: Stmt = sql!("UPDATE tasks SET input_responses = ?, status = ?, updated_at_ms = ? WHERE id = ?");

/// (status, result, error, now_ms, id, fence or NULL).
pub(super) const FINISH_TASK: Stmt = sql!(
    "UPDATE tasks SET status = ?1, result = ?2, error = ?3, lease_owner = NULL, lease_expires_ms = NULL, updated_at_ms = ?4 \
     WHERE id = ?5 AND status IN ('working', 'input_required') AND (?6{pg:::bigint} IS NULL OR fence = ?6)"
);

/// (now_ms, id).
pub(super) const CANCEL_TASK: Stmt = sql!(
    "UPDATE tasks SET status = 'cancelled', lease_owner = NULL, lease_expires_ms = NULL, updated_at_ms = ? \
     WHERE id = ? AND status IN ('working', 'input_required')"
);

/// (id, fence).
pub(super) const RELEASE_TASK: Stmt = sql!("UPDATE tasks SET lease_owner = NULL, lease_expires_ms = NULL WHERE id = ? AND fence = ?");

/// → kind, status, n, waiting (working and not leased).
pub(super) const TASK_COUNTS: Stmt = sql!(
    "SELECT kind, status, COUNT(*) AS n, \
     COUNT(*) FILTER (WHERE status = 'working' AND (lease_expires_ms IS NULL OR lease_expires_ms <= {now})) AS waiting \
     FROM tasks GROUP BY kind, status"
);
