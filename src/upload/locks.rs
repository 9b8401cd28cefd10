//! Upload leases: one writer per upload, with release-on-request (DESIGN §2 "upload leases",
//! §3 "Concurrency"). tusd calls this role a Locker.
//!
//! A request that needs an upload (HEAD, PATCH, DELETE) takes its lease through a [`Locker`].
//! If a PATCH holds it, the newcomer asks that PATCH to stop — its [`Lease::stop`] token fires,
//! it checkpoints what it has and ends — and waits up to the take-over timeout, else the caller
//! answers 423. A task writing one of its output files holds the lease *pinned*: it never lets
//! go before the file is finished, so a newcomer is refused at once (423) instead of waiting.
//! Background sweeps take a lease only [`Want::IfFree`]: they never stop a live writer.
//!
//! Two implementations:
//! - [`LocalLocker`]: the in-process table ([`WriterLocks`]) for a single server; the fence comes
//!   from [`Catalog::acquire_fence`] when a writer opens the upload.
//! - [`CatalogLocker`]: for catalogs shared by several processes: the in-process table plus a
//!   catalog lease (owner, expiry on the database clock, a fence that only grows), renewed by
//!   heartbeat; release requests cross processes through [`Catalog::request_release`] and
//!   [`Catalog::release_requests`] (SQLite polls, PostgreSQL `LISTEN/NOTIFY`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;

use crate::catalog::{Catalog, CatalogError, LeaseOutcome};

/// What kind of hold a caller wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Ask a current holder to let go, and wait for it (HEAD, PATCH, DELETE).
    Takeover,
    /// Like `Takeover`, then keep the lease until dropped, refusing every later request at once
    /// (a task's output file).
    Pinned,
    /// Only if nobody holds it; never disturbs a holder (background sweeps).
    IfFree,
}

/// Why a lease was not granted.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Held by someone who did not let go in time (or is pinned, or `IfFree` found it held).
    #[error("the upload is locked by another request")]
    Locked,
    /// The catalog failed (or the upload is unknown: `CatalogError::NotFound`).
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

/// Takes upload leases. Implementations: [`LocalLocker`], [`CatalogLocker`].
#[async_trait]
pub trait Locker: Send + Sync + 'static {
    /// Take the lease of upload `id` as `want` says, waiting at most `wait` for a holder to let
    /// go. Errors: [`LockError::Locked`] when it did not in time (at once for a pinned holder
    /// or `IfFree`); [`LockError::Catalog`] for catalog failures (`NotFound`: unknown upload).
    async fn acquire(&self, id: &str, want: Want, wait: Duration) -> Result<Lease, LockError>;

    /// Whether leases carry their own fence ([`Lease::fence`] is `Some`). When `false`, a
    /// writer takes the fence with [`Catalog::acquire_fence`] under the lease.
    fn fences(&self) -> bool;
}

/// Lease validity as seen by the holder's own monotonic clock: the deadline moves forward on
/// every successful renewal (counted from when the renewal was *sent*), so a holder that was
/// paused (SIGSTOP, a long GC-like stall) finds its lease stale before it writes again.
#[derive(Debug, Clone, Default)]
pub struct Validity(Arc<Mutex<Option<Instant>>>);

impl Validity {
    fn until(at: Instant) -> Validity {
        Validity(Arc::new(Mutex::new(Some(at))))
    }

    fn extend(&self, to: Instant) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_some_and(|t| t < to) {
            *g = Some(to);
        }
    }

    fn end(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() - Duration::from_millis(1));
    }

    /// Until when the lease may be trusted, by this process's clock (`None`: in-process
    /// leases, for ever).
    pub fn deadline(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True while the lease may still be trusted (always, for in-process leases).
    pub fn is_valid(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_none_or(|t| Instant::now() < t)
    }
}

