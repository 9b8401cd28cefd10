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
use axum::Extension;

/// Strong ETag of a finished upload: its sha256 in hex, quoted.
pub fn etag(sha256: &[u8; 32]) -> String {
    format!("\"{}\"", hex::encode(sha256))
}

/// Whether a browser would execute or render `m` actively (or as anything but a passive
/// view): every type but those known to be shown passively — raster images, audio, video,
/// plain text, CSV, JSON and PDF — is served as an attachment. An allowlist: a type this list
/// does not know (`multipart/x-mixed-replace`, `message/rfc822`, `text/css`, `image/svg`
/// without `+xml`, …) is an attachment rather than a page of the server's origin.
fn is_active(m: &mime::Mime) -> bool {
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
        "application/octet-stream",
    ];
    let essence = m.essence_str();
    !(PASSIVE.contains(&essence) || matches!(m.type_(), mime::AUDIO | mime::VIDEO))
}

/// RFC 8187 attr-char: ALPHA / DIGIT / "!#$&+-.^_`|~".
const ATTR_CHAR: &AsciiSet =
    &NON_ALPHANUMERIC.remove(b'!').remove(b'#').remove(b'$').remove(b'&').remove(b'+').remove(b'-').remove(b'.').remove(b'^').remove(b'_').remove(b'`').remove(b'|').remove(b'~');

/// Most bytes of the name [`content_disposition`] offers (before percent-encoding, which at
/// most triples it): the header stays under about 900 bytes whatever the stored name.
pub const DISPOSITION_NAME_BYTES: usize = 200;

/// RFC 6266 `Content-Disposition`, following its Appendix D: the name shown to people
/// ([`crate::names::display_name`]: control and bidi characters replaced by U+FFFD), cut to
/// [`DISPOSITION_NAME_BYTES`] with its extension kept ([`crate::names::shorten`]); a
/// `filename` that is that name when plain ASCII says it faithfully, else an ASCII fallback
/// (other characters, `"`, `\\` and `%` and `;` as `_`) followed by `filename*` (RFC 8187, UTF-8).
fn content_disposition(disposition: &str, filename: Option<&str>) -> String {
    let Some(name) = filename.map(|n| n.rsplit(['/', '\\']).next().unwrap_or(n)).filter(|n| !n.is_empty() && *n != "." && *n != "..") else {
        return disposition.to_string();
    };
    let name = crate::names::shorten(&crate::names::display_name(name), DISPOSITION_NAME_BYTES);
    let fallback: String = name.chars().map(|c| if c.is_ascii_graphic() && !matches!(c, '"' | '\\' | '%' | ';') || c == ' ' { c } else { '_' }).collect();
    if fallback == name {
        return format!("{disposition}; filename=\"{fallback}\"");
    }
    format!("{disposition}; filename=\"{fallback}\"; filename*=UTF-8''{}", utf8_percent_encode(&name, ATTR_CHAR))
}

