//! The JSON API under `/api/v1`: tasks (start with `Idempotency-Key`, get, list, answer
//! input, cancel, and the `external` producer's progress/complete/fail) and files (list, info).
//!
//! One file of ~1 140 lines because the routes, their handlers and the OpenAPI document generated
//! from the handlers' annotations change together: a route added to [`routes`] gets its
//! annotation and its `paths(...)` entry in [`ApiDoc`] in the same file. The schema-only types
//! (`*Doc`, about 130 lines) are the part that could move out if the file grows.
//!
//! Arguments and results travel as exact JSON text: what a client sends comes back byte for
//! byte. Status payloads never carry arguments; `GET /tasks/{id}/args` returns them.
//!
//! The OpenAPI document (`GET /api/v1/openapi.json`) is generated from the annotations here
//! ([`ApiDoc`]): keep every route in [`routes`] listed in `ApiDoc`'s `paths(...)`.

use crate::error::{ErrorCode, Refusal};
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{OpenApi, PartialSchema, ToSchema};

use super::{AppState, Problem};
use crate::app::views::{file_view, DamageView, FileView};
use crate::app::Principal;
use crate::catalog::{Progress, TaskRecord};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/tasks", post(start_task).get(list_tasks))
        .route("/tasks/{id}", get(get_task))
        .route("/tasks/{id}/args", get(task_args))
        .route("/tasks/{id}/input", post(respond))
        .route("/tasks/{id}/cancel", post(cancel))
        .route("/tasks/{id}/progress", post(report_progress))
        .route("/tasks/{id}/partial", post(super::task_partials::append_partial))
        .route("/tasks/{id}/complete", post(complete))
        .route("/tasks/{id}/fail", post(fail))
        .route("/files", get(list_files))
        .route("/files/{id}", get(file_info))
        .route("/files/{id}/share", post(share_file))
        .route("/zip", get(super::zip::zip_files))
        .route("/openapi.json", get(openapi_json))
        .route("/events", get(super::events::events))
        .route("/webhooks/deliveries", get(super::events::deliveries))
        .merge(super::links::api_routes())
}

/// The OpenAPI 3.1 description of this API, generated from the handlers' annotations.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "ferry API",
        description = "Tasks (durable background jobs that produce files) and files (uploads) of ferry. \
            Uploads themselves use TUS 1.0 on /files/ and are not described here. \
            Every error is RFC 9457 `application/problem+json` with ferry's stable `code`, `retryable` and `recovery_hint`."
    ),
    paths(
        start_task, list_tasks, get_task, task_args, respond, cancel, report_progress, super::task_partials::append_partial, complete, fail,
        list_files, file_info, share_file, super::zip::zip_files, super::links::create_link, super::links::list_links,
        super::links::get_link, super::links::revoke_link_post, openapi_json, super::events::events, super::events::deliveries
    ),
    components(schemas(
        TaskView, TaskList, super::task_partials::PartialResultsDoc, super::task_partials::FragmentDoc, super::task_partials::AppendBody,
        TaskStatusDoc, ProgressDoc, TaskErrorDoc, StartBody, InputBody, InputAnswer, CompleteBody, FailBody, FileView, DamageView, FileList,
        ShareBody, ShareView, super::links::LinkBody, super::links::LinkView, super::links::LinkList, ProblemDoc, ErrorCodeDoc, PartialDoc,
        QuotaDoc, super::events::DeliveryList
    )),
    modifiers(&DocExtras),
    security(("bearer" = [])),
    tags(
        (name = "tasks", description = "Durable background jobs: start (idempotently), poll, answer \
                                        input, cancel; and the `external` producer's reports."),
        (name = "files", description = "Uploads and task artifacts: list and info. Download with GET /files/{id} (ranged)."),
        (name = "links", description = "Links a person opens at /l/{id}: a share of several files or a request for \
                                        several files, with a message, a passphrase, a download limit; revoked at once."),
        (name = "events", description = "Live events of the caller's uploads and tasks (Server-Sent Events) and webhook deliveries."),
        (name = "meta", description = "This document."),
    )
)]
pub struct ApiDoc;

/// Adds what the derive cannot express: the bearer scheme and the generic problem response.
/// Each operation's error responses come from [`super::api_answers`] ([`document`]).
struct DocExtras;

impl utoipa::Modify for DocExtras {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token from `ferry token create NAME`. Required only when the server has \
                         tokens configured; otherwise every request acts as principal `local`.",
                    ))
                    .build(),
            ),
        );
        let problem = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(PROBLEM_JSON, ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build())
                .build()
        };
        components.responses.insert("Problem".into(), RefOr::T(problem("An RFC 9457 problem (see the `code`).")));
    }
}

const PROBLEM_JSON: &str = "application/problem+json";

/// `GET /api/v1/openapi.json`.
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "meta", operation_id = "openapi",
    responses((status = 200, description = "This OpenAPI 3.1 document.", content_type = "application/json", body = Object)))]
async fn openapi_json(State(s): State<AppState>) -> Response {
    let kinds: Vec<(String, Option<serde_json::Value>)> = s.tasks.kind_schemas().into_iter().filter(|(k, _)| k != "concat").collect();
    let doc = document(!s.tokens.is_empty(), &kinds);
    ([("content-type", "application/json")], serde_json::to_string_pretty(&doc).expect("the OpenAPI document serialises")).into_response()
}

