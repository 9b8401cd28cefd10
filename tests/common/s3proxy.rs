//! A strict-S3 fault proxy (issue 22): an HTTP/1.1 proxy in front of an S3 endpoint (moto, or
//! any S3) that forwards every request as it came — method, path and query, headers (`Host`
//! included, so SigV4 signatures stay valid) and body — and behaves, on demand, as real
//! S3-compatible stores do where moto is permissive:
//!
//! - [`S3Proxy::set_strict`]: CompleteMultipartUpload is refused with `400 EntityTooSmall` when
//!   a part but the last is under 5 MiB, and `400 InvalidPart` when the parts but the last do not
//!   all have one size (Cloudflare R2's rule). Sizes are learnt from the UploadPart requests
//!   forwarded (`Content-Length`) and UploadPartCopy ones (`x-amz-copy-source-range`).
//! - [`S3Proxy::refuse_complete`]: every CompleteMultipartUpload refused (`400 InvalidPart`).
//! - [`S3Proxy::lifecycle_abort`]: a bucket lifecycle rule aborting multipart uploads behind
//!   ferry's back: they are aborted upstream and every later request naming one gets
//!   `404 NoSuchUpload`.
//! - [`S3Proxy::hold`]: the next matching request is held (before it is forwarded, or after,
//!   with its response held) until the test releases it — and forwarded then even if ferry
//!   gave up on it meanwhile (every request runs to its end, as bytes in the network do).
//! - [`S3Proxy::cut_next_part`]: the next UploadPart's connection is dropped after part of its
//!   body was read.
//! - [`S3Proxy::set_black_hole`] / [`S3Proxy::black_hole_after_complete`]: requests are
//!   accepted and never answered (a partition where packets vanish); when the hole closes the
//!   waiting ones are dropped, never forwarded.
//! - [`S3Proxy::seen`] / [`S3Proxy::count`]: every request, by [`Kind`], key and status.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::sync::watch;

const MIB: u64 = 1 << 20;
/// S3's smallest part but the last.
pub const S3_MIN_PART: u64 = 5 * MIB;

/// What an S3 request is (path-style addressing: `/bucket/key?query`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    CreateMultipart,
    UploadPart,
    UploadPartCopy,
    Complete,
    AbortMultipart,
    ListMultipart,
    List,
    Get,
    Head,
    Put,
    Copy,
    Delete,
    Other,
}

/// One request as the proxy saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub kind: Kind,
    /// `bucket/key` (no leading slash, no query).
    pub key: String,
    pub query: String,
    /// Body bytes (UploadPart), or the copied range's length (UploadPartCopy).
    pub len: u64,
    /// The status answered (0: held, cut, or dropped without an answer).
    pub status: u16,
    /// Waiting in the black hole now.
    pub in_hole: bool,
}

/// Where a held request waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldAt {
    /// Before it is forwarded: S3 sees it only once released.
    Request,
    /// After S3 answered: ferry gets the answer only once released.
    Response,
}

/// A request [`S3Proxy::hold`] caught (or will catch).
pub struct Hold {
    arrived: watch::Receiver<bool>,
    release: watch::Sender<bool>,
}

impl Hold {
    /// Wait until a request was caught (and, with [`HoldAt::Response`], S3 answered it).
    pub async fn arrived(&self) {
        let mut rx = self.arrived.clone();
        let _ = rx.wait_for(|a| *a).await;
    }

    /// Whether a request was caught yet.
    pub fn has_arrived(&self) -> bool {
        *self.arrived.borrow()
    }

    /// Let it go on (forwarded, or its answer delivered).
    pub fn release(&self) {
        self.release.send_replace(true);
    }
}

struct PendingHold {
    kind: Kind,
    key_part: String,
    at: HoldAt,
    arrived: watch::Sender<bool>,
    release: watch::Receiver<bool>,
}

