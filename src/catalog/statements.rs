//! The upload catalog's statements, each written once for SQLite and PostgreSQL (the marks
//! are in `dialect.rs`). `sqlite.rs` and `postgres.rs` bind them in the same order.

use super::dialect::{sql, Stmt};
use super::sql::upload_columns;

/// An upload row: the 18 [`upload_columns`], then `creation_key`, `creation_fingerprint`.
pub(super) const INSERT_UPLOAD: Stmt =
    sql!("INSERT INTO uploads (", upload_columns!(), ", creation_key, creation_fingerprint) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");

/// (principal, now_ms) → `bytes`, `open`: what a principal holds (quotas).
pub(super) const USAGE: Stmt = sql!(
    "SELECT CAST(COALESCE(SUM(COALESCE(length, {greatest}(\"offset\", COALESCE(reserved_to, 0)))), 0) AS BIGINT) AS bytes, \
     COUNT(*) FILTER (WHERE finished_at_ms IS NULL) AS open \
     FROM uploads WHERE principal = ? AND expired = {false} \
     AND (finished_at_ms IS NOT NULL OR expires_at_ms IS NULL OR expires_at_ms > ?)"
);

/// (principal, key) → the live upload holding the creation key, and its fingerprint.
pub(super) const BY_CREATION_KEY: Stmt =
    sql!("SELECT ", upload_columns!(), ", creation_fingerprint FROM uploads WHERE principal = ? AND creation_key = ? AND expired = {false}");

pub(super) const ANNOUNCE: Stmt = sql!("UPDATE uploads SET announced = {true} WHERE id = ? AND announced = {false}");

pub(super) const WITHDRAW: Stmt = sql!("DELETE FROM uploads WHERE id = ? AND announced = {false}");

/// id → principal, length, offset, reserved_to of a live upload.
pub(super) const RESERVATION_ROW: Stmt = sql!("SELECT principal, length, \"offset\", reserved_to FROM uploads WHERE id = ? AND expired = {false}");

/// (reserved_to, nonce, id).
pub(super) const SET_RESERVATION: Stmt = sql!("UPDATE uploads SET reserved_to = ?, reservation = ? WHERE id = ?");

/// (id, nonce).
pub(super) const RELEASE_RESERVATION: Stmt = sql!("UPDATE uploads SET reserved_to = NULL, reservation = NULL WHERE id = ? AND reservation = ?");

/// The start of the retention query: (finished_before_ms, …).
macro_rules! finished_before {
    () => {
        "SELECT id FROM uploads WHERE finished_at_ms IS NOT NULL AND expired = {false} AND finished_at_ms <= ?"
    };
}

/// (finished_before_ms, principal, limit).
pub(super) const FINISHED_BEFORE_OF: Stmt = sql!(finished_before!(), " AND principal = ? ORDER BY finished_at_ms LIMIT ?");

/// (finished_before_ms, principals to leave out as an array, limit); PostgreSQL only — SQLite
/// lists the principals as placeholders ([`FINISHED_BEFORE_SQLITE`]).
pub(super) const FINISHED_BEFORE_EXCEPT_PG: Stmt = sql!(finished_before!(), " AND NOT (principal = ANY(?)) ORDER BY finished_at_ms LIMIT ?");

/// The start of the retention query on SQLite, for a statement built with one `?` per
/// principal left out.
pub(super) const FINISHED_BEFORE_SQLITE: &str = sql!(finished_before!()).sqlite;

/// (now_ms, id, finished_before_ms).
pub(super) const EXPIRE_FINISHED_IF_DUE: Stmt = sql!(
    "UPDATE uploads SET updated_at_ms = ?, expired = {true}, fence = fence + 1, lease_owner = NULL, lease_expires_ms = NULL \
     WHERE id = ? AND finished_at_ms IS NOT NULL AND finished_at_ms <= ? AND expired = {false}"
);

pub(super) const GET_UPLOAD: Stmt = sql!("SELECT ", upload_columns!(), " FROM uploads WHERE id = ?");

/// id → the row's blob state (seq −1), then its entries in order, from one snapshot.
pub(super) const BLOB_STATE: Stmt = sql!(
    "SELECT blob_state, -1 AS seq FROM uploads WHERE id = ?1 \
     UNION ALL SELECT entry, seq FROM upload_blob_entries WHERE upload_id = ?1 ORDER BY seq"
);

pub(super) const ACQUIRE_FENCE: Stmt = sql!("UPDATE uploads SET fence = fence + 1 WHERE id = ? RETURNING fence");

