//! Per-principal limits (issue 13 item 4): quotas on bytes stored and uploads in progress,
//! checked against the catalog (so they hold across replicas), and retention of finished files,
//! removed by the expiry sweeper like an expired upload (`upload.expired`, 410 then 404).
//!
//! What counts (see [`crate::catalog::Usage`]): every live upload of the principal reserves its
//! length when known, else its durable offset; a tombstone or an unfinished upload past its
//! expiry counts nothing. Creation (TUS POST, the IETF draft, MCP `file_upload_begin`, a final
//! concatenation, a task's output file) is checked in the catalog transaction that inserts the
//! row. A deferred-length upload (or a task's file) reserves room in the catalog, under the same
//! lock, before bytes arrive: a PATCH the room its body can use (all of it for a body of unknown
//! length), a length declared the whole length, a task's file 16 MiB ahead of what it wrote; so
//! no mix of concurrent writers and replicas stores more than the quota.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::{QuotaDetail, Refusal};

use super::{now_ms, UploadEngine};
use crate::catalog::{PrincipalScope, Quota, UploadRecord};

/// One principal's limits; `None` = unlimited / kept until deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes stored (`max_bytes`).
    pub max_bytes: Option<u64>,
    /// Most unfinished uploads at once (`max_uploads_in_progress`).
    pub max_uploads_in_progress: Option<u64>,
    /// Finished files are removed this long after they finished (`retain_finished`).
    pub retain_finished: Option<Duration>,
}

impl Limits {
    /// The part the catalog enforces.
    pub fn quota(&self) -> Quota {
        Quota { max_bytes: self.max_bytes, max_uploads_in_progress: self.max_uploads_in_progress }
    }
}

/// `[limits]`: a default for every principal, and principals' own (already merged over the
/// default: a key a principal's table leaves out is the default's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrincipalLimits {
    pub default: Limits,
    pub principals: BTreeMap<String, Limits>,
}

impl PrincipalLimits {
    /// The limits of `principal`.
    pub fn of(&self, principal: &str) -> Limits {
        self.principals.get(principal).copied().unwrap_or(self.default)
    }

    /// Whether any retention is configured (the sweeper has work).
    pub fn any_retention(&self) -> bool {
        self.default.retain_finished.is_some() || self.principals.values().any(|l| l.retain_finished.is_some())
    }
}

/// Room a writer holds in its principal's bytes quota ([`UploadEngine::patch_room`]); given back
/// when dropped. The release names the reservation, so one that runs late never frees the room
/// of the next writer of the upload.
pub(crate) struct RoomHeld {
    catalog: std::sync::Arc<dyn crate::catalog::Catalog>,
    id: String,
    nonce: String,
}

