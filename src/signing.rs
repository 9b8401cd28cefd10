//! Signed URLs (DESIGN §6): let curl or a browser act on one file without a bearer token.
//!
//! A signed URL is `/files/{id}?scope=SCOPE&expires=UNIX_SECONDS&sig=MAC`, where `MAC` is
//! base64url (no padding) of HMAC-SHA256 (RFC 2104) over `"ferry-url-v1\n{scope}\n{id}\n{expires}"`
//! keyed with the server's 32-byte secret. The scope says what the URL may do:
//! [`Scope::Download`] allows `GET`/`HEAD`, [`Scope::Upload`] allows the TUS resume verbs
//! `HEAD`/`PATCH`. A request with such a URL acts as the principal that owns the file.
//!
//! The secret is read from the configuration (`url_secret`, 64 hex digits), else it lives in the
//! catalog (created once, shared by every replica: DESIGN §2 "shared secrets"). A data dir from
//! before that keeps its `DATA/url-secret` value: the first start stores it in the catalog, so
//! links signed earlier stay valid.

use std::path::Path;

use anyhow::Context;

use crate::catalog::Catalog;
use hmac::{Hmac, KeyInit, Mac};
use http::Method;

/// What a signed URL may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Read the finished file: `GET` (with Range) and `HEAD`.
    Download,
    /// Resume an upload with TUS: `HEAD` for the offset, `PATCH` for chunks.
    Upload,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Download => "download",
            Scope::Upload => "upload",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        match s {
            "download" => Some(Scope::Download),
            "upload" => Some(Scope::Upload),
            _ => None,
        }
    }

    /// Whether a request with this method is within the scope. `OPTIONS` (TUS discovery,
    /// CORS preflight) needs no signature at all.
    pub fn allows(self, method: &Method) -> bool {
        match self {
            Scope::Download => method == Method::GET || method == Method::HEAD,
            Scope::Upload => method == Method::HEAD || method == Method::PATCH,
        }
    }
}

/// Why a signed URL is refused (each answers 403 `unauthorized`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the signed URL is incomplete: it needs scope, expires and sig")]
    Incomplete,
    #[error("the URL signature does not match (the URL was altered or signed for another file)")]
    Mismatch,
    /// The expiry, Unix seconds (shown as RFC 3339).
    #[error("the signed URL expired at {}", crate::upload::rfc3339(.0.saturating_mul(1000)))]
    Expired(i64),
    #[error("this URL is signed for {0}; it does not allow {1}")]
    WrongScope(&'static str, Method),
    /// A signed parameter (`scope`, `expires`, `sig`) appears more than once: which value the
    /// signature covers would depend on the reader, so the URL is refused whole.
    #[error("the signed URL repeats its {0} parameter; a signed URL has each of scope, expires and sig once (use the URL exactly as it was given)")]
    Repeated(&'static str),
}

/// The three signature parameters of a URL's query string.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SignedQuery {
    pub scope: Option<String>,
    pub expires: Option<String>,
    pub sig: Option<String>,
    /// The first signed parameter that appeared more than once, if any.
    pub repeated: Option<&'static str>,
}

impl SignedQuery {
    /// Pick `scope`, `expires` and `sig` out of a raw query string; `None` when none is present.
    /// A parameter given twice is noted in `repeated` (the verification refuses it).
    pub fn from_query(query: Option<&str>) -> Option<SignedQuery> {
        let mut q = SignedQuery::default();
        for pair in query?.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_encoding::percent_decode_str(v).decode_utf8_lossy().into_owned();
            let (slot, name) = match k {
                "scope" => (&mut q.scope, "scope"),
                "expires" => (&mut q.expires, "expires"),
                "sig" => (&mut q.sig, "sig"),
                _ => continue,
            };
            if slot.replace(v).is_some() {
                q.repeated = q.repeated.or(Some(name));
            }
        }
        (q != SignedQuery::default()).then_some(q)
    }
}

/// Signs and verifies URLs with the server secret.
#[derive(Clone)]
pub struct UrlSigner {
    key: [u8; 32],
}

impl std::fmt::Debug for UrlSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UrlSigner(..)")
    }
}

/// The per-data-dir secret file of earlier versions (read once, to migrate it).
const SECRET_FILE: &str = "url-secret";
/// The catalog's name for the URL-signing secret.
const SECRET_NAME: &str = "url-signing-v1";

