//! TUS 1.0 handlers: OPTIONS (discovery), POST (creation), HEAD, PATCH, DELETE (termination).
//! A request carrying `Upload-Draft-Interop-Version` speaks the IETF resumable-upload draft
//! instead and is handed to [`super::rufh`] before any TUS rule applies.

use crate::error::Refusal;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use ferry_tus::{check_version, plan_creation, plan_patch, CreationHeaders, PatchHeaders, UploadConcat, Verb, TUS_EXTENSIONS, TUS_VERSION};

use super::body::BodyChunk;
use super::{rufh, tus_headers, AppState, Problem, FILES_PATH};
use crate::app::Principal;
use crate::catalog::{Concat, UploadRecord};
use axum::Extension;

/// Headers of the upload routes that carry one value (TUS 1.0 §Headers, the IETF draft,
/// RFC 9530, Idempotency-Key): sent twice, no copy may silently win.
const SINGLE_VALUED: [&str; 14] = [
    "tus-resumable",
    "upload-offset",
    "upload-length",
    "upload-defer-length",
    "upload-checksum",
    "upload-metadata",
    "upload-concat",
    "upload-complete",
    "upload-incomplete",
    "upload-draft-interop-version",
    "repr-digest",
    "content-digest",
    "idempotency-key",
    "content-type",
];

/// Middleware of the upload routes: a header of [`SINGLE_VALUED`] sent more than once is
/// refused with 400 `invalid_argument` naming it, before any handler reads it (and nothing is
/// stored), rather than parsed as some malformed value.
pub(super) async fn single_valued_headers(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if let Some(refused) = SINGLE_VALUED.iter().find_map(|n| repeated(req.headers(), n)) {
        return refused.into_response();
    }
    next.run(req).await
}

/// 400 `invalid_argument` naming header `name` (lowercase) when it was sent more than once.
fn repeated(h: &HeaderMap, name: &str) -> Option<Problem> {
    let times = h.get_all(name).iter().count();
    if times < 2 {
        return None;
    }
    let canonical = name.split('-').map(|w| w[..1].to_ascii_uppercase() + &w[1..]).collect::<Vec<_>>().join("-");
    Some(Problem(Refusal::new(
        400,
        crate::error::ErrorCode::InvalidArgument,
        format!("the {canonical} header was sent {times} times; it carries one value"),
        format!("Send {canonical} once."),
    )))
}

/// The single value of header `name`. A value that is not visible ASCII, or a header sent
/// more than once, is passed on as a placeholder no grammar accepts, so it is refused as
/// malformed instead of one copy silently winning.
pub(super) fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut all = h.get_all(name).iter();
    let first = all.next()?;
    if all.next().is_some() {
        return Some("\u{0}");
    }
    Some(first.to_str().unwrap_or("\u{0}"))
}

/// Hand a request that speaks the IETF draft to [`rufh`]: `$call` gets the interop version.
macro_rules! draft_or_tus {
    ($s:expr, $h:expr, |$v:ident| $call:expr) => {
        match rufh::version_of(&$h) {
            Some(Ok($v)) => return Ok($call.await),
            Some(Err(e)) => return Ok(rufh::draft_problem(&$s, None, e)),
            None => {}
        }
    };
}

fn version(verb: Verb, h: &HeaderMap) -> Result<(), Problem> {
    check_version(verb, header(h, "tus-resumable")).map_err(Problem::from)
}

pub(super) fn set(h: &mut HeaderMap, name: &'static str, value: impl ToString) {
    if let Ok(v) = HeaderValue::from_str(&value.to_string()) {
        h.insert(name, v);
    }
}

/// IMF-fixdate of Unix ms, clamped to what HTTP dates can express (years 1970–9999).
pub(super) fn http_date(ms: i64) -> String {
    const MAX_MS: i64 = 253_402_300_799_000; // 9999-12-31T23:59:59Z
    httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.clamp(0, MAX_MS) as u64))
}