/// The OpenAPI document as this server enforces it: the derived [`ApiDoc`] plus the
/// constraints whose values live in constants the checks use too (so the two cannot drift):
/// `limit` 1 to [`MAX_LIST_LIMIT`], `ttl_ms` of a share 1 to [`crate::signing::MAX_URL_TTL_MS`],
/// `Idempotency-Key` of 1 to [`ferry_tus::IdempotencyKey::MAX_LEN`] characters, the task kinds
/// this server has, and `Authorization` only when the server has tokens (without tokens every
/// request acts as `local` and no operation answers 401).
pub fn document(with_tokens: bool, kinds: &[(String, Option<serde_json::Value>)]) -> serde_json::Value {
    use serde_json::{json, Value};
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document serialises");
    let limit = json!({ "type": "integer", "format": "int32", "minimum": 1, "maximum": MAX_LIST_LIMIT, "default": DEFAULT_LIST_LIMIT });
    for path in ["/api/v1/files", "/api/v1/tasks", "/api/v1/links"] {
        if let Some(params) = doc.pointer_mut(&format!("/paths/{}/get/parameters", path.replace('/', "~1"))).and_then(Value::as_array_mut) {
            for p in params.iter_mut().filter(|p| p["name"] == "limit") {
                p["schema"] = limit.clone();
                p["description"] = json!(format!("At most this many, 1 to {MAX_LIST_LIMIT} (default {DEFAULT_LIST_LIMIT}); other values are 400."));
            }
        }
    }
    if let Some(params) = doc.pointer_mut("/paths/~1api~1v1~1zip/get/parameters").and_then(Value::as_array_mut) {
        for p in params.iter_mut().filter(|p| p["name"] == "files") {
            p["schema"] = json!({ "type": "string", "pattern": super::zip::FILES_PATTERN });
        }
    }
    if let Some(params) = doc.pointer_mut("/paths/~1api~1v1~1tasks/post/parameters").and_then(Value::as_array_mut) {
        for p in params.iter_mut().filter(|p| p["name"] == "Idempotency-Key") {
            let max = ferry_tus::IdempotencyKey::MAX_LEN;
            // The bare form; an RFC 9651 string ("…") of the same characters is accepted too.
            p["schema"] = json!({ "type": "string", "minLength": 1, "maxLength": max, "pattern": format!("^[!-~]{{1,{max}}}$") });
            p["description"] = json!(format!("1 to {max} characters (visible ASCII, or an RFC 9651 string \"…\"); makes the start safe to retry."));
        }
    }
    // Every request body is an object of the members its schema lists: any other member is
    // refused by name (400), as a misspelt optional member would otherwise be ignored.
    for name in ["StartTask", "InputResponse", "CompleteTask", "FailTask", "Progress", "ShareBody", "AppendPartial", "LinkBody"] {
        if let Some(body) = doc.pointer_mut(&format!("/components/schemas/{name}")).and_then(Value::as_object_mut) {
            body.insert("additionalProperties".into(), json!(false));
        }
    }
    if let Some(complete) = doc.pointer_mut("/components/schemas/CompleteTask") {
        complete["properties"]["files"] = json!({
            "type": "array",
            "items": { "type": "string" },
            "deprecated": true,
            "description": "Deprecated name of file_ids; send one of the two."
        });
        complete["not"] = json!({ "required": ["file_ids", "files"] });
    }
    if let Some(ttl) = doc.pointer_mut("/components/schemas/StartTask/properties/ttl_ms") {
        ttl["minimum"] = json!(1);
        ttl["maximum"] = json!(crate::tasks::MAX_TASK_TTL_MS);
        ttl["description"] =
            json!(format!("Keep the task this long after it finishes, ms: 1 to {} (366 days; default 24 h).", crate::tasks::MAX_TASK_TTL_MS));
    }
    if let Some(share) = doc.pointer_mut("/components/schemas/ShareBody") {
        share["required"] = json!([]);
        share["properties"]["scope"] = json!({
            "type": ["string", "null"],
            "enum": ["download", "upload", null],
            "description": "`download` (GET/HEAD of the finished file, the default) or `upload` (TUS HEAD/PATCH to finish it)."
        });
        share["properties"]["ttl_ms"]["minimum"] = json!(1);
        share["properties"]["ttl_ms"]["maximum"] = json!(crate::signing::MAX_URL_TTL_MS);
    }
    if let Some(link) = doc.pointer_mut("/components/schemas/LinkBody") {
        link["properties"]["kind"] = json!({
            "type": "string",
            "enum": ["share", "request"],
            "description": "`share` (people download `files`) or `request` (people upload files into it).",
        });
        link["properties"]["ttl_ms"]["minimum"] = json!(1);
        link["properties"]["ttl_ms"]["maximum"] = json!(crate::app::links::MAX_LINK_TTL_MS);
        link["properties"]["message"]["maxLength"] = json!(crate::app::links::MAX_MESSAGE_CHARS);
        link["properties"]["files"]["maxItems"] = json!(crate::app::links::MAX_LINK_FILES);
        link["properties"]["max_files"]["minimum"] = json!(1);
        link["properties"]["max_files"]["maximum"] = json!(crate::app::links::MAX_LINK_FILES);
        link["properties"]["max_downloads"]["minimum"] = json!(1);
        link["properties"]["passphrase"]["minLength"] = json!(1);
        link["properties"]["passphrase"]["maxLength"] = json!(crate::app::links::MAX_PASSPHRASE_BYTES);
    }
    if let Some(start) = doc.pointer_mut("/components/schemas/StartTask") {
        // Each kind's `args` as that kind's schema, the one the start checks them with
        // (`Job::args_schema`); a kind without one takes any JSON (issue 23, kind 2).
        let names: Vec<&String> = kinds.iter().map(|(k, _)| k).collect();
        start["properties"]["kind"]["enum"] = json!(names);
        let variants: Vec<Value> = kinds
            .iter()
            .map(|(k, schema)| match schema {
                Some(s) => json!({ "title": k, "properties": { "kind": { "const": k }, "args": s }, "required": ["kind", "args"] }),
                None => json!({ "title": k, "properties": { "kind": { "const": k } }, "required": ["kind"] }),
            })
            .collect();
        start["oneOf"] = Value::Array(variants);
    }
    // Every refusal each operation can answer, from the one list the server holds its answers
    // to (issue 48, kind 5).
    super::api_answers::document_errors(&mut doc, with_tokens);
    if !with_tokens {
        if let Some(o) = doc.as_object_mut() {
            o.remove("security");
        }
        if let Some(scheme) = doc.pointer_mut("/components/securitySchemes/bearer/description") {
            *scheme = json!("This server has no tokens: requests need no Authorization and act as principal `local`.");
        }
    }
    doc
}

/// RFC 9457 problem details, as every error of ferry is rendered.
#[derive(ToSchema)]
#[schema(as = Problem)]
#[allow(dead_code)]
pub(super) struct ProblemDoc {
    /// `urn:ferry:error:<code>`.
    #[schema(rename = "type", example = "urn:ferry:error:not_found")]
    type_: String,
    /// The HTTP status's reason phrase.
    #[schema(example = "Not Found")]
    title: String,
    status: u16,
    /// What went wrong, for a person.
    detail: String,
    code: ErrorCodeDoc,
    /// Whether repeating the (repaired) request can succeed without a person's help.
    retryable: bool,
    /// What to do about it.
    recovery_hint: String,
    /// Present when part of the work is durable, e.g. an upload's offset to resume from.
    partial: Option<PartialDoc>,
    /// Present with `quota_exceeded`: which per-principal quota, its limit and the current use.
    quota: Option<QuotaDoc>,
}