/// Asks a [`Lease`] not to be let go cleanly: its next holder then counts as a takeover, a new
/// generation of writers ([`Lease::generation`]). Set by a holder that may have requests on their
/// way to the store that no commit records (S3 part numbers whose note failed): a holder of a new
/// generation skips past them (`blob::s3::state::Numbering::open`), while one that followed a
/// clean release would use them again. A catalog lease is then not released (it runs out, as a
/// crashed holder's does); an in-process lease counts the upload's next holder one generation on.
#[derive(Debug, Clone, Default)]
pub struct LetRunOut(Arc<AtomicBool>);

impl LetRunOut {
    /// Do not let the lease go cleanly (see the type).
    pub fn now(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn asked(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A held upload lease. Dropping it releases the lease (unless [`LetRunOut`] was asked).
pub struct Lease {
    stop: CancellationToken,
    fence: Option<u64>,
    /// Takeovers of the upload's catalog lease, this one included (`None` for in-process leases).
    takeovers: Option<u64>,
    validity: Validity,
    /// The upload's row as the catalog lease's grant read it ([`crate::catalog::LeaseGrant::row`]),
    /// until [`Lease::take_row`]; `None` for in-process leases.
    row: Option<Box<crate::catalog::UploadRecord>>,
    /// Asked by a holder that must not let go cleanly.
    run_out: LetRunOut,
    /// Releases on drop (the in-process slot, the catalog lease and its heartbeat).
    _hold: Box<dyn Send + Sync>,
}

impl Lease {
    /// Cancelled when another request wants this upload (or the lease was lost).
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// The lease's fencing token, for lockers that [`Locker::fences`].
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// The generation of writers this lease belongs to ([`crate::blob::WriteLease::generation`]):
    /// the catalog lease's takeover count; for in-process leases, whose writers of one upload
    /// follow one another (the next waits until the previous one let go of its slot), how many
    /// holders in this process did not let go cleanly ([`LetRunOut`]), 0 for most.
    pub fn generation(&self) -> u64 {
        self.takeovers.unwrap_or(0)
    }

    /// The handle that asks this lease not to be let go cleanly ([`LetRunOut`]).
    pub fn let_run_out(&self) -> LetRunOut {
        self.run_out.clone()
    }

    /// Whether the lease is still ours by our own clock; checked before each batch of bytes
    /// becomes part of the upload. A shared handle the writer keeps.
    pub fn validity(&self) -> Validity {
        self.validity.clone()
    }

    /// The upload's row as it stood when this lease was granted, once: what a holder would read
    /// first, without another catalog statement. `None` for in-process leases, and after the
    /// first call.
    pub fn take_row(&mut self) -> Option<crate::catalog::UploadRecord> {
        self.row.take().map(|r| *r)
    }
}

/// The in-process locker of a single server.
#[derive(Default)]
pub struct LocalLocker {
    table: Arc<WriterLocks>,
    /// Uploads whose holders in this process did not let go cleanly ([`LetRunOut`]), and how
    /// often: the generation their next holder belongs to.
    generations: Arc<Mutex<HashMap<String, u64>>>,
}

/// An in-process lease's hold: the slot, and on drop, if the holder asked ([`LetRunOut`]), the
/// upload's next generation.
struct LocalHold {
    guard: Option<WriteGuard>,
    id: String,
    run_out: LetRunOut,
    generations: Arc<Mutex<HashMap<String, u64>>>,
}

impl Drop for LocalHold {
    fn drop(&mut self) {
        if self.run_out.asked() {
            let mut g = self.generations.lock().unwrap_or_else(|p| p.into_inner());
            if g.len() >= FENCE_CACHE_MAX {
                // Starting over costs protection only for holders that failed long ago.
                g.clear();
            }
            *g.entry(std::mem::take(&mut self.id)).or_insert(0) += 1;
        }
        // The generation is counted before the slot is free: the next holder sees it.
        drop(self.guard.take());
    }
}

impl LocalLocker {
    pub fn new() -> LocalLocker {
        LocalLocker::default()
    }
}

#[async_trait]
impl Locker for LocalLocker {
    async fn acquire(&self, id: &str, want: Want, wait: Duration) -> Result<Lease, LockError> {
        let g = self.table.take(id, want, wait).await.ok_or(LockError::Locked)?;
        let generation = self.generations.lock().unwrap_or_else(|p| p.into_inner()).get(id).copied();
        let run_out = LetRunOut::default();
        let stop = g.stop.clone();
        let hold = LocalHold { guard: Some(g), id: id.to_string(), run_out: run_out.clone(), generations: self.generations.clone() };
        Ok(Lease { stop, fence: None, takeovers: generation, validity: Validity::default(), row: None, run_out, _hold: Box::new(hold) })
    }

    fn fences(&self) -> bool {
        false
    }
}

/// The fences this process took with [`Catalog::acquire_fence`] under in-process leases
/// ([`LocalLocker`]), kept from one writer of an upload to the next, so an upload's PATCHes make
/// one catalog commit each (the checkpoint) instead of two (fence + checkpoint).
///
/// Why reusing a fence is safe: with in-process leases one process serves the catalog (it holds
/// `DATA/lock`), and inside it only the holder of the upload's slot ever writes the upload, so
/// two writers never hold the same fence at once. Anything that fences writers out — expiry
/// (`mark_expired`, `expire_if_due`), a later `acquire_fence` — grows the catalog's fence, and
/// every checkpoint still checks it (`UPDATE … WHERE fence = ?`): a stale entry fails with
/// [`CatalogError::Fenced`] and is forgotten, so the next writer takes a fresh fence. Catalog
/// leases ([`CatalogLocker`]) never use this: their fence comes with each lease, because another
/// process may take the upload over between two requests.
#[derive(Default)]
pub struct FenceCache {
    fences: Mutex<HashMap<String, u64>>,
}

/// Entries kept at most; beyond it the cache starts over (a forgotten fence costs one
/// `acquire_fence` commit, never correctness).
const FENCE_CACHE_MAX: usize = 100_000;

impl FenceCache {
    /// The fence kept for upload `id`, if any.
    pub fn get(&self, id: &str) -> Option<u64> {
        self.fences.lock().unwrap_or_else(|p| p.into_inner()).get(id).copied()
    }

    /// Keep `fence` (just taken from the catalog) for upload `id`.
    pub fn keep(&self, id: &str, fence: u64) {
        let mut g = self.fences.lock().unwrap_or_else(|p| p.into_inner());
        if g.len() >= FENCE_CACHE_MAX {
            g.clear();
        }
        g.insert(id.to_string(), fence);
    }

    /// Forget upload `id`'s fence (it was fenced out, finished, terminated or expired).
    pub fn forget(&self, id: &str) {
        self.fences.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }

    /// Number of fences kept (for tests).
    pub fn len(&self) -> usize {
        self.fences.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Settings of a [`CatalogLocker`].
#[derive(Debug, Clone)]
pub struct CatalogLeaseConfig {
    /// Lease owner id of this process (stable across restarts of one data dir).
    pub owner: String,
    /// Lease length; renewed every third of it.
    pub ttl: Duration,
    /// How often a waiting taker retries while the holder lets go.
    pub retry: Duration,
}

/// Upload leases in a catalog shared by several processes.
pub struct CatalogLocker {
    catalog: Arc<dyn Catalog>,
    cfg: CatalogLeaseConfig,
    table: Arc<WriterLocks>,
    _listener: tokio::task::JoinHandle<()>,
}

impl CatalogLocker {
    /// Start listening for release requests from other processes.
    pub async fn start(catalog: Arc<dyn Catalog>, cfg: CatalogLeaseConfig) -> Result<CatalogLocker, CatalogError> {
        let table = Arc::new(WriterLocks::default());
        let mut requests = catalog.release_requests().await?;
        let (t, me) = (table.clone(), cfg.owner.clone());
        let listener = tokio::spawn(async move {
            while let Some(r) = requests.next().await {
                // Our own requests are for holders elsewhere (local holders were asked
                // through the in-process table already); stopping ourselves would make a taker
                // stop the very request it is acquiring for.
                if r.from != me {
                    t.request_stop(&r.upload_id);
                }
            }
        });
        Ok(CatalogLocker { catalog, cfg, table, _listener: listener })
    }

    fn ttl_ms(&self) -> i64 {
        self.cfg.ttl.as_millis() as i64
    }
}

impl Drop for CatalogLocker {
    fn drop(&mut self) {
        self._listener.abort();
    }
}

/// Held by a [`CatalogLocker`] lease: releases the catalog lease, then the in-process slot.
struct CatalogHold {
    catalog: Arc<dyn Catalog>,
    id: String,
    fence: u64,
    run_out: LetRunOut,
    heartbeat: tokio::task::JoinHandle<()>,
    local: Option<WriteGuard>,
}

impl Drop for CatalogHold {
    fn drop(&mut self) {
        self.heartbeat.abort();
        if let Some(local) = &self.local {
            local.letting_go();
        }
        let (catalog, id, fence, local) = (self.catalog.clone(), std::mem::take(&mut self.id), self.fence, self.local.take());
        if self.run_out.asked() {
            // Not released: the lease runs out, and its next holder is a takeover.
            tracing::info!(upload = id, "letting the upload's lease run out, so its next holder counts as a takeover");
            drop(local);
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = crate::catalog::retry_transient(|| catalog.release_upload_lease(&id, fence)).await {
                    tracing::warn!(upload = id, error = %e, "releasing an upload lease (it will expire)");
                }
                drop(local);
            });
        }
    }
}

#[async_trait]
impl Locker for CatalogLocker {
    async fn acquire(&self, id: &str, want: Want, wait: Duration) -> Result<Lease, LockError> {
        let deadline = tokio::time::Instant::now() + wait;
        // Same process first: stops a local holder without a catalog round trip.
        let local = self.table.take(id, want, wait).await.ok_or(LockError::Locked)?;
        let mut asked = false;
        loop {
            let sent = Instant::now();
            match self.catalog.acquire_upload_lease(id, &self.cfg.owner, self.ttl_ms()).await? {
                LeaseOutcome::Granted(g) => {
                    let validity = Validity::until(sent + self.cfg.ttl);
                    let heartbeat =
                        spawn_heartbeat(self.catalog.clone(), id.to_string(), g.fence, self.cfg.ttl, validity.clone(), local.stop.clone());
                    let stop = local.stop.clone();
                    let run_out = LetRunOut::default();
                    let hold = CatalogHold {
                        catalog: self.catalog.clone(),
                        id: id.to_string(),
                        fence: g.fence,
                        run_out: run_out.clone(),
                        heartbeat,
                        local: Some(local),
                    };
                    return Ok(Lease {
                        stop,
                        fence: Some(g.fence),
                        takeovers: Some(g.takeovers),
                        validity,
                        row: g.row,
                        run_out,
                        _hold: Box::new(hold),
                    });
                }
                LeaseOutcome::Held { .. } if want == Want::IfFree => return Err(LockError::Locked),
                LeaseOutcome::Held { .. } => {
                    if !asked {
                        self.catalog.request_release(id, &self.cfg.owner).await?;
                        asked = true;
                    }
                    if tokio::time::Instant::now() + self.cfg.retry > deadline {
                        return Err(LockError::Locked);
                    }
                    tokio::time::sleep(self.cfg.retry).await;
                }
            }
        }
    }

    fn fences(&self) -> bool {
        true
    }
}

/// Renew every third of `ttl`; on a lost lease, end validity and fire the holder's stop token.
fn spawn_heartbeat(
    catalog: Arc<dyn Catalog>,
    id: String,
    fence: u64,
    ttl: Duration,
    validity: Validity,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(ttl / 3).await;
            let sent = Instant::now();
            match catalog.renew_upload_lease(&id, fence, ttl.as_millis() as i64).await {
                Ok(_) => validity.extend(sent + ttl),
                Err(CatalogError::Fenced) | Err(CatalogError::NotFound) => {
                    validity.end();
                    stop.cancel();
                    return;
                }
                // The catalog is away: keep trying; validity runs out on its own if it stays away.
                Err(e) => tracing::warn!(upload = id, error = %e, "renewing an upload lease"),
            }
        }
    })
}

