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
//! One file of ~1 080 lines because the writer, the reader and the stray-file
//! bookkeeping share one file layout and its durability steps (`fdatasync`, directory fsyncs);
//! the `O_DIRECT` staging they share is already `direct.rs`.

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
use super::{BlobError, BlobResult, BlobState, BlobStore, BlobWriter, ByteStream, SyncFuture, WriteLease};

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
    Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, format!("the blob directory {} {why}: give --blobs a directory (it is created if missing)", root.display())))
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

/// Start writeback of `[offset, offset + len)` without waiting for it (Linux); a no-op
/// elsewhere. Only a performance hint: durability still comes from `fdatasync`.
fn start_writeback(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        extern "C" {
            fn sync_file_range(fd: std::ffi::c_int, offset: i64, nbytes: i64, flags: std::ffi::c_uint) -> std::ffi::c_int;
        }
        const SYNC_FILE_RANGE_WRITE: std::ffi::c_uint = 2;
        // SAFETY: plain syscall wrapper on a valid, open descriptor; it reads no user memory.
        // Errors (e.g. a filesystem without support) are ignored: fdatasync still follows.
        unsafe {
            sync_file_range(file.as_raw_fd(), offset as i64, len as i64, SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// `writev` every byte of `bufs` (std's `write_all_vectored` is unstable).
fn write_all_vectored(mut file: &File, bufs: &[Bytes]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = bufs.iter().filter(|b| !b.is_empty()).map(|b| IoSlice::new(b)).collect();
    let mut slices = slices.as_mut_slice();
    while !slices.is_empty() {
        // Linux takes at most IOV_MAX (1024) slices per call.
        let n = slices.len().min(1024);
        match file.write_vectored(&slices[..n]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(w) => IoSlice::advance_slices(&mut slices, w),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Read buffers (each [`READ_CHUNK`] long, initialised) waiting for reuse.
static READ_POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
/// Buffers the pool keeps at most (the rest are freed).
const READ_POOL_MAX: usize = 8;

/// A chunk of a pooled buffer; the buffer returns to [`READ_POOL`] when the last `Bytes`
/// pointing into it is dropped.
struct PooledChunk {
    buf: Vec<u8>,
    len: usize,
}

impl AsRef<[u8]> for PooledChunk {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for PooledChunk {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let mut pool = READ_POOL.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < READ_POOL_MAX {
            pool.push(buf);
        }
    }
}

/// A [`READ_CHUNK`]-long buffer from [`READ_POOL`], or a new one.
fn pooled_buffer() -> Vec<u8> {
    let buf = READ_POOL.lock().unwrap_or_else(|p| p.into_inner()).pop();
    buf.unwrap_or_else(|| vec![0; READ_CHUNK])
}

/// Fill `buf` from `pos` with what the page cache holds, without waiting on the disk (Linux
/// `preadv2` with `RWF_NOWAIT`): the number of bytes read, from `pos` up to the first one not
/// cached; 0 when that is the first, or when the kernel cannot tell (`EAGAIN`, `EOPNOTSUPP`,
/// any error, another OS — the caller then reads with a plain `pread`, which reports errors).
fn fill_cached(file: &File, pos: u64, buf: &mut [u8]) -> usize {
    #[cfg(target_os = "linux")]
    {
        use rustix::io::{preadv2, ReadWriteFlags};
        let mut got = 0;
        while got < buf.len() {
            match preadv2(file, &mut [std::io::IoSliceMut::new(&mut buf[got..])], pos + got as u64, ReadWriteFlags::NOWAIT) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        got
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, pos, buf);
        0
    }
}

/// Up to `len` (≤ [`READ_CHUNK`]) bytes at `pos` that the page cache holds ([`fill_cached`]),
/// in a pooled buffer: empty when the byte at `pos` is not cached.
fn read_cached(file: &File, pos: u64, len: usize) -> Bytes {
    let mut buf = pooled_buffer();
    let got = fill_cached(file, pos, &mut buf[..len]);
    // An empty chunk still gives its buffer back to the pool when dropped.
    Bytes::from_owner(PooledChunk { buf, len: got })
}

/// One read of a range of a blob file: the file, the range's end, and the end of what was
/// asked of the kernel ahead so far ([`will_need`]).
struct Reading {
    file: File,
    end: u64,
    advised: AtomicU64,
}

/// `len` (≤ [`READ_CHUNK`]) bytes at `pos` of `r` into a pooled buffer. What the page cache
/// holds is copied at once; when the rest is not cached and less than half of [`READ_AHEAD`]
/// past it has been asked for, the kernel is first asked to read up to [`READ_AHEAD`] bytes
/// ahead in the background ([`will_need`]); then `pread` waits for this chunk's bytes. Errors:
/// I/O, and `UnexpectedEof` when the file is shorter than the bytes its record counts.
fn read_chunk(r: &Reading, pos: u64, len: usize) -> std::io::Result<Bytes> {
    use std::os::unix::fs::FileExt;
    let mut buf = pooled_buffer();
    let cached = fill_cached(&r.file, pos, &mut buf[..len]);
    if cached < len {
        let from = pos + cached as u64;
        let asked = r.advised.load(Ordering::Relaxed);
        if asked < r.end.min(from + READ_AHEAD / 2) {
            let (start, until) = (asked.max(from), r.end.min(from + READ_AHEAD));
            r.advised.store(until, Ordering::Relaxed);
            will_need(&r.file, start, until - start);
        }
        r.file.read_exact_at(&mut buf[cached..len], from).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "blob shorter than its recorded length")
            } else {
                e
            }
        })?;
    }
    Ok(Bytes::from_owner(PooledChunk { buf, len }))
}

/// Ask the kernel to read `len` bytes at `pos` into the page cache in the background
/// (`posix_fadvise(POSIX_FADV_WILLNEED)`): one request for many MiB, where the kernel's own
/// read-ahead for `pread`s goes 128 KiB at a time (a file written with `O_DIRECT`, read back
/// from a virtual disk: ≈ 300–400 MB/s without, 1.6–1.8 GB/s with, issue 24 session 10). Advice
/// only: an error is ignored, as is an OS without it.
fn will_need(file: &File, pos: u64, len: u64) {
    #[cfg(target_os = "linux")]
    if len > 0 {
        use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
        let (Ok(pos), Ok(len)) = (i64::try_from(pos), i64::try_from(len)) else { return };
        let _ = posix_fadvise(file, pos, len, PosixFadviseAdvice::POSIX_FADV_WILLNEED);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, pos, len);
}

#[async_trait]
impl BlobStore for FsBlobStore {
    fn checkpoints_unsynced(&self) -> bool {
        !self.durable
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
                blocking(move || open_for_writing(&p, offset, durable, want_direct, false)).await?.expect("an open on a blocking thread waits rather than declines")
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

    async fn truncate(&self, id: &str, len: u64) -> BlobResult<()> {
        let path = self.path(id)?;
        self.stray.settle(&path).await;
        let durable = self.durable;
        blocking(move || -> BlobResult<()> {
            let f = crate::regular_file::open(OpenOptions::new().write(true), &path).map_err(not_found)?;
            if f.metadata()?.len() > len {
                f.set_len(len)?;
                if durable {
                    f.sync_data()?;
                }
            }
            Ok(())
        })
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

    async fn abort(&self, id: &str) -> BlobResult<()> {
        self.delete(id).await
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
    async fn delete(&self, id: &str) -> BlobResult<()> {
        let path = self.path(id)?;
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

/// A byte stream that keeps one read ahead of its consumer.
struct ReadAhead {
    /// The file and the range's end.
    reading: Arc<Reading>,
    /// Next byte to read.
    pos: u64,
    /// A chunk read and not yet yielded.
    ready: Option<Bytes>,
    next: Option<JoinHandle<std::io::Result<Bytes>>>,
}

impl ReadAhead {
    fn spawn_next(&mut self) {
        if self.pos >= self.reading.end || self.next.is_some() {
            return;
        }
        let (pos, len) = (self.pos, (self.reading.end - self.pos).min(READ_CHUNK as u64) as usize);
        self.pos += len as u64;
        let r = self.reading.clone();
        self.next = Some(tokio::task::spawn_blocking(move || read_chunk(&r, pos, len)));
    }
}

impl Stream for ReadAhead {
    type Item = std::io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(chunk) = self.ready.take() {
            return Poll::Ready(Some(Ok(chunk)));
        }
        let Some(h) = self.next.as_mut() else { return Poll::Ready(None) };
        let r = match h.poll_unpin(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        self.next = None;
        match r {
            Ok(Ok(chunk)) => {
                self.spawn_next();
                Poll::Ready(Some(Ok(chunk)))
            }
            Ok(Err(e)) => {
                self.pos = self.reading.end;
                Poll::Ready(Some(Err(e)))
            }
            Err(join) => {
                self.pos = self.reading.end;
                Poll::Ready(Some(Err(std::io::Error::other(join))))
            }
        }
    }
}

/// Open the blob file at `p` to read `range`. Errors: [`BlobError::NotFound`],
/// [`BlobError::OutOfRange`] (the range ends past the file), I/O.
fn open_for_reading(p: &Path, range: &Range<u64>) -> BlobResult<File> {
    let f = crate::regular_file::open(OpenOptions::new().read(true), p).map_err(not_found)?;
    let len = f.metadata()?.len();
    if range.start > range.end || range.end > len {
        return Err(BlobError::OutOfRange { start: range.start, end: range.end, len });
    }
    Ok(f)
}

/// Whether `root` lies on a filesystem of a local disk or of memory (ext2/3/4, XFS, Btrfs,
/// F2FS, tmpfs), where opening a file is a few system calls that do not wait on a network:
/// anything else, or a `statfs` that fails, is treated as remote.
fn on_local_disk(root: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use nix::sys::statfs::{statfs, BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, F2FS_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC};
        // ext2, ext3 and ext4 share one magic number.
        statfs(root).is_ok_and(|s| [EXT4_SUPER_MAGIC, XFS_SUPER_MAGIC, BTRFS_SUPER_MAGIC, F2FS_SUPER_MAGIC, TMPFS_MAGIC].contains(&s.filesystem_type()))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = root;
        false
    }
}

/// Open the blob file at `p` to write from byte `offset`: its writer lock taken
/// ([`hold_writer_lock`]), anything past `offset` cut (and the cut synced when `durable`), and a
/// direct writer set up at `offset` when `want_direct`. `quick`: run on an async thread, so
/// return `Ok(None)` rather than wait — the writer lock is held by another writer, or a cut is
/// needed — and the caller opens again on a blocking thread; never `None` otherwise. Errors:
/// [`BlobError::NotFound`], [`BlobError::OutOfRange`] (the file is shorter than `offset`),
/// [`BlobError::Unavailable`] (the lock stayed held), I/O.
fn open_for_writing(p: &Path, offset: u64, durable: bool, want_direct: bool, quick: bool) -> BlobResult<Option<(File, Option<Direct>)>> {
    // Readable too: a direct writer reads back the partial block it continues.
    let mut f = crate::regular_file::open(OpenOptions::new().read(true).write(true), p).map_err(not_found)?;
    if !quick {
        hold_writer_lock(&f)?;
    } else if let Err(e) = f.try_lock() {
        return match e {
            std::fs::TryLockError::WouldBlock => Ok(None),
            std::fs::TryLockError::Error(e) => Err(e.into()),
        };
    }
    let len = f.metadata()?.len();
    if len < offset {
        return Err(BlobError::OutOfRange { start: offset, end: offset, len });
    }
    if len > offset {
        if quick {
            return Ok(None);
        }
        f.set_len(offset)?;
        if durable {
            f.sync_data()?;
        }
    }
    f.seek(SeekFrom::Start(offset))?;
    let direct = if want_direct { Direct::open(p, &f, offset)? } else { None };
    Ok(Some((f, direct)))
}

/// How long a new writer waits for the previous writer of a blob to close it
/// ([`hold_writer_lock`]).
const WRITER_LOCK_WAIT: std::time::Duration = crate::blob::CUT_GRACE;

/// Take the blob file's exclusive writer lock (`flock`; on NFS the client maps it to a POSIX
/// byte-range lock the server enforces across hosts) for as long as `f` is open: a writer that
/// another process still has attached — paused (`SIGSTOP`, a VM freeze) or cut off past its
/// lease, so it may still be between its lease check and a `writev` — keeps every later writer
/// out until it closes the file or dies, so it can never write over bytes another writer
/// committed since (DESIGN §2 "a lost lease is its own outcome"). Waits up to
/// [`WRITER_LOCK_WAIT`] (a writer of this process that is closing); then
/// [`BlobError::Unavailable`] (503, retryable). Runs on a blocking thread.
fn hold_writer_lock(f: &File) -> BlobResult<()> {
    let deadline = std::time::Instant::now() + WRITER_LOCK_WAIT;
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(10)),
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(BlobError::Unavailable(
                    "another writer (a paused or cut-off process on a shared directory) still has this upload's file open; nothing was written".into(),
                ))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
        }
    }
}

struct FsWriter {
    file: Arc<File>,
    path: PathBuf,
    stray: Arc<StrayWrites>,
    /// Bytes given to `write` and not yet handed to the file.
    gathered: Vec<Bytes>,
    gathered_len: usize,
    /// The batch being written, and its length in bytes.
    in_flight: Option<JoinHandle<std::io::Result<()>>>,
    in_flight_len: u64,
    /// Direct writes (`O_DIRECT`) and their carry, used by one batch at a time; `None`:
    /// writes go through the page cache.
    direct: Option<Arc<Mutex<Direct>>>,
    /// A direct writer's carry may hold bytes not yet in the file (a batch was written
    /// without `whole`).
    carry_unwritten: bool,
    /// Bytes handed to the file so far (written or in flight; excluding `gathered`).
    flushed: u64,
    durable: bool,
    /// Checked on the writing thread right before each `writev` and `fdatasync`: a writer
    /// whose lease ran out (paused, cut off) writes nothing more. On a directory several
    /// replicas share, a pause between that check and the system call itself is covered by the
    /// writer lock ([`hold_writer_lock`]): no other writer opens the file meanwhile.
    lease: WriteLease,
}

impl FsWriter {
    /// Wait for the batch being written, if any.
    async fn settle(&mut self) -> BlobResult<()> {
        match self.in_flight.take() {
            Some(h) => joined(h.await),
            None => Ok(()),
        }
    }

    /// Hand the gathered bytes to the file (after the previous batch) without waiting.
    /// `writeback`: also start their writeback (durable mode, buffered writes) — not when an
    /// `fdatasync` follows at once, which would submit the same pages a second time. `whole`:
    /// every byte handed over is in the file once this batch is written (a direct writer's
    /// carry too), as an `fdatasync` or a completion that follows needs. `sync`: then
    /// `fdatasync` on the same blocking thread (the end of a PATCH: one trip, not two), even
    /// when nothing is gathered.
    async fn flush_gathered(&mut self, writeback: bool, whole: bool, sync: bool) -> BlobResult<()> {
        self.settle().await?;
        let carry = whole && self.carry_unwritten;
        if self.gathered_len == 0 && !sync && !carry {
            return Ok(());
        }
        let bufs = std::mem::take(&mut self.gathered);
        let n = std::mem::take(&mut self.gathered_len) as u64;
        self.lease.check()?;
        let (file, start, writeback, lease, direct) = (self.file.clone(), self.flushed, writeback && self.durable, self.lease.clone(), self.direct.clone());
        self.in_flight = Some(tokio::task::spawn_blocking(move || {
            if !lease.holds() {
                return Err(std::io::Error::other(BlobError::LeaseLost));
            }
            match &direct {
                Some(d) => {
                    let mut d = d.lock().unwrap_or_else(|p| p.into_inner());
                    d.write(&file, &bufs)?;
                    drop(bufs);
                    if whole || sync {
                        d.write_carry(&file)?;
                    }
                }
                None => {
                    write_all_vectored(&file, &bufs)?;
                    if writeback {
                        start_writeback(&file, start, n);
                    }
                }
            }
            if sync {
                file.sync_data()?;
            }
            Ok(())
        }));
        self.flushed += n;
        self.in_flight_len = n;
        if self.direct.is_some() {
            self.carry_unwritten = !(whole || sync) && (n > 0 || self.carry_unwritten);
        }
        Ok(())
    }
}

impl Drop for FsWriter {
    fn drop(&mut self) {
        if let Some(h) = self.in_flight.take() {
            if !h.is_finished() {
                self.stray.add(std::mem::take(&mut self.path), h);
            }
        }
    }
}

#[async_trait]
impl BlobWriter for FsWriter {
    async fn write(&mut self, data: Bytes) -> BlobResult<()> {
        self.gathered_len += data.len();
        self.gathered.push(data);
        if self.gathered_len >= WRITE_BATCH {
            self.flush_gathered(true, false, false).await?;
        }
        Ok(())
    }

    /// The end of a PATCH: the last gathered bytes are written and made durable in one trip to
    /// a blocking thread (`writev` then `fdatasync`), not one trip for each (issue 24: the
    /// fixed cost of a PATCH). Nothing else writes meanwhile: the caller waits for it.
    async fn sync(&mut self) -> BlobResult<BlobState> {
        if !self.durable {
            return self.start_sync().await?.await;
        }
        self.flush_gathered(false, true, true).await?;
        self.settle().await?;
        Ok(BlobState::fs(self.flushed))
    }

    /// A quiet body: its bytes go to the file whole, a direct writer's carry too (a write of
    /// at most 4 KiB through the page cache), so what the store holds is what was received.
    async fn flush(&mut self) -> BlobResult<()> {
        self.flush_gathered(true, true, false).await
    }

    async fn start_sync(&mut self) -> BlobResult<SyncFuture> {
        self.flush_gathered(false, true, false).await?;
        self.settle().await?;
        let state = BlobState::fs(self.flushed);
        if !self.durable {
            return Ok(Box::pin(std::future::ready(Ok(state))));
        }
        let (file, lease) = (self.file.clone(), self.lease.clone());
        let h = tokio::task::spawn_blocking(move || {
            if !lease.holds() {
                return Err(std::io::Error::other(BlobError::LeaseLost));
            }
            file.sync_data()
        });
        Ok(Box::pin(h.map(move |r| joined(r).map(|()| state))) as Pin<Box<dyn Future<Output = BlobResult<BlobState>> + Send>>)
    }

    async fn rewind(&mut self, len: u64) -> BlobResult<()> {
        if len >= self.flushed {
            let mut keep = (len - self.flushed) as usize;
            for b in &mut self.gathered {
                b.truncate(keep);
                keep -= b.len();
            }
            self.gathered.retain(|b| !b.is_empty());
            self.gathered_len = (len - self.flushed) as usize;
            return Ok(());
        }
        self.gathered.clear();
        self.gathered_len = 0;
        // A batch that failed (ENOSPC, EDQUOT…) is being discarded anyway: its error must not
        // stop the cut that releases its bytes (DESIGN §9).
        if let Err(e) = self.settle().await {
            tracing::debug!(error = %e, "discarding a failed write batch");
        }
        let (file, durable, direct) = (self.file.clone(), self.durable, self.direct.clone());
        blocking(move || -> std::io::Result<_> {
            let direct = direct.as_ref().map(|d| d.lock().unwrap_or_else(|p| p.into_inner()));
            if let Some(d) = &direct {
                // Bytes before `len` may still be only in the carry: into the file first, so
                // the cut below never extends the file with zeros.
                d.write_carry(&file)?;
            }
            file.set_len(len)?;
            (&*file).seek(SeekFrom::Start(len))?;
            if durable {
                file.sync_data()?;
            }
            if let Some(mut d) = direct {
                d.restart(&file, len)?;
            }
            Ok(())
        })
        .await?;
        self.flushed = len;
        // A restarted direct writer's carry was read back from the file.
        self.carry_unwritten = false;
        Ok(())
    }

    async fn salvage(&mut self) -> BlobResult<Option<BlobState>> {
        self.gathered.clear();
        self.gathered_len = 0;
        // The batch that failed wrote what it could: the file's length says how much.
        if let Err(e) = self.settle().await {
            tracing::debug!(error = %e, "salvaging after a failed write batch");
        }
        let (file, durable, direct) = (self.file.clone(), self.durable, self.direct.clone());
        let len = blocking(move || -> std::io::Result<u64> {
            let len = file.metadata()?.len();
            (&*file).seek(SeekFrom::Start(len))?;
            if durable {
                file.sync_data()?;
            }
            if let Some(d) = direct {
                d.lock().unwrap_or_else(|p| p.into_inner()).restart(&file, len)?;
            }
            Ok(len)
        })
        .await?;
        self.flushed = len;
        // A restarted direct writer's carry was read back from the file.
        self.carry_unwritten = false;
        Ok(Some(BlobState::fs(len)))
    }

    /// Durable mode: nothing to do (the last sync covered every byte). Relaxed mode, which
    /// syncs no checkpoint: the finished blob is made durable here — its bytes, its name and its
    /// fan-out directory's name — so a power loss can cost an unfinished upload its recent
    /// bytes but never a finished one its file (`tests/power_loss.rs`).
    async fn complete(&mut self) -> BlobResult<Option<BlobState>> {
        if self.durable {
            return Ok(None);
        }
        self.flush_gathered(false, true, false).await?;
        self.settle().await?;
        let (file, path, lease) = (self.file.clone(), self.path.clone(), self.lease.clone());
        blocking(move || -> std::io::Result<()> {
            if !lease.holds() {
                return Err(std::io::Error::other(BlobError::LeaseLost));
            }
            file.sync_data()?;
            let dir = path.parent().expect("blob path has a parent");
            sync_dir(dir)?;
            sync_dir(dir.parent().expect("a fan-out directory has a parent"))
        })
        .await?;
        Ok(None)
    }

    fn position(&self) -> u64 {
        self.flushed + self.gathered_len as u64
    }

    fn unwritten(&self) -> u64 {
        let in_flight = if self.in_flight.as_ref().is_some_and(|h| !h.is_finished()) { self.in_flight_len } else { 0 };
        // A direct writer's carry: less than one block, until the next batch or sync writes it.
        let carry = if self.carry_unwritten { crate::blob::direct::ALIGN as u64 } else { 0 };
        self.gathered_len as u64 + in_flight + carry
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