/// A per-principal quota that refused the request.
#[derive(ToSchema)]
#[schema(as = Quota)]
#[allow(dead_code)]
struct QuotaDoc {
    /// `bytes` (bytes stored) or `uploads_in_progress` (unfinished uploads).
    name: String,
    /// The configured limit (bytes, or a count).
    limit: u64,
    /// The principal's current use without this request (bytes, or a count).
    used: u64,
    /// What the request needed on top (bytes, or 1 upload).
    requested: u64,
}

/// Durable progress of a refused request.
#[derive(ToSchema)]
#[schema(as = Partial)]
#[allow(dead_code)]
struct PartialDoc {
    /// Where to resume from (bytes).
    cursor: u64,
}

/// ferry's stable error codes (the list comes from `crate::error::ErrorCode::ALL`).
struct ErrorCodeDoc;

impl PartialSchema for ErrorCodeDoc {
    fn schema() -> RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some("Stable machine-readable error code."))
            .enum_values(Some(crate::error::ErrorCode::ALL.iter().map(|c| c.as_str())))
            .into()
    }
}

impl ToSchema for ErrorCodeDoc {
    fn name() -> std::borrow::Cow<'static, str> {
        "ErrorCode".into()
    }
}

/// Task status, as MCP names them; `completed`, `failed` and `cancelled` are terminal.
#[derive(Serialize, ToSchema)]
#[schema(as = TaskStatus)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum TaskStatusDoc {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

/// Progress of a task: a fraction in [0, 1] when known, a message, and named counters.
#[derive(ToSchema)]
#[schema(as = Progress)]
#[allow(dead_code)]
struct ProgressDoc {
    #[schema(minimum = 0.0, maximum = 1.0, example = 0.42)]
    fraction: Option<f64>,
    message: Option<String>,
    /// Named counters, e.g. `{"pages": 10, "items": 400}`.
    #[schema(example = json!({"pages": 10, "items": 400}))]
    counters: Option<std::collections::BTreeMap<String, u64>>,
}

/// Why a task failed.
#[derive(ToSchema)]
#[schema(as = TaskError)]
#[allow(dead_code)]
struct TaskErrorDoc {
    #[schema(example = "task_failed")]
    code: ErrorCodeDoc,
    message: String,
    /// Whether starting the task again as it was can succeed (the code's retryability).
    retryable: bool,
    /// The one next step, in HTTP terms.
    #[schema(example = "Read message, fix the arguments or inputs it names, and start the task \
                        again (POST /api/v1/tasks; the same Idempotency-Key starts a new run).")]
    recovery_hint: String,
}

/// A failed task's `error` as the REST API shows it: the transport-neutral code and message,
/// with the code's retryability and the next step in HTTP terms (as every problem body has).
#[derive(Serialize)]
pub struct TaskErrorView {
    #[serde(flatten)]
    error: crate::app::views::TaskError,
    retryable: bool,
    recovery_hint: String,
}

impl TaskErrorView {
    fn of(error: crate::app::views::TaskError) -> TaskErrorView {
        let code = ErrorCode::ALL.into_iter().find(|k| k.as_str() == error.code).unwrap_or(ErrorCode::TaskFailed);
        let again = "POST /api/v1/tasks; the same Idempotency-Key starts a new run";
        let recovery_hint = match code {
            ErrorCode::Internal => format!("Start the task again ({again}); the failure was on the server's side."),
            ErrorCode::QuotaExceeded => {
                format!(
                    "The task's output would exceed the storage quota; its partial output was removed. \
                     Delete files you no longer need (DELETE /files/ID), then start the task again ({again})."
                )
            }
            ErrorCode::InsufficientStorage | ErrorCode::Unavailable => {
                format!(
                    "The server ran out of disk space (or another resource) while running the \
                     task; its partial output was removed. Start the task again later ({again})."
                )
            }
            _ => format!("Read message, fix the arguments or inputs it names, and start the task again ({again})."),
        };
        TaskErrorView { error, retryable: code.retryable(), recovery_hint }
    }
}

/// Largest JSON request body, in bytes (task arguments, results, answers).
pub const MAX_JSON_BODY: usize = 1 << 20;

/// The body, or 413 `size_exceeded` past [`MAX_JSON_BODY`] (the router sets the limit).
pub(super) fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Problem> {
    body.map_err(|e| match e {
        BytesRejection::FailedToBufferBody(_) => Problem(Refusal::new(
            413,
            crate::error::ErrorCode::SizeExceeded,
            format!("the request body is larger than {MAX_JSON_BODY} bytes"),
            "Send large data as a file (TUS upload) and pass its id instead.",
        )),
        _ => Problem(Refusal::bad_request("the request body could not be read", "Send the JSON body again.")),
    })
}

/// Deepest nesting of arrays and objects a JSON request body may have (the body object is
/// level 1).
pub const MAX_JSON_NESTING: usize = 64;

/// The nesting depth of arrays and objects in JSON text `body` once it passes `most`, or
/// `None` when it stays within (brackets inside strings do not count; the text need not be
/// valid JSON: the parser judges that afterwards).
fn nesting_beyond(body: &[u8], most: usize) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in body {
        match (in_string, b) {
            (true, _) if escaped => escaped = false,
            (true, b'\\') => escaped = true,
            (true, b'"') => in_string = false,
            (true, _) => {}
            (false, b'"') => in_string = true,
            (false, b'[' | b'{') => {
                depth += 1;
                if depth > most {
                    return Some(depth);
                }
            }
            (false, b']' | b'}') => depth = depth.saturating_sub(1),
            (false, _) => {}
        }
    }
    None
}

/// Most items one list answer holds (`limit` ≤ this); the OpenAPI document states it.
pub const MAX_LIST_LIMIT: u32 = 1000;
/// Items a list answer holds without `limit`.
pub const DEFAULT_LIST_LIMIT: u32 = 100;

