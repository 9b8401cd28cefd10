//! Which bytes a `GET` or `HEAD` of a finished file answers (RFC 9110 §13 conditional
//! requests, §14 range requests), decided from the request's header values and the file's
//! validators with no I/O, and the `Content-Range` that goes with the answer — so a 416 always
//! carries `bytes */N` (RFC 9110 §15.5.17) and a 206 `bytes first-last/N` inside the file.

use crate::headers::range::{ByteRangeSpec, ByteRanges};

/// What a GET (and the HEAD that mirrors it) will send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeOutcome {
    /// 200 with every byte.
    Whole,
    /// 206 with bytes `start..=end_inclusive` (`start <= end_inclusive < len`).
    #[allow(missing_docs)]
    Partial { start: u64, end_inclusive: u64 },
    /// 304: `If-None-Match` matched, or (without it) `If-Modified-Since` is not older than
    /// the file.
    NotModified,
    /// 412: `If-Match` does not name the file, or (without it) the file is newer than
    /// `If-Unmodified-Since`.
    PreconditionFailed,
    /// 416: no byte of the file is in the range.
    Unsatisfiable,
}

impl RangeOutcome {
    /// The response status.
    pub fn status(self) -> u16 {
        match self {
            RangeOutcome::Whole => 200,
            RangeOutcome::Partial { .. } => 206,
            RangeOutcome::NotModified => 304,
            RangeOutcome::PreconditionFailed => 412,
            RangeOutcome::Unsatisfiable => 416,
        }
    }

    /// The `Content-Range` of the answer for a file of `len` bytes: `bytes first-last/len`
    /// for 206, `bytes */len` for 416, none otherwise.
    pub fn content_range(self, len: u64) -> Option<String> {
        match self {
            RangeOutcome::Partial { start, end_inclusive } => Some(format!("bytes {start}-{end_inclusive}/{len}")),
            RangeOutcome::Unsatisfiable => Some(format!("bytes */{len}")),
            RangeOutcome::Whole | RangeOutcome::NotModified | RangeOutcome::PreconditionFailed => None,
        }
    }

    /// The half-open byte range sent (empty for 304, 412 and 416).
    pub fn bytes(self, len: u64) -> std::ops::Range<u64> {
        match self {
            RangeOutcome::Whole => 0..len,
            RangeOutcome::Partial { start, end_inclusive } => start..end_inclusive + 1,
            RangeOutcome::NotModified | RangeOutcome::PreconditionFailed | RangeOutcome::Unsatisfiable => 0..0,
        }
    }
}

/// The conditional and range fields of a request, as received. Each is every field line of
/// that name joined with `", "` (RFC 9110 §5.3): a list field sent on several lines is one
/// list, and a field that carries one value (a date, `If-Range`) sent twice is invalid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Conditions<'a> {
    /// `If-Match` (RFC 9110 §13.1.1): `*` or a list of entity tags.
    pub if_match: Option<&'a str>,
    /// `If-Unmodified-Since` (RFC 9110 §13.1.4): an HTTP-date.
    pub if_unmodified_since: Option<&'a str>,
    /// `If-None-Match` (RFC 9110 §13.1.2): `*` or a list of entity tags.
    pub if_none_match: Option<&'a str>,
    /// `If-Modified-Since` (RFC 9110 §13.1.3): an HTTP-date.
    pub if_modified_since: Option<&'a str>,
    /// `Range` (RFC 9110 §14.2), read as [`ByteRanges`].
    pub range: Option<&'a str>,
    /// `If-Range` (RFC 9110 §13.1.5): a strong entity tag or an HTTP-date.
    pub if_range: Option<&'a str>,
}