/// Content-Type, Content-Disposition and the validators of a finished upload. `attachment`
/// forces `Content-Disposition: attachment` (the download page's button asks for it with
/// `?download=1`); otherwise every type but the passive ones ([`is_active`]).
pub(super) fn representation_headers(h: &mut HeaderMap, rec: &UploadRecord, attachment: bool) {
    // The same description `GET /api/v1/files/{id}` and MCP handles show.
    let crate::upload::Description { name, media_type: media } = crate::upload::describe_raw(&rec.metadata);
    let disposition = if attachment || is_active(&media) { "attachment" } else { "inline" };
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

/// `GET /files/{id}`. Errors: 404/410; 409 `upload_incomplete` with `Upload-Offset` while the
/// upload is unfinished; 416 with `Content-Range: bytes */N` for an unsatisfiable range.
/// `?download=1` asks for `Content-Disposition: attachment` whatever the media type.
pub async fn get(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    Path(id): Path<String>,
    uri: axum::http::Uri,
    h: HeaderMap,
) -> Result<Response, Problem> {
    let attachment = uri.query().is_some_and(|q| q.split('&').any(|pair| pair == "download=1"));
    ferry_tus::check_version(Verb::Get, super::tus::header(&h, "tus-resumable"))?;
    // An upload whose bytes are all stored but that is not finished is finished first; while
    // it cannot be, 503 + Retry-After (what download clients retry on), not 409.
    let rec = match s.engine.get_finished_or_finish(&p, &id).await {
        Ok(rec) => rec,
        Err(mut e) if e.code == ErrorCode::Locked => {
            e.status = 503;
            e.code = ErrorCode::Unavailable;
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    let (Some(sha), Some(len)) = (rec.sha256.filter(|_| rec.is_finished()), rec.length) else {
        let mut res = Problem(s.engine.not_complete_now(&rec).await).into_response();
        super::tus::upload_headers(res.headers_mut(), &rec);
        return Ok(res);
    };
    let tag = etag(&sha);
    let mut headers = HeaderMap::new();
    super::tus::upload_headers(&mut headers, &rec);
    representation_headers(&mut headers, &rec, attachment);
    let last_modified = headers.get("last-modified").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
    let outcome = ferry_tus::select_range(get("if-none-match"), get("range"), get("if-range"), len, &tag, &last_modified);
    let status = StatusCode::from_u16(outcome.status()).expect("a valid status");
    let range = outcome.bytes(len);
    match outcome {
        RangeOutcome::NotModified => {
            let mut res = StatusCode::NOT_MODIFIED.into_response();
            res.headers_mut().extend(headers);
            return Ok(res);
        }
        RangeOutcome::Unsatisfiable => {
            let mut res = Problem(Refusal::new(
                416,
                ErrorCode::InvalidArgument,
                format!("the range is outside the file's {len} bytes"),
                if len == 0 { "The file is empty: request it without a Range header.".to_string() } else { format!("Request a range within bytes 0-{}.", len - 1) },
            ))
            .into_response();
            if let Some(cr) = outcome.content_range(len) {
                res.headers_mut().insert("content-range", HeaderValue::from_str(&cr).expect("ascii"));
            }
            return Ok(res);
        }
        RangeOutcome::Whole | RangeOutcome::Partial { .. } => {
            if let Some(cr) = outcome.content_range(len) {
                headers.insert("content-range", HeaderValue::from_str(&cr).expect("ascii"));
            }
        }
    }
    let stream = s.engine.read(&rec, range.clone()).await?;
    // `ferry_bytes_sent_total`: counted as the server hands each chunk to the connection.
    let sent = s.metrics.bytes_sent.clone();
    let stream = futures::TryStreamExt::inspect_ok(stream, move |chunk| {
        sent.inc_by(chunk.len() as u64);
    });
    headers.insert("content-length", HeaderValue::from(range.end - range.start));
    tus_headers(&mut headers);
    let mut res = (status, Body::from_stream(stream)).into_response();
    res.headers_mut().extend(headers);
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disposition_is_safe() {
        assert_eq!(content_disposition("inline", None), "inline");
        assert_eq!(content_disposition("inline", Some("..")), "inline");
        assert_eq!(content_disposition("attachment", Some("../evil\"name.html")), "attachment; filename=\"evil_name.html\"; filename*=UTF-8''evil%22name.html");
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
    fn active_types() {
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
            assert!(is_active(&t.parse().unwrap()), "{t}");
        }
        for t in ["multipart/x-mixed-replace; boundary=x", "message/rfc822", "text/css", "image/svg", "application/x-shockwave-flash", "text/vtt", "font/woff2"] {
            assert!(is_active(&t.parse().unwrap()), "{t}: not known to be passive");
        }
        for t in ["image/png", "image/jpeg", "text/plain; charset=utf-8", "text/csv", "application/pdf", "application/json", "video/mp4", "audio/mpeg"] {
            assert!(!is_active(&t.parse().unwrap()), "{t}");
        }
    }
}
