//! The upload engine: create, append, complete, concatenate, terminate, expire.
//!
//! It owns the storage invariant of DESIGN §2 — the catalog's offset is the truth, bytes
//! `[0, offset)` are durable, and the stored midstate hashes exactly them — and every TUS
//! decision that needs stored state. The HTTP layer parses headers into `ferry_tus` plans and
//! renders what this module returns; it never touches files or SQL. Nor does this module know
//! HTTP: an append reads a [`ChunkStream`] (bytes, then perhaps a trailing checksum) that each
//! transport builds from what it received.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use crate::error::{ErrorCode, Next, Refusal};
use ferry_tus::{CreationPlan, IdempotencyKey, PatchPlan, UploadConcat};
use tokio_util::sync::CancellationToken;

use crate::blob::{BlobError, BlobStore, ByteStream};
use crate::catalog::{Catalog, CatalogError, Concat, CreationKey, KeyedCreate, UploadRecord};
use crate::metrics::Metrics;

mod append;
mod chunk;
mod concat;
mod crc32;
pub mod describe;
mod exhausted;
mod files;
pub mod finishing;
pub mod follow;
pub mod hash;
pub mod hooks;
pub mod locks;
mod maintenance;
mod quota;
mod removal;

pub use append::AppendOutcome;
pub use chunk::{ChunkError, ChunkStream, WholeChunk};
pub use concat::failed_final;
pub use describe::{check_metadata, describe, describe_raw, metadata_from_json, metadata_json, Description, MAX_METADATA_BYTES};
pub use files::{FileCursor, FileHandle, FileWriter};
pub use follow::{FollowStream, Followed};
use hash::RunningSha256;
use locks::{Lease, LocalLocker, LockError, Locker, Want};
pub use quota::{Limits, PrincipalLimits};

/// What [`UploadEngine::create_keyed`] returns.
#[derive(Debug, Clone)]
pub struct Created {
    /// The upload, as `get` reads it.
    pub upload: UploadRecord,
    /// True when a retried request found the upload its first attempt created.
    pub existing: bool,
}

/// A creation that carried bytes and was not answered with success
/// ([`UploadEngine::settle_creation`]).
#[derive(Debug)]
pub struct RefusedCreation {
    pub error: Refusal,
    /// The upload was kept (the answer may name it: `Location`), else nothing of it is left.
    pub kept: bool,
}

/// sha256 (hex) of what a creation request asks for: length or deferral, metadata as sent,
/// concatenation (the parts' ids, so absolute and relative URLs of one part agree) and the
/// declared sha256. Two requests with the same fingerprint create the same upload.
fn creation_fingerprint(plan: &CreationPlan, metadata_raw: &str) -> String {
    use sha2::Digest as _;
    let concat = match &plan.concat {
        None => "none".to_string(),
        Some(UploadConcat::Partial) => "partial".to_string(),
        Some(f @ UploadConcat::Final(_)) => format!("final {}", f.final_ids().join(" ")),
    };
    let text = serde_json::json!({
        "length": plan.length,
        "concat": concat,
        "metadata": metadata_raw,
        "sha256": plan.expected_sha256.map(hex::encode),
    });
    hex::encode(sha2::Sha256::digest(text.to_string().as_bytes()))
}

/// Most partial uploads one final upload may name. Its HEAD answers them all in
/// `Upload-Concat` (`/files/ID`, 34 bytes each, sharing the metadata's 4 KiB: see
/// `http::tus`), so the response headers stay under the 6 KiB the README promises proxies.
pub const MAX_PARTS: usize = 100;

/// Engine settings (see `ferry serve --help` for the user-facing names).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Largest upload in bytes (`Tus-Max-Size`).
    pub max_size: u64,
    /// Unfinished uploads expire this long after their last change; `None` = never.
    pub expire_after: Option<Duration>,
    /// Checkpoint every this many bytes inside one long PATCH.
    pub checkpoint_every: u64,
    /// How long a newcomer waits for an in-flight PATCH to let go before 423.
    pub takeover_wait: Duration,
    /// A PATCH whose body sends nothing for this long is checkpointed and ended.
    pub idle_timeout: Duration,
    /// How often the sweeper looks for expired uploads.
    pub sweep_interval: Duration,
    /// Free space kept on the data directory's filesystem (DESIGN §9); off by default here,
    /// `ferry serve` sets `--min-free-space`.
    pub reserve: crate::exhaustion::SpaceReserve,
    /// Per-principal quotas and retention of finished files (`[limits]`); none by default.
    pub limits: PrincipalLimits,
    /// Directories whose filesystem's free space `/metrics` reports (`ferry_disk_free_bytes{dir}`):
    /// `data`, and `blobs` when the blobs are a directory.
    pub disk_dirs: Vec<(&'static str, std::path::PathBuf)>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_size: 1 << 40,
            expire_after: Some(Duration::from_secs(7 * 24 * 3600)),
            checkpoint_every: 64 << 20,
            takeover_wait: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            sweep_interval: Duration::from_secs(60),
            reserve: crate::exhaustion::SpaceReserve::none(),
            limits: PrincipalLimits::default(),
            disk_dirs: Vec::new(),
        }
    }
}

