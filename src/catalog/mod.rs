//! Upload and task metadata: the [`Catalog`] trait, its SQLite implementation (the embedded
//! default) and its PostgreSQL one (several replicas on one database).
//!
//! The catalog's `offset` for an upload is the truth (DESIGN §2): bytes `[0, offset)` are
//! durable in the blob store and `hash_state` is the sha256 midstate of exactly those bytes.
//! Every write that moves an offset is a [`Catalog::checkpoint`], guarded by the fencing token
//! the writer obtained from [`Catalog::acquire_fence`] or [`Catalog::acquire_upload_lease`].
//!
//! **Clocks.** Methods that take a `now_ms` argument use the caller's value for the row's
//! timestamps (`updated_at_ms`, `expires_at_ms`, tombstone times). Every *lease* expiry
//! (upload leases, task leases) is set and compared on the **database's** clock, never the
//! caller's, so processes whose clocks disagree still agree on who holds a lease.
//!
//! **Fences** only ever grow, for the life of a row: nothing (reopen, expiry, reclaim) resets
//! one, so a token handed out once can never become current again.

use async_trait::async_trait;

pub mod conformance;
pub mod conformance_events;
pub mod conformance_links;
pub mod conformance_quota;
pub mod conformance_race;
pub mod conformance_tasks;
mod damage_marks;
mod dialect;
mod event_statements;
pub mod events;
pub mod hold;
pub mod links;
pub mod partials;
pub mod postgres;
mod postgres_events;
mod postgres_tasks;
mod sql;
pub mod sqlite;
mod sqlite_events;
mod sqlite_tasks;
mod statements;
mod task_statements;
pub mod tasks;

pub use events::{AttemptOutcome, Delivery, DeliveryState, EventCatalog, EventFilter, EventRecord, Settlement};
pub use links::{LinkCatalog, LinkKind, LinkRecord, PassphraseHash};
pub use partials::{Appended, Fragment, PartialPage};
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
    /// value as received (kept; HEAD answers the parts by id, as `/files/ID`).
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
    /// The blob store's own state for bytes `[0, offset)`, as its writer returned it
    /// (`blob::BlobState` bytes: versioned, opaque to the catalog). Empty for a new upload.
    /// Read from the catalog, a state framed with entries (S3: its part list) is the row
    /// alone ([`crate::framed::split`]): what a writer or a finisher needs whole comes
    /// from [`Catalog::upload_blob_state`] (DESIGN §2 "the part list out of the hot row").
    pub blob_state: Vec<u8>,
    /// Not announced yet: the creation that made it (one that carries bytes: a body, an empty
    /// upload completed at once, a task's file) has not been answered. Such a row emits no
    /// event until [`Catalog::announce_upload`]; a refused creation removes it without a trace
    /// ([`Catalog::withdraw_upload`]).
    pub provisional: bool,
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
    /// The blob store's state for exactly bytes `[0, offset)` (opaque; see
    /// [`UploadRecord::blob_state`]). Committed in the same transaction as offset and midstate.
    /// The row keeps the state's row ([`crate::framed::split`]); the entries of a framed state are kept
    /// beside it as [`Checkpoint::blob_entries_from`] says.
    pub blob_state: Vec<u8>,
    /// Which of the entries the catalog keeps for this upload change: `None`, none (they are
    /// the framed `blob_state`'s entries already); `Some(k)`, those from `k` on are replaced
    /// by `blob_state`'s (`Some(0)`: all of them, and none for a state that is not framed).
    /// [`crate::framed::entries_from`] computes it from the committed state.
    pub blob_entries_from: Option<u32>,
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
// Returned once per creation request, never stored in bulk: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum KeyedCreate {
    /// The record was inserted and now holds the key.
    Created,
    /// A live upload of the same principal already holds the key: that upload (as
    /// [`Catalog::get_upload`] reads it) and the fingerprint it was created with. Nothing was
    /// inserted.
    Existing { upload: Box<UploadRecord>, fingerprint: String },
}

