//! Links as catalog records (issue 51): a **share** of several files or a **request** for
//! several files, opened by a person at `/l/{id}`. Unlike a signed URL (`crate::signing`),
//! a link has state: a passphrase hash, a download count, a revocation. Every catalog backend
//! provides [`LinkCatalog`]; both pass `conformance_links`.
//!
//! **Counting.** [`LinkCatalog::take_download`] and [`LinkCatalog::take_file_slot`] are each
//! one compare-and-set `UPDATE … WHERE downloads < max_downloads` (or `files_added <
//! max_files`): replicas sharing a catalog never hand out more than the limit between them.

use async_trait::async_trait;

use super::dialect::{sql, Stmt};
use super::{CatalogError, CatalogResult, PostgresCatalog, SqliteCatalog};

/// What a link is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    /// Its files are downloaded by whoever opens it.
    Share,
    /// Whoever opens it uploads files into it (owned by the link's principal).
    Request,
}

impl LinkKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkKind::Share => "share",
            LinkKind::Request => "request",
        }
    }

    fn parse(s: &str) -> CatalogResult<LinkKind> {
        match s {
            "share" => Ok(LinkKind::Share),
            "request" => Ok(LinkKind::Request),
            other => Err(CatalogError::Backend(format!("a link row has kind {other:?}").into())),
        }
    }
}

/// An argon2 PHC string (`$argon2id$v=19$…`). Its `Debug` never shows it, so a record logged
/// whole does not leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct PassphraseHash(pub String);

impl std::fmt::Debug for PassphraseHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PassphraseHash(..)")
    }
}

/// One link's row and its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkRecord {
    /// Random, unguessable, URL-safe (26 lowercase base32 characters, 128 bits).
    pub id: String,
    /// Who made it: a share's files are this principal's; a request's files become its.
    pub principal: String,
    pub kind: LinkKind,
    /// File (upload) ids in order: a share's from its creation, a request's as they arrive.
    pub files: Vec<String>,
    /// Shown first on the page; may be empty.
    pub message: String,
    pub passphrase_hash: Option<PassphraseHash>,
    /// A share's download limit (`None`: no limit).
    pub max_downloads: Option<u32>,
    /// Downloads counted so far.
    pub downloads: u32,
    /// A request's most files (a share: its file count).
    pub max_files: u32,
    /// Unix ms.
    pub expires_at_ms: i64,
    /// Unix ms; `None` while not revoked.
    pub revoked_at_ms: Option<i64>,
    /// Unix ms.
    pub created_at_ms: i64,
}

impl LinkRecord {
    /// Whether every download allowed was taken.
    pub fn used_up(&self) -> bool {
        self.max_downloads.is_some_and(|m| self.downloads >= m)
    }
}

/// Links in the catalog. Every method is one statement or one transaction.
#[async_trait]
pub trait LinkCatalog: Send + Sync {
    /// Insert a link and its files. Errors: `AlreadyExists` for a taken id.
    async fn create_link(&self, link: &LinkRecord) -> CatalogResult<()>;

    /// The link with its files in order; `None` for an unknown id (revoked and expired links
    /// are returned: the caller says why they no longer work).
    async fn get_link(&self, id: &str) -> CatalogResult<Option<LinkRecord>>;

    /// A principal's links, newest first, at most `limit`.
    async fn list_links(&self, principal: &str, limit: u32) -> CatalogResult<Vec<LinkRecord>>;

    /// Revoke `principal`'s link at `now_ms` (a revoked link keeps its first revocation time).
    /// `false`: no such link of this principal.
    async fn revoke_link(&self, principal: &str, id: &str, now_ms: i64) -> CatalogResult<bool>;

    /// Count one download, atomically: `true` when the link is live at `now_ms` (not revoked,
    /// not expired) and below its limit (or has none); `false` changes nothing.
    async fn take_download(&self, id: &str, now_ms: i64) -> CatalogResult<bool>;

    /// Take one file slot of a live request link, atomically: its position (0-based) for
    /// [`LinkCatalog::record_link_file`], or `None` when the link is full, revoked, expired,
    /// unknown or a share. A slot taken and never recorded stays taken.
    async fn take_file_slot(&self, id: &str, now_ms: i64) -> CatalogResult<Option<u32>>;

    /// Record the file created for a slot [`LinkCatalog::take_file_slot`] handed out.
    async fn record_link_file(&self, id: &str, position: u32, file_id: &str) -> CatalogResult<()>;

    /// The link a file arrived through (or was shared in first), if any.
    async fn link_of_file(&self, file_id: &str) -> CatalogResult<Option<String>>;
}

/// The columns a link row is read with, in [`link_from`]'s order.
macro_rules! link_columns {
    () => {
        "id, principal, kind, message, passphrase_hash, max_downloads, downloads, max_files, expires_at_ms, revoked_at_ms, created_at_ms"
    };
}

