//! Owns the round-trip checks shared by the cargo-fuzz targets in `fuzz/` and by the regression
//! test `tests/fuzz_regressions.rs`, so a crash input kept in `fuzz/regressions/<target>/` is
//! replayed by `cargo test` with exactly the logic that found it.
//!
//! Each check parses arbitrary input (non-UTF-8 input is ignored, as HTTP header values reach
//! the parsers as `&str`) and, when parsing succeeds, asserts that `parse(display(x)) == x`.
//! A failed check panics.

use std::fmt::Debug;
use std::fmt::Display;
use std::str::FromStr;

use crate::{
    ByteRanges, ContentDigest, ParseError, ReprDigest, RufhLength, RufhOffset, TusResumable, UploadChecksum, UploadComplete, UploadConcat,
    UploadDraftInteropVersion, UploadExpires, UploadLength, UploadLimit, UploadMetadata, UploadOffset,
};

/// Every target name, one per parser; each is a `[[bin]]` in `fuzz/Cargo.toml`.
pub const TARGETS: &[&str] = &[
    "upload_offset",
    "upload_length",
    "upload_metadata",
    "upload_checksum",
    "upload_concat",
    "upload_expires",
    "upload_complete",
    "upload_limit",
    "repr_digest",
    "tus_resumable",
    "rufh_offset",
    "rufh_length",
    "upload_draft_interop_version",
    "content_digest",
    "byte_ranges",
    "draft_append",
    "plan_patch",
    "plan_creation",
    "draft_planning",
    "range_selection",
    "concat_planning",
];

/// The decision targets: structured states and requests drawn from the bytes (not text), so
/// the fuzzer spends its time on the decisions, not on re-finding header syntax.
const DECISIONS: &[&str] = &["plan_patch", "plan_creation", "draft_planning", "range_selection", "concat_planning"];

/// The draft's append decision on arbitrary header values (one per line: Content-Type,
/// Upload-Offset, Upload-Complete, Upload-Length, Content-Length, Content-Digest) against a few
/// stored states: it never panics, and what it accepts starts at the stored offset and stays
/// within the length and the maximum size.
fn draft_append(s: &str) {
    use crate::draft::{plan_draft_append, DraftAppendHeaders, InteropVersion};
    let mut f = s.split('\n').map(|v| if v == "-" { None } else { Some(v) });
    let mut next = || f.next().flatten();
    let h = DraftAppendHeaders {
        content_type: next(),
        upload_offset: next(),
        upload_complete: next(),
        upload_length: next(),
        content_length: next(),
        content_digest: next(),
        has_body: s.len().is_multiple_of(2),
    };
    let max = 1u64 << 40;
    for state in [(0, None), (10, Some(100)), (100, Some(100)), (5, None), (u64::MAX - 1, None)] {
        let st = crate::UploadState { offset: state.0, length: state.1, is_final: false };
        for v in InteropVersion::ALL {
            if let Ok(p) = plan_draft_append(v, &st, &h, max) {
                assert_eq!(p.offset, st.offset);
                assert!(p.length.is_none_or(|l| l >= p.offset && p.offset.saturating_add(p.max_bytes) <= l.max(p.offset)));
                assert!(p.set_length.is_none() || st.length.is_none());
            }
        }
    }
}

fn roundtrip<T>(s: &str)
where
    T: FromStr<Err = ParseError> + Display + PartialEq + Debug,
{
    if let Ok(x) = s.parse::<T>() {
        let shown = x.to_string();
        match shown.parse::<T>() {
            Ok(y) => assert_eq!(x, y, "round trip changed the value: {s:?} -> {shown:?}"),
            Err(e) => panic!("display of a parsed value does not parse: {s:?} -> {shown:?}: {e}"),
        }
    }
}

