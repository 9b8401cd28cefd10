//! Principals (DESIGN §6): bearer tokens from ferry.toml map to principal names. With no
//! tokens configured every request acts as the principal `local`. Only a token's sha256 is
//! ever stored.

use std::collections::HashMap;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ferry_tus::{ErrorCode, TusError};
use sha2::Digest;

use super::{AppState, Problem};
use crate::config::TokenEntry;
use crate::signing::SignedQuery;

/// The principal a request acts as, put in the request's extensions by [`authenticate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal(pub String);

/// The principal of every request when no tokens are configured.
pub const LOCAL_PRINCIPAL: &str = "local";

/// Token hashes → principal names.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    by_hash: HashMap<String, String>,
}

/// sha256 of a token, lowercase hex: what ferry.toml stores.
pub fn token_hash(token: &str) -> String {
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

impl Tokens {
    pub fn new(entries: &[TokenEntry]) -> Tokens {
        Tokens { by_hash: entries.iter().map(|e| (e.sha256.to_ascii_lowercase(), e.principal.clone())).collect() }
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The principal a bearer token names.
    pub fn principal(&self, token: &str) -> Option<&str> {
        self.by_hash.get(&token_hash(token)).map(String::as_str)
    }
}

fn unauthorized(detail: &str) -> Response {
    let mut res = Problem(TusError::new(401, ErrorCode::Unauthorized, detail, "Send `Authorization: Bearer <token>`; `ferry token create NAME` makes one.")).into_response();
    res.headers_mut().insert("www-authenticate", HeaderValue::from_static("Bearer"));
    res
}

/// Resolve the request's principal, or answer 401. Health, metrics, the OpenAPI document and
/// TUS discovery (`OPTIONS`) need no token.
pub async fn authenticate(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
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
    let open = matches!(path, "/healthz" | "/readyz" | "/metrics" | "/api/v1/openapi.json") || req.method() == Method::OPTIONS;
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
            Some(t) => match s.tokens.principal(t) {
                Some(p) => Some(p.to_string()),
                None => return unauthorized("the bearer token is not valid"),
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

fn forbidden(detail: String) -> Response {
    Problem(TusError::new(
        403,
        ErrorCode::Unauthorized,
        detail,
        "Get a fresh signed URL (MCP `file_download_url` or `file_upload_begin`, `ferry share ID`, or POST /api/v1/files/{id}/share), or send a bearer token instead.",
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
        Ok(None) => Err(Problem(TusError::not_found()).into_response()),
        Err(e) => Err(Problem(e).into_response()),
    }
}

/// Generate a new token: 32 random bytes, base32, prefixed `fy_`.
pub fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("fy_{}", data_encoding::BASE32_NOPAD.encode(&bytes).to_ascii_lowercase())
}
