//! The worker pool, leases and the task API used by the HTTP and MCP layers.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{ErrorCode, Next, Refusal};
use futures::FutureExt;
use serde_json::value::RawValue;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Job, JobContext, JobError};

/// How long a run that found its file held by an earlier run waits before releasing the task
/// ([`JobError::Busy`]).
const BUSY_PAUSE: Duration = Duration::from_millis(500);
/// Runs of one task after which a store that is still unavailable fails it (DESIGN §9: the
/// catalog or the blob store away for a moment is waited out, one that stays away is not).
const UNAVAILABLE_RUNS: u64 = 12;
/// The pause before a task whose run met an unavailable store is let go to run again, times
/// the runs so far (capped at [`UNAVAILABLE_PAUSE_MAX`]): ≈ 5 minutes over
/// [`UNAVAILABLE_RUNS`] runs, each also waiting for its claim.
const UNAVAILABLE_PAUSE: Duration = Duration::from_secs(1);
const UNAVAILABLE_PAUSE_MAX: Duration = Duration::from_secs(30);
use crate::catalog::{Catalog, CatalogError, NewTask, StartOutcome, TaskEnd, TaskRecord, TaskStatus};
use crate::upload::{internal, new_id, now_ms, UploadEngine};

/// Largest answer to an input request, in bytes (programs receive it in an environment variable).
pub const MAX_RESPONSE: usize = 64 * 1024;

/// Engine settings.
#[derive(Debug, Clone)]
pub struct TaskConfig {
    /// Tasks run at once by this process.
    pub workers: usize,
    /// Lease length; renewed every third of it. Another process may take over a task whose
    /// lease expired (its owner died).
    pub lease: Duration,
    /// How often idle workers look for work they were not told about.
    pub poll: Duration,
    /// Terminal tasks are kept this long, then swept (`ttl_ms` default).
    pub default_ttl: Duration,
    /// This process's lease owner id. `ferry serve` keeps it in the data dir, so a restarted
    /// server recognises (and at once reclaims) what it held before a crash.
    pub owner: String,
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig {
            workers: 4,
            lease: Duration::from_secs(10),
            poll: Duration::from_millis(500),
            default_ttl: Duration::from_secs(24 * 3600),
            owner: format!("ferry-{}", new_id()),
        }
    }
}

/// The answer to [`Engine::start`].
#[derive(Debug, Clone)]
pub struct Started {
    pub task: TaskRecord,
    /// False when an idempotency key joined an existing task.
    pub created: bool,
}

/// The task engine. Share it behind an `Arc`.
pub struct Engine {
    catalog: Arc<dyn Catalog>,
    uploads: Arc<UploadEngine>,
    cfg: TaskConfig,
    jobs: HashMap<String, Arc<dyn Job>>,
    /// This process's lease owner id.
    owner: String,
    running: Mutex<HashMap<String, CancellationToken>>,
    wake: Notify,
    shutdown: CancellationToken,
}

fn unknown_task() -> Refusal {
    Refusal::new(404, ErrorCode::NotFound, "no task with this id", Next::ListTasks)
}

fn catalog_err(e: CatalogError) -> Refusal {
    match e {
        CatalogError::NotFound => unknown_task(),
        // 507 / 503 with the cause named (DESIGN §9); the rest 500.
        e @ (CatalogError::Full(_) | CatalogError::Unavailable(_)) => e.into(),
        other => internal("task catalog", other),
    }
}

fn error_json(code: ErrorCode, message: &str) -> String {
    serde_json::json!({ "code": code.as_str(), "message": message }).to_string()
}

impl Engine {
    pub fn new(catalog: Arc<dyn Catalog>, uploads: Arc<UploadEngine>, cfg: TaskConfig) -> Engine {
        let owner = cfg.owner.clone();
        Engine {
            catalog,
            uploads,
            cfg,
            jobs: HashMap::new(),
            owner,
            running: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            shutdown: CancellationToken::new(),
        }
    }