/// (offset, hash_state, blob_state, length, finished_sha256, now_ms, expires_at_ms, id, fence).
macro_rules! checkpoint_update {
    () => {
        "UPDATE uploads SET \"offset\" = ?1, hash_state = ?2, blob_state = ?3, length = COALESCE(?4, length), \
         sha256 = COALESCE(?5, sha256), finished_at_ms = CASE WHEN ?5{pg:::bytea} IS NULL THEN finished_at_ms ELSE ?6 END, \
         expires_at_ms = CASE WHEN ?5{pg:::bytea} IS NULL THEN ?7 ELSE NULL END, updated_at_ms = ?6 \
         WHERE id = ?8 AND fence = ?9"
    };
}

/// (offset, hash_state, blob_state, expires_at_ms, now_ms, id, fence).
macro_rules! reopen_update {
    () => {
        "UPDATE uploads SET \"offset\" = ?1, hash_state = ?2, blob_state = ?3, length = NULL, sha256 = NULL, \
         finished_at_ms = NULL, expires_at_ms = ?4, updated_at_ms = ?5 WHERE id = ?6 AND fence = ?7 AND expired = {false}"
    };
}

/// PostgreSQL: fenced `update` and the replacement of the row's blob entries in one statement
/// (data-modifying CTEs; the rows it upserts and the ones it deletes are disjoint). After the
/// update's own parameters: `seq` (int4[] of the entries' numbers), `entry` (bytea[]),
/// `end` (the new number of entries). Returns the rows the update changed.
macro_rules! with_entries {
    ($update:expr, $seq:literal, $entry:literal, $end:literal) => {
        concat!(
            "WITH up AS (",
            $update,
            " RETURNING id), \
             put AS (INSERT INTO upload_blob_entries (upload_id, seq, entry) SELECT up.id, t.s, t.e FROM up, UNNEST(?",
            $seq,
            "::int4[], ?",
            $entry,
            "::bytea[]) AS t(s, e) \
             ON CONFLICT (upload_id, seq) DO UPDATE SET entry = EXCLUDED.entry), \
             cut AS (DELETE FROM upload_blob_entries WHERE upload_id IN (SELECT id FROM up) AND seq >= ?",
            $end,
            ") SELECT count(*) FROM up"
        )
    };
}

pub(super) const CHECKPOINT: Stmt = sql!(checkpoint_update!());
/// [`CHECKPOINT`] returning the row as written (SQLite's read cache keeps it).
pub(super) const CHECKPOINT_RETURNING_SQLITE: &str = sql!(checkpoint_update!(), " RETURNING ", upload_columns!()).sqlite;
/// [`CHECKPOINT`] and its blob entries (`with_entries!`; PostgreSQL only).
pub(super) const CHECKPOINT_WITH_ENTRIES_PG: Stmt = sql!(with_entries!(checkpoint_update!(), "10", "11", "12"));
pub(super) const REOPEN: Stmt = sql!(reopen_update!());
/// [`REOPEN`] and its blob entries (`with_entries!`; PostgreSQL only).
pub(super) const REOPEN_WITH_ENTRIES_PG: Stmt = sql!(with_entries!(reopen_update!(), "8", "9", "10"));

/// (now_ms, id).
pub(super) const MARK_EXPIRED: Stmt = sql!(
    "UPDATE uploads SET updated_at_ms = CASE WHEN expired = {true} THEN updated_at_ms ELSE ? END, \
     expired = {true}, fence = fence + 1, lease_owner = NULL, lease_expires_ms = NULL WHERE id = ? AND finished_at_ms IS NULL"
);

/// (now_ms, id). One statement: on PostgreSQL under READ COMMITTED a concurrent writer's
/// update makes it re-check the WHERE against the new row, so a finish or a fresh lease wins.
pub(super) const EXPIRE_IF_DUE: Stmt = sql!(
    "UPDATE uploads SET updated_at_ms = ?1, expired = {true}, fence = fence + 1, lease_owner = NULL, lease_expires_ms = NULL \
     WHERE id = ?2 AND finished_at_ms IS NULL AND expired = {false} AND expires_at_ms <= ?1 \
     AND (lease_owner IS NULL OR lease_expires_ms <= {now})"
);

pub(super) const DELETE_UPLOAD: Stmt = sql!("DELETE FROM uploads WHERE id = ?");

