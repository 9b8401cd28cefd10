//! A strict S3 in this process (issue 47, Build 4): a tiny HTTP/1.1 server on `127.0.0.1:0` that
//! keeps objects and multipart uploads in memory and answers the S3 REST API as path-style
//! requests `/bucket/key?query`, the way object_store's AmazonS3 client and ferry's own signed
//! requests (UploadPartCopy, the numbered CompleteMultipartUpload, ListMultipartUploads,
//! streamed UploadPart) send them. Signatures are not checked; any bucket exists.
//!
//! It is as strict as the strictest store users run ([`Rules`]):
//! - every part but the last at least [`Rules::min_part`] (S3: 5 MiB; a test may lower it to
//!   match the part floor it gives ferry) — `400 EntityTooSmall`;
//! - every part but the last of one size (Cloudflare R2) — `400 InvalidPart`;
//! - part numbers 1..=10 000, at most [`Rules::max_parts`] parts — `400 InvalidArgument`;
//! - `411 MissingContentLength` for a PUT or POST without `Content-Length` (AWS answers so to
//!   body-less PUTs without one);
//! - `404 NoSuchUpload` for every request naming a multipart upload that was aborted or
//!   completed; a part number sent twice keeps the last one (last writer wins);
//! - CompleteMultipartUpload checks each listed part's ETag (`400 InvalidPart`) and their order
//!   (`400 InvalidPartOrder`).
//!
//! Errors are S3's XML (`<Error><Code>…</Code><Message>…</Message><Resource>…</Resource>
//! <RequestId>…</RequestId></Error>`).
//!
//! Faults, chosen by the test ([`S3Strict::inject`]): the next N requests of a [`Kind`] whose
//! key contains a text answer 404/411/500/501/503, or are held ([`Fault::Hold`]: applied only
//! once [`S3Strict::release_holds`]), or (UploadPart) are **delivered late** ([`Fault::Late`]:
//! the body is read and kept aside, the client's connection is dropped without an answer when
//! the test says so, and the part lands in the store only at [`S3Strict::deliver_late`] — bytes
//! held in the network that land after a takeover). [`S3Strict::lifecycle_abort`] aborts
//! multipart uploads behind the client's back at any moment, [`S3Strict::hold_completions_for`]
//! makes CompleteMultipartUpload take a while (a store assembling thousands of parts).
//!
//! Records: every request ([`Seen`]: kind, key, status, whether a PUT/POST came without
//! `Content-Length`), the most CompleteMultipartUpload requests of one multipart upload ever in
//! flight at once ([`S3Strict::completions_at_once`]).
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::sync::watch;

/// S3's smallest part but the last.
pub const S3_MIN_PART: u64 = 5 << 20;

/// What a request is (path-style: `/bucket/key?query`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    PutObject,
    GetObject,
    HeadObject,
    DeleteObject,
    /// One key of a DeleteObjects (`POST /bucket?delete`): one [`Seen`] per key.
    DeleteObjects,
    ListObjects,
    CreateMultipart,
    UploadPart,
    UploadPartCopy,
    Complete,
    AbortMultipart,
    ListMultipart,
    CopyObject,
    Other,
}

impl Kind {
    /// Whether a request of this kind changes what the store holds.
    pub fn writes(self) -> bool {
        !matches!(self, Kind::GetObject | Kind::HeadObject | Kind::ListObjects | Kind::ListMultipart | Kind::Other)
    }
}

/// How strict the store is.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// Smallest part but the last (S3: 5 MiB).
    pub min_part: u64,
    /// Most parts one completion may list (S3: 10 000).
    pub max_parts: usize,
    /// Every part but the last of one size (R2).
    pub equal_parts: bool,
    /// `411 MissingContentLength` for a PUT or POST without `Content-Length` (AWS).
    pub require_length: bool,
    /// What an UploadPart or CompleteMultipartUpload naming an aborted or completed multipart
    /// upload gets: `404 NoSuchUpload` (S3), or `500 InternalError` as moto answers.
    pub gone_is_500: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Rules { min_part: S3_MIN_PART, max_parts: 10_000, equal_parts: true, require_length: true, gone_is_500: false }
    }
}

/// What an injected fault does to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer this status with S3's code for it (404 `NoSuchKey`/`NoSuchUpload`, 411
    /// `MissingContentLength`, 500 `InternalError`, 501 `NotImplemented`, 503 `SlowDown`);
    /// nothing is changed.
    Status(u16),
    /// Hold the request (before it is applied) until [`S3Strict::release_holds`]; it is applied
    /// then, even if its client went away.
    Hold,
    /// UploadPart only: read the body, keep the part aside, drop the connection unanswered at
    /// [`S3Strict::drop_late_clients`]; the part lands at [`S3Strict::deliver_late`].
    Late,
}

