//! Owns `Upload-Concat` (TUS 1.0 §Concatenation): whether an upload is a partial upload or the
//! final concatenation of partial ones.

use std::fmt;
use std::str::FromStr;

use crate::error::ParseError;

const NAME: &str = "Upload-Concat";

/// `Upload-Concat` (TUS 1.0 §Upload-Concat).
///
/// Grammar:
///
/// ```text
/// Upload-Concat = "partial" / "final;" url *( 1*SP url )
/// url           = 1*( %x21-7E )    ; an absolute or relative URL, no spaces
/// ```
///
/// `partial` and `final` are case-sensitive. Leniency: spaces before the first URL and runs of
/// spaces between URLs are accepted (tusd does the same); `Display` writes `final;a b`. URLs are
/// stored verbatim. Each URL must contain a non-empty path segment (the upload id, see
/// [`UploadConcat::final_ids`]); otherwise it is a syntax error.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UploadConcat {
    /// This upload is a partial upload, to be concatenated later.
    Partial,
    /// This upload is the concatenation of these partial uploads, in order (at least one).
    Final(Vec<String>),
}

impl UploadConcat {
    /// The canonical header name.
    pub const NAME: &'static str = NAME;

    /// For a final upload, the upload id named by each URL, in order: the last non-empty path
    /// segment once any `#fragment` and `?query` are removed (`https://h/files/abc?x=1` → `abc`).
    /// Empty for [`UploadConcat::Partial`].
    pub fn final_ids(&self) -> Vec<String> {
        match self {
            UploadConcat::Partial => Vec::new(),
            UploadConcat::Final(urls) => urls.iter().map(|u| upload_id(u).unwrap_or_default().to_owned()).collect(),
        }
    }
}

/// The last non-empty path segment of `url` (query and fragment removed).
fn upload_id(url: &str) -> Option<&str> {
    let url = url.split('#').next().unwrap_or("");
    let url = url.split('?').next().unwrap_or("");
    url.rsplit('/').find(|seg| !seg.is_empty())
}

impl FromStr for UploadConcat {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        if s == "partial" {
            return Ok(UploadConcat::Partial);
        }
        let Some(list) = s.strip_prefix("final;") else {
            return Err(ParseError::syntax(NAME, 0, "expected \"partial\" or \"final;\""));
        };
        let base = "final;".len();
        let mut urls = Vec::new();
        let mut offset = base;
        for url in list.split(' ') {
            let start = offset;
            offset += url.len() + 1;
            if url.is_empty() {
                continue;
            }
            if let Some(i) = url.bytes().position(|b| !(0x21..=0x7e).contains(&b)) {
                return Err(ParseError::syntax(NAME, start + i, "invalid character in URL"));
            }
            if upload_id(url).is_none() {
                return Err(ParseError::syntax(NAME, start, "URL names no upload"));
            }
            urls.push(url.to_owned());
        }
        if urls.is_empty() {
            return Err(ParseError::syntax(NAME, s.len(), "expected at least one partial upload URL"));
        }
        Ok(UploadConcat::Final(urls))
    }
}

impl fmt::Display for UploadConcat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UploadConcat::Partial => f.write_str("partial"),
            UploadConcat::Final(urls) => {
                f.write_str("final;")?;
                for (i, u) in urls.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" ")?;
                    }
                    f.write_str(u)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(x: UploadConcat) {
        assert_eq!(x.to_string().parse::<UploadConcat>().unwrap(), x);
    }

    #[test]
    fn partial() {
        assert_eq!("partial".parse(), Ok(UploadConcat::Partial));
        rt(UploadConcat::Partial);
        assert!(UploadConcat::Partial.final_ids().is_empty());
    }

    #[test]
    fn spec_example_final() {
        let c: UploadConcat = "final;/files/a /files/b".parse().unwrap();
        assert_eq!(c, UploadConcat::Final(vec!["/files/a".into(), "/files/b".into()]));
        assert_eq!(c.final_ids(), ["a", "b"]);
        assert_eq!(c.to_string(), "final;/files/a /files/b");
        rt(c);
    }

    #[test]
    fn ids_from_absolute_urls_queries_and_fragments() {
        let c: UploadConcat = "final;https://tus.example.org/files/abc?x=1#f https://h/files/def/ xyz g/h#a/b?c".parse().unwrap();
        assert_eq!(c.final_ids(), ["abc", "def", "xyz", "h"]);
        rt(c);
    }

    #[test]
    fn lenient_spaces_between_urls() {
        let c: UploadConcat = "final; /files/a   /files/b".parse().unwrap();
        assert_eq!(c.final_ids(), ["a", "b"]);
        assert_eq!(c.to_string(), "final;/files/a /files/b");
    }

    #[test]
    fn rejects() {
        for s in [
            "",
            "Partial",
            "partial ",
            " partial",
            "final",
            "final;",
            "final; ",
            "Final;/a",
            "final:/a",
            "final;/a\t/b",
            "final;/files/\u{e9}",
            "final;/",
            "final;?x=/a",
            "final;#/a",
            "partial;/a",
        ] {
            assert!(s.parse::<UploadConcat>().is_err(), "{s:?}");
        }
    }
}