#[derive(Default)]
struct Slot {
    lock: Arc<tokio::sync::Mutex<()>>,
    /// The current holder's stop token.
    stop: Mutex<CancellationToken>,
    /// The holder does not give the slot up on request.
    pinned: AtomicBool,
    /// The holder is letting go already: its catalog lease's release is on its way, and the slot
    /// follows once the catalog has it ([`CatalogHold`]).
    releasing: AtomicBool,
}

/// The in-process table of upload slots.
#[derive(Default)]
pub struct WriterLocks {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

/// Held while a request owns an upload's slot; [`WriteGuard::stop`] fires when another request
/// asks for it.
pub struct WriteGuard {
    table: Arc<WriterLocks>,
    id: String,
    slot: Arc<Slot>,
    stop: CancellationToken,
    _guard: Option<OwnedMutexGuard<()>>,
    pinned: bool,
}

impl WriteGuard {
    /// Cancelled when another request wants this upload.
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// The holder is letting go (what keeps it is on its way): a request that wants the slot
    /// only if free waits for it instead of being refused.
    fn letting_go(&self) {
        self.slot.releasing.store(true, Ordering::SeqCst);
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        if self.pinned {
            self.slot.pinned.store(false, Ordering::SeqCst);
        }
        self.slot.releasing.store(false, Ordering::SeqCst);
        drop(self._guard.take());
        let mut slots = self.table.slots.lock().unwrap();
        // The map and this guard hold the only references: nobody waits, drop the slot.
        if Arc::strong_count(&self.slot) <= 2 {
            if let Some(s) = slots.get(&self.id) {
                if Arc::ptr_eq(s, &self.slot) {
                    slots.remove(&self.id);
                }
            }
        }
    }
}

impl WriterLocks {
    /// Take the slot of `id` as `want` says (see [`Want`]), waiting at most `wait`.
    /// `None` when the holder did not let go in time.
    pub async fn take(self: &Arc<Self>, id: &str, want: Want, wait: Duration) -> Option<WriteGuard> {
        let mut g = match want {
            Want::IfFree => self.acquire_if_free(id, wait).await?,
            Want::Takeover | Want::Pinned => self.acquire(id, wait).await?,
        };
        if want == Want::Pinned {
            g.slot.pinned.store(true, Ordering::SeqCst);
            g.pinned = true;
        }
        Some(g)
    }

