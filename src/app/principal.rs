//! Principals (DESIGN §6): bearer tokens from ferry.toml map to principal names. With no
//! tokens configured every request acts as the principal `local`. Only a token's sha256 is
//! ever stored.

use std::collections::HashMap;

use sha2::Digest;

use crate::config::TokenEntry;

/// The principal a request acts as (HTTP: put in the request's extensions by the auth middleware).
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

/// Generate a new token: 32 random bytes, base32, prefixed `fy_`.
pub fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("fy_{}", data_encoding::BASE32_NOPAD.encode(&bytes).to_ascii_lowercase())
}
