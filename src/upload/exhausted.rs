//! What the upload engine does when a resource runs out (DESIGN §9): the statuses clients get
//! (507 `insufficient_storage`, 503 `unavailable`), the free-space reserve checked before
//! bytes are accepted, deletes that free space even on a full disk, and the readiness report
//! behind `/readyz`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::Refusal;
use serde::Serialize;

use super::chunk::ChunkStream;
use super::{internal, UploadEngine};
use crate::blob::BlobError;
use crate::catalog::{CatalogError, UploadRecord};
use crate::exhaustion::{classify_chain, classify_io, Exhausted};

/// The last catalog failure that was an exhaustion, and when: `/readyz` reports it for
/// [`CATALOG_TROUBLE_FOR`] after it happened (then the catalog is assumed well again, so
/// readiness comes back by itself).
static CATALOG_TROUBLE: Mutex<Option<(Instant, String)>> = Mutex::new(None);
const CATALOG_TROUBLE_FOR: Duration = Duration::from_secs(5);

fn note_catalog_trouble(what: &str) {
    *CATALOG_TROUBLE.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), what.to_string()));
}

fn recent_catalog_trouble() -> Option<String> {
    CATALOG_TROUBLE.lock().unwrap_or_else(|p| p.into_inner()).as_ref().filter(|(at, _)| at.elapsed() < CATALOG_TROUBLE_FOR).map(|(_, w)| w.clone())
}

/// A blob store failure as the client sees it: no room → 507; too many open files, or a
/// store that is away or refusing (S3 unreachable, 5xx, `SlowDown`, 403) → 503
/// `unavailable` with `Retry-After`; anything else → 500 (logged).
pub(super) fn blob_error(e: BlobError) -> Refusal {
    let kind = match &e {
        BlobError::Io(io) => classify_io(io),
        BlobError::Unavailable(why) => {
            tracing::warn!(error = %why, "blob store unavailable");
            return Refusal::unavailable("the server's blob store (S3) is unreachable or refused the request; nothing stored was lost");
        }
        BlobError::Lost { kept, why } => {
            tracing::warn!(kept, error = %why, "blob store lost an unfinished upload's bytes; rolled back");
            return Refusal::new(
                409,
                crate::error::ErrorCode::OffsetMismatch,
                format!("the server's blob store no longer has this upload's bytes past offset {kept}: {why}"),
                crate::error::Next::Resume { soon: false },
            )
            .with_cursor(*kept);
        }
        BlobError::NoRoom { limit, waited } => {
            tracing::warn!(limit, "the S3 memory budget ([s3] max_buffer) is full: a request was told to retry");
            return Refusal::unavailable(format!(
                "the server's upload buffer for S3 ([s3] max_buffer, {} MiB) is full with other uploads' bytes \
                 and had no room within {}; nothing acknowledged was lost (an operator can raise [s3] max_buffer)",
                limit >> 20,
                crate::units::human_duration(*waited)
            ));
        }
        BlobError::Refused { what, status, code } => {
            let what = format!("{what} ({})", crate::blob::refused_answer(*status, code.as_deref()));
            tracing::error!(
                refused = %what,
                "the blob store refused a request for good: its configuration (credentials, bucket policy, features) needs an operator"
            );
            return Refusal::new(
                502,
                crate::error::ErrorCode::StoreRefused,
                format!(
                    "the server's blob store refused {what}; nothing stored was lost; the \
                     same request is refused until the store or the server's settings change"
                ),
                crate::error::Next::ByCode,
            );
        }
        BlobError::TooManyParts { most, part_size } => {
            tracing::warn!(most, part_size, "an upload of deferred length outgrew its S3 parts ([s3] deferred_part_size)");
            return Refusal::new(
                413,
                crate::error::ErrorCode::SizeExceeded,
                format!(
                    "this upload cannot grow past {most} bytes ({} GiB) on this server's S3 store: its length was not given when it \
                     began, so its bytes were cut into parts of {} MiB, and S3 holds at most 10 000 parts; nothing acknowledged was lost",
                    most >> 30,
                    part_size >> 20
                ),
                "Send the file again as a new upload that declares its length when it is created, \
                 so its parts are sized to fit; or an operator raises [s3] deferred_part_size.",
            );
        }
        BlobError::LeaseLost => return super::append::lease_lost(),
        BlobError::Cut => return Refusal::locked(None),
        _ => None,
    };
    match kind {
        Some(Exhausted::Space) => {
            tracing::warn!(error = %e, "blob store: no space left");
            Refusal::insufficient_storage("the server's disk is full (or its quota reached): these bytes could not be stored", None)
        }
        Some(Exhausted::Transient) => {
            tracing::warn!(error = %e, "blob store: out of file descriptors or memory");
            Refusal::unavailable("the server is briefly out of resources (open files); nothing was changed")
        }
        None => internal("blob store", e),
    }
}

