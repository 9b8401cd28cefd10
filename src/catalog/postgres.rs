//! The distributed [`Catalog`]: PostgreSQL (sqlx), shared by every replica.
//!
//! The upload half of the [`Catalog`] trait, one method per item. The statements are written
//! once for both catalogs in `statements.rs` (rendered for PostgreSQL by `dialect.rs`); decoders
//! and the rest both share are in `sql.rs`; tasks and events in `postgres_tasks.rs` and
//! `postgres_events.rs`.
//!
//! One file of ~960 lines because it is the one implementation of the upload half of the
//! [`Catalog`] trait for PostgreSQL, kept beside its SQLite twin (`sqlite.rs`) method for method so
//! the two are read side by side; the shared parts already live in `statements.rs` and `sql.rs`.
//!
//! The same rows as the SQLite catalog (migrations/postgres/ mirrors migrations/sqlite/), with
//! the differences that matter across processes:
//! - leases and claims compare against the **database's** clock (`ferry_now_ms()`), never a
//!   replica's own;
//! - task claims use `FOR UPDATE SKIP LOCKED`, so replicas polling at once never wait on each
//!   other and never claim one task twice;
//! - read-modify-write changes lock their row (`SELECT … FOR UPDATE`) inside one transaction;
//! - JSON is stored as `text`, so what goes in comes back byte for byte.
//!
//! One file of ~930 lines because it is the upload half of one trait implementation (rust
//! wants an `impl Catalog` in one block) plus the transaction and lease helpers that half uses;
//! tasks and events are in files of their own already.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Postgres, Row, Transaction};

use super::sql::{row_to_record, to_i64};
use super::statements as st;
use super::{
    join_blob_state, Catalog, CatalogError, CatalogResult, Checkpoint, Concat, CreationKey, KeyedCreate, LeaseGrant, LeaseOutcome, PrincipalScope,
    Quota, ReleaseRequest, ReleaseRequests, UploadRecord, Usage,
};
use super::{Damage, FinalFailure};

/// A PostgreSQL statement whose `$n` placeholders are being bound (the value `sqlx::query` returns).
type PgQuery = sqlx::query::Query<'static, Postgres, sqlx::postgres::PgArguments>;

/// The `NOTIFY` channel of release requests (release-on-request across replicas).
const RELEASE_CHANNEL: &str = "ferry_release";

/// Connections one process keeps open at most (PostgreSQL's default `max_connections` is 100,
/// shared by every replica).
const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// How long a request waits for a pooled connection before it fails (503 with
/// `retryable: true`) instead of hanging while the database is away.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest one catalog call (a statement or a transaction, with the wait for its connection)
/// may take before it fails `Unavailable` (503, `retryable: true`): a database that stops
/// answering without closing its connections — a network partition, a stalled proxy — is
/// reported to the client rather than waited out. Its connection goes back to the pool, which
/// pings it before reuse (sqlx), so one that answers again later is kept. Statements here take
/// milliseconds; the bound is for outages, not for load.
pub const CALL_DEADLINE: Duration = Duration::from_secs(15);

/// Longest a background sweep's call may take (pruning events, sweeping tasks and MCP
/// sessions: one statement over every row due, however many accumulated), so that it still
/// ends when the database stops answering, yet a large backlog is not cut off — and rolled
/// back — again and again.
pub const SWEEP_DEADLINE: Duration = Duration::from_secs(600);

/// `call` within [`CALL_DEADLINE`].
pub(super) async fn within<T>(call: impl std::future::Future<Output = CatalogResult<T>>) -> CatalogResult<T> {
    within_for(CALL_DEADLINE, call).await
}

/// `call` within `deadline`, else `Unavailable`.
pub(super) async fn within_for<T>(deadline: Duration, call: impl std::future::Future<Output = CatalogResult<T>>) -> CatalogResult<T> {
    match tokio::time::timeout(deadline, call).await {
        Ok(r) => r,
        Err(_) => Err(CatalogError::Unavailable(format!("PostgreSQL did not answer within {} s", deadline.as_secs()).into())),
    }
}

/// How long start-up waits for the first connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a readiness ping waits for a pooled connection before it opens one of its own
/// (`Catalog::ping`): well inside `/readyz`'s 3 s bound, so the reason a refused connection
/// gives reaches the prober.
const PING_POOL_WAIT: Duration = Duration::from_secs(1);

/// How a transaction body ends (see [`settle`]).
pub(super) enum Tx<T> {
    Commit(T),
    Rollback(T),
}

