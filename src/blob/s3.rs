//! Upload bytes in S3-compatible object storage (DESIGN §2 "S3 mapping"), on `object_store`'s
//! low-level [`MultipartStore`].
//!
//! One TUS upload = one S3 multipart upload, created lazily when the first part fills (an upload
//! smaller than one part never makes one: `finish` PUTs it whole). Objects, under the prefix:
//!
//! - `<id>.created` — empty; the blob exists and is unfinished ([`BlobStore::create`]).
//! - `<id>.mpu/<hex multipart id>` — empty; one per multipart upload ever created for the blob,
//!   so [`BlobStore::abort`] (which gets no state) aborts every one, orphans of crashed or
//!   superseded writers included. Never ListParts / ListMultipartUploads.
//! - `<id>.tail/<part>-<start>-<end>` — bytes `start..end` of part `part` that did not fill it
//!   when a sync came: a segment written by that sync only (each sync uploads just its new
//!   bytes), readable by any replica, folded into the part when it fills.
//! - `<id>` — the finished object ([`BlobStore::finish`]); downloads are ranged GETs on it.
//!
//! The blob state (version 2) holds the multipart id, the schedule base, each uploaded part's
//! size and `PartId.content_id` (verbatim), and the tail segments' end offsets; the fenced
//! checkpoint commits it, so whoever holds the lease next resumes without listing anything.
//!
//! Part boundaries are a pure function of the offset ([`part_size`]): two writers of one upload
//! (a paused replica that lost its lease and the one that took over) can only write the same
//! bytes to the same part number and tail key, and a part whose content differs from the one
//! the state recorded fails `CompleteMultipartUpload` (ETag mismatch) instead of corrupting.
//!
//! Unfinished blobs cannot be read: S3 serves no bytes of a multipart upload before it is
//! completed, and the engine reads only finished uploads (downloads, concatenation sources).
//! [`BlobStore::read`] of an unfinished blob behaves as an empty one, [`BlobStore::len`] says
//! `Some(0)`, and [`BlobStore::truncate`] below the finished length is unsupported (the
//! catalog's offset + blob state are the truth; no relaxed-durability roll-back exists on S3).

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::{HttpConnector, ReqwestConnector};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{ClientConfigKey, ClientOptions};
use object_store::{GetOptions, GetRange, MultipartId, ObjectStore, ObjectStoreExt, PutPayload};

use super::{BlobError, BlobResult, BlobState, BlobStore, BlobWriter, ByteStream};

/// S3's smallest part but the last: 5 MiB.
pub const MIN_PART: u64 = 5 * 1024 * 1024;
/// S3's largest part number.
pub const MAX_PARTS: u64 = 10_000;
/// Parts of one size before the size doubles.
const PARTS_PER_STEP: u64 = 1_000;

/// Size in bytes of part `idx` (0-based) for schedule base `base`: `base * 2^(idx / 1000)`.
///
/// With the default base of 5 MiB: parts 0–999 are 5 MiB, 1000–1999 10 MiB, … 9000–9999
/// 2.5 GiB (S3's largest part is 5 GiB). 10 000 parts then hold `1000 * base * 1023` bytes
/// ≈ 4.88 TiB (S3's largest object is 5 TiB); 1 TiB needs 7 647 parts, the largest 640 MiB.
/// A writer holds at most one part in memory.
pub fn part_size(base: u64, idx: u64) -> u64 {
    base << (idx / PARTS_PER_STEP).min(20)
}

/// Where part `idx` starts, in bytes.
pub fn part_start(base: u64, idx: u64) -> u64 {
    let step = idx / PARTS_PER_STEP;
    // Full steps: 1000 * base * (2^step - 1); then the parts of this step.
    PARTS_PER_STEP * base * ((1u64 << step) - 1) + (idx % PARTS_PER_STEP) * part_size(base, idx)
}

/// Largest upload the schedule fits in [`MAX_PARTS`] parts (the last part may be short).
pub fn max_upload(base: u64) -> u64 {
    part_start(base, MAX_PARTS)
}

fn io(e: object_store::Error) -> BlobError {
    match e {
        object_store::Error::NotFound { .. } => BlobError::NotFound,
        e => BlobError::Io(std::io::Error::other(e.to_string())),
    }
}

fn is_not_found(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. })
}

