//! How ferry talks to S3 when a request fails: the bounds on one request (a deadline, the
//! retries object_store makes and the same ones, through backon, for the requests ferry sends
//! itself) and the mapping of S3's failures onto [`BlobError`].

use std::time::Duration;

use object_store::{BackoffConfig, RetryConfig};

use crate::blob::BlobError;

/// object_store's retries of one S3 request (5xx, `SlowDown`, connection errors, timeouts):
/// at most 3 more attempts, 100 ms then doubling backoff (at most 1 s), and none started
/// after 10 s — so a request is not held for minutes while S3 is away (object_store's default
/// is 10 retries over up to 3 minutes). The client then gets `503 unavailable` with
/// `Retry-After` and retries itself.
pub fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig { init_backoff: Duration::from_millis(100), max_backoff: Duration::from_secs(1), base: 2.0 },
        max_retries: 3,
        retry_timeout: Duration::from_secs(10),
    }
}

/// The same bounded retries as [`retry_config`] for the requests ferry signs and sends itself
/// (UploadPartCopy, the numbered CompleteMultipartUpload): 100 ms, 200 ms, 400 ms.
pub(super) fn own_retries() -> backon::ExponentialBuilder {
    let r = retry_config();
    crate::retry::doubling(r.backoff.init_backoff, r.backoff.max_backoff).with_max_times(r.max_retries)
}

/// Longest ferry waits for an S3 request that carries no data (HEAD, DELETE, a marker object,
/// CreateMultipartUpload, the readiness probe), object_store's retries included. A request
/// with data gets one more second per MiB ([`deadline_for`]). object_store's own limits still
/// apply inside: 5 s to connect, 30 s for one attempt, no new attempt after 10 s
/// ([`retry_config`]). A frozen S3 (it accepts connections and never answers) thus costs a
/// client at most this long, then `503 unavailable`, instead of the 30 s of one silent attempt.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// [`REQUEST_DEADLINE`] plus one second per MiB of `bytes` sent or read.
pub fn deadline_for(bytes: u64) -> Duration {
    REQUEST_DEADLINE + Duration::from_secs(bytes.div_ceil(1024 * 1024))
}

/// S3 did not answer within the deadline: as retryable as a refused connection.
#[derive(Debug)]
pub(super) struct NoAnswer(Duration);

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3 did not answer within {}", crate::units::human_duration(self.0))
    }
}

impl std::error::Error for NoAnswer {}

/// `fut` (an S3 request) bounded by `deadline`; running out is an `Unavailable` error
/// ([`classify`]). The request is dropped: an object it was writing may still appear later,
/// which the catalog's state (the truth) never names.
pub(super) async fn bounded<T>(deadline: Duration, fut: impl std::future::Future<Output = object_store::Result<T>>) -> object_store::Result<T> {
    match tokio::time::timeout(deadline, fut).await {
        Ok(r) => r,
        Err(_) => Err(object_store::Error::Generic { store: "S3", source: Box::new(NoAnswer(deadline)) }),
    }
}

/// What an S3 failure means for the caller, once object_store's own bounded retries are spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// 404: the object (or multipart upload) is not there.
    NotFound,
    /// The store is away or refuses for now: no connection, a timeout, a dropped response,
    /// 5xx / 429 / 408, an error body such as `SlowDown` or `InternalError`, 403 / 401
    /// (a bucket policy or credentials that refuse; an operator can fix it without losing
    /// anything). The request may succeed later.
    Unavailable,
    /// Anything else (400 `InvalidPart`, a response that does not parse…): retrying the same
    /// request cannot help.
    Other,
}

/// Classify an object_store error. object_store 0.14 keeps its `RetryError` (the one carrying
/// the HTTP status) in a private module, so a status it did not map to a variant of its own
/// (`NotFound`, `PermissionDenied`, …) is read from the error's message, which it formats as
/// `Server returned non-2xx status code: 503 Service Unavailable: …` or, for an error in the
/// body of a 200 (S3's `SlowDown` / `InternalError`), `Server returned error response: …`.
/// Transport failures are its public `HttpError` in the source chain.
pub(super) fn classify(e: &object_store::Error) -> Failure {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => return Failure::NotFound,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => return Failure::Unavailable,
        // 409: S3's `OperationAborted` (a conflicting operation in progress on the key).
        E::AlreadyExists { .. } => return Failure::Unavailable,
        E::Generic { .. } => {}
        _ => return Failure::Other,
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<object_store::client::HttpError>() || err.is::<NoAnswer>() {
            return Failure::Unavailable;
        }
        cur = err.source();
    }
    classify_message(&e.to_string())
}

