//! Owns the structured-field headers of the IETF resumable-upload draft
//! (draft-ietf-httpbis-resumable-upload, "RUFH"): `Upload-Complete`, `Upload-Limit`, the draft's
//! `Upload-Offset` and `Upload-Length` (Integers, unlike TUS 1.0's plain digits) and
//! `Upload-Draft-Interop-Version`. All are RFC 9651 structured fields, parsed and serialised with
//! the `sfv` crate.

use std::fmt;
use std::str::FromStr;

use sfv::{key_ref, BareItem, DictSerializer, Dictionary, Integer, Item, ItemSerializer, ListEntry, Parser};

use crate::error::ParseError;

/// `Upload-Complete`: whether this request carries the end of the upload
/// (draft-ietf-httpbis-resumable-upload §Upload-Complete).
///
/// Grammar: an RFC 9651 Item whose bare item is a Boolean, `?1` or `?0`. Parameters are ignored
/// (RFC 9651 §3.1.2). `Display` writes `?1` / `?0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct UploadComplete(pub bool);

impl UploadComplete {
    /// The canonical header name.
    pub const NAME: &'static str = "Upload-Complete";
}

impl FromStr for UploadComplete {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        let item: Item = Parser::new(s).parse_item().map_err(|e| ParseError::from_sfv(Self::NAME, &e))?;
        match item.bare_item {
            BareItem::Boolean(b) => Ok(UploadComplete(b)),
            _ => Err(ParseError::syntax(Self::NAME, 0, "expected a boolean ?0 or ?1")),
        }
    }
}

impl fmt::Display for UploadComplete {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&ItemSerializer::new().bare_item(self.0).finish())
    }
}

/// `Upload-Limit`: the server's limits for uploads (draft-ietf-httpbis-resumable-upload
/// §Upload-Limit).
///
/// Grammar: an RFC 9651 Dictionary with the members `max-size`, `min-size`, `max-append-size`,
/// `min-append-size` (bytes), `expires` (seconds; interop version 6, draft -05) and `max-age`
/// (seconds; the same limit renamed in draft -06), each a non-negative Integer. Unknown
/// members and parameters are ignored; a known member that is not a non-negative Integer is an
/// error. `Display` writes the present members in the order above, e.g.
/// `max-size=1000000, max-age=86400`; no member gives `""`.
///
/// RFC 9651 Integers have at most 15 digits, so a value above 999 999 999 999 999 is written
/// as that maximum (about 1 PB / 31 million years); parsed values always round-trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct UploadLimit {
    /// `max-size`: the largest upload length accepted, in bytes.
    pub max_size: Option<u64>,
    /// `min-size`: the smallest upload length accepted, in bytes.
    pub min_size: Option<u64>,
    /// `max-append-size`: the largest body of one append request, in bytes.
    pub max_append_size: Option<u64>,
    /// `min-append-size`: the smallest body of a non-final append request, in bytes.
    pub min_append_size: Option<u64>,
    /// `expires`: seconds until an upload may expire (draft -05, interop version 6).
    pub expires: Option<u64>,
    /// `max-age`: remaining lifetime of the upload resource in seconds (draft -06 and later).
    pub max_age: Option<u64>,
}

impl UploadLimit {
    /// The canonical header name.
    pub const NAME: &'static str = "Upload-Limit";

