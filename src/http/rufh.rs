//! The IETF resumable-upload draft (draft-ietf-httpbis-resumable-upload, "RUFH") on `/files/`,
//! beside TUS 1.0: a request carrying `Upload-Draft-Interop-Version` is routed here by the TUS
//! handlers ([`super::tus`]); everything else stays TUS.
//!
//! The handlers parse headers into `ferry_tus::draft` plans, call the same upload engine as TUS
//! (one engine, one storage invariant, one lease per upload with release-on-request), and render
//! the result: the draft's state headers (`Upload-Offset`, `Upload-Complete`, `Upload-Length`,
//! `Upload-Limit`) and its problem types through the shared problem renderer.
//!
//! `104 (Upload Resumption Supported)`: a creation that carries content, at interop version 8 or
//! later, is told its upload's `Location` (with `Upload-Limit` and the interop version) in a 104
//! before its content is read, so a client cut off mid-body can resume. hyper 1.x, which serves
//! ferry, has no API for a server to send 1xx answers (hyperium/hyper PR #4114 is open); over
//! HTTP/1.1 [`super::wire::Interim`] writes it on the connection, over HTTP/2 none is sent and a
//! client learns the upload URL from the final answer (the draft's "careful" creation, as
//! tus-js-client always works) or from an interrupted creation's problem answer.

use crate::error::Refusal;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use ferry_tus::draft::{plan_draft_append, plan_draft_creation, DraftAppendHeaders, DraftCreationHeaders};
use ferry_tus::{InteropVersion, UploadComplete, UploadLimit};

use super::body::BodyChunk;
use super::tus::{has_body, header, idempotency_key, location, set};
use super::{render_problem, AppState};
use crate::catalog::{Concat, UploadRecord};

/// The draft version a request speaks: `None` for a TUS request (no
/// `Upload-Draft-Interop-Version`), `Some(Err)` for a version ferry does not serve.
pub(super) fn version_of(h: &HeaderMap) -> Option<Result<InteropVersion, Refusal>> {
    header(h, "upload-draft-interop-version").map(|v| InteropVersion::from_header(v).map_err(Refusal::from))
}

/// A refusal rendered for a client of the draft: its problem type when the refusal has one,
/// no TUS headers, `Upload-Limit` on 413.
pub(super) fn draft_problem(s: &AppState, version: Option<InteropVersion>, e: Refusal) -> Response {
    let limit = version.and_then(|v| v.upload_limit(s.engine.config().max_size, None));
    render_problem(e, Some(limit))
}

/// Seconds until `rec` may expire (the draft's `max-age` / `expires`), if it can.
fn lifetime_secs(rec: &UploadRecord) -> Option<u64> {
    match (rec.is_finished(), rec.expires_at_ms) {
        (false, Some(at)) => Some(((at - crate::upload::now_ms()).max(0) / 1000) as u64),
        _ => None,
    }
}

/// The draft's state of an upload (§Offset Retrieval, server behaviour): `Upload-Offset`,
/// `Upload-Complete`, `Upload-Length` when known, `Upload-Limit` (interop 6 and later), and
/// once complete the download validators.
fn state_headers(s: &AppState, v: InteropVersion, hm: &mut HeaderMap, rec: &UploadRecord) {
    let final_pending = matches!(rec.concat, Concat::Final { .. }) && !rec.is_finished();
    if !final_pending {
        set(hm, "upload-offset", rec.offset);
    }
    set(hm, "upload-complete", UploadComplete(rec.is_finished()));
    if let Some(l) = rec.length {
        set(hm, "upload-length", l);
    }
    if let Some(limit) = v.upload_limit(s.engine.config().max_size, lifetime_secs(rec)) {
        set(hm, "upload-limit", limit);
    }
    if let Some(sha) = rec.sha256 {
        set(hm, "etag", super::download::etag(&sha));
        set(hm, "repr-digest", ferry_tus::ReprDigest::from_sha256(sha));
    }
}

/// The answer to a request that completed the upload: 200 (or 201 for a creation) with the
/// file's JSON view, as `GET /api/v1/files/{id}` shows it — what the draft calls the response
/// of the resource that processed the representation.
fn completed(status: StatusCode, rec: &UploadRecord) -> Response {
    let body = serde_json::to_string(&crate::app::views::file_view(rec)).unwrap_or_default();
    let mut res = (status, body).into_response();
    res.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    res
}

/// `OPTIONS /files/` headers for the draft: `Accept-Patch` names both append media types
/// (draft -09 requires `application/partial-upload`), `Upload-Limit` the maximum size, and
/// `Upload-Draft-Interop-Versions` the interop versions ferry serves (a ferry header: the draft
/// defines none for this).
pub(super) fn options_headers(s: &AppState, hm: &mut HeaderMap) {
    set(hm, "accept-patch", format!("{}, {}", ferry_tus::OFFSET_OCTET_STREAM, ferry_tus::draft::PARTIAL_UPLOAD));
    let cfg = s.engine.config();
    let limit = UploadLimit { max_size: Some(cfg.max_size), max_age: cfg.expire_after.map(|d| d.as_secs()), ..UploadLimit::default() };
    set(hm, "upload-limit", limit);
    set(hm, "upload-draft-interop-versions", InteropVersion::supported_list());
}

