//! `ferry-tus`: the TUS 1.0 resumable upload protocol (and the IETF resumable-upload draft's
//! header fields), sans I/O.
//!
//! This crate owns the *wire vocabulary*: one newtype per header, each parsed strictly with
//! `FromStr<Err = ParseError>` and encoded canonically with `Display`, such that
//! `parse(display(x)) == x` (checked by unit tests and by the cargo-fuzz targets in `fuzz/`).
//! It performs no I/O, spawns nothing and depends on nothing of ferry's.
//!
//! - [`error`] — [`ParseError`], the single parse error type (header, byte index, kind).
//! - [`headers`] — the header types; everything is re-exported at the crate root.
//! - [`protocol`] — TUS 1.0's decisions and the refusals the protocol defines ([`ErrorCode`],
//!   [`TusError`]); [`draft`] — the IETF resumable-upload draft's decisions and problem types.
//!   The application's own error catalogue (quotas, tasks, storage trouble) is not here.
//!
//! Sources: TUS 1.0 (<https://tus.io/protocols/resumable-upload>), RFC 9110, RFC 9530,
//! RFC 9651, draft-ietf-httpbis-resumable-upload.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod headers;

pub use error::{ParseError, ParseErrorKind};
pub use headers::checksum::{ChecksumAlgorithm, UploadChecksum};
pub use headers::concat::UploadConcat;
pub use headers::core::{TusResumable, UploadDeferLength, UploadLength, UploadOffset, TUS_VERSION};
pub use headers::digest::{ContentDigest, ReprDigest};
pub use headers::expires::UploadExpires;
pub use headers::idempotency::IdempotencyKey;
pub use headers::metadata::UploadMetadata;
pub use headers::parse_u64_digits;
pub use headers::range::{ByteRangeSpec, ByteRanges, ContentRange};
pub use headers::rufh::{RufhLength, RufhOffset, UploadComplete, UploadDraftInteropVersion, UploadLimit};

/// The TUS extensions ferry implements, in the order advertised in `Tus-Extension`
/// (TUS 1.0 §Tus-Extension).
pub const TUS_EXTENSIONS: &[&str] = &[
    "creation",
    "creation-with-upload",
    "creation-defer-length",
    "expiration",
    "checksum",
    "checksum-trailer",
    "termination",
    "concatenation",
    "concatenation-unfinished",
];

pub mod protocol;
pub use protocol::*;

pub mod draft;
pub mod selection;
pub use draft::{DraftProblem, InteropVersion};
pub use selection::{select_range, Conditions, RangeOutcome};
