//! The HTTP edge (axum): TUS on `/files/`, downloads, health and metrics.
//!
//! Handlers parse headers into `ferry_tus` plans, call the upload engine, and render what it
//! returns. One error type, [`Problem`], decides what a client sees of a failure: an RFC 9457
//! `application/problem+json` body with ferry's stable `code`; details go to the logs.

use crate::error::{ErrorCode, Refusal};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use ferry_tus::TUS_VERSION;
use tower::ServiceExt;
use tower_http::cors::{AllowOrigin, CorsLayer};

pub(crate) mod api;
pub(crate) mod api_answers;
pub mod auth;
mod body;
mod download;
mod events;
mod health;
pub(crate) mod hints;
mod links;
mod rufh;
mod task_partials;
pub(crate) mod tus;
pub mod web;
pub(crate) mod wire;
pub(crate) mod zip;

pub use crate::app::views::FILES_PATH;
use crate::app::Origins;
pub use crate::app::{AppState, HttpConfig};

/// Headers a browser may send to the TUS endpoints (CORS preflight allow list): everything the
/// TUS 1.0 and IETF resumable-upload clients send (tus-js-client — also `X-Request-ID` with
/// `addRequestId` and `X-HTTP-Method-Override` with `overridePatchMethod` —, Uppy, the draft's
/// `Upload-Complete`/`Upload-Incomplete`/`Upload-Draft-Interop-Version`), tusd's default list as
/// the reference, plus what ferry itself reads. Operators add more with `[cors] allow_headers`.
pub const ALLOW_HEADERS: &[&str] = &[
    "authorization",
    "content-type",
    "content-length",
    "content-digest",
    "forwarded",
    "idempotency-key",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    // draft-ietf-httpbis-incremental: asks intermediaries to forward the body as it comes
    // (the resumable-upload draft recommends it from -12, interop 9).
    "incremental",
    "range",
    "repr-digest",
    "tus-resumable",
    "upload-checksum",
    "upload-complete",
    "upload-concat",
    "upload-defer-length",
    "upload-draft-interop-version",
    "upload-incomplete",
    "upload-length",
    "upload-metadata",
    "upload-offset",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-http-method-override",
    "x-request-id",
    "x-requested-with",
];

/// Response headers a browser script may read (CORS expose list); `[cors] expose_headers` adds more.
pub const EXPOSE_HEADERS: &[&str] = &[
    "accept-ranges",
    "content-disposition",
    "content-length",
    "content-range",
    "etag",
    "location",
    "repr-digest",
    "tus-checksum-algorithm",
    "tus-extension",
    "tus-max-size",
    "tus-resumable",
    "tus-version",
    "accept-patch",
    "upload-complete",
    "upload-concat",
    "upload-defer-length",
    "upload-draft-interop-version",
    "upload-draft-interop-versions",
    "upload-expires",
    "upload-incomplete",
    "upload-length",
    "upload-limit",
    "upload-metadata",
    "upload-offset",
];

fn cors(cfg: &crate::app::CorsConfig) -> CorsLayer {
    let names = |builtin: &[&'static str], extra: &[String]| {
        let mut all: Vec<HeaderName> = builtin.iter().map(|h| HeaderName::from_static(h)).collect();
        all.extend(extra.iter().filter_map(|h| HeaderName::from_bytes(h.as_bytes()).ok()));
        all.dedup();
        all
    };
    let origins = match &cfg.allow_origins {
        Origins::Default | Origins::Any => AllowOrigin::any(),
        // A page on this server's own host is allowed by the origin guard; mirror it here too.
        Origins::Only(_) => AllowOrigin::mirror_request(),
    };
    CorsLayer::new()
        .allow_origin(origins)
        .allow_methods([Method::GET, Method::HEAD, Method::POST, Method::PATCH, Method::DELETE, Method::OPTIONS])
        .allow_headers(names(ALLOW_HEADERS, &cfg.allow_headers))
        .expose_headers(names(EXPOSE_HEADERS, &cfg.expose_headers))
        .max_age(std::time::Duration::from_secs(86_400))
}

