//! Appending a chunk (TUS 1.0 §PATCH, §Checksum, checksum-trailer, creation-with-upload):
//! stream the body into the blob while hashing, and checkpoint per DESIGN §2.
//!
//! One file of ~1 090 lines because it is one PATCH's state machine — the [`Appender`] (open under
//! the lease, stream, background checkpoints, the ways a body ends, completion) and the
//! `UploadEngine` methods that drive it — whose states are easiest to check when read together;
//! hashing is in `hash.rs`, the free-space watch in `exhausted.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Next, Refusal, TrailerFault};
use bytes::Bytes;
use ferry_tus::{PatchPlan, UploadState};
use futures::StreamExt;

use super::chunk::ChunkStream;
use super::hash::{ChunkDigests, PipelinedSha256, RunningSha256};
use super::locks::{Lease, LockError, Validity, Want};
use super::{internal, now_ms, UploadEngine};
use crate::blob::{BlobError, BlobState, BlobWriter, SyncFuture, WriteLease};
use crate::catalog::{CatalogError, Checkpoint, Concat, UploadRecord};

/// How long received bytes may wait for a full write/hash batch before they are handed on
/// anyway ([`Appender::flush`]): bounds the memory of slow uploads to about this much of
/// their rate (1 000 uploads at 16 KiB/s hold ≈ 16 MiB, not up to a batch each).
const FLUSH_QUIET: Duration = Duration::from_secs(1);

/// How a PATCH body ended.
enum End {
    Eof,
    TooLarge,
    Disconnected,
    Idle,
    TakenOver,
    Shutdown,
    /// Free space fell to the reserve (DESIGN §9): keep what arrived, answer 507.
    Reserve,
    /// The principal's bytes quota is reached: keep what fitted, answer 507 `quota_exceeded`.
    Quota,
}

/// Bytes given back when keeping what a full disk took (DESIGN §9): room for the catalog,
/// on the same filesystem, to record the checkpoint that keeps the rest.
pub(crate) const SALVAGE_SLACK: u64 = 1 << 20;

/// Result of an append: the upload's record after the last checkpoint.
pub type AppendOutcome = UploadRecord;

/// A writer holding the fence of one upload.
pub(crate) struct Appender {
    engine: Arc<UploadEngine>,
    rec: UploadRecord,
    fence: u64,
    writer: Box<dyn BlobWriter>,
    /// The upload's running sha256, hashed off the receive path (see [`PipelinedSha256`]).
    hasher: PipelinedSha256,
    /// Offset, midstate and blob state of the last commit.
    committed: (u64, RunningSha256),
    /// The blob state committed with it.
    committed_blob: BlobState,
    /// Whether the lease is still ours (checked before every batch of bytes).
    validity: Validity,
    /// The lease as the blob store is told of it: what a roll-back to 0 runs under.
    under: WriteLease,
    /// Asks the lease not to be let go cleanly, when what this writer sent may be on its way
    /// with no commit recording it ([`Appender::note_in_transit`]).
    run_out: super::locks::LetRunOut,
    /// When the upload's expiry was last pushed forward while bytes arrive.
    touched: Instant,
    /// The length in force, and whether this request declared it.
    length: Option<u64>,
    set_length: Option<u64>,
    finished: bool,
    /// A checkpoint whose fsync runs while later bytes keep arriving: committed once `done`.
    pending: Option<PendingCheckpoint>,
    /// Whether bytes that reached the disk before it filled may be kept (not when a chunk
    /// checksum still has to verify them).
    keep_partial: bool,
    /// The writer was cut or its lease lost (DESIGN §2 "a lost lease is its own outcome"): it
    /// is not touched again — no flush, sync, rewind or truncate.
    broken: bool,
    /// The blob store lost the bytes past this offset ([`BlobError::Lost`]): the upload is
    /// rolled back to it before the error is answered.
    lost: Option<u64>,
    /// A commit failed without an answer (the catalog unreachable or silent past its deadline):
    /// it may still have been committed, so what it covered is not released here — the next
    /// holder cuts the blob to whatever the catalog says ([`Appender::released`]).
    commit_unknown: bool,
}

/// Offset and midstate captured when a background fsync started; they describe exactly the
/// bytes that fsync covers, so committing them after it resolves keeps DESIGN §2's invariant.
struct PendingCheckpoint {
    /// When the fsync started (`ferry_checkpoint_duration_seconds` runs from here to the commit).
    started: Instant,
    offset: u64,
    hasher: RunningSha256,
    done: SyncFuture,
}

/// The lease ran out by our own clock (paused, cut off): no more bytes may be added.
pub(crate) fn lease_lost() -> Refusal {
    // `locked` (retryable): HEAD, then resuming, is a retry that succeeds (issue 23, kind 15).
    Refusal::new(409, crate::error::ErrorCode::Locked, "this request lost the upload's lease; no more bytes were accepted", Next::LearnOffset)
}

struct InFlight<'a>(&'a UploadEngine);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.metrics.patches_in_flight.dec();
    }
}

