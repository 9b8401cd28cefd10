//! Owns the byte-range headers: `Range` (RFC 9110 §14.2, the `ranges-specifier` of §14.1.1),
//! what a download asks for, and `Content-Range` of a single byte range (RFC 9110 §14.4), what
//! a ranged download's answer says it carries. `Content-Range` is read by ferry's `fetch` job
//! and the CLI's resumable download, so both read the header with one grammar.

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

/// One `byte-range-spec` (RFC 9110 §14.1.1) of a [`ByteRanges`].
///
/// Positions are `1*DIGIT` of any length, leading zeros allowed; a value past `u64::MAX` is
/// held as `u64::MAX`, which means the same for every representation (whose length is at most
/// `u64::MAX`): a first position there is past the end, a last position is clipped to the end,
/// a suffix length covers the whole representation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRangeSpec {
    /// `int-range = first-pos "-" [ last-pos ]`: bytes `first..=last` (`last: None`: to the
    /// end). `first <= last` (as written, before any value saturates).
    Int {
        /// First byte position (0-based).
        first: u64,
        /// Last byte position (inclusive), if given.
        last: Option<u64>,
    },
    /// `suffix-range = "-" suffix-length`: the last `length` bytes.
    Suffix {
        /// How many bytes from the end (0 is valid syntax and satisfiable by nothing).
        length: u64,
    },
}

impl ByteRangeSpec {
    /// The bytes `first..=last` this range selects from a representation of `len` bytes (RFC
    /// 9110 §14.1.2: a last position at or past the end means the last byte; a suffix longer
    /// than the representation means all of it), or `None` when it is unsatisfiable (§14.1.1:
    /// a first position at or past `len`, a suffix length of 0). A non-zero suffix of an empty
    /// representation is satisfiable (§14.1.1) yet selects no byte: `None` here too;
    /// [`crate::select_range`] answers it with the whole (empty) representation.
    pub fn resolve(self, len: u64) -> Option<(u64, u64)> {
        match self {
            ByteRangeSpec::Int { first, .. } if first >= len => None,
            ByteRangeSpec::Int { first, last } => Some((first, last.map_or(len - 1, |l| l.min(len - 1)))),
            ByteRangeSpec::Suffix { length } if length == 0 || len == 0 => None,
            ByteRangeSpec::Suffix { length } => Some((len.saturating_sub(length), len - 1)),
        }
    }
}

impl fmt::Display for ByteRangeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ByteRangeSpec::Int { first, last: Some(last) } => write!(f, "{first}-{last}"),
            ByteRangeSpec::Int { first, last: None } => write!(f, "{first}-"),
            ByteRangeSpec::Suffix { length } => write!(f, "-{length}"),
        }
    }
}

/// `Range: bytes=…` (RFC 9110 §14.2): the byte ranges a request asks for, in order.
///
/// Grammar (RFC 9110 §14.1.1): `range-unit "=" 1#range-spec`, each `range-spec` an `int-range`
/// or a `suffix-range` ([`ByteRangeSpec`]). Leniency, each one RFC 9110 allows a recipient:
/// the unit `bytes` in any case (§14.1: units are case-insensitive), optional whitespace around
/// each element and empty list elements (`bytes=, 1-2,` — §5.6.1), and numbers of any length
/// (a value past `u64::MAX` saturates, see [`ByteRangeSpec`]). Errors: another unit, a sign,
/// a space inside an element, `first > last`, no element at all. Several field lines are one
/// list (RFC 9110 §5.3): join them with `", "` before parsing, which makes two `Range` lines
/// an error (the second `bytes=` is not a range-spec) — a recipient ignores either.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByteRanges {
    /// The ranges, as sent (at least one).
    pub specs: Vec<ByteRangeSpec>,
}

impl ByteRanges {
    /// The canonical header name.
    pub const NAME: &'static str = "Range";
}

/// A position: `1*DIGIT`, saturating at `u64::MAX`, and its digits without leading zeros (for
/// an exact comparison of two positions of any length).
fn position(s: &str, at: usize) -> Result<(u64, &str), ParseError> {
    if s.is_empty() {
        return Err(ParseError::syntax(ByteRanges::NAME, at, "expected ASCII digit"));
    }
    if let Some(i) = s.bytes().position(|b| !b.is_ascii_digit()) {
        return Err(ParseError::syntax(ByteRanges::NAME, at + i, "expected ASCII digit"));
    }
    let significant = s.trim_start_matches('0');
    Ok((parse_u64_digits(s, ByteRanges::NAME).unwrap_or(u64::MAX), significant))
}