fn parse_secret(hex_text: &str, origin: &str) -> anyhow::Result<UrlSigner> {
    let bytes = hex::decode(hex_text.trim()).with_context(|| format!("{origin}: the URL secret must be hex"))?;
    let key: [u8; 32] = bytes.try_into().map_err(|_| anyhow::anyhow!("{origin}: the URL secret must be 32 bytes (64 hex digits)"))?;
    Ok(UrlSigner::new(key))
}

impl UrlSigner {
    pub fn new(key: [u8; 32]) -> UrlSigner {
        UrlSigner { key }
    }

    /// The configured secret (64 hex digits), else the catalog's shared one, created once
    /// (from `data/url-secret` when that file exists, else random). Errors: a malformed
    /// configured secret or secret file, or a catalog failure.
    pub async fn load_shared(catalog: &dyn Catalog, data: &Path, configured: Option<&str>) -> anyhow::Result<UrlSigner> {
        if let Some(s) = configured {
            return parse_secret(s, "url_secret");
        }
        let path = data.join(SECRET_FILE);
        let candidate = match crate::regular_file::read_to_string(&path) {
            Ok(text) => parse_secret(&text, &path.display().to_string())?.key,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => rand::random(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let stored = catalog.shared_secret(SECRET_NAME, &candidate).await.context("reading the shared URL secret from the catalog")?;
        let key: [u8; 32] = stored.try_into().map_err(|_| anyhow::anyhow!("the catalog's URL secret is not 32 bytes"))?;
        Ok(UrlSigner::new(key))
    }

    fn mac(&self, scope: Scope, id: &str, expires: i64) -> Hmac<sha2::Sha256> {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(format!("ferry-url-v1\n{}\n{id}\n{expires}", scope.as_str()).as_bytes());
        mac
    }

    /// The query string (without `?`) that signs `scope` on file `id` until `expires`
    /// (unix seconds).
    pub fn sign(&self, scope: Scope, id: &str, expires: i64) -> String {
        let sig = data_encoding::BASE64URL_NOPAD.encode(&self.mac(scope, id, expires).finalize().into_bytes());
        format!("scope={}&expires={expires}&sig={sig}", scope.as_str())
    }

    /// Check a signed query for file `id` and request `method` at `now` (unix seconds).
    /// The MAC is compared in constant time.
    pub fn verify(&self, q: &SignedQuery, id: &str, method: &Method, now: i64) -> Result<Scope, SignatureError> {
        let (scope, _) = self.verify_link(q, id, now)?;
        if !scope.allows(method) {
            return Err(SignatureError::WrongScope(scope.as_str(), method.clone()));
        }
        Ok(scope)
    }

    /// Check a signed query for file `id` at `now` (unix seconds) whatever it will be used
    /// for: the MAC (constant time) and the expiry. Returns the scope and the expiry (unix
    /// seconds). The page of a link (`/share/{id}`) uses this to say what the link is for.
    /// A grant for a link (issue 51): `"{expires}.{mac}"`, the MAC being base64url HMAC-SHA256
    /// over `"ferry-link-grant-v1\n{what}\n{link}\n{expires}"` (`what`: `open` after the
    /// passphrase, `download` after a counted download). Unix seconds.
    pub fn grant(&self, what: &str, link: &str, expires: i64) -> String {
        format!("{expires}.{}", data_encoding::BASE64URL_NOPAD.encode(&self.grant_mac(what, link, expires).finalize().into_bytes()))
    }

    /// Whether `token` is a [`UrlSigner::grant`] of `what` for `link` that has not expired at
    /// `now` (Unix seconds).
    pub fn verify_grant(&self, token: &str, what: &str, link: &str, now: i64) -> bool {
        let Some((expires, mac)) = token.split_once('.') else { return false };
        let Some(expires) = ferry_tus::headers::parse_u64_digits(expires, "expires").ok().and_then(|v| i64::try_from(v).ok()) else {
            return false;
        };
        let Ok(mac) = data_encoding::BASE64URL_NOPAD.decode(mac.as_bytes()) else { return false };
        expires > now && self.grant_mac(what, link, expires).verify_slice(&mac).is_ok()
    }

    fn grant_mac(&self, what: &str, link: &str, expires: i64) -> Hmac<sha2::Sha256> {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(format!("ferry-link-grant-v1\n{what}\n{link}\n{expires}").as_bytes());
        mac
    }

    pub fn verify_link(&self, q: &SignedQuery, id: &str, now: i64) -> Result<(Scope, i64), SignatureError> {
        if let Some(name) = q.repeated {
            return Err(SignatureError::Repeated(name));
        }
        let (Some(scope), Some(expires), Some(sig)) = (&q.scope, &q.expires, &q.sig) else {
            return Err(SignatureError::Incomplete);
        };
        let scope = Scope::parse(scope).ok_or(SignatureError::Mismatch)?;
        let expires: i64 =
            ferry_tus::headers::parse_u64_digits(expires, "expires").ok().and_then(|v| i64::try_from(v).ok()).ok_or(SignatureError::Mismatch)?;
        let sig = data_encoding::BASE64URL_NOPAD.decode(sig.as_bytes()).map_err(|_| SignatureError::Mismatch)?;
        self.mac(scope, id, expires).verify_slice(&sig).map_err(|_| SignatureError::Mismatch)?;
        if expires <= now {
            return Err(SignatureError::Expired(expires));
        }
        Ok((scope, expires))
    }
}

/// A URL that works without a token until it expires.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SignedUrl {
    /// Absolute URL: `{public_url}/files/{id}?scope=…&expires=…&sig=…`.
    pub url: String,
    /// The page for people with the same signature: `{public_url}/share/{id}?scope=…` (a
    /// request-a-file page for `upload`, a download page for `download`); `None` with `--no-web`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_url: Option<String>,
    pub scope: Scope,
    /// Unix ms.
    pub expires_at_ms: i64,
}

/// Longest life of a signed URL: 7 days (ms), like S3 presigned URLs.
pub const MAX_URL_TTL_MS: u64 = 7 * 24 * 3600 * 1000;

/// Absolute URLs of files, plain and signed.
#[derive(Debug, Clone)]
pub struct Links {
    base: String,
    signer: UrlSigner,
    pages: bool,
}

/// Path prefix of the pages for people behind signed links (`/share/{id}?scope=…`).
pub const PAGE_PATH: &str = "/share/";

/// Path prefix of a catalog link's page and routes (issue 51): `/l/{id}`.
pub const LINK_PATH: &str = "/l/";

impl Links {
    /// `base`: absolute URL without a trailing `/` (the `public_url` setting).
    pub fn new(base: impl Into<String>, signer: UrlSigner) -> Links {
        Links { base: base.into().trim_end_matches('/').to_string(), signer, pages: false }
    }