/// One request as the store saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub seq: u64,
    pub kind: Kind,
    /// `bucket/key` (no leading slash, no query); for [`Kind::DeleteObjects`] the key deleted.
    pub key: String,
    pub query: String,
    /// Body bytes (or the copied range's length).
    pub len: u64,
    /// The status answered (0: held, late or dropped).
    pub status: u16,
    /// A PUT or POST that came without `Content-Length`.
    pub no_length: bool,
}

#[derive(Clone)]
struct Object {
    data: Bytes,
    etag: String,
    modified: SystemTime,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UploadState {
    Open,
    Aborted,
    Completed,
}

struct Upload {
    key: String,
    parts: BTreeMap<u32, (Bytes, String)>,
    state: UploadState,
    initiated: SystemTime,
}

struct Injected {
    kind: Kind,
    key_part: String,
    fault: Fault,
    left: u32,
}

struct Late {
    upload: String,
    number: u32,
    data: Bytes,
    key: String,
}

#[derive(Default)]
struct Store {
    objects: BTreeMap<String, Object>,
    uploads: HashMap<String, Upload>,
    seen: Vec<Seen>,
    faults: Vec<Injected>,
    late: Vec<Late>,
    /// uploadId → (Complete requests in flight now, most ever at once).
    completing: HashMap<String, (u32, u32)>,
    hold_completions: Option<Duration>,
    /// uploadId → when the store is done assembling it (a slow completion under way).
    assembling: HashMap<String, tokio::time::Instant>,
}

struct State {
    rules: Mutex<Rules>,
    store: Mutex<Store>,
    next_id: AtomicU64,
    /// Bumped by [`S3Strict::release_holds`].
    holds: watch::Sender<u64>,
    /// Held requests waiting now.
    held: AtomicU64,
    /// Bumped by [`S3Strict::drop_late_clients`].
    late_clients: watch::Sender<u64>,
    late_waiting: AtomicU64,
    /// Requests an injected fault hit (statuses, holds, late parts).
    hits: AtomicU64,
}

/// The running store; stops (dropping every connection) when dropped.
pub struct S3Strict {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl S3Strict {
    pub async fn start(rules: Rules) -> S3Strict {
        let state = Arc::new(State {
            rules: Mutex::new(rules),
            store: Mutex::new(Store::default()),
            next_id: AtomicU64::new(1),
            holds: watch::channel(0).0,
            held: AtomicU64::new(0),
            late_clients: watch::channel(0).0,
            late_waiting: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        });
        let (url, task) = serve_to_end(state.clone(), handle).await;
        S3Strict { url, state, task }
    }

