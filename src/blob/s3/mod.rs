//! Upload bytes in S3-compatible object storage (DESIGN §2 "S3 mapping"), on `object_store`'s
//! low-level [`MultipartStore`].
//!
//! One TUS upload = one S3 multipart upload, created lazily when the first part fills (an upload
//! smaller than one part never makes one: completing it PUTs it whole). Every part but the last
//! has one size, fixed when the upload's first writer opens it ([`state`]). Objects, under the
//! prefix:
//!
//! - `<id>.created` — empty; the blob exists and is unfinished ([`BlobStore::create`]).
//! - `<id>.mpu/<hex multipart id>` — empty; one per multipart upload ever created for the blob,
//!   so [`BlobStore::abort`] (which gets no state) aborts every one, orphans of crashed or
//!   superseded writers included. Never ListParts for resume state.
//! - `<id>.tail/<part>-<start>-<end>.<fence>` — bytes `start..end` of part `part` that did not
//!   fill it when a checkpoint came, written by the writer holding fence `fence`: readable by
//!   any replica that takes the upload over ([`writer`]).
//! - `<id>` — the finished object; downloads are ranged GETs on it.
//!
//! The blob state holds the schedule, the multipart id, each uploaded part's
//! `PartId.content_id` (verbatim) and the tail segments; the fenced checkpoint commits it, so
//! whoever holds the lease next resumes without listing anything.
//!
//! **Complete, then commit.** [`BlobWriter::complete`] completes the multipart upload and
//! removes the `.created` marker, the markers and the tail *before* the engine commits the
//! upload finished; a completion S3 refuses for good ([`BlobError::Lost`]) rolls the upload back
//! instead. A multipart upload that vanished (`NoSuchUpload`, a lifecycle rule) is
//! [`BlobError::Lost`] too.
//!
//! Unfinished blobs cannot be read: S3 serves no bytes of a multipart upload before it is
//! completed, and the engine reads only finished uploads (downloads, concatenation sources).
//! [`BlobStore::read`] of an unfinished blob behaves as an empty one, [`BlobStore::len`] says
//! `Some(0)`, and [`BlobStore::truncate`] below the finished length is unsupported (the
//! catalog's offset + blob state are the truth; no relaxed-durability roll-back exists on S3).

mod budget;
mod client;
mod compose;
mod errors;
mod requests;
pub mod state;
mod writer;

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::BytesMut;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::HttpConnector;
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use object_store::{ClientConfigKey, ClientOptions};
use object_store::{GetOptions, GetRange, MultipartId, ObjectStore, ObjectStoreExt, PutPayload};

use budget::Budget;
pub use budget::{BudgetStats, BUDGET_UNIT, BUDGET_WAIT};
use client::{Inner, Listing};
use errors::{bounded, deadline_for, io, is_gone, is_not_found, own_retries, own_retries_count, Failure};
pub use errors::{retry_config, REQUEST_DEADLINE};
pub use requests::{RequestObserver, RequestSeen};
use state::S3State;
pub use state::{fixed_part_size, DEFAULT_PART_FLOOR, MAX_PART, MAX_PARTS, MIN_PART};
use writer::{Parked, S3Writer};

use super::{BlobError, BlobResult, BlobState, BlobStore, BlobWriter, ByteStream, Unreferenced, WriteLease};

/// The default store-wide bound on buffered part bytes (`[s3] max_buffer`): 512 MiB.
pub const DEFAULT_MAX_BUFFER: u64 = 512 << 20;

/// The default part size of an upload whose length is deferred (`[s3] deferred_part_size`):
/// 64 MiB, so such an upload may reach ≈ 312 GiB in [`PART_SLOTS`] parts (≈ 625 GiB in S3's
/// 10 000 when no part is sent twice), while one slow client holds at most 64 MiB of the
/// memory budget. It used to be sized for the largest upload the server accepts (1 TiB: 210
/// MiB parts).
pub const DEFAULT_DEFERRED_PART: u64 = 64 << 20;

/// The default number of one upload's full parts sent at once (`[s3] parts_in_flight`).
pub const DEFAULT_PARTS_IN_FLIGHT: usize = 2;

