//! Uploads whose bytes are all stored but that are not finished, and how they get finished.
//!
//! An upload reaches `offset = length` without being finished when the last step after its last
//! byte does not happen: the pre-finish hook could not answer (policy `reject`), the process
//! died while the hook was asked, or the catalog or blob store failed the completing
//! checkpoint. The client sent everything; only the server still owes the finish. So nothing
//! waits for the client to ask again (standard TUS clients never send the empty PATCH at the
//! full offset that would):
//!
//! - a background finisher ([`UploadEngine::spawn_finisher`]) retries every such upload the
//!   catalog lists ([`crate::catalog::Catalog::list_awaiting_finish`]), with exponential
//!   backoff per upload (1 s doubling to 5 min), after restarts too (the state is the catalog's),
//!   on every replica (each attempt takes the upload's lease only if it is free, so a replica
//!   never disturbs another's attempt or a writer);
//! - a reader asks first ([`UploadEngine::get_finished_or_finish`], [`UploadEngine::head`]):
//!   HEAD, a download, the JSON view and MCP's `file_status` try the finish at once, and while
//!   it still cannot be done they answer "not yet, retry" ([`finishing_error`]) rather than an
//!   `Upload-Offset` equal to `Upload-Length`, which every TUS client takes for done.
//!
//! A final upload of a concatenation whose build failed the same way (its `concat` task ended on
//! a hook or store that could not answer) is built again by the finisher once its parts are
//! all complete.
//!
//! Every failed attempt refreshes the upload's expiry (it is checkpointed again at the full
//! offset), so a stored upload is not expired while it waits for a hook that is down.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{ErrorCode, Next, Refusal};

use super::append::Appender;
use super::locks::{Lease, Want};
use super::UploadEngine;
use crate::catalog::{Concat, UploadRecord};

/// Seconds a client is told to wait (`Retry-After`) before asking again about an upload the
/// server is still finishing.
pub const FINISH_RETRY_AFTER_SECS: u32 = 2;
/// First background retry of a finish after a failed attempt; doubles up to [`FINISH_BACKOFF_MAX`].
pub const FINISH_BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest wait between two background attempts to finish one upload.
pub const FINISH_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Longest a reader (HEAD, a download, the JSON view, MCP) waits for a finish it started: past
/// it the finish goes on in the background, holding the upload's lease, and the reader answers
/// "not yet, retry" at once (a blob store that hangs would otherwise hold the HEAD for its whole
/// request deadline, and clients time out).
const READER_FINISH_WAIT: Duration = Duration::from_secs(3);

/// How often the finisher looks for uploads waiting to be finished.
const FINISHER_EVERY: Duration = Duration::from_millis(500);

/// Whether `rec` has every byte stored but is not finished: it waits only for the server.
pub fn awaits_finish(rec: &UploadRecord) -> bool {
    !rec.is_finished() && !rec.expired && rec.length == Some(rec.offset)
}

/// What a client is told while an upload waits to be finished: 423 `locked` (retryable, with
/// `Retry-After`, no `Upload-Offset`). 423 because that is the status standard TUS clients
/// retry on HEAD: tus-js-client creates a new upload for any other error status on HEAD, and
/// tuspy retries when the answer has no `Upload-Offset`. `why` is the last attempt's failure.
pub fn finishing_error(rec: &UploadRecord, why: &Refusal) -> Refusal {
    Refusal::new(
        423,
        ErrorCode::Locked,
        format!("all {} bytes of this upload are stored; the server is still finishing it ({})", rec.offset, why.detail),
        Next::Finishing { offset: rec.offset },
    )
    .with_retry_after(FINISH_RETRY_AFTER_SECS)
}

/// Per-upload backoff of the background finisher (this process's; other replicas keep their
/// own): when the next attempt is due and how many failed, on [`crate::retry::doubling`] from
/// [`FINISH_BACKOFF_MIN`] to [`FINISH_BACKOFF_MAX`].
#[derive(Default)]
pub struct Backoff(Mutex<HashMap<String, (Instant, u32)>>);

