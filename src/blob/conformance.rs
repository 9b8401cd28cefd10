//! The conformance suite every [`BlobStore`] backend must pass (fs, S3): plain async functions
//! over `&dyn BlobStore`. Each check panics on a violated guarantee.
//!
//! [`run_all`] holds for every store: bytes are read once [`BlobStore::finish`] made the blob
//! whole. [`run_unfinished_reads`] adds what only stores that can read unfinished blobs
//! promise (fs: reads, `len` and `truncate` of bytes not yet finished, an empty state at any
//! offset); S3 cannot serve bytes of an uncompleted multipart upload.

use bytes::Bytes;
use futures::TryStreamExt;

use super::{BlobError, BlobState, BlobStore, Unreferenced, WriteLease};

async fn read_all(store: &dyn BlobStore, id: &str, range: std::ops::Range<u64>) -> Vec<u8> {
    let s = store.read(id, range).await.expect("read");
    let chunks: Vec<Bytes> = s.try_collect().await.expect("read stream");
    chunks.concat()
}

/// Run every check that holds for every store; ids are `prefix` + a suffix (prefix: lowercase
/// letters/digits, ≥ 2 chars). Stores that cut blobs into parts should be configured with
/// parts of about 1 MiB here so [`check_parts_tails_resume`] crosses several of them.
pub async fn run_all(store: &dyn BlobStore, prefix: &str) {
    check_write_finish_read(store, prefix).await;
    check_rewind_then_finish(store, prefix).await;
    check_missing_and_ranges(store, prefix).await;
    check_blob_state_resume_and_finish(store, prefix).await;
    check_parts_tails_resume(store, prefix).await;
    check_delete_unfinished(store, prefix).await;
    check_inventory(store, prefix).await;
    store.ping().await.expect("ping");
}

/// The checks for stores that read unfinished blobs (fs): reads, `len` and `truncate` before
/// `finish`, and an empty state at a non-zero offset (the relaxed-durability repair).
pub async fn run_unfinished_reads(store: &dyn BlobStore, prefix: &str) {
    check_write_read(store, prefix).await;
    check_reopen_discards_garbage(store, prefix).await;
    check_rewind(store, prefix).await;
}

async fn put(w: &mut Box<dyn super::BlobWriter>, data: &[u8], r: std::ops::Range<u64>) {
    w.write(Bytes::copy_from_slice(&data[r.start as usize..r.end as usize])).await.unwrap()
}

