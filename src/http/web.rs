//! The pages for people (issue 16): the dashboard at `/` (a principal's files and tasks through
//! the JSON API, with a token pasted into the tab), a signed link's page at `/share/{id}?scope=…&expires=…&sig=…`
//! — a request-a-file page for an `upload` link, a download page for a `download` link — and
//! its assets under `/assets/`.
//!
//! The HTML, JS and CSS are built from `web/src` by `web/build.mjs` (esbuild, Uppy) into
//! `web/dist` and embedded here at build time: no node at run time, no CDN. The HTML carries
//! no data; the script asks `GET /share/{id}/info` with the link's own query and fills the
//! page with `textContent`. Every response here has a strict Content-Security-Policy (no
//! inline script, `connect-src 'self'`) and refuses to be framed. `--no-web` leaves these
//! routes out.

use std::sync::OnceLock;

use crate::error::{ErrorCode, Refusal};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::Digest;

use super::Problem;
use crate::app::views::file_view;
use crate::app::AppState;
use crate::signing::{SignatureError, SignedQuery, PAGE_PATH};

/// Path prefix of the embedded assets.
pub const ASSETS_PATH: &str = "/assets/";

/// `Content-Security-Policy` of every page response: scripts and styles only from this
/// server's own files, requests only to this server, no plugins, no framing, no forms.
/// Workers (`worker-src`, falling back to `script-src`) come only from this server too: the
/// request-a-file page's hashing worker is `/assets/hash.js`.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                       connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `Content-Security-Policy` of `/assets/hash.js` (a dedicated worker runs under the policy of
/// its own script's response): [`CSP`] plus `'wasm-unsafe-eval'`, which lets that worker compile
/// its inline WebAssembly sha256 (hash-wasm) and allows no JavaScript `eval`. Only the worker
/// gets it; the pages themselves cannot compile WebAssembly.
pub const WORKER_CSP: &str = "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self'; img-src \
                              'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One embedded file, with its gzip form and ETag computed on first use.
struct Asset {
    bytes: &'static [u8],
    content_type: &'static str,
    /// The `Content-Security-Policy` its response carries.
    csp: &'static str,
    gzip: OnceLock<Vec<u8>>,
    etag: OnceLock<String>,
}

impl Asset {
    const fn new(bytes: &'static [u8], content_type: &'static str) -> Asset {
        Asset::with_csp(bytes, content_type, CSP)
    }

    const fn with_csp(bytes: &'static [u8], content_type: &'static str, csp: &'static str) -> Asset {
        Asset { bytes, content_type, csp, gzip: OnceLock::new(), etag: OnceLock::new() }
    }

    fn gzip(&self) -> &[u8] {
        self.gzip.get_or_init(|| {
            use std::io::Write;
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            enc.write_all(self.bytes).expect("gzip into memory");
            enc.finish().expect("gzip into memory")
        })
    }

    fn etag(&self) -> &str {
        self.etag.get_or_init(|| format!("\"{}\"", hex::encode(&sha2::Sha256::digest(self.bytes)[..12])))
    }
}

static PAGE: Asset = Asset::new(include_bytes!("../../web/dist/page.html"), "text/html; charset=utf-8");
static DASH: Asset = Asset::new(include_bytes!("../../web/dist/dash.html"), "text/html; charset=utf-8");
static APP_JS: Asset = Asset::new(include_bytes!("../../web/dist/app.js"), "text/javascript; charset=utf-8");
static HASH_JS: Asset = Asset::with_csp(include_bytes!("../../web/dist/hash.js"), "text/javascript; charset=utf-8", WORKER_CSP);
static LINK_PAGE: Asset = Asset::new(include_bytes!("../../web/dist/link.html"), "text/html; charset=utf-8");
static LINK_JS: Asset = Asset::new(include_bytes!("../../web/dist/link.js"), "text/javascript; charset=utf-8");
static APP_CSS: Asset = Asset::new(include_bytes!("../../web/dist/app.css"), "text/css; charset=utf-8");

