//! Removing an upload: the row first, then the bytes (issue 48).
//!
//! The catalog's row is the truth (DESIGN §2), so it goes first: deleting it queues its id for
//! byte removal in the same transaction (`blob_removals`, a trigger on every delete of an
//! upload row, so no path can forget it), and only then are the bytes removed — fs: the unlink
//! and its directory's fsync; S3: every object and multipart upload of the id — and the queued
//! id forgotten. A crash (or a blob store that is away) in between leaves the id queued: the
//! next start and every sweep remove what is left ([`UploadEngine::finish_removals`]). So a
//! client never sees a finished upload whose bytes are gone (the old order, bytes first, left
//! one after a kill -9 between the two: HEAD finished, GET `damaged`), and no bytes outlive
//! every record of them (an orphan `ferry check` would report for ever).
//!
//! The rule is in the types: [`crate::blob::BlobStore::delete`] takes an [`Unreferenced`], the
//! evidence that no record names the bytes, and this file is the only one in `src/` that makes
//! one (`tests/layers.rs`, `REMOVAL_GRANTORS`) — each from the catalog step that released the
//! row: a deletion, a tombstone (expiry, a final that can never be built, retention), a row
//! that was never written, or a queued removal.
//!
//! A creation makes its blob before its row. A process killed between the two leaves a blob
//! no row names (S3: a `.created` marker), and nothing queued it: [`UploadEngine::remove_strays`]
//! finds such blobs at start and in sweeps and removes each that still has no row
//! [`STRAY_GRACE`] after it was first seen without one. A creation still in flight is never
//! one of them: it records its row within [`CREATION_DEADLINE`] of making its blob, or
//! removes the blob and refuses ([`UploadEngine::in_time_to_record`]), and the grace is twice
//! that.

use crate::blob::{BlobError, Unreferenced};
use crate::catalog::{BlobClaim, CatalogResult};

use super::now_ms;

use super::UploadEngine;

/// How long after making its blob a creation may still record its row
/// ([`UploadEngine::in_time_to_record`]): S3's bounded PUT of the marker (10 s) and then some.
pub const CREATION_DEADLINE: std::time::Duration = std::time::Duration::from_secs(20);

/// How long a blob stays without a row, from when a search first saw it so, before it is taken
/// for a creation's leftover and removed: twice [`CREATION_DEADLINE`], so every creation in
/// flight when it was first seen has recorded its row or given up.
pub const STRAY_GRACE: std::time::Duration = std::time::Duration::from_secs(40);

/// Sweeps between two searches for strays ([`UploadEngine::remove_strays`]): each lists the
/// whole store and looks every blob up, so not every sweep (with the default `sweep_interval`
/// of 60 s, one search an hour, and one at the first sweep after a start).
pub const SWEEPS_PER_STRAY_SEARCH: u32 = 60;

/// What [`UploadEngine::remove_strays`] remembers between searches: the blobs seen without a
/// row, with when first seen so, and when it last searched.
#[derive(Debug, Default)]
pub struct Strays {
    seen: std::collections::HashMap<String, std::time::Instant>,
    last: Option<std::time::Instant>,
}

/// Queued removals taken per round of [`UploadEngine::finish_removals`].
const REMOVALS_PAGE: u32 = 1000;

impl UploadEngine {
    /// Delete upload `id`'s row ([`crate::catalog::Catalog::delete_upload`], which queues the
    /// removal of its bytes in the same transaction): its bytes are then named by nothing.
    pub(super) async fn delete_row(&self, id: &str) -> CatalogResult<Unreferenced> {
        self.catalog.delete_upload(id).await?;
        self.commits.tell(id, None);
        Ok(Unreferenced::vouched(id))
    }

    /// Withdraw refused creation `id` ([`crate::catalog::Catalog::withdraw_upload`]): `Some`
    /// once its row is gone, `None` when it was kept (announced meanwhile, or gone already).
    pub(super) async fn withdraw_row(&self, id: &str) -> CatalogResult<Option<Unreferenced>> {
        Ok(self.catalog.withdraw_upload(id).await?.then(|| Unreferenced::vouched(id)))
    }