/// The S3 store's blob state (version 2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct S3State {
    base: u64,
    multipart: Option<String>,
    /// Uploaded parts in order: (size, content id).
    parts: Vec<(u64, String)>,
    /// End offsets of the tail segments (the first starts where the parts end).
    tail: Vec<u64>,
}

impl S3State {
    fn parts_end(&self) -> u64 {
        self.parts.iter().map(|p| p.0).sum()
    }
    fn offset(&self) -> u64 {
        self.tail.last().copied().unwrap_or_else(|| self.parts_end())
    }
    /// (part, start, end) of each tail segment.
    fn segments(&self) -> Vec<(u64, u64, u64)> {
        let mut start = self.parts_end();
        let idx = self.parts.len() as u64;
        self.tail
            .iter()
            .map(|&end| {
                let s = (idx, start, end);
                start = end;
                s
            })
            .collect()
    }

    fn encode(&self) -> BlobState {
        let mut v = vec![2u8];
        v.extend_from_slice(&self.base.to_le_bytes());
        let mp = self.multipart.as_deref().unwrap_or("");
        v.extend_from_slice(&(mp.len() as u32).to_le_bytes());
        v.extend_from_slice(mp.as_bytes());
        v.extend_from_slice(&(self.parts.len() as u32).to_le_bytes());
        for (size, cid) in &self.parts {
            v.extend_from_slice(&size.to_le_bytes());
            v.extend_from_slice(&(cid.len() as u32).to_le_bytes());
            v.extend_from_slice(cid.as_bytes());
        }
        v.extend_from_slice(&(self.tail.len() as u32).to_le_bytes());
        for end in &self.tail {
            v.extend_from_slice(&end.to_le_bytes());
        }
        BlobState(v)
    }

    /// Decode and check a state: `None` for the empty state, `BadState` for anything this
    /// store did not write or that breaks the schedule.
    fn decode(state: &BlobState) -> BlobResult<Option<S3State>> {
        let b = state.as_bytes();
        if b.is_empty() {
            return Ok(None);
        }
        let mut r = Reader(b);
        if r.take(1)? != [2] {
            return Err(BlobError::BadState);
        }
        let base = r.u64()?;
        let mp = r.string()?;
        let n = r.u32()?;
        let mut parts = Vec::with_capacity(n.min(MAX_PARTS as u32) as usize);
        for i in 0..n as u64 {
            let size = r.u64()?;
            if i >= MAX_PARTS || size != part_size(base, i) {
                return Err(BlobError::BadState);
            }
            parts.push((size, r.string()?));
        }
        let nt = r.u32()?;
        let mut tail = Vec::new();
        for _ in 0..nt {
            tail.push(r.u64()?);
        }
        if !r.0.is_empty() || base == 0 || (mp.is_empty() && !parts.is_empty()) {
            return Err(BlobError::BadState);
        }
        let s = S3State { base, multipart: (!mp.is_empty()).then_some(mp), parts, tail };
        let next_size = part_size(base, s.parts.len() as u64);
        let mut prev = s.parts_end();
        for &end in &s.tail {
            if end <= prev || end - s.parts_end() >= next_size {
                return Err(BlobError::BadState);
            }
            prev = end;
        }
        Ok(Some(s))
    }
}

struct Reader<'a>(&'a [u8]);
impl Reader<'_> {
    fn take(&mut self, n: usize) -> BlobResult<&[u8]> {
        if self.0.len() < n {
            return Err(BlobError::BadState);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u32(&mut self) -> BlobResult<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> BlobResult<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn string(&mut self) -> BlobResult<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| BlobError::BadState)
    }
}

struct Inner {
    s3: AmazonS3,
    prefix: String,
    base: u64,
    /// Where ListMultipartUploads goes ([`Inner::unmarked_multiparts`]).
    listing: Listing,
}

/// Path-style address of the bucket and the signing region, for the one request object_store
/// does not make: ListMultipartUploads.
struct Listing {
    /// e.g. `http://127.0.0.1:9000/bucket` or `https://s3.eu-west-1.amazonaws.com/bucket`.
    bucket_url: String,
    region: String,
    /// object_store's own HTTP client (TLS, proxies and `AWS_ALLOW_HTTP` as for every other
    /// request).
    http: object_store::client::HttpClient,
}

