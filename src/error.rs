//! ferry's error catalogue (DESIGN §5): the one list of codes every transport sends, each with
//! its usual status, its retryability and its `Retry-After`; and [`Refusal`], the error every
//! engine returns — a code, a detail, and the *context* of the next step ([`Next`]: an offset,
//! ids, a task kind), never the words of a transport.
//!
//! Each transport words the next step itself: `http::hints` in HTTP and TUS terms (send HEAD,
//! `GET /api/v1/files`), `mcp` as the tool to call and its arguments. The protocol crate
//! `ferry_tus` keeps only the refusals TUS 1.0 and the IETF draft define; its
//! [`ferry_tus::TusError`] converts into a [`Refusal`] here, keeping the protocol's own words.
//!
//! A leaf module: it names nothing of ferry's, so every layer may use it.

use std::borrow::Cow;
use std::fmt;

/// Stable error codes shared by HTTP problem bodies and MCP error envelopes (DESIGN §5): the
/// protocol's seven ([`ferry_tus::ErrorCode`]) and the application's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    OffsetMismatch,
    ChecksumMismatch,
    SizeExceeded,
    /// An MCP inline chunk larger than the server takes in one call: 413.
    ChunkTooLarge,
    /// A task's input file (or a read) needs a finished upload: 409.
    UploadIncomplete,
    UploadExpired,
    NotFound,
    Conflict,
    /// Another request holds the upload (or the server is shutting down or finishing it).
    Locked,
    InvalidArgument,
    /// No valid token, or not allowed for it: 401/403.
    Unauthorized,
    /// A task's job failed (the task's `error`).
    TaskFailed,
    /// A task was cancelled (the task's `error`).
    Cancelled,
    /// The server's disk (or quota) has no room for these bytes (DESIGN §9): 507.
    InsufficientStorage,
    /// A store is briefly unable to answer (a failing catalog write, too many open files):
    /// 503 with `Retry-After` (DESIGN §9).
    Unavailable,
    /// A hook the operator configured (pre-create, pre-finish) refused the request; the
    /// status and message are the hook's (DESIGN §8).
    Rejected,
    /// A per-principal quota (bytes stored, uploads in progress) has no room for this request:
    /// 507 for bytes, 429 for uploads in progress; the refusal names the quota, its limit and
    /// the current use ([`QuotaDetail`]).
    QuotaExceeded,
    /// A hook the operator configured answered something other than the documented JSON (a
    /// 2xx that is not a JSON object, metadata that does not encode, a redirect, an answer too
    /// large): 502, not retryable — the same request gets the same answer until the operator
    /// fixes the hook (DESIGN §8). Nothing was created; a finishing upload keeps every byte.
    HookInvalid,
    /// The blob store (S3) refused a request for good — credentials or a bucket policy that
    /// refuse, a request the store does not implement: 502, not retryable; the detail names
    /// the request and the store's status and code. Nothing stored was lost; an operator must
    /// change the store or the server's settings.
    StoreRefused,
    /// `ferry check` found this finished file's stored bytes damaged (they no longer hash to
    /// its sha256, or are missing) and the operator marked it (`--repair-catalog`): 500, not
    /// retryable — downloads refuse instead of serving wrong bytes, until the bytes are
    /// restored (a later check clears the mark) or the file is deleted.
    Damaged,
    Internal,
}

impl ErrorCode {
    /// Every code, in catalogue order.
    pub const ALL: [ErrorCode; 21] = [
        ErrorCode::OffsetMismatch,
        ErrorCode::ChecksumMismatch,
        ErrorCode::SizeExceeded,
        ErrorCode::ChunkTooLarge,
        ErrorCode::UploadIncomplete,
        ErrorCode::UploadExpired,
        ErrorCode::NotFound,
        ErrorCode::Conflict,
        ErrorCode::Locked,
        ErrorCode::InvalidArgument,
        ErrorCode::Unauthorized,
        ErrorCode::TaskFailed,
        ErrorCode::Cancelled,
        ErrorCode::InsufficientStorage,
        ErrorCode::Unavailable,
        ErrorCode::Rejected,
        ErrorCode::QuotaExceeded,
        ErrorCode::HookInvalid,
        ErrorCode::StoreRefused,
        ErrorCode::Damaged,
        ErrorCode::Internal,
    ];

