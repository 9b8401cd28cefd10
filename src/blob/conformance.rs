//! The conformance suite every [`BlobStore`] backend must pass (fs now; S3 later): plain async
//! functions over `&dyn BlobStore`. Each check panics on a violated guarantee.

use bytes::Bytes;
use futures::TryStreamExt;

use super::{BlobError, BlobState, BlobStore};

async fn read_all(store: &dyn BlobStore, id: &str, range: std::ops::Range<u64>) -> Vec<u8> {
    let s = store.read(id, range).await.expect("read");
    let chunks: Vec<Bytes> = s.try_collect().await.expect("read stream");
    chunks.concat()
}

/// Run every check; ids are `prefix` + a suffix (prefix: lowercase letters/digits, ≥ 2 chars).
pub async fn run_all(store: &dyn BlobStore, prefix: &str) {
    check_write_read(store, prefix).await;
    check_reopen_discards_garbage(store, prefix).await;
    check_rewind(store, prefix).await;
    check_missing_and_ranges(store, prefix).await;
    check_blob_state_resume_and_finish(store, prefix).await;
    check_abort(store, prefix).await;
    store.ping().await.expect("ping");
}

/// Writes return a state describing exactly the synced bytes; reopening at that state resumes
/// there; `finish` makes the object whole.
pub async fn check_blob_state_resume_and_finish(store: &dyn BlobStore, p: &str) {
    let id = format!("{p}state");
    store.create(&id).await.unwrap();
    let mut w = store.open_writer(&id, 0, &BlobState::default()).await.unwrap();
    w.write(Bytes::from(vec![7u8; 3_000_000])).await.unwrap();
    let s1 = w.sync().await.unwrap();
    assert!(!s1.as_bytes().is_empty(), "a sync returns a non-empty state");
    w.write(Bytes::from_static(b"garbage past the checkpoint")).await.unwrap();
    let pending = w.start_sync().await.unwrap();
    let s_garbage = pending.await.unwrap();
    assert_ne!(s_garbage, s1, "a state describes exactly the bytes it covers");
    drop(w);
    // Resume at the committed state: the bytes past it are not part of the blob.
    let mut w = store.open_writer(&id, 3_000_000, &s1).await.expect("resume at the committed state");
    assert_eq!(w.position(), 3_000_000);
    assert!(matches!(store.open_writer(&id, 5, &s1).await, Err(BlobError::BadState)), "a state for another offset is refused");
    w.write(Bytes::from_static(b"tail")).await.unwrap();
    let s2 = w.sync().await.unwrap();
    drop(w);
    store.finish(&id, &s2).await.expect("finish");
    store.finish(&id, &s2).await.expect("finish is idempotent");
    let all = read_all(store, &id, 0..3_000_004).await;
    assert_eq!(&all[2_999_998..], &[7, 7, b't', b'a', b'i', b'l']);
    assert!(matches!(store.finish(&format!("{p}nostate"), &s2).await, Err(BlobError::NotFound)));
}

pub async fn check_abort(store: &dyn BlobStore, p: &str) {
    let id = format!("{p}abort");
    store.create(&id).await.unwrap();
    let mut w = store.open_writer(&id, 0, &BlobState::default()).await.unwrap();
    w.write(Bytes::from_static(b"abc")).await.unwrap();
    w.sync().await.unwrap();
    drop(w);
    store.abort(&id).await.unwrap();
    assert_eq!(store.len(&id).await.unwrap(), None, "aborted: gone");
    store.abort(&id).await.expect("abort is idempotent");
}

pub async fn check_write_read(store: &dyn BlobStore, p: &str) {
    let id = format!("{p}writeread");
    store.create(&id).await.unwrap();
    assert_eq!(store.len(&id).await.unwrap(), Some(0));
    let mut w = store.open_writer(&id, 0, &BlobState::default()).await.unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    for chunk in data.chunks(70_000) {
        w.write(Bytes::copy_from_slice(chunk)).await.unwrap();
    }
    assert_eq!(w.position(), data.len() as u64);
    w.sync().await.unwrap();
    drop(w);
    assert_eq!(store.len(&id).await.unwrap(), Some(data.len() as u64), "sync makes every byte visible");
    assert_eq!(read_all(store, &id, 0..data.len() as u64).await, data);
    assert_eq!(read_all(store, &id, 1_000_000..1_000_010).await, &data[1_000_000..1_000_010]);
    assert!(read_all(store, &id, 5..5).await.is_empty());
    // Concurrent readers do not block each other.
    let (a, b) = futures::join!(read_all(store, &id, 0..10), read_all(store, &id, 10..20));
    assert_eq!((a.as_slice(), b.as_slice()), (&data[0..10], &data[10..20]));
}

pub async fn check_reopen_discards_garbage(store: &dyn BlobStore, p: &str) {
    let id = format!("{p}reopen");
    store.create(&id).await.unwrap();
    let mut w = store.open_writer(&id, 0, &BlobState::default()).await.unwrap();
    w.write(Bytes::from_static(b"hello world")).await.unwrap();
    w.sync().await.unwrap();
    drop(w);
    let mut w = store.open_writer(&id, 5, &BlobState::default()).await.unwrap();
    assert_eq!(w.position(), 5);
    w.write(Bytes::from_static(b"!")).await.unwrap();
    w.sync().await.unwrap();
    assert_eq!(read_all(store, &id, 0..6).await, b"hello!");
    assert_eq!(store.len(&id).await.unwrap(), Some(6));
    store.truncate(&id, 2).await.unwrap();
    assert_eq!(store.len(&id).await.unwrap(), Some(2));
    store.truncate(&id, 10).await.unwrap();
    assert_eq!(store.len(&id).await.unwrap(), Some(2), "truncate never grows");
    assert!(matches!(store.open_writer(&id, 3, &BlobState::default()).await, Err(BlobError::OutOfRange { .. })), "offset past the end");
    store.create(&id).await.unwrap();
    assert_eq!(store.len(&id).await.unwrap(), Some(0), "create resets");
}

pub async fn check_rewind(store: &dyn BlobStore, p: &str) {
    let id = format!("{p}rewind");
    store.create(&id).await.unwrap();
    let mut w = store.open_writer(&id, 0, &BlobState::default()).await.unwrap();
    w.write(Bytes::from(vec![1u8; 2_500_000])).await.unwrap();
    w.rewind(1_000).await.unwrap();
    w.write(Bytes::from_static(b"xyz")).await.unwrap();
    w.rewind(1_002).await.unwrap();
    w.sync().await.unwrap();
    assert_eq!(w.position(), 1_002);
    drop(w);
    let got = read_all(store, &id, 0..1_002).await;
    assert_eq!(&got[998..], &[1, 1, b'x', b'y']);
    assert_eq!(store.len(&id).await.unwrap(), Some(1_002));
}

pub async fn check_missing_and_ranges(store: &dyn BlobStore, p: &str) {
    let id = format!("{p}missing");
    assert_eq!(store.len(&id).await.unwrap(), None);
    assert!(matches!(store.open_writer(&id, 0, &BlobState::default()).await, Err(BlobError::NotFound)));
    assert!(matches!(store.read(&id, 0..0).await, Err(BlobError::NotFound)));
    store.delete(&id).await.expect("deleting an absent blob is Ok");
    store.create(&id).await.unwrap();
    assert!(matches!(store.read(&id, 0..1).await, Err(BlobError::OutOfRange { .. })));
    store.delete(&id).await.unwrap();
    assert_eq!(store.len(&id).await.unwrap(), None);
}
