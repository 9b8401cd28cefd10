//! The protocol decisions of TUS 1.0 and the refusals it defines, sans I/O.
//!
//! Each `plan_*` function takes the state of an upload and the raw request headers and
//! returns either a plan (what the server should do) or a [`TusError`] that already knows
//! its HTTP status, its stable protocol [`ErrorCode`], and the one next step for the client. The status
//! codes follow TUS 1.0 where it decides and ferry's DESIGN §3 where it leaves a choice.

#![allow(missing_docs)] // variants and fields are named after the spec terms they carry

use std::fmt;

use crate::{
    ChecksumAlgorithm, ParseError, ReprDigest, UploadChecksum, UploadConcat, UploadDeferLength, UploadLength, UploadMetadata, UploadOffset,
    TUS_VERSION,
};

/// The media type every PATCH body must declare (TUS 1.0 §PATCH).
pub const OFFSET_OCTET_STREAM: &str = "application/offset+octet-stream";

/// The refusals TUS 1.0 and the IETF resumable-upload draft define, as stable code words.
///
/// Only the protocol's own: each names a status the specs give (TUS 1.0: 400, 403, 404, 409,
/// 410 with the expiration extension, 412, 413, 415, 460; the draft's problem types map to
/// [`crate::draft::DraftProblem`]). The application that serves the protocol keeps its own,
/// larger catalogue of codes (with retryability and `Retry-After`) and maps these into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// 409 (TUS 1.0 §PATCH): the request's `Upload-Offset` is not the stored one.
    OffsetMismatch,
    /// 460 (TUS 1.0 §Checksum), or a declared digest of the whole upload that does not match.
    ChecksumMismatch,
    /// 413 (TUS 1.0 §Tus-Max-Size, §Upload-Length): more bytes than the upload or server allows.
    SizeExceeded,
    /// 410 (TUS 1.0 §Expiration): the upload expired.
    UploadExpired,
    /// 404 (TUS 1.0 §HEAD): no upload at this URL.
    NotFound,
    /// 403 (TUS 1.0 §Concatenation: a final upload is not patched) and the draft's
    /// `completed-upload`: the upload's state does not allow the request.
    Conflict,
    /// 400, 412, 415: a malformed, unsupported or contradictory request.
    InvalidArgument,
}

impl ErrorCode {
    /// Every code, in catalogue order.
    pub const ALL: [ErrorCode; 7] = [
        ErrorCode::OffsetMismatch,
        ErrorCode::ChecksumMismatch,
        ErrorCode::SizeExceeded,
        ErrorCode::UploadExpired,
        ErrorCode::NotFound,
        ErrorCode::Conflict,
        ErrorCode::InvalidArgument,
    ];

    /// The snake_case word sent on the wire, e.g. `"offset_mismatch"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::OffsetMismatch => "offset_mismatch",
            ErrorCode::ChecksumMismatch => "checksum_mismatch",
            ErrorCode::SizeExceeded => "size_exceeded",
            ErrorCode::UploadExpired => "upload_expired",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::InvalidArgument => "invalid_argument",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused request: HTTP status, stable code, a human detail, the one next step in the
/// protocol's words, and the byte offset the client should continue from where one is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TusError {
    /// HTTP status code (RFC 9110 §15), e.g. 409.
    pub status: u16,
    pub code: ErrorCode,
    /// What went wrong, for a person; never contains internal error text.
    pub detail: String,
    /// The one next step in TUS/HTTP terms, e.g. "Re-send this chunk starting at offset 131072."
    pub recovery_hint: String,
    /// Byte offset to resume from, when known.
    pub cursor: Option<u64>,
    /// The IETF resumable-upload draft's problem type for this refusal, when it has one; the
    /// HTTP layer renders it for requests that speak the draft (TUS requests keep ferry's own
    /// `type`). See [`crate::draft`].
    pub draft: Option<crate::draft::DraftProblem>,
    /// The refusal is of bytes sent to an upload that already holds all of them
    /// ([`TusError::already_complete`]): a state of the upload, which a transport may word in
    /// its own terms.
    pub complete: bool,
}

