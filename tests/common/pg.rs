//! PostgreSQL for tests: a fresh database per test (`ferry_test_<pid>_<random>`), created
//! through the admin URL in `FERRY_TEST_PG` (default: the role `.ci/run` creates,
//! `postgres://ferry:ferry-ci@127.0.0.1:5432/postgres`).
//!
//! Without a reachable server the test fails at once with a message saying how to start one —
//! it never hangs and never passes silently. Databases are dropped when their [`TestDb`] is
//! dropped; databases of test processes that died (`kill`, a panic in a child) are dropped by
//! the next test that creates one.

use std::time::Duration;

use sqlx::{Connection, Executor, PgConnection};

/// The admin URL's default: the role and password `.ci/run` creates.
pub const DEFAULT_ADMIN_URL: &str = "postgres://ferry:ferry-ci@127.0.0.1:5432/postgres";

/// The admin URL (`FERRY_TEST_PG`, else [`DEFAULT_ADMIN_URL`]).
pub fn admin_url() -> String {
    std::env::var("FERRY_TEST_PG").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| DEFAULT_ADMIN_URL.to_string())
}

/// `url` with its password hidden.
pub fn redacted(url: &str) -> String {
    ferry::catalog::postgres::redact_url(url)
}

/// `admin` with its database replaced by `db`.
pub fn url_for(admin: &str, db: &str) -> String {
    let mut u = url::Url::parse(admin).expect("FERRY_TEST_PG is a URL");
    u.set_path(&format!("/{db}"));
    u.to_string()
}

async fn admin_connection() -> PgConnection {
    let admin = admin_url();
    let how = "start PostgreSQL 15 and create the test role as `.ci/run` does \
               (`pg_ctlcluster 15 main start`, then the `CREATE ROLE ferry … CREATEDB` step of .ci/run), \
               or point FERRY_TEST_PG at a role with CREATEDB";
    match tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(&admin)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => panic!("PostgreSQL for tests is not reachable at {} (FERRY_TEST_PG): {e}\n  → {how}", redacted(&admin)),
        Err(_) => panic!("PostgreSQL for tests did not answer within 10 s at {} (FERRY_TEST_PG)\n  → {how}", redacted(&admin)),
    }
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// A database that exists until this value is dropped.
pub struct TestDb {
    pub name: String,
    /// Connection URL of the database (with the admin role's password).
    pub url: String,
}

impl TestDb {
    /// Create a fresh, empty database.
    pub async fn create() -> TestDb {
        let mut conn = admin_connection().await;
        // Drop what earlier test processes left behind when they died.
        let names: Vec<String> = sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 'ferry\\_test\\_%'")
            .fetch_all(&mut conn)
            .await
            .expect("list databases");
        for old in names {
            let pid = old.strip_prefix("ferry_test_").and_then(|r| r.split('_').next()).and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|p| !pid_alive(p)) {
                let _ = conn.execute(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{old}\" WITH (FORCE)"))).await;
            }
        }
        let name = format!("ferry_test_{}_{:016x}", std::process::id(), rand::random::<u64>());
        conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e} (the role in FERRY_TEST_PG needs CREATEDB)"));
        let _ = conn.close().await;
        TestDb { url: url_for(&admin_url(), &name), name }
    }

    /// [`TestDb::create`] from synchronous code (it runs on its own thread and runtime, so it
    /// works inside a tokio test too).
    pub fn create_blocking() -> TestDb {
        std::thread::spawn(|| tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(TestDb::create()))
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }

    /// Drop a database by name (terminating its connections).
    pub fn drop_blocking(name: &str) {
        let name = name.to_string();
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async move {
                if let Ok(Ok(mut conn)) = tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(&admin_url())).await {
                    let _ = conn.execute(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))).await;
                    let _ = conn.close().await;
                }
            })
        })
        .join();
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        TestDb::drop_blocking(&self.name);
    }
}

/// Terminate every connection to `db` except the caller's (what a database restart does to
/// its clients).
pub async fn terminate_backends(db: &str) -> u64 {
    let mut conn = admin_connection().await;
    let n: Vec<bool> = sqlx::query_scalar("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()")
        .bind(db)
        .fetch_all(&mut conn)
        .await
        .expect("terminate");
    let _ = conn.close().await;
    n.len() as u64
}
