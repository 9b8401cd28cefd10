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

mod compose;
pub mod state;
mod writer;

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::BytesMut;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::{HttpConnector, ReqwestConnector};
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use object_store::{BackoffConfig, GetOptions, GetRange, MultipartId, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use object_store::{ClientConfigKey, ClientOptions};

pub use state::{fixed_part_size, DEFAULT_PART_FLOOR, MAX_PART, MAX_PARTS, MIN_PART};
use state::{S3State, Schedule, Segment};
use writer::{Budget, Parked, S3Writer};

use super::{BlobError, BlobResult, BlobState, BlobStore, BlobWriter, ByteStream, WriteLease};

/// The default store-wide bound on buffered part bytes (`[s3] max_buffer`): 512 MiB.
pub const DEFAULT_MAX_BUFFER: u64 = 512 << 20;

/// The S3 store's settings (`[s3]` in ferry.toml, `--s3-*` flags), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct S3Settings {
    /// The smallest part size ([`fixed_part_size`]'s floor): 5 MiB..=5 GiB.
    pub part_size: u64,
    /// Most bytes of open parts buffered at once, across all uploads.
    pub max_buffer: u64,
}

impl Default for S3Settings {
    fn default() -> Self {
        S3Settings { part_size: DEFAULT_PART_FLOOR, max_buffer: DEFAULT_MAX_BUFFER }
    }
}

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

