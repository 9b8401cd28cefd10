//! The decisions of the IETF resumable-upload draft (draft-ietf-httpbis-resumable-upload,
//! "RUFH"), sans I/O, rendering the same error catalogue as TUS 1.0 ([`crate::protocol`]).
//!
//! ferry serves the draft beside TUS 1.0 on the same upload resources: a request that carries
//! `Upload-Draft-Interop-Version` speaks the draft, any other request speaks TUS. The draft has
//! changed on the wire as it matured, so the interop version picks the rules:
//!
//! - **5**, draft -03 (tus-js-client `ietf-draft-03`): `Upload-Complete`; append with any
//!   `Content-Type`; no `Upload-Limit`.
//! - **6**, draft -05 (tus-js-client `ietf-draft-05`): append needs `Content-Type:
//!   application/partial-upload`; `Upload-Length`; `Upload-Limit` with `expires`; problem types
//!   for a mismatching offset and a completed upload.
//! - **8**, drafts -09 to -11: `Upload-Limit` member `max-age` instead of `expires`; problem type
//!   for an inconsistent length; `Accept-Patch` on OPTIONS; `104 (Upload Resumption Supported)`
//!   with `Location`.
//! - **9**, draft -12 and later (to -15): `GET` retrieves the offset as `HEAD` does; otherwise as
//!   8 (see [`InteropVersion::V9`]).
//!
//! Versions 5 and 6 also accept `Upload-Length` (tus-js-client sends it in both modes), and every
//! version gets the three problem types: they only add members to ferry's problem body.
//!
//! One deviation, documented in the README: the draft says only `Upload-Complete: ?1` completes
//! an upload, while ferry's engine completes an upload whose known length is reached (TUS 1.0's
//! rule). tus-js-client relies on it: it may send the last bytes with `Upload-Complete: ?0` and
//! treats `Upload-Offset == size` as done.

use std::fmt;

use crate::protocol::{
    content_length, parse_opt, plan_creation, too_large, CreationHeaders, CreationLimits, CreationPlan, PatchPlan, UploadState, OFFSET_OCTET_STREAM,
};
use crate::{
    ChecksumAlgorithm, ContentDigest, ErrorCode, RufhLength, RufhOffset, TusError, UploadChecksum, UploadComplete, UploadDraftInteropVersion,
    UploadLimit,
};

/// The media type of an append's body since draft -04 (interop version 6):
/// draft-ietf-httpbis-resumable-upload §Media Type `application/partial-upload`.
pub const PARTIAL_UPLOAD: &str = "application/partial-upload";

/// An interop version of the draft that ferry serves (`Upload-Draft-Interop-Version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InteropVersion {
    /// Interop version 5: draft -03; tus-js-client 4.3 `protocol: 'ietf-draft-03'`.
    V5,
    /// Interop version 6: draft -05; tus-js-client 4.3 `protocol: 'ietf-draft-05'`.
    V6,
    /// Interop version 8: draft -09 to -11.
    V8,
    /// Interop version 9: draft -12 and later. As 8, and: `GET` retrieves the offset
    /// ([`InteropVersion::offset_by_get`]); the `Incremental` request header passes CORS. What
    /// else -12 changed (`Upload-Complete` in responses, an offset past what the client sent,
    /// `Accept-Patch` no longer required) needs nothing new of ferry: its responses always
    /// carry `Upload-Complete`, its offsets never pass what was sent, and it keeps sending
    /// `Accept-Patch` on `OPTIONS` for version 8's clients.
    V9,
}

impl InteropVersion {
    /// Every version ferry serves, oldest first.
    pub const ALL: [InteropVersion; 4] = [InteropVersion::V5, InteropVersion::V6, InteropVersion::V8, InteropVersion::V9];

    /// The newest version ferry serves.
    pub const NEWEST: InteropVersion = InteropVersion::V9;

