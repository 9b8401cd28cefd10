//! Upload bytes: the [`BlobStore`] trait and its local-file implementation.
//!
//! A blob is addressed only by an upload id (never by a client-supplied name). Writers append;
//! the catalog decides which prefix of a blob is real (DESIGN §2), so stores may hold garbage
//! past the recorded offset, which recovery truncates.

use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;

pub mod conformance;
mod direct;
pub mod fs;
pub mod s3;

pub use fs::FsBlobStore;
pub use s3::S3BlobStore;

/// A stream of byte chunks read from a blob.
pub type ByteStream = Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send>>;

/// Resolves once the bytes a [`BlobWriter::start_sync`] covered are durable, with the blob
/// state describing exactly those bytes.
pub type SyncFuture = Pin<Box<dyn std::future::Future<Output = BlobResult<BlobState>> + Send>>;

/// The blob store's own record of a blob's durable bytes, returned by its writer and committed
/// by the caller's fenced checkpoint together with offset and midstate (DESIGN §2 "blob state
/// in the checkpoint"; the caller keeps it, as object_store's `MultipartStore` makes the caller
/// keep the part list). Opaque to everyone but the store that made it; versioned by its first
/// byte so a store can read states it wrote in older formats.
///
/// - fs (version 1): the durable length, u64 little-endian.
/// - S3 (version 2): the multipart id, the ordered part list (`size, content_id`) and the
///   tail segments ([`s3`]).
///
/// The empty state means "nothing written yet" (a new upload, or a row from before blob
/// states existed); stores must accept it wherever they accept a state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobState(pub Vec<u8>);

impl BlobState {
    /// The fs store's state: version 1, durable length.
    pub fn fs(len: u64) -> BlobState {
        let mut v = Vec::with_capacity(9);
        v.push(1);
        v.extend_from_slice(&len.to_le_bytes());
        BlobState(v)
    }

