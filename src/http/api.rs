//! The JSON API under `/api/v1`: tasks (start with `Idempotency-Key`, get, list, answer
//! input, cancel, and the `external` producer's progress/complete/fail) and files (list, info).
//!
//! Arguments and results travel as exact JSON text: what a client sends comes back byte for
//! byte. Status payloads never carry arguments; `GET /tasks/{id}/args` returns them.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use ferry_tus::{TusError, UploadMetadata};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::auth::Principal;
use super::tus::header;
use super::{AppState, Problem};
use crate::catalog::{Progress, TaskRecord, UploadRecord};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/tasks", post(start_task).get(list_tasks))
        .route("/tasks/{id}", get(get_task))
        .route("/tasks/{id}/args", get(task_args))
        .route("/tasks/{id}/input", post(respond))
        .route("/tasks/{id}/cancel", post(cancel))
        .route("/tasks/{id}/progress", post(report_progress))
        .route("/tasks/{id}/complete", post(complete))
        .route("/tasks/{id}/fail", post(fail))
        .route("/files", get(list_files))
        .route("/files/{id}", get(file_info))
}

fn json_body<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, Problem> {
    serde_json::from_slice(body).map_err(|e| Problem(TusError::bad_request(format!("invalid JSON body: {e}"), "Send a JSON object as documented in /api/v1/openapi.json.")))
}

/// Milliseconds between polls a client should wait.
const POLL_AFTER_MS: u64 = 1000;

/// The status payload of a task.
#[derive(Serialize)]
pub struct TaskView<'a> {
    pub id: &'a str,
    pub kind: &'a str,
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_message: Option<&'a str>,
    pub progress: &'a Progress,
    /// Outstanding input requests: key → request.
    pub input_requests: serde_json::Map<String, serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prior_failure: Option<&'a str>,
    /// Unix ms.
    pub created_at: i64,
    pub updated_at: i64,
    pub ttl_ms: i64,
    /// How many times a worker started or resumed the job.
    pub runs: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_after_ms: Option<u64>,
}

fn raw_ref(text: &Option<String>) -> Option<&RawValue> {
    text.as_deref().and_then(|t| serde_json::from_str::<&RawValue>(t).ok())
}

/// The view of `t`; input requests already answered are left out.
pub fn task_view(t: &TaskRecord) -> TaskView<'_> {
    let mut requests: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&t.input_requests).unwrap_or_default();
    let answered: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&t.input_responses).unwrap_or_default();
    requests.retain(|k, _| !answered.contains_key(k));
    TaskView {
        id: &t.id,
        kind: &t.kind,
        status: t.status.as_str(),
        status_message: t.status_message.as_deref(),
        progress: &t.progress,
        input_requests: requests,
        result: raw_ref(&t.result),
        error: raw_ref(&t.error),
        idempotency_key: t.idempotency_key.as_deref(),
        prior_failure: t.prior_failure.as_deref(),
        created_at: t.created_at_ms,
        updated_at: t.updated_at_ms,
        ttl_ms: t.ttl_ms,
        runs: t.runs,
        poll_after_ms: (!t.status.is_terminal()).then_some(POLL_AFTER_MS),
    }
}

fn task_json(status: StatusCode, t: &TaskRecord) -> Response {
    (status, axum::Json(task_view(t))).into_response()
}

#[derive(Deserialize)]
struct StartBody<'a> {
    kind: String,
    #[serde(borrow)]
    args: Option<&'a RawValue>,
    ttl_ms: Option<i64>,
}

/// `POST /api/v1/tasks` `{kind, args, ttl_ms?}` with optional `Idempotency-Key` → 201 with
/// the new task, or 200 with the task the key already names.
async fn start_task(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, h: HeaderMap, body: Bytes) -> Result<Response, Problem> {
    let b: StartBody = json_body(&body)?;
    let key = header(&h, "idempotency-key");
    if key == Some("\u{0}") {
        return Err(Problem(TusError::bad_request("Idempotency-Key must be one visible-ASCII value", "Send one Idempotency-Key header.")));
    }
    let args = b.args.map(RawValue::get).unwrap_or("null");
    let started = s.tasks.start(&p, &b.kind, args, key, b.ttl_ms).await?;
    let mut res = task_json(if started.created { StatusCode::CREATED } else { StatusCode::OK }, &started.task);
    if let Ok(loc) = HeaderValue::from_str(&format!("/api/v1/tasks/{}", started.task.id)) {
        res.headers_mut().insert("location", loc);
    }
    Ok(res)
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<u32>,
}

#[derive(Serialize)]
struct TaskList<'a> {
    tasks: Vec<TaskView<'a>>,
}

async fn list_tasks(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, Query(q): Query<ListQuery>) -> Result<Response, Problem> {
    let tasks = s.tasks.list(&p, q.limit.unwrap_or(100)).await?;
    Ok(axum::Json(TaskList { tasks: tasks.iter().map(task_view).collect() }).into_response())
}

async fn get_task(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, Path(id): Path<String>) -> Result<Response, Problem> {
    Ok(task_json(StatusCode::OK, &s.tasks.get(&p, &id).await?))
}

