//! Principals (DESIGN §6): bearer tokens from ferry.toml map to principal names. With no
//! tokens configured every request acts as the principal `local`. Only a token's sha256 is
//! ever stored.
//!
//! A token may be narrowed: `scope = "upload"` (it may only create uploads) and `expires` (an
//! RFC 3339 time after which it is refused). The set is swapped whole on SIGHUP
//! ([`Tokens::replace`]): every clone of [`Tokens`] sees the new set from its next lookup.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// The principal a request acts as (HTTP: put in the request's extensions by the auth middleware).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal(pub String);

/// The principal of every request when no tokens are configured.
pub const LOCAL_PRINCIPAL: &str = "local";

/// What one token grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub principal: String,
    pub scope: TokenScope,
    /// Unix ms after which the token is refused; `None`: never.
    pub expires_ms: Option<i64>,
}

/// Why a bearer token is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRefusal {
    /// No configured token has this sha256 (never was, or revoked).
    Unknown,
    /// The token's `expires` (unix ms) has passed.
    Expired(i64),
}

/// Token hashes → grants; cheap to clone, shared with every clone, replaced whole on reload.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    set: Arc<RwLock<Arc<HashMap<String, Grant>>>>,
}

/// `[[tokens]]` in ferry.toml: a bearer token's sha256 (hex) and the principal it names.
/// Written by `ferry token create NAME [--scope upload] [--ttl 1h]`; the token itself is never
/// stored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    pub principal: String,
    pub sha256: String,
    /// What the token may do (default `full`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<TokenScope>,
    /// RFC 3339 time after which the token is refused (401), e.g. `2026-11-30T21:00:00Z`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
}

impl TokenEntry {
    /// `expires` as unix ms. Errors: not an RFC 3339 time.
    pub fn expires_ms(&self) -> anyhow::Result<Option<i64>> {
        self.expires
            .as_deref()
            .map(|e| {
                let t = humantime::parse_rfc3339_weak(e.trim())
                    .map_err(|err| anyhow::anyhow!("[[tokens]] expires {e:?} for {:?}: {err} (write e.g. 2026-11-30T21:00:00Z)", self.principal))?;
                let ms = t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
                Ok(ms)
            })
            .transpose()
    }
}

/// sha256 of a bearer token, lowercase hex: what ferry.toml stores.
pub fn token_hash(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// Generate a new bearer token: 32 random bytes, base32, prefixed `fy_`.
pub fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("fy_{}", data_encoding::BASE32_NOPAD.encode(&bytes).to_ascii_lowercase())
}

/// What a bearer token may do (`scope` of a `[[tokens]]` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TokenScope {
    /// Everything its principal may do.
    #[default]
    Full,
    /// Only create uploads (`POST /files/`); each creation answers a signed upload URL in
    /// `Location`, good for that one upload's HEAD and PATCH. Cannot list, read, download or
    /// delete anything, nor use the API or MCP: what a web page may hold.
    Upload,
}

impl TokenScope {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenScope::Full => "full",
            TokenScope::Upload => "upload",
        }
    }
}

/// Token hashes → grants. Errors: an `expires` that is not an RFC 3339 time, or one token
/// listed twice — each token names exactly one principal, scope and expiry, so a second entry
/// (a copy under another principal, say) is refused rather than one of them silently winning.
fn grants(entries: &[TokenEntry]) -> anyhow::Result<HashMap<String, Grant>> {
    let mut out = HashMap::with_capacity(entries.len());
    for e in entries {
        let grant = Grant { principal: e.principal.clone(), scope: e.scope.unwrap_or_default(), expires_ms: e.expires_ms()? };
        let hash = e.sha256.to_ascii_lowercase();
        if let Some(first) = out.get(&hash) {
            let first: &Grant = first;
            anyhow::bail!(
                "[[tokens]]: the token whose sha256 starts {} is listed twice (for {:?} and {:?}); a token names one \
                 principal — remove one entry, or create a new token for the second (`ferry token create NAME`)",
                &hash[..hash.len().min(12)],
                first.principal,
                e.principal
            );
        }
        out.insert(hash, grant);
    }
    Ok(out)
}

