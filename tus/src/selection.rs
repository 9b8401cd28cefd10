//! Which bytes a `GET` of a finished file sends (RFC 9110 §13 conditional requests, §14 range
//! requests), decided from the request's header values and the file's validators with no I/O,
//! and the `Content-Range` that goes with the answer — so a 416 always carries `bytes */N`
//! (RFC 9110 §15.5.17) and a 206 `bytes first-last/N` inside the file.

/// What a GET will send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeOutcome {
    /// 200 with every byte.
    Whole,
    /// 206 with bytes `start..=end_inclusive` (`start <= end_inclusive < len`).
    #[allow(missing_docs)]
    Partial { start: u64, end_inclusive: u64 },
    /// 304: `If-None-Match` matched.
    NotModified,
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
            RangeOutcome::Unsatisfiable => 416,
        }
    }

    /// The `Content-Range` of the answer for a file of `len` bytes: `bytes first-last/len`
    /// for 206, `bytes */len` for 416, none otherwise.
    pub fn content_range(self, len: u64) -> Option<String> {
        match self {
            RangeOutcome::Partial { start, end_inclusive } => Some(format!("bytes {start}-{end_inclusive}/{len}")),
            RangeOutcome::Unsatisfiable => Some(format!("bytes */{len}")),
            RangeOutcome::Whole | RangeOutcome::NotModified => None,
        }
    }

    /// The half-open byte range sent (empty for 304 and 416).
    pub fn bytes(self, len: u64) -> std::ops::Range<u64> {
        match self {
            RangeOutcome::Whole => 0..len,
            RangeOutcome::Partial { start, end_inclusive } => start..end_inclusive + 1,
            RangeOutcome::NotModified | RangeOutcome::Unsatisfiable => 0..0,
        }
    }
}

/// Decide a GET of a file of `len` bytes with strong ETag `etag` and `Last-Modified`
/// `last_modified` (IMF-fixdate), from the raw `If-None-Match`, `Range` and `If-Range` values.
///
/// `If-None-Match` (`*` or a matching tag, weak comparison) → 304. A `Range` that is
/// malformed, names several ranges (no multipart/byteranges) or comes with an `If-Range` that
/// does not match (a strong ETag exactly, or the date equal to `Last-Modified`) → the whole
/// file. One satisfiable range → 206 with it, clipped to the file; `bytes=-0`, a suffix of an
/// empty file or a first byte at or past `len` → 416.
pub fn select_range(if_none_match: Option<&str>, range: Option<&str>, if_range: Option<&str>, len: u64, etag: &str, last_modified: &str) -> RangeOutcome {
    if let Some(inm) = if_none_match {
        if inm.split(',').any(|t| t.trim() == "*" || t.trim().trim_start_matches("W/") == etag) {
            return RangeOutcome::NotModified;
        }
    }
    let Some(range) = range else { return RangeOutcome::Whole };
    if let Some(ir) = if_range {
        let ir = ir.trim();
        // A strong ETag must match exactly; a date must equal Last-Modified (RFC 9110 §13.1.5).
        let fresh = if ir.starts_with('"') { ir == etag } else { ir == last_modified };
        if !fresh {
            return RangeOutcome::Whole;
        }
    }
    let Some(range) = lenient_range(range) else { return RangeOutcome::Whole };
    let range = range.as_str();
    // The crate parses the syntax; RFC 9110 §14.1.2 semantics are applied here.
    // `bytes=-0` is a valid suffix range of length 0, which nothing satisfies (the crate
    // refuses it as syntax).
    if let Some(suffix) = range.trim().strip_prefix("bytes=-") {
        if !suffix.is_empty() && suffix.bytes().all(|b| b == b'0') {
            return RangeOutcome::Unsatisfiable;
        }
    }
    let Ok(parsed) = http_range_header::parse_range_header(range) else {
        // Syntactically invalid Range headers are ignored (RFC 9110 §14.2).
        return RangeOutcome::Whole;
    };
    let [only] = parsed.ranges.as_slice() else {
        // Several ranges: the whole representation (no multipart/byteranges).
        return RangeOutcome::Whole;
    };
    use http_range_header::{EndPosition, StartPosition};
    match (only.start, only.end) {
        (StartPosition::FromLast(n), _) => {
            if n == 0 || len == 0 {
                RangeOutcome::Unsatisfiable
            } else {
                RangeOutcome::Partial { start: len.saturating_sub(n), end_inclusive: len - 1 }
            }
        }
        (StartPosition::Index(s), _) if s >= len => RangeOutcome::Unsatisfiable,
        (StartPosition::Index(s), EndPosition::LastByte) => RangeOutcome::Partial { start: s, end_inclusive: len - 1 },
        (StartPosition::Index(s), EndPosition::Index(e)) if e < s => RangeOutcome::Whole,
        (StartPosition::Index(s), EndPosition::Index(e)) => RangeOutcome::Partial { start: s, end_inclusive: e.min(len - 1) },
    }
}

