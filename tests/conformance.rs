//! The Catalog and BlobStore conformance suites against the embedded backends.

use ferry::blob::FsBlobStore;
use ferry::catalog::SqliteCatalog;

#[tokio::test]
async fn sqlite_catalog_conformance() {
    let dir = tempfile::tempdir().unwrap();
    let cat = SqliteCatalog::open(&dir.path().join("ferry.db")).await.unwrap();
    ferry::catalog::conformance::run_all(&cat, "t").await;
    let mem = SqliteCatalog::in_memory().await.unwrap();
    ferry::catalog::conformance::run_all(&mem, "m").await;
}

#[tokio::test]
async fn fs_blob_store_conformance() {
    for durable in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path(), durable).unwrap();
        ferry::blob::conformance::run_all(&store, "ab").await;
    }
}
