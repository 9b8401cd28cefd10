//! `ferry check` and the `check` task kind: re-read finished files from the blob store and
//! compare each with the sha256 the catalog recorded when it finished (DESIGN §7), and look for
//! orphans — blobs no catalog row names, S3 multipart uploads nothing references.
//!
//! Read-only unless asked: with [`CheckOptions::repair_catalog`] a finished upload whose bytes
//! do not match (or are missing) gets a damage mark in the catalog ([`Catalog::set_damage`]),
//! after which downloads answer `500 damaged` instead of serving wrong bytes; a marked upload
//! whose bytes are whole again loses its mark. Nothing ever deletes or rewrites bytes: orphans
//! are reported, never removed.
//!
//! Works on every catalog and blob store through their traits only ([`Catalog`],
//! [`BlobStore`]), so the CLI (its own process, on the stores a server uses) and the task
//! engine (inside the server) run the same code.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::blob::{BlobError, BlobState, BlobStore};
use crate::catalog::{BlobClaim, Catalog, CatalogError, Damage, UploadRecord};

/// Rows read from the catalog per page.
const PAGE: u32 = 500;

/// How long a blob no catalog record names is given to get its row before it is reported as
/// an orphan ([`Checker::orphans`]): a server creating an upload makes the blob, then the row,
/// a few milliseconds apart (longer when the catalog is busy).
pub const ORPHAN_SETTLE: Duration = Duration::from_secs(3);

/// What to check.
#[derive(Debug, Clone, Default)]
pub struct CheckOptions {
    /// Upload ids to check; empty = every finished upload, plus the search for orphans.
    pub ids: Vec<String>,
    /// Mark damaged uploads in the catalog (and clear marks of uploads found whole).
    pub repair_catalog: bool,
    /// Most bytes read per second; `None` = as fast as the store answers.
    pub rate: Option<u64>,
    /// Only this principal's uploads (the `check` task kind); `None` = everyone's (the CLI).
    /// Other principals' ids asked for are skipped as `unknown`.
    pub principal: Option<String>,
}

/// One finished upload to re-read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub id: String,
    /// Bytes.
    pub size: u64,
    /// Lowercase hex, as the upload finished with.
    pub sha256: String,
    #[serde(skip)]
    blob_state: Vec<u8>,
}

/// A finished upload whose bytes are all there but hash to something else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mismatch {
    pub id: String,
    pub size: u64,
    /// Lowercase hex: what the upload finished with.
    pub expected_sha256: String,
    /// Lowercase hex: what the stored bytes hash to now.
    pub actual_sha256: String,
}

/// A finished upload whose blob (or bytes at its end) is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Missing {
    pub id: String,
    pub size: u64,
    /// Bytes the store still has (`0` when the blob is gone altogether).
    pub stored: u64,
}

/// A finished upload whose bytes are whole but whose blob holds more after them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Longer {
    pub id: String,
    /// The upload's length in bytes.
    pub size: u64,
    /// Bytes the store holds.
    pub stored: u64,
}

/// An S3 multipart upload no unfinished upload references.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrphanMultipart {
    /// The blob id it was created for.
    pub id: String,
    /// S3's `UploadId`.
    pub upload_id: String,
}

/// An id that was asked for and not checked, with why: `unknown` (no such upload),
/// `unfinished`, `expired` (a tombstone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub id: String,
    pub reason: String,
}

/// A file the check could not read for a reason other than damage (the store away, an I/O
/// error): neither whole nor damaged as far as anyone knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unchecked {
    pub id: String,
    pub error: String,
}

/// The summary `ferry check --json` prints and a `check` task returns (README "ferry check").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    /// Finished uploads re-read to the end.
    pub files_checked: u64,
    /// Bytes read from the blob store.
    pub bytes_read: u64,
    /// Files whose bytes hash to their sha256.
    pub ok: u64,
    pub mismatched: Vec<Mismatch>,
    pub missing: Vec<Missing>,
    /// Files deleted (or expired) by a live server while this check read them: not checked,
    /// and no damage.
    #[serde(default)]
    pub deleted_while_read: u64,
    /// Whole files whose blob holds bytes past their end (nothing lost; reported, never cut).
    #[serde(default)]
    pub longer: Vec<Longer>,
    /// Whether orphans were searched for (only when no ids were given).
    pub orphans_searched: bool,
    /// Blob ids no catalog row names.
    pub orphan_blobs: Vec<String>,
    pub orphan_multiparts: Vec<OrphanMultipart>,
    /// Finished uploads whose blob keeps objects only an unfinished one needs (S3).
    #[serde(default)]
    pub leftovers: Vec<String>,
    pub skipped: Vec<Skipped>,
    pub unchecked: Vec<Unchecked>,
    /// Ids this run marked damaged (`--repair-catalog`).
    pub marked_damaged: Vec<String>,
    /// Ids whose damage mark this run removed: their bytes are whole again.
    pub cleared_damage: Vec<String>,
}

