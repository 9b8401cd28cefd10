//! The S3 writer: one upload's open part, under its lease (DESIGN §2 "S3 mapping").
//!
//! - **The open part stays in memory while this process holds the lease.** Bytes gather in the
//!   part being filled; a full part is sent (UploadPart) at once, in a task of its own, while
//!   the next one fills (at most `[s3] parts_in_flight` on their way). At a checkpoint
//!   ([`BlobWriter::sync`]) only the bytes new since the last one are written, as one tail
//!   segment object, so the next holder can resume. When the request's declared length says
//!   a part will fill within it ([`BlobWriter::expecting`]), the part is **streamed**: its
//!   UploadPart starts with its first byte and is fed as bytes arrive ([`Streaming`]), so
//!   a PATCH that ends on a part's boundary waits only for S3's answer, not for the whole
//!   part to be sent after it was received; the open part still gathers every byte, and a
//!   stream that fails is replaced by the whole part sent as before. When the writer ends (the PATCH is over),
//!   its open part is **parked** in the store ([`Parked`]) with the state it last synced; the
//!   next PATCH of the same upload in this process, at that committed state, takes it back and
//!   reads nothing from S3. Only a new holder (another process, or after eviction) reads the
//!   tail segments back.
//! - **Memory is bounded store-wide** by `[s3] max_buffer` ([`Budget`](super::budget::Budget)): a writer reserves its
//!   open part's bytes as they arrive, 64 KiB at a time (never a whole part for one byte), after
//!   evicting parked parts (their bytes are durable in tail segments); a full part takes its
//!   share with it until S3 has stored it. A reservation that finds no room waits at most
//!   [`BUDGET_WAIT`](super::budget::BUDGET_WAIT), then fails `Unavailable` (the client is told to retry): writers that hold
//!   part of the budget and want more never wait on each other without bound. Tails read back
//!   on a resume or a rewind, and parts a composition streams, are reserved before they are read.
//! - **The lease guards every change** ([`WriteLease`]): every request that changes the store
//!   is made only while the lease holds, is cut short when the writer is asked to let go, and
//!   a part whose upload returns after the lease ran out is not recorded. A writer cut or
//!   fenced is broken: it changes nothing more and is never parked.
//!
//! One file of ~790 lines because it is one writer's state machine (the open part, the parts on
//! their way, the stream, the numbers taken) whose every method moves the same fields; the
//! budget it reserves from is `budget.rs`, the part model `state.rs`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use object_store::multipart::{MultipartStore, PartId};
use object_store::{MultipartId, ObjectStoreExt, PutPayload};
use tokio::sync::OwnedSemaphorePermit;

use super::budget::BUDGET_UNIT;

use super::state::{part_number, S3State, Segment, MAX_PARTS, PART_SLOTS, STALE_WINDOW, UNNOTED_NUMBERS};
use super::{bounded, deadline_for, io, Inner, REQUEST_DEADLINE};
use crate::blob::{BlobError, BlobResult, BlobState, BlobWriter, WriteLease};

/// Part numbers streaming leaves unused for takeovers and resends ([`S3Writer::numbers_to_spare`]):
/// eight takeovers' windows. An upload near [`PART_SLOTS`] parts sends its last parts whole
/// rather than streamed to keep them.
const KEPT_FOR_TAKEOVERS: u32 = 8 * STALE_WINDOW;

/// How long a parked open part waits for the next PATCH of its upload before it is dropped
/// (its bytes are durable in tail segments; a later writer reads them back).
const PARK_FOR: Duration = Duration::from_secs(60);

/// How many received slices a streamed part's body may queue before a write waits for S3 to
/// take them (hyper hands over slices of up to a few hundred KiB).
const FEED_DEPTH: usize = 16;

/// Longest a write waits for a streamed part's request to take its bytes before the stream is
/// given up (S3 stopped reading): the part is then gathered and sent whole, as without one.
const FEED_WAIT: Duration = Duration::from_secs(5);

/// A part sent while its bytes arrive: an UploadPart of the part's full size whose body is fed
/// by [`BlobWriter::write`] ([`Inner::stream_part`]).
struct Streaming {
    /// Index (0-based) of the part it sends: always the open part's.
    idx: u64,
    /// Its part number, and the one kept for sending the part whole should the stream fail
    /// (a number is sent once: [`super::state::Numbering`]).
    number: u32,
    fallback: u32,
    /// Feeds the request's body; `None` once the request stopped taking bytes (it failed: the
    /// part is then sent whole when full).
    feed: Option<tokio::sync::mpsc::Sender<Bytes>>,
    task: tokio::task::JoinHandle<BlobResult<PartId>>,
}