/// [`classify`] for an error's message (see there).
pub(super) fn classify_message(msg: &str) -> Failure {
    if msg.contains("Server returned error response") {
        return Failure::Unavailable;
    }
    // A key a DeleteObjects answer lists under `<Error>` (object_store's `DeleteFailed`):
    // judged by its S3 error code, as a single request's status would be.
    if let Some(at) = msg.find("DeleteObjects request failed for key").and_then(|_| msg.rfind("(code: ")) {
        let code = msg[at + "(code: ".len()..].trim_end_matches(')');
        return match code {
            "NoSuchKey" => Failure::NotFound,
            "AccessDenied" | "InternalError" | "ServiceUnavailable" | "SlowDown" | "RequestTimeout" | "OperationAborted" => Failure::Unavailable,
            // Garage and others name their own server-side failures (`ServerError`, …).
            c if c.contains("Internal") || c.contains("Unavailable") || c.starts_with("Serv") => Failure::Unavailable,
            _ => Failure::Other,
        };
    }
    let Some(at) = msg.find("status code: ") else { return Failure::Other };
    let code: u16 = msg[at + "status code: ".len()..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap_or(0);
    match code {
        404 => Failure::NotFound,
        401 | 403 | 408 | 409 | 429 | 500..=599 => Failure::Unavailable,
        _ => Failure::Other,
    }
}

pub(super) fn io(e: object_store::Error) -> BlobError {
    match classify(&e) {
        Failure::NotFound => BlobError::NotFound,
        Failure::Unavailable => BlobError::Unavailable(e.to_string()),
        Failure::Other => BlobError::Io(std::io::Error::other(e.to_string())),
    }
}

/// Whether a blob error says something the state names is not there (an object, a tail
/// segment, a multipart upload): [`BlobError::NotFound`] or a [`corrupt`] read.
pub(super) fn is_gone(e: &BlobError) -> bool {
    matches!(e, BlobError::NotFound) || matches!(e, BlobError::Io(io) if io.kind() == std::io::ErrorKind::NotFound)
}

pub(super) fn is_not_found(e: &object_store::Error) -> bool {
    classify(e) == Failure::NotFound
}

/// A missing object a committed state names: the store lost bytes (or someone deleted them).
pub(super) fn corrupt(e: object_store::Error, what: &str) -> BlobError {
    if is_not_found(&e) {
        BlobError::Io(std::io::Error::new(std::io::ErrorKind::NotFound, format!("{what} named by the blob state is missing")))
    } else {
        io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_failures_are_classified_from_object_stores_messages() {
        let m = |tail: &str| format!("Error performing PUT http://127.0.0.1:1/b/k in 1.2s, after 3 retries, max_retries: 3, retry_timeout: 10s  - {tail}");
        let slow = m("Server returned non-2xx status code: 503 Service Unavailable: <Error><Code>SlowDown</Code></Error>");
        assert_eq!(classify_message(&slow), Failure::Unavailable);
        assert_eq!(classify_message(&m("Server returned non-2xx status code: 500 Internal Server Error: ")), Failure::Unavailable);
        assert_eq!(classify_message(&m("Server returned non-2xx status code: 429 Too Many Requests: ")), Failure::Unavailable);
        assert_eq!(classify_message(&m("Server returned error response: <Error><Code>InternalError</Code></Error>")), Failure::Unavailable);
        assert_eq!(classify_message(&m("Server returned non-2xx status code: 403 Forbidden: AccessDenied")), Failure::Unavailable);
        assert_eq!(classify_message(&m("Server returned non-2xx status code: 404 Not Found: NoSuchUpload")), Failure::NotFound);
        assert_eq!(classify_message(&m("Server returned non-2xx status code: 400 Bad Request: <Code>InvalidPart</Code>")), Failure::Other);
        assert_eq!(classify_message("Got invalid multipart response: missing field"), Failure::Other);
        let bulk = |code: &str| format!("Generic S3 error: DeleteObjects request failed for key p/up/x.created: Internal error: Could not reach quorum (code: {code})");
        assert_eq!(classify_message(&bulk("InternalError")), Failure::Unavailable, "Garage under load");
        assert_eq!(classify_message(&bulk("ServerError")), Failure::Unavailable);
        assert_eq!(classify_message(&bulk("SlowDown")), Failure::Unavailable);
        assert_eq!(classify_message(&bulk("NoSuchKey")), Failure::NotFound);
        assert_eq!(classify_message(&bulk("MalformedXML")), Failure::Other);
        let denied = object_store::Error::PermissionDenied { path: "k".into(), source: "AccessDenied".into() };
        assert!(matches!(io(denied), BlobError::Unavailable(_)), "a bucket that refuses writes is retryable");
        let missing = object_store::Error::NotFound { path: "k".into(), source: "NoSuchKey".into() };
        assert!(matches!(io(missing), BlobError::NotFound));
        let generic = object_store::Error::Generic { store: "S3", source: slow.into() };
        assert!(matches!(io(generic), BlobError::Unavailable(_)));
        // Carried through a read stream and back.
        let back = BlobError::from_stream(BlobError::Unavailable("cut".into()).into_stream_error());
        assert!(matches!(back, BlobError::Unavailable(w) if w == "cut"));
    }
}
