//! Work the engine does on its own: the expiry sweeper, rolling back an upload whose blob lost
//! bytes, and building the final upload of a concatenation (TUS 1.0 §Concatenation,
//! concatenation-unfinished).
//!
//! There is no start-up recovery pass: the process that takes an upload's lease repairs that
//! one upload when it opens the blob at the committed state (DESIGN §2 "recovery by the
//! taker"), so no process ever cuts bytes another process is writing.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Refusal;
use futures::TryStreamExt;

use super::append::Appender;
use super::hash::RunningSha256;
use super::locks::{Lease, Want};
use super::{now_ms, UploadEngine};
use crate::blob::BlobError;
use crate::catalog::{Checkpoint, Concat, UploadRecord};

impl UploadEngine {
    /// Complete an upload created with `Upload-Length: 0`.
    pub(super) async fn complete_empty(self: &Arc<Self>, lease: &Lease, rec: &UploadRecord) -> Result<(), Refusal> {
        let mut app = Appender::open(self, rec.clone(), 0, Some(0), None, lease).await?;
        app.commit().await
    }

    /// Final uploads naming `part_id` whose parts are now all complete: each is ready for
    /// [`UploadEngine::build_final`] (the task kind `concat` runs it).
    pub async fn finals_ready(&self, part_id: &str) -> Result<Vec<String>, Refusal> {
        let mut ready = Vec::new();
        for f in self.catalog.finals_waiting_on(part_id).await? {
            if self.final_ready(&f).await? {
                ready.push(f);
            }
        }
        Ok(ready)
    }

