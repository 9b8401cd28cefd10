//! Links as catalog records (issue 51): the REST operations under `/api/v1/links` (create,
//! list, get, revoke) and the routes a person's page uses under `/l/{id}`:
//!
//! | route | what |
//! | --- | --- |
//! | `GET /l/{id}` | the page (the same HTML for every link; its script asks `info`) |
//! | `GET /l/{id}/info` | what the page shows: state, message, files (a share's), limits |
//! | `POST /l/{id}/unlock` | `{"passphrase"}` → 204 and an open grant (cookie, [`OPEN_GRANT_SECS`]) |
//! | `GET`/`HEAD /l/{id}/files/{file}` | a share's file, with Range; a GET from byte 0 counts ([`crate::app::links`]) |
//! | `POST /l/{id}/files` | TUS creation of one file of a request, owned by the link's principal |
//! | `HEAD`/`PATCH /l/{id}/files/{file}` | TUS resume of a request's file |
//! | `GET /l/{id}/zip` | all of a share's files as one zip (501 until the zip is wired in) |
//!
//! Every `/l/` route checks the link itself (revoked, expired, passphrase grant): revoking
//! stops downloads and uploads through it at their next request.

use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::Deserialize;
use utoipa::ToSchema;

use super::{AppState, Problem};
use crate::app::links::{self as links, LinkState, NewLink, DOWNLOAD_GRANT_SECS};
use crate::app::views::file_view;
use crate::app::Principal;
use crate::catalog::{LinkKind, LinkRecord};
use crate::error::{ErrorCode, Refusal};

pub use crate::app::links::OPEN_GRANT_SECS;

/// The REST routes, nested under `/api/v1`.
pub(super) fn api_routes() -> Router<AppState> {
    Router::new()
        .route("/links", post(create_link).get(list_links))
        .route("/links/{id}", get(get_link))
        .route("/links/{id}/revoke", post(revoke_link_post))
}

/// The routes of the pages, merged at the root with the other pages.
pub(super) fn page_routes() -> Router<AppState> {
    Router::new()
        .route("/l/{id}", get(page))
        .route("/l/{id}/info", get(info))
        .route("/l/{id}/unlock", post(unlock))
        .route("/l/{id}/files", post(create_file))
        .route("/l/{id}/files/{file}", get(download).head(head).patch(patch))
        .route("/l/{id}/zip", get(zip))
}

fn now_ms() -> i64 {
    crate::upload::now_ms()
}

/// Body of `POST /api/v1/links`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = LinkBody)]
pub(super) struct LinkBody {
    /// `share` (people download `files`) or `request` (people upload files into it).
    #[schema(value_type = String, example = "share")]
    kind: LinkKind,
    /// A share's file ids, in the order its page lists them (1 to 200); absent for a request.
    #[serde(default)]
    files: Vec<String>,
    /// Shown first on the page (who asks, what for): at most 1 000 characters.
    message: Option<String>,
    /// The page asks for it before showing anything; stored as an argon2id hash, never returned.
    passphrase: Option<String>,
    /// A share's download limit (1 = a one-time link); absent: no limit.
    #[serde(default, deserialize_with = "super::api::opt_whole")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 4294967295_u64)]
    max_downloads: Option<u64>,
    /// A request's most files, 1 to 200 (default 20).
    #[serde(default, deserialize_with = "super::api::opt_whole")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 200)]
    max_files: Option<u64>,
    /// Lifetime in ms, 1 to 7776000000 (90 days); default 604800000 (7 days).
    #[serde(default, deserialize_with = "super::api::opt_whole")]
    ttl_ms: Option<u64>,
}

/// `n` as a u32, or 400 naming `field` (the schema's bound).
fn whole_u32(n: u64, field: &str) -> Result<u32, Problem> {
    u32::try_from(n).map_err(|_| {
        Problem(Refusal::bad_request(
            format!("{field} must be at most {}", u32::MAX),
            format!("Send a smaller {field}, or leave it out for no limit."),
        ))
    })
}

