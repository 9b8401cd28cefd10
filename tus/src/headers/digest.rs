//! Owns `Repr-Digest` and `Content-Digest` (RFC 9530 §2, §3): integrity digests as RFC 9651
//! Dictionaries of algorithm → byte sequence. ferry only computes sha-256.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use sfv::{key_ref, BareItem, DictSerializer, Dictionary, Item, ListEntry, Parser, RefBareItem};

use crate::error::ParseError;

const NAME: &str = "Repr-Digest";

/// `Repr-Digest` (RFC 9530 §3) — and, through [`ContentDigest`], `Content-Digest` (RFC 9530 §2).
///
/// Grammar: an RFC 9651 Dictionary whose keys are hash algorithm keys from the IANA registry and
/// whose values are Byte Sequences, e.g. `sha-256=:RK/0qy18MlBSVnWgjwz6lZEWjP/lF5HF9bvEF8FabDg=:`.
/// Only `sha-256` is kept; other members (`sha-512`, unknown ones) are ignored as RFC 9530 §2
/// allows. A `sha-256` member that is not a Byte Sequence of exactly 32 bytes is an error.
/// `Display` writes `sha-256=:…:` (standard base64 with padding), or `""` when there is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReprDigest {
    /// The `sha-256` digest, if present.
    pub sha256: Option<[u8; 32]>,
}

/// `Content-Digest` (RFC 9530 §2): the grammar of [`ReprDigest`], over one message's content
/// (the IETF draft's chunk checksum) rather than the whole representation; its errors name
/// `Content-Digest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ContentDigest {
    /// The `sha-256` digest, if present.
    pub sha256: Option<[u8; 32]>,
}

impl ContentDigest {
    /// The canonical header name.
    pub const NAME: &'static str = "Content-Digest";
}

/// The `sha-256` member of digest field `name` (RFC 9530 §2: other members are ignored).
fn parse_sha256(s: &str, name: &'static str) -> Result<Option<[u8; 32]>, ParseError> {
    let dict: Dictionary = Parser::new(s).parse_dictionary().map_err(|e| ParseError::from_sfv(name, &e))?;
    match dict.get("sha-256") {
        None => Ok(None),
        Some(ListEntry::Item(Item { bare_item: BareItem::ByteSequence(b), .. })) => match <[u8; 32]>::try_from(b.as_slice()) {
            Ok(d) => Ok(Some(d)),
            // RFC 9651 §4.2.7 has parsers accept base64 without padding or with stray pad bits,
            // so `:garbage:` reads as 5 bytes: when the length is wrong, say first whether the
            // text was base64 at all, the likelier fault.
            Err(_) => match last_byte_sequence(s, "sha-256") {
                Some(raw) if STANDARD.decode(raw).is_err() => Err(ParseError::syntax(
                    name,
                    raw.as_ptr() as usize - s.as_ptr() as usize,
                    "the sha-256 value is not base64 (RFC 4648 §4, padded): a sha-256 \
                     digest is 32 bytes, 44 base64 characters ending in '=' between colons",
                )),
                _ => {
                    Err(ParseError::syntax(name, 0, "sha-256 digest must be 32 bytes (44 base64 characters); this base64 decodes to another length"))
                }
            },
        },
        Some(_) => Err(ParseError::syntax(name, 0, "sha-256 digest must be a byte sequence")),
    }
}

/// The text between the colons of the last top-level member `key` of dictionary `s` (which
/// already parsed as an RFC 9651 Dictionary) when its value is a Byte Sequence; `None` otherwise.
fn last_byte_sequence<'a>(s: &'a str, key: &str) -> Option<&'a str> {
    let (mut found, mut start, mut quoted, mut escaped, mut depth) = (None, 0, false, false, 0u32);
    let member = |m: &'a str| {
        let (k, v) = m.trim().split_once('=')?;
        let v = v.strip_prefix(':')?;
        (k == key).then(|| v.split(':').next()).flatten()
    };
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => depth = depth.saturating_sub(1),
            ',' if !quoted && depth == 0 => {
                if let Some(v) = member(&s[start..i]) {
                    found = Some(v);
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    member(&s[start..]).or(found)
}

/// `sha-256=:…:`, or nothing.
fn write_sha256(sha256: Option<&[u8; 32]>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let mut ser = DictSerializer::new();
    if let Some(d) = sha256 {
        ser.bare_item(key_ref("sha-256"), RefBareItem::ByteSequence(d));
    }
    f.write_str(ser.finish().as_deref().unwrap_or(""))
}

impl FromStr for ContentDigest {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        Ok(ContentDigest { sha256: parse_sha256(s, Self::NAME)? })
    }
}