/// The upload engine. Cheap to share behind an `Arc`.
pub struct UploadEngine {
    pub(crate) catalog: Arc<dyn Catalog>,
    pub(crate) blobs: Arc<dyn BlobStore>,
    pub(crate) cfg: EngineConfig,
    pub(crate) locker: Arc<dyn Locker>,
    pub(crate) metrics: Arc<Metrics>,
    /// Cancelled on graceful shutdown: in-flight PATCHes checkpoint and end.
    pub(crate) shutdown: CancellationToken,
    /// Pre-create / pre-finish hooks, when configured ([`UploadEngine::set_hooks`]).
    pub(crate) hooks: std::sync::OnceLock<Arc<dyn hooks::UploadHooks>>,
    /// Fences kept between writers under in-process leases ([`locks::FenceCache`]).
    pub(crate) fences: locks::FenceCache,
    /// Unfinished uploads whose stored bytes this process has checked against their
    /// checkpointed sha256 midstate, or written from 0 itself, when the blob store does not
    /// sync checkpoints ([`crate::blob::BlobStore::checkpoints_unsynced`]; issue 48, kind 9):
    /// an OS crash or power cut that could have lost them also ended this process.
    pub(crate) checked: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Blobs the store held with no row when last looked, and since when: removed once still
    /// without one [`removal::STRAY_GRACE`] later ([`UploadEngine::remove_strays`]).
    pub(crate) strays: std::sync::Mutex<removal::Strays>,
    /// This process's commits, told to the followers of the uploads they follow.
    pub(crate) commits: follow::Commits,
}

pub use crate::clock::now_ms;

/// Expired: swept already, or past its expiry — unfinished past `Upload-Expires` (TUS 1.0
/// §Expiration), or finished past its retention (as [`UploadEngine::get`] fills it in).
fn is_expired(r: &UploadRecord, now: i64) -> bool {
    r.expired || r.expires_at_ms.is_some_and(|e| e <= now)
}

/// Unix ms as RFC 3339 UTC with second precision (`2026-11-30T02:19:36Z`); negative → the epoch.
pub fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// A new upload id: 128 random bits as 26 lowercase base32 characters (DESIGN §2).
pub fn new_id() -> String {
    let bytes: [u8; 16] = rand::random();
    data_encoding::BASE32_NOPAD.encode(&bytes).to_ascii_lowercase()
}

/// Whether `s` has the shape of an id from [`new_id`].
pub fn is_valid_id(s: &str) -> bool {
    s.len() == 26 && s.bytes().all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
}

pub fn internal(context: &str, e: impl std::fmt::Display) -> Refusal {
    tracing::error!(error = %e, "{context}");
    Refusal::internal()
}

impl From<CatalogError> for Refusal {
    fn from(e: CatalogError) -> Self {
        match e {
            CatalogError::NotFound => Refusal::not_found(),
            CatalogError::QuotaExceeded(q) => Refusal::quota_exceeded(q, None),
            // `locked` (retryable), as the hint's HEAD-then-resume is a retry.
            CatalogError::Fenced => Refusal::new(409, ErrorCode::Locked, "another writer took over this upload", Next::LearnOffset),
            other => exhausted::catalog_error(other),
        }
    }
}

impl From<BlobError> for Refusal {
    fn from(e: BlobError) -> Self {
        exhausted::blob_error(e)
    }
}

impl UploadEngine {
    /// An engine for a single server: in-process upload leases ([`LocalLocker`]).
    pub fn new(catalog: Arc<dyn Catalog>, blobs: Arc<dyn BlobStore>, cfg: EngineConfig, metrics: Arc<Metrics>) -> Arc<Self> {
        Self::with_locker(catalog, blobs, cfg, metrics, Arc::new(LocalLocker::new()))
    }