/// The state headers of an upload (TUS 1.0 §HEAD, §Expiration, §Concatenation), plus, once
/// it is complete, the download validators.
pub(super) fn upload_headers(h: &mut HeaderMap, rec: &UploadRecord) {
    tus_headers(h);
    let final_pending = matches!(rec.concat, Concat::Final { .. }) && !rec.is_finished();
    if !final_pending {
        set(h, "upload-offset", rec.offset);
    }
    match rec.length {
        Some(l) => set(h, "upload-length", l),
        None if !matches!(rec.concat, Concat::Final { .. }) => set(h, "upload-defer-length", 1),
        None => {}
    }
    if !rec.metadata.is_empty() {
        set(h, "upload-metadata", &rec.metadata);
    }
    match &rec.concat {
        Concat::None => {}
        Concat::Partial => set(h, "upload-concat", "partial"),
        // The parts as this server's relative URLs, not the header as received: its length
        // then depends only on the number of parts (at most `MAX_PARTS`), so the response
        // headers stay within what the README promises proxies.
        Concat::Final { parts, .. } => {
            let urls: Vec<String> = parts.iter().map(|p| format!("{FILES_PATH}{p}")).collect();
            set(h, "upload-concat", format!("final;{}", urls.join(" ")));
        }
    }
    if let (Some(exp), false) = (rec.expires_at_ms, rec.is_finished()) {
        set(h, "upload-expires", http_date(exp));
    }
    if let Some(sha) = rec.sha256 {
        set(h, "etag", super::download::etag(&sha));
        set(h, "repr-digest", ferry_tus::ReprDigest::from_sha256(sha));
    }
}

/// `OPTIONS /files/`: TUS discovery (TUS 1.0 §OPTIONS). 200 with an empty body
/// (`Content-Length: 0`), as tusd answers and as conformance suites written against it expect;
/// TUS 1.0's example shows 204, and a 200 with no body serves clients that expect either.
pub async fn options(State(s): State<AppState>, h: HeaderMap) -> Result<Response, Problem> {
    version(Verb::Options, &h)?;
    let mut res = StatusCode::OK.into_response();
    let h = res.headers_mut();
    tus_headers(h);
    set(h, "tus-version", TUS_VERSION);
    set(h, "tus-extension", TUS_EXTENSIONS.join(","));
    set(h, "tus-max-size", s.engine.config().max_size);
    set(h, "tus-checksum-algorithm", ferry_tus::checksum_algorithms_header());
    rufh::options_headers(&s, h);
    Ok(res)
}

/// The URL of an upload as the client should see it: relative by default; absolute from
/// `Forwarded` / `X-Forwarded-Host`/`-Proto` only when configured behind a proxy.
///
/// For a request made with an upload-scoped token (`upload_only`), the URL carries a signed
/// `upload` query ([`crate::signing`]): that token cannot HEAD or PATCH by itself, the URL can,
/// for this one upload and [`crate::app::UPLOAD_ONLY_URL_TTL_MS`].
pub(super) fn location(s: &AppState, h: &HeaderMap, id: &str, upload_only: Option<crate::app::UploadOnly>) -> String {
    let url = location_unsigned(s, h, id);
    match upload_only {
        None => url,
        Some(_) => {
            let expires = (crate::upload::now_ms() + crate::app::UPLOAD_ONLY_URL_TTL_MS as i64 + 999).div_euclid(1000);
            format!("{url}?{}", s.links.signer().sign(crate::signing::Scope::Upload, id, expires))
        }
    }
}

/// Longest forwarded host `Location` echoes (a DNS name's 253 characters, `:` and a port).
const MAX_HOST_LEN: usize = 259;