    /// The durable length recorded by [`BlobState::fs`]; `Some(0)` for the empty state;
    /// `None` for a state of another format.
    pub fn fs_len(&self) -> Option<u64> {
        match self.0.as_slice() {
            [] => Some(0),
            [1, rest @ ..] => Some(u64::from_le_bytes(rest.try_into().ok()?)),
            _ => None,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// A state in two pieces ([`crate::framed`]; DESIGN §2 "the part list out of the hot row"):
    /// a small `head` every holder needs and an append-only list of `entries` (S3: one per
    /// uploaded part) only a writer and a finisher need. The catalog keeps the head in the
    /// upload's row ([`BlobState::row`]) and the entries beside it, appending those a
    /// checkpoint adds ([`BlobState::entries_from`]), so reads of the row fetch no entry.
    pub fn framed(head: &[u8], entries: &[Vec<u8>]) -> BlobState {
        BlobState(crate::framed::encode(head, entries))
    }

    /// `(head, entries)` of a [`BlobState::framed`] state; `None` for a state of another
    /// layout; [`BlobError::BadState`] for a framed state that is cut (a row read alone,
    /// [`BlobState::row`], is one) or has bytes past its entries.
    pub fn unframe(&self) -> BlobResult<Option<crate::framed::Framed<'_>>> {
        crate::framed::unframe(&self.0).map_err(|_| BlobError::BadState)
    }

    /// What the catalog keeps in the upload's row ([`crate::framed::split`]).
    pub fn row(&self) -> &[u8] {
        crate::framed::split(&self.0).0
    }

    /// The entries of a framed state (empty for any other state or a malformed one).
    pub fn entries(&self) -> Vec<&[u8]> {
        crate::framed::split(&self.0).1
    }

    /// Whether this is a row read alone whose entries the catalog keeps beside it
    /// ([`crate::framed::lacks_entries`]): [`crate::catalog::Catalog::upload_blob_state`]
    /// gives the whole state.
    pub fn lacks_entries(&self) -> bool {
        crate::framed::lacks_entries(&self.0)
    }

    /// The whole state from a row and the entries kept beside it ([`crate::framed::join`]).
    pub fn join(row: &[u8], entries: &[Vec<u8>]) -> BlobState {
        BlobState(crate::framed::join(row, entries))
    }

    /// What a checkpoint replacing `committed` with `self` changes of the kept entries
    /// ([`crate::framed::entries_from`]; `crate::catalog::Checkpoint::blob_entries_from`).
    pub fn entries_from(&self, committed: &BlobState) -> Option<u32> {
        crate::framed::entries_from(&self.0, &committed.0)
    }
}

/// Blob store failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlobError {
    /// No blob with this id.
    #[error("blob not found")]
    NotFound,
    /// The requested range is not inside the blob.
    #[error("range {start}..{end} outside blob of {len} bytes")]
    OutOfRange { start: u64, end: u64, len: u64 },
    /// The backend failed (disk, network).
    #[error("blob backend: {0}")]
    Io(#[from] std::io::Error),
    /// A blob state this store cannot read (another store's, or corrupt).
    #[error("blob state is not one this store wrote")]
    BadState,
    /// The backend is away or refuses for now, after the store's own bounded retries: S3
    /// unreachable, answering 5xx / `SlowDown`, or refusing access (403). Nothing the caller
    /// committed was changed; the same call can succeed later.
    #[error("blob store unavailable: {0}")]
    Unavailable(String),
    /// The store's memory budget (S3: `[s3] max_buffer`, `limit` bytes) had no room for these
    /// bytes within `waited`: other uploads hold it. Nothing the caller committed was changed;
    /// the same call can succeed once they move on.
    #[error("no room in the blob store's memory budget ({limit} bytes) within {waited:?}: other uploads hold it")]
    NoRoom { limit: u64, waited: std::time::Duration },
    /// The backend refused the request for good (S3: a 4xx other than 404, 408, 409, 412 and
    /// 429, or 501 — credentials or a bucket policy that refuse, a request the store does not
    /// implement or accept): the same request gets the same answer until an operator changes
    /// the store or ferry's settings. Holds the request (`what`, e.g. `UploadPartCopy of
    /// bytes=0-5242879 into part 1`), the store's HTTP status and its error code (S3's
    /// `<Code>`, e.g. `NotImplemented`), never the store's error body. Nothing the caller
    /// committed was changed.
    #[error("the blob store refused {what} ({})", refused_answer(*status, code.as_deref()))]
    Refused { what: String, status: Option<u16>, code: Option<String> },
    /// The blob cannot grow past `most` bytes in this store: S3 holds at most 10 000 parts,
    /// and this upload's parts were cut `part_size` bytes each when its length was unknown
    /// (`[s3] deferred_part_size`). Nothing the caller committed was changed; the upload keeps
    /// what it has.
    #[error("the blob store holds at most {most} bytes for this upload (10 000 parts of {part_size} bytes)")]
    TooManyParts { most: u64, part_size: u64 },
    /// The store no longer has the bytes of this unfinished blob past byte `kept` (S3: its
    /// multipart upload was aborted behind ferry's back — a bucket lifecycle rule
    /// `AbortIncompleteMultipartUpload` — or the store refused for good to assemble it). The
    /// caller rolls the upload back to `kept` bytes ([`BlobStore::create`] for 0) and tells
    /// the client to resume from there.
    #[error("the blob store lost this upload's bytes past byte {kept}: {why}")]
    Lost { kept: u64, why: String },
    /// The writer's lease is no longer valid ([`WriteLease`]): it changed nothing in the store
    /// after that, and a request that returned after it is not part of any state.
    #[error("the writer's lease ran out; nothing more was written")]
    LeaseLost,
    /// The writer was asked to let go ([`WriteLease::cut`]) while it waited on the store, and
    /// the store did not answer within [`CUT_GRACE`]: the request was dropped. The writer is
    /// unusable afterwards; the committed state is untouched.
    #[error("the writer was asked to let go while the blob store did not answer")]
    Cut,
}

/// `503 SlowDown`, `404`, `NoSuchBucket`, `no answer`: how a store's answer is named (in
/// [`BlobError::Refused`], and by the S3 store's own errors).
pub(crate) fn refused_answer(status: Option<u16>, code: Option<&str>) -> String {
    match (status, code) {
        (Some(s), Some(c)) => format!("{s} {c}"),
        (Some(s), None) => s.to_string(),
        (None, Some(c)) => c.to_string(),
        (None, None) => "no answer".to_string(),
    }
}

/// How long a writer asked to let go ([`WriteLease::cut`]) still waits for a store request
/// in flight (and for the checkpoint of what it received) before it drops it: well under an
/// upload lease (10 s), so another process takes over within about one lease even when the
/// store hangs (DESIGN §2).
pub const CUT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// What a writer is told of the lease it writes under and of the upload it writes (DESIGN §2
/// "a lost lease is its own outcome").
#[derive(Clone)]
pub struct WriteLease {
    /// The most bytes the blob will hold: its `Upload-Length`; 0 while the length is deferred
    /// (or unknown). S3 sizes parts from it (a deferred length: `[s3] deferred_part_size`).
    pub size_hint: u64,
    /// The lease's fencing token (0 when none): S3 names the tail objects this writer writes
    /// with it, so two writers of one upload never write the same key.
    pub fence: u64,
    /// Which generation of writers this one belongs to: writers of one generation never
    /// write at once, writers of two may (one lost its lease without knowing, and the other
    /// took it over). Catalog leases count takeovers ([`crate::catalog::LeaseGrant::takeovers`]);
    /// in-process leases use the fence. S3 picks a part's number by its parity, so a stale part
    /// that lands late never replaces the taker's.
    pub generation: u64,
    /// Until when the lease is valid by the holder's own clock (`None`: for ever). A writer
    /// checks it before every change it makes to the store and after every request that
    /// returns: past it, [`BlobError::LeaseLost`] and nothing more is changed.
    pub valid_until: Arc<dyn Fn() -> Option<Instant> + Send + Sync>,
    /// Fires when the writer should let go (another request or process asked for the upload,
    /// or the server shuts down): a store request in flight gets [`CUT_GRACE`] more, then
    /// [`BlobError::Cut`].
    pub cut: tokio_util::sync::CancellationToken,
}

impl Default for WriteLease {
    fn default() -> Self {
        WriteLease { size_hint: 0, fence: 0, generation: 0, valid_until: Arc::new(|| None), cut: tokio_util::sync::CancellationToken::new() }
    }
}

impl std::fmt::Debug for WriteLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteLease")
            .field("size_hint", &self.size_hint)
            .field("fence", &self.fence)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl WriteLease {
    /// Whether the lease is still valid now.
    pub fn holds(&self) -> bool {
        (self.valid_until)().is_none_or(|t| Instant::now() < t)
    }

    /// `Ok` while the lease holds, else [`BlobError::LeaseLost`].
    pub fn check(&self) -> BlobResult<()> {
        if self.holds() {
            Ok(())
        } else {
            Err(BlobError::LeaseLost)
        }
    }

    /// Run store request `fut` under this lease: [`BlobError::Cut`] once [`WriteLease::cut`]
    /// fired and [`CUT_GRACE`] passed, [`BlobError::LeaseLost`] when the lease's validity
    /// runs out first or by the time the request returns (its result is then not used).
    pub async fn run<T>(&self, fut: impl std::future::Future<Output = BlobResult<T>>) -> BlobResult<T> {
        self.check()?;
        let cut = async {
            self.cut.cancelled().await;
            tokio::time::sleep(CUT_GRACE).await;
        };
        // The deadline moves while the lease is renewed: sleep to the one in force, then
        // look again.
        let lost = async {
            loop {
                match (self.valid_until)() {
                    Some(t) if Instant::now() < t => tokio::time::sleep_until(t.into()).await,
                    Some(_) => return,
                    None => std::future::pending::<()>().await,
                }
            }
        };
        let r = tokio::select! {
            r = fut => r,
            _ = cut => return Err(BlobError::Cut),
            _ = lost => return Err(BlobError::LeaseLost),
        };
        self.check()?;
        r
    }
}

impl BlobError {
    /// The error a [`ByteStream`] item carries, as a [`BlobError`]: a store puts a
    /// `BlobError` inside the `io::Error` (e.g. [`BlobError::Unavailable`] for an S3 outage
    /// in the middle of a read); anything else is [`BlobError::Io`].
    pub fn from_stream(e: std::io::Error) -> BlobError {
        if !e.get_ref().is_some_and(|inner| inner.is::<BlobError>()) {
            return BlobError::Io(e);
        }
        match e.into_inner().map(|inner| inner.downcast::<BlobError>()) {
            Some(Ok(b)) => *b,
            // Not reached: the inner error was checked to be a BlobError.
            Some(Err(other)) => BlobError::Io(std::io::Error::other(other)),
            None => BlobError::Io(std::io::Error::other("blob stream failed")),
        }
    }

