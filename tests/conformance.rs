//! The Catalog and BlobStore conformance suites against every backend: SQLite (file and
//! memory) and PostgreSQL (a fresh database per test, via `FERRY_TEST_PG`; see
//! tests/common/pg.rs), plus the races between two handles on one database (two pools —
//! what two processes have).

mod common;

use std::sync::Arc;

use common::pg::TestDb;
use common::s3::TestS3;
use ferry::blob::{BlobStore, FsBlobStore, S3BlobStore, Unreferenced};
use ferry::catalog::{Catalog, PostgresCatalog, SqliteCatalog};

#[tokio::test]
async fn sqlite_catalog_conformance() {
    let dir = tempfile::tempdir().unwrap();
    let cat = SqliteCatalog::open(&dir.path().join("ferry.db")).await.unwrap();
    ferry::catalog::conformance::run_all(&cat, "t").await;
    let mem = SqliteCatalog::in_memory().await.unwrap();
    ferry::catalog::conformance::run_all(&mem, "m").await;
}

/// The read cache of tasks and finished uploads (`ferry serve` with in-process leases) passes the
/// whole suite: every read the suite makes after a write sees that write.
#[tokio::test]
async fn sqlite_catalog_conformance_with_read_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cat = SqliteCatalog::open(&dir.path().join("ferry.db")).await.unwrap().with_read_cache();
    ferry::catalog::conformance::run_all(&cat, "t").await;
}