fn location_unsigned(s: &AppState, h: &HeaderMap, id: &str) -> String {
    let path = format!("{FILES_PATH}{id}");
    if !s.http.behind_proxy {
        // With `--public-url` the operator told us the absolute address; else stay relative.
        return if s.http.absolute_locations { s.links.file_url(id) } else { path };
    }
    let mut proto = None;
    let mut host = None;
    if let Some(fwd) = header(h, "forwarded") {
        // RFC 7239: the first element describes the client-facing hop.
        for pair in fwd.split(',').next().unwrap_or("").split(';') {
            if let Some((k, v)) = pair.trim().split_once('=') {
                let v = v.trim().trim_matches('"').to_string();
                match k.trim().to_ascii_lowercase().as_str() {
                    "proto" => proto = Some(v),
                    "host" => host = Some(v),
                    _ => {}
                }
            }
        }
    }
    let first = |name| header(h, name).and_then(|v| v.split(',').next()).map(|v| v.trim().to_string());
    let proto = proto.or_else(|| first("x-forwarded-proto")).filter(|p| p == "http" || p == "https");
    let host = host.or_else(|| first("x-forwarded-host")).or_else(|| first("host"));
    // A host name is at most 253 characters, and a port 6 more: a longer "host" is not one, and
    // echoing it would let a request grow the answer's headers past what proxies are told.
    let valid_host = |h: &String| !h.is_empty() && h.len() <= MAX_HOST_LEN && h.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b));
    match host.filter(valid_host) {
        Some(host) => format!("{}://{host}{path}", proto.unwrap_or_else(|| "http".into())),
        None => path,
    }
}

/// Whether a request carries content: `Content-Length` above 0, or a body whose end is not
/// known yet. Over HTTP/1.1 the latter is `Transfer-Encoding: chunked`; over HTTP/2 a body has
/// neither header when its length is unknown (RFC 9113 §8.1: the stream's frames frame it), so
/// the body itself says whether more may come.
pub(super) fn has_body(h: &HeaderMap, body: &Body) -> bool {
    match header(h, "content-length") {
        Some(cl) => cl != "0",
        None => !http_body::Body::is_end_stream(body),
    }
}