const INSERT_LINK: Stmt = sql!("INSERT INTO links (", link_columns!(), ", files_added) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)");
const INSERT_FILE: Stmt = sql!("INSERT INTO link_files (link_id, position, file_id) VALUES (?,?,?)");
const GET_LINK: Stmt = sql!("SELECT ", link_columns!(), " FROM links WHERE id = ?");
const LINK_FILES: Stmt = sql!("SELECT file_id FROM link_files WHERE link_id = ? ORDER BY position");
/// (principal, limit).
const LIST_LINKS: Stmt = sql!("SELECT ", link_columns!(), " FROM links WHERE principal = ? ORDER BY created_at_ms DESC, id LIMIT ?");
/// (now_ms, principal, id).
const REVOKE: Stmt = sql!("UPDATE links SET revoked_at_ms = COALESCE(revoked_at_ms, ?) WHERE principal = ? AND id = ?");
/// (id, now_ms).
const TAKE_DOWNLOAD: Stmt = sql!(
    "UPDATE links SET downloads = downloads + 1 WHERE id = ? AND revoked_at_ms IS NULL AND expires_at_ms > ? \
     AND (max_downloads IS NULL OR downloads < max_downloads)"
);
/// (id, now_ms) → files_added after the take.
const TAKE_SLOT: Stmt = sql!(
    "UPDATE links SET files_added = files_added + 1 WHERE id = ? AND kind = 'request' AND revoked_at_ms IS NULL \
     AND expires_at_ms > ? AND files_added < max_files RETURNING files_added"
);
const LINK_OF_FILE: Stmt = sql!("SELECT link_id FROM link_files WHERE file_id = ? ORDER BY link_id LIMIT 1");

type LinkRow = (String, String, String, String, Option<String>, Option<i64>, i64, i64, i64, Option<i64>, i64);

fn count(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}

fn link_from(row: LinkRow, files: Vec<String>) -> CatalogResult<LinkRecord> {
    let (id, principal, kind, message, hash, max_downloads, downloads, max_files, expires_at_ms, revoked_at_ms, created_at_ms) = row;
    Ok(LinkRecord {
        id,
        principal,
        kind: LinkKind::parse(&kind)?,
        files,
        message,
        passphrase_hash: hash.map(PassphraseHash),
        max_downloads: max_downloads.map(count),
        downloads: count(downloads),
        max_files: count(max_files),
        expires_at_ms,
        revoked_at_ms,
        created_at_ms,
    })
}

/// Binds a link's columns to `INSERT_LINK`, on either backend.
macro_rules! bind_link {
    ($q:expr, $l:expr) => {
        $q.bind(&$l.id)
            .bind(&$l.principal)
            .bind($l.kind.as_str())
            .bind(&$l.message)
            .bind($l.passphrase_hash.as_ref().map(|h| h.0.as_str()))
            .bind($l.max_downloads.map(i64::from))
            .bind(i64::from($l.downloads))
            .bind(i64::from($l.max_files))
            .bind($l.expires_at_ms)
            .bind($l.revoked_at_ms)
            .bind($l.created_at_ms)
            .bind(if $l.kind == LinkKind::Share { $l.files.len() as i64 } else { 0 })
    };
}

/// A unique-key violation is a taken id.
fn taken(e: sqlx::Error) -> CatalogError {
    match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => CatalogError::AlreadyExists,
        _ => e.into(),
    }
}

#[async_trait]
impl LinkCatalog for SqliteCatalog {
    async fn create_link(&self, link: &LinkRecord) -> CatalogResult<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        bind_link!(sqlx::query(INSERT_LINK.sqlite), link).execute(&mut *tx).await.map_err(taken)?;
        for (i, f) in link.files.iter().enumerate() {
            sqlx::query(INSERT_FILE.sqlite).bind(&link.id).bind(i as i64).bind(f).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn get_link(&self, id: &str) -> CatalogResult<Option<LinkRecord>> {
        let Some(row) = sqlx::query_as::<_, LinkRow>(GET_LINK.sqlite).bind(id).fetch_optional(&self.pool).await? else {
            return Ok(None);
        };
        let files = sqlx::query_scalar(LINK_FILES.sqlite).bind(id).fetch_all(&self.pool).await?;
        link_from(row, files).map(Some)
    }

    async fn list_links(&self, principal: &str, limit: u32) -> CatalogResult<Vec<LinkRecord>> {
        let rows: Vec<LinkRow> = sqlx::query_as(LIST_LINKS.sqlite).bind(principal).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let files = sqlx::query_scalar(LINK_FILES.sqlite).bind(&row.0).fetch_all(&self.pool).await?;
            out.push(link_from(row, files)?);
        }
        Ok(out)
    }