impl TusError {
    pub fn new(status: u16, code: ErrorCode, detail: impl Into<String>, hint: impl Into<String>) -> Self {
        TusError { status, code, detail: detail.into(), recovery_hint: hint.into(), cursor: None, draft: None, complete: false }
    }

    /// 413 `size_exceeded` for bytes sent to an upload that already holds all of its `length`
    /// bytes (TUS 1.0 §PATCH: nothing may be appended past `Upload-Length`); the cursor is
    /// `length`, [`TusError::complete`] is set.
    pub fn already_complete(length: u64) -> Self {
        let e = TusError::new(
            413,
            ErrorCode::SizeExceeded,
            format!("the upload already holds all of its {length} bytes; nothing more can be appended"),
            "Nothing more can be sent to this upload: it is complete. Download it with GET, or create a new upload for other bytes.",
        );
        TusError { complete: true, ..e.with_cursor(length) }
    }

    /// Attach the draft problem type this refusal is an instance of.
    pub fn with_draft(mut self, problem: crate::draft::DraftProblem) -> Self {
        self.draft = Some(problem);
        self
    }

    /// Attach the byte offset the client should resume from.
    pub fn with_cursor(mut self, cursor: u64) -> Self {
        self.cursor = Some(cursor);
        self
    }

    /// 400 `invalid_argument`: a malformed or contradictory request.
    pub fn bad_request(detail: impl Into<String>, hint: impl Into<String>) -> Self {
        TusError::new(400, ErrorCode::InvalidArgument, detail, hint)
    }

    /// 409 `offset_mismatch`: the client's offset is not the stored one.
    pub fn offset_mismatch(expected: u64, got: u64) -> Self {
        TusError::new(
            409,
            ErrorCode::OffsetMismatch,
            format!("expected offset {expected}, got {got}"),
            format!("Re-send this chunk starting at offset {expected}."),
        )
        .with_cursor(expected)
        .with_draft(crate::draft::DraftProblem::MismatchingOffset { expected, provided: got })
    }

    pub(crate) fn from_parse(e: &ParseError) -> Self {
        TusError::bad_request(e.to_string(), format!("Send a valid {} header.", e.header()))
    }
}

impl fmt::Display for TusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.detail)
    }
}

impl std::error::Error for TusError {}

/// The request methods that TUS distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Options,
    Post,
    Head,
    Patch,
    Delete,
    Get,
}

/// TUS 1.0 §Tus-Resumable, with DESIGN §3's choices: a version we do not speak → 412 on
/// every method; a missing header → 412 on POST, PATCH and DELETE; OPTIONS, HEAD and GET
/// without it are plain HTTP.
pub fn check_version(verb: Verb, tus_resumable: Option<&str>) -> Result<(), TusError> {
    let refuse = |detail: String| TusError::new(412, ErrorCode::InvalidArgument, detail, format!("Send Tus-Resumable: {TUS_VERSION}."));
    match tus_resumable {
        Some(v) if v.trim() == TUS_VERSION => Ok(()),
        Some(_) => Err(refuse(format!("unsupported protocol version; this server speaks Tus-Resumable {TUS_VERSION}"))),
        None => match verb {
            Verb::Post | Verb::Patch | Verb::Delete => Err(refuse("missing Tus-Resumable header".to_string())),
            Verb::Options | Verb::Head | Verb::Get => Ok(()),
        },
    }
}

/// Raw header values of an upload creation request (`POST`), as received.
#[derive(Debug, Default, Clone, Copy)]
pub struct CreationHeaders<'a> {
    pub upload_length: Option<&'a str>,
    pub upload_defer_length: Option<&'a str>,
    pub upload_metadata: Option<&'a str>,
    pub upload_concat: Option<&'a str>,
    pub upload_checksum: Option<&'a str>,
    pub repr_digest: Option<&'a str>,
    pub content_type: Option<&'a str>,
    pub content_length: Option<&'a str>,
    /// True when the request carries a body (chunked or non-zero Content-Length).
    pub has_body: bool,
}

/// Server limits that creation checks.
#[derive(Debug, Clone, Copy)]
pub struct CreationLimits {
    /// Largest upload accepted, in bytes (`Tus-Max-Size`).
    pub max_size: u64,
    /// Largest `Upload-Metadata` header accepted, in bytes.
    pub max_metadata: usize,
}