    /// Add a job kind (replacing one of the same name).
    pub fn register(&mut self, job: Arc<dyn Job>) {
        self.jobs.insert(job.kind().to_string(), job);
    }

    /// Registered kinds, sorted.
    /// Each kind and the JSON Schema of its arguments ([`Job::args_schema`]), sorted by kind.
    pub fn kind_schemas(&self) -> Vec<(String, Option<serde_json::Value>)> {
        let mut k: Vec<(String, Option<serde_json::Value>)> = self.jobs.iter().map(|(k, j)| (k.clone(), j.args_schema())).collect();
        k.sort_by(|a, b| a.0.cmp(&b.0));
        k
    }

    pub fn kinds(&self) -> Vec<String> {
        let mut k: Vec<String> = self.jobs.keys().cloned().collect();
        k.sort();
        k
    }

    /// Bring the task gauges of `/metrics` up to date from the catalog: `ferry_tasks{kind,status}`
    /// for every registered kind and status (0 when none), and `ferry_task_queue_depth` (tasks of
    /// kinds workers run that no worker holds). Kinds not registered here are left out, so the
    /// label set stays bounded.
    pub async fn refresh_metrics(&self) -> Result<(), CatalogError> {
        let counts = self.catalog.task_counts().await?;
        let metrics = &self.uploads.metrics;
        let mut waiting = 0u64;
        for kind in self.kinds() {
            for status in [TaskStatus::Working, TaskStatus::InputRequired, TaskStatus::Completed, TaskStatus::Failed, TaskStatus::Cancelled] {
                let name = status.as_str();
                let n = counts.iter().filter(|c| c.kind == kind && c.status == name).map(|c| c.count).sum::<u64>();
                metrics.tasks.get_or_create(&crate::metrics::TaskLabels { kind: kind.clone(), status: name }).set(n as i64);
            }
            if self.jobs.get(&kind).is_some_and(|j| j.runnable()) {
                waiting += counts.iter().filter(|c| c.kind == kind).map(|c| c.waiting).sum::<u64>();
            }
        }
        metrics.task_queue_depth.set(waiting as i64);
        Ok(())
    }

    pub fn uploads(&self) -> &Arc<UploadEngine> {
        &self.uploads
    }