/// Whether a request to `/files/` carrying `Origin: origin` may proceed: this server's own
/// origin (`Host`, `--public-url`) always; another one as `[cors] allow_origins` says — by
/// default any origin when the server has `tokens`, none when it has not.
fn tus_origin_allowed(cfg: &crate::app::CorsConfig, own: &[String], origin: &str, host: &str, tokens: bool) -> bool {
    same_origin(own, origin, host) || cfg.allow_origins.admits(origin, tokens)
}

/// The `Origin` is this server's own: it names the host this request was sent to, or it is
/// one of `own` (`--public-url`'s origin — behind a proxy that rewrites `Host`, e.g. nginx's
/// `$host`, which drops the port, the pages still come from the public URL).
fn same_origin(own: &[String], origin: &str, host: &str) -> bool {
    origin.split_once("://").map(|(_, authority)| authority.eq_ignore_ascii_case(host)).unwrap_or(false)
        || crate::app::origin_of(origin).is_some_and(|o| own.contains(&o))
}

/// `DELETE /mcp` (a client closing its session) answers `204 No Content` where rmcp answers
/// `202 Accepted`: the session is gone when the answer comes, and clients accept 200 or 204
/// only (the Python SDK logs "Session termination failed: 202" on every close).
async fn mcp_session_closed(req: Request, next: Next) -> Response {
    let closing = req.method() == Method::DELETE && req.uri().path() == "/mcp";
    let mut res = next.run(req).await;
    if closing && res.status() == StatusCode::ACCEPTED {
        *res.status_mut() = StatusCode::NO_CONTENT;
        *res.body_mut() = axum::body::Body::empty();
        res.headers_mut().remove(axum::http::header::CONTENT_TYPE);
        res.headers_mut().remove(axum::http::header::CONTENT_LENGTH);
    }
    res
}

/// The whole router, without binding a port. `mcp` is the MCP service nested at `/mcp`
/// (built by `serve.rs` from the same state; this layer does not know MCP).
pub fn app<M>(state: AppState, mcp: M) -> Router
where
    M: tower::Service<Request, Error = std::convert::Infallible> + Clone + Send + Sync + 'static,
    M::Response: IntoResponse,
    M::Future: Send + 'static,
{
    let files = Router::new()
        .route("/files", post(tus::create).options(tus::options))
        .route("/files/", post(tus::create).options(tus::options))
        .route("/files/{id}", get(download::get).head(tus::head).patch(tus::patch).delete(tus::terminate).options(tus::options))
        .route_layer(middleware::from_fn(tus::single_valued_headers));
    let pages = if state.http.web { web::routes().merge(links::page_routes()) } else { Router::new() };
    let routes: Router = Router::new()
        .merge(files)
        .merge(pages)
        .nest_service("/mcp", mcp)
        .nest("/api/v1", api::routes().layer(DefaultBodyLimit::max(api::MAX_JSON_BODY)))
        .merge(health::routes())
        .fallback(|| async {
            Problem(Refusal::new(
                404,
                ErrorCode::NotFound,
                "no such route",
                "Uploads live under /files/, the task and file API under /api/v1/ (see /api/v1/openapi.json).",
            ))
        })
        .method_not_allowed_fallback(|| async {
            Problem(Refusal::new(
                405,
                ErrorCode::InvalidArgument,
                "this method is not allowed on this route",
                "See /api/v1/openapi.json for the API, or send OPTIONS to /files/ for TUS.",
            ))
        })
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn(worded_rejections))
        .layer(middleware::from_fn_with_state(state.clone(), auth::authenticate))
        .layer(middleware::from_fn_with_state(state.clone(), note_route))
        .layer(middleware::from_fn(mcp_session_closed))
        .layer(middleware::from_fn_with_state(state.clone(), guard_origin))
        .with_state(state.clone());
    // CORS is for the TUS endpoints only (browser uploaders such as Uppy on another origin);
    // the API and MCP are not readable from other origins. tower-http answers every OPTIONS
    // as a CORS preflight; a plain OPTIONS (no Access-Control-Request-Method) is TUS
    // discovery and must reach the handler.
    let with_cors = routes.clone().layer(cors(&state.http.cors));
    let cors_cfg = state.http.cors.clone();
    let own_origins = state.http.own_origins.clone();
    let tokens = state.tokens.clone();
    let edge = tower::service_fn(move |req: Request| {
        let tus = req.uri().path().starts_with("/files");
        let preflight = req.method() != Method::OPTIONS || req.headers().contains_key("access-control-request-method");
        if tus {
            // An origin the operator did not allow is refused outright (as tusd does), the
            // preflight included, so neither a browser nor a script gets anything from it.
            let origin = req.headers().get("origin").and_then(|v| v.to_str().ok());
            let host = req.headers().get("host").and_then(|v| v.to_str().ok()).unwrap_or("");
            let has_tokens = !tokens.is_empty();
            if let Some(origin) = origin.filter(|o| !tus_origin_allowed(&cors_cfg, &own_origins, o, host, has_tokens)) {
                let detail = if has_tokens || cors_cfg.allow_origins != Origins::Default {
                    format!("uploads from web pages on {origin} are not allowed")
                } else {
                    format!(
                        "uploads from web pages on {origin} are not allowed: this server has no tokens, so it takes \
                         browser uploads only from its own pages and the origins listed in [cors] allow_origins"
                    )
                };
                let refused = Problem(Refusal::new(403, ErrorCode::Unauthorized, detail, hints::foreign_origin(origin))).into_response();
                return futures::future::Either::Left(std::future::ready(Ok(refused)));
            }
        }
        let svc = if preflight && tus { with_cors.clone() } else { routes.clone() };
        futures::future::Either::Right(svc.oneshot(req))
    });
    Router::new()
        .fallback_service(edge)
        .layer(middleware::from_fn(one_host))
        .layer(middleware::from_fn_with_state(state, count_status))
        // Outermost: `X-HTTP-Method-Override` is honoured before routing, auth and CORS.
        .layer(middleware::from_fn(method_override))
}