/// The same bounded retries as [`retry_config`] for the requests ferry signs and sends itself
/// (UploadPartCopy, the numbered CompleteMultipartUpload): 100 ms, 200 ms, 400 ms.
fn own_retries() -> backon::ExponentialBuilder {
    let r = retry_config();
    crate::retry::doubling(r.backoff.init_backoff, r.backoff.max_backoff).with_max_times(r.max_retries)
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
    // A key a DeleteObjects answer lists under `<Error>` (object_store's `DeleteFailed`):
    // judged by its S3 error code, as a single request's status would be.
    if let Some(at) = msg.find("DeleteObjects request failed for key").and_then(|_| msg.rfind("(code: ")) {
        let code = msg[at + "(code: ".len()..].trim_end_matches(')');
        return match code {
            "NoSuchKey" => Failure::NotFound,
            "AccessDenied" | "InternalError" | "ServiceUnavailable" | "SlowDown" | "RequestTimeout" | "OperationAborted" => Failure::Unavailable,
            // Garage and others name their own server-side failures (`ServerError`, …).
            c if c.contains("Internal") || c.contains("Unavailable") || c.starts_with("Serv") => Failure::Unavailable,
            _ => Failure::Other,
        };
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

/// Whether a blob error says something the state names is not there (an object, a tail
/// segment, a multipart upload): [`BlobError::NotFound`] or a [`corrupt`] read.
fn is_gone(e: &BlobError) -> bool {
    matches!(e, BlobError::NotFound) || matches!(e, BlobError::Io(io) if io.kind() == std::io::ErrorKind::NotFound)
}

fn is_not_found(e: &object_store::Error) -> bool {
    classify(e) == Failure::NotFound
}

/// What every writer, reader and composer of one S3 store shares: the client and its settings.
struct Inner {
    s3: AmazonS3,
    /// For the one request object_store does not offer (UploadPartCopy with a range; see
    /// [`Inner::copy_part`]), sent to a URL object_store signs.
    http: reqwest::Client,
    bucket: String,
    prefix: String,
    /// The smallest part size (`[s3] part_size`): see [`fixed_part_size`].
    floor: u64,
    /// Where ListMultipartUploads goes ([`Inner::unmarked_multiparts`]).
    listing: Listing,
    /// Store-wide bound on the bytes of open parts (`[s3] max_buffer`).
    budget: Budget,
    /// Open parts of writers that ended, for the next writer of the same upload here.
    parked: Parked,
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
    fn segment(&self, id: &str, seg: &Segment) -> Path {
        self.key(&format!("{id}.tail/{}", seg.name()))
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
        Ok(self.multiparts_under(&key).await?.into_iter().filter(|(k, _)| *k == key).map(|(_, u)| u).collect())
    }

    /// `(Key, UploadId)` of the unfinished multipart uploads whose key starts with `key`
    /// (ListMultipartUploads, its first page: up to 1000), signed with object_store's own
    /// credentials.
    async fn multiparts_under(&self, key: &str) -> Result<Vec<(String, String)>, String> {
        let mut url = url::Url::parse(&self.listing.bucket_url).map_err(|e| e.to_string())?;
        url.query_pairs_mut().append_pair("prefix", key).append_pair("uploads", "");
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
        Ok(parse_uploads(&body))
    }

    /// The blob id a key under the prefix belongs to (`<id>`, `<id>.created`, `<id>.mpu/…`,
    /// `<id>.tail/…`), `None` for keys outside the prefix or that name no blob (the probe).
    fn id_of(&self, key: &str) -> Option<String> {
        let name = if self.prefix.is_empty() { key } else { key.strip_prefix(self.prefix.as_str())?.strip_prefix('/')? };
        let id = name.split(['.', '/']).next()?;
        super::is_blob_id(id).then(|| id.to_string())
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
        self.parked.forget(id);
        self.abort_multiparts(id, None).await?;
        self.delete_segments(id, &HashSet::new()).await?;
        self.delete_quiet(&self.object(id)).await?;
        self.delete_quiet(&self.created(id)).await
    }

    async fn read_segments(&self, id: &str, segs: &[Segment], buf: &mut BytesMut) -> BlobResult<()> {
        buf.reserve(segs.iter().map(Segment::len).sum::<u64>() as usize);
        for s in segs {
            let got = bounded(REQUEST_DEADLINE, self.s3.get(&self.segment(id, s))).await.map_err(|e| corrupt(e, "a tail segment"))?;
            let b = bounded(deadline_for(s.len()), got.bytes()).await.map_err(io)?;
            if b.len() as u64 != s.len() {
                return Err(BlobError::Io(std::io::Error::other(format!("tail segment {} has {} bytes", s.name(), b.len()))));
            }
            buf.extend_from_slice(&b);
        }
        Ok(())
    }

    /// Once the object is whole: every multipart upload of `id` (the completed one answers
    /// `NoSuchUpload`, which is fine), its markers, the tail and the `.created` marker go, in
    /// that order (the marker last: while it exists, a repeated finish finds the rest).
    async fn finished_cleanup(&self, id: &str) -> BlobResult<()> {
        self.parked.forget(id);
        self.abort_multiparts(id, None).await?;
        self.delete_segments(id, &HashSet::new()).await?;
        self.delete_quiet(&self.created(id)).await
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
        BlobError::Io(std::io::Error::new(std::io::ErrorKind::NotFound, format!("{what} named by the blob state is missing")))
    } else {
        io(e)
    }
}

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
        let listing_http = ReqwestConnector::default().connect(&ClientOptions::new().with_allow_http(allow_http)).map_err(|e| anyhow::anyhow!("configuring S3 for {url}: {e}"))?;
        let listing = Listing { bucket_url: format!("{}/{bucket}", endpoint.trim_end_matches('/')), region, http: listing_http };
        let s3 = b.with_retry(retry_config()).build().map_err(|e| anyhow::anyhow!("configuring S3 for {url}: {e}"))?;
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).build().map_err(|e| anyhow::anyhow!("HTTP client for {url}: {e}"))?;
        let inner = Inner {
            s3,
            http,
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            floor: part_floor,
            listing,
            budget: Budget::new(DEFAULT_MAX_BUFFER),
            parked: Parked::default(),
        };
        Ok(S3BlobStore { inner: Arc::new(inner) })
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
            let st = decoded.unwrap_or_else(|| S3State::new(Schedule::Fixed(fixed_part_size(len, s.floor))));
            let mut w = S3Writer::new(s.clone(), id, st, BytesMut::new(), Vec::new(), lease);
            w.completed_len = Some(len);
            return Ok(Box::new(w));
        }
        lease.run(async { bounded(REQUEST_DEADLINE, s.s3.put(&s.created(id), PutPayload::new())).await.map_err(io) }).await?;
        let fresh = S3State::new(Schedule::Fixed(fixed_part_size(lease.size_hint.max(offset), s.floor)));
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
        let mut tail = BytesMut::new();
        s.read_segments(id, &st.segments(), &mut tail).await?;
        match &st.multipart {
            None => bounded(deadline_for(tail.len() as u64), s.s3.put(&s.object(id), PutPayload::from(tail.freeze()))).await.map(drop).map_err(io),
            Some(mp) => {
                let mpid = MultipartId::from(mp.clone());
                let mut parts = st.parts.clone();
                if !tail.is_empty() {
                    // The tail becomes the last part (S3 allows the last one to be short); the
                    // number of a part no writer used for it (fence parity 0 after one of 1).
                    let number = state::part_number(st.schedule, st.parts.len() as u64, st.parts.last().map_or(0, |p| u64::from(p.0) + 1));
                    let deadline = deadline_for(tail.len() as u64);
                    let pid = bounded(deadline, s.s3.put_part(&s.object(id), &mpid, number as usize - 1, PutPayload::from(tail.freeze()))).await.map_err(io)?;
                    parts.push((number, pid.content_id));
                }
                match s.complete_numbered(&s.object(id), mp, &parts).await {
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
        let under = if s.prefix.is_empty() { String::new() } else { format!("{}/", s.prefix) };
        let multiparts = s.multiparts_under(&under).await.map_err(BlobError::Unavailable)?;
        let multiparts = multiparts.into_iter().filter_map(|(k, u)| Some((s.id_of(&k)?, u))).collect();
        Ok(super::Inventory { blobs, multiparts })
    }

    async fn create(&self, id: &str) -> BlobResult<()> {
        let s = &self.inner;
        // An existing blob is reset: its multipart uploads, tail and object go.
        s.remove_all(id).await?;
        bounded(REQUEST_DEADLINE, s.s3.put(&s.created(id), PutPayload::new())).await.map_err(io)?;
        Ok(())
    }

    async fn open_writer_under(&self, id: &str, offset: u64, state: &BlobState, lease: &WriteLease) -> BlobResult<Box<dyn BlobWriter>> {
        let s = &self.inner;
        if let Some(part) = s.parked.take(id, state) {
            // This process wrote the committed state and kept its open part: no request at all.
            if part.st.offset() == offset {
                let mut w = S3Writer::new(s.clone(), id, part.st.clone(), BytesMut::new(), Vec::new(), lease);
                w.part = part;
                return Ok(Box::new(w));
            }
        }
        if s.exists(&s.created(id)).await?.is_none() {
            return self.reopen_finished(id, offset, state, lease).await;
        }
        let st = match S3State::decode(state)? {
            None if offset == 0 => S3State::new(Schedule::Fixed(fixed_part_size(lease.size_hint, s.floor))),
            None => return Err(BlobError::BadState),
            Some(st) if st.offset() == offset => st,
            Some(_) => return Err(BlobError::BadState),
        };
        let mut buf = BytesMut::with_capacity(st.open_part_size().min(64 << 20) as usize);
        let segs = st.segments();
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
        // Segments the committed state does not name are a crashed or superseded writer's.
        let keep: HashSet<Path> = segs.iter().map(|g| s.segment(id, g)).collect();
        lease.run(s.delete_segments(id, &keep)).await?;
        Ok(Box::new(S3Writer::new(s.clone(), id, st, buf, segs, lease)))
    }

    async fn finish(&self, id: &str, state: &BlobState) -> BlobResult<()> {
        let s = &self.inner;
        let st = S3State::decode(state)?.unwrap_or(S3State::new(Schedule::Fixed(s.floor)));
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

    async fn compose(&self, id: &str, sources: &[(String, u64)]) -> BlobResult<bool> {
        let lens: Vec<u64> = sources.iter().map(|s| s.1).collect();
        let Some(plan) = compose::plan_for(&lens, self.inner.floor) else { return Ok(false) };
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let bulk = |code: &str| format!("Generic S3 error: DeleteObjects request failed for key p/up/x.created: Internal error: Could not reach quorum (code: {code})");
        assert_eq!(classify_message(&bulk("InternalError")), Failure::Unavailable, "Garage under load");
        assert_eq!(classify_message(&bulk("ServerError")), Failure::Unavailable);
        assert_eq!(classify_message(&bulk("SlowDown")), Failure::Unavailable);
        assert_eq!(classify_message(&bulk("NoSuchKey")), Failure::NotFound);
        assert_eq!(classify_message(&bulk("MalformedXML")), Failure::Other);
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
}
