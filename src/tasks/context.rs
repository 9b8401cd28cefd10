//! [`JobContext`]: what a running job may do — report progress, checkpoint, ask for input,
//! notice cancellation, and write files.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::JobError;
use crate::catalog::{Catalog, CatalogError, Progress, TaskUpdate};
use crate::upload::{now_ms, FileCursor, FileWriter, UploadEngine};

/// Progress reports are written at most this often (checkpoints always write).
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// The handle a job runs with. One per run.
pub struct JobContext {
    pub(super) task_id: String,
    pub(super) principal: String,
    pub(super) fence: u64,
    pub(super) catalog: Arc<dyn Catalog>,
    pub(super) uploads: Arc<UploadEngine>,
    pub(super) cancel: CancellationToken,
    pub(super) responses: BTreeMap<String, Box<RawValue>>,
    pub(super) progress: Mutex<(Progress, Option<Instant>)>,
    /// The progress clients had already seen when this run started (a resumed run restarts
    /// from its checkpoint, behind it): reported instead of the job's own until the job
    /// passes it, so reported progress never goes backwards. `None` once passed.
    pub(super) floor: Mutex<Option<Progress>>,
    /// Files this run created or reopened (removed if the task fails or is cancelled).
    pub(super) files: Mutex<Vec<String>>,
    /// The number of the last partial result fragment this run appended (or replayed); starts
    /// at the mark of the checkpoint the run resumes from ([`crate::catalog::partials`]).
    pub(super) partial_seq: tokio::sync::Mutex<u64>,
}

fn lost(e: CatalogError) -> JobError {
    match e {
        CatalogError::Fenced => JobError::Cancelled,
        e @ (CatalogError::Full(_) | CatalogError::Unavailable(_)) => JobError::Exhausted(e.into()),
        other => JobError::Internal(other.to_string()),
    }
}

impl JobContext {
    /// The task's id.
    pub fn task_id(&self) -> &str {
        &self.task_id
    }

    /// The principal that owns the task (and the files it creates).
    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// Cancelled when the task is cancelled or the server shuts down.
    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancel
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// `Err(Cancelled)` once cancelled: `ctx.check()?` between steps.
    pub fn check(&self) -> Result<(), JobError> {
        if self.is_cancelled() {
            Err(JobError::Cancelled)
        } else {
            Ok(())
        }
    }

    /// Update progress: `fraction` in [0, 1] (clamped), an optional message, and counters to
    /// set. Persisted at most every 250 ms; the next checkpoint always persists it.
    pub async fn progress(&self, fraction: Option<f64>, message: Option<&str>, counters: &[(&str, u64)]) -> Result<(), JobError> {
        let snapshot = {
            let mut g = self.progress.lock().unwrap();
            if let Some(f) = fraction {
                g.0.fraction = Some(f.clamp(0.0, 1.0));
            }
            if let Some(m) = message {
                g.0.message = Some(m.to_string());
            }
            for (k, v) in counters {
                g.0.counters.insert((*k).to_string(), *v);
            }
            if g.1.is_some_and(|t| t.elapsed() < PROGRESS_EVERY) {
                return Ok(());
            }
            g.1 = Some(Instant::now());
            g.0.clone()
        };
        let snapshot = self.never_backwards(snapshot);
        let u = TaskUpdate { progress: Some(snapshot), checkpoint: None, partial_mark: None, now_ms: now_ms() };
        match self.catalog.update_task(&self.task_id, Some(self.fence), &u).await {
            // A progress report is advisory: one the catalog cannot take now (disk full, busy)
            // is skipped — the next report or checkpoint carries it (DESIGN §9).
            Err(e @ (CatalogError::Full(_) | CatalogError::Unavailable(_))) => {
                tracing::warn!(task = self.task_id, error = %e, "progress report skipped");
                Ok(())
            }
            other => other.map_err(lost),
        }
    }

