//! One writer per upload, with release-on-request (DESIGN §3 "Concurrency").
//!
//! A request that needs an upload (HEAD, PATCH, DELETE) takes its slot. If a PATCH holds it,
//! the newcomer cancels that PATCH's stop token — the PATCH checkpoints what it has and ends —
//! and waits up to the take-over timeout for the slot, else the caller answers 423.
//!
//! A task writing one of its output files holds the slot *pinned*: it never lets go before
//! the file is finished, so a newcomer is refused at once (423) instead of waiting.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Slot {
    lock: Arc<tokio::sync::Mutex<()>>,
    /// The current holder's stop token.
    stop: Mutex<CancellationToken>,
    /// The holder does not give the slot up on request.
    pinned: AtomicBool,
}

/// The in-process table of upload slots.
#[derive(Default)]
pub struct WriterLocks {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

/// Held while a request owns an upload; [`WriteGuard::stop`] fires when another request
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
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        if self.pinned {
            self.slot.pinned.store(false, Ordering::SeqCst);
        }
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
    /// Take the slot of `id`, asking a current holder to stop and waiting at most `wait`.
    /// `None` when the holder did not let go in time.
    pub async fn acquire(self: &Arc<Self>, id: &str, wait: Duration) -> Option<WriteGuard> {
        let slot = self.slots.lock().unwrap().entry(id.to_string()).or_default().clone();
        let guard = match slot.lock.clone().try_lock_owned() {
            Ok(g) => g,
            Err(_) if slot.pinned.load(Ordering::SeqCst) => {
                drop(WriteGuard { table: self.clone(), id: id.to_string(), slot, stop: CancellationToken::new(), _guard: None, pinned: false });
                return None;
            }
            Err(_) => {
                slot.stop.lock().unwrap().cancel();
                match tokio::time::timeout(wait, slot.lock.clone().lock_owned()).await {
                    Ok(g) => g,
                    Err(_) => {
                        drop(WriteGuard { table: self.clone(), id: id.to_string(), slot, stop: CancellationToken::new(), _guard: None, pinned: false });
                        return None;
                    }
                }
            }
        };
        let stop = CancellationToken::new();
        *slot.stop.lock().unwrap() = stop.clone();
        Some(WriteGuard { table: self.clone(), id: id.to_string(), slot, stop, _guard: Some(guard), pinned: false })
    }

    /// Take the slot of `id` like [`WriterLocks::acquire`] and keep it until the guard drops:
    /// later requests for `id` are refused at once.
    pub async fn acquire_pinned(self: &Arc<Self>, id: &str, wait: Duration) -> Option<WriteGuard> {
        let mut g = self.acquire(id, wait).await?;
        g.slot.pinned.store(true, Ordering::SeqCst);
        g.pinned = true;
        Some(g)
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
    async fn a_holder_that_never_lets_go_times_out() {
        let locks = Arc::new(WriterLocks::default());
        let _first = locks.acquire("a", Duration::from_secs(1)).await.unwrap();
        assert!(locks.acquire("a", Duration::from_millis(50)).await.is_none());
        assert_eq!(locks.len(), 1);
    }
}
