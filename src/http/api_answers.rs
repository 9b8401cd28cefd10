//! What each `/api/v1` operation can answer besides success, as the one list both the OpenAPI
//! document and the server read (issue 48, kind 5).
//!
//! Each operation names its refusals as `(status, code, when)` entries of the error catalogue
//! ([`ErrorCode`]); [`EVERY`] and [`WITH_BODY`] add what every operation (and every one that
//! reads a body) may answer from the layers around the handlers. [`document_errors`] writes
//! them into the document: one response per status, whose problem schema names that status and
//! exactly those codes, so a client (or schemathesis) that validates answers against the
//! document checks the codes too. [`observe`] holds every problem the server actually answers
//! on an operation against the same list: an answer the list lacks is logged as an error and
//! counted in `ferry_http_undocumented_answers_total`, which the tests require to stay at 0.

use crate::error::ErrorCode;
use serde_json::{json, Value};

/// A refusal an operation can answer: its status, its code, and when, for the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub code: ErrorCode,
    pub when: &'static str,
}

const fn a(status: u16, code: ErrorCode, when: &'static str) -> Answer {
    Answer { status, code, when }
}

use ErrorCode::{
    Conflict, Damaged, InsufficientStorage, Internal, InvalidArgument, NotFound, SizeExceeded, Unauthorized, Unavailable, UploadExpired,
    UploadIncomplete,
};

/// What every operation may answer, whatever it does: a request the HTTP layer refuses (no or
/// several `Host`s, `X-HTTP-Method-Override`, a path segment or query that is not UTF-8), a web
/// page's origin or a `Host` that is not this server's, a token without the right, and the
/// catalog failing briefly or for good.
pub const EVERY: &[Answer] = &[
    a(
        400,
        InvalidArgument,
        "The request is malformed: a missing or repeated `Host`, `X-HTTP-Method-Override`, or a query the operation does not take.",
    ),
    a(401, Unauthorized, "Missing or invalid bearer token (only on a server with tokens)."),
    a(403, Unauthorized, "A token whose scope does not allow this, an `Origin` other than this server's, or a `Host` that is not one of its names."),
    a(500, Internal, "The server failed; nothing was changed."),
    a(503, Unavailable, "A store is briefly unable to answer; try again after `Retry-After`."),
];

/// What every operation that reads a request body may answer besides [`EVERY`].
pub const WITH_BODY: &[Answer] = &[
    a(400, InvalidArgument, "The body is not a JSON object of the documented shape (the places that do not fit are named in `detail`)."),
    a(413, SizeExceeded, "The body is larger than 1 MiB."),
    a(507, InsufficientStorage, "The catalog has no room to store the change."),
];