    /// `self` inside an `io::Error`, for a [`ByteStream`] item ([`BlobError::from_stream`]
    /// recovers it).
    pub fn into_stream_error(self) -> std::io::Error {
        match self {
            BlobError::Io(e) => e,
            other => std::io::Error::other(other),
        }
    }
}

pub type BlobResult<T> = Result<T, BlobError>;

/// The right to remove blob `id`'s bytes ([`BlobStore::delete`]): evidence that no record
/// promises them to anyone any more — the catalog's row was deleted, tombstoned (terminated,
/// expired, failed) or never written — so removing them takes nothing from a client (DESIGN
/// §2: the row is the truth; the blob holds at least the bytes the row names).
///
/// `delete` takes one, so removing bytes without it does not compile. Only the catalog step
/// that released the row can say so, and the upload engine makes every one of them in one
/// file (`src/upload/removal.rs`): `tests/layers.rs` (`REMOVAL_GRANTORS`) fails when
/// [`Unreferenced::vouched`] is called anywhere else in `src/`.
#[derive(Debug)]
#[must_use = "an Unreferenced is the right to remove the bytes; pass it to BlobStore::delete"]
pub struct Unreferenced {
    id: String,
}

impl Unreferenced {
    /// Vouch that blob `id` is named by no record (see the type). Callers: only
    /// `upload::removal` (and tests of the stores themselves).
    pub fn vouched(id: impl Into<String>) -> Unreferenced {
        Unreferenced { id: id.into() }
    }