/// The S3 store's settings (`[s3]` in ferry.toml, `--s3-*` flags), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct S3Settings {
    /// The smallest part size ([`fixed_part_size`]'s floor): 5 MiB..=5 GiB.
    pub part_size: u64,
    /// The part size of an upload whose length is not known when its first part is cut (a
    /// deferred length): 5 MiB..=5 GiB, at least `part_size` (the larger wins). It bounds
    /// such an upload to 10 000 parts of it ([`BlobError::TooManyParts`]).
    pub deferred_part_size: u64,
    /// Most bytes of open parts buffered at once, across all uploads.
    pub max_buffer: u64,
    /// Full parts of one upload on their way to S3 at once while the next one is received
    /// (1..=16): receiving and sending overlap.
    pub parts_in_flight: usize,
}

impl Default for S3Settings {
    fn default() -> Self {
        S3Settings {
            part_size: DEFAULT_PART_FLOOR,
            deferred_part_size: DEFAULT_DEFERRED_PART,
            max_buffer: DEFAULT_MAX_BUFFER,
            parts_in_flight: DEFAULT_PARTS_IN_FLIGHT,
        }
    }
}

/// The readiness probe's object, under the prefix: written and deleted by [`BlobStore::ping`]
/// at most once per [`WRITE_PROBE_EVERY`]; probes in between read (HEAD the store's mark).
pub const PROBE_KEY: &str = ".ferry-probe";

/// How often [`BlobStore::ping`] writes and deletes [`PROBE_KEY`] to show the store takes
/// writes: every 10 s at most (every probe in between is one HEAD request), so a bucket that
/// stops taking writes shows in `/readyz` within about 10 s.
pub const WRITE_PROBE_EVERY: Duration = Duration::from_secs(10);

/// How often, and how long apart, [`BlobStore::finish`] looks for an object another finisher
/// is completing (its multipart upload gone, the object not shown yet): 3 s in all.
const COMPLETION_POLLS: u32 = 15;
const COMPLETION_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// [`BlobStore`] over an S3 bucket (or any S3-compatible store).
#[derive(Clone)]
pub struct S3BlobStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for S3BlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3BlobStore").field("prefix", &self.inner.prefix).field("floor", &self.inner.floor).finish()
    }
}

impl S3BlobStore {
    /// Open `s3://bucket/prefix` with the `AWS_*` environment (`AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL` for S3-compatible stores,
    /// `AWS_ALLOW_HTTP=true` for a plain-http endpoint; `AmazonS3Builder::from_env`).
    /// `part_floor` is the smallest part size in bytes ([`fixed_part_size`];
    /// [`DEFAULT_PART_FLOOR`] by default; below [`MIN_PART`] only against a test store that
    /// allows it); open parts buffer at most [`DEFAULT_MAX_BUFFER`] bytes store-wide
    /// ([`S3BlobStore::with_max_buffer`]). Errors: a URL that is not `s3://bucket[/prefix]`, a
    /// floor of 0 or above 5 GiB, or a configuration object_store refuses. Does not touch the
    /// network; [`BlobStore::ping`] does.
    pub fn from_url(url: &str, part_floor: u64) -> anyhow::Result<S3BlobStore> {
        let rest = url.strip_prefix("s3://").ok_or_else(|| anyhow::anyhow!("blob store URL {url:?} does not start with s3://"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        anyhow::ensure!(!bucket.is_empty(), "blob store URL {url:?} names no bucket");
        anyhow::ensure!((1..=MAX_PART).contains(&part_floor), "the S3 part size must be at most 5 GiB (S3's limit), not {part_floor} bytes");
        let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Ok(ep) = std::env::var("AWS_ENDPOINT_URL") {
            // S3-compatible stores are addressed by path (bucket in the path), as MinIO and moto expect.
            b = b.with_endpoint(ep).with_virtual_hosted_style_request(false);
        }
        let region = b.get_config_value(&AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".to_string());
        let endpoint = b.get_config_value(&AmazonS3ConfigKey::Endpoint).unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        let allow_http = b.get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp)).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        // object_store would only say "builder error" at the first request.
        anyhow::ensure!(
            allow_http || !endpoint.to_ascii_lowercase().starts_with("http://"),
            "the S3 endpoint {endpoint} is plain http: set AWS_ALLOW_HTTP=true to use it (only on a network you trust), or give an https:// endpoint"
        );
        let requests = requests::Requests::default();
        b = b.with_http_connector(requests::MeteredConnector(requests.clone()));
        let listing_http = requests::MeteredConnector(requests.clone())
            .connect(&ClientOptions::new().with_allow_http(allow_http))
            .map_err(|e| anyhow::anyhow!("configuring S3 for {url}: {e}"))?;
        let listing = Listing { bucket_url: format!("{}/{bucket}", endpoint.trim_end_matches('/')), region, http: listing_http };
        // Bodies go unsigned (and parts may be streamed, which needs it) where nothing on the
        // way can change them — TLS or loopback — unless `AWS_UNSIGNED_PAYLOAD` says otherwise:
        // object_store then need not hash every body into its signature (a sha256 of every
        // byte sent, ≈ 0.7 s of CPU per GiB).
        let unsigned = std::env::var("AWS_UNSIGNED_PAYLOAD").ok().map(|v| v.trim().eq_ignore_ascii_case("true"));
        let stream_parts = unsigned.unwrap_or_else(|| client::may_stream_parts(&endpoint));
        if unsigned.is_none() && stream_parts {
            b = b.with_unsigned_payload(true);
        }
        let s3 = b.with_retry(retry_config()).build().map_err(|e| anyhow::anyhow!("configuring S3 for {url}: {e}"))?;
        let http =
            reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).build().map_err(|e| anyhow::anyhow!("HTTP client for {url}: {e}"))?;
        let inner = Inner {
            s3,
            http,
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            floor: part_floor,
            requests,
            deferred_part: DEFAULT_DEFERRED_PART.max(part_floor),
            listing,
            budget: Budget::new(DEFAULT_MAX_BUFFER),
            parts_in_flight: DEFAULT_PARTS_IN_FLIGHT,
            stream_parts,
            parked: Parked::default(),
            cannot_copy: std::sync::atomic::AtomicBool::new(false),
            write_probed: std::sync::Mutex::new(None),
        };
        Ok(S3BlobStore { inner: Arc::new(inner) })
    }