/// A full part on its way to S3, in a task of its own, which answers with the number the part
/// was stored under (its stream's, or the whole part's after a stream failed).
struct Sending {
    /// The part's bytes, put back in front of the open part if it is not stored.
    data: Bytes,
    /// Their reservation in the [`Budget`](super::budget::Budget): given back once the part is stored, put back with
    /// the bytes if it is not.
    permit: Option<OwnedSemaphorePermit>,
    task: tokio::task::JoinHandle<BlobResult<(u32, PartId)>>,
}

/// What a writer keeps of its upload between two PATCHes.
pub(super) struct OpenPart {
    /// Parts uploaded and tail as of the last write / sync.
    pub st: S3State,
    /// Bytes from the end of the uploaded parts on (less than one part).
    pub buf: BytesMut,
    /// Tail segments known to exist (opened with or written by this writer), for rewinds.
    pub known: Vec<Segment>,
    /// The segments of the last three synced states (the opened one first): older ones are
    /// deleted, as the engine commits a state before it syncs twice more.
    pub history: Vec<Vec<Segment>>,
    /// The reservation in the [`Budget`](super::budget::Budget) covering `buf` (whole units, grown as it fills).
    pub permit: Option<OwnedSemaphorePermit>,
}

/// An open part's bytes lent out as [`Bytes`] while a request sends some of them, and given back
/// to the part when dropped — after the request, or when the future sending it is dropped: the
/// part is whole again on every path. Back without a copy (and with its capacity) when nothing
/// else still holds the bytes; a copy otherwise.
struct Lent<'a> {
    part: &'a mut BytesMut,
    whole: Option<Bytes>,
}

impl<'a> Lent<'a> {
    fn new(part: &'a mut BytesMut) -> Lent<'a> {
        let whole = std::mem::take(part).freeze();
        Lent { part, whole: Some(whole) }
    }

    fn whole(&self) -> &Bytes {
        self.whole.as_ref().expect("lent until dropped")
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(whole) = self.whole.take() {
            *self.part = whole.try_into_mut().unwrap_or_else(|shared| BytesMut::from(&shared[..]));
        }
    }
}

/// Open parts of writers that ended, by upload id, with the state each last synced.
#[derive(Default)]
pub(super) struct Parked(Mutex<HashMap<String, (BlobState, Instant, OpenPart)>>);

impl Parked {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (BlobState, Instant, OpenPart)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The parked part of `id` if it was parked at exactly `state` (nobody committed anything
    /// since); any other parked part of `id` is dropped.
    pub(super) fn take(&self, id: &str, state: &BlobState) -> Option<OpenPart> {
        let mut m = self.lock();
        m.retain(|_, (_, at, _)| at.elapsed() < PARK_FOR);
        let (st, _, part) = m.remove(id)?;
        (st == *state).then_some(part)
    }

    fn put(&self, id: String, state: BlobState, part: OpenPart) {
        self.lock().insert(id, (state, Instant::now(), part));
    }

    /// Drop the part parked longest ago; `false` when none is.
    pub(super) fn evict_one(&self) -> bool {
        let mut m = self.lock();
        let Some(oldest) = m.iter().min_by_key(|(_, (_, at, _))| *at).map(|(k, _)| k.clone()) else { return false };
        m.remove(&oldest);
        true
    }

    /// Forget the parked part of `id` (its blob was reset, aborted or deleted).
    pub(super) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }
}

/// The error of an UploadPart on this writer's own multipart upload `mp` (on `path`): the
/// multipart upload is gone, and with it every part ([`BlobError::Lost`]), only once
/// ListMultipartUploads confirms it — after a `404 NoSuchUpload`, or after a failure a store
/// gives for an upload it aborted (moto answers 500) — never on one answer alone; until then the
/// failure is one that may pass ([`BlobError::Unavailable`]).
async fn part_error(s: &Inner, path: &object_store::path::Path, mp: &MultipartId, e: object_store::Error) -> BlobError {
    let err = io(e);
    let suspect = matches!(err, BlobError::NotFound | BlobError::Unavailable(_));
    if suspect && s.multipart_gone(path, mp.as_ref()).await {
        return BlobError::Lost {
            kept: 0,
            why: "its S3 multipart upload is gone (NoSuchUpload, confirmed by listing): a bucket \
                  lifecycle rule (AbortIncompleteMultipartUpload) or someone else aborted it"
                .into(),
        };
    }
    match err {
        BlobError::NotFound => BlobError::Unavailable("S3 UploadPart: 404 NoSuchUpload while the multipart upload is still listed".into()),
        other => other,
    }
}

pub(super) struct S3Writer {
    pub store: Arc<Inner>,
    pub id: String,
    pub part: OpenPart,
    pub lease: WriteLease,
    /// A request was cut or the lease was lost: nothing more is done, nothing parked.
    pub broken: bool,
    /// `Some(len)`: opened on the completed object of `len` bytes (a finish to repeat after a
    /// crash between completing and committing); only [`BlobWriter::complete`]'s clean-up is
    /// left to do.
    pub completed_len: Option<u64>,
    /// The multipart upload was completed by this writer.
    pub completed: bool,
    /// Full parts sent and not yet known to be stored, oldest first (at most `[s3]
    /// parts_in_flight`); they follow `part.st.parts` and precede `part.buf`. A checkpoint, a
    /// rewind and the completion wait for them first, so what those see is the state of a
    /// writer that sent each part in turn.
    sending: VecDeque<Sending>,
    /// The open part, streamed as it fills.
    streaming: Option<Streaming>,
    /// Where this request's bytes end, by its declared length (0: unknown).
    expected: u64,
    /// The first part this writer may still stream: one whose stream was given up is not
    /// streamed again.
    stream_from: u64,
    /// The numbering's `next` as last synced or amended (or opened): what a commit records.
    noted: u32,
    /// Whether this writer has said that it sends part numbers again (they ran short).
    warned_reuse: bool,
}

impl S3Writer {
    pub(super) fn new(store: Arc<Inner>, id: &str, st: S3State, buf: BytesMut, known: Vec<Segment>, lease: &WriteLease) -> S3Writer {
        let history = vec![known.clone()];
        S3Writer::with_part(store, id, OpenPart { st, buf, known, history, permit: None }, lease)
    }