    /// The blob id whose bytes may go.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// Byte storage for uploads.
#[async_trait]
pub trait BlobStore: Send + Sync + 'static {
    /// Create an empty blob for a new upload `id` (one nothing was stored under yet; fs: a
    /// file that exists is truncated). Durable once this returns (in durable mode).
    async fn create(&self, id: &str) -> BlobResult<()>;

    /// Start unfinished blob `id` again from 0 bytes under `lease` (a roll-back to 0: the
    /// store lost its bytes). Every change is made while the lease holds ([`WriteLease::run`]),
    /// and a finished object is never removed (S3: its multipart uploads and tail go, and the
    /// `.created` marker is put back), so a holder whose lease ran out cannot erase what a
    /// later holder finished. Errors: [`BlobError::LeaseLost`] / [`BlobError::Cut`], I/O.
    async fn reset(&self, id: &str, lease: &WriteLease) -> BlobResult<()> {
        lease.run(self.create(id)).await
    }

    /// Open a writer that appends at byte `offset`, resuming from `state` — the blob state
    /// committed with that offset (empty for offset 0 or a legacy row) — under `lease`.
    /// Anything stored past `offset` is discarded (or, for object stores, ignored) first: this
    /// is the repair a lease taker runs. `NotFound` if the blob does not exist; `OutOfRange` if
    /// fewer than `offset` bytes survived (relaxed durability after a power loss; `len` says
    /// how many); `BadState` for a state this store did not write.
    async fn open_writer_under(&self, id: &str, offset: u64, state: &BlobState, lease: &WriteLease) -> BlobResult<Box<dyn BlobWriter>>;

    /// Whether a checkpoint's bytes may be lost after an OS crash or power cut (fs in relaxed
    /// durability, which syncs no checkpoint): then the blob can come back shorter than its
    /// checkpoint, or as long but with zeros where a file system persisted the size before
    /// the data. The upload engine checks such a blob against the checkpointed sha256
    /// midstate before it resumes it. `false` by default.
    fn checkpoints_unsynced(&self) -> bool {
        false
    }

