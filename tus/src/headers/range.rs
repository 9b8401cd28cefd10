//! Owns `Content-Range` of a single byte range (RFC 9110 §14.4): what a ranged download's
//! answer says it carries. Used by ferry's `fetch` job and the CLI's resumable download, so
//! both read the header with one grammar.

use std::fmt;
use std::str::FromStr;

use super::parse_u64_digits;
use crate::error::ParseError;

/// `Content-Range: bytes first-last/total`, `bytes first-last/*` or `bytes */total`.
///
/// Grammar (RFC 9110 §14.4): `bytes SP (first-pos "-" last-pos "/" (complete-length / "*") /
/// "*/" complete-length)`, each number `1*DIGIT` ([`parse_u64_digits`]: no sign, no spaces).
/// A range whose last position is before its first, or not below the complete length, is
/// invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentRange {
    /// `bytes first-last/total` (`total` is `None` for `*`).
    Bytes {
        /// First byte position.
        first: u64,
        /// Last byte position (inclusive).
        last: u64,
        /// The representation's length, when known.
        total: Option<u64>,
    },
    /// `bytes */total`, on a `416` answer.
    Unsatisfied {
        /// The representation's length.
        total: u64,
    },
}

impl ContentRange {
    /// The canonical header name.
    pub const NAME: &'static str = "Content-Range";

    /// The complete length, when the header states it.
    pub fn total(&self) -> Option<u64> {
        match self {
            ContentRange::Bytes { total, .. } => *total,
            ContentRange::Unsatisfied { total } => Some(*total),
        }
    }
}

impl FromStr for ContentRange {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let n = |v: &str| parse_u64_digits(v, Self::NAME);
        let rest = s.strip_prefix("bytes ").ok_or_else(|| ParseError::syntax(Self::NAME, 0, "expected \"bytes \""))?;
        let (range, total) = rest.split_once('/').ok_or_else(|| ParseError::syntax(Self::NAME, s.len(), "expected \"/\""))?;
        if range == "*" {
            return Ok(ContentRange::Unsatisfied { total: n(total)? });
        }
        let (first, last) = range.split_once('-').ok_or_else(|| ParseError::syntax(Self::NAME, 6, "expected first-last"))?;
        let (first, last) = (n(first)?, n(last)?);
        let total = if total == "*" { None } else { Some(n(total)?) };
        if last < first || total.is_some_and(|t| last >= t) {
            return Err(ParseError::syntax(Self::NAME, 6, "the range is empty or past the complete length"));
        }
        Ok(ContentRange::Bytes { first, last, total })
    }
}

impl fmt::Display for ContentRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContentRange::Bytes { first, last, total: Some(t) } => write!(f, "bytes {first}-{last}/{t}"),
            ContentRange::Bytes { first, last, total: None } => write!(f, "bytes {first}-{last}/*"),
            ContentRange::Unsatisfied { total } => write!(f, "bytes */{total}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_round_trips() {
        for (text, v) in [
            ("bytes 10-19/100", ContentRange::Bytes { first: 10, last: 19, total: Some(100) }),
            ("bytes 10-19/*", ContentRange::Bytes { first: 10, last: 19, total: None }),
            ("bytes */100", ContentRange::Unsatisfied { total: 100 }),
        ] {
            assert_eq!(text.parse::<ContentRange>().unwrap(), v);
            assert_eq!(v.to_string(), text);
        }
    }

    #[test]
    fn strict() {
        for bad in ["bytes +10-19/100", "bytes 10-+19/100", "bytes 10-19/+100", "bytes 19-10/100", "bytes 10-100/100", "bytes 1 -2/3", "items 1-2/3", "bytes */*", "bytes 1-2", ""]
        {
            assert!(bad.parse::<ContentRange>().is_err(), "{bad}");
        }
    }
}