/// A link as the API shows it (never its passphrase).
#[derive(ToSchema)]
#[allow(dead_code)]
pub(super) struct LinkView {
    id: String,
    #[schema(example = "share")]
    kind: String,
    /// The page to send to people: `{public_url}/l/{id}`.
    url: String,
    /// `open`, `revoked`, `expired`, `used_up` (a share's downloads all taken) or `full` (a
    /// request's files all arrived).
    #[schema(example = "open")]
    state: String,
    /// File ids in order: a share's; a request's as they arrive.
    files: Vec<String>,
    message: String,
    /// Whether the page asks for a passphrase.
    passphrase: bool,
    max_downloads: Option<u32>,
    /// Downloads counted so far.
    downloads: u32,
    max_files: u32,
    /// Unix ms.
    expires_at_ms: i64,
    /// RFC 3339.
    expires_at: String,
    revoked_at_ms: Option<i64>,
    created_at_ms: i64,
}

/// A page of links, newest first.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(super) struct LinkList {
    links: Vec<LinkView>,
}

/// Make a link: a share of several files, or a request for several files (issue 51).
#[utoipa::path(post, path = "/api/v1/links", tag = "links", operation_id = "create_link",
    request_body(content = LinkBody, description = "What the link is for, and its limits."),
    responses((status = 201, description = "The link.", body = LinkView)))]
pub(super) async fn create_link(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let body = super::api::body_bytes(body)?;
    let b: LinkBody = super::api::checked_body(&body, "LinkBody")?;
    let req = NewLink {
        kind: Some(b.kind),
        files: b.files,
        message: b.message,
        passphrase: b.passphrase,
        max_downloads: b.max_downloads.map(|n| whole_u32(n, "max_downloads")).transpose()?,
        // Beyond u32 is beyond the 200 files a request may take: refused as out of range there.
        max_files: b.max_files.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        ttl_ms: b.ttl_ms,
    };
    let now = now_ms();
    let l = links::create(&s, &p, req, now).await?;
    Ok((StatusCode::CREATED, axum::Json(links::view(&s, &l, now))).into_response())
}

/// The caller's links, newest first.
#[utoipa::path(get, path = "/api/v1/links", tag = "links", operation_id = "list_links",
    params(("limit" = Option<u32>, Query, minimum = 1, description = "At most this many (default 100).")),
    responses((status = 200, description = "The links.", body = LinkList)))]
pub(super) async fn list_links(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    q: Result<Query<super::api::ListQuery>, QueryRejection>,
) -> Result<Response, Problem> {
    let all = s.engine.catalog.list_links(&p, super::api::limit(q)?).await.map_err(Refusal::from)?;
    let now = now_ms();
    let views: Vec<_> = all.iter().map(|l| links::view(&s, l, now)).collect();
    Ok(axum::Json(serde_json::json!({ "links": views })).into_response())
}

/// One of the caller's links.
#[utoipa::path(get, path = "/api/v1/links/{id}", tag = "links", operation_id = "get_link",
    params(("id" = String, Path, description = "Link id.")),
    responses((status = 200, description = "The link.", body = LinkView)))]
pub(super) async fn get_link(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    let l = links::get_own(&s, &p, &id).await?;
    Ok(axum::Json(links::view(&s, &l, now_ms())).into_response())
}

async fn revoke(s: &AppState, p: &str, id: &str) -> Result<Response, Problem> {
    links::get_own(s, p, id).await?;
    let now = now_ms();
    s.engine.catalog.revoke_link(p, id, now).await.map_err(Refusal::from)?;
    tracing::info!(link = %id, "link revoked");
    let l = links::get_own(s, p, id).await?;
    Ok(axum::Json(links::view(s, &l, now)).into_response())
}

/// Revoke one of the caller's links, at once: its page, downloads and uploads stop working at
/// their next request. Revoking again changes nothing; the link is kept (its page says it was
/// revoked, `GET` shows it with `state: revoked`).
#[utoipa::path(post, path = "/api/v1/links/{id}/revoke", tag = "links", operation_id = "revoke_link_post",
    params(("id" = String, Path, description = "Link id.")),
    responses((status = 200, description = "The revoked link.", body = LinkView)))]