    /// Whether signed URLs also name their page for people ([`SignedUrl::page_url`]): on when
    /// the server serves the pages (not `--no-web`).
    pub fn with_pages(mut self, pages: bool) -> Links {
        self.pages = pages;
        self
    }

    pub fn signer(&self) -> &UrlSigner {
        &self.signer
    }

    /// `{base}/files/{id}`: needs a bearer token when the server has tokens.
    /// The page of a catalog link (issue 51): `{base}/l/{id}`.
    pub fn link_url(&self, id: &str) -> String {
        format!("{}{LINK_PATH}{id}", self.base)
    }

    pub fn file_url(&self, id: &str) -> String {
        format!("{}/files/{id}", self.base)
    }

    /// A URL signed for `scope` on `id`, valid `ttl_ms` from `now_ms` (capped at
    /// [`MAX_URL_TTL_MS`]; expiry rounded up to whole seconds).
    pub fn signed(&self, scope: Scope, id: &str, ttl_ms: u64, now_ms: i64) -> SignedUrl {
        let expires_ms = now_ms.saturating_add(ttl_ms.min(MAX_URL_TTL_MS) as i64);
        let expires = (expires_ms + 999).div_euclid(1000);
        let query = self.signer.sign(scope, id, expires);
        let page_url = self.pages.then(|| format!("{}{PAGE_PATH}{id}?{query}", self.base));
        SignedUrl { url: format!("{}?{query}", self.file_url(id)), page_url, scope, expires_at_ms: expires * 1000 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> SignedQuery {
        SignedQuery::from_query(Some(s)).unwrap()
    }

    #[test]
    fn round_trip_and_every_refusal() {
        let s = UrlSigner::new([7; 32]);
        let signed = s.sign(Scope::Download, "abc", 2_000);
        assert_eq!(s.verify(&q(&signed), "abc", &Method::GET, 1_000), Ok(Scope::Download));
        assert_eq!(s.verify(&q(&signed), "abc", &Method::HEAD, 1_999), Ok(Scope::Download));
        assert_eq!(s.verify(&q(&signed), "abd", &Method::GET, 1_000), Err(SignatureError::Mismatch));
        assert_eq!(s.verify(&q(&signed), "abc", &Method::GET, 2_000), Err(SignatureError::Expired(2_000)));
        assert!(matches!(s.verify(&q(&signed), "abc", &Method::PATCH, 1_000), Err(SignatureError::WrongScope("download", _))));
        // Changing the scope or the expiry breaks the MAC.
        let upgraded = signed.replace("scope=download", "scope=upload");
        assert_eq!(s.verify(&q(&upgraded), "abc", &Method::PATCH, 1_000), Err(SignatureError::Mismatch));
        let longer = signed.replace("expires=2000", "expires=9000");
        assert_eq!(s.verify(&q(&longer), "abc", &Method::GET, 1_000), Err(SignatureError::Mismatch));
        // Another key does not verify.
        assert_eq!(UrlSigner::new([8; 32]).verify(&q(&signed), "abc", &Method::GET, 1_000), Err(SignatureError::Mismatch));
        assert_eq!(s.verify(&q("sig=x"), "abc", &Method::GET, 1_000), Err(SignatureError::Incomplete));
        assert_eq!(s.verify(&q("scope=upload&expires=-5&sig=AA"), "abc", &Method::GET, 1_000), Err(SignatureError::Mismatch));
        let up = s.sign(Scope::Upload, "abc", 2_000);
        assert_eq!(s.verify(&q(&up), "abc", &Method::PATCH, 1_000), Ok(Scope::Upload));
        assert!(s.verify(&q(&up), "abc", &Method::GET, 1_000).is_err());
        // A signed parameter given twice is refused whole, whichever copy is the signed one.
        for extra in ["scope=download", "scope=upload", "expires=2000", "sig=AA"] {
            let e = s.verify(&q(&format!("{up}&{extra}")), "abc", &Method::PATCH, 1_000).unwrap_err();
            assert_eq!(
                e,
                SignatureError::Repeated(
                    extra
                        .split('=')
                        .next()
                        .map(|n| if n == "scope" {
                            "scope"
                        } else if n == "expires" {
                            "expires"
                        } else {
                            "sig"
                        })
                        .unwrap()
                )
            );
            assert!(e.to_string().contains("repeats its"), "{e}");
        }
    }

    #[test]
    fn grants_are_bound_to_what_link_and_time() {
        let s = UrlSigner::new([7; 32]);
        let g = s.grant("open", "lnk", 2_000);
        assert!(s.verify_grant(&g, "open", "lnk", 1_999));
        assert!(!s.verify_grant(&g, "open", "lnk", 2_000), "expired");
        assert!(!s.verify_grant(&g, "download", "lnk", 1_000), "another kind of grant");
        assert!(!s.verify_grant(&g, "open", "lnl", 1_000), "another link");
        assert!(!s.verify_grant(&g.replacen("2000", "9000", 1), "open", "lnk", 1_000), "a longer life");
        assert!(!UrlSigner::new([8; 32]).verify_grant(&g, "open", "lnk", 1_000));
        assert!(!s.verify_grant("garbage", "open", "lnk", 1_000));
    }

    #[test]
    fn query_without_signature_params_is_none() {
        assert_eq!(SignedQuery::from_query(None), None);
        assert_eq!(SignedQuery::from_query(Some("a=1&b")), None);
    }

    #[tokio::test]
    async fn secret_is_created_once_in_the_catalog_and_shared() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("shared.db");
        let (one, two) = (crate::catalog::SqliteCatalog::open(&db).await.unwrap(), crate::catalog::SqliteCatalog::open(&db).await.unwrap());
        let (d1, d2) = (dir.path().join("a"), dir.path().join("b"));
        let a = UrlSigner::load_shared(&one, &d1, None).await.unwrap();
        let b = UrlSigner::load_shared(&two, &d2, None).await.unwrap();
        assert_eq!(a.key, b.key, "two replicas with their own data dirs share one secret");
        assert_eq!(UrlSigner::load_shared(&one, &d1, None).await.unwrap().key, a.key, "and keep it across restarts");
        assert!(UrlSigner::load_shared(&one, &d1, Some("zz")).await.is_err());
        assert_eq!(UrlSigner::load_shared(&one, &d1, Some(&"ab".repeat(32))).await.unwrap().key, [0xab; 32], "a configured secret wins");
    }

    #[tokio::test]
    async fn an_old_secret_file_is_migrated_into_the_catalog() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SECRET_FILE), "cd".repeat(32)).unwrap();
        let cat = crate::catalog::SqliteCatalog::open(&dir.path().join("ferry.db")).await.unwrap();
        assert_eq!(UrlSigner::load_shared(&cat, dir.path(), None).await.unwrap().key, [0xcd; 32], "links signed before keep working");
        std::fs::remove_file(dir.path().join(SECRET_FILE)).unwrap();
        assert_eq!(UrlSigner::load_shared(&cat, dir.path(), None).await.unwrap().key, [0xcd; 32], "the catalog keeps it");
    }
}
