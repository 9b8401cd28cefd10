//! Several finished files as one zip, streamed as it is read: [`serve_zip`] (which the share
//! pages' "Download all" calls too) and `GET /api/v1/zip?files=ID,ID,…&name=…` ([`zip_files`]).
//!
//! The archive's layout is [`crate::zip_layout`]'s: members stored, so its length, ETag and
//! every header are known from the files' names, sizes, finishing times and sha256s before a
//! byte is read. A `Range` (and `If-Range`, `If-None-Match`…) is decided as for one file
//! ([`super::download::select`]) and served from the member it falls in, without reading the
//! members before it.
//!
//! **CRC-32s.** Only a member's data descriptor and the central directory need its CRC-32. It is
//! taken from the catalog when kept ([`crate::upload::UploadEngine::kept_crc32`]); otherwise it is
//! computed while the member streams and kept for every later request, on any replica. A
//! request that needs a CRC-32 not kept and not streamed whole reads what it lacks first: a
//! range starting inside member k reads k's bytes before the range (combined with what it
//! streams) before k's descriptor, and the central directory reads each member whose value is
//! still missing. So the first download of a share from byte 0 reads every member once, as a
//! plain download would; a resumed one reads at most the members it skips, once, ever.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use sha2::Digest;

use super::download::{content_disposition, select, Selected};
use super::{AppState, Problem};
use crate::app::Principal;
use crate::blob::ByteStream;
use crate::catalog::UploadRecord;
use crate::error::{ErrorCode, Refusal};
use crate::zip_layout::{Member, Part, Piece, ZipLayout};

/// Most files one zip holds (`GET /api/v1/zip` answers 400 beyond it).
pub const MAX_ZIP_FILES: usize = 1000;

/// What `files` of `GET /api/v1/zip` is, as the OpenAPI document states it: 1 to
/// [`MAX_ZIP_FILES`] ids separated by commas (the server also trims spaces around each).
pub const FILES_PATTERN: &str = "^[^,\\s]+(,[^,\\s]+){0,999}$";

/// The name a zip gets when the request names none.
pub const DEFAULT_ZIP_NAME: &str = "files.zip";

/// Answer a `GET` of `files` (finished uploads, in this order) as one zip named `zip_name`
/// (`.zip` is added when it lacks it): `200` with the whole archive or `206` with the one range
/// asked, `304`, `412` or `416` as for one file; `Content-Length`, a strong `ETag` (the sha256
/// of the members' names, sizes, times and sha256s: the same files under the same names are
/// the same bytes), `Last-Modified` (the latest finishing time), `Accept-Ranges: bytes`,
/// `Content-Disposition: attachment` (RFC 6266). Errors before the first byte: 409
/// `upload_incomplete` for a file that is not finished, 500 `damaged` for one marked damaged,
/// the catalog's 503; a read that fails later ends the body early (the client sees a short
/// body and resumes with `Range`; the log says why).
pub async fn serve_zip(s: &AppState, files: Vec<UploadRecord>, zip_name: &str, h: &HeaderMap) -> Result<Response, Problem> {
    let wanted: Vec<(Option<String>, String)> = files.iter().map(|r| (crate::upload::describe_raw(&r.metadata).name, r.id.clone())).collect();
    let mut members = Vec::with_capacity(files.len());
    let mut crcs = Vec::with_capacity(files.len());
    let mut tag = sha2::Sha256::new();
    tag.update(b"ferry zip 1\n");
    for (rec, name) in files.iter().zip(crate::names::unique_member_names(&wanted)) {
        let (Some(sha), Some(size), Some(modified_ms)) = (rec.sha256, rec.length, rec.finished_at_ms) else {
            let mut e = s.engine.not_complete_now(rec).await;
            e.detail = format!("file {}: {}", rec.id, e.detail);
            return Err(e.into());
        };
        if let Some(d) = s.engine.damage(rec).await? {
            return Err(Refusal::damaged(&d.kind).into());
        }
        let mtime = (modified_ms / 1000).max(0) as u64;
        for field in [&(name.len() as u64).to_le_bytes()[..], name.as_bytes(), &size.to_le_bytes(), &mtime.to_le_bytes(), &sha] {
            tag.update(field);
        }
        crcs.push(match s.engine.kept_crc32(rec).await? {
            Some(v) => Crc::Known(v),
            None => Crc::Unknown,
        });
        members.push(Member { name, size, mtime });
    }
    let layout = Arc::new(ZipLayout::new(members));
    let etag = format!("\"zip-{}\"", hex::encode(tag.finalize()));
    let last_modified = files.iter().filter_map(|r| r.finished_at_ms).max().unwrap_or(0);
    let name = if zip_name.to_ascii_lowercase().ends_with(".zip") { zip_name.to_string() } else { format!("{zip_name}.zip") };
    let mut headers = HeaderMap::new();
    let pairs = [
        ("content-type", "application/zip".to_string()),
        ("content-disposition", content_disposition("attachment", Some(&name))),
        ("etag", etag.clone()),
        ("last-modified", super::tus::http_date(last_modified)),
        ("accept-ranges", "bytes".to_string()),
        ("x-content-type-options", "nosniff".to_string()),
    ];
    for (k, v) in pairs {
        if let Ok(v) = HeaderValue::from_str(&v) {
            headers.insert(k, v);
        }
    }
    let (status, range) = match select(h, layout.len(), &etag, &mut headers) {
        Selected::Send { status, range } => (status, range),
        Selected::Done(res) => return Ok(res),
    };
    let zip = Arc::new(Zip { s: s.clone(), files, layout, crcs: Mutex::new(crcs) });
    let pieces = zip.layout.pieces(range);
    let body = futures::stream::iter(pieces).then(move |piece| zip.clone().piece(piece)).flatten();
    // Nothing after the first failure: the body ends there.
    let body = body.scan(false, |failed, item| {
        let next = (!*failed).then(|| {
            *failed = item.is_err();
            item
        });
        futures::future::ready(next)
    });
    let sent = s.metrics.bytes_sent.clone();
    let body = body.inspect_ok(move |chunk| {
        sent.inc_by(chunk.len() as u64);
    });
    let body = body.inspect_err(|e| tracing::warn!(error = %e, "a zip download stopped: reading a member's bytes failed"));
    let mut res = (status, Body::from_stream(body)).into_response();
    res.headers_mut().extend(headers);
    Ok(res)
}

