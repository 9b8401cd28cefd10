//! Owns [`ParseError`], the one error every header parser in this crate returns.
//!
//! The error is an opaque struct in the style of `httparse`/`sfv`: it says *which* header failed,
//! *where* (byte index into the field value as given to the parser), *what kind* of failure it
//! was (so callers can pick a status or message without matching on text), and a short static
//! reason for logs. It never carries a copy of the offending input: field values are client
//! controlled and must not be echoed into responses or logs by accident.

use std::fmt;

/// The broad class of a [`ParseError`], for callers that answer differently per class.
///
/// For example the server answers 400 both for a malformed `Upload-Checksum` and for one naming
/// an algorithm it does not support, but with a different problem `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ParseErrorKind {
    /// The value does not match the header's grammar.
    Syntax,
    /// The value is well formed but names a checksum/digest algorithm this crate does not know
    /// (TUS 1.0 §Checksum: the server answers `400 Bad Request`).
    UnknownAlgorithm,
    /// A number is syntactically valid but does not fit in a `u64`.
    Overflow,
    /// A key occurs twice where keys must be unique (TUS 1.0 §Upload-Metadata).
    Duplicate,
}

/// A header field value that could not be parsed.
///
/// `Display` renders e.g. `invalid Upload-Offset at byte 0: expected ASCII digit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    header: &'static str,
    index: usize,
    kind: ParseErrorKind,
    reason: &'static str,
}

impl ParseError {
    /// Builds an error. `index` is a byte offset into the field value.
    pub(crate) const fn new(header: &'static str, index: usize, kind: ParseErrorKind, reason: &'static str) -> Self {
        Self { header, index, kind, reason }
    }

    /// A [`ParseErrorKind::Syntax`] error.
    pub(crate) const fn syntax(header: &'static str, index: usize, reason: &'static str) -> Self {
        Self::new(header, index, ParseErrorKind::Syntax, reason)
    }

    /// Converts an `sfv` error, keeping its byte index when it has one.
    pub(crate) fn from_sfv(header: &'static str, err: &sfv::Error) -> Self {
        Self::syntax(header, err.index().unwrap_or(0), "not a valid structured field value (RFC 9651)")
    }

    /// The canonical name of the header whose value failed to parse, e.g. `"Upload-Offset"`.
    pub fn header(&self) -> &'static str {
        self.header
    }

    /// The byte index into the field value at which parsing failed.
    pub fn index(&self) -> usize {
        self.index
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ParseErrorKind {
        self.kind
    }

    /// A short, static, human-readable reason (never contains input bytes).
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} at byte {}: {}", self.header, self.index, self.reason)
    }
}

impl std::error::Error for ParseError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_header_index_and_reason() {
        let e = ParseError::syntax("Upload-Offset", 0, "expected ASCII digit");
        assert_eq!(e.to_string(), "invalid Upload-Offset at byte 0: expected ASCII digit");
        assert_eq!(e.header(), "Upload-Offset");
        assert_eq!(e.index(), 0);
        assert_eq!(e.kind(), ParseErrorKind::Syntax);
    }
}