#[derive(Default)]
struct Flags {
    strict: bool,
    /// Answer a PUT or POST that carries no `Content-Length` `411 MissingContentLength`, as AWS does.
    require_length: bool,
    /// Answer every UploadPartCopy with this status and S3 error code.
    refuse_copy: Option<(u16, &'static str)>,
    /// Answer the next N requests of this kind with this status and S3 error code.
    fail_next: Option<(Kind, usize, u16, &'static str)>,
    refuse_complete: bool,
    black_hole_after_complete: bool,
    cut_next_part: Option<u64>,
}

struct State {
    upstream: String,
    http: reqwest::Client,
    seen: Mutex<Vec<Seen>>,
    flags: Mutex<Flags>,
    /// (uploadId, part number) → size of the last UploadPart(Copy) S3 accepted.
    parts: Mutex<HashMap<(String, u32), u64>>,
    /// uploadId → `bucket/key`, from CreateMultipartUpload answers.
    uploads: Mutex<HashMap<String, String>>,
    aborted: Mutex<HashSet<String>>,
    /// `bucket/key` and part sizes (in order) of every CompleteMultipartUpload S3 accepted.
    completed: Mutex<Vec<(String, Vec<u64>)>>,
    /// Completions this proxy refused: `bucket/key` and the error code.
    refused: Mutex<Vec<(String, String)>>,
    hold: Mutex<Option<PendingHold>>,
    /// `true` while the hole is open.
    hole: watch::Sender<bool>,
}

/// The running proxy; stops (dropping every connection) when dropped.
pub struct S3Proxy {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl S3Proxy {
    /// Forward to `upstream` (e.g. `http://127.0.0.1:41234`).
    pub async fn start(upstream: &str) -> S3Proxy {
        let state = Arc::new(State {
            upstream: upstream.trim_end_matches('/').to_string(),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            seen: Mutex::new(Vec::new()),
            flags: Mutex::new(Flags::default()),
            parts: Mutex::new(HashMap::new()),
            uploads: Mutex::new(HashMap::new()),
            aborted: Mutex::new(HashSet::new()),
            completed: Mutex::new(Vec::new()),
            refused: Mutex::new(Vec::new()),
            hold: Mutex::new(None),
            hole: watch::channel(false).0,
        });
        let (url, task) = serve_to_end(state.clone(), handle).await;
        S3Proxy { url, state, task }
    }

    /// Enforce S3's 5 MiB floor and R2's equal-parts rule on CompleteMultipartUpload.
    pub fn set_strict(&self, on: bool) {
        self.state.flags.lock().unwrap().strict = on;
    }

    /// Answer a PUT or POST without `Content-Length` with `411 MissingContentLength` while
    /// `on`, as AWS S3 does (moto and Garage accept it).
    pub fn require_content_length(&self, on: bool) {
        self.state.flags.lock().unwrap().require_length = on;
    }

    /// Answer every UploadPartCopy with `status` and S3 error `code` (e.g. `501 NotImplemented`,
    /// a store without it) while `Some`.
    pub fn refuse_copy(&self, with: Option<(u16, &'static str)>) {
        self.state.flags.lock().unwrap().refuse_copy = with;
    }

    /// Answer the next `n` requests of `kind` with `status` and S3 error `code`, without
    /// forwarding them.
    pub fn fail_next(&self, kind: Kind, n: usize, status: u16, code: &'static str) {
        self.state.flags.lock().unwrap().fail_next = Some((kind, n, status, code));
    }

    /// Refuse every CompleteMultipartUpload (`400 InvalidPart`) while `on`.
    pub fn refuse_complete(&self, on: bool) {
        self.state.flags.lock().unwrap().refuse_complete = on;
    }

    /// Drop the connection of the next UploadPart after `after` bytes of its body were read.
    pub fn cut_next_part(&self, after: u64) {
        self.state.flags.lock().unwrap().cut_next_part = Some(after);
    }

    /// Accept requests and never answer them while `on`; closing the hole drops the requests
    /// that waited in it (unanswered, never forwarded).
    pub fn set_black_hole(&self, on: bool) {
        self.state.hole.send_replace(on);
    }

    /// Open the black hole as soon as the next CompleteMultipartUpload succeeds (everything
    /// after it, e.g. a finisher's clean-up, vanishes); once.
    pub fn black_hole_after_complete(&self) {
        self.state.flags.lock().unwrap().black_hole_after_complete = true;
    }

    /// Hold the next request of `kind` whose `bucket/key` contains `key_part`.
    pub fn hold(&self, kind: Kind, key_part: &str, at: HoldAt) -> Hold {
        let (arrived_tx, arrived_rx) = watch::channel(false);
        let (release_tx, release_rx) = watch::channel(false);
        *self.state.hold.lock().unwrap() = Some(PendingHold { kind, key_part: key_part.to_string(), at, arrived: arrived_tx, release: release_rx });
        Hold { arrived: arrived_rx, release: release_tx }
    }

    /// A lifecycle rule fires: every multipart upload whose key contains `key_part` is aborted
    /// upstream (AbortMultipartUpload signed as `s3`, the upstream's own configuration) and
    /// from now on every request naming it gets `404 NoSuchUpload`. Returns the upload ids.
    pub async fn lifecycle_abort(&self, key_part: &str, s3: &super::s3::S3Config) -> Vec<String> {
        let ids: Vec<(String, String)> =
            self.state.uploads.lock().unwrap().iter().filter(|(_, k)| k.contains(key_part)).map(|(u, k)| (u.clone(), k.clone())).collect();
        for (upload, key) in &ids {
            self.state.aborted.lock().unwrap().insert(upload.clone());
            let r = s3.request("DELETE", &format!("/{key}"), &[("uploadId", upload)]).send().await.expect("AbortMultipartUpload");
            assert!(r.status().is_success(), "AbortMultipartUpload of {key}: {}", r.status());
        }
        ids.into_iter().map(|(u, _)| u).collect()
    }

    /// Requests (of `kind`, or any) whose `bucket/key` contains `key_part` waiting in the
    /// black hole now.
    pub fn in_hole(&self, kind: Option<Kind>, key_part: &str) -> usize {
        self.state.seen.lock().unwrap().iter().filter(|s| kind.is_none_or(|k| s.kind == k) && s.key.contains(key_part) && s.in_hole).count()
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Requests of `kind` whose `bucket/key` contains `key_part`.
    pub fn count(&self, kind: Kind, key_part: &str) -> usize {
        self.state.seen.lock().unwrap().iter().filter(|s| s.kind == kind && s.key.contains(key_part)).count()
    }

    /// `bucket/key` and part sizes of every CompleteMultipartUpload S3 accepted.
    pub fn completed(&self) -> Vec<(String, Vec<u64>)> {
        self.state.completed.lock().unwrap().clone()
    }

    /// Completions this proxy refused: (`bucket/key`, error code).
    pub fn refused(&self) -> Vec<(String, String)> {
        self.state.refused.lock().unwrap().clone()
    }
}

impl Drop for S3Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn has_param(query: &str, name: &str) -> bool {
    query.split('&').any(|p| p == name || p.starts_with(&format!("{name}=")))
}

fn param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .find_map(|p| p.strip_prefix(&format!("{name}=")))
        .map(|v| percent_encoding::percent_decode_str(v).decode_utf8_lossy().into_owned())
}

fn kind_of(method: &http::Method, query: &str, copy: bool) -> Kind {
    let upload = has_param(query, "uploadId");
    match method.as_str() {
        "POST" if has_param(query, "uploads") => Kind::CreateMultipart,
        "POST" if upload => Kind::Complete,
        "PUT" if has_param(query, "partNumber") && copy => Kind::UploadPartCopy,
        "PUT" if has_param(query, "partNumber") => Kind::UploadPart,
        "PUT" if copy => Kind::Copy,
        "PUT" => Kind::Put,
        "DELETE" if upload => Kind::AbortMultipart,
        "DELETE" => Kind::Delete,
        "GET" if has_param(query, "uploads") => Kind::ListMultipart,
        "GET" if has_param(query, "list-type") => Kind::List,
        "GET" => Kind::Get,
        "HEAD" => Kind::Head,
        _ => Kind::Other,
    }
}

pub type Resp = hyper::Response<Full<Bytes>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn xml_error(status: u16, code: &str, message: &str) -> Resp {
    let body = format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>");
    hyper::Response::builder().status(status).header("content-type", "application/xml").body(Full::new(Bytes::from(body))).unwrap()
}

/// The `<PartNumber>`s of a CompleteMultipartUpload body, in order.
fn listed_parts(body: &[u8]) -> Vec<u32> {
    let text = String::from_utf8_lossy(body);
    text.split("<PartNumber>").skip(1).filter_map(|s| s.split("</PartNumber>").next()).filter_map(|n| n.trim().parse().ok()).collect()
}

/// Why S3 (R2) refuses to complete with parts of `sizes`, if it does.
fn strict_refusal(sizes: &[u64]) -> Option<(&'static str, String)> {
    let (_, init) = sizes.split_last()?;
    if let Some(small) = init.iter().find(|&&s| s < S3_MIN_PART) {
        return Some(("EntityTooSmall", format!("Your proposed upload is smaller than the minimum allowed object size ({small} bytes).")));
    }
    if init.windows(2).any(|w| w[0] != w[1]) {
        return Some(("InvalidPart", format!("All non-trailing parts must have the same length ({init:?}).")));
    }
    None
}

/// Serve HTTP/1.1 on a new loopback port, every request answered by `handle(state, req)` in a
/// task of its own, so it runs to its end even when its client goes away, as bytes already in
/// the network do (a held request still reaches S3 once released). Returns the
/// `http://127.0.0.1:PORT` address and the accept loop's task (aborted to stop).
pub async fn serve_to_end<S, F, Fut, E>(state: Arc<S>, handle: F) -> (String, tokio::task::JoinHandle<()>)
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, hyper::Request<Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Resp, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let Ok((stream, _)) = l.accept().await else { continue };
            while conns.try_join_next().is_some() {}
            let st = state.clone();
            conns.spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let st = st.clone();
                    async move {
                        match tokio::spawn(handle(st, req)).await {
                            Ok(Ok(r)) => Ok(r),
                            Ok(Err(e)) => Err(std::io::Error::other(e.to_string())),
                            Err(e) => Err(std::io::Error::other(e)),
                        }
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(stream), svc).await;
            });
        }
    });
    (url, task)
}