/// `limit` query parameter: 1 to [`MAX_LIST_LIMIT`], default [`DEFAULT_LIST_LIMIT`].
pub(super) fn limit(q: Result<Query<ListQuery>, QueryRejection>) -> Result<u32, Problem> {
    match q {
        Ok(Query(ListQuery { limit: None })) => Ok(DEFAULT_LIST_LIMIT),
        Ok(Query(ListQuery { limit: Some(n) })) if (1..=MAX_LIST_LIMIT).contains(&n) => Ok(n),
        _ => Err(Problem(Refusal::bad_request(
            format!("limit must be a whole number from 1 to {MAX_LIST_LIMIT}"),
            format!("Send ?limit={DEFAULT_LIST_LIMIT} or omit it."),
        ))),
    }
}

/// A request body: every one this API takes is a JSON object (serde would also read a struct
/// from an array, which the document does not allow).
/// `schema`: the component whose bounds a number past 64 bits is named with.
fn json_body<'a, T: Deserialize<'a>>(body: &'a [u8], schema: Option<&str>) -> Result<T, Problem> {
    let hint = "Send a JSON object as documented in /api/v1/openapi.json.";
    if !body.trim_ascii_start().starts_with(b"{") {
        return Err(Problem(Refusal::bad_request("the request body must be a JSON object", hint)));
    }
    serde_json::from_slice(body).map_err(|e| {
        let past = serde_json::from_slice::<serde_json::Value>(body).ok().and_then(|v| {
            crate::app::schema_check::number_past_64_bits(&v, schema.and_then(|name| BODY_DOC.pointer(&format!("/components/schemas/{name}"))))
        });
        Problem(Refusal::bad_request(format!("invalid JSON body: {}", past.map_or_else(|| e.to_string(), |m| format!("body{m}"))), hint))
    })
}

/// The `operationId` of the documented operation `method` `route` (a route template as
/// matched, `/api/v1/tasks/{id}`), if there is one.
pub(super) fn operation_of(method: &axum::http::Method, route: &str) -> Option<&'static str> {
    static OPERATIONS: std::sync::LazyLock<std::collections::BTreeMap<(String, String), String>> = std::sync::LazyLock::new(|| {
        let mut ops = std::collections::BTreeMap::new();
        for (path, item) in BODY_DOC["paths"].as_object().into_iter().flatten() {
            for (method, op) in item.as_object().into_iter().flatten() {
                if let Some(id) = op["operationId"].as_str() {
                    ops.insert((method.to_ascii_uppercase(), path.clone()), id.to_string());
                }
            }
        }
        ops
    });
    if !route.starts_with("/api/v1/") {
        return None;
    }
    OPERATIONS.get(&(method.as_str().to_string(), route.to_string())).map(String::as_str)
}

/// The document the body schemas come from (for the bounds a refusal names).
static BODY_DOC: std::sync::LazyLock<serde_json::Value> = std::sync::LazyLock::new(|| document(true, &[]));

/// The request bodies the document describes, compiled from the document itself, by
/// component name. `StartTask` without its per-kind variants and kind list: the kind's own
/// check holds a start to those (`Job::args_schema`, in [`crate::tasks::Engine::start`]).
static BODY_SCHEMAS: std::sync::LazyLock<std::collections::BTreeMap<&'static str, jsonschema::Validator>> = std::sync::LazyLock::new(|| {
    let mut doc = BODY_DOC.clone();
    if let Some(start) = doc.pointer_mut("/components/schemas/StartTask").and_then(serde_json::Value::as_object_mut) {
        start.remove("oneOf");
        if let Some(kind) = start.get_mut("properties").and_then(|p| p.get_mut("kind")).and_then(serde_json::Value::as_object_mut) {
            kind.remove("enum");
        }
    }
    ["StartTask", "InputResponse", "CompleteTask", "FailTask", "Progress", "ShareBody", "AppendPartial", "LinkBody"]
        .into_iter()
        .filter_map(|name| {
            let schema = serde_json::json!({ "$ref": format!("#/components/schemas/{name}"), "components": doc["components"] });
            match jsonschema::validator_for(&schema) {
                Ok(v) => Some((name, v)),
                Err(e) => {
                    tracing::error!(schema = name, error = %e, "a request body schema of the OpenAPI document does not compile");
                    None
                }
            }
        })
        .collect()
});

/// A request body checked against its schema in the OpenAPI document (`schema`: the
/// component's name) before it is read: a refusal names each place that does not fit by its
/// JSON pointer (`body/ttl_ms: 0 is less than the minimum of 1`; issue 23, kind 3).
pub(super) fn checked_body<'a, T: Deserialize<'a>>(body: &'a [u8], schema: &str) -> Result<T, Problem> {
    let hint = "Send a JSON object as documented in /api/v1/openapi.json.";
    if !body.trim_ascii_start().starts_with(b"{") {
        return Err(Problem(Refusal::bad_request("the request body must be a JSON object", hint)));
    }
    // Members kept as written (`args`, a fragment, a result) are stored and served again: a
    // nesting no reader of ferry's JSON can take (SQLite's JSON stops at 1 000, serde_json at
    // 128) is refused here, before anything is stored.
    if let Some(depth) = nesting_beyond(body, MAX_JSON_NESTING) {
        return Err(Problem(Refusal::bad_request(
            format!("the JSON body nests arrays and objects {depth} deep; at most {MAX_JSON_NESTING} levels are accepted"),
            "Flatten the value, or put it in a file (TUS upload) and pass its id instead.",
        )));
    }
    // Members kept as written must be JSON every reader takes alike: no lone surrogate, no
    // number past a double (issue: `"\ud800"`, `1e999` were stored verbatim).
    if let Some(m) = std::str::from_utf8(body).ok().and_then(crate::app::schema_check::unportable_json) {
        return Err(Problem(Refusal::bad_request(
            format!("the JSON body cannot be stored as sent: body{m}"),
            "Fix the value at that place, then send the request again.",
        )));
    }
    // A body serde_json cannot hold as a value (a number past f64, kept exact in `args`) is
    // read as it is: the members the schemas constrain are never such numbers.
    if let (Some(v), Ok(value)) = (BODY_SCHEMAS.get(schema), serde_json::from_slice::<serde_json::Value>(body)) {
        crate::app::schema_check::check(v, &value, "body").map_err(|m| {
            Problem(Refusal::bad_request(
                format!("the body does not match the {schema} schema of /api/v1/openapi.json: {m}"),
                format!("Fix the places named in detail ({hint})"),
            ))
        })?;
    }
    json_body(body, Some(schema))
}