pub(super) async fn revoke_link_post(
    State(s): State<AppState>,
    Extension(Principal(p)): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    revoke(&s, &p, &id).await
}

/// The value of cookie `name` in the request, if it has one.
fn cookie<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// Whether the request holds a grant of `what` for link `l`.
fn granted(s: &AppState, h: &HeaderMap, what: &str, l: &LinkRecord) -> bool {
    cookie(h, &links::cookie_name(what, &l.id)).is_some_and(|t| s.links.signer().verify_grant(t, what, &l.id, now_ms().div_euclid(1000)))
}

/// `Set-Cookie` of a grant: only for this link's routes, never sent by another site's page.
fn grant_cookie(what: &str, id: &str, token: &str, secs: i64) -> HeaderValue {
    let v = format!("{}={token}; Path=/l/{id}; Max-Age={secs}; HttpOnly; SameSite=Strict", links::cookie_name(what, id));
    HeaderValue::from_str(&v).expect("a grant cookie is ASCII")
}

fn locked() -> Refusal {
    Refusal::new(
        401,
        ErrorCode::Unauthorized,
        "this link is protected by a passphrase",
        "Open the link's page and type the passphrase you were given.",
    )
}

/// Whether link `l` in `state` still works for this request: an open link; a full request
/// for the files already in it (`full_is_ok`); a used-up share for the visitor whose download
/// was counted (its download grant).
fn works(s: &AppState, l: &LinkRecord, state: LinkState, h: &HeaderMap, full_is_ok: bool) -> bool {
    match state {
        LinkState::Open => true,
        LinkState::Full => full_is_ok,
        LinkState::UsedUp => granted(s, h, "download", l),
        LinkState::Revoked | LinkState::Expired => false,
    }
}

/// The link, usable now by this request ([`works`]), and unlocked when it has a passphrase.
/// `full_is_ok`: a request's files already created may still be resumed when it is full.
async fn usable(s: &AppState, id: &str, h: &HeaderMap, full_is_ok: bool) -> Result<LinkRecord, Problem> {
    let l = links::get(s, id).await?;
    if !works(s, &l, links::state(&l, now_ms()), h, full_is_ok) {
        return Err(Problem(links::refusal(&l, now_ms()).unwrap_or_else(Refusal::not_found)));
    }
    if l.passphrase_hash.is_some() && !granted(s, h, "open", &l) {
        return Err(Problem(locked()));
    }
    Ok(l)
}

fn no_store(mut res: Response) -> Response {
    res.headers_mut().insert("cache-control", HeaderValue::from_static("no-store"));
    res.headers_mut().insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    res
}

/// `GET /l/{id}`: the page, under the status its link has (404 unknown, 410 revoked, expired
/// or used up) so a link checker sees it too.
async fn page(State(s): State<AppState>, Path(id): Path<String>, h: HeaderMap) -> Response {
    let mut res = super::web::link_page(&h);
    let status = match links::get(&s, &id).await {
        Ok(l) if works(&s, &l, links::state(&l, now_ms()), &h, true) => None,
        Ok(l) => links::refusal(&l, now_ms()).map(|r| r.status),
        Err(e) => Some(e.status).filter(|st| *st == 404),
    };
    if let Some(code) = status.and_then(|c| StatusCode::from_u16(c).ok()) {
        *res.status_mut() = code;
    }
    res
}