/// Runs the check for `target` on `data`. Panics on a round-trip failure, a broken decision
/// invariant or an unknown target.
pub fn check(target: &str, data: &[u8]) {
    if DECISIONS.contains(&target) {
        let mut u = arbitrary::Unstructured::new(data);
        let _ = decisions::check(target, &mut u);
        return;
    }
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match target {
        "upload_offset" => roundtrip::<UploadOffset>(s),
        "upload_length" => roundtrip::<UploadLength>(s),
        "upload_metadata" => {
            roundtrip::<UploadMetadata>(s);
            if let Ok(m) = s.parse::<UploadMetadata>() {
                assert_eq!(m.encoded_len(), m.to_string().len());
                let again: UploadMetadata = m.to_string().parse().unwrap();
                assert_eq!(m.pairs(), again.pairs());
            }
        }
        "upload_checksum" => roundtrip::<UploadChecksum>(s),
        "upload_concat" => {
            roundtrip::<UploadConcat>(s);
            if let Ok(c @ UploadConcat::Final(_)) = s.parse::<UploadConcat>() {
                assert!(c.final_ids().iter().all(|id| !id.is_empty()));
            }
        }
        "upload_expires" => roundtrip::<UploadExpires>(s),
        "upload_complete" => roundtrip::<UploadComplete>(s),
        "upload_limit" => roundtrip::<UploadLimit>(s),
        "repr_digest" => roundtrip::<ReprDigest>(s),
        "tus_resumable" => roundtrip::<TusResumable>(s),
        "rufh_offset" => roundtrip::<RufhOffset>(s),
        "rufh_length" => roundtrip::<RufhLength>(s),
        "upload_draft_interop_version" => {
            roundtrip::<UploadDraftInteropVersion>(s);
            let _ = crate::InteropVersion::from_header(s);
        }
        "byte_ranges" => {
            roundtrip::<ByteRanges>(s);
            if let Ok(r) = s.parse::<ByteRanges>() {
                assert!(!r.specs.is_empty());
                for spec in r.specs {
                    for len in [0, 1, 100, u64::MAX] {
                        if let Some((first, last)) = spec.resolve(len) {
                            assert!(first <= last && last < len, "{spec} of {len}: {first}-{last}");
                        }
                    }
                }
            }
        }
        "content_digest" => {
            roundtrip::<ContentDigest>(s);
            let _ = crate::draft::content_digest_checksum(Some(s));
        }
        "draft_append" => draft_append(s),
        other => panic!("unknown fuzz target {other:?}"),
    }
}

/// The decision targets' generators and invariants.
mod decisions {
    use arbitrary::{Result, Unstructured};

    use crate::draft::{plan_draft_append, plan_draft_creation, DraftAppendHeaders, DraftCreationHeaders, InteropVersion};
    use crate::{
        plan_concatenation, plan_creation, plan_patch, select_range, ConcatPart, Conditions, CreationHeaders, CreationLimits, PatchHeaders,
        RangeOutcome, TusError, UploadState,
    };

    /// A number near the interesting ones (0, `near`, its neighbours, `u64::MAX`) or any.
    fn num(u: &mut Unstructured<'_>, near: u64) -> Result<u64> {
        Ok(match u.int_in_range(0..=5u8)? {
            0 => 0,
            1 => near,
            2 => near.saturating_add(u.int_in_range(1..=3)?),
            3 => near.saturating_sub(u.int_in_range(1..=3)?),
            4 => u64::MAX - u.int_in_range(0..=1)?,
            _ => u.arbitrary()?,
        })
    }