    /// Whether [`BlobStore::read`] serves an unfinished blob's committed bytes (fs: they are
    /// in place, durable, readable at once). `false` for a store that can read only a finished
    /// object (S3: the parts of a multipart upload cannot be read before it is completed), so a
    /// follower of an unfinished upload waits for its completion
    /// ([`crate::upload::UploadEngine::follow`]).
    fn reads_unfinished(&self) -> bool {
        false
    }

    /// Bytes of the local disk that opening a writer at `offset` frees: what the blob holds past
    /// `offset`, which the writer discards (bytes of a writer killed mid-PATCH). `0` for a store
    /// that does not keep blobs on the local disk, or when it cannot tell.
    async fn held_past(&self, _id: &str, _offset: u64) -> u64 {
        0
    }

    /// [`BlobStore::open_writer_under`] a lease that never ends and no size hint (tests, tools).
    async fn open_writer(&self, id: &str, offset: u64, state: &BlobState) -> BlobResult<Box<dyn BlobWriter>> {
        self.open_writer_under(id, offset, state, &WriteLease::default()).await
    }

    /// Make the blob whole once the upload is complete: `state` is the one committed with
    /// the final offset (S3: complete the multipart upload from its part list; fs: nothing to
    /// do, the bytes are durable in place). Idempotent; after it, [`BlobStore::read`] serves
    /// every byte. `NotFound` if the blob does not exist.
    async fn finish(&self, id: &str, state: &BlobState) -> BlobResult<()>;

    /// Build unfinished blob `id` from the finished blobs `sources` (`(id, length in bytes)`,
    /// in order) inside the store, without the bytes passing through this process where the
    /// store can (S3: UploadPartCopy). Returns `false`, changing nothing, when this store or
    /// these lengths do not allow it (the caller then streams the bytes through a writer);
    /// `true` once `id` is finished as after [`BlobStore::finish`] with exactly those bytes,
    /// whatever it held before. Every change is made under `lease` (the final's write lease:
    /// [`BlobError::LeaseLost`] / [`BlobError::Cut`] once it is gone), and the finished object
    /// is never removed on the way: a composer that lost its lease can at most write the same
    /// bytes again. `NotFound` when a source is not (yet) a finished blob. Restartable: a call
    /// that failed part-way can be repeated.
    async fn compose(&self, id: &str, sources: &[(String, u64)], lease: &WriteLease) -> BlobResult<bool> {
        let _ = (id, sources, lease);
        Ok(false)
    }

    /// The store's memory budget now (S3: `[s3] max_buffer`; [`s3::BudgetStats`]), `None` for
    /// a store that keeps no bytes in memory (fs).
    fn memory(&self) -> Option<s3::BudgetStats> {
        None
    }

    /// Whether the store answers and accepts writes (for `/readyz`).
    async fn ping(&self) -> BlobResult<()>;

    /// The mark that ties this store to one catalog (`serve::check_store_mark`): the text
    /// kept under the store's root as [`STORE_MARK`] (fs: a file beside the blob directories;
    /// S3: an object under the prefix), `None` when there is none. Errors: I/O, an unreachable
    /// store.
    async fn mark(&self) -> BlobResult<Option<String>>;

    /// Keep `mark` as this store's mark (durably, replacing any). Errors: I/O, an unreachable
    /// store.
    async fn set_mark(&self, mark: &str) -> BlobResult<()>;

    /// `Ok` when the store answers and holds its mark ([`BlobStore::mark`]): it is there, and it
    /// is a catalog's store. A blob found absent is lost bytes only then. A store without its
    /// mark — a bucket deleted or misnamed (S3 answers a HEAD of any key in a missing bucket
    /// 404, as for a missing object), a disk that is not mounted — is not the store the uploads
    /// are in, and nothing it lacks is any upload's damage. Errors: [`BlobError::Refused`] when
    /// the mark is not there (or S3 says `NoSuchBucket`), the store's own errors when it is
    /// away.
    async fn confirm_present(&self) -> BlobResult<()> {
        match self.mark().await? {
            Some(_) => Ok(()),
            None => Err(BlobError::Refused {
                what: format!(
                    "to show its mark {STORE_MARK}, which a store keeps while it holds a \
                     catalog's uploads (a bucket deleted or renamed, a disk not mounted?)"
                ),
                status: None,
                code: Some("NoStoreMark".into()),
            }),
        }
    }

