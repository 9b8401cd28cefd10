//! The read half of the directory blob store: pooled chunk buffers, reads from the page cache on
//! the request's thread (`preadv2` with `RWF_NOWAIT`), the read-ahead stream and the disk read-ahead
//! hint.

use super::*;

/// Read buffers (each [`READ_CHUNK`] long, initialised) waiting for reuse.
pub(super) static READ_POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
/// Buffers the pool keeps at most (the rest are freed).
pub(super) const READ_POOL_MAX: usize = 8;

/// A chunk of a pooled buffer; the buffer returns to [`READ_POOL`] when the last `Bytes`
/// pointing into it is dropped.
pub(super) struct PooledChunk {
    pub(super) buf: Vec<u8>,
    pub(super) len: usize,
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
pub(super) fn pooled_buffer() -> Vec<u8> {
    let buf = READ_POOL.lock().unwrap_or_else(|p| p.into_inner()).pop();
    buf.unwrap_or_else(|| vec![0; READ_CHUNK])
}

/// Fill `buf` from `pos` with what the page cache holds, without waiting on the disk (Linux
/// `preadv2` with `RWF_NOWAIT`): the number of bytes read, from `pos` up to the first one not
/// cached; 0 when that is the first, or when the kernel cannot tell (`EAGAIN`, `EOPNOTSUPP`,
/// any error, another OS — the caller then reads with a plain `pread`, which reports errors).
pub(super) fn fill_cached(file: &File, pos: u64, buf: &mut [u8]) -> usize {
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
pub(super) fn read_cached(file: &File, pos: u64, len: usize) -> Bytes {
    let mut buf = pooled_buffer();
    let got = fill_cached(file, pos, &mut buf[..len]);
    // An empty chunk still gives its buffer back to the pool when dropped.
    Bytes::from_owner(PooledChunk { buf, len: got })
}

/// One read of a range of a blob file: the file, the range's end, and the end of what was
/// asked of the kernel ahead so far ([`will_need`]).
pub(super) struct Reading {
    pub(super) file: File,
    pub(super) end: u64,
    pub(super) advised: AtomicU64,
}

/// `len` (≤ [`READ_CHUNK`]) bytes at `pos` of `r` into a pooled buffer. What the page cache
/// holds is copied at once; when the rest is not cached and less than half of [`READ_AHEAD`]
/// past it has been asked for, the kernel is first asked to read up to [`READ_AHEAD`] bytes
/// ahead in the background ([`will_need`]); then `pread` waits for this chunk's bytes. Errors:
/// I/O, and `UnexpectedEof` when the file is shorter than the bytes its record counts.
pub(super) fn read_chunk(r: &Reading, pos: u64, len: usize) -> std::io::Result<Bytes> {
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
pub(super) fn will_need(file: &File, pos: u64, len: u64) {
    #[cfg(target_os = "linux")]
    if len > 0 {
        use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
        let (Ok(pos), Ok(len)) = (i64::try_from(pos), i64::try_from(len)) else { return };
        let _ = posix_fadvise(file, pos, len, PosixFadviseAdvice::POSIX_FADV_WILLNEED);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, pos, len);
}

/// A byte stream that keeps one read ahead of its consumer.
pub(super) struct ReadAhead {
    /// The file and the range's end.
    pub(super) reading: Arc<Reading>,
    /// Next byte to read.
    pub(super) pos: u64,
    /// A chunk read and not yet yielded.
    pub(super) ready: Option<Bytes>,
    pub(super) next: Option<JoinHandle<std::io::Result<Bytes>>>,
}

impl ReadAhead {
    pub(super) fn spawn_next(&mut self) {
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
pub(super) fn open_for_reading(p: &Path, range: &Range<u64>) -> BlobResult<File> {
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
pub(super) fn on_local_disk(root: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use nix::sys::statfs::{statfs, BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, F2FS_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC};
        // ext2, ext3 and ext4 share one magic number.
        statfs(root)
            .is_ok_and(|s| [EXT4_SUPER_MAGIC, XFS_SUPER_MAGIC, BTRFS_SUPER_MAGIC, F2FS_SUPER_MAGIC, TMPFS_MAGIC].contains(&s.filesystem_type()))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = root;
        false
    }
}
