//! Downloads of finished uploads: `GET /files/{id}` with a single Range (RFC 9110 §14.2),
//! If-Range (§13.1.5), If-None-Match, a strong ETag from the sha256, and
//! `Repr-Digest: sha-256=:…:` (RFC 9530).
//!
//! A request with several ranges gets `200` and the whole body (RFC 9110 allows ignoring
//! Range; ferry does not produce multipart/byteranges). Decide first, then render.

use crate::error::{ErrorCode, Refusal};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use ferry_tus::RangeOutcome;
use ferry_tus::Verb;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::{tus_headers, AppState, Problem};
use crate::app::Principal;
use crate::catalog::UploadRecord;
use crate::upload::Followed;
use axum::Extension;
use http_body::Frame;

/// Strong ETag of a finished upload: its sha256 in hex, quoted.
pub fn etag(sha256: &[u8; 32]) -> String {
    format!("\"{}\"", hex::encode(sha256))
}

/// Whether a download of media type `m` may be shown by the browser (`inline`): only types a
/// browser shows passively — raster images (PNG, JPEG, GIF, WebP, AVIF, BMP), audio, video,
/// `text/plain`, `text/csv`, JSON and PDF. An allowlist: every other type is an attachment —
/// active ones (HTML, SVG, XML, JavaScript), ones this list does not know
/// (`multipart/x-mixed-replace`, `message/rfc822`, `text/css`, `image/svg` without `+xml`, …),
/// and `application/octet-stream`, which is also what a media type ferry cannot parse falls
/// back to ([`crate::upload::describe_raw`]). A text type is inline only with no `charset` or
/// `charset` `utf-8` / `us-ascii` (case-insensitive, RFC 2046 §4.1.2): another charset
/// (`utf-7`, …) is one a browser might decode into markup.
fn is_inline(m: &mime::Mime) -> bool {
    const PASSIVE: &[&str] = &[
        "image/png",
        "image/jpeg",
        "image/gif",
        "image/webp",
        "image/avif",
        "image/bmp",
        "text/plain",
        "text/csv",
        "application/json",
        "application/pdf",
    ];
    let passive = PASSIVE.contains(&m.essence_str()) || matches!(m.type_(), mime::AUDIO | mime::VIDEO);
    let charset_ok = m.type_() != mime::TEXT
        || m.get_param(mime::CHARSET).is_none_or(|c| c.as_str().eq_ignore_ascii_case("utf-8") || c.as_str().eq_ignore_ascii_case("us-ascii"));
    passive && charset_ok
}

/// RFC 8187 attr-char: ALPHA / DIGIT / "!#$&+-.^_`|~".
const ATTR_CHAR: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'!')
    .remove(b'#')
    .remove(b'$')
    .remove(b'&')
    .remove(b'+')
    .remove(b'-')
    .remove(b'.')
    .remove(b'^')
    .remove(b'_')
    .remove(b'`')
    .remove(b'|')
    .remove(b'~');

/// Most bytes of the name [`content_disposition`] offers (before percent-encoding, which at
/// most triples it): the header stays under about 900 bytes whatever the stored name.
pub const DISPOSITION_NAME_BYTES: usize = 200;

/// RFC 6266 `Content-Disposition`, following its Appendix D: the name shown to people
/// ([`crate::names::display_name`]: control and bidi characters replaced by U+FFFD), cut to
/// [`DISPOSITION_NAME_BYTES`] with its extension kept ([`crate::names::shorten`]); a
/// `filename` that is that name when plain ASCII says it faithfully, else an ASCII fallback
/// (other characters, `"`, `\\` and `%` and `;` as `_`) followed by `filename*` (RFC 8187, UTF-8).
pub(super) fn content_disposition(disposition: &str, filename: Option<&str>) -> String {
    let Some(name) = filename.map(|n| n.rsplit(['/', '\\']).next().unwrap_or(n)).filter(|n| !n.is_empty() && *n != "." && *n != "..") else {
        return disposition.to_string();
    };
    let name = crate::names::shorten(&crate::names::display_name(name), DISPOSITION_NAME_BYTES);
    let fallback: String =
        name.chars().map(|c| if c.is_ascii_graphic() && !matches!(c, '"' | '\\' | '%' | ';') || c == ' ' { c } else { '_' }).collect();
    if fallback == name {
        return format!("{disposition}; filename=\"{fallback}\"");
    }
    format!("{disposition}; filename=\"{fallback}\"; filename*=UTF-8''{}", utf8_percent_encode(&name, ATTR_CHAR))
}