    fn refuse(self: &Arc<Self>, id: &str, slot: Arc<Slot>) -> Option<WriteGuard> {
        drop(WriteGuard { table: self.clone(), id: id.to_string(), slot, stop: CancellationToken::new(), _guard: None, pinned: false });
        None
    }

    fn granted(self: &Arc<Self>, id: &str, slot: Arc<Slot>, guard: OwnedMutexGuard<()>) -> WriteGuard {
        let stop = CancellationToken::new();
        *slot.stop.lock().unwrap() = stop.clone();
        WriteGuard { table: self.clone(), id: id.to_string(), slot, stop, _guard: Some(guard), pinned: false }
    }

    /// Take the slot of `id` only if nobody holds it, never asking a holder to stop; a holder
    /// already letting go is waited for (at most `wait`), not refused: the next PATCH of an
    /// upload on a catalog lease usually arrives while the previous one's release is still on
    /// its way to the catalog (issue 24: it took the takeover path, a catalog read more).
    async fn acquire_if_free(self: &Arc<Self>, id: &str, wait: Duration) -> Option<WriteGuard> {
        let slot = self.slots.lock().unwrap().entry(id.to_string()).or_default().clone();
        let guard = match slot.lock.clone().try_lock_owned() {
            Ok(g) => g,
            Err(_) if slot.releasing.load(Ordering::SeqCst) => match tokio::time::timeout(wait, slot.lock.clone().lock_owned()).await {
                Ok(g) => g,
                Err(_) => return self.refuse(id, slot),
            },
            Err(_) => return self.refuse(id, slot),
        };
        Some(self.granted(id, slot, guard))
    }