/// limit → ids whose row was deleted and whose bytes may remain (`blob_removals`, queued by a
/// trigger on every delete of an upload row), oldest first.
pub(super) const LIST_BLOB_REMOVALS: Stmt = sql!("SELECT id FROM blob_removals ORDER BY at_ms, id LIMIT ?");

pub(super) const FORGET_BLOB_REMOVAL: Stmt = sql!("DELETE FROM blob_removals WHERE id = ?");

/// id → rows naming it, queued removals naming it: one statement, so one snapshot.
pub(super) const BLOB_CLAIM: Stmt = sql!(
    "SELECT CAST((SELECT COUNT(*) FROM uploads WHERE id = ?1) AS BIGINT) AS uploads, \
     CAST((SELECT COUNT(*) FROM blob_removals WHERE id = ?1) AS BIGINT) AS removals"
);

/// (id, before_ms).
pub(super) const DELETE_TOMBSTONE: Stmt = sql!("DELETE FROM uploads WHERE id = ? AND expired = {true} AND updated_at_ms < ?");

/// (owner, ttl_ms, id) → fence, lease_expires_ms, lease_takeovers, then the [`upload_columns`]
/// (the holder's first read of the upload, without a statement of its own). One statement: the
/// condition and the update are atomic. SET expressions read the row as it was, so
/// `lease_takeovers` counts whether an (expired) owner was still named; RETURNING reads the row
/// as written.
pub(super) const ACQUIRE_LEASE: Stmt = sql!(
    "UPDATE uploads SET fence = fence + 1, lease_owner = ?, lease_expires_ms = {now} + ?, \
     lease_takeovers = lease_takeovers + CASE WHEN lease_owner IS NOT NULL THEN 1 ELSE 0 END \
     WHERE id = ? AND expired = {false} AND (lease_owner IS NULL OR lease_expires_ms <= {now}) \
     RETURNING fence, lease_expires_ms, lease_takeovers, ",
    upload_columns!()
);

/// id → lease_owner, lease_expires_ms, expired.
pub(super) const LEASE_HOLDER: Stmt = sql!("SELECT lease_owner, lease_expires_ms, expired FROM uploads WHERE id = ?");

/// (ttl_ms, id, fence) → lease_expires_ms.
pub(super) const RENEW_LEASE: Stmt = sql!(
    "UPDATE uploads SET lease_expires_ms = {now} + ? WHERE id = ? AND fence = ? AND expired = {false} AND lease_owner IS NOT NULL \
     RETURNING lease_expires_ms"
);

/// (expires_at_ms, id, fence).
pub(super) const TOUCH: Stmt = sql!(
    "UPDATE uploads SET expires_at_ms = CASE WHEN finished_at_ms IS NULL AND expires_at_ms IS NOT NULL \
     THEN {greatest}(expires_at_ms, ?) ELSE expires_at_ms END WHERE id = ? AND fence = ? AND expired = {false}"
);

/// (id, fence).
pub(super) const RELEASE_LEASE: Stmt = sql!("UPDATE uploads SET lease_owner = NULL, lease_expires_ms = NULL WHERE id = ? AND fence = ?");

/// owner: its upload leases expire now.
pub(super) const RECLAIM_UPLOADS: Stmt = sql!("UPDATE uploads SET lease_expires_ms = 0 WHERE lease_owner = ?");
/// owner: its task leases are let go.
pub(super) const RECLAIM_TASKS: Stmt =
    sql!("UPDATE tasks SET lease_owner = NULL, lease_expires_ms = NULL WHERE lease_owner = ? AND status IN ('working', 'input_required')");
/// owner: its delivery leases are let go.
pub(super) const RECLAIM_DELIVERIES: Stmt = sql!("UPDATE webhook_deliveries SET lease_owner = NULL, lease_expires_ms = NULL WHERE lease_owner = ?");

/// (name, candidate): the first writer's value stays.
pub(super) const OFFER_SECRET: Stmt = sql!("INSERT INTO shared_secrets (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING");
pub(super) const SECRET: Stmt = sql!("SELECT value FROM shared_secrets WHERE name = ?");

/// (now_ms, limit) → ids.
pub(super) const LIST_EXPIRED: Stmt = sql!(
    "SELECT id FROM uploads WHERE finished_at_ms IS NULL AND expired = {false} AND expires_at_ms <= ? \
     ORDER BY expires_at_ms LIMIT ?"
);

/// (before_ms, limit) → ids.
pub(super) const LIST_TOMBSTONES: Stmt = sql!("SELECT id FROM uploads WHERE expired = {true} AND updated_at_ms < ? LIMIT ?");