    /// The `AWS_*` variables that point object_store (and ferry) here.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.url.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "strict".into()),
            ("AWS_SECRET_ACCESS_KEY", "strict".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    pub fn set_rules(&self, rules: Rules) {
        *self.state.rules.lock().unwrap() = rules;
    }

    pub fn rules(&self) -> Rules {
        *self.state.rules.lock().unwrap()
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.state.store.lock().unwrap()
    }

    /// The next `times` requests of `kind` whose `bucket/key` contains `key_part` get `fault`.
    pub fn inject(&self, kind: Kind, key_part: &str, fault: Fault, times: u32) {
        self.store().faults.push(Injected { kind, key_part: key_part.to_string(), fault, left: times });
    }

    /// How many requests an injected fault hit so far (and lifecycle aborts).
    pub fn hits(&self) -> u64 {
        self.state.hits.load(Ordering::SeqCst)
    }

    /// Faults injected and not used yet.
    pub fn faults_left(&self) -> usize {
        self.store().faults.len()
    }

    /// Forget every injected fault not yet used.
    pub fn clear_faults(&self) {
        self.store().faults.clear();
    }

    /// Requests held now ([`Fault::Hold`]) and late parts whose clients still wait.
    pub fn waiting(&self) -> u64 {
        self.state.held.load(Ordering::SeqCst) + self.state.late_waiting.load(Ordering::SeqCst)
    }

    /// Requests held now ([`Fault::Hold`]).
    pub fn held(&self) -> u64 {
        self.state.held.load(Ordering::SeqCst)
    }

    /// Late parts whose clients still wait for an answer ([`Fault::Late`]).
    pub fn late_waiting(&self) -> u64 {
        self.state.late_waiting.load(Ordering::SeqCst)
    }

    /// Let every held request go on (it is applied now).
    pub fn release_holds(&self) {
        self.state.holds.send_modify(|n| *n += 1);
    }

    /// Drop the connections of the late parts' clients, unanswered (their parts stay aside).
    pub fn drop_late_clients(&self) {
        self.state.late_clients.send_modify(|n| *n += 1);
    }

    /// Late parts not delivered yet.
    pub fn late_parts(&self) -> usize {
        self.store().late.len()
    }

    /// Every late part lands now (into its multipart upload if that is still open; last writer
    /// wins). Returns how many landed.
    pub fn deliver_late(&self) -> usize {
        self.drop_late_clients();
        let mut s = self.store();
        let late = std::mem::take(&mut s.late);
        let mut n = 0;
        for l in late {
            if let Some(u) = s.uploads.get_mut(&l.upload).filter(|u| u.state == UploadState::Open) {
                u.parts.insert(l.number, (l.data.clone(), etag_of(&l.data)));
                n += 1;
            }
        }
        n
    }

    /// CompleteMultipartUpload takes `d` (`None`: no time): the first one of a multipart upload
    /// starts assembling it, and every one that comes meanwhile waits for the assembly to end; all
    /// are answered then (the first as done, the others `404 NoSuchUpload`). One that comes after
    /// is answered at once.
    pub fn hold_completions_for(&self, d: Option<Duration>) {
        self.store().hold_completions = d;
    }

    /// A bucket lifecycle rule fires: every open multipart upload whose `bucket/key` contains
    /// `key_part` is aborted. Returns their ids.
    pub fn lifecycle_abort(&self, key_part: &str) -> Vec<String> {
        self.state.hits.fetch_add(1, Ordering::SeqCst);
        let mut s = self.store();
        let mut ids = Vec::new();
        for (id, u) in s.uploads.iter_mut() {
            if u.state == UploadState::Open && u.key.contains(key_part) {
                u.state = UploadState::Aborted;
                u.parts.clear();
                ids.push(id.clone());
            }
        }
        ids
    }

    /// The object at `bucket/key`.
    pub fn object(&self, key: &str) -> Option<Bytes> {
        self.store().objects.get(key).map(|o| o.data.clone())
    }

    /// Keys (`bucket/key`) that start with `prefix`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.store().objects.range(prefix.to_string()..).take_while(|(k, _)| k.starts_with(prefix)).map(|(k, _)| k.clone()).collect()
    }

    /// Open multipart uploads whose `bucket/key` starts with `prefix`: (key, upload id).
    pub fn open_uploads(&self, prefix: &str) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .store()
            .uploads
            .iter()
            .filter(|(_, u)| u.state == UploadState::Open && u.key.starts_with(prefix))
            .map(|(id, u)| (u.key.clone(), id.clone()))
            .collect();
        v.sort();
        v
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.store().seen.clone()
    }

    /// Requests since sequence number `from` (inclusive).
    pub fn seen_since(&self, from: u64) -> Vec<Seen> {
        self.store().seen.iter().filter(|s| s.seq >= from).cloned().collect()
    }

    /// The sequence number the next request gets.
    pub fn next_seq(&self) -> u64 {
        self.store().seen.len() as u64
    }

    /// PUT and POST requests that came without `Content-Length`.
    pub fn without_length(&self) -> Vec<Seen> {
        self.store().seen.iter().filter(|s| s.no_length).cloned().collect()
    }

    /// For every multipart upload that ever got a CompleteMultipartUpload: (upload id, the most
    /// of them in flight at once).
    pub fn completions_at_once(&self) -> Vec<(String, u32)> {
        let mut v: Vec<(String, u32)> = self.store().completing.iter().map(|(u, (_, most))| (u.clone(), *most)).collect();
        v.sort();
        v
    }
}

impl Drop for S3Strict {
    fn drop(&mut self) {
        self.task.abort();
        self.release_holds();
        self.drop_late_clients();
    }
}

fn etag_of(data: &[u8]) -> String {
    use md5::Digest as _;
    format!("\"{}\"", hex::encode(md5::Md5::digest(data)))
}

fn has_param(query: &str, name: &str) -> bool {
    query.split('&').any(|p| p == name || p.starts_with(&format!("{name}=")))
}

fn param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .find_map(|p| p.strip_prefix(&format!("{name}=")))
        .map(|v| percent_encoding::percent_decode_str(&v.replace('+', " ")).decode_utf8_lossy().into_owned())
}