/// End `tx` as `out` says, rolling back explicitly on every path that does not commit: the one
/// way every PostgreSQL transaction of the catalog ends (`begin`, a body returning
/// `CatalogResult<Tx<T>>`, then `settle`). A dropped transaction only *queues* its ROLLBACK
/// until the connection is next used, and a pooled idle connection would keep its row locks
/// (and advisory locks) until then: claims with SKIP LOCKED would pass the row over.
pub(super) async fn settle<T>(tx: Transaction<'static, Postgres>, out: CatalogResult<Tx<T>>) -> CatalogResult<T> {
    match out {
        Ok(Tx::Commit(v)) => {
            tx.commit().await?;
            Ok(v)
        }
        Ok(Tx::Rollback(v)) => {
            tx.rollback().await?;
            Ok(v)
        }
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// A principal's quota lock (transaction-scoped advisory lock): creations and reservations
/// of one principal, on every replica, are decided one after the other.
const QUOTA_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended('ferry.quota:' || $1, 0))";

/// How long a pooled connection may sit idle before it is pinged on acquire.
const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

/// PostgreSQL-backed catalog.
#[derive(Clone)]
pub struct PostgresCatalog {
    pub(super) pool: PgPool,
    hot: std::sync::Arc<HotConnections>,
}

/// Most pooled connections kept aside by [`HotConnections`] (at most half the pool's).
const HOT_CONNECTIONS: usize = 4;

/// A connection idle this long is closed: the pool's own and the ones [`HotConnections`] keeps
/// (checked every [`IDLE_TIMEOUT`] / 5), so a replica without traffic holds none.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Pooled connections kept aside for the statements every PATCH runs (the lease's grant, the
/// checkpoint, the release): sqlx pings a connection that goes back to its pool, a round trip
/// and a task per statement (issue 24: the fixed cost of a PATCH). The ones kept here are still
/// the pool's, so the catalog never holds more than its `max_connections`, and others always
/// have at least half of them. One idle for [`PING_IDLE_AFTER`] is pinged before use, as the
/// pool does; a statement that fails gives its connection back to the pool (which tests it)
/// and lets go of every other one kept here, which a restarted or lost database broke alike.
struct HotConnections {
    pool: PgPool,
    idle: std::sync::Mutex<Vec<(PoolConnection<Postgres>, std::time::Instant)>>,
    keep: usize,
}

impl HotConnections {
    fn new(pool: PgPool, max_connections: u32) -> Self {
        HotConnections { pool, idle: Default::default(), keep: HOT_CONNECTIONS.min(max_connections as usize / 2) }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(PoolConnection<Postgres>, std::time::Instant)>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A kept connection, else one from the pool.
    async fn take(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        loop {
            let kept = self.idle().pop();
            let Some((mut conn, since)) = kept else { return self.pool.acquire().await };
            if since.elapsed() < PING_IDLE_AFTER || conn.ping().await.is_ok() {
                return Ok(conn);
            }
            conn.close_on_drop();
        }
    }

    /// Keep `conn` for the next statement when its statement's `outcome` left it usable (an
    /// answer, or an error the database sent) and there is room; else it goes back to the pool
    /// (and, when it failed otherwise, so does every connection kept). Once the pool is closing
    /// nothing is kept: its `close` waits for every connection to come back.
    fn give_back<T>(&self, conn: PoolConnection<Postgres>, outcome: &Result<T, sqlx::Error>) {
        if matches!(outcome, Err(e) if !matches!(e, sqlx::Error::Database(_))) || self.pool.is_closed() {
            self.let_go();
            return;
        }
        let mut idle = self.idle();
        if idle.len() < self.keep {
            idle.push((conn, std::time::Instant::now()));
        }
    }

    /// Give every kept connection back to the pool.
    fn let_go(&self) {
        let kept = std::mem::take(&mut *self.idle());
        drop(kept);
    }

    /// Close the kept connections idle for `idle` or longer.
    fn close_idle(&self, idle: Duration) {
        let stale: Vec<_> = {
            let mut kept = self.idle();
            let (stale, fresh) = std::mem::take(&mut *kept).into_iter().partition(|(_, since)| since.elapsed() >= idle);
            *kept = fresh;
            stale
        };
        for (mut conn, _) in stale {
            conn.close_on_drop();
        }
    }

    /// Keep closing connections idle for [`IDLE_TIMEOUT`] while `hot` is alive.
    fn spawn_idle_sweep(hot: &std::sync::Arc<HotConnections>) {
        let hot = std::sync::Arc::downgrade(hot);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(IDLE_TIMEOUT / 5).await;
                match hot.upgrade() {
                    Some(h) => h.close_idle(IDLE_TIMEOUT),
                    None => return,
                }
            }
        });
    }
}

