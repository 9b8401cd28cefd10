//! A writer that lost its upload lease can never add bytes afterwards (DESIGN §2 "upload
//! leases": the fence is checked before each batch of bytes becomes part of the upload).
//!
//! Two upload engines with catalog leases share one SQLite catalog file and one blob directory,
//! as two replicas would. Engine A runs on its own single-threaded runtime; its request body
//! blocks that thread mid-upload — like `SIGSTOP`, nothing of A runs, not even its lease
//! heartbeat. Its lease expires on the database clock, engine B takes the upload over (repairing
//! the blob A left) and commits its own bytes. When A wakes, its next bytes are refused: the
//! blob and the catalog hold exactly B's bytes.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use ferry::blob::{BlobStore, FsBlobStore};
use ferry::catalog::{Catalog, SqliteCatalog};
use ferry::error::Refusal;
use ferry::metrics::Metrics;
use ferry::upload::locks::{CatalogLeaseConfig, CatalogLocker};
use ferry::upload::{ChunkError, ChunkStream, EngineConfig, UploadEngine, WholeChunk};
use ferry_tus::{CreationPlan, PatchPlan, UploadState};
use futures::TryStreamExt;

const MIB: usize = 1 << 20;

/// A body that sends `first`, then blocks its thread for `pause` (the whole runtime stops),
/// then sends `second`. Tells `paused` when the pause begins.
struct PausingBody {
    first: Option<Bytes>,
    second: Option<Bytes>,
    pause: Duration,
    paused: Option<std::sync::mpsc::Sender<()>>,
}

impl futures::Stream for PausingBody {
    type Item = Result<Bytes, ChunkError>;

    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(b) = self.first.take() {
            return Poll::Ready(Some(Ok(b)));
        }
        if let Some(tx) = self.paused.take() {
            let _ = tx.send(());
            std::thread::sleep(self.pause); // the process is "stopped"
        }
        Poll::Ready(self.second.take().map(Ok))
    }
}

impl ChunkStream for PausingBody {}

async fn engine(dir: &std::path::Path, owner: &str) -> Arc<UploadEngine> {
    let catalog: Arc<dyn Catalog> = Arc::new(SqliteCatalog::open(&dir.join("shared.db")).await.unwrap());
    let blobs = Arc::new(FsBlobStore::open(&dir.join("blobs"), true).unwrap());
    let locker = CatalogLocker::start(
        catalog.clone(),
        CatalogLeaseConfig { owner: owner.into(), ttl: Duration::from_secs(1), retry: Duration::from_millis(50) },
    )
    .await
    .unwrap();
    let cfg = EngineConfig { takeover_wait: Duration::from_secs(20), ..EngineConfig::default() };
    UploadEngine::with_locker(catalog, blobs, cfg, Arc::new(Metrics::default()), Arc::new(locker))
}

fn at_durable_offset(st: &UploadState) -> Result<PatchPlan, Refusal> {
    let length = st.length.expect("length known");
    Ok(PatchPlan {
        offset: st.offset,
        set_length: None,
        length: Some(length),
        max_bytes: length - st.offset,
        checksum: None,
        checksum_in_trailer: false,
        completes: false,
    })
}