/// Per-principal limits the catalog enforces, in the same transaction, when it inserts an
/// upload ([`Catalog::create_upload_within`]); `None` = no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Most bytes stored: the sum over the principal's live uploads of their length, or of
    /// their offset while the length is unknown.
    pub max_bytes: Option<u64>,
    /// Most unfinished uploads (not expired) at once.
    pub max_uploads_in_progress: Option<u64>,
}

/// Room in the bytes quota held by one writer of a deferred-length upload
/// ([`Catalog::reserve_upload_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The upload may hold bytes `[0, granted_to)` without passing the quota.
    pub granted_to: u64,
    /// Names this reservation for [`Catalog::release_upload_bytes`].
    pub nonce: String,
}

impl Reservation {
    /// The reservation `reserve_upload_bytes` grants, the same on every catalog: the upload
    /// (at `offset`, of `length` or deferred with an earlier `reserved_to`) asks for room up to
    /// byte `to` while its principal `used` bytes in all (the upload's own share included) of
    /// `max_bytes`. Never below `offset` (what is stored stays), never past the quota otherwise.
    fn grant(offset: u64, length: Option<u64>, reserved_to: Option<u64>, used: u64, to: u64, max_bytes: u64) -> Reservation {
        let own = length.unwrap_or_else(|| offset.max(reserved_to.unwrap_or(0)));
        let others = used.saturating_sub(own);
        let granted_to = to.min(max_bytes.saturating_sub(others)).max(offset);
        // The nonce names this reservation only.
        Reservation { granted_to, nonce: format!("{:032x}", rand::random::<u128>()) }
    }
}

/// What a principal uses now, as [`Catalog::usage`] counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes stored or reserved: for every live upload (not a tombstone, not past its expiry
    /// while unfinished) its length when known, else the larger of its durable offset and the
    /// room a writer reserved ([`Catalog::reserve_upload_bytes`]).
    pub bytes: u64,
    /// Unfinished live uploads (partial and final uploads of a concatenation included).
    pub uploads_in_progress: u64,
}

impl Usage {
    /// The first limit of `quota` that `self` (a use that includes a new upload reserving
    /// `added_bytes` and counting as one more upload in progress when `added_upload`) breaks.
    pub fn exceeds(&self, quota: &Quota, added_bytes: u64, added_upload: bool) -> Option<crate::error::QuotaDetail> {
        if let Some(limit) = quota.max_uploads_in_progress {
            if added_upload && self.uploads_in_progress > limit {
                return Some(crate::error::QuotaDetail { name: "uploads_in_progress", limit, used: self.uploads_in_progress - 1, requested: 1 });
            }
        }
        if let Some(limit) = quota.max_bytes {
            if self.bytes > limit {
                return Some(crate::error::QuotaDetail {
                    name: "bytes",
                    limit,
                    used: self.bytes.saturating_sub(added_bytes),
                    requested: added_bytes,
                });
            }
        }
        None
    }
}

