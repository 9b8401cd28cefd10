//! Recovery hints in HTTP and TUS terms: the `recovery_hint` of every problem body, worded
//! from a refusal's code and the context its engine gave ([`Next`]) — send HEAD, the header
//! to add, the REST path that lists what the client needs. The MCP layer words the same
//! contexts as tool calls; neither rewrites the other's sentences.

use crate::error::{ErrorCode, Next, Refusal, TrailerFault};

/// The next step for a browser upload refused because pages on `origin` may not upload to
/// `/files/`. A web origin is named as `[cors] allow_origins` keeps it; `null` (a sandboxed
/// iframe, a `file://` page) is never offered for the list — it would admit every page, as
/// `*` does — nor is a value no browser sends: both are told to serve the page from an origin
/// of its own and list that one.
pub(crate) fn foreign_origin(origin: &str) -> String {
    use crate::app::Listable;
    let serve_it = "serve the page from a web origin of its own (for a local page, e.g. `python3 -m \
                    http.server` makes it http://localhost:8000), then add that origin to [cors] allow_origins \
                    in ferry.toml (or --cors-allow-origins, or FERRY_CORS_ALLOW_ORIGINS) and restart ferry";
    match crate::app::listable(origin) {
        Listable::Origin(o) => format!(
            "To let pages on {o} upload, add it to [cors] allow_origins in ferry.toml (or start \
             ferry with --cors-allow-origins {o}, or FERRY_CORS_ALLOW_ORIGINS), then restart ferry."
        ),
        Listable::Opaque => format!(
            "The page has no origin of its own (`Origin: null`: a sandboxed iframe, a file:// page, a data: \
             URL), and allowing `null` would let every such page upload, so do not list it: {serve_it}."
        ),
        Listable::NotAnOrigin => format!("{origin:?} is not a web origin (scheme://host[:port]), so it cannot be allowed: {serve_it}."),
    }
}

/// The one next step of `e`, for an HTTP client.
pub(crate) fn hint(e: &Refusal) -> String {
    let at = |c: Option<u64>| c.map_or_else(|| "the offset HEAD shows".to_string(), |c| format!("offset {c}"));
    match &e.next {
        Next::ByCode => by_code(e),
        Next::Say(s) => s.to_string(),
        Next::LearnOffset => "Send HEAD to learn the offset, then resume from it.".into(),
        Next::Resume { soon: false } => format!("Resume from {}.", at(e.cursor)),
        Next::Resume { soon: true } => format!("Resume from {} in a moment.", at(e.cursor)),
        Next::BodyCut => {
            format!("Check the body's framing (Content-Length, chunked encoding) and send the rest from {} (HEAD shows it).", at(e.cursor))
        }
        Next::SendAtMost { bytes } => format!("Send at most {bytes} bytes starting at {}.", at(e.cursor)),
        Next::Trailer(TrailerFault::Unannounced) => "Send `Trailer: Upload-Checksum` with the request, or send the checksum as a header.".into(),
        Next::Trailer(TrailerFault::Disagrees) => "Send the chunk's checksum once, as a header or as an announced trailer.".into(),
        Next::Trailer(TrailerFault::Missing) => "Send the chunk again with its Upload-Checksum header or trailer.".into(),
        Next::Trailer(TrailerFault::NotAscii) => "Send `algorithm base64digest`.".into(),
        Next::Finishing { offset } => {
            format!(
                "Ask again after Retry-After seconds: the server keeps trying by itself, \
                 and the upload is complete once HEAD shows Upload-Offset {offset}."
            )
        }
        Next::KeyReused { task: false } => "Use a new Idempotency-Key for a different upload, or resend the original request unchanged.".into(),
        Next::KeyReused { task: true } => "Use a new Idempotency-Key for different arguments, or resend the original arguments.".into(),
        Next::ListTasks => "List your tasks with GET /api/v1/tasks.".into(),
        Next::ArgsSchema { kind } => {
            format!("Send args as the schema of kind {kind} says (the StartTask schema of /api/v1/openapi.json), then start the task again.")
        }
        Next::UnknownFiles { ids, many } => {
            let (what, them) = if *many { ("ids", "them") } else { ("id", "it") };
            format!(
                "No file of yours has the {what} {ids} (never created, deleted, or expired): check {them} with \
                 file_list (MCP) or GET /api/v1/files, and start the task again with ids of finished files."
            )
        }
        Next::UnfinishedFiles { ids } => {
            format!("Finish uploading {ids} (file_status or GET /api/v1/files/ID shows the offset), then start the task again.")
        }
        Next::AlreadyComplete => "Nothing more can be sent to this upload: it is complete. \
                                  Download it with GET, or create a new upload for other bytes."
            .into(),
        Next::AwaitParts => "Nothing is sent to a final upload: the server builds it once each of its parts \
                             is uploaded. Finish the parts (HEAD on each shows its offset), then ask again."
            .into(),
    }
}