/// Bytes of the page's first load (HTML + JS + CSS, and the hashing worker a request-a-file
/// page starts when a file is chosen): `(identity, gzip)`.
pub fn page_weight() -> (usize, usize) {
    [&PAGE, &APP_JS, &APP_CSS, &HASH_JS].iter().fold((0, 0), |(raw, gz), a| (raw + a.bytes.len(), gz + a.gzip().len()))
}

/// The routes, merged into the app by [`super::app`] unless `--no-web`.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(|h: HeaderMap| async move { serve(&DASH, &h, "no-cache") }))
        .route("/share/{id}", get(page))
        .route("/share/{id}/info", get(info))
        .route("/assets/app.js", get(|h: HeaderMap| async move { serve(&APP_JS, &h, "no-cache") }))
        .route("/assets/link.js", get(|h: HeaderMap| async move { serve(&LINK_JS, &h, "no-cache") }))
        .route("/assets/hash.js", get(|h: HeaderMap| async move { serve(&HASH_JS, &h, "no-cache") }))
        .route("/assets/app.css", get(|h: HeaderMap| async move { serve(&APP_CSS, &h, "no-cache") }))
        // Every browser asks for it on every page. ferry has no icon: 204 (no content, cached
        // for a day) keeps the pages' consoles free of a 404 per visit.
        .route("/favicon.ico", get(|| async { (axum::http::StatusCode::NO_CONTENT, [(axum::http::header::CACHE_CONTROL, "public, max-age=86400")]) }))
}

/// The page of a catalog link (`/l/{id}`, issue 51): the same bytes for every link, never
/// cached; `super::links` sets its status.
pub(super) fn link_page(h: &HeaderMap) -> Response {
    serve(&LINK_PAGE, h, "no-store")
}

/// Paths that need neither a token nor a signature of their own: the pages (static, no data;
/// the dashboard at `/` calls the API with the token the person pastes), their assets, and the
/// info endpoint (which checks the link's signature itself).
pub(super) fn is_open(path: &str) -> bool {
    path == "/" || path.starts_with(PAGE_PATH) || path.starts_with(ASSETS_PATH)
}

/// The headers every page response carries, `csp` its Content-Security-Policy.
fn protect(h: &mut HeaderMap, csp: &'static str) {
    h.insert("content-security-policy", HeaderValue::from_static(csp));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    // The page's URL is a capability: never send it to anyone as a Referer.
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("cross-origin-opener-policy", HeaderValue::from_static("same-origin"));
}

fn accepts_gzip(h: &HeaderMap) -> bool {
    h.get_all("accept-encoding").iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|c| {
        let mut parts = c.split(';');
        let coding = parts.next().unwrap_or("").trim();
        let refused = parts.any(|p| p.trim().strip_prefix("q=").is_some_and(|q| q.trim().parse::<f32>().is_ok_and(|q| q == 0.0)));
        coding.eq_ignore_ascii_case("gzip") && !refused
    })
}

/// An embedded asset: gzip when the client takes it, `304` on a matching `If-None-Match`.
fn serve(asset: &Asset, h: &HeaderMap, cache: &'static str) -> Response {
    let etag = asset.etag();
    let matched = h.get("if-none-match").and_then(|v| v.to_str().ok()).is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut res = if matched {
        StatusCode::NOT_MODIFIED.into_response()
    } else if accepts_gzip(h) {
        let mut r = asset.gzip().to_vec().into_response();
        r.headers_mut().insert("content-encoding", HeaderValue::from_static("gzip"));
        r
    } else {
        asset.bytes.into_response()
    };
    let rh = res.headers_mut();
    rh.insert("content-type", HeaderValue::from_static(asset.content_type));
    rh.insert("cache-control", HeaderValue::from_static(cache));
    rh.insert("vary", HeaderValue::from_static("accept-encoding"));
    if let Ok(v) = HeaderValue::from_str(etag) {
        rh.insert("etag", v);
    }
    protect(rh, asset.csp);
    res
}