    /// A writer of `part` (opened from a committed state, or parked by an earlier writer of
    /// this process): its numbering skips what holders that never let go may have sent
    /// ([`S3State::open_numbering`]).
    pub(super) fn with_part(store: Arc<Inner>, id: &str, mut part: OpenPart, lease: &WriteLease) -> S3Writer {
        part.st.open_numbering(lease.generation);
        let noted = part.st.numbering.map_or(0, |n| n.next);
        S3Writer {
            store,
            id: id.to_string(),
            part,
            lease: lease.clone(),
            broken: false,
            completed_len: None,
            completed: false,
            sending: VecDeque::new(),
            streaming: None,
            expected: 0,
            stream_from: 0,
            noted,
            warned_reuse: false,
        }
    }

    /// Stop streaming the open part (its request is dropped mid-body, so S3 stores nothing of
    /// it); its bytes stay in the open part.
    fn stop_streaming(&mut self) {
        if let Some(s) = self.streaming.take() {
            s.task.abort();
            self.stream_from = s.idx + 1;
        }
    }

    /// Start streaming the open part if this request's bytes will fill it: the multipart upload
    /// is created if needed, and the bytes the part already holds go first.
    async fn start_streaming(&mut self) -> BlobResult<()> {
        let schedule = self.part.st.schedule;
        let idx = self.filling();
        let size = schedule.size(idx);
        let fills = schedule.start(idx).saturating_add(size) <= self.expected;
        if !self.store.stream_parts || self.streaming.is_some() || idx < self.stream_from || !fills || !self.numbers_to_spare(idx) {
            return Ok(());
        }
        // The bytes already in the open part (a resumed tail) go first, as a copy the stream
        // holds until S3 has read it: budget for it too, held by the stream, or no stream (the
        // part is gathered and sent whole, as it is when streaming does not apply).
        let mut copy_permit = None;
        if !self.part.buf.is_empty() && !self.store.budget.try_cover(&mut copy_permit, self.part.buf.len() as u64, &self.store.parked) {
            return Ok(());
        }
        let mp = self.ensure_multipart().await?;
        let (number, fallback) = (self.take_number(idx)?, self.take_number(idx)?);
        let holds = self.lease.check();
        self.guard(holds)?;
        let (feed, body) = tokio::sync::mpsc::channel(FEED_DEPTH);
        if !self.part.buf.is_empty() {
            // Room for it: the channel is new.
            let _ = feed.try_send(Bytes::copy_from_slice(&self.part.buf));
        }
        let (s, lease) = (self.store.clone(), self.lease.clone());
        let path = s.object(&self.id);
        let task = tokio::spawn(async move {
            let _copy = copy_permit;
            lease.run(s.stream_part(&path, &mp, number, size, body)).await
        });
        self.streaming = Some(Streaming { idx, number, fallback, feed: Some(feed), task });
        Ok(())
    }