    /// The same store sending up to `n` (at least 1) full parts of one upload at once
    /// (`[s3] parts_in_flight`). Only before the store is shared.
    pub fn with_parts_in_flight(mut self, n: usize) -> S3BlobStore {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.parts_in_flight = n.max(1);
        }
        self
    }

    /// The same store telling `observer` of every request it makes to S3, once answered
    /// ([`RequestSeen`]: the S3 operation, the status class, the seconds). The first observer
    /// installed stays.
    pub fn with_request_observer(self, observer: RequestObserver) -> S3BlobStore {
        self.inner.requests.observe_with(observer);
        self
    }

    /// The same store cutting uploads of unknown length into parts of `bytes` (`[s3]
    /// deferred_part_size`; never below the floor). Only before the store is shared.
    pub fn with_deferred_part_size(mut self, bytes: u64) -> S3BlobStore {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.deferred_part = bytes.clamp(1, MAX_PART).max(inner.floor);
        }
        self
    }

    /// The same store with open parts bounded to `bytes` store-wide (`[s3] max_buffer`; at
    /// least one part is always allowed). Only before the store is shared.
    pub fn with_max_buffer(mut self, bytes: u64) -> S3BlobStore {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.budget = Budget::new(bytes);
        }
        self
    }

    /// Bytes of open parts buffered now, parked ones included (at most `[s3] max_buffer`, plus
    /// one receive frame per writer).
    pub fn buffered(&self) -> u64 {
        self.inner.budget.in_use()
    }

    /// The memory budget's use, waiters and waits ([`BudgetStats`]).
    pub fn budget_stats(&self) -> BudgetStats {
        self.inner.budget.stats()
    }

    /// Reopen a finished blob at `offset` (a job re-running after a crash between finishing
    /// its file and checkpointing that): its multipart upload is completed, so the first
    /// `offset` bytes are copied from the object into a new one (a GET streamed into parts).
    async fn reopen_finished(&self, id: &str, offset: u64, state: &BlobState, lease: &WriteLease) -> BlobResult<Box<dyn BlobWriter>> {
        let s = &self.inner;
        let decoded = S3State::decode(state)?;
        let len = s.exists(&s.object(id)).await?.ok_or(BlobError::NotFound)?;
        if len < offset {
            return Err(BlobError::OutOfRange { start: offset, end: offset, len });
        }
        if len == offset && decoded.as_ref().is_none_or(|st| st.offset() == offset) {
            // Completed already, at exactly the committed offset (a finish that stopped before
            // its commit): nothing to copy; completing again only cleans up.
            let st = decoded.unwrap_or_else(|| S3State::fixed(fixed_part_size(len, s.floor)));
            let mut w = S3Writer::new(s.clone(), id, st, BytesMut::new(), Vec::new(), lease);
            w.completed_len = Some(len);
            return Ok(Box::new(w));
        }
        lease.run(async { bounded(REQUEST_DEADLINE, s.s3.put(&s.created(id), PutPayload::new())).await.map_err(io) }).await?;
        let fresh = S3State::fixed(s.part_size_for(lease.size_hint).max(fixed_part_size(offset, s.floor)));
        let mut w = S3Writer::new(s.clone(), id, fresh, BytesMut::new(), Vec::new(), lease);
        if offset > 0 {
            let mut stream = self.read(id, 0..offset).await?;
            while let Some(chunk) = stream.try_next().await.map_err(BlobError::from_stream)? {
                w.write(chunk).await?;
            }
        }
        Ok(Box::new(w))
    }

    /// Complete the multipart upload of `id` from committed state `st` (its tail becomes the
    /// last part), or PUT the tail whole when no part was ever uploaded. For states committed
    /// finished before round 3 (their object may not be whole yet) and concatenation sources.
    async fn assemble(&self, id: &str, st: &S3State) -> BlobResult<()> {
        let s = &self.inner;
        let segs = st.segments();
        let _room = s.budget.reserve(segs.iter().map(|g| g.len()).sum(), &s.parked).await?;
        let mut tail = BytesMut::new();
        s.read_segments(id, &segs, &mut tail).await?;
        match &st.multipart {
            None => bounded(deadline_for(tail.len() as u64), s.s3.put(&s.object(id), PutPayload::from(tail.freeze()))).await.map(drop).map_err(io),
            Some(mp) => {
                let mpid = MultipartId::from(mp.clone());
                let mut parts = st.parts.clone();
                if !tail.is_empty() {
                    // The tail becomes the last part (S3 allows the last one to be short), under
                    // a number no writer used (versions 3–4: fence parity 0 after one of 1).
                    let idx = st.parts.len() as u64;
                    let after = st.parts.last().map_or(0, |p| p.0);
                    let number = match st.numbering {
                        Some(mut n) => n.take(idx, idx + 1, after).ok_or(BlobError::BadState)?.0,
                        None => state::part_number(st.schedule, idx, u64::from(after) + 1),
                    };
                    let deadline = deadline_for(tail.len() as u64);
                    let pid = bounded(deadline, s.s3.put_part(&s.object(id), &mpid, number as usize - 1, PutPayload::from(tail.freeze())))
                        .await
                        .map_err(io)?;
                    parts.push((number, pid.content_id));
                }
                match s.complete_numbered(&s.object(id), mp, &parts, Some(st.offset())).await {
                    // Gone: the caller checks whether it was completed already.
                    Err(BlobError::Lost { .. }) => Err(BlobError::NotFound),
                    r => r,
                }
            }
        }
    }
}