    /// Tombstone unfinished upload `id` now, whatever its expiry
    /// ([`crate::catalog::Catalog::mark_expired`]): `None` when it finished meanwhile (it
    /// keeps its bytes).
    pub(super) async fn tombstone(&self, id: &str) -> CatalogResult<Option<Unreferenced>> {
        Ok(self.catalog.mark_expired(id, now_ms()).await?.then(|| Unreferenced::vouched(id)))
    }

    /// The expiry sweep's tombstone ([`crate::catalog::Catalog::expire_if_due`]): `Some` when
    /// this call expired `id`.
    pub(super) async fn tombstone_if_due(&self, id: &str) -> CatalogResult<Option<Unreferenced>> {
        Ok(self.catalog.expire_if_due(id, now_ms()).await?.then(|| Unreferenced::vouched(id)))
    }

    /// Retention's tombstone of finished upload `id` finished before `before_ms`
    /// ([`crate::catalog::Catalog::expire_finished_if_due`]): `Some` when this call removed it.
    pub(super) async fn tombstone_finished_if_due(&self, id: &str, before_ms: i64) -> CatalogResult<Option<Unreferenced>> {
        Ok(self.catalog.expire_finished_if_due(id, before_ms, now_ms()).await?.then(|| Unreferenced::vouched(id)))
    }

    /// Tombstones marked before `before_ms` (at most `limit`): their bytes were released when
    /// they were marked, and may be removed again before the tombstone is forgotten.
    pub(super) async fn tombstones(&self, before_ms: i64, limit: u32) -> CatalogResult<Vec<Unreferenced>> {
        Ok(self.catalog.list_tombstones(before_ms, limit).await?.into_iter().map(Unreferenced::vouched).collect())
    }

    /// The blob created for new upload `id` whose row was never written (its insert failed, or
    /// a concurrent creation under the same idempotency key won it): nothing ever named it.
    pub(super) fn never_recorded(id: &str) -> Unreferenced {
        Unreferenced::vouched(id)
    }

    /// The one exception to "the row first": on a disk so full that the catalog cannot write
    /// even the deletion of upload `id`, which a client asked to delete, its bytes go first to
    /// make room (the only order that can succeed there), and then the row
    /// (`UploadEngine::delete_record_and_bytes`).
    pub(super) fn bytes_first_on_a_full_disk(id: &str) -> Unreferenced {
        Unreferenced::vouched(id)
    }

    /// Remove what the blob store holds under `gone`'s id, then forget its queued removal (if
    /// any). Idempotent.
    pub(crate) async fn remove_bytes(&self, gone: &Unreferenced) -> Result<(), BlobError> {
        // `delete` removes everything stored under the id, finished or not (fs: the file, then
        // the directory's fsync; S3: object, markers, tail and multipart uploads).
        self.blobs.delete(gone).await?;
        if let Err(e) = self.catalog.forget_blob_removal(gone.id()).await {
            // The bytes are gone; the queued id is removed again (a no-op) and forgotten later.
            tracing::warn!(upload = gone.id(), error = %e, "removed an upload's bytes but could not forget its queued removal");
        }
        Ok(())
    }

    /// [`UploadEngine::remove_bytes`], a failure only logged: the removal stays queued (or the
    /// tombstone kept) and the next sweep (or start) finishes it.
    pub(crate) async fn remove_bytes_later_if_need_be(&self, gone: &Unreferenced) {
        if let Err(e) = self.remove_bytes(gone).await {
            tracing::warn!(upload = gone.id(), error = %e, "the upload is gone but its bytes could not be removed yet; the sweeper removes them");
        }
    }

