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

/// How many times [`own_retries`] sends a request again.
pub(super) fn own_retries_count() -> usize {
    retry_config().max_retries
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

/// What an S3 failure means for the caller, once the bounded retries are spent: decided by
/// [`decide`] from the HTTP status and S3's error code, never from an error's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// 404 `NoSuchKey` / `NoSuchUpload`: the object (or multipart upload) is not there.
    NotFound,
    /// The store is away or refuses for now: no answer, a dropped connection, 5xx but 501,
    /// 408 / 409 / 412 / 429, or an error code that says so (`SlowDown`, `InternalError`,
    /// `ServiceUnavailable`, `OperationAborted`…). The request may succeed later.
    Unavailable,
    /// The store refuses for good: any other 4xx (400, 401, 403, 405, 411, 413…) or 501
    /// `NotImplemented`. The same request gets the same answer until an operator changes the
    /// store or ferry's settings.
    Refused,
}

/// What S3 answered to a request that failed: its HTTP status (`None`: no answer came) and
/// the `<Code>` of its error body (`None`: none, as for a HEAD). Never the body itself: it
/// names buckets, keys and request ids, and reaches no client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Answer {
    pub status: Option<u16>,
    pub code: Option<String>,
}

impl Answer {
    /// The answer of a response ferry read itself: `status` and the error code in `body`.
    pub(super) fn of(status: u16, body: &str) -> Answer {
        Answer { status: Some(status), code: error_code(body).map(str::to_string) }
    }

    /// [`BlobError::Refused`] of request `what` with this answer.
    pub(super) fn refused(&self, what: &str) -> BlobError {
        BlobError::Refused { what: what.to_string(), status: self.status, code: self.code.clone() }
    }

    /// What this answer means ([`decide`]).
    pub(super) fn failure(&self) -> Failure {
        decide(self.status, self.code.as_deref())
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::blob::refused_answer(self.status, self.code.as_deref()))
    }
}

/// S3's error code in an error body (`<Error><Code>…</Code>`), if it has one.
pub(super) fn error_code(body: &str) -> Option<&str> {
    let start = body.find("<Code>")? + "<Code>".len();
    let end = start + body[start..].find("</Code>")?;
    Some(body[start..end].trim()).filter(|c| !c.is_empty())
}

/// The one decision table for a failed S3 request (S3 API reference, "Error responses"): the
/// error code first where it is one S3 documents, then the status. `None` for the status means
/// no answer came (a refused or dropped connection, a deadline).
pub(super) fn decide(status: Option<u16>, code: Option<&str>) -> Failure {
    match code {
        Some("NoSuchKey" | "NoSuchUpload") => return Failure::NotFound,
        Some(
            "SlowDown"
            | "InternalError"
            | "ServiceUnavailable"
            | "RequestTimeout"
            | "OperationAborted"
            | "RequestTimeTooSkewed"
            | "ExpiredToken"
            | "TooManyRequests",
        ) => return Failure::Unavailable,
        Some(
            "AccessDenied"
            | "InvalidAccessKeyId"
            | "SignatureDoesNotMatch"
            | "NoSuchBucket"
            | "InvalidBucketName"
            | "MissingContentLength"
            | "NotImplemented"
            | "MethodNotAllowed"
            | "MalformedXML"
            | "InvalidArgument"
            | "InvalidRequest"
            | "InvalidPart"
            | "InvalidPartOrder"
            | "EntityTooSmall"
            | "EntityTooLarge"
            | "KeyTooLongError"
            | "InvalidRange",
        ) => return Failure::Refused,
        // Garage and others name their own server-side failures (`ServerError`, …).
        Some(c) if c.contains("Internal") || c.contains("Unavailable") || c.starts_with("Serv") => return Failure::Unavailable,
        _ => {}
    }
    match status {
        None => Failure::Unavailable,
        Some(404) => Failure::NotFound,
        Some(501) => Failure::Refused,
        Some(408 | 409 | 412 | 429 | 500..=599) => Failure::Unavailable,
        // An error in the body of a 2xx (S3 does this for CompleteMultipartUpload and
        // UploadPartCopy) whose code is not one it documents as permanent.
        Some(200..=299) => Failure::Unavailable,
        Some(_) => Failure::Refused,
    }
}