/// Each operation (by `operationId`): whether it reads a body, and its own refusals.
pub const OPERATIONS: &[(&str, bool, &[Answer])] = &[
    (
        "start_task",
        true,
        &[
            a(400, InvalidArgument, "Unknown kind, arguments outside the kind's schema in this document, `ttl_ms` or Idempotency-Key."),
            a(403, Unauthorized, "A `fetch` of a host outside the server's allow list."),
            a(404, NotFound, "An input file the arguments name is not one of the caller's files (the ids in `detail`)."),
            a(409, UploadIncomplete, "An input file is still being uploaded."),
            a(422, Conflict, "The Idempotency-Key names a task started with other arguments (compared as JSON values)."),
            a(
                422,
                InvalidArgument,
                "Arguments that fit the kind's schema but that the kind cannot use (a URL whose host is no \
                 domain name, a command's `params` outside its `params_schema`…): `detail` says which.",
            ),
        ],
    ),
    ("list_tasks", false, &[a(400, InvalidArgument, "`limit` is not a whole number from 1 to 1000.")]),
    ("get_task", false, &[a(400, InvalidArgument, "`partial_after` is not a whole number."), a(404, NotFound, "No such task for this principal.")]),
    ("get_task_args", false, &[a(404, NotFound, "No such task for this principal.")]),
    (
        "answer_input",
        true,
        &[
            a(400, InvalidArgument, "The response does not fit the input request's schema."),
            a(404, NotFound, "No such task for this principal."),
            a(409, Conflict, "The task is already finished."),
            a(413, SizeExceeded, "The response is larger than an input response may be."),
        ],
    ),
    ("cancel_task", false, &[a(404, NotFound, "No such task for this principal.")]),
    (
        "report_progress",
        true,
        &[
            a(404, NotFound, "No such task for this principal."),
            a(409, Conflict, "The task is already finished, or it is run by ferry (not of kind `external`)."),
        ],
    ),
    (
        "append_partial",
        true,
        &[
            a(404, NotFound, "No such task for this principal."),
            a(409, Conflict, "The task is already finished, or it is run by ferry (not of kind `external`)."),
            a(413, SizeExceeded, "The fragment is larger than 16 KiB; put big data in a file."),
        ],
    ),
    (
        "complete_task",
        true,
        &[
            a(404, NotFound, "No such task for this principal."),
            a(422, NotFound, "A file in `file_ids` is not one of the caller's files."),
            a(409, Conflict, "The task is already finished, or it is run by ferry (not of kind `external`)."),
            a(409, UploadIncomplete, "A file is not fully uploaded (`partial.cursor` = its offset)."),
            a(410, UploadExpired, "A file in `file_ids` expired before it was finished."),
        ],
    ),
    (
        "fail_task",
        true,
        &[
            a(404, NotFound, "No such task for this principal."),
            a(409, Conflict, "The task is already finished, or it is run by ferry (not of kind `external`)."),
        ],
    ),
    ("list_files", false, &[a(400, InvalidArgument, "`limit` is not a whole number from 1 to 1000.")]),
    (
        "get_file",
        false,
        &[
            a(404, NotFound, "No such file for this principal."),
            a(410, UploadExpired, "The upload expired before it was finished; its bytes were removed."),
        ],
    ),
    (
        "share_file",
        true,
        &[
            a(404, NotFound, "No such file for this principal."),
            a(409, Conflict, "Scope `upload` for a file that is already complete."),
            a(410, UploadExpired, "The upload expired before it was finished."),
        ],
    ),
    (
        "zip_files",
        false,
        &[
            a(400, InvalidArgument, "`files` is not 1 to 1000 ids separated by commas, or the query has a member other than `files` and `name`."),
            a(422, InvalidArgument, "`files` names an id twice."),
            a(404, NotFound, "A file in `files` is not one of the caller's (the ids in `detail`)."),
            a(409, UploadIncomplete, "A file in `files` is not fully uploaded (`detail` names it)."),
            a(410, UploadExpired, "A file in `files` expired before it was finished."),
            a(412, Conflict, "`If-Match` or `If-Unmodified-Since` does not hold for this zip."),
            a(416, InvalidArgument, "The range is outside the zip (`Content-Range: bytes */N`)."),
            a(500, Damaged, "A file's stored bytes were found damaged (`ferry check`); nothing is served."),
        ],
    ),
    (
        "create_link",
        true,
        &[
            a(
                422,
                InvalidArgument,
                "A body that fits the schema but not a link: a share without files or with `max_files`, a request with \
                 files or `max_downloads`, a file listed twice, a control character in the message (named in `detail`).",
            ),
            a(404, NotFound, "A file of the share is not one of the caller's files."),
            a(410, UploadExpired, "A file of the share expired before it was finished."),
        ],
    ),
    ("list_links", false, &[a(400, InvalidArgument, "`limit` is not a whole number from 1 to 1000.")]),
    ("get_link", false, &[a(404, NotFound, "No such link for this principal.")]),
    ("revoke_link_post", false, &[a(404, NotFound, "No such link for this principal.")]),
    ("openapi", false, &[]),
    (
        "events",
        false,
        &[a(404, NotFound, "`Last-Event-ID` names no event kept for this principal; reconnect without it, or list state with the API.")],
    ),
    ("webhook_deliveries", false, &[a(400, InvalidArgument, "`state` or `limit` is not one the operation takes.")]),
];

/// Every refusal operation `op` can answer (its own, then [`WITH_BODY`] and [`EVERY`]); `None`
/// for an operation the list does not know.
pub fn answers(op: &str) -> Option<Vec<Answer>> {
    let (_, body, own) = OPERATIONS.iter().find(|(name, ..)| *name == op)?;
    let mut all = own.to_vec();
    if *body {
        all.extend_from_slice(WITH_BODY);
    }
    all.extend_from_slice(EVERY);
    Some(all)
}

/// Whether operation `op` documents answering `code` with `status`.
pub fn documented(op: &str, status: u16, code: ErrorCode) -> bool {
    answers(op).is_some_and(|all| all.iter().any(|a| a.status == status && a.code == code))
}