    async fn revoke_link(&self, principal: &str, id: &str, now_ms: i64) -> CatalogResult<bool> {
        Ok(sqlx::query(REVOKE.sqlite).bind(now_ms).bind(principal).bind(id).execute(&self.pool).await?.rows_affected() > 0)
    }

    async fn take_download(&self, id: &str, now_ms: i64) -> CatalogResult<bool> {
        Ok(sqlx::query(TAKE_DOWNLOAD.sqlite).bind(id).bind(now_ms).execute(&self.pool).await?.rows_affected() > 0)
    }

    async fn take_file_slot(&self, id: &str, now_ms: i64) -> CatalogResult<Option<u32>> {
        let rows: Vec<i64> = sqlx::query_scalar(TAKE_SLOT.sqlite).bind(id).bind(now_ms).fetch_all(&self.pool).await?;
        Ok(super::sqlite::first(rows).map(|n| count(n - 1)))
    }

    async fn record_link_file(&self, id: &str, position: u32, file_id: &str) -> CatalogResult<()> {
        sqlx::query(INSERT_FILE.sqlite).bind(id).bind(i64::from(position)).bind(file_id).execute(&self.pool).await.map_err(taken)?;
        Ok(())
    }

    async fn link_of_file(&self, file_id: &str) -> CatalogResult<Option<String>> {
        Ok(sqlx::query_scalar(LINK_OF_FILE.sqlite).bind(file_id).fetch_optional(&self.pool).await?)
    }
}

#[async_trait]
impl LinkCatalog for PostgresCatalog {
    async fn create_link(&self, link: &LinkRecord) -> CatalogResult<()> {
        super::postgres::within(async {
            let mut tx = self.pool.begin().await?;
            bind_link!(sqlx::query(INSERT_LINK.pg), link).execute(&mut *tx).await.map_err(taken)?;
            for (i, f) in link.files.iter().enumerate() {
                sqlx::query(INSERT_FILE.pg).bind(&link.id).bind(i as i64).bind(f).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn get_link(&self, id: &str) -> CatalogResult<Option<LinkRecord>> {
        super::postgres::within(async {
            let Some(row) = sqlx::query_as::<_, LinkRow>(GET_LINK.pg).bind(id).fetch_optional(&self.pool).await? else {
                return Ok(None);
            };
            let files = sqlx::query_scalar(LINK_FILES.pg).bind(id).fetch_all(&self.pool).await?;
            link_from(row, files).map(Some)
        })
        .await
    }

    async fn list_links(&self, principal: &str, limit: u32) -> CatalogResult<Vec<LinkRecord>> {
        super::postgres::within(async {
            let rows: Vec<LinkRow> = sqlx::query_as(LIST_LINKS.pg).bind(principal).bind(i64::from(limit)).fetch_all(&self.pool).await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let files = sqlx::query_scalar(LINK_FILES.pg).bind(&row.0).fetch_all(&self.pool).await?;
                out.push(link_from(row, files)?);
            }
            Ok(out)
        })
        .await
    }

    async fn revoke_link(&self, principal: &str, id: &str, now_ms: i64) -> CatalogResult<bool> {
        super::postgres::within(async {
            Ok(sqlx::query(REVOKE.pg).bind(now_ms).bind(principal).bind(id).execute(&self.pool).await?.rows_affected() > 0)
        })
        .await
    }

    async fn take_download(&self, id: &str, now_ms: i64) -> CatalogResult<bool> {
        super::postgres::within(async { Ok(sqlx::query(TAKE_DOWNLOAD.pg).bind(id).bind(now_ms).execute(&self.pool).await?.rows_affected() > 0) })
            .await
    }

    async fn take_file_slot(&self, id: &str, now_ms: i64) -> CatalogResult<Option<u32>> {
        super::postgres::within(async {
            let n: Option<i64> = sqlx::query_scalar(TAKE_SLOT.pg).bind(id).bind(now_ms).fetch_optional(&self.pool).await?;
            Ok(n.map(|n| count(n - 1)))
        })
        .await
    }

    async fn record_link_file(&self, id: &str, position: u32, file_id: &str) -> CatalogResult<()> {
        super::postgres::within(async {
            sqlx::query(INSERT_FILE.pg).bind(id).bind(i64::from(position)).bind(file_id).execute(&self.pool).await.map_err(taken)?;
            Ok(())
        })
        .await
    }

    async fn link_of_file(&self, file_id: &str) -> CatalogResult<Option<String>> {
        super::postgres::within(async { Ok(sqlx::query_scalar(LINK_OF_FILE.pg).bind(file_id).fetch_optional(&self.pool).await?) }).await
    }
}
