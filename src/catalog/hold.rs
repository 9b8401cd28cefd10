//! One catalog, one kind of server (issue 23, kind 9). A server with `--leases local` keeps
//! upload leases (and, on SQLite, a read cache) in its own process, so it must be the catalog's
//! only server; servers with `--leases catalog` share it freely. Each server therefore holds a
//! lock on the catalog for its whole life — exclusive with local leases, shared with catalog
//! leases — and refuses to start when it cannot get it:
//! - SQLite: `flock` on a lock file beside the database (`ferry.db` → `ferry.db.lock`);
//! - PostgreSQL: a session advisory lock (`ferry.catalog`) on a connection of its own, checked
//!   every second and taken again if the connection was lost (a database restart, an
//!   administrator's `pg_terminate_backend`), so a wrongly configured server finds it held again
//!   within about a second.

use anyhow::Context;

use super::CatalogUrl;

/// The key of the PostgreSQL session advisory lock.
const PG_LOCK: &str = "ferry.catalog";

/// How often the PostgreSQL lock's connection is checked (and, if it was lost, the lock taken
/// again): one ping a second per server.
const PG_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a start waits for the PostgreSQL lock before refusing.
const PG_RESTART_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// A held catalog lock; released when dropped (or when the process ends).
pub enum CatalogHold {
    /// The locked file.
    File(#[allow(dead_code)] std::fs::File),
    /// The task that owns the locking connection (and keeps it alive).
    Postgres(tokio::task::JoinHandle<()>),
}

impl Drop for CatalogHold {
    fn drop(&mut self) {
        if let CatalogHold::Postgres(keeper) = self {
            keeper.abort();
        }
    }
}

fn refusal(catalog: &str, exclusive: bool, lock: &str) -> anyhow::Error {
    if exclusive {
        anyhow::anyhow!(
            "another ferry server uses the catalog {catalog} ({lock}); with --leases local a catalog has exactly one server: \
             stop the other one, give this one its own --catalog, or run every server on this catalog with --leases catalog"
        )
    } else {
        anyhow::anyhow!(
            "a ferry server with --leases local uses the catalog {catalog} ({lock}) and must be its only server: \
             stop it, or restart it with --leases catalog to share the catalog"
        )
    }
}

/// Connect and try the lock: the connection holding it, or None when another holds it.
async fn pg_lock(url: &str, shown: &str, exclusive: bool) -> anyhow::Result<Option<sqlx::PgConnection>> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.map_err(|e| anyhow::anyhow!("cannot connect to the catalog {shown}: {e}"))?;
    let sql = if exclusive {
        "SELECT pg_try_advisory_lock(hashtextextended($1, 0))"
    } else {
        "SELECT pg_try_advisory_lock_shared(hashtextextended($1, 0))"
    };
    let got: bool = sqlx::query_scalar(sql).bind(PG_LOCK).fetch_one(&mut conn).await.with_context(|| format!("locking the catalog {shown}"))?;
    Ok(got.then_some(conn))
}

/// Keep the lock's connection alive; when it is lost (a database restart), take the lock again.
async fn keep_pg_lock(mut conn: sqlx::PgConnection, url: String, shown: String, exclusive: bool) {
    use sqlx::Connection;
    loop {
        tokio::time::sleep(PG_CHECK).await;
        if conn.ping().await.is_ok() {
            continue;
        }
        tracing::warn!(catalog = shown, "the connection holding the catalog lock was lost; taking the lock again");
        // Each outcome is logged when it first happens, not at every attempt.
        let mut last: Option<bool> = None;
        loop {
            match pg_lock(&url, &shown, exclusive).await {
                Ok(Some(c)) => {
                    conn = c;
                    tracing::info!(catalog = shown, "the catalog lock is held again");
                    break;
                }
                Ok(None) if last != Some(true) => {
                    last = Some(true);
                    tracing::error!(catalog = shown, "{:#}", refusal(&shown, exclusive, "it took the lock while this server's connection was lost"));
                }
                Err(e) if last != Some(false) => {
                    last = Some(false);
                    tracing::warn!(catalog = shown, error = %format!("{e:#}"), "cannot take the catalog lock again yet; trying every second");
                }
                _ => {}
            }
            tokio::time::sleep(PG_CHECK).await;
        }
    }
}

impl CatalogUrl {
    /// Lock the catalog for this process: `exclusive` with local leases, shared otherwise.
    /// Errors: another server holds it in a way that conflicts (the message says what to do),
    /// or the lock cannot be taken at all.
    pub async fn hold(&self, exclusive: bool) -> anyhow::Result<CatalogHold> {
        let shown = self.redacted();
        match self {
            CatalogUrl::Sqlite(db) => {
                let mut name = db.file_name().map(|n| n.to_os_string()).unwrap_or_default();
                name.push(".lock");
                let path = db.with_file_name(name);
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
                }
                let f = crate::regular_file::open(std::fs::OpenOptions::new().create(true).truncate(false).write(true), &path)
                    .with_context(|| format!("opening {}", path.display()))?;
                let got = if exclusive { f.try_lock() } else { f.try_lock_shared() };
                match got {
                    Ok(()) => Ok(CatalogHold::File(f)),
                    Err(std::fs::TryLockError::WouldBlock) => Err(refusal(&shown, exclusive, &format!("it holds {}", path.display()))),
                    Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", path.display())),
                }
            }
            CatalogUrl::Postgres(url) => {
                // A server killed a moment ago holds the lock until the database notices its
                // connection is gone: a restart waits for that, briefly.
                let deadline = tokio::time::Instant::now() + PG_RESTART_GRACE;
                loop {
                    if let Some(conn) = pg_lock(url, &shown, exclusive).await? {
                        return Ok(CatalogHold::Postgres(tokio::spawn(keep_pg_lock(conn, url.clone(), shown, exclusive))));
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err(refusal(&shown, exclusive, "it holds the session advisory lock ferry.catalog"));
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                }
            }
        }
    }
}