    /// Hand the open part's share of `data` (received next) to its stream, waiting while S3
    /// is behind, at most [`FEED_WAIT`]: a stream S3 stopped reading is given up. One whose
    /// request ended is left to report its failure when the part is whole.
    async fn feed(&mut self, data: &Bytes) {
        let room = self.part.st.schedule.size(self.filling()).saturating_sub(self.part.buf.len() as u64);
        let Some(s) = self.streaming.as_mut() else { return };
        let Some(feed) = s.feed.as_ref() else { return };
        let n = (data.len() as u64).min(room) as usize;
        if n == 0 {
            return;
        }
        match tokio::time::timeout(FEED_WAIT, feed.send(data.slice(..n))).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => s.feed = None,
            Err(_) => {
                tracing::debug!(upload = %self.id, part = s.idx, "S3 stopped reading a streamed part; gathering it to send whole");
                self.stop_streaming();
            }
        }
    }

    fn parts_end(&self) -> u64 {
        self.part.st.parts_end()
    }

    /// Most parts this upload can have: its size hint in parts of its size (every part but the
    /// last has it), or [`PART_SLOTS`] when unknown.
    fn most_parts(&self) -> u64 {
        let size = self.part.st.schedule.size(self.filling()).max(1);
        match self.lease.size_hint {
            0 => PART_SLOTS,
            hint => hint.div_ceil(size).clamp(1, MAX_PARTS),
        }
    }

    /// The number of the next attempt at part `idx`, never sent before ([`super::state::Numbering::take`];
    /// states of versions 2–4: [`part_number`]). Errors when S3's 10 000 numbers cannot hold it.
    fn take_number(&mut self, idx: u64) -> BlobResult<u32> {
        let most = self.most_parts();
        let after = self.part.st.parts.last().map_or(0, |p| p.0);
        let number = match self.part.st.numbering.as_mut() {
            Some(n) => n.take(idx, most, after),
            None => Some(part_number(self.part.st.schedule, idx, self.lease.generation)).filter(|&n| u64::from(n) <= MAX_PARTS).map(|n| (n, false)),
        };
        let part_size = self.part.st.schedule.size(idx);
        let (number, held_back) = number.ok_or(BlobError::TooManyParts { most: self.part.st.schedule.start(idx), part_size })?;
        if held_back && !std::mem::replace(&mut self.warned_reuse, true) {
            tracing::warn!(
                upload = %self.id,
                part = number,
                "this upload has used up its spare S3 part numbers (taken over many times): parts now go under numbers \
                 that may have been sent before, and a stale part that reaches S3 late can make its completion fail"
            );
        }
        Ok(number)
    }

    /// Whether part `idx` can be streamed: a stream takes two numbers (its own and the whole
    /// part's, should it fail), which must leave room for the parts after it and
    /// [`KEPT_FOR_TAKEOVERS`] more.
    fn numbers_to_spare(&self, idx: u64) -> bool {
        match self.part.st.numbering {
            Some(n) => {
                let to_come = self.most_parts().max(idx + 1).min(MAX_PARTS) - idx - 1;
                u64::from(n.next) + 1 + to_come + u64::from(KEPT_FOR_TAKEOVERS) <= MAX_PARTS
            }
            None => u64::from(part_number(self.part.st.schedule, idx, self.lease.generation)) <= MAX_PARTS,
        }
    }

    /// Index of the part `part.buf` fills: after the stored parts and those on their way.
    fn filling(&self) -> u64 {
        (self.part.st.parts.len() + self.sending.len()) as u64
    }