#[async_trait]
impl BlobStore for S3BlobStore {
    async fn inventory(&self) -> BlobResult<super::Inventory> {
        let s = &self.inner;
        let root = (!s.prefix.is_empty()).then(|| Path::from(s.prefix.as_str()));
        let keys: Vec<Path> = s.s3.list(root.as_ref()).map_ok(|m| m.location).try_collect().await.map_err(io)?;
        let mut blobs: Vec<String> = keys.iter().filter_map(|k| s.id_of(k.as_ref())).collect();
        blobs.sort();
        blobs.dedup();
        // Every key of an id but its object is what only an unfinished blob keeps.
        let mut unfinished: Vec<String> = keys.iter().filter_map(|k| s.id_of(k.as_ref()).filter(|id| *k != s.object(id))).collect();
        unfinished.sort();
        unfinished.dedup();
        let under = if s.prefix.is_empty() { String::new() } else { format!("{}/", s.prefix) };
        let multiparts = s.multiparts_under(&under).await.map_err(BlobError::Unavailable)?;
        let multiparts = multiparts.into_iter().filter_map(|(k, u)| Some((s.id_of(&k)?, u))).collect();
        Ok(super::Inventory { blobs, multiparts, unfinished })
    }

    async fn create(&self, id: &str) -> BlobResult<()> {
        let s = &self.inner;
        // A new id: nothing to remove first (one request per new upload).
        bounded(REQUEST_DEADLINE, s.s3.put(&s.created(id), PutPayload::new())).await.map_err(io)?;
        Ok(())
    }

    async fn reset(&self, id: &str, lease: &WriteLease) -> BlobResult<()> {
        let s = &self.inner;
        s.parked.forget(id);
        // The object `<id>` stays: an unfinished upload has none, and a finished one (another
        // holder finished it after this one's lease ran out) must keep it.
        // The tail stays too: the committed state still names it until the caller's roll-back
        // commits (a commit that fails leaves a state the next holder must be able to open);
        // the finish's clean-up, or an abort, removes it later.
        lease
            .run(async {
                s.abort_multiparts(id, None).await?;
                bounded(REQUEST_DEADLINE, s.s3.put(&s.created(id), PutPayload::new())).await.map_err(io)?;
                Ok(())
            })
            .await
    }