impl Inner {
    fn key(&self, name: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(name)
        } else {
            Path::from(format!("{}/{name}", self.prefix))
        }
    }
    fn object(&self, id: &str) -> Path {
        self.key(id)
    }
    fn created(&self, id: &str) -> Path {
        self.key(&format!("{id}.created"))
    }
    fn mpu_dir(&self, id: &str) -> Path {
        self.key(&format!("{id}.mpu"))
    }
    fn mpu_marker(&self, id: &str, mp: &str) -> Path {
        self.key(&format!("{id}.mpu/{}", hex::encode(mp)))
    }
    fn tail_dir(&self, id: &str) -> Path {
        self.key(&format!("{id}.tail"))
    }
    fn segment(&self, id: &str, (idx, start, end): (u64, u64, u64)) -> Path {
        self.key(&format!("{id}.tail/{idx}-{start}-{end}"))
    }

    async fn exists(&self, p: &Path) -> BlobResult<Option<u64>> {
        match self.s3.head(p).await {
            Ok(m) => Ok(Some(m.size)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(io(e)),
        }
    }

    async fn delete_quiet(&self, p: &Path) -> BlobResult<()> {
        match self.s3.delete(p).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(io(e)),
        }
    }

    async fn list(&self, dir: &Path) -> BlobResult<Vec<Path>> {
        self.s3.list(Some(dir)).map_ok(|m| m.location).try_collect().await.map_err(io)
    }

    /// Abort every multipart upload of `id` but `keep`, and forget their markers. Multipart
    /// uploads no marker names (a writer died between CreateMultipartUpload and writing the
    /// marker) are found with ListMultipartUploads on the object's key and aborted too.
    async fn abort_multiparts(&self, id: &str, keep: Option<&str>) -> BlobResult<()> {
        for marker in self.list(&self.mpu_dir(id)).await? {
            let Some(mp) = marker.filename().and_then(|h| hex::decode(h).ok()).and_then(|b| String::from_utf8(b).ok()) else { continue };
            if keep == Some(mp.as_str()) {
                continue;
            }
            self.abort_one(id, mp).await?;
            self.delete_quiet(&marker).await?;
        }
        match self.unmarked_multiparts(id).await {
            Ok(ids) => {
                for mp in ids.into_iter().filter(|m| keep != Some(m.as_str())) {
                    self.abort_one(id, mp).await?;
                }
            }
            // Best effort: a store without ListMultipartUploads leaves such orphans to the
            // bucket's AbortIncompleteMultipartUpload lifecycle rule.
            Err(e) => tracing::warn!(upload = id, error = %e, "listing multipart uploads to abort orphans failed"),
        }
        Ok(())
    }

    async fn abort_one(&self, id: &str, mp: String) -> BlobResult<()> {
        match self.s3.abort_multipart(&self.object(id), &MultipartId::from(mp)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(io(e)),
        }
    }

    /// The ids of the unfinished multipart uploads of `id`'s object: ListMultipartUploads
    /// with the key as prefix (exact key matches only), signed with object_store's own
    /// credentials. For cleanup only, never for resume state (DESIGN §2).
    async fn unmarked_multiparts(&self, id: &str) -> Result<Vec<String>, String> {
        let key = self.object(id).to_string();
        let mut url = url::Url::parse(&self.listing.bucket_url).map_err(|e| e.to_string())?;
        url.query_pairs_mut().append_pair("prefix", &key).append_pair("uploads", "");
        let cred = self.s3.credentials().get_credential().await.map_err(|e| e.to_string())?;
        let mut req = http::Request::get(url.as_str()).body(object_store::client::HttpRequestBody::empty()).map_err(|e| e.to_string())?;
        object_store::aws::AwsAuthorizer::new(&cred, "s3", &self.listing.region).try_authorize(&mut req, None).map_err(|e| e.to_string())?;
        let resp = self.listing.http.execute(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp.into_body().bytes().await.map_err(|e| e.to_string())?;
        let body = String::from_utf8_lossy(&body);
        if !status.is_success() {
            return Err(format!("ListMultipartUploads answered {status}: {}", body.chars().take(300).collect::<String>()));
        }
        Ok(parse_uploads(&body).into_iter().filter(|(k, _)| *k == key).map(|(_, u)| u).collect())
    }

    /// Delete the tail segments of `id` not in `keep`.
    async fn delete_segments(&self, id: &str, keep: &HashSet<Path>) -> BlobResult<()> {
        for p in self.list(&self.tail_dir(id)).await? {
            if !keep.contains(&p) {
                self.delete_quiet(&p).await?;
            }
        }
        Ok(())
    }

    /// Everything stored for `id`, the finished object included.
    async fn remove_all(&self, id: &str) -> BlobResult<()> {
        self.abort_multiparts(id, None).await?;
        self.delete_segments(id, &HashSet::new()).await?;
        self.delete_quiet(&self.object(id)).await?;
        self.delete_quiet(&self.created(id)).await
    }

    async fn read_segments(&self, id: &str, segs: &[(u64, u64, u64)], buf: &mut BytesMut) -> BlobResult<()> {
        for &s in segs {
            let b = self.s3.get(&self.segment(id, s)).await.map_err(|e| corrupt(e, "a tail segment"))?.bytes().await.map_err(io)?;
            if b.len() as u64 != s.2 - s.1 {
                return Err(BlobError::Io(std::io::Error::other(format!("tail segment {}-{} has {} bytes", s.1, s.2, b.len()))));
            }
            buf.extend_from_slice(&b);
        }
        Ok(())
    }
}

