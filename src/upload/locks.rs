//! One writer per upload, with release-on-request (DESIGN §3 "Concurrency").
//!
//! A request that needs an upload (HEAD, PATCH, DELETE) takes its slot. If a PATCH holds it,
//! the newcomer cancels that PATCH's stop token — the PATCH checkpoints what it has and ends —
//! and waits up to the take-over timeout for the slot, else the caller answers 423.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Slot {
    lock: Arc<tokio::sync::Mutex<()>>,
    /// The current holder's stop token.
    stop: Mutex<CancellationToken>,
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
}

impl WriteGuard {
    /// Cancelled when another request wants this upload.
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
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
            Err(_) => {
                slot.stop.lock().unwrap().cancel();
                match tokio::time::timeout(wait, slot.lock.clone().lock_owned()).await {
                    Ok(g) => g,
                    Err(_) => {
                        drop(WriteGuard { table: self.clone(), id: id.to_string(), slot, stop: CancellationToken::new(), _guard: None });
                        return None;
                    }
                }
            }
        };
        let stop = CancellationToken::new();
        *slot.stop.lock().unwrap() = stop.clone();
        Some(WriteGuard { table: self.clone(), id: id.to_string(), slot, stop, _guard: Some(guard) })
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
    async fn a_holder_that_never_lets_go_times_out() {
        let locks = Arc::new(WriterLocks::default());
        let _first = locks.acquire("a", Duration::from_secs(1)).await.unwrap();
        assert!(locks.acquire("a", Duration::from_millis(50)).await.is_none());
        assert_eq!(locks.len(), 1);
    }
}
