//! The embedded [`Catalog`]: one SQLite file (`DATA/ferry.db`) in WAL mode with
//! `synchronous=FULL`, so a committed checkpoint survives power loss.
//!
//! The upload half of the [`Catalog`] trait, one method per trait item, plus opening the file
//! and the read cache. The statements are written once for both catalogs in `statements.rs`
//! (rendered for SQLite by `dialect.rs`); decoders and the rest both share are in `sql.rs`;
//! tasks and events are in `sqlite_tasks.rs`, `sqlite_events.rs`.
//!
//! One file of ~910 lines because it is the one implementation of the upload half of the
//! [`Catalog`] trait for SQLite, kept beside its PostgreSQL twin (`postgres.rs`) method for
//! method so the two are read side by side; what they share already lives in `statements.rs`
//! and `sql.rs`.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Row};

use super::dialect::sql;
use super::sql::{row_to_record, to_i64};
use super::statements as st;
use super::{
    join_blob_state, Catalog, CatalogError, CatalogResult, Checkpoint, Concat, CreationKey, KeyedCreate, LeaseGrant, LeaseOutcome, PrincipalScope,
    Quota, ReleaseRequest, ReleaseRequests, UploadRecord, Usage,
};
use super::{Damage, FinalFailure};

/// `to_end!(self, this, [id: &str, …], { body })`: run a write's `body` to its end
/// ([`SqliteCatalog::to_end`]), with `this` the catalog inside it, and each listed borrowed
/// argument carried in owned and lent to the body again under its own name and type.
macro_rules! to_end {
    ($self:ident, $this:ident, [$($arg:ident: $ty:ty),* $(,)?], $body:block) => {{
        let $this = $self.clone();
        $(let $arg = $arg.to_owned();)*
        $self
            .to_end(async move {
                $(let $arg: $ty = &$arg;)*
                $body
            })
            .await
    }};
}
pub(super) use to_end;

/// A receiver as a stream (what `tokio_stream::wrappers::ReceiverStream` does).
fn tokio_stream_from(mut rx: tokio::sync::mpsc::Receiver<ReleaseRequest>) -> impl futures::Stream<Item = ReleaseRequest> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// SQLite-backed catalog.
#[derive(Clone)]
pub struct SqliteCatalog {
    pub(super) pool: SqlitePool,
    /// Task rows as last read, for [`super::TaskCatalog::get_task`] (see
    /// [`SqliteCatalog::with_read_cache`]); `None` = every read goes to the database.
    pub(super) task_cache: Option<std::sync::Arc<super::sqlite_tasks::TaskReadCache>>,
    /// Finished upload rows as last read, and unfinished ones as their last checkpoint wrote
    /// them, for [`Catalog::get_upload`] (downloads, HEAD, the next PATCH).
    pub(super) upload_cache: Option<std::sync::Arc<super::sqlite_tasks::RowCache<UploadRecord>>>,
    /// A connection kept out of the pool for checkpoints, the statement every PATCH ends with
    /// (`None` for an in-memory database, whose pool holds its only connection). sqlx pings a
    /// pooled connection's thread each time it goes back to the pool: one round trip more per
    /// PATCH (issue 24). A checkpoint takes the connection out and puts it back once its
    /// statement succeeded; one that failed or was cut short drops it, and the next checkpoint
    /// takes a fresh one from the pool.
    checkpointer: Option<std::sync::Arc<tokio::sync::Mutex<Option<sqlx::SqliteConnection>>>>,
    /// The database file's damage marks file, appended to after every mark this process commits
    /// (`None` for an in-memory database).
    marks: Option<super::damage_marks::MarksFile>,
    /// Finished uploads found unmarked, for [`Catalog::damage`] (see
    /// [`SqliteCatalog::with_read_cache`] and [`super::damage_marks`]).
    clean: Option<std::sync::Arc<super::damage_marks::CleanIds>>,
}

/// `sql` (the checkpoint update, with or without `RETURNING`) bound to checkpoint `cp` of upload
/// `id` under `fence`, `row` being the blob state's row part.
fn checkpoint_query<'q>(
    sql: &'static str,
    id: &'q str,
    fence: u64,
    cp: &'q Checkpoint,
    row: &'q [u8],
) -> CatalogResult<sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>> {
    Ok(sqlx::query(sql)
        .bind(to_i64(cp.offset)?)
        .bind(&cp.hash_state)
        .bind(row)
        .bind(cp.length.map(to_i64).transpose()?)
        .bind(cp.finished_sha256.map(|d| d.to_vec()))
        .bind(cp.now_ms)
        .bind(cp.expires_at_ms)
        .bind(id)
        .bind(to_i64(fence)?))
}

/// The first row a writing statement with `RETURNING` gave, read with `fetch_all`. Outside a
/// transaction such a statement commits when it steps to its end; sqlx's `fetch_optional` and
/// `fetch_one` stop at the first row and reset the statement, which commits there and drops the
/// commit's error (the WAL's fsync failing, a full disk): the caller would take a write that
/// did not last for one that did (a power-cut test caught a checkpoint acknowledged this way).
pub(super) fn first<T>(rows: Vec<T>) -> Option<T> {
    rows.into_iter().next()
}

impl From<sqlx::Error> for CatalogError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::RowNotFound => CatalogError::NotFound,
            sqlx::Error::Database(ref d) if d.is_unique_violation() => CatalogError::AlreadyExists,
            other => match crate::exhaustion::classify_sqlx(&other) {
                Some(crate::exhaustion::Exhausted::Space) => CatalogError::Full(Box::new(other)),
                Some(crate::exhaustion::Exhausted::Transient) => CatalogError::Unavailable(Box::new(other)),
                None => CatalogError::Backend(Box::new(other)),
            },
        }
    }
}