/// An optional whole number (`ttl_ms`), also written with a zero fraction (`3600000.0`), as
/// JSON Schema's `integer` allows.
pub(super) fn opt_whole<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let n: Option<serde_json::Number> = Option::deserialize(d)?;
    n.map(|n| crate::catalog::tasks::whole_number(&n).ok_or_else(|| serde::de::Error::custom(format!("expected a whole number ≥ 0, got {n}"))))
        .transpose()
}

/// [`opt_whole`] for a task's `ttl_ms` (signed in the catalog): values past `i64::MAX` are
/// refused naming the bound [`crate::tasks::MAX_TASK_TTL_MS`] (the start checks it too).
fn opt_whole_i64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    let n: Option<serde_json::Number> = Option::deserialize(d)?;
    n.map(|n| {
        n.as_i64()
            .or_else(|| crate::catalog::tasks::whole_number(&n).and_then(|v| i64::try_from(v).ok()))
            .ok_or_else(|| serde::de::Error::custom(format!("expected a whole number from 1 to {}, got {n}", crate::tasks::MAX_TASK_TTL_MS)))
    })
    .transpose()
}

use crate::tasks::POLL_AFTER_MS;

/// The status payload of a task. Never carries the arguments (`GET /tasks/{id}/args`).
#[derive(Serialize, ToSchema)]
#[schema(as = Task)]
pub struct TaskView<'a> {
    /// 26-character lowercase base32 id.
    pub id: &'a str,
    #[schema(example = "archive")]
    pub kind: &'a str,
    #[schema(value_type = TaskStatusDoc)]
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_message: Option<&'a str>,
    #[schema(value_type = ProgressDoc)]
    pub progress: &'a Progress,
    /// Outstanding input requests: key → request.
    #[schema(value_type = Object)]
    pub input_requests: serde_json::Map<String, serde_json::Value>,
    /// The result (completed only), exactly as produced. A file a task produced is always the
    /// same handle (`id`, `name`, `media_type`, `size`, `sha256`): built-in kinds store
    /// `{"file": handle, …}`, `external` tasks completed with files `{"files": [handle…],
    /// "result": …}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    pub result: Option<&'a RawValue>,
    /// Why it failed (failed only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<TaskErrorDoc>)]
    pub error: Option<TaskErrorView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<&'a str>,
    /// Id of the failed task this run retries (same idempotency key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prior_failure: Option<&'a str>,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub updated_at: i64,
    /// Kept this long after finishing, then swept (its id becomes unknown).
    pub ttl_ms: i64,
    /// How many times a worker started or resumed the job.
    pub runs: u64,
    /// Suggested wait before polling again (non-terminal tasks only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_after_ms: Option<u64>,
    /// Partial results appended while the task worked (single-task answers; a list leaves it
    /// out): small JSON fragments, separate from `result`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<super::task_partials::PartialResultsDoc>)]
    pub partial: Option<&'a crate::catalog::PartialPage>,
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
        error: crate::app::views::task_error(t.error.as_deref()).map(TaskErrorView::of),
        idempotency_key: t.idempotency_key.as_deref(),
        prior_failure: t.prior_failure.as_deref(),
        created_at: t.created_at_ms,
        updated_at: t.updated_at_ms,
        ttl_ms: t.ttl_ms,
        runs: t.runs,
        poll_after_ms: (!t.status.is_terminal()).then_some(POLL_AFTER_MS),
        partial: None,
    }
}

/// A start's `ttl_ms`, when it is a number, is 1 to [`crate::tasks::MAX_TASK_TTL_MS`]: every
/// number outside — 0, negative, past 64 bits, past f64 (`1e999`) — gets the one refusal
/// [`crate::tasks::ttl_out_of_range`] with the value as written, before the schema check
/// (whose words differ with the number's size).
fn ttl_in_range(body: &[u8]) -> Result<(), Problem> {
    #[derive(Deserialize)]
    struct Ttl<'a> {
        #[serde(borrow)]
        ttl_ms: Option<&'a RawValue>,
    }
    let Ok(Ttl { ttl_ms: Some(raw) }) = serde_json::from_slice::<Ttl>(body) else { return Ok(()) };
    let text = raw.get();
    if !text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        return Ok(()); // not a number: the schema names its type
    }
    let ok = serde_json::from_str::<serde_json::Number>(text)
        .ok()
        .and_then(|n| crate::catalog::tasks::whole_number(&n))
        .and_then(|v| i64::try_from(v).ok())
        .is_some_and(|v| (1..=crate::tasks::MAX_TASK_TTL_MS).contains(&v));
    if ok {
        Ok(())
    } else {
        Err(Problem(crate::tasks::ttl_out_of_range("body/ttl_ms", text)))
    }
}

/// Start a task.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = StartTask)]
struct StartBody<'a> {
    /// A registered kind: `archive`, `compress`, `fetch`, `command`, `external`, or one an
    /// embedder added.
    #[schema(example = "external")]
    kind: String,
    /// The kind's arguments, any JSON (default `null`); stored and returned exactly.
    #[serde(borrow)]
    #[schema(value_type = Option<serde_json::Value>)]
    args: Option<&'a RawValue>,
    /// Keep the task this long after it finishes (default 24 h).
    #[schema(minimum = 1)]
    #[serde(default, deserialize_with = "opt_whole_i64")]
    ttl_ms: Option<i64>,
}

/// Start a task.
///
/// `POST /api/v1/tasks` `{kind, args, ttl_ms?}` with optional `Idempotency-Key` → 201 with
/// the new task, or 200 with the task the key already names. The id is returned only after
/// the task is durable. With a key (per principal and kind): a running or completed task is
/// returned as is; a failed one is retried as a new task naming it in `prior_failure`; the
/// same key with different arguments (compared as JSON values: whitespace, member order and
/// number spelling do not matter) is a 422 `conflict` (draft-ietf-httpapi-idempotency-key-header).
/// A key is 1 to 255 characters (`ferry_tus::IdempotencyKey`), sent as an RFC 9651 string
/// (`"…"`) or bare visible ASCII; it is scoped to the principal and the kind.
#[utoipa::path(post, path = "/api/v1/tasks", tag = "tasks", operation_id = "start_task",
    params(("Idempotency-Key" = Option<String>, Header, description = "1-255 visible ASCII characters; makes the start safe to retry.")),
    request_body(content = StartBody, content_type = "application/json"),
    responses(
        (status = 201, description = "Started; `Location` names the task.", body = TaskView,
            headers(("location" = String, description = "/api/v1/tasks/{id}"))),
        (status = 200, description = "The task the Idempotency-Key already names.", body = TaskView),
    ))]
