//! Work the engine does on its own: start-up recovery, the expiry sweeper, and building the
//! final upload of a concatenation (TUS 1.0 §Concatenation, concatenation-unfinished).

use std::sync::Arc;
use std::time::Duration;

use ferry_tus::TusError;
use futures::TryStreamExt;

use super::append::Appender;
use super::hash::RunningSha256;
use super::locks::WriteGuard;
use super::{now_ms, UploadEngine};
use crate::catalog::{Checkpoint, Concat, UploadRecord};

impl UploadEngine {
    /// Complete an upload created with `Upload-Length: 0`.
    pub(super) async fn complete_empty(self: &Arc<Self>, _guard: &WriteGuard, rec: &UploadRecord) -> Result<(), TusError> {
        let mut app = Appender::open(self, rec.clone(), 0, Some(0), None).await?;
        app.commit().await
    }

    /// Final uploads naming `part_id` whose parts are now all complete: each is ready for
    /// [`UploadEngine::build_final`] (the task kind `concat` runs it).
    pub async fn finals_ready(&self, part_id: &str) -> Result<Vec<String>, TusError> {
        let mut ready = Vec::new();
        for f in self.catalog.finals_waiting_on(part_id).await? {
            if self.final_ready(&f).await? {
                ready.push(f);
            }
        }
        Ok(ready)
    }

    /// Whether every part of unfinished final upload `id` is complete.
    pub async fn final_ready(&self, id: &str) -> Result<bool, TusError> {
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
            if let Err(e) = self.catalog.mark_expired(&f, now_ms()).await {
                tracing::error!(upload = f, error = %e, "expiring a final upload");
            }
            let _ = self.blobs.delete(&f).await;
            self.metrics.uploads_expired.inc();
        }
    }

    /// Build final upload `id` (TUS 1.0 §Concatenation) if every part is complete: copy the
    /// parts in order into its blob with the running sha256, then commit it finished. A no-op
    /// while parts are unfinished or once built. A declared sha256 that does not match deletes
    /// the final (460). Restartable: a crash mid-copy starts the copy again.
    pub async fn build_final(self: &Arc<Self>, id: &str) -> Result<(), TusError> {
        let Some(rec) = self.catalog.get_upload(id).await? else { return Ok(()) };
        let Concat::Final { parts, .. } = &rec.concat else { return Ok(()) };
        if rec.is_finished() || rec.expired {
            return Ok(());
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
        let total: u64 = sources.iter().filter_map(|r| r.length).sum();
        let guard = self.take(id).await?;
        let Some(rec) = self.catalog.get_upload(id).await? else { return Ok(()) };
        if rec.is_finished() {
            return Ok(());
        }
        let length_unset = rec.length.is_none();
        let mut app = Appender::open(self, rec, 0, Some(total), length_unset.then_some(total)).await?;
        for src in &sources {
            let mut stream = self.blobs.read(&src.id, 0..src.length.unwrap_or(0)).await?;
            while let Some(chunk) = stream.try_next().await.map_err(|e| super::internal("reading a part", e))? {
                app.write(chunk).await?;
            }
        }
        let result = app.commit().await;
        drop(guard);
        if let Err(e) = &result {
            if e.code == ferry_tus::ErrorCode::ChecksumMismatch {
                self.catalog.delete_upload(id).await?;
                self.blobs.delete(id).await?;
            }
        }
        result
    }

    /// Start-up recovery (DESIGN §2): cut every blob back to its recorded offset, so garbage
    /// past a checkpoint never becomes data. (Finals are rebuilt by their `concat` tasks.)
    /// In relaxed durability a blob may be *shorter* than its offset after a power loss: the
    /// upload is then rolled back to the bytes that survived (re-hashed once).
    pub async fn recover(self: &Arc<Self>) -> anyhow::Result<()> {
        for rec in self.catalog.list_unfinished().await? {
            if matches!(rec.concat, Concat::Final { .. }) {
                continue;
            }
            match self.blobs.len(&rec.id).await? {
                Some(len) if len > rec.offset => {
                    tracing::info!(upload = rec.id, len, offset = rec.offset, "truncating bytes past the last checkpoint");
                    self.blobs.truncate(&rec.id, rec.offset).await?;
                }
                Some(len) if len == rec.offset => {}
                found => {
                    let len = found.unwrap_or(0);
                    tracing::warn!(upload = rec.id, len, offset = rec.offset, "blob shorter than its checkpoint (relaxed durability?); rolling back");
                    if found.is_none() {
                        self.blobs.create(&rec.id).await?;
                    }
                    self.rehash_to(&rec, len).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                }
            }
        }
        Ok(())
    }

    async fn rehash_to(&self, rec: &UploadRecord, len: u64) -> Result<(), TusError> {
        let mut hasher = RunningSha256::new();
        let mut stream = self.blobs.read(&rec.id, 0..len).await?;
        while let Some(chunk) = stream.try_next().await.map_err(|e| super::internal("re-hashing", e))? {
            hasher.update(&chunk);
        }
        let fence = self.catalog.acquire_fence(&rec.id).await?;
        let now = now_ms();
        let cp = Checkpoint { offset: len, hash_state: hasher.state(), length: None, finished_sha256: None, expires_at_ms: self.expiry_from(now), now_ms: now };
        self.catalog.checkpoint(&rec.id, fence, &cp).await?;
        Ok(())
    }

    /// One sweep: expire unfinished uploads past their `Upload-Expires` (their bytes are
    /// deleted and the id answers 410), and forget tombstones older than the expiry period
    /// (the id then answers 404). Returns how many uploads expired.
    pub async fn sweep_once(&self) -> anyhow::Result<usize> {
        let now = now_ms();
        let ids = self.catalog.list_expired(now, 1000).await?;
        let mut n = 0;
        for id in ids {
            let Ok(_guard) = self.take(&id).await else { continue };
            match self.catalog.get_upload(&id).await? {
                Some(r) if !r.is_finished() && !r.expired && r.expires_at_ms.is_some_and(|e| e <= now_ms()) => {}
                _ => continue,
            }
            self.catalog.mark_expired(&id, now_ms()).await?;
            self.blobs.delete(&id).await?;
            self.metrics.uploads_expired.inc();
            self.part_gone(&id).await;
            n += 1;
        }
        let keep = self.cfg.expire_after.unwrap_or(Duration::ZERO).min(Duration::from_secs(24 * 3600));
        for id in self.catalog.list_tombstones(now - keep.as_millis() as i64, 1000).await? {
            self.catalog.delete_upload(&id).await?;
        }
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