/// How long release requests are kept for pollers, ms.
const RELEASE_REQUEST_TTL_MS: i64 = 60_000;
/// How often a [`Catalog::release_requests`] stream polls, on SQLite.
const RELEASE_POLL: Duration = Duration::from_millis(100);

impl SqliteCatalog {
    /// Run fenced `update` of upload `id`'s row and, when it changed the row and `from` says
    /// so ([`Checkpoint::blob_entries_from`]), replace the entries kept beside it from `from`
    /// on with `entries[from..]`, in the same transaction. Returns the rows `update` changed.
    async fn update_with_entries(
        &self,
        update: sqlx::query::Query<'_, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
        id: &str,
        from: Option<u32>,
        entries: &[&[u8]],
    ) -> CatalogResult<u64> {
        let Some(from) = from else { return Ok(update.execute(&self.pool).await?.rows_affected()) };
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let changed = update.execute(&mut *tx).await?.rows_affected();
        if changed == 1 {
            sqlx::query("DELETE FROM upload_blob_entries WHERE upload_id = ? AND seq >= ?").bind(id).bind(from as i64).execute(&mut *tx).await?;
            for (seq, entry) in entries.iter().enumerate().skip(from as usize) {
                sqlx::query("INSERT INTO upload_blob_entries (upload_id, seq, entry) VALUES (?, ?, ?)")
                    .bind(id)
                    .bind(seq as i64)
                    .bind(*entry)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// Open (creating if missing) the database file and run pending migrations.
    pub async fn open(path: &Path) -> anyhow::Result<Self> {
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10));
        let mut catalog = Self::connect(opts, false).await?;
        catalog.marks = Some(super::damage_marks::MarksFile::beside(path));
        // SQLite fsyncs the directory for the journal files it creates, not for the database
        // file: make `ferry.db`'s own name durable without relying on the `-wal`'s creation
        // having done it on the way (a power cut would lose a new database otherwise).
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let dir = dir.to_path_buf();
            tokio::task::spawn_blocking(move || std::fs::File::open(&dir)?.sync_all()).await??;
        }
        Ok(catalog)
    }

    /// An in-memory database (tests of the conformance suite).
    pub async fn in_memory() -> anyhow::Result<Self> {
        Self::connect(SqliteConnectOptions::from_str("sqlite::memory:")?, true).await
    }

    async fn connect(opts: SqliteConnectOptions, in_memory: bool) -> anyhow::Result<Self> {
        if !in_memory {
            // Switch to WAL and migrate over one connection before the pool opens more: on a fresh
            // file, concurrent `journal_mode=WAL` switches race for the exclusive lock and SQLite
            // answers SQLITE_BUSY without consulting the busy handler.
            // WAL persists in the file, so pool connections leave journal_mode alone.
            let mut conn = opts.clone().journal_mode(SqliteJournalMode::Wal).connect().await?;
            sqlx::migrate!("./migrations/sqlite").run(&mut conn).await?;
            conn.close().await?;
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(if in_memory { 1 } else { 8 })
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            // A local file has no far end to lose: sqlx's ping before every acquire is one more
            // round trip to the connection's thread per statement, for nothing (issue 24: the
            // fixed cost of a PATCH). The ping on release, which sqlx always makes, still finds a
            // connection whose thread died.
            .test_before_acquire(false)
            // DESIGN §9: a connection whose transaction could not be rolled back is closed,
            // never handed out again (see `left_clean`).
            .before_acquire(|conn, _| Box::pin(async move { Ok(left_clean(conn)) }))
            .connect_with(opts)
            .await?;
        if in_memory {
            sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        }
        Ok(SqliteCatalog { pool, task_cache: None, upload_cache: None, checkpointer: (!in_memory).then(Default::default), marks: None, clean: None })
    }

    /// Serve [`super::TaskCatalog::get_task`] and, for finished uploads, [`Catalog::get_upload`]
    /// from memory while the row has not changed since it was last read (task status polling —
    /// `GET /api/v1/tasks/{id}`, MCP `task_get` — and downloads), so those reads neither queue
    /// for a pool connection behind writers nor cost a query. Every write of this catalog to a
    /// task or upload row invalidates what it touched once it has committed (see
    /// [`super::sqlite_tasks::RowCache`]).
    ///
    /// Only for a process that is the database's **sole writer** (`ferry serve` with
    /// `--leases local`: one server per catalog, DATA/lock held): a write by another process
    /// would not be seen. The one writer beside it, `ferry check --repair-catalog`, marks damage,
    /// which [`Catalog::damage`] learns from the marks file ([`super::damage_marks`]).
    pub fn with_read_cache(mut self) -> Self {
        self.task_cache = Some(std::sync::Arc::default());
        self.upload_cache = Some(std::sync::Arc::default());
        self.clean = self.marks.clone().map(|m| std::sync::Arc::new(super::damage_marks::CleanIds::new(m)));
        self
    }

    /// Run `write` to its end in a task of its own when a read cache exists, and return its
    /// outcome. A caller that stops waiting (a client gone mid-request drops the handler's
    /// future) would otherwise end the write's cache guard ([`Invalidate`]) while sqlx's
    /// connection thread still runs the statement it was handed: a read in between could keep
    /// the row as it was before, and serve it after the write landed. Without a read cache the
    /// write runs in the caller's task. A write cut short by the runtime shutting down is
    /// `Unavailable`.
    ///
    /// So a write once begun is carried out even for a caller that left (before, it was rolled
    /// back or committed depending on how far it got): a task started for a client that
    /// disconnected runs (a retry with the same idempotency key finds it), and quota room
    /// reserved for a request that ended is given back by the upload's next PATCH or its expiry.
    ///
    /// [`Invalidate`]: super::sqlite_tasks::Invalidate
    pub(super) async fn to_end<T: Send + 'static>(
        &self,
        write: impl std::future::Future<Output = CatalogResult<T>> + Send + 'static,
    ) -> CatalogResult<T> {
        if self.upload_cache.is_none() && self.task_cache.is_none() {
            return write.await;
        }
        match tokio::spawn(tracing::Instrument::in_current_span(write)).await {
            Ok(outcome) => outcome,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(CatalogError::Unavailable(Box::new(e))),
        }
    }