/// Content-Type, Content-Disposition and the validators of a finished upload. `attachment`
/// forces `Content-Disposition: attachment` (the download page's button asks for it with
/// `?download=1`); otherwise every type but the passive ones ([`is_inline`]).
pub(super) fn representation_headers(h: &mut HeaderMap, rec: &UploadRecord, attachment: bool) {
    // The same description `GET /api/v1/files/{id}` and MCP handles show.
    let crate::upload::Description { name, media_type: media } = crate::upload::describe_raw(&rec.metadata);
    let disposition = if !attachment && is_inline(&media) { "inline" } else { "attachment" };
    let cd = content_disposition(disposition, name.as_deref());
    let pairs = [
        ("content-type", media.to_string()),
        ("content-disposition", cd),
        ("x-content-type-options", "nosniff".to_string()),
        ("content-security-policy", "default-src 'none'; sandbox".to_string()),
        ("accept-ranges", "bytes".to_string()),
        ("last-modified", super::tus::http_date(rec.finished_at_ms.unwrap_or(0))),
    ];
    for (k, v) in pairs {
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    }
}

/// Every field line of `name` joined with `", "` (RFC 9110 §5.3), bytes outside visible ASCII
/// as U+FFFD (they match no tag, date or range); `None` when the request has none.
fn combined(h: &HeaderMap, name: &str) -> Option<String> {
    let mut lines = h.get_all(name).iter().map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let first = lines.next()?;
    Some(lines.fold(first, |all, line| all + ", " + &line))
}

/// `GET /files/{id}`. Errors: 404/410; 409 `upload_incomplete` with `Upload-Offset` while the
/// upload is unfinished; 412 `conflict` when `If-Match`/`If-Unmodified-Since` do not hold; 416
/// with `Content-Range: bytes */N` for an unsatisfiable range. 304 as `If-None-Match` /
/// `If-Modified-Since` say; which of these, and 200 or 206, is [`ferry_tus::select_range`]'s.
/// `?download=1` asks for `Content-Disposition: attachment` whatever the media type.
///
/// A `GET` at interop version 9 or later of the IETF draft (`Upload-Draft-Interop-Version`) is
/// the draft's offset retrieval, answered as its `HEAD` ([`super::rufh::head`]).
pub async fn get(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    Path(id): Path<String>,
    uri: axum::http::Uri,
    h: HeaderMap,
) -> Result<Response, Problem> {
    if let Some(Ok(v)) = super::rufh::version_of(&h).filter(|v| v.as_ref().is_ok_and(|v| v.offset_by_get())) {
        return Ok(super::rufh::head(s.clone(), p, v, id).await);
    }
    answer(&s, &p, &id, &uri, &h, false).await
}

/// A plain HTTP `HEAD /files/{id}` (no `Tus-Resumable`: curl -I, a browser, a download
/// manager): exactly the status and header fields [`get`] would send, without the body (RFC
/// 9110 §9.3.2) and without reading a byte — preconditions, `Range` (206, 416) and the 409 of an
/// unfinished upload included. RFC 9110 §14.2 defines range handling for GET only; ferry
/// mirrors the GET, as nginx does, so a HEAD learns what the GET would answer.
pub(super) async fn head(s: &AppState, p: &str, id: &str, uri: &axum::http::Uri, h: &HeaderMap) -> Result<Response, Problem> {
    answer(s, p, id, uri, h, true).await
}