    /// Take the slot of `id`, asking a current holder to stop and waiting at most `wait`.
    /// `None` when the holder did not let go in time.
    pub async fn acquire(self: &Arc<Self>, id: &str, wait: Duration) -> Option<WriteGuard> {
        let slot = self.slots.lock().unwrap().entry(id.to_string()).or_default().clone();
        let guard = match slot.lock.clone().try_lock_owned() {
            Ok(g) => g,
            Err(_) if slot.pinned.load(Ordering::SeqCst) => return self.refuse(id, slot),
            Err(_) => {
                slot.stop.lock().unwrap().cancel();
                match tokio::time::timeout(wait, slot.lock.clone().lock_owned()).await {
                    Ok(g) => g,
                    Err(_) => return self.refuse(id, slot),
                }
            }
        };
        Some(self.granted(id, slot, guard))
    }

    /// Take the slot of `id` like [`WriterLocks::acquire`] and keep it until the guard drops:
    /// later requests for `id` are refused at once.
    pub async fn acquire_pinned(self: &Arc<Self>, id: &str, wait: Duration) -> Option<WriteGuard> {
        self.take(id, Want::Pinned, wait).await
    }

    /// Ask the holder of `id`'s slot in this process, if any and not pinned, to let go (a
    /// release request from another process).
    pub fn request_stop(&self, id: &str) {
        let slot = self.slots.lock().unwrap().get(id).cloned();
        if let Some(slot) = slot {
            if !slot.pinned.load(Ordering::SeqCst) {
                slot.stop.lock().unwrap().cancel();
            }
        }
    }

