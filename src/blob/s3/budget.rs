//! The S3 store's memory budget (`[s3] max_buffer`): everything the store holds in memory —
//! writers' open parts, tails read back on a resume or a rewind, parts a composition streams —
//! is reserved here before it is held, [`BUDGET_UNIT`] at a time, and a reservation that finds
//! no room waits at most [`BUDGET_WAIT`] (DESIGN §2 "S3 mapping"; `writer.rs` uses it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use super::writer::Parked;
use crate::blob::{BlobError, BlobResult};

/// Longest a reservation in the [`Budget`] waits for room before it gives up with
/// [`BlobError::Unavailable`] (the client is told to retry after a moment): a writer never
/// waits without bound for memory other uploads hold.
pub const BUDGET_WAIT: Duration = Duration::from_secs(5);

/// What one permit of the [`Budget`] stands for: 64 KiB, so an idle upload holding a few bytes
/// of an open part holds 64 KiB of the budget (8 192 such uploads fill the default 512 MiB).
pub const BUDGET_UNIT: u64 = 64 * 1024;

/// Store-wide bound on the bytes of open parts, in [`BUDGET_UNIT`] permits. Reserved as bytes
/// arrive, a unit at a time (never a whole part for one byte), by whatever is about to hold bytes in
/// memory: a writer's open part, the tail a resume reads back, a part a composition streams.
pub(super) struct Budget {
    sem: Arc<Semaphore>,
    mib: u32,
    /// Reservations waiting now, and how many and how long (ms) all have waited.
    waiting: AtomicU64,
    waits: AtomicU64,
    waited_ms: AtomicU64,
    refused: AtomicU64,
}

/// What the [`Budget`] is doing (`ferry_s3_buffer_*` metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetStats {
    /// Bytes reserved now (open parts, parked ones included, tails read back, streamed pieces).
    pub in_use: u64,
    /// The bound (`[s3] max_buffer`), in bytes.
    pub limit: u64,
    /// Reservations waiting for room now.
    pub waiting: u64,
    /// Reservations that had to wait, and their waits in all (ms).
    pub waits: u64,
    pub waited_ms: u64,
    /// Reservations that gave up after [`BUDGET_WAIT`] (their request answered 503).
    pub refused: u64,
}

impl Budget {
    /// A budget of `bytes` (at least one MiB).
    pub(super) fn new(bytes: u64) -> Budget {
        let mib = u32::try_from(bytes.div_ceil(BUDGET_UNIT).max(1)).unwrap_or(u32::MAX >> 4).min(Semaphore::MAX_PERMITS as u32);
        Budget {
            sem: Arc::new(Semaphore::new(mib as usize)),
            mib,
            waiting: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            waited_ms: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Bytes reserved now (active and parked open parts, tails being read, streamed pieces).
    pub(super) fn in_use(&self) -> u64 {
        u64::from(self.mib - self.sem.available_permits() as u32) * BUDGET_UNIT
    }

    pub(super) fn stats(&self) -> BudgetStats {
        BudgetStats {
            in_use: self.in_use(),
            limit: u64::from(self.mib) * BUDGET_UNIT,
            waiting: self.waiting.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            waited_ms: self.waited_ms.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }

    /// Whole permits covering `bytes`: at least one, at most the whole budget.
    fn permits_for(&self, bytes: u64) -> u32 {
        (bytes.div_ceil(BUDGET_UNIT).max(1).min(u64::from(self.mib))) as u32
    }

    /// Make `held` cover `bytes` (whole MiB), reserving what it lacks: at once where there is
    /// room, after evicting parked open parts (their bytes are durable in tail segments), else
    /// waiting at most [`BUDGET_WAIT`]. Errors: [`BlobError::Unavailable`] when no room came in
    /// time (nothing is reserved then beyond what `held` had).
    pub(super) async fn cover(&self, held: &mut Option<OwnedSemaphorePermit>, bytes: u64, parked: &Parked) -> BlobResult<()> {
        let have = held.as_ref().map_or(0, |p| p.num_permits() as u32);
        let want = self.permits_for(bytes);
        if have >= want {
            return Ok(());
        }
        let more = self.reserve_permits(want - have, parked).await?;
        match held {
            Some(p) => p.merge(more),
            None => *held = Some(more),
        }
        Ok(())
    }

    /// [`Budget::cover`] without waiting: `true` when `held` covers `bytes` now (reserving
    /// what it lacks where there is room, after evicting parked parts), `false` changing
    /// nothing otherwise.
    pub(super) fn try_cover(&self, held: &mut Option<OwnedSemaphorePermit>, bytes: u64, parked: &Parked) -> bool {
        let have = held.as_ref().map_or(0, |p| p.num_permits() as u32);
        let want = self.permits_for(bytes);
        if have >= want {
            return true;
        }
        loop {
            match self.sem.clone().try_acquire_many_owned(want - have) {
                Ok(more) => {
                    match held {
                        Some(p) => p.merge(more),
                        None => *held = Some(more),
                    }
                    return true;
                }
                Err(TryAcquireError::NoPermits) if parked.evict_one() => continue,
                Err(_) => return false,
            }
        }
    }

    /// A reservation covering `bytes` (see [`Budget::cover`]).
    pub(super) async fn reserve(&self, bytes: u64, parked: &Parked) -> BlobResult<OwnedSemaphorePermit> {
        self.reserve_permits(self.permits_for(bytes), parked).await
    }

    async fn reserve_permits(&self, n: u32, parked: &Parked) -> BlobResult<OwnedSemaphorePermit> {
        loop {
            match self.sem.clone().try_acquire_many_owned(n) {
                Ok(p) => return Ok(p),
                Err(TryAcquireError::NoPermits) if parked.evict_one() => continue,
                Err(TryAcquireError::NoPermits) => break,
                Err(TryAcquireError::Closed) => return Err(BlobError::Io(std::io::Error::other("the S3 memory budget is closed"))),
            }
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let got = tokio::time::timeout(BUDGET_WAIT, self.sem.clone().acquire_many_owned(n)).await;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.waited_ms.fetch_add(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        match got {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(e)) => Err(BlobError::Io(std::io::Error::other(e))),
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(BlobError::NoRoom { limit: u64::from(self.mib) * BUDGET_UNIT, waited: BUDGET_WAIT })
            }
        }
    }
}
