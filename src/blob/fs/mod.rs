//! The embedded [`BlobStore`]: one file per upload under `DATA/blobs/xx/<id>`.
//!
//! **Writes** are pipelined: [`BlobWriter::write`] only gathers the `Bytes` it is given (no
//! copy) until [`WRITE_BATCH`] bytes are pending, then hands them to one `writev` on a blocking
//! thread and returns at once, so the caller receives and hashes the next batch while this one
//! is written. At most one batch is in the kernel's hands at a time (writes stay in order and
//! memory stays bounded: ≤ 2 batches per writer). In durable mode each written batch also
//! starts the disk's writeback (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, Linux), so the
//! `fdatasync` of a checkpoint finds little left to do. [`BlobWriter::start_sync`] runs that
//! `fdatasync` on its own blocking thread while later batches keep being written; it covers
//! every byte written before it started (POSIX), which is all the caller commits.
//!
//! **Direct writes** (the default on Linux; [`FsBlobStore::with_direct_writes`]): each batch
//! goes to the disk with `O_DIRECT` from an aligned copy instead of through the page cache
//! (`super::direct`): the kernel's copy into the page cache cost about as much CPU as the
//! sha256. No writeback hint is needed then; the `fdatasync` still makes the blob's length and
//! the disk's cache durable. A just-finished blob is then read from the disk, not the cache.
//!
//! A writer dropped with a batch still being written leaves that write in the store's list of
//! stray writes; `create`, `open_writer`, `truncate` and `delete` of the same blob wait for
//! them first, so a late write can never land after a newer writer cut the file.
//!
//! **Reads** open and read the first chunk in one blocking call, then `pread` [`READ_CHUNK`]-sized
//! chunks one ahead of the consumer (the next read runs while hyper sends the current chunk).
//! On a local disk the open and as much of the first [`INLINE_READ`] bytes as the page cache
//! holds are read on the request's own thread instead (`preadv2` with `RWF_NOWAIT`, which
//! never waits on the disk); only what the cache lacks goes to a blocking thread. A chunk the
//! cache lacks first asks the kernel for the next [`READ_AHEAD`] bytes of the range at once
//! (`POSIX_FADV_WILLNEED`): the disk then works on many MiB while hyper sends, instead of the
//! 128 KiB the kernel's own read-ahead asks for at a time.
//! Chunk buffers are recycled: a chunk's memory goes back to a small pool once hyper has sent
//! it, so steady-state reads touch no fresh pages (no page faults, no zeroing) — one copy.
//!
//! This file holds the store itself (layout, creation, deletion, the stray-write bookkeeping and
//! the [`BlobStore`] methods); the write half is `write.rs` (the writer, its batches and syncs), the
//! read half `read.rs` (chunk pool, page-cache reads, read-ahead); the `O_DIRECT` staging both
//! writes use is `super::direct`.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{IoSlice, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{FutureExt, Stream};
use tokio::task::JoinHandle;

use super::direct::Direct;

mod read;
mod write;
use super::{BlobError, BlobResult, BlobState, BlobStore, BlobWriter, ByteStream, SyncFuture, Unreferenced, WriteLease};
use read::*;
use write::*;

/// Bytes gathered before one `writev` is issued.
pub const WRITE_BATCH: usize = 2 << 20;
/// Size of the chunks a read streams.
pub const READ_CHUNK: usize = 2 << 20;
/// Bytes past a chunk the page cache lacks that a read asks the kernel to read in the
/// background ([`will_need`]), within the range read: eight chunks.
pub const READ_AHEAD: u64 = 16 << 20;
/// Bytes at most that a read takes from the page cache on the request's thread (a copy of
/// ≈ 50 µs) before the rest goes through blocking threads.
pub const INLINE_READ: usize = 1 << 20;

/// Files under a root directory.
#[derive(Debug, Clone)]
pub struct FsBlobStore {
    root: PathBuf,
    durable: bool,
    /// Writers write with `O_DIRECT` where the filesystem takes it.
    direct: bool,
    /// Writers' files are opened on the async thread when nothing there can wait
    /// ([`FsBlobStore::with_inline_opens`]).
    open_inline: bool,
    stray: Arc<StrayWrites>,
    /// Fan-out directories (`xx/`) whose entry in `root` this process made durable.
    synced_dirs: Arc<Mutex<std::collections::HashSet<PathBuf>>>,
}

/// Writes still running for writers that were dropped, by blob path.
#[derive(Debug, Default)]
struct StrayWrites(Mutex<HashMap<PathBuf, Vec<JoinHandle<std::io::Result<()>>>>>);