    /// Stored length in bytes, garbage past the catalog offset included; `None` if absent.
    async fn len(&self, id: &str) -> BlobResult<Option<u64>>;

    /// Cut the blob to `len` bytes (no-op if already that short) under `lease`, the writer's:
    /// a writer that lost it cuts nothing ([`BlobError::LeaseLost`] / [`BlobError::Cut`]).
    /// Durable once this returns.
    async fn truncate(&self, id: &str, len: u64, lease: &WriteLease) -> BlobResult<()>;

    /// Stream bytes `range` (half-open, in bytes). `OutOfRange` unless
    /// `range.start <= range.end <= len`. Never blocks writers or other readers.
    async fn read(&self, id: &str, range: Range<u64>) -> BlobResult<ByteStream>;

    /// Remove everything stored under `gone`'s id, finished or not (S3: the object, its
    /// markers, tail and multipart uploads; fs: the file) — only with the evidence that no
    /// record names it ([`Unreferenced`]). Durable once this returns (fs, durable mode: the
    /// unlink and then its directory's fsync), so a removal the caller reports done does not
    /// come back after a power cut. Idempotent: deleting an absent blob is `Ok`.
    async fn delete(&self, gone: &Unreferenced) -> BlobResult<()>;

    /// What the store holds, for `ferry check`'s search for orphans ([`Inventory`]). A
    /// listing, not a snapshot: blobs created or removed meanwhile may or may not appear.
    async fn inventory(&self) -> BlobResult<Inventory>;
}

/// Everything a blob store holds, by blob id ([`BlobStore::inventory`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Ids with anything stored (fs: the files under the root; S3: the distinct ids among the
    /// object keys under the prefix — finished objects, `.created` markers, tails), sorted,
    /// each once. Names that are no blob id (probes, temporary files) are left out.
    pub blobs: Vec<String>,
    /// Open multipart uploads: `(blob id, multipart upload id)` (S3: ListMultipartUploads
    /// under the prefix, first 1000; fs: none).
    pub multiparts: Vec<(String, String)>,
    /// Ids among `blobs` with something stored that only an unfinished blob keeps (S3: the
    /// `.created` marker, multipart markers, tail segments), sorted, each once; fs: none. For a
    /// finished or deleted upload these are leftovers.
    pub unfinished: Vec<String>,
}

/// The name of a store's mark ([`BlobStore::mark`]) under its root: never a blob id (it starts
/// with a dot), so `ferry check` never counts it as an orphan.
pub const STORE_MARK: &str = ".ferry-store-mark";