/// Most bytes of an axum rejection's text read to word it as a problem.
const REJECTION_TEXT: usize = 4096;

/// axum's own refusals — an extractor's rejection, such as a path segment that is not UTF-8
/// (`/files/%FF`: "Invalid URL: …") — are `text/plain` without ferry's `code`. Every refusal
/// explains itself the same way: such an answer (status 400 or more, `text/plain;
/// charset=utf-8`, outside `/mcp`, whose JSON-RPC errors are MCP's) becomes problem+json with
/// axum's text as its `detail`. ferry's own handlers never refuse in plain text.
async fn worded_rejections(req: Request, next: Next) -> Response {
    let mcp = req.uri().path() == "/mcp" || req.uri().path().starts_with("/mcp/");
    let res = next.run(req).await;
    let plain = res.headers().get(axum::http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"text/plain; charset=utf-8"));
    if mcp || !plain || res.status().as_u16() < 400 {
        return res;
    }
    let status = res.status().as_u16();
    let text = match axum::body::to_bytes(res.into_body(), REJECTION_TEXT).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
        Err(_) => String::new(),
    };
    let code = match status {
        404 => ErrorCode::NotFound,
        413 => ErrorCode::SizeExceeded,
        s if s >= 500 => ErrorCode::Internal,
        _ => ErrorCode::InvalidArgument,
    };
    let detail = if text.is_empty() { format!("the request was refused ({status})") } else { format!("the request was refused: {text}") };
    Problem(Refusal::new(
        status,
        code,
        detail,
        "Fix the request as the detail says: ids and path segments are plain ASCII, and the API's requests are described in /api/v1/openapi.json.",
    ))
    .into_response()
}

/// RFC 9112 §3.2: an HTTP/1.1 request without a `Host` header, or with more than one, is
/// answered 400 before anything else reads it, so the checks on `Host` ([`guard_origin`])
/// never meet a missing or ambiguous one.
async fn one_host(req: Request, next: Next) -> Response {
    let hosts = req.headers().get_all("host").iter().count();
    if hosts > 1 || (hosts == 0 && req.version() == axum::http::Version::HTTP_11) {
        let what = if hosts == 0 { "no Host header".to_string() } else { format!("{hosts} Host headers") };
        return Problem(Refusal::bad_request(
            format!("the request carries {what}; HTTP/1.1 requires exactly one (RFC 9112 §3.2)"),
            "Send exactly one Host header naming this server.",
        ))
        .into_response();
    }
    next.run(req).await
}