/// The task's arguments, exactly as sent.
async fn task_args(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, Path(id): Path<String>) -> Result<Response, Problem> {
    let t = s.tasks.get(&p, &id).await?;
    Ok(([("content-type", "application/json")], t.args).into_response())
}

#[derive(Deserialize)]
struct InputBody<'a> {
    key: String,
    #[serde(borrow)]
    response: &'a RawValue,
}

/// `POST /tasks/{id}/input` `{key, response}` → `{accepted, task}`. A key that is not
/// outstanding is ignored (`accepted: false`).
async fn respond(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, Path(id): Path<String>, body: Bytes) -> Result<Response, Problem> {
    let b: InputBody = json_body(&body)?;
    let (accepted, t) = s.tasks.respond(&p, &id, &b.key, b.response.get()).await?;
    Ok(axum::Json(serde_json::json!({ "accepted": accepted, "task": task_view(&t) })).into_response())
}

async fn cancel(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, Path(id): Path<String>) -> Result<Response, Problem> {
    Ok(task_json(StatusCode::OK, &s.tasks.cancel(&p, &id).await?))
}

async fn report_progress(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, Path(id): Path<String>, body: Bytes) -> Result<Response, Problem> {
    let progress: Progress = json_body(&body)?;
    if progress.fraction.is_some_and(|f| !(0.0..=1.0).contains(&f)) {
        return Err(Problem(TusError::bad_request("fraction must be between 0 and 1", "Send a fraction in [0, 1].")));
    }
    Ok(task_json(StatusCode::OK, &s.tasks.report(&p, &id, progress).await?))
}

#[derive(Deserialize)]
struct CompleteBody<'a> {
    #[serde(borrow)]
    result: Option<&'a RawValue>,
    /// Ids of finished uploads (sent with TUS) the task produced.
    #[serde(default)]
    files: Vec<String>,
}

/// `POST /tasks/{id}/complete` `{result?, files?}`: with files, the stored result is
/// `{"files": [file info…], "result": <result>}`; without, the result exactly.
async fn complete(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, Path(id): Path<String>, body: Bytes) -> Result<Response, Problem> {
    let b: CompleteBody = json_body(&body)?;
    let result = b.result.map(RawValue::get).unwrap_or("null");
    let text = if b.files.is_empty() {
        result.to_string()
    } else {
        let mut infos = Vec::new();
        for f in &b.files {
            let rec = s.engine.get(&p, f).await?;
            if !rec.is_finished() {
                return Err(Problem(TusError::new(409, ferry_tus::ErrorCode::UploadIncomplete, format!("file {f} is not complete"), "Finish uploading the file, then complete the task.").with_cursor(rec.offset)));
            }
            infos.push(file_view(&rec));
        }
        #[derive(Serialize)]
        struct WithFiles<'a> {
            files: Vec<FileView>,
            result: &'a RawValue,
        }
        let raw: &RawValue = serde_json::from_str(result).expect("already parsed");
        serde_json::to_string(&WithFiles { files: infos, result: raw }).expect("serialises")
    };
    Ok(task_json(StatusCode::OK, &s.tasks.finish_external(&p, &id, Ok(text)).await?))
}

#[derive(Deserialize)]
struct FailBody {
    message: String,
}

async fn fail(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, Path(id): Path<String>, body: Bytes) -> Result<Response, Problem> {
    let b: FailBody = json_body(&body)?;
    Ok(task_json(StatusCode::OK, &s.tasks.finish_external(&p, &id, Err(b.message)).await?))
}

/// What the API says about a file (an upload).
#[derive(Debug, Serialize)]
pub struct FileView {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub media_type: String,
    /// Total bytes, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Bytes stored so far.
    pub offset: u64,
    pub complete: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    pub created_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// Relative URL for GET (download) and TUS requests.
    pub url: String,
}

pub fn file_view(r: &UploadRecord) -> FileView {
    let md: UploadMetadata = r.metadata.parse().unwrap_or_default();
    let get = |keys: &[&str]| keys.iter().find_map(|k| md.get_str(k).map(str::to_owned));
    FileView {
        id: r.id.clone(),
        name: get(&["filename", "name"]),
        media_type: get(&["filetype", "contentType", "type"]).unwrap_or_else(|| "application/octet-stream".into()),
        size: r.length,
        offset: r.offset,
        complete: r.is_finished(),
        sha256: r.sha256.map(hex::encode),
        created_at: r.created_at_ms,
        expires_at: if r.is_finished() { None } else { r.expires_at_ms },
        url: format!("{}{}", super::FILES_PATH, r.id),
    }
}

async fn list_files(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, Query(q): Query<ListQuery>) -> Result<Response, Problem> {
    let files = s.engine.list(&p, q.limit.unwrap_or(100)).await?;
    Ok(axum::Json(serde_json::json!({ "files": files.iter().map(file_view).collect::<Vec<_>>() })).into_response())
}

/// File info; unlike HEAD on /files/{id}, never interrupts an upload in progress.
async fn file_info(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, Path(id): Path<String>) -> Result<Response, Problem> {
    Ok(axum::Json(file_view(&s.engine.get(&p, &id).await?)).into_response())
}
