//! The write half of the directory blob store: opening a blob for writing under its writer lock,
//! the pipelined `writev` batches (direct or through the page cache), their writeback hint, and
//! [`FsWriter`], the [`BlobWriter`] whose checkpoints `fdatasync` what they commit.

use super::*;

/// Start writeback of `[offset, offset + len)` without waiting for it (Linux); a no-op
/// elsewhere. Only a performance hint: durability still comes from `fdatasync`.
pub(super) fn start_writeback(file: &File, offset: u64, len: u64) {
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
pub(super) fn write_all_vectored(mut file: &File, bufs: &[Bytes]) -> std::io::Result<()> {
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

/// Open the blob file at `p` to write from byte `offset`: its writer lock taken
/// ([`hold_writer_lock`]), anything past `offset` cut (and the cut synced when `durable`), and a
/// direct writer set up at `offset` when `want_direct`. `quick`: run on an async thread, so
/// return `Ok(None)` rather than wait — the writer lock is held by another writer, or a cut is
/// needed — and the caller opens again on a blocking thread; never `None` otherwise. Errors:
/// [`BlobError::NotFound`], [`BlobError::OutOfRange`] (the file is shorter than `offset`),
/// [`BlobError::Unavailable`] (the lock stayed held), I/O.
pub(super) fn open_for_writing(p: &Path, offset: u64, durable: bool, want_direct: bool, quick: bool) -> BlobResult<Option<(File, Option<Direct>)>> {
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
pub(super) const WRITER_LOCK_WAIT: std::time::Duration = crate::blob::CUT_GRACE;

/// Take the blob file's exclusive writer lock (`flock`; on NFS the client maps it to a POSIX
/// byte-range lock the server enforces across hosts) for as long as `f` is open: a writer that
/// another process still has attached — paused (`SIGSTOP`, a VM freeze) or cut off past its
/// lease, so it may still be between its lease check and a `writev` — keeps every later writer
/// out until it closes the file or dies, so it can never write over bytes another writer
/// committed since (DESIGN §2 "a lost lease is its own outcome"). Waits up to
/// [`WRITER_LOCK_WAIT`] (a writer of this process that is closing); then
/// [`BlobError::Unavailable`] (503, retryable). Runs on a blocking thread.
pub(super) fn hold_writer_lock(f: &File) -> BlobResult<()> {
    let deadline = std::time::Instant::now() + WRITER_LOCK_WAIT;
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(BlobError::Unavailable(
                    "another writer (a paused or cut-off process on a shared directory) still has this upload's file open; nothing was written"
                        .into(),
                ))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
        }
    }
}

pub(super) struct FsWriter {
    pub(super) file: Arc<File>,
    pub(super) path: PathBuf,
    pub(super) stray: Arc<StrayWrites>,
    /// Bytes given to `write` and not yet handed to the file.
    pub(super) gathered: Vec<Bytes>,
    pub(super) gathered_len: usize,
    /// The batch being written, and its length in bytes.
    pub(super) in_flight: Option<JoinHandle<std::io::Result<()>>>,
    pub(super) in_flight_len: u64,
    /// Direct writes (`O_DIRECT`) and their carry, used by one batch at a time; `None`:
    /// writes go through the page cache.
    pub(super) direct: Option<Arc<Mutex<Direct>>>,
    /// A direct writer's carry may hold bytes not yet in the file (a batch was written
    /// without `whole`).
    pub(super) carry_unwritten: bool,
    /// Bytes handed to the file so far (written or in flight; excluding `gathered`).
    pub(super) flushed: u64,
    pub(super) durable: bool,
    /// Checked on the writing thread right before each `writev` and `fdatasync`: a writer
    /// whose lease ran out (paused, cut off) writes nothing more. On a directory several
    /// replicas share, a pause between that check and the system call itself is covered by the
    /// writer lock ([`hold_writer_lock`]): no other writer opens the file meanwhile.
    pub(super) lease: WriteLease,
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
        let (file, start, writeback, lease, direct) =
            (self.file.clone(), self.flushed, writeback && self.durable, self.lease.clone(), self.direct.clone());
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
