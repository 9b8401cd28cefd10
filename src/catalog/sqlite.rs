//! The embedded [`Catalog`]: one SQLite file (`DATA/ferry.db`) in WAL mode with
//! `synchronous=FULL`, so a committed checkpoint survives power loss.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Row};

use super::{Catalog, CatalogError, CatalogResult, Checkpoint, Concat, CreationKey, KeyedCreate, UploadRecord};

/// SQLite-backed catalog.
#[derive(Clone)]
pub struct SqliteCatalog {
    pub(super) pool: SqlitePool,
}

impl From<sqlx::Error> for CatalogError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::RowNotFound => CatalogError::NotFound,
            sqlx::Error::Database(ref d) if d.is_unique_violation() => CatalogError::AlreadyExists,
            other => CatalogError::Backend(Box::new(other)),
        }
    }
}

const COLUMNS: &str = "id, principal, length, \"offset\", metadata, hash_state, sha256, expected_sha256, \
     concat_kind, concat_parts, concat_header, created_at_ms, updated_at_ms, expires_at_ms, \
     finished_at_ms, expired";

fn to_i64(v: u64) -> CatalogResult<i64> {
    i64::try_from(v).map_err(|_| CatalogError::Backend("value exceeds i64".into()))
}

fn digest32(v: Option<Vec<u8>>) -> CatalogResult<Option<[u8; 32]>> {
    v.map(|b| <[u8; 32]>::try_from(b.as_slice()).map_err(|_| CatalogError::Backend("stored digest is not 32 bytes".into()))).transpose()
}

fn row_to_record(r: &SqliteRow) -> CatalogResult<UploadRecord> {
    let kind: String = r.try_get("concat_kind")?;
    let concat = match kind.as_str() {
        "partial" => Concat::Partial,
        "final" => {
            let parts: String = r.try_get::<Option<String>, _>("concat_parts")?.unwrap_or_default();
            Concat::Final { parts: parts.split_whitespace().map(str::to_owned).collect(), header: r.try_get::<Option<String>, _>("concat_header")?.unwrap_or_default() }
        }
        _ => Concat::None,
    };
    Ok(UploadRecord {
        id: r.try_get("id")?,
        principal: r.try_get("principal")?,
        length: r.try_get::<Option<i64>, _>("length")?.map(|v| v as u64),
        offset: r.try_get::<i64, _>("offset")? as u64,
        metadata: r.try_get("metadata")?,
        hash_state: r.try_get("hash_state")?,
        sha256: digest32(r.try_get("sha256")?)?,
        expected_sha256: digest32(r.try_get("expected_sha256")?)?,
        concat,
        created_at_ms: r.try_get("created_at_ms")?,
        updated_at_ms: r.try_get("updated_at_ms")?,
        expires_at_ms: r.try_get("expires_at_ms")?,
        finished_at_ms: r.try_get("finished_at_ms")?,
        expired: r.try_get::<i64, _>("expired")? != 0,
    })
}

impl SqliteCatalog {
    /// Open (creating if missing) the database file and run pending migrations.
    pub async fn open(path: &Path) -> anyhow::Result<Self> {
        let opts = SqliteConnectOptions::new().filename(path).create_if_missing(true).synchronous(SqliteSynchronous::Full).busy_timeout(Duration::from_secs(10));
        Self::connect(opts, false).await
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
        let pool = SqlitePoolOptions::new().max_connections(if in_memory { 1 } else { 8 }).min_connections(1).idle_timeout(None).max_lifetime(None).connect_with(opts).await?;
        if in_memory {
            sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        }
        Ok(SqliteCatalog { pool })
    }

    async fn ids(&self, sql: &'static str, a: i64, limit: u32) -> CatalogResult<Vec<String>> {
        let rows = sqlx::query(sql).bind(a).bind(limit as i64).fetch_all(&self.pool).await?;
        rows.iter().map(|r| r.try_get::<String, _>(0).map_err(Into::into)).collect()
    }
}

impl SqliteCatalog {
    /// INSERT `rec`, holding `key` when given.
    async fn insert(&self, rec: &UploadRecord, key: Option<&CreationKey>) -> CatalogResult<()> {
        let (kind, parts, header) = match &rec.concat {
            Concat::None => ("none", None, None),
            Concat::Partial => ("partial", None, None),
            Concat::Final { parts, header } => ("final", Some(parts.join(" ")), Some(header.clone())),
        };
        sqlx::query(sqlx::AssertSqlSafe(format!("INSERT INTO uploads ({COLUMNS}, creation_key, creation_fingerprint) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")))
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
            .bind(rec.expired as i64)
            .bind(key.map(|k| k.key.as_str()))
            .bind(key.map(|k| k.fingerprint.as_str()))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The live upload of `principal` holding creation key `key`, with its fingerprint.
    async fn by_creation_key(&self, principal: &str, key: &str) -> CatalogResult<Option<(UploadRecord, String)>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS}, creation_fingerprint FROM uploads WHERE principal = ? AND creation_key = ? AND expired = 0")))
            .bind(principal)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok((row_to_record(&r)?, r.try_get::<Option<String>, _>("creation_fingerprint")?.unwrap_or_default()))).transpose()
    }
}