    /// The number sent in `Upload-Draft-Interop-Version`.
    pub fn number(self) -> u64 {
        match self {
            InteropVersion::V5 => 5,
            InteropVersion::V6 => 6,
            InteropVersion::V8 => 8,
            InteropVersion::V9 => 9,
        }
    }

    /// The version with this number, if ferry serves it.
    pub fn from_number(n: u64) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.number() == n)
    }

    /// `"5, 6, 8, 9"`: the versions ferry serves, as the README and OPTIONS list them.
    pub fn supported_list() -> String {
        Self::ALL.iter().map(|v| v.number().to_string()).collect::<Vec<_>>().join(", ")
    }

    /// The version a request's `Upload-Draft-Interop-Version` names. Errors: 400
    /// `invalid_argument` for a value that is not an Integer or a version ferry does not serve
    /// (the hint lists the ones it does).
    pub fn from_header(raw: &str) -> Result<Self, TusError> {
        let hint = || format!("Send Upload-Draft-Interop-Version with one of {}, or speak TUS 1.0 (Tus-Resumable: 1.0.0).", Self::supported_list());
        let n = raw.parse::<UploadDraftInteropVersion>().map_err(|e| TusError::bad_request(e.to_string(), hint()))?.0;
        Self::from_number(n)
            .ok_or_else(|| TusError::bad_request(format!("this server does not speak interop version {n} of the resumable-upload draft"), hint()))
    }

    /// Whether a creation carrying content is answered `104 (Upload Resumption Supported)` with
    /// the upload's `Location` before its content is read: interop version 8 and later (draft
    /// -09 added the 104 section, with `Upload-Draft-Interop-Version` required in it).
    pub fn sends_104(self) -> bool {
        self >= InteropVersion::V8
    }

    /// Whether `GET` of an upload retrieves its offset as `HEAD` does (draft -12, interop 9);
    /// before, `GET` of an upload resource was left to the server (ferry: the download).
    pub fn offset_by_get(self) -> bool {
        self >= InteropVersion::V9
    }

    /// Whether an append must declare `Content-Type: application/partial-upload` (draft -04 on).
    pub fn requires_partial_upload(self) -> bool {
        self >= InteropVersion::V6
    }

    /// The `Upload-Limit` this version knows how to say (none before draft -04): `max-size` in
    /// bytes, and the remaining lifetime in seconds as `expires` (version 6) or `max-age` (8).
    pub fn upload_limit(self, max_size: u64, lifetime_secs: Option<u64>) -> Option<UploadLimit> {
        match self {
            InteropVersion::V5 => None,
            InteropVersion::V6 => Some(UploadLimit { max_size: Some(max_size), expires: lifetime_secs, ..UploadLimit::default() }),
            InteropVersion::V8 | InteropVersion::V9 => {
                Some(UploadLimit { max_size: Some(max_size), max_age: lifetime_secs, ..UploadLimit::default() })
            }
        }
    }
}

impl fmt::Display for InteropVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.number())
    }
}

/// The draft's problem types (draft-ietf-httpbis-resumable-upload §Problem Types, RFC 9457).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DraftProblem {
    /// `mismatching-upload-offset` (409): the append's `Upload-Offset` is not the upload's.
    MismatchingOffset {
        /// The upload's offset (`expected-offset`).
        expected: u64,
        /// The request's offset (`provided-offset`).
        provided: u64,
    },
    /// `completed-upload` (400): the upload is complete and cannot be appended to.
    CompletedUpload,
    /// `inconsistent-upload-length` (400): the request's length indicators disagree with each
    /// other or with the length recorded before.
    InconsistentLength,
}