/// What a valid creation request asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct CreationPlan {
    /// Total length in bytes; `None` when deferred, or for a final upload (derived later).
    pub length: Option<u64>,
    pub metadata: UploadMetadata,
    pub concat: Option<UploadConcat>,
    /// sha256 the client declared for the whole upload (metadata `sha256` hex or `Repr-Digest`).
    pub expected_sha256: Option<[u8; 32]>,
    /// creation-with-upload: the body holds the first chunk, starting at offset 0.
    pub with_body: bool,
    /// Checksum of the creation body (TUS 1.0 §Checksum applies to it as to a PATCH).
    pub checksum: Option<UploadChecksum>,
}

pub(crate) fn parse_opt<T: std::str::FromStr<Err = ParseError>>(v: Option<&str>) -> Result<Option<T>, TusError> {
    v.map(|s| s.parse::<T>().map_err(|e| TusError::from_parse(&e))).transpose()
}

/// An `Upload-Checksum` value, as a header or as a trailer (TUS 1.0 §Checksum,
/// checksum-trailer): 400 `invalid_argument` when it is malformed or names an algorithm ferry
/// does not know. A digest of the wrong length parses: it is a checksum that does not match,
/// which the comparison with the chunk answers with 460 ([`chunk_checksum_mismatch`]).
pub fn parse_upload_checksum(s: &str) -> Result<UploadChecksum, TusError> {
    s.parse::<UploadChecksum>().map_err(|e| {
        if e.kind() == crate::ParseErrorKind::UnknownAlgorithm {
            let names: Vec<&str> = ChecksumAlgorithm::ALL.iter().map(|a| a.name()).collect();
            TusError::bad_request("unsupported checksum algorithm", format!("Use one of: {}.", names.join(", ")))
        } else {
            TusError::bad_request(e.to_string(), "Send `algorithm base64digest` with sha1, sha256, sha512 or md5.")
        }
    })
}

fn parse_checksum(v: Option<&str>) -> Result<Option<UploadChecksum>, TusError> {
    v.map(parse_upload_checksum).transpose()
}

pub(crate) fn content_length(v: Option<&str>) -> Result<Option<u64>, TusError> {
    v.map(|s| crate::parse_u64_digits(s, "Content-Length").map_err(|e| TusError::from_parse(&e))).transpose()
}

pub(crate) fn too_large(max: u64) -> TusError {
    TusError::new(
        413,
        ErrorCode::SizeExceeded,
        format!("upload exceeds the maximum size of {max} bytes"),
        format!("Split the file into uploads of at most {max} bytes."),
    )
}