/// Browser protections outside the TUS endpoints:
/// - a request to `/api/` or `/mcp` carrying an `Origin` other than this server's own is
///   refused (403): a web page must not drive the API, not even with requests a browser sends
///   without a CORS preflight (`Content-Type: text/plain` POSTs);
/// - with no tokens configured (everything is the principal `local`), the `Host` must be one
///   this server is known as (loopback names, `--public-url`'s host): DNS rebinding cannot
///   turn a web page into a same-origin client. Not applied `--behind-proxy`.
async fn guard_origin(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let host = req.headers().get("host").and_then(|v| v.to_str().ok()).unwrap_or("");
    let host_name = host_without_port(host);
    if s.tokens.is_empty()
        && !s.http.behind_proxy
        && !s.http.allowed_hosts.is_empty()
        && !host.is_empty()
        && !s.http.allowed_hosts.iter().any(|h| h.eq_ignore_ascii_case(host_name))
    {
        return Problem(Refusal::new(
            403,
            ErrorCode::Unauthorized,
            format!("Host {host:?} is not a name of this server"),
            "Connect to 127.0.0.1 or localhost, or start ferry with --public-url naming this host.",
        ))
        .into_response();
    }
    let path = req.uri().path();
    // A link's POST and PATCH (its passphrase, its uploads) come from its own page only.
    let link_write = links::is_link_route(path) && !matches!(*req.method(), Method::GET | Method::HEAD);
    if path.starts_with("/api/") || path == "/mcp" || path.starts_with("/mcp/") || link_write {
        if let Some(origin) = req.headers().get("origin").and_then(|v| v.to_str().ok()) {
            if !same_origin(&s.http.own_origins, origin, host) {
                return Problem(Refusal::new(
                    403,
                    ErrorCode::Unauthorized,
                    format!("cross-origin requests from {origin} are refused on {path}"),
                    "Call the API from a server-side client (curl, the ferry CLI, an MCP \
                     client), not from a web page; browsers may upload with TUS on /files/.",
                ))
                .into_response();
            }
        }
    }
    next.run(req).await
}

/// `example.com` of `example.com:8080`, `::1` of `[::1]:8080`.
fn host_without_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map(|(h, _)| h).unwrap_or(host)
}

/// The methods `X-HTTP-Method-Override` may name: those the TUS routes serve (PATCH and
/// DELETE for clients that cannot send them, TUS 1.0 §X-HTTP-Method-Override; HEAD and GET,
/// which `/files/{id}` serves too; POST, the creation).
const OVERRIDABLE: [Method; 5] = [Method::PATCH, Method::DELETE, Method::HEAD, Method::GET, Method::POST];

/// `X-HTTP-Method-Override` (TUS 1.0 §X-HTTP-Method-Override): on the TUS endpoints
/// (`/files`, `/files/…`; the IETF draft's uploads share them) its value replaces the method
/// before routing, auth and CORS. Elsewhere (`/api/v1/…`, `/mcp`, pages, health) it has no
/// meaning and is refused (400 `invalid_argument`) rather than ignored: a client relying on it
/// there would act with another method than it believes. A value that is not one of
/// [`OVERRIDABLE`] is refused the same way.
async fn method_override(mut req: Request, next: Next) -> Response {
    let Some(value) = req.headers().get("x-http-method-override") else { return next.run(req).await };
    let path = req.uri().path();
    if path != "/files" && !path.starts_with("/files/") {
        return Problem(Refusal::bad_request(
            format!("X-HTTP-Method-Override is honoured only on the TUS endpoints (/files/…), not on {path}"),
            "Send the request with its real method and without X-HTTP-Method-Override.",
        ))
        .into_response();
    }
    let named = value.to_str().ok().and_then(|m| Method::from_bytes(m.trim().to_ascii_uppercase().as_bytes()).ok());
    match named.filter(|m| OVERRIDABLE.contains(m)) {
        Some(m) => {
            *req.method_mut() = m;
            next.run(req).await
        }
        None => Problem(Refusal::bad_request(
            "X-HTTP-Method-Override must name PATCH, DELETE, HEAD, GET or POST",
            "Send X-HTTP-Method-Override: PATCH (or DELETE) with a POST to the upload's URL.",
        ))
        .into_response(),
    }
}