/// `POST /files/` with `Upload-Complete` (§Upload Creation): creates the upload, appends the
/// content if any, and answers 201 with `Location` and the upload's state (plus the file's
/// JSON view when the request completed it).
pub(super) async fn create(
    s: AppState,
    p: String,
    v: InteropVersion,
    h: HeaderMap,
    body: Body,
    upload_only: Option<crate::app::UploadOnly>,
    interim: Option<super::wire::Interim>,
) -> Response {
    let dh = DraftCreationHeaders {
        upload_complete: header(&h, "upload-complete"),
        upload_length: header(&h, "upload-length"),
        upload_metadata: header(&h, "upload-metadata"),
        repr_digest: header(&h, "repr-digest"),
        content_digest: header(&h, "content-digest"),
        content_length: header(&h, "content-length"),
        has_body: has_body(&h, &body),
    };
    let limits = crate::app::limits::creation_limits(&s.engine);
    let planned = match plan_draft_creation(&dh, &limits) {
        Ok(c) => c,
        Err(e) => return draft_problem(&s, Some(v), e.into()),
    };
    let key = match idempotency_key(&h) {
        Ok(k) => k,
        Err(e) => return draft_problem(&s, Some(v), e.0),
    };
    let created = match s.engine.create_keyed(&p, &planned.plan, header(&h, "upload-metadata").unwrap_or(""), key.as_ref()).await {
        Ok(c) => c,
        Err(e) => return draft_problem(&s, Some(v), e),
    };
    let loc = location(&s, &h, &created.upload.id, upload_only);
    let rec = match (planned.body, created.existing) {
        (Some(plan), false) => {
            let told = interim.filter(|i| v.sends_104() && i.can_send());
            if let Some(interim) = &told {
                let mut hm = HeaderMap::new();
                set(&mut hm, "location", &loc);
                set(&mut hm, "upload-draft-interop-version", v.number());
                if let Some(limit) = v.upload_limit(s.engine.config().max_size, lifetime_secs(&created.upload)) {
                    set(&mut hm, "upload-limit", limit);
                }
                interim.send(StatusCode::from_u16(104).expect("104 is a status"), "Upload Resumption Supported", &hm);
            }
            let appended = s.engine.append(p.clone(), created.upload.id.clone(), move |_| Ok(plan), BodyChunk::new(body, &h)).await;
            // Told where the upload is (the 104), the client may resume it if the body is cut.
            match s.engine.settle_creation_told(&p, &created.upload.id, appended, told.is_some()).await {
                Ok(rec) => rec,
                Err(refused) => {
                    // Interrupted: say where, so the client can resume. Refused: nothing is
                    // left, and the answer names no upload.
                    let mut res = draft_problem(&s, Some(v), refused.error);
                    if refused.kept {
                        set(res.headers_mut(), "location", &loc);
                    }
                    return res;
                }
            }
        }
        _ => created.upload,
    };
    let mut res = if rec.is_finished() { completed(StatusCode::CREATED, &rec) } else { StatusCode::CREATED.into_response() };
    state_headers(&s, v, res.headers_mut(), &rec);
    set(res.headers_mut(), "location", loc);
    res
}

/// `HEAD /files/{id}` (§Offset Retrieval): an append still in flight is asked to checkpoint and
/// stop first (release-on-request), so the offset is the durable one; 204 with the state and
/// `Cache-Control: no-store`.
pub(super) async fn head(s: AppState, p: String, v: InteropVersion, id: String) -> Response {
    match s.engine.head(&p, &id).await {
        Ok(rec) => {
            let mut res = StatusCode::NO_CONTENT.into_response();
            state_headers(&s, v, res.headers_mut(), &rec);
            res.headers_mut().insert("cache-control", HeaderValue::from_static("no-store"));
            res
        }
        Err(e) => draft_problem(&s, Some(v), e),
    }
}

/// `PATCH /files/{id}` (§Upload Append): append at `Upload-Offset`; 204 with the new state, or
/// 200 with the file's JSON view when the upload is complete.
pub(super) async fn append(s: AppState, p: String, v: InteropVersion, id: String, h: HeaderMap, body: Body) -> Response {
    let owned: Vec<Option<String>> = ["content-type", "upload-offset", "upload-complete", "upload-length", "content-length", "content-digest"]
        .iter()
        .map(|n| header(&h, n).map(str::to_owned))
        .collect();
    let body_present = has_body(&h, &body);
    let max_size = s.engine.config().max_size;
    let decide = move |state: &ferry_tus::UploadState| {
        let dh = DraftAppendHeaders {
            content_type: owned[0].as_deref(),
            upload_offset: owned[1].as_deref(),
            upload_complete: owned[2].as_deref(),
            upload_length: owned[3].as_deref(),
            content_length: owned[4].as_deref(),
            content_digest: owned[5].as_deref(),
            has_body: body_present,
        };
        plan_draft_append(v, state, &dh, max_size).map_err(Refusal::from)
    };
    match s.engine.append(p, id, decide, BodyChunk::new(body, &h)).await {
        Ok(rec) => {
            let mut res = if rec.is_finished() { completed(StatusCode::OK, &rec) } else { StatusCode::NO_CONTENT.into_response() };
            state_headers(&s, v, res.headers_mut(), &rec);
            res
        }
        Err(e) => draft_problem(&s, Some(v), e),
    }
}

/// `DELETE /files/{id}` (§Upload Cancellation): an append in flight is stopped first; 204.
pub(super) async fn cancel(s: AppState, p: String, v: InteropVersion, id: String) -> Response {
    match s.engine.terminate(&p, &id).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => draft_problem(&s, Some(v), e),
    }
}