    /// Held by every write to upload `id`'s row: when dropped — after the write committed or
    /// failed — the read cache forgets it.
    fn upload_changed(&self, id: &str) -> super::sqlite_tasks::Invalidate<UploadRecord> {
        super::sqlite_tasks::Invalidate::new(self.upload_cache.clone(), Some(id))
    }

    /// `Ok` when one row changed; else `NotFound` (no such id) or `Fenced`.
    async fn fenced_or_missing(&self, id: &str, changed: u64) -> CatalogResult<()> {
        if changed == 1 {
            return Ok(());
        }
        match self.get_upload(id).await? {
            None => Err(CatalogError::NotFound),
            Some(_) => Err(CatalogError::Fenced),
        }
    }

    /// The pool's connections, for tests that need to see their state.
    #[doc(hidden)]
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    async fn ids(&self, sql: &'static str, a: i64, limit: u32) -> CatalogResult<Vec<String>> {
        let rows = sqlx::query(sql).bind(a).bind(limit as i64).fetch_all(&self.pool).await?;
        rows.iter().map(|r| r.try_get::<String, _>(0).map_err(Into::into)).collect()
    }
}

/// INSERT `rec` (holding `key` when given) through `exec`.
async fn insert_on<'e>(exec: impl sqlx::SqliteExecutor<'e>, rec: &UploadRecord, key: Option<&CreationKey>) -> CatalogResult<()> {
    let (kind, parts, header) = match &rec.concat {
        Concat::None => ("none", None, None),
        Concat::Partial => ("partial", None, None),
        Concat::Final { parts, header } => ("final", Some(parts.join(" ")), Some(header.clone())),
    };
    sqlx::query(st::INSERT_UPLOAD.sqlite)
        .bind(&rec.id)
        .bind(&rec.principal)
        .bind(rec.length.map(to_i64).transpose()?)
        .bind(to_i64(rec.offset)?)
        .bind(&rec.metadata)
        .bind(&rec.hash_state)
        .bind(rec.sha256.map(|d| d.to_vec()))
        .bind(rec.expected_sha256.map(|d| d.to_vec()))
        .bind(kind)
        .bind(parts)
        .bind(header)
        .bind(rec.created_at_ms)
        .bind(rec.updated_at_ms)
        .bind(rec.expires_at_ms)
        .bind(rec.finished_at_ms)
        .bind(rec.expired)
        .bind(&rec.blob_state)
        .bind(!rec.provisional)
        .bind(key.map(|k| k.key.as_str()))
        .bind(key.map(|k| k.fingerprint.as_str()))
        .execute(exec)
        .await?;
    Ok(())
}

/// [`Catalog::usage`] through `exec`.
async fn usage_on<'e>(exec: impl sqlx::SqliteExecutor<'e>, principal: &str, now_ms: i64) -> CatalogResult<Usage> {
    let row = sqlx::query(st::USAGE.sqlite).bind(principal).bind(now_ms).fetch_one(exec).await?;
    Ok(Usage { bytes: row.try_get::<i64, _>("bytes")?.max(0) as u64, uploads_in_progress: row.try_get::<i64, _>("open")?.max(0) as u64 })
}

/// Whether a pooled connection may be handed out again (`before_acquire`).
///
/// A dropped [`sqlx::Transaction`] queues a `ROLLBACK` that runs before the connection is
/// pooled again. When SQLite already rolled the transaction back itself — it may do so on
/// `SQLITE_FULL`, `SQLITE_IOERR` or `SQLITE_NOMEM`, e.g. when `COMMIT` hits a full disk —
/// that `ROLLBACK` fails ("no transaction is active") and sqlx keeps counting the connection
/// as inside a transaction. Every later `begin_with("BEGIN IMMEDIATE")` on it then failed with
/// "attempted to call begin_with at non-zero transaction depth", forever (issue 9, item 6).
/// Such a connection is closed here and the pool opens a fresh one.
fn left_clean(conn: &mut sqlx::SqliteConnection) -> bool {
    if conn.is_in_transaction() {
        tracing::warn!("closing a catalog connection left inside a transaction (its rollback failed); the pool opens a new one");
        return false;
    }
    true
}

impl SqliteCatalog {
    /// INSERT `rec`, holding `key` when given.
    async fn insert(&self, rec: &UploadRecord, key: Option<&CreationKey>) -> CatalogResult<()> {
        insert_on(&self.pool, rec, key).await
    }