    /// `p`, or the progress already reported before this run while `p` is still behind it.
    fn never_backwards(&self, p: Progress) -> Progress {
        let mut floor = self.floor.lock().unwrap();
        let Some(f) = floor.as_ref() else { return p };
        if passes(&p, f) {
            *floor = None;
            p
        } else {
            f.clone()
        }
    }

    /// Persist `value` as the point to resume from after a crash (and the current progress).
    /// Call it only after the work it describes is durable (e.g. after [`FileWriter::sync`]).
    /// It covers every partial result appended so far: a run resumed from it numbers its
    /// fragments after those.
    pub async fn checkpoint<T: Serialize + ?Sized>(&self, value: &T) -> Result<(), JobError> {
        let mark = self.partial_count().await;
        self.checkpoint_at(value, mark).await
    }

    /// [`JobContext::checkpoint`] covering only the first `mark` partial result fragments (a
    /// job that learns of a resume point after it appended fragments past it, like the
    /// `command` kind's pending checkpoints).
    pub async fn checkpoint_at<T: Serialize + ?Sized>(&self, value: &T, mark: u64) -> Result<(), JobError> {
        let text = serde_json::to_string(value).map_err(|e| JobError::Internal(e.to_string()))?;
        let progress = self.progress.lock().unwrap().0.clone();
        let progress = self.never_backwards(progress);
        let u = TaskUpdate { progress: Some(progress), checkpoint: Some(text), partial_mark: Some(mark), now_ms: now_ms() };
        self.catalog.update_task(&self.task_id, Some(self.fence), &u).await.map_err(lost)
    }

    /// Append a partial result: a small JSON value (at most 16 KiB as JSON,
    /// [`crate::catalog::partials::MAX_FRAGMENT_BYTES`]) a caller can read before the task
    /// ends — rows exported so far, a first finding. Stored at once with its `task.partial`
    /// event; returns its number. A fragment this run re-emits after resuming from a checkpoint
    /// (one stored before the checkpoint's run crashed) is not stored twice. The oldest
    /// fragments are dropped past 256 or 64 KiB. Errors: a value too big or not JSON
    /// ([`JobError::Failed`]), a lost lease ([`JobError::Cancelled`]), a catalog that cannot
    /// take it ([`JobError::Exhausted`]).
    pub async fn partial<T: Serialize + ?Sized>(&self, value: &T) -> Result<u64, JobError> {
        let text = serde_json::to_string(value).map_err(|e| JobError::Internal(e.to_string()))?;
        self.partial_json(&text).await
    }

    /// [`JobContext::partial`] of JSON text.
    pub async fn partial_json(&self, text: &str) -> Result<u64, JobError> {
        let value = crate::catalog::partials::check_fragment(text).map_err(JobError::failed)?;
        let mut seq = self.partial_seq.lock().await;
        let next = *seq + 1;
        self.catalog.append_partial(&self.task_id, Some(self.fence), next, value.get(), now_ms()).await.map_err(lost)?;
        *seq = next;
        Ok(next)
    }

    /// The job starts its work again from a checkpoint that covered the first `mark` partial
    /// results (within one run, e.g. a program restarted from its last checkpoint): its next
    /// fragments are numbered from there, and those already stored count as replays.
    pub async fn rewind_partials(&self, mark: u64) {
        let mut seq = self.partial_seq.lock().await;
        *seq = (*seq).min(mark);
    }

    /// The number of the last partial result fragment this run appended (or found already
    /// stored), counting those before the checkpoint it resumed from.
    pub async fn partial_count(&self) -> u64 {
        *self.partial_seq.lock().await
    }