    /// Start a task of `kind` with `args` (exact JSON text). With an idempotency key: a running
    /// or completed task with the same key and arguments is returned instead (`created:
    /// false`); a failed one is retried as a new task naming it in `prior_failure`.
    /// Errors: unknown kind, arguments outside the kind's schema or an invalid key → 400
    /// `invalid_argument`; arguments the kind's own check refuses ([`Job::check`]) → 422
    /// `invalid_argument` (or the check's own status, e.g. 403 for a host not allowed); input files that are unknown → 404 `not_found`, or not
    /// complete → 409 `upload_incomplete` ([`Job::check_inputs`]); the key names a task with other arguments → 422 `conflict`
    /// (draft-ietf-httpapi-idempotency-key-header).
    pub async fn start(
        &self,
        principal: &str,
        kind: &str,
        args: &str,
        idempotency_key: Option<&str>,
        ttl_ms: Option<i64>,
    ) -> Result<Started, Refusal> {
        let job = self
            .jobs
            .get(kind)
            .ok_or_else(|| Refusal::bad_request(format!("unknown task kind {kind:?}"), format!("Use one of: {}.", self.kinds().join(", "))))?;
        let raw: Box<RawValue> =
            serde_json::from_str(args).map_err(|e| Refusal::bad_request(format!("args are not JSON: {e}"), "Send args as a JSON value."))?;
        if let Some(m) = super::schema_check::unportable_json(raw.get()) {
            return Err(Refusal::bad_request(
                format!("args{m}"),
                "Fix args at that place (JSON every reader takes alike), then start the task again.",
            ));
        }
        if let Some(k) = idempotency_key {
            // The one notion of a valid key (also for `Idempotency-Key` on POST /files/).
            ferry_tus::IdempotencyKey::new(k).map_err(|e| {
                Refusal::bad_request(
                    format!("{e}"),
                    format!("Send an idempotency key of 1 to {} characters without control characters.", ferry_tus::IdempotencyKey::MAX_LEN),
                )
            })?;
            // A replay of a start that is running or done is answered from the task it started,
            // before any check with side effects or a different answer (its input files may be
            // gone by now): no new run, no event (issue 23 item 5).
            if let Some(old) = self.catalog.task_by_key(principal, kind, k).await.map_err(catalog_err)? {
                if crate::catalog::tasks::same_args(&old.args, raw.get())
                    && !matches!(old.status, crate::catalog::TaskStatus::Failed | crate::catalog::TaskStatus::Cancelled)
                {
                    return Ok(Started { task: old, created: false });
                }
            }
        }
        // A kind's schema that does not compile (a bug of the kind, the same on every call) is
        // logged and left out: the kind's own check still runs, and no caller is told to retry.
        let schema = job.args_schema().and_then(|s| {
            jsonschema::validator_for(&s).inspect_err(|e| tracing::error!(kind, error = %e, "the args schema of a task kind does not compile")).ok()
        });
        if let Some(v) = schema {
            let value: serde_json::Value =
                serde_json::from_str(raw.get()).map_err(|e| Refusal::bad_request(format!("args are not JSON: {e}"), "Send args as a JSON value."))?;
            super::schema_check::check(&v, &value, "args")
                .map_err(|m| Refusal::bad_request(format!("invalid args for {kind}: {m}"), Next::ArgsSchema { kind: kind.to_string() }))?;
        }
        // Past the schema, a kind's own check refuses args that are well formed but that it
        // cannot use (a URL whose host is no domain name, a name with control characters):
        // 422, as the document cannot say it; a malformed start stays 400 (issue 48, kind 5).
        job.check(&raw).map_err(|e| if e.status == 400 { Refusal { status: 422, ..e } } else { e })?;
        job.check_inputs(principal, &raw, &self.uploads).await?;
        let ttl = ttl_ms.unwrap_or(self.cfg.default_ttl.as_millis() as i64);
        if !(1..=super::MAX_TASK_TTL_MS).contains(&ttl) {
            return Err(super::ttl_out_of_range("ttl_ms", &ttl.to_string()));
        }
        let new = NewTask {
            id: new_id(),
            principal: principal.to_string(),
            kind: kind.to_string(),
            args: raw.get().to_string(),
            idempotency_key: idempotency_key.map(str::to_owned),
            ttl_ms: ttl,
            now_ms: now_ms(),
        };
        let out = self.catalog.start_task(&new).await.map_err(catalog_err)?;
        let started = match out {
            StartOutcome::Created(task) | StartOutcome::Retried { task, .. } => Started { task, created: true },
            StartOutcome::Existing(task) => Started { task, created: false },
            StartOutcome::Conflict(id) => {
                // 422 as draft-ietf-httpapi-idempotency-key-header says for a key reused with
                // another request (uploads answer the same).
                return Err(Refusal::new(
                    422,
                    ErrorCode::Conflict,
                    format!("Idempotency-Key already names task {id}, started with different arguments"),
                    Next::KeyReused { task: true },
                ));
            }
        };
        self.wake.notify_one();
        Ok(started)
    }

    /// The task as `principal` may see it; another principal's task does not exist (404).
    pub async fn get(&self, principal: &str, id: &str) -> Result<TaskRecord, Refusal> {
        match self.catalog.get_task(id).await.map_err(catalog_err)? {
            Some(t) if t.principal == principal => Ok(t),
            _ => Err(unknown_task()),
        }
    }