/// Readers keep filling the task read cache while a writer updates one task's progress; after
/// each update returns, a read sees that update (never a row a reader fetched before it
/// committed and cached afterwards).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_read_cache_never_serves_a_row_older_than_a_finished_write() {
    use ferry::catalog::{NewTask, Progress, TaskCatalog, TaskUpdate};
    let dir = tempfile::tempdir().unwrap();
    let cat = Arc::new(SqliteCatalog::open(&dir.path().join("ferry.db")).await.unwrap().with_read_cache());
    let id = "t".repeat(26);
    let new =
        NewTask { id: id.clone(), principal: "p".into(), kind: "k".into(), args: "{}".into(), idempotency_key: None, ttl_ms: 60_000, now_ms: 0 };
    cat.start_task(&new).await.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (cat, id, stop) = (cat.clone(), id.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    cat.get_task(&id).await.unwrap().unwrap();
                    n += 1;
                    // A cache hit completes without awaiting anything: let the writer run.
                    tokio::task::yield_now().await;
                }
                n
            })
        })
        .collect();
    for i in 1..=300u64 {
        let progress = Progress { message: Some(format!("step {i}")), ..Progress::default() };
        cat.update_task(&id, None, &TaskUpdate { progress: Some(progress), checkpoint: None, partial_mark: None, now_ms: i as i64 }).await.unwrap();
        let seen = cat.get_task(&id).await.unwrap().unwrap();
        assert_eq!(seen.progress.message.as_deref(), Some(format!("step {i}").as_str()), "read after update {i}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut reads = 0;
    for r in readers {
        reads += r.await.unwrap();
    }
    assert!(reads > 0, "the readers ran");
    let cancelled = cat.cancel_task(&id, 1000).await.unwrap();
    assert_eq!(cancelled.status, ferry::catalog::TaskStatus::Cancelled);
    assert_eq!(cat.get_task(&id).await.unwrap().unwrap().status, ferry::catalog::TaskStatus::Cancelled);
}

/// A write whose caller stops waiting after one poll (a client gone mid-request drops the
/// handler's future) still runs to its end, and the read cache forgets the row only after it
/// landed: readers spinning on the same tasks throughout never get to keep the row as it was
/// before, so every task reads as cancelled once the write is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_cache_sees_a_write_whose_caller_stopped_waiting() {
    use ferry::catalog::{NewTask, TaskCatalog, TaskStatus};
    let dir = tempfile::tempdir().unwrap();
    let cat = Arc::new(SqliteCatalog::open(&dir.path().join("ferry.db")).await.unwrap().with_read_cache());
    let ids: Vec<String> = (0..40).map(|i| format!("{i:0>26}")).collect();
    for id in &ids {
        let new =
            NewTask { id: id.clone(), principal: "p".into(), kind: "k".into(), args: "{}".into(), idempotency_key: None, ttl_ms: 60_000, now_ms: 0 };
        cat.start_task(&new).await.unwrap();
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (cat, ids, stop) = (cat.clone(), ids.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for id in &ids {
                        cat.get_task(id).await.unwrap().unwrap();
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for id in &ids {
        // Polled once, then dropped.
        let _ = tokio::time::timeout(std::time::Duration::ZERO, cat.cancel_task(id, 1_000)).await;
    }
    for id in &ids {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while cat.get_task(id).await.unwrap().unwrap().status != TaskStatus::Cancelled {
            assert!(std::time::Instant::now() < deadline, "task {id}: the abandoned cancel never showed");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_catalog_two_handles_on_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let a = SqliteCatalog::open(&path).await.unwrap();
    let b = SqliteCatalog::open(&path).await.unwrap();
    ferry::catalog::conformance::run_concurrent(&a, &b, "c").await;
    ferry::catalog::conformance_race::run_all(Arc::new(a), Arc::new(b), "r").await;
}

#[tokio::test]
async fn postgres_catalog_conformance() {
    let db = TestDb::create().await;
    let cat = PostgresCatalog::connect(&db.url).await.unwrap();
    ferry::catalog::conformance::run_all(&cat, "t").await;
    cat.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_catalog_two_handles_on_one_database() {
    let db = TestDb::create().await;
    let a = PostgresCatalog::connect(&db.url).await.unwrap();
    let b = PostgresCatalog::connect(&db.url).await.unwrap();
    ferry::catalog::conformance::run_concurrent(&a, &b, "c").await;
    let (a, b) = (Arc::new(a), Arc::new(b));
    ferry::catalog::conformance_race::run_all(a.clone(), b.clone(), "r").await;
    a.close().await;
    b.close().await;
}

/// The connections kept aside for the statements every PATCH runs are closed once idle, as
/// the pool's own are: a replica without traffic does not hold them.
#[tokio::test]
async fn postgres_kept_connections_close_when_idle() {
    let db = TestDb::create().await;
    let cat = PostgresCatalog::connect(&db.url).await.unwrap();
    let backends = || async {
        let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&common::pg::admin_url()).await.unwrap();
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'ferry'")
            .bind(&db.name)
            .fetch_one(&mut admin)
            .await
            .unwrap();
        n
    };
    // A release is one of those statements; its connection is kept afterwards.
    cat.release_upload_lease("nosuchupload", 1).await.unwrap();
    let before = backends().await;
    assert!(before >= 1, "the kept connection is open");
    cat.close_idle_kept(std::time::Duration::ZERO);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while backends().await >= before {
        assert!(std::time::Instant::now() < deadline, "the kept connection was never closed ({before} backends)");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The next statement takes a connection from the pool again.
    cat.release_upload_lease("nosuchupload", 1).await.unwrap();
    cat.close().await;
}

/// Replicas starting together on an empty database migrate it once (sqlx's advisory lock)
/// and all come up; a second start finds the schema current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_starting_at_once_migrate_once() {
    let db = TestDb::create().await;
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let url = db.url.clone();
            tokio::spawn(async move { PostgresCatalog::connect(&url).await })
        })
        .collect();
    let mut cats = Vec::new();
    for s in starts {
        cats.push(s.await.unwrap().expect("every replica starts"));
    }
    let again = PostgresCatalog::connect(&db.url).await.expect("restart on a migrated database");
    again.ping().await.unwrap();
    for c in cats.iter().chain([&again]) {
        c.close().await;
    }
}

/// Connections the database drops (a restart, `pg_terminate_backend`) are replaced: the next
/// calls succeed without a new catalog handle, and a release-request stream keeps delivering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_catalog_reconnects_after_its_connections_are_terminated() {
    use futures::StreamExt;
    let db = TestDb::create().await;
    let cat = PostgresCatalog::connect(&db.url).await.unwrap();
    let mut requests = cat.release_requests().await.unwrap();
    cat.ping().await.unwrap();
    assert!(common::pg::terminate_backends(&db.name).await >= 1, "the pool and the listener had connections");
    // The first call after the kill may fail on a connection that died under it (503 to a
    // client); within a few calls the pool has fresh ones.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match cat.ping().await {
            Ok(()) => break,
            Err(e) => assert!(std::time::Instant::now() < deadline, "the pool never reconnected: {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The listener reconnects too: a request sent after that arrives. A send may still meet a
    // pooled connection whose backend was ending while the pings above went through
    // (`pg_terminate_backend` only signals it): such a call fails once, and the next is sent.
    let got = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            if let Err(e) = cat.request_release("after-restart", "test").await {
                eprintln!("request_release after the termination: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
            if let Ok(Some(r)) = tokio::time::timeout(std::time::Duration::from_millis(500), requests.next()).await {
                if r.upload_id == "after-restart" {
                    return r.upload_id;
                }
            }
        }
    })
    .await
    .expect("the release-request stream delivers again after its connection was terminated");
    assert_eq!(got, "after-restart");
    drop(requests);
    cat.close().await;
}

#[tokio::test]
async fn fs_blob_store_conformance() {
    // `inline`: opens (and reads from the page cache) on the async thread, as on a local disk,
    // or always on blocking threads, as on a network filesystem.
    for (durable, direct, inline) in [(true, true, true), (false, true, true), (true, false, true), (true, true, false)] {
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path(), durable).unwrap().with_direct_writes(direct).with_inline_opens(inline);
        ferry::blob::conformance::run_all(&store, "ab").await;
        ferry::blob::conformance::run_unfinished_reads(&store, "ab").await;
    }
}

/// The suite against S3 (moto, or a prefix in `FERRY_TEST_S3_BUCKET`: Garage in `.ci/run`), with
/// 1 MiB parts so a few MiB cross several parts, tails and folds; afterwards no multipart upload
/// and no object is left in the bucket.
/// Issue 47, point 1: a composer that stalled past its lease (a PostgreSQL link that hung,
/// SIGSTOP, a VM pause) changes nothing, and no composition ever removes a finished final —
/// not even one that runs after the client removed the partials (`ferry upload --parallel`
/// does), which before issue 47 deleted the final's object first and left its bytes nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_blob_store_a_stale_composer_never_erases_a_finished_final() {
    use ferry::blob::{BlobError, BlobState, WriteLease};
    const MIB: u64 = 1 << 20;
    let s3 = TestS3::start("compose", 5 * MIB).await;
    s3.set_env();
    let store = S3BlobStore::from_url(&s3.url("stale/compose"), 5 * MIB).unwrap();
    let (mut sources, mut all) = (Vec::new(), Vec::new());
    for (i, n) in [6 * MIB + 1, 5 * MIB].into_iter().enumerate() {
        let id = format!("src{i}");
        let data: Vec<u8> = (0..n).map(|b| ((b * 31 + i as u64) % 251) as u8).collect();
        store.create(&id).await.unwrap();
        let mut w = store.open_writer(&id, 0, &BlobState::default()).await.unwrap();
        w.write(bytes::Bytes::from(data.clone())).await.unwrap();
        let state = w.sync().await.unwrap();
        drop(w);
        store.finish(&id, &state).await.unwrap();
        sources.push((id, n));
        all.extend_from_slice(&data);
    }
    let read = |id: &'static str| {
        let store = store.clone();
        async move {
            let len = store.len(id).await.unwrap().expect("the final exists");
            let s = store.read(id, 0..len).await.expect("the final reads");
            let chunks: Vec<bytes::Bytes> = futures::TryStreamExt::try_collect(s).await.expect("read stream");
            chunks.concat()
        }
    };
    store.create("fin").await.unwrap();
    let live = WriteLease::default();
    assert!(store.compose("fin", &sources, &live).await.unwrap(), "composed inside S3");
    assert!(read("fin").await == all, "the composed final");

    let stale = WriteLease { valid_until: Arc::new(|| Some(std::time::Instant::now() - std::time::Duration::from_secs(1))), ..WriteLease::default() };
    assert!(matches!(store.compose("fin", &sources, &stale).await, Err(BlobError::LeaseLost)), "a composer without its lease is refused");
    assert!(store.reset("fin", &stale).await.is_err(), "a reset without the lease is refused");
    assert!(read("fin").await == all, "the final is untouched");

    for (id, _) in &sources {
        store.delete(&Unreferenced::vouched(id)).await.unwrap();
    }
    let late = store.compose("fin", &sources, &live).await;
    assert!(late.is_err(), "its sources are gone: {late:?}");
    assert!(read("fin").await == all, "a composition after the partials were removed left the finished final whole");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_blob_store_conformance() {
    const MIB: u64 = 1 << 20;
    let s3 = TestS3::start("conf", MIB).await;
    s3.set_env();
    let store = S3BlobStore::from_url(&s3.url("some/prefix"), MIB).unwrap();
    ferry::blob::conformance::run_all(&store, "ab").await;
    // Two processes finishing the same committed state at once (a reader on each replica
    // completing an upload whose finish was interrupted), then a third time: all succeed and
    // the object is whole.
    let other = S3BlobStore::from_url(&s3.url("some/prefix"), MIB).unwrap();
    let data: Vec<u8> = (0..2 * MIB + 12_345).map(|i| (i * 7 % 251) as u8).collect();
    store.create("race").await.unwrap();
    let mut w = store.open_writer("race", 0, &ferry::blob::BlobState::default()).await.unwrap();
    w.write(bytes::Bytes::from(data.clone())).await.unwrap();
    let state = w.sync().await.unwrap();
    drop(w);
    let (a, b) = tokio::join!(store.finish("race", &state), other.finish("race", &state));
    // moto (not S3) sometimes answers 500 to two uploads of one part number at once; ferry
    // turns a store error into 503 and the reader asks again, so a finisher refused that way
    // must succeed when it tries again. Any other error fails the test.
    for (who, r, s) in [("first finisher", a, &store), ("second finisher", b, &other)] {
        match r {
            Ok(()) => {}
            Err(ferry::blob::BlobError::Unavailable(e)) => {
                eprintln!("{who}: {e}; trying again");
                s.finish("race", &state).await.expect(who);
            }
            Err(e) => panic!("{who}: {e:?}"),
        }
    }
    store.finish("race", &state).await.expect("finish again");
    let got: Vec<bytes::Bytes> = futures::TryStreamExt::try_collect(store.read("race", 0..data.len() as u64).await.unwrap()).await.unwrap();
    assert_eq!(got.concat(), data);
    store.delete(&Unreferenced::vouched("race")).await.unwrap();
    assert_eq!(s3.multipart_uploads().await, Vec::<String>::new(), "every multipart upload completed or aborted");
    // A finish that completed the object and was cut off before its last clean-up step (seen on
    // Garage under load: the DELETE of `.created` answered 500): the catalog still has the upload
    // unfinished at its full offset, with a state naming tails that are gone. The next writer
    // only finishes the clean-up, and the object stays whole.
    store.create("cut").await.unwrap();
    let mut w = store.open_writer("cut", 0, &ferry::blob::BlobState::default()).await.unwrap();
    w.write(bytes::Bytes::from(data.clone())).await.unwrap();
    let cut_state = w.sync().await.unwrap();
    drop(w);
    store.finish("cut", &cut_state).await.unwrap();
    s3.config.call("PUT", &format!("/{}/{}", s3.bucket, s3.key("some/prefix/cut.created")), &[]).await;
    let mut w = store.open_writer("cut", data.len() as u64, &cut_state).await.expect("a writer after a cut-off clean-up");
    w.complete().await.expect("the clean-up finishes");
    drop(w);
    let got: Vec<bytes::Bytes> = futures::TryStreamExt::try_collect(store.read("cut", 0..data.len() as u64).await.unwrap()).await.unwrap();
    assert_eq!(got.concat(), data);
    assert!(!s3.keys().await.iter().any(|k| k.starts_with("some/prefix/cut.")), "the clean-up left nothing but the object");
    store.delete(&Unreferenced::vouched("cut")).await.unwrap();
    // What remains: the blobs the suite finished and did not delete.
    let keys = s3.keys().await;
    assert!(keys.iter().all(|k| k.starts_with("some/prefix/") && !k.contains(".tail/") && !k.contains(".mpu/")), "{keys:?}");
    // A bucket that does not exist: ping fails, naming no secret.
    let bad = S3BlobStore::from_url("s3://no-such-bucket", MIB).unwrap();
    let err = bad.ping().await.expect_err("ping of a missing bucket").to_string();
    assert!(!err.contains(&s3.config.secret_access_key), "{err}");
}