impl DraftProblem {
    /// The problem type URI, e.g.
    /// `https://iana.org/assignments/http-problem-types#mismatching-upload-offset`.
    pub fn type_uri(self) -> &'static str {
        match self {
            DraftProblem::MismatchingOffset { .. } => "https://iana.org/assignments/http-problem-types#mismatching-upload-offset",
            DraftProblem::CompletedUpload => "https://iana.org/assignments/http-problem-types#completed-upload",
            DraftProblem::InconsistentLength => "https://iana.org/assignments/http-problem-types#inconsistent-upload-length",
        }
    }

    /// The registered title.
    pub fn title(self) -> &'static str {
        match self {
            DraftProblem::MismatchingOffset { .. } => "Mismatching Upload Offset",
            DraftProblem::CompletedUpload => "Upload Is Completed",
            DraftProblem::InconsistentLength => "Inconsistent Upload Length Values",
        }
    }

    /// The problem type's extension members (name, bytes): `expected-offset` and
    /// `provided-offset` for a mismatching offset, none otherwise.
    pub fn members(self) -> Vec<(&'static str, u64)> {
        match self {
            DraftProblem::MismatchingOffset { expected, provided } => vec![("expected-offset", expected), ("provided-offset", provided)],
            _ => Vec::new(),
        }
    }
}

/// 400 `conflict` + `completed-upload`: an empty append to an upload that is complete.
/// `length` is its length (the cursor: nothing is left to send).
pub fn completed_upload(length: u64) -> TusError {
    TusError::new(
        400,
        ErrorCode::Conflict,
        "this upload is complete; nothing can be appended to it",
        "Nothing is left to send: fetch the file with GET.",
    )
    .with_cursor(length)
    .with_draft(DraftProblem::CompletedUpload)
}

/// 400 `invalid_argument` + `inconsistent-upload-length`.
pub fn inconsistent_length(detail: impl Into<String>, hint: impl Into<String>) -> TusError {
    TusError::bad_request(detail, hint).with_draft(DraftProblem::InconsistentLength)
}

/// The body of a request with `Upload-Complete: ?1` ended at `end`, short of the upload's known
/// `length`: the bytes that arrived are kept (the offset is `end`) and the upload stays open.
pub fn length_short(length: u64, end: u64) -> TusError {
    inconsistent_length(
        format!(
            "the request said it completes the upload, but its content ended at \
             offset {end}, short of the upload length {length}; the bytes were kept"
        ),
        format!("Send the remaining {} bytes from offset {end} with Upload-Complete: ?1.", length - end),
    )
    .with_cursor(end)
}

fn required_complete(raw: Option<&str>) -> Result<bool, TusError> {
    let hint = "Send Upload-Complete: ?1 if this request carries the end of the upload, ?0 if more follows.";
    match raw {
        None => Err(TusError::bad_request("missing Upload-Complete", hint)),
        Some(s) => s.parse::<UploadComplete>().map(|c| c.0).map_err(|e| TusError::bad_request(e.to_string(), hint)),
    }
}

/// `Content-Digest` (RFC 9530 §2) of one request's content as the chunk checksum the engine
/// verifies (sha-256 only; other algorithms are ignored, as RFC 9530 allows). Errors: 400 for
/// a malformed field or a sha-256 value that is not 32 bytes.
pub fn content_digest_checksum(raw: Option<&str>) -> Result<Option<UploadChecksum>, TusError> {
    let d: Option<ContentDigest> = raw
        .map(|s| {
            s.parse::<ContentDigest>()
                .map_err(|e| TusError::bad_request(e.to_string(), "Send Content-Digest: sha-256=:<base64 of the 32-byte digest>:, or omit it."))
        })
        .transpose()?;
    Ok(d.and_then(|d| d.sha256).map(|digest| UploadChecksum { algorithm: ChecksumAlgorithm::Sha256, digest: digest.to_vec() }))
}

/// Raw header values of a draft upload creation request (a `POST` carrying `Upload-Complete`);
/// each field is the value of the header it is named after.
#[allow(missing_docs)]
#[derive(Debug, Default, Clone, Copy)]
pub struct DraftCreationHeaders<'a> {
    pub upload_complete: Option<&'a str>,
    pub upload_length: Option<&'a str>,
    /// TUS 1.0's `Upload-Metadata`, which tus-js-client sends in draft mode too.
    pub upload_metadata: Option<&'a str>,
    pub repr_digest: Option<&'a str>,
    pub content_digest: Option<&'a str>,
    pub content_length: Option<&'a str>,
    /// True when the request carries content (chunked or non-zero `Content-Length`).
    pub has_body: bool,
}