/// `GET /l/{id}/info` → what the page shows. A locked link (a passphrase, no grant) shows
/// only that it is locked; a link that cannot be used shows its state and why.
async fn info(State(s): State<AppState>, Path(id): Path<String>, h: HeaderMap) -> Result<Response, Problem> {
    let l = links::get(&s, &id).await?;
    let now = now_ms();
    let state = links::state(&l, now);
    let mut body = serde_json::json!({
        "id": l.id, "kind": l.kind, "state": state, "expires_at_ms": l.expires_at_ms,
        "passphrase": l.passphrase_hash.is_some(),
    });
    if let Some(r) = links::refusal(&l, now) {
        body["why"] = r.detail.clone().into();
        if let crate::error::Next::Say(words) = &r.next {
            body["next"] = words.to_string().into();
        }
    }
    let open = l.passphrase_hash.is_none() || granted(&s, &h, "open", &l);
    body["locked"] = (!open).into();
    let download_grant = granted(&s, &h, "download", &l);
    body["download_grant"] = download_grant.into();
    if open && works(&s, &l, state, &h, true) {
        body["message"] = l.message.clone().into();
        body["max_downloads"] = l.max_downloads.into();
        body["downloads"] = l.downloads.into();
        body["max_files"] = l.max_files.into();
        body["files_left"] = l.max_files.saturating_sub(l.files.len() as u32).into();
        if l.kind == LinkKind::Share {
            let mut files = Vec::new();
            for f in &l.files {
                // A file deleted or expired since the link was made is listed as gone.
                match s.engine.get(&l.principal, f).await {
                    Ok(rec) => files.push(serde_json::to_value(file_view(&rec)).unwrap_or_default()),
                    Err(_) => files.push(serde_json::json!({ "id": f, "gone": true })),
                }
            }
            body["files"] = files.into();
        }
    }
    Ok(no_store(axum::Json(body).into_response()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UnlockBody {
    passphrase: String,
}

/// `POST /l/{id}/unlock` `{"passphrase"}` → 204 with the open grant's cookie. Errors: 403 a
/// wrong passphrase, 429 + `Retry-After` after a few wrong ones (per link and per address),
/// 410 a link that cannot be used, 404.
async fn unlock(
    State(s): State<AppState>,
    Path(id): Path<String>,
    peer: Option<Extension<ConnectInfo<std::net::SocketAddr>>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Problem> {
    let l = links::get(&s, &id).await?;
    let now = now_ms();
    if let Some(r) = links::refusal(&l, now).filter(|_| links::state(&l, now) != LinkState::Full) {
        return Err(Problem(r));
    }
    let body = super::api::body_bytes(body)?;
    let b: UnlockBody = serde_json::from_slice(&body)
        .map_err(|_| Problem(Refusal::bad_request("the body must be {\"passphrase\": \"…\"}", "Send the passphrase as a JSON string.")))?;
    let token = links::unlock(&s, &l, b.passphrase, peer.map(|Extension(ConnectInfo(a))| a.ip()), now).await?;
    let mut res = StatusCode::NO_CONTENT.into_response();
    res.headers_mut().insert("set-cookie", grant_cookie("open", &l.id, &token, OPEN_GRANT_SECS));
    Ok(no_store(res))
}

/// The file `file` of link `l`, or 404 (a file the link does not list is not told about).
fn listed(l: &LinkRecord, file: &str) -> Result<(), Problem> {
    if l.files.iter().any(|f| f == file) {
        Ok(())
    } else {
        Err(Problem(Refusal::not_found()))
    }
}

/// `GET /l/{id}/files/{file}`: a share's file (Range, `?download=1` for an attachment). A GET
/// without a download grant counts one download and gives the grant (see
/// [`crate::app::links`]); a link whose downloads are all taken answers 410.
async fn download(State(s): State<AppState>, Path((id, file)): Path<(String, String)>, uri: Uri, h: HeaderMap) -> Result<Response, Problem> {
    let l = usable(&s, &id, &h, false).await?;
    share_only(&l)?;
    listed(&l, &file)?;
    // A file still arriving gets the download's own answer (409) and costs no download; one
    // whose bytes are all in (finished, or about to be) counts.
    let rec = s.engine.get(&l.principal, &file).await?;
    let whole = rec.is_finished() || rec.length == Some(rec.offset);
    let grant = count_download(&s, &h, &l, whole).await?;
    let res = super::download::get(State(s.clone()), Extension(Principal(l.principal.clone())), Path(file), uri, h).await?;
    Ok(with_grant(res, &l, grant))
}

/// Count one download of share `l` when `counts` and the visitor has no download grant yet,
/// and return the grant to hand out. Counted before the first byte (one compare-and-set:
/// replicas never hand out more than the limit); an answer that fails after keeps it counted.
/// Errors: 410 (or 404) with what to do next when the link's downloads are all taken.
async fn count_download(s: &AppState, h: &HeaderMap, l: &LinkRecord, counts: bool) -> Result<Option<String>, Problem> {
    if !counts || granted(s, h, "download", l) {
        return Ok(None);
    }
    if !s.engine.catalog.take_download(&l.id, now_ms()).await.map_err(Refusal::from)? {
        let fresh = links::get(s, &l.id).await?;
        return Err(Problem(links::refusal(&fresh, now_ms()).unwrap_or_else(Refusal::not_found)));
    }
    Ok(Some(s.links.signer().grant("download", &l.id, now_ms().div_euclid(1000) + DOWNLOAD_GRANT_SECS)))
}

/// `res` with the download grant's cookie (if one was handed out), never stored by a cache.
fn with_grant(mut res: Response, l: &LinkRecord, grant: Option<String>) -> Response {
    if let Some(token) = grant {
        res.headers_mut().append("set-cookie", grant_cookie("download", &l.id, &token, DOWNLOAD_GRANT_SECS));
    }
    no_store(res)
}

fn share_only(l: &LinkRecord) -> Result<(), Problem> {
    if l.kind == LinkKind::Share {
        Ok(())
    } else {
        Err(Problem(Refusal::new(
            405,
            ErrorCode::InvalidArgument,
            "this is a request link: files are uploaded into it, not downloaded from it",
            "Upload with TUS: POST /l/{id}/files, then PATCH the Location.",
        )))
    }
}

fn request_only(l: &LinkRecord) -> Result<(), Problem> {
    if l.kind == LinkKind::Request {
        Ok(())
    } else {
        Err(Problem(Refusal::new(
            405,
            ErrorCode::InvalidArgument,
            "this is a share link: its files are downloaded, nothing is uploaded into it",
            "GET /l/{id}/files/{file} downloads a file of it.",
        )))
    }
}

/// `HEAD /l/{id}/files/{file}`: a share's file (never counts), or a request's upload offset
/// (TUS HEAD, with `Tus-Resumable`).
async fn head(State(s): State<AppState>, Path((id, file)): Path<(String, String)>, uri: Uri, h: HeaderMap) -> Result<Response, Problem> {
    let l = usable(&s, &id, &h, true).await?;
    listed(&l, &file)?;
    let res = super::tus::head(State(s.clone()), Extension(Principal(l.principal.clone())), None, Path(file), uri, h).await?;
    Ok(no_store(res))
}

/// `PATCH /l/{id}/files/{file}`: TUS append to a request's file.
async fn patch(State(s): State<AppState>, Path((id, file)): Path<(String, String)>, h: HeaderMap, body: Body) -> Result<Response, Problem> {
    let l = usable(&s, &id, &h, true).await?;
    request_only(&l)?;
    listed(&l, &file)?;
    super::tus::patch(State(s.clone()), Extension(Principal(l.principal.clone())), Path(file), h, body).await
}

/// The metadata key naming the link a file arrived through (events carry it with the
/// upload's metadata: `upload.created`'s `metadata`).
pub const LINK_METADATA_KEY: &str = "ferry-link";

/// `Upload-Metadata` as sent, without any `ferry-link` pair, with this link's.
fn with_link_metadata(sent: Option<&str>, link: &str) -> String {
    use base64::Engine as _;
    let mut pairs: Vec<&str> =
        sent.unwrap_or("").split(',').map(str::trim).filter(|p| !p.is_empty() && p.split(' ').next() != Some(LINK_METADATA_KEY)).collect();
    let ours = format!("{LINK_METADATA_KEY} {}", base64::engine::general_purpose::STANDARD.encode(link));
    pairs.push(&ours);
    pairs.join(",")
}

/// `POST /l/{id}/files`: TUS creation of one file of a request link, owned by the link's
/// principal and recorded on the link; `Location` is `/l/{id}/files/{file}`. Errors: 410 when
/// the link took all its files (or is revoked or expired), 401 locked, 405 a share, and every
/// refusal of `POST /files/` (size, quota, metadata).
async fn create_file(State(s): State<AppState>, Path(id): Path<String>, uri: Uri, mut h: HeaderMap, body: Body) -> Result<Response, Problem> {
    let l = usable(&s, &id, &h, false).await?;
    request_only(&l)?;
    if h.contains_key("upload-concat") {
        return Err(Problem(Refusal::bad_request(
            "a request link takes whole files, not concatenation parts",
            "Send each file as one upload (tus-js-client: parallelUploads 1).",
        )));
    }
    let Some(slot) = s.engine.catalog.take_file_slot(&l.id, now_ms()).await.map_err(Refusal::from)? else {
        let fresh = links::get(&s, &id).await?;
        let mut r = links::refusal(&fresh, now_ms()).unwrap_or_else(|| {
            Refusal::new(410, ErrorCode::Unauthorized, "this request took all the files it asked for", "Ask the person who sent it for a new link.")
        });
        if links::state(&fresh, now_ms()) == LinkState::Open {
            r.detail = format!("this request took the {} files it asked for", fresh.max_files);
        }
        return Err(Problem(r));
    };
    let md = with_link_metadata(super::tus::header(&h, "upload-metadata"), &l.id);
    h.insert(
        "upload-metadata",
        HeaderValue::from_str(&md)
            .map_err(|_| Problem(Refusal::bad_request("Upload-Metadata is not visible ASCII", "Encode each value in base64.")))?,
    );
    let mut res = super::tus::create(State(s.clone()), Extension(Principal(l.principal.clone())), None, None, uri, h, body).await?;
    let created = res
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .and_then(|loc| loc.split('?').next())
        .and_then(|p| p.trim_end_matches('/').rsplit('/').next())
        .map(str::to_owned);
    if let Some(file) = created {
        s.engine.catalog.record_link_file(&l.id, slot, &file).await.map_err(Refusal::from)?;
        tracing::info!(link = %l.id, file = %file, "a file was created through a request link");
        if let Ok(v) = HeaderValue::from_str(&format!("/l/{}/files/{file}", l.id)) {
            res.headers_mut().insert("location", v);
        }
    }
    Ok(res)
}

/// `GET /l/{id}/zip`: every file of a share as one zip ([`super::zip::serve_zip`]: stored,
/// Range-resumable, the same bytes every time), named after the link. It counts as one download,
/// as a file's GET does, and gives the same grant (so its Range resumes, and the files one by
/// one, count no more).
async fn zip(State(s): State<AppState>, Path(id): Path<String>, h: HeaderMap) -> Result<Response, Problem> {
    let l = usable(&s, &id, &h, false).await?;
    share_only(&l)?;
    let mut files = Vec::with_capacity(l.files.len());
    for f in &l.files {
        files.push(s.engine.get(&l.principal, f).await?);
    }
    // A share with a file still arriving gets the zip's own answer (409) and costs no download.
    let grant = count_download(&s, &h, &l, files.iter().all(|r| r.is_finished())).await?;
    let res = super::zip::serve_zip(&s, files, &format!("ferry-{}", l.id), &h).await?;
    Ok(with_grant(res, &l, grant))
}

/// Whether `path` (any method) is a link's route: these check the link themselves and act as
/// its principal, with no token.
pub(super) fn is_link_route(path: &str) -> bool {
    path.starts_with(crate::signing::LINK_PATH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_metadata_pair_replaces_one_sent() {
        assert_eq!(with_link_metadata(None, "abc"), "ferry-link YWJj");
        assert_eq!(with_link_metadata(Some("filename eC50eHQ=,ferry-link ZXZpbA=="), "abc"), "filename eC50eHQ=,ferry-link YWJj");
    }

    #[test]
    fn cookies_are_read_by_name() {
        let mut h = HeaderMap::new();
        h.insert("cookie", HeaderValue::from_static("a=1; ferry_open_x=tok; b=2"));
        assert_eq!(cookie(&h, "ferry_open_x"), Some("tok"));
        assert_eq!(cookie(&h, "ferry_open_y"), None);
    }
}