    fn members(&self) -> [(&'static str, Option<u64>); 6] {
        [
            ("max-size", self.max_size),
            ("min-size", self.min_size),
            ("max-append-size", self.max_append_size),
            ("min-append-size", self.min_append_size),
            ("expires", self.expires),
            ("max-age", self.max_age),
        ]
    }
}

impl FromStr for UploadLimit {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        let dict: Dictionary = Parser::new(s).parse_dictionary().map_err(|e| ParseError::from_sfv(Self::NAME, &e))?;
        let get = |name: &str| -> Result<Option<u64>, ParseError> {
            match dict.get(name) {
                None => Ok(None),
                Some(ListEntry::Item(Item { bare_item: BareItem::Integer(i), .. })) => {
                    u64::try_from(i64::from(*i)).map(Some).map_err(|_| ParseError::syntax(Self::NAME, 0, "limit must not be negative"))
                }
                Some(_) => Err(ParseError::syntax(Self::NAME, 0, "limit must be an integer")),
            }
        };
        Ok(UploadLimit {
            max_size: get("max-size")?,
            min_size: get("min-size")?,
            max_append_size: get("max-append-size")?,
            min_append_size: get("min-append-size")?,
            expires: get("expires")?,
            max_age: get("max-age")?,
        })
    }
}

impl fmt::Display for UploadLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ser = DictSerializer::new();
        for (name, value) in self.members() {
            if let Some(v) = value {
                let v = Integer::try_from(v).unwrap_or(Integer::MAX);
                ser.bare_item(key_ref(name), v);
            }
        }
        f.write_str(ser.finish().as_deref().unwrap_or(""))
    }
}

/// Parses an RFC 9651 Item whose bare item is a non-negative Integer (parameters ignored).
fn sf_non_negative(s: &str, name: &'static str) -> Result<u64, ParseError> {
    let item: Item = Parser::new(s).parse_item().map_err(|e| ParseError::from_sfv(name, &e))?;
    match item.bare_item {
        BareItem::Integer(i) => u64::try_from(i64::from(i)).map_err(|_| ParseError::syntax(name, 0, "must not be negative")),
        _ => Err(ParseError::syntax(name, 0, "expected an integer")),
    }
}

fn sf_integer(f: &mut fmt::Formatter<'_>, v: u64) -> fmt::Result {
    f.write_str(&ItemSerializer::new().bare_item(Integer::try_from(v).unwrap_or(Integer::MAX)).finish())
}