    /// INSERT `rec` and check `quota` in one `BEGIN IMMEDIATE` transaction (SQLite has one
    /// writer at a time, so no other creation interleaves between the count and the insert).
    async fn insert_within(&self, rec: &UploadRecord, key: Option<&CreationKey>, quota: &Quota) -> CatalogResult<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        insert_on(&mut *tx, rec, key).await?;
        let used = usage_on(&mut *tx, &rec.principal, rec.created_at_ms).await?;
        if let Some(q) = used.exceeds(quota, rec.length.unwrap_or(rec.offset), !rec.is_finished()) {
            return Err(CatalogError::QuotaExceeded(q));
        }
        tx.commit().await?;
        Ok(())
    }

    /// The live upload of `principal` holding creation key `key`, with its fingerprint.
    async fn by_creation_key(&self, principal: &str, key: &str) -> CatalogResult<Option<(UploadRecord, String)>> {
        let row = sqlx::query(st::BY_CREATION_KEY.sqlite).bind(principal).bind(key).fetch_optional(&self.pool).await?;
        row.map(|r| Ok((row_to_record(&r)?, r.try_get::<Option<String>, _>("creation_fingerprint")?.unwrap_or_default()))).transpose()
    }
}

#[async_trait]
impl Catalog for SqliteCatalog {
    async fn create_upload(&self, rec: &UploadRecord) -> CatalogResult<()> {
        self.insert(rec, None).await
    }

    async fn create_upload_keyed(&self, rec: &UploadRecord, key: &CreationKey) -> CatalogResult<KeyedCreate> {
        // The unique index decides between concurrent holders of the key (`sql::create_keyed`).
        super::sql::create_keyed(
            || self.insert(rec, Some(key)),
            || self.by_creation_key(&rec.principal, &key.key),
            || async { Ok(self.get_upload(&rec.id).await?.is_some()) },
        )
        .await
    }

    async fn create_upload_within(&self, rec: &UploadRecord, key: Option<&CreationKey>, quota: &Quota) -> CatalogResult<KeyedCreate> {
        let Some(key) = key else {
            return self.insert_within(rec, None, quota).await.map(|()| KeyedCreate::Created);
        };
        super::sql::create_keyed(
            || self.insert_within(rec, Some(key), quota),
            || self.by_creation_key(&rec.principal, &key.key),
            || async { Ok(self.get_upload(&rec.id).await?.is_some()) },
        )
        .await
    }

    async fn usage(&self, principal: &str, now_ms: i64) -> CatalogResult<Usage> {
        usage_on(&self.pool, principal, now_ms).await
    }

    async fn upload_by_creation_key(&self, principal: &str, key: &str) -> CatalogResult<Option<(UploadRecord, String)>> {
        self.by_creation_key(principal, key).await
    }

    async fn announce_upload(&self, id: &str) -> CatalogResult<()> {
        to_end!(self, this, [id: &str], {
            let _changed = this.upload_changed(id);
            sqlx::query(st::ANNOUNCE.sqlite).bind(id).execute(&this.pool).await?;
            Ok(())
        })
    }

    async fn withdraw_upload(&self, id: &str) -> CatalogResult<bool> {
        to_end!(self, this, [id: &str], {
            let _changed = this.upload_changed(id);
            let done = sqlx::query(st::WITHDRAW.sqlite).bind(id).execute(&this.pool).await?;
            Ok(done.rows_affected() == 1)
        })
    }

    async fn reserve_upload_bytes(&self, id: &str, to: u64, max_bytes: u64, now_ms: i64) -> CatalogResult<super::Reservation> {
        to_end!(self, this, [id: &str], {
            let _changed = this.upload_changed(id);
            // One writer at a time (BEGIN IMMEDIATE): no creation or reservation interleaves.
            let mut tx = this.pool.begin_with("BEGIN IMMEDIATE").await?;
            let row = sqlx::query(st::RESERVATION_ROW.sqlite).bind(id).fetch_optional(&mut *tx).await?;
            let Some(row) = row else { return Err(CatalogError::NotFound) };
            let principal: String = row.try_get("principal")?;
            let n = |v: i64| v.max(0) as u64;
            let (offset, length, reserved_to) =
                (n(row.try_get("offset")?), row.try_get::<Option<i64>, _>("length")?.map(n), row.try_get::<Option<i64>, _>("reserved_to")?.map(n));
            let used = usage_on(&mut *tx, &principal, now_ms).await?.bytes;
            let r = super::Reservation::grant(offset, length, reserved_to, used, to, max_bytes);
            sqlx::query(st::SET_RESERVATION.sqlite).bind(to_i64(r.granted_to)?).bind(&r.nonce).bind(id).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(r)
        })
    }

    async fn release_upload_bytes(&self, id: &str, nonce: &str) -> CatalogResult<()> {
        to_end!(self, this, [id: &str, nonce: &str], {
            let _changed = this.upload_changed(id);
            sqlx::query(st::RELEASE_RESERVATION.sqlite).bind(id).bind(nonce).execute(&this.pool).await?;
            Ok(())
        })
    }

    async fn list_finished_before(&self, scope: &PrincipalScope, finished_before_ms: i64, limit: u32) -> CatalogResult<Vec<String>> {
        let rows = match scope {
            PrincipalScope::Only(p) => {
                sqlx::query(st::FINISHED_BEFORE_OF.sqlite).bind(finished_before_ms).bind(p).bind(limit as i64).fetch_all(&self.pool).await?
            }
            PrincipalScope::AllExcept(ps) => {
                let marks = vec!["?"; ps.len()].join(",");
                let not_in = if ps.is_empty() { String::new() } else { format!(" AND principal NOT IN ({marks})") };
                let sql = format!("{}{not_in} ORDER BY finished_at_ms LIMIT ?", st::FINISHED_BEFORE_SQLITE);
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(finished_before_ms);
                for p in ps {
                    q = q.bind(p);
                }
                q.bind(limit as i64).fetch_all(&self.pool).await?
            }
        };
        rows.iter().map(|r| r.try_get::<String, _>(0).map_err(Into::into)).collect()
    }