    /// The principal's tasks, newest first.
    pub async fn list(&self, principal: &str, limit: u32) -> Result<Vec<TaskRecord>, Refusal> {
        self.catalog.list_tasks(principal, limit.clamp(1, 1000)).await.map_err(catalog_err)
    }

    /// Answer input request `key` with `response` (JSON text). Returns whether it was
    /// accepted (false for a key that is not outstanding) and the task after the call.
    pub async fn respond(&self, principal: &str, id: &str, key: &str, response: &str) -> Result<(bool, TaskRecord), Refusal> {
        let task = self.get(principal, id).await?;
        if task.status.is_terminal() {
            return Err(terminal(&task));
        }
        if response.len() > MAX_RESPONSE {
            return Err(Refusal::new(
                413,
                ErrorCode::SizeExceeded,
                format!("an input response may be at most {MAX_RESPONSE} bytes"),
                "Send a shorter answer, or upload the data as a file and answer with its id.",
            ));
        }
        let raw: Box<RawValue> = serde_json::from_str(response)
            .map_err(|e| Refusal::bad_request(format!("response is not JSON: {e}"), "Send the response as a JSON value."))?;
        check_response(&task, key, raw.get())?;
        let accepted = self.catalog.respond_input(id, key, raw.get(), now_ms()).await.map_err(catalog_err)?;
        self.wake.notify_one();
        Ok((accepted, self.get(principal, id).await?))
    }

    /// Cancel a task: `cancelled` at once (terminal); the running job is told to stop and its
    /// late result is discarded. A terminal task is returned unchanged.
    pub async fn cancel(&self, principal: &str, id: &str) -> Result<TaskRecord, Refusal> {
        self.get(principal, id).await?;
        let task = self.catalog.cancel_task(id, now_ms()).await.map_err(catalog_err)?;
        let running_here = match self.running.lock().unwrap().get(id) {
            Some(tok) => {
                tok.cancel();
                true
            }
            None => false,
        };
        // A run (here, or on another replica, which learns of the cancel at its next lease
        // renewal) removes its own unfinished files. A task no run holds — waiting for input,
        // for its next run, or a run that crashed — still has those its checkpoint names: they
        // go now, not when they expire a week later (issue 48). One a run still holds answers
        // `locked` and is left to that run.
        if !running_here && task.status == TaskStatus::Cancelled {
            // What a run killed with its server left running (a `command`'s process group)
            // ends before anything else is said to be over.
            if let Some(job) = self.jobs.get(&task.kind) {
                job.release(&task.id, task.checkpoint.as_deref());
            }
            let files = super::context::checkpoint_files(task.checkpoint.as_deref());
            super::context::discard_unfinished(&self.uploads, &task.principal, &task.id, files, Duration::ZERO).await;
        }
        Ok(task)
    }

    /// Report progress for a task driven from outside (kind `external`).
    pub async fn report(&self, principal: &str, id: &str, progress: crate::catalog::Progress) -> Result<TaskRecord, Refusal> {
        let task = self.external(principal, id).await?;
        let u = crate::catalog::TaskUpdate { progress: Some(progress), checkpoint: None, partial_mark: None, now_ms: now_ms() };
        match self.catalog.update_task(&task.id, None, &u).await {
            Ok(()) => self.get(principal, id).await,
            Err(CatalogError::Fenced) => Err(terminal(&task)),
            Err(e) => Err(catalog_err(e)),
        }
    }