macro_rules! sf_count {
    ($(#[$doc:meta])* $ty:ident, $name:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $ty(pub u64);

        impl $ty {
            /// The canonical header name.
            pub const NAME: &'static str = $name;
        }

        impl FromStr for $ty {
            type Err = ParseError;

            fn from_str(s: &str) -> Result<Self, ParseError> {
                sf_non_negative(s, Self::NAME).map($ty)
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                sf_integer(f, self.0)
            }
        }
    };
}

sf_count!(
    /// The draft's `Upload-Offset` (draft-ietf-httpbis-resumable-upload §Offset): bytes of the
    /// representation processed so far.
    ///
    /// Grammar: an RFC 9651 Item whose bare item is a non-negative Integer (at most 15 digits,
    /// so at most 999 999 999 999 999); parameters are ignored. Unlike TUS 1.0's `Upload-Offset`
    /// (1*DIGIT, up to `u64::MAX`), `"-0"` is 0 and `"1;a=b"` is 1. `Display` writes the digits;
    /// a value above the RFC 9651 maximum is written as that maximum.
    RufhOffset,
    "Upload-Offset"
);

sf_count!(
    /// The draft's `Upload-Length` (draft-ietf-httpbis-resumable-upload §Length, since -05):
    /// the number of bytes of the whole representation. Same grammar as [`RufhOffset`].
    RufhLength,
    "Upload-Length"
);

sf_count!(
    /// `Upload-Draft-Interop-Version` (draft-ietf-httpbis-resumable-upload §Draft Version
    /// Identification): the iteration of the draft a client implements, e.g. `6` for draft -05.
    /// An RFC 9651 Integer, same grammar as [`RufhOffset`]; which values ferry serves is
    /// `ferry_tus::InteropVersion`'s business.
    UploadDraftInteropVersion,
    "Upload-Draft-Interop-Version"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete() {
        assert_eq!("?1".parse(), Ok(UploadComplete(true)));
        assert_eq!("?0".parse(), Ok(UploadComplete(false)));
        assert_eq!("?1;x=2".parse(), Ok(UploadComplete(true)));
        for b in [true, false] {
            let x = UploadComplete(b);
            assert_eq!(x.to_string().parse(), Ok(x));
        }
        assert_eq!(UploadComplete(true).to_string(), "?1");
        assert_eq!(UploadComplete(false).to_string(), "?0");
        for s in ["", "1", "0", "true", "?2", "?", "?1,?0", "\"?1\"", "?1 ?0", ":Pw==:"] {
            let e = s.parse::<UploadComplete>().unwrap_err();
            assert_eq!(e.header(), "Upload-Complete", "{s:?}");
        }
    }

    #[test]
    fn limit_round_trip() {
        let all = UploadLimit {
            max_size: Some(1 << 40),
            min_size: Some(0),
            max_append_size: Some(64 << 20),
            min_append_size: Some(5 << 20),
            expires: Some(86_400),
            max_age: None,
        };
        let s = all.to_string();
        assert_eq!(s, "max-size=1099511627776, min-size=0, max-append-size=67108864, min-append-size=5242880, expires=86400");
        assert_eq!(s.parse(), Ok(all));
        let none = UploadLimit::default();
        assert_eq!(none.to_string(), "");
        assert_eq!("".parse(), Ok(none));
        let some = UploadLimit { max_size: Some(10), ..UploadLimit::default() };
        assert_eq!(some.to_string().parse(), Ok(some));
    }

    #[test]
    fn limit_parse_leniency_and_errors() {
        let x: UploadLimit = "expires=5, foo=bar, max-size=7;p=1".parse().unwrap();
        assert_eq!(x, UploadLimit { expires: Some(5), max_size: Some(7), ..Default::default() });
        for s in ["max-size=-1", "max-size=1.5", "max-size=\"1\"", "max-size=(1 2)", "max-size", "max-size=1,", "MAX-SIZE=1"] {
            assert!(s.parse::<UploadLimit>().is_err(), "{s:?}");
        }
        // Values beyond RFC 9651's 15 digits are written as the maximum Integer.
        let big = UploadLimit { max_size: Some(u64::MAX), ..Default::default() };
        assert_eq!(big.to_string(), "max-size=999999999999999");
    }

    #[test]
    fn limit_max_age() {
        let x: UploadLimit = "max-size=10, max-age=3600".parse().unwrap();
        assert_eq!(x, UploadLimit { max_size: Some(10), max_age: Some(3600), ..Default::default() });
        assert_eq!(x.to_string(), "max-size=10, max-age=3600");
        assert!("max-age=-1".parse::<UploadLimit>().is_err());
    }

    #[test]
    fn sf_counts() {
        assert_eq!("0".parse(), Ok(RufhOffset(0)));
        assert_eq!("1048576".parse(), Ok(RufhOffset(1_048_576)));
        assert_eq!("5;x=1".parse(), Ok(RufhLength(5)));
        assert_eq!("-0".parse(), Ok(RufhLength(0)));
        assert_eq!("999999999999999".parse(), Ok(RufhOffset(999_999_999_999_999)));
        assert_eq!("6".parse(), Ok(UploadDraftInteropVersion(6)));
        for s in ["", "-1", "1.5", "?1", "\"1\"", "1000000000000000", "1 2", "1,2", "+1", "0x10", "abc"] {
            let e = s.parse::<RufhOffset>().unwrap_err();
            assert_eq!(e.header(), "Upload-Offset", "{s:?}");
            assert_eq!(s.parse::<RufhLength>().unwrap_err().header(), "Upload-Length");
            assert_eq!(s.parse::<UploadDraftInteropVersion>().unwrap_err().header(), "Upload-Draft-Interop-Version");
        }
        for v in [0u64, 1, 42, 999_999_999_999_999] {
            assert_eq!(RufhOffset(v).to_string().parse(), Ok(RufhOffset(v)));
        }
        assert_eq!(RufhLength(u64::MAX).to_string(), "999999999999999");
    }
}