/// Decide a GET (or HEAD) of a file of `len` bytes with strong ETag `etag` (quoted, e.g.
/// `"abc"`) and `Last-Modified` `last_modified` (IMF-fixdate), in the order of RFC 9110 §13.2.2:
///
/// 1. `If-Match` that is not `*` and names no tag equal to `etag` by strong comparison
///    (§8.8.3.2; `W/` tags never match; a malformed list names nothing) → 412.
/// 2. Else, without `If-Match`: `If-Unmodified-Since` earlier than `Last-Modified` → 412; a
///    value that is not an HTTP-date (§5.6.7: IMF-fixdate, RFC 850 or asctime) is ignored.
/// 3. `If-None-Match` that is `*` or names `etag` by weak comparison → 304.
/// 4. Else, without `If-None-Match`: `If-Modified-Since` not earlier than `Last-Modified` → 304
///    (an invalid date is ignored).
/// 5. `Range`: ignored (→ 200, the whole file) when it is not a valid [`ByteRanges`], names
///    several ranges (no multipart/byteranges; two `Range` lines count as several), or comes
///    with an `If-Range` that does not match (a strong ETag exactly, or the date equal to
///    `Last-Modified`). One range → 206 with it, clipped to the file (§14.1.2), or 416 when it
///    is unsatisfiable (§14.1.1): a first position at or past `len` (however many digits),
///    `bytes=-0`, and on an empty file any int-range (`bytes=0-`). A non-zero suffix of an
///    empty file is satisfiable (§14.1.1) but selects no byte, which a 206 cannot express: it
///    gets 200 with the whole (empty) file, as nginx answers.
pub fn select_range(req: &Conditions<'_>, len: u64, etag: &str, last_modified: &str) -> RangeOutcome {
    let modified = httpdate::parse_http_date(last_modified).ok();
    // A date condition is compared at HTTP-date resolution (whole seconds); invalid → ignored.
    let date = |v: Option<&str>| v.and_then(|v| httpdate::parse_http_date(v.trim()).ok()).zip(modified);
    if let Some(im) = req.if_match {
        if !names_tag(im, etag, Comparison::Strong) {
            return RangeOutcome::PreconditionFailed;
        }
    } else if let Some((since, modified)) = date(req.if_unmodified_since) {
        if modified > since {
            return RangeOutcome::PreconditionFailed;
        }
    }
    if let Some(inm) = req.if_none_match {
        if names_tag(inm, etag, Comparison::Weak) {
            return RangeOutcome::NotModified;
        }
    } else if let Some((since, modified)) = date(req.if_modified_since) {
        if modified <= since {
            return RangeOutcome::NotModified;
        }
    }
    let Some(range) = req.range else { return RangeOutcome::Whole };
    if let Some(ir) = req.if_range {
        let ir = ir.trim();
        // A strong ETag must match exactly; a date must equal Last-Modified (RFC 9110 §13.1.5).
        let fresh = if ir.starts_with('"') { ir == etag } else { ir == last_modified };
        if !fresh {
            return RangeOutcome::Whole;
        }
    }
    // Syntactically invalid Range headers are ignored (RFC 9110 §14.2).
    let Ok(ranges) = range.trim().parse::<ByteRanges>() else { return RangeOutcome::Whole };
    let [only] = ranges.specs.as_slice() else {
        // Several ranges: the whole representation (no multipart/byteranges).
        return RangeOutcome::Whole;
    };
    match only.resolve(len) {
        Some((start, end_inclusive)) => RangeOutcome::Partial { start, end_inclusive },
        None if len == 0 && matches!(only, ByteRangeSpec::Suffix { length } if *length > 0) => RangeOutcome::Whole,
        None => RangeOutcome::Unsatisfiable,
    }
}

/// How two entity tags are compared (RFC 9110 §8.8.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Comparison {
    /// Both strong and the same opaque tag (`If-Match`).
    Strong,
    /// The same opaque tag, either one weak or not (`If-None-Match`).
    Weak,
}