impl fmt::Display for ContentDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_sha256(self.sha256.as_ref(), f)
    }
}

impl ReprDigest {
    /// The canonical header name.
    pub const NAME: &'static str = NAME;

    /// A digest field carrying only `sha-256`.
    pub fn from_sha256(d: [u8; 32]) -> Self {
        ReprDigest { sha256: Some(d) }
    }
}

impl FromStr for ReprDigest {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        Ok(ReprDigest { sha256: parse_sha256(s, NAME)? })
    }
}

impl fmt::Display for ReprDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_sha256(self.sha256.as_ref(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // sha-256 of the empty string.
    const EMPTY: [u8; 32] = [
        0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24, 0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93,
        0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55,
    ];

    #[test]
    fn display_and_round_trip() {
        let d = ReprDigest::from_sha256(EMPTY);
        assert_eq!(d.to_string(), "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:");
        assert_eq!(d.to_string().parse(), Ok(d));
        let none = ReprDigest::default();
        assert_eq!(none.to_string(), "");
        assert_eq!("".parse(), Ok(none));
        let c = ContentDigest { sha256: d.sha256 };
        assert_eq!(c.to_string(), d.to_string());
        assert_eq!(c.to_string().parse::<ContentDigest>(), Ok(c));
    }

    #[test]
    fn other_members_ignored() {
        // RFC 9530 §2 example shape: several algorithms in one field.
        let s = "sha-512=:YMAam51Jz/jOATT6/zvHrLVgOYTGFy1d6GJiOHTohq4yP+pgk4vf2aCsyRZOtw8MjkM7iw7yZ/WkppmM44T3qg==:, \
                 sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:, foo=bar";
        assert_eq!(s.parse(), Ok(ReprDigest::from_sha256(EMPTY)));
        assert_eq!("sha-512=:AAAA:".parse(), Ok(ReprDigest::default()));
    }

    #[test]
    fn rejects() {
        for s in [
            "sha-256=:AAAA:",                                       // 3 bytes
            "sha-256=47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=", // not a byte sequence
            "sha-256=(:AAAA:)",
            "sha-256",                                                // boolean true
            "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=",  // unterminated
            "SHA-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:", // keys are lowercase
            "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:,",
        ] {
            let e = s.parse::<ReprDigest>().unwrap_err();
            assert_eq!(e.header(), "Repr-Digest", "{s:?}");
            let e = s.parse::<ContentDigest>().unwrap_err();
            assert_eq!(e.header(), "Content-Digest", "{s:?}");
        }
    }

    #[test]
    fn text_that_is_not_base64_is_said_to_be_so() {
        // sfv reads `:garbage:` leniently (RFC 9651 §4.2.7) as 5 bytes; the fault is the base64.
        let e = "sha-256=:garbage:".parse::<ContentDigest>().unwrap_err();
        assert!(e.reason().contains("not base64"), "{e}");
        assert_eq!(e.index(), 9);
        let e = "foo=\",\", sha-256=:garbage:;p".parse::<ReprDigest>().unwrap_err();
        assert!(e.reason().contains("not base64"), "{e}");
        // Valid base64 of the wrong length keeps the length message.
        let e = "sha-256=:AAAA:".parse::<ContentDigest>().unwrap_err();
        assert!(e.reason().starts_with("sha-256 digest must be 32 bytes"), "{e}");
        assert_eq!(last_byte_sequence("a=(1 2), sha-256=:AA==:, b=?1", "sha-256"), Some("AA=="));
        assert_eq!(last_byte_sequence("sha-256=1", "sha-256"), None);
    }
}
