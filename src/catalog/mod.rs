//! Upload and task metadata: the [`Catalog`] trait, its SQLite implementation (the embedded
//! default) and its PostgreSQL one (several replicas on one database).
//!
//! The catalog's `offset` for an upload is the truth (DESIGN §2): bytes `[0, offset)` are
//! durable in the blob store and `hash_state` is the sha256 midstate of exactly those bytes.
//! Every write that moves an offset is a [`Catalog::checkpoint`], guarded by the fencing token
//! the writer obtained from [`Catalog::acquire_fence`].

use async_trait::async_trait;

pub mod conformance;
pub mod postgres;
mod postgres_tasks;
pub mod sqlite;
mod sqlite_tasks;
pub mod tasks;

pub use postgres::PostgresCatalog;
pub use sqlite::SqliteCatalog;
pub use tasks::{NewTask, Progress, StartOutcome, TaskCatalog, TaskEnd, TaskRecord, TaskStatus, TaskUpdate};

/// How an upload takes part in TUS concatenation (TUS 1.0 §Concatenation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Concat {
    /// An ordinary upload.
    None,
    /// `Upload-Concat: partial`.
    Partial,
    /// `Upload-Concat: final;…`: the ids of the partial uploads in order, and the header
    /// value as received (echoed on HEAD).
    Final { parts: Vec<String>, header: String },
}

/// One upload's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadRecord {
    /// 26-char lowercase base32 id (128 random bits).
    pub id: String,
    /// Who created it; other principals never see it.
    pub principal: String,
    /// Total length in bytes; `None` while deferred (or for a final upload being built).
    pub length: Option<u64>,
    /// Durable bytes `[0, offset)`.
    pub offset: u64,
    /// `Upload-Metadata` exactly as received (may be empty).
    pub metadata: String,
    /// Tagged sha256 midstate of bytes `[0, offset)` (see `upload::hash`).
    pub hash_state: Vec<u8>,
    /// sha256 of the whole upload, set when it completes.
    pub sha256: Option<[u8; 32]>,
    /// sha256 the client declared at creation; checked at completion.
    pub expected_sha256: Option<[u8; 32]>,
    pub concat: Concat,
    /// Unix ms.
    pub created_at_ms: i64,
    /// Unix ms of the last change.
    pub updated_at_ms: i64,
    /// Unix ms after which an unfinished upload expires; `None` = never.
    pub expires_at_ms: Option<i64>,
    /// Unix ms at which it completed.
    pub finished_at_ms: Option<i64>,
    /// True once the sweeper removed the bytes of an expired upload (a tombstone: 410).
    pub expired: bool,
}

impl UploadRecord {
    /// Complete: the length is known and every byte is stored.
    pub fn is_finished(&self) -> bool {
        self.finished_at_ms.is_some()
    }
}

/// The state a writer commits after making bytes durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub offset: u64,
    pub hash_state: Vec<u8>,
    /// Sets the length (deferred length declared, or a final upload's derived length).
    pub length: Option<u64>,
    /// Marks the upload complete with this sha256.
    pub finished_sha256: Option<[u8; 32]>,
    pub expires_at_ms: Option<i64>,
    pub now_ms: i64,
}

/// The key a creation request is made under (DESIGN §2; issue 9 item 5): a client's
/// `Idempotency-Key`, or the key ferry derives for a final upload from its parts and metadata.
/// Scoped to the record's principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreationKey {
    /// The key (at most a few hundred bytes).
    pub key: String,
    /// Opaque digest of the request the key was first used for; a later request under the same
    /// key with another fingerprint is a different request.
    pub fingerprint: String,
}

/// What [`Catalog::create_upload_keyed`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyedCreate {
    /// The record was inserted and now holds the key.
    Created,
    /// A live upload of the same principal already holds the key: that upload (as
    /// [`Catalog::get_upload`] reads it) and the fingerprint it was created with. Nothing was
    /// inserted.
    Existing { upload: UploadRecord, fingerprint: String },
}

/// Catalog failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// The id is unknown.
    #[error("not found")]
    NotFound,
    /// An upload with this id already exists.
    #[error("already exists")]
    AlreadyExists,
    /// The fencing token is stale: another writer has taken the upload since.
    #[error("fenced out: another writer holds this upload")]
    Fenced,
    /// The backing database failed.
    #[error("catalog backend: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

pub type CatalogResult<T> = Result<T, CatalogError>;