/// TUS 1.0 §Creation, §Creation With Upload, §Creation Defer Length, §Concatenation.
///
/// Errors: both or neither of `Upload-Length`/`Upload-Defer-Length` → 400; a deferred length
/// other than `1` → 400; a length above `max_size` → 413; a final upload with a length or a
/// body → 400; a body whose `Content-Type` is not `application/offset+octet-stream` → 415;
/// a body whose `Content-Length` runs past the length (413) or, with the length deferred,
/// past `max_size` (413); a malformed header → 400.
pub fn plan_creation(h: &CreationHeaders<'_>, limits: &CreationLimits) -> Result<CreationPlan, TusError> {
    let metadata = match h.upload_metadata {
        Some(raw) if raw.len() > limits.max_metadata => {
            return Err(TusError::bad_request(
                format!("Upload-Metadata is longer than {} bytes", limits.max_metadata),
                "Send fewer or shorter metadata values.",
            ))
        }
        Some(raw) => raw.parse::<UploadMetadata>().map_err(|e| TusError::from_parse(&e))?,
        None => UploadMetadata::default(),
    };
    let concat: Option<UploadConcat> = parse_opt(h.upload_concat)?;
    let length: Option<UploadLength> = parse_opt(h.upload_length)?;
    let defer: Option<UploadDeferLength> = parse_opt(h.upload_defer_length)?;
    let checksum = parse_checksum(h.upload_checksum)?;
    let declared_len = content_length(h.content_length)?;

    let is_final = matches!(concat, Some(UploadConcat::Final(_)));
    let length = if is_final {
        if length.is_some() || defer.is_some() {
            return Err(TusError::bad_request(
                "a final upload must not carry Upload-Length or Upload-Defer-Length",
                "Remove Upload-Length; the final length is the sum of the partial uploads.",
            ));
        }
        if h.has_body {
            return Err(TusError::bad_request(
                "a final upload cannot carry a body",
                "Send the bytes to the partial uploads, then create the final upload without a body.",
            ));
        }
        None
    } else {
        match (length, defer) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(TusError::bad_request(
                    "send exactly one of Upload-Length and Upload-Defer-Length",
                    "Send Upload-Length with the size in bytes, or Upload-Defer-Length: 1 if it is not known yet.",
                ))
            }
            (Some(UploadLength(n)), None) => {
                if n > limits.max_size {
                    return Err(too_large(limits.max_size));
                }
                Some(n)
            }
            (None, Some(_)) => None,
        }
    };

    if h.has_body && !is_octet_stream(h.content_type) {
        return Err(unsupported_media());
    }
    if let (Some(len), Some(cl)) = (length, declared_len) {
        if cl > len {
            return Err(past_length(0, len));
        }
    }
    // A deferred length (or a draft creation of unknown length) still has the maximum size:
    // a body declared larger is refused before any byte, as PATCH refuses one (found by the
    // `draft_planning` fuzz target: the body used to be read up to the maximum, then cut).
    if let (None, Some(cl), true) = (length, declared_len, h.has_body) {
        if cl > limits.max_size {
            return Err(too_large(limits.max_size));
        }
    }

    let mut expected_sha256 = None;
    if let Some(hexed) = metadata.get_str("sha256") {
        expected_sha256 = Some(parse_declared_sha256(hexed)?);
    }
    if let Some(d) = parse_opt::<ReprDigest>(h.repr_digest)?.and_then(|d| d.sha256) {
        if expected_sha256.is_some_and(|e| e != d) {
            return Err(TusError::bad_request("metadata sha256 and Repr-Digest disagree", "Declare the expected digest once."));
        }
        expected_sha256 = Some(d);
    }

    Ok(CreationPlan { length, metadata, concat, expected_sha256, with_body: h.has_body, checksum })
}

/// The sha256 a client declares for a whole upload in hex — metadata `sha256`, the MCP
/// `file_upload_begin` argument `sha256` — as 32 bytes. Case-insensitive.
///
/// Errors (400 `invalid_argument`): the detail says what is wrong — a character that is not a
/// hexadecimal digit (its 1-based position and the character), or another length than 64
/// digits (the count). A declared digest is checked when the upload completes; one of the
/// wrong length could never match, so it is refused at once — before any byte is sent — as an
/// invalid digest value, the class draft-ietf-httpapi-digest-fields-problem-types
/// ("digest-invalid-value", 400) gives a digest "that cannot be generated by the hashing
/// algorithm", apart from both a syntax error and a mismatch. `Repr-Digest` with a `sha-256`
/// member of another length than 32 bytes is refused the same way.
pub fn parse_declared_sha256(hexed: &str) -> Result<[u8; 32], TusError> {
    let hint = "Send the expected sha256 of the whole file as 64 hex digits (0-9, a-f), or omit it.";
    if let Some((i, c)) = hexed.chars().enumerate().find(|(_, c)| !c.is_ascii_hexdigit()) {
        return Err(TusError::bad_request(
            format!("the declared sha256 is not hexadecimal: character {} is {c:?}; a sha256 is 64 hexadecimal digits", i + 1),
            hint,
        ));
    }
    let digits = hexed.len();
    if digits != 64 {
        return Err(TusError::bad_request(
            format!("the declared sha256 has {digits} hex digits; a sha256 is 64 hexadecimal digits, so no file could match it"),
            hint,
        ));
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(hexed.as_bytes().chunks(2)) {
        // Both are hex digits (checked above).
        *o = ((pair[0] as char).to_digit(16).unwrap_or(0) * 16 + (pair[1] as char).to_digit(16).unwrap_or(0)) as u8;
    }
    Ok(out)
}

fn is_octet_stream(content_type: Option<&str>) -> bool {
    content_type.and_then(|ct| ct.split(';').next()).is_some_and(|ct| ct.trim().eq_ignore_ascii_case(OFFSET_OCTET_STREAM))
}

fn unsupported_media() -> TusError {
    TusError::new(
        415,
        ErrorCode::InvalidArgument,
        format!("the body must be sent as Content-Type: {OFFSET_OCTET_STREAM}"),
        format!("Send Content-Type: {OFFSET_OCTET_STREAM}."),
    )
}

fn past_length(offset: u64, length: u64) -> TusError {
    if offset >= length {
        return TusError::already_complete(offset);
    }
    TusError::new(
        413,
        ErrorCode::SizeExceeded,
        format!("the chunk would run past Upload-Length {length}"),
        format!("Send at most {} bytes starting at offset {offset}.", length.saturating_sub(offset)),
    )
    .with_cursor(offset)
}

/// The stored state of an upload that PATCH decisions depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadState {
    /// Durable bytes, `[0, offset)`.
    pub offset: u64,
    /// Total length in bytes; `None` while deferred.
    pub length: Option<u64>,
    /// A final (concatenated) upload: PATCH is forbidden.
    pub is_final: bool,
}