    async fn expire_finished_if_due(&self, id: &str, finished_before_ms: i64, now_ms: i64) -> CatalogResult<bool> {
        to_end!(self, this, [id: &str], {
            // A finished row is what the read cache keeps: retention must make it forget it.
            let _changed = this.upload_changed(id);
            let done = sqlx::query(st::EXPIRE_FINISHED_IF_DUE.sqlite).bind(now_ms).bind(id).bind(finished_before_ms).execute(&this.pool).await?;
            Ok(done.rows_affected() == 1)
        })
    }

    async fn get_upload(&self, id: &str) -> CatalogResult<Option<UploadRecord>> {
        let generation = match self.upload_cache.as_ref().map(|c| c.get(id)) {
            Some(Ok(rec)) => return Ok(Some(rec)),
            Some(Err(generation)) => Some(generation),
            None => None,
        };
        let row = sqlx::query(st::GET_UPLOAD.sqlite).bind(id).fetch_optional(&self.pool).await?;
        let rec = row.as_ref().map(row_to_record).transpose()?;
        // Only finished uploads: their rows change again only by deletion or a reopen.
        if let (Some(c), Some(g), Some(r)) = (&self.upload_cache, generation, &rec) {
            if r.is_finished() && !r.expired {
                c.keep(g, id, r);
            }
        }
        Ok(rec)
    }

    async fn upload_blob_state(&self, id: &str) -> CatalogResult<Option<Vec<u8>>> {
        // One statement, so the row and its entries come from one snapshot.
        let rows = sqlx::query(st::BLOB_STATE.sqlite).bind(id).fetch_all(&self.pool).await?;
        join_blob_state(rows.iter().map(|r| r.try_get::<Vec<u8>, _>(0)).collect::<Result<Vec<_>, _>>()?)
    }

    async fn acquire_fence(&self, id: &str) -> CatalogResult<u64> {
        let fence: Option<i64> = first(sqlx::query_scalar(st::ACQUIRE_FENCE.sqlite).bind(id).fetch_all(&self.pool).await?);
        fence.map(|f| f as u64).ok_or(CatalogError::NotFound)
    }

    async fn checkpoint(&self, id: &str, fence: u64, cp: &Checkpoint) -> CatalogResult<()> {
        to_end!(self, this, [id: &str, cp: &Checkpoint], {
            let (row, entries) = crate::framed::split(&cp.blob_state);
            if let (Some(slot), None) = (&this.checkpointer, cp.blob_entries_from) {
                // The row as written comes back from the statement itself, and the read cache keeps
                // it: the next PATCH of this upload reads it from memory (issue 24: one query less
                // per PATCH).
                // Only a process with a read cache needs the row back.
                let keeping = this.upload_cache.is_some();
                let sql = if keeping { st::CHECKPOINT_RETURNING_SQLITE } else { st::CHECKPOINT.sqlite };
                let update = checkpoint_query(sql, id, fence, cp, row)?;
                let mut slot = slot.lock().await;
                if this.pool.is_closed() {
                    return Err(sqlx::Error::PoolClosed.into());
                }
                // Checkpoints take turns on the connection, and the write begins once this one's turn
                // came: two uploads' checkpoints never overlap, so each may keep its row.
                let mut changed = this.upload_changed(id);
                let mut conn = match slot.take() {
                    Some(c) => c,
                    None => this.pool.acquire().await?.detach(),
                };
                let rows = if keeping {
                    let written = first(update.fetch_all(&mut conn).await?);
                    // Committed: a row that does not decode is read again from the database later.
                    if let Some(rec) = written.as_ref().and_then(|r| row_to_record(r).ok()) {
                        changed.wrote(rec);
                    }
                    u64::from(written.is_some())
                } else {
                    update.execute(&mut conn).await?.rows_affected()
                };
                *slot = Some(conn);
                if rows == 0 {
                    // Fenced or gone: the statement changed nothing.
                    changed.narrow_to(None);
                }
                drop(changed);
                drop(slot);
                return this.fenced_or_missing(id, rows).await;
            }
            let _changed = this.upload_changed(id);
            let update = checkpoint_query(st::CHECKPOINT.sqlite, id, fence, cp, row)?;
            let changed = this.update_with_entries(update, id, cp.blob_entries_from, &entries).await?;
            this.fenced_or_missing(id, changed).await
        })
    }

    async fn mark_expired(&self, id: &str, now_ms: i64) -> CatalogResult<bool> {
        to_end!(self, this, [id: &str], {
            let _changed = this.upload_changed(id);
            let done = sqlx::query(st::MARK_EXPIRED.sqlite).bind(now_ms).bind(id).execute(&this.pool).await?;
            if done.rows_affected() == 1 {
                return Ok(true);
            }
            match this.get_upload(id).await? {
                None => Err(CatalogError::NotFound),
                Some(_) => Ok(false),
            }
        })
    }

    async fn expire_if_due(&self, id: &str, now_ms: i64) -> CatalogResult<bool> {
        to_end!(self, this, [id: &str], {
            let _changed = this.upload_changed(id);
            let done = sqlx::query(st::EXPIRE_IF_DUE.sqlite).bind(now_ms).bind(id).execute(&this.pool).await?;
            Ok(done.rows_affected() == 1)
        })
    }