/// `(Key, UploadId)` of each `<Upload>` in a ListMultipartUploads answer (XML entities of the
/// five predefined kinds decoded).
fn parse_uploads(xml: &str) -> Vec<(String, String)> {
    fn field(block: &str, name: &str) -> Option<String> {
        let start = block.find(&format!("<{name}>"))? + name.len() + 2;
        let end = start + block[start..].find(&format!("</{name}>"))?;
        Some(block[start..end].replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&"))
    }
    xml.split("<Upload>").skip(1).filter_map(|b| Some((field(b, "Key")?, field(b, "UploadId")?))).collect()
}

/// A missing object a committed state names: the store lost bytes (or someone deleted them).
fn corrupt(e: object_store::Error, what: &str) -> BlobError {
    if is_not_found(&e) {
        BlobError::Io(std::io::Error::other(format!("{what} named by the blob state is missing")))
    } else {
        io(e)
    }
}

/// [`BlobStore`] over an S3 bucket (or any S3-compatible store).
#[derive(Clone)]
pub struct S3BlobStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for S3BlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3BlobStore").field("prefix", &self.inner.prefix).field("base", &self.inner.base).finish()
    }
}

impl S3BlobStore {
    /// Open `s3://bucket/prefix` with the `AWS_*` environment (`AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL` for S3-compatible stores,
    /// `AWS_ALLOW_HTTP=true` for a plain-http endpoint; `AmazonS3Builder::from_env`).
    /// `base_part` is the schedule base in bytes ([`part_size`]; [`MIN_PART`] in production,
    /// smaller only against a test server that allows it). Errors: a URL that is not
    /// `s3://bucket[/prefix]`, or a configuration object_store refuses. Does not touch the
    /// network; [`BlobStore::ping`] does.
    pub fn from_url(url: &str, base_part: u64) -> anyhow::Result<S3BlobStore> {
        let rest = url.strip_prefix("s3://").ok_or_else(|| anyhow::anyhow!("blob store URL {url:?} does not start with s3://"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        anyhow::ensure!(!bucket.is_empty(), "blob store URL {url:?} names no bucket");
        anyhow::ensure!(base_part > 0, "part size must be positive");
        let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Ok(ep) = std::env::var("AWS_ENDPOINT_URL") {
            // S3-compatible stores are addressed by path (bucket in the path), as MinIO and moto expect.
            b = b.with_endpoint(ep).with_virtual_hosted_style_request(false);
        }
        let region = b.get_config_value(&AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".to_string());
        let endpoint = b.get_config_value(&AmazonS3ConfigKey::Endpoint).unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        let allow_http = b.get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp)).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let http = ReqwestConnector::default().connect(&ClientOptions::new().with_allow_http(allow_http)).map_err(|e| anyhow::anyhow!("configuring S3 for {url}: {e}"))?;
        let listing = Listing { bucket_url: format!("{}/{bucket}", endpoint.trim_end_matches('/')), region, http };
        let s3 = b.build().map_err(|e| anyhow::anyhow!("configuring S3 for {url}: {e}"))?;
        Ok(S3BlobStore { inner: Arc::new(Inner { s3, prefix: prefix.trim_matches('/').to_string(), base: base_part, listing }) })
    }

    /// Reopen a finished blob at `offset` (a job re-running after a crash between finishing
    /// its file and checkpointing that): its multipart upload is completed, so the first
    /// `offset` bytes are copied from the object into a new one (a GET streamed into parts).
    async fn reopen_finished(&self, id: &str, offset: u64, state: &BlobState) -> BlobResult<Box<dyn BlobWriter>> {
        let s = &self.inner;
        S3State::decode(state)?;
        let len = s.exists(&s.object(id)).await?.ok_or(BlobError::NotFound)?;
        if len < offset {
            return Err(BlobError::OutOfRange { start: offset, end: offset, len });
        }
        s.s3.put(&s.created(id), PutPayload::new()).await.map_err(io)?;
        let fresh = S3State { base: s.base, ..Default::default() };
        let mut w = S3Writer { store: s.clone(), id: id.to_string(), parts_end: 0, known: Vec::new(), history: vec![Vec::new()], st: fresh, buf: BytesMut::new() };
        if offset > 0 {
            let mut stream = self.read(id, 0..offset).await?;
            while let Some(chunk) = stream.try_next().await? {
                w.write(chunk).await?;
            }
        }
        Ok(Box::new(w))
    }

    /// Parts an upload of `len` bytes needs under this store's schedule.
    pub fn parts_for(&self, len: u64) -> u64 {
        let mut i = 0;
        while part_start(self.inner.base, i) < len {
            i += 1;
        }
        i
    }
}

#[async_trait]
impl BlobStore for S3BlobStore {
    async fn create(&self, id: &str) -> BlobResult<()> {
        let s = &self.inner;
        // An existing blob is reset: its multipart uploads, tail and object go.
        s.remove_all(id).await?;
        s.s3.put(&s.created(id), PutPayload::new()).await.map_err(io)?;
        Ok(())
    }