    /// Wait until at most `keep` parts are still on their way to S3, recording each stored
    /// one in order. A part that was not stored puts its bytes, and those of every part sent
    /// after it (stopped; S3 replaces a part sent again under the same number), back in front
    /// of the open part, as if none of them had been sent, and its error is returned.
    async fn settle(&mut self, keep: usize) -> BlobResult<()> {
        while self.sending.len() > keep {
            let Some(next) = self.sending.pop_front() else { break };
            let stored = match next.task.await {
                Ok(r) => r,
                Err(e) => Err(BlobError::Io(std::io::Error::other(format!("sending a part to S3 stopped: {e}")))),
            };
            match stored {
                Ok((number, pid)) => {
                    self.part.st.parts.push((number, pid.content_id));
                    self.part.st.tail.clear();
                    drop(next.permit);
                }
                Err(e) => {
                    // The open part moves up behind the returned bytes: its stream is stale.
                    // Their reservations come back with them, so the open part stays covered.
                    self.stop_streaming();
                    let later: Vec<Sending> = self.sending.drain(..).collect();
                    let mut back = BytesMut::with_capacity(next.data.len() + later.iter().map(|l| l.data.len()).sum::<usize>() + self.part.buf.len());
                    back.extend_from_slice(&next.data);
                    let mut permits: Vec<OwnedSemaphorePermit> = next.permit.into_iter().collect();
                    for l in later {
                        l.task.abort();
                        back.extend_from_slice(&l.data);
                        permits.extend(l.permit);
                    }
                    for p in permits {
                        match self.part.permit.as_mut() {
                            Some(held) => held.merge(p),
                            None => self.part.permit = Some(p),
                        }
                    }
                    back.extend_from_slice(&self.part.buf);
                    self.part.buf = back;
                    return self.guard(Err(e));
                }
            }
        }
        Ok(())
    }

    fn usable(&self) -> BlobResult<()> {
        if self.broken {
            return Err(BlobError::Cut);
        }
        if self.completed || self.completed_len.is_some() {
            return Err(BlobError::Io(std::io::Error::other("the blob is complete; it takes no more bytes")));
        }
        self.lease.check()
    }

    /// `r`, marking the writer broken when it was cut or its lease lost.
    fn guard<T>(&mut self, r: BlobResult<T>) -> BlobResult<T> {
        if matches!(r, Err(BlobError::Cut | BlobError::LeaseLost)) {
            self.broken = true;
        }
        r
    }

    /// Make the open part's reservation in the store's budget cover `bytes` (whole MiB, grown
    /// as the part fills; [`Budget::cover`](super::budget::Budget::cover)): never waits past
    /// [`BUDGET_WAIT`](super::budget::BUDGET_WAIT), and a writer asked to let go stops waiting.
    async fn cover(&mut self, bytes: u64) -> BlobResult<()> {
        let s = self.store.clone();
        loop {
            let mut held = self.part.permit.take();
            let covered = s.budget.try_cover(&mut held, bytes, &s.parked);
            self.part.permit = held;
            if covered {
                return Ok(());
            }
            // This writer's own parts on their way hold budget: wait for the oldest to be stored
            // (bounded by its request's deadline) before waiting on other uploads.
            if self.sending.is_empty() {
                break;
            }
            let keep = self.sending.len() - 1;
            self.settle(keep).await?;
        }
        let mut held = self.part.permit.take();
        let covered = self.lease.run(async { s.budget.cover(&mut held, bytes, &s.parked).await }).await;
        self.part.permit = held;
        self.guard(covered)
    }

    async fn ensure_multipart(&mut self) -> BlobResult<String> {
        if let Some(m) = &self.part.st.multipart {
            return Ok(m.clone());
        }
        let s = self.store.clone();
        let path = s.object(&self.id);
        let created = self
            .lease
            .run(async {
                let m = bounded(REQUEST_DEADLINE, s.s3.create_multipart(&path)).await.map_err(io)?;
                bounded(REQUEST_DEADLINE, s.s3.put(&s.mpu_marker(&self.id, &m), PutPayload::new())).await.map_err(io)?;
                Ok(m)
            })
            .await;
        let m = self.guard(created)?;
        self.part.st.multipart = Some(m.clone());
        Ok(m)
    }