    async fn delete_upload(&self, id: &str) -> CatalogResult<bool> {
        to_end!(self, this, [id: &str], {
            let _changed = this.upload_changed(id);
            let done = sqlx::query(st::DELETE_UPLOAD.sqlite).bind(id).execute(&this.pool).await?;
            Ok(done.rows_affected() > 0)
        })
    }

    async fn list_blob_removals(&self, limit: u32) -> CatalogResult<Vec<String>> {
        let rows = sqlx::query(st::LIST_BLOB_REMOVALS.sqlite).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter().map(|r| r.try_get::<String, _>(0).map_err(Into::into)).collect()
    }

    async fn forget_blob_removal(&self, id: &str) -> CatalogResult<()> {
        to_end!(self, this, [id: &str], {
            sqlx::query(st::FORGET_BLOB_REMOVAL.sqlite).bind(id).execute(&this.pool).await?;
            Ok(())
        })
    }

    async fn blob_claim(&self, id: &str) -> CatalogResult<super::BlobClaim> {
        let r = sqlx::query(st::BLOB_CLAIM.sqlite).bind(id).fetch_one(&self.pool).await?;
        Ok(super::sql::blob_claim(r.try_get(0)?, r.try_get(1)?))
    }

    async fn delete_tombstone(&self, id: &str, before_ms: i64) -> CatalogResult<bool> {
        to_end!(self, this, [id: &str], {
            let _changed = this.upload_changed(id);
            let done = sqlx::query(st::DELETE_TOMBSTONE.sqlite).bind(id).bind(before_ms).execute(&this.pool).await?;
            Ok(done.rows_affected() > 0)
        })
    }

    async fn reopen_upload(&self, id: &str, fence: u64, cp: &Checkpoint) -> CatalogResult<()> {
        to_end!(self, this, [id: &str, cp: &Checkpoint], {
            let _changed = this.upload_changed(id);
            let (row, entries) = crate::framed::split(&cp.blob_state);
            let update = sqlx::query(st::REOPEN.sqlite)
                .bind(to_i64(cp.offset)?)
                .bind(&cp.hash_state)
                .bind(row)
                .bind(cp.expires_at_ms)
                .bind(cp.now_ms)
                .bind(id)
                .bind(to_i64(fence)?);
            let changed = this.update_with_entries(update, id, Some(cp.blob_entries_from.unwrap_or(0)), &entries).await?;
            this.fenced_or_missing(id, changed).await
        })
    }

    async fn acquire_upload_lease(&self, id: &str, owner: &str, ttl_ms: i64) -> CatalogResult<LeaseOutcome> {
        // One statement (SQLite serialises writers; see `statements::ACQUIRE_LEASE`).
        let row = first(sqlx::query(st::ACQUIRE_LEASE.sqlite).bind(owner).bind(ttl_ms).bind(id).fetch_all(&self.pool).await?);
        if let Some(r) = row {
            return Ok(LeaseOutcome::Granted(LeaseGrant {
                fence: r.try_get::<i64, _>(0)? as u64,
                expires_at_ms: r.try_get(1)?,
                takeovers: r.try_get::<i64, _>(2)? as u64,
                row: row_to_record(&r).ok().map(Box::new),
            }));
        }
        let row = sqlx::query(st::LEASE_HOLDER.sqlite).bind(id).fetch_optional(&self.pool).await?;
        match row {
            Some(r) if !r.try_get::<bool, _>(2)? => Ok(LeaseOutcome::Held {
                owner: r.try_get::<Option<String>, _>(0)?.unwrap_or_default(),
                expires_at_ms: r.try_get::<Option<i64>, _>(1)?.unwrap_or(0),
            }),
            _ => Err(CatalogError::NotFound),
        }
    }

    async fn renew_upload_lease(&self, id: &str, fence: u64, ttl_ms: i64) -> CatalogResult<i64> {
        let until: Option<i64> =
            first(sqlx::query_scalar(st::RENEW_LEASE.sqlite).bind(ttl_ms).bind(id).bind(to_i64(fence)?).fetch_all(&self.pool).await?);
        match until {
            Some(t) => Ok(t),
            None => self.fenced_or_missing(id, 0).await.map(|_| 0),
        }
    }

    async fn touch_upload(&self, id: &str, fence: u64, expires_at_ms: i64) -> CatalogResult<()> {
        to_end!(self, this, [id: &str], {
            let _changed = this.upload_changed(id);
            let done = sqlx::query(st::TOUCH.sqlite).bind(expires_at_ms).bind(id).bind(to_i64(fence)?).execute(&this.pool).await?;
            this.fenced_or_missing(id, done.rows_affected()).await
        })
    }

    async fn release_upload_lease(&self, id: &str, fence: u64) -> CatalogResult<()> {
        sqlx::query(st::RELEASE_LEASE.sqlite).bind(id).bind(to_i64(fence)?).execute(&self.pool).await?;
        Ok(())
    }

    async fn close(&self) {
        // The pool first: a checkpoint that gets the connection's turn afterwards finds it closed
        // and neither opens another connection nor puts one back.
        self.pool.close().await;
        if let Some(slot) = &self.checkpointer {
            if let Some(conn) = slot.lock().await.take() {
                let _ = conn.close().await;
            }
        }
    }