    async fn open_writer(&self, id: &str, offset: u64, state: &BlobState) -> BlobResult<Box<dyn BlobWriter>> {
        let s = &self.inner;
        if s.exists(&s.created(id)).await?.is_none() {
            return self.reopen_finished(id, offset, state).await;
        }
        let st = match S3State::decode(state)? {
            None if offset == 0 => S3State { base: s.base, ..Default::default() },
            None => return Err(BlobError::BadState),
            Some(st) if st.offset() == offset => st,
            Some(_) => return Err(BlobError::BadState),
        };
        let mut buf = BytesMut::new();
        let segs = st.segments();
        s.read_segments(id, &segs, &mut buf).await?;
        // Segments the committed state does not name are a crashed or superseded writer's.
        let keep: HashSet<Path> = segs.iter().map(|&g| s.segment(id, g)).collect();
        s.delete_segments(id, &keep).await?;
        Ok(Box::new(S3Writer { store: self.inner.clone(), id: id.to_string(), parts_end: st.parts_end(), known: segs.clone(), history: vec![segs], st, buf }))
    }

    async fn finish(&self, id: &str, state: &BlobState) -> BlobResult<()> {
        let s = &self.inner;
        let st = S3State::decode(state)?.unwrap_or(S3State { base: s.base, ..Default::default() });
        let len = st.offset();
        if s.exists(&s.created(id)).await?.is_none() {
            // Finished already (idempotent) or never created.
            return match s.exists(&s.object(id)).await? {
                Some(_) => Ok(()),
                None => Err(BlobError::NotFound),
            };
        }
        let mut tail = BytesMut::new();
        s.read_segments(id, &st.segments(), &mut tail).await?;
        match &st.multipart {
            None => {
                s.s3.put(&s.object(id), PutPayload::from(tail.freeze())).await.map_err(io)?;
            }
            Some(mp) => {
                let mpid = MultipartId::from(mp.clone());
                let mut parts: Vec<PartId> = st.parts.iter().map(|(_, c)| PartId { content_id: c.clone() }).collect();
                if !tail.is_empty() {
                    // The tail becomes the last part (S3 allows the last one to be short).
                    parts.push(s.s3.put_part(&s.object(id), &mpid, st.parts.len(), PutPayload::from(tail.freeze())).await.map_err(io)?);
                }
                if let Err(e) = s.s3.complete_multipart(&s.object(id), &mpid, parts).await {
                    // Completed by an earlier call that crashed before cleaning up?
                    if s.exists(&s.object(id)).await? != Some(len) {
                        return Err(io(e));
                    }
                }
                s.delete_quiet(&s.mpu_marker(id, mp)).await?;
            }
        }
        s.abort_multiparts(id, None).await?;
        s.delete_segments(id, &HashSet::new()).await?;
        s.delete_quiet(&s.created(id)).await
    }