async fn start_task(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    h: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let body = body_bytes(body)?;
    ttl_in_range(&body)?;
    let b: StartBody = checked_body(&body, "StartTask")?;
    let key = super::tus::idempotency_key(&h)?;
    if b.kind == "concat" {
        // Started by the server when a concatenation's parts are complete (TUS concatenation).
        return Err(Problem(Refusal::bad_request(
            "the concat kind is internal to TUS concatenation",
            "Create a final upload with `Upload-Concat: final;…` on POST /files/ instead.",
        )));
    }
    let args = b.args.map(RawValue::get).unwrap_or("null");
    let started = s.tasks.start(&p, &b.kind, args, key.as_ref().map(|k| k.as_str()), b.ttl_ms).await?;
    let mut res =
        super::task_partials::task_json_after(&s, if started.created { StatusCode::CREATED } else { StatusCode::OK }, &started.task, 0).await?;
    if let Ok(loc) = HeaderValue::from_str(&format!("/api/v1/tasks/{}", started.task.id)) {
        res.headers_mut().insert("location", loc);
    }
    Ok(res)
}

#[derive(Deserialize)]
pub(super) struct ListQuery {
    limit: Option<u32>,
}

/// A page of tasks, newest first.
#[derive(Serialize, ToSchema)]
struct TaskList<'a> {
    tasks: Vec<TaskView<'a>>,
}

/// List the caller's tasks, newest first.
#[utoipa::path(get, path = "/api/v1/tasks", tag = "tasks", operation_id = "list_tasks",
    params((
        "limit" = Option<u32>, Query, minimum = 1, maximum = 1000,
        description = "At most this many, 1 to 1000 (default 100); other values are 400."
    )),
    responses((status = 200, description = "The tasks.", body = TaskList)))]
async fn list_tasks(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let tasks = s.tasks.list(&p, limit(q)?).await?;
    Ok(axum::Json(TaskList { tasks: tasks.iter().map(task_view).collect() }).into_response())
}

/// A task's status, progress, outstanding input requests, and result or error.
#[utoipa::path(get, path = "/api/v1/tasks/{id}", tag = "tasks", operation_id = "get_task",
    params(
        ("id" = String, Path, description = "Task id."),
        (
            "partial_after" = Option<u64>, Query, minimum = 0, maximum = 9223372036854775807_i64,
            description = "Show only partial result fragments numbered above this (the `partial.next` of the last view read); default 0, \
                           every kept fragment."
        ),
    ),
    responses(
        (status = 200, description = "The task.", body = TaskView),
    ))]
async fn get_task(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    Path(id): Path<String>,
    q: Result<Query<super::task_partials::TaskQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let after = super::task_partials::partial_after(q)?;
    super::task_partials::task_json_after(&s, StatusCode::OK, &s.tasks.get(&p, &id).await?, after).await
}

/// The task's arguments, exactly as sent.
#[utoipa::path(get, path = "/api/v1/tasks/{id}/args", tag = "tasks", operation_id = "get_task_args",
    params(("id" = String, Path, description = "Task id.")),
    responses(
        (status = 200, description = "The arguments, byte for byte as sent (any JSON).", body = serde_json::Value, content_type = "application/json"),
    ))]
async fn task_args(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, Path(id): Path<String>) -> Result<Response, Problem> {
    let t = s.tasks.get(&p, &id).await?;
    Ok(([("content-type", "application/json")], t.args).into_response())
}

/// An answer to one of the task's `input_requests`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = InputResponse)]
struct InputBody<'a> {
    /// The request's key (a key of `input_requests`).
    key: String,
    /// The answer, any JSON.
    #[serde(borrow)]
    #[schema(value_type = serde_json::Value)]
    response: &'a RawValue,
}

/// The outcome of answering an input request.
#[derive(ToSchema)]
#[allow(dead_code)]
struct InputAnswer<'a> {
    /// False when the key was not outstanding (the answer was ignored).
    accepted: bool,
    task: TaskView<'a>,
}

/// Answer an input request.
///
/// `POST /tasks/{id}/input` `{key, response}` → `{accepted, task}`. A key that is not
/// outstanding is ignored (`accepted: false`). The task goes back to `working`.
#[utoipa::path(post, path = "/api/v1/tasks/{id}/input", tag = "tasks", operation_id = "answer_input",
    params(("id" = String, Path, description = "Task id.")),
    request_body(content = InputBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Whether the answer was taken, and the task.", body = InputAnswer),
    ))]
async fn respond(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let body = body_bytes(body)?;
    let b: InputBody = checked_body(&body, "InputResponse")?;
    let (accepted, t) = s.tasks.respond(&p, &id, &b.key, b.response.get()).await?;
    let page = s.tasks.partials(&t, 0).await?;
    Ok(axum::Json(serde_json::json!({ "accepted": accepted, "task": super::task_partials::with_partial(task_view(&t), &page) })).into_response())
}

/// Cancel a task: `cancelled` at once (terminal); the job is told to stop and a late result
/// is discarded. Cancelling a finished task changes nothing and returns it.
#[utoipa::path(post, path = "/api/v1/tasks/{id}/cancel", tag = "tasks", operation_id = "cancel_task",
    params(("id" = String, Path, description = "Task id.")),
    responses(
        (status = 200, description = "The task after the call.", body = TaskView),
    ))]
async fn cancel(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, Path(id): Path<String>) -> Result<Response, Problem> {
    super::task_partials::task_json_after(&s, StatusCode::OK, &s.tasks.cancel(&p, &id).await?, 0).await
}

/// Report progress of an `external` task (its producer only).
#[utoipa::path(post, path = "/api/v1/tasks/{id}/progress", tag = "tasks", operation_id = "report_progress",
    params(("id" = String, Path, description = "Task id (kind `external`).")),
    request_body(content = ProgressDoc, content_type = "application/json"),
    responses(
        (status = 200, description = "The task after the report.", body = TaskView),
    ))]