    async fn reclaim_owner(&self, owner: &str) -> CatalogResult<(u64, u64)> {
        to_end!(self, this, [owner: &str], {
            let mut tx = this.pool.begin_with("BEGIN IMMEDIATE").await?;
            let uploads = sqlx::query(st::RECLAIM_UPLOADS.sqlite).bind(owner).execute(&mut *tx).await?.rows_affected();
            let _changed = this.tasks_changed(None);
            let tasks = sqlx::query(st::RECLAIM_TASKS.sqlite).bind(owner).execute(&mut *tx).await?.rows_affected();
            sqlx::query(st::RECLAIM_DELIVERIES.sqlite).bind(owner).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok((uploads, tasks))
        })
    }

    async fn request_release(&self, id: &str, from: &str) -> CatalogResult<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(sql!("DELETE FROM lease_requests WHERE at_ms < {now} - ?").sqlite).bind(RELEASE_REQUEST_TTL_MS).execute(&mut *tx).await?;
        sqlx::query(sql!("INSERT INTO lease_requests (upload_id, from_owner, at_ms) VALUES (?, ?, {now})").sqlite)
            .bind(id)
            .bind(from)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn release_requests(&self) -> CatalogResult<ReleaseRequests> {
        let mut seen: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM lease_requests").fetch_one(&self.pool).await?;
        let pool = self.pool.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<ReleaseRequest>(256);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(RELEASE_POLL) => {}
                }
                let rows = match sqlx::query("SELECT seq, upload_id, from_owner FROM lease_requests WHERE seq > ? ORDER BY seq")
                    .bind(seen)
                    .fetch_all(&pool)
                    .await
                {
                    Ok(rows) => rows,
                    Err(e) => {
                        tracing::warn!(error = %e, "polling release requests");
                        continue;
                    }
                };
                for r in rows {
                    let (Ok(seq), Ok(upload_id), Ok(from)) = (r.try_get::<i64, _>(0), r.try_get::<String, _>(1), r.try_get::<String, _>(2)) else {
                        continue;
                    };
                    seen = seen.max(seq);
                    if tx.send(ReleaseRequest { upload_id, from }).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Box::pin(tokio_stream_from(rx)))
    }

    async fn shared_secret(&self, name: &str, candidate: &[u8]) -> CatalogResult<Vec<u8>> {
        sqlx::query(st::OFFER_SECRET.sqlite).bind(name).bind(candidate).execute(&self.pool).await?;
        Ok(sqlx::query_scalar(st::SECRET.sqlite).bind(name).fetch_one(&self.pool).await?)
    }

    async fn list_expired(&self, now_ms: i64, limit: u32) -> CatalogResult<Vec<String>> {
        self.ids(st::LIST_EXPIRED.sqlite, now_ms, limit).await
    }

    async fn list_tombstones(&self, before_ms: i64, limit: u32) -> CatalogResult<Vec<String>> {
        self.ids(st::LIST_TOMBSTONES.sqlite, before_ms, limit).await
    }

    async fn list_awaiting_finish(&self, limit: u32) -> CatalogResult<Vec<String>> {
        let rows = sqlx::query(st::LIST_AWAITING_FINISH.sqlite).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter().map(|r| sqlx::Row::try_get::<String, _>(r, "id").map_err(Into::into)).collect()
    }

    async fn finals_waiting_on(&self, part_id: &str) -> CatalogResult<Vec<String>> {
        let rows = sqlx::query(st::FINALS_NAMING.sqlite).bind(part_id).fetch_all(&self.pool).await?;
        let mut out = Vec::new();
        for r in rows {
            let parts: String = r.try_get("concat_parts")?;
            if parts.split_whitespace().any(|p| p == part_id) {
                out.push(r.try_get("id")?);
            }
        }
        Ok(out)
    }

    async fn list_uploads(&self, principal: &str, limit: u32) -> CatalogResult<Vec<UploadRecord>> {
        let rows = sqlx::query(st::LIST_UPLOADS.sqlite).bind(principal).bind(limit as i64).fetch_all(&self.pool).await?;
        rows.iter().map(row_to_record).collect()
    }

    async fn ping(&self) -> CatalogResult<()> {
        sqlx::query(st::PING.sqlite).execute(&self.pool).await?;
        Ok(())
    }

    async fn put_mcp_session(&self, id: &str, state: &str, now_ms: i64) -> CatalogResult<()> {
        sqlx::query(st::PUT_MCP_SESSION.sqlite).bind(id).bind(state).bind(now_ms).execute(&self.pool).await?;
        Ok(())
    }

    async fn get_mcp_session(&self, id: &str, now_ms: i64) -> CatalogResult<Option<String>> {
        Ok(first(sqlx::query_scalar(st::GET_MCP_SESSION.sqlite).bind(now_ms).bind(id).fetch_all(&self.pool).await?))
    }

    async fn delete_mcp_session(&self, id: &str) -> CatalogResult<()> {
        sqlx::query(st::DELETE_MCP_SESSION.sqlite).bind(id).execute(&self.pool).await?;
        Ok(())
    }

    async fn forget_mcp_sessions(&self, before_ms: i64) -> CatalogResult<u64> {
        Ok(sqlx::query(st::FORGET_MCP_SESSIONS.sqlite).bind(before_ms).execute(&self.pool).await?.rows_affected())
    }

    async fn list_uploads_after(&self, after: &str, limit: u32) -> CatalogResult<Vec<UploadRecord>> {
        let rows = sqlx::query(st::LIST_UPLOADS_AFTER.sqlite).bind(after).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter().map(row_to_record).collect()
    }

    async fn set_damage(&self, id: &str, damage: Option<&Damage>) -> CatalogResult<bool> {
        let done = match damage {
            Some(d) => {
                let done = sqlx::query(st::SET_DAMAGE.sqlite).bind(&d.kind).bind(&d.detail).bind(d.found_at_ms).bind(id).execute(&self.pool).await?;
                // After the commit (see `damage_marks`): a server beside this process forgets
                // which uploads it found unmarked.
                if let Some(Err(e)) = self.marks.as_ref().map(|m| m.bump()) {
                    tracing::warn!(
                        error = %e,
                        "could not append to the damage marks file: a server on this catalog serves the upload for up to 1 s more"
                    );
                }
                done
            }
            None => sqlx::query(st::CLEAR_DAMAGE.sqlite).bind(id).execute(&self.pool).await?,
        };
        sqlx::query(st::FORGET_CRC32.sqlite).bind(id).execute(&self.pool).await?;
        Ok(done.rows_affected() > 0)
    }

    async fn damage(&self, id: &str) -> CatalogResult<Option<Damage>> {
        use super::damage_marks::Look;
        let look = self.clean.as_ref().map(|c| c.look(id));
        if let Some(Look::Clean) = look {
            return Ok(None);
        }
        let row: Option<(String, String, i64)> = sqlx::query_as(st::DAMAGE.sqlite).bind(id).fetch_optional(&self.pool).await?;
        if let (None, Some(Look::Ask(stamp)), Some(c)) = (&row, look, &self.clean) {
            c.found_clean(id, stamp);
        }
        Ok(row.map(|(kind, detail, found_at_ms)| Damage { kind, detail, found_at_ms }))
    }

    async fn set_final_failure(&self, id: &str, failure: &FinalFailure) -> CatalogResult<bool> {
        let done = sqlx::query(st::SET_FINAL_FAILURE.sqlite)
            .bind(&failure.code)
            .bind(&failure.detail)
            .bind(failure.failed_at_ms)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn final_failure(&self, id: &str) -> CatalogResult<Option<FinalFailure>> {
        let row: Option<(String, String, i64)> = sqlx::query_as(st::FINAL_FAILURE.sqlite).bind(id).fetch_optional(&self.pool).await?;
        Ok(row.map(|(code, detail, failed_at_ms)| FinalFailure { code, detail, failed_at_ms }))
    }

    async fn keep_crc32(&self, id: &str, crc32: u32) -> CatalogResult<bool> {
        let done = sqlx::query(st::KEEP_CRC32.sqlite).bind(i64::from(crc32)).bind(id).execute(&self.pool).await?;
        Ok(done.rows_affected() > 0)
    }

    async fn crc32(&self, id: &str) -> CatalogResult<Option<u32>> {
        let row: Option<(i64,)> = sqlx::query_as(st::CRC32.sqlite).bind(id).fetch_optional(&self.pool).await?;
        Ok(row.and_then(|(v,)| u32::try_from(v).ok()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{NewTask, TaskCatalog};

    /// Issue 9, item 6: a transaction that hit a full disk (here: SQLite's page limit, the same
    /// `SQLITE_FULL`) was rolled back by SQLite itself, sqlx's rollback then failed, and the
    /// pooled connection stayed "inside a transaction": every later `BEGIN IMMEDIATE` failed
    /// with "attempted to call begin_with at non-zero transaction depth". Now each failure is
    /// `Full`, reads keep working, and no pooled connection is left in a transaction.
    #[tokio::test]
    async fn a_full_database_rolls_back_and_leaves_every_connection_clean() {
        let dir = tempfile::tempdir().unwrap();
        let opts = SqliteConnectOptions::new().filename(dir.path().join("ferry.db")).create_if_missing(true).synchronous(SqliteSynchronous::Full);
        let cat = SqliteCatalog::connect(opts.clone(), false).await.unwrap();
        let pages: i64 = sqlx::query_scalar("PRAGMA page_count").fetch_one(&cat.pool).await.unwrap();
        cat.pool.close().await;
        let cat = SqliteCatalog::connect(opts.pragma("max_page_count", (pages + 8).to_string()), false).await.unwrap();
        let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(3000));
        let task = |i: usize| NewTask {
            id: format!("t{i:025}"),
            principal: "p".into(),
            kind: "k".into(),
            args: big.clone(),
            idempotency_key: Some(format!("key{i}")),
            ttl_ms: 1,
            now_ms: 0,
        };
        let mut full = 0;
        for i in 0..200 {
            match cat.start_task(&task(i)).await {
                Ok(_) => {}
                Err(CatalogError::Full(_)) => full += 1,
                Err(other) => panic!("start {i}: expected Ok or Full, got {other}"),
            }
        }
        assert!(full > 100, "the database never filled ({full} failures)");
        // Reads work and the next transactions still reach SQLite (Full, not a stuck connection).
        assert!(cat.get_task(&task(0).id).await.unwrap().is_some());
        assert!(matches!(cat.start_task(&task(999)).await, Err(CatalogError::Full(_))));
        for _ in 0..8 {
            let mut conn = cat.pool.acquire().await.unwrap();
            assert!(!conn.is_in_transaction(), "a pooled connection was handed out inside a transaction");
            sqlx::query("SELECT 1").execute(&mut *conn).await.unwrap();
        }
        // Space returns (old rows go): writes succeed again on the same pool.
        sqlx::query("DELETE FROM task_keys").execute(&cat.pool).await.unwrap();
        sqlx::query("DELETE FROM tasks").execute(&cat.pool).await.unwrap();
        cat.start_task(&task(1000)).await.unwrap();
    }
}