/// The [`Answer`] inside an object_store error. object_store 0.14 keeps the error that carries
/// the status (`RetryError`) in a private module, so its status and body are read from the one
/// format it gives them — `… Server returned non-2xx status code: 503 Service Unavailable: <body>`,
/// or `… Server returned error response: <body>` for an error in a 2xx's body, or `… (code: X)`
/// for a key a DeleteObjects answer lists under `<Error>` — here and nowhere else; variants of
/// its own (`NotFound`, `PermissionDenied`…) and transport errors in the source chain decide
/// without it.
pub(super) fn answer_of(e: &object_store::Error) -> Answer {
    use object_store::Error as E;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<object_store::client::HttpError>() || err.is::<NoAnswer>() {
            return Answer::default();
        }
        cur = err.source();
    }
    let msg = e.to_string();
    let mut answer = if let Some(at) = msg.find("status code: ") {
        let status = msg[at + "status code: ".len()..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().ok();
        Answer { status, code: error_code(&msg[at..]).map(str::to_string) }
    } else if let Some(at) = msg.find("Server returned error response: ") {
        Answer { status: Some(200), code: error_code(&msg[at..]).map(str::to_string) }
    } else if let Some(at) = msg.find("DeleteObjects request failed for key").and_then(|_| msg.rfind("(code: ")) {
        Answer { status: None, code: Some(msg[at + "(code: ".len()..].trim_end_matches(')').to_string()) }
    } else {
        // A response that does not parse, a builder error: nothing a retry changes.
        Answer { status: Some(400), code: None }
    };
    match e {
        E::NotFound { .. } => answer.status = Some(404),
        E::PermissionDenied { .. } => answer.status = Some(403),
        E::Unauthenticated { .. } => answer.status = Some(401),
        // 409: S3's `OperationAborted` (a conflicting operation in progress on the key).
        E::AlreadyExists { .. } => answer.status = Some(409),
        E::Precondition { .. } => answer.status = Some(412),
        _ => {}
    }
    answer
}

/// What an object_store error means ([`answer_of`], [`decide`]).
pub(super) fn classify(e: &object_store::Error) -> Failure {
    answer_of(e).failure()
}

/// The request `op` on `what` (e.g. `UploadPartCopy`, `part 3 of <key>`) failed with `answer`:
/// the [`BlobError`] its [`Failure`] makes, naming the request and the store's status and code
/// only.
pub(super) fn refusal(op: &str, answer: &Answer) -> BlobError {
    match answer.failure() {
        Failure::NotFound => BlobError::NotFound,
        Failure::Unavailable => BlobError::Unavailable(format!("S3 {op}: {answer}")),
        Failure::Refused => answer.refused(op),
    }
}

/// An object_store error as a [`BlobError`] ([`classify`]). Logged in full here (the server's
/// log is where an operator reads the store's words); the error names the store's status and
/// code only.
pub(super) fn io(e: object_store::Error) -> BlobError {
    let answer = answer_of(&e);
    tracing::debug!(error = %e, "S3 request failed");
    match answer.failure() {
        Failure::NotFound => BlobError::NotFound,
        Failure::Unavailable => BlobError::Unavailable(format!("S3: {}", transport_words(&e, &answer))),
        Failure::Refused => answer.refused(&request_of(&e)),
    }
}

/// Which request an object_store error is of, in words (`a PUT request`), for a refusal's
/// message (object_store names the method first: `Error performing PUT …`).
fn request_of(e: &object_store::Error) -> String {
    let msg = e.to_string();
    match msg.split("Error performing ").nth(1).and_then(|r| r.split(' ').next()) {
        Some(m) if !m.is_empty() && m.chars().all(|c| c.is_ascii_uppercase()) => format!("a {m} request"),
        _ => "a request".to_string(),
    }
}

