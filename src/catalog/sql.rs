//! What the SQLite and PostgreSQL catalogs share besides their statements (those are written
//! once in `statements.rs` and the like, rendered per database by `dialect.rs`): the column
//! lists, the row decoders (generic over the driver's row through [`Cols`]), value
//! conversions, and the creation-key arbitration.

use std::collections::BTreeMap;

use serde_json::value::RawValue;
use sqlx::postgres::{PgRow, Postgres};
use sqlx::sqlite::{Sqlite, SqliteRow};
use sqlx::{Decode, Row, Type};

use super::tasks::{Progress, TaskRecord, TaskStatus};
use super::{CatalogError, CatalogResult, Concat, KeyedCreate, UploadRecord};

/// The columns [`row_to_record`] reads, in `SELECT` order (a literal, for `concat!` and `sql!`).
macro_rules! upload_columns {
    () => {
        "id, principal, length, \"offset\", metadata, hash_state, sha256, expected_sha256, \
         concat_kind, concat_parts, concat_header, created_at_ms, updated_at_ms, expires_at_ms, \
         finished_at_ms, expired, blob_state, announced"
    };
}
pub(super) use upload_columns;

/// The columns [`row_to_task`] reads, in `SELECT` order (a literal, for `concat!` and `sql!`).
macro_rules! task_columns {
    () => {
        "id, principal, kind, args, idempotency_key, status, status_message, progress, checkpoint, \
         input_requests, input_responses, result, error, prior_failure, created_at_ms, updated_at_ms, ttl_ms, \
         lease_owner, lease_expires_ms, fence, runs, partial_seq, partial_dropped, partial_mark"
    };
}
pub(super) use task_columns;

/// A column value both drivers decode (text, integers, `bool` — SQLite's 0/1 integers too —,
/// bytes, and `Option`s of them).
pub(super) trait Value: for<'r> Decode<'r, Sqlite> + Type<Sqlite> + for<'r> Decode<'r, Postgres> + Type<Postgres> {}

impl<T> Value for T where T: for<'r> Decode<'r, Sqlite> + Type<Sqlite> + for<'r> Decode<'r, Postgres> + Type<Postgres> {}

/// A row of either catalog, read by column name.
pub(super) trait Cols {
    fn col<T: Value>(&self, name: &str) -> Result<T, sqlx::Error>;
}

impl Cols for SqliteRow {
    fn col<T: Value>(&self, name: &str) -> Result<T, sqlx::Error> {
        self.try_get(name)
    }
}

impl Cols for PgRow {
    fn col<T: Value>(&self, name: &str) -> Result<T, sqlx::Error> {
        self.try_get(name)
    }
}

pub(super) fn to_i64(v: u64) -> CatalogResult<i64> {
    i64::try_from(v).map_err(|_| CatalogError::Backend("value exceeds i64".into()))
}

pub(super) fn digest32(v: Option<Vec<u8>>) -> CatalogResult<Option<[u8; 32]>> {
    v.map(|b| <[u8; 32]>::try_from(b.as_slice()).map_err(|_| CatalogError::Backend("stored digest is not 32 bytes".into()))).transpose()
}

/// An upload row ([`upload_columns`]).
pub(super) fn row_to_record(r: &impl Cols) -> CatalogResult<UploadRecord> {
    let kind: String = r.col("concat_kind")?;
    let concat = match kind.as_str() {
        "partial" => Concat::Partial,
        "final" => {
            let parts: String = r.col::<Option<String>>("concat_parts")?.unwrap_or_default();
            Concat::Final {
                parts: parts.split_whitespace().map(str::to_owned).collect(),
                header: r.col::<Option<String>>("concat_header")?.unwrap_or_default(),
            }
        }
        _ => Concat::None,
    };
    Ok(UploadRecord {
        id: r.col("id")?,
        principal: r.col("principal")?,
        length: r.col::<Option<i64>>("length")?.map(|v| v as u64),
        offset: r.col::<i64>("offset")? as u64,
        metadata: r.col("metadata")?,
        hash_state: r.col("hash_state")?,
        sha256: digest32(r.col("sha256")?)?,
        expected_sha256: digest32(r.col("expected_sha256")?)?,
        concat,
        created_at_ms: r.col("created_at_ms")?,
        updated_at_ms: r.col("updated_at_ms")?,
        expires_at_ms: r.col("expires_at_ms")?,
        finished_at_ms: r.col("finished_at_ms")?,
        expired: r.col::<bool>("expired")?,
        blob_state: r.col("blob_state")?,
        provisional: !r.col::<bool>("announced")?,
    })
}