/// What one response knows of a member's CRC-32.
#[derive(Clone)]
enum Crc {
    Known(u32),
    /// Nothing yet.
    Unknown,
    /// Its bytes `[start, upto)` went through `hasher` in this response.
    Streamed {
        start: u64,
        upto: u64,
        hasher: crc32fast::Hasher,
    },
}

/// One response's zip: what rendering its pieces needs.
struct Zip {
    s: AppState,
    files: Vec<UploadRecord>,
    layout: Arc<ZipLayout>,
    crcs: Mutex<Vec<Crc>>,
}

impl Zip {
    /// The bytes of `piece`: rendered headers, a member's bytes, or a failure.
    async fn piece(self: Arc<Self>, piece: Piece) -> ByteStream {
        let w = piece.within.clone();
        let slice = |bytes: Vec<u8>| -> ByteStream {
            let b = Bytes::from(bytes).slice(w.start as usize..w.end as usize);
            futures::stream::once(futures::future::ready(Ok(b))).boxed()
        };
        let failed = |e: std::io::Error| -> ByteStream { futures::stream::once(futures::future::ready(Err(e))).boxed() };
        match piece.part {
            Part::Header(i) => slice(self.layout.header(i)),
            Part::Data(i) => match self.data(i, piece.within).await {
                Ok(stream) => stream,
                Err(e) => failed(e),
            },
            Part::Descriptor(i) => match self.crc32(i).await {
                Ok(crc) => slice(self.layout.descriptor(i, crc)),
                Err(e) => failed(e),
            },
            Part::Tail => {
                let mut all = Vec::with_capacity(self.files.len());
                for i in 0..self.files.len() {
                    match self.crc32(i).await {
                        Ok(crc) => all.push(crc),
                        Err(e) => return failed(e),
                    }
                }
                slice(self.layout.tail(&all))
            }
        }
    }

    /// Bytes `within` of member `i`, hashed on the way when its CRC-32 is not known yet.
    async fn data(self: &Arc<Self>, i: usize, within: Range<u64>) -> std::io::Result<ByteStream> {
        let stream = self.s.engine.read(&self.files[i], within.clone()).await.map_err(std::io::Error::other)?;
        let hashing = {
            let mut crcs = self.crcs.lock().expect("not poisoned");
            if matches!(crcs[i], Crc::Known(_)) {
                false
            } else {
                crcs[i] = Crc::Streamed { start: within.start, upto: within.start, hasher: crc32fast::Hasher::new() };
                true
            }
        };
        if !hashing {
            return Ok(stream);
        }
        let zip = self.clone();
        Ok(stream
            .inspect_ok(move |chunk| {
                if let Crc::Streamed { upto, hasher, .. } = &mut zip.crcs.lock().expect("not poisoned")[i] {
                    hasher.update(chunk);
                    *upto += chunk.len() as u64;
                }
            })
            .boxed())
    }

