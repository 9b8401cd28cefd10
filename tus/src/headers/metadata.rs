//! Owns `Upload-Metadata` (TUS 1.0 §Upload-Metadata): ordered key/value pairs whose values are
//! arbitrary bytes carried as base64.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use crate::error::{ParseError, ParseErrorKind};

const NAME: &str = "Upload-Metadata";

/// `Upload-Metadata`: comma-separated key/value pairs (TUS 1.0 §Upload-Metadata).
///
/// Grammar, as this crate reads the spec:
///
/// ```text
/// Upload-Metadata = [ pair *( OWS "," OWS pair ) ]
/// pair            = key [ SP value ]
/// key             = 1*( %x21-2B / %x2D-7E )   ; visible ASCII except ","; no spaces
/// value           = base64                    ; RFC 4648 §4 standard alphabet, canonical padding, may be empty
/// ```
///
/// - `key` alone means "no value" ([`None`]); `key ` followed by an empty value means an empty
///   value (`Some(vec![])`). Both are kept and re-encoded as received.
/// - Keys must be unique: a repeated key is an error of kind [`ParseErrorKind::Duplicate`].
/// - Pair order is preserved.
/// - The one leniency: optional whitespace (SP / HTAB) around the commas is ignored. Whitespace
///   inside a pair (two spaces between key and value, a space inside the base64) is an error.
/// - The empty field value parses to empty metadata, and empty metadata displays as `""`.
///
/// Values are bytes, not text: use [`UploadMetadata::get_str`] for UTF-8 values, and sanitise
/// before echoing a value into another header (the spec warns about header smuggling).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UploadMetadata(Vec<(String, Option<Vec<u8>>)>);

impl UploadMetadata {
    /// The canonical header name.
    pub const NAME: &'static str = NAME;

    /// Empty metadata.
    pub fn new() -> Self {
        Self(Vec::new())
    }

    /// The pairs in the order they were received or inserted.
    pub fn pairs(&self) -> &[(String, Option<Vec<u8>>)] {
        &self.0
    }

    /// Looks a key up: `None` if absent, `Some(None)` if present without a value,
    /// `Some(Some(bytes))` otherwise.
    pub fn get(&self, key: &str) -> Option<Option<&[u8]>> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_deref())
    }

    /// The value of `key` as UTF-8 text; `None` if the key is absent, has no value, or its value
    /// is not valid UTF-8. An empty value gives `Some("")`.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).flatten().and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Appends a pair. Fails with [`ParseErrorKind::Syntax`] if `key` is not a valid key (empty,
    /// non-ASCII, contains a space, comma or control character) and with
    /// [`ParseErrorKind::Duplicate`] if it is already present; the metadata is unchanged then.
    pub fn insert(&mut self, key: impl Into<String>, value: Option<Vec<u8>>) -> Result<(), ParseError> {
        let key = key.into();
        check_key(&key, 0)?;
        if self.get(&key).is_some() {
            return Err(ParseError::new(NAME, 0, ParseErrorKind::Duplicate, "duplicate key"));
        }
        self.0.push((key, value));
        Ok(())
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Length in bytes of the encoded header value (`self.to_string().len()`), without
    /// allocating; useful for enforcing a metadata size limit.
    pub fn encoded_len(&self) -> usize {
        let commas = self.0.len().saturating_sub(1);
        commas + self.0.iter().map(|(k, v)| k.len() + v.as_ref().map_or(0, |v| 1 + v.len().div_ceil(3) * 4)).sum::<usize>()
    }

    /// Consumes the metadata, returning its pairs.
    pub fn into_pairs(self) -> Vec<(String, Option<Vec<u8>>)> {
        self.0
    }
}

fn is_ows(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// Validates a key; `base` is the key's byte offset in the field value.
fn check_key(key: &str, base: usize) -> Result<(), ParseError> {
    if key.is_empty() {
        return Err(ParseError::syntax(NAME, base, "empty key"));
    }
    match key.bytes().position(|b| !(0x21..=0x7e).contains(&b) || b == b',') {
        Some(i) => Err(ParseError::syntax(NAME, base + i, "key must be visible ASCII without spaces or commas")),
        None => Ok(()),
    }
}

impl FromStr for UploadMetadata {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        let mut out = UploadMetadata::new();
        if s.trim_matches(is_ows).is_empty() {
            return Ok(out);
        }
        let mut base = 0;
        for elem in s.split(',') {
            let elem_base = base;
            base += elem.len() + 1;

            let trimmed = elem.trim_start_matches(is_ows);
            let kbase = elem_base + (elem.len() - trimmed.len());
            let key_end = trimmed.find(is_ows).unwrap_or(trimmed.len());
            let (key, rest) = trimmed.split_at(key_end);
            check_key(key, kbase)?;

            let value = if rest.is_empty() {
                None
            } else if let Some(v) = rest.strip_prefix(' ') {
                let v = v.trim_end_matches(is_ows);
                let vbase = kbase + key_end + 1;
                if let Some(i) = v.bytes().position(|b| !(b.is_ascii_alphanumeric() || b"+/=".contains(&b))) {
                    return Err(ParseError::syntax(NAME, vbase + i, "value is not base64"));
                }
                match STANDARD.decode(v) {
                    Ok(bytes) => Some(bytes),
                    Err(e) => {
                        let i = match e {
                            base64::DecodeError::InvalidByte(i, _) | base64::DecodeError::InvalidLastSymbol(i, _) => i,
                            _ => v.len(),
                        };
                        return Err(ParseError::syntax(NAME, vbase + i, "value is not canonical padded base64"));
                    }
                }
            } else if rest.trim_end_matches(is_ows).is_empty() {
                // Trailing tab(s) before a comma: whitespace around the separator.
                None
            } else {
                return Err(ParseError::syntax(NAME, kbase + key_end, "key and value must be separated by one space"));
            };

            if out.get(key).is_some() {
                return Err(ParseError::new(NAME, kbase, ParseErrorKind::Duplicate, "duplicate key"));
            }
            out.0.push((key.to_owned(), value));
        }
        Ok(out)
    }
}