async fn report_progress(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let body = body_bytes(body)?;
    let progress: Progress = checked_body(&body, "Progress")?;
    if progress.fraction.is_some_and(|f| !(0.0..=1.0).contains(&f)) {
        return Err(Problem(Refusal::bad_request("fraction must be between 0 and 1", "Send a fraction in [0, 1].")));
    }
    super::task_partials::task_json_after(&s, StatusCode::OK, &s.tasks.report(&p, &id, progress).await?, 0).await
}

/// Complete an `external` task.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CompleteTask)]
struct CompleteBody<'a> {
    /// The result, any JSON (default `null`).
    #[serde(borrow)]
    #[schema(value_type = Option<serde_json::Value>)]
    result: Option<&'a RawValue>,
    /// Ids of finished uploads (sent with TUS) the task produced. `files` is the deprecated
    /// name, still accepted.
    #[serde(default, alias = "files")]
    file_ids: Vec<String>,
}

/// Complete an `external` task (its producer only).
///
/// `POST /tasks/{id}/complete` `{result?, file_ids?}`: with files, the stored result is
/// `{"files": [handle…], "result": <result>}` (each handle `id`, `name`, `media_type`, `size`,
/// `sha256`, as built-in kinds store theirs); without, the result exactly.
#[utoipa::path(post, path = "/api/v1/tasks/{id}/complete", tag = "tasks", operation_id = "complete_task",
    params(("id" = String, Path, description = "Task id (kind `external`).")),
    request_body(content = CompleteBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The completed task.", body = TaskView),
    ))]
async fn complete(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let body = body_bytes(body)?;
    if serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&body)
        .is_ok_and(|m| m.contains_key("file_ids") && m.contains_key("files"))
    {
        return Err(Problem(Refusal::bad_request(
            "the body has both file_ids and files; files is the deprecated name of file_ids",
            "Send the file ids once, as file_ids.",
        )));
    }
    let b: CompleteBody = checked_body(&body, "CompleteTask")?;
    let result = b.result.map(RawValue::get).unwrap_or("null");
    let text = if b.file_ids.is_empty() {
        result.to_string()
    } else {
        let mut infos = Vec::new();
        for f in &b.file_ids {
            // A file the body names that does not exist is not the task missing: the request
            // is well formed and its target exists, so 422 (RFC 9110 §15.5.21), code `not_found`.
            let rec = s.engine.get(&p, f).await.map_err(|e| if e.status == 404 { Refusal { status: 422, ..e } } else { e })?;
            // The same handle built-in kinds store for the files they produce.
            let Some(handle) = crate::app::views::produced_file(&rec) else {
                return Err(Problem(
                    Refusal::new(
                        409,
                        crate::error::ErrorCode::UploadIncomplete,
                        format!("file {f} is not complete"),
                        "Finish uploading the file, then complete the task.",
                    )
                    .with_cursor(rec.offset),
                ));
            };
            infos.push(handle);
        }
        #[derive(Serialize)]
        struct WithFiles<'a> {
            files: Vec<crate::upload::FileHandle>,
            result: &'a RawValue,
        }
        let raw: &RawValue = serde_json::from_str(result).expect("already parsed");
        serde_json::to_string(&WithFiles { files: infos, result: raw }).expect("serialises")
    };
    super::task_partials::task_json_after(&s, StatusCode::OK, &s.tasks.finish_external(&p, &id, Ok(text)).await?, 0).await
}

/// Fail an `external` task.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = FailTask)]
struct FailBody {
    /// Shown to the task's owner as `error.message` (no secrets).
    message: String,
}

/// Fail an `external` task (its producer only).
#[utoipa::path(post, path = "/api/v1/tasks/{id}/fail", tag = "tasks", operation_id = "fail_task",
    params(("id" = String, Path, description = "Task id (kind `external`).")),
    request_body(content = FailBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The failed task.", body = TaskView),
    ))]
async fn fail(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let body = body_bytes(body)?;
    let b: FailBody = checked_body(&body, "FailTask")?;
    super::task_partials::task_json_after(&s, StatusCode::OK, &s.tasks.finish_external(&p, &id, Err(b.message)).await?, 0).await
}

/// A page of files, newest first.
#[derive(ToSchema)]
#[allow(dead_code)]
struct FileList {
    files: Vec<FileView>,
}

/// List the caller's files (uploads and task artifacts).
#[utoipa::path(get, path = "/api/v1/files", tag = "files", operation_id = "list_files",
    params(("limit" = Option<u32>, Query, minimum = 1, description = "At most this many (default 100).")),
    responses((status = 200, description = "The files.", body = FileList)))]
async fn list_files(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let files = s.engine.list(&p, limit(q)?).await?;
    let mut views = Vec::with_capacity(files.len());
    for f in &files {
        views.push(file_view(f).damaged(s.engine.damage(f).await?.as_ref()));
    }
    Ok(axum::Json(serde_json::json!({ "files": views })).into_response())
}

/// File info; unlike HEAD on /files/{id}, never interrupts an upload in progress.
#[utoipa::path(get, path = "/api/v1/files/{id}", tag = "files", operation_id = "get_file",
    params(("id" = String, Path, description = "File (upload) id.")),
    responses(
        (status = 200, description = "The file.", body = FileView),
    ))]
async fn file_info(State(s): State<AppState>, Extension(Principal(p)): Extension<Principal>, Path(id): Path<String>) -> Result<Response, Problem> {
    // An upload whose bytes are all stored but that is not finished is finished first (only
    // if no request holds it); while it cannot be, the view says `finishing`.
    let rec = match s.engine.get_finished_or_finish(&p, &id).await {
        Ok(rec) => rec,
        Err(e) if e.code == crate::error::ErrorCode::Locked => s.engine.get(&p, &id).await?,
        Err(e) => return Err(e.into()),
    };
    Ok(axum::Json(file_view(&rec).damaged(s.engine.damage(&rec).await?.as_ref())).into_response())
}

/// Body of `POST /api/v1/files/{id}/share`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ShareBody {
    /// `download` (GET/HEAD of the finished file) or `upload` (TUS HEAD/PATCH to finish it).
    #[schema(value_type = String, example = "download")]
    scope: Option<crate::signing::Scope>,
    /// Lifetime in ms, 1 to 604800000 (7 days); default 3600000 (1 h).
    #[serde(default, deserialize_with = "opt_whole")]
    ttl_ms: Option<u64>,
}