    /// Number of live slots (for tests).
    pub fn len(&self) -> usize {
        self.slots.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn newcomer_stops_the_holder() {
        let locks = Arc::new(WriterLocks::default());
        let first = locks.acquire("a", Duration::from_secs(1)).await.unwrap();
        let stop = first.stop().clone();
        let holder = tokio::spawn(async move {
            stop.cancelled().await;
            drop(first);
        });
        let second = locks.acquire("a", Duration::from_secs(5)).await.expect("takes over");
        holder.await.unwrap();
        assert!(!second.stop().is_cancelled());
        drop(second);
        assert!(locks.is_empty(), "slots are dropped when free");
    }

    #[tokio::test]
    async fn a_pinned_holder_refuses_at_once_and_frees_on_drop() {
        let locks = Arc::new(WriterLocks::default());
        let pinned = locks.acquire_pinned("a", Duration::from_secs(1)).await.unwrap();
        let asked = pinned.stop().clone();
        assert!(locks.acquire("a", Duration::from_secs(3600)).await.is_none(), "refused without waiting");
        assert!(!asked.is_cancelled(), "a pinned holder is not asked to stop");
        drop(pinned);
        let next = locks.acquire("a", Duration::from_millis(50)).await.expect("free after the pin drops");
        drop(next);
        assert!(locks.is_empty());
    }

    #[tokio::test]
    async fn if_free_waits_for_a_holder_letting_go_and_refuses_one_that_is_not() {
        let locks = Arc::new(WriterLocks::default());
        let first = locks.take("a", Want::IfFree, Duration::from_secs(1)).await.unwrap();
        assert!(locks.take("a", Want::IfFree, Duration::from_secs(3600)).await.is_none(), "a working holder: refused at once");
        assert!(!first.stop().is_cancelled(), "and not asked to stop");
        first.letting_go();
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(first);
        });
        let second = locks.take("a", Want::IfFree, Duration::from_secs(5)).await.expect("waits for the holder letting go");
        release.await.unwrap();
        assert!(!second.slot.releasing.load(Ordering::SeqCst), "the new holder is not letting go");
        drop(second);
        assert!(locks.is_empty());
    }