impl FromStr for ByteRanges {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let (unit, set) = s.split_once('=').ok_or_else(|| ParseError::syntax(Self::NAME, 0, "expected \"bytes=\""))?;
        if !unit.trim().eq_ignore_ascii_case("bytes") {
            return Err(ParseError::syntax(Self::NAME, 0, "expected the unit \"bytes\""));
        }
        let mut specs = Vec::new();
        let mut at = unit.len() + 1;
        for element in set.split(',') {
            let start = at + (element.len() - element.trim_start_matches([' ', '\t']).len());
            at += element.len() + 1;
            let spec = element.trim_matches([' ', '\t']);
            if spec.is_empty() {
                continue;
            }
            let (first, last) = spec.split_once('-').ok_or_else(|| ParseError::syntax(Self::NAME, start, "expected \"-\""))?;
            if first.is_empty() {
                let (length, _) = position(last, start + 1)?;
                specs.push(ByteRangeSpec::Suffix { length });
                continue;
            }
            let (first_pos, first_digits) = position(first, start)?;
            let last = if last.is_empty() {
                None
            } else {
                let (last_pos, last_digits) = position(last, start + first.len() + 1)?;
                // first <= last, compared exactly whatever the number of digits.
                if (first_digits.len(), first_digits) > (last_digits.len(), last_digits) {
                    return Err(ParseError::syntax(Self::NAME, start, "the last position is before the first"));
                }
                Some(last_pos)
            };
            specs.push(ByteRangeSpec::Int { first: first_pos, last });
        }
        if specs.is_empty() {
            return Err(ParseError::syntax(Self::NAME, s.len(), "expected a range"));
        }
        Ok(ByteRanges { specs })
    }
}

impl fmt::Display for ByteRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("bytes=")?;
        for (i, spec) in self.specs.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{spec}")?;
        }
        Ok(())
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
        for bad in [
            "bytes +10-19/100",
            "bytes 10-+19/100",
            "bytes 10-19/+100",
            "bytes 19-10/100",
            "bytes 10-100/100",
            "bytes 1 -2/3",
            "items 1-2/3",
            "bytes */*",
            "bytes 1-2",
            "",
        ] {
            assert!(bad.parse::<ContentRange>().is_err(), "{bad}");
        }
    }

    #[test]
    fn range_any_digits_and_leading_zeros() {
        let one = |s: &str| s.parse::<ByteRanges>().map(|r| r.specs);
        let int = |first, last| ByteRangeSpec::Int { first, last };
        assert_eq!(one("bytes=00-01"), Ok(vec![int(0, Some(1))]));
        assert_eq!(one("bytes=0-99999999999999999999999"), Ok(vec![int(0, Some(u64::MAX))]));
        assert_eq!(one("bytes=18446744073709551616-"), Ok(vec![int(u64::MAX, None)]));
        assert_eq!(one("bytes=-99999999999999999999"), Ok(vec![ByteRangeSpec::Suffix { length: u64::MAX }]));
        assert_eq!(one("bytes=-000"), Ok(vec![ByteRangeSpec::Suffix { length: 0 }]));
        assert_eq!(one("BYTES=1-2,"), Ok(vec![int(1, Some(2))]));
        assert_eq!(one("bytes=, 1-2 ,\t3-"), Ok(vec![int(1, Some(2)), int(3, None)]));
        // first <= last is compared exactly, past 64 bits and with leading zeros too.
        assert_eq!(one("bytes=00018446744073709551617-18446744073709551617"), Ok(vec![int(u64::MAX, Some(u64::MAX))]));
        assert!(one("bytes=18446744073709551617-18446744073709551616").is_err());
        assert!(one("bytes=99999999999999999999999-18446744073709551615").is_err());
        assert!(one("bytes=10-9").is_err());
        for bad in [
            "bytes=",
            "bytes=,",
            "bytes=+1-2",
            "bytes=1-+2",
            "bytes=-+1",
            "bytes=1 -2",
            "bytes=--1",
            "bytes=1-2-3",
            "bytes=a-",
            "pages=1-2",
            "bytes 1-2",
            "bytes=0-1, bytes=5-6",
            "",
        ] {
            assert!(one(bad).is_err(), "{bad:?}");
        }
        for text in ["bytes=0-1", "bytes=5-", "bytes=-7", "bytes=0-1, 5-6"] {
            assert_eq!(text.parse::<ByteRanges>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn range_resolves_against_a_length() {
        let int = |first, last| ByteRangeSpec::Int { first, last };
        assert_eq!(int(0, Some(u64::MAX)).resolve(10), Some((0, 9)));
        assert_eq!(int(9, None).resolve(10), Some((9, 9)));
        assert_eq!(int(10, None).resolve(10), None);
        assert_eq!(int(u64::MAX, None).resolve(10), None);
        assert_eq!(ByteRangeSpec::Suffix { length: u64::MAX }.resolve(10), Some((0, 9)));
        assert_eq!(ByteRangeSpec::Suffix { length: 3 }.resolve(10), Some((7, 9)));
        assert_eq!(ByteRangeSpec::Suffix { length: 0 }.resolve(10), None);
        assert_eq!(ByteRangeSpec::Suffix { length: 1 }.resolve(0), None);
        assert_eq!(int(0, None).resolve(0), None);
    }
}