impl StrayWrites {
    fn add(&self, path: PathBuf, h: JoinHandle<std::io::Result<()>>) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, hs| {
            hs.retain(|h| !h.is_finished());
            !hs.is_empty()
        });
        map.entry(path).or_default().push(h);
    }

    /// Wait until no stray write to `path` is running.
    async fn settle(&self, path: &Path) {
        let hs = self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(path).unwrap_or_default();
        for h in hs {
            let _ = h.await;
        }
    }
}

/// Run blocking file I/O off the async threads.
async fn blocking<T: Send + 'static, E: Into<BlobError> + Send + 'static>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> BlobResult<T> {
    joined(tokio::task::spawn_blocking(f).await)
}

fn joined<T, E: Into<BlobError>>(r: Result<Result<T, E>, tokio::task::JoinError>) -> BlobResult<T> {
    match r {
        // A BlobError carried inside an io::Error (the lease check on the writing thread)
        // comes back as itself.
        Ok(r) => r.map_err(|e| match e.into() {
            BlobError::Io(io) => BlobError::from_stream(io),
            other => other,
        }),
        Err(join) => Err(BlobError::Io(std::io::Error::other(join))),
    }
}

/// An open's error as the store's: no file, or something that is not a regular file where the
/// blob should be (a FIFO, a directory: [`crate::regular_file`]), is [`BlobError::NotFound`].
fn not_found(e: std::io::Error) -> BlobError {
    if e.kind() == std::io::ErrorKind::NotFound || crate::regular_file::is_not_regular(&e) {
        BlobError::NotFound
    } else {
        BlobError::Io(e)
    }
}

impl FsBlobStore {
    /// Use (creating) `root`. `durable = false` skips every fsync but those of the directories
    /// at opening and of a finished blob ([`BlobWriter::complete`]).
    pub fn open(root: &Path, durable: bool) -> std::io::Result<Self> {
        not_a_directory(root)?;
        // Also in relaxed mode: once per start, and finished blobs rely on it.
        create_dir_all_synced(root)?;
        Ok(FsBlobStore {
            root: root.to_path_buf(),
            durable,
            direct: cfg!(target_os = "linux"),
            open_inline: on_local_disk(root),
            stray: Arc::default(),
            synced_dirs: Arc::default(),
        })
    }

    /// The same store writing blobs with `O_DIRECT` (`true`, the default on Linux, where the
    /// filesystem takes it) or through the page cache (`false`: `--buffered-writes`).
    pub fn with_direct_writes(mut self, on: bool) -> Self {
        self.direct = on && cfg!(target_os = "linux");
        self
    }

    /// Open writers' files on the request's own thread when the open cannot wait (`true`):
    /// the file's writer lock is free and nothing past the offset needs cutting, else the open
    /// goes to a blocking thread as always. Where an open is a few local system calls, this saves
    /// a PATCH a hand-off to the blocking pool and back (issue 24: 0.03–0.1 ms of CPU and 3
    /// context switches per PATCH). [`FsBlobStore::open`] turns it on for a root on a local disk
    /// filesystem ([`on_local_disk`]), never for a network one (NFS, SMB, FUSE…), whose opens
    /// are round trips. Reads then also open on the request's thread and take the range's
    /// first [`INLINE_READ`] bytes there as far as the page cache holds them.
    pub fn with_inline_opens(mut self, on: bool) -> Self {
        self.open_inline = on;
        self
    }

    /// Path of the blob for `id`. Ids are validated by the caller; this rejects anything but
    /// `[a-z0-9_-]` defensively so no id can name another path.
    fn path(&self, id: &str) -> std::io::Result<PathBuf> {
        if id.len() < 3 || !id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_') {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "invalid blob id"));
        }
        Ok(self.root.join(&id[..2]).join(id))
    }
}