fn kind_of(method: &http::Method, query: &str, copy: bool, has_key: bool) -> Kind {
    let upload = has_param(query, "uploadId");
    match method.as_str() {
        "POST" if has_param(query, "delete") && !has_key => Kind::DeleteObjects,
        "POST" if has_param(query, "uploads") => Kind::CreateMultipart,
        "POST" if upload => Kind::Complete,
        "PUT" if has_param(query, "partNumber") && copy => Kind::UploadPartCopy,
        "PUT" if has_param(query, "partNumber") => Kind::UploadPart,
        "PUT" if copy => Kind::CopyObject,
        "PUT" => Kind::PutObject,
        "DELETE" if upload => Kind::AbortMultipart,
        "DELETE" => Kind::DeleteObject,
        "GET" if has_param(query, "uploads") => Kind::ListMultipart,
        "GET" if !has_key => Kind::ListObjects,
        "GET" => Kind::GetObject,
        "HEAD" => Kind::HeadObject,
        _ => Kind::Other,
    }
}

use super::s3proxy::{serve_to_end, Resp};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&apos;")
}

fn unesc(s: &str) -> String {
    s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&#34;", "\"").replace("&apos;", "'").replace("&amp;", "&")
}

fn xml_error(status: u16, code: &str, message: &str, resource: &str) -> Resp {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <Error><Code>{code}</Code><Message>{}</Message><Resource>/{}</Resource><RequestId>STRICT{:08X}</RequestId></Error>",
        esc(message),
        esc(resource),
        rand::random::<u32>()
    );
    hyper::Response::builder().status(status).header("content-type", "application/xml").body(Full::new(Bytes::from(body))).unwrap()
}

