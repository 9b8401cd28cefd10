//! The limits a final upload of a concatenation (TUS 1.0 §Concatenation) must stay within when
//! its size becomes known only after its creation (`concatenation-unfinished` with
//! deferred-length parts), and what becomes of a final that can never be built.
//!
//! A final's size is checked against the maximum upload size (`Tus-Max-Size`) and its
//! principal's bytes quota (`[limits] max_bytes`) at three moments:
//!
//! - at creation, when every part's length is known ([`ferry_tus::plan_concatenation`]: 413);
//! - when a part's deferred length is declared ([`UploadEngine::check_part_length`]): the
//!   declaration is refused (413 `size_exceeded`, 507 `quota_exceeded`) if a pending final
//!   naming the part would then be larger than either limit, whatever the other parts' lengths;
//! - when the final is built ([`UploadEngine::build_final`]), for what the check above cannot
//!   see (two parts declared at once, a limit lowered since, a length the IETF draft's
//!   `Upload-Complete` set): the build then fails for good ([`UploadEngine::fail_final`]).
//!
//! A final that failed for good is tombstoned — its parts are free again (they can be deleted or
//! named by another final), it counts nothing in the quota — and the catalog keeps why
//! ([`crate::catalog::FinalFailure`]): HEAD, GET, the files API and MCP answer
//! [`failed_final`] (409, not retryable) instead of "not built yet", until the final is
//! deleted or its tombstone is forgotten (then 404).

use std::collections::HashMap;

use crate::catalog::{Concat, FinalFailure, UploadRecord};
use crate::error::{ErrorCode, Next, QuotaDetail, Refusal};

use super::{now_ms, UploadEngine};

/// Which limit a final upload's size breaks.
enum Breach {
    /// The maximum upload size (`Tus-Max-Size`).
    MaxSize(u64),
    /// The principal's bytes quota (`[limits] max_bytes`).
    Quota(u64),
}

/// The refusal for reading, or asking about, final upload `id` whose build failed for good:
/// 409 with the failure's code (`size_exceeded`, `quota_exceeded`: not retryable) and what to
/// do next.
pub fn failed_final(id: &str, f: &FinalFailure) -> Refusal {
    let code = ErrorCode::parse(&f.code).unwrap_or(ErrorCode::SizeExceeded);
    Refusal::new(
        409,
        code,
        format!("final upload {id} could not be built and never will be: {}", f.detail),
        Next::Say(
            "Nothing was stored for this final upload and its parts are free again: delete it, \
             then concatenate parts that add up to a size within the limit (or delete the parts)."
                .into(),
        ),
    )
}

impl UploadEngine {
    /// The limit a final upload of `principal` of at least `size` bytes breaks, if any: the
    /// maximum upload size, or the bytes quota, which must hold the final beside its parts
    /// (`parts`: the bytes of the distinct parts) — a part cannot be deleted while the final
    /// waits on it, so a final that does not fit beside its parts never will.
    fn final_breach(&self, principal: &str, size: u64, parts: u64) -> Option<Breach> {
        if size > self.cfg.max_size {
            return Some(Breach::MaxSize(self.cfg.max_size));
        }
        match self.cfg.limits.of(principal).max_bytes {
            Some(max) if size.saturating_add(parts) > max => Some(Breach::Quota(max)),
            _ => None,
        }
    }

