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

use crate::blob::BlobError;

use super::UploadEngine;

/// Queued removals taken per round of [`UploadEngine::finish_removals`].
const REMOVALS_PAGE: u32 = 1000;

impl UploadEngine {
    /// Remove what the blob store holds under `id`, whose row is gone (its removal queued by
    /// the catalog), then forget the queued removal. Idempotent.
    pub(crate) async fn remove_bytes(&self, id: &str) -> Result<(), BlobError> {
        // `delete` removes everything stored under the id, finished or not (fs: the file, then
        // the directory's fsync; S3: object, markers, tail and multipart uploads).
        self.blobs.delete(id).await?;
        if let Err(e) = self.catalog.forget_blob_removal(id).await {
            // The bytes are gone; the queued id is removed again (a no-op) and forgotten later.
            tracing::warn!(upload = id, error = %e, "removed an upload's bytes but could not forget its queued removal");
        }
        Ok(())
    }

    /// [`UploadEngine::remove_bytes`], a failure only logged: the removal stays queued and the
    /// next sweep (or start) finishes it.
    pub(crate) async fn remove_bytes_later_if_need_be(&self, id: &str) {
        if let Err(e) = self.remove_bytes(id).await {
            tracing::warn!(upload = id, error = %e, "the upload is gone but its bytes could not be removed yet; the sweeper removes them");
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
                match self.remove_bytes(&id).await {
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