/// Whose finished uploads [`Catalog::list_finished_before`] lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrincipalScope {
    /// One principal's.
    Only(String),
    /// Every principal's but these (the default retention, minus principals with their own).
    AllExcept(Vec<String>),
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
    /// The database's disk or quota is full (SQLite `SQLITE_FULL`, `ENOSPC`/`EDQUOT`, PostgreSQL
    /// `53100 disk_full`). The write was rolled back; it can succeed once space returns.
    #[error("catalog storage full: {0}")]
    Full(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The database failed in a way that passes (busy, locked, out of connections or file
    /// descriptors, an I/O error). The write was rolled back; retry later.
    #[error("catalog unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A per-principal quota has no room for the upload ([`Catalog::create_upload_within`]);
    /// nothing was inserted.
    #[error("quota {} exceeded: {} of {} used", .0.name, .0.used, .0.limit)]
    QuotaExceeded(crate::error::QuotaDetail),
    /// The backing database failed.
    #[error("catalog backend: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

pub type CatalogResult<T> = Result<T, CatalogError>;

/// Run idempotent catalog operation `op` again while it fails with [`CatalogError::Unavailable`]:
/// six more attempts, 50 ms apart and doubling up to 0.8 s (≈ 2.4 s in all). For writes nobody
/// waits on and nothing else repeats — a lease or quota room given back when a request ends. A
/// pooled PostgreSQL connection the server dropped within the last second fails its next
/// statement once ([`PostgresCatalog::connect`]); past that second every pooled connection is
/// pinged before use, so such a write gets through rather than holding the upload until its
/// lease runs out. The last error is returned.
pub async fn retry_transient<T, F, Fut>(op: F) -> CatalogResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = CatalogResult<T>>,
{
    use backon::Retryable as _;
    let waits = crate::retry::doubling(std::time::Duration::from_millis(50), std::time::Duration::from_millis(800)).with_max_times(6);
    op.retry(waits).when(|e| matches!(e, CatalogError::Unavailable(_))).await
}

/// A granted upload lease (see [`Catalog::acquire_upload_lease`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The new fencing token: every checkpoint of this holder carries it.
    pub fence: u64,
    /// When the lease runs out, Unix ms on the **database** clock.
    pub expires_at_ms: i64,
    /// How many times this upload's lease was taken from a holder that did not release it,
    /// this grant included: holders of different counts may still be writing at once (the
    /// one taken from did not know), so stores that must keep their writes apart use it (S3:
    /// the parity picks the part numbers, DESIGN §2).
    pub takeovers: u64,
    /// The upload's row as the grant left it, read by the granting statement itself: the
    /// holder's first read of the upload costs no statement of its own. `None` when the row did
    /// not decode (the holder reads it again).
    pub row: Option<Box<UploadRecord>>,
}

/// The whole blob state from the rows of a catalog's [`Catalog::upload_blob_state`] query:
/// the upload's `blob_state` first, then its entries in order; `None` when there is no row.
pub(crate) fn join_blob_state(mut rows: Vec<Vec<u8>>) -> CatalogResult<Option<Vec<u8>>> {
    if rows.is_empty() {
        return Ok(None);
    }
    let row = rows.remove(0);
    if rows.is_empty() {
        return Ok(Some(row));
    }
    Ok(Some(crate::framed::join(&row, &rows)))
}

/// What [`Catalog::acquire_upload_lease`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseOutcome {
    Granted(LeaseGrant),
    /// Another live holder has it (its owner id, and its expiry on the database clock).
    Held {
        owner: String,
        expires_at_ms: i64,
    },
}

/// One [`Catalog::request_release`] call, as delivered to listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRequest {
    /// The upload whose lease holder should let go.
    pub upload_id: String,
    /// The lease owner id of the process that asked (a listener ignores its own requests).
    pub from: String,
}

/// Release requests made through [`Catalog::request_release`], in any process.
pub type ReleaseRequests = futures::stream::BoxStream<'static, ReleaseRequest>;