/// `POST /files/`: creation, creation-with-upload, creation-defer-length, concatenation.
pub async fn create(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    upload_only: Option<Extension<crate::app::UploadOnly>>,
    interim: Option<Extension<super::wire::Interim>>,
    uri: axum::http::Uri,
    h: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let upload_only = upload_only.map(|Extension(u)| u);
    draft_or_tus!(s, h, |v| rufh::create(s.clone(), p, v, h, body, upload_only, interim.map(|Extension(i)| i)));
    version(Verb::Post, &h)?;
    let ch = CreationHeaders {
        upload_length: header(&h, "upload-length"),
        upload_defer_length: header(&h, "upload-defer-length"),
        upload_metadata: header(&h, "upload-metadata"),
        upload_concat: header(&h, "upload-concat"),
        upload_checksum: header(&h, "upload-checksum"),
        repr_digest: header(&h, "repr-digest"),
        content_type: header(&h, "content-type"),
        content_length: header(&h, "content-length"),
        has_body: has_body(&h, &body),
    };
    let limits = crate::app::limits::creation_limits(&s.engine);
    let plan = plan_creation(&ch, &limits)?;
    if let Some(UploadConcat::Final(urls)) = &plan.concat {
        check_part_count(urls.len(), header(&h, "upload-metadata").map_or(0, str::len))?;
        check_part_urls(&s, &h, &uri, urls)?;
    }
    let key = idempotency_key(&h)?;
    let created = s.engine.create_keyed(&p, &plan, header(&h, "upload-metadata").unwrap_or(""), key.as_ref()).await?;
    let rec = created.upload;
    let loc = location(&s, &h, &rec.id, upload_only);
    let rec = if matches!(rec.concat, Concat::Final { .. }) && s.engine.final_ready(&rec.id).await? {
        // Small concatenations finish while the client waits; big ones continue in the
        // background (HEAD shows no Upload-Offset until then).
        let task = start_concat(&s, &p, &rec.id).await?;
        let deadline = tokio::time::Instant::now() + CONCAT_WAIT;
        // Subscribed before the first look: the task's end (an event, on whichever replica
        // runs it) wakes the wait.
        let mut changes = s.events.changes();
        loop {
            if s.tasks.get(&p, &task).await.map(|t| t.status.is_terminal()).unwrap_or(true) {
                break;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            changes.wait(left).await;
        }
        s.engine.get(&p, &rec.id).await?
    } else {
        rec
    };
    // A retry that found its first attempt's upload does not append its body again: the client
    // learns the offset from the answer (or HEAD) and resumes from there.
    let rec = if plan.with_body && !created.existing {
        let body_plan = s.engine.creation_body_plan(&plan);
        let appended = s.engine.append(p.clone(), rec.id.clone(), move |_| Ok(body_plan), BodyChunk::new(body, &h)).await;
        match s.engine.settle_creation(&p, &rec.id, appended).await {
            Ok(rec) => rec,
            Err(refused) => {
                // Interrupted: the upload keeps what arrived; tell the client where, so it can
                // resume. Refused: nothing is left, and the answer names no upload.
                let mut res = Problem(refused.error).into_response();
                if refused.kept {
                    set(res.headers_mut(), "location", &loc);
                }
                return Ok(res);
            }
        }
    } else {
        rec
    };
    let mut res = StatusCode::CREATED.into_response();
    let hm = res.headers_mut();
    upload_headers(hm, &rec);
    hm.remove("upload-metadata");
    set(hm, "location", loc);
    Ok(res)
}

/// Bytes of the `Upload-Concat` value answered for a final upload of `parts` parts
/// (`final;/files/ID /files/ID…`, see [`upload_headers`]).
fn concat_answer_len(parts: usize) -> usize {
    "final;".len() + parts * (FILES_PATH.len() + 26 + 1) - 1
}

/// A final upload names at most [`crate::upload::MAX_PARTS`] parts, and its `Upload-Metadata`
/// and the part list it answers in `Upload-Concat` share the metadata's 4 KiB: every HEAD
/// answers both, and the README promises proxies response headers under 6 KiB. 400
/// `invalid_argument` naming the limit otherwise.
fn check_part_count(parts: usize, metadata_len: usize) -> Result<(), Problem> {
    use crate::upload::{MAX_METADATA_BYTES, MAX_PARTS};
    if parts > MAX_PARTS {
        return Err(Problem(Refusal::bad_request(
            format!("a final upload may name at most {MAX_PARTS} partial uploads; this one names {parts}"),
            format!(
                "Upload the file in at most {MAX_PARTS} parts, or concatenate in \
                 stages (a final upload cannot be a part, so join fewer, larger parts)."
            ),
        )));
    }
    let answered = concat_answer_len(parts);
    if metadata_len + answered > MAX_METADATA_BYTES {
        return Err(Problem(Refusal::bad_request(
            format!(
                "a final upload's Upload-Metadata ({metadata_len} bytes) and the part list it answers in Upload-Concat \
                 ({answered} bytes for {parts} parts, {} per part) may take at most {MAX_METADATA_BYTES} bytes together",
                FILES_PATH.len() + 27
            ),
            "Send less metadata with the final upload, or join fewer parts.",
        )));
    }
    Ok(())
}

/// The parts a final upload names must be uploads of this server (TUS 1.0 §Concatenation): a
/// relative URL (`/files/ID`, or the bare id) always is; an absolute one (or a scheme-relative
/// `//host/…`) must name the host the request was sent to (`Host`, or with `--behind-proxy`
/// the forwarded host) or the public URL's (`--public-url`). Otherwise 400 `invalid_argument`
/// naming the URL, rather than joining whatever local upload has that URL's last path segment
/// as its id.
fn check_part_urls(s: &AppState, h: &HeaderMap, uri: &axum::http::Uri, urls: &[String]) -> Result<(), Problem> {
    let mut ours: Vec<String> = Vec::new();
    ours.extend(header(h, "host").map(str::to_owned));
    // HTTP/2 sends `:authority` instead of `Host`.
    ours.extend(uri.authority().map(|a| a.as_str().to_owned()));
    if s.http.behind_proxy {
        let first = |name| header(h, name).and_then(|v| v.split(',').next()).map(|v| v.trim().to_string());
        ours.extend(first("x-forwarded-host"));
        if let Some(fwd) = header(h, "forwarded") {
            for pair in fwd.split(',').next().unwrap_or("").split(';') {
                if let Some((k, v)) = pair.trim().split_once('=') {
                    if k.trim().eq_ignore_ascii_case("host") {
                        ours.push(v.trim().trim_matches('"').to_string());
                    }
                }
            }
        }
    }
    if let Ok(public) = url::Url::parse(&s.links.file_url("x")) {
        ours.extend(public.host_str().map(|host| match public.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        }));
    }
    for u in urls {
        let absolute = if u.starts_with("//") { url::Url::parse(&format!("http:{u}")) } else { url::Url::parse(u) };
        let Ok(abs) = absolute else { continue };
        let Some(host) = abs.host_str() else {
            return Err(foreign_part(u, "it names no host"));
        };
        if !matches!(abs.scheme(), "http" | "https") {
            return Err(foreign_part(u, "it is not an http(s) URL"));
        }
        let same = ours.iter().any(|a| {
            let (ah, ap) = split_authority(a);
            ah.eq_ignore_ascii_case(host) && (ap == abs.port() || ap == abs.port_or_known_default())
        });
        if !same {
            return Err(foreign_part(u, &format!("it names another server ({host})")));
        }
    }
    Ok(())
}