    #[tokio::test]
    async fn a_holder_that_never_lets_go_times_out() {
        let locks = Arc::new(WriterLocks::default());
        let _first = locks.acquire("a", Duration::from_secs(1)).await.unwrap();
        assert!(locks.acquire("a", Duration::from_millis(50)).await.is_none());
        assert_eq!(locks.len(), 1);
    }

    /// A holder that may have store requests on their way that no commit records does not let
    /// go cleanly ([`LetRunOut`]): the next holder is one generation on, so it skips past what
    /// they may hold (issue 47 point 6); after a clean release the generation stays.
    #[tokio::test]
    async fn a_lease_let_run_out_makes_its_next_holder_a_new_generation() {
        let local = LocalLocker::new();
        let first = local.acquire("a", Want::Takeover, Duration::from_secs(1)).await.unwrap();
        assert_eq!(first.generation(), 0);
        drop(first);
        let clean = local.acquire("a", Want::Takeover, Duration::from_secs(1)).await.unwrap();
        assert_eq!(clean.generation(), 0, "after a clean release: the same generation");
        clean.let_run_out().now();
        drop(clean);
        let next = local.acquire("a", Want::Takeover, Duration::from_secs(1)).await.unwrap();
        assert_eq!(next.generation(), 1, "after a holder that did not let go cleanly: the next generation");
        assert_eq!(local.acquire("b", Want::IfFree, Duration::ZERO).await.unwrap().generation(), 0, "other uploads keep theirs");

        let dir = tempfile::tempdir().unwrap();
        let catalog: Arc<dyn Catalog> = Arc::new(crate::catalog::SqliteCatalog::open(&dir.path().join("c.db")).await.unwrap());
        let rec = crate::catalog::UploadRecord {
            id: "lease-run-out".into(),
            principal: "p".into(),
            length: Some(10),
            offset: 0,
            metadata: String::new(),
            hash_state: Vec::new(),
            sha256: None,
            expected_sha256: None,
            concat: crate::catalog::Concat::None,
            created_at_ms: 1_000,
            updated_at_ms: 1_000,
            expires_at_ms: None,
            finished_at_ms: None,
            expired: false,
            blob_state: Vec::new(),
            provisional: false,
        };
        catalog.create_upload(&rec).await.unwrap();
        let cfg = CatalogLeaseConfig { owner: "me".into(), ttl: Duration::from_millis(300), retry: Duration::from_millis(20) };
        let locker = CatalogLocker::start(catalog.clone(), cfg).await.unwrap();
        let first = locker.acquire(&rec.id, Want::Takeover, Duration::from_secs(5)).await.unwrap();
        let base = first.generation();
        drop(first);
        // The release is on its way (spawned); the next holder waits for it, not for the ttl.
        let clean = locker.acquire(&rec.id, Want::Takeover, Duration::from_secs(5)).await.unwrap();
        assert_eq!(clean.generation(), base, "after a clean release: the same generation");
        clean.let_run_out().now();
        drop(clean);
        let next = locker.acquire(&rec.id, Want::Takeover, Duration::from_secs(5)).await.unwrap();
        assert_eq!(next.generation(), base + 1, "the lease ran out unreleased: its next holder is a takeover");
    }
}