    /// The snake_case word sent on the wire, e.g. `"offset_mismatch"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::OffsetMismatch => "offset_mismatch",
            ErrorCode::ChecksumMismatch => "checksum_mismatch",
            ErrorCode::SizeExceeded => "size_exceeded",
            ErrorCode::ChunkTooLarge => "chunk_too_large",
            ErrorCode::UploadIncomplete => "upload_incomplete",
            ErrorCode::UploadExpired => "upload_expired",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Locked => "locked",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::TaskFailed => "task_failed",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::InsufficientStorage => "insufficient_storage",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Rejected => "rejected",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::HookInvalid => "hook_invalid",
            ErrorCode::StoreRefused => "store_refused",
            ErrorCode::Damaged => "damaged",
            ErrorCode::Internal => "internal",
        }
    }

    /// The code of this wire word, if it is one.
    pub fn parse(word: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == word)
    }

    /// The usual HTTP status of a refusal with this code (RFC 9110 §15; DESIGN §3 and §9);
    /// a refusal may name another one (`locked` is 409, 423, 408 or 503 by its cause).
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::OffsetMismatch | ErrorCode::Conflict | ErrorCode::UploadIncomplete => 409,
            ErrorCode::ChecksumMismatch => 460,
            ErrorCode::SizeExceeded | ErrorCode::ChunkTooLarge => 413,
            ErrorCode::UploadExpired => 410,
            ErrorCode::NotFound => 404,
            ErrorCode::Locked => 423,
            ErrorCode::InvalidArgument => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Rejected => 403,
            ErrorCode::InsufficientStorage | ErrorCode::QuotaExceeded => 507,
            ErrorCode::Unavailable => 503,
            ErrorCode::HookInvalid | ErrorCode::StoreRefused => 502,
            ErrorCode::TaskFailed | ErrorCode::Cancelled | ErrorCode::Damaged | ErrorCode::Internal => 500,
        }
    }

    /// Whether repeating the (repaired) request can succeed without a person's help.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::OffsetMismatch
                | ErrorCode::ChecksumMismatch
                | ErrorCode::ChunkTooLarge
                | ErrorCode::UploadIncomplete
                | ErrorCode::Locked
                | ErrorCode::InsufficientStorage
                | ErrorCode::Unavailable
                | ErrorCode::Internal
        )
    }

    /// Seconds a client should wait before retrying (`Retry-After`, RFC 9110 §10.2.3), for the
    /// codes that name a resource that comes back by itself: 507 and 503.
    pub fn retry_after_secs(self) -> Option<u32> {
        match self {
            ErrorCode::InsufficientStorage => Some(30),
            ErrorCode::Unavailable => Some(2),
            // Another request holds the upload; it is asked to stop and does within seconds.
            ErrorCode::Locked => Some(1),
            _ => None,
        }
    }
}

