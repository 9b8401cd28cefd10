//! Partial results over REST (issue 27): `GET /api/v1/tasks/{id}?partial_after=SEQ` (in
//! [`super::api`]) shows only fragments numbered above `SEQ`, and an `external` producer appends
//! with `POST /api/v1/tasks/{id}/partial {"fragment": …}`. The fragments, their numbering and
//! bounds are [`crate::catalog::partials`]'s.

use crate::error::Refusal;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use super::api::{body_bytes, checked_body, task_view, TaskView};
use super::{AppState, Problem};
use crate::app::Principal;
use crate::catalog::TaskRecord;

/// The `partial` member of a task: kept partial result fragments, oldest first.
#[derive(ToSchema)]
#[schema(as = PartialResults)]
#[allow(dead_code)]
pub(super) struct PartialResultsDoc {
    /// Fragments numbered above `partial_after` (all kept ones without it), oldest first. At
    /// most 256 are kept, whose view stays within 64 KiB; older ones are dropped.
    fragments: Vec<FragmentDoc>,
    /// How many of the task's fragments were dropped to stay within the bounds.
    #[schema(minimum = 0)]
    dropped: u64,
    /// The task's last fragment number (0: none yet): pass it as `partial_after` to read only
    /// fragments appended after this view.
    #[schema(minimum = 0)]
    next: u64,
}

/// One partial result fragment.
#[derive(ToSchema)]
#[schema(as = PartialFragment)]
#[allow(dead_code)]
pub(super) struct FragmentDoc {
    /// 1, 2, 3… per task, never reused.
    #[schema(minimum = 1)]
    seq: u64,
    /// When it was appended, Unix ms.
    at_ms: i64,
    /// The fragment, exactly as appended (any JSON).
    #[schema(value_type = serde_json::Value)]
    value: serde_json::Value,
}

/// Query of `GET /api/v1/tasks/{id}`.
#[derive(Deserialize)]
pub(super) struct TaskQuery {
    partial_after: Option<String>,
}

/// `partial_after` as a whole number (digits only) up to `i64::MAX`, default 0.
pub(super) fn partial_after(q: Result<Query<TaskQuery>, QueryRejection>) -> Result<u64, Problem> {
    let bad = || {
        Problem(Refusal::bad_request(
            "partial_after must be a whole number from 0 to 9223372036854775807 (a fragment seq)",
            "Send the `partial.next` of the last view you read, or omit it for every kept fragment.",
        ))
    };
    match q {
        Ok(Query(TaskQuery { partial_after: None })) => Ok(0),
        // Fragment numbers are signed 64-bit in the catalog; the document says the same bound.
        Ok(Query(TaskQuery { partial_after: Some(v) })) => {
            ferry_tus::parse_u64_digits(&v, "partial_after").ok().filter(|n| i64::try_from(*n).is_ok()).ok_or_else(bad)
        }
        Err(_) => Err(bad()),
    }
}

/// `t`'s view with its partial results numbered above `after`.
pub(super) async fn task_json_after(s: &AppState, status: StatusCode, t: &TaskRecord, after: u64) -> Result<Response, Problem> {
    let page = s.tasks.partials(t, after).await?;
    Ok((status, axum::Json(with_partial(task_view(t), &page))).into_response())
}

/// `view` showing `page` as its `partial`.
pub(crate) fn with_partial<'a>(mut view: TaskView<'a>, page: &'a crate::catalog::PartialPage) -> TaskView<'a> {
    view.partial = Some(page);
    view
}

/// Append a partial result.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AppendPartial)]
pub(super) struct AppendBody<'a> {
    /// The fragment: any JSON value of at most 16 KiB (rows so far, a first finding).
    #[serde(borrow)]
    #[schema(value_type = serde_json::Value)]
    fragment: &'a RawValue,
}

/// Append a partial result to an `external` task (its producer only).
///
/// `POST /tasks/{id}/partial {"fragment": …}` → the task, its `partial` showing only the new
/// fragment (`partial.next` is its number). Readers see it at once in the task view and as a
/// `task.partial` event. Allowed while the task is `working` or `input_required`.
#[utoipa::path(post, path = "/api/v1/tasks/{id}/partial", tag = "tasks", operation_id = "append_partial",
    params(("id" = String, Path, description = "Task id (kind `external`).")),
    request_body(content = AppendBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The task after the append; `partial.fragments` holds the new fragment.", body = TaskView),
    ))]
pub(super) async fn append_partial(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let body = body_bytes(body)?;
    let b: AppendBody = checked_body(&body, "AppendPartial")?;
    let (seq, t) = s.tasks.append_external(&p, &id, b.fragment.get()).await?;
    task_json_after(&s, StatusCode::OK, &t, seq - 1).await
}