    /// An engine whose upload leases come from `locker` (a [`locks::CatalogLocker`] when
    /// several processes share the catalog).
    pub fn with_locker(
        catalog: Arc<dyn Catalog>,
        blobs: Arc<dyn BlobStore>,
        cfg: EngineConfig,
        metrics: Arc<Metrics>,
        locker: Arc<dyn Locker>,
    ) -> Arc<Self> {
        Arc::new(UploadEngine {
            catalog,
            blobs,
            cfg,
            locker,
            metrics,
            shutdown: CancellationToken::new(),
            hooks: std::sync::OnceLock::new(),
            fences: locks::FenceCache::default(),
            checked: Default::default(),
            strays: Default::default(),
            commits: Default::default(),
        })
    }

    /// Install the pre-create / pre-finish hooks (once, before serving). Later calls are ignored.
    pub fn set_hooks(&self, hooks: Arc<dyn hooks::UploadHooks>) {
        let _ = self.hooks.set(hooks);
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Ask every in-flight PATCH to checkpoint and end (graceful shutdown).
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Whether every store can do its work (for `/readyz`); see [`UploadEngine::readiness`].
    pub async fn ready(&self) -> bool {
        self.readiness().await.ready
    }

    /// The fence a writer holding `lease` on upload `id` commits with: the lease's own (catalog
    /// leases), else the one this process took before for `id` and kept ([`locks::FenceCache`]),
    /// else a new one from [`Catalog::acquire_fence`], kept for the next writer.
    pub(crate) async fn fence_for(&self, id: &str, lease: &Lease) -> Result<u64, CatalogError> {
        if let Some(f) = lease.fence() {
            return Ok(f);
        }
        if let Some(f) = self.fences.get(id) {
            return Ok(f);
        }
        let f = self.catalog.acquire_fence(id).await?;
        self.fences.keep(id, f);
        Ok(f)
    }

    /// What the blob store is told of `lease` ([`crate::blob::WriteLease`]): its fence,
    /// generation, validity and let-go token; `size_hint` is the most bytes the blob will hold
    /// (S3 sizes parts from it).
    pub(crate) fn write_lease(lease: &Lease, size_hint: u64) -> crate::blob::WriteLease {
        let validity = lease.validity();
        crate::blob::WriteLease {
            size_hint,
            fence: lease.fence().unwrap_or(0),
            generation: lease.generation(),
            valid_until: Arc::new(move || validity.deadline()),
            cut: lease.stop().clone(),
        }
    }

    /// A catalog error of a fenced write: a kept fence that turned out stale is forgotten, so
    /// the next writer takes a fresh one.
    pub(crate) fn fenced(&self, id: &str, e: CatalogError) -> CatalogError {
        if matches!(e, CatalogError::Fenced | CatalogError::NotFound) {
            self.fences.forget(id);
        }
        e
    }

    fn expiry_from(&self, now: i64) -> Option<i64> {
        self.cfg.expire_after.map(|d| now.saturating_add(d.as_millis() as i64))
    }

    /// The upload as `principal` may see it: unknown, someone else's → 404; expired → 410.
    pub async fn get(&self, principal: &str, id: &str) -> Result<UploadRecord, Refusal> {
        if !is_valid_id(id) {
            return Err(Refusal::not_found());
        }
        let rec = self.catalog.get_upload(id).await?;
        if let Some(r) = rec.as_ref().filter(|r| r.principal == principal) {
            // A final whose build failed for good says why, not just "expired".
            if let Some(f) = self.failure_of(r).await? {
                return Err(failed_final(id, &f));
            }
        }
        self.admit(principal, rec)
    }

    /// Upload row `rec` as [`UploadEngine::get`] answers it to `principal`: 404 when there is
    /// none or it is another principal's, 410 when it expired (retention included).
    pub(crate) fn admit(&self, principal: &str, rec: Option<UploadRecord>) -> Result<UploadRecord, Refusal> {
        let rec = rec.filter(|r| r.principal == principal).ok_or_else(Refusal::not_found)?;
        let rec = self.with_retention(rec);
        if is_expired(&rec, now_ms()) {
            return Err(Refusal::expired());
        }
        Ok(rec)
    }

    /// The principal that owns upload `id`, whatever its state (signed URLs act as the owner).
    pub async fn owner(&self, id: &str) -> Result<Option<String>, Refusal> {
        if !is_valid_id(id) {
            return Ok(None);
        }
        Ok(self.catalog.get_upload(id).await?.map(|r| r.principal))
    }

    /// Take the upload's lease as `want` says; 423 (with the durable offset) when the
    /// holder does not let go in time.
    pub(crate) async fn lease(&self, id: &str, want: Want) -> Result<Lease, Refusal> {
        match self.locker.acquire(id, want, self.cfg.takeover_wait).await {
            Ok(l) => Ok(l),
            Err(LockError::Locked) => {
                let offset = if want == Want::Pinned { None } else { self.catalog.get_upload(id).await.ok().flatten().map(|r| r.offset) };
                Err(Refusal::locked(offset))
            }
            Err(LockError::Catalog(e)) => Err(e.into()),
        }
    }

    async fn take(&self, id: &str) -> Result<Lease, Refusal> {
        self.lease(id, Want::Takeover).await
    }

    /// HEAD: first asks an in-flight PATCH to checkpoint and stop, so the answer is the true
    /// durable offset. Errors: 404, 410, 423 when the writer does not let go in time.
    ///
    /// An upload whose bytes are all stored but that is not finished is finished here
    /// ([`finishing`]); while that still fails the answer is [`finishing::finishing_error`]
    /// (423, retry), never an offset equal to the length.
    pub async fn head(self: &Arc<Self>, principal: &str, id: &str) -> Result<UploadRecord, Refusal> {
        let rec = self.get(principal, id).await?;
        if rec.is_finished() {
            return Ok(rec);
        }
        if matches!(rec.concat, Concat::Final { .. }) && !finishing::awaits_finish(&rec) {
            // Nothing can be writing to it from outside (a final is built by the server).
            return Ok(rec);
        }
        if finishing::awaits_finish(&rec) {
            // Every byte is stored: whoever holds the upload is finishing it (the last PATCH's
            // completion, the finisher, an earlier reader's finish). It is never asked to let go:
            // a completion of many parts can outlast a lease, and a client polling HEAD every
            // `Retry-After` would cut it each time, re-sending the last part, so that it never
            // finished (issue 47 point 6). Taken only if free; else 423, retry.
            return self.get_finished_or_finish(principal, id).await;
        }
        let guard = self.take(id).await?;
        self.finish_held(principal, id, &guard).await
    }

    /// Create an upload (TUS 1.0 §Creation). A final upload of a concatenation is created
    /// empty; [`UploadEngine::build_final`] fills it once [`UploadEngine::final_ready`].
    /// Errors: 400 for a final naming an unknown, foreign or non-partial upload.
    ///
    /// A final identical to a live one of the same principal (same parts, same metadata) is
    /// not created again: see [`UploadEngine::create_keyed`].
    pub async fn create(self: &Arc<Self>, principal: &str, plan: &CreationPlan, metadata_raw: &str) -> Result<UploadRecord, Refusal> {
        Ok(self.create_keyed(principal, plan, metadata_raw, None).await?.upload)
    }

    /// Create an upload, doing the work once for a retried request (issue 9 item 5):
    ///
    /// - with an `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header): if a live
    ///   upload of `principal` was created under `key`, it is returned (`existing: true`) and
    ///   nothing is created; if that upload was created by a different request (another length,
    ///   metadata, concatenation or declared sha256), 422 `conflict`. The key is scoped to the
    ///   principal and lives as long as the upload it created: until that upload is deleted or
    ///   expires (an expired one answers 410 to the key until it is swept).
    /// - a final upload without a key gets one derived from its parts and metadata, so the same
    ///   final POSTed twice (a client that timed out and retried) returns the first final: one
    ///   copy of the parts, one `concat` task.
    ///
    /// A replay (the key already holds an upload) is answered before anything else happens: no
    /// hook call, no quota check, no blob, no event (issue 23 item 5). Otherwise a pre-create
    /// hook (when configured) is asked first, with the request as sent: it may refuse (its error
    /// is returned, nothing is created) or replace the metadata.
    pub async fn create_keyed(
        self: &Arc<Self>,
        principal: &str,
        plan: &CreationPlan,
        metadata_raw: &str,
        key: Option<&IdempotencyKey>,
    ) -> Result<Created, Refusal> {
        let fingerprint = creation_fingerprint(plan, metadata_raw);
        let key = match (key, &plan.concat) {
            (Some(k), _) => Some(CreationKey { key: format!("k:{}", k.as_str()), fingerprint }),
            (None, Some(UploadConcat::Final(_))) => Some(CreationKey { key: format!("final:{fingerprint}"), fingerprint }),
            (None, _) => None,
        };
        // A replay (issue 23 item 5) is answered from what the first attempt made, before
        // anything with a side effect: no hook call, no quota check, no blob, no event.
        if let Some(k) = &key {
            if let Some((upload, fingerprint)) = self.catalog.upload_by_creation_key(principal, &k.key).await? {
                return self.replayed(upload, &fingerprint, k).await;
            }
        }
        let hooked;
        let metadata_raw = match self.hooks.get() {
            None => metadata_raw,
            Some(h) => {
                let concat = match &plan.concat {
                    None => "none",
                    Some(UploadConcat::Partial) => "partial",
                    Some(UploadConcat::Final(_)) => "final",
                };
                match h.pre_create(&hooks::PlannedUpload { principal, length: plan.length, metadata: metadata_raw, concat }).await? {
                    None => metadata_raw,
                    Some(new) => {
                        hooked = new;
                        hooked.as_str()
                    }
                }
            }
        };
        // After the hook: what it substitutes is answered back by HEAD just the same.
        check_metadata(metadata_raw)?;
        let now = now_ms();
        let id = new_id();
        let (concat, length, expires) = match &plan.concat {
            None => (Concat::None, plan.length, self.expiry_from(now)),
            Some(UploadConcat::Partial) => (Concat::Partial, plan.length, self.expiry_from(now)),
            Some(fin @ UploadConcat::Final(_)) => {
                let parts = fin.final_ids();
                if parts.len() > MAX_PARTS {
                    return Err(Refusal::bad_request(
                        format!("a final upload may name at most {MAX_PARTS} partial uploads; this one names {}", parts.len()),
                        format!("Upload the file in at most {MAX_PARTS} parts."),
                    ));
                }
                let mut seen = Vec::with_capacity(parts.len());
                for part in &parts {
                    let view = match self.get(principal, part).await {
                        Ok(r) if r.concat == Concat::Partial => Some(ferry_tus::ConcatPart { length: r.length }),
                        _ => None,
                    };
                    seen.push((part.as_str(), view));
                    if view.is_none() {
                        break;
                    }
                }
                let total = ferry_tus::plan_concatenation(&seen, MAX_PARTS, self.cfg.max_size)?;
                (Concat::Final { parts, header: fin.to_string() }, total, None)
            }
        };
        let completes_at_once = length == Some(0) && !matches!(concat, Concat::Final { .. });
        let rec = UploadRecord {
            id: id.clone(),
            principal: principal.to_string(),
            length,
            offset: 0,
            metadata: metadata_raw.to_string(),
            hash_state: RunningSha256::new().state(),
            sha256: None,
            expected_sha256: plan.expected_sha256,
            concat,
            created_at_ms: now,
            updated_at_ms: now,
            expires_at_ms: expires,
            finished_at_ms: None,
            expired: false,
            blob_state: Vec::new(),
            // A creation whose bytes may still be refused is announced only once answered
            // ([`UploadEngine::settle_creation`]); a refused one leaves no trace.
            provisional: plan.with_body || completes_at_once,
        };
        self.check_space(rec.length.unwrap_or(0), None)?;
        let began = std::time::Instant::now();
        self.blobs.create(&id).await?;
        self.in_time_to_record(&id, began).await?;
        let created = match (&key, self.quota_of(principal)) {
            (key, Some(quota)) => self.catalog.create_upload_within(&rec, key.as_ref(), &quota).await,
            (None, None) => self.catalog.create_upload(&rec).await.map(|()| KeyedCreate::Created),
            (Some(k), None) => self.catalog.create_upload_keyed(&rec, k).await,
        };
        let created = match created {
            Ok(c) => c,
            Err(e) => {
                // Nothing was recorded (a full disk, a failing catalog): the blob goes too.
                let _ = self.blobs.delete(&UploadEngine::never_recorded(&id)).await;
                return Err(e.into());
            }
        };
        match (created, &key) {
            (KeyedCreate::Created, _) | (_, None) => {}
            (KeyedCreate::Existing { upload, fingerprint }, Some(k)) => {
                // A concurrent first attempt under the same key won the insert.
                if let Err(e) = self.blobs.delete(&UploadEngine::never_recorded(&id)).await {
                    tracing::warn!(upload = %id, error = %e, "could not remove the blob of a creation that was a retry");
                }
                return self.replayed(*upload, &fingerprint, k).await;
            }
        }
        if !rec.provisional {
            self.metrics.uploads_created.inc();
        }
        if completes_at_once {
            // `Upload-Length: 0` is complete at creation (DESIGN §3).
            let done = match self.take(&id).await {
                Ok(guard) => self.complete_empty(&guard, &rec).await,
                Err(e) => Err(e),
            };
            let rec = self.settle_creation(principal, &id, done.map(|()| rec.clone())).await.map_err(|refused| refused.error)?;
            return Ok(Created { upload: rec, existing: false });
        }
        Ok(Created { upload: self.get(principal, &id).await?, existing: false })
    }

    /// The answer to a creation whose key already holds `upload` (created with `fingerprint`):
    /// that upload, or 422 for a different request under the key, or 410 once it expired. A
    /// replayed creation of an upload that is not announced yet announces it: its client now
    /// knows where it is.
    async fn replayed(&self, upload: UploadRecord, fingerprint: &str, key: &CreationKey) -> Result<Created, Refusal> {
        if fingerprint != key.fingerprint {
            return Err(Refusal::new(
                422,
                ErrorCode::Conflict,
                format!("this Idempotency-Key already created upload {} with a different request", upload.id),
                Next::KeyReused { task: false },
            ));
        }
        let upload = self.with_retention(upload);
        if is_expired(&upload, now_ms()) {
            return Err(Refusal::expired());
        }
        if upload.provisional {
            self.catalog.announce_upload(&upload.id).await?;
        }
        Ok(Created { upload, existing: true })
    }

    /// Settle a creation that carried bytes (a creation-with-upload body, an empty upload
    /// completed at once) once `outcome`, the result of taking them in, is known (issue 23
    /// item 4):
    ///
    /// - taken in: the upload is announced (`upload.created`, and `upload.finished` when it is
    ///   complete, are written now) and returned as `get` reads it;
    /// - interrupted by the server's state or another request (`locked`, `unavailable`,
    ///   `insufficient_storage`, `internal`: what arrived is kept and can be resumed): the upload
    ///   is announced and the error comes back with `kept: true` — the client is told where;
    /// - refused (a checksum, a length, a declared sha256, a hook, a quota, a malformed or
    ///   truncated body): the upload, its bytes and its quota use are removed with no event, and
    ///   the error comes back with `kept: false` — the answer names no upload.
    ///
    /// An upload a replayed creation handed out meanwhile (it is announced) is kept either way.
    pub async fn settle_creation(&self, principal: &str, id: &str, outcome: Result<UploadRecord, Refusal>) -> Result<UploadRecord, RefusedCreation> {
        self.settle_creation_told(principal, id, outcome, false).await
    }

    /// [`UploadEngine::settle_creation`] for a creation whose client was `told` where the
    /// upload is before its bytes were taken in (the draft's `104 Upload Resumption
    /// Supported`): a body cut off (the connection dropped) is then interrupted, not refused —
    /// what arrived is kept for the client to resume. Refusals stay refusals.
    pub async fn settle_creation_told(
        &self,
        principal: &str,
        id: &str,
        outcome: Result<UploadRecord, Refusal>,
        told: bool,
    ) -> Result<UploadRecord, RefusedCreation> {
        use ErrorCode::{InsufficientStorage, Internal, Locked, Unavailable};
        let cut = |e: &Refusal| told && matches!(e.next, Next::BodyCut);
        match outcome {
            Ok(_) => match self.catalog.announce_upload(id).await {
                Ok(()) => {
                    self.metrics.uploads_created.inc();
                    self.get(principal, id).await.map_err(|error| RefusedCreation { error, kept: true })
                }
                Err(e) => Err(RefusedCreation { error: e.into(), kept: true }),
            },
            Err(error) if matches!(error.code, Locked | Unavailable | InsufficientStorage | Internal) || cut(&error) => {
                match self.catalog.announce_upload(id).await {
                    Ok(()) => {
                        self.metrics.uploads_created.inc();
                    }
                    Err(e) => tracing::warn!(upload = id, error = %e, "could not announce an interrupted creation"),
                }
                Err(RefusedCreation { error, kept: true })
            }
            Err(mut error) => {
                let kept = self.withdraw(id).await;
                // Nothing is left to resume: no offset, and the step is the creation again.
                if !kept && error.cursor.is_some() {
                    error.cursor = None;
                    error.next = Next::Say(
                        "Nothing of this upload was kept: send the creation request again, with a body that matches what it declares.".into(),
                    );
                }
                Err(RefusedCreation { error, kept })
            }
        }
    }

    /// Remove provisional upload `id` and its bytes without an event; `true` when it had to be
    /// kept (announced meanwhile, or the removal failed: it then expires as any upload does).
    async fn withdraw(&self, id: &str) -> bool {
        let guard = match self.take(id).await {
            Ok(g) => g,
            Err(e) if e.code == ErrorCode::NotFound => return false,
            Err(e) => {
                tracing::warn!(upload = id, error = %e.detail, "a refused creation could not be removed; it expires");
                return true;
            }
        };
        self.fences.forget(id);
        match self.withdraw_row(id).await {
            Ok(Some(gone)) => {
                drop(guard);
                // The row went first and queued its bytes ([`removal`]).
                self.remove_bytes_later_if_need_be(&gone).await;
                false
            }
            // Gone already (a refused pre-finish removed it), or announced by a replay: kept.
            Ok(None) => self.catalog.get_upload(id).await.ok().flatten().is_some(),
            Err(e) => {
                tracing::warn!(upload = id, error = %e, "a refused creation could not be removed; it expires");
                true
            }
        }
    }

    /// The plan for the body of a creation-with-upload request, which starts at offset 0.
    pub fn creation_body_plan(&self, plan: &CreationPlan) -> PatchPlan {
        let limit = plan.length.unwrap_or(self.cfg.max_size);
        PatchPlan {
            offset: 0,
            set_length: None,
            length: plan.length,
            max_bytes: limit,
            checksum: plan.checksum.clone(),
            checksum_in_trailer: false,
            completes: false,
        }
    }

    /// Terminate (TUS 1.0 §Termination): the record and bytes are gone; the id answers 404.
    ///
    /// Errors: 409 `conflict` for a partial upload that an unfinished final upload still
    /// waits on (TUS 1.0 §Concatenation, `concatenation-unfinished`): terminating it would
    /// leave the final unable to ever complete, so nothing is deleted. Once the final is
    /// finished its parts may go.
    ///
    /// A final upload whose build failed for good ([`failed_final`]) is deleted too: its row
    /// goes, and the id answers 404.
    pub async fn terminate(&self, principal: &str, id: &str) -> Result<(), Refusal> {
        if let Err(e) = self.get(principal, id).await {
            return match self.catalog.get_upload(id).await? {
                Some(r) if r.principal == principal && self.failure_of(&r).await?.is_some() => {
                    let gone = self.delete_row(id).await?;
                    self.remove_bytes_later_if_need_be(&gone).await;
                    self.metrics.uploads_terminated.inc();
                    Ok(())
                }
                _ => Err(e),
            };
        }
        let _guard = self.take(id).await?;
        let rec = self.get(principal, id).await?;
        if let Some(fin) = self.catalog.finals_waiting_on(id).await?.first() {
            return Err(Refusal::new(
                409,
                ErrorCode::Conflict,
                format!("upload {id} is a part of final upload {fin}, which is not finished yet: without it {fin} could never complete"),
                "Finish sending this part (the final upload completes once every part has), or terminate the final upload first.",
            ));
        }
        self.fences.forget(id);
        self.delete_record_and_bytes(&rec).await?;
        self.metrics.uploads_terminated.inc();
        self.part_gone(id).await;
        Ok(())
    }

    /// Stream bytes `range` of a finished upload. Never takes the writer slot, so
    /// concurrent downloads never block each other.
    ///
    /// An upload the catalog calls finished whose blob was not made whole yet (a crash or a
    /// store outage between the completing checkpoint and [`crate::blob::BlobStore::finish`],
    /// which runs after it; S3: the multipart upload is still open) is finished here from the
    /// committed blob state — by whichever process reads it first; `finish` is idempotent.
    /// A store that is away answers 503 (`unavailable`); a failure mid-stream ends the
    /// stream with the store's error (see [`BlobError::from_stream`]). A file `ferry check
    /// --repair-catalog` marked damaged answers 500 `damaged` ([`Refusal::damaged`]).
    pub async fn read(&self, rec: &UploadRecord, range: std::ops::Range<u64>) -> Result<ByteStream, Refusal> {
        if rec.is_finished() {
            if let Some(d) = self.catalog.damage(&rec.id).await? {
                return Err(Refusal::damaged(&d.kind));
            }
        }
        match self.blobs.read(&rec.id, range.clone()).await {
            Err(BlobError::OutOfRange { .. } | BlobError::NotFound) if rec.is_finished() => {
                let made_whole = match self.blobs.finish(&rec.id, &self.blob_state_of(rec).await?).await {
                    Ok(()) => self.blobs.read(&rec.id, range).await,
                    Err(e) => Err(e),
                };
                match made_whole {
                    Ok(stream) => Ok(stream),
                    Err(e) => Err(self.bytes_gone(rec, e).await),
                }
            }
            r => Ok(r?),
        }
    }

    /// Whether an unfinished upload's committed bytes can be read ([`UploadEngine::read`]) before
    /// it finishes: the blob store's [`crate::blob::BlobStore::reads_unfinished`].
    pub fn reads_unfinished(&self) -> bool {
        self.blobs.reads_unfinished()
    }

    /// The damage mark of finished upload `rec` (`ferry check --repair-catalog`, or a read that
    /// found its bytes gone: [`UploadEngine::read`]); `None` for an unfinished upload.
    pub async fn damage(&self, rec: &UploadRecord) -> Result<Option<crate::catalog::Damage>, Refusal> {
        if !rec.is_finished() {
            return Ok(None);
        }
        Ok(self.catalog.damage(&rec.id).await?)
    }

    /// What a read of finished upload `rec` answers when its blob stayed short or absent after
    /// [`crate::blob::BlobStore::finish`]: the bytes are gone, not briefly away — 500 `damaged`
    /// (not retryable), as after a `ferry check --repair-catalog` mark, and a log line naming
    /// the upload. The upload is marked damaged as `ferry check --repair-catalog` would mark it
    /// (`missing`), so its views (`/api/v1/files`, `ferry ls`) say what downloads answer; a later
    /// `ferry check --repair-catalog` that finds it whole clears the mark — but only when the
    /// store itself is there ([`crate::blob::BlobStore::confirm_present`]): a store without its
    /// mark answers 502 `store_refused`, one that is away 503, and nothing is marked. Any other
    /// store error keeps its own answer (503 for a store that is away).
    async fn bytes_gone(&self, rec: &UploadRecord, e: BlobError) -> Refusal {
        match e {
            BlobError::OutOfRange { .. } | BlobError::NotFound => {
                // Only a store that is there can have lost an upload's bytes: a missing
                // bucket, refused credentials or an unmounted disk make every blob look absent,
                // and are the store's refusal (502 / 503), never a damage mark on every file.
                if let Err(away) = self.blobs.confirm_present().await {
                    tracing::warn!(
                        upload = %rec.id,
                        error = %away,
                        "a finished upload's bytes were not found, and the blob store is not there either: not marked damaged"
                    );
                    return away.into();
                }
                tracing::error!(
                    upload = %rec.id,
                    error = %e,
                    "a finished upload's stored bytes are missing; marked damaged (ferry \
                     check --repair-catalog clears the mark if it finds them whole)"
                );
                let mark = crate::catalog::Damage {
                    kind: "missing".into(),
                    detail: format!("found when it was read: {e}"),
                    found_at_ms: crate::clock::now_ms(),
                };
                if let Err(m) = self.catalog.set_damage(&rec.id, Some(&mark)).await {
                    tracing::warn!(upload = %rec.id, error = %m, "could not mark the upload damaged");
                }
                Refusal::damaged_on_read()
            }
            other => other.into(),
        }
    }

    /// The whole blob state committed for `rec` (its row's, with the entries the catalog keeps
    /// beside it: an S3 upload's part list), for a writer or a finisher; reads need only the row.
    pub(crate) async fn blob_state_of(&self, rec: &UploadRecord) -> Result<crate::blob::BlobState, Refusal> {
        if !crate::framed::lacks_entries(&rec.blob_state) {
            return Ok(crate::blob::BlobState(rec.blob_state.clone()));
        }
        let whole = self.catalog.upload_blob_state(&rec.id).await?.ok_or_else(Refusal::not_found)?;
        Ok(crate::blob::BlobState(whole))
    }

    pub(crate) fn hash_state_of(rec: &UploadRecord) -> Result<RunningSha256, Refusal> {
        RunningSha256::from_state(&rec.hash_state).map_err(|e| internal("hash state", e))
    }
}

impl UploadEngine {
    /// Bring the gauges `/metrics` reads at scrape time up to date: free space of the
    /// configured directories (`statvfs`, a cheap system call).
    pub fn refresh_metrics(&self) {
        if let Some(b) = self.blobs.memory() {
            let m = &self.metrics;
            let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            m.s3_buffer.set(n(b.in_use));
            m.s3_buffer_limit.set(n(b.limit));
            m.s3_buffer_waiting.set(n(b.waiting));
            m.s3_buffer_waits.set(n(b.waits));
            m.s3_buffer_wait_seconds.set(b.waited_ms as f64 / 1000.0);
            m.s3_buffer_refused.set(n(b.refused));
        }
        for (dir, path) in &self.cfg.disk_dirs {
            if let Ok(st) = nix::sys::statvfs::statvfs(path) {
                #[allow(clippy::unnecessary_cast)] // fsblkcnt_t and c_ulong are u64 here, not on every platform
                let free = (st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64);
                self.metrics.disk_free.get_or_create(&crate::metrics::DirLabel { dir }).set(i64::try_from(free).unwrap_or(i64::MAX));
            }
        }
    }

    /// Resolves once [`UploadEngine::begin_shutdown`] was called.
    pub async fn shutdown_requested(&self) {
        self.shutdown.cancelled().await
    }
}

impl UploadEngine {
    /// A principal's uploads (finished or not, expired ones excluded), newest first.
    pub async fn list(&self, principal: &str, limit: u32) -> Result<Vec<UploadRecord>, Refusal> {
        let now = now_ms();
        let mut all: Vec<UploadRecord> =
            self.catalog.list_uploads(principal, limit.clamp(1, 1000)).await?.into_iter().map(|r| self.with_retention(r)).collect();
        // Expired but not swept yet: gone for clients already (as `get` answers 410).
        all.retain(|r| !is_expired(r, now));
        Ok(all)
    }
}
