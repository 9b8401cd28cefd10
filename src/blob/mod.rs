//! Upload bytes: the [`BlobStore`] trait and its local-file implementation.
//!
//! A blob is addressed only by an upload id (never by a client-supplied name). Writers append;
//! the catalog decides which prefix of a blob is real (DESIGN §2), so stores may hold garbage
//! past the recorded offset, which recovery truncates.

use std::ops::Range;
use std::pin::Pin;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;

pub mod conformance;
pub mod fs;

pub use fs::FsBlobStore;

/// A stream of byte chunks read from a blob.
pub type ByteStream = Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send>>;

/// Resolves once the bytes a [`BlobWriter::start_sync`] covered are durable.
pub type SyncFuture = Pin<Box<dyn std::future::Future<Output = BlobResult<()>> + Send>>;

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
}

pub type BlobResult<T> = Result<T, BlobError>;

/// Byte storage for uploads.
#[async_trait]
pub trait BlobStore: Send + Sync + 'static {
    /// Create an empty blob for `id`. If one exists it is truncated to 0 bytes.
    /// Durable once this returns (in durable mode).
    async fn create(&self, id: &str) -> BlobResult<()>;

    /// Open a writer that appends at byte `offset`. Anything stored past `offset` is
    /// discarded first. `NotFound` if the blob does not exist; `OutOfRange` if the blob is
    /// shorter than `offset`.
    async fn open_writer(&self, id: &str, offset: u64) -> BlobResult<Box<dyn BlobWriter>>;

    /// Stored length in bytes, garbage past the catalog offset included; `None` if absent.
    async fn len(&self, id: &str) -> BlobResult<Option<u64>>;

    /// Cut the blob to `len` bytes (no-op if already that short). Durable once this returns.
    async fn truncate(&self, id: &str, len: u64) -> BlobResult<()>;

    /// Stream bytes `range` (half-open, in bytes). `OutOfRange` unless
    /// `range.start <= range.end <= len`. Never blocks writers or other readers.
    async fn read(&self, id: &str, range: Range<u64>) -> BlobResult<ByteStream>;

    /// Remove the blob. Idempotent: deleting an absent blob is `Ok`.
    async fn delete(&self, id: &str) -> BlobResult<()>;
}

/// An open append handle to one blob.
#[async_trait]
pub trait BlobWriter: Send {
    /// Append `data`. Not durable until [`BlobWriter::sync`] returns.
    async fn write(&mut self, data: Bytes) -> BlobResult<()>;

    /// Make every byte written so far durable (fsync in durable mode).
    async fn sync(&mut self) -> BlobResult<()>;

    /// Start making every byte written so far durable and return without waiting for it:
    /// the future resolves once they are. Writes may continue meanwhile (they are not
    /// covered). The default waits for [`BlobWriter::sync`] first.
    async fn start_sync(&mut self) -> BlobResult<SyncFuture> {
        self.sync().await?;
        Ok(Box::pin(std::future::ready(Ok(()))))
    }

    /// Discard everything past byte `len` (e.g. a chunk whose checksum failed) and continue
    /// appending from there. `len` must not exceed [`BlobWriter::position`].
    async fn rewind(&mut self, len: u64) -> BlobResult<()>;

    /// Bytes written so far, counted from the start of the blob.
    fn position(&self) -> u64;
}