/// The one decision path of [`get`] and [`head`]: the same status and headers; the body (the
/// bytes) only for a GET.
async fn answer(s: &AppState, p: &str, id: &str, uri: &axum::http::Uri, h: &HeaderMap, head: bool) -> Result<Response, Problem> {
    let attachment = query_flag(uri, "download");
    ferry_tus::check_version(Verb::Get, super::tus::header(h, "tus-resumable"))?;
    if query_flag(uri, "follow") {
        let rec = s.engine.get(p, id).await?;
        if !rec.is_finished() {
            return follow(s, &rec, h, head, attachment).await;
        }
    }
    // An upload whose bytes are all stored but that is not finished is finished first; while
    // it cannot be, 503 + Retry-After (what download clients retry on), not 409.
    let rec = match s.engine.get_finished_or_finish(p, id).await {
        Ok(rec) => rec,
        Err(mut e) if e.code == ErrorCode::Locked => {
            e.status = 503;
            e.code = ErrorCode::Unavailable;
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    if rec.concat == crate::catalog::Concat::Partial && rec.is_finished() {
        // Finished just now, perhaps: build the finals it completes, as its last PATCH would.
        super::tus::start_ready_finals(s, p, &rec.id).await?;
    }
    let (Some(sha), Some(len)) = (rec.sha256.filter(|_| rec.is_finished()), rec.length) else {
        let mut res = Problem(s.engine.not_complete_now(&rec).await).into_response();
        super::tus::upload_headers(res.headers_mut(), &rec);
        return Ok(res);
    };
    let tag = etag(&sha);
    let mut headers = HeaderMap::new();
    super::tus::upload_headers(&mut headers, &rec);
    representation_headers(&mut headers, &rec, attachment);
    let (status, range) = match select(h, len, &tag, &mut headers) {
        Selected::Send { status, range } => (status, range),
        Selected::Done(res) => return Ok(res),
    };
    tus_headers(&mut headers);
    if head {
        let mut res = status.into_response();
        res.headers_mut().extend(headers);
        return Ok(res);
    }
    let stream = counted(s, &rec.id, s.engine.read(&rec, range.clone()).await?);
    let mut res = (status, Body::from_stream(stream)).into_response();
    res.headers_mut().extend(headers);
    Ok(res)
}

/// Whether the query has `NAME=1` (`?download=1`, `?follow=1`).
fn query_flag(uri: &axum::http::Uri, name: &str) -> bool {
    uri.query().is_some_and(|q| q.split('&').any(|pair| pair.strip_prefix(name).and_then(|v| v.strip_prefix('=')) == Some("1")))
}

/// `GET /files/{id}?follow=1` of upload `rec`, which is not finished yet: `200` (or `206` for
/// a single `Range` of an upload whose length is declared) whose body is the bytes committed
/// so far, then each new commit as it becomes durable, until the upload finishes
/// ([`crate::upload::UploadEngine::follow`]). No `Content-Length` (HTTP/1.1: chunked), no
/// `ETag`, `Cache-Control: no-store`; `Trailer: Repr-Digest` is declared and the body ends with
/// the whole file's `Repr-Digest: sha-256=:…:` (RFC 9530) as a trailer field — on HTTP/1.1 only
/// when the request says `TE: trailers` (RFC 9110 §10.1.4; hyper sends no trailer otherwise),
/// always on HTTP/2. A follow that cannot end with the whole file (terminated, expired, refused
/// at completion, rolled back, server shutting down) ends the body as a failure: the chunked
/// encoding is never terminated (HTTP/1.1, the connection is closed) or the stream is reset
/// (HTTP/2), so no client takes a short body for the file.
///
/// A `Range` whose bytes are all committed already, on a store that reads unfinished uploads
/// (files), is an ordinary `206` with `Content-Length` (no trailer). `If-Range` never matches
/// (the file has no ETag yet: the whole body follows); `If-Match` other than `*` → 412. A
/// `Range` on an upload of deferred length is ignored (200, the whole body).
async fn follow(s: &AppState, rec: &UploadRecord, h: &HeaderMap, head: bool, attachment: bool) -> Result<Response, Problem> {
    let mut headers = HeaderMap::new();
    super::tus::upload_headers(&mut headers, rec);
    representation_headers(&mut headers, rec, attachment);
    headers.remove("last-modified");
    let fields = ["if-match", "if-none-match", "range", "if-range"].map(|n| combined(h, n));
    let [if_match, if_none_match, range, if_range] = fields.each_ref().map(Option::as_deref);
    let conditions = ferry_tus::Conditions { if_match, if_unmodified_since: None, if_none_match, if_modified_since: None, range, if_range };
    // No validator yet: only `*` names the upload, and `If-Range` never holds.
    let outcome = match rec.length {
        Some(len) => ferry_tus::select_range(&conditions, len, "", ""),
        None => ferry_tus::select_range(&ferry_tus::Conditions { range: None, ..conditions }, 0, "", ""),
    };
    let len = rec.length.unwrap_or(0);
    let (status, start, end) = match outcome {
        RangeOutcome::Whole => (StatusCode::OK, 0, None),
        RangeOutcome::Partial { start, end_inclusive } => (StatusCode::PARTIAL_CONTENT, start, Some(end_inclusive + 1)),
        RangeOutcome::NotModified => {
            let mut res = StatusCode::NOT_MODIFIED.into_response();
            res.headers_mut().extend(headers);
            return Ok(res);
        }
        RangeOutcome::PreconditionFailed => {
            return Err(Refusal::new(
                412,
                ErrorCode::Conflict,
                "the upload is not finished: it has no ETag yet, so If-Match names another file",
                "Send the request without If-Match, or wait until the upload is finished.",
            )
            .into())
        }
        RangeOutcome::Unsatisfiable => {
            let mut res = Problem(Refusal::new(
                416,
                ErrorCode::InvalidArgument,
                format!("the range is outside the upload's declared {len} bytes"),
                if len == 0 {
                    "The upload is empty: request it without a Range header.".to_string()
                } else {
                    format!("Request a range within bytes 0-{}.", len - 1)
                },
            ))
            .into_response();
            if let Some(cr) = outcome.content_range(len) {
                res.headers_mut().insert("content-range", HeaderValue::from_str(&cr).expect("ascii"));
            }
            return Ok(res);
        }
    };
    if let Some(cr) = outcome.content_range(len) {
        headers.insert("content-range", HeaderValue::from_str(&cr).expect("ascii"));
    }
    headers.insert("cache-control", HeaderValue::from_static("no-store"));
    tus_headers(&mut headers);
    // A range of committed bytes: read as they are, like a finished file's.
    if let Some(end) = end.filter(|e| *e <= rec.offset && s.engine.reads_unfinished()) {
        headers.insert("content-length", HeaderValue::from(end - start));
        let body = if head { Body::empty() } else { Body::from_stream(counted(s, &rec.id, s.engine.read(rec, start..end).await?)) };
        let mut res = (status, body).into_response();
        res.headers_mut().extend(headers);
        return Ok(res);
    }
    headers.insert("trailer", HeaderValue::from_static("repr-digest"));
    if head {
        let body = Body::from_stream(futures::stream::empty::<Result<bytes::Bytes, std::io::Error>>());
        let mut res = (status, body).into_response();
        res.headers_mut().extend(headers);
        return Ok(res);
    }
    let sent = s.metrics.bytes_sent.clone();
    let id = rec.id.clone();
    let frames = futures::StreamExt::map(s.engine.follow(rec, start, end), move |item| match item {
        Ok(Followed::Bytes(chunk)) => {
            sent.inc_by(chunk.len() as u64);
            Ok(Frame::data(chunk))
        }
        Ok(Followed::Whole { sha256 }) => {
            let mut trailers = HeaderMap::new();
            let digest = ferry_tus::ReprDigest::from_sha256(sha256).to_string();
            trailers.insert("repr-digest", HeaderValue::from_str(&digest).expect("ascii"));
            Ok(Frame::trailers(trailers))
        }
        Err(e) => {
            tracing::warn!(upload = id, error = %e, "a followed download ended without the whole file");
            Err(e)
        }
    });
    let mut res = (status, Body::new(http_body_util::StreamBody::new(frames))).into_response();
    res.headers_mut().extend(headers);
    Ok(res)
}

/// `stream` counted into `ferry_bytes_sent_total` as each chunk is handed to the connection,
/// and a read that fails mid-body logged: the body then ends early, the log says why.
fn counted(s: &AppState, id: &str, stream: crate::blob::ByteStream) -> impl futures::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static {
    let sent = s.metrics.bytes_sent.clone();
    let stream = futures::TryStreamExt::inspect_ok(stream, move |chunk| {
        sent.inc_by(chunk.len() as u64);
    });
    let id = id.to_string();
    futures::TryStreamExt::inspect_err(stream, move |e| {
        tracing::warn!(upload = id, error = %e, "a download stopped: reading the upload's bytes failed");
    })
}

/// What [`select`] decided.
pub(super) enum Selected {
    /// Send bytes `range` of the representation with `status` (200 or 206); `headers` now
    /// carry `Content-Length` and, for a 206, `Content-Range`.
    Send { status: StatusCode, range: std::ops::Range<u64> },
    /// The whole answer, without a body: 304, 412 or 416.
    Done(Response),
}

/// The conditional and range decision of a `GET` (or `HEAD`) of a representation of `len`
/// bytes whose validators are `tag` (a strong ETag) and the `last-modified` in `headers`
/// ([`ferry_tus::select_range`]: RFC 9110 §13.2.2 order, a single range, If-Range), rendered:
/// a 304 with `headers`, a 412 or 416 problem (the 416 with `Content-Range: bytes */N`), or
/// what to send. Both downloads of one file ([`get`]) and zips of several
/// ([`super::zip::serve_zip`]) answer through it.
pub(super) fn select(h: &HeaderMap, len: u64, tag: &str, headers: &mut HeaderMap) -> Selected {
    let last_modified = headers.get("last-modified").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let fields = ["if-match", "if-unmodified-since", "if-none-match", "if-modified-since", "range", "if-range"].map(|n| combined(h, n));
    let [if_match, if_unmodified_since, if_none_match, if_modified_since, range, if_range] = fields.each_ref().map(Option::as_deref);
    let conditions = ferry_tus::Conditions { if_match, if_unmodified_since, if_none_match, if_modified_since, range, if_range };
    let outcome = ferry_tus::select_range(&conditions, len, tag, &last_modified);
    let status = StatusCode::from_u16(outcome.status()).expect("a valid status");
    let range = outcome.bytes(len);
    match outcome {
        RangeOutcome::NotModified => {
            // A 304 sends no Content-Length. An empty body of known size would get one of 0 —
            // from axum on a HEAD, from hyper on an HTTP/2 GET — which RFC 9110 §8.6 forbids
            // (only the 200's length may be). A body of unknown size gets none on either protocol.
            let body = Body::from_stream(futures::stream::empty::<Result<bytes::Bytes, std::io::Error>>());
            let mut res = (StatusCode::NOT_MODIFIED, body).into_response();
            res.headers_mut().extend(headers.clone());
            return Selected::Done(res);
        }
        RangeOutcome::PreconditionFailed => {
            let mut res = Problem(Refusal::new(
                412,
                ErrorCode::Conflict,
                format!("the file is not the one If-Match or If-Unmodified-Since names: its ETag is {tag}, last modified {last_modified}"),
                "Send the request without If-Match and If-Unmodified-Since to get the file \
                 as it is now (its ETag and Last-Modified are in this answer's headers).",
            ))
            .into_response();
            for name in ["etag", "last-modified", "repr-digest"] {
                if let Some(v) = headers.get(name) {
                    res.headers_mut().insert(name, v.clone());
                }
            }
            return Selected::Done(res);
        }
        RangeOutcome::Unsatisfiable => {
            let mut res = Problem(Refusal::new(
                416,
                ErrorCode::InvalidArgument,
                format!("the range is outside the file's {len} bytes"),
                if len == 0 {
                    "The file is empty: request it without a Range header.".to_string()
                } else {
                    format!("Request a range within bytes 0-{}.", len - 1)
                },
            ))
            .into_response();
            if let Some(cr) = outcome.content_range(len) {
                res.headers_mut().insert("content-range", HeaderValue::from_str(&cr).expect("ascii"));
            }
            return Selected::Done(res);
        }
        RangeOutcome::Whole | RangeOutcome::Partial { .. } => {
            if let Some(cr) = outcome.content_range(len) {
                headers.insert("content-range", HeaderValue::from_str(&cr).expect("ascii"));
            }
        }
    }
    headers.insert("content-length", HeaderValue::from(range.end - range.start));
    Selected::Send { status, range }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disposition_is_safe() {
        assert_eq!(content_disposition("inline", None), "inline");
        assert_eq!(content_disposition("inline", Some("..")), "inline");
        assert_eq!(
            content_disposition("attachment", Some("../evil\"name.html")),
            "attachment; filename=\"evil_name.html\"; filename*=UTF-8''evil%22name.html"
        );
        assert_eq!(content_disposition("inline", Some("résumé.pdf")), "inline; filename=\"r_sum_.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9.pdf");
        assert_eq!(content_disposition("inline", Some("plain name.txt")), "inline; filename=\"plain name.txt\"");
        assert_eq!(content_disposition("attachment", Some("100%.txt")), "attachment; filename=\"100_.txt\"; filename*=UTF-8''100%25.txt");
        // Terminal escapes and bidi overrides are replaced by U+FFFD, never passed on.
        let cd = content_disposition("attachment", Some("invoice\u{202E}gnp.exe\u{7}\u{1b}"));
        assert_eq!(cd, "attachment; filename=\"invoice_gnp.exe__\"; filename*=UTF-8''invoice%EF%BF%BDgnp.exe%EF%BF%BD%EF%BF%BD");
        // Long names of any script stay within a bound, extension kept.
        for name in ["a".repeat(255) + ".bin", "é".repeat(250) + ".bin", "😀".repeat(250) + ".bin", "\u{1}".repeat(250)] {
            let cd = content_disposition("attachment", Some(&name));
            assert!(cd.len() <= 3 * DISPOSITION_NAME_BYTES + DISPOSITION_NAME_BYTES + 64, "{} bytes: {cd}", cd.len());
            assert!(HeaderValue::from_str(&cd).is_ok());
        }
    }

    #[test]
    fn only_passive_types_are_inline() {
        for t in [
            "text/html",
            "image/svg+xml",
            "application/xml",
            "text/javascript",
            "application/atom+xml",
            "text/jscript",
            "text/livescript",
            "text/xsl",
            "text/xml-external-parsed-entity",
        ] {
            assert!(!is_inline(&t.parse().unwrap()), "{t}");
        }
        for t in [
            "multipart/x-mixed-replace; boundary=x",
            "message/rfc822",
            "text/css",
            "image/svg",
            "application/x-shockwave-flash",
            "text/vtt",
            "font/woff2",
            "application/octet-stream",
        ] {
            assert!(!is_inline(&t.parse().unwrap()), "{t}: not known to be passive");
        }
        // A text type with a charset other than UTF-8 or US-ASCII could decode into markup.
        for t in ["text/plain; charset=utf-7", "text/csv; charset=UTF-16", "text/plain; charset=iso-2022-jp", "text/plain; charset=\"utf-7\""] {
            assert!(!is_inline(&t.parse().unwrap()), "{t}");
        }
        for t in [
            "image/png",
            "image/jpeg",
            "text/plain",
            "text/plain; charset=utf-8",
            "text/plain; charset=UTF-8",
            "text/csv; charset=US-ASCII",
            "text/plain; format=flowed",
            "application/pdf",
            "application/json",
            "video/mp4",
            "audio/mpeg",
        ] {
            assert!(is_inline(&t.parse().unwrap()), "{t}");
        }
    }

    #[test]
    fn field_lines_join_into_one_list() {
        let mut h = HeaderMap::new();
        assert_eq!(combined(&h, "range"), None);
        h.append("range", HeaderValue::from_static("bytes=0-1"));
        assert_eq!(combined(&h, "range").as_deref(), Some("bytes=0-1"));
        h.append("range", HeaderValue::from_static("bytes=5-6"));
        assert_eq!(combined(&h, "range").as_deref(), Some("bytes=0-1, bytes=5-6"));
    }
}