async fn handle(st: Arc<State>, req: hyper::Request<Incoming>) -> Result<Resp, BoxError> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or("").to_string();
    let key = percent_encoding::percent_decode_str(path.trim_start_matches('/')).decode_utf8_lossy().into_owned();
    let copy = parts.headers.contains_key("x-amz-copy-source");
    let kind = kind_of(&parts.method, &query, copy);
    let upload_id = param(&query, "uploadId");
    let part_no: Option<u32> = param(&query, "partNumber").and_then(|n| n.parse().ok());
    let idx = {
        let mut seen = st.seen.lock().unwrap();
        seen.push(Seen { kind, key: key.clone(), query: query.clone(), len: 0, status: 0, in_hole: false });
        seen.len() - 1
    };
    let record = |len: u64, status: u16| {
        let mut seen = st.seen.lock().unwrap();
        seen[idx].len = len;
        seen[idx].status = status;
    };

    // A partition: wait while the hole is open, then drop the request.
    if *st.hole.borrow() {
        let mut rx = st.hole.subscribe();
        st.seen.lock().unwrap()[idx].in_hole = true;
        let _ = rx.wait_for(|open| !*open).await;
        st.seen.lock().unwrap()[idx].in_hole = false;
        return Err("black hole".into());
    }

    // The body: whole, or cut after some bytes.
    let cut = if kind == Kind::UploadPart { st.flags.lock().unwrap().cut_next_part.take() } else { None };
    let body: Bytes = match cut {
        Some(after) => {
            let mut body = body;
            let mut got = 0u64;
            while got < after {
                match body.frame().await {
                    Some(Ok(f)) => got += f.data_ref().map(|d| d.len() as u64).unwrap_or(0),
                    _ => break,
                }
            }
            record(got, 0);
            return Err("connection cut mid-part".into());
        }
        None => body.collect().await?.to_bytes(),
    };
    let len = match kind {
        Kind::UploadPartCopy => parts
            .headers
            .get("x-amz-copy-source-range")
            .and_then(|v| v.to_str().ok())
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.split_once('-'))
            .and_then(|(a, b)| Some(b.parse::<u64>().ok()? + 1 - a.parse::<u64>().ok()?))
            .unwrap_or(0),
        _ => body.len() as u64,
    };

    // Refusals a strict or partial store gives.
    let refusal = {
        let mut f = st.flags.lock().unwrap();
        let no_length = matches!(parts.method.as_str(), "PUT" | "POST") && !parts.headers.contains_key(hyper::header::CONTENT_LENGTH);
        if f.require_length && no_length {
            Some((411, "MissingContentLength"))
        } else if kind == Kind::UploadPartCopy && f.refuse_copy.is_some() {
            f.refuse_copy
        } else if f.fail_next.is_some_and(|(k, ..)| k == kind) {
            let (_, n, status, code) = f.fail_next.as_mut().expect("checked");
            let answer = (*status, *code);
            *n -= 1;
            if *n == 0 {
                f.fail_next = None;
            }
            Some(answer)
        } else {
            None
        }
    };
    if let Some((status, code)) = refusal {
        record(len, status);
        return Ok(xml_error(status, code, "refused by the fault proxy"));
    }

    // A multipart upload a lifecycle rule aborted.
    if upload_id.as_ref().is_some_and(|u| st.aborted.lock().unwrap().contains(u)) {
        record(len, 404);
        return Ok(xml_error(
            404,
            "NoSuchUpload",
            "The specified multipart upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.",
        ));
    }

    // CompleteMultipartUpload as strict stores answer it.
    let mut sizes = Vec::new();
    if kind == Kind::Complete {
        let upload = upload_id.clone().unwrap_or_default();
        let known = st.parts.lock().unwrap().clone();
        sizes = listed_parts(&body).iter().map(|n| known.get(&(upload.clone(), *n)).copied().unwrap_or(0)).collect();
        let (strict, refuse) = {
            let f = st.flags.lock().unwrap();
            (f.strict, f.refuse_complete)
        };
        let refusal = if refuse {
            Some(("InvalidPart", "One or more of the specified parts could not be found.".to_string()))
        } else if strict {
            strict_refusal(&sizes)
        } else {
            None
        };
        if let Some((code, msg)) = refusal {
            st.refused.lock().unwrap().push((key.clone(), code.to_string()));
            record(len, 400);
            return Ok(xml_error(400, code, &msg));
        }
    }

    // A held request.
    let hold = {
        let mut h = st.hold.lock().unwrap();
        if h.as_ref().is_some_and(|h| h.kind == kind && key.contains(&h.key_part)) {
            h.take()
        } else {
            None
        }
    };
    if let Some(h) = hold.as_ref().filter(|h| h.at == HoldAt::Request) {
        h.arrived.send_replace(true);
        let mut rx = h.release.clone();
        let _ = rx.wait_for(|r| *r).await;
    }

    // Forward as it came.
    let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut out = st.http.request(parts.method.clone(), format!("{}{pq}", st.upstream)).body(body);
    for (k, v) in parts.headers.iter() {
        if !matches!(k.as_str(), "content-length" | "transfer-encoding" | "connection" | "keep-alive" | "expect") {
            out = out.header(k, v);
        }
    }
    let resp = match out.send().await {
        Ok(r) => r,
        Err(e) => {
            record(len, 502);
            return Ok(hyper::Response::builder().status(502).body(Full::new(Bytes::from(e.to_string()))).unwrap());
        }
    };
    let status = resp.status();
    let headers = resp.headers().clone();
    let rbody = resp.bytes().await.unwrap_or_default();
    // S3 may answer 200 with an `<Error>` body (CompleteMultipartUpload, UploadPartCopy).
    let ok = status.is_success() && !String::from_utf8_lossy(&rbody[..rbody.len().min(512)]).contains("<Error>");
    if ok {
        match kind {
            Kind::CreateMultipart => {
                let text = String::from_utf8_lossy(&rbody);
                if let Some(u) = text.split("<UploadId>").nth(1).and_then(|s| s.split("</UploadId>").next()) {
                    st.uploads.lock().unwrap().insert(u.to_string(), key.clone());
                }
            }
            Kind::UploadPart | Kind::UploadPartCopy => {
                if let (Some(u), Some(n)) = (upload_id.clone(), part_no) {
                    st.parts.lock().unwrap().insert((u, n), len);
                }
            }
            Kind::Complete => {
                st.completed.lock().unwrap().push((key.clone(), sizes));
                if let Some(u) = &upload_id {
                    st.uploads.lock().unwrap().remove(u);
                }
                if std::mem::take(&mut st.flags.lock().unwrap().black_hole_after_complete) {
                    st.hole.send_replace(true);
                }
            }
            Kind::AbortMultipart => {
                if let Some(u) = &upload_id {
                    st.uploads.lock().unwrap().remove(u);
                }
            }
            _ => {}
        }
    }
    record(len, status.as_u16());
    if let Some(h) = hold.as_ref().filter(|h| h.at == HoldAt::Response) {
        h.arrived.send_replace(true);
        let mut rx = h.release.clone();
        let _ = rx.wait_for(|r| *r).await;
    }
    let mut b = hyper::Response::builder().status(status);
    for (k, v) in headers.iter() {
        // Content-Length stays: a HEAD's names the object's size.
        if !matches!(k.as_str(), "transfer-encoding" | "connection" | "keep-alive") {
            b = b.header(k, v);
        }
    }
    Ok::<_, BoxError>(b.body(Full::new(rbody)).unwrap())
}