impl Appender {
    /// Open the blob at `offset` under `lease` (discarding anything past it: the repair a lease
    /// taker owes) with the lease's fence, or a fresh catalog fence for in-process leases.
    /// A blob shorter than its checkpoint, or gone (relaxed durability after a power loss), is
    /// rolled back to what survived and the caller gets 409 with that offset.
    pub(crate) async fn open(
        engine: &Arc<UploadEngine>,
        rec: UploadRecord,
        offset: u64,
        length: Option<u64>,
        set_length: Option<u64>,
        lease: &Lease,
    ) -> Result<Appender, Refusal> {
        let engine = engine.clone();
        let state = if offset == rec.offset { engine.blob_state_of(&rec).await? } else { BlobState::default() };
        // S3 sizes the upload's parts from the hint (fixed at the first writer).
        let under = UploadEngine::write_lease(lease, length.or(rec.length).unwrap_or(0));
        // The fence (a catalog commit unless kept from an earlier writer) and the blob's opening
        // are independent: do them at once.
        let (fence, opened) = tokio::join!(engine.fence_for(&rec.id, lease), engine.blobs.open_writer_under(&rec.id, offset, &state, &under));
        let fence = fence?;
        let opened = match opened {
            // No blob at all for an unfinished upload the catalog knows: relaxed durability
            // syncs no blob creation, so a power loss can take the whole file. Nothing
            // survived: at offset 0 start it again; past 0, roll back to 0 (below).
            Err(BlobError::NotFound) if offset == rec.offset && !rec.is_finished() => {
                // A store that is not there (a missing bucket, an unmounted disk) lost nothing:
                // its refusal stands, and the upload keeps its offset.
                engine.blobs.confirm_present().await?;
                tracing::warn!(upload = rec.id, offset, "the upload's blob is gone (a power loss in relaxed durability?); starting it again from 0");
                if offset == 0 {
                    engine.blobs.reset(&rec.id, &under).await?;
                    engine.blobs.open_writer_under(&rec.id, 0, &state, &under).await
                } else {
                    Err(BlobError::OutOfRange { start: offset, end: offset, len: 0 })
                }
            }
            r => r,
        };
        let unsynced = engine.blobs.checkpoints_unsynced();
        let writer = match opened {
            Ok(w) => w,
            Err(BlobError::OutOfRange { len, .. }) if offset == rec.offset => {
                // Without synced checkpoints the bytes below `len` are no more trustworthy
                // than the rest (the size may have reached the disk before the data): only
                // a prefix the catalog can vouch for is kept, and that is the empty one.
                let keep = if unsynced { 0 } else { len };
                engine.roll_back_to(&rec, keep, fence, &under).await?;
                return Err(Refusal::new(
                    409,
                    crate::error::ErrorCode::OffsetMismatch,
                    format!("the server kept only {keep} bytes of this upload (a power loss in relaxed durability)"),
                    Next::Resume { soon: false },
                )
                .with_cursor(keep));
            }
            Err(e) => return Err(e.into()),
        };
        if unsynced && offset == rec.offset && !rec.is_finished() && !engine.checked.lock().unwrap_or_else(|p| p.into_inner()).contains(&rec.id) {
            if offset > 0 && !engine.stored_bytes_match(&rec).await? {
                drop(writer);
                engine.roll_back_to(&rec, 0, fence, &under).await?;
                return Err(Refusal::new(
                    409,
                    crate::error::ErrorCode::OffsetMismatch,
                    format!(
                        "the {offset} stored bytes of this upload no longer hash to what was \
                         checkpointed (a power loss in relaxed durability); it starts again from 0"
                    ),
                    Next::Resume { soon: false },
                )
                .with_cursor(0));
            }
            engine.checked.lock().unwrap_or_else(|p| p.into_inner()).insert(rec.id.clone());
        }
        let hasher = if offset == rec.offset { UploadEngine::hash_state_of(&rec)? } else { RunningSha256::new() };
        Ok(Appender {
            engine,
            under,
            run_out: lease.let_run_out(),
            fence,
            writer,
            committed: (offset, hasher.clone()),
            committed_blob: state,
            validity: lease.validity(),
            touched: Instant::now(),
            hasher: PipelinedSha256::new(hasher),
            length,
            set_length,
            finished: false,
            pending: None,
            keep_partial: true,
            broken: false,
            lost: None,
            commit_unknown: false,
            rec,
        })
    }

    pub(crate) fn id(&self) -> &str {
        &self.rec.id
    }

    pub(crate) fn engine(&self) -> &Arc<UploadEngine> {
        &self.engine
    }

    pub(crate) fn position(&self) -> u64 {
        self.writer.position()
    }

    /// The request's bytes will run up to byte `end` of the blob ([`BlobWriter::expecting`]).
    pub(crate) fn expecting(&mut self, end: u64) {
        self.writer.expecting(end);
    }

    /// Bytes written that the local disk does not hold yet ([`crate::blob::BlobWriter::unwritten`]).
    pub(crate) fn unwritten(&self) -> u64 {
        self.writer.unwritten()
    }

    /// Offset, tagged midstate and blob state of the last commit.
    pub(crate) fn committed_state(&self) -> (u64, Vec<u8>, Vec<u8>) {
        (self.committed.0, self.committed.1.state(), self.committed_blob.0.clone())
    }

    /// Declare the length (for a deferred-length upload) so the next commit completes it.
    pub(crate) fn set_final_length(&mut self, len: u64) {
        self.length = Some(len);
        self.set_length = Some(len);
    }

    /// sha256 of everything written so far.
    pub(crate) async fn digest(&mut self) -> [u8; 32] {
        self.hasher.snapshot().await.digest()
    }

    pub(crate) async fn write(&mut self, data: Bytes) -> Result<(), Refusal> {
        // The fence check before bytes become part of the upload: a holder whose lease ran
        // out by its own clock (it was paused or cut off) stops here.
        if !self.validity.is_valid() {
            return Err(lease_lost());
        }
        self.hasher.update(data.clone()).await;
        if let Err(e) = self.writer.write(data).await {
            let e = self.blob_failed(e);
            return Err(self.released(e).await);
        }
        self.keep_alive().await
    }

    /// Start writing and hashing the bytes gathered for the next batch now (a quiet body): they
    /// stop holding memory, and the receive buffers they point into, within [`FLUSH_QUIET`].
    pub(crate) async fn flush(&mut self) -> Result<(), Refusal> {
        self.hasher.flush().await;
        if let Err(e) = self.writer.flush().await {
            let e = self.blob_failed(e);
            return Err(self.released(e).await);
        }
        Ok(())
    }