/// A `postgres://` URL with its password (in the user info or a `password=` parameter)
/// replaced by `***`, for messages and logs. Text that is not a URL is replaced whole.
pub fn redact_url(url: &str) -> String {
    let Ok(mut u) = url::Url::parse(url) else { return "<unparsable URL>".to_string() };
    if u.password().is_some() {
        let _ = u.set_password(Some("***"));
    }
    if u.query_pairs().any(|(k, _)| k == "password") {
        let pairs: Vec<(String, String)> =
            u.query_pairs().map(|(k, v)| (k.to_string(), if k == "password" { "***".to_string() } else { v.to_string() })).collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.to_string()
}

impl PostgresCatalog {
    /// Connect to `url` (`postgres://user:password@host:port/database?…`), run pending
    /// migrations (under sqlx's advisory lock, so replicas starting together migrate once),
    /// and keep a pool of at most 10 connections that reconnects by itself.
    ///
    /// Errors name the URL without its password: unparsable URL, unreachable server, refused
    /// login, missing database, failed migration.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        Self::connect_with_max(url, DEFAULT_MAX_CONNECTIONS).await
    }

    /// [`PostgresCatalog::connect`] with another pool size.
    pub async fn connect_with_max(url: &str, max_connections: u32) -> anyhow::Result<Self> {
        let shown = redact_url(url);
        let opts = PgConnectOptions::from_str(url)
            .map_err(|e| anyhow::anyhow!("invalid catalog URL {shown}: {}", scrub(&e.to_string(), url)))?
            .application_name("ferry");
        // One plain connection first: its error names the cause (refused, login, no such
        // database), where the pool would only report that it timed out.
        match tokio::time::timeout(CONNECT_TIMEOUT, opts.connect()).await {
            Err(_) => anyhow::bail!("cannot connect to the catalog {shown}: no answer within {} s", CONNECT_TIMEOUT.as_secs()),
            Ok(Err(e)) => anyhow::bail!("cannot connect to the catalog {shown}: {}", scrub(&describe(&e), url)),
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
            }
        }
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .min_connections(0)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .idle_timeout(IDLE_TIMEOUT)
            // A connection idle for a while is pinged before use, so one the server dropped
            // meanwhile (a restart, `pg_terminate_backend`) is replaced without failing a
            // request; one in steady use is not (issue 24: the ping was a round trip before every
            // statement of every PATCH). A connection dropped within that while fails its next
            // statement once (`Unavailable`, retryable), and sqlx discards it.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IDLE_AFTER {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(opts)
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to the catalog {shown}: {}", scrub(&describe(&e), url)))?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await.map_err(|e| anyhow::anyhow!("migrating the catalog {shown}: {e}"))?;
        let hot = std::sync::Arc::new(HotConnections::new(pool.clone(), max_connections.max(1)));
        HotConnections::spawn_idle_sweep(&hot);
        Ok(PostgresCatalog { hot, pool })
    }

    /// Close the connections kept aside for the PATCH statements that have been idle for
    /// `idle` or longer (what a sweep does every minute with 300 s; tests).
    #[doc(hidden)]
    pub fn close_idle_kept(&self, idle: Duration) {
        self.hot.close_idle(idle);
    }

    /// The connection pool (tests and benchmarks).
    #[doc(hidden)]
    pub fn pool(&self) -> &PgPool {
        &self.pool
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

    async fn ids(&self, sql: &'static str, a: i64, limit: u32) -> CatalogResult<Vec<String>> {
        let rows = sqlx::query(sql).bind(a).bind(limit as i64).fetch_all(&self.pool).await?;
        rows.iter().map(|r| r.try_get::<String, _>(0).map_err(Into::into)).collect()
    }
}

/// A release request from its `NOTIFY` payload (`{"upload_id":…,"from":…}`).
fn release_request(payload: &str) -> Option<ReleaseRequest> {
    let v: serde_json::Value = serde_json::from_str(payload).ok()?;
    Some(ReleaseRequest { upload_id: v["upload_id"].as_str()?.to_string(), from: v["from"].as_str()?.to_string() })
}