#[async_trait]
impl Catalog for SqliteCatalog {
    async fn create_upload(&self, rec: &UploadRecord) -> CatalogResult<()> {
        self.insert(rec, None).await
    }

    async fn create_upload_keyed(&self, rec: &UploadRecord, key: &CreationKey) -> CatalogResult<KeyedCreate> {
        // The partial unique index (principal, creation_key) WHERE live makes the insert the
        // arbiter: of concurrent inserts one wins, the others fail and read the winner.
        for _ in 0..3 {
            match self.insert(rec, Some(key)).await {
                Ok(()) => return Ok(KeyedCreate::Created),
                Err(CatalogError::AlreadyExists) => {
                    if let Some((upload, fingerprint)) = self.by_creation_key(&rec.principal, &key.key).await? {
                        return Ok(KeyedCreate::Existing { upload, fingerprint });
                    }
                    if self.get_upload(&rec.id).await?.is_some() {
                        return Err(CatalogError::AlreadyExists);
                    }
                    // The holder went away between the insert and the read: try again.
                }
                Err(e) => return Err(e),
            }
        }
        Err(CatalogError::Backend("creation key contended too long".into()))
    }

    async fn get_upload(&self, id: &str) -> CatalogResult<Option<UploadRecord>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM uploads WHERE id = ?"))).bind(id).fetch_optional(&self.pool).await?;
        row.as_ref().map(row_to_record).transpose()
    }

    async fn acquire_fence(&self, id: &str) -> CatalogResult<u64> {
        let row = sqlx::query("UPDATE uploads SET fence = fence + 1 WHERE id = ? RETURNING fence").bind(id).fetch_optional(&self.pool).await?;
        match row {
            Some(r) => Ok(r.try_get::<i64, _>(0)? as u64),
            None => Err(CatalogError::NotFound),
        }
    }

    async fn checkpoint(&self, id: &str, fence: u64, cp: &Checkpoint) -> CatalogResult<()> {
        let done = sqlx::query(
            "UPDATE uploads SET \"offset\" = ?, hash_state = ?, length = COALESCE(?, length), \
             sha256 = COALESCE(?, sha256), finished_at_ms = CASE WHEN ? IS NULL THEN finished_at_ms ELSE ? END, \
             expires_at_ms = CASE WHEN ? IS NULL THEN ? ELSE NULL END, updated_at_ms = ? \
             WHERE id = ? AND fence = ?",
        )
        .bind(to_i64(cp.offset)?)
        .bind(&cp.hash_state)
        .bind(cp.length.map(to_i64).transpose()?)
        .bind(cp.finished_sha256.map(|d| d.to_vec()))
        .bind(cp.finished_sha256.map(|d| d.to_vec()))
        .bind(cp.now_ms)
        .bind(cp.finished_sha256.map(|d| d.to_vec()))
        .bind(cp.expires_at_ms)
        .bind(cp.now_ms)
        .bind(id)
        .bind(to_i64(fence)?)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        match self.get_upload(id).await? {
            None => Err(CatalogError::NotFound),
            Some(_) => Err(CatalogError::Fenced),
        }
    }

    async fn mark_expired(&self, id: &str, now_ms: i64) -> CatalogResult<()> {
        let done = sqlx::query(
            "UPDATE uploads SET updated_at_ms = CASE WHEN expired = 1 THEN updated_at_ms ELSE ? END, \
             expired = 1, fence = fence + 1 WHERE id = ?",
        )
        .bind(now_ms)
        .bind(id)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            return Err(CatalogError::NotFound);
        }
        Ok(())
    }

    async fn delete_upload(&self, id: &str) -> CatalogResult<bool> {
        let done = sqlx::query("DELETE FROM uploads WHERE id = ?").bind(id).execute(&self.pool).await?;
        Ok(done.rows_affected() > 0)
    }

    async fn list_expired(&self, now_ms: i64, limit: u32) -> CatalogResult<Vec<String>> {
        self.ids(
            "SELECT id FROM uploads WHERE finished_at_ms IS NULL AND expired = 0 AND expires_at_ms <= ? \
             ORDER BY expires_at_ms LIMIT ?",
            now_ms,
            limit,
        )
        .await
    }

    async fn list_tombstones(&self, before_ms: i64, limit: u32) -> CatalogResult<Vec<String>> {
        self.ids("SELECT id FROM uploads WHERE expired = 1 AND updated_at_ms < ? LIMIT ?", before_ms, limit).await
    }

    async fn list_unfinished(&self) -> CatalogResult<Vec<UploadRecord>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} FROM uploads WHERE finished_at_ms IS NULL AND expired = 0"))).fetch_all(&self.pool).await?;
        rows.iter().map(row_to_record).collect()
    }

    async fn finals_waiting_on(&self, part_id: &str) -> CatalogResult<Vec<String>> {
        let rows = sqlx::query(
            "SELECT id, concat_parts FROM uploads WHERE concat_kind = 'final' AND finished_at_ms IS NULL \
             AND expired = 0 AND instr(concat_parts, ?) > 0",
        )
        .bind(part_id)
        .fetch_all(&self.pool)
        .await?;
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
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM uploads WHERE principal = ? AND expired = 0 \
             ORDER BY created_at_ms DESC LIMIT ?"
        )))
        .bind(principal)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(row_to_record).collect()
    }

    async fn ping(&self) -> CatalogResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}