    /// An upload receiving bytes is alive: push its expiry forward now and then, so neither
    /// the sweeper nor a reader takes it for expired while a slow body trickles in.
    async fn keep_alive(&mut self) -> Result<(), Refusal> {
        let Some(after) = self.engine.cfg.expire_after else { return Ok(()) };
        let every = (after / 4).clamp(Duration::from_millis(250), Duration::from_secs(60));
        if self.touched.elapsed() < every {
            return Ok(());
        }
        self.touched = Instant::now();
        let until = now_ms().saturating_add(after.as_millis() as i64);
        self.engine.catalog.touch_upload(&self.rec.id, self.fence, until).await.map_err(|e| self.engine.fenced(&self.rec.id, e))?;
        Ok(())
    }

    /// After a failed write, sync or checkpoint (DESIGN §9): release every byte past the
    /// durable offset at once — so a full disk does not stay full — and name that offset as
    /// the client's cursor. Not after a lost fence or a vanished upload: the bytes are no
    /// longer this writer's to cut; nor after a commit whose outcome is unknown
    /// ([`Appender::commit_unknown`]): the catalog may hold it.
    async fn released(&mut self, e: Refusal) -> Refusal {
        use crate::error::ErrorCode::{InsufficientStorage, Internal, Unavailable};
        if self.lost.is_none() && !self.commit_unknown {
            self.note_in_transit().await;
        }
        if self.commit_unknown {
            // What it sent is noted only if that commit landed: the next holder must count as a
            // takeover either way.
            self.run_out.now();
            // The blob keeps what the commit covered; the next holder repairs it from the
            // catalog's offset, whichever commit that is.
            self.broken = true;
        }
        if self.broken {
            // Cut or fenced: the blob is no longer this writer's to touch; the next holder
            // repairs it from the committed state.
            self.pending = None;
            // The offset is this writer's to tell only while its lease held and its commits
            // were answered: after a lost lease (409) another writer may have moved it, after
            // an unanswered commit the catalog may hold a later one. HEAD tells the client then.
            let stale = self.commit_unknown || (e.status == 409 && e.code == crate::error::ErrorCode::Locked);
            return if e.cursor.is_none() && !stale { e.with_cursor(self.committed.0) } else { e };
        }
        if let Some(kept) = self.lost.take() {
            self.pending = None;
            self.broken = true;
            return match self.engine.roll_back_to(&self.rec, kept, self.fence, &self.under).await {
                Ok(()) => e,
                Err(re) => {
                    tracing::warn!(
                        upload = self.rec.id,
                        error = %re.detail,
                        "rolling back an upload whose bytes the store lost failed; the next writer tries again"
                    );
                    re
                }
            };
        }
        if !matches!(e.code, InsufficientStorage | Unavailable | Internal) {
            return e;
        }
        self.pending = None;
        if e.code == InsufficientStorage && self.keep_partial {
            // The disk filled: keep what it took before that (fsync + checkpoint), rather than
            // throwing away everything since the last checkpoint.
            match self.salvage().await {
                Ok(Some(kept)) => {
                    tracing::info!(upload = self.rec.id, kept, "the disk filled; the bytes written before that were kept");
                    let mut e = e;
                    e.cursor = None;
                    return e.with_cursor(kept);
                }
                Ok(None) => {}
                Err(se) => {
                    tracing::warn!(
                        upload = self.rec.id,
                        error = %se.detail,
                        "keeping the bytes written before the disk filled failed; releasing them"
                    )
                }
            }
        }
        let keep = self.committed.0;
        if let Err(re) = self.writer.rewind(keep).await {
            tracing::warn!(upload = self.rec.id, error = %re, "releasing uncommitted bytes through the writer failed; truncating the blob");
            if let Err(te) = self.engine.blobs.truncate(&self.rec.id, keep, &self.under).await {
                tracing::error!(upload = self.rec.id, error = %te, "could not release uncommitted bytes; the next writer cuts them");
            }
        }
        self.hasher.reset(self.committed.1.clone());
        tracing::info!(upload = self.rec.id, kept = keep, code = %e.code, "write failed; bytes past the durable offset released");
        if e.cursor.is_none() {
            e.with_cursor(keep)
        } else {
            e
        }
    }

    /// After a failure or a discard, before the lease goes: commit the last committed state
    /// amended with what the writer sent that may still be on its way to the store
    /// ([`crate::blob::BlobWriter::amend`]: S3 part numbers a later writer must not use again),
    /// at the same offset and midstate, under this writer's fence — also when it was cut, since
    /// its lease is still held then. A commit that fails (fenced, catalog away) changes nothing,
    /// so the lease is not let go cleanly ([`super::locks::LetRunOut`]): it was taken, or it runs
    /// out unreleased, and the next holder counts as a takeover, which the store allows for
    /// ([`crate::blob::WriteLease::generation`]). (A clean release after a failed note let the
    /// next writer send the same S3 part numbers again: issue 47 point 6.)
    async fn note_in_transit(&mut self) {
        if let Err(e) = self.note_numbers().await {
            tracing::info!(
                upload = self.rec.id,
                error = %e.detail,
                "could not note the store requests still on their way; the next writer takes the upload over"
            );
            self.run_out.now();
        }
    }

    /// Commit the last committed state amended with what the writer sent since
    /// ([`crate::blob::BlobWriter::amend`]), if anything.
    async fn note_numbers(&mut self) -> Result<(), Refusal> {
        let Some(blob) = self.writer.amend(&self.committed_blob) else { return Ok(()) };
        let cp = self.unfinished_checkpoint(self.committed.0, &self.committed.1, &blob, None);
        self.record(&cp).await?;
        self.committed_blob = blob;
        Ok(())
    }