#[test]
fn a_paused_writer_never_adds_bytes_after_losing_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let b = rt.block_on(engine(dir.path(), "replica-b"));
    let plan = CreationPlan {
        length: Some(8 * MIB as u64),
        metadata: Default::default(),
        concat: None,
        expected_sha256: None,
        with_body: false,
        checksum: None,
    };
    let id = rt.block_on(b.create("p", &plan, "")).unwrap().id;

    // Replica A: 3 MiB (written to the blob as one batch), then paused 4 s (lease: 1 s), then
    // 3 MiB more.
    let (paused_tx, paused_rx) = std::sync::mpsc::channel();
    let (dir_a, id_a) = (dir.path().to_path_buf(), id.clone());
    let a = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let a = engine(&dir_a, "replica-a").await;
            let body = PausingBody {
                first: Some(Bytes::from(vec![b'A'; 3 * MIB])),
                second: Some(Bytes::from(vec![b'a'; 3 * MIB])),
                pause: Duration::from_secs(4),
                paused: Some(paused_tx),
            };
            a.append("p".into(), id_a, at_durable_offset, body).await
        })
    });
    paused_rx.recv().expect("A started and paused");

    // Replica B takes the lease once A's has expired on the database clock, but A still has the
    // blob file open (it may be between its lease check and a write): B's writer cannot attach
    // (503, retryable, nothing written) until A wakes, finds its lease lost and lets go. Then B
    // commits 1 MiB.
    let mine = vec![b'B'; MIB];
    let mut refused = 0;
    let got = loop {
        match rt.block_on(b.append("p".into(), id.clone(), at_durable_offset, WholeChunk::from(mine.clone()))) {
            Ok(got) => break got,
            Err(e) if e.status == 503 || e.status == 423 => {
                refused += u32::from(e.status == 503);
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("B takes the upload over: {e:?}"),
        }
    };
    assert!(refused > 0, "B attached to the file while the paused writer still had it open");
    assert_eq!(got.offset, MIB as u64, "B's bytes start at the durable offset 0: A committed nothing");

    // A woke: its next bytes were refused, nothing of it reaches the upload.
    let a_result = a.join().unwrap();
    let err = a_result.expect_err("the paused writer must not succeed");
    assert_eq!(err.status, 409, "A learns it lost the upload: {err:?}");

    rt.block_on(async {
        let rec = b.get("p", &id).await.unwrap();
        assert_eq!(rec.offset, MIB as u64, "the catalog holds B's offset");
        let blobs = FsBlobStore::open(&dir.path().join("blobs"), true).unwrap();
        assert_eq!(blobs.len(&id).await.unwrap(), Some(MIB as u64), "no byte of A landed after B's commit");
        let stored: Vec<Bytes> = blobs.read(&id, 0..MIB as u64).await.unwrap().try_collect().await.unwrap();
        assert!(stored.concat() == mine, "bytes [0, offset) are B's, byte for byte");
    });
}

/// In-process leases keep an upload's fence from one writer to the next, so each PATCH makes
/// one catalog commit (its checkpoint) instead of two; but a kept fence that has since grown in
/// the catalog (expiry, another writer) is never used to commit: that PATCH is refused (409)
/// and adds nothing, and the next one takes a fresh fence.
#[tokio::test]
async fn a_kept_fence_saves_a_commit_per_patch_and_never_outlives_a_newer_fence() {
    let dir = tempfile::tempdir().unwrap();
    let catalog: Arc<dyn Catalog> = Arc::new(SqliteCatalog::open(&dir.path().join("ferry.db")).await.unwrap());
    let blobs = Arc::new(FsBlobStore::open(&dir.path().join("blobs"), true).unwrap());
    let e = UploadEngine::new(catalog.clone(), blobs, EngineConfig::default(), Arc::new(Metrics::default()));
    let plan = CreationPlan {
        length: Some(4 * MIB as u64),
        metadata: Default::default(),
        concat: None,
        expected_sha256: None,
        with_body: false,
        checksum: None,
    };
    let id = e.create("p", &plan, "").await.unwrap().id;
    let chunk = |b: u8| WholeChunk::from(vec![b; MIB]);
    for i in 0..3u8 {
        let rec = e.append("p".into(), id.clone(), at_durable_offset, chunk(i)).await.unwrap();
        assert_eq!(rec.offset, (i as u64 + 1) * MIB as u64);
    }
    // Three PATCHes took one fence between them: the next one handed out is 2.
    assert_eq!(catalog.acquire_fence(&id).await.unwrap(), 2, "the fence grew once for three PATCHes");
    // That made the kept fence (1) stale: the next PATCH must not commit with it.
    let err = e.append("p".into(), id.clone(), at_durable_offset, chunk(9)).await.expect_err("a stale fence never commits");
    assert_eq!(err.status, 409, "{err:?}");
    assert_eq!(e.get("p", &id).await.unwrap().offset, 3 * MIB as u64, "the refused PATCH added nothing");
    // The stale fence was forgotten: the retry takes a fresh one and completes the upload.
    let rec = e.append("p".into(), id.clone(), at_durable_offset, chunk(3)).await.unwrap();
    assert_eq!(rec.offset, 4 * MIB as u64);
    assert!(rec.is_finished());
    let stored: Vec<Bytes> =
        FsBlobStore::open(&dir.path().join("blobs"), true).unwrap().read(&id, 0..4 * MIB as u64).await.unwrap().try_collect().await.unwrap();
    let want: Vec<u8> = [0u8, 1, 2, 3].iter().flat_map(|b| vec![*b; MIB]).collect();
    assert!(stored.concat() == want, "bytes [0, 4 MiB) are the four accepted chunks");
}