/// Raw header values of a `PATCH` request.
#[derive(Debug, Default, Clone, Copy)]
pub struct PatchHeaders<'a> {
    pub content_type: Option<&'a str>,
    pub upload_offset: Option<&'a str>,
    pub upload_length: Option<&'a str>,
    pub upload_checksum: Option<&'a str>,
    pub content_length: Option<&'a str>,
    /// The `Trailer` header; naming `Upload-Checksum` announces checksum-trailer.
    pub trailer: Option<&'a str>,
}

/// What a valid PATCH asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchPlan {
    /// Where the chunk starts; equals the stored offset.
    pub offset: u64,
    /// A length declared now for an upload created with `Upload-Defer-Length: 1`.
    pub set_length: Option<u64>,
    /// The length in force for this request (stored or newly declared), if any.
    pub length: Option<u64>,
    /// Most bytes this PATCH may append before it runs past the length or `max_size`.
    pub max_bytes: u64,
    pub checksum: Option<UploadChecksum>,
    /// The client announced `Upload-Checksum` as an HTTP trailer (checksum-trailer).
    pub checksum_in_trailer: bool,
    /// The request carries the end of the upload (the IETF draft's `Upload-Complete: ?1`): when
    /// the body ends, its end is the upload's length — it becomes the length of a
    /// deferred-length upload, and one that ends short of a known length is an inconsistent
    /// length ([`crate::draft::length_short`]). Always false for TUS 1.0.
    pub completes: bool,
}

/// TUS 1.0 §PATCH with §Checksum and §Creation Defer Length, decided before any I/O.
///
/// Errors, in the order checked: final upload → 403; wrong `Content-Type` → 415;
/// missing or malformed `Upload-Offset` → 400; malformed or conflicting `Upload-Length` → 400
/// (repeating the stored length is accepted); offset ≠ stored → 409 with the stored offset;
/// a `Content-Length` past the length → 413; a malformed checksum or unknown algorithm → 400.
pub fn plan_patch(state: &UploadState, h: &PatchHeaders<'_>, max_size: u64) -> Result<PatchPlan, TusError> {
    if state.is_final {
        return Err(TusError::new(
            403,
            ErrorCode::Conflict,
            "a final (concatenated) upload cannot be patched",
            "Send the bytes to its partial uploads instead.",
        ));
    }
    if !is_octet_stream(h.content_type) {
        return Err(unsupported_media());
    }
    let offset = match h.upload_offset {
        None => {
            return Err(TusError::bad_request(
                "missing Upload-Offset",
                "Add the Upload-Offset header (HEAD shows the offset) and send the PATCH again.",
            )
            .with_cursor(state.offset))
        }
        Some(raw) => raw.parse::<UploadOffset>().map_err(|e| TusError::from_parse(&e).with_cursor(state.offset))?.0,
    };
    let declared: Option<UploadLength> = parse_opt(h.upload_length)?;
    let mut set_length = None;
    let length = match (state.length, declared) {
        (Some(stored), Some(UploadLength(n))) if n != stored => {
            return Err(TusError::bad_request(
                format!("Upload-Length {n} differs from the stored length {stored}"),
                "Omit Upload-Length once it is set.",
            ))
        }
        (Some(stored), _) => Some(stored),
        (None, Some(UploadLength(n))) => {
            if n > max_size {
                return Err(too_large(max_size));
            }
            if n < state.offset {
                return Err(TusError::bad_request(
                    format!("Upload-Length {n} is below the bytes already stored ({})", state.offset),
                    format!("Declare a length of at least {} bytes.", state.offset),
                ));
            }
            set_length = Some(n);
            Some(n)
        }
        (None, None) => None,
    };
    if offset != state.offset {
        return Err(TusError::offset_mismatch(state.offset, offset));
    }
    let limit = length.unwrap_or(max_size);
    let max_bytes = limit.saturating_sub(offset);
    if let Some(cl) = content_length(h.content_length)? {
        if cl > max_bytes {
            return Err(match length {
                Some(len) => past_length(offset, len),
                None => too_large(max_size),
            });
        }
    }
    let checksum = parse_checksum(h.upload_checksum)?;
    let checksum_in_trailer = h.trailer.is_some_and(|t| t.split(',').any(|n| n.trim().eq_ignore_ascii_case("upload-checksum")));
    Ok(PatchPlan { offset, set_length, length, max_bytes, checksum, checksum_in_trailer, completes: false })
}