impl From<ferry_tus::ErrorCode> for ErrorCode {
    fn from(c: ferry_tus::ErrorCode) -> Self {
        match c {
            ferry_tus::ErrorCode::OffsetMismatch => ErrorCode::OffsetMismatch,
            ferry_tus::ErrorCode::ChecksumMismatch => ErrorCode::ChecksumMismatch,
            ferry_tus::ErrorCode::SizeExceeded => ErrorCode::SizeExceeded,
            ferry_tus::ErrorCode::UploadExpired => ErrorCode::UploadExpired,
            ferry_tus::ErrorCode::NotFound => ErrorCode::NotFound,
            ferry_tus::ErrorCode::Conflict => ErrorCode::Conflict,
            ferry_tus::ErrorCode::InvalidArgument => ErrorCode::InvalidArgument,
            // `#[non_exhaustive]`: a protocol code this build does not know yet.
            _ => ErrorCode::InvalidArgument,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which per-principal quota refused a request, with numbers a client can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaDetail {
    /// `"bytes"` (bytes stored) or `"uploads_in_progress"` (unfinished uploads).
    pub name: &'static str,
    /// The configured limit (bytes, or a count).
    pub limit: u64,
    /// The principal's current use, without this request (bytes, or a count).
    pub used: u64,
    /// What this request needed on top (bytes, or 1 upload).
    pub requested: u64,
}

/// The context of a refusal's next step: what a transport needs to word it. The offset to
/// resume from is the refusal's `cursor`; everything else is here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// The code's own step, from the code, the cursor and the quota alone (an unknown upload,
    /// a lock held, no space, a quota reached, a store briefly failing, damaged bytes…).
    ByCode,
    /// A step in words that name no transport (no method, header, path or tool), shown as
    /// they are where the transport has nothing more precise; or, from a transport or the
    /// protocol crate, that transport's own words.
    Say(Cow<'static, str>),
    /// The stored offset moved or is unknown: learn it, then resume from it.
    LearnOffset,
    /// Resume from the cursor; `soon`: after a moment (the server is shutting down).
    Resume { soon: bool },
    /// The body ended early or was malformed: check its framing, then send the rest from the
    /// cursor.
    BodyCut,
    /// The body ran past the upload's length: send at most `bytes` from the cursor.
    SendAtMost { bytes: u64 },
    /// A checksum trailer went wrong (TUS checksum-trailer).
    Trailer(TrailerFault),
    /// The upload's bytes are all stored and the server is still finishing it by itself: ask
    /// again later; it is complete once its offset reads `offset`.
    Finishing { offset: u64 },
    /// An idempotency key already names a different request (`task`: a task's start, else an
    /// upload's creation): use a new key, or repeat the original request.
    KeyReused { task: bool },
    /// No task of the caller has this id: list the tasks.
    ListTasks,
    /// A task's args do not fit its kind's schema: send them as the schema of `kind` says.
    ArgsSchema { kind: String },
    /// A task's input files are unknown to the caller (`ids`, comma-separated).
    UnknownFiles { ids: String, many: bool },
    /// A task's input files are not finished uploads yet (`ids`, comma-separated).
    UnfinishedFiles { ids: String },
    /// A final upload (TUS 1.0 §Concatenation) is not built yet: it is built by the server once
    /// each of its parts is uploaded; nothing is sent to the final itself.
    AwaitParts,
    /// The upload already holds all of its bytes: nothing more is sent; read, share or
    /// download the finished file.
    AlreadyComplete,
}

/// What went wrong with a checksum trailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrailerFault {
    /// It arrived without being announced.
    Unannounced,
    /// It disagrees with the checksum header.
    Disagrees,
    /// It was announced but did not arrive.
    Missing,
    /// Its value is not ASCII.
    NotAscii,
}

impl From<&'static str> for Next {
    fn from(s: &'static str) -> Self {
        Next::Say(Cow::Borrowed(s))
    }
}

impl From<String> for Next {
    fn from(s: String) -> Self {
        Next::Say(Cow::Owned(s))
    }
}

/// A refused request (DESIGN §5): status, stable code, a human detail, the context of the one
/// next step, and the byte offset the client should continue from where one is known.
///
/// Rendered as an RFC 9457 `application/problem+json` body by `http` and as an error envelope
/// by `mcp`, each wording [`Refusal::next`] itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// HTTP status code (RFC 9110 §15), e.g. 409.
    pub status: u16,
    pub code: ErrorCode,
    /// What went wrong, for a person; never contains internal error text.
    pub detail: String,
    /// What the next step needs; each transport words it.
    pub next: Next,
    /// Byte offset to resume from, when known (`partial.cursor`).
    pub cursor: Option<u64>,
    /// The IETF resumable-upload draft's problem type for this refusal, when it has one; the
    /// HTTP layer renders it for requests that speak the draft.
    pub draft: Option<ferry_tus::DraftProblem>,
    /// For `quota_exceeded`: which quota, its limit and the current use (the problem body's
    /// `quota` member and `error.quota` in MCP envelopes).
    pub quota: Option<Box<QuotaDetail>>,
    /// Seconds the client should wait before asking again (`Retry-After`), when this refusal
    /// names one itself; otherwise [`ErrorCode::retry_after_secs`] applies.
    pub retry_after: Option<u32>,
}

impl Refusal {
    /// A refusal with `status`, `code`, `detail` and the context of its next step (a string is
    /// [`Next::Say`]).
    pub fn new(status: u16, code: ErrorCode, detail: impl Into<String>, next: impl Into<Next>) -> Self {
        Refusal { status, code, detail: detail.into(), next: next.into(), cursor: None, draft: None, quota: None, retry_after: None }
    }

    /// 400 `invalid_argument`: a malformed or contradictory request.
    pub fn bad_request(detail: impl Into<String>, next: impl Into<Next>) -> Self {
        Refusal::new(400, ErrorCode::InvalidArgument, detail, next)
    }