impl CheckReport {
    /// Whether a finished file's bytes mismatch or are missing.
    pub fn damage_found(&self) -> bool {
        !self.mismatched.is_empty() || !self.missing.is_empty()
    }

    /// Whether an orphan, or bytes stored past the end of a whole file, were found: bytes no
    /// upload needs.
    pub fn orphans_found(&self) -> bool {
        !self.orphan_blobs.is_empty() || !self.orphan_multiparts.is_empty() || !self.longer.is_empty() || !self.leftovers.is_empty()
    }
}

/// Failures that stop a check: the catalog cannot be read (or written, when repairing), the
/// blob store cannot be listed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("catalog: {0}")]
    Catalog(#[from] CatalogError),
    #[error("blob store: {0}")]
    Blob(#[from] BlobError),
    #[error("cancelled")]
    Cancelled,
}

/// What a check reports while it runs (the CLI's progress bar, the task's progress).
pub trait Observer: Send + Sync {
    /// `n` more bytes were read.
    fn read(&self, n: u64) {
        let _ = n;
    }
}

/// No progress reporting.
pub struct Quiet;
impl Observer for Quiet {}

/// Keeps reads under a rate: after `done` bytes, at least `done / rate` seconds have passed.
struct Pacer {
    rate: Option<u64>,
    start: Instant,
    done: u64,
}

impl Pacer {
    fn new(rate: Option<u64>) -> Pacer {
        Pacer { rate: rate.filter(|r| *r > 0), start: Instant::now(), done: 0 }
    }

    async fn add(&mut self, n: u64) {
        self.done += n;
        if let Some(rate) = self.rate {
            let due = Duration::from_secs_f64(self.done as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(self.start.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// The check's view of the stores.
pub struct Checker {
    catalog: Arc<dyn Catalog>,
    blobs: Arc<dyn BlobStore>,
    opts: CheckOptions,
}

impl Checker {
    pub fn new(catalog: Arc<dyn Catalog>, blobs: Arc<dyn BlobStore>, opts: CheckOptions) -> Checker {
        Checker { catalog, blobs, opts }
    }

    /// The finished uploads to re-read, in id order, and the ids asked for that are not
    /// (recorded in `report.skipped`).
    pub async fn targets(&self, report: &mut CheckReport) -> Result<Vec<Target>, CheckError> {
        let target = |r: &UploadRecord| Target {
            id: r.id.clone(),
            size: r.length.unwrap_or(r.offset),
            sha256: r.sha256.map(hex::encode).unwrap_or_default(),
            blob_state: r.blob_state.clone(),
        };
        let mut out = Vec::new();
        if self.opts.ids.is_empty() {
            let mut after = String::new();
            loop {
                let page = self.catalog.list_uploads_after(&after, PAGE).await?;
                let Some(last) = page.last() else { break };
                after = last.id.clone();
                out.extend(page.iter().filter(|r| r.is_finished() && !r.expired && r.sha256.is_some() && self.mine(r)).map(target));
            }
        } else {
            let mut ids = self.opts.ids.clone();
            ids.sort();
            ids.dedup();
            for id in ids {
                let reason = match self.catalog.get_upload(&id).await? {
                    Some(r) if !self.mine(&r) => "unknown",
                    None => "unknown",
                    Some(r) if r.expired => "expired",
                    Some(r) if !r.is_finished() || r.sha256.is_none() => "unfinished",
                    Some(r) => {
                        out.push(target(&r));
                        continue;
                    }
                };
                report.skipped.push(Skipped { id, reason: reason.into() });
            }
        }
        Ok(out)
    }

    fn mine(&self, r: &UploadRecord) -> bool {
        self.opts.principal.as_ref().is_none_or(|p| *p == r.principal)
    }

    /// Re-read one finished upload and record what was found (and, when repairing, mark or
    /// clear its damage).
    pub async fn check_one(&self, t: &Target, report: &mut CheckReport, pace: &mut PaceState, obs: &dyn Observer) -> Result<(), CheckError> {
        let found = match self.reread(t, pace, obs, report).await {
            Ok(f) => f,
            Err(e) => {
                report.unchecked.push(Unchecked { id: t.id.clone(), error: e.to_string() });
                return Ok(());
            }
        };
        if !matches!(&found, Found::Whole(actual) if *actual == t.sha256) && !self.still_finished(t).await? {
            // Deleted (or expired) while it was read, beside a live server: its bytes went
            // with it, after its row — no damage (issue 48).
            report.deleted_while_read += 1;
            return Ok(());
        }
        report.files_checked += 1;
        let damage = match found {
            Found::Whole(actual) if actual == t.sha256 => {
                report.ok += 1;
                None
            }
            Found::Whole(actual) => {
                let detail = format!("sha256 of the stored bytes is {actual}, the upload finished with {}", t.sha256);
                report.mismatched.push(Mismatch { id: t.id.clone(), size: t.size, expected_sha256: t.sha256.clone(), actual_sha256: actual });
                Some(Damage { kind: "sha256_mismatch".into(), detail, found_at_ms: crate::upload::now_ms() })
            }
            Found::Short(stored) => {
                // Bytes are missing only from a store that is there: without its mark (a bucket
                // deleted or misnamed, a disk not mounted) every file would look missing, and
                // `--repair-catalog` would mark them all. The check stops instead.
                self.blobs.confirm_present().await?;
                let detail = format!("the blob store has {stored} of the upload's {} bytes", t.size);
                report.missing.push(Missing { id: t.id.clone(), size: t.size, stored });
                Some(Damage { kind: "missing".into(), detail, found_at_ms: crate::upload::now_ms() })
            }
        };
        if damage.is_none() {
            // Whole; bytes stored past its end are reported (nothing is lost, but something
            // wrote where it should not have, or a removal was cut short).
            if let Ok(Some(stored)) = self.blobs.len(&t.id).await {
                if stored > t.size {
                    report.longer.push(Longer { id: t.id.clone(), size: t.size, stored });
                }
            }
        }
        if self.opts.repair_catalog {
            match damage {
                Some(d) => {
                    if self.catalog.set_damage(&t.id, Some(&d)).await? {
                        report.marked_damaged.push(t.id.clone());
                    }
                }
                None => {
                    if self.catalog.damage(&t.id).await?.is_some() && self.catalog.set_damage(&t.id, None).await? {
                        report.cleared_damage.push(t.id.clone());
                    }
                }
            }
        }
        Ok(())
    }

    async fn reread(&self, t: &Target, pace: &mut PaceState, obs: &dyn Observer, report: &mut CheckReport) -> Result<Found, BlobError> {
        let mut stream = match self.blobs.read(&t.id, 0..t.size).await {
            Ok(s) => s,
            Err(BlobError::OutOfRange { .. } | BlobError::NotFound) if !t.blob_state.is_empty() => {
                // Finished in the catalog but not made whole yet (S3: a crash between the
                // commit and the completion): what the first download would do.
                match self.blobs.finish(&t.id, &BlobState(t.blob_state.clone())).await {
                    Ok(()) => match self.blobs.read(&t.id, 0..t.size).await {
                        Ok(s) => s,
                        Err(e) => return short_or_err(e),
                    },
                    Err(BlobError::NotFound | BlobError::Lost { .. }) => return Ok(Found::Short(self.stored(&t.id).await)),
                    // A blob cut short behind the store's back: its bytes at the end are gone.
                    Err(e) => return short_or_err(e),
                }
            }
            Err(e) => return short_or_err(e),
        };
        let mut hasher = Sha256::new();
        let mut got = 0u64;
        loop {
            match stream.try_next().await {
                Ok(Some(chunk)) => {
                    hasher.update(&chunk);
                    let n = chunk.len() as u64;
                    got += n;
                    report.bytes_read += n;
                    obs.read(n);
                    pace.0.add(n).await;
                }
                Ok(None) => break,
                Err(e) => match BlobError::from_stream(e) {
                    BlobError::NotFound => return Ok(Found::Short(got)),
                    BlobError::Io(e) if e.kind() == std::io::ErrorKind::NotFound || e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        return Ok(Found::Short(got))
                    }
                    other => return Err(other),
                },
            }
        }
        if got < t.size {
            return Ok(Found::Short(got));
        }
        Ok(Found::Whole(hex::encode(hasher.finalize())))
    }

    /// Whether `t` is still a finished upload with the same sha256 (not deleted or expired
    /// since its row was read).
    async fn still_finished(&self, t: &Target) -> Result<bool, CheckError> {
        Ok(self
            .catalog
            .get_upload(&t.id)
            .await?
            .is_some_and(|r| r.is_finished() && !r.expired && r.sha256.map(hex::encode).as_deref() == Some(t.sha256.as_str())))
    }

    async fn stored(&self, id: &str) -> u64 {
        self.blobs.len(id).await.ok().flatten().unwrap_or(0)
    }

    /// Look for orphans: blobs nothing in the catalog names, and S3 multipart uploads of blobs
    /// that are not unfinished uploads — never an upload a live server is creating or
    /// removing at the time (issue 48):
    ///
    /// - the store is listed first, and each candidate looked up after it in one snapshot
    ///   ([`Catalog::blob_claim`]): its row, or its removal queued when the row was deleted
    ///   (the bytes go after the row) — a blob being removed is no orphan;
    /// - a creation makes its blob just before its row, so a blob listed in between looks
    ///   unclaimed: candidates are looked up again after [`ORPHAN_SETTLE`], and the store is
    ///   listed again after that, so a candidate removed meanwhile is not reported either.
    pub async fn orphans(&self, report: &mut CheckReport) -> Result<(), CheckError> {
        report.orphans_searched = true;
        let inv = self.blobs.inventory().await?;
        let mut blobs = Vec::new();
        for id in inv.blobs {
            if self.catalog.blob_claim(&id).await? == BlobClaim::Unclaimed {
                blobs.push(id);
            }
        }
        let mut multiparts = Vec::new();
        for (id, upload_id) in inv.multiparts {
            if !self.multipart_wanted(&id).await? {
                multiparts.push((id, upload_id));
            }
        }
        // What only an unfinished blob keeps, under a finished upload (finishing removes it
        // before the upload is called finished).
        let mut leftovers = Vec::new();
        for id in inv.unfinished {
            if self.leftover_of_finished(&id).await? {
                leftovers.push(id);
            }
        }
        if blobs.is_empty() && multiparts.is_empty() && leftovers.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(ORPHAN_SETTLE).await;
        let mut still = Vec::new();
        for id in blobs {
            if self.catalog.blob_claim(&id).await? == BlobClaim::Unclaimed {
                still.push(id);
            }
        }
        let mut still_mp = Vec::new();
        for (id, upload_id) in multiparts {
            if !self.multipart_wanted(&id).await? {
                still_mp.push((id, upload_id));
            }
        }
        let mut still_left = Vec::new();
        for id in leftovers {
            if self.leftover_of_finished(&id).await? {
                still_left.push(id);
            }
        }
        // Listed again after the last look-up: what was removed meanwhile is gone from it.
        let again = self.blobs.inventory().await?;
        report.leftovers.extend(still_left.into_iter().filter(|id| again.unfinished.binary_search(id).is_ok()));
        report.orphan_blobs.extend(still.into_iter().filter(|id| again.blobs.binary_search(id).is_ok()));
        report
            .orphan_multiparts
            .extend(still_mp.into_iter().filter(|m| again.multiparts.contains(m)).map(|(id, upload_id)| OrphanMultipart { id, upload_id }));
        Ok(())
    }

    /// Whether `id` is a finished upload (not a tombstone), so that what only an unfinished
    /// blob keeps is left over.
    async fn leftover_of_finished(&self, id: &str) -> Result<bool, CheckError> {
        Ok(self.catalog.get_upload(id).await?.is_some_and(|r| r.is_finished() && !r.expired))
    }

    /// Whether multipart uploads of blob `id` belong to something: an unfinished upload, a
    /// tombstone whose bytes the sweeper removes before forgetting it, or a row deleted whose
    /// bytes are queued for removal.
    async fn multipart_wanted(&self, id: &str) -> Result<bool, CheckError> {
        Ok(match self.catalog.get_upload(id).await? {
            Some(r) => !r.is_finished() || r.expired,
            None => self.catalog.blob_claim(id).await? != BlobClaim::Unclaimed,
        })
    }

    /// The whole check: every target, then (no ids given) the orphans. `cancel` stops it
    /// between reads ([`CheckError::Cancelled`]).
    pub async fn run(&self, obs: &dyn Observer, cancel: Option<&tokio_util::sync::CancellationToken>) -> Result<CheckReport, CheckError> {
        let mut report = CheckReport::default();
        let targets = self.targets(&mut report).await?;
        let mut pace = self.pace();
        for t in &targets {
            if cancel.is_some_and(|c| c.is_cancelled()) {
                return Err(CheckError::Cancelled);
            }
            self.check_one(t, &mut report, &mut pace, obs).await?;
        }
        if self.opts.ids.is_empty() {
            self.orphans(&mut report).await?;
        }
        Ok(report)
    }

    /// A fresh rate limiter for [`Checker::check_one`].
    pub fn pace(&self) -> PaceState {
        PaceState(Pacer::new(self.opts.rate))
    }
}

/// The rate limiter one run shares across its files.
pub struct PaceState(Pacer);

enum Found {
    /// Every byte read; their sha256, lowercase hex.
    Whole(String),
    /// Only this many bytes are stored.
    Short(u64),
}

fn short_or_err(e: BlobError) -> Result<Found, BlobError> {
    match e {
        BlobError::NotFound => Ok(Found::Short(0)),
        BlobError::OutOfRange { len, .. } => Ok(Found::Short(len)),
        other => Err(other),
    }
}