/// Inside the router, where the match is known: put the matched route template on the
/// response for [`count_status`] (`unmatched` when no route matched: the fallbacks).
/// On an `/api/v1` operation, a refusal is held against the answers its document lists
/// ([`api_answers::observe`]).
async fn note_route(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let route = match req.extensions().get::<axum::extract::MatchedPath>() {
        // A nested service (`/mcp`) reports its own tail parameter; the prefix is the route.
        Some(m) => m.as_str().split("/{*").next().unwrap_or("/").to_string(),
        None => "unmatched".to_string(),
    };
    let operation = api::operation_of(req.method(), &route);
    let mut res = next.run(req).await;
    if let (Some(op), Some(AnsweredCode(code))) = (operation, res.extensions().get::<AnsweredCode>()) {
        api_answers::observe(&s.metrics, op, res.status().as_u16(), *code);
    }
    res.extensions_mut().insert(crate::metrics::MatchedRoute(route));
    res
}

/// The label for a request method: the methods ferry serves, else `OTHER` (bounded cardinality).
fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::PUT => "PUT",
        _ => "OTHER",
    }
}

/// Outermost layer: responses by status, the duration of every request by method, route
/// template and status, measured until its response body ends (a download's last byte, or the
/// client going away), and the reason phrase of statuses hyper has none for.
async fn count_status(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let method = method_label(req.method());
    let mut res = next.run(req).await;
    let status = res.status().as_u16();
    state.metrics.requests.get_or_create(&crate::metrics::StatusLabel { status }).inc();
    if let Some(reason) = reason_phrase(status) {
        res.extensions_mut().insert(hyper::ext::ReasonPhrase::from_static(reason));
    }
    let route = res.extensions().get::<crate::metrics::MatchedRoute>().map_or_else(|| "unmatched".to_string(), |r| r.0.clone());
    let timer = RequestTimer { metrics: state.metrics.clone(), labels: Some(crate::metrics::RouteLabels { method, route, status }), started };
    let (parts, body) = res.into_parts();
    let body = http_body_util::BodyExt::map_frame(body, move |frame| {
        let _ = &timer;
        frame
    });
    Response::from_parts(parts, axum::body::Body::new(body))
}

/// Records a request's duration when its response body is dropped (sent, or abandoned).
struct RequestTimer {
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    labels: Option<crate::metrics::RouteLabels>,
    started: std::time::Instant,
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        if let Some(labels) = self.labels.take() {
            self.metrics.request_duration.get_or_create(&labels).observe(self.started.elapsed().as_secs_f64());
        }
    }
}

/// The HTTP/1 reason phrase of a status hyper knows no phrase for (it would write `460 <none>`):
/// TUS's `460 Checksum Mismatch`, as tusd writes it. hyper writes a `ReasonPhrase` found in the
/// response's extensions in place of the canonical one.
fn reason_phrase(status: u16) -> Option<&'static [u8]> {
    match status {
        460 => Some(b"Checksum Mismatch"),
        _ => None,
    }
}

/// Headers every TUS response carries.
pub(crate) fn tus_headers(h: &mut HeaderMap) {
    h.insert("tus-resumable", HeaderValue::from_static(TUS_VERSION));
}

/// A refused request, rendered as RFC 9457 problem+json.
#[derive(Debug)]
pub struct Problem(pub Refusal);

impl From<Refusal> for Problem {
    fn from(e: Refusal) -> Self {
        Problem(e)
    }
}

/// A refusal the protocol crate decided, in its own words.
impl From<ferry_tus::TusError> for Problem {
    fn from(e: ferry_tus::TusError) -> Self {
        Problem(e.into())
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        render_problem(self.0, None)
    }
}