/// Replace every operation's error responses in `doc` (an OpenAPI 3.1 document as JSON) with
/// those [`answers`] lists: one per status, `application/problem+json` with the `Problem`
/// schema narrowed to that status and its codes. `with_tokens`: whether 401 is possible.
/// An operation the list does not know keeps what it has and gets the `Problem` default (the
/// unit test `every_operation_lists_its_answers` keeps that from happening).
pub fn document_errors(doc: &mut Value, with_tokens: bool) {
    let Some(paths) = doc.pointer_mut("/paths").and_then(Value::as_object_mut) else { return };
    for op in paths.values_mut().filter_map(Value::as_object_mut).flat_map(|item| item.values_mut()) {
        let Some(id) = op.get("operationId").and_then(Value::as_str).map(str::to_string) else { continue };
        let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else { continue };
        let Some(all) = answers(&id) else {
            responses.entry("default").or_insert_with(|| json!({ "$ref": "#/components/responses/Problem" }));
            continue;
        };
        responses.retain(|status, _| status.starts_with('2'));
        let mut statuses: Vec<u16> = all.iter().map(|a| a.status).filter(|s| with_tokens || *s != 401).collect();
        statuses.sort_unstable();
        statuses.dedup();
        for status in statuses {
            let here: Vec<&Answer> = all.iter().filter(|a| a.status == status).collect();
            let mut codes: Vec<&str> = Vec::new();
            for a in &here {
                if !codes.contains(&a.code.as_str()) {
                    codes.push(a.code.as_str());
                }
            }
            let description = here.iter().map(|a| format!("`{}`: {}", a.code.as_str(), a.when)).collect::<Vec<_>>().join(" ");
            responses.insert(
                status.to_string(),
                json!({
                    "description": description,
                    "content": { "application/problem+json": { "schema": {
                        "allOf": [
                            { "$ref": "#/components/schemas/Problem" },
                            { "type": "object", "properties": { "status": { "const": status }, "code": { "enum": codes } } }
                        ]
                    } } }
                }),
            );
        }
    }
}

/// Hold a problem the server answered on operation `op` against the list: one it lacks is
/// logged as an error and counted (`ferry_http_undocumented_answers_total`). Returns whether
/// it was documented.
pub fn observe(metrics: &crate::metrics::Metrics, op: &'static str, status: u16, code: ErrorCode) -> bool {
    if documented(op, status, code) {
        return true;
    }
    tracing::error!(operation = op, status, code = code.as_str(), "an /api/v1 operation answered a refusal its OpenAPI document does not list");
    metrics.undocumented_answers.get_or_create(&crate::metrics::AnswerLabels { operation: op, status, code: code.as_str() }).inc();
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation the document describes is in the list, and every answer the list names
    /// is in the document under its status with its code (derived from the catalogue: each
    /// code's status is where the document must have it).
    #[test]
    fn every_operation_lists_its_answers() {
        for tokens in [true, false] {
            let doc = super::super::api::document(tokens, &[]);
            let mut seen = Vec::new();
            for (path, item) in doc["paths"].as_object().unwrap() {
                for (method, op) in item.as_object().unwrap() {
                    let id = op["operationId"].as_str().unwrap_or_else(|| panic!("{method} {path} has no operationId"));
                    let all = answers(id).unwrap_or_else(|| panic!("{id} ({method} {path}) is not in api_answers::OPERATIONS"));
                    assert!(op["responses"].get("default").is_none(), "{id}: every answer is listed, no default");
                    for code in ErrorCode::ALL {
                        for status in 400..600u16 {
                            let listed = op["responses"]
                                .get(status.to_string())
                                .and_then(|r| r.pointer("/content/application~1problem+json/schema/allOf/1/properties/code/enum"))
                                .and_then(Value::as_array)
                                .is_some_and(|codes| codes.iter().any(|c| c == code.as_str()));
                            let expected = all.iter().any(|a| a.status == status && a.code == code) && (tokens || status != 401);
                            assert_eq!(listed, expected, "{id}: {status} {code} listed {listed}, expected {expected}");
                        }
                    }
                    seen.push(id.to_string());
                }
            }
            for (op, ..) in OPERATIONS {
                assert!(seen.iter().any(|s| s == op), "{op} is listed but not documented");
            }
        }
    }

    #[test]
    fn an_unlisted_answer_is_counted() {
        let m = crate::metrics::Metrics::default();
        assert!(observe(&m, "start_task", 422, ErrorCode::Conflict));
        assert!(!observe(&m, "start_task", 400, ErrorCode::Conflict));
        assert!(
            m.encode().contains(r#"ferry_http_undocumented_answers_total{operation="start_task",status="400",code="conflict"} 1"#),
            "{}",
            m.encode()
        );
    }
}