/// Whether `list`, an `If-Match`/`If-None-Match` value (`"*" / #entity-tag`, RFC 9110 §13.1.1),
/// names the strong tag `etag` under `cmp`. `*` names every tag of an existing file. Empty list
/// elements are skipped (§5.6.1); a list that is otherwise malformed (an unquoted tag, a stray
/// character) names nothing.
fn names_tag(list: &str, etag: &str, cmp: Comparison) -> bool {
    let list = list.trim_matches([' ', '\t']);
    if list == "*" {
        return true;
    }
    let ours = etag.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(etag);
    let mut found = false;
    let mut rest = list;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return found;
        }
        let (weak, tag) = match rest.strip_prefix("W/") {
            Some(t) => (true, t),
            None => (false, rest),
        };
        let Some((opaque, after)) = tag.strip_prefix('"').and_then(|t| t.split_once('"')) else { return false };
        // etagc = %x21 / %x23-7E / obs-text (RFC 9110 §8.8.3)
        if !opaque.bytes().all(|b| b == 0x21 || (0x23..=0x7e).contains(&b) || b >= 0x80) {
            return false;
        }
        found |= opaque == ours && (cmp == Comparison::Weak || !weak);
        rest = after.trim_start_matches([' ', '\t']);
        if !(rest.is_empty() || rest.starts_with(',')) {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ETAG: &str = "\"abc\"";
    const DATE: &str = "Sun, 06 Nov 1994 08:49:37 GMT";

    fn decide(len: u64, p: &[(&'static str, &str)]) -> RangeOutcome {
        let get = |n: &str| p.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        let c = Conditions {
            if_match: get("if-match"),
            if_unmodified_since: get("if-unmodified-since"),
            if_none_match: get("if-none-match"),
            if_modified_since: get("if-modified-since"),
            range: get("range"),
            if_range: get("if-range"),
        };
        select_range(&c, len, ETAG, DATE)
    }

    #[test]
    fn range_decisions() {
        let d = |p: &[(&'static str, &str)]| decide(100, p);
        assert_eq!(d(&[]), RangeOutcome::Whole);
        assert_eq!(d(&[("range", "bytes=0-9")]), RangeOutcome::Partial { start: 0, end_inclusive: 9 });
        assert_eq!(d(&[("range", "bytes=-10")]), RangeOutcome::Partial { start: 90, end_inclusive: 99 });
        assert_eq!(d(&[("range", "bytes=90-")]), RangeOutcome::Partial { start: 90, end_inclusive: 99 });
        assert_eq!(d(&[("range", "bytes=100-")]), RangeOutcome::Unsatisfiable);
        assert_eq!(d(&[("range", "bytes=0-1,5-6")]), RangeOutcome::Whole);
        assert_eq!(d(&[("range", "bytes=0-4,0-4")]), RangeOutcome::Whole);
        // Two Range field lines, joined as RFC 9110 §5.3 says: several ranges, the whole file.
        assert_eq!(d(&[("range", "bytes=0-1, bytes=5-6")]), RangeOutcome::Whole);
        assert_eq!(d(&[("range", "bytes=-1000")]), RangeOutcome::Partial { start: 0, end_inclusive: 99 });
        assert_eq!(d(&[("range", "bytes=-0")]), RangeOutcome::Unsatisfiable);
        assert_eq!(d(&[("range", "bytes=-00")]), RangeOutcome::Unsatisfiable);
        assert_eq!(d(&[("range", "pages=1")]), RangeOutcome::Whole);
        assert_eq!(d(&[("range", "bytes=5-4")]), RangeOutcome::Whole);
        // What RFC 9110 lets a recipient accept: any case of the unit, empty list elements,
        // leading zeros, numbers of any length.
        assert_eq!(d(&[("range", "BYTES=1-2")]), RangeOutcome::Partial { start: 1, end_inclusive: 2 });
        assert_eq!(d(&[("range", "bytes=1-2,")]), RangeOutcome::Partial { start: 1, end_inclusive: 2 });
        assert_eq!(d(&[("range", "bytes=, 1-2")]), RangeOutcome::Partial { start: 1, end_inclusive: 2 });
        assert_eq!(d(&[("range", "bytes=00-01")]), RangeOutcome::Partial { start: 0, end_inclusive: 1 });
        assert_eq!(d(&[("range", "bytes=")]), RangeOutcome::Whole);
        assert_eq!(d(&[("range", "bytes=0-9"), ("if-range", ETAG)]), RangeOutcome::Partial { start: 0, end_inclusive: 9 });
        assert_eq!(d(&[("range", "bytes=0-9"), ("if-range", "\"old\"")]), RangeOutcome::Whole);
        assert_eq!(d(&[("range", "bytes=0-9"), ("if-range", DATE)]), RangeOutcome::Partial { start: 0, end_inclusive: 9 });
        assert_eq!(d(&[("if-none-match", ETAG)]), RangeOutcome::NotModified);
    }

    /// Big numbers: any digit count behaves as a big u64 does (RFC 9110 §14.1.2).
    #[test]
    fn positions_of_any_length() {
        let d = |r: &str| decide(10_000, &[("range", r)]);
        let whole = RangeOutcome::Partial { start: 0, end_inclusive: 9_999 };
        for suffix in ["bytes=-10000", "bytes=-18446744073709551615", "bytes=-18446744073709551616", "bytes=-99999999999999999999"] {
            assert_eq!(d(suffix), whole, "{suffix}");
        }
        for last in ["bytes=0-9999", "bytes=0-18446744073709551615", "bytes=0-99999999999999999999999", "bytes=000-0099999999999999999999999"] {
            assert_eq!(d(last), whole, "{last}");
        }
        for first in [
            "bytes=10000-",
            "bytes=18446744073709551615-",
            "bytes=18446744073709551616-",
            "bytes=99999999999999999999999-",
            "bytes=10000-99999999999999999999999",
        ] {
            assert_eq!(d(first), RangeOutcome::Unsatisfiable, "{first}");
        }
        assert_eq!(d("bytes=99999999999999999999999-18446744073709551616"), RangeOutcome::Whole, "last before first: invalid, ignored");
    }

    #[test]
    fn an_empty_file() {
        let d = |r: &str| decide(0, &[("range", r)]);
        assert_eq!(d("bytes=-1"), RangeOutcome::Whole);
        assert_eq!(d("bytes=-99999999999999999999"), RangeOutcome::Whole);
        assert_eq!(d("bytes=-0"), RangeOutcome::Unsatisfiable);
        assert_eq!(d("bytes=0-"), RangeOutcome::Unsatisfiable);
        assert_eq!(d("bytes=0-0"), RangeOutcome::Unsatisfiable);
    }

    #[test]
    fn preconditions_in_rfc_9110_order() {
        let d = |p: &[(&'static str, &str)]| decide(100, p);
        let pf = RangeOutcome::PreconditionFailed;
        // If-Match: strong comparison; `*` matches an existing file; lists and several lines.
        assert_eq!(d(&[("if-match", "\"x\"")]), pf);
        assert_eq!(d(&[("if-match", "W/\"abc\"")]), pf, "a weak tag never matches strongly");
        assert_eq!(d(&[("if-match", "abc")]), pf, "malformed: names nothing");
        assert_eq!(d(&[("if-match", "\"abc\" x")]), pf);
        assert_eq!(d(&[("if-match", "*")]), RangeOutcome::Whole);
        assert_eq!(d(&[("if-match", ETAG)]), RangeOutcome::Whole);
        assert_eq!(d(&[("if-match", "\"x,y\", \"abc\"")]), RangeOutcome::Whole);
        assert_eq!(d(&[("if-match", " , \"x\",,\"abc\" ,")]), RangeOutcome::Whole);
        // If-Unmodified-Since: only without If-Match; an invalid date is ignored; other formats.
        assert_eq!(d(&[("if-unmodified-since", "Sat, 05 Nov 1994 08:49:37 GMT")]), pf);
        assert_eq!(d(&[("if-unmodified-since", "Saturday, 05-Nov-94 08:49:37 GMT")]), pf);
        assert_eq!(d(&[("if-unmodified-since", DATE)]), RangeOutcome::Whole);
        assert_eq!(d(&[("if-unmodified-since", "Sun Nov  6 08:49:38 1994")]), RangeOutcome::Whole);
        assert_eq!(d(&[("if-unmodified-since", "yesterday")]), RangeOutcome::Whole);
        assert_eq!(d(&[("if-unmodified-since", "Sat, 05 Nov 1994 08:49:37 GMT, Sat, 05 Nov 1994 08:49:37 GMT")]), RangeOutcome::Whole);
        assert_eq!(d(&[("if-match", "*"), ("if-unmodified-since", "Sat, 05 Nov 1994 08:49:37 GMT")]), RangeOutcome::Whole);
        // If-None-Match: weak comparison; `*`.
        assert_eq!(d(&[("if-none-match", "*")]), RangeOutcome::NotModified);
        assert_eq!(d(&[("if-none-match", "W/\"abc\"")]), RangeOutcome::NotModified);
        assert_eq!(d(&[("if-none-match", "\"x\", \"abc\"")]), RangeOutcome::NotModified);
        assert_eq!(d(&[("if-none-match", "\"x\"")]), RangeOutcome::Whole);
        // If-Modified-Since: only without If-None-Match.
        assert_eq!(d(&[("if-modified-since", DATE)]), RangeOutcome::NotModified);
        assert_eq!(d(&[("if-modified-since", "Mon, 07 Nov 1994 08:49:37 GMT")]), RangeOutcome::NotModified);
        assert_eq!(d(&[("if-modified-since", "Sat, 05 Nov 1994 08:49:37 GMT")]), RangeOutcome::Whole);
        assert_eq!(d(&[("if-modified-since", "garbage")]), RangeOutcome::Whole);
        assert_eq!(d(&[("if-none-match", "\"x\""), ("if-modified-since", DATE)]), RangeOutcome::Whole);
        // Order: 412 before 304, 304 before a range.
        assert_eq!(d(&[("if-match", "\"x\""), ("if-none-match", "*")]), pf);
        assert_eq!(d(&[("if-unmodified-since", "Sat, 05 Nov 1994 08:49:37 GMT"), ("if-none-match", "*")]), pf);
        assert_eq!(d(&[("if-none-match", "*"), ("range", "bytes=0-1")]), RangeOutcome::NotModified);
        assert_eq!(d(&[("if-match", ETAG), ("range", "bytes=0-1")]), RangeOutcome::Partial { start: 0, end_inclusive: 1 });
        assert_eq!(pf.status(), 412);
        assert_eq!(pf.content_range(100), None);
    }

    #[test]
    fn unsatisfiable_carries_the_length() {
        assert_eq!(RangeOutcome::Unsatisfiable.content_range(7).as_deref(), Some("bytes */7"));
        assert_eq!(RangeOutcome::Partial { start: 1, end_inclusive: 2 }.content_range(7).as_deref(), Some("bytes 1-2/7"));
    }
}