    /// While bytes arrive: when the writer asks ([`crate::blob::BlobWriter::wants_numbers_noted`]),
    /// commit what it sent — with or without a checkpoint of the bytes (none may be committed
    /// while a chunk checksum is still to verify), so a writer never holds many store names no
    /// commit records (S3: what a taker skips stays small, [`crate::blob::s3::state::STALE_WINDOW`]).
    pub(crate) async fn note_numbers_if_due(&mut self) -> Result<(), Refusal> {
        if !self.writer.wants_numbers_noted() {
            return Ok(());
        }
        match self.note_numbers().await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.released(e).await),
        }
    }

    /// The checkpoint of this unfinished upload at `offset`, with `hasher`'s midstate and blob
    /// state `blob` in place of the committed one, declaring `length` if it is new.
    fn unfinished_checkpoint(&self, offset: u64, hasher: &RunningSha256, blob: &BlobState, length: Option<u64>) -> Checkpoint {
        let now = now_ms();
        Checkpoint {
            offset,
            hash_state: hasher.state(),
            blob_state: blob.0.clone(),
            blob_entries_from: blob.entries_from(&self.committed_blob),
            length,
            finished_sha256: None,
            expires_at_ms: self.engine.expiry_from(now),
            now_ms: now,
        }
    }

    /// `blob` (a state the writer synced) with everything the writer sent since noted, so that
    /// committing it never takes back what an earlier commit recorded.
    fn numbered(&mut self, blob: BlobState) -> BlobState {
        self.writer.amend(&blob).unwrap_or(blob)
    }

    /// A blob store failure as the client sees it, noting what it means for this writer: cut
    /// or fenced ([`Appender::broken`]), or bytes the store lost ([`Appender::lost`]).
    fn blob_failed(&mut self, e: BlobError) -> Refusal {
        match &e {
            BlobError::Lost { kept, .. } => self.lost = Some(*kept),
            BlobError::LeaseLost | BlobError::Cut => self.broken = true,
            _ => {}
        }
        e.into()
    }

    /// Whether the lease is still ours; after it is lost, nothing of the blob is touched.
    pub(crate) fn holds(&self) -> bool {
        !self.broken && self.validity.is_valid()
    }

    /// After the disk filled: make the bytes it took durable and commit them (less
    /// [`SALVAGE_SLACK`], given back so the catalog on the same filesystem can record the
    /// checkpoint). Their sha256 midstate is computed again from the committed one by reading
    /// them back (the running hash covers bytes the disk refused). `None` when the store cannot
    /// tell what it kept or nothing past the committed offset is worth keeping.
    async fn salvage(&mut self) -> Result<Option<u64>, Refusal> {
        let committed = self.committed.0;
        if self.writer.salvage().await?.is_none() {
            return Ok(None);
        }
        let keep = self.writer.position().saturating_sub(SALVAGE_SLACK);
        if keep <= committed || self.length.is_some_and(|l| keep >= l) {
            return Ok(None);
        }
        self.writer.rewind(keep).await?;
        let blob = self.writer.sync().await?;
        let mut hasher = self.committed.1.clone();
        let mut stream = self.engine.blobs.read(&self.rec.id, committed..keep).await?;
        while let Some(chunk) = futures::TryStreamExt::try_next(&mut stream).await.map_err(|e| Refusal::from(BlobError::from_stream(e)))? {
            hasher.update(&chunk);
        }
        self.commit_durable(keep, hasher.clone(), blob).await?;
        self.hasher = super::hash::PipelinedSha256::new(hasher);
        Ok(Some(keep))
    }

    /// Start a checkpoint of everything written so far without waiting for its fsync: the
    /// offset and midstate are committed once it is durable (by [`Appender::poll_checkpoint`],
    /// the next call of this, [`Appender::discard`]; [`Appender::commit`] supersedes it).
    /// At most one is outstanding: an earlier one is awaited and committed first.
    pub(crate) async fn checkpoint_in_background(&mut self) -> Result<(), Refusal> {
        if self.finished {
            return Ok(());
        }
        if let Err(e) = self.settle_pending().await {
            return Err(self.released(e).await);
        }
        let done = match self.writer.start_sync().await {
            Ok(d) => d,
            Err(e) => {
                let e = self.blob_failed(e);
                return Err(self.released(e).await);
            }
        };
        let hasher = self.hasher.snapshot().await;
        self.pending = Some(PendingCheckpoint { started: Instant::now(), offset: self.writer.position(), hasher, done });
        Ok(())
    }

    /// Commit the outstanding background checkpoint if its fsync has finished; never waits
    /// for the disk.
    pub(crate) async fn poll_checkpoint(&mut self) -> Result<(), Refusal> {
        let ready = match self.pending.as_mut() {
            Some(p) => futures::FutureExt::now_or_never(&mut p.done),
            None => return Ok(()),
        };
        match ready {
            None => Ok(()),
            Some(r) => {
                let p = self.pending.take().expect("pending checkpoint");
                let done = match r {
                    Ok(blob) => self.commit_durable(p.offset, p.hasher, blob).await,
                    Err(e) => Err(self.blob_failed(e)),
                };
                if done.is_ok() {
                    self.engine.metrics.checkpoint_duration.observe(p.started.elapsed().as_secs_f64());
                }
                match done {
                    Ok(()) => Ok(()),
                    Err(e) => Err(self.released(e).await),
                }
            }
        }
    }

    /// Wait for the outstanding background checkpoint, if any, and commit it.
    async fn settle_pending(&mut self) -> Result<(), Refusal> {
        if let Some(p) = self.pending.take() {
            let blob = match p.done.await {
                Ok(b) => b,
                Err(e) => return Err(self.blob_failed(e)),
            };
            self.commit_durable(p.offset, p.hasher, blob).await?;
            self.engine.metrics.checkpoint_duration.observe(p.started.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// Commit `offset` + `hasher` (durable already) unless it would complete the upload
    /// (completion, with its digest check, is [`Appender::commit`]'s alone).
    async fn commit_durable(&mut self, offset: u64, hasher: RunningSha256, blob: BlobState) -> Result<(), Refusal> {
        if self.finished || self.length == Some(offset) || offset <= self.committed.0 {
            return Ok(());
        }
        let blob = self.numbered(blob);
        let cp = self.unfinished_checkpoint(offset, &hasher, &blob, self.set_length);
        self.record(&cp).await?;
        self.committed = (offset, hasher);
        self.committed_blob = blob;
        Ok(())
    }

    /// Commit `cp` under this writer's fence, and keep [`Appender::rec`] as the catalog's row
    /// now is: while the fence is ours no one else changes the row (a sweeper or a delete
    /// moves the fence, and this commit fails), so the answer to the PATCH needs no read.
    async fn record(&mut self, cp: &Checkpoint) -> Result<(), CatalogError> {
        if let Err(e) = self.engine.catalog.checkpoint(&self.rec.id, self.fence, cp).await {
            self.commit_unknown |= matches!(e, CatalogError::Unavailable(_));
            return Err(self.engine.fenced(&self.rec.id, e));
        }
        self.engine.commits.tell(&self.rec.id, Some(cp.offset));
        let rec = &mut self.rec;
        rec.offset = cp.offset;
        rec.hash_state.clone_from(&cp.hash_state);
        rec.blob_state = crate::framed::split(&cp.blob_state).0.to_vec();
        rec.length = cp.length.or(rec.length);
        rec.updated_at_ms = cp.now_ms;
        match cp.finished_sha256 {
            Some(digest) => {
                rec.sha256 = Some(digest);
                rec.finished_at_ms = Some(cp.now_ms);
                rec.expires_at_ms = None;
            }
            None => rec.expires_at_ms = cp.expires_at_ms,
        }
        Ok(())
    }

    /// Throw away everything since the last commit (a background checkpoint that was
    /// already under way is completed first, as if it had been synchronous).
    pub(crate) async fn discard(&mut self) -> Result<(), Refusal> {
        if self.broken {
            return Err(lease_lost());
        }
        if let Err(e) = self.settle_pending().await {
            return Err(self.released(e).await);
        }
        if let Err(e) = self.writer.rewind(self.committed.0).await {
            let e = self.blob_failed(e);
            return Err(self.released(e).await);
        }
        self.hasher.reset(self.committed.1.clone());
        // What was sent of the discarded bytes (a streamed part given up may still be on its
        // way) keeps its store names from the next writer.
        self.note_in_transit().await;
        Ok(())
    }

    /// Make the written bytes durable, then commit offset + midstate (+ completion) in one
    /// catalog transaction. At completion the whole-upload sha256 is checked against the
    /// declared one; a mismatch resets the upload to offset 0 and answers 460.
    pub(crate) async fn commit(&mut self) -> Result<(), Refusal> {
        let started = Instant::now();
        let was_finished = self.finished;
        match self.commit_inner().await {
            Ok(()) => {
                if !was_finished {
                    self.engine.metrics.checkpoint_duration.observe(started.elapsed().as_secs_f64());
                }
                Ok(())
            }
            Err(e) => Err(self.released(e).await),
        }
    }

    async fn commit_inner(&mut self) -> Result<(), Refusal> {
        if self.finished {
            return Ok(());
        }
        if self.broken {
            return Err(lease_lost());
        }
        // The sync below covers whatever an outstanding background checkpoint covered.
        if let Some(p) = self.pending.take() {
            if let Err(e) = p.done.await {
                return Err(self.blob_failed(e));
            }
        }
        // Hashing of the last bytes and the final fsync run at once.
        let (synced, mut hasher) = tokio::join!(self.writer.sync(), self.hasher.snapshot());
        let mut blob = synced.map_err(|e| self.blob_failed(e))?;
        blob = self.numbered(blob);
        let offset = self.writer.position();
        let now = now_ms();
        let mut finished_sha256 = None;
        if self.length == Some(offset) {
            let digest = hasher.digest();
            if self.rec.expected_sha256.is_some_and(|e| e != digest) {
                if let Err(e) = self.writer.rewind(0).await {
                    return Err(self.blob_failed(e));
                }
                blob = self.writer.sync().await.map_err(|e| self.blob_failed(e))?;
                blob = self.numbered(blob);
                hasher = RunningSha256::new();
                self.hasher.reset(hasher.clone());
                let cp = self.unfinished_checkpoint(0, &hasher, &blob, self.set_length);
                self.record(&cp).await?;
                self.committed = (0, hasher);
                self.committed_blob = blob;
                return Err(ferry_tus::upload_digest_mismatch().into());
            }
            finished_sha256 = Some(digest);
        }
        let mut cp = Checkpoint {
            offset,
            hash_state: hasher.state(),
            blob_state: blob.0.clone(),
            blob_entries_from: blob.entries_from(&self.committed_blob),
            length: self.set_length,
            finished_sha256,
            expires_at_ms: if finished_sha256.is_some() { None } else { self.engine.expiry_from(now) },
            now_ms: now,
        };
        if let Some(digest) = finished_sha256 {
            // Complete, then commit (DESIGN §2): first every byte is durable and committed at
            // the full offset — unfinished, so a crash from here on leaves an upload the
            // finisher completes ([`super::finishing`]) rather than one that starts over.
            if self.committed.0 != offset || self.committed_blob != blob {
                let mut at_offset = cp.clone();
                at_offset.finished_sha256 = None;
                at_offset.expires_at_ms = self.engine.expiry_from(now);
                self.record(&at_offset).await?;
                self.committed = (offset, hasher.clone());
                self.committed_blob = blob.clone();
            }
            if let Some(hooks) = self.engine.hooks.get().filter(|h| h.has_pre_finish()) {
                let finishing = super::hooks::FinishingUpload {
                    id: &self.rec.id,
                    principal: &self.rec.principal,
                    size: offset,
                    sha256: digest,
                    metadata: &self.rec.metadata,
                };
                match hooks.pre_finish(&finishing).await {
                    Ok(()) => {}
                    Err(refused) if refused.code == crate::error::ErrorCode::Rejected => {
                        // Refused (e.g. a virus scan): the upload is failed; its record and bytes go.
                        tracing::info!(upload = self.rec.id, status = refused.status, "pre-finish hook refused the upload; removing it");
                        self.finished = true;
                        self.engine.delete_record_and_bytes(&self.rec).await?;
                        return Err(refused);
                    }
                    // The hook could not answer (policy: reject): every byte is kept; the server
                    // finishes it once the hook answers ([`super::finishing`]).
                    Err(unavailable) => return Err(unavailable.with_cursor(offset)),
                }
            }
            // Then the object is made whole (S3: the multipart upload completed, its markers
            // and tail removed). A store that is away leaves the upload waiting for the
            // finisher; one that refuses for good (or lost the bytes) rolls it back — never a
            // "finished" for bytes nobody could read.
            match self.writer.complete().await {
                Ok(Some(whole)) => {
                    cp.blob_state = whole.0.clone();
                    blob = whole;
                }
                Ok(None) => {}
                Err(e) => return Err(self.blob_failed(e)),
            }
            cp.blob_entries_from = blob.entries_from(&self.committed_blob);
        }
        self.record(&cp).await?;
        self.committed = (offset, hasher);
        self.committed_blob = blob;
        if finished_sha256.is_some() {
            self.finished = true;
            // A finished upload takes no more bytes: its kept fence is of no further use.
            self.engine.fences.forget(&self.rec.id);
            self.engine.metrics.uploads_finished.inc();
        }
        Ok(())
    }
}

impl UploadEngine {
    /// Append `chunk` to the upload at the offset `decide` approves, given the stored state
    /// read under the writer slot (TUS 1.0 §PATCH). Runs on its own task, so a client that
    /// goes away mid-body still gets what arrived checkpointed.
    ///
    /// The chunk checksum is either announced before the bytes (the plan's `checksum`) or, when
    /// the plan says one follows them (`checksum_in_trailer`), read from
    /// [`ChunkStream::trailing_checksum`] once the stream has ended (TUS 1.0 §Checksum).
    ///
    /// Errors: everything [`ferry_tus::plan_patch`] decides; 413 when the body runs past the
    /// length (bytes since the last checkpoint are discarded); 460 for a chunk checksum
    /// mismatch (the chunk is discarded) or a whole-upload sha256 mismatch (reset to 0);
    /// 423/409 when another request takes the upload over mid-body (what arrived is kept).
    pub async fn append<C, F>(self: &Arc<Self>, principal: String, id: String, decide: F, chunk: C) -> Result<AppendOutcome, Refusal>
    where
        C: ChunkStream + Send + 'static,
        F: FnOnce(&UploadState) -> Result<PatchPlan, Refusal> + Send + 'static,
    {
        let me = self.clone();
        tokio::spawn(async move { UploadEngine::append_owned(&me, &principal, &id, decide, chunk).await })
            .await
            .map_err(|e| internal("append task", e))?
    }

    async fn append_owned<C, F>(self: &Arc<Self>, principal: &str, id: &str, decide: F, mut body: C) -> Result<AppendOutcome, Refusal>
    where
        C: ChunkStream + Send + 'static,
        F: FnOnce(&UploadState) -> Result<PatchPlan, Refusal>,
    {
        // The lease first when it is free (the usual case: one client, one PATCH after
        // another): the upload is read once, under it. When another request holds it, the
        // owner is checked before that request is asked to stop, so a stranger's PATCH never
        // disturbs a writer.
        let mut guard = match self.locker.acquire(id, Want::IfFree, self.cfg.takeover_wait).await {
            Ok(lease) => lease,
            Err(LockError::Locked) => {
                self.get(principal, id).await?;
                self.take(id).await?
            }
            Err(LockError::Catalog(e)) => {
                // An unknown, foreign or expired upload: the reader's answer (404 or 410).
                self.get(principal, id).await?;
                return Err(e.into());
            }
        };
        // A catalog lease's grant read the row already (issue 24: one statement less per PATCH).
        let rec = match guard.take_row() {
            Some(row) => self.admit(principal, Some(row))?,
            None => self.get(principal, id).await?,
        };
        let state = UploadState { offset: rec.offset, length: rec.length, is_final: matches!(rec.concat, Concat::Final { .. }) };
        let plan = match decide(&state) {
            Ok(plan) => plan,
            Err(e) => {
                // Refused before reading (an offset that moved, a length that does not fit):
                // the lease goes back and the answer goes out at once; a client that waits for
                // `100 Continue` sends nothing, one still sending is read in the background.
                drop(guard);
                super::exhausted::let_go(body);
                return Err(e);
            }
        };
        if rec.is_finished() {
            // Offset equals length: nothing more may arrive; an empty PATCH is a no-op. A body
            // whose size was not announced (chunked) is read up to its first byte to learn
            // which this is.
            if super::exhausted::has_bytes(&mut body).await {
                super::exhausted::let_go(body);
                return Err(already_complete(rec.offset));
            }
            return Ok(rec);
        }
        if let Err(e) = self.check_space(0, Some(rec.offset)) {
            // Bytes the blob holds past the committed offset (a writer killed mid-PATCH) are
            // cut when this PATCH's writer opens: that room is this upload's own to use again.
            let freed = self.blobs.held_past(&rec.id, rec.offset).await;
            if freed == 0 || self.cfg.reserve.check_freeing(0, freed).is_err() {
                // Refused before reading: the 507 with its cursor goes out at once (`let_go`).
                super::exhausted::let_go(body);
                return Err(e);
            }
        }
        if let Some(len) = plan.set_length {
            // A part's length declared now must not make a pending final too large (`concat`).
            if let Err(e) = self.check_part_length(&rec, len).await {
                drop(guard);
                super::exhausted::let_go(body);
                return Err(e);
            }
        }
        // A deferred length grows the principal's use as bytes arrive: this PATCH may add at
        // most the quota's room (a length declared now is checked whole, before any byte).
        let want = plan.max_bytes.min(body.len_hint().unwrap_or(u64::MAX));
        let (room, _room_held) = match self.patch_room(&rec, plan.set_length, want).await {
            Ok(r) => r,
            Err(e) => {
                super::exhausted::let_go(body);
                return Err(e);
            }
        };
        let mut refused: u64 = 0;
        self.metrics.patches_in_flight.inc();
        let _in_flight = InFlight(self);
        let durable = rec.offset;
        let mut app = match Appender::open(self, rec, plan.offset, plan.length, plan.set_length, &guard).await {
            Ok(app) => app,
            Err(e) => {
                // The blob could not be opened (the store is away, say): the answer with its
                // cursor goes out at once (`let_go`).
                super::exhausted::let_go(body);
                let retry_later = matches!(e.code, crate::error::ErrorCode::Unavailable | crate::error::ErrorCode::InsufficientStorage);
                return Err(if retry_later && e.cursor.is_none() { e.with_cursor(durable) } else { e });
            }
        };

        if let Some(declared) = body.len_hint() {
            // What this body will add, within its plan and the quota's room.
            app.expecting(plan.offset.saturating_add(declared.min(plan.max_bytes).min(room.unwrap_or(u64::MAX))));
        }
        let mut digests = match (&plan.checksum, plan.checksum_in_trailer) {
            (Some(c), _) => ChunkDigests::for_header(c.algorithm),
            (None, true) => ChunkDigests::for_trailer(),
            (None, false) => ChunkDigests::default(),
        };
        let verifying = !digests.is_empty();
        app.keep_partial = !verifying;
        let mut space = super::exhausted::SpaceWatch::default();
        let mut received: u64 = 0;
        let mut since_checkpoint: u64 = 0;
        // The idle timeout counts from the last slice of bytes; bytes gathered for a batch are
        // handed on once the oldest of them waited FLUSH_QUIET.
        let mut last_frame = tokio::time::Instant::now();
        let mut gathered_since: Option<tokio::time::Instant> = None;
        let end = loop {
            let quiet = gathered_since.map(|t| t + FLUSH_QUIET);
            let frame = tokio::select! {
                biased;
                _ = guard.stop().cancelled() => break End::TakenOver,
                _ = self.shutdown.cancelled() => break End::Shutdown,
                _ = tokio::time::sleep_until(quiet.unwrap_or(last_frame)), if quiet.is_some() => {
                    gathered_since = None;
                    if let Err(e) = app.flush().await {
                        super::exhausted::let_go(body);
                        return Err(e);
                    }
                    continue;
                }
                f = tokio::time::timeout_at(last_frame + self.cfg.idle_timeout, body.next()) => f,
            };
            last_frame = tokio::time::Instant::now();
            let data = match frame {
                Err(_) => break End::Idle,
                Ok(None) => break End::Eof,
                Ok(Some(Err(e))) => {
                    tracing::debug!(upload = id, error = %e, "PATCH body failed");
                    break End::Disconnected;
                }
                Ok(Some(Ok(d))) => d,
            };
            received += data.len() as u64;
            if received > plan.max_bytes {
                break End::TooLarge;
            }
            if let Some(room) = room.filter(|r| received > *r) {
                // Keep the part of this chunk that fits, refuse the rest.
                let fit = room - (received - data.len() as u64);
                refused = received - room;
                if fit > 0 {
                    let part = data.slice(..fit as usize);
                    digests.update(&part);
                    let n = part.len() as u64;
                    if let Err(e) = app.write(part).await {
                        super::exhausted::let_go(body);
                        return Err(e);
                    }
                    self.metrics.bytes_received.inc_by(n);
                }
                break End::Quota;
            }
            // Before a byte of it is written: a frame that would eat into the reserve is refused
            // whole (the client sends it again with the rest).
            if space.check(&self.cfg.reserve, received, app.unwritten()).is_err() {
                break End::Reserve;
            }
            digests.update(&data);
            since_checkpoint += data.len() as u64;
            let n = data.len() as u64;
            if let Err(e) = app.write(data).await {
                super::exhausted::let_go(body);
                return Err(e);
            }
            if let Err(e) = app.note_numbers_if_due().await {
                super::exhausted::let_go(body);
                return Err(e);
            }
            gathered_since.get_or_insert(last_frame);
            // `ferry_bytes_received_total`: bytes of request bodies, written (a task's own
            // files and a concatenation's copies are not received).
            self.metrics.bytes_received.inc_by(n);
            if !verifying {
                if since_checkpoint >= self.cfg.checkpoint_every {
                    // fsync + commit in the background while the body keeps streaming in
                    if let Err(e) = app.checkpoint_in_background().await {
                        super::exhausted::let_go(body);
                        return Err(e);
                    }
                    since_checkpoint = 0;
                } else {
                    if let Err(e) = app.poll_checkpoint().await {
                        super::exhausted::let_go(body);
                        return Err(e);
                    }
                }
            }
        };

        match end {
            End::Eof => {
                let trailer = body.trailing_checksum();
                if !verifying && trailer.is_some() {
                    app.discard().await?;
                    return Err(Refusal::bad_request(
                        "an Upload-Checksum trailer arrived without being announced in the Trailer header; the chunk was discarded",
                        Next::Trailer(TrailerFault::Unannounced),
                    )
                    .with_cursor(plan.offset));
                }
                if verifying {
                    let expected = match (plan.checksum, trailer) {
                        (Some(c), Some(t)) if t.as_ref().ok() != Some(&c) => {
                            app.discard().await?;
                            return Err(Refusal::bad_request(
                                "the Upload-Checksum trailer disagrees with the Upload-Checksum header; the chunk was discarded",
                                Next::Trailer(TrailerFault::Disagrees),
                            )
                            .with_cursor(plan.offset));
                        }
                        (Some(c), _) => c,
                        (None, Some(Ok(c))) => c,
                        (None, Some(Err(e))) => {
                            app.discard().await?;
                            return Err(e.with_cursor(plan.offset));
                        }
                        (None, None) => {
                            app.discard().await?;
                            return Err(Refusal::bad_request(
                                "the Upload-Checksum trailer announced in Trailer did not arrive; the chunk was discarded",
                                Next::Trailer(TrailerFault::Missing),
                            )
                            .with_cursor(plan.offset));
                        }
                    };
                    if !digests.matches(&expected) {
                        app.discard().await?;
                        return Err(ferry_tus::chunk_checksum_mismatch(plan.offset).into());
                    }
                }
                if plan.completes {
                    // The draft's `Upload-Complete: ?1`: the body's end is the upload's end.
                    let end = app.position();
                    match app.length {
                        None => app.set_final_length(end),
                        Some(len) if len != end => {
                            app.commit().await?;
                            return Err(ferry_tus::draft::length_short(len, app.committed.0).into());
                        }
                        Some(_) => {}
                    }
                }
                app.commit().await?;
            }
            End::TooLarge => {
                app.discard().await?;
                let kept = app.committed.0;
                let room = plan.offset + plan.max_bytes - kept;
                if room == 0 && plan.length == Some(kept) {
                    return Err(already_complete(kept));
                }
                let limit = plan.length.map_or("the maximum upload size".to_string(), |l| format!("Upload-Length {l}"));
                return Err(Refusal::new(
                    413,
                    crate::error::ErrorCode::SizeExceeded,
                    format!("the body ran past {limit}; bytes after offset {kept} were discarded"),
                    Next::SendAtMost { bytes: room },
                )
                .with_cursor(kept));
            }
            End::Disconnected | End::Idle | End::TakenOver | End::Shutdown | End::Reserve | End::Quota => {
                if !app.holds() {
                    // The lease was lost (its renewal was refused, or it ran out while this
                    // process was paused): nothing of what arrived is written or committed.
                    tracing::info!(upload = id, "the upload's lease was lost mid-body; nothing more was written");
                    return Err(lease_lost());
                }
                // Keep what arrived, unless it can no longer be verified.
                if verifying {
                    app.discard().await?;
                } else {
                    app.commit().await?;
                }
                let kept = app.committed.0;
                tracing::debug!(upload = id, kept, "PATCH ended early");
                if matches!(end, End::Reserve | End::Quota) {
                    super::exhausted::let_go(body);
                }
                return Err(match end {
                    End::Quota => self.quota_refusal(principal, kept, refused).await,
                    End::Reserve => match self.check_space(0, Some(kept)) {
                        Err(e) => e,
                        Ok(()) => Refusal::insufficient_storage("the server's disk reached its free-space reserve", Some(kept)),
                    },
                    End::Shutdown => Refusal::new(
                        503,
                        crate::error::ErrorCode::Locked,
                        format!("the server is shutting down; the upload keeps its first {kept} bytes (offset {kept})"),
                        Next::Resume { soon: true },
                    )
                    .with_cursor(kept),
                    End::Idle => Refusal::new(
                        408,
                        crate::error::ErrorCode::Locked,
                        format!("the body stalled; the upload keeps its first {kept} bytes (offset {kept})"),
                        Next::Resume { soon: false },
                    )
                    .with_cursor(kept),
                    End::Disconnected => Refusal::bad_request(
                        format!(
                            "the request body ended early or was malformed; {}the upload keeps its first {kept} bytes (offset {kept})",
                            if verifying { "nothing of it was kept (its checksum could not be verified); " } else { "" }
                        ),
                        // Not retryable: a malformed body fails the same way again; the repair is a
                        // well-framed body.
                        Next::BodyCut,
                    )
                    .with_cursor(kept),
                    // Taken over: TUS allows one request at a time per upload.
                    _ => Refusal::new(
                        423,
                        crate::error::ErrorCode::Locked,
                        // The request that took over may be a DELETE, which removes the upload after this
                        // answer: say what was stored, not that the upload keeps it.
                        format!(
                            "another request for this upload (a HEAD, PATCH or DELETE) asked this PATCH to stop; its \
                             bytes up to offset {kept} were stored, and the upload is kept unless that request deletes it"
                        ),
                        Next::Resume { soon: true },
                    )
                    .with_cursor(kept),
                });
            }
        }
        drop(guard);
        // The row as the last commit left it (see `Appender::record`), as `get` would show it.
        Ok(self.with_retention(app.rec))
    }
}

/// The protocol's refusal of bytes sent to an upload that already holds all of its `length`
/// bytes ([`ferry_tus::TusError::already_complete`]); the body is dropped.
fn already_complete(length: u64) -> Refusal {
    ferry_tus::TusError::already_complete(length).into()
}