    /// Tell the client to wait `secs` seconds before asking again (`Retry-After`).
    pub fn with_retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// Seconds the client should wait before retrying: this refusal's own, else its code's.
    pub fn retry_after_secs(&self) -> Option<u32> {
        self.retry_after.or(self.code.retry_after_secs())
    }

    /// Attach the byte offset the client should resume from.
    pub fn with_cursor(mut self, cursor: u64) -> Self {
        self.cursor = Some(cursor);
        self
    }

    fn by_code(code: ErrorCode, detail: impl Into<String>) -> Self {
        Refusal::new(code.status(), code, detail, Next::ByCode)
    }

    /// 404 `not_found` for an upload id.
    pub fn not_found() -> Self {
        Refusal::by_code(ErrorCode::NotFound, "no upload with this id")
    }

    /// 410 `upload_expired`.
    pub fn expired() -> Self {
        Refusal::by_code(ErrorCode::UploadExpired, "this upload expired and its bytes were removed")
    }

    /// 423 `locked`: another request holds the upload; `offset` is its stored offset if known.
    pub fn locked(offset: Option<u64>) -> Self {
        let e = Refusal::by_code(ErrorCode::Locked, "another request is writing to this upload");
        Refusal { cursor: offset, ..e }
    }

    /// 500 `internal`; the cause belongs in the logs, never in the body.
    pub fn internal() -> Self {
        Refusal::by_code(ErrorCode::Internal, "the server failed to complete this request; stored data is unchanged")
    }

    /// 507 `insufficient_storage` (DESIGN §9): no room for the bytes. `detail` says which
    /// limit (disk full, quota, the server's free-space reserve); `cursor` is the durable offset
    /// the upload resumes from, when there is an upload.
    pub fn insufficient_storage(detail: impl Into<String>, cursor: Option<u64>) -> Self {
        Refusal { cursor, ..Refusal::by_code(ErrorCode::InsufficientStorage, detail) }
    }

    /// `quota_exceeded`: a per-principal quota has no room. Bytes stored → 507 Insufficient
    /// Storage (DESIGN §9: a quota reached is a lack of space; RFC 4918 §11.5 and RFC 4331's
    /// WebDAV quotas answer 507 too); uploads in progress → 429 Too Many Requests (a limit on
    /// concurrent work, as AWS Lambda's concurrency limit; it frees when an upload finishes or
    /// expires). `cursor` is the durable offset of the upload the request was writing, if any.
    pub fn quota_exceeded(q: QuotaDetail, cursor: Option<u64>) -> Self {
        let (status, detail) = if q.name == "uploads_in_progress" {
            (429, format!("quota reached: {} of {} uploads in progress; finish, delete or let expire one of them first", q.used, q.limit))
        } else {
            (507, format!("quota reached: {} of {} bytes stored; this needs {} more", q.used, q.limit, q.requested))
        };
        Refusal { cursor, quota: Some(Box::new(q)), ..Refusal::new(status, ErrorCode::QuotaExceeded, detail, Next::ByCode) }
    }

    /// 503 `unavailable` (DESIGN §9): a store failed briefly (a catalog write, too many open
    /// files); nothing was changed.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Refusal::by_code(ErrorCode::Unavailable, detail)
    }

    /// 500 `damaged`: `ferry check --repair-catalog` marked this finished file's stored bytes
    /// as damaged (`kind`: `sha256_mismatch` or `missing`); nothing is served.
    pub fn damaged(kind: &str) -> Self {
        Refusal::damaged_found(kind, "found by ferry check")
    }

    /// 500 `damaged`: reading this finished file found its stored bytes missing or cut short
    /// (before any `ferry check` mark); nothing is served.
    pub fn damaged_on_read() -> Self {
        Refusal::damaged_found("missing", "found when it was read")
    }

    fn damaged_found(kind: &str, how: &str) -> Self {
        let what = if kind == "missing" { "are missing from the blob store" } else { "no longer match its sha256" };
        Refusal::by_code(ErrorCode::Damaged, format!("the stored bytes of this file {what} ({how}); nothing is served"))
    }
}

