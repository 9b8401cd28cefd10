//! Owns the typed TUS 1.0 and resumable-upload header values: one newtype per header, each with
//! `FromStr<Err = ParseError>` (strict parsing) and `Display` (canonical encoding), such that
//! `parse(display(x)) == x`.
//!
//! | module | headers | source |
//! | --- | --- | --- |
//! | [`core`] | `Upload-Offset`, `Upload-Length`, `Upload-Defer-Length`, `Tus-Resumable` | TUS 1.0 §Headers, §Creation |
//! | [`metadata`] | `Upload-Metadata` | TUS 1.0 §Upload-Metadata |
//! | [`checksum`] | `Upload-Checksum`, `Tus-Checksum-Algorithm` names | TUS 1.0 §Checksum |
//! | [`concat`] | `Upload-Concat` | TUS 1.0 §Concatenation |
//! | [`expires`] | `Upload-Expires` | TUS 1.0 §Expiration, RFC 9110 §5.6.7 |
//! | [`rufh`] | `Upload-Complete`, `Upload-Limit` | draft-ietf-httpbis-resumable-upload |
//! | [`range`] | `Range`, `Content-Range` | RFC 9110 §14.1.1, §14.2, §14.4 |
//! | [`digest`] | `Repr-Digest`, `Content-Digest` | RFC 9530 |
//! | [`idempotency`] | `Idempotency-Key` | draft-ietf-httpapi-idempotency-key-header |
//!
//! Parsers receive the field value as the HTTP layer hands it over (leading/trailing OWS already
//! removed by the HTTP parser) and are strict: anything outside the grammar is an error, and any
//! leniency is named in the type's documentation. Nothing here performs I/O.

pub mod checksum;
pub mod concat;
pub mod core;
pub mod digest;
pub mod expires;
pub mod idempotency;
pub mod metadata;
pub mod range;
pub mod rufh;

use crate::error::{ParseError, ParseErrorKind};

/// Parses a strict `1*DIGIT` decimal (RFC 9110 §5.6 style, as used by `Upload-Offset`,
/// `Upload-Length` and `Content-Length`) into a `u64`.
///
/// Only ASCII digits `0-9` are accepted: no sign (`"+5"`, `"-1"`), no whitespace, no empty
/// string. Leading zeros are accepted (`"007"` is 7). Arithmetic is checked, so any value above
/// `u64::MAX` is an error of kind [`ParseErrorKind::Overflow`] located at the first digit that
/// does not fit. `header` names the field in the error.
///
/// (Note that `"+5".parse::<u64>()` is `Ok(5)` in Rust, which is why this exists.)
pub fn parse_u64_digits(s: &str, header: &'static str) -> Result<u64, ParseError> {
    if s.is_empty() {
        return Err(ParseError::syntax(header, 0, "expected ASCII digit"));
    }
    let mut n: u64 = 0;
    for (i, b) in s.bytes().enumerate() {
        if !b.is_ascii_digit() {
            return Err(ParseError::syntax(header, i, "expected ASCII digit"));
        }
        n = n.checked_mul(10).and_then(|n| n.checked_add(u64::from(b - b'0'))).ok_or(ParseError::new(
            header,
            i,
            ParseErrorKind::Overflow,
            "number does not fit in 64 bits",
        ))?;
    }
    Ok(n)
}

/// RFC 9110 §5.6.2 `tchar`.
pub(crate) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Index of the first byte of `s` that is not a `tchar`, if any.
pub(crate) fn first_non_tchar(s: &str) -> Option<usize> {
    s.bytes().position(|b| !is_tchar(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_accepts_plain_and_leading_zeros() {
        assert_eq!(parse_u64_digits("0", "H"), Ok(0));
        assert_eq!(parse_u64_digits("007", "H"), Ok(7));
        assert_eq!(parse_u64_digits("18446744073709551615", "H"), Ok(u64::MAX));
        assert_eq!(parse_u64_digits("000000000000000000000000000042", "H"), Ok(42));
    }

    #[test]
    fn digits_rejects_signs_space_empty_and_non_ascii_digits() {
        for (s, idx) in [
            ("", 0),
            ("+5", 0),
            ("-1", 0),
            (" 5", 0),
            ("5 ", 1),
            ("1_000", 1),
            ("0x10", 1),
            ("١٢", 0), // Arabic-Indic digits
            ("12.0", 2),
            ("1e3", 1),
        ] {
            let e = parse_u64_digits(s, "Content-Length").unwrap_err();
            assert_eq!(e.kind(), ParseErrorKind::Syntax, "{s:?}");
            assert_eq!(e.index(), idx, "{s:?}");
            assert_eq!(e.header(), "Content-Length");
        }
    }

    #[test]
    fn digits_overflow_is_its_own_kind() {
        let e = parse_u64_digits("18446744073709551616", "H").unwrap_err();
        assert_eq!(e.kind(), ParseErrorKind::Overflow);
        assert_eq!(e.index(), 19);
        let e = parse_u64_digits("123456789012345678901234567890", "H").unwrap_err();
        assert_eq!(e.kind(), ParseErrorKind::Overflow);
        // A non-digit after an overflow is still reported as overflow (first failure wins).
        assert_eq!(parse_u64_digits("99999999999999999999x", "H").unwrap_err().kind(), ParseErrorKind::Overflow);
    }
}
