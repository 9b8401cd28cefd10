//! The Catalog and BlobStore conformance suites against the embedded backends.

use ferry::blob::{BlobStore, FsBlobStore, S3BlobStore};

#[path = "common/moto.rs"]
mod moto;
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
        ferry::blob::conformance::run_unfinished_reads(&store, "ab").await;
    }
}

/// The suite against S3 (moto), with 1 MiB parts so a few MiB cross several parts, tails and
/// folds; afterwards no multipart upload and no object is left in the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_blob_store_conformance() {
    const MIB: u64 = 1 << 20;
    let moto = moto::Moto::start("conf", MIB).await;
    moto.set_env();
    let store = S3BlobStore::from_url("s3://conf/some/prefix", MIB).unwrap();
    ferry::blob::conformance::run_all(&store, "ab").await;
    assert_eq!(moto.multipart_uploads("conf").await, Vec::<String>::new(), "every multipart upload completed or aborted");
    // What remains: the blobs the suite finished and did not delete.
    let keys = moto.keys("conf").await;
    assert!(keys.iter().all(|k| k.starts_with("some/prefix/") && !k.contains(".tail/") && !k.contains(".mpu/")), "{keys:?}");
    // A bucket that does not exist: ping fails, naming no secret.
    let bad = S3BlobStore::from_url("s3://no-such-bucket", MIB).unwrap();
    let err = bad.ping().await.expect_err("ping of a missing bucket").to_string();
    assert!(!err.contains("testing"), "{err}");
}