/// PostgreSQL takes the outbox lock (`ferry.outbox`, which makes event seqs commit order) last:
/// a transaction that has made a change with an event and goes on working (a creation's quota
/// `SUM` over the principal's uploads) does not hold it, so another principal's change does not
/// wait for that transaction; its events still come in commit order, with the change's facts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outbox_lock_is_taken_at_commit() {
    use ferry::catalog::{Concat, EventCatalog, UploadRecord};
    let rec = |id: &str, principal: &str| UploadRecord {
        id: id.into(),
        principal: principal.into(),
        length: Some(5),
        offset: 0,
        metadata: String::new(),
        hash_state: Vec::new(),
        sha256: None,
        expected_sha256: None,
        concat: Concat::None,
        created_at_ms: 1_000,
        updated_at_ms: 1_000,
        expires_at_ms: None,
        finished_at_ms: None,
        expired: false,
        blob_state: Vec::new(),
        provisional: false,
    };
    let db = TestDb::create().await;
    let cat = PostgresCatalog::connect(&db.url).await.unwrap();
    cat.create_upload(&rec("outboxa", "alice")).await.unwrap();
    let mut tx = cat.pool().begin().await.unwrap();
    sqlx::query("UPDATE uploads SET expired = TRUE WHERE id = 'outboxa'").execute(&mut *tx).await.unwrap();
    sqlx::query("SELECT COUNT(*) FROM uploads WHERE principal = 'alice'").execute(&mut *tx).await.unwrap(); // still working
    let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtextextended('ferry.outbox', 0))").fetch_one(cat.pool()).await.unwrap();
    assert!(free, "a transaction still working after its change holds the outbox lock");
    tokio::time::timeout(std::time::Duration::from_secs(5), cat.create_upload(&rec("outboxb", "bob")))
        .await
        .expect("another principal's creation waited for a transaction it shares nothing with")
        .unwrap();
    tx.commit().await.unwrap();
    let all = cat.list_events(None, 0, 100).await.unwrap();
    let order: Vec<(&str, &str)> = all.iter().map(|e| (e.event_type.as_str(), e.subject.as_str())).collect();
    assert_eq!(order, vec![("upload.created", "outboxa"), ("upload.created", "outboxb"), ("upload.expired", "outboxa")], "commit order");
    let body: serde_json::Value = serde_json::from_str(&all[2].body).unwrap();
    assert_eq!((body["upload"].as_str(), body["length"].as_i64()), (Some("outboxa"), Some(5)));
    cat.close().await;
}
