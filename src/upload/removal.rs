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

use crate::blob::{BlobError, Unreferenced};
use crate::catalog::CatalogResult;

use super::now_ms;

use super::UploadEngine;

/// Queued removals taken per round of [`UploadEngine::finish_removals`].
const REMOVALS_PAGE: u32 = 1000;

impl UploadEngine {
    /// Delete upload `id`'s row ([`crate::catalog::Catalog::delete_upload`], which queues the
    /// removal of its bytes in the same transaction): its bytes are then named by nothing.
    pub(super) async fn delete_row(&self, id: &str) -> CatalogResult<Unreferenced> {
        self.catalog.delete_upload(id).await?;
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
                    Err(e) => tracing::warn!(upload = id, error = %e, "could not remove the bytes of a deleted upload yet; tried again at the next sweep"),
                }
                seen.insert(id);
            }
            if ids.len() < REMOVALS_PAGE as usize {
                return Ok(n);
            }
        }
    }
}