    /// Whether every part of unfinished final upload `id` is complete.
    pub async fn final_ready(&self, id: &str) -> Result<bool, Refusal> {
        let Some(rec) = self.catalog.get_upload(id).await? else { return Ok(false) };
        let Concat::Final { parts, .. } = &rec.concat else { return Ok(false) };
        if rec.is_finished() || rec.expired {
            return Ok(false);
        }
        for p in parts {
            match self.catalog.get_upload(p).await? {
                Some(r) if r.is_finished() && !r.expired => {}
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// A partial upload was terminated or expired: every unfinished final naming it can never
    /// complete, so it expires too (410, then 404) instead of waiting forever.
    pub(super) async fn part_gone(&self, part_id: &str) {
        let finals = match self.catalog.finals_waiting_on(part_id).await {
            Ok(f) => f,
            Err(e) => return tracing::error!(error = %e, "looking up final uploads"),
        };
        for f in finals {
            tracing::info!(upload = f, part = part_id, "a part is gone; the final upload expires");
            self.fences.forget(&f);
            match self.tombstone(&f).await {
                Ok(Some(gone)) => {
                    let _ = self.blobs.delete(&gone).await;
                    self.metrics.uploads_expired.inc();
                }
                // Finished meanwhile (compare-and-set): it keeps its bytes.
                Ok(None) => {}
                Err(e) => tracing::error!(upload = f, error = %e, "expiring a final upload"),
            }
        }
    }

    /// Build final upload `id` (TUS 1.0 §Concatenation) if every part is complete, then commit
    /// it finished with its sha256. A no-op while parts are unfinished or once built. A
    /// declared sha256 that does not match deletes the final (460). Parts that add up past the
    /// maximum upload size or the principal's bytes quota fail the final for good
    /// ([`super::failed_final`], 409; see `super::concat`). Restartable: a crash
    /// mid-way builds it again.
    ///
    /// Where the blob store can compose inside itself ([`crate::blob::BlobStore::compose`];
    /// S3: UploadPartCopy for every stretch of ≥ 5 MiB), the bytes are not written again: they
    /// are only read for the sha256, and not even that for the first part, whose committed
    /// midstate is where the final's hash starts. Otherwise every part is copied through a
    /// writer with the running sha256.
    pub async fn build_final(self: &Arc<Self>, id: &str) -> Result<(), Refusal> {
        let Some(rec) = self.catalog.get_upload(id).await? else { return Ok(()) };
        let Concat::Final { parts, .. } = &rec.concat else { return Ok(()) };
        if rec.is_finished() {
            return Ok(());
        }
        if rec.expired {
            return match self.failure_of(&rec).await? {
                Some(f) => Err(super::failed_final(id, &f)),
                None => Ok(()),
            };
        }
        let mut sources = Vec::with_capacity(parts.len());
        for p in parts {
            match self.catalog.get_upload(p).await? {
                Some(r) if r.is_finished() && !r.expired => sources.push(r),
                Some(_) => return Ok(()),
                None => {
                    self.part_gone(p).await;
                    return Ok(());
                }
            }
        }
        let total = sources.iter().filter_map(|r| r.length).fold(0u64, u64::saturating_add);
        let guard = self.take(id).await?;
        let Some(rec) = self.catalog.get_upload(id).await? else { return Ok(()) };
        if rec.is_finished() {
            return Ok(());
        }
        if let Some(f) = self.failure_of(&rec).await? {
            return Err(super::failed_final(id, &f));
        }
        if rec.expired {
            return Ok(());
        }
        // Parts whose lengths were declared after the final's creation may add up past a limit
        // the declarations could not see (two at once, a limit lowered since): that build can
        // never succeed, and the final says so for good (see `super::concat`).
        if let Some(refused) = self.final_over_limit(&rec, &sources).await {
            return Err(refused);
        }
        let length_unset = rec.length.is_none();
        // A final whose parts' lengths were not all known at its creation (concatenation of
        // unfinished parts) reserves its whole length in the bytes quota now, before any copy.
        let (_, _room) = if length_unset { self.patch_room(&rec, Some(total), 0).await? } else { (None, None) };
        let result = match self.compose_final(&rec, &sources, total, &guard).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                let mut app = Appender::open(self, rec, 0, Some(total), length_unset.then_some(total), &guard).await?;
                // The copy shares the free-space reserve with every other writer: a join that
                // would eat into it stops (507; the final is built again later, from the start).
                let mut space = super::exhausted::SpaceWatch::default();
                for src in &sources {
                    let mut stream = self.read(src, 0..src.length.unwrap_or(0)).await?;
                    while let Some(chunk) = stream.try_next().await.map_err(|e| Refusal::from(BlobError::from_stream(e)))? {
                        if let Err(detail) = space.check(&self.cfg.reserve, app.position() + chunk.len() as u64, app.unwritten()) {
                            return Err(Refusal::insufficient_storage(detail, None));
                        }
                        app.write(chunk).await?;
                    }
                }
                app.commit().await
            }
            Err(e) => Err(e),
        };
        drop(guard);
        if let Err(e) = &result {
            if e.code == crate::error::ErrorCode::ChecksumMismatch {
                let gone = self.delete_row(id).await?;
                self.remove_bytes_later_if_need_be(&gone).await;
            }
        }
        result
    }

    /// Build final `rec` inside the blob store ([`crate::blob::BlobStore::compose`]) and
    /// commit it finished under `lease`; `false` when the store cannot (nothing changed).
    async fn compose_final(self: &Arc<Self>, rec: &UploadRecord, sources: &[UploadRecord], total: u64, lease: &Lease) -> Result<bool, Refusal> {
        let list: Vec<(String, u64)> = sources.iter().map(|r| (r.id.clone(), r.length.unwrap_or(0))).collect();
        // Every change the composition makes is made under the final's lease: a composer that
        // stalled past it changes nothing (and never removes a final another one finished).
        let under = UploadEngine::write_lease(lease, total);
        let composed = match self.blobs.compose(&rec.id, &list, &under).await {
            // A part the catalog calls finished whose object is not whole yet (its finish was
            // left to the first read): finish the parts, then compose again.
            Err(BlobError::NotFound) => {
                for src in sources {
                    self.blobs.finish(&src.id, &self.blob_state_of(src).await?).await?;
                }
                self.blobs.compose(&rec.id, &list, &under).await?
            }
            r => r?,
        };
        if !composed {
            return Ok(false);
        }
        // The final's sha256: the first part's committed midstate, then the others' bytes.
        let mut hasher = match sources.first() {
            Some(first) => UploadEngine::hash_state_of(first)?,
            None => RunningSha256::new(),
        };
        for src in sources.iter().skip(1) {
            let mut stream = self.read(src, 0..src.length.unwrap_or(0)).await?;
            while let Some(chunk) = stream.try_next().await.map_err(|e| Refusal::from(BlobError::from_stream(e)))? {
                hasher.update(&chunk);
            }
        }
        let digest = hasher.digest();
        if rec.expected_sha256.is_some_and(|e| e != digest) {
            return Err(ferry_tus::upload_digest_mismatch().into());
        }
        if let Some(hooks) = self.hooks.get().filter(|h| h.has_pre_finish()) {
            // Asked as for any other upload before it is called finished. If the hook cannot
            // answer, the final stays unfinished and is composed again later (the background
            // finisher, or the client's retry); if it refuses, the final and its bytes go.
            let finishing =
                super::hooks::FinishingUpload { id: &rec.id, principal: &rec.principal, size: total, sha256: digest, metadata: &rec.metadata };
            if let Err(e) = hooks.pre_finish(&finishing).await {
                if e.code == crate::error::ErrorCode::Rejected {
                    // The row first; it queues its bytes (`super::removal`).
                    let gone = self.delete_row(&rec.id).await?;
                    self.remove_bytes_later_if_need_be(&gone).await;
                }
                return Err(e);
            }
        }
        let fence = self.fence_for(&rec.id, lease).await?;
        let now = now_ms();
        let cp = Checkpoint {
            offset: total,
            hash_state: hasher.state(),
            // The composed object is whole already; a finished S3 blob needs no part list.
            blob_state: Vec::new(),
            blob_entries_from: Some(0),
            length: rec.length.is_none().then_some(total),
            finished_sha256: Some(digest),
            expires_at_ms: None,
            now_ms: now,
        };
        self.catalog.checkpoint(&rec.id, fence, &cp).await.map_err(|e| self.fenced(&rec.id, e))?;
        self.commits.tell(&rec.id, Some(total));
        self.fences.forget(&rec.id);
        self.metrics.uploads_finished.inc();
        Ok(true)
    }

    /// Whether the blob's first `rec.offset` bytes hash to the checkpointed sha256 midstate
    /// (read once, start to end): the check a blob store without synced checkpoints needs
    /// before an upload resumes after a restart (issue 48, kind 9).
    pub(super) async fn stored_bytes_match(&self, rec: &UploadRecord) -> Result<bool, Refusal> {
        let want = UploadEngine::hash_state_of(rec)?.digest();
        let mut hasher = RunningSha256::new();
        let mut stream = self.blobs.read(&rec.id, 0..rec.offset).await?;
        while let Some(chunk) = stream.try_next().await.map_err(|e| super::internal("re-hashing", e))? {
            hasher.update(&chunk);
        }
        let same = hasher.digest() == want;
        if !same {
            tracing::warn!(
                upload = rec.id,
                offset = rec.offset,
                "the stored bytes of an unfinished upload do not match its checkpoint (a power loss in relaxed durability); rolling back to 0"
            );
        }
        Ok(same)
    }

    /// Roll upload `rec` back to the `len` bytes its blob still has (relaxed durability after
    /// a power loss; an S3 multipart upload a lifecycle rule aborted), re-hashing them once,
    /// under the caller's `fence`; the blob is started again ([`crate::blob::BlobStore::reset`])
    /// only under its write lease `lease`.
    pub(super) async fn roll_back_to(&self, rec: &UploadRecord, len: u64, fence: u64, lease: &crate::blob::WriteLease) -> Result<(), Refusal> {
        tracing::warn!(
            upload = rec.id,
            len,
            offset = rec.offset,
            "the blob store holds fewer of this upload's bytes than its checkpoint; rolling back to what it holds"
        );
        let mut hasher = RunningSha256::new();
        if len > 0 {
            let mut stream = self.blobs.read(&rec.id, 0..len).await?;
            while let Some(chunk) = stream.try_next().await.map_err(|e| super::internal("re-hashing", e))? {
                hasher.update(&chunk);
            }
        } else {
            // Nothing survives: start the blob again (S3: a lost multipart upload's markers and
            // tail go with it).
            self.blobs.reset(&rec.id, lease).await?;
        }
        let now = now_ms();
        let cp = Checkpoint {
            offset: len,
            hash_state: hasher.state(),
            // The store's own state is unknown after a loss; the empty state means "as found".
            blob_state: Vec::new(),
            blob_entries_from: Some(0),
            length: None,
            finished_sha256: None,
            expires_at_ms: self.expiry_from(now),
            now_ms: now,
        };
        self.catalog.checkpoint(&rec.id, fence, &cp).await?;
        self.commits.tell(&rec.id, Some(len));
        Ok(())
    }

    /// One sweep: expire unfinished uploads past their `Upload-Expires` (their bytes are
    /// deleted and the id answers 410), remove finished files past their principal's
    /// `retain_finished` the same way, and forget tombstones older than the expiry period
    /// (the id then answers 404). Returns how many uploads expired.
    ///
    /// Safe on every replica at once and never against a live writer: an upload whose lease
    /// is held (in this process or, through the catalog, in another) is alive and skipped —
    /// the sweep never asks a holder to stop — and the tombstone is a compare-and-set
    /// ([`crate::catalog::Catalog::expire_if_due`]) re-checked under the lease.
    pub async fn sweep_once(&self) -> anyhow::Result<usize> {
        let now = now_ms();
        let ids = self.catalog.list_expired(now, 1000).await?;
        let mut n = 0;
        for id in ids {
            // In-process leases live only in this process's table: a held slot means a live
            // writer. Catalog leases are checked by `expire_if_due` itself, in the same atomic
            // step as the tombstone (taking one here would make the sweeper its own obstacle).
            let _slot = if self.locker.fences() {
                None
            } else {
                match self.locker.acquire(&id, Want::IfFree, Duration::ZERO).await {
                    Ok(l) => Some(l),
                    // Held: someone is writing it, so it is alive. Gone: swept meanwhile.
                    Err(_) => continue,
                }
            };
            let Some(gone) = self.tombstone_if_due(&id).await? else {
                continue;
            };
            self.fences.forget(&id);
            if let Err(e) = self.blobs.delete(&gone).await {
                // The tombstone remembers the id: its bytes are aborted again before it is
                // forgotten (below), so a blob store that is away now leaks nothing.
                tracing::warn!(upload = id, error = %e, "expired, but its bytes could not be removed yet");
            }
            self.metrics.uploads_expired.inc();
            self.part_gone(&id).await;
            n += 1;
        }
        if self.cfg.limits.any_retention() {
            n += self.sweep_retention().await?;
        }
        let keep = self.cfg.expire_after.unwrap_or(Duration::ZERO).min(Duration::from_secs(24 * 3600));
        let before = now - keep.as_millis() as i64;
        for gone in self.tombstones(before, 1000).await? {
            // Idempotent; the last chance to remove bytes an earlier removal could not (a blob
            // store that was away): a tombstone is only forgotten once they are gone. `delete`
            // removes a finished object (retention) and what an unfinished one left alike.
            if let Err(e) = self.blobs.delete(&gone).await {
                tracing::warn!(upload = gone.id(), error = %e, "keeping the tombstone until its bytes can be removed");
                continue;
            }
            if self.catalog.delete_tombstone(gone.id(), before).await? {
                // Deleting the row queued its bytes, which are gone already (`super::removal`).
                self.catalog.forget_blob_removal(gone.id()).await?;
            }
        }
        // Bytes of deleted rows that a crash or a store away left behind.
        self.finish_removals().await?;
        // Blobs of creations killed before they recorded their rows.
        self.remove_strays().await?;
        Ok(n)
    }

    /// Run [`UploadEngine::sweep_once`] every `sweep_interval` until shutdown.
    pub fn spawn_sweeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = me.shutdown.cancelled() => break,
                    _ = tokio::time::sleep(me.cfg.sweep_interval) => {}
                }
                if let Err(e) = me.sweep_once().await {
                    tracing::error!(error = %e, "expiry sweep failed");
                }
            }
        })
    }
}