/// Renders a refusal as RFC 9457 problem+json: ferry's `code`, `retryable`, `recovery_hint`
/// and `partial.cursor`, plus the offset in `Upload-Offset` and `Retry-After` where they apply.
///
/// `draft` is `None` for TUS 1.0 (TUS headers, `type` `urn:ferry:error:<code>`), and for a
/// client of the IETF resumable-upload draft `Some(the Upload-Limit its version speaks)`: the
/// draft's problem type (`type`, `title` and members such as `expected-offset`) when the
/// refusal has one, no TUS headers, `Upload-Limit` on 413 (draft §Limits), and 400 for TUS's
/// own 460 checksum status.
/// A problem's `title` (RFC 9457 §3.1.4): the status's reason phrase (RFC 9110 §15), or TUS
/// 1.0 §Checksum's name for its own 460.
fn status_title(status: StatusCode) -> &'static str {
    match status.as_u16() {
        460 => "Checksum Mismatch",
        _ => status.canonical_reason().unwrap_or("Error"),
    }
}

/// The code of the problem a response carries, as a response extension (for
/// [`api_answers::observe`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AnsweredCode(pub ErrorCode);

pub(crate) fn render_problem(e: Refusal, draft: Option<Option<ferry_tus::UploadLimit>>) -> Response {
    let code = e.code;
    let (status, headers, body) = problem_parts(e, draft);
    let mut res = (status, body).into_response();
    res.extensions_mut().insert(AnsweredCode(code));
    for (name, value) in headers.iter() {
        res.headers_mut().insert(name, value.clone());
    }
    res
}

/// What [`render_problem`] answers, in parts: the status, the headers (`Content-Type` and the
/// others it sets; not `Content-Length`) and the JSON body. [`wire`] writes these itself for the
/// refusals hyper makes before any handler runs.
pub(crate) fn problem_parts(e: Refusal, draft: Option<Option<ferry_tus::UploadLimit>>) -> (StatusCode, HeaderMap, String) {
    let status = match (e.status, &draft) {
        (460, Some(_)) => StatusCode::BAD_REQUEST,
        (s, _) => StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
    };
    let draft_type = draft.as_ref().and(e.draft);
    let mut body = serde_json::json!({
        "type": draft_type.map_or_else(|| format!("urn:ferry:error:{}", e.code), |d| d.type_uri().to_string()),
        "title": draft_type.map_or_else(|| status_title(status), |d| d.title()),
        "status": status.as_u16(),
        "detail": e.detail,
        "code": e.code.as_str(),
        "retryable": e.code.retryable(),
        "recovery_hint": hints::hint(&e),
    });
    if let Some(c) = e.cursor {
        body["partial"] = serde_json::json!({ "cursor": c });
    }
    if let Some(q) = &e.quota {
        body["quota"] = serde_json::json!({ "name": q.name, "limit": q.limit, "used": q.used, "requested": q.requested });
    }
    for (name, value) in draft_type.map(|d| d.members()).unwrap_or_default() {
        body[name] = serde_json::json!(value);
    }
    let mut headers = HeaderMap::new();
    let h = &mut headers;
    h.insert("content-type", HeaderValue::from_static("application/problem+json"));
    match &draft {
        None => {
            tus_headers(h);
            if e.status == 412 {
                h.insert("tus-version", HeaderValue::from_static(TUS_VERSION));
            }
        }
        Some(limit) => {
            if let (413, Some(l)) = (e.status, limit) {
                if let Ok(v) = HeaderValue::from_str(&l.to_string()) {
                    h.insert("upload-limit", v);
                }
            }
        }
    }
    // The offset to resume from, where the spec's clients look for it.
    if let (Some(c), 409 | 423 | 460 | 503 | 507) = (e.cursor, e.status) {
        h.insert("upload-offset", HeaderValue::from(c));
    }
    // DESIGN §9: space and transient catalog trouble come back by themselves. Every 423 and
    // 503 says when to come back, whatever its code (a shutdown is `locked` with 503): the
    // refusal's own wait, else its code's, else this fallback.
    let fallback = match e.status {
        423 => Some(1),
        503 => Some(2),
        _ => None,
    };
    if let Some(secs) = e.retry_after_secs().or(fallback) {
        h.insert("retry-after", HeaderValue::from(secs));
    }
    (status, headers, body.to_string())
}
