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
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::{HttpConnector, ReqwestConnector};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{BackoffConfig, GetOptions, GetRange, MultipartId, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use object_store::{ClientConfigKey, ClientOptions};

use super::{BlobError, BlobResult, BlobState, BlobStore, BlobWriter, ByteStream};

/// object_store's retries of one S3 request (5xx, `SlowDown`, connection errors, timeouts):
/// at most 3 more attempts, 100 ms then doubling backoff (at most 1 s), and none started
/// after 10 s — so a request is not held for minutes while S3 is away (object_store's default
/// is 10 retries over up to 3 minutes). The client then gets `503 unavailable` with
/// `Retry-After` and retries itself.
pub fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig { init_backoff: Duration::from_millis(100), max_backoff: Duration::from_secs(1), base: 2.0 },
        max_retries: 3,
        retry_timeout: Duration::from_secs(10),
    }
}

/// Longest ferry waits for an S3 request that carries no data (HEAD, DELETE, a marker object,
/// CreateMultipartUpload, the readiness probe), object_store's retries included. A request
/// with data gets one more second per MiB ([`deadline_for`]). object_store's own limits still
/// apply inside: 5 s to connect, 30 s for one attempt, no new attempt after 10 s
/// ([`retry_config`]). A frozen S3 (it accepts connections and never answers) thus costs a
/// client at most this long, then `503 unavailable`, instead of the 30 s of one silent attempt.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// [`REQUEST_DEADLINE`] plus one second per MiB of `bytes` sent or read.
pub fn deadline_for(bytes: u64) -> Duration {
    REQUEST_DEADLINE + Duration::from_secs(bytes.div_ceil(1024 * 1024))
}

/// S3 did not answer within the deadline: as retryable as a refused connection.
#[derive(Debug)]
struct NoAnswer(Duration);

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3 did not answer within {}", crate::config::human_duration(self.0))
    }
}

impl std::error::Error for NoAnswer {}

/// `fut` (an S3 request) bounded by `deadline`; running out is an `Unavailable` error
/// ([`classify`]). The request is dropped: an object it was writing may still appear later,
/// which the catalog's state (the truth) never names.
async fn bounded<T>(deadline: Duration, fut: impl std::future::Future<Output = object_store::Result<T>>) -> object_store::Result<T> {
    match tokio::time::timeout(deadline, fut).await {
        Ok(r) => r,
        Err(_) => Err(object_store::Error::Generic { store: "S3", source: Box::new(NoAnswer(deadline)) }),
    }
}

/// The readiness probe's object, under the prefix: written and deleted by [`BlobStore::ping`].
pub const PROBE_KEY: &str = ".ferry-probe";

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

/// What an S3 failure means for the caller, once object_store's own bounded retries are spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// 404: the object (or multipart upload) is not there.
    NotFound,
    /// The store is away or refuses for now: no connection, a timeout, a dropped response,
    /// 5xx / 429 / 408, an error body such as `SlowDown` or `InternalError`, 403 / 401
    /// (a bucket policy or credentials that refuse; an operator can fix it without losing
    /// anything). The request may succeed later.
    Unavailable,
    /// Anything else (400 `InvalidPart`, a response that does not parse…): retrying the same
    /// request cannot help.
    Other,
}

/// Classify an object_store error. object_store 0.14 keeps its `RetryError` (the one carrying
/// the HTTP status) in a private module, so a status it did not map to a variant of its own
/// (`NotFound`, `PermissionDenied`, …) is read from the error's message, which it formats as
/// `Server returned non-2xx status code: 503 Service Unavailable: …` or, for an error in the
/// body of a 200 (S3's `SlowDown` / `InternalError`), `Server returned error response: …`.
/// Transport failures are its public `HttpError` in the source chain.
fn classify(e: &object_store::Error) -> Failure {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => return Failure::NotFound,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => return Failure::Unavailable,
        // 409: S3's `OperationAborted` (a conflicting operation in progress on the key).
        E::AlreadyExists { .. } => return Failure::Unavailable,
        E::Generic { .. } => {}
        _ => return Failure::Other,
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<object_store::client::HttpError>() || err.is::<NoAnswer>() {
            return Failure::Unavailable;
        }
        cur = err.source();
    }
    classify_message(&e.to_string())
}