/// One partial upload a final upload names, as its creator sees it: `None` when it is not a
/// partial upload of theirs (unknown, another principal's, an ordinary upload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcatPart {
    /// Its length; `None` while deferred.
    pub length: Option<u64>,
}

/// TUS 1.0 §Concatenation: the length of a final upload made of `parts` (`(id, part)` in
/// order), decided before anything is created. `Ok(None)`: a part's length is still deferred
/// (the final's length is known once every part's is).
///
/// Errors: more than `max_parts` parts → 400; a part that is not a partial upload of the
/// caller's → 400 naming it; lengths that add up past `max_size` (or past `u64`) → 413.
pub fn plan_concatenation(parts: &[(&str, Option<ConcatPart>)], max_parts: usize, max_size: u64) -> Result<Option<u64>, TusError> {
    if parts.len() > max_parts {
        return Err(TusError::bad_request(format!("a final upload may name at most {max_parts} partial uploads"), "Concatenate in stages."));
    }
    let mut total = Some(0u64);
    let mut overflow = false;
    for (id, part) in parts {
        let Some(part) = part else {
            return Err(TusError::bad_request(
                format!("Upload-Concat names {id:?}, which is not a partial upload of yours"),
                "Create each part with Upload-Concat: partial and list their URLs.",
            ));
        };
        if let (Some(t), Some(l)) = (total, part.length) {
            overflow |= t.checked_add(l).is_none();
        }
        total = total.zip(part.length).map(|(t, l)| t.saturating_add(l));
    }
    if overflow || total.is_some_and(|t| t > max_size) {
        // Fewer parts would not help: the joined upload is what is too large.
        let shown = if overflow { "more than 2^64".to_string() } else { total.unwrap_or(0).to_string() };
        return Err(TusError::new(
            413,
            ErrorCode::SizeExceeded,
            format!("the concatenation would be {shown} bytes, above the maximum upload size of {max_size} bytes (Tus-Max-Size)"),
            format!(
                "A file of more than {max_size} bytes cannot be stored here; delete \
                 the partial uploads, and upload files of at most {max_size} bytes."
            ),
        ));
    }
    Ok(total)
}

/// The `Tus-Checksum-Algorithm` value (TUS 1.0 §Checksum): `sha1,sha256,sha512,md5`.
pub fn checksum_algorithms_header() -> String {
    ChecksumAlgorithm::ALL.iter().map(|a| a.name()).collect::<Vec<_>>().join(",")
}

/// The error for a chunk whose `Upload-Checksum` does not match its bytes (TUS 1.0 §Checksum:
/// 460; the chunk is discarded and the offset stays at `offset`).
pub fn chunk_checksum_mismatch(offset: u64) -> TusError {
    TusError::new(
        460,
        ErrorCode::ChecksumMismatch,
        "the chunk's bytes do not match the checksum sent with it (Upload-Checksum, or the draft's Content-Digest); the chunk was discarded",
        format!("Re-send the chunk starting at offset {offset}."),
    )
    .with_cursor(offset)
}