    /// Send every full part gathered in `part.buf`, each in a task of its own, with at most
    /// `[s3] parts_in_flight` on their way at once (waiting for the oldest beyond that), so the
    /// next part is received while earlier ones are sent. A part's reservation in the budget
    /// goes with it and is given back when S3 has answered.
    async fn upload_full_parts(&mut self) -> BlobResult<()> {
        loop {
            let idx = self.filling();
            let size = self.part.st.schedule.size(idx);
            if (self.part.buf.len() as u64) < size {
                break;
            }
            let most = self.store.parts_in_flight.max(1);
            if self.sending.len() >= most {
                self.settle(most - 1).await?;
                continue;
            }
            let mp = MultipartId::from(self.ensure_multipart().await?);
            let holds = self.lease.check();
            self.guard(holds)?;
            // The part's stream has had every byte: its body ends here (the sender goes), and
            // should it fail the part goes whole under the number kept for that.
            let streamed = match self.streaming.take() {
                Some(st) if st.idx == idx => Some(st),
                other => {
                    if let Some(st) = other {
                        st.task.abort();
                    }
                    None
                }
            };
            let (number, whole) = match &streamed {
                Some(st) => (st.number, st.fallback),
                None => {
                    let n = self.take_number(idx)?;
                    (n, n)
                }
            };
            let data = self.part.buf.split_to(size as usize).freeze();
            // The part takes its share of the open part's reservation with it.
            let share = (size.div_ceil(BUDGET_UNIT) as usize).min(self.part.permit.as_ref().map_or(0, |p| p.num_permits()));
            let permit = match self.part.permit.as_mut() {
                Some(p) if p.num_permits() <= share => self.part.permit.take(),
                Some(p) => p.split(share),
                None => None,
            };
            let (s, lease) = (self.store.clone(), self.lease.clone());
            let path = s.object(&self.id);
            let payload = PutPayload::from(data.clone());
            let streamed = streamed.map(|st| st.task);
            let task = tokio::spawn(async move {
                // S3's answer to a streamed part is awaited as long as a whole part's would be,
                // from its last byte; one that fails otherwise is sent again whole.
                let streamed = match streamed {
                    None => None,
                    Some(stream) => {
                        let abort = stream.abort_handle();
                        match tokio::time::timeout(deadline_for(size), stream).await {
                            Ok(Ok(Ok(pid))) => Some(Ok((number, pid))),
                            Ok(Ok(Err(e @ (BlobError::Cut | BlobError::LeaseLost)))) => Some(Err(e)),
                            Ok(Ok(Err(e))) => {
                                tracing::debug!(part = number, error = %e, "a streamed part failed; sending it whole");
                                None
                            }
                            Ok(Err(e)) => {
                                tracing::debug!(part = number, error = %e, "a streamed part stopped; sending it whole");
                                None
                            }
                            Err(_) => {
                                abort.abort();
                                Some(Err(BlobError::Unavailable(format!(
                                    "S3 did not answer part {number} within {} s",
                                    deadline_for(size).as_secs()
                                ))))
                            }
                        }
                    }
                };
                let sent = match streamed {
                    Some(done) => done,
                    None => lease
                        .run(async {
                            match bounded(deadline_for(size), s.s3.put_part(&path, &mp, whole as usize - 1, payload)).await {
                                Ok(pid) => Ok(pid),
                                Err(e) => Err(part_error(&s, &path, &mp, e).await),
                            }
                        })
                        .await
                        .map(|pid| (whole, pid)),
                };
                sent
            });
            self.sending.push_back(Sending { data, permit, task });
        }
        if !self.part.buf.is_empty() {
            self.cover(self.part.buf.len() as u64).await?;
        }
        Ok(())
    }

