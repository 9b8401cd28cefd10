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
    ContentDigest, ParseError, ReprDigest, RufhLength, RufhOffset, TusResumable, UploadChecksum, UploadComplete, UploadConcat, UploadDraftInteropVersion, UploadExpires,
    UploadLength, UploadLimit, UploadMetadata, UploadOffset,
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
    "draft_append",
];

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

/// Runs the check for `target` on `data`. Panics on a round-trip failure or an unknown target.
pub fn check(target: &str, data: &[u8]) {
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
        "content_digest" => {
            roundtrip::<ContentDigest>(s);
            let _ = crate::draft::content_digest_checksum(Some(s));
        }
        "draft_append" => draft_append(s),
        other => panic!("unknown fuzz target {other:?}"),
    }
}
