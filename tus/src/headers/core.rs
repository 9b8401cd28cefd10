//! Owns the core TUS 1.0 headers: `Upload-Offset`, `Upload-Length`, `Upload-Defer-Length` and
//! `Tus-Resumable` (TUS 1.0 §Headers and §Creation).

use std::fmt;
use std::str::FromStr;

use super::{first_non_tchar, parse_u64_digits};
use crate::error::ParseError;

/// The protocol version this crate speaks, as sent in `Tus-Resumable` and `Tus-Version`.
pub const TUS_VERSION: &str = "1.0.0";

macro_rules! u64_header {
    ($(#[$doc:meta])* $name:ident, $header:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub u64);

        impl $name {
            /// The canonical header name.
            pub const NAME: &'static str = $header;
        }

        impl FromStr for $name {
            type Err = ParseError;
            fn from_str(s: &str) -> Result<Self, ParseError> {
                parse_u64_digits(s, $header).map($name)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

u64_header!(
    /// `Upload-Offset`: a byte offset within the upload (TUS 1.0 §Upload-Offset).
    ///
    /// Grammar: `1*DIGIT` — "The value MUST be a non-negative integer". Parsed with
    /// [`parse_u64_digits`]: ASCII digits only, leading zeros accepted, values above `u64::MAX`
    /// rejected with [`crate::ParseErrorKind::Overflow`].
    UploadOffset,
    "Upload-Offset"
);

u64_header!(
    /// `Upload-Length`: the size of the entire upload in bytes (TUS 1.0 §Upload-Length).
    ///
    /// Grammar: `1*DIGIT`, same rules as [`UploadOffset`].
    UploadLength,
    "Upload-Length"
);

/// `Upload-Defer-Length: 1`: the upload's length is not known yet (TUS 1.0 §Creation,
/// `creation-defer-length`).
///
/// Grammar: exactly the value `1`; "If the `Upload-Defer-Length` header contains any other value
/// than `1` the server should return a `400 Bad Request` status".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct UploadDeferLength;

impl UploadDeferLength {
    /// The canonical header name.
    pub const NAME: &'static str = "Upload-Defer-Length";
}

impl FromStr for UploadDeferLength {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        if s == "1" {
            Ok(UploadDeferLength)
        } else {
            let index = if s.starts_with('1') { 1 } else { 0 };
            Err(ParseError::syntax(Self::NAME, index, "the only allowed value is 1"))
        }
    }
}

impl fmt::Display for UploadDeferLength {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("1")
    }
}

/// `Tus-Resumable`: the protocol version used by the client or server (TUS 1.0 §Tus-Resumable).
///
/// Grammar: a non-empty RFC 9110 `token` (the spec's versions look like `1.0.0`). Any version
/// parses; use [`TusResumable::is_supported`] to decide whether to answer `412 Precondition
/// Failed`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TusResumable(pub String);

impl TusResumable {
    /// The canonical header name.
    pub const NAME: &'static str = "Tus-Resumable";

    /// The version this crate speaks, [`TUS_VERSION`].
    pub fn current() -> Self {
        TusResumable(TUS_VERSION.to_owned())
    }

    /// Whether this is exactly [`TUS_VERSION`] (`"1.0.0"`).
    pub fn is_supported(&self) -> bool {
        self.0 == TUS_VERSION
    }
}

impl Default for TusResumable {
    fn default() -> Self {
        Self::current()
    }
}

impl FromStr for TusResumable {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        if s.is_empty() {
            return Err(ParseError::syntax(Self::NAME, 0, "expected a version token"));
        }
        if let Some(i) = first_non_tchar(s) {
            return Err(ParseError::syntax(Self::NAME, i, "invalid character in version token"));
        }
        Ok(TusResumable(s.to_owned()))
    }
}

impl fmt::Display for TusResumable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ParseErrorKind;

    fn rt<T: FromStr<Err = ParseError> + fmt::Display + PartialEq + fmt::Debug>(x: T) {
        assert_eq!(x.to_string().parse::<T>().unwrap(), x);
    }

    #[test]
    fn offset_and_length_round_trip() {
        for n in [0, 1, 9, 10, 4096, u64::from(u32::MAX), u64::MAX - 1, u64::MAX] {
            rt(UploadOffset(n));
            rt(UploadLength(n));
        }
        assert_eq!("007".parse::<UploadOffset>(), Ok(UploadOffset(7)));
    }

    #[test]
    fn offset_is_strict() {
        for s in ["", "+5", "-1", " 5", "5 ", "5,6", "five"] {
            let e = s.parse::<UploadOffset>().unwrap_err();
            assert_eq!(e.header(), "Upload-Offset");
            assert_eq!(e.kind(), ParseErrorKind::Syntax, "{s:?}");
        }
        assert_eq!("".parse::<UploadOffset>().unwrap_err().to_string(), "invalid Upload-Offset at byte 0: expected ASCII digit");
        for s in ["18446744073709551616", "999999999999999999999999999999"] {
            let e = s.parse::<UploadLength>().unwrap_err();
            assert_eq!(e.header(), "Upload-Length");
            assert_eq!(e.kind(), ParseErrorKind::Overflow);
        }
    }

    #[test]
    fn defer_length_only_one() {
        rt(UploadDeferLength);
        assert_eq!("1".parse::<UploadDeferLength>(), Ok(UploadDeferLength));
        for s in ["", "0", "2", "01", "1 ", " 1", "true", "11"] {
            assert!(s.parse::<UploadDeferLength>().is_err(), "{s:?}");
        }
    }

    #[test]
    fn tus_resumable() {
        let v: TusResumable = "1.0.0".parse().unwrap();
        assert!(v.is_supported());
        rt(v);
        let old: TusResumable = "0.2.2".parse().unwrap();
        assert!(!old.is_supported());
        rt(old);
        assert!(TusResumable::current().is_supported());
        for s in ["", "1.0.0 ", "1,0", "v 1", "\u{e9}"] {
            assert!(s.parse::<TusResumable>().is_err(), "{s:?}");
        }
    }
}