/// What a valid draft creation asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftCreation {
    /// The upload to create, as a TUS creation would (length `None` while unknown).
    pub plan: CreationPlan,
    /// `Upload-Complete: ?1`: the request carries the whole representation.
    pub complete: bool,
    /// How to append the request's content at offset 0; `None` when it has none.
    pub body: Option<PatchPlan>,
}

/// draft-ietf-httpbis-resumable-upload §Upload Creation (server behaviour) and §Length.
///
/// The length is `Upload-Length` if sent, and with `Upload-Complete: ?1` also the content's
/// length (`Content-Length`, or 0 when there is no content); both must agree. Errors: missing
/// or malformed `Upload-Complete`, malformed `Upload-Length` or `Content-Digest` → 400;
/// disagreeing lengths, or content longer than `Upload-Length` → 400 `inconsistent-upload-length`;
/// a length above `limits.max_size` → 413; malformed metadata or `Repr-Digest` → 400 (as TUS).
pub fn plan_draft_creation(h: &DraftCreationHeaders<'_>, limits: &CreationLimits) -> Result<DraftCreation, TusError> {
    let complete = required_complete(h.upload_complete)?;
    let declared: Option<RufhLength> = parse_opt(h.upload_length)?;
    let cl = content_length(h.content_length)?;
    let indicated = match (complete, h.has_body) {
        (true, true) => cl,
        (true, false) => Some(0),
        (false, _) => None,
    };
    let length = match (declared.map(|d| d.0), indicated) {
        (Some(a), Some(b)) if a != b => {
            return Err(inconsistent_length(
                format!("Upload-Length {a} disagrees with the {b} bytes of content sent with Upload-Complete: ?1"),
                "Send the same length in Upload-Length and Content-Length, or omit Upload-Length.",
            ))
        }
        (Some(a), _) => Some(a),
        (None, b) => b,
    };
    if let (Some(len), Some(cl)) = (length, cl) {
        if cl > len {
            return Err(inconsistent_length(
                format!("the content ({cl} bytes) is longer than Upload-Length {len}"),
                format!("Send at most {len} bytes."),
            ));
        }
    }
    let length_text = length.map(|l| l.to_string());
    let tus = CreationHeaders {
        upload_length: length_text.as_deref(),
        upload_defer_length: if length.is_none() { Some("1") } else { None },
        upload_metadata: h.upload_metadata,
        upload_concat: None,
        upload_checksum: None,
        repr_digest: h.repr_digest,
        // The draft's creation content is the representation itself, whatever its media type.
        content_type: Some(OFFSET_OCTET_STREAM),
        content_length: h.content_length,
        has_body: h.has_body,
    };
    let plan = plan_creation(&tus, limits)?;
    let checksum = content_digest_checksum(h.content_digest)?;
    let body = h.has_body.then(|| PatchPlan {
        offset: 0,
        set_length: None,
        length: plan.length,
        max_bytes: plan.length.unwrap_or(limits.max_size),
        checksum,
        checksum_in_trailer: false,
        completes: complete,
    });
    Ok(DraftCreation { plan, complete, body })
}

/// Raw header values of a draft append (`PATCH` to the upload resource); each field is the
/// value of the header it is named after.
#[allow(missing_docs)]
#[derive(Debug, Default, Clone, Copy)]
pub struct DraftAppendHeaders<'a> {
    pub content_type: Option<&'a str>,
    pub upload_offset: Option<&'a str>,
    pub upload_complete: Option<&'a str>,
    pub upload_length: Option<&'a str>,
    pub content_length: Option<&'a str>,
    pub content_digest: Option<&'a str>,
    /// True when the request carries content (chunked or non-zero `Content-Length`).
    pub has_body: bool,
}