/// A catalog failure as the client sees it: `Full` → 507, `Unavailable` → 503 (both were
/// rolled back), anything else → 500 (logged).
pub(super) fn catalog_error(e: CatalogError) -> Refusal {
    let kind = match &e {
        CatalogError::Full(_) => Some(Exhausted::Space),
        CatalogError::Unavailable(_) => Some(Exhausted::Transient),
        CatalogError::Backend(b) => classify_chain(b.as_ref()),
        _ => None,
    };
    match kind {
        Some(Exhausted::Space) => {
            tracing::warn!(error = %e, "catalog: no space left; the write was rolled back");
            note_catalog_trouble("the catalog cannot write: its disk is full");
            Refusal::insufficient_storage("the server's disk is full: the change could not be recorded and was rolled back", None)
        }
        Some(Exhausted::Transient) => {
            tracing::warn!(error = %e, "catalog unavailable; nothing was changed");
            note_catalog_trouble("the catalog failed a request (busy, restarting, or out of connections or file descriptors)");
            Refusal::unavailable("the server's catalog is unavailable for a moment (busy, restarting, or out of connections); nothing was changed")
        }
        None => internal("catalog", e),
    }
}

/// Most bytes of a refused PATCH body read and dropped so its client receives the 507.
const DRAIN_MAX: u64 = 1 << 30;
/// Longest wait for the next piece of a refused body.
const DRAIN_IDLE: Duration = Duration::from_secs(5);

/// Let go of a chunk refused before or while its bytes were read, without holding the answer
/// back:
/// - a client that waits for `100 Continue` and was sent none ([`ChunkStream::waits_to_send`])
///   is answered at once and sends nothing: the chunk is dropped unread;
/// - a client still sending reads the answer (with its cursor) now, while the rest of its
///   body is read and dropped in the background ([`drain`]); closing the connection instead
///   would reset it, and the answer could be lost with the unread bytes.
///
/// Must be called from within a tokio runtime.
pub(super) fn let_go<C: ChunkStream + Send + 'static>(mut chunk: C) {
    if chunk.waits_to_send() {
        return;
    }
    tokio::spawn(async move {
        drain(&mut chunk).await;
    });
}

/// Whether a chunk brings any byte: by its announced length when it has one (HTTP
/// `Content-Length`), else by reading up to its first non-empty piece (at most [`DRAIN_IDLE`]
/// per read; a stream that fails or goes quiet first counts as empty).
pub(super) async fn has_bytes<C: ChunkStream>(chunk: &mut C) -> bool {
    use futures::StreamExt;
    if let Some(n) = chunk.len_hint() {
        return n > 0;
    }
    loop {
        match tokio::time::timeout(DRAIN_IDLE, chunk.next()).await {
            Ok(Some(Ok(b))) if b.is_empty() => continue,
            Ok(Some(Ok(_))) => return true,
            _ => return false,
        }
    }
}

/// Read and drop the rest of a chunk, bounded by [`DRAIN_MAX`] bytes and [`DRAIN_IDLE`] per
/// read. Returns how many bytes it dropped.
async fn drain<C: ChunkStream>(chunk: &mut C) -> u64 {
    use futures::StreamExt;
    let mut dropped = 0u64;
    while dropped < DRAIN_MAX {
        match tokio::time::timeout(DRAIN_IDLE, chunk.next()).await {
            Ok(Some(Ok(b))) => dropped += b.len() as u64,
            _ => break,
        }
    }
    dropped
}

/// One store's part of the readiness report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// `catalog`, `blobs` or `free_space`.
    pub store: &'static str,
    pub ok: bool,
    /// Why not, for a person.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What `/readyz` answers: ready only when every check passes.
#[derive(Debug, Clone, Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub checks: Vec<Check>,
    /// Free bytes on the data directory's filesystem, and the reserve kept (when measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserve_bytes: Option<u64>,
}

/// Longest `/readyz` waits for one store's probe: 3 s (a fsync on a busy disk can take a second or two).
pub const READY_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// One writer's part in the shared free-space ledger while it streams bytes in (DESIGN §9; see
/// [`crate::exhaustion::SpaceLedger`]): all writers together take at most half of the room left
/// above the reserve between two measurements, so uploads sent at once stop at the reserve as
/// one does.
#[derive(Debug, Default)]
pub(crate) struct SpaceWatch {
    /// Bytes this writer had taken at its last check.
    written: u64,
    /// Its unflushed bytes as last noted in the ledger.
    held: u64,
    ledger: Option<std::sync::Arc<crate::exhaustion::SpaceLedger>>,
}