/// [`classify`] for an error's message (see there).
fn classify_message(msg: &str) -> Failure {
    if msg.contains("Server returned error response") {
        return Failure::Unavailable;
    }
    let Some(at) = msg.find("status code: ") else { return Failure::Other };
    let code: u16 = msg[at + "status code: ".len()..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap_or(0);
    match code {
        404 => Failure::NotFound,
        401 | 403 | 408 | 409 | 429 | 500..=599 => Failure::Unavailable,
        _ => Failure::Other,
    }
}

fn io(e: object_store::Error) -> BlobError {
    match classify(&e) {
        Failure::NotFound => BlobError::NotFound,
        Failure::Unavailable => BlobError::Unavailable(e.to_string()),
        Failure::Other => BlobError::Io(std::io::Error::other(e.to_string())),
    }
}

fn is_not_found(e: &object_store::Error) -> bool {
    classify(e) == Failure::NotFound
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
    /// For the one request object_store does not offer (UploadPartCopy with a range; see
    /// [`Inner::copy_part`]), sent to a URL object_store signs.
    http: reqwest::Client,
    bucket: String,
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
        match bounded(REQUEST_DEADLINE, self.s3.head(p)).await {
            Ok(m) => Ok(Some(m.size)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(io(e)),
        }
    }

    async fn delete_quiet(&self, p: &Path) -> BlobResult<()> {
        match bounded(REQUEST_DEADLINE, self.s3.delete(p)).await {
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
            let got = bounded(REQUEST_DEADLINE, self.s3.get(&self.segment(id, s))).await.map_err(|e| corrupt(e, "a tail segment"))?;
            let b = bounded(deadline_for(s.2 - s.1), got.bytes()).await.map_err(io)?;
            if b.len() as u64 != s.2 - s.1 {
                return Err(BlobError::Io(std::io::Error::other(format!("tail segment {}-{} has {} bytes", s.1, s.2, b.len()))));
            }
            buf.extend_from_slice(&b);
        }
        Ok(())
    }
}

impl Inner {
    /// UploadPartCopy (S3 API reference): part `idx` (0-based) of multipart upload `mp` on
    /// `to` becomes bytes `range` of object `from`, copied inside S3. object_store 0.14 sends
    /// UploadPartCopy only within its own whole-object `copy` and does not expose it; it does
    /// expose SigV4 presigning with signed query parameters and headers
    /// ([`Signer::signed_url_opts`]), so this request goes to a URL object_store signs
    /// (`partNumber`, `uploadId`, `x-amz-copy-source`, `x-amz-copy-source-range` all under
    /// the signature) — no signing code of ferry's own. Errors are classified as object_store's
    /// are ([`classify_message`]); S3 may answer 200 with an `<Error>` body, which is one too.
    async fn copy_part(&self, to: &Path, mp: &str, idx: usize, from: &Path, range: Range<u64>) -> BlobResult<PartId> {
        use object_store::signer::{SignedUrlOptions, Signer};
        const KEY: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b'/');
        let source = format!("{}/{}", self.bucket, percent_encoding::utf8_percent_encode(from.as_ref(), KEY));
        let source_range = format!("bytes={}-{}", range.start, range.end - 1);
        let header = |v: &str| http::HeaderValue::from_str(v).map_err(|e| BlobError::Io(std::io::Error::other(e)));
        let (src_h, range_h) = (header(&source)?, header(&source_range)?);
        let opts = SignedUrlOptions::new()
            .with_query([("partNumber", (idx + 1).to_string()), ("uploadId", mp.to_string())])
            .with_signed_header(http::HeaderName::from_static("x-amz-copy-source"), src_h.clone())
            .with_signed_header(http::HeaderName::from_static("x-amz-copy-source-range"), range_h.clone());
        let url = self.s3.signed_url_opts(http::Method::PUT, to, Duration::from_secs(3600), &opts).await.map_err(io)?;
        let unavailable = |what: String| BlobError::Unavailable(format!("UploadPartCopy of {from} {source_range} into part {}: {what}", idx + 1));
        let mut attempt = 0;
        let body = loop {
            let sent = self.http.put(url.clone()).header("x-amz-copy-source", src_h.clone()).header("x-amz-copy-source-range", range_h.clone()).send().await;
            let failure = match sent {
                Ok(r) if r.status().is_success() => match r.text().await {
                    Ok(body) if !body.contains("<Error>") => break body,
                    Ok(body) => (classify_message(&format!("Server returned error response: {body}")), body),
                    Err(e) => (Failure::Unavailable, e.to_string()),
                },
                Ok(r) => {
                    let status = r.status();
                    let body = r.text().await.unwrap_or_default();
                    (classify_message(&format!("status code: {}", status.as_u16())), format!("{status}: {body}"))
                }
                Err(e) => (Failure::Unavailable, e.to_string()),
            };
            // The same bounded retries object_store gives its own requests ([`retry_config`]).
            attempt += 1;
            match failure {
                (Failure::Unavailable, _) if attempt <= retry_config().max_retries => tokio::time::sleep(Duration::from_millis(100 << attempt.min(3))).await,
                (Failure::Unavailable, what) => return Err(unavailable(what)),
                (Failure::NotFound, _) => return Err(BlobError::NotFound),
                (Failure::Other, what) => return Err(BlobError::Io(std::io::Error::other(format!("UploadPartCopy of {from} {source_range}: {what}")))),
            }
        };
        let etag = body.split("<ETag>").nth(1).and_then(|t| t.split("</ETag>").next()).ok_or_else(|| unavailable(format!("no ETag in the answer: {body}")))?;
        Ok(PartId { content_id: etag.replace("&quot;", "\"").replace("&#34;", "\"").replace("&amp;", "&") })
    }

    /// Part `idx` of a composition on `path` (multipart upload `mp`): copied or streamed.
    async fn compose_part(&self, path: &Path, mp: &str, idx: usize, piece: &Piece, sources: &[(String, u64)]) -> BlobResult<PartId> {
        match piece {
            Piece::Copy { src, range } => self.copy_part(path, mp, idx, &self.object(&sources[*src].0), range.clone()).await,
            Piece::Stream(ranges) => {
                let mut buf = BytesMut::new();
                for (src, range) in ranges {
                    let opts = GetOptions { range: Some(GetRange::Bounded(range.clone())), ..Default::default() };
                    let got = self.s3.get_opts(&self.object(&sources[*src].0), opts).await.map_err(io)?;
                    buf.extend_from_slice(&got.bytes().await.map_err(io)?);
                }
                let mpid = MultipartId::from(mp.to_string());
                let deadline = deadline_for(buf.len() as u64);
                bounded(deadline, self.s3.put_part(path, &mpid, idx, PutPayload::from(buf.freeze()))).await.map_err(io)
            }
        }
    }

    /// Build `id` from finished objects (see [`BlobStore::compose`]) along `plan`.
    async fn compose(&self, id: &str, sources: &[(String, u64)], plan: &[Piece]) -> BlobResult<()> {
        // Start from nothing: an earlier attempt's multipart uploads, object and tail go.
        self.remove_all(id).await?;
        bounded(REQUEST_DEADLINE, self.s3.put(&self.created(id), PutPayload::new())).await.map_err(io)?;
        let path = self.object(id);
        let mp = bounded(REQUEST_DEADLINE, self.s3.create_multipart(&path)).await.map_err(io)?;
        bounded(REQUEST_DEADLINE, self.s3.put(&self.mpu_marker(id, &mp), PutPayload::new())).await.map_err(io)?;
        let mpid = MultipartId::from(mp.clone());
        // Up to 4 parts at once (UploadPartCopy of a large range takes S3 a while).
        let mut pending = Vec::with_capacity(plan.len());
        for (idx, piece) in plan.iter().enumerate() {
            pending.push(self.compose_part(&path, &mp, idx, piece, sources));
        }
        let parts = futures::stream::iter(pending).buffered(4).try_collect::<Vec<PartId>>().await;
        let done = match parts {
            Ok(parts) => self.s3.complete_multipart(&path, &mpid, parts).await.map_err(io),
            Err(e) => Err(e),
        };
        if let Err(e) = done {
            // Best effort: if S3 is away, the marker lets a later abort or delete find it.
            if self.s3.abort_multipart(&path, &mpid).await.is_ok() {
                let _ = self.delete_quiet(&self.mpu_marker(id, &mp)).await;
            }
            return Err(e);
        }
        self.delete_quiet(&self.mpu_marker(id, &mp)).await?;
        self.delete_quiet(&self.created(id)).await
    }
}