/// A refusal the protocol decided keeps its status, code, cursor and draft problem type, and
/// its hint in the protocol's words ([`Next::Say`]) — or, for bytes sent to a complete upload,
/// [`Next::AlreadyComplete`], which each transport words.
impl From<ferry_tus::TusError> for Refusal {
    fn from(e: ferry_tus::TusError) -> Self {
        let next = if e.complete { Next::AlreadyComplete } else { Next::Say(e.recovery_hint.into()) };
        Refusal { cursor: e.cursor, draft: e.draft, ..Refusal::new(e.status, e.code.into(), e.detail, next) }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.detail)
    }
}

impl std::error::Error for Refusal {}

/// One value of every [`Next`] context, for the transports' tests of their wording.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::{Next, TrailerFault};

    /// Every context (a new variant fails to compile in `covered` until it is listed here).
    pub(crate) fn contexts() -> Vec<Next> {
        let all = vec![
            Next::ByCode,
            Next::Say("Fix the arguments and start the task again.".into()),
            Next::LearnOffset,
            Next::Resume { soon: false },
            Next::Resume { soon: true },
            Next::BodyCut,
            Next::SendAtMost { bytes: 5 },
            Next::Trailer(TrailerFault::Unannounced),
            Next::Trailer(TrailerFault::Disagrees),
            Next::Trailer(TrailerFault::Missing),
            Next::Trailer(TrailerFault::NotAscii),
            Next::Finishing { offset: 9 },
            Next::KeyReused { task: false },
            Next::KeyReused { task: true },
            Next::ListTasks,
            Next::ArgsSchema { kind: "archive".into() },
            Next::UnknownFiles { ids: "aaaaaaaaaaaaaaaaaaaaaaaaaa".into(), many: false },
            Next::UnfinishedFiles { ids: "aaaaaaaaaaaaaaaaaaaaaaaaaa".into() },
            Next::AwaitParts,
            Next::AlreadyComplete,
        ];
        all.iter().for_each(covered);
        all
    }

    fn covered(n: &Next) {
        match n {
            Next::ByCode
            | Next::Say(_)
            | Next::LearnOffset
            | Next::Resume { .. }
            | Next::BodyCut
            | Next::SendAtMost { .. }
            | Next::Trailer(_)
            | Next::Finishing { .. }
            | Next::KeyReused { .. }
            | Next::ListTasks
            | Next::ArgsSchema { .. }
            | Next::UnknownFiles { .. }
            | Next::UnfinishedFiles { .. }
            | Next::AwaitParts
            | Next::AlreadyComplete => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_is_complete_and_names_every_protocol_code() {
        let words: std::collections::HashSet<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(words.len(), ErrorCode::ALL.len());
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(c.as_str()), Some(c));
        }
        // The protocol's codes are the catalogue's, word for word.
        for p in ferry_tus::ErrorCode::ALL {
            assert_eq!(ErrorCode::from(p).as_str(), p.as_str());
        }
    }

    #[test]
    fn exhaustion_errors_are_retryable_with_a_cursor_and_retry_after() {
        let e = Refusal::insufficient_storage("no space left on the server's disk", Some(4096));
        assert_eq!((e.status, e.code.as_str(), e.cursor), (507, "insufficient_storage", Some(4096)));
        assert!(e.code.retryable());
        assert_eq!(ErrorCode::InsufficientStorage.retry_after_secs(), Some(30));
        let u = Refusal::unavailable("the catalog could not write");
        assert_eq!((u.status, u.code.as_str(), u.code.retryable()), (503, "unavailable", true));
        assert_eq!(ErrorCode::Unavailable.retry_after_secs(), Some(2));
        assert_eq!(ErrorCode::Internal.retry_after_secs(), None);
        let q = Refusal::quota_exceeded(QuotaDetail { name: "uploads_in_progress", limit: 2, used: 2, requested: 1 }, None);
        assert_eq!((q.status, q.code, q.next), (429, ErrorCode::QuotaExceeded, Next::ByCode));
    }

    #[test]
    fn a_protocol_refusal_keeps_its_words_cursor_and_draft_type() {
        let e = Refusal::from(ferry_tus::TusError::offset_mismatch(7, 3));
        assert_eq!((e.status, e.code, e.cursor), (409, ErrorCode::OffsetMismatch, Some(7)));
        assert_eq!(e.next, Next::from("Re-send this chunk starting at offset 7.".to_string()));
        assert!(e.draft.is_some());
    }
}