impl fmt::Display for UploadMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(k)?;
            if let Some(v) = v {
                f.write_str(" ")?;
                f.write_str(&STANDARD.encode(v))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(s: &str) -> UploadMetadata {
        s.parse().unwrap()
    }

    fn err(s: &str) -> ParseError {
        s.parse::<UploadMetadata>().unwrap_err()
    }

    #[test]
    fn parses_the_spec_example_in_order() {
        let m = md("filename d29ybGRfZG9taW5hdGlvbl9wbGFuLnBkZg==,is_confidential");
        assert_eq!(m.len(), 2);
        assert_eq!(m.pairs()[0].0, "filename");
        assert_eq!(m.get_str("filename"), Some("world_domination_plan.pdf"));
        assert_eq!(m.get("is_confidential"), Some(None));
        assert_eq!(m.get_str("is_confidential"), None);
        assert_eq!(m.get("absent"), None);
        assert_eq!(m.to_string(), "filename d29ybGRfZG9taW5hdGlvbl9wbGFuLnBkZg==,is_confidential");
    }

    #[test]
    fn empty_value_is_distinct_from_no_value() {
        let m = md("a ,b");
        assert_eq!(m.get("a"), Some(Some(&b""[..])));
        assert_eq!(m.get_str("a"), Some(""));
        assert_eq!(m.get("b"), Some(None));
        assert_eq!(m.to_string(), "a ,b");
        assert_eq!(md(&m.to_string()), m);
    }

    #[test]
    fn empty_header_is_empty_metadata() {
        assert!(md("").is_empty());
        assert_eq!(UploadMetadata::new().to_string(), "");
        assert_eq!(UploadMetadata::new().encoded_len(), 0);
    }

    #[test]
    fn whitespace_around_commas_is_tolerated() {
        let m = md("a YQ==, b Yg== ,\tc");
        assert_eq!(m.get("a"), Some(Some(&b"a"[..])));
        assert_eq!(m.get("b"), Some(Some(&b"b"[..])));
        assert_eq!(m.get("c"), Some(None));
        assert_eq!(m.to_string(), "a YQ==,b Yg==,c");
    }

    #[test]
    fn rejects_bad_input() {
        let e = err("a YQ==,a Yg==");
        assert_eq!(e.kind(), ParseErrorKind::Duplicate);
        assert_eq!(e.index(), 7);
        assert_eq!(err("a,a").kind(), ParseErrorKind::Duplicate);
        for (s, idx) in [
            (",a", 0),
            ("a,", 2),
            ("a,,b", 2),
            ("a YQ=", 5),        // bad padding
            ("a YQ", 4),         // missing padding
            ("a YR==", 3),       // non-canonical trailing bits
            ("a Y Q==", 3),      // space inside the value
            ("a  YQ==", 2),      // two spaces
            ("a YQ==\u{e9}", 6), // non-ASCII in value
            ("a -_8=", 2),       // URL-safe alphabet
            ("k\u{e9} YQ==", 1), // non-ASCII key
            ("a\u{1}b YQ==", 1), // control character in key
            ("a\tYQ==", 1),      // tab is not the separator
        ] {
            let e = err(s);
            assert_eq!(e.kind(), ParseErrorKind::Syntax, "{s:?}");
            assert_eq!(e.index(), idx, "{s:?}: {e}");
            assert_eq!(e.header(), "Upload-Metadata");
        }
    }

    #[test]
    fn insert_checks_keys_and_duplicates() {
        let mut m = UploadMetadata::new();
        m.insert("filename", Some(b"r\xe9sum\xe9.pdf".to_vec())).unwrap();
        m.insert("flag", None).unwrap();
        m.insert("empty", Some(vec![])).unwrap();
        assert_eq!(m.insert("flag", Some(vec![1])).unwrap_err().kind(), ParseErrorKind::Duplicate);
        for bad in ["", "a b", "a,b", "\u{e9}", "a\nb"] {
            assert_eq!(m.insert(bad, None).unwrap_err().kind(), ParseErrorKind::Syntax, "{bad:?}");
        }
        assert_eq!(m.len(), 3);
        assert_eq!(m.get_str("filename"), None); // not UTF-8
        assert_eq!(md(&m.to_string()), m);
    }

    #[test]
    fn round_trips_and_encoded_len() {
        let mut m = UploadMetadata::new();
        for (i, n) in [0usize, 1, 2, 3, 4, 5, 100].into_iter().enumerate() {
            m.insert(format!("k{i}"), Some((0..n).map(|b| (b * 37) as u8).collect())).unwrap();
        }
        m.insert("~!#$%&'*+-./:;<=>?@[]^_`{|}", None).unwrap();
        let s = m.to_string();
        assert_eq!(m.encoded_len(), s.len());
        assert_eq!(md(&s), m);
        let one = md("x");
        assert_eq!(one.encoded_len(), 1);
        assert_eq!(one.clone().into_pairs(), vec![("x".to_owned(), None)]);
    }
}