    /// Append partial result `fragment` (JSON text) to a task driven from outside (kind
    /// `external`); returns its number and the task after the call. Errors: not JSON or over
    /// [`crate::catalog::partials::MAX_FRAGMENT_BYTES`] (400 / 413), not an external task or
    /// finished (409 `conflict`).
    pub async fn append_external(&self, principal: &str, id: &str, fragment: &str) -> Result<(u64, TaskRecord), Refusal> {
        let task = self.external(principal, id).await?;
        if fragment.len() > crate::catalog::partials::MAX_FRAGMENT_BYTES {
            return Err(Refusal::new(
                413,
                ErrorCode::SizeExceeded,
                format!(
                    "a partial result fragment may be at most {} bytes of JSON, got {}",
                    crate::catalog::partials::MAX_FRAGMENT_BYTES,
                    fragment.len()
                ),
                "Send a smaller fragment; put big data in a file (upload it with TUS) and send its id.",
            ));
        }
        let value =
            crate::catalog::partials::check_fragment(fragment).map_err(|m| Refusal::bad_request(m, "Send the fragment as one JSON value."))?;
        match self.catalog.append_partial(&task.id, None, 0, value.get(), now_ms()).await {
            Ok(crate::catalog::Appended::Stored(seq) | crate::catalog::Appended::Replayed(seq)) => Ok((seq, self.get(principal, id).await?)),
            Err(CatalogError::Fenced) => Err(terminal(&self.get(principal, id).await.unwrap_or(task))),
            Err(e) => Err(catalog_err(e)),
        }
    }

    /// `task`'s kept partial result fragments numbered above `after`, oldest first (no query
    /// when the record shows there is none).
    pub async fn partials(&self, task: &TaskRecord, after: u64) -> Result<crate::catalog::PartialPage, Refusal> {
        if task.partial_seq <= after {
            return Ok(crate::catalog::PartialPage { fragments: Vec::new(), dropped: task.partial_dropped, next: task.partial_seq });
        }
        self.catalog.task_partials(&task.id, after).await.map_err(catalog_err)
    }

    /// End a task driven from outside: `Ok(result)` completes it, `Err(message)` fails it.
    pub async fn finish_external(&self, principal: &str, id: &str, end: Result<String, String>) -> Result<TaskRecord, Refusal> {
        self.external(principal, id).await?;
        let end = match end {
            Ok(result) => TaskEnd::Completed(result),
            Err(message) => TaskEnd::Failed(error_json(ErrorCode::TaskFailed, &message)),
        };
        if !self.catalog.finish_task(id, None, &end, now_ms()).await.map_err(catalog_err)? {
            return Err(terminal(&self.get(principal, id).await?));
        }
        self.get(principal, id).await
    }

    async fn external(&self, principal: &str, id: &str) -> Result<TaskRecord, Refusal> {
        let task = self.get(principal, id).await?;
        if self.jobs.get(&task.kind).is_some_and(|j| j.runnable()) {
            // The request is well formed; the task's state (who runs it) refuses it: 409, as
            // a finished task's does.
            return Err(Refusal::new(
                409,
                ErrorCode::Conflict,
                format!("task {id} is run by ferry (kind {}), not by an external producer", task.kind),
                "Only tasks of kind external accept reports; start one with kind external to report on it.",
            ));
        }
        Ok(task)
    }

    /// Start the worker pool and the TTL sweeper. Workers stop at [`Engine::shutdown`].
    pub fn spawn(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut handles: Vec<_> = (0..self.cfg.workers.max(1)).map(|_| tokio::spawn(self.clone().worker())).collect();
        let me = self.clone();
        handles.push(tokio::spawn(async move {
            let mut failing = false;
            loop {
                match me.catalog.sweep_tasks(now_ms()).await {
                    Ok(_) => failing = false,
                    Err(e) if !std::mem::replace(&mut failing, true) => log_catalog_failure(&e, "task sweep failed; trying again"),
                    Err(_) => {}
                }
                tokio::select! {
                    _ = me.shutdown.cancelled() => break,
                    _ = tokio::time::sleep(me.cfg.poll.max(Duration::from_millis(100)) * 4) => {}
                }
            }
        }));
        handles
    }