/// A signed URL.
#[derive(ToSchema)]
#[allow(dead_code)]
struct ShareView {
    /// Absolute URL that works without a token until it expires.
    url: String,
    /// The page for people with the same signature (absent with `--no-web`): for `upload` a
    /// request-a-file page that uploads into this file, for `download` a page with the file's
    /// name, size, sha256 and a download button.
    page_url: Option<String>,
    #[schema(example = "download")]
    scope: String,
    /// Unix ms.
    expires_at_ms: i64,
    /// RFC 3339.
    expires_at: String,
}

/// Default lifetime of a signed URL, ms.
pub const DEFAULT_SHARE_TTL_MS: u64 = 3_600_000;

/// Sign a URL for one file (DESIGN §6): curl or a browser can then download it (scope
/// `download`) or finish uploading it with TUS (scope `upload`) without a token.
#[utoipa::path(post, path = "/api/v1/files/{id}/share", tag = "files", operation_id = "share_file",
    params(("id" = String, Path, description = "File (upload) id.")),
    request_body(content = ShareBody, description = "Scope and lifetime; `{}` means download for 1 h."),
    responses(
        (status = 200, description = "The signed URL.", body = ShareView),
    ))]
async fn share_file(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let body = body_bytes(body)?;
    let req: ShareBody =
        if body.iter().all(u8::is_ascii_whitespace) { ShareBody { scope: None, ttl_ms: None } } else { checked_body(&body, "ShareBody")? };
    let ttl = req.ttl_ms.unwrap_or(DEFAULT_SHARE_TTL_MS);
    if !(1..=crate::signing::MAX_URL_TTL_MS).contains(&ttl) {
        return Err(Problem(Refusal::bad_request(
            format!("ttl_ms must be from 1 to {} (7 days)", crate::signing::MAX_URL_TTL_MS),
            format!("Send a ttl_ms in that range, e.g. {DEFAULT_SHARE_TTL_MS} for one hour."),
        )));
    }
    let rec = s.engine.get(&p, &id).await?;
    let scope = req.scope.unwrap_or(crate::signing::Scope::Download);
    if scope == crate::signing::Scope::Upload && rec.is_finished() {
        // An upload link to a file that can take no more bytes would only ever answer 409.
        return Err(Problem(Refusal::new(
            409,
            crate::error::ErrorCode::Conflict,
            format!("file {id} is complete ({} bytes): an upload link would have nothing to take", rec.offset),
            r#"Share it with {"scope":"download"} for someone to fetch it, or ask for a new file (ferry request NAME, MCP file_request)."#,
        )));
    }
    let signed = s.links.signed(scope, &id, ttl, crate::upload::now_ms());
    let expires_at = crate::upload::rfc3339(signed.expires_at_ms);
    let mut view = serde_json::json!({
        "url": signed.url, "scope": signed.scope, "expires_at_ms": signed.expires_at_ms, "expires_at": expires_at,
    });
    if let Some(page) = signed.page_url {
        view["page_url"] = page.into();
    }
    Ok(axum::Json(view).into_response())
}

#[cfg(test)]
mod schema_tests {
    //! Every body the API answers with validates against the OpenAPI document it serves (issue
    //! 23, kind 1): task views from generated task records in every state, file views from
    //! generated upload records — the same `task_view` / `file_view` the handlers serialise.
    use super::*;
    use crate::app::arb;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    #[test]
    fn nesting_counts_brackets_outside_strings() {
        assert_eq!(nesting_beyond(br#"{"a":[1,{"b":2}]}"#, 3), None);
        assert_eq!(nesting_beyond(br#"{"a":[1,{"b":[2]}]}"#, 3), Some(4));
        assert_eq!(nesting_beyond(br#"{"a":"[[[[[[\"[[[["}"#, 1), None, "brackets in strings, an escaped quote");
        let deep = format!("{{\"f\":{}{}}}", "[".repeat(1001), "]".repeat(1001));
        assert_eq!(nesting_beyond(deep.as_bytes(), 64), Some(65));
    }

    /// A validator for `#/components/schemas/{name}` of the served document.
    fn component(name: &str) -> jsonschema::Validator {
        let doc = document(true, &[("archive".to_string(), None), ("external".to_string(), None)]);
        let schema = json!({ "$ref": format!("#/components/schemas/{name}"), "components": doc["components"] });
        jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    static TASK: std::sync::LazyLock<jsonschema::Validator> = std::sync::LazyLock::new(|| component("Task"));
    static TASK_LIST: std::sync::LazyLock<jsonschema::Validator> = std::sync::LazyLock::new(|| component("TaskList"));
    static ANSWER: std::sync::LazyLock<jsonschema::Validator> = std::sync::LazyLock::new(|| component("InputAnswer"));
    static FILE: std::sync::LazyLock<jsonschema::Validator> = std::sync::LazyLock::new(|| component("File"));
    static FILE_LIST: std::sync::LazyLock<jsonschema::Validator> = std::sync::LazyLock::new(|| component("FileList"));

    fn check(what: &str, v: &jsonschema::Validator, body: &Value) -> Result<(), TestCaseError> {
        let errors: Vec<String> = v.iter_errors(body).map(|e| format!("{}: {e}", e.instance_path())).collect();
        prop_assert!(errors.is_empty(), "{what} breaks the OpenAPI document: {errors:?}\n{body}");
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn every_task_body_fits_the_document(t in arb::task_record()) {
            let view = serde_json::to_value(task_view(&t)).unwrap();
            check("Task", &TASK, &view)?;
            let value = serde_json::value::RawValue::from_string(serde_json::to_string(&t.progress).unwrap()).unwrap();
            let page = crate::catalog::PartialPage {
                fragments: vec![crate::catalog::Fragment { seq: t.runs + 1, at_ms: t.created_at_ms, value }],
                dropped: t.runs,
                next: t.runs + 1,
            };
            check("Task", &TASK, &serde_json::to_value(crate::http::task_partials::with_partial(task_view(&t), &page)).unwrap())?;
            check("TaskList", &TASK_LIST, &json!({ "tasks": [view.clone()] }))?;
            check("InputAnswer", &ANSWER, &json!({ "accepted": t.runs % 2 == 0, "task": view }))?;
        }

        #[test]
        fn every_file_body_fits_the_document(r in arb::upload_record()) {
            let view = serde_json::to_value(file_view(&r)).unwrap();
            check("File", &FILE, &view)?;
            check("FileList", &FILE_LIST, &json!({ "files": [view] }))?;
        }
    }
}