    async fn abort(&self, id: &str) -> BlobResult<()> {
        self.inner.remove_all(id).await
    }

    async fn ping(&self) -> BlobResult<()> {
        let s = &self.inner;
        let probe = s.key(&format!(".ferry-probe-{}", hex::encode(rand::random::<[u8; 8]>())));
        s.s3.put(&probe, PutPayload::from_static(b"ferry")).await.map_err(io)?;
        s.s3.delete(&probe).await.map_err(io)
    }

    async fn len(&self, id: &str) -> BlobResult<Option<u64>> {
        let s = &self.inner;
        if let Some(n) = s.exists(&s.object(id)).await? {
            return Ok(Some(n));
        }
        Ok(s.exists(&s.created(id)).await?.map(|_| 0))
    }

    async fn truncate(&self, id: &str, len: u64) -> BlobResult<()> {
        match self.len(id).await? {
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
        Ok(Box::pin(got.into_stream().map(|r| r.map_err(|e| std::io::Error::other(e.to_string())))))
    }

    async fn delete(&self, id: &str) -> BlobResult<()> {
        self.inner.remove_all(id).await
    }
}

struct S3Writer {
    store: Arc<Inner>,
    id: String,
    /// Parts uploaded (and multipart id) as of the last write; `st.tail` as of the last sync.
    st: S3State,
    parts_end: u64,
    /// Bytes from `parts_end` on: the tail, in memory (less than one part).
    buf: BytesMut,
    /// Tail segments known to exist (opened with or written by this writer).
    known: Vec<(u64, u64, u64)>,
    /// The segments of the last three states (the opened one first): older ones are deleted,
    /// as the engine commits a state before it syncs twice more.
    history: Vec<Vec<(u64, u64, u64)>>,
}

impl S3Writer {
    fn next_size(&self) -> u64 {
        part_size(self.st.base, self.st.parts.len() as u64)
    }

    async fn upload_full_parts(&mut self) -> BlobResult<()> {
        while self.buf.len() as u64 >= self.next_size() {
            let idx = self.st.parts.len() as u64;
            if idx >= MAX_PARTS {
                return Err(BlobError::Io(std::io::Error::other("upload exceeds 10 000 S3 parts")));
            }
            let size = self.next_size();
            let s = self.store.clone();
            let path = s.object(&self.id);
            let mp = match &self.st.multipart {
                Some(m) => m.clone(),
                None => {
                    let m = s.s3.create_multipart(&path).await.map_err(io)?;
                    s.s3.put(&s.mpu_marker(&self.id, &m), PutPayload::new()).await.map_err(io)?;
                    self.st.multipart = Some(m.clone());
                    m
                }
            };
            let data = self.buf.split_to(size as usize).freeze();
            let pid = s.s3.put_part(&path, &MultipartId::from(mp), idx as usize, PutPayload::from(data)).await.map_err(io)?;
            self.st.parts.push((size, pid.content_id));
            self.parts_end += size;
            self.st.tail.clear();
        }
        Ok(())
    }
}

#[async_trait]
impl BlobWriter for S3Writer {
    async fn write(&mut self, data: Bytes) -> BlobResult<()> {
        self.buf.extend_from_slice(&data);
        self.upload_full_parts().await
    }

    async fn sync(&mut self) -> BlobResult<BlobState> {
        let s = self.store.clone();
        let idx = self.st.parts.len() as u64;
        let synced = self.st.tail.last().copied().unwrap_or(self.parts_end);
        let pos = self.position();
        if pos > synced {
            let seg = (idx, synced, pos);
            let data = Bytes::copy_from_slice(&self.buf[(synced - self.parts_end) as usize..]);
            s.s3.put(&s.segment(&self.id, seg), PutPayload::from(data)).await.map_err(io)?;
            self.st.tail.push(pos);
            self.known.push(seg);
        }
        self.history.push(self.st.segments());
        if self.history.len() > 3 {
            let old = self.history.remove(0);
            for seg in old {
                if !self.history.iter().any(|h| h.contains(&seg)) {
                    s.delete_quiet(&s.segment(&self.id, seg)).await?;
                    self.known.retain(|k| *k != seg);
                }
            }
        }
        Ok(self.st.encode())
    }