impl Tokens {
    /// Errors: an `expires` that is not an RFC 3339 time (the config check refuses it first).
    pub fn new(entries: &[TokenEntry]) -> anyhow::Result<Tokens> {
        Ok(Tokens { set: Arc::new(RwLock::new(Arc::new(grants(entries)?))) })
    }

    fn current(&self) -> Arc<HashMap<String, Grant>> {
        self.set.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Swap in a new set (SIGHUP): the next lookup on any clone uses it. Errors as [`Tokens::new`];
    /// the old set then stays.
    pub fn replace(&self, entries: &[TokenEntry]) -> anyhow::Result<()> {
        let new = Arc::new(grants(entries)?);
        *self.set.write().unwrap_or_else(|e| e.into_inner()) = new;
        Ok(())
    }

    /// No tokens configured: every request is `local`.
    pub fn is_empty(&self) -> bool {
        self.current().is_empty()
    }

    /// (distinct principals, tokens) configured.
    pub fn counts(&self) -> (usize, usize) {
        let set = self.current();
        (set.values().map(|g| g.principal.as_str()).collect::<BTreeSet<_>>().len(), set.len())
    }

    /// What a bearer token grants at `now_ms` (unix ms).
    pub fn grant(&self, token: &str, now_ms: i64) -> Result<Grant, TokenRefusal> {
        let set = self.current();
        let g = set.get(&token_hash(token)).ok_or(TokenRefusal::Unknown)?;
        match g.expires_ms {
            Some(exp) if exp <= now_ms => Err(TokenRefusal::Expired(exp)),
            _ => Ok(g.clone()),
        }
    }

    /// The principal a full or upload token names, if it is valid now.
    pub fn principal(&self, token: &str) -> Option<String> {
        self.grant(token, crate::upload::now_ms()).ok().map(|g| g.principal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(p: &str, token: &str, scope: Option<TokenScope>, expires: Option<&str>) -> TokenEntry {
        TokenEntry { principal: p.into(), sha256: token_hash(token), scope, expires: expires.map(str::to_owned) }
    }

    #[test]
    fn grants_expiry_and_replacement_seen_by_every_clone() {
        let t = Tokens::new(&[entry("alice", "a", None, None), entry("web", "w", Some(TokenScope::Upload), Some("2026-01-01T00:00:00Z"))]).unwrap();
        let other = t.clone();
        assert_eq!(t.counts(), (2, 2));
        assert_eq!(t.grant("a", 0).unwrap().scope, TokenScope::Full);
        let exp = 1_767_225_600_000;
        assert_eq!(t.grant("w", exp - 1).unwrap(), Grant { principal: "web".into(), scope: TokenScope::Upload, expires_ms: Some(exp) });
        assert_eq!(t.grant("w", exp), Err(TokenRefusal::Expired(exp)));
        assert_eq!(t.grant("nope", 0), Err(TokenRefusal::Unknown));
        t.replace(&[entry("bob", "b", None, None)]).unwrap();
        assert_eq!(other.grant("a", 0), Err(TokenRefusal::Unknown), "a clone sees the revocation");
        assert_eq!(other.grant("b", 0).unwrap().principal, "bob");
        assert!(t.replace(&[entry("x", "x", None, Some("soon"))]).is_err());
        assert_eq!(other.grant("b", 0).unwrap().principal, "bob", "a refused replacement keeps the old set");
    }

    #[test]
    fn one_token_listed_twice_is_refused_whatever_the_principals() {
        let mut copied = entry("mallory", "b", None, None);
        copied.sha256 = copied.sha256.to_ascii_uppercase();
        let e = Tokens::new(&[entry("bob", "b", None, None), copied]).unwrap_err().to_string();
        assert!(e.contains("listed twice") && e.contains("\"bob\"") && e.contains("\"mallory\""), "{e}");
        assert!(
            Tokens::new(&[entry("bob", "b", None, None), entry("bob", "b", Some(TokenScope::Upload), None)]).is_err(),
            "same principal, another scope"
        );
        let t = Tokens::new(&[entry("bob", "b", None, None)]).unwrap();
        assert!(t.replace(&[entry("bob", "b", None, None), entry("mallory", "b", None, None)]).is_err());
        assert_eq!(t.grant("b", 0).unwrap().principal, "bob", "the reload is refused and bob stays bob");
    }
}