/// `Range` as the range crate reads it, after what RFC 9110 allows a recipient to accept:
/// the unit is case-insensitive (§14.1), empty list elements are ignored (§5.6.1), and a last
/// position too large for any file is the end of the file (§14.1.2: it is clipped anyway).
/// `None` when the unit is not `bytes`.
fn lenient_range(range: &str) -> Option<String> {
    let (unit, set) = range.trim().split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return None;
    }
    let specs: Vec<String> = set
        .split(',')
        .map(str::trim)
        .filter(|spec| !spec.is_empty())
        .map(|spec| match spec.split_once('-') {
            Some((first, last)) if !first.is_empty() && !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) && last.parse::<u64>().is_err() => format!("{first}-"),
            _ => spec.to_string(),
        })
        .collect();
    Some(format!("bytes={}", specs.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_decisions() {
        let d = |p: &[(&'static str, &str)]| {
            let get = |n: &str| p.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
            select_range(get("if-none-match"), get("range"), get("if-range"), 100, "\"abc\"", "Sun, 06 Nov 1994 08:49:37 GMT")
        };
        assert_eq!(d(&[]), RangeOutcome::Whole);
        assert_eq!(d(&[("range", "bytes=0-9")]), RangeOutcome::Partial { start: 0, end_inclusive: 9 });
        assert_eq!(d(&[("range", "bytes=-10")]), RangeOutcome::Partial { start: 90, end_inclusive: 99 });
        assert_eq!(d(&[("range", "bytes=90-")]), RangeOutcome::Partial { start: 90, end_inclusive: 99 });
        assert_eq!(d(&[("range", "bytes=100-")]), RangeOutcome::Unsatisfiable);
        assert_eq!(d(&[("range", "bytes=0-1,5-6")]), RangeOutcome::Whole);
        assert_eq!(d(&[("range", "bytes=0-4,0-4")]), RangeOutcome::Whole);
        assert_eq!(d(&[("range", "bytes=-1000")]), RangeOutcome::Partial { start: 0, end_inclusive: 99 });
        assert_eq!(d(&[("range", "bytes=-0")]), RangeOutcome::Unsatisfiable);
        assert_eq!(d(&[("range", "pages=1")]), RangeOutcome::Whole);
        // What RFC 9110 lets a recipient accept: any case of the unit, empty list elements, a
        // last position past any file.
        assert_eq!(d(&[("range", "BYTES=1-2")]), RangeOutcome::Partial { start: 1, end_inclusive: 2 });
        assert_eq!(d(&[("range", "bytes=1-2,")]), RangeOutcome::Partial { start: 1, end_inclusive: 2 });
        assert_eq!(d(&[("range", "bytes=, 1-2")]), RangeOutcome::Partial { start: 1, end_inclusive: 2 });
        assert_eq!(d(&[("range", "bytes=0-99999999999999999999999")]), RangeOutcome::Partial { start: 0, end_inclusive: 99 });
        assert_eq!(d(&[("range", "bytes=")]), RangeOutcome::Whole);
        assert_eq!(d(&[("range", "bytes=0-9"), ("if-range", "\"abc\"")]), RangeOutcome::Partial { start: 0, end_inclusive: 9 });
        assert_eq!(d(&[("range", "bytes=0-9"), ("if-range", "\"old\"")]), RangeOutcome::Whole);
        assert_eq!(d(&[("range", "bytes=0-9"), ("if-range", "Sun, 06 Nov 1994 08:49:37 GMT")]), RangeOutcome::Partial { start: 0, end_inclusive: 9 });
        assert_eq!(d(&[("if-none-match", "\"abc\"")]), RangeOutcome::NotModified);
    }

    #[test]
    fn unsatisfiable_carries_the_length() {
        assert_eq!(RangeOutcome::Unsatisfiable.content_range(7).as_deref(), Some("bytes */7"));
        assert_eq!(RangeOutcome::Partial { start: 1, end_inclusive: 2 }.content_range(7).as_deref(), Some("bytes 1-2/7"));
    }
}