    /// Remove the bytes of every upload whose row was deleted but whose bytes were not (a crash
    /// or a blob store away between the two). Run at start and by every sweep; safe on every
    /// replica at once (removal is idempotent, and a queued id never has a row again). Returns
    /// how many were removed.
    pub async fn finish_removals(&self) -> anyhow::Result<usize> {
        let mut n = 0;
        // Each id once per call: one that fails (or whose forgetting fails) waits for the next.
        let mut seen = std::collections::HashSet::new();
        loop {
            let ids = self.catalog.list_blob_removals(REMOVALS_PAGE).await?;
            let fresh: Vec<String> = ids.iter().filter(|id| !seen.contains(*id)).cloned().collect();
            if fresh.is_empty() {
                return Ok(n);
            }
            for id in fresh {
                match self.remove_bytes(&Unreferenced::vouched(id.as_str())).await {
                    Ok(()) => n += 1,
                    Err(e) => {
                        tracing::warn!(upload = id, error = %e, "could not remove the bytes of a deleted upload yet; tried again at the next sweep")
                    }
                }
                seen.insert(id);
            }
            if ids.len() < REMOVALS_PAGE as usize {
                return Ok(n);
            }
        }
    }

    /// Before creation `id` records its row: `Ok` while that is within [`CREATION_DEADLINE`]
    /// of `began` (just before its blob was made). Later — the process stalled (SIGSTOP, a
    /// catalog that hung) — the blob may be taken for a leftover ([`STRAY_GRACE`]): the
    /// creation removes it itself and answers 503, and the client creates again.
    pub(super) async fn in_time_to_record(&self, id: &str, began: std::time::Instant) -> Result<(), crate::error::Refusal> {
        if began.elapsed() < CREATION_DEADLINE {
            return Ok(());
        }
        tracing::warn!(
            upload = id,
            waited_ms = began.elapsed().as_millis() as u64,
            "a creation stalled between making its blob and recording it; refused"
        );
        let _ = self.blobs.delete(&UploadEngine::never_recorded(id)).await;
        Err(crate::error::Refusal::unavailable("the server was held up while creating this upload; nothing was created"))
    }

    /// Remove blobs that no row names and nothing queued (a creation killed between making its
    /// blob and recording its row), at most once every [`SWEEPS_PER_STRAY_SEARCH`] sweeps: each
    /// id the store lists with nothing in the catalog naming it ([`BlobClaim::Unclaimed`]) is
    /// remembered the first time, and removed when a later search, at least [`STRAY_GRACE`]
    /// on, still lists it unclaimed. Ids that are no upload id are left alone. Returns how many
    /// were removed. Safe on every replica at once (a removal is idempotent, and an id with no
    /// row that long never gets one: see [`CREATION_DEADLINE`]).
    pub async fn remove_strays(&self) -> anyhow::Result<usize> {
        let now = std::time::Instant::now();
        let every = (self.cfg.sweep_interval * SWEEPS_PER_STRAY_SEARCH).max(STRAY_GRACE);
        if self.strays.lock().unwrap_or_else(|p| p.into_inner()).last.is_some_and(|at| now.duration_since(at) < every) {
            return Ok(0);
        }
        let listed = self.blobs.inventory().await?.blobs;
        let before = std::mem::take(&mut self.strays.lock().unwrap_or_else(|p| p.into_inner()).seen);
        let mut seen = std::collections::HashMap::new();
        let mut n = 0;
        // Each candidate is looked up after the listing: a row recorded meanwhile keeps its blob.
        for id in listed.into_iter().filter(|id| super::is_valid_id(id)) {
            if self.catalog.blob_claim(&id).await? != BlobClaim::Unclaimed {
                continue;
            }
            let first = before.get(&id).copied().unwrap_or(now);
            if now.duration_since(first) < STRAY_GRACE {
                seen.insert(id, first);
                continue;
            }
            tracing::warn!(upload = id, "removing a blob no upload names (a creation stopped before it recorded the upload)");
            match self.remove_bytes(&UploadEngine::never_recorded(&id)).await {
                Ok(()) => n += 1,
                Err(e) => {
                    tracing::warn!(upload = id, error = %e, "could not remove a blob no upload names yet; tried again at the next search");
                    seen.insert(id, first);
                }
            }
        }
        *self.strays.lock().unwrap_or_else(|p| p.into_inner()) = Strays { seen, last: Some(now) };
        Ok(n)
    }
}
