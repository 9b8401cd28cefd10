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

use crate::{ParseError, ReprDigest, TusResumable, UploadChecksum, UploadComplete, UploadConcat, UploadExpires, UploadLength, UploadLimit, UploadMetadata, UploadOffset};

/// Every target name, one per parser; each is a `[[bin]]` in `fuzz/Cargo.toml`.
pub const TARGETS: &[&str] =
    &["upload_offset", "upload_length", "upload_metadata", "upload_checksum", "upload_concat", "upload_expires", "upload_complete", "upload_limit", "repr_digest", "tus_resumable"];

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
        other => panic!("unknown fuzz target {other:?}"),
    }
}