/// The error for a completed upload whose sha256 is not the declared one; the upload was
/// reset to offset 0.
pub fn upload_digest_mismatch() -> TusError {
    TusError::new(
        460,
        ErrorCode::ChecksumMismatch,
        "the whole upload's sha256 does not match the declared digest; the upload was reset to offset 0",
        "Check the source file, then upload it again from offset 0.",
    )
    .with_cursor(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(offset: u64, length: Option<u64>) -> UploadState {
        UploadState { offset, length, is_final: false }
    }

    fn patch<'a>(offset: &'a str) -> PatchHeaders<'a> {
        PatchHeaders { content_type: Some(OFFSET_OCTET_STREAM), upload_offset: Some(offset), ..Default::default() }
    }

    #[test]
    fn version_rules() {
        assert!(check_version(Verb::Head, None).is_ok());
        assert!(check_version(Verb::Get, None).is_ok());
        assert_eq!(check_version(Verb::Post, None).unwrap_err().status, 412);
        assert_eq!(check_version(Verb::Head, Some("0.2.2")).unwrap_err().status, 412);
        assert!(check_version(Verb::Patch, Some("1.0.0")).is_ok());
    }

    #[test]
    fn patch_decisions() {
        let s = state(10, Some(100));
        assert_eq!(plan_patch(&s, &patch("10"), 1000).unwrap().max_bytes, 90);
        let e = plan_patch(&s, &patch("0"), 1000).unwrap_err();
        assert_eq!((e.status, e.code, e.cursor), (409, ErrorCode::OffsetMismatch, Some(10)));
        for bad in ["+5", "-1", "18446744073709551616", "123456789012345678901234567890", ""] {
            assert_eq!(plan_patch(&s, &patch(bad), 1000).unwrap_err().status, 400, "{bad}");
        }
        let mut h = patch("10");
        h.content_type = Some("text/plain");
        assert_eq!(plan_patch(&s, &h, 1000).unwrap_err().status, 415);
        let mut h = patch("10");
        h.content_length = Some("91");
        assert_eq!(plan_patch(&s, &h, 1000).unwrap_err().status, 413);
        let mut h = patch("10");
        h.upload_length = Some("100");
        assert!(plan_patch(&s, &h, 1000).is_ok());
        h.upload_length = Some("101");
        assert_eq!(plan_patch(&s, &h, 1000).unwrap_err().status, 400);
        let fin = UploadState { is_final: true, ..s };
        assert_eq!(plan_patch(&fin, &patch("10"), 1000).unwrap_err().status, 403);
    }

    #[test]
    fn deferred_length_is_set_once() {
        let s = state(10, None);
        let mut h = patch("10");
        h.upload_length = Some("50");
        let p = plan_patch(&s, &h, 1000).unwrap();
        assert_eq!((p.set_length, p.max_bytes), (Some(50), 40));
        h.upload_length = Some("5");
        assert_eq!(plan_patch(&s, &h, 1000).unwrap_err().status, 400);
    }

    #[test]
    fn creation_decisions() {
        let limits = CreationLimits { max_size: 1000, max_metadata: 4096 };
        let ok = CreationHeaders { upload_length: Some("10"), ..Default::default() };
        assert_eq!(plan_creation(&ok, &limits).unwrap().length, Some(10));
        let both = CreationHeaders { upload_length: Some("10"), upload_defer_length: Some("1"), ..Default::default() };
        assert_eq!(plan_creation(&both, &limits).unwrap_err().status, 400);
        assert_eq!(plan_creation(&CreationHeaders::default(), &limits).unwrap_err().status, 400);
        let defer2 = CreationHeaders { upload_defer_length: Some("2"), ..Default::default() };
        assert_eq!(plan_creation(&defer2, &limits).unwrap_err().status, 400);
        let big = CreationHeaders { upload_length: Some("1001"), ..Default::default() };
        assert_eq!(plan_creation(&big, &limits).unwrap_err().status, 413);
        let fin = CreationHeaders { upload_concat: Some("final;/files/a"), upload_length: Some("1"), ..Default::default() };
        assert_eq!(plan_creation(&fin, &limits).unwrap_err().status, 400);
        let body = CreationHeaders { upload_length: Some("10"), has_body: true, content_type: Some("text/plain"), ..Default::default() };
        assert_eq!(plan_creation(&body, &limits).unwrap_err().status, 415);
        let sha = CreationHeaders { upload_length: Some("10"), upload_metadata: Some("sha256 eHl6"), ..Default::default() };
        assert_eq!(plan_creation(&sha, &limits).unwrap_err().status, 400);
    }

    #[test]
    fn a_wrong_length_digest_is_a_mismatch_but_a_malformed_one_is_400() {
        // Upload-Checksum (header or trailer): parses; comparing it with the chunk fails → 460.
        let c = parse_upload_checksum("sha1 AAAAAAAAAAAAAAAAAAAAAAAAAAAA").unwrap();
        assert!(!c.can_match());
        let s = state(10, Some(100));
        let mut h = patch("10");
        h.upload_checksum = Some("sha256 AAAA");
        assert_eq!(plan_patch(&s, &h, 1000).unwrap().checksum.map(|c| c.digest.len()), Some(3));
        let ch = CreationHeaders { upload_length: Some("10"), upload_checksum: Some("md5 AAAA"), ..Default::default() };
        assert!(plan_creation(&ch, &CreationLimits { max_size: 1000, max_metadata: 4096 }).is_ok());
        // Not base64, or an unknown algorithm: malformed → 400.
        for bad in ["sha1 !!!!", "crc32 AAAA", "sha1", "sha1 AAAA-A=="] {
            let e = parse_upload_checksum(bad).unwrap_err();
            assert_eq!((e.status, e.code), (400, ErrorCode::InvalidArgument), "{bad}");
        }
        assert_eq!(parse_upload_checksum("crc32 AAAA").unwrap_err().detail, "unsupported checksum algorithm");
    }

    #[test]
    fn a_declared_sha256_is_checked_before_any_byte() {
        let limits = CreationLimits { max_size: 1000, max_metadata: 4096 };
        use base64::Engine as _;
        let md = |hexed: &str| format!("sha256 {}", base64::engine::general_purpose::STANDARD.encode(hexed));
        let good = "ab".repeat(32);
        assert_eq!(parse_declared_sha256(&good.to_ascii_uppercase()), Ok([0xab; 32]));
        let created =
            plan_creation(&CreationHeaders { upload_length: Some("10"), upload_metadata: Some(&md(&good)), ..Default::default() }, &limits).unwrap();
        assert_eq!(created.expected_sha256, Some([0xab; 32]));
        // Hex of the wrong length (odd counts too): an invalid digest value (400), said as such.
        for short in ["ab".repeat(31), "ab".repeat(33), "ab".to_string(), "abc".to_string(), String::new()] {
            let e = parse_declared_sha256(&short).unwrap_err();
            assert_eq!(e.status, 400);
            assert_eq!(
                e.detail,
                format!("the declared sha256 has {} hex digits; a sha256 is 64 hexadecimal digits, so no file could match it", short.len())
            );
            if !short.is_empty() {
                let h = md(&short);
                assert_eq!(
                    plan_creation(&CreationHeaders { upload_length: Some("10"), upload_metadata: Some(&h), ..Default::default() }, &limits)
                        .unwrap_err(),
                    e
                );
            }
        }
        // A character that is no hex digit: named with its position.
        assert_eq!(
            parse_declared_sha256("xyz").unwrap_err().detail,
            "the declared sha256 is not hexadecimal: character 1 is 'x'; a sha256 is 64 hexadecimal digits"
        );
        let e = parse_declared_sha256(&format!("{}g{}", "a".repeat(10), "a".repeat(53))).unwrap_err();
        assert!(e.detail.contains("character 11 is 'g'"), "{}", e.detail);
        // Repr-Digest (RFC 9530): a sha-256 byte sequence of another length is an invalid value, 400.
        let rd = CreationHeaders { upload_length: Some("10"), repr_digest: Some("sha-256=:AAAA:"), ..Default::default() };
        assert_eq!(plan_creation(&rd, &limits).unwrap_err().status, 400);
    }

    #[test]
    fn catalogue_is_complete() {
        let words: std::collections::HashSet<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(words.len(), ErrorCode::ALL.len());
    }
}
