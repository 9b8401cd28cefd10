//! Every request the S3 store makes, named by its S3 operation and observed once answered
//! (issue 47: per-operation request counts and latencies, as tusd exports its store's).
//!
//! object_store's requests go through [`MeteredConnector`] (object_store's own reqwest client,
//! wrapped: `AmazonS3Builder::with_http_connector`); the few requests ferry signs and sends
//! itself (streamed parts, UploadPartCopy, CompleteMultipartUpload, ListMultipartUploads) go
//! through [`Requests::send`] or the same wrapped client. What is seen goes to the observer the
//! composition root installs ([`super::S3BlobStore::with_request_observer`]: serve.rs records it
//! as `ferry_s3_request_seconds{operation,outcome}`); without one, nothing is kept.
//!
//! The time is until the answer's head arrived: for a request with a body (UploadPart,
//! PutObject) that includes sending the body; for a GET, the time to its first byte.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use async_trait::async_trait;
use object_store::client::{HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector};
use object_store::ClientOptions;

/// One request the store made, once answered (or failed without an answer).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestSeen {
    /// The S3 operation, as AWS names it: `UploadPart`, `CompleteMultipartUpload`, `GetObject`…
    pub operation: &'static str,
    /// `2xx`, `3xx`, `4xx`, `5xx` by the answer's status, or `error` when none came (a
    /// connection refused or cut, a deadline).
    pub outcome: &'static str,
    /// Seconds from sending it to the answer's head.
    pub seconds: f64,
}

/// What the composition root does with each [`RequestSeen`].
pub type RequestObserver = Arc<dyn Fn(RequestSeen) + Send + Sync>;

/// The store's observer, installed once (before or after the clients were made).
#[derive(Clone, Default)]
pub(crate) struct Requests(Arc<OnceLock<RequestObserver>>);

impl std::fmt::Debug for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requests").field("observed", &self.0.get().is_some()).finish()
    }
}

impl Requests {
    /// Install `observer` (the first one installed stays).
    pub(crate) fn observe_with(&self, observer: RequestObserver) {
        let _ = self.0.set(observer);
    }

    /// Tell the observer that `operation`, sent at `started`, was answered with `status` (`None`:
    /// no answer).
    pub(crate) fn seen(&self, operation: &'static str, status: Option<u16>, started: Instant) {
        if let Some(o) = self.0.get() {
            let outcome = match status {
                Some(200..=299) => "2xx",
                Some(300..=399) => "3xx",
                Some(400..=499) => "4xx",
                Some(_) => "5xx",
                None => "error",
            };
            o(RequestSeen { operation, outcome, seconds: started.elapsed().as_secs_f64() });
        }
    }

    /// Send `request` (one ferry built itself, for `operation`) and observe it.
    pub(crate) async fn send(&self, operation: &'static str, request: reqwest::RequestBuilder) -> reqwest::Result<reqwest::Response> {
        let started = Instant::now();
        let r = request.send().await;
        self.seen(operation, r.as_ref().ok().map(|r| r.status().as_u16()), started);
        r
    }
}

/// The S3 operation a request of object_store's is (REST API: the method, the sub-resources in
/// the query, and `x-amz-copy-source`).
pub(crate) fn operation(method: &http::Method, uri: &http::Uri, copies: bool) -> &'static str {
    let query = uri.query().unwrap_or("");
    let has = |name: &str| query.split('&').any(|kv| kv == name || kv.starts_with(&format!("{name}=")));
    match *method {
        http::Method::PUT if has("partNumber") && copies => "UploadPartCopy",
        http::Method::PUT if has("partNumber") => "UploadPart",
        http::Method::PUT if copies => "CopyObject",
        http::Method::PUT => "PutObject",
        http::Method::POST if has("uploads") => "CreateMultipartUpload",
        http::Method::POST if has("uploadId") => "CompleteMultipartUpload",
        http::Method::POST if has("delete") => "DeleteObjects",
        http::Method::DELETE if has("uploadId") => "AbortMultipartUpload",
        http::Method::DELETE => "DeleteObject",
        http::Method::GET if has("uploads") => "ListMultipartUploads",
        http::Method::GET if has("list-type") => "ListObjectsV2",
        http::Method::GET if has("uploadId") => "ListParts",
        http::Method::GET => "GetObject",
        http::Method::HEAD => "HeadObject",
        _ => "other",
    }
}

/// object_store's reqwest connector, each client it makes observed ([`Requests`]).
#[derive(Debug)]
pub(crate) struct MeteredConnector(pub(crate) Requests);

impl HttpConnector for MeteredConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(Metered { inner: ReqwestConnector::default().connect(options)?, requests: self.0.clone() }))
    }
}

#[derive(Debug)]
struct Metered {
    inner: HttpClient,
    requests: Requests,
}

#[async_trait]
impl HttpService for Metered {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let op = operation(req.method(), req.uri(), req.headers().contains_key("x-amz-copy-source"));
        let started = Instant::now();
        let r = self.inner.execute(req).await;
        self.requests.seen(op, r.as_ref().ok().map(|r| r.status().as_u16()), started);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_named_by_their_s3_operation() {
        let op = |m: http::Method, q: &str, copies: bool| operation(&m, &format!("http://s3.local/bucket/key{q}").parse().unwrap(), copies);
        assert_eq!(op(http::Method::PUT, "?partNumber=3&uploadId=x", false), "UploadPart");
        assert_eq!(op(http::Method::PUT, "?partNumber=3&uploadId=x", true), "UploadPartCopy");
        assert_eq!(op(http::Method::PUT, "", false), "PutObject");
        assert_eq!(op(http::Method::POST, "?uploads", false), "CreateMultipartUpload");
        assert_eq!(op(http::Method::POST, "?uploadId=x", false), "CompleteMultipartUpload");
        assert_eq!(op(http::Method::POST, "?delete", false), "DeleteObjects");
        assert_eq!(op(http::Method::DELETE, "?uploadId=x", false), "AbortMultipartUpload");
        assert_eq!(op(http::Method::DELETE, "", false), "DeleteObject");
        assert_eq!(op(http::Method::GET, "?uploads&prefix=a", false), "ListMultipartUploads");
        assert_eq!(op(http::Method::GET, "?list-type=2&prefix=a", false), "ListObjectsV2");
        assert_eq!(op(http::Method::GET, "?uploadId=x", false), "ListParts");
        assert_eq!(op(http::Method::GET, "", false), "GetObject");
        assert_eq!(op(http::Method::HEAD, "", false), "HeadObject");
        assert_eq!(op(http::Method::GET, "?uploadsx=1", false), "GetObject", "a name is matched whole");
    }

    #[test]
    fn an_observer_sees_each_request_with_its_outcome() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let r = Requests::default();
        r.seen("GetObject", Some(200), Instant::now());
        let s = seen.clone();
        r.observe_with(Arc::new(move |x: RequestSeen| s.lock().unwrap().push((x.operation, x.outcome))));
        for (status, _) in [(Some(204), "2xx"), (Some(404), "4xx"), (Some(503), "5xx"), (None, "error")] {
            r.seen("UploadPart", status, Instant::now());
        }
        assert_eq!(
            *seen.lock().unwrap(),
            [("UploadPart", "2xx"), ("UploadPart", "4xx"), ("UploadPart", "5xx"), ("UploadPart", "error")],
            "none kept before an observer"
        );
    }
}