fn is_partial_upload(content_type: Option<&str>) -> bool {
    content_type.and_then(|ct| ct.split(';').next()).is_some_and(|ct| ct.trim().eq_ignore_ascii_case(PARTIAL_UPLOAD))
}

/// draft-ietf-httpbis-resumable-upload §Upload Append (server behaviour), decided before any
/// I/O from the upload's stored state.
///
/// Errors, in the order checked: a final (concatenated) upload → 403; interop version 6 or
/// later without `Content-Type: application/partial-upload` → 415; missing or malformed
/// `Upload-Offset` → 400; malformed `Upload-Complete`, or missing at interop version 8 → 400
/// (missing at 5 and 6 means `?0`, for tus-js-client); an offset other than
/// the upload's → 409 `mismatching-upload-offset` (the right offset in `Upload-Offset`, the
/// cursor and `expected-offset`); the upload is complete → 400 `completed-upload` for an empty
/// append, `inconsistent-upload-length` for one with content; an `Upload-Length` other than
/// the recorded one, below the offset, or contradicting the content of an
/// `Upload-Complete: ?1` request, or content running past the length → 400
/// `inconsistent-upload-length`; a length above `max_size` → 413; a malformed `Content-Digest`
/// → 400.
pub fn plan_draft_append(version: InteropVersion, state: &UploadState, h: &DraftAppendHeaders<'_>, max_size: u64) -> Result<PatchPlan, TusError> {
    if state.is_final {
        return Err(TusError::new(
            403,
            ErrorCode::Conflict,
            "a final (concatenated) upload cannot be appended to",
            "Send the bytes to its partial uploads instead.",
        ));
    }
    if version.requires_partial_upload() && !is_partial_upload(h.content_type) {
        return Err(TusError::new(
            415,
            ErrorCode::InvalidArgument,
            format!("an append must be sent as Content-Type: {PARTIAL_UPLOAD}"),
            format!("Send Content-Type: {PARTIAL_UPLOAD}."),
        ));
    }
    let offset = match h.upload_offset {
        None => {
            return Err(TusError::bad_request(
                "missing Upload-Offset",
                "Add the Upload-Offset header (HEAD shows the offset) and send the append again.",
            )
            .with_cursor(state.offset))
        }
        Some(raw) => raw.parse::<RufhOffset>().map_err(|e| TusError::from_parse(&e).with_cursor(state.offset))?.0,
    };
    // tus-js-client (interop 5 and 6) sends an empty last append without `Upload-Complete`
    // when a stream ends exactly on a chunk boundary: taken as `?0` there (its `Upload-Length`
    // equal to the offset then completes the upload); from version 8 on it is required.
    let complete = match (h.upload_complete, version) {
        (None, InteropVersion::V5 | InteropVersion::V6) => false,
        (raw, _) => required_complete(raw)?,
    };
    if offset != state.offset {
        return Err(TusError::offset_mismatch(state.offset, offset));
    }
    if state.length == Some(state.offset) {
        return Err(if h.has_body {
            inconsistent_length(
                "this upload is complete; content appended to it would run past its length",
                "Nothing is left to send: fetch the file with GET.",
            )
            .with_cursor(state.offset)
        } else {
            completed_upload(state.offset)
        });
    }
    let declared: Option<RufhLength> = parse_opt(h.upload_length)?;
    let cl = content_length(h.content_length)?;
    let mut set_length = None;
    let mut length = match (state.length, declared.map(|d| d.0)) {
        (Some(stored), Some(n)) if n != stored => {
            return Err(inconsistent_length(
                format!("Upload-Length {n} differs from the recorded length {stored}"),
                format!("Send Upload-Length: {stored}, or omit it."),
            ))
        }
        (Some(stored), _) => Some(stored),
        (None, Some(n)) => {
            if n < offset {
                return Err(inconsistent_length(
                    format!("Upload-Length {n} is below the bytes already stored ({offset})"),
                    format!("Declare a length of at least {offset} bytes."),
                ));
            }
            if n > max_size {
                return Err(too_large(max_size));
            }
            set_length = Some(n);
            Some(n)
        }
        (None, None) => None,
    };
    if complete {
        let content = if h.has_body { cl } else { Some(0) };
        if let Some(end) = content.and_then(|c| offset.checked_add(c)) {
            match length {
                Some(len) if len != end => {
                    return Err(inconsistent_length(
                        format!("the request completes the upload at offset {end}, but its length is {len}"),
                        format!("Send exactly {} bytes from offset {offset} with Upload-Complete: ?1.", len.saturating_sub(offset)),
                    )
                    .with_cursor(offset))
                }
                Some(_) => {}
                None => {
                    if end > max_size {
                        return Err(too_large(max_size));
                    }
                    set_length = Some(end);
                    length = Some(end);
                }
            }
        }
    }
    let max_bytes = length.unwrap_or(max_size).saturating_sub(offset);
    if let Some(cl) = cl {
        if cl > max_bytes {
            return Err(match length {
                Some(len) => inconsistent_length(
                    format!("the content ({cl} bytes) would run past the upload length {len}"),
                    format!("Send at most {max_bytes} bytes from offset {offset}."),
                )
                .with_cursor(offset),
                None => too_large(max_size),
            });
        }
    }
    let checksum = content_digest_checksum(h.content_digest)?;
    Ok(PatchPlan { offset, set_length, length, max_bytes, checksum, checksum_in_trailer: false, completes: complete })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: CreationLimits = CreationLimits { max_size: 1000, max_metadata: 4096 };

    fn state(offset: u64, length: Option<u64>) -> UploadState {
        UploadState { offset, length, is_final: false }
    }

    fn append<'a>(offset: &'a str, complete: &'a str) -> DraftAppendHeaders<'a> {
        DraftAppendHeaders { content_type: Some(PARTIAL_UPLOAD), upload_offset: Some(offset), upload_complete: Some(complete), ..Default::default() }
    }

    #[test]
    fn versions() {
        assert_eq!(InteropVersion::from_header("5"), Ok(InteropVersion::V5));
        assert_eq!(InteropVersion::from_header("6"), Ok(InteropVersion::V6));
        assert_eq!(InteropVersion::from_header("8"), Ok(InteropVersion::V8));
        assert_eq!(InteropVersion::from_header("9"), Ok(InteropVersion::V9));
        for bad in ["4", "7", "10", "x", "", "-6", "6.0"] {
            let e = InteropVersion::from_header(bad).unwrap_err();
            assert_eq!(e.status, 400, "{bad}");
            assert!(e.recovery_hint.contains("5, 6, 8, 9"), "{}", e.recovery_hint);
        }
        assert_eq!(InteropVersion::V5.upload_limit(10, Some(60)), None);
        assert_eq!(InteropVersion::V6.upload_limit(10, Some(60)).unwrap().to_string(), "max-size=10, expires=60");
        assert_eq!(InteropVersion::V8.upload_limit(10, Some(60)).unwrap().to_string(), "max-size=10, max-age=60");
        assert!(!InteropVersion::V5.requires_partial_upload() && InteropVersion::V6.requires_partial_upload());
    }

    #[test]
    fn creation_lengths() {
        // Without content, ?0: length unknown (deferred).
        let c = plan_draft_creation(&DraftCreationHeaders { upload_complete: Some("?0"), ..Default::default() }, &LIMITS).unwrap();
        assert_eq!((c.plan.length, c.complete, c.body.is_none()), (None, false, true));
        // ?1 without content: an empty representation.
        let c = plan_draft_creation(&DraftCreationHeaders { upload_complete: Some("?1"), ..Default::default() }, &LIMITS).unwrap();
        assert_eq!(c.plan.length, Some(0));
        // ?1 with Content-Length: the length.
        let h = DraftCreationHeaders { upload_complete: Some("?1"), content_length: Some("10"), has_body: true, ..Default::default() };
        let c = plan_draft_creation(&h, &LIMITS).unwrap();
        assert_eq!(c.plan.length, Some(10));
        assert_eq!(c.body.as_ref().map(|b| (b.completes, b.max_bytes)), Some((true, 10)));
        // ?0 with Upload-Length and part of the content.
        let h = DraftCreationHeaders {
            upload_complete: Some("?0"),
            upload_length: Some("100"),
            content_length: Some("10"),
            has_body: true,
            ..Default::default()
        };
        let c = plan_draft_creation(&h, &LIMITS).unwrap();
        assert_eq!((c.plan.length, c.body.map(|b| b.completes)), (Some(100), Some(false)));
        // Disagreeing indicators.
        let h = DraftCreationHeaders {
            upload_complete: Some("?1"),
            upload_length: Some("11"),
            content_length: Some("10"),
            has_body: true,
            ..Default::default()
        };
        assert_eq!(plan_draft_creation(&h, &LIMITS).unwrap_err().draft, Some(DraftProblem::InconsistentLength));
        let h = DraftCreationHeaders {
            upload_complete: Some("?0"),
            upload_length: Some("5"),
            content_length: Some("10"),
            has_body: true,
            ..Default::default()
        };
        assert_eq!(plan_draft_creation(&h, &LIMITS).unwrap_err().draft, Some(DraftProblem::InconsistentLength));
        // Limits and malformed fields.
        let h = DraftCreationHeaders { upload_complete: Some("?0"), upload_length: Some("1001"), ..Default::default() };
        assert_eq!(plan_draft_creation(&h, &LIMITS).unwrap_err().status, 413);
        for bad in [None, Some("1"), Some("true")] {
            let h = DraftCreationHeaders { upload_complete: bad, ..Default::default() };
            assert_eq!(plan_draft_creation(&h, &LIMITS).unwrap_err().status, 400, "{bad:?}");
        }
        let h = DraftCreationHeaders { upload_complete: Some("?0"), upload_length: Some("-1"), ..Default::default() };
        assert_eq!(plan_draft_creation(&h, &LIMITS).unwrap_err().status, 400);
    }

    #[test]
    fn append_decisions() {
        let s = state(10, Some(100));
        let p = plan_draft_append(InteropVersion::V8, &s, &append("10", "?0"), 1000).unwrap();
        assert_eq!((p.offset, p.max_bytes, p.completes), (10, 90, false));
        // Mismatching offset: 409 with both offsets.
        let e = plan_draft_append(InteropVersion::V8, &s, &append("20", "?0"), 1000).unwrap_err();
        assert_eq!((e.status, e.cursor, e.draft), (409, Some(10), Some(DraftProblem::MismatchingOffset { expected: 10, provided: 20 })));
        // Media type: required from version 6.
        let mut h = append("10", "?0");
        h.content_type = Some("application/offset+octet-stream");
        assert_eq!(plan_draft_append(InteropVersion::V6, &s, &h, 1000).unwrap_err().status, 415);
        h.content_type = None;
        assert!(plan_draft_append(InteropVersion::V5, &s, &h, 1000).is_ok());
        // Missing fields.
        let mut h = append("10", "?0");
        h.upload_complete = None;
        assert_eq!(plan_draft_append(InteropVersion::V8, &s, &h, 1000).unwrap_err().status, 400);
        assert!(!plan_draft_append(InteropVersion::V6, &s, &h, 1000).unwrap().completes);
        h = append("10", "?0");
        h.upload_offset = None;
        assert_eq!(plan_draft_append(InteropVersion::V8, &s, &h, 1000).unwrap_err().cursor, Some(10));
        // ?1 with a Content-Length that does not reach the length.
        let mut h = append("10", "?1");
        h.content_length = Some("50");
        h.has_body = true;
        assert_eq!(plan_draft_append(InteropVersion::V8, &s, &h, 1000).unwrap_err().draft, Some(DraftProblem::InconsistentLength));
        h.content_length = Some("90");
        assert!(plan_draft_append(InteropVersion::V8, &s, &h, 1000).unwrap().completes);
        // Another Upload-Length than recorded.
        let mut h = append("10", "?0");
        h.upload_length = Some("99");
        assert_eq!(plan_draft_append(InteropVersion::V8, &s, &h, 1000).unwrap_err().draft, Some(DraftProblem::InconsistentLength));
        // Content past the length.
        let mut h = append("10", "?0");
        h.content_length = Some("91");
        h.has_body = true;
        assert_eq!(plan_draft_append(InteropVersion::V8, &s, &h, 1000).unwrap_err().draft, Some(DraftProblem::InconsistentLength));
    }

    #[test]
    fn append_to_completed_and_deferred() {
        let done = state(100, Some(100));
        let e = plan_draft_append(InteropVersion::V8, &done, &append("100", "?1"), 1000).unwrap_err();
        assert_eq!((e.status, e.draft), (400, Some(DraftProblem::CompletedUpload)));
        let mut h = append("100", "?0");
        h.has_body = true;
        assert_eq!(plan_draft_append(InteropVersion::V8, &done, &h, 1000).unwrap_err().draft, Some(DraftProblem::InconsistentLength));
        // Deferred: ?1 with Content-Length sets the length; without it the engine does at EOF.
        let open = state(10, None);
        let mut h = append("10", "?1");
        h.content_length = Some("5");
        h.has_body = true;
        let p = plan_draft_append(InteropVersion::V8, &open, &h, 1000).unwrap();
        assert_eq!((p.set_length, p.length, p.max_bytes), (Some(15), Some(15), 5));
        h.content_length = None;
        let p = plan_draft_append(InteropVersion::V8, &open, &h, 1000).unwrap();
        assert_eq!((p.set_length, p.max_bytes, p.completes), (None, 990, true));
        // An empty ?1 completes at the current offset.
        let p = plan_draft_append(InteropVersion::V8, &open, &append("10", "?1"), 1000).unwrap();
        assert_eq!(p.set_length, Some(10));
        // Upload-Length below the offset, or above the maximum.
        let mut h = append("10", "?0");
        h.upload_length = Some("5");
        assert_eq!(plan_draft_append(InteropVersion::V8, &open, &h, 1000).unwrap_err().draft, Some(DraftProblem::InconsistentLength));
        h.upload_length = Some("1001");
        assert_eq!(plan_draft_append(InteropVersion::V8, &open, &h, 1000).unwrap_err().status, 413);
    }

    #[test]
    fn content_digest() {
        let c = content_digest_checksum(Some("sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:")).unwrap().unwrap();
        assert_eq!((c.algorithm, c.digest.len()), (ChecksumAlgorithm::Sha256, 32));
        assert_eq!(content_digest_checksum(Some("sha-512=:AAAA:")).unwrap(), None);
        assert_eq!(content_digest_checksum(Some("sha-256=:AAAA:")).unwrap_err().status, 400);
        assert_eq!(content_digest_checksum(None).unwrap(), None);
    }

    #[test]
    fn problem_types() {
        let m = DraftProblem::MismatchingOffset { expected: 1, provided: 2 };
        assert!(m.type_uri().ends_with("#mismatching-upload-offset"));
        assert_eq!(m.members(), vec![("expected-offset", 1), ("provided-offset", 2)]);
        assert!(DraftProblem::CompletedUpload.type_uri().ends_with("#completed-upload"));
        assert!(DraftProblem::InconsistentLength.type_uri().ends_with("#inconsistent-upload-length"));
        let e = completed_upload(7);
        assert_eq!((e.status, e.cursor, e.code), (400, Some(7), ErrorCode::Conflict));
        let e = length_short(100, 40);
        assert_eq!((e.cursor, e.draft), (Some(40), Some(DraftProblem::InconsistentLength)));
    }
}