impl Drop for RoomHeld {
    fn drop(&mut self) {
        let (catalog, id, nonce) = (self.catalog.clone(), std::mem::take(&mut self.id), std::mem::take(&mut self.nonce));
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        rt.spawn(async move {
            if let Err(e) = crate::catalog::retry_transient(|| catalog.release_upload_bytes(&id, &nonce)).await {
                // The row keeps counting the reserved room until its next PATCH or its expiry.
                tracing::warn!(upload = id, error = %e, "could not give back the quota room a PATCH held");
            }
        });
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl UploadEngine {
    /// The catalog quota of `principal` (`None` when it has no limit at all).
    pub(crate) fn quota_of(&self, principal: &str) -> Option<Quota> {
        let q = self.cfg.limits.of(principal).quota();
        (q != Quota::default()).then_some(q)
    }

    /// When a finished upload is removed by retention (Unix ms), if its principal has one.
    pub fn retained_until(&self, rec: &UploadRecord) -> Option<i64> {
        let keep = self.cfg.limits.of(&rec.principal).retain_finished?;
        rec.finished_at_ms.map(|f| f.saturating_add(ms(keep)))
    }

    /// `rec` as clients see it: a finished file whose principal has a retention gets the time it
    /// is removed as `expires_at_ms` (the catalog keeps none for finished files: the policy,
    /// not the row, decides, so a changed `retain_finished` applies to files already stored).
    pub(crate) fn with_retention(&self, mut rec: UploadRecord) -> UploadRecord {
        if rec.is_finished() {
            rec.expires_at_ms = self.retained_until(&rec);
        }
        rec
    }

    /// Bytes a PATCH on `rec` may add past its durable offset under the bytes quota: `None` =
    /// no limit applies (no quota, or a known length — reserved at creation). The room is
    /// reserved in the catalog ([`crate::catalog::Catalog::reserve_upload_bytes`], under the lock
    /// creation takes), so concurrent PATCHes, task files and creations of the principal, on any
    /// replica, can never together pass the quota; the returned [`RoomHeld`] gives it back when
    /// dropped (the PATCH ended). `want` is the most the PATCH can add (its body's length when
    /// known). When the PATCH declares the length (`set_length`), the whole length is reserved
    /// now: 507 `quota_exceeded` with the upload's offset as cursor if it does not fit.
    pub(crate) async fn patch_room(
        &self,
        rec: &UploadRecord,
        set_length: Option<u64>,
        want: u64,
    ) -> Result<(Option<u64>, Option<RoomHeld>), Refusal> {
        let Some(limit) = self.cfg.limits.of(&rec.principal).max_bytes else { return Ok((None, None)) };
        if rec.length.is_some() {
            return Ok((None, None));
        }
        let to = set_length.unwrap_or_else(|| rec.offset.saturating_add(want));
        let r = self.catalog.reserve_upload_bytes(&rec.id, to, limit, now_ms()).await?;
        let held = RoomHeld { catalog: self.catalog.clone(), id: rec.id.clone(), nonce: r.nonce };
        match set_length {
            Some(len) if r.granted_to < len => {
                // Given back before the use is read, so the refusal counts what is stored, not
                // the room just granted (a release left to `Drop` runs later).
                if let Err(e) = crate::catalog::retry_transient(|| self.catalog.release_upload_bytes(&rec.id, &held.nonce)).await {
                    tracing::warn!(upload = rec.id, error = %e, "could not give back the quota room of a refused length");
                }
                drop(held);
                let used = self.catalog.usage(&rec.principal, now_ms()).await.map(|u| u.bytes).unwrap_or(limit);
                Err(Refusal::quota_exceeded(QuotaDetail { name: "bytes", limit, used, requested: len.saturating_sub(rec.offset) }, Some(rec.offset)))
            }
            Some(_) => Ok((None, Some(held))),
            None => Ok((Some(r.granted_to.saturating_sub(rec.offset)), Some(held))),
        }
    }

    /// The refusal of bytes past a PATCH's room: the upload kept `kept` bytes, `refused` did not fit.
    pub(crate) async fn quota_refusal(&self, principal: &str, kept: u64, refused: u64) -> Refusal {
        let limit = self.cfg.limits.of(principal).max_bytes.unwrap_or(0);
        let used = match self.catalog.usage(principal, now_ms()).await {
            Ok(u) => u.bytes,
            Err(_) => limit,
        };
        Refusal::quota_exceeded(QuotaDetail { name: "bytes", limit, used: used.max(kept), requested: refused.max(1) }, Some(kept))
    }

    /// A task's file `id` of `principal` at `position` bytes (of which the catalog knows
    /// `committed`), holding room up to `*reserved`: when `position` passes it, room up to
    /// `position + ahead` is reserved in the catalog (as for a PATCH); 507 `quota_exceeded` when
    /// not even `position` fits. `*reserved` stays `None` without a bytes quota.
    pub(crate) async fn file_room(
        &self,
        principal: &str,
        id: &str,
        position: u64,
        committed: u64,
        ahead: u64,
        reserved: &mut Option<u64>,
    ) -> Result<(), Refusal> {
        let Some(limit) = self.cfg.limits.of(principal).max_bytes else { return Ok(()) };
        if reserved.is_some_and(|r| position <= r) {
            return Ok(());
        }
        let r = self.catalog.reserve_upload_bytes(id, position.saturating_add(ahead), limit, now_ms()).await?;
        *reserved = Some(r.granted_to);
        if r.granted_to < position {
            let used = self.catalog.usage(principal, now_ms()).await.map(|u| u.bytes).unwrap_or(limit);
            return Err(Refusal::quota_exceeded(
                QuotaDetail { name: "bytes", limit, used, requested: position.saturating_sub(r.granted_to) },
                Some(committed),
            ));
        }
        Ok(())
    }

    /// Retention: remove the finished files whose principal's `retain_finished` has passed
    /// since they finished. Each is tombstoned with a compare-and-set (`upload.expired` is
    /// emitted; the id answers 410, then 404), then its bytes are deleted. Returns how many.
    pub(crate) async fn sweep_retention(&self) -> anyhow::Result<usize> {
        let limits = &self.cfg.limits;
        let now = now_ms();
        let mut scopes: Vec<(PrincipalScope, Duration)> = Vec::new();
        for (p, l) in &limits.principals {
            if let Some(d) = l.retain_finished {
                scopes.push((PrincipalScope::Only(p.clone()), d));
            }
        }
        if let Some(d) = limits.default.retain_finished {
            scopes.push((PrincipalScope::AllExcept(limits.principals.keys().cloned().collect()), d));
        }
        let mut n = 0;
        for (scope, keep) in scopes {
            let before = now.saturating_sub(ms(keep));
            for id in self.catalog.list_finished_before(&scope, before, 1000).await? {
                let Some(gone) = self.tombstone_finished_if_due(&id, before).await? else {
                    continue;
                };
                if let Err(e) = self.blobs.delete(&gone).await {
                    // The tombstone is only forgotten once its bytes are gone (see `sweep_once`).
                    tracing::warn!(upload = id, error = %e, "retention: removed, but its bytes could not be deleted yet");
                }
                tracing::info!(upload = id, "retention: finished file removed");
                self.metrics.uploads_retention_removed.inc();
                self.part_gone(&id).await;
                n += 1;
            }
        }
        Ok(n)
    }
}