    /// Refuse declaring `len` as the length of deferred-length partial upload `rec` when an
    /// unfinished final upload naming it would then be larger than the maximum upload size (413
    /// `size_exceeded`) or could not fit beside its parts in its principal's bytes quota (507
    /// `quota_exceeded`), counting the parts whose length is known (this one with `len`, as
    /// often as the final names it). Nothing is stored; the cursor is the part's offset.
    pub(crate) async fn check_part_length(&self, rec: &UploadRecord, len: u64) -> Result<(), Refusal> {
        if rec.concat != Concat::Partial || rec.length.is_some() {
            return Ok(());
        }
        let mut lengths: HashMap<String, Option<u64>> = HashMap::from([(rec.id.clone(), Some(len))]);
        for fin in self.catalog.finals_waiting_on(&rec.id).await? {
            let Some(f) = self.catalog.get_upload(&fin).await? else { continue };
            let Concat::Final { parts, .. } = &f.concat else { continue };
            let mut at_least: u64 = 0;
            for p in parts {
                let l = match lengths.get(p) {
                    Some(l) => *l,
                    None => {
                        let l = self.catalog.get_upload(p).await?.and_then(|r| r.length);
                        lengths.insert(p.clone(), l);
                        l
                    }
                };
                at_least = at_least.saturating_add(l.unwrap_or(0));
            }
            let distinct: std::collections::HashSet<&String> = parts.iter().collect();
            let parts_bytes = distinct.iter().filter_map(|p| lengths.get(*p).copied().flatten()).fold(0u64, u64::saturating_add);
            let whole = if parts.iter().all(|p| lengths.get(p).is_some_and(Option::is_some)) { "" } else { "at least " };
            let what = format!("declaring Upload-Length {len} for this part would make final upload {fin}, which names it, {whole}{at_least} bytes");
            let hint = format!("Nothing was stored. Declare a smaller length for this part, or delete final upload {fin} first.");
            match self.final_breach(&f.principal, at_least, parts_bytes) {
                None => {}
                Some(Breach::MaxSize(max)) => {
                    return Err(Refusal::new(
                        413,
                        ErrorCode::SizeExceeded,
                        format!("{what}, above the maximum upload size of {max} bytes (Tus-Max-Size)"),
                        Next::Say(hint.into()),
                    )
                    .with_cursor(rec.offset));
                }
                Some(Breach::Quota(max)) => {
                    let used = self.catalog.usage(&f.principal, now_ms()).await.map(|u| u.bytes).unwrap_or(0);
                    let mut e = Refusal::quota_exceeded(
                        QuotaDetail { name: "bytes", limit: max, used, requested: len.saturating_sub(rec.offset) },
                        Some(rec.offset),
                    );
                    e.detail = format!(
                        "{what}: with its parts ({parts_bytes} bytes) that is more than the bytes quota \
                         of {max} bytes, so it could never be built (a final is stored beside its parts)"
                    );
                    e.next = Next::Say(hint.into());
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// The failure of building final upload `rec` from `sources` (its parts, in order), if its
    /// size breaks a limit for good: the failure is recorded and the final tombstoned
    /// ([`UploadEngine::fail_final`]), and the refusal to return is [`failed_final`].
    pub(super) async fn final_over_limit(&self, rec: &UploadRecord, sources: &[UploadRecord]) -> Option<Refusal> {
        let total = sources.iter().filter_map(|r| r.length).fold(0u64, u64::saturating_add);
        let mut seen = std::collections::HashSet::new();
        let parts = sources.iter().filter(|r| seen.insert(r.id.as_str())).filter_map(|r| r.length).fold(0u64, u64::saturating_add);
        let (code, detail) = match self.final_breach(&rec.principal, total, parts)? {
            Breach::MaxSize(max) => {
                (ErrorCode::SizeExceeded, format!("its parts add up to {total} bytes, above the maximum upload size of {max} bytes (Tus-Max-Size)"))
            }
            Breach::Quota(max) => (
                ErrorCode::QuotaExceeded,
                format!(
                    "its parts add up to {total} bytes, and beside the parts themselves \
                     ({parts} bytes) that is more than the bytes quota of {max} bytes"
                ),
            ),
        };
        let failure = FinalFailure { code: code.as_str().to_string(), detail, failed_at_ms: now_ms() };
        Some(self.fail_final(rec, &failure).await)
    }

    /// Record that final upload `rec` can never be built (`failure`), tombstone it (its parts
    /// are free again, its blob is removed) and return [`failed_final`] for it.
    pub(super) async fn fail_final(&self, rec: &UploadRecord, failure: &FinalFailure) -> Refusal {
        tracing::info!(upload = rec.id, code = failure.code, detail = failure.detail, "a final upload can never be built");
        if let Err(e) = self.catalog.set_final_failure(&rec.id, failure).await {
            tracing::warn!(upload = rec.id, error = %e, "could not record why a final upload failed");
        }
        self.fences.forget(&rec.id);
        match self.tombstone(&rec.id).await {
            Ok(Some(gone)) => {
                let _ = self.blobs.delete(&gone).await;
                self.metrics.uploads_expired.inc();
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(upload = rec.id, error = %e, "could not tombstone a final upload that failed"),
        }
        failed_final(&rec.id, failure)
    }

    /// Why `rec` (a tombstoned final upload) failed, when its build failed for good.
    pub(super) async fn failure_of(&self, rec: &UploadRecord) -> Result<Option<FinalFailure>, Refusal> {
        if !rec.expired || !matches!(rec.concat, Concat::Final { .. }) {
            return Ok(None);
        }
        Ok(self.catalog.final_failure(&rec.id).await?)
    }
}