    /// The response to input request `key`, if one was stored; otherwise record `request`,
    /// move the task to `input_required` and return `Err(JobError::Parked)` — return it from
    /// `run`. When answered, the job runs again from its last checkpoint and this call then
    /// returns the response, so replay is safe.
    pub async fn need_input(&self, key: &str, request: serde_json::Value) -> Result<serde_json::Value, JobError> {
        if let Some(r) = self.responses.get(key) {
            return serde_json::from_str(r.get()).map_err(|e| JobError::Internal(e.to_string()));
        }
        let text = request.to_string();
        self.catalog.park_for_input(&self.task_id, self.fence, key, &text, now_ms()).await.map_err(lost)?;
        Err(JobError::Parked)
    }

    /// Create a file owned by the task's principal; stream into it, `sync` to checkpoint,
    /// `finish` to get its handle.
    pub async fn create_file(&self, name: &str, media_type: &str) -> Result<FileWriter, JobError> {
        let w = self.uploads.create_file(&self.principal, name, media_type).await?;
        self.files.lock().unwrap().push(w.id().to_string());
        Ok(w)
    }

    /// Reopen a file from a cursor saved in a checkpoint.
    pub async fn reopen_file(&self, cursor: &FileCursor) -> Result<FileWriter, JobError> {
        let w = self.uploads.reopen_file(&self.principal, cursor).await?;
        self.files.lock().unwrap().push(w.id().to_string());
        Ok(w)
    }

    /// The job completed: a fraction it reported reads 1.0 (a finished task never shows
    /// work left to do, whatever its last report said).
    pub(super) fn progress_done(&self) {
        let mut g = self.progress.lock().unwrap();
        if g.0.fraction.is_some() {
            g.0.fraction = Some(1.0);
        }
    }

    /// Persist the latest progress (reports are throttled; the engine calls this when the
    /// job returns so the final counters are never lost).
    pub(super) async fn flush_progress(&self) -> Result<(), JobError> {
        let snapshot = self.progress.lock().unwrap().0.clone();
        let snapshot = self.never_backwards(snapshot);
        let u = TaskUpdate { progress: Some(snapshot), checkpoint: None, partial_mark: None, now_ms: now_ms() };
        self.catalog.update_task(&self.task_id, Some(self.fence), &u).await.map_err(lost)
    }

    /// Show `message` as the task's progress message (its counters and fraction as they
    /// stand): what the engine tells the task's owner about a pause the job did not report.
    pub(super) async fn say(&self, message: &str) -> Result<(), JobError> {
        let snapshot = self.progress.lock().unwrap().0.clone();
        let mut snapshot = self.never_backwards(snapshot);
        snapshot.message = Some(message.to_string());
        let u = TaskUpdate { progress: Some(snapshot), checkpoint: None, partial_mark: None, now_ms: now_ms() };
        self.catalog.update_task(&self.task_id, Some(self.fence), &u).await.map_err(lost)
    }

    /// Remove the unfinished files of this run (the task failed or was cancelled): those it
    /// created or reopened, and those the checkpoint it resumed from names.
    ///
    /// The run's writer of a file may still hold the file's lease for a moment after it was
    /// dropped (with catalog leases its release is a catalog write of its own), so a file found
    /// locked or the store briefly away is tried again, for up to [`DISCARD_PATIENCE`]; one
    /// still left then is logged and expires like any unfinished upload.
    pub(super) async fn discard_unfinished_files(&self) {
        let ids = std::mem::take(&mut *self.files.lock().unwrap());
        discard_unfinished(&self.uploads, &self.principal, &self.task_id, ids, DISCARD_PATIENCE).await;
    }

    /// The upload engine (to read other files of the principal).
    pub fn uploads(&self) -> &Arc<UploadEngine> {
        &self.uploads
    }
}