/// Upload metadata storage. Implementations must be safe to share between tasks and, for the
/// distributed backends, between processes.
#[async_trait]
pub trait Catalog: TaskCatalog + Send + Sync + 'static {
    /// Insert a new upload. Atomic; fails with `AlreadyExists` if the id is taken.
    async fn create_upload(&self, rec: &UploadRecord) -> CatalogResult<()>;

    /// Insert a new upload under `key`, atomically: unless a live (not expired) upload of
    /// `rec.principal` already holds `key.key`, insert `rec` holding it and return `Created`;
    /// otherwise insert nothing and return that upload with its fingerprint (`Existing`).
    /// Concurrent calls with the same principal and key create exactly one upload; the others
    /// see it. The key is held as long as the row lives and is not marked expired: deleting
    /// the upload or [`Catalog::mark_expired`] frees it. Keys of different principals never
    /// collide. Fails with `AlreadyExists` only if `rec.id` is taken.
    async fn create_upload_keyed(&self, rec: &UploadRecord, key: &CreationKey) -> CatalogResult<KeyedCreate>;

    /// The upload's current row, tombstones included; `Ok(None)` if unknown.
    /// Reads what the last committed checkpoint wrote (read-your-writes).
    async fn get_upload(&self, id: &str) -> CatalogResult<Option<UploadRecord>>;

    /// Take the write fence of an upload: atomically increments its fencing token and
    /// returns the new value. Any checkpoint made with an older token fails with `Fenced`.
    /// `NotFound` if the id is unknown.
    async fn acquire_fence(&self, id: &str) -> CatalogResult<u64>;

    /// Commit a checkpoint in one transaction (offset, hash state, and optionally length,
    /// completion and expiry), only if `fence` is still current. The caller must have made
    /// bytes `[0, cp.offset)` durable first. Errors: `NotFound`, `Fenced`.
    async fn checkpoint(&self, id: &str, fence: u64, cp: &Checkpoint) -> CatalogResult<()>;

    /// Mark an upload expired at `now_ms` (a tombstone: its bytes are gone, the id answers
    /// 410 until [`Catalog::list_tombstones`] lists it). Fences out every writer. Idempotent.
    /// `NotFound` if the id is unknown.
    async fn mark_expired(&self, id: &str, now_ms: i64) -> CatalogResult<()>;

    /// Delete the row. Returns whether a row was deleted. Idempotent.
    async fn delete_upload(&self, id: &str) -> CatalogResult<bool>;

    /// Ids of unfinished, not yet tombstoned uploads whose `expires_at_ms` ≤ `now_ms`,
    /// at most `limit`.
    async fn list_expired(&self, now_ms: i64, limit: u32) -> CatalogResult<Vec<String>>;

    /// Ids of tombstones marked expired before `before_ms`, at most `limit`.
    async fn list_tombstones(&self, before_ms: i64, limit: u32) -> CatalogResult<Vec<String>>;

    /// Every unfinished upload that still has bytes (not tombstoned), for start-up recovery.
    async fn list_unfinished(&self) -> CatalogResult<Vec<UploadRecord>>;

    /// Final uploads that list `part_id` among their parts and are not finished.
    async fn finals_waiting_on(&self, part_id: &str) -> CatalogResult<Vec<String>>;

    /// A principal's uploads, newest first, at most `limit`.
    async fn list_uploads(&self, principal: &str, limit: u32) -> CatalogResult<Vec<UploadRecord>>;

    /// Whether the backend answers (for `/readyz`).
    async fn ping(&self) -> CatalogResult<()>;
}

/// Where the catalog lives (`--catalog`): `sqlite:PATH` or a `postgres://` (`postgresql://`) URL.
#[derive(Clone, PartialEq, Eq)]
pub enum CatalogUrl {
    /// A SQLite file (created if missing).
    Sqlite(std::path::PathBuf),
    /// A PostgreSQL connection URL, as given (it may carry a password: print
    /// [`CatalogUrl::redacted`], never the URL itself).
    Postgres(String),
}

impl CatalogUrl {
    /// Parse `sqlite:PATH` (also `sqlite://PATH`) or `postgres://…` / `postgresql://…`.
    /// Errors say what is accepted, without echoing a password.
    pub fn parse(s: &str) -> Result<CatalogUrl, String> {
        let s = s.trim();
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            url::Url::parse(s).map_err(|e| format!("invalid catalog URL {}: {e}", postgres::redact_url(s)))?;
            return Ok(CatalogUrl::Postgres(s.to_string()));
        }
        if let Some(path) = s.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err("sqlite: needs a file path, e.g. sqlite:/var/lib/ferry/ferry.db".into());
            }
            return Ok(CatalogUrl::Sqlite(path.into()));
        }
        Err(format!("unsupported catalog {:?}: use sqlite:PATH or postgres://USER:PASSWORD@HOST:PORT/DATABASE", if s.contains('@') { "<redacted>" } else { s }))
    }

    /// For messages and logs: the path, or the URL with its password replaced by `***`.
    pub fn redacted(&self) -> String {
        match self {
            CatalogUrl::Sqlite(p) => format!("sqlite:{}", p.display()),
            CatalogUrl::Postgres(u) => postgres::redact_url(u),
        }
    }

    /// Open the catalog (creating the SQLite file, or migrating the PostgreSQL database).
    /// The error is one line naming [`CatalogUrl::redacted`] and the cause.
    pub async fn open(&self) -> anyhow::Result<std::sync::Arc<dyn Catalog>> {
        Ok(match self {
            CatalogUrl::Sqlite(p) => std::sync::Arc::new(SqliteCatalog::open(p).await.map_err(|e| anyhow::anyhow!("cannot open the catalog {}: {e:#}", self.redacted()))?),
            CatalogUrl::Postgres(u) => std::sync::Arc::new(PostgresCatalog::connect(u).await?),
        })
    }
}

impl std::fmt::Debug for CatalogUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

#[cfg(test)]
mod url_tests {
    use super::CatalogUrl;

    #[test]
    fn catalog_urls_parse() {
        assert_eq!(CatalogUrl::parse("sqlite:/tmp/x.db"), Ok(CatalogUrl::Sqlite("/tmp/x.db".into())));
        assert_eq!(CatalogUrl::parse("sqlite:///tmp/x.db"), Ok(CatalogUrl::Sqlite("/tmp/x.db".into())));
        assert_eq!(CatalogUrl::parse("sqlite:rel.db"), Ok(CatalogUrl::Sqlite("rel.db".into())));
        assert!(matches!(CatalogUrl::parse("postgres://u:p@h/db"), Ok(CatalogUrl::Postgres(_))));
        assert!(matches!(CatalogUrl::parse("postgresql://h/db"), Ok(CatalogUrl::Postgres(_))));
        assert!(CatalogUrl::parse("sqlite:").is_err());
        let e = CatalogUrl::parse("mysql://u:hunter2@h/db").unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
        assert_eq!(format!("{:?}", CatalogUrl::parse("postgres://u:hunter2@h/db").unwrap()), "postgres://u:***@h/db");
    }
}
