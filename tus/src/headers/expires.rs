//! Owns `Upload-Expires` (TUS 1.0 §Expiration): when an unfinished upload expires.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::ParseError;

const NAME: &str = "Upload-Expires";

/// The last second `httpdate` can format: 9999-12-31T23:59:59Z.
const MAX_SECS: u64 = 253_402_300_799;

/// `Upload-Expires`: the time after which the unfinished upload expires (TUS 1.0
/// §Upload-Expires). The value is an HTTP date (RFC 9110 §5.6.7).
///
/// Parsing accepts the three formats RFC 9110 §5.6.7 says recipients MUST accept (IMF-fixdate,
/// obsolete RFC 850, asctime), years 1970–9999. `Display` always writes IMF-fixdate, e.g.
/// `Wed, 25 Jun 2025 16:00:00 GMT`, truncating sub-second precision, so the round trip holds
/// at whole-second precision. Times before 1970 or after year 9999 are clamped when displayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UploadExpires(pub SystemTime);

impl UploadExpires {
    /// The canonical header name.
    pub const NAME: &'static str = NAME;
}

impl FromStr for UploadExpires {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        httpdate::parse_http_date(s).map(UploadExpires).map_err(|_| ParseError::syntax(NAME, 0, "not an HTTP date (RFC 9110 §5.6.7)"))
    }
}

impl fmt::Display for UploadExpires {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()).min(MAX_SECS);
        f.write_str(&httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> UploadExpires {
        UploadExpires(UNIX_EPOCH + Duration::from_secs(secs))
    }

    #[test]
    fn imf_fixdate_round_trip() {
        for secs in [0, 1, 784_111_777, 1_750_867_200, MAX_SECS] {
            let x = at(secs);
            assert_eq!(x.to_string().parse::<UploadExpires>().unwrap(), x);
        }
        assert_eq!(at(784_111_777).to_string(), "Sun, 06 Nov 1994 08:49:37 GMT");
    }

    #[test]
    fn obsolete_formats_accepted() {
        let x = at(784_111_777);
        assert_eq!("Sunday, 06-Nov-94 08:49:37 GMT".parse(), Ok(x));
        assert_eq!("Sun Nov  6 08:49:37 1994".parse(), Ok(x));
    }

    #[test]
    fn display_never_panics_and_truncates() {
        assert_eq!(UploadExpires(UNIX_EPOCH - Duration::from_secs(5)).to_string(), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(at(u64::MAX / 4).to_string(), "Fri, 31 Dec 9999 23:59:59 GMT");
        let frac = UploadExpires(UNIX_EPOCH + Duration::from_millis(1500));
        assert_eq!(frac.to_string().parse(), Ok(at(1)));
    }

    #[test]
    fn rejects() {
        for s in ["", "0", "tomorrow", "Sun, 06 Nov 1994 08:49:37", "2025-06-25T16:00:00Z", "Sun, 32 Nov 1994 08:49:37 GMT"] {
            let e = s.parse::<UploadExpires>().unwrap_err();
            assert_eq!(e.header(), "Upload-Expires", "{s:?}");
        }
    }
}