fn pattern(range: std::ops::Range<u64>) -> Vec<u8> {
    range.map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

/// Write, sync, finish, then read whole and in ranges, concurrently.
pub async fn check_write_finish_read(store: &dyn BlobStore, p: &str) {
    let id = format!("{p}wfr");
    store.create(&id).await.unwrap();
    assert_eq!(store.len(&id).await.unwrap(), Some(0));
    let mut w = store.open_writer(&id, 0, &BlobState::default()).await.unwrap();
    let data = pattern(0..3_000_000);
    for chunk in data.chunks(70_000) {
        w.write(Bytes::copy_from_slice(chunk)).await.unwrap();
    }
    assert_eq!(w.position(), data.len() as u64);
    let st = w.sync().await.unwrap();
    drop(w);
    store.finish(&id, &st).await.unwrap();
    assert_eq!(store.len(&id).await.unwrap(), Some(data.len() as u64), "finish makes every byte visible");
    assert_eq!(read_all(store, &id, 0..data.len() as u64).await, data);
    assert_eq!(read_all(store, &id, 1_000_000..1_000_010).await, &data[1_000_000..1_000_010]);
    assert!(read_all(store, &id, 5..5).await.is_empty());
    assert!(matches!(store.read(&id, 0..3_000_001).await, Err(BlobError::OutOfRange { .. })));
    let (a, b) = futures::join!(read_all(store, &id, 0..10), read_all(store, &id, 10..20));
    assert_eq!((a.as_slice(), b.as_slice()), (&data[0..10], &data[10..20]));
    store.delete(&Unreferenced::vouched(&id)).await.unwrap();
    assert_eq!(store.len(&id).await.unwrap(), None, "deleted: gone");
}

/// Rewinds inside the unsynced bytes, then finish and read.
pub async fn check_rewind_then_finish(store: &dyn BlobStore, p: &str) {
    let id = format!("{p}rwf");
    store.create(&id).await.unwrap();
    let mut w = store.open_writer(&id, 0, &BlobState::default()).await.unwrap();
    w.write(Bytes::from(vec![1u8; 900_000])).await.unwrap();
    w.rewind(1_000).await.unwrap();
    w.write(Bytes::from_static(b"xyz")).await.unwrap();
    w.rewind(1_002).await.unwrap();
    let st = w.sync().await.unwrap();
    assert_eq!(w.position(), 1_002);
    drop(w);
    store.finish(&id, &st).await.unwrap();
    let got = read_all(store, &id, 0..1_002).await;
    assert_eq!(&got[998..], &[1, 1, b'x', b'y']);
    assert_eq!(store.len(&id).await.unwrap(), Some(1_002));
}

/// An upload of several parts written in uneven chunks with syncs that leave tails, a writer
/// dropped with unsynced and synced-but-uncommitted bytes, resume at the committed state, a
/// rewind back to the committed offset after more parts were sent (a chunk whose checksum
/// failed), then finish and ranged reads across every part boundary.
pub async fn check_parts_tails_resume(store: &dyn BlobStore, p: &str) {
    const MIB: u64 = 1 << 20;
    let id = format!("{p}parts");
    store.create(&id).await.unwrap();
    let data = pattern(0..7 * MIB + 12_345);
    let mut w = store.open_writer(&id, 0, &BlobState::default()).await.unwrap();
    let mut at = 0u64;
    let mut committed = (0u64, BlobState::default());
    for len in [300_000u64, 1_500_000, 77, 700_000, 10] {
        put(&mut w, &data, at..at + len).await;
        at += len;
        let st = w.sync().await.unwrap();
        committed = (at, st);
    }
    // Garbage after the committed state: a synced state nobody commits, then unsynced bytes.
    put(&mut w, &data, at..at + 2 * MIB).await;
    let _uncommitted = w.sync().await.unwrap();
    w.write(Bytes::from(vec![0xEE; 1_300_000])).await.unwrap();
    drop(w);

    let (off, st) = committed.clone();
    let mut w = store.open_writer(&id, off, &st).await.expect("resume at the committed state");
    assert_eq!(w.position(), off);
    put(&mut w, &data, off..off + 1_000_000).await;
    w.sync().await.unwrap();
    // More than a part past the last commit, then the chunk fails its checksum: back to it.
    w.write(Bytes::from(vec![0xAB; 2_500_000])).await.unwrap();
    w.rewind(off + 1_000_000).await.expect("rewind to the last synced offset");
    at = off + 1_000_000;
    for len in [333_333u64, 1_200_000] {
        put(&mut w, &data, at..at + len).await;
        at += len;
        w.sync().await.unwrap();
    }
    let rest = data.len() as u64;
    put(&mut w, &data, at..rest).await;
    let last = w.sync().await.unwrap();
    assert_eq!(w.position(), rest);
    drop(w);
    store.finish(&id, &last).await.expect("finish");
    assert_eq!(store.len(&id).await.unwrap(), Some(rest));
    assert_eq!(read_all(store, &id, 0..rest).await, data, "every byte, in order");
    for b in [MIB, 2 * MIB, 4 * MIB, 5 * MIB, 6 * MIB, 7 * MIB] {
        let r = b - 3..(b + 5).min(rest);
        assert_eq!(read_all(store, &id, r.clone()).await, &data[r.start as usize..r.end as usize], "range across {b}");
    }
    store.delete(&Unreferenced::vouched(&id)).await.unwrap();
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
    // A finished blob reopened at an earlier committed state (a job re-run after a crash
    // between finishing its file and checkpointing): the bytes before it are kept.
    let mut w = store.open_writer(&id, 3_000_000, &s1).await.expect("reopen a finished blob");
    assert_eq!(w.position(), 3_000_000);
    w.write(Bytes::from_static(b"TAIL!")).await.unwrap();
    let s3 = w.sync().await.unwrap();
    drop(w);
    store.finish(&id, &s3).await.expect("finish again");
    assert_eq!(store.len(&id).await.unwrap(), Some(3_000_005));
    let all = read_all(store, &id, 2_999_999..3_000_005).await;
    assert_eq!(all, b"\x07TAIL!");
    assert!(matches!(store.finish(&format!("{p}nostate"), &s2).await, Err(BlobError::NotFound)));
}

pub async fn check_delete_unfinished(store: &dyn BlobStore, p: &str) {
    let id = format!("{p}abort");
    store.create(&id).await.unwrap();
    let mut w = store.open_writer(&id, 0, &BlobState::default()).await.unwrap();
    w.write(Bytes::from_static(b"abc")).await.unwrap();
    w.sync().await.unwrap();
    drop(w);
    store.delete(&Unreferenced::vouched(&id)).await.unwrap();
    assert_eq!(store.len(&id).await.unwrap(), None, "an unfinished blob deleted: gone");
    store.delete(&Unreferenced::vouched(&id)).await.expect("delete is idempotent");
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
    // A writer whose lease ran out cuts nothing.
    let past = std::time::Instant::now();
    let lost = WriteLease { valid_until: std::sync::Arc::new(move || Some(past)), ..WriteLease::default() };
    assert!(matches!(store.truncate(&id, 2, &lost).await, Err(BlobError::LeaseLost)), "a truncate without the lease");
    assert_eq!(store.len(&id).await.unwrap(), Some(6), "a truncate without the lease cut nothing");
    store.truncate(&id, 2, &WriteLease::default()).await.unwrap();
    assert_eq!(store.len(&id).await.unwrap(), Some(2));
    store.truncate(&id, 10, &WriteLease::default()).await.unwrap();
    assert_eq!(store.len(&id).await.unwrap(), Some(2), "truncate never grows");
    // One writer at a time: the fs store keeps a second one out while the first has the file.
    drop(w);
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
    store.delete(&Unreferenced::vouched(&id)).await.expect("deleting an absent blob is Ok");
    store.create(&id).await.unwrap();
    assert!(matches!(store.read(&id, 0..1).await, Err(BlobError::OutOfRange { .. })));
    store.delete(&Unreferenced::vouched(&id)).await.unwrap();
    assert_eq!(store.len(&id).await.unwrap(), None);
}

/// [`BlobStore::inventory`] names a finished blob and an unfinished one (once each), and no
/// longer names a deleted one.
pub async fn check_inventory(store: &dyn BlobStore, p: &str) {
    let (done, open, gone) = (format!("{p}invdone"), format!("{p}invopen"), format!("{p}invgone"));
    for id in [&done, &open, &gone] {
        store.create(id).await.unwrap();
    }
    let data = pattern(0..1000);
    let mut w = store.open_writer(&done, 0, &super::BlobState::default()).await.unwrap();
    put(&mut w, &data, 0..1000).await;
    let st = w.sync().await.unwrap();
    w.complete().await.unwrap();
    drop(w);
    store.finish(&done, &st).await.unwrap();
    store.delete(&Unreferenced::vouched(&gone)).await.unwrap();
    let inv = store.inventory().await.unwrap();
    assert_eq!(inv.blobs.iter().filter(|b| **b == done).count(), 1, "{inv:?}");
    assert_eq!(inv.blobs.iter().filter(|b| **b == open).count(), 1, "{inv:?}");
    assert!(!inv.blobs.contains(&gone), "{inv:?}");
    assert!(inv.blobs.windows(2).all(|w| w[0] < w[1]), "sorted, each once");
    assert!(!inv.unfinished.contains(&done), "a finished blob keeps nothing of an unfinished one: {inv:?}");
    assert!(inv.unfinished.iter().all(|u| inv.blobs.contains(u)), "{inv:?}");
    store.delete(&Unreferenced::vouched(&done)).await.unwrap();
    store.delete(&Unreferenced::vouched(&open)).await.unwrap();
}