/// Whether `name` can be a blob id: 3 or more of `[a-z0-9_-]` (the only names stores use).
pub fn is_blob_id(name: &str) -> bool {
    name.len() >= 3 && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// An open append handle to one blob.
#[async_trait]
pub trait BlobWriter: Send {
    /// Append `data`. Not durable until [`BlobWriter::sync`] returns.
    async fn write(&mut self, data: Bytes) -> BlobResult<()>;

    /// Make every byte written so far durable (fsync in durable mode) and return the blob
    /// state that describes exactly them ([`BlobWriter::position`] bytes).
    async fn sync(&mut self) -> BlobResult<BlobState>;

    /// Hand what [`BlobWriter::write`] gathered for a batched write to the store now, without
    /// waiting for it and without making it durable. The appender calls it when a body goes
    /// quiet, so a slow upload does not keep its received bytes (and the receive buffers they
    /// point into) in memory until a batch fills. Default: nothing (a store that copies what
    /// it keeps holds no receive buffers).
    async fn flush(&mut self) -> BlobResult<()> {
        Ok(())
    }

    /// Start making every byte written so far durable and return without waiting for it:
    /// the future resolves once they are, with their blob state. Writes may continue
    /// meanwhile (they are not covered). The default waits for [`BlobWriter::sync`] first.
    async fn start_sync(&mut self) -> BlobResult<SyncFuture> {
        let state = self.sync().await?;
        Ok(Box::pin(std::future::ready(Ok(state))))
    }

    /// Discard everything past byte `len` (e.g. a chunk whose checksum failed) and continue
    /// appending from there. `len` must not exceed [`BlobWriter::position`].
    async fn rewind(&mut self, len: u64) -> BlobResult<()>;

    /// After a failed write or sync (a full disk): make durable the bytes that did reach the
    /// store before the failure, drop the rest, and continue appending after them. Returns the
    /// state describing exactly [`BlobWriter::position`] bytes afterwards, or `None` (changing
    /// nothing) when this store cannot tell which bytes it kept — the caller then falls back
    /// to its last committed state. The default is `None`. fs: the file's length is what the
    /// disk took; S3 (`None`): a part that failed was not stored, and the bytes of parts sent
    /// since the last commit cannot be read back to hash them while the store is away.
    async fn salvage(&mut self) -> BlobResult<Option<BlobState>> {
        Ok(None)
    }

    /// Make the blob whole from every byte written, which [`BlobWriter::sync`] made durable
    /// first (S3: upload the last part and complete the multipart upload; fs: nothing to do),
    /// and remove what only an unfinished blob needs. Afterwards [`BlobStore::read`] serves
    /// every byte. Runs *before* the catalog calls the upload finished (DESIGN §2 "complete,
    /// then commit"); idempotent, so a crash between the two is repaired by running it again.
    /// Returns the blob state the finished upload keeps in place of the last synced one, when
    /// a whole blob needs less (S3: the empty state — reads use the completed object, so the
    /// part list leaves the catalog row every HEAD, GET and list reads); `None` keeps it.
    /// Errors: [`BlobError::Lost`] when the store refuses for good or lost the bytes;
    /// [`BlobError::Unavailable`] when it is away (nothing changed that matters).
    async fn complete(&mut self) -> BlobResult<Option<BlobState>> {
        Ok(None)
    }

    /// `state` (one this writer synced, or the one last committed) amended with what this
    /// writer sent that may still be on its way to the store and must never be reused by a
    /// later writer, for the caller to commit under its fence (at the offset and midstate
    /// `state` goes with); `None` when there is nothing to add. Changes nothing in the store.
    /// The caller amends every state it commits (so a commit never takes back what an earlier
    /// one noted), commits the last committed state amended after a failure or a discard, and
    /// when [`BlobWriter::wants_numbers_noted`]. S3: the part numbers it took ([`s3::state`],
    /// "a part number is sent once"). Default: `None` (fs writes land in order on one file).
    fn amend(&mut self, state: &BlobState) -> Option<BlobState> {
        let _ = state;
        None
    }

    /// Whether this writer has sent enough since its last [`BlobWriter::amend`] or sync that
    /// the caller should commit the last committed state amended now (S3: [`s3::state::UNNOTED_NUMBERS`]
    /// part numbers), even where it may not commit bytes yet (a chunk checksum still to
    /// verify). Default: never.
    fn wants_numbers_noted(&self) -> bool {
        false
    }

    /// Bytes written so far, counted from the start of the blob.
    fn position(&self) -> u64;

    /// Bytes given to [`BlobWriter::write`] that the local disk does not hold yet (gathered in
    /// memory, or a batch being written): its free space does not show them (the free-space
    /// reserve counts them). `0` for a store that does not write to the local disk.
    fn unwritten(&self) -> u64 {
        0
    }

    /// A hint: the bytes this writer is about to be given run up to byte `end` of the blob (the
    /// request body's declared length, `Content-Length`). A store may then begin sending a
    /// piece whose bytes have not all arrived yet (S3: a part streamed while it is received);
    /// a hint that proves wrong (the body stops short) costs that work again, never a byte.
    /// Default: ignored.
    fn expecting(&mut self, end: u64) {
        let _ = end;
    }
}