/// Words for an answer-less failure (which request, which deadline), the status and code
/// otherwise.
fn transport_words(e: &object_store::Error, answer: &Answer) -> String {
    if answer.status.is_some() || answer.code.is_some() {
        return answer.to_string();
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(n) = err.downcast_ref::<NoAnswer>() {
            return n.to_string();
        }
        cur = err.source();
    }
    "no answer (the connection failed)".to_string()
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
    fn the_decision_reads_status_and_code() {
        use Failure::*;
        for (status, code, want) in [
            (Some(404), Some("NoSuchUpload"), NotFound),
            (Some(404), None, NotFound),
            (Some(404), Some("NoSuchBucket"), Refused),
            (Some(503), Some("SlowDown"), Unavailable),
            (Some(500), None, Unavailable),
            (Some(429), None, Unavailable),
            (Some(409), Some("OperationAborted"), Unavailable),
            (Some(200), Some("InternalError"), Unavailable),
            (Some(200), Some("InvalidPart"), Refused),
            (Some(411), Some("MissingContentLength"), Refused),
            (Some(411), None, Refused),
            (Some(501), Some("NotImplemented"), Refused),
            (Some(501), None, Refused),
            (Some(403), Some("AccessDenied"), Refused),
            (Some(400), Some("EntityTooSmall"), Refused),
            (Some(400), Some("RequestTimeout"), Unavailable),
            (None, Some("ServerError"), Unavailable),
            (None, Some("MalformedXML"), Refused),
            (None, None, Unavailable),
        ] {
            assert_eq!(decide(status, code), want, "{status:?} {code:?}");
        }
    }

    #[test]
    fn object_stores_errors_give_their_status_and_code() {
        let m = |tail: &str| {
            format!("Error performing PUT http://127.0.0.1:1/b/k in 1.2s, after 3 retries, max_retries: 3, retry_timeout: 10s  - {tail}")
        };
        let generic = |msg: String| object_store::Error::Generic { store: "S3", source: msg.into() };
        let slow =
            generic(m("Server returned non-2xx status code: 503 Service Unavailable: <Error><Code>SlowDown</Code><Message>x</Message></Error>"));
        assert_eq!(answer_of(&slow), Answer { status: Some(503), code: Some("SlowDown".into()) });
        let body_error = generic(m("Server returned error response: <Error><Code>InternalError</Code></Error>"));
        assert_eq!(answer_of(&body_error), Answer { status: Some(200), code: Some("InternalError".into()) });
        let length = generic(m("Server returned non-2xx status code: 411 Length Required: <Error><Code>MissingContentLength</Code></Error>"));
        assert_eq!(classify(&length), Failure::Refused);
        let bulk =
            generic("DeleteObjects request failed for key p/up/x.created: Internal error: Could not reach quorum (code: InternalError)".into());
        assert_eq!(answer_of(&bulk).code.as_deref(), Some("InternalError"));
        assert_eq!(classify(&bulk), Failure::Unavailable, "Garage under load");
        assert_eq!(classify(&generic("Got invalid multipart response: missing field".into())), Failure::Refused);
        let denied = object_store::Error::PermissionDenied { path: "k".into(), source: "AccessDenied".into() };
        assert!(
            matches!(io(denied), BlobError::Refused { status: Some(403), .. }),
            "a bucket that refuses writes is refused for good, by its status"
        );
        let missing = object_store::Error::NotFound { path: "k".into(), source: "NoSuchKey".into() };
        assert!(matches!(io(missing), BlobError::NotFound));
        match io(slow) {
            BlobError::Unavailable(w) => assert!(w.contains("503 SlowDown") && !w.contains("127.0.0.1") && !w.contains("<Error>"), "{w}"),
            other => panic!("{other:?}"),
        }
        // Carried through a read stream and back.
        let back = BlobError::from_stream(BlobError::Unavailable("cut".into()).into_stream_error());
        assert!(matches!(back, BlobError::Unavailable(w) if w == "cut"));
    }
}