/// Largest range one UploadPartCopy copies: 5 GiB (S3's largest part).
const MAX_COPY: u64 = 5 << 30;

/// One part of a composed blob.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// Bytes `range` of source `src`, copied inside S3 (UploadPartCopy).
    Copy { src: usize, range: Range<u64> },
    /// These source ranges, read and uploaded as one part (small sources, and the bytes that
    /// top a part up to the minimum).
    Stream(Vec<(usize, Range<u64>)>),
}

/// How to compose sources of lengths `lens` (bytes) into parts of at least `min_part` bytes
/// but the last (S3's rule for every part, copied or uploaded): every stretch of a source that
/// can be a part of its own is copied inside S3 (split at [`MAX_COPY`]); a source too small
/// for that is read and uploaded together with its neighbours, and when such bytes are waiting,
/// the head of the next large source tops them up to `min_part` before the rest of it is
/// copied. So at most `min_part` bytes pass through ferry per small stretch. `None` when
/// nothing would be copied (streaming is as good) or the parts would exceed [`MAX_PARTS`].
fn compose_plan(lens: &[u64], min_part: u64) -> Option<Vec<Piece>> {
    let last = lens.iter().rposition(|&l| l > 0)?;
    let mut parts = Vec::new();
    let mut buf: Vec<(usize, Range<u64>)> = Vec::new();
    let mut buf_len = 0u64;
    for (i, &len) in lens.iter().enumerate() {
        if len == 0 {
            continue;
        }
        let mut pos = 0;
        if buf_len > 0 {
            let need = min_part - buf_len;
            if len > need && (len - need >= min_part || i == last) {
                buf.push((i, 0..need));
                parts.push(Piece::Stream(std::mem::take(&mut buf)));
                buf_len = 0;
                pos = need;
            } else {
                buf.push((i, 0..len));
                buf_len += len;
                if buf_len >= min_part {
                    parts.push(Piece::Stream(std::mem::take(&mut buf)));
                    buf_len = 0;
                }
                continue;
            }
        }
        let rem = len - pos;
        if rem >= min_part || i == last {
            let step = rem.div_ceil(rem.div_ceil(MAX_COPY));
            while pos < len {
                let end = (pos + step).min(len);
                parts.push(Piece::Copy { src: i, range: pos..end });
                pos = end;
            }
        } else {
            buf.push((i, pos..len));
            buf_len += rem;
        }
    }
    if !buf.is_empty() {
        parts.push(Piece::Stream(buf));
    }
    let copies = parts.iter().any(|p| matches!(p, Piece::Copy { .. }));
    (copies && parts.len() as u64 <= MAX_PARTS).then_some(parts)
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
        BlobError::Io(std::io::Error::new(std::io::ErrorKind::NotFound, format!("{what} named by the blob state is missing")))
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
        let listing_http = ReqwestConnector::default().connect(&ClientOptions::new().with_allow_http(allow_http)).map_err(|e| anyhow::anyhow!("configuring S3 for {url}: {e}"))?;
        let listing = Listing { bucket_url: format!("{}/{bucket}", endpoint.trim_end_matches('/')), region, http: listing_http };
        let s3 = b.with_retry(retry_config()).build().map_err(|e| anyhow::anyhow!("configuring S3 for {url}: {e}"))?;
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).build().map_err(|e| anyhow::anyhow!("HTTP client for {url}: {e}"))?;
        Ok(S3BlobStore { inner: Arc::new(Inner { s3, http, bucket: bucket.to_string(), prefix: prefix.trim_matches('/').to_string(), base: base_part, listing }) })
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
        bounded(REQUEST_DEADLINE, s.s3.put(&s.created(id), PutPayload::new())).await.map_err(io)?;
        let fresh = S3State { base: s.base, ..Default::default() };
        let mut w = S3Writer { store: s.clone(), id: id.to_string(), parts_end: 0, known: Vec::new(), history: vec![Vec::new()], st: fresh, buf: BytesMut::new() };
        if offset > 0 {
            let mut stream = self.read(id, 0..offset).await?;
            while let Some(chunk) = stream.try_next().await.map_err(BlobError::from_stream)? {
                w.write(chunk).await?;
            }
        }
        Ok(Box::new(w))
    }

    /// Complete the multipart upload of `id` from committed state `st` (its tail becomes the
    /// last part), or PUT the tail whole when no part was ever uploaded.
    async fn assemble(&self, id: &str, st: &S3State) -> BlobResult<()> {
        let s = &self.inner;
        let mut tail = BytesMut::new();
        s.read_segments(id, &st.segments(), &mut tail).await?;
        match &st.multipart {
            None => bounded(deadline_for(tail.len() as u64), s.s3.put(&s.object(id), PutPayload::from(tail.freeze()))).await.map(drop).map_err(io),
            Some(mp) => {
                let mpid = MultipartId::from(mp.clone());
                let mut parts: Vec<PartId> = st.parts.iter().map(|(_, c)| PartId { content_id: c.clone() }).collect();
                if !tail.is_empty() {
                    // The tail becomes the last part (S3 allows the last one to be short).
                    let deadline = deadline_for(tail.len() as u64);
                    parts.push(bounded(deadline, s.s3.put_part(&s.object(id), &mpid, st.parts.len(), PutPayload::from(tail.freeze()))).await.map_err(io)?);
                }
                s.s3.complete_multipart(&s.object(id), &mpid, parts).await.map_err(io)?;
                s.delete_quiet(&s.mpu_marker(id, mp)).await
            }
        }
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
        bounded(REQUEST_DEADLINE, s.s3.put(&s.created(id), PutPayload::new())).await.map_err(io)?;
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
        if let Err(e) = self.assemble(id, &st).await {
            // The multipart upload or a tail segment gone: assembled already, by a finisher
            // that stopped before cleaning up or by another replica finishing the same
            // committed state at the same moment (whose clean-up removed what this one was
            // reading)? Then only the clean-up is left. Any other failure stands.
            let gone = matches!(&e, BlobError::NotFound) || matches!(&e, BlobError::Io(io) if io.kind() == std::io::ErrorKind::NotFound);
            if !gone || s.exists(&s.object(id)).await? != Some(len) {
                return Err(e);
            }
        }
        s.abort_multiparts(id, None).await?;
        s.delete_segments(id, &HashSet::new()).await?;
        s.delete_quiet(&s.created(id)).await
    }

    async fn compose(&self, id: &str, sources: &[(String, u64)]) -> BlobResult<bool> {
        let lens: Vec<u64> = sources.iter().map(|s| s.1).collect();
        let Some(plan) = compose_plan(&lens, self.inner.base) else { return Ok(false) };
        self.inner.compose(id, sources, &plan).await?;
        Ok(true)
    }

    async fn abort(&self, id: &str) -> BlobResult<()> {
        self.inner.remove_all(id).await
    }

    async fn ping(&self) -> BlobResult<()> {
        let s = &self.inner;
        // One fixed key for every replica and every probe: a probe cut short (S3 froze, the
        // readiness check gave up) leaves at most this one small object, never one per probe.
        let probe = s.key(PROBE_KEY);
        bounded(REQUEST_DEADLINE, s.s3.put(&probe, PutPayload::from_static(b"ferry"))).await.map_err(io)?;
        s.delete_quiet(&probe).await
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
        // A failure mid-body (S3 cut off) ends the stream with the classified error, so the
        // reader knows the bytes stopped short and why.
        Ok(Box::pin(got.into_stream().map(|r| r.map_err(|e| io(e).into_stream_error()))))
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
                    let m = bounded(REQUEST_DEADLINE, s.s3.create_multipart(&path)).await.map_err(io)?;
                    bounded(REQUEST_DEADLINE, s.s3.put(&s.mpu_marker(&self.id, &m), PutPayload::new())).await.map_err(io)?;
                    self.st.multipart = Some(m.clone());
                    m
                }
            };
            let data = self.buf.split_to(size as usize).freeze();
            let pid = bounded(deadline_for(size), s.s3.put_part(&path, &MultipartId::from(mp), idx as usize, PutPayload::from(data))).await.map_err(io)?;
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
            bounded(deadline_for(data.len() as u64), s.s3.put(&s.segment(&self.id, seg), PutPayload::from(data))).await.map_err(io)?;
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
    fn s3_failures_are_classified_from_object_stores_messages() {
        let m = |tail: &str| format!("Error performing PUT http://127.0.0.1:1/b/k in 1.2s, after 3 retries, max_retries: 3, retry_timeout: 10s  - {tail}");
        let slow = m("Server returned non-2xx status code: 503 Service Unavailable: <Error><Code>SlowDown</Code></Error>");
        assert_eq!(classify_message(&slow), Failure::Unavailable);
        assert_eq!(classify_message(&m("Server returned non-2xx status code: 500 Internal Server Error: ")), Failure::Unavailable);
        assert_eq!(classify_message(&m("Server returned non-2xx status code: 429 Too Many Requests: ")), Failure::Unavailable);
        assert_eq!(classify_message(&m("Server returned error response: <Error><Code>InternalError</Code></Error>")), Failure::Unavailable);
        assert_eq!(classify_message(&m("Server returned non-2xx status code: 403 Forbidden: AccessDenied")), Failure::Unavailable);
        assert_eq!(classify_message(&m("Server returned non-2xx status code: 404 Not Found: NoSuchUpload")), Failure::NotFound);
        assert_eq!(classify_message(&m("Server returned non-2xx status code: 400 Bad Request: <Code>InvalidPart</Code>")), Failure::Other);
        assert_eq!(classify_message("Got invalid multipart response: missing field"), Failure::Other);
        let denied = object_store::Error::PermissionDenied { path: "k".into(), source: "AccessDenied".into() };
        assert!(matches!(io(denied), BlobError::Unavailable(_)), "a bucket that refuses writes is retryable");
        let missing = object_store::Error::NotFound { path: "k".into(), source: "NoSuchKey".into() };
        assert!(matches!(io(missing), BlobError::NotFound));
        let generic = object_store::Error::Generic { store: "S3", source: slow.into() };
        assert!(matches!(io(generic), BlobError::Unavailable(_)));
        // Carried through a read stream and back.
        let back = BlobError::from_stream(BlobError::Unavailable("cut".into()).into_stream_error());
        assert!(matches!(back, BlobError::Unavailable(w) if w == "cut"));
    }

    /// Each part: its byte count, and whether it is copied.
    fn sizes(plan: &[Piece]) -> Vec<(u64, bool)> {
        plan.iter()
            .map(|p| match p {
                Piece::Copy { range, .. } => (range.end - range.start, true),
                Piece::Stream(rs) => (rs.iter().map(|(_, r)| r.end - r.start).sum(), false),
            })
            .collect()
    }

    #[test]
    fn compose_plans_copy_large_stretches_and_stream_small_ones() {
        let c = |src, range| Piece::Copy { src, range };
        assert_eq!(compose_plan(&[6], 5), Some(vec![c(0, 0..6)]));
        assert_eq!(compose_plan(&[3], 5), Some(vec![c(0, 0..3)]), "a single source is the last part: copied whatever its size");
        assert_eq!(compose_plan(&[6, 1, 5, 1], 5), Some(vec![c(0, 0..6), Piece::Stream(vec![(1, 0..1), (2, 0..5)]), c(3, 0..1)]));
        assert_eq!(compose_plan(&[1, 12], 5), Some(vec![Piece::Stream(vec![(0, 0..1), (1, 0..4)]), c(1, 4..12)]), "the head of a large source tops small bytes up");
        assert_eq!(compose_plan(&[1, 1], 5), None, "nothing to copy: stream");
        assert_eq!(compose_plan(&[0, 0], 5), None);
        assert_eq!(compose_plan(&[], 5), None);
        let big = 2 * MAX_COPY + 10;
        let plan = compose_plan(&[big], MIN_PART).unwrap();
        assert_eq!(plan.len(), 3);
        assert!(sizes(&plan).iter().all(|&(n, copied)| copied && (MIN_PART..=MAX_COPY).contains(&n)));
        assert_eq!(compose_plan(&vec![MIN_PART; 10_001], MIN_PART), None, "more than 10 000 parts: stream");

        // Any lengths: the parts cover every source in order, each part but the last has at
        // least the minimum, and at most `min` bytes are streamed per copied stretch.
        let mut seed = 0x9e3779b97f4a7c15u64;
        for _ in 0..2_000 {
            let mut next = |m: u64| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (seed >> 33) % m
            };
            let n = 1 + next(7) as usize;
            let lens: Vec<u64> = (0..n).map(|_| [0, 1, 4, 5, 6, 9, 10, 11, 23][next(9) as usize]).collect();
            let Some(plan) = compose_plan(&lens, 5) else {
                assert!(lens.iter().sum::<u64>() == 0 || lens.iter().filter(|&&l| l > 0).count() > 1, "{lens:?}");
                continue;
            };
            let mut at = vec![0u64; n];
            let mut order = Vec::new();
            for p in &plan {
                let ranges = match p {
                    Piece::Copy { src, range } => vec![(*src, range.clone())],
                    Piece::Stream(rs) => rs.clone(),
                };
                for (src, r) in ranges {
                    assert_eq!(r.start, at[src], "{lens:?} {plan:?}");
                    assert!(r.end > r.start);
                    at[src] = r.end;
                    order.push(src);
                }
            }
            assert_eq!(at, lens, "every byte once: {plan:?}");
            assert!(order.windows(2).all(|w| w[0] <= w[1]), "in order: {plan:?}");
            let sz = sizes(&plan);
            assert!(sz[..sz.len() - 1].iter().all(|&(b, _)| b >= 5), "{lens:?} {plan:?}");
        }
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