    async fn open_writer_under(&self, id: &str, offset: u64, state: &BlobState, lease: &WriteLease) -> BlobResult<Box<dyn BlobWriter>> {
        let s = &self.inner;
        if let Some(part) = s.parked.take(id, state) {
            // This process wrote the committed state and kept its open part: no request at all.
            if part.st.offset() == offset {
                return Ok(Box::new(S3Writer::with_part(s.clone(), id, part, lease)));
            }
        }
        if s.exists(&s.created(id)).await?.is_none() {
            return self.reopen_finished(id, offset, state, lease).await;
        }
        let st = match S3State::decode(state)? {
            None if offset == 0 => S3State::fixed(s.part_size_for(lease.size_hint)),
            None => return Err(BlobError::BadState),
            Some(st) if st.offset() == offset => st,
            Some(_) => return Err(BlobError::BadState),
        };
        let segs = st.segments();
        // The tail comes back into memory: room for it first, within the store's budget.
        let tail_len: u64 = segs.iter().map(|g| g.len()).sum();
        let mut permit = None;
        if tail_len > 0 {
            lease.run(s.budget.cover(&mut permit, tail_len, &s.parked)).await?;
        }
        // The whole part's capacity at once (pages the tail does not fill are not touched, so
        // they cost no memory until bytes arrive): the part then fills without reallocating.
        let mut buf = BytesMut::with_capacity(st.open_part_size().min(64 << 20).max(tail_len) as usize);
        if let Err(e) = s.read_segments(id, &segs, &mut buf).await {
            // A tail the committed state names is gone: a finish that completed the object
            // and was cut off in its clean-up (the upload is still unfinished in the catalog,
            // at its full offset)? Then this writer only finishes the clean-up.
            let gone = is_gone(&e);
            if gone && s.exists(&s.object(id)).await? == Some(offset) {
                let mut w = S3Writer::new(s.clone(), id, st, BytesMut::new(), Vec::new(), lease);
                w.completed_len = Some(offset);
                return Ok(Box::new(w));
            }
            return Err(e);
        }
        // Segments the committed state does not name are a crashed or superseded writer's (named
        // by its fence, so never this writer's): gone now, or with the finish's clean-up for an
        // upload that committed nothing yet (a new upload's first PATCH lists nothing).
        if !state.as_bytes().is_empty() {
            let keep: HashSet<Path> = segs.iter().map(|g| s.segment(id, g)).collect();
            lease.run(s.delete_segments(id, &keep)).await?;
        }
        let mut w = S3Writer::new(s.clone(), id, st, buf, segs, lease);
        w.part.permit = permit;
        Ok(Box::new(w))
    }

    async fn finish(&self, id: &str, state: &BlobState) -> BlobResult<()> {
        let s = &self.inner;
        let st = S3State::decode(state)?.unwrap_or(S3State::fixed(s.floor));
        let len = st.offset();
        if s.exists(&s.created(id)).await?.is_none() {
            // Finished already (idempotent) or never created.
            return match s.exists(&s.object(id)).await? {
                Some(_) => Ok(()),
                None => Err(BlobError::NotFound),
            };
        }
        if let Err(e) = self.assemble(id, &st).await {
            // The multipart upload or a tail segment gone: assembled already, by a finisher
            // that stopped before cleaning up or by another replica finishing the same
            // committed state at the same moment (whose clean-up removed what this one was
            // reading)? Then only the clean-up is left. Any other failure stands.
            let gone = is_gone(&e);
            if !gone {
                return Err(e);
            }
            // Another finisher's CompleteMultipartUpload may still be under way: the multipart
            // upload is gone before the object shows (seen on Garage). Give it a moment.
            let mut whole = s.exists(&s.object(id)).await? == Some(len);
            for _ in 0..COMPLETION_POLLS {
                if whole {
                    break;
                }
                tokio::time::sleep(COMPLETION_POLL).await;
                whole = s.exists(&s.object(id)).await? == Some(len);
            }
            if !whole {
                return Err(e);
            }
        }
        s.finished_cleanup(id).await
    }