    /// Make the blob whole (see [`BlobWriter::complete`]).
    async fn assemble(&mut self) -> BlobResult<()> {
        self.settle(0).await?;
        // The open part is the last one, shorter than a streamed part's declared size.
        self.stop_streaming();
        let s = self.store.clone();
        let pos = self.position();
        let path = s.object(&self.id);
        // Completed already (an earlier finish of this state that stopped before its commit, or
        // another process finishing it at the same moment): S3 answers a request on a completed
        // multipart upload with NoSuchUpload (moto with 500), so look first. One HEAD per upload.
        if s.exists(&path).await? == Some(pos) {
            return Ok(());
        }
        let Some(mp) = self.part.st.multipart.clone() else {
            let data = self.part.buf.clone().freeze();
            let put = self
                .lease
                .run(async { bounded(deadline_for(data.len() as u64), s.s3.put(&path, PutPayload::from(data.clone()))).await.map(drop).map_err(io) })
                .await;
            return self.guard(put);
        };
        let mpid = MultipartId::from(mp.clone());
        let mut parts = self.part.st.parts.clone();
        let mut done = Ok(());
        if !self.part.buf.is_empty() {
            // The open part becomes the last one (S3 allows the last part to be short).
            let data = self.part.buf.clone().freeze();
            let number = self.take_number(parts.len() as u64)?;
            let sent = self
                .lease
                .run(async {
                    match bounded(deadline_for(data.len() as u64), s.s3.put_part(&path, &mpid, number as usize - 1, PutPayload::from(data.clone())))
                        .await
                    {
                        Ok(pid) => Ok(pid),
                        Err(e) => Err(part_error(&s, &path, &mpid, e).await),
                    }
                })
                .await;
            match self.guard(sent) {
                Ok(pid) => parts.push((number, pid.content_id)),
                Err(e) => done = Err(e),
            }
        }
        if done.is_ok() {
            // Not cut short when the writer is asked to let go: a completion dropped mid-way
            // leaves its outcome unknown to the next holder, who would send it again while S3
            // may still be assembling (it is waited out instead; [`Inner::complete_numbered`]).
            let holds = self.lease.check();
            done = self.guard(holds);
            if done.is_ok() {
                let completed = s.complete_numbered(&path, &mp, &parts, Some(pos)).await;
                done = completed.and_then(|()| self.lease.check());
                done = self.guard(done);
            }
        }
        // Completed already: by this upload's earlier finish that stopped before its commit, or
        // by another process finishing the same committed state.
        if matches!(done, Err(BlobError::Lost { .. })) && s.exists(&path).await? == Some(pos) {
            return Ok(());
        }
        done
    }
}

impl Drop for S3Writer {
    fn drop(&mut self) {
        // Park the open part for this upload's next writer in this process, if every byte it
        // holds is in the last synced state (which the engine commits or supersedes).
        for s in self.sending.drain(..) {
            s.task.abort();
        }
        self.stop_streaming();
        if self.broken || self.completed || self.completed_len.is_some() || self.position() != self.part.st.offset() {
            return;
        }
        let part = OpenPart {
            st: self.part.st.clone(),
            buf: std::mem::take(&mut self.part.buf),
            known: std::mem::take(&mut self.part.known),
            history: std::mem::take(&mut self.part.history),
            permit: self.part.permit.take(),
        };
        self.store.parked.put(std::mem::take(&mut self.id), part.st.encode(), part);
    }
}

#[async_trait]
impl BlobWriter for S3Writer {
    async fn write(&mut self, data: Bytes) -> BlobResult<()> {
        self.usable()?;
        self.cover(self.part.buf.len() as u64 + data.len() as u64).await?;
        if self.streaming.is_none() {
            self.start_streaming().await?;
        }
        self.feed(&data).await;
        self.part.buf.extend_from_slice(&data);
        self.upload_full_parts().await
    }

    async fn sync(&mut self) -> BlobResult<BlobState> {
        if self.completed_len.is_some() || self.completed {
            return Ok(self.part.st.encode());
        }
        if self.broken {
            return Err(BlobError::Cut);
        }
        self.lease.check()?;
        self.settle(0).await?;
        let s = self.store.clone();
        let synced = self.part.st.offset();
        let pos = self.position();
        if pos > synced {
            let seg = Segment { part: self.part.st.parts.len() as u64, start: synced, end: pos, fence: Some(self.lease.fence) };
            let from = (synced - self.parts_end()) as usize;
            let key = s.segment(&self.id, &seg);
            // The tail PUT sends the open part's new bytes themselves, not a copy: a copy is
            // memory outside the budget, and 200 uploads syncing at once held 200 such copies.
            let lent = Lent::new(&mut self.part.buf);
            let data = lent.whole().slice(from..);
            let put = self
                .lease
                .run(async { bounded(deadline_for(data.len() as u64), s.s3.put(&key, PutPayload::from(data))).await.map(drop).map_err(io) })
                .await;
            drop(lent);
            self.guard(put)?;
            self.part.st.tail.push((seg.fence, pos));
            self.part.known.push(seg);
        }
        self.noted = self.part.st.numbering.map_or(0, |n| n.next);
        self.part.history.push(self.part.st.segments());
        if self.part.history.len() > 3 {
            let old = self.part.history.remove(0);
            for seg in old {
                if !self.part.history.iter().any(|h| h.contains(&seg)) {
                    let key = s.segment(&self.id, &seg);
                    let deleted = self.lease.run(s.delete_quiet(&key)).await;
                    self.guard(deleted)?;
                    self.part.known.retain(|k| *k != seg);
                }
            }
        }
        Ok(self.part.st.encode())
    }