    /// Stop taking work; running jobs are told to stop and their leases released, so they
    /// resume from their checkpoints on the next start.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
        for tok in self.running.lock().unwrap().values() {
            tok.cancel();
        }
    }

    async fn worker(self: Arc<Self>) {
        let runnable: Vec<String> = self.jobs.values().filter(|j| j.runnable()).map(|j| j.kind().to_string()).collect();
        // A catalog that is away fails every poll: said once per streak, at warn when it passes.
        let mut failing = false;
        while !self.shutdown.is_cancelled() {
            let claimed = self.catalog.claim_task(&self.owner, &runnable, self.cfg.lease.as_millis() as i64).await;
            if failing && claimed.is_ok() {
                failing = false;
                tracing::info!("claiming tasks works again");
            }
            match claimed {
                Ok(Some(task)) => self.run(task).await,
                Ok(None) => {
                    tokio::select! {
                        _ = self.shutdown.cancelled() => {}
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(self.cfg.poll) => {}
                    }
                }
                Err(e) => {
                    if !std::mem::replace(&mut failing, true) {
                        log_catalog_failure(&e, "claiming a task failed; trying again every poll");
                    }
                    tokio::time::sleep(self.cfg.poll).await;
                }
            }
        }
    }

    async fn run(&self, task: TaskRecord) {
        let Some(job) = self.jobs.get(&task.kind).cloned() else { return };
        let cancel = self.shutdown.child_token();
        self.running.lock().unwrap().insert(task.id.clone(), cancel.clone());
        let responses: BTreeMap<String, Box<RawValue>> = serde_json::from_str(&task.input_responses).unwrap_or_default();
        let resumed = task.runs > 1 && task.progress != Default::default();
        let ctx = JobContext {
            task_id: task.id.clone(),
            principal: task.principal.clone(),
            fence: task.fence,
            catalog: self.catalog.clone(),
            uploads: self.uploads.clone(),
            cancel: cancel.clone(),
            responses,
            // A resumed run starts behind what clients saw: its own reports start empty and the
            // stored progress is the floor until they pass it (never reported backwards).
            progress: Mutex::new((if resumed { Default::default() } else { task.progress.clone() }, None)),
            floor: Mutex::new(resumed.then(|| task.progress.clone())),
            // The files earlier runs made (named by the checkpoint this run resumes from) are
            // this run's too: if it fails before it reopens them, they go all the same.
            files: Mutex::new(super::context::checkpoint_files(task.checkpoint.as_deref())),
            // Without a checkpoint the run starts over and numbers its fragments from the start.
            partial_seq: tokio::sync::Mutex::new(if task.checkpoint.is_some() { task.partial_mark } else { 0 }),
        };
        let heartbeat = {
            let (catalog, id, fence, lease, cancel) = (self.catalog.clone(), task.id.clone(), task.fence, self.cfg.lease, cancel.clone());
            tokio::spawn(async move {
                // The lease is ours until `valid_until` by our own clock (counted from when the
                // last successful renewal was sent): past it another process may have claimed
                // the task, so the job is stopped even if the catalog cannot tell us.
                let mut valid_until = std::time::Instant::now() + lease;
                loop {
                    tokio::time::sleep(lease / 3).await;
                    let sent = std::time::Instant::now();
                    match catalog.renew_lease(&id, fence, lease.as_millis() as i64).await {
                        Ok(s) if s == TaskStatus::Working || s == TaskStatus::InputRequired => valid_until = sent + lease,
                        Ok(_) | Err(CatalogError::Fenced) => {
                            cancel.cancel();
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(task = id, error = %e, "lease renewal failed");
                            if std::time::Instant::now() >= valid_until {
                                tracing::warn!(task = id, "task lease ran out while the catalog was unreachable; stopping the job");
                                cancel.cancel();
                                break;
                            }
                        }
                    }
                }
            })
        };
        let checkpoint = task.checkpoint.as_deref().and_then(|c| serde_json::from_str(c).ok());
        let args: Box<RawValue> = match serde_json::from_str(&task.args) {
            Ok(a) => a,
            Err(_) => RawValue::from_string("null".into()).expect("valid JSON"),
        };
        tracing::info!(task = task.id, kind = task.kind, run = task.runs, resumed = checkpoint.is_some(), "task running");
        let out = AssertUnwindSafe(job.run(&ctx, &args, checkpoint)).catch_unwind().await;
        heartbeat.abort();
        self.running.lock().unwrap().remove(&task.id);
        if matches!(out, Ok(Ok(_))) {
            ctx.progress_done();
        }
        if matches!(out, Ok(Ok(_)) | Ok(Err(JobError::Failed { .. })) | Ok(Err(JobError::Parked))) {
            let _ = ctx.flush_progress().await;
        }
        let user_cancelled = matches!(out, Ok(Err(JobError::Cancelled)))
            && self.catalog.get_task(&task.id).await.ok().flatten().is_some_and(|t| t.status == TaskStatus::Cancelled);
        // The catalog or a store away for a moment (503 `unavailable`: a restart, a network
        // blip, out of file descriptors) is no fault of the task: it keeps its files and its
        // checkpoint and runs again, here or on another replica — unless it has met one on
        // every run for too long.
        let waits_out = matches!(&out, Ok(Err(JobError::Exhausted(e))) if e.code == ErrorCode::Unavailable) && task.runs < UNAVAILABLE_RUNS;
        if user_cancelled || (matches!(out, Ok(Err(JobError::Failed { .. } | JobError::Exhausted(_))) | Err(_)) && !waits_out) {
            ctx.discard_unfinished_files().await;
        }
        let now = now_ms();
        let end = match out {
            Ok(Ok(value)) => Some(TaskEnd::Completed(value.to_string())),
            Ok(Err(JobError::Failed { message })) => Some(TaskEnd::Failed(error_json(ErrorCode::TaskFailed, &message))),
            Ok(Err(JobError::Exhausted(e))) if waits_out => {
                let pause = (UNAVAILABLE_PAUSE * task.runs.max(1) as u32).min(UNAVAILABLE_PAUSE_MAX);
                tracing::warn!(
                    task = task.id,
                    run = task.runs,
                    error = %e,
                    pause_ms = pause.as_millis() as u64,
                    "task paused: the catalog or a store is unavailable; it runs again from its checkpoint"
                );
                // Its unfinished output is kept for that run, and its view says so (when the
                // catalog can take the note: an unavailable blob store leaves it writable).
                let _ = ctx
                    .say(
                        "paused: the catalog or a store is unavailable; the task runs again \
                         from its last checkpoint and keeps its unfinished output for that run",
                    )
                    .await;
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = self.shutdown.cancelled() => {}
                }
                // If the catalog is still away this fails too: the lease then runs out and the
                // task is claimed again all the same.
                let _ = self.catalog.release_task(&task.id, task.fence).await;
                None
            }
            Ok(Err(JobError::Exhausted(e))) => {
                tracing::warn!(task = task.id, error = %e, "task failed: a resource ran out; its unfinished files were removed");
                Some(TaskEnd::Failed(error_json(
                    e.code,
                    &format!("{}; the task's unfinished files were removed — start it again once the server has room", e.detail),
                )))
            }
            Ok(Err(JobError::Parked)) => None,
            Ok(Err(JobError::Busy(msg))) => {
                // Pause before releasing, so the run that holds the file can stop (its lease
                // renewal fails, it is cancelled and lets go) without this one spinning on claims.
                tracing::warn!(task = task.id, error = msg, "task busy: an earlier run still holds its file; running it again shortly");
                tokio::time::sleep(BUSY_PAUSE).await;
                let _ = self.catalog.release_task(&task.id, task.fence).await;
                None
            }
            Ok(Err(JobError::Cancelled)) => {
                // Cancelled by the user: already terminal. By shutdown or a lost lease: let it
                // resume from its checkpoint.
                let _ = self.catalog.release_task(&task.id, task.fence).await;
                None
            }
            Ok(Err(JobError::Internal(msg))) => {
                tracing::error!(task = task.id, error = msg, "task failed internally");
                if self.shutdown.is_cancelled() {
                    let _ = self.catalog.release_task(&task.id, task.fence).await;
                    None
                } else {
                    Some(TaskEnd::Failed(error_json(ErrorCode::Internal, "the job failed on a server error")))
                }
            }
            Err(_) => {
                tracing::error!(task = task.id, "job panicked");
                Some(TaskEnd::Failed(error_json(ErrorCode::Internal, "the job panicked")))
            }
        };
        if let Some(end) = end {
            self.record_end(&task, &end, now).await;
        }
    }

    /// Record a task's end. A catalog that cannot write now (disk full, busy: DESIGN §9) is
    /// asked again with backoff for as long as the lease lasts, so the task does not sit in
    /// `working` with frozen progress; if it never answers, the lease expires and another
    /// worker runs the task again.
    async fn record_end(&self, task: &TaskRecord, end: &TaskEnd, now: i64) {
        let deadline = std::time::Instant::now() + self.cfg.lease;
        let mut wait = Duration::from_millis(50);
        loop {
            match self.catalog.finish_task(&task.id, Some(task.fence), end, now).await {
                Ok(true) => return tracing::info!(task = task.id, "task ended"),
                Ok(false) => return tracing::info!(task = task.id, "late result discarded (cancelled or taken over)"),
                Err(e @ (CatalogError::Full(_) | CatalogError::Unavailable(_)))
                    if std::time::Instant::now() + wait < deadline && !self.shutdown.is_cancelled() =>
                {
                    tracing::warn!(task = task.id, error = %e, "recording a task's end failed; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    return tracing::error!(task = task.id, error = %e, "recording a task's end failed; the task runs again when its lease expires")
                }
            }
        }
    }
}