/// A blob's claim from the counts [`super::statements::BLOB_CLAIM`] reads.
pub(super) fn blob_claim(uploads: i64, removals: i64) -> super::BlobClaim {
    match (uploads, removals) {
        (0, 0) => super::BlobClaim::Unclaimed,
        (0, _) => super::BlobClaim::Removal,
        _ => super::BlobClaim::Row,
    }
}

pub(super) fn corrupt(what: &str) -> CatalogError {
    CatalogError::Backend(format!("stored task {what} is invalid").into())
}

/// A task row ([`task_columns`]).
pub(super) fn row_to_task(r: &impl Cols) -> CatalogResult<TaskRecord> {
    let status: String = r.col("status")?;
    let progress: String = r.col("progress")?;
    Ok(TaskRecord {
        id: r.col("id")?,
        principal: r.col("principal")?,
        kind: r.col("kind")?,
        args: r.col("args")?,
        idempotency_key: r.col("idempotency_key")?,
        status: TaskStatus::parse(&status).ok_or_else(|| corrupt("status"))?,
        status_message: r.col("status_message")?,
        progress: serde_json::from_str::<Progress>(&progress).map_err(|_| corrupt("progress"))?,
        checkpoint: r.col("checkpoint")?,
        input_requests: r.col("input_requests")?,
        input_responses: r.col("input_responses")?,
        result: r.col("result")?,
        error: r.col("error")?,
        prior_failure: r.col("prior_failure")?,
        created_at_ms: r.col("created_at_ms")?,
        updated_at_ms: r.col("updated_at_ms")?,
        ttl_ms: r.col("ttl_ms")?,
        lease_owner: r.col("lease_owner")?,
        lease_expires_ms: r.col("lease_expires_ms")?,
        fence: r.col::<i64>("fence")? as u64,
        runs: r.col::<i64>("runs")? as u64,
        partial_seq: r.col::<i64>("partial_seq")?.max(0) as u64,
        partial_dropped: r.col::<i64>("partial_dropped")?.max(0) as u64,
        partial_mark: r.col::<i64>("partial_mark")?.max(0) as u64,
    })
}

/// A task's input requests or responses, by request id.
pub(super) type JsonMap = BTreeMap<String, Box<RawValue>>;

pub(super) fn json_map(text: &str) -> CatalogResult<JsonMap> {
    serde_json::from_str(text).map_err(|_| corrupt("input map"))
}

pub(super) fn json_text(map: &JsonMap) -> String {
    serde_json::to_string(map).expect("a map of raw JSON serialises")
}

pub(super) fn raw(text: &str) -> CatalogResult<Box<RawValue>> {
    RawValue::from_string(text.to_string()).map_err(|e| CatalogError::Backend(Box::new(e)))
}

/// Create an upload holding a creation key (both backends): the partial unique index
/// (principal, creation_key) WHERE live is the arbiter — of concurrent `insert`s one wins,
/// the others fail with `AlreadyExists` and read the winner (`by_key`). An id taken by another
/// upload (`id_taken`) is `AlreadyExists`; a holder that went away between the insert and the
/// read is tried again, three times in all.
pub(super) async fn create_keyed<I, B, G>(insert: impl Fn() -> I, by_key: impl Fn() -> B, id_taken: impl Fn() -> G) -> CatalogResult<KeyedCreate>
where
    I: std::future::Future<Output = CatalogResult<()>>,
    B: std::future::Future<Output = CatalogResult<Option<(UploadRecord, String)>>>,
    G: std::future::Future<Output = CatalogResult<bool>>,
{
    for _ in 0..3 {
        match insert().await {
            Ok(()) => return Ok(KeyedCreate::Created),
            Err(CatalogError::AlreadyExists) => {
                if let Some((upload, fingerprint)) = by_key().await? {
                    return Ok(KeyedCreate::Existing { upload: Box::new(upload), fingerprint });
                }
                if id_taken().await? {
                    return Err(CatalogError::AlreadyExists);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(CatalogError::Backend("creation key contended too long".into()))
}
