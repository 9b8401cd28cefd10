//! The event catalog's statements, each written once for SQLite and PostgreSQL (the marks
//! are in `dialect.rs`). What stays per backend: a cursor's starting point (SQLite's
//! AUTOINCREMENT counter, PostgreSQL's `MAX(seq)`), claiming (one `UPDATE … FROM (… FOR UPDATE
//! SKIP LOCKED)` on PostgreSQL, a select and an update a row inside `BEGIN IMMEDIATE` on SQLite),
//! pruning (`NOT IN` against `NOT EXISTS`, each the form its planner answers well) and the state
//! list of `list_deliveries` (JSON against an array).

use super::dialect::{sql, Stmt};
use super::events::{delivery_columns, event_columns};

/// (after_seq, principal or NULL, limit).
pub(super) const LIST_EVENTS: Stmt =
    sql!("SELECT ", event_columns!(), " FROM events e WHERE e.seq > ?1 AND (?2{pg:::TEXT} IS NULL OR e.principal = ?2) ORDER BY e.seq LIMIT ?3");

/// id → the event.
pub(super) const EVENT_BY_ID: Stmt = sql!("SELECT ", event_columns!(), " FROM events e WHERE e.id = ?");

/// (after_seq, limit): the events a cursor has not passed.
pub(super) const EVENTS_AFTER: Stmt = sql!("SELECT ", event_columns!(), " FROM events e WHERE e.seq > ? ORDER BY e.seq LIMIT ?");

/// before_ms: settled deliveries older than that go.
pub(super) const PRUNE_DELIVERIES: Stmt =
    sql!("DELETE FROM webhook_deliveries WHERE state <> 'pending' AND COALESCE(last_attempt_ms, created_at_ms) < ?");

/// webhook → its cursor; on PostgreSQL locked, so replicas take turns and each reads the
/// cursor the last one left.
pub(super) const CURSOR: Stmt = sql!("SELECT last_seq FROM webhook_cursors WHERE webhook = ?{pg: FOR UPDATE}");

/// (webhook, event_seq, subject, now_ms).
pub(super) const INSERT_DELIVERY: Stmt = sql!(
    "INSERT INTO webhook_deliveries (webhook, event_seq, subject, state, created_at_ms, next_attempt_ms) VALUES (?1, ?2, ?3, 'pending', ?4, ?4) \
     ON CONFLICT (webhook, event_seq) DO NOTHING"
);

/// (last_seq, webhook).
pub(super) const SET_CURSOR: Stmt = sql!("UPDATE webhook_cursors SET last_seq = ? WHERE webhook = ?");

/// (webhook, event_seq) → the delivery and its event.
pub(super) const DELIVERY: Stmt = sql!(
    "SELECT ",
    delivery_columns!(),
    ", ",
    event_columns!(),
    " FROM webhook_deliveries d JOIN events e ON e.seq = d.event_seq WHERE d.webhook = ? AND d.event_seq = ?"
);

/// (state, now_ms, status, error, next_attempt_ms or NULL, webhook, event_seq, owner).
pub(super) const SETTLE_DELIVERY: Stmt = sql!(
    "UPDATE webhook_deliveries SET state = ?, attempts = attempts + 1, last_attempt_ms = ?, last_status = ?, last_error = ?, \
     next_attempt_ms = COALESCE(?, next_attempt_ms), lease_owner = NULL, lease_expires_ms = NULL \
     WHERE webhook = ? AND event_seq = ? AND lease_owner = ? AND state = 'pending'"
);

/// → pending, failed.
pub(super) const DELIVERY_BACKLOG: Stmt = sql!(
    "SELECT COUNT(*) FILTER (WHERE state = 'pending'), COUNT(*) FILTER (WHERE state = 'failed') FROM webhook_deliveries WHERE state <> 'delivered'"
);

/// The start of `list_deliveries`; the backend adds its state filter.
macro_rules! deliveries_joined {
    () => {
        concat!(
            "SELECT ",
            $crate::catalog::events::delivery_columns!(),
            ", ",
            $crate::catalog::events::event_columns!(),
            " FROM webhook_deliveries d JOIN events e ON e.seq = d.event_seq "
        )
    };
}
pub(super) use deliveries_joined;
