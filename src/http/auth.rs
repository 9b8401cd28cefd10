//! Authentication of HTTP requests (DESIGN §6): a bearer token ([`crate::app::Tokens`]) or a
//! signed URL names the principal a request acts as; with no tokens every request is `local`.

use crate::error::{ErrorCode, Refusal};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Problem;
use crate::app::principal::{TokenRefusal, TokenScope};
use crate::app::{AppState, Principal, UploadOnly, LOCAL_PRINCIPAL};
use crate::signing::SignedQuery;

fn unauthorized(detail: &str) -> Response {
    let mut res =
        Problem(Refusal::new(401, ErrorCode::Unauthorized, detail, "Send `Authorization: Bearer <token>`; `ferry token create NAME` makes one."))
            .into_response();
    res.headers_mut().insert("www-authenticate", HeaderValue::from_static("Bearer"));
    res
}

/// Resolve the request's principal, or answer 401. Health, metrics, the OpenAPI document and
/// TUS discovery (`OPTIONS`) need no token.
pub async fn authenticate(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    // The pages for people and their assets: static, or checking the link's signature
    // themselves (`GET /share/{id}/info`); they never act as a principal.
    if super::web::is_open(req.uri().path()) && matches!(*req.method(), Method::GET | Method::HEAD) {
        return next.run(req).await;
    }
    // A link's routes (issue 51) check the link (revocation, expiry, its passphrase grant)
    // themselves and act as its principal.
    if super::links::is_link_route(req.uri().path()) {
        return next.run(req).await;
    }
    if req.method() != Method::OPTIONS {
        if let Some(q) = SignedQuery::from_query(req.uri().query()) {
            let (method, path) = (req.method().clone(), req.uri().path().to_owned());
            return match signed_principal(&s, &method, &path, &q).await {
                Ok((p, scope)) => {
                    req.extensions_mut().insert(Principal(p));
                    req.extensions_mut().insert(scope);
                    next.run(req).await
                }
                Err(res) => res,
            };
        }
    }
    let path = req.uri().path();
    // `/favicon.ico`: browsers ask for it on every page; ferry has none, and a 401 there would
    // only fill logs (and a browser's console) — it gets the plain 404 without a token.
    let open = matches!(path, "/healthz" | "/readyz" | "/metrics" | "/api/v1/openapi.json" | "/favicon.ico") || req.method() == Method::OPTIONS;
    let principal = if s.tokens.is_empty() {
        Some(LOCAL_PRINCIPAL.to_string())
    } else {
        if req.headers().get_all("authorization").iter().count() > 1 {
            return unauthorized("send one Authorization header");
        }
        let bearer = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        match bearer {
            Some(t) => match s.tokens.grant(t, crate::upload::now_ms()) {
                Ok(g) if g.scope == TokenScope::Upload => {
                    if !open && !creates_upload(req.method(), path) {
                        return forbidden_scope(req.method(), path);
                    }
                    req.extensions_mut().insert(UploadOnly { token_expires_ms: g.expires_ms });
                    Some(g.principal)
                }
                Ok(g) => Some(g.principal),
                Err(TokenRefusal::Unknown) => return unauthorized("the bearer token is not valid"),
                Err(TokenRefusal::Expired(ms)) => return unauthorized(&format!("the bearer token expired at {}", crate::upload::rfc3339(ms))),
            },
            None if open => None,
            None => return unauthorized("this server requires a bearer token"),
        }
    };
    if let Some(p) = principal {
        req.extensions_mut().insert(Principal(p));
    }
    next.run(req).await
}

/// `POST /files/`: the one request an upload-scoped token may make.
fn creates_upload(method: &Method, path: &str) -> bool {
    method == Method::POST && matches!(path, "/files" | "/files/")
}

fn forbidden_scope(method: &Method, path: &str) -> Response {
    Problem(Refusal::new(
        403,
        ErrorCode::Unauthorized,
        format!("this token has scope upload: it may only create uploads (POST /files/), not {method} {path}"),
        "Continue an upload with the signed URL its creation answered in Location; list, read or delete files with a full token.",
    ))
    .into_response()
}

fn forbidden(detail: String) -> Response {
    Problem(Refusal::new(
        403,
        ErrorCode::Unauthorized,
        detail,
        "Get a fresh signed URL (MCP `file_download_url` or `file_upload_begin`, `ferry \
         share ID`, or POST /api/v1/files/{id}/share), or send a bearer token instead.",
    ))
    .into_response()
}

/// A request carrying `scope`/`expires`/`sig` (DESIGN §6) acts as the owner of the one file
/// it names, or is refused with 403 `unauthorized` whether or not it also has a token.
async fn signed_principal(s: &AppState, method: &Method, path: &str, q: &SignedQuery) -> Result<(String, crate::signing::Scope), Response> {
    let id = path.strip_prefix(super::FILES_PATH).filter(|id| !id.is_empty() && !id.contains('/'));
    let Some(id) = id else {
        return Err(forbidden("signed URLs only open /files/{id}".into()));
    };
    let now = crate::upload::now_ms().div_euclid(1000);
    let scope = s.links.signer().verify(q, id, method, now).map_err(|e| forbidden(e.to_string()))?;
    match s.engine.owner(id).await {
        Ok(Some(owner)) => Ok((owner, scope)),
        Ok(None) => Err(Problem(Refusal::not_found()).into_response()),
        Err(e) => Err(Problem(e).into_response()),
    }
}