    /// Member `i`'s CRC-32: known, finished from what streamed (reading the bytes before the
    /// streamed part), or read whole; a value computed here is kept.
    async fn crc32(&self, i: usize) -> std::io::Result<u32> {
        let size = self.files[i].length.unwrap_or(0);
        let (start, streamed) = match self.crcs.lock().expect("not poisoned")[i].clone() {
            Crc::Known(v) => return Ok(v),
            Crc::Streamed { start, upto, hasher } if upto == size => (start, hasher),
            _ => (size, crc32fast::Hasher::new()),
        };
        let rec = &self.files[i];
        let mut whole = self.s.engine.crc32_of(rec, 0..start).await?;
        whole.combine(&streamed);
        let v = whole.finalize();
        self.crcs.lock().expect("not poisoned")[i] = Crc::Known(v);
        self.s.engine.keep_crc32(rec, v).await;
        Ok(v)
    }
}

/// Query of `GET /api/v1/zip`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ZipQuery {
    files: String,
    name: Option<String>,
}

/// The caller's finished files as one zip (stored members, ZIP64 past 4 GiB, the same bytes
/// every time): ranged and resumable like a single file's download.
#[utoipa::path(get, path = "/api/v1/zip", tag = "files", operation_id = "zip_files",
    params(
        ("files" = String, Query, description = "Ids of the caller's finished files, separated by commas, 1 to 1000; \
            the zip holds them in this order."),
        ("name" = Option<String>, Query, description = "The zip's file name (`Content-Disposition`); \
            `.zip` is added when missing. Default `files.zip`."),
        ("Range" = Option<String>, Header, description = "One byte range (`bytes=N-`, `bytes=N-M`, `bytes=-N`), as for a single file's download."),
        ("If-Range" = Option<String>, Header, description = "The ETag of an earlier answer: the range is served only if the zip is \
            still that one, else the whole zip (200)."),
    ),
    responses(
        (status = 200, description = "The whole zip.", content_type = "application/zip", body = Vec<u8>),
        (status = 206, description = "The range asked (`Content-Range`).", content_type = "application/zip", body = Vec<u8>),
        (status = 304, description = "Not modified (`If-None-Match` names this zip's ETag)."),
    ))]
pub(super) async fn zip_files(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    q: Result<Query<ZipQuery>, QueryRejection>,
    h: HeaderMap,
) -> Result<Response, Problem> {
    let Ok(Query(q)) = q else {
        return Err(Refusal::bad_request(
            "the query must be files=ID,ID,… and optionally name=NAME, nothing else",
            "Send ?files= with the ids of your finished files, separated by commas.",
        )
        .into());
    };
    let ids: Vec<&str> = q.files.split(',').map(str::trim).collect();
    if ids.iter().any(|id| id.is_empty()) || ids.len() > MAX_ZIP_FILES {
        return Err(Refusal::bad_request(
            format!(
                "files must name 1 to {MAX_ZIP_FILES} ids separated by single commas; it names {}",
                ids.iter().filter(|id| !id.is_empty()).count()
            ),
            format!("Send ?files=ID,ID,… with 1 to {MAX_ZIP_FILES} ids (several zips for more)."),
        )
        .into());
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(twice) = ids.iter().find(|id| !seen.insert(**id)) {
        return Err(Refusal::new(422, ErrorCode::InvalidArgument, format!("file {twice} is named twice"), "Name each file once.").into());
    }
    let mut files = Vec::with_capacity(ids.len());
    let mut unknown = Vec::new();
    for id in &ids {
        match s.engine.get_finished_or_finish(&p, id).await {
            Ok(rec) => files.push(rec),
            Err(e) if e.code == ErrorCode::NotFound => unknown.push(*id),
            Err(mut e) => {
                if e.code == ErrorCode::Locked {
                    // Being finished by someone else right now: what download clients retry on.
                    (e.status, e.code) = (503, ErrorCode::Unavailable);
                }
                e.detail = format!("file {id}: {}", e.detail);
                return Err(e.into());
            }
        }
    }
    if !unknown.is_empty() {
        let shown = unknown.iter().take(10).copied().collect::<Vec<_>>().join(", ");
        let more = if unknown.len() > 10 { format!(" and {} more", unknown.len() - 10) } else { String::new() };
        return Err(Refusal::new(
            404,
            ErrorCode::NotFound,
            format!("no file of yours with id {shown}{more}"),
            "List your files with GET /api/v1/files and send their ids.",
        )
        .into());
    }
    let name = q.name.as_deref().map(str::trim).filter(|n| !n.is_empty()).unwrap_or(DEFAULT_ZIP_NAME);
    serve_zip(&s, files, name, &h).await
}