/// Upload metadata storage. Implementations must be safe to share between tasks and, for the
/// distributed backends, between processes.
#[async_trait]
pub trait Catalog: TaskCatalog + EventCatalog + LinkCatalog + Send + Sync + 'static {
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

    /// [`Catalog::create_upload_keyed`] (or [`Catalog::create_upload`] when `key` is `None`)
    /// under `quota`, atomically across processes: the new row is inserted and the principal's
    /// [`Catalog::usage`] (at `rec.created_at_ms`, the new row included) checked in one
    /// transaction that concurrent creations of the same principal cannot interleave with
    /// (SQLite: one writer at a time; PostgreSQL: a per-principal advisory lock held to
    /// commit). Over a limit → `QuotaExceeded` with the limit and the use without the new row,
    /// and nothing is inserted. A retried request whose key already holds a live upload gets
    /// `Existing`, whatever the quota says (it creates nothing).
    async fn create_upload_within(&self, rec: &UploadRecord, key: Option<&CreationKey>, quota: &Quota) -> CatalogResult<KeyedCreate>;

    /// What `principal` uses at `now_ms` (see [`Usage`]): one aggregate over its rows.
    async fn usage(&self, principal: &str, now_ms: i64) -> CatalogResult<Usage>;

    /// The live upload of `principal` holding creation key `key` (see
    /// [`Catalog::create_upload_keyed`]) and the fingerprint it was created with; `None` if no
    /// live upload holds it. A read: a retried creation is answered from it without side effects.
    async fn upload_by_creation_key(&self, principal: &str, key: &str) -> CatalogResult<Option<(UploadRecord, String)>>;

    /// Announce a [`UploadRecord::provisional`] upload: from now on it is an ordinary upload,
    /// and `upload.created` (followed by `upload.finished` when it is finished already) is
    /// written in this transaction. A no-op for an announced or unknown upload.
    async fn announce_upload(&self, id: &str) -> CatalogResult<()>;

    /// Delete upload `id` only if it is still provisional (never announced): no event is
    /// written. Returns whether it was deleted (`false`: unknown, or announced meanwhile — a
    /// retried creation handed it out — and then kept).
    async fn withdraw_upload(&self, id: &str) -> CatalogResult<bool>;

    /// Reserve room in the bytes quota for a writer of unfinished, deferred-length upload `id`:
    /// in one transaction that concurrent creations and reservations of the same principal
    /// cannot interleave with (the lock [`Catalog::create_upload_within`] takes), the row is
    /// granted `min(to, what max_bytes leaves beside the principal's other uploads)` (never
    /// less than its offset) and counts that much until released, the length is set, or the
    /// next reservation replaces it. `NotFound` if unknown or a tombstone.
    async fn reserve_upload_bytes(&self, id: &str, to: u64, max_bytes: u64, now_ms: i64) -> CatalogResult<Reservation>;

    /// Give back reservation `nonce` of upload `id` (the row then counts its offset). A no-op
    /// when another reservation replaced it. Idempotent.
    async fn release_upload_bytes(&self, id: &str, nonce: &str) -> CatalogResult<()>;

    /// Ids of finished, live uploads of `scope` that finished at or before `finished_before_ms`,
    /// oldest first, at most `limit` (retention of finished files).
    async fn list_finished_before(&self, scope: &PrincipalScope, finished_before_ms: i64, limit: u32) -> CatalogResult<Vec<String>>;

    /// Retention's compare-and-set: tombstone finished upload `id` at `now_ms` only if it is
    /// still live and finished at or before `finished_before_ms` (its bytes are then removed by
    /// the caller; the id answers 410, then 404 once the tombstone is forgotten). Emits
    /// `upload.expired` like any tombstone. Returns whether this call tombstoned it; of many
    /// sweepers racing, one wins. Unknown id → `Ok(false)`.
    async fn expire_finished_if_due(&self, id: &str, finished_before_ms: i64, now_ms: i64) -> CatalogResult<bool>;

    /// The upload's current row, tombstones included; `Ok(None)` if unknown.
    /// Reads what the last committed checkpoint wrote (read-your-writes).
    async fn get_upload(&self, id: &str) -> CatalogResult<Option<UploadRecord>>;

    /// The whole blob state of upload `id`: its row's ([`UploadRecord::blob_state`]) joined
    /// with the entries kept beside it (the same bytes when it has none). `Ok(None)` if unknown.
    async fn upload_blob_state(&self, id: &str) -> CatalogResult<Option<Vec<u8>>>;

    /// Take the write fence of an upload: atomically increments its fencing token and
    /// returns the new value. Any checkpoint made with an older token fails with `Fenced`.
    /// `NotFound` if the id is unknown.
    async fn acquire_fence(&self, id: &str) -> CatalogResult<u64>;

    /// Commit a checkpoint in one transaction (offset, hash state, and optionally length,
    /// completion and expiry), only if `fence` is still current. The caller must have made
    /// bytes `[0, cp.offset)` durable first. Errors: `NotFound`, `Fenced`.
    async fn checkpoint(&self, id: &str, fence: u64, cp: &Checkpoint) -> CatalogResult<()>;

    /// Mark an **unfinished** upload expired at `now_ms` (a tombstone: its bytes are gone, the
    /// id answers 410 until [`Catalog::list_tombstones`] lists it), whatever its expiry time
    /// (a final whose part is gone). Compare-and-set: a finished upload is never tombstoned
    /// (returns `false`). Fences out every writer (the fence grows). Idempotent: an existing
    /// tombstone answers `true` and keeps its time. `NotFound` if the id is unknown.
    async fn mark_expired(&self, id: &str, now_ms: i64) -> CatalogResult<bool>;

    /// The expiry sweep's compare-and-set: tombstone upload `id` at `now_ms` only if, in one
    /// atomic step, it is still unfinished, not a tombstone, `expires_at_ms <= now_ms`, and no
    /// live lease holds it (no owner, or its lease expired on the database clock). Returns
    /// whether this call tombstoned it: of many sweepers racing (any replica), exactly one
    /// wins; an upload that finished, was extended, or is being written is left alone.
    /// Fences out every writer. Unknown id → `Ok(false)`.
    async fn expire_if_due(&self, id: &str, now_ms: i64) -> CatalogResult<bool>;

    /// Delete the row. Returns whether a row was deleted. Idempotent.
    async fn delete_upload(&self, id: &str) -> CatalogResult<bool>;

    /// Ids whose upload row was deleted while their bytes may still be in the blob store,
    /// oldest first, at most `limit`. Every deletion of an upload row ([`Catalog::delete_upload`],
    /// [`Catalog::withdraw_upload`], [`Catalog::delete_tombstone`]) queues its id in the same
    /// transaction: the row goes first, the bytes after it, and a crash in between leaves the id
    /// here for the next start or sweep to finish (issue 48: a finished upload never outlives its
    /// bytes, and no bytes outlive every record of them).
    async fn list_blob_removals(&self, limit: u32) -> CatalogResult<Vec<String>>;

    /// Forget the queued removal of `id` ([`Catalog::list_blob_removals`]) once its bytes are
    /// gone. Idempotent.
    async fn forget_blob_removal(&self, id: &str) -> CatalogResult<()>;

    /// What names blob `id` at one instant (one snapshot): its upload row, a queued removal,
    /// or nothing (`ferry check`'s test for an orphan).
    async fn blob_claim(&self, id: &str) -> CatalogResult<BlobClaim>;

    /// Delete tombstone `id` if it still is one and was marked before `before_ms`
    /// (compare-and-set; a live upload is never deleted by this). Returns whether it was.
    async fn delete_tombstone(&self, id: &str, before_ms: i64) -> CatalogResult<bool>;

    /// Make a finished upload unfinished again at `cp` (a task resumed after a crash between
    /// finishing its file and checkpointing its result): sets offset, hash state and blob state
    /// from `cp`, clears length, sha256 and completion, sets `expires_at_ms`. Only while
    /// `fence` is current (`Fenced` otherwise); the row and its fence are kept, so the fence
    /// stays monotonic. `NotFound` if unknown.
    async fn reopen_upload(&self, id: &str, fence: u64, cp: &Checkpoint) -> CatalogResult<()>;

    /// Take the lease of upload `id` for `owner`, `ttl_ms` long on the **database clock**.
    /// Atomic: granted only when nobody holds it or the holder's lease has expired
    /// (`lease_expires_ms <= database now`); the fence grows by one and is returned. A lease
    /// held (unexpired) by anyone — `owner` included — answers `Held`.
    /// `NotFound` if the id is unknown; a tombstone answers `NotFound` too.
    async fn acquire_upload_lease(&self, id: &str, owner: &str, ttl_ms: i64) -> CatalogResult<LeaseOutcome>;

    /// Extend a held lease to database-now + `ttl_ms`, only while `fence` is current and the
    /// lease is still held. Returns the new lease expiry (database clock). `Fenced` if the
    /// lease was lost (another holder, released, or a tombstone); `NotFound` if unknown.
    async fn renew_upload_lease(&self, id: &str, fence: u64, ttl_ms: i64) -> CatalogResult<i64>;

    /// An upload receiving bytes is alive: push an unfinished upload's `expires_at_ms` to at
    /// least `expires_at_ms` (never earlier), only while `fence` is current (`Fenced`
    /// otherwise, e.g. after a tombstone). A finished upload or one without expiry is left
    /// alone (`Ok`). `NotFound` if unknown.
    async fn touch_upload(&self, id: &str, fence: u64, expires_at_ms: i64) -> CatalogResult<()>;

    /// Give a held lease back (owner cleared) so the next taker need not repair. A no-op
    /// when `fence` is no longer current. Idempotent.
    async fn release_upload_lease(&self, id: &str, fence: u64) -> CatalogResult<()>;

    /// A restarted single server (it holds `DATA/lock`, so its previous incarnation is dead)
    /// reclaims what `owner` held: every upload lease of `owner` expires now (the next taker
    /// repairs: its grant counts one more of [`LeaseGrant::takeovers`]), and every task lease of `owner` is freed so a worker claims
    /// the task at once, and every webhook delivery lease of `owner` is freed (the delivery is
    /// sent again under its one id). Fences are not reset. Returns (uploads, tasks) reclaimed.
    async fn reclaim_owner(&self, owner: &str) -> CatalogResult<(u64, u64)>;

    /// Close the connections at the end of a clean shutdown, waiting for ones in use to come
    /// back. SQLite then checkpoints its write-ahead log into the database file and removes
    /// `ferry.db-wal` / `-shm`. Calls after it fail. Default: nothing to do.
    async fn close(&self) {}

    /// Ask whoever holds upload `id`'s lease, in any process, to checkpoint and let go
    /// (release-on-request across replicas). Delivered to every [`Catalog::release_requests`]
    /// stream open now, at least once, within about a second (SQLite polls; PostgreSQL uses
    /// `NOTIFY`). Never fails because nobody holds the lease.
    /// `from` is the asking process's lease owner id, delivered with the request.
    async fn request_release(&self, id: &str, from: &str) -> CatalogResult<()>;

    /// A stream of the [`Catalog::request_release`] calls made (by any process) after this
    /// call returned. Ends only when dropped; may repeat a request.
    async fn release_requests(&self) -> CatalogResult<ReleaseRequests>;

    /// The shared secret `name` (e.g. the URL-signing key): if none is stored yet, store
    /// `candidate` — atomically, so of many replicas starting at once all end up with the
    /// same value — and return the stored value.
    async fn shared_secret(&self, name: &str, candidate: &[u8]) -> CatalogResult<Vec<u8>>;

    /// Ids of unfinished, not yet tombstoned uploads whose `expires_at_ms` ≤ `now_ms`,
    /// at most `limit`.
    async fn list_expired(&self, now_ms: i64, limit: u32) -> CatalogResult<Vec<String>>;

    /// Ids of tombstones marked expired before `before_ms`, at most `limit`.
    async fn list_tombstones(&self, before_ms: i64, limit: u32) -> CatalogResult<Vec<String>>;

    /// Ids of unfinished uploads (not tombstones) that the server itself may have to finish,
    /// oldest change first, at most `limit`: those whose bytes are all stored (length known,
    /// `offset = length`) — they wait only for the finishing step (a pre-finish hook that could
    /// not answer, a crash or a store failure between the last byte and the completion) — and
    /// every unfinished final upload of a concatenation (built by the server once its parts are).
    async fn list_awaiting_finish(&self, limit: u32) -> CatalogResult<Vec<String>>;

    /// Final uploads that list `part_id` among their parts and are not finished.
    async fn finals_waiting_on(&self, part_id: &str) -> CatalogResult<Vec<String>>;

    /// A principal's uploads, newest first, at most `limit`.
    async fn list_uploads(&self, principal: &str, limit: u32) -> CatalogResult<Vec<UploadRecord>>;

    /// Whether the backend answers (for `/readyz`).
    async fn ping(&self) -> CatalogResult<()>;

    /// Store (or replace) the MCP session `id`: `state` is opaque text (the client's
    /// `initialize` parameters as JSON), `now_ms` its last use. Sessions exist only for MCP
    /// clients of protocols before 2026-07-28; keeping them here lets any replica serve them.
    async fn put_mcp_session(&self, id: &str, state: &str, now_ms: i64) -> CatalogResult<()>;

    /// The state of MCP session `id`, marking it used at `now_ms`; `None` if unknown.
    async fn get_mcp_session(&self, id: &str, now_ms: i64) -> CatalogResult<Option<String>>;

    /// Forget MCP session `id` (the client ended it). Idempotent.
    async fn delete_mcp_session(&self, id: &str) -> CatalogResult<()>;

    /// Forget MCP sessions last used before `before_ms`; returns how many.
    async fn forget_mcp_sessions(&self, before_ms: i64) -> CatalogResult<u64>;

    /// Every upload row (tombstones and provisional rows included) whose id sorts after
    /// `after` (`""`: from the first), in id order, at most `limit`: `ferry check` pages
    /// through the whole catalog with it.
    async fn list_uploads_after(&self, after: &str, limit: u32) -> CatalogResult<Vec<UploadRecord>>;

    /// Record (`Some`) or clear (`None`) what `ferry check --repair-catalog` found wrong with
    /// the stored bytes of finished upload `id` ([`Damage`]). Recording is a no-op unless the
    /// upload exists, is finished and is not a tombstone; returns whether a mark was written
    /// or removed. The mark goes with the upload (delete, expiry's removal of the row).
    async fn set_damage(&self, id: &str, damage: Option<&Damage>) -> CatalogResult<bool>;

    /// The damage mark of upload `id`, if `ferry check --repair-catalog` left one.
    async fn damage(&self, id: &str) -> CatalogResult<Option<Damage>>;

    /// Record why unfinished final upload `id` can never be built ([`FinalFailure`]). A no-op
    /// (returns `false`) unless the upload exists, is a final upload and is not finished; the
    /// first failure recorded stays. The record goes with the upload's row (delete, or the
    /// sweep forgetting its tombstone). The caller tombstones the final
    /// ([`Catalog::mark_expired`]) afterwards, which frees its parts.
    async fn set_final_failure(&self, id: &str, failure: &FinalFailure) -> CatalogResult<bool>;

    /// Why final upload `id` could not be built, if [`Catalog::set_final_failure`] recorded it.
    async fn final_failure(&self, id: &str) -> CatalogResult<Option<FinalFailure>>;

    /// Keep `crc32`, the CRC-32 of finished upload `id`'s bytes (a zip's members need it). A
    /// no-op (returns `false`) unless the upload exists, is finished and is not a tombstone;
    /// the first value kept stays. It goes with the upload's row, and a damage mark set or
    /// cleared ([`Catalog::set_damage`]) forgets it.
    async fn keep_crc32(&self, id: &str, crc32: u32) -> CatalogResult<bool>;

    /// The CRC-32 [`Catalog::keep_crc32`] kept for upload `id`, if any.
    async fn crc32(&self, id: &str) -> CatalogResult<Option<u32>>;
}