    async fn rewind(&mut self, len: u64) -> BlobResult<()> {
        if len > self.position() {
            return Err(BlobError::OutOfRange { start: len, end: len, len: self.position() });
        }
        // Segments reaching past `len` hold bytes that are no longer the blob's.
        self.known.retain(|k| k.2 <= len);
        if len >= self.parts_end {
            self.buf.truncate((len - self.parts_end) as usize);
            self.st.tail.retain(|&e| e <= len);
            return Ok(());
        }
        // Back into a part already sent: rebuild its bytes before `len` from tail segments of
        // that part (the committed state's are kept), and send it again later.
        let base = self.st.base;
        let mut idx = 0;
        while part_start(base, idx + 1) <= len {
            idx += 1;
        }
        let start = part_start(base, idx);
        let mut chain = Vec::new();
        let mut cur = start;
        while cur < len {
            let Some(&next) = self.known.iter().filter(|k| k.0 == idx && k.1 == cur).max_by_key(|k| k.2) else {
                return Err(BlobError::Io(std::io::Error::other(format!("cannot rewind to {len}: those bytes were sent as part {idx} and no tail holds them"))));
            };
            chain.push(next);
            cur = next.2;
        }
        let mut buf = BytesMut::new();
        self.store.read_segments(&self.id, &chain, &mut buf).await?;
        self.st.parts.truncate(idx as usize);
        self.st.tail = chain.iter().map(|c| c.2).collect();
        self.parts_end = start;
        self.buf = buf;
        Ok(())
    }

    fn position(&self) -> u64 {
        self.parts_end + self.buf.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_fits_a_tebibyte_in_ten_thousand_parts() {
        let tib = 1u64 << 40;
        assert!(max_upload(MIN_PART) >= 4 * tib, "≈ 4.88 TiB fit");
        assert!(max_upload(MIN_PART) <= 5 * tib, "S3's largest object is 5 TiB");
        let mut i = 0;
        while part_start(MIN_PART, i) < tib {
            i += 1;
        }
        assert!(i <= MAX_PARTS, "1 TiB needs {i} parts");
        assert_eq!(i, 7_647);
        assert_eq!(part_size(MIN_PART, i - 1), 640 * 1024 * 1024, "largest part at 1 TiB");
        assert!(part_size(MIN_PART, MAX_PARTS - 1) <= 5 << 30, "S3's largest part is 5 GiB");
        // Starts are the running sum of sizes.
        let mut sum = 0;
        for idx in 0..MAX_PARTS {
            assert_eq!(part_start(MIN_PART, idx), sum);
            assert!(part_size(MIN_PART, idx) >= MIN_PART);
            sum += part_size(MIN_PART, idx);
        }
    }

    #[test]
    fn list_multipart_uploads_answers_parse() {
        let xml = "<?xml version=\"1.0\"?><ListMultipartUploadsResult><Bucket>b</Bucket><Upload><Key>up/a&amp;b</Key><UploadId>X1</UploadId>\
                   <Initiated>2026</Initiated></Upload><Upload><Key>up/c</Key><UploadId>Y2</UploadId></Upload></ListMultipartUploadsResult>";
        assert_eq!(parse_uploads(xml), vec![("up/a&b".to_string(), "X1".to_string()), ("up/c".to_string(), "Y2".to_string())]);
        assert_eq!(parse_uploads("<ListMultipartUploadsResult/>"), vec![]);
    }

    #[test]
    fn state_round_trips_and_rejects_foreign_states() {
        let st = S3State { base: MIN_PART, multipart: Some("abc/def+==".into()), parts: vec![(MIN_PART, "\"etag1\"".into())], tail: vec![MIN_PART + 3, MIN_PART + 10] };
        assert_eq!(S3State::decode(&st.encode()).unwrap(), Some(st.clone()));
        assert_eq!(st.offset(), MIN_PART + 10);
        assert_eq!(S3State::decode(&BlobState::default()).unwrap(), None);
        assert!(matches!(S3State::decode(&BlobState::fs(5)), Err(BlobError::BadState)));
        let mut bad = st.encode().0;
        bad.push(0);
        assert!(matches!(S3State::decode(&BlobState(bad)), Err(BlobError::BadState)));
        let wrong_size = S3State { parts: vec![(MIN_PART - 1, "x".into())], tail: vec![], ..st.clone() };
        assert!(matches!(S3State::decode(&wrong_size.encode()), Err(BlobError::BadState)));
        let tail_fills_part = S3State { tail: vec![2 * MIN_PART], ..st };
        assert!(matches!(S3State::decode(&tail_fills_part.encode()), Err(BlobError::BadState)));
    }
}