/// limit → ids.
pub(super) const LIST_AWAITING_FINISH: Stmt = sql!(
    "SELECT id FROM uploads WHERE finished_at_ms IS NULL AND expired = {false} \
     AND ((length IS NOT NULL AND \"offset\" = length) OR concat_kind = 'final') ORDER BY concat_kind = 'final', updated_at_ms LIMIT ?"
);

/// part id → id, concat_parts of open finals naming it (a substring match; callers split).
pub(super) const FINALS_NAMING: Stmt = sql!(
    "SELECT id, concat_parts FROM uploads WHERE concat_kind = 'final' AND finished_at_ms IS NULL \
     AND expired = {false} AND {strpos}(concat_parts, ?) > 0"
);

/// (principal, limit).
pub(super) const LIST_UPLOADS: Stmt =
    sql!("SELECT ", upload_columns!(), " FROM uploads WHERE principal = ? AND expired = {false} ORDER BY created_at_ms DESC LIMIT ?");

/// (after, limit).
pub(super) const LIST_UPLOADS_AFTER: Stmt = sql!("SELECT ", upload_columns!(), " FROM uploads WHERE id > ? ORDER BY id LIMIT ?");

pub(super) const PING: Stmt = sql!("SELECT 1");

/// (id, state, used_at_ms).
pub(super) const PUT_MCP_SESSION: Stmt = sql!(
    "INSERT INTO mcp_sessions (id, state, used_at_ms) VALUES (?, ?, ?) \
     ON CONFLICT (id) DO UPDATE SET state = excluded.state, used_at_ms = excluded.used_at_ms"
);
/// (used_at_ms, id) → state.
pub(super) const GET_MCP_SESSION: Stmt = sql!("UPDATE mcp_sessions SET used_at_ms = ? WHERE id = ? RETURNING state");
pub(super) const DELETE_MCP_SESSION: Stmt = sql!("DELETE FROM mcp_sessions WHERE id = ?");
/// before_ms.
pub(super) const FORGET_MCP_SESSIONS: Stmt = sql!("DELETE FROM mcp_sessions WHERE used_at_ms < ?");

/// (kind, detail, found_at_ms, id): only a finished, live upload is marked.
pub(super) const SET_DAMAGE: Stmt = sql!(
    "INSERT INTO upload_damage (id, kind, detail, found_at_ms) SELECT id, ?, ?, ? FROM uploads WHERE id = ? AND finished_at_ms IS NOT NULL \
     AND expired = {false} ON CONFLICT (id) DO UPDATE SET kind = excluded.kind, detail = excluded.detail, found_at_ms = excluded.found_at_ms"
);
pub(super) const CLEAR_DAMAGE: Stmt = sql!("DELETE FROM upload_damage WHERE id = ?");
/// id → kind, detail, found_at_ms.
pub(super) const DAMAGE: Stmt = sql!("SELECT kind, detail, found_at_ms FROM upload_damage WHERE id = ?");

/// (code, detail, failed_at_ms, id): only an unfinished final upload is marked; the first
/// failure recorded stays.
pub(super) const SET_FINAL_FAILURE: Stmt = sql!(
    "INSERT INTO final_failures (id, code, detail, failed_at_ms) SELECT id, ?, ?, ? FROM uploads WHERE id = ? AND concat_kind = 'final' \
     AND finished_at_ms IS NULL ON CONFLICT (id) DO NOTHING"
);
/// id → code, detail, failed_at_ms.
pub(super) const FINAL_FAILURE: Stmt = sql!("SELECT code, detail, failed_at_ms FROM final_failures WHERE id = ?");

/// (crc32, id): kept for a finished upload that is not a tombstone; the first value stays.
pub(super) const KEEP_CRC32: Stmt = sql!(
    "INSERT INTO upload_crc32 (id, crc32) SELECT id, ? FROM uploads WHERE id = ? AND finished_at_ms IS NOT NULL AND expired = {false} \
     ON CONFLICT (id) DO NOTHING"
);
/// id: a damage mark set or cleared forgets the kept value (the bytes it was computed from
/// were wrong, or were restored).
pub(super) const FORGET_CRC32: Stmt = sql!("DELETE FROM upload_crc32 WHERE id = ?");
/// id → crc32.
pub(super) const CRC32: Stmt = sql!("SELECT crc32 FROM upload_crc32 WHERE id = ?");