/// A driver error in one line: the server's own message for database errors (without the
/// source position sqlx appends), the OS error for I/O.
fn describe(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => match d.code() {
            Some(code) => format!("{} (SQLSTATE {code})", d.message()),
            None => d.message().to_string(),
        },
        sqlx::Error::Io(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// `text` with any occurrence of the URL's password removed (driver messages may echo parts
/// of the URL).
fn scrub(text: &str, url: &str) -> String {
    match url::Url::parse(url).ok().and_then(|u| u.password().map(str::to_owned)) {
        Some(p) if !p.is_empty() => text.replace(&p, "***"),
        _ => text.to_string(),
    }
}

/// INSERT `rec` (holding `key` when given) through `exec`.
async fn insert_on<'e>(exec: impl sqlx::PgExecutor<'e>, rec: &UploadRecord, key: Option<&CreationKey>) -> CatalogResult<()> {
    let (kind, parts, header) = match &rec.concat {
        Concat::None => ("none", None, None),
        Concat::Partial => ("partial", None, None),
        Concat::Final { parts, header } => ("final", Some(parts.join(" ")), Some(header.clone())),
    };
    sqlx::query(st::INSERT_UPLOAD.pg)
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
async fn usage_on<'e>(exec: impl sqlx::PgExecutor<'e>, principal: &str, now_ms: i64) -> CatalogResult<Usage> {
    let row = sqlx::query(st::USAGE.pg).bind(principal).bind(now_ms).fetch_one(exec).await?;
    Ok(Usage { bytes: row.try_get::<i64, _>("bytes")?.max(0) as u64, uploads_in_progress: row.try_get::<i64, _>("open")?.max(0) as u64 })
}

impl PostgresCatalog {
    /// Run fenced update `sql.0` of one upload's row (its placeholders bound by `bind`) and,
    /// when it changed the row and `from` says so ([`Checkpoint::blob_entries_from`]), replace
    /// the entries kept beside it from `from` on with `entries[from..]` — in one statement,
    /// `sql.1` (the update inside `statements::with_entries!`: one round trip, one
    /// transaction). Returns the rows the update changed.
    async fn update_with_entries(
        &self,
        sql: (&'static str, &'static str),
        bind: impl FnOnce(PgQuery) -> PgQuery,
        from: Option<u32>,
        entries: &[&[u8]],
    ) -> CatalogResult<u64> {
        let mut conn = self.hot.take().await?;
        let Some(from) = from else {
            let done = bind(sqlx::query(sql.0)).execute(&mut *conn).await;
            self.hot.give_back(conn, &done);
            return Ok(done?.rows_affected());
        };
        let added = entries.get(from as usize..).unwrap_or_default();
        let seqs: Vec<i32> = (from as i32..).take(added.len()).collect();
        let bytes: Vec<Vec<u8>> = added.iter().map(|e| e.to_vec()).collect();
        let row = bind(sqlx::query(sql.1)).bind(seqs).bind(bytes).bind(entries.len() as i32).fetch_one(&mut *conn).await;
        self.hot.give_back(conn, &row);
        Ok(row?.try_get::<i64, _>(0)? as u64)
    }

    /// INSERT `rec`, holding `key` when given.
    async fn insert(&self, rec: &UploadRecord, key: Option<&CreationKey>) -> CatalogResult<()> {
        insert_on(&self.pool, rec, key).await
    }

    /// INSERT `rec` and check `quota` in one transaction, holding a transaction-scoped advisory
    /// lock on the principal (`ferry.quota:<principal>`) from before the count to commit, so
    /// concurrent creations of one principal on any replica are checked one after the other.
    async fn insert_within(&self, rec: &UploadRecord, key: Option<&CreationKey>, quota: &Quota) -> CatalogResult<()> {
        let mut tx = self.pool.begin().await?;
        let out: CatalogResult<Tx<_>> = async {
            sqlx::query(QUOTA_LOCK).bind(&rec.principal).execute(&mut *tx).await?;
            insert_on(&mut *tx, rec, key).await?;
            let used = usage_on(&mut *tx, &rec.principal, rec.created_at_ms).await?;
            if let Some(q) = used.exceeds(quota, rec.length.unwrap_or(rec.offset), !rec.is_finished()) {
                return Err(CatalogError::QuotaExceeded(q));
            }
            Ok(Tx::Commit(()))
        }
        .await;
        settle(tx, out).await
    }

    /// The live upload of `principal` holding creation key `key`, with its fingerprint.
    async fn by_creation_key(&self, principal: &str, key: &str) -> CatalogResult<Option<(UploadRecord, String)>> {
        let row = sqlx::query(st::BY_CREATION_KEY.pg).bind(principal).bind(key).fetch_optional(&self.pool).await?;
        row.map(|r| Ok((row_to_record(&r)?, r.try_get::<Option<String>, _>("creation_fingerprint")?.unwrap_or_default()))).transpose()
    }
}

#[async_trait]
impl Catalog for PostgresCatalog {
    async fn create_upload(&self, rec: &UploadRecord) -> CatalogResult<()> {
        within(async { self.insert(rec, None).await }).await
    }

    async fn create_upload_keyed(&self, rec: &UploadRecord, key: &CreationKey) -> CatalogResult<KeyedCreate> {
        within(async {
            // The unique index decides between concurrent holders of the key (`sql::create_keyed`).
            super::sql::create_keyed(
                || self.insert(rec, Some(key)),
                || self.by_creation_key(&rec.principal, &key.key),
                || async { Ok(self.get_upload(&rec.id).await?.is_some()) },
            )
            .await
        })
        .await
    }

    async fn create_upload_within(&self, rec: &UploadRecord, key: Option<&CreationKey>, quota: &Quota) -> CatalogResult<KeyedCreate> {
        within(async {
            let Some(key) = key else {
                return self.insert_within(rec, None, quota).await.map(|()| KeyedCreate::Created);
            };
            super::sql::create_keyed(
                || self.insert_within(rec, Some(key), quota),
                || self.by_creation_key(&rec.principal, &key.key),
                || async { Ok(self.get_upload(&rec.id).await?.is_some()) },
            )
            .await
        })
        .await
    }

    async fn usage(&self, principal: &str, now_ms: i64) -> CatalogResult<Usage> {
        within(async { usage_on(&self.pool, principal, now_ms).await }).await
    }

    async fn upload_by_creation_key(&self, principal: &str, key: &str) -> CatalogResult<Option<(UploadRecord, String)>> {
        within(async { self.by_creation_key(principal, key).await }).await
    }

    async fn announce_upload(&self, id: &str) -> CatalogResult<()> {
        within(async {
            sqlx::query(st::ANNOUNCE.pg).bind(id).execute(&self.pool).await?;
            Ok(())
        })
        .await
    }

    async fn withdraw_upload(&self, id: &str) -> CatalogResult<bool> {
        within(async {
            let done = sqlx::query(st::WITHDRAW.pg).bind(id).execute(&self.pool).await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    async fn reserve_upload_bytes(&self, id: &str, to: u64, max_bytes: u64, now_ms: i64) -> CatalogResult<super::Reservation> {
        within(async {
            let principal: Option<String> =
                sqlx::query_scalar("SELECT principal FROM uploads WHERE id = $1").bind(id).fetch_optional(&self.pool).await?;
            let Some(principal) = principal else { return Err(CatalogError::NotFound) };
            let mut tx = self.pool.begin().await?;
            let out: CatalogResult<Tx<_>> = async {
                // The lock `insert_within` takes: creations and reservations of one principal, on
                // every replica, are decided one after the other.
                sqlx::query(QUOTA_LOCK).bind(&principal).execute(&mut *tx).await?;
                let row = sqlx::query(st::RESERVATION_ROW.pg).bind(id).fetch_optional(&mut *tx).await?;
                let Some(row) = row else { return Err(CatalogError::NotFound) };
                let n = |v: i64| v.max(0) as u64;
                let (offset, length, reserved_to) = (
                    n(row.try_get("offset")?),
                    row.try_get::<Option<i64>, _>("length")?.map(n),
                    row.try_get::<Option<i64>, _>("reserved_to")?.map(n),
                );
                let used = usage_on(&mut *tx, &principal, now_ms).await?.bytes;
                let r = super::Reservation::grant(offset, length, reserved_to, used, to, max_bytes);
                sqlx::query(st::SET_RESERVATION.pg).bind(to_i64(r.granted_to)?).bind(&r.nonce).bind(id).execute(&mut *tx).await?;
                Ok(Tx::Commit(r))
            }
            .await;
            settle(tx, out).await
        })
        .await
    }

    async fn release_upload_bytes(&self, id: &str, nonce: &str) -> CatalogResult<()> {
        within(async {
            sqlx::query(st::RELEASE_RESERVATION.pg).bind(id).bind(nonce).execute(&self.pool).await?;
            Ok(())
        })
        .await
    }

    async fn list_finished_before(&self, scope: &PrincipalScope, finished_before_ms: i64, limit: u32) -> CatalogResult<Vec<String>> {
        within(async {
            let rows = match scope {
                PrincipalScope::Only(p) => {
                    sqlx::query(st::FINISHED_BEFORE_OF.pg).bind(finished_before_ms).bind(p).bind(limit as i64).fetch_all(&self.pool).await?
                }
                PrincipalScope::AllExcept(ps) => {
                    sqlx::query(st::FINISHED_BEFORE_EXCEPT_PG.pg).bind(finished_before_ms).bind(ps).bind(limit as i64).fetch_all(&self.pool).await?
                }
            };
            rows.iter().map(|r| r.try_get::<String, _>(0).map_err(Into::into)).collect()
        })
        .await
    }

    async fn expire_finished_if_due(&self, id: &str, finished_before_ms: i64, now_ms: i64) -> CatalogResult<bool> {
        within(async {
            let done = sqlx::query(st::EXPIRE_FINISHED_IF_DUE.pg).bind(now_ms).bind(id).bind(finished_before_ms).execute(&self.pool).await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    async fn get_upload(&self, id: &str) -> CatalogResult<Option<UploadRecord>> {
        within(async {
            let row = sqlx::query(st::GET_UPLOAD.pg).bind(id).fetch_optional(&self.pool).await?;
            row.as_ref().map(row_to_record).transpose()
        })
        .await
    }

    async fn upload_blob_state(&self, id: &str) -> CatalogResult<Option<Vec<u8>>> {
        within(async {
            // One statement, so the row and its entries come from one snapshot.
            let rows = sqlx::query(st::BLOB_STATE.pg).bind(id).fetch_all(&self.pool).await?;
            join_blob_state(rows.iter().map(|r| r.try_get::<Vec<u8>, _>(0)).collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn acquire_fence(&self, id: &str) -> CatalogResult<u64> {
        within(async {
            let fence: Option<i64> = sqlx::query_scalar(st::ACQUIRE_FENCE.pg).bind(id).fetch_optional(&self.pool).await?;
            fence.map(|f| f as u64).ok_or(CatalogError::NotFound)
        })
        .await
    }

    async fn checkpoint(&self, id: &str, fence: u64, cp: &Checkpoint) -> CatalogResult<()> {
        within(async {
            let (row, entries) = crate::framed::split(&cp.blob_state);
            let (offset, length, fence) = (to_i64(cp.offset)?, cp.length.map(to_i64).transpose()?, to_i64(fence)?);
            let bind = |q: PgQuery| -> PgQuery {
                q.bind(offset)
                    .bind(cp.hash_state.clone())
                    .bind(row.to_vec())
                    .bind(length)
                    .bind(cp.finished_sha256.map(|d| d.to_vec()))
                    .bind(cp.now_ms)
                    .bind(cp.expires_at_ms)
                    .bind(id.to_string())
                    .bind(fence)
            };
            let changed =
                self.update_with_entries((st::CHECKPOINT.pg, st::CHECKPOINT_WITH_ENTRIES_PG.pg), bind, cp.blob_entries_from, &entries).await?;
            self.fenced_or_missing(id, changed).await
        })
        .await
    }

    async fn mark_expired(&self, id: &str, now_ms: i64) -> CatalogResult<bool> {
        within(async {
            let done = sqlx::query(st::MARK_EXPIRED.pg).bind(now_ms).bind(id).execute(&self.pool).await?;
            if done.rows_affected() == 1 {
                return Ok(true);
            }
            match self.get_upload(id).await? {
                None => Err(CatalogError::NotFound),
                Some(_) => Ok(false),
            }
        })
        .await
    }

    async fn expire_if_due(&self, id: &str, now_ms: i64) -> CatalogResult<bool> {
        within(async {
            let done = sqlx::query(st::EXPIRE_IF_DUE.pg).bind(now_ms).bind(id).execute(&self.pool).await?;
            Ok(done.rows_affected() == 1)
        })
        .await
    }

    async fn delete_upload(&self, id: &str) -> CatalogResult<bool> {
        within(async {
            let done = sqlx::query(st::DELETE_UPLOAD.pg).bind(id).execute(&self.pool).await?;
            Ok(done.rows_affected() > 0)
        })
        .await
    }

    async fn list_blob_removals(&self, limit: u32) -> CatalogResult<Vec<String>> {
        within(async {
            let rows = sqlx::query(st::LIST_BLOB_REMOVALS.pg).bind(i64::from(limit)).fetch_all(&self.pool).await?;
            rows.iter().map(|r| r.try_get::<String, _>(0).map_err(Into::into)).collect()
        })
        .await
    }

    async fn forget_blob_removal(&self, id: &str) -> CatalogResult<()> {
        within(async {
            sqlx::query(st::FORGET_BLOB_REMOVAL.pg).bind(id).execute(&self.pool).await?;
            Ok(())
        })
        .await
    }

    async fn blob_claim(&self, id: &str) -> CatalogResult<super::BlobClaim> {
        within(async {
            let r = sqlx::query(st::BLOB_CLAIM.pg).bind(id).fetch_one(&self.pool).await?;
            Ok(super::sql::blob_claim(r.try_get(0)?, r.try_get(1)?))
        })
        .await
    }

    async fn delete_tombstone(&self, id: &str, before_ms: i64) -> CatalogResult<bool> {
        within(async {
            let done = sqlx::query(st::DELETE_TOMBSTONE.pg).bind(id).bind(before_ms).execute(&self.pool).await?;
            Ok(done.rows_affected() > 0)
        })
        .await
    }

    async fn reopen_upload(&self, id: &str, fence: u64, cp: &Checkpoint) -> CatalogResult<()> {
        within(async {
            let (row, entries) = crate::framed::split(&cp.blob_state);
            let (offset, fence) = (to_i64(cp.offset)?, to_i64(fence)?);
            let bind = |q: PgQuery| -> PgQuery {
                q.bind(offset).bind(cp.hash_state.clone()).bind(row.to_vec()).bind(cp.expires_at_ms).bind(cp.now_ms).bind(id.to_string()).bind(fence)
            };
            let changed = self
                .update_with_entries((st::REOPEN.pg, st::REOPEN_WITH_ENTRIES_PG.pg), bind, Some(cp.blob_entries_from.unwrap_or(0)), &entries)
                .await?;
            self.fenced_or_missing(id, changed).await
        })
        .await
    }

    async fn acquire_upload_lease(&self, id: &str, owner: &str, ttl_ms: i64) -> CatalogResult<LeaseOutcome> {
        within(async {
            // A concurrent taker waits for the row lock, then re-checks the WHERE against the
            // winner's row: Held.
            let mut conn = self.hot.take().await?;
            let row = sqlx::query(st::ACQUIRE_LEASE.pg).bind(owner).bind(ttl_ms).bind(id).fetch_optional(&mut *conn).await;
            self.hot.give_back(conn, &row);
            let row = row?;
            if let Some(r) = row {
                return Ok(LeaseOutcome::Granted(LeaseGrant {
                    fence: r.try_get::<i64, _>(0)? as u64,
                    expires_at_ms: r.try_get(1)?,
                    takeovers: r.try_get::<i64, _>(2)? as u64,
                    row: row_to_record(&r).ok().map(Box::new),
                }));
            }
            let row = sqlx::query(st::LEASE_HOLDER.pg).bind(id).fetch_optional(&self.pool).await?;
            match row {
                Some(r) if !r.try_get::<bool, _>(2)? => Ok(LeaseOutcome::Held {
                    owner: r.try_get::<Option<String>, _>(0)?.unwrap_or_default(),
                    expires_at_ms: r.try_get::<Option<i64>, _>(1)?.unwrap_or(0),
                }),
                _ => Err(CatalogError::NotFound),
            }
        })
        .await
    }

    async fn renew_upload_lease(&self, id: &str, fence: u64, ttl_ms: i64) -> CatalogResult<i64> {
        within(async {
            let until: Option<i64> =
                sqlx::query_scalar(st::RENEW_LEASE.pg).bind(ttl_ms).bind(id).bind(to_i64(fence)?).fetch_optional(&self.pool).await?;
            match until {
                Some(t) => Ok(t),
                None => self.fenced_or_missing(id, 0).await.map(|_| 0),
            }
        })
        .await
    }

    async fn touch_upload(&self, id: &str, fence: u64, expires_at_ms: i64) -> CatalogResult<()> {
        within(async {
            let done = sqlx::query(st::TOUCH.pg).bind(expires_at_ms).bind(id).bind(to_i64(fence)?).execute(&self.pool).await?;
            self.fenced_or_missing(id, done.rows_affected()).await
        })
        .await
    }

    async fn release_upload_lease(&self, id: &str, fence: u64) -> CatalogResult<()> {
        within(async {
            let mut conn = self.hot.take().await?;
            let done = sqlx::query(st::RELEASE_LEASE.pg).bind(id).bind(to_i64(fence)?).execute(&mut *conn).await;
            self.hot.give_back(conn, &done);
            done?;
            Ok(())
        })
        .await
    }

    async fn reclaim_owner(&self, owner: &str) -> CatalogResult<(u64, u64)> {
        within(async {
            let mut tx = self.pool.begin().await?;
            let out = async {
                let uploads = sqlx::query(st::RECLAIM_UPLOADS.pg).bind(owner).execute(&mut *tx).await?.rows_affected();
                let tasks = sqlx::query(st::RECLAIM_TASKS.pg).bind(owner).execute(&mut *tx).await?.rows_affected();
                sqlx::query(st::RECLAIM_DELIVERIES.pg).bind(owner).execute(&mut *tx).await?;
                Ok(Tx::Commit((uploads, tasks)))
            }
            .await;
            settle(tx, out).await
        })
        .await
    }

    async fn request_release(&self, id: &str, from: &str) -> CatalogResult<()> {
        within(async {
            let payload = serde_json::json!({ "upload_id": id, "from": from }).to_string();
            sqlx::query("SELECT pg_notify($1, $2)").bind(RELEASE_CHANNEL).bind(payload).execute(&self.pool).await?;
            Ok(())
        })
        .await
    }

    async fn release_requests(&self) -> CatalogResult<ReleaseRequests> {
        within(async {
            // LISTEN before returning: every request made after this call is delivered. The
            // listener has its own connection (not one of the pool's) and reconnects by itself
            // when the database restarts; requests sent while it was away are lost, and the
            // holder then lets go when its lease expires instead.
            let mut listener = sqlx::postgres::PgListener::connect_with(&self.pool).await?;
            listener.listen(RELEASE_CHANNEL).await?;
            let pool = self.pool.clone();
            let stream = futures::stream::unfold(listener, move |mut listener| {
                let pool = pool.clone();
                async move {
                    loop {
                        match listener.recv().await {
                            Ok(n) => match release_request(n.payload()) {
                                Some(r) => return Some((r, listener)),
                                None => tracing::warn!(payload = n.payload(), "ignoring a malformed release request"),
                            },
                            // The server is shutting down (its pool closed): nothing to reconnect to.
                            Err(_) if pool.is_closed() => return None,
                            Err(e) => {
                                tracing::warn!(error = %e, "release-request listener lost its connection; reconnecting");
                                tokio::time::sleep(Duration::from_millis(500)).await;
                            }
                        }
                    }
                }
            });
            Ok(Box::pin(stream) as ReleaseRequests)
        })
        .await
    }

    async fn shared_secret(&self, name: &str, candidate: &[u8]) -> CatalogResult<Vec<u8>> {
        within(async {
            sqlx::query(st::OFFER_SECRET.pg).bind(name).bind(candidate).execute(&self.pool).await?;
            Ok(sqlx::query_scalar(st::SECRET.pg).bind(name).fetch_one(&self.pool).await?)
        })
        .await
    }

    async fn list_expired(&self, now_ms: i64, limit: u32) -> CatalogResult<Vec<String>> {
        within(async { self.ids(st::LIST_EXPIRED.pg, now_ms, limit).await }).await
    }

    async fn list_tombstones(&self, before_ms: i64, limit: u32) -> CatalogResult<Vec<String>> {
        within(async { self.ids(st::LIST_TOMBSTONES.pg, before_ms, limit).await }).await
    }

    async fn list_awaiting_finish(&self, limit: u32) -> CatalogResult<Vec<String>> {
        within(async {
            let rows = sqlx::query(st::LIST_AWAITING_FINISH.pg).bind(i64::from(limit)).fetch_all(&self.pool).await?;
            rows.iter().map(|r| sqlx::Row::try_get::<String, _>(r, "id").map_err(Into::into)).collect()
        })
        .await
    }

    async fn finals_waiting_on(&self, part_id: &str) -> CatalogResult<Vec<String>> {
        within(async {
            let rows = sqlx::query(st::FINALS_NAMING.pg).bind(part_id).fetch_all(&self.pool).await?;
            let mut out = Vec::new();
            for r in rows {
                let parts: String = r.try_get("concat_parts")?;
                if parts.split_whitespace().any(|p| p == part_id) {
                    out.push(r.try_get("id")?);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn list_uploads(&self, principal: &str, limit: u32) -> CatalogResult<Vec<UploadRecord>> {
        within(async {
            let rows = sqlx::query(st::LIST_UPLOADS.pg).bind(principal).bind(limit as i64).fetch_all(&self.pool).await?;
            rows.iter().map(row_to_record).collect()
        })
        .await
    }

    async fn close(&self) {
        // The kept connections first: the pool's close waits for every connection it lent.
        self.hot.let_go();
        self.pool.close().await;
    }

    /// Readiness (`/readyz`): a pooled connection runs the ping. When none comes within
    /// [`PING_POOL_WAIT`], or the one that came fails (the server ended it: a restart,
    /// `pg_terminate_backend`), a connection of its own runs it instead and its outcome is
    /// the answer: the pool's error would only say that its wait timed out or that an old
    /// connection was ended, where a fresh connection says why the database refuses now (closed
    /// to connections, too many clients, a refused login) — or that it answers, and the pool
    /// replaces what it lost.
    async fn ping(&self) -> CatalogResult<()> {
        within(async {
            match tokio::time::timeout(PING_POOL_WAIT, sqlx::query(st::PING.pg).execute(&self.pool)).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) => tracing::debug!(error = %e, "a pooled connection failed the readiness ping; asking a connection of its own"),
                Err(_) => tracing::debug!("no pooled connection for the readiness ping within a second; asking a connection of its own"),
            }
            let mut own = self.pool.connect_options().connect().await?;
            let pinged = sqlx::query(st::PING.pg).execute(&mut own).await;
            let _ = own.close().await;
            pinged?;
            Ok(())
        })
        .await
    }

    async fn put_mcp_session(&self, id: &str, state: &str, now_ms: i64) -> CatalogResult<()> {
        within(async {
            sqlx::query(st::PUT_MCP_SESSION.pg).bind(id).bind(state).bind(now_ms).execute(&self.pool).await?;
            Ok(())
        })
        .await
    }

    async fn get_mcp_session(&self, id: &str, now_ms: i64) -> CatalogResult<Option<String>> {
        within(async { Ok(sqlx::query_scalar(st::GET_MCP_SESSION.pg).bind(now_ms).bind(id).fetch_optional(&self.pool).await?) }).await
    }

    async fn delete_mcp_session(&self, id: &str) -> CatalogResult<()> {
        within(async {
            sqlx::query(st::DELETE_MCP_SESSION.pg).bind(id).execute(&self.pool).await?;
            Ok(())
        })
        .await
    }

    async fn forget_mcp_sessions(&self, before_ms: i64) -> CatalogResult<u64> {
        within_for(SWEEP_DEADLINE, async { Ok(sqlx::query(st::FORGET_MCP_SESSIONS.pg).bind(before_ms).execute(&self.pool).await?.rows_affected()) })
            .await
    }

    async fn list_uploads_after(&self, after: &str, limit: u32) -> CatalogResult<Vec<UploadRecord>> {
        within(async {
            let rows = sqlx::query(st::LIST_UPLOADS_AFTER.pg).bind(after).bind(i64::from(limit)).fetch_all(&self.pool).await?;
            rows.iter().map(row_to_record).collect()
        })
        .await
    }

    async fn set_damage(&self, id: &str, damage: Option<&Damage>) -> CatalogResult<bool> {
        within(async {
            let done = match damage {
                Some(d) => sqlx::query(st::SET_DAMAGE.pg).bind(&d.kind).bind(&d.detail).bind(d.found_at_ms).bind(id).execute(&self.pool).await?,
                None => sqlx::query(st::CLEAR_DAMAGE.pg).bind(id).execute(&self.pool).await?,
            };
            sqlx::query(st::FORGET_CRC32.pg).bind(id).execute(&self.pool).await?;
            Ok(done.rows_affected() > 0)
        })
        .await
    }

    async fn damage(&self, id: &str) -> CatalogResult<Option<Damage>> {
        within(async {
            let row: Option<(String, String, i64)> = sqlx::query_as(st::DAMAGE.pg).bind(id).fetch_optional(&self.pool).await?;
            Ok(row.map(|(kind, detail, found_at_ms)| Damage { kind, detail, found_at_ms }))
        })
        .await
    }

    async fn set_final_failure(&self, id: &str, failure: &FinalFailure) -> CatalogResult<bool> {
        within(async {
            let done = sqlx::query(st::SET_FINAL_FAILURE.pg)
                .bind(&failure.code)
                .bind(&failure.detail)
                .bind(failure.failed_at_ms)
                .bind(id)
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected() > 0)
        })
        .await
    }

    async fn final_failure(&self, id: &str) -> CatalogResult<Option<FinalFailure>> {
        within(async {
            let row: Option<(String, String, i64)> = sqlx::query_as(st::FINAL_FAILURE.pg).bind(id).fetch_optional(&self.pool).await?;
            Ok(row.map(|(code, detail, failed_at_ms)| FinalFailure { code, detail, failed_at_ms }))
        })
        .await
    }

    async fn keep_crc32(&self, id: &str, crc32: u32) -> CatalogResult<bool> {
        within(async {
            let done = sqlx::query(st::KEEP_CRC32.pg).bind(i64::from(crc32)).bind(id).execute(&self.pool).await?;
            Ok(done.rows_affected() > 0)
        })
        .await
    }

    async fn crc32(&self, id: &str) -> CatalogResult<Option<u32>> {
        within(async {
            let row: Option<(i64,)> = sqlx::query_as(st::CRC32.pg).bind(id).fetch_optional(&self.pool).await?;
            Ok(row.and_then(|(v,)| u32::try_from(v).ok()))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redaction_hides_passwords() {
        assert_eq!(redact_url("postgres://ferry:s3cret@127.0.0.1:5432/db"), "postgres://ferry:***@127.0.0.1:5432/db");
        assert_eq!(redact_url("postgres://ferry@db/x?password=s3cret&sslmode=disable"), "postgres://ferry@db/x?password=***&sslmode=disable");
        assert_eq!(redact_url("postgres://db/x"), "postgres://db/x");
        assert!(!redact_url("postgres://a:b c@").contains("b c"));
    }
}