/// `GET /share/{id}`: the page. The same bytes for every link (the script reads the link from
/// its own URL), never cached: the URL carries a signature. A link that cannot work gets the
/// page (which explains why) under the status its info request gets — 403 altered, 410
/// expired, 404 no such file — so a crawler, a link checker or `curl -f` sees it too.
async fn page(State(s): State<AppState>, Path(id): Path<String>, uri: Uri, h: HeaderMap) -> Response {
    let mut res = serve(&PAGE, &h, "no-store");
    let q = SignedQuery::from_query(uri.query()).unwrap_or_default();
    let now = crate::upload::now_ms().div_euclid(1000);
    let status = match s.links.signer().verify_link(&q, &id, now) {
        Err(e) => Some(link_refused(e).0.status),
        // A catalog that cannot answer leaves the page to say so (its info request retries).
        Ok(_) => matches!(s.engine.owner(&id).await, Ok(None)).then_some(404),
    };
    if let Some(code) = status.and_then(|c| StatusCode::from_u16(c).ok()) {
        *res.status_mut() = code;
    }
    res
}

/// Why a link's page cannot be used: 403 for an altered or incomplete link, 410 for an expired
/// one (both code `unauthorized`; an expired *upload* is 410 `upload_expired`).
fn link_refused(e: SignatureError) -> Problem {
    let status = if matches!(e, SignatureError::Expired(_)) { 410 } else { 403 };
    Problem(Refusal::new(status, ErrorCode::Unauthorized, e.to_string(), "Ask the person who sent the link for a new one."))
}

/// `GET /share/{id}/info?scope=…&expires=…&sig=…` → `{"scope", "expires_at_ms", "file"}`,
/// `file` being the API's file view. Errors: 403/410 `unauthorized` (link altered/expired),
/// 404 `not_found`, 410 `upload_expired`.
async fn info(State(s): State<AppState>, Path(id): Path<String>, uri: Uri) -> Result<Response, Problem> {
    let q = SignedQuery::from_query(uri.query()).unwrap_or_default();
    let now = crate::upload::now_ms().div_euclid(1000);
    let (scope, expires) = s.links.signer().verify_link(&q, &id, now).map_err(link_refused)?;
    let owner = s.engine.owner(&id).await?.ok_or_else(Refusal::not_found)?;
    let rec = s.engine.get(&owner, &id).await?;
    let body = serde_json::json!({ "scope": scope, "expires_at_ms": expires.saturating_mul(1000), "file": file_view(&rec) });
    let mut res = axum::Json(body).into_response();
    res.headers_mut().insert("cache-control", HeaderValue::from_static("no-store"));
    protect(res.headers_mut(), CSP);
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_taken_only_when_offered() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert("accept-encoding", HeaderValue::from_str(v).unwrap());
            m
        };
        assert!(accepts_gzip(&h("gzip, deflate, br")));
        assert!(accepts_gzip(&h("br;q=1.0, GZIP;q=0.5")));
        assert!(!accepts_gzip(&h("gzip;q=0")));
        assert!(!accepts_gzip(&h("br")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn the_page_has_no_inline_script_and_weighs_little() {
        for (name, asset, script) in [("page.html", &PAGE, "app.js"), ("dash.html", &DASH, "app.js"), ("link.html", &LINK_PAGE, "link.js")] {
            let html = std::str::from_utf8(asset.bytes).unwrap();
            // No inline script (a `<script>` element with a body, an `on…=` handler attribute) or style.
            let handler = html.match_indices(" on").any(|(i, _)| {
                html[i + 3..].chars().take_while(|c| c.is_ascii_alphabetic()).count() > 0
                    && html[i + 3..].trim_start_matches(|c: char| c.is_ascii_alphabetic()).starts_with('=')
            });
            assert!(!html.contains("<script>") && !handler && !html.contains("style="), "inline script or style in {name}");
            assert!(html.contains(&format!(r#"<script src="/assets/{script}""#)), "{name}");
        }
        // The worker's policy is the pages' plus WebAssembly compilation, nothing else.
        assert_eq!(WORKER_CSP, CSP.replace("script-src 'self';", "script-src 'self' 'wasm-unsafe-eval';"));
        assert!(!CSP.contains("wasm"));
        let (_, gz) = page_weight();
        assert!(gz <= 300 * 1024, "first load is {gz} bytes gzipped; the goal is ≤ 300 KiB");
    }
}