/// Terminate every unfinished upload of `ids` (files of task `task_id`, owned by `principal`):
/// a task that failed or was cancelled leaves no partial output behind. A file found locked or
/// the store away is tried again for up to `patience`; finished files (a completed part of the
/// result) and unknown ids are left alone.
pub(super) async fn discard_unfinished(uploads: &UploadEngine, principal: &str, task_id: &str, mut ids: Vec<String>, patience: Duration) {
    ids.sort();
    ids.dedup();
    for id in ids {
        let deadline = tokio::time::Instant::now() + patience;
        let mut pause = Duration::from_millis(50);
        loop {
            let Ok(rec) = uploads.get(principal, &id).await else { break };
            if rec.is_finished() {
                break;
            }
            match uploads.terminate(principal, &id).await {
                Ok(()) => {
                    tracing::info!(task = task_id, upload = id, "removed the unfinished output of a failed or cancelled task");
                    break;
                }
                Err(e)
                    if matches!(e.code, crate::error::ErrorCode::Locked | crate::error::ErrorCode::Unavailable)
                        && tokio::time::Instant::now() + pause < deadline =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::warn!(
                        task = task_id,
                        upload = id,
                        error = %e.detail,
                        "could not remove an unfinished output file; it expires like any unfinished upload"
                    );
                    break;
                }
            }
        }
    }
}

/// The upload ids of the files a task's checkpoint names: every [`crate::upload::FileCursor`]
/// in it (an object with a string `id`, a numeric `offset` and a string `hash_state`), at any
/// depth — what a job stores to reopen its files.
pub(super) fn checkpoint_files(checkpoint: Option<&str>) -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let (Some(serde_json::Value::String(id)), Some(serde_json::Value::Number(_)), Some(serde_json::Value::String(_))) =
                    (m.get("id"), m.get("offset"), m.get("hash_state"))
                {
                    out.push(id.clone());
                }
                m.values().for_each(|v| walk(v, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Some(v) = checkpoint.and_then(|c| serde_json::from_str::<serde_json::Value>(c).ok()) {
        walk(&v, &mut out);
    }
    out
}

/// How long [`JobContext::discard_unfinished_files`] keeps trying a locked file.
const DISCARD_PATIENCE: Duration = Duration::from_secs(10);

/// Whether progress `p` has caught up with `floor`: by fraction when both have one, else by
/// every counter they share; equal counts as caught up.
fn passes(p: &Progress, floor: &Progress) -> bool {
    match (p.fraction, floor.fraction) {
        (Some(a), Some(b)) => a >= b,
        (None, Some(_)) => false,
        _ => floor.counters.iter().all(|(k, v)| p.counters.get(k).is_none_or(|mine| mine >= v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file cursor a job keeps in its checkpoint, at any depth, names a file of the task;
    /// nothing else does.
    #[test]
    fn checkpoint_files_finds_every_cursor() {
        let cp = r#"{"cursor":{"id":"aaa","offset":5,"hash_state":"x"},"token":"t","inputs":{"k":{"id":"not-a-cursor"}},
                     "parts":[{"out":{"id":"bbb","offset":0,"hash_state":"","blob_state":"AQ=="}}],"id":"ccc"}"#;
        assert_eq!(checkpoint_files(Some(cp)), vec!["aaa".to_string(), "bbb".to_string()]);
        assert!(checkpoint_files(None).is_empty());
        assert!(checkpoint_files(Some("not json")).is_empty());
    }

    fn prog(fraction: Option<f64>, bytes: u64) -> Progress {
        Progress { fraction, message: None, counters: [("bytes".to_string(), bytes)].into() }
    }

    #[test]
    fn progress_passes_by_fraction_else_by_counters() {
        assert!(!passes(&prog(Some(0.3), 70), &prog(Some(0.5), 100)));
        assert!(passes(&prog(Some(0.5), 1), &prog(Some(0.5), 100)), "fraction decides when both have one");
        assert!(!passes(&prog(None, 70), &prog(None, 100)));
        assert!(passes(&prog(None, 101), &prog(None, 100)));
        assert!(!passes(&prog(None, 999), &prog(Some(0.1), 0)), "no fraction never passes a reported fraction");
        assert!(passes(&Progress::default(), &Progress::default()));
    }
}