impl SpaceWatch {
    /// Before writing more: `Err(detail)` when the bytes up to `written` (this writer's total
    /// once they are written) would eat into the reserve — write none of them then.
    /// `unwritten`: how many of the bytes written so far the disk does not hold yet (free space
    /// does not show them).
    pub(crate) fn check(&mut self, reserve: &crate::exhaustion::SpaceReserve, written: u64, unwritten: u64) -> Result<(), String> {
        let n = written.saturating_sub(self.written);
        self.written = written;
        let ledger = self.ledger.get_or_insert_with(|| reserve.ledger().clone());
        ledger.take(n, unwritten, &mut self.held, || reserve.measure())
    }
}

impl Drop for SpaceWatch {
    fn drop(&mut self) {
        if let Some(l) = &self.ledger {
            l.release(self.held);
        }
    }
}

impl UploadEngine {
    /// 507 when writing `bytes` more (0: anything at all) would eat into the free-space
    /// reserve; `cursor` is the durable offset of the upload concerned, if any.
    pub(crate) fn check_space(&self, bytes: u64, cursor: Option<u64>) -> Result<(), Refusal> {
        self.cfg.reserve.check(bytes).map_err(|detail| Refusal::insufficient_storage(detail, cursor))
    }

    /// Remove an upload's row and bytes, the row first ([`super::removal`]): deleting the row
    /// queues its bytes for removal in the same transaction, then they are removed (fs: the
    /// unlink and its directory's fsync) before this returns. If the catalog fails nothing
    /// changed and the client's retry does it all; if the blob store fails (S3 away) the upload
    /// is gone all the same and its bytes stay queued until a sweep removes them — never a row
    /// without its bytes, never bytes without a record.
    ///
    /// One exception: on a disk so full that the catalog cannot write even the deletion
    /// (`CatalogError::Full`), the bytes go first to make room — the only order that can
    /// succeed there — and then the row.
    pub(super) async fn delete_record_and_bytes(&self, rec: &UploadRecord) -> Result<(), Refusal> {
        self.fences.forget(&rec.id);
        let gone = match self.delete_row(&rec.id).await {
            Ok(gone) => gone,
            Err(CatalogError::Full(e)) => {
                tracing::warn!(
                    upload = rec.id,
                    error = %e,
                    "the catalog cannot write on this full disk: removing the upload's bytes first to make room"
                );
                self.blobs.delete(&UploadEngine::bytes_first_on_a_full_disk(&rec.id)).await?;
                self.delete_row(&rec.id).await?
            }
            Err(e) => return Err(e.into()),
        };
        self.remove_bytes_later_if_need_be(&gone).await;
        Ok(())
    }

    /// Every store's state (`/readyz`): the catalog answers and has not failed a write in
    /// the last few seconds; the blob store can write and sync ([`crate::blob::BlobStore::ping`]); free space is
    /// above the reserve. Each comes back by itself when the resource does. The catalog and
    /// blob probes run at once, each bounded by [`READY_PROBE_TIMEOUT`]: a store that hangs
    /// (a frozen S3 or database) answers not ready within that, not after the store's own
    /// request timeouts, so a prober's timeout (Kubernetes' default is 1 s, typical ones a few
    /// seconds) sees an answer.
    pub async fn readiness(&self) -> Readiness {
        let mut checks = Vec::new();
        let late = || format!("did not answer within {}", crate::units::human_duration(READY_PROBE_TIMEOUT));
        let (catalog, blobs) = tokio::join!(
            tokio::time::timeout(READY_PROBE_TIMEOUT, self.catalog.ping()),
            tokio::time::timeout(READY_PROBE_TIMEOUT, self.blobs.ping())
        );
        let catalog = match catalog {
            Err(_) => Some(format!("the catalog {}", late())),
            Ok(Err(e)) => Some(format!("the catalog does not answer: {e}")),
            Ok(Ok(())) => recent_catalog_trouble(),
        };
        checks.push(Check { store: "catalog", ok: catalog.is_none(), reason: catalog });
        let blobs = match blobs {
            Err(_) => Some(format!("the blob store {}", late())),
            Ok(Err(e)) => Some(format!("the blob store cannot write: {e}")),
            Ok(Ok(())) => None,
        };
        checks.push(Check { store: "blobs", ok: blobs.is_none(), reason: blobs });
        let space = self.cfg.reserve.measure();
        if let Some(s) = space {
            let low = s.available <= s.reserve;
            let reason = low.then(|| {
                format!(
                    "free space is below the reserve: {} bytes free, {} kept in reserve; new uploads are refused with 507",
                    s.available, s.reserve
                )
            });
            checks.push(Check { store: "free_space", ok: !low, reason });
        }
        Readiness { ready: checks.iter().all(|c| c.ok), checks, free_bytes: space.map(|s| s.available), reserve_bytes: space.map(|s| s.reserve) }
    }
}