/// `host[:port]` (IPv6 in brackets) → host (brackets kept, as `Url::host_str` gives it) and port.
fn split_authority(a: &str) -> (&str, Option<u16>) {
    match a.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, port.parse().ok()),
        _ => (a, None),
    }
}

fn foreign_part(url: &str, why: &str) -> Problem {
    Problem(Refusal::bad_request(
        format!("Upload-Concat names {url:?}, which is not a partial upload of this server: {why}"),
        "Name each partial upload by the URL this server answered in its Location (a relative /files/ID is enough).",
    ))
}

/// The request's `Idempotency-Key`, if any (one parser for every route that takes one).
/// Errors: 400 for a malformed key or one sent twice.
pub(super) fn idempotency_key(h: &HeaderMap) -> Result<Option<ferry_tus::IdempotencyKey>, Problem> {
    if let Some(refused) = repeated(h, "idempotency-key") {
        return Err(refused);
    }
    header(h, "idempotency-key")
        .map(|v| {
            v.parse::<ferry_tus::IdempotencyKey>().map_err(|e| {
                Problem(Refusal::bad_request(
                    format!("{e}"),
                    format!(
                        "Send one Idempotency-Key of 1 to {} characters, e.g. \"8e03978e-40d5-43e8-bc93-6894a57f9324\".",
                        ferry_tus::IdempotencyKey::MAX_LEN
                    ),
                ))
            })
        })
        .transpose()
}

/// Start (or join) the `concat` task that builds final upload `id`.
async fn start_concat(s: &AppState, principal: &str, id: &str) -> Result<String, Refusal> {
    let args = serde_json::json!({ "final": id }).to_string();
    let started = s.tasks.start(principal, "concat", &args, Some(&crate::tasks::kinds::concat::concat_key(id)), None).await?;
    Ok(started.task.id)
}