/// Refuse a blob directory that is something else already — a file, or a symbolic link to
/// nothing — naming it (`create_dir_all` would only say "File exists").
fn not_a_directory(root: &Path) -> std::io::Result<()> {
    let Ok(link) = std::fs::symlink_metadata(root) else { return Ok(()) };
    let why = match std::fs::metadata(root) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => "is a file, not a directory".to_string(),
        Err(_) if link.file_type().is_symlink() => {
            format!("is a symbolic link to {}, which does not exist", std::fs::read_link(root).map(|t| t.display().to_string()).unwrap_or_default())
        }
        Err(e) => return Err(e),
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("the blob directory {} {why}: give --blobs a directory (it is created if missing)", root.display()),
    ))
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `create_dir_all`, and the name of every directory it created made durable: each one's
/// parent is fsynced, and so is `path`'s parent even when `path` already existed (a process
/// that crashed after creating it may not have synced it). A new directory's entry lives in
/// its parent, which only a directory fsync makes durable (POSIX; `tests/power_loss.rs` loses
/// it otherwise). Errors: those of `create_dir_all` and `fsync`.
pub fn create_dir_all_synced(path: &Path) -> std::io::Result<()> {
    let missing: Vec<&Path> = path.ancestors().take_while(|p| !p.as_os_str().is_empty() && !p.exists()).collect();
    std::fs::create_dir_all(path)?;
    let mut parents: Vec<&Path> = missing.iter().filter_map(|p| p.parent()).collect();
    parents.extend(path.parent());
    parents.dedup();
    for parent in parents.into_iter().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(())
}

#[async_trait]
impl BlobStore for FsBlobStore {
    fn checkpoints_unsynced(&self) -> bool {
        !self.durable
    }

    /// Committed bytes are in the file, in place: a follower reads them as they come.
    fn reads_unfinished(&self) -> bool {
        true
    }

    async fn held_past(&self, id: &str, offset: u64) -> u64 {
        match self.len(id).await {
            Ok(Some(len)) => len.saturating_sub(offset),
            _ => 0,
        }
    }

    async fn inventory(&self) -> BlobResult<super::Inventory> {
        let root = self.root.clone();
        blocking(move || -> std::io::Result<super::Inventory> {
            let mut blobs = Vec::new();
            for dir in std::fs::read_dir(&root)? {
                let dir = dir?;
                if !dir.file_type()?.is_dir() {
                    continue;
                }
                let prefix = dir.file_name();
                for f in std::fs::read_dir(dir.path())? {
                    let f = f?;
                    let name = f.file_name();
                    let Some(name) = name.to_str() else { continue };
                    // Only `xx/<id>` where xx is the id's start: anything else is not a blob.
                    if super::is_blob_id(name) && prefix.to_str() == Some(&name[..2]) && f.file_type()?.is_file() {
                        blobs.push(name.to_string());
                    }
                }
            }
            blobs.sort();
            Ok(super::Inventory { blobs, multiparts: Vec::new(), unfinished: Vec::new() })
        })
        .await
    }

    async fn create(&self, id: &str) -> BlobResult<()> {
        let path = self.path(id)?;
        self.stray.settle(&path).await;
        let durable = self.durable;
        let dir = path.parent().expect("blob path has a parent").to_path_buf();
        // The fan-out directory's own name is durable once this process synced `root` after
        // creating (or first using) it: once per directory and process.
        let sync_root = durable && !self.synced_dirs.lock().unwrap_or_else(|p| p.into_inner()).contains(&dir);
        let (root, d) = (self.root.clone(), dir.clone());
        blocking(move || -> std::io::Result<_> {
            std::fs::create_dir_all(&d)?;
            let f = crate::regular_file::create(&path)?;
            if durable {
                f.sync_all()?;
                sync_dir(&d)?;
                if sync_root {
                    sync_dir(&root)?;
                }
            }
            Ok(())
        })
        .await?;
        if sync_root {
            self.synced_dirs.lock().unwrap_or_else(|p| p.into_inner()).insert(dir);
        }
        Ok(())
    }

    async fn open_writer_under(&self, id: &str, offset: u64, state: &BlobState, lease: &WriteLease) -> BlobResult<Box<dyn BlobWriter>> {
        // The fs state only repeats the durable length; it must not claim more than `offset`.
        match state.fs_len() {
            Some(len) if len == offset || state.0.is_empty() => {}
            _ => return Err(BlobError::BadState),
        }
        let path = self.path(id)?;
        self.stray.settle(&path).await;
        let (durable, want_direct) = (self.durable, self.direct);
        let quick = if self.open_inline { open_for_writing(&path, offset, durable, want_direct, true)? } else { None };
        let (file, direct) = match quick {
            Some(opened) => opened,
            None => {
                let p = path.clone();
                blocking(move || open_for_writing(&p, offset, durable, want_direct, false))
                    .await?
                    .expect("an open on a blocking thread waits rather than declines")
            }
        };
        Ok(Box::new(FsWriter {
            file: Arc::new(file),
            direct: direct.map(|d| Arc::new(Mutex::new(d))),
            carry_unwritten: false,
            path,
            stray: self.stray.clone(),
            gathered: Vec::new(),
            gathered_len: 0,
            in_flight: None,
            in_flight_len: 0,
            flushed: offset,
            durable,
            lease: lease.clone(),
        }))
    }

