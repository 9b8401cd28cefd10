//! Owns `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header): the key that makes a
//! retried non-idempotent request (an upload creation, a task start) do its work once.

use std::fmt;
use std::str::FromStr;

use sfv::{BareItem, Item, ItemSerializer, Parser};

use crate::error::ParseError;

const NAME: &str = "Idempotency-Key";

/// An idempotency key: 1 to [`IdempotencyKey::MAX_LEN`] characters, none of them a control
/// character. The one definition of a valid key for every place ferry takes one — the
/// `Idempotency-Key` header of `POST /files/` and `POST /api/v1/tasks`, the MCP tools'
/// `idempotency_key` argument, the CLI — so they accept and refuse the same keys.
///
/// Header grammar (the draft): an RFC 9651 Item whose bare item is a String,
/// `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`; parameters are ignored.
/// Leniency: a value that does not start with `"` is taken verbatim as the key when it is
/// visible ASCII (`%x21-7E`), as many clients send it unquoted (ferry's CLI did). `"abc"` and
/// `abc` therefore name the same key. `Display` writes the sf-string form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The canonical header name.
    pub const NAME: &'static str = NAME;

    /// Longest key accepted, in characters.
    pub const MAX_LEN: usize = 255;

    /// A key given as a plain string (an MCP or CLI argument, not a header field).
    ///
    /// Errors: empty, longer than [`IdempotencyKey::MAX_LEN`] characters, or containing a
    /// control character.
    pub fn new(key: &str) -> Result<IdempotencyKey, ParseError> {
        if key.is_empty() {
            return Err(ParseError::syntax(NAME, 0, "an idempotency key must not be empty"));
        }
        if let Some((i, _)) = key.char_indices().nth(Self::MAX_LEN) {
            return Err(ParseError::syntax(NAME, i, "an idempotency key has at most 255 characters"));
        }
        if let Some((i, _)) = key.char_indices().find(|(_, c)| c.is_control()) {
            return Err(ParseError::syntax(NAME, i, "an idempotency key must not contain control characters"));
        }
        Ok(IdempotencyKey(key.to_owned()))
    }

    /// The key itself (without the quotes of the header form).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for IdempotencyKey {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        if s.starts_with('"') {
            let item: Item = Parser::new(s).parse_item().map_err(|e| ParseError::from_sfv(NAME, &e))?;
            return match item.bare_item {
                BareItem::String(k) => IdempotencyKey::new(k.as_str()),
                _ => Err(ParseError::syntax(NAME, 0, "expected a string")),
            };
        }
        if let Some(i) = s.bytes().position(|b| !(0x21..=0x7e).contains(&b)) {
            return Err(ParseError::syntax(NAME, i, "an unquoted key must be visible ASCII"));
        }
        IdempotencyKey::new(s)
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match sfv::StringRef::from_str(&self.0) {
            Ok(s) => f.write_str(&ItemSerializer::new().bare_item(s).finish()),
            // Not representable as an sf-string (non-ASCII): only plain-string keys can be.
            Err(_) => f.write_str(&self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_and_bare_forms_name_the_same_key() {
        let q: IdempotencyKey = "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"".parse().unwrap();
        let b: IdempotencyKey = "8e03978e-40d5-43e8-bc93-6894a57f9324".parse().unwrap();
        assert_eq!(q, b);
        assert_eq!(q.to_string(), "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"");
        assert_eq!(q.to_string().parse::<IdempotencyKey>().unwrap(), q);
        let spaced: IdempotencyKey = "\"a b\";p=1".parse().unwrap();
        assert_eq!(spaced.as_str(), "a b");
    }

    #[test]
    fn length_is_1_to_255_characters() {
        assert!(IdempotencyKey::new(&"k".repeat(255)).is_ok());
        assert!(format!("\"{}\"", "k".repeat(255)).parse::<IdempotencyKey>().is_ok());
        assert!(IdempotencyKey::new(&"é".repeat(255)).is_ok(), "characters, not bytes");
        for bad in ["".to_string(), "k".repeat(256), "a\u{7}b".into()] {
            assert!(IdempotencyKey::new(&bad).is_err(), "{bad:?}");
        }
        for bad in ["", "\"\"", "a b", "\"unterminated", "ké"] {
            assert_eq!(bad.parse::<IdempotencyKey>().unwrap_err().header(), "Idempotency-Key", "{bad:?}");
        }
        assert!("k".repeat(256).parse::<IdempotencyKey>().is_err());
    }
}