impl Backoff {
    fn due(&self, id: &str) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(id).is_none_or(|(at, _)| Instant::now() >= *at)
    }

    fn failed(&self, id: &str) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let failed = m.get(id).map_or(0, |(_, n)| n.saturating_add(1));
        let wait = crate::retry::delay_after(crate::retry::doubling(FINISH_BACKOFF_MIN, FINISH_BACKOFF_MAX), failed);
        m.insert(id.to_string(), (Instant::now() + wait, failed));
    }

    fn seen(&self, id: &str) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).contains_key(id)
    }

    fn forget(&self, id: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }

    fn retain(&self, ids: &[String]) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).retain(|k, _| ids.contains(k));
    }
}

impl UploadEngine {
    /// Finish `rec` (every byte stored, see [`awaits_finish`]) under `lease`: reopen its blob at
    /// the committed state and commit the completion as the last PATCH would have — the
    /// declared sha256 is checked, the pre-finish hook asked, then the completing checkpoint
    /// (with its `upload.finished` event) and the blob made whole. Returns the record
    /// afterwards (`None`: the hook refused it and it was removed). Errors: what the finish
    /// failed with (503 while the hook or a store is away); the upload stays as it was.
    pub(crate) async fn finish_stored(self: &Arc<Self>, rec: &UploadRecord, lease: &Lease) -> Result<Option<UploadRecord>, Refusal> {
        let mut app = Appender::open(self, rec.clone(), rec.offset, rec.length, None, lease).await?;
        match app.commit().await {
            Ok(()) => {
                tracing::info!(upload = rec.id, size = rec.offset, "finished an upload whose bytes were all stored");
                Ok(self.catalog.get_upload(&rec.id).await?)
            }
            Err(e) if e.code == ErrorCode::Rejected => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The refusal for reading `rec` before it is finished (409 `upload_incomplete`), one for
    /// every reader (downloads, MCP, signed links): an upload in progress has its offset as the
    /// cursor, to resume from; a final upload (TUS 1.0 §Concatenation) has none, as it is
    /// built once its parts are.
    pub fn not_complete(rec: &UploadRecord) -> Refusal {
        if let Concat::Final { parts, .. } = &rec.concat {
            let n = parts.len();
            let parts = if n == 1 { "its part is".to_string() } else { format!("each of its {n} parts is") };
            return Refusal::new(
                409,
                ErrorCode::UploadIncomplete,
                format!("final upload {} is not built yet: that happens once {parts} uploaded", rec.id),
                Next::AwaitParts,
            );
        }
        let of = rec.length.map_or_else(|| "an unknown length".to_string(), |l| l.to_string());
        Refusal::new(
            409,
            ErrorCode::UploadIncomplete,
            format!("the upload is not complete: {} bytes of {of} stored", rec.offset),
            format!("Resume the upload at offset {} and download it once it is complete.", rec.offset),
        )
        .with_cursor(rec.offset)
    }

    /// [`UploadEngine::not_complete`], told apart for a final upload whose parts are all
    /// uploaded: it is not waiting for them but being built (or waiting for room to be, retried
    /// in the background), and the client has nothing to send.
    pub async fn not_complete_now(&self, rec: &UploadRecord) -> Refusal {
        let Concat::Final { parts, .. } = &rec.concat else { return Self::not_complete(rec) };
        if !self.final_ready(&rec.id).await.unwrap_or(false) {
            return Self::not_complete(rec);
        }
        let n = parts.len();
        Refusal::new(
            409,
            ErrorCode::UploadIncomplete,
            format!(
                "final upload {} is not built yet; all {n} of its parts are uploaded and the server is \
                 building it (a build that a limit or a store stopped is retried in the background)",
                rec.id
            ),
            "Nothing more is needed from you: ask again in a moment. The final's concat task says what the build waits for.",
        )
        .with_retry_after(FINISH_RETRY_AFTER_SECS)
    }

    /// Upload `id` of `principal` as a reader sees it, finishing it first if every byte is
    /// stored but it is not finished (the lease is taken only if free: a reader never stops a
    /// writer). Errors: 404/410 as [`UploadEngine::get`]; [`finishing_error`] (423) while it
    /// still cannot be finished; the hook's refusal (the upload is then gone).
    pub async fn get_finished_or_finish(self: &Arc<Self>, principal: &str, id: &str) -> Result<UploadRecord, Refusal> {
        let rec = self.get(principal, id).await?;
        if !awaits_finish(&rec) {
            return Ok(rec);
        }
        let lease = match self.lease(id, Want::IfFree).await {
            Ok(l) => l,
            // Someone else (the finisher, another reader, another replica) is finishing it.
            Err(e) if e.code == ErrorCode::Locked => return Err(finishing_error(&rec, &Refusal::locked(None))),
            Err(e) => return Err(e),
        };
        self.finish_for_reader(&rec, principal, lease).await
    }

    /// Finish `rec` (which awaits it) under `lease` for a reader, waiting at most
    /// [`READER_FINISH_WAIT`]: a finish still under way then goes on in the background with the
    /// lease, and the reader gets [`finishing_error`] (423, retry).
    pub(super) async fn finish_for_reader(self: &Arc<Self>, rec: &UploadRecord, principal: &str, lease: Lease) -> Result<UploadRecord, Refusal> {
        let (engine, principal, id) = (self.clone(), principal.to_string(), rec.id.clone());
        let finishing = tokio::spawn(async move { engine.finish_held(&principal, &id, &lease).await });
        match tokio::time::timeout(READER_FINISH_WAIT, finishing).await {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => Err(super::internal("finishing an upload", e)),
            Err(_) => Err(finishing_error(rec, &Refusal::locked(None))),
        }
    }

    /// Under `lease`: re-read the record and finish it if it awaits that.
    pub(super) async fn finish_held(self: &Arc<Self>, principal: &str, id: &str, lease: &Lease) -> Result<UploadRecord, Refusal> {
        let rec = self.get(principal, id).await?;
        if !awaits_finish(&rec) {
            return Ok(rec);
        }
        match self.finish_stored(&rec, lease).await {
            Ok(Some(done)) => Ok(done),
            Ok(None) => Err(Refusal::not_found()),
            Err(e) => Err(finishing_error(&rec, &e)),
        }
    }

    /// One pass of the background finisher: try to finish every upload that awaits it and is
    /// due by this process's backoff. Returns the uploads it finished.
    pub async fn finish_pass(self: &Arc<Self>, backoff: &Backoff) -> anyhow::Result<Vec<UploadRecord>> {
        let ids = self.catalog.list_awaiting_finish(1000).await?;
        backoff.retain(&ids);
        let mut finished = Vec::new();
        for id in ids {
            if self.shutdown.is_cancelled() {
                break;
            }
            if !backoff.due(&id) {
                continue;
            }
            // Only if free: a HEAD, a writer or another replica holding it is finishing it.
            let Ok(lease) = self.lease(&id, Want::IfFree).await else { continue };
            let Some(rec) = self.catalog.get_upload(&id).await? else { continue };
            let attempt = if awaits_finish(&rec) {
                self.finish_stored(&rec, &lease).await
            } else if matches!(rec.concat, Concat::Final { .. }) && !rec.is_finished() && !rec.expired {
                // A final whose build failed (its `concat` task ended on a hook or store that
                // could not answer): build it again once every part is complete. Not on first
                // sight — its task may only be starting — and never while anyone holds it.
                if !backoff.seen(&id) {
                    backoff.failed(&id);
                    continue;
                }
                if !self.final_ready(&id).await? {
                    backoff.failed(&id);
                    continue;
                }
                drop(lease);
                match self.build_final(&id).await {
                    Ok(()) => self.catalog.get_upload(&id).await.map_err(Refusal::from),
                    Err(e) => Err(e),
                }
            } else {
                backoff.forget(&id);
                continue;
            };
            match attempt {
                Ok(done) => {
                    backoff.forget(&id);
                    finished.extend(done.filter(|r| r.is_finished()));
                }
                Err(e) => {
                    tracing::info!(
                        upload = id,
                        code = %e.code,
                        detail = e.detail,
                        "an upload whose bytes are all stored could not be finished yet; retrying later"
                    );
                    backoff.failed(&id);
                }
            }
        }
        Ok(finished)
    }

    /// Run [`UploadEngine::finish_pass`] until shutdown; `on_finished` is told of every upload
    /// it finished (e.g. to start building a final upload whose last part this was).
    pub fn spawn_finisher(self: &Arc<Self>, on_finished: impl Fn(UploadRecord) + Send + Sync + 'static) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let backoff = Backoff::default();
            loop {
                tokio::select! {
                    _ = me.shutdown.cancelled() => break,
                    _ = tokio::time::sleep(FINISHER_EVERY) => {}
                }
                match me.finish_pass(&backoff).await {
                    Ok(done) => done.into_iter().for_each(&on_finished),
                    Err(e) => tracing::warn!(error = %e, "looking for uploads to finish failed"),
                }
            }
        })
    }
}