    async fn compose(&self, id: &str, sources: &[(String, u64)], lease: &WriteLease) -> BlobResult<bool> {
        let s = &self.inner;
        if s.cannot_copy.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(false);
        }
        let lens: Vec<u64> = sources.iter().map(|s| s.1).collect();
        let Some(plan) = compose::plan_for(&lens, s.floor) else { return Ok(false) };
        match s.compose(id, sources, &plan, lease).await {
            Ok(()) => Ok(true),
            // The store does not copy parts (501 NotImplemented, or a refusal for good): the
            // caller streams the sources through a writer, now and from now on.
            Err(compose::ComposeError::CannotCopy { what, unimplemented }) => {
                if unimplemented {
                    tracing::warn!(
                        refused = %what,
                        "the S3 store does not implement UploadPartCopy: concatenations stream their parts through this server from now on"
                    );
                    s.cannot_copy.store(true, std::sync::atomic::Ordering::Relaxed);
                } else {
                    tracing::warn!(
                        refused = %what,
                        "the S3 store refused an UploadPartCopy: this concatenation streams its parts through this server"
                    );
                }
                Ok(false)
            }
            Err(compose::ComposeError::Blob(e)) => Err(e),
        }
    }

    fn memory(&self) -> Option<BudgetStats> {
        Some(self.inner.budget.stats())
    }

    async fn ping(&self) -> BlobResult<()> {
        let s = &self.inner;
        let wrote_lately = s.write_probed.lock().unwrap_or_else(|p| p.into_inner()).is_some_and(|at| at.elapsed() < WRITE_PROBE_EVERY);
        if wrote_lately {
            // A read answers whether the store is there (the mark: 200 or 404 alike).
            return s.exists(&s.key(super::STORE_MARK)).await.map(drop);
        }
        // One fixed key for every replica and every probe: a probe cut short (S3 froze, the
        // readiness check gave up) leaves at most this one small object, never one per probe.
        let probe = s.key(PROBE_KEY);
        bounded(REQUEST_DEADLINE, s.s3.put(&probe, PutPayload::from_static(b"ferry"))).await.map_err(io)?;
        s.delete_quiet(&probe).await?;
        *s.write_probed.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
        Ok(())
    }

    async fn mark(&self) -> BlobResult<Option<String>> {
        let s = &self.inner;
        match bounded(REQUEST_DEADLINE, async { s.s3.get(&s.key(super::STORE_MARK)).await?.bytes().await }).await {
            Ok(b) => Ok(Some(String::from_utf8_lossy(&b).trim().to_string())),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(io(e)),
        }
    }

    async fn set_mark(&self, mark: &str) -> BlobResult<()> {
        let s = &self.inner;
        bounded(REQUEST_DEADLINE, s.s3.put(&s.key(super::STORE_MARK), PutPayload::from(format!("{mark}\n").into_bytes()))).await.map_err(io)?;
        Ok(())
    }

    async fn len(&self, id: &str) -> BlobResult<Option<u64>> {
        let s = &self.inner;
        if let Some(n) = s.exists(&s.object(id)).await? {
            return Ok(Some(n));
        }
        Ok(s.exists(&s.created(id)).await?.map(|_| 0))
    }

    async fn truncate(&self, id: &str, len: u64, lease: &WriteLease) -> BlobResult<()> {
        match lease.run(self.len(id)).await? {
            Some(n) if n <= len => Ok(()),
            Some(_) => Err(BlobError::Io(std::io::Error::new(std::io::ErrorKind::Unsupported, "S3 objects cannot be truncated"))),
            None => Err(BlobError::NotFound),
        }
    }

    async fn read(&self, id: &str, range: Range<u64>) -> BlobResult<ByteStream> {
        let s = &self.inner;
        let Some(len) = self.len(id).await? else { return Err(BlobError::NotFound) };
        if range.start > range.end || range.end > len {
            return Err(BlobError::OutOfRange { start: range.start, end: range.end, len });
        }
        if range.start == range.end {
            return Ok(Box::pin(futures::stream::empty()));
        }
        let opts = GetOptions { range: Some(GetRange::Bounded(range)), ..Default::default() };
        let got = s.s3.get_opts(&s.object(id), opts).await.map_err(io)?;
        // A failure mid-body (S3 cut off) ends the stream with the classified error, so the
        // reader knows the bytes stopped short and why.
        Ok(Box::pin(got.into_stream().map(|r| r.map_err(|e| io(e).into_stream_error()))))
    }

    async fn delete(&self, gone: &Unreferenced) -> BlobResult<()> {
        self.inner.remove_all(gone.id()).await
    }
}