    async fn len(&self, id: &str) -> BlobResult<Option<u64>> {
        match tokio::fs::metadata(self.path(id)?).await {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn truncate(&self, id: &str, len: u64, lease: &WriteLease) -> BlobResult<()> {
        let path = self.path(id)?;
        self.stray.settle(&path).await;
        let durable = self.durable;
        lease
            .run(blocking(move || -> BlobResult<()> {
                let f = crate::regular_file::open(OpenOptions::new().write(true), &path).map_err(not_found)?;
                if f.metadata()?.len() > len {
                    f.set_len(len)?;
                    if durable {
                        f.sync_data()?;
                    }
                }
                Ok(())
            }))
            .await
    }

    async fn read(&self, id: &str, range: Range<u64>) -> BlobResult<ByteStream> {
        let path = self.path(id)?;
        let start = range.start;
        let (reading, chunk) = if self.open_inline {
            // On this thread: the open, and the head of the range the page cache has. The
            // first chunk is then what the cache had, or (none cached) one blocking read, so
            // that an error reading it is still this call's, not the stream's.
            let first = (range.end.saturating_sub(range.start)).min(INLINE_READ as u64) as usize;
            let r = Arc::new(Reading { file: open_for_reading(&path, &range)?, end: range.end, advised: AtomicU64::new(0) });
            let mut chunk = if first > 0 { read_cached(&r.file, start, first) } else { Bytes::new() };
            if chunk.is_empty() && first > 0 {
                let r = r.clone();
                chunk = blocking(move || read_chunk(&r, start, first)).await?;
            }
            (r, chunk)
        } else {
            // open + fstat + the first read in one blocking call (one hop for small ranges)
            let first = (range.end.saturating_sub(range.start)).min(READ_CHUNK as u64) as usize;
            let range = range.clone();
            let (r, chunk) = blocking(move || -> BlobResult<(Reading, Bytes)> {
                let r = Reading { file: open_for_reading(&path, &range)?, end: range.end, advised: AtomicU64::new(0) };
                let chunk = if first > 0 { read_chunk(&r, range.start, first)? } else { Bytes::new() };
                Ok((r, chunk))
            })
            .await?;
            (Arc::new(r), chunk)
        };
        let mut s = ReadAhead { pos: start + chunk.len() as u64, reading, ready: None, next: None };
        if !chunk.is_empty() {
            s.ready = Some(chunk);
            s.spawn_next();
        }
        Ok(Box::pin(s))
    }

    async fn finish(&self, id: &str, state: &BlobState) -> BlobResult<()> {
        let len = state.fs_len().ok_or(BlobError::BadState)?;
        match self.len(id).await? {
            None => Err(BlobError::NotFound),
            Some(have) if have < len => Err(BlobError::OutOfRange { start: 0, end: len, len: have }),
            // Bytes are durable in place (the writer synced them before the state existed).
            Some(_) => Ok(()),
        }
    }

    async fn ping(&self) -> BlobResult<()> {
        let root = self.root.clone();
        blocking(move || -> std::io::Result<()> {
            // A directory we can create files in and sync: write 4 KiB, fsync, remove (a full
            // disk fails here, DESIGN §9).
            let probe = root.join(".ready-probe");
            let res = crate::regular_file::create(&probe).and_then(|mut f| {
                std::io::Write::write_all(&mut f, &[0u8; 4096])?;
                f.sync_all()
            });
            let removed = std::fs::remove_file(&probe);
            res?;
            removed
        })
        .await
    }

    async fn mark(&self) -> BlobResult<Option<String>> {
        let path = self.root.join(super::STORE_MARK);
        blocking(move || -> std::io::Result<_> {
            match crate::regular_file::read_to_string(&path) {
                Ok(text) => Ok(Some(text.trim().to_string())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await
    }

    async fn set_mark(&self, mark: &str) -> BlobResult<()> {
        let (root, mark) = (self.root.clone(), mark.to_string());
        blocking(move || -> std::io::Result<()> {
            // Written beside, synced, then renamed over: a crash leaves the old mark or the new.
            let tmp = root.join(format!("{}.new", super::STORE_MARK));
            let mut f = crate::regular_file::create(&tmp)?;
            std::io::Write::write_all(&mut f, format!("{mark}\n").as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, root.join(super::STORE_MARK))?;
            sync_dir(&root)
        })
        .await
    }

    /// Unlink the file and, in durable mode, fsync its directory before returning: a removal
    /// the caller reports done stays done after a power cut (without the directory's fsync the
    /// name, and the bytes, can come back). Removing an absent blob syncs the directory too, so
    /// a retry after a crash between the unlink and the fsync still makes it durable.
    async fn delete(&self, gone: &Unreferenced) -> BlobResult<()> {
        let path = self.path(gone.id())?;
        self.stray.settle(&path).await;
        let durable = self.durable;
        blocking(move || -> std::io::Result<()> {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            if durable {
                match sync_dir(path.parent().expect("blob path has a parent")) {
                    // No fan-out directory: nothing was ever created there.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    r => r?,
                }
            }
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer another holder still has attached keeps every later writer out (503-style
    /// `Unavailable`, nothing written or truncated) until it closes the file; a writer opened
    /// short of the file's length cuts it — whether opens start on the async thread or not.
    #[tokio::test]
    async fn a_second_writer_waits_for_the_first_to_close_the_file() {
        for inline in [false, true] {
            a_second_writer_waits_with(inline).await;
        }
    }

    /// Only a local filesystem opens writers on the async thread: not a pseudo or network one,
    /// nor a path `statfs` cannot read.
    #[test]
    fn inline_opens_only_on_a_local_disk() {
        assert!(!on_local_disk(Path::new("/proc")));
        assert!(!on_local_disk(Path::new("/no/such/directory")));
    }

    /// A read takes the head of its range from the page cache on the async thread as far as
    /// the cache holds it and the rest from the disk, whatever part of the file is cached: the
    /// bytes are the file's in every case, and the first chunk is never longer than
    /// [`INLINE_READ`].
    #[tokio::test]
    async fn a_read_takes_what_the_page_cache_has_and_reads_the_rest() {
        use futures::StreamExt;
        use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path(), true).unwrap().with_inline_opens(true);
        let data: Vec<u8> = (0..(5u32 << 20) + 123).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        store.create("cached1").await.unwrap();
        let mut w = store.open_writer("cached1", 0, &BlobState::default()).await.unwrap();
        w.write(Bytes::from(data.clone())).await.unwrap();
        w.sync().await.unwrap();
        drop(w);
        let file = File::open(store.path("cached1").unwrap()).unwrap();
        let uncache = || posix_fadvise(&file, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED).unwrap();
        let read = |range: Range<u64>| {
            let store = store.clone();
            async move {
                let chunks: Vec<Bytes> = store.read("cached1", range).await.unwrap().map(|c| c.unwrap()).collect().await;
                let first = chunks.first().map_or(0, Bytes::len);
                assert!(first <= INLINE_READ, "first chunk {first} bytes");
                chunks.concat()
            }
        };
        let len = data.len() as u64;
        for range in [0..len, 7..(1 << 20) + 9, (3 << 20) + 1..len, 100..100] {
            let want = &data[range.start as usize..range.end as usize];
            uncache();
            assert_eq!(read(range.clone()).await, want, "nothing cached: {range:?}");
            assert_eq!(read(range.clone()).await, want, "all cached: {range:?}");
            uncache();
            let mut head = [0u8; 4096];
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut head, range.start & !4095).unwrap();
            assert_eq!(read(range.clone()).await, want, "the head cached: {range:?}");
        }
        assert!(matches!(store.read("cached1", 0..len + 1).await, Err(BlobError::OutOfRange { .. })));
        assert!(matches!(store.read("nosuch1", 0..1).await, Err(BlobError::NotFound)));
    }

    async fn a_second_writer_waits_with(inline: bool) {
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path(), true).unwrap().with_inline_opens(inline);
        store.create("writer1").await.unwrap();
        let mut first = store.open_writer("writer1", 0, &BlobState::default()).await.unwrap();
        first.write(Bytes::from_static(b"committed and more")).await.unwrap();
        first.sync().await.unwrap();
        let second = store.open_writer("writer1", 9, &BlobState::fs(9)).await;
        assert!(matches!(second, Err(BlobError::Unavailable(_))), "a second writer attached while the first had the file");
        assert_eq!(store.len("writer1").await.unwrap(), Some(18), "the refused writer truncated nothing");
        drop(first);
        let second = store.open_writer("writer1", 9, &BlobState::fs(9)).await.expect("free once the first closed the file");
        assert_eq!(second.position(), 9);
        assert_eq!(store.len("writer1").await.unwrap(), Some(9), "the new writer discarded what was past its offset");
    }
}