/// What names a blob id in the catalog ([`Catalog::blob_claim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobClaim {
    /// An upload row (a tombstone included).
    Row,
    /// No row, but its removal is queued: the bytes are on their way out.
    Removal,
    /// Nothing: bytes under this id belong to no upload.
    Unclaimed,
}

/// Why a final upload of a concatenation can never be built, as the catalog keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalFailure {
    /// The error code of the failure (`size_exceeded`, `quota_exceeded`).
    pub code: String,
    /// For the client: what was too large, and by how much.
    pub detail: String,
    /// Unix ms the build failed.
    pub failed_at_ms: i64,
}

/// What `ferry check` found wrong with a finished upload's stored bytes, as the catalog keeps
/// it once `--repair-catalog` marks the upload (downloads then answer `500 damaged`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// `sha256_mismatch` (the bytes are all there but hash to something else) or `missing`
    /// (the blob, or bytes at its end, are gone).
    pub kind: String,
    /// For the operator: e.g. `sha256 of the stored bytes is 3f…, the upload's is 9a…`.
    pub detail: String,
    /// Unix ms the check found it.
    pub found_at_ms: i64,
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
        Err(format!(
            "unsupported catalog {:?}: use sqlite:PATH or postgres://USER:PASSWORD@HOST:PORT/DATABASE",
            if s.contains('@') { "<redacted>" } else { s }
        ))
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
        self.open_as(false).await
    }

    /// [`CatalogUrl::open`] for a process that is the database's only writer (`ferry serve`
    /// with in-process leases: one server per catalog): a SQLite catalog then serves task reads
    /// and finished uploads from memory while the row is unchanged ([`SqliteCatalog::with_read_cache`]).
    pub async fn open_as(&self, sole_writer: bool) -> anyhow::Result<std::sync::Arc<dyn Catalog>> {
        Ok(match self {
            CatalogUrl::Sqlite(p) => {
                let c = SqliteCatalog::open(p).await.map_err(|e| anyhow::anyhow!("cannot open the catalog {}: {e:#}", self.redacted()))?;
                std::sync::Arc::new(if sole_writer { c.with_read_cache() } else { c })
            }
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
        assert_eq!(CatalogUrl::parse("sqlite:/var/lib/ferry/x.db"), Ok(CatalogUrl::Sqlite("/var/lib/ferry/x.db".into())));
        assert_eq!(CatalogUrl::parse("sqlite:///var/lib/ferry/x.db"), Ok(CatalogUrl::Sqlite("/var/lib/ferry/x.db".into())));
        assert_eq!(CatalogUrl::parse("sqlite:rel.db"), Ok(CatalogUrl::Sqlite("rel.db".into())));
        assert!(matches!(CatalogUrl::parse("postgres://u:p@h/db"), Ok(CatalogUrl::Postgres(_))));
        assert!(matches!(CatalogUrl::parse("postgresql://h/db"), Ok(CatalogUrl::Postgres(_))));
        assert!(CatalogUrl::parse("sqlite:").is_err());
        let e = CatalogUrl::parse("mysql://u:hunter2@h/db").unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
        assert_eq!(format!("{:?}", CatalogUrl::parse("postgres://u:hunter2@h/db").unwrap()), "postgres://u:***@h/db");
    }
}

#[cfg(test)]
mod retry_tests {
    use super::{retry_transient, CatalogError, CatalogResult};

    #[tokio::test]
    async fn retry_transient_tries_again_only_while_unavailable() {
        let unavailable = || CatalogError::Unavailable("connection reset".into());
        let mut calls = 0;
        let got = retry_transient(|| {
            calls += 1;
            let n = calls;
            async move {
                if n < 3 {
                    Err(unavailable())
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(got.unwrap(), 3, "succeeds on the third attempt");
        let mut calls = 0;
        let got: CatalogResult<()> = retry_transient(|| {
            calls += 1;
            async { Err(CatalogError::Fenced) }
        })
        .await;
        assert!(matches!(got, Err(CatalogError::Fenced)));
        assert_eq!(calls, 1, "a refusal is not retried");
        let mut calls = 0;
        let got: CatalogResult<()> = retry_transient(|| {
            calls += 1;
            async { Err(unavailable()) }
        })
        .await;
        assert!(matches!(got, Err(CatalogError::Unavailable(_))));
        assert_eq!(calls, 7, "one attempt and six more");
    }
}