fn terminal(task: &TaskRecord) -> Refusal {
    Refusal::new(
        409,
        ErrorCode::Conflict,
        format!("task {} is already {}", task.id, task.status.as_str()),
        "A finished task cannot change; start a new one.",
    )
}

/// An answer to outstanding input request `key` of `task` against the request's `schema`
/// (a JSON Schema the job declared, relayed to clients as the request's answer shape): a
/// refusal names each place that does not fit, and nothing is stored (issue 23, kind 3).
fn check_response(task: &TaskRecord, key: &str, response: &str) -> Result<(), Refusal> {
    let requests: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&task.input_requests).unwrap_or_default();
    let answered: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&task.input_responses).unwrap_or_default();
    let Some(schema) = requests.get(key).filter(|_| !answered.contains_key(key)).and_then(|r| r.get("schema")).filter(|s| s.is_object()) else {
        return Ok(());
    };
    // A schema the job wrote that is not one cannot be held against the answer.
    let Ok(v) = jsonschema::validator_for(schema) else { return Ok(()) };
    let value: serde_json::Value = serde_json::from_str(response)
        .map_err(|e| Refusal::bad_request(format!("response is not JSON: {e}"), "Send the response as a JSON value."))?;
    super::schema_check::check(&v, &value, "response").map_err(|m| {
        Refusal::bad_request(
            format!("the response does not match the schema of input request {key:?}: {m}"),
            format!("Send a response that fits input_requests[{key:?}].schema (the places that do not fit are named in detail)."),
        )
    })
}

/// Log a background catalog failure once: at warn when it passes by itself (the catalog is away
/// for now), at error otherwise.
fn log_catalog_failure(e: &crate::catalog::CatalogError, what: &str) {
    if matches!(e, crate::catalog::CatalogError::Unavailable(_)) {
        tracing::warn!(error = %e, "{what}");
    } else {
        tracing::error!(error = %e, "{what}");
    }
}