    async fn rewind(&mut self, len: u64) -> BlobResult<()> {
        if let Some(done) = self.completed_len {
            if len == done {
                return Ok(());
            }
            return Err(BlobError::Io(std::io::Error::other("a completed blob cannot be rewound; create it again")));
        }
        if self.broken {
            return Err(BlobError::Cut);
        }
        if len > self.position() {
            return Err(BlobError::OutOfRange { start: len, end: len, len: self.position() });
        }
        // A part that failed on its way is back in the open part (`settle`), so the rewind goes
        // on from there: it is how the engine releases what a failed PATCH wrote. Only a writer
        // cut or fenced stops here.
        if let Err(e) = self.settle(0).await {
            if self.broken {
                return Err(e);
            }
            tracing::debug!(upload = %self.id, error = %e, "a part on its way to S3 failed; rewinding over its bytes");
        }
        // What the open part's stream sent may be past `len`; the part is sent again later.
        self.stop_streaming();
        // Segments reaching past `len` hold bytes that are no longer the blob's.
        self.part.known.retain(|k| k.end <= len);
        let parts_end = self.parts_end();
        if len >= parts_end {
            self.part.buf.truncate((len - parts_end) as usize);
            self.part.st.tail.retain(|&(_, e)| e <= len);
            return Ok(());
        }
        // Back into a part already sent: rebuild its bytes before `len` from tail segments of
        // that part (the committed state's are kept), and send it again later.
        let schedule = self.part.st.schedule;
        let idx = schedule.part_of(len);
        let start = schedule.start(idx);
        let mut chain = Vec::new();
        let mut cur = start;
        while cur < len {
            let Some(&next) = self.part.known.iter().filter(|k| k.part == idx && k.start == cur).max_by_key(|k| k.end) else {
                return Err(BlobError::Io(std::io::Error::other(format!(
                    "cannot rewind to {len}: those bytes were sent as part {idx} and no tail holds them"
                ))));
            };
            chain.push(next);
            cur = next.end;
        }
        let mut buf = BytesMut::new();
        self.cover(chain.iter().map(Segment::len).sum()).await?;
        self.store.read_segments(&self.id, &chain, &mut buf).await?;
        self.part.st.parts.truncate(idx as usize);
        self.part.st.tail = chain.iter().map(|c| (c.fence, c.end)).collect();
        self.part.buf = buf;
        Ok(())
    }

    async fn complete(&mut self) -> BlobResult<Option<BlobState>> {
        if !(self.completed || self.completed_len.is_some()) {
            if self.broken {
                return Err(BlobError::Cut);
            }
            self.assemble().await?;
            self.completed = true;
            self.part.permit = None;
        }
        // What only an unfinished blob needs goes before the catalog calls it finished, so a
        // finished upload never keeps leftovers (a crash here: the next finish repeats this).
        let s = self.store.clone();
        let cleaned = self.lease.run(s.finished_cleanup(&self.id)).await;
        self.guard(cleaned)?;
        // The completed object is all a reader needs: no part list in the finished row.
        Ok(Some(BlobState::default()))
    }

    fn amend(&mut self, state: &BlobState) -> Option<BlobState> {
        let mine = self.part.st.numbering?;
        // Whatever the caller commits next records every number taken so far (or needs not).
        self.noted = mine.next;
        let mut st = S3State::decode(state).ok()??;
        // Numbers count within one multipart upload: parts of one this writer created (the
        // committed state has none yet) are never completed, and the next writer makes its own.
        if st.multipart.is_none() || st.multipart != self.part.st.multipart {
            return None;
        }
        let n = st.numbering.as_mut()?;
        if mine.next <= n.next && mine.generation <= n.generation {
            return None;
        }
        n.next = n.next.max(mine.next);
        n.generation = n.generation.max(mine.generation);
        Some(st.encode())
    }

    fn wants_numbers_noted(&self) -> bool {
        self.part.st.numbering.is_some_and(|n| n.next >= self.noted.saturating_add(UNNOTED_NUMBERS))
    }

    fn position(&self) -> u64 {
        self.completed_len.unwrap_or_else(|| self.part.st.schedule.start(self.filling()) + self.part.buf.len() as u64)
    }

    fn expecting(&mut self, end: u64) {
        self.expected = end;
    }
}