/// How long a POST creating a ready final upload waits for its concatenation.
const CONCAT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Start the `concat` tasks of the finals that finished partial upload `id` completes (it was
/// finished just now, perhaps, by a reader), as its last PATCH would.
pub(super) async fn start_ready_finals(s: &AppState, principal: &str, id: &str) -> Result<(), Refusal> {
    for f in s.engine.finals_ready(id).await? {
        start_concat(s, principal, &f).await?;
    }
    Ok(())
}

/// `HEAD /files/{id}`. With `Tus-Resumable` (every TUS client sends it: tus-js-client, tuspy,
/// `ferry upload`), TUS 1.0 §HEAD: the durable offset (an in-flight PATCH is asked to
/// checkpoint first), 200 whether or not the upload is finished. Without it, a plain HTTP HEAD
/// of the download (curl -I, a browser): exactly what `GET` would answer, minus the body
/// (RFC 9110 §9.3.2; see [`super::download::head`]) — 409 for an unfinished upload.
pub async fn head(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    scope: Option<Extension<crate::signing::Scope>>,
    Path(id): Path<String>,
    uri: axum::http::Uri,
    h: HeaderMap,
) -> Result<Response, Problem> {
    draft_or_tus!(s, h, |v| rufh::head(s.clone(), p, v, id));
    if !h.contains_key("tus-resumable") {
        return super::download::head(&s, &p, &id, &uri, &h).await;
    }
    version(Verb::Head, &h)?;
    // A TUS HEAD with a signed download URL reads the record without asking an in-flight
    // PATCH to stop.
    let reader = scope.is_some_and(|Extension(sc)| sc == crate::signing::Scope::Download);
    // Either way an upload whose bytes are all stored but that is not finished is finished
    // first; while it cannot be, the answer is 423 + Retry-After, never offset = length.
    let rec = if reader { s.engine.get_finished_or_finish(&p, &id).await? } else { s.engine.head(&p, &id).await? };
    if rec.concat == Concat::Partial && rec.is_finished() {
        // Finished just now, perhaps: build the finals it completes, as its last PATCH would.
        start_ready_finals(&s, &p, &rec.id).await?;
    }
    let mut res = StatusCode::OK.into_response();
    let hm = res.headers_mut();
    upload_headers(hm, &rec);
    hm.insert("cache-control", HeaderValue::from_static("no-store"));
    if rec.is_finished() {
        super::download::representation_headers(hm, &rec, false);
        set(hm, "content-length", rec.length.unwrap_or(0));
    }
    Ok(res)
}

/// `PATCH /files/{id}`: append a chunk at `Upload-Offset`.
pub async fn patch(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    Path(id): Path<String>,
    h: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    draft_or_tus!(s, h, |v| rufh::append(s.clone(), p, v, id, h, body));
    version(Verb::Patch, &h)?;
    let owned: Vec<Option<String>> = ["content-type", "upload-offset", "upload-length", "upload-checksum", "content-length", "trailer"]
        .iter()
        .map(|n| header(&h, n).map(str::to_owned))
        .collect();
    let max_size = s.engine.config().max_size;
    let decide = move |state: &ferry_tus::UploadState| -> Result<ferry_tus::PatchPlan, Refusal> {
        let ph = PatchHeaders {
            content_type: owned[0].as_deref(),
            upload_offset: owned[1].as_deref(),
            upload_length: owned[2].as_deref(),
            upload_checksum: owned[3].as_deref(),
            content_length: owned[4].as_deref(),
            trailer: owned[5].as_deref(),
        };
        plan_patch(state, &ph, max_size).map_err(Refusal::from)
    };
    let rec = s.engine.append(p.clone(), id, decide, BodyChunk::new(body, &h)).await?;
    if rec.concat == Concat::Partial && rec.is_finished() {
        start_ready_finals(&s, &p, &rec.id).await?;
    }
    let mut res = StatusCode::NO_CONTENT.into_response();
    let hm = res.headers_mut();
    upload_headers(hm, &rec);
    hm.remove("upload-metadata");
    Ok(res)
}

/// `DELETE /files/{id}`: termination (TUS 1.0 §Termination).
pub async fn terminate(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    Path(id): Path<String>,
    h: HeaderMap,
) -> Result<Response, Problem> {
    draft_or_tus!(s, h, |v| rufh::cancel(s.clone(), p, v, id));
    version(Verb::Delete, &h)?;
    s.engine.terminate(&p, &id).await?;
    let mut res = StatusCode::NO_CONTENT.into_response();
    tus_headers(res.headers_mut());
    Ok(res)
}