    /// A header value: absent, a number near `near` (sometimes with junk: `+5`, spaces,
    /// leading zeros), one of `words`, or arbitrary text.
    fn value(u: &mut Unstructured<'_>, near: u64, words: &[&'static str]) -> Result<Option<String>> {
        Ok(match u.int_in_range(0..=5u8)? {
            0 => None,
            1 | 2 => Some(num(u, near)?.to_string()),
            3 => Some(format!("{}{}{}", u.choose(&["", "+", " ", "0", "-"])?, num(u, near)?, u.choose(&["", " ", "x", ",1"])?)),
            4 if !words.is_empty() => Some((*u.choose(words)?).to_string()),
            _ => Some(String::from(<&str>::arbitrary_take(u)?)),
        })
    }

    trait TakeStr<'a> {
        fn arbitrary_take(u: &mut Unstructured<'a>) -> Result<&'a str>;
    }
    impl<'a> TakeStr<'a> for &'a str {
        fn arbitrary_take(u: &mut Unstructured<'a>) -> Result<&'a str> {
            let n = u.int_in_range(0..=40usize)?;
            let bytes = u.bytes(n.min(u.len()))?;
            Ok(std::str::from_utf8(bytes).unwrap_or(""))
        }
    }

    fn state(u: &mut Unstructured<'_>, max: u64) -> Result<UploadState> {
        let length = if u.arbitrary()? { Some(num(u, max)?) } else { None };
        // A stored offset never exceeds the length (the catalog's invariant).
        let offset = match length {
            Some(l) if u.arbitrary()? => u.int_in_range(0..=l)?,
            Some(l) => num(u, l)?.min(l),
            None => num(u, max / 2)?.min(max),
        };
        Ok(UploadState { offset, length, is_final: u.ratio(1, 8)? })
    }

    /// The invariants of any accepted append, TUS or draft: it starts at the stored offset
    /// (never elsewhere, so never backwards), and what it may take stays within the length and
    /// the maximum size.
    fn accepted_append(st: &UploadState, p: &crate::PatchPlan, max: u64, cl: Option<u64>) {
        assert_eq!(p.offset, st.offset, "an accepted append starts at the stored offset");
        assert!(!st.is_final, "a final upload accepts no bytes");
        match (st.length, p.set_length) {
            (Some(l), _) => {
                assert_eq!(p.length, Some(l), "the stored length stays");
                assert!(p.set_length.is_none(), "a known length is never set again");
                assert!(p.offset.saturating_add(p.max_bytes) <= l, "never past Upload-Length");
            }
            (None, Some(n)) => {
                assert!(n <= max, "a declared length within the maximum size");
                assert!(n >= st.offset, "a declared length never below the stored bytes");
                assert_eq!(p.length, Some(n));
            }
            (None, None) => assert!(p.length.is_none()),
        }
        let limit = p.length.unwrap_or(max);
        assert!(p.offset.saturating_add(p.max_bytes) <= limit.max(p.offset), "never past the length or the maximum size");
        assert!(p.max_bytes <= limit.saturating_sub(p.offset), "the budget is what is left");
        if let Some(cl) = cl {
            assert!(cl <= p.max_bytes, "a Content-Length past the budget is refused before any byte");
        }
    }

    /// What every refusal of a request on an existing upload keeps: a 4xx, and a cursor (when
    /// it has one) that is the stored offset — the client is never sent elsewhere.
    fn refusal(st: &UploadState, e: &TusError) {
        assert!((400..500).contains(&e.status), "a refusal is a 4xx: {e}");
        if let Some(c) = e.cursor {
            assert!(c == st.offset || st.length == Some(c), "a refusal's cursor is the stored offset: {e} for {st:?}");
        }
    }

    fn cl_of(v: &Option<String>) -> Option<u64> {
        v.as_deref().and_then(|s| crate::parse_u64_digits(s, "Content-Length").ok())
    }

    pub(super) fn check(target: &str, u: &mut Unstructured<'_>) -> Result<()> {
        let max = num(u, 1 << 40)?.max(1);
        match target {
            "plan_patch" => {
                let st = state(u, max)?;
                let before = st;
                let ct = value(u, 0, &["application/offset+octet-stream", "application/offset+octet-stream; x=1", "text/plain"])?;
                let off = value(u, st.offset, &[])?;
                let len = value(u, st.length.unwrap_or(st.offset), &[])?;
                let sum = value(u, 0, &["sha1 Kq5sNclPz7QV2+lfQIuc6R7oRu0=", "md5 1B2M2Y8AsgTpgAmY7PhCfg==", "crc32 AAAA", "sha1"])?;
                let cl = value(u, st.length.unwrap_or(max).saturating_sub(st.offset), &[])?;
                let trailer = value(u, 0, &["Upload-Checksum", "x, upload-checksum"])?;
                let h = PatchHeaders {
                    content_type: ct.as_deref(),
                    upload_offset: off.as_deref(),
                    upload_length: len.as_deref(),
                    upload_checksum: sum.as_deref(),
                    content_length: cl.as_deref(),
                    trailer: trailer.as_deref(),
                };
                let r = plan_patch(&st, &h, max);
                if std::env::var_os("FERRY_FUZZ_DEBUG").is_some() {
                    eprintln!("plan_patch max={max} {st:?} {h:?} -> {r:?}");
                }
                match r {
                    Ok(p) => {
                        accepted_append(&st, &p, max, cl_of(&cl));
                        assert!(!p.completes, "TUS 1.0 never completes by the request");
                    }
                    Err(e) => {
                        refusal(&st, &e);
                        // A well-formed offset other than the stored one, on an upload that takes bytes, is a 409
                        // naming the stored offset — unless an earlier check refused first.
                        if e.status == 409 {
                            assert_eq!(e.cursor, Some(st.offset));
                        }
                        if st.is_final {
                            assert_eq!(e.status, 403);
                        }
                    }
                }
                assert_eq!(st, before, "a plan never changes the state it was given");
            }
            "plan_creation" => {
                let len = value(u, max, &[])?;
                let defer = value(u, 1, &["1", "0", "2"])?;
                let md = value(u, 0, &["filename aGVsbG8=", "sha256 YWJj", "a,a", "x"])?;
                let concat = value(u, 0, &["partial", "final;/files/a /files/b", "final;", "final; ", "nope"])?;
                let sum = value(u, 0, &["sha1 Kq5sNclPz7QV2+lfQIuc6R7oRu0="])?;
                let repr = value(u, 0, &["sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:", "sha-256=:YWJj:"])?;
                let ct = value(u, 0, &["application/offset+octet-stream", "text/plain"])?;
                let cl = value(u, len.as_deref().and_then(|l| l.parse().ok()).unwrap_or(0), &[])?;
                let has_body = u.arbitrary()?;
                let limits = CreationLimits { max_size: max, max_metadata: u.int_in_range(0..=64)? };
                let h = CreationHeaders {
                    upload_length: len.as_deref(),
                    upload_defer_length: defer.as_deref(),
                    upload_metadata: md.as_deref(),
                    upload_concat: concat.as_deref(),
                    upload_checksum: sum.as_deref(),
                    repr_digest: repr.as_deref(),
                    content_type: ct.as_deref(),
                    content_length: cl.as_deref(),
                    has_body,
                };
                match plan_creation(&h, &limits) {
                    Ok(p) => {
                        assert!(p.length.is_none_or(|l| l <= max), "never a length past the maximum size");
                        assert_eq!(p.with_body, has_body);
                        if matches!(p.concat, Some(crate::UploadConcat::Final(_))) {
                            assert!(p.length.is_none() && !has_body, "a final upload has no length of its own and no body");
                        } else {
                            assert!(
                                p.length.is_some() != (h.upload_defer_length.is_some() && h.upload_length.is_none()) || p.length.is_some(),
                                "exactly one of length and deferral"
                            );
                        }
                        if let (Some(l), Some(c)) = (p.length, cl_of(&cl)) {
                            assert!(c <= l, "a body longer than Upload-Length is refused at creation");
                        }
                        if let (true, Some(c)) = (has_body, cl_of(&cl)) {
                            assert!(c <= max, "a body longer than the maximum size is refused at creation");
                        }
                        assert!(h.upload_metadata.is_none_or(|m| m.len() <= limits.max_metadata));
                    }
                    Err(e) => assert!(matches!(e.status, 400 | 413 | 415), "creation refusals: {e}"),
                }
            }
            "draft_planning" => {
                let version = *u.choose(&InteropVersion::ALL)?;
                let complete = value(u, 0, &["?1", "?0", "?2", "1"])?;
                let len = value(u, max, &[])?;
                let cl = value(u, len.as_deref().and_then(|l| l.parse().ok()).unwrap_or(0), &[])?;
                let digest = value(u, 0, &["sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:", "md5=:AAAA:"])?;
                let has_body = u.arbitrary()?;
                let limits = CreationLimits { max_size: max, max_metadata: 64 };
                let h = DraftCreationHeaders {
                    upload_complete: complete.as_deref(),
                    upload_length: len.as_deref(),
                    upload_metadata: None,
                    repr_digest: None,
                    content_digest: digest.as_deref(),
                    content_length: cl.as_deref(),
                    has_body,
                };
                let r = plan_draft_creation(&h, &limits);
                if std::env::var_os("FERRY_FUZZ_DEBUG").is_some() {
                    eprintln!("plan_draft_creation max={max} {h:?} -> {r:?}");
                }
                match r {
                    Ok(c) => {
                        assert!(c.plan.length.is_none_or(|l| l <= max), "never a length past the maximum size");
                        if let Some(b) = &c.body {
                            assert_eq!(b.offset, 0, "a creation's content starts at 0");
                            assert!(b.max_bytes <= c.plan.length.unwrap_or(max), "never past the length or the maximum size");
                            if let Some(n) = cl_of(&cl) {
                                assert!(n <= b.max_bytes);
                            }
                        }
                        if c.complete {
                            // Known now, or (chunked content) the end of the body is the length.
                            assert!(c.plan.length.is_some() || c.body.as_ref().is_some_and(|b| b.completes), "a complete creation knows its length");
                        }
                    }
                    Err(e) => assert!(matches!(e.status, 400 | 413 | 415), "draft creation refusals: {e}"),
                }
                let st = state(u, max)?;
                let before = st;
                let ct = value(u, 0, &["application/partial-upload", "application/offset+octet-stream"])?;
                let off = value(u, st.offset, &[])?;
                let alen = value(u, st.length.unwrap_or(st.offset), &[])?;
                let acl = value(u, st.length.unwrap_or(max).saturating_sub(st.offset), &[])?;
                let h = DraftAppendHeaders {
                    content_type: ct.as_deref(),
                    upload_offset: off.as_deref(),
                    upload_complete: complete.as_deref(),
                    upload_length: alen.as_deref(),
                    content_length: acl.as_deref(),
                    content_digest: digest.as_deref(),
                    has_body: u.arbitrary()?,
                };
                match plan_draft_append(version, &st, &h, max) {
                    Ok(p) => accepted_append(&st, &p, max, cl_of(&acl).filter(|_| h.has_body)),
                    Err(e) => {
                        assert!((400..500).contains(&e.status), "a refusal is a 4xx: {e}");
                        if e.status == 409 {
                            assert_eq!(e.cursor, Some(st.offset), "a mismatch names the stored offset");
                        }
                    }
                }
                assert_eq!(st, before);
            }
            "range_selection" => {
                let len = num(u, 100)?;
                let etag = "\"abc\"";
                let date = "Sun, 06 Nov 1994 08:49:37 GMT";
                let a = num(u, len)?;
                let b = num(u, len)?;
                let range = match u.int_in_range(0..=6u8)? {
                    0 => None,
                    1 => Some(format!("bytes={a}-{b}")),
                    2 => Some(format!("bytes={a}-")),
                    3 => Some(format!("bytes=-{a}")),
                    4 => Some(format!("bytes={a}-{b},{b}-")),
                    5 => Some(
                        (*u.choose(&[
                            "bytes=-0",
                            "bytes=-00",
                            "bytes=",
                            "bytes=0-0",
                            "pages=1-2",
                            "bytes=--1",
                            "bytes=00-01",
                            "bytes=-99999999999999999999",
                            "bytes=18446744073709551616-",
                            "bytes=0-1, bytes=2-3",
                        ])?)
                        .to_string(),
                    ),
                    _ => Some(<&str as TakeStr>::arbitrary_take(u)?.to_string()),
                };
                let if_range = match u.int_in_range(0..=3u8)? {
                    0 => None,
                    1 => Some(etag),
                    2 => Some(date),
                    _ => Some("\"old\""),
                };
                let tags = ["*", etag, "W/\"abc\"", "\"x\"", "\"x\", \"abc\"", "abc"];
                let dates = [date, "Sat, 05 Nov 1994 08:49:37 GMT", "Mon, 07 Nov 1994 08:49:37 GMT", "soon"];
                let inm = if u.ratio(1, 6)? { Some(*u.choose(&tags)?) } else { None };
                let im = if u.ratio(1, 6)? { Some(*u.choose(&tags)?) } else { None };
                let ims = if u.ratio(1, 6)? { Some(*u.choose(&dates)?) } else { None };
                let ius = if u.ratio(1, 6)? { Some(*u.choose(&dates)?) } else { None };
                let c = Conditions {
                    if_match: im,
                    if_unmodified_since: ius,
                    if_none_match: inm,
                    if_modified_since: ims,
                    range: range.as_deref(),
                    if_range,
                };
                let o = select_range(&c, len, etag, date);
                let cr = o.content_range(len);
                match o {
                    RangeOutcome::Partial { start, end_inclusive } => {
                        assert!(start <= end_inclusive && end_inclusive < len, "a 206 range lies inside the file: {o:?} of {len}");
                        assert_eq!(cr, Some(format!("bytes {start}-{end_inclusive}/{len}")));
                        assert_eq!(o.bytes(len), start..end_inclusive + 1);
                    }
                    RangeOutcome::Unsatisfiable => assert_eq!(cr, Some(format!("bytes */{len}")), "a 416 always carries */N"),
                    RangeOutcome::Whole => {
                        assert_eq!(cr, None);
                        assert_eq!(o.bytes(len), 0..len);
                    }
                    RangeOutcome::NotModified => assert!(inm.is_some() || ims.is_some()),
                    RangeOutcome::PreconditionFailed => assert!(im.is_some() || ius.is_some()),
                }
                if o.status() == 416 {
                    assert!(cr.as_deref().is_some_and(|c| c.starts_with("bytes */")));
                }
                if range.is_none() && [im, ius, inm, ims].iter().all(Option::is_none) {
                    assert_eq!(o, RangeOutcome::Whole);
                }
            }
            "concat_planning" => {
                let n = u.int_in_range(0..=12usize)?;
                let max_parts = u.int_in_range(0..=10usize)?;
                let mut parts: Vec<(&str, Option<ConcatPart>)> = Vec::with_capacity(n);
                for _ in 0..n {
                    let p =
                        if u.ratio(1, 10)? { None } else { Some(ConcatPart { length: if u.ratio(1, 6)? { None } else { Some(num(u, max / 3)?) } }) };
                    parts.push(("p", p));
                }
                match plan_concatenation(&parts, max_parts, max) {
                    Ok(total) => {
                        assert!(parts.len() <= max_parts && parts.iter().all(|(_, p)| p.is_some()));
                        let lengths: Option<Vec<u64>> = parts.iter().map(|(_, p)| p.unwrap().length).collect();
                        let sum = lengths.map(|ls| ls.iter().try_fold(0u64, |t, l| t.checked_add(*l)));
                        match total {
                            Some(t) => {
                                assert!(t <= max, "never a final past the maximum size");
                                assert_eq!(sum, Some(Some(t)), "the final's length is the sum of its parts");
                            }
                            None => assert!(parts.iter().any(|(_, p)| p.unwrap().length.is_none()), "unknown only while a part's length is deferred"),
                        }
                    }
                    Err(e) if e.status == 413 => assert!(parts.len() <= max_parts && parts.iter().all(|(_, p)| p.is_some())),
                    Err(e) => assert_eq!(e.status, 400, "{e}"),
                }
            }
            other => panic!("unknown decision target {other:?}"),
        }
        Ok(())
    }
}
