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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_catalog_two_handles_on_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let a = SqliteCatalog::open(&path).await.unwrap();
    let b = SqliteCatalog::open(&path).await.unwrap();
    ferry::catalog::conformance::run_concurrent(&a, &b, "c").await;
}

#[tokio::test]
async fn fs_blob_store_conformance() {
    for durable in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path(), durable).unwrap();
        ferry::blob::conformance::run_all(&store, "ab").await;
    }
}