fn xml_ok(body: String) -> Resp {
    hyper::Response::builder()
        .status(200)
        .header("content-type", "application/xml")
        .body(Full::new(Bytes::from(format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{body}"))))
        .unwrap()
}

fn empty(status: u16) -> Resp {
    hyper::Response::builder().status(status).body(Full::new(Bytes::new())).unwrap()
}

/// The status an injected fault answers, with S3's code and message.
fn fault_error(status: u16, kind: Kind, resource: &str) -> Resp {
    let (code, msg) = match status {
        404 if matches!(kind, Kind::UploadPart | Kind::UploadPartCopy | Kind::Complete | Kind::AbortMultipart) => (
            "NoSuchUpload",
            "The specified multipart upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.",
        ),
        404 => ("NoSuchKey", "The specified key does not exist."),
        411 => ("MissingContentLength", "You must provide the Content-Length HTTP header."),
        500 => ("InternalError", "We encountered an internal error. Please try again."),
        501 => ("NotImplemented", "A header you provided implies functionality that is not implemented."),
        503 => ("SlowDown", "Please reduce your request rate."),
        _ => ("InvalidRequest", "Injected."),
    };
    if kind == Kind::HeadObject {
        return empty(status);
    }
    xml_error(status, code, msg, resource)
}

/// `(PartNumber, ETag)` of each `<Part>` of a CompleteMultipartUpload body, in order.
fn listed_parts(body: &str) -> Option<Vec<(u32, String)>> {
    let field = |block: &str, name: &str| -> Option<String> {
        let start = block.find(&format!("<{name}>"))? + name.len() + 2;
        let end = start + block[start..].find(&format!("</{name}>"))?;
        Some(unesc(block[start..end].trim()))
    };
    body.split("<Part>").skip(1).map(|b| Some((field(b, "PartNumber")?.parse().ok()?, field(b, "ETag")?))).collect()
}

fn same_etag(a: &str, b: &str) -> bool {
    a.trim_matches('"') == b.trim_matches('"')
}

async fn handle(st: Arc<State>, req: hyper::Request<Incoming>) -> Result<Resp, String> {
    let (parts, body) = req.into_parts();
    let path = percent_encoding::percent_decode_str(parts.uri.path().trim_start_matches('/')).decode_utf8_lossy().into_owned();
    let (bucket, object_key) = path.split_once('/').map(|(b, k)| (b.to_string(), k.to_string())).unwrap_or((path.clone(), String::new()));
    let query = parts.uri.query().unwrap_or("").to_string();
    let copy_source = parts
        .headers
        .get("x-amz-copy-source")
        .and_then(|v| v.to_str().ok())
        .map(|v| percent_encoding::percent_decode_str(v.trim_start_matches('/')).decode_utf8_lossy().into_owned());
    let kind = kind_of(&parts.method, &query, copy_source.is_some(), !object_key.is_empty());
    let no_length = matches!(parts.method.as_str(), "PUT" | "POST") && !parts.headers.contains_key(http::header::CONTENT_LENGTH);
    let upload_id = param(&query, "uploadId");
    let seq = {
        let mut s = st.store.lock().unwrap();
        let seq = s.seen.len() as u64;
        s.seen.push(Seen { seq, kind, key: path.clone(), query: query.clone(), len: 0, status: 0, no_length });
        seq
    };
    let record = |status: u16, len: u64| {
        let mut s = st.store.lock().unwrap();
        if let Some(x) = s.seen.get_mut(seq as usize) {
            x.status = status;
            x.len = len;
        }
    };
    let body: Bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Err(format!("body: {e}")),
    };
    let len = body.len() as u64;
    let rules = *st.rules.lock().unwrap();

    // An injected fault.
    let fault = {
        let mut s = st.store.lock().unwrap();
        let hit = s.faults.iter_mut().find(|f| f.left > 0 && f.kind == kind && path.contains(&f.key_part));
        let fault = hit.map(|f| {
            f.left -= 1;
            f.fault
        });
        s.faults.retain(|f| f.left > 0);
        fault
    };
    if fault.is_some() {
        st.hits.fetch_add(1, Ordering::SeqCst);
    }
    match fault {
        Some(Fault::Status(status)) => {
            record(status, len);
            return Ok(fault_error(status, kind, &path));
        }
        Some(Fault::Hold) => {
            st.held.fetch_add(1, Ordering::SeqCst);
            let mut rx = st.holds.subscribe();
            let _ = rx.changed().await;
            st.held.fetch_sub(1, Ordering::SeqCst);
        }
        Some(Fault::Late) if kind == Kind::UploadPart => {
            let number: u32 = param(&query, "partNumber").and_then(|n| n.parse().ok()).unwrap_or(0);
            let mut rx = st.late_clients.subscribe();
            st.store.lock().unwrap().late.push(Late { upload: upload_id.clone().unwrap_or_default(), number, data: body.clone(), key: path.clone() });
            st.late_waiting.fetch_add(1, Ordering::SeqCst);
            let _ = rx.changed().await;
            st.late_waiting.fetch_sub(1, Ordering::SeqCst);
            return Err("late part: the connection is dropped unanswered".into());
        }
        Some(Fault::Late) => {}
        None => {}
    }

    if rules.require_length && no_length {
        record(411, len);
        return Ok(xml_error(411, "MissingContentLength", "You must provide the Content-Length HTTP header.", &path));
    }

    // A slow completion: in flight (counted) while the store assembles.
    if kind == Kind::Complete {
        let u = upload_id.clone().unwrap_or_default();
        let until = {
            let mut s = st.store.lock().unwrap();
            let e = s.completing.entry(u.clone()).or_insert((0, 0));
            e.0 += 1;
            e.1 = e.1.max(e.0);
            let now = tokio::time::Instant::now();
            match (s.assembling.get(&u).copied(), s.hold_completions) {
                (Some(end), _) if end > now => Some(end),
                (Some(_), _) => None,
                (None, Some(d)) => {
                    s.assembling.insert(u.clone(), now + d);
                    Some(now + d)
                }
                (None, None) => None,
            }
        };
        if let Some(end) = until {
            tokio::time::sleep_until(end).await;
        }
        let r = apply(&st, kind, &bucket, &object_key, &path, &query, copy_source.as_deref(), &parts.headers, body, rules);
        if let Some(e) = st.store.lock().unwrap().completing.get_mut(&u) {
            e.0 -= 1;
        }
        record(r.status().as_u16(), len);
        return Ok(r);
    }
    let r = apply(&st, kind, &bucket, &object_key, &path, &query, copy_source.as_deref(), &parts.headers, body, rules);
    record(r.status().as_u16(), len);
    Ok(r)
}

#[allow(clippy::too_many_arguments)]
fn apply(
    st: &State,
    kind: Kind,
    bucket: &str,
    object_key: &str,
    path: &str,
    query: &str,
    copy_source: Option<&str>,
    headers: &http::HeaderMap,
    body: Bytes,
    rules: Rules,
) -> Resp {
    let now = SystemTime::now();
    let mut s = st.store.lock().unwrap();
    let upload_id = param(query, "uploadId");
    // A request naming a multipart upload that is gone (aborted, completed) or never was.
    if matches!(kind, Kind::UploadPart | Kind::UploadPartCopy | Kind::Complete | Kind::AbortMultipart) {
        let u = upload_id.clone().unwrap_or_default();
        match s.uploads.get(&u) {
            Some(up) if up.state == UploadState::Open && up.key == path => {}
            Some(_) if rules.gone_is_500 && matches!(kind, Kind::UploadPart | Kind::Complete) => {
                return xml_error(500, "InternalError", "We encountered an internal error. Please try again.", path)
            }
            _ => {
                return xml_error(
                    404,
                    "NoSuchUpload",
                    "The specified multipart upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.",
                    path,
                )
            }
        }
    }
    match kind {
        Kind::PutObject => {
            let etag = etag_of(&body);
            s.objects.insert(path.to_string(), Object { data: body, etag: etag.clone(), modified: now });
            hyper::Response::builder().status(200).header("etag", etag).body(Full::new(Bytes::new())).unwrap()
        }
        Kind::CopyObject => {
            let Some(src) = copy_source.and_then(|c| s.objects.get(c)).cloned() else {
                return xml_error(404, "NoSuchKey", "The specified key does not exist.", copy_source.unwrap_or(""));
            };
            s.objects.insert(path.to_string(), Object { modified: now, ..src.clone() });
            xml_ok(format!(
                "<CopyObjectResult><ETag>{}</ETag><LastModified>{}</LastModified></CopyObjectResult>",
                esc(&src.etag),
                humantime::format_rfc3339_millis(now)
            ))
        }
        Kind::GetObject | Kind::HeadObject => {
            let Some(o) = s.objects.get(path).cloned() else {
                if kind == Kind::HeadObject {
                    return empty(404);
                }
                return xml_error(404, "NoSuchKey", "The specified key does not exist.", path);
            };
            let total = o.data.len() as u64;
            let range = headers.get(http::header::RANGE).and_then(|v| v.to_str().ok()).and_then(|r| r.strip_prefix("bytes=")).map(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, ""));
                match (a.parse::<u64>().ok(), b.parse::<u64>().ok()) {
                    (Some(a), Some(b)) => (a, b.min(total.saturating_sub(1))),
                    (Some(a), None) => (a, total.saturating_sub(1)),
                    (None, Some(n)) => (total.saturating_sub(n), total.saturating_sub(1)),
                    (None, None) => (total, 0),
                }
            });
            let b = hyper::Response::builder()
                .header("etag", &o.etag)
                .header("last-modified", httpdate::fmt_http_date(o.modified))
                .header("accept-ranges", "bytes");
            match range {
                Some((a, z)) if kind == Kind::GetObject => {
                    if a >= total || z < a {
                        return xml_error(416, "InvalidRange", "The requested range is not satisfiable", path);
                    }
                    let data = o.data.slice(a as usize..=z as usize);
                    b.status(206)
                        .header("content-range", format!("bytes {a}-{z}/{total}"))
                        .header("content-length", data.len())
                        .body(Full::new(data))
                        .unwrap()
                }
                _ if kind == Kind::HeadObject => b.status(200).header("content-length", total).body(Full::new(Bytes::new())).unwrap(),
                _ => b.status(200).header("content-length", total).body(Full::new(o.data.clone())).unwrap(),
            }
        }
        Kind::DeleteObject => {
            s.objects.remove(path);
            empty(204)
        }
        Kind::DeleteObjects => {
            let text = String::from_utf8_lossy(&body).into_owned();
            let keys: Vec<String> = text.split("<Key>").skip(1).filter_map(|b| b.split("</Key>").next()).map(unesc).collect();
            let mut out = String::from("<DeleteResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">");
            for k in keys {
                let full = format!("{bucket}/{k}");
                s.objects.remove(&full);
                let seq = s.seen.len() as u64;
                s.seen.push(Seen { seq, kind: Kind::DeleteObjects, key: full, query: String::new(), len: 0, status: 200, no_length: false });
                out.push_str(&format!("<Deleted><Key>{}</Key></Deleted>", esc(&k)));
            }
            out.push_str("</DeleteResult>");
            xml_ok(out)
        }
        Kind::ListObjects => {
            let prefix = param(query, "prefix").unwrap_or_default();
            let delimiter = param(query, "delimiter").filter(|d| !d.is_empty());
            let after = param(query, "continuation-token").or_else(|| param(query, "start-after")).unwrap_or_default();
            let max: usize = param(query, "max-keys").and_then(|m| m.parse().ok()).unwrap_or(1000).clamp(1, 1000);
            let base = format!("{bucket}/");
            let mut contents = Vec::new();
            let mut prefixes: Vec<String> = Vec::new();
            let mut truncated = None;
            for (k, o) in s.objects.range(format!("{base}{prefix}")..) {
                let Some(name) = k.strip_prefix(&base) else { break };
                if !name.starts_with(&prefix) {
                    break;
                }
                if !after.is_empty() && name <= after.as_str() {
                    continue;
                }
                if contents.len() + prefixes.len() >= max {
                    truncated = Some(contents.last().map(|(n, _): &(String, Object)| n.clone()).unwrap_or_default());
                    break;
                }
                if let Some(d) = &delimiter {
                    if let Some(at) = name[prefix.len()..].find(d.as_str()) {
                        let p = name[..prefix.len() + at + d.len()].to_string();
                        if !prefixes.contains(&p) {
                            prefixes.push(p);
                        }
                        continue;
                    }
                }
                contents.push((name.to_string(), o.clone()));
            }
            let mut out = format!(
                "<ListBucketResult \
                 xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>{}</Name><Prefix>{}</Prefix>\
                 <KeyCount>{}</KeyCount><MaxKeys>{max}</MaxKeys><IsTruncated>{}</IsTruncated>",
                esc(bucket),
                esc(&prefix),
                contents.len() + prefixes.len(),
                truncated.is_some()
            );
            for (name, o) in &contents {
                out.push_str(&format!(
                    "<Contents><Key>{}</Key><LastModified>{}</LastModified><ETag>{}</ETag>\
                     <Size>{}</Size><StorageClass>STANDARD</StorageClass></Contents>",
                    esc(name),
                    humantime::format_rfc3339_millis(o.modified),
                    esc(&o.etag),
                    o.data.len()
                ));
            }
            for p in &prefixes {
                out.push_str(&format!("<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>", esc(p)));
            }
            if let Some(t) = truncated {
                out.push_str(&format!("<NextContinuationToken>{}</NextContinuationToken>", esc(&t)));
            }
            out.push_str("</ListBucketResult>");
            xml_ok(out)
        }
        Kind::CreateMultipart => {
            let id = format!("mpu{}x{:08x}", st.next_id.fetch_add(1, Ordering::SeqCst), rand::random::<u32>());
            s.uploads.insert(id.clone(), Upload { key: path.to_string(), parts: BTreeMap::new(), state: UploadState::Open, initiated: now });
            xml_ok(format!(
                "<InitiateMultipartUploadResult \
                 xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Bucket>{}</Bucket>\
                 <Key>{}</Key><UploadId>{id}</UploadId></InitiateMultipartUploadResult>",
                esc(bucket),
                esc(object_key)
            ))
        }
        Kind::UploadPart | Kind::UploadPartCopy => {
            let number: u32 = match param(query, "partNumber").and_then(|n| n.parse().ok()) {
                Some(n) if (1..=10_000).contains(&n) => n,
                _ => return xml_error(400, "InvalidArgument", "Part number must be an integer between 1 and 10000, inclusive", path),
            };
            let data = if kind == Kind::UploadPart {
                body
            } else {
                let Some(src) = copy_source.and_then(|c| s.objects.get(c)) else {
                    return xml_error(404, "NoSuchKey", "The specified key does not exist.", copy_source.unwrap_or(""));
                };
                let total = src.data.len() as u64;
                match headers.get("x-amz-copy-source-range").and_then(|v| v.to_str().ok()) {
                    None => src.data.clone(),
                    Some(r) => {
                        let parsed = r
                            .strip_prefix("bytes=")
                            .and_then(|r| r.split_once('-'))
                            .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
                        match parsed {
                            Some((a, z)) if a <= z && z < total => src.data.slice(a as usize..=z as usize),
                            _ => {
                                return xml_error(
                                    400,
                                    "InvalidArgument",
                                    "The x-amz-copy-source-range value must be of the form bytes=first-last where \
                                     first and last are the zero-based offsets of the first and last bytes to copy",
                                    path,
                                )
                            }
                        }
                    }
                }
            };
            let etag = etag_of(&data);
            let u = s.uploads.get_mut(upload_id.as_deref().unwrap_or("")).expect("checked above");
            u.parts.insert(number, (data, etag.clone()));
            if kind == Kind::UploadPart {
                hyper::Response::builder().status(200).header("etag", etag).body(Full::new(Bytes::new())).unwrap()
            } else {
                xml_ok(format!(
                    "<CopyPartResult><LastModified>{}</LastModified><ETag>{}</ETag></CopyPartResult>",
                    humantime::format_rfc3339_millis(now),
                    esc(&etag)
                ))
            }
        }
        Kind::Complete => {
            let text = String::from_utf8_lossy(&body).into_owned();
            let Some(listed) = listed_parts(&text).filter(|l| !l.is_empty()) else {
                return xml_error(
                    400,
                    "MalformedXML",
                    "The XML you provided was not well-formed or did not validate against our published schema.",
                    path,
                );
            };
            if listed.len() > rules.max_parts {
                return xml_error(400, "InvalidArgument", "Too many parts.", path);
            }
            if listed.windows(2).any(|w| w[0].0 >= w[1].0) {
                return xml_error(
                    400,
                    "InvalidPartOrder",
                    "The list of parts was not in ascending order. The parts list must be specified in order by part number.",
                    path,
                );
            }
            let u = s.uploads.get(upload_id.as_deref().unwrap_or("")).expect("checked above");
            let mut datas = Vec::with_capacity(listed.len());
            for (n, etag) in &listed {
                match u.parts.get(n) {
                    Some((d, e)) if same_etag(e, etag) => datas.push(d.clone()),
                    _ => {
                        return xml_error(
                            400,
                            "InvalidPart",
                            "One or more of the specified parts could not be found. The part may not have been \
                             uploaded, or the specified entity tag may not have matched the part's entity tag.",
                            path,
                        )
                    }
                }
            }
            let sizes: Vec<u64> = datas.iter().map(|d| d.len() as u64).collect();
            let (_, init) = sizes.split_last().expect("not empty");
            if let Some(small) = init.iter().find(|&&n| n < rules.min_part) {
                return xml_error(
                    400,
                    "EntityTooSmall",
                    &format!("Your proposed upload is smaller than the minimum allowed size ({small} bytes)."),
                    path,
                );
            }
            if rules.equal_parts && init.windows(2).any(|w| w[0] != w[1]) {
                return xml_error(400, "InvalidPart", "All non-trailing parts must have the same length.", path);
            }
            let mut whole = Vec::with_capacity(sizes.iter().sum::<u64>() as usize);
            for d in &datas {
                whole.extend_from_slice(d);
            }
            use md5::Digest as _;
            let mut h = md5::Md5::new();
            for (_, e) in &listed {
                h.update(hex::decode(e.trim_matches('"')).unwrap_or_default());
            }
            let etag = format!("\"{}-{}\"", hex::encode(h.finalize()), listed.len());
            let key = u.key.clone();
            s.uploads.get_mut(upload_id.as_deref().unwrap_or("")).expect("checked above").state = UploadState::Completed;
            s.uploads.get_mut(upload_id.as_deref().unwrap_or("")).expect("checked above").parts.clear();
            s.objects.insert(key, Object { data: Bytes::from(whole), etag: etag.clone(), modified: now });
            xml_ok(format!(
                "<CompleteMultipartUploadResult \
                 xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Location>/{}</Location>\
                 <Bucket>{}</Bucket><Key>{}</Key><ETag>{}</ETag></CompleteMultipartUploadResult>",
                esc(path),
                esc(bucket),
                esc(object_key),
                esc(&etag)
            ))
        }
        Kind::AbortMultipart => {
            let u = s.uploads.get_mut(upload_id.as_deref().unwrap_or("")).expect("checked above");
            u.state = UploadState::Aborted;
            u.parts.clear();
            empty(204)
        }
        Kind::ListMultipart => {
            let prefix = param(query, "prefix").unwrap_or_default();
            let full = format!("{bucket}/{prefix}");
            let mut ups: Vec<(&String, &Upload)> =
                s.uploads.iter().filter(|(_, u)| u.state == UploadState::Open && u.key.starts_with(&full)).collect();
            ups.sort_by(|a, b| (&a.1.key, a.0).cmp(&(&b.1.key, b.0)));
            let mut out = format!(
                "<ListMultipartUploadsResult \
                 xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Bucket>{}</Bucket><Prefix>{}</Prefix><IsTruncated>false</IsTruncated>",
                esc(bucket),
                esc(&prefix)
            );
            for (id, u) in ups.into_iter().take(1000) {
                let key = u.key.strip_prefix(&format!("{bucket}/")).unwrap_or(&u.key);
                out.push_str(&format!(
                    "<Upload><Key>{}</Key><UploadId>{}</UploadId><Initiated>{}</Initiated></Upload>",
                    esc(key),
                    esc(id),
                    humantime::format_rfc3339_millis(u.initiated)
                ));
            }
            out.push_str("</ListMultipartUploadsResult>");
            xml_ok(out)
        }
        Kind::Other => xml_error(501, "NotImplemented", "A header you provided implies functionality that is not implemented.", path),
    }
}