/// The step a code implies by itself, with the refusal's cursor and quota.
fn by_code(e: &Refusal) -> String {
    match e.code {
        ErrorCode::NotFound => "Check the id (uploads of other principals, deleted ones and long-expired \
                                ones do not exist); to upload anew, POST to the upload collection."
            .into(),
        ErrorCode::UploadExpired => "Create a new upload with POST and send the file again.".into(),
        ErrorCode::Locked => "Wait a moment, send HEAD to learn the offset, then resume from it.".into(),
        ErrorCode::Internal => "Retry after a moment (an upload: send HEAD first to learn the offset to resume from).".into(),
        ErrorCode::Unavailable => "Retry after Retry-After seconds (an upload: send HEAD first to learn the offset to resume from).".into(),
        ErrorCode::InsufficientStorage => match e.cursor {
            Some(c) => {
                format!(
                    "Nothing acknowledged was lost: the upload is kept at offset {c}. Retry from \
                     offset {c} later (after Retry-After), once the server has free space again."
                )
            }
            None => "Retry later (after Retry-After), once the server has free space again; a smaller file may fit sooner.".into(),
        },
        ErrorCode::QuotaExceeded if e.quota.as_ref().is_some_and(|q| q.name == "uploads_in_progress") => {
            "Finish or delete one of your unfinished uploads (GET /api/v1/files lists them), then create this one again.".into()
        }
        ErrorCode::QuotaExceeded => match e.cursor {
            Some(c) => format!(
                "Nothing acknowledged was lost: the upload is kept at offset {c}. Delete files \
                 you no longer need (or ask for a larger quota), then resume from offset {c}."
            ),
            None => "Delete files you no longer need (or ask the operator for a larger quota), then try again.".into(),
        },
        ErrorCode::StoreRefused => "The server's storage refused this for good (the detail names what it refused); nothing stored \
                                    was lost. Report it to the server's operator, who must change the store or the server's settings."
            .into(),
        ErrorCode::Damaged => "The file cannot be downloaded: upload it again (and delete this \
                               one), or ask the operator to restore its bytes from a backup."
            .into(),
        _ if e.code.retryable() => "Send HEAD to learn the offset, then retry the request.".into(),
        _ => "Read the problem's detail, fix what it names, and send the request again.".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::QuotaDetail;

    /// Every context an engine can give, for every code: the hint says retry only for a
    /// retryable code, and is never empty (issue 23, kind 15).
    #[test]
    fn every_context_reads_as_its_code_allows() {
        let mut wrong = Vec::new();
        for code in ErrorCode::ALL {
            for next in crate::error::tests_support::contexts() {
                for (cursor, quota) in [(None, None), (Some(7), None), (Some(7), Some("bytes")), (None, Some("uploads_in_progress"))] {
                    let mut e = Refusal::new(code.status(), code, "detail", next.clone());
                    e.cursor = cursor;
                    e.quota = quota.map(|name| Box::new(QuotaDetail { name, limit: 1, used: 1, requested: 1 }));
                    let h = hint(&e);
                    assert!(!h.is_empty());
                    // Only the code's own step is bound to the code; a context is given with
                    // the codes its engine pairs it with (checked at the sites).
                    if next == Next::ByCode && crate::error_catalogue_tests::says_retry(&h) && !code.retryable() {
                        wrong.push(format!("{code}: {h:?}"));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn hints_keep_their_words() {
        let e = Refusal::insufficient_storage("full", Some(4096));
        assert!(hint(&e).contains("4096"), "{}", hint(&e));
        let e = Refusal::new(408, ErrorCode::Locked, "stalled", Next::Resume { soon: false }).with_cursor(10);
        assert_eq!(hint(&e), "Resume from offset 10.");
        let e = Refusal::new(404, ErrorCode::NotFound, "d", Next::UnknownFiles { ids: "a, b".into(), many: true });
        assert!(hint(&e).starts_with("No file of yours has the ids a, b (never"), "{}", hint(&e));
    }
}
