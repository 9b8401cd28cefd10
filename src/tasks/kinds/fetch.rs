//! The `fetch` kind: import a URL into a file, resuming with `Range` after failures.
//!
//! One file of ~840 lines because a resumable fetch is one loop (request, `Range` resume, redirects
//! to allowed hosts, TLS roots) whose steps share its state; about a quarter is its tests.
//!
//! # Arguments
//!
//! `{"url": "http(s)://host/path", "name": "optional file name"}`. `https://` is verified
//! with rustls against the system's certificate authorities plus `[fetch] ca_file`. The URL's
//! host — or `host:port` — must be listed in `[fetch] allow_hosts` of ferry.toml
//! (case-insensitive; an entry without a port allows every port). Nothing is allowed by
//! default. Redirects (at most 10) are followed only to allowed hosts. Credentials in the URL are sent as basic
//! auth and removed from the result.
//!
//! # Behaviour
//!
//! The file is named `name`, else the URL's last path segment (percent-decoded), else
//! `download`; its media type is the response's `Content-Type` (default
//! `application/octet-stream`). The body is stored as sent (no content decoding).
//!
//! After a network error, a truncated body or a `408`/`429`/`5xx` answer, ferry retries with
//! backoff (5 attempts in a row without receiving data, 200 ms doubling), sending
//! `Range: bytes=<stored>-` and `If-Range: <strong ETag, else Last-Modified>` when the server
//! gave one. A `206` whose `Content-Range` starts at the stored length (and agrees with the
//! known total) continues the file; a `200` restarts it from byte 0; a `416` with
//! `Content-Range: bytes */<stored>` means it was complete. Any other answer fails the task
//! with its status.
//!
//! Progress: `fraction` = stored / total when the total is known; counter `bytes`.
//! Result: `{"file": FileHandle, "url": "<url without credentials>"}`.
//! Partial results: one fragment per checkpoint, `{"bytes": <durable bytes so far>, "total":
//! <length or null>, "etag": <strong ETag or null>, "last_modified": <Last-Modified or null>}`.
//!
//! # Checkpoint
//!
//! `{"cursor": FileCursor, "start": FileCursor, "url": "...", "etag": "...", "last_modified":
//! "...", "length": N}` — taken right after the file is created and then every 64 MiB (after
//! `sync`). `start` is the file at byte 0 (to restart on a `200`); `etag`/`last_modified`
//! (either may be absent) are the validator for `If-Range`; `length` the total, when known. A
//! resumed task reopens the file at `cursor` and continues with a range request.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use reqwest::header::{HeaderMap, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, ETAG, IF_RANGE, LAST_MODIFIED, RANGE};
use reqwest::{StatusCode, Url};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use ferry_tus::ContentRange;

use crate::tasks::settings::FetchConfig;
use crate::tasks::{Job, JobContext, JobError};
use crate::upload::{FileCursor, FileWriter};

/// Tries in a row without receiving any data before giving up.
/// Most requests one run makes, successful or not.
const MAX_REQUESTS: u32 = 64;

const ATTEMPTS: u32 = 5;
/// First retry delay; doubles each time.
const BACKOFF: Duration = Duration::from_millis(200);
/// Durable checkpoint interval.
const CHECKPOINT_EVERY: u64 = 64 * 1024 * 1024;
const MAX_REDIRECTS: usize = 10;

/// Downloads from allow-listed hosts.
pub struct FetchJob {
    allow: Arc<Vec<String>>,
    /// Certificate authorities trusted besides the system's (`[fetch] ca_file`).
    roots: Arc<Vec<reqwest::Certificate>>,
}

impl FetchJob {
    /// A `[fetch] ca_file` that cannot be read is logged and ignored here; `Config::resolve`
    /// refuses it at start-up.
    pub fn new(cfg: FetchConfig) -> Self {
        let roots = match cfg.ca_file.as_deref().map(load_roots).transpose() {
            Ok(r) => r.unwrap_or_default(),
            Err(e) => {
                tracing::error!(error = %e, "[fetch] ca_file ignored");
                Vec::new()
            }
        };
        FetchJob { allow: Arc::new(cfg.allow_hosts), roots: Arc::new(roots) }
    }

    fn client(&self) -> Result<reqwest::Client, JobError> {
        let allow = self.allow.clone();
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            match check_target(&allow, attempt.url()).map_err(|r| r.to_string()) {
                Ok(()) => attempt.follow(),
                Err(e) => attempt.error(format!("redirect refused: {e}")),
            }
        });
        reqwest::Client::builder()
            .redirect(policy)
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(60))
            .user_agent(concat!("ferry/", env!("CARGO_PKG_VERSION")))
            .tls_certs_merge(self.roots.iter().cloned())
            .build()
            .map_err(|e| JobError::Internal(format!("http client: {e}")))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FetchArgs {
    url: String,
    #[serde(default)]
    name: Option<String>,
}

/// Parse and check the arguments: the URL to fetch and the explicit name, if any.
fn parse_args(allow: &[String], args: &RawValue) -> Result<(Url, Option<String>), String> {
    let a: FetchArgs =
        serde_json::from_str(args.get()).map_err(|e| format!("fetch arguments: {e} (expected {{\"url\": \"http://...\", \"name\": ...}})"))?;
    let url = check_url(allow, &a.url).map_err(|r| r.to_string())?;
    if let Some(n) = &a.name {
        if n.is_empty() || n.len() > 255 || n.chars().any(|c| crate::names::is_hidden_control(c) || c == '/' || c == '\\') {
            return Err("name must be 1 to 255 bytes without '/', '\\' or control or bidi-override characters".into());
        }
    }
    Ok((url, a.name))
}

/// Why a URL may not be fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not an absolute `http://` URL with a host (400 `invalid_argument`).
    Invalid(String),
    /// The host (and port) is not in `[fetch] allow_hosts` (403 `unauthorized`).
    NotAllowed(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Invalid(m) | Refusal::NotAllowed(m) => f.write_str(m),
        }
    }
}

impl From<Refusal> for crate::error::Refusal {
    /// The one answer to a refused URL, on REST (`POST /api/v1/tasks` kind `fetch`) and MCP
    /// (`fetch_url`) alike.
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Invalid(m) => crate::error::Refusal::bad_request(format!("invalid args for fetch: {m}"), "Pass an absolute http:// URL."),
            Refusal::NotAllowed(m) => crate::error::Refusal::new(
                403,
                crate::error::ErrorCode::Unauthorized,
                format!("this server may not fetch from it: {m}"),
                "Ask the operator to add the host to [fetch] allow_hosts in ferry.toml, or upload the file instead.",
            ),
        }
    }
}

/// An `allow_hosts` entry: a host name, IPv4 or IPv6 address (bracketed or not), optionally
/// with `:port`; case-insensitive, a trailing dot ignored. `None` if it names no host.
fn allow_entry(entry: &str) -> Option<(url::Host<String>, Option<u16>)> {
    let e = entry.trim();
    let (host, port) = match e.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && (!h.contains(':') || h.ends_with(']')) => {
            (h, Some(p.parse::<u16>().ok()?))
        }
        _ => (e, None),
    };
    let host = if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() };
    Some((normal_host(url::Host::parse(&host).ok()?), port))
}

/// Check one `[fetch] allow_hosts` entry at start-up: `host`, `host:port`, an IPv4 address or
/// an IPv6 one (`[::1]:8443`). Errors (a sentence naming the entry) for a URL, a path, an empty
/// entry, a port above 65535 or anything else that names no host, which would otherwise allow
/// nothing without a word.
pub fn check_allow_entry(entry: &str) -> Result<(), String> {
    if let Ok(u) = Url::parse(entry.trim()) {
        if let Some(host) = u.host_str().filter(|h| !h.is_empty()) {
            let hint = u.port().map_or_else(|| host.to_string(), |p| format!("{host}:{p}"));
            return Err(format!("{entry:?} is a URL; write its host (and :port) only, e.g. {hint:?}"));
        }
    }
    match allow_entry(entry) {
        Some(_) => Ok(()),
        None => {
            Err(format!("{entry:?} names no host; write a host name, an IP address or host:port (e.g. \"files.example.com\" or \"10.0.0.5:8080\")"))
        }
    }
}

fn normal_host(h: url::Host<String>) -> url::Host<String> {
    match h {
        url::Host::Domain(d) => url::Host::Domain(d.trim_end_matches('.').to_ascii_lowercase()),
        other => other,
    }
}

/// The certificate authorities of a PEM file (`[fetch] ca_file`). Errors: unreadable file, no
/// certificate in it, or one that does not parse.
pub fn load_roots(path: &std::path::Path) -> anyhow::Result<Vec<reqwest::Certificate>> {
    let pem = std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{} holds no PEM certificate", path.display());
    Ok(certs)
}

/// The allow-list check (DESIGN §4 `fetch`): the one function every path that fetches uses —
/// task creation over REST and MCP, the job itself, and every redirect. The scheme must be
/// `http` or `https`; the URL's host (as a WHATWG URL parser reads it: userinfo, IDNA, IPv4 forms and
/// IPv6 literals resolved) must equal an entry's host, and the entry's port, when it names
/// one, the URL's port (80 when absent). An entry without a port allows every port.
pub fn check_target(allow: &[String], url: &Url) -> Result<(), Refusal> {
    match url.scheme() {
        "http" | "https" => {}
        s => return Err(Refusal::Invalid(format!("unsupported URL scheme '{s}': use http:// or https://"))),
    }
    let host = url.host().filter(|h| !matches!(h, url::Host::Domain(""))).ok_or_else(|| Refusal::Invalid("the URL has no host".into()))?;
    let host = normal_host(host.to_owned());
    let port = url.port_or_known_default();
    let allowed = allow.iter().filter_map(|a| allow_entry(a)).any(|(h, p)| h == host && p.is_none_or(|p| Some(p) == port));
    if allowed {
        return Ok(());
    }
    let shown = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    Err(Refusal::NotAllowed(format!("host {shown} is not in [fetch] allow_hosts of ferry.toml")))
}

/// Parse `url` and [`check_target`] it.
pub fn check_url(allow: &[String], url: &str) -> Result<Url, Refusal> {
    let u = Url::parse(url).map_err(|e| Refusal::Invalid(format!("url: {e}")))?;
    check_target(allow, &u)?;
    Ok(u)
}

/// The URL without user name and password.
fn redact(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.to_string()
}

/// `name`, else the last path segment (percent-decoded, cleaned), else `download`.
fn file_name(url: &Url, name: Option<&str>) -> String {
    if let Some(n) = name {
        return n.to_string();
    }
    let seg = url.path_segments().and_then(|mut s| s.next_back()).unwrap_or("");
    let seg = percent_encoding::percent_decode_str(seg).decode_utf8_lossy();
    let clean: String = seg.chars().map(|c| if crate::names::is_hidden_control(c) || c == '/' || c == '\\' { '_' } else { c }).collect();
    if clean.is_empty() || clean == "." || clean == ".." || clean.len() > 255 {
        "download".into()
    } else {
        clean
    }
}

/// `1*DIGIT` as u64, strict (ferry-tus's one number grammar).
fn digits(s: &str) -> Option<u64> {
    ferry_tus::parse_u64_digits(s, "Content-Length").ok()
}

/// A `Content-Range` value (ferry-tus's one grammar), `None` if it does not parse.
fn parse_content_range(v: &str) -> Option<ContentRange> {
    v.trim().parse().ok()
}

/// What to do with a response.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    /// Store the body starting at file offset `from` (0: restart the file); `total` if known.
    Body { from: u64, total: Option<u64> },
    /// The file already holds the whole resource.
    Complete,
    /// Ask again from byte 0 without `Range` (counts as a failed attempt).
    Restart(String),
    /// Transient: try again later.
    Retry(String),
    /// Final answer.
    Fail(String),
}

/// Decide on a response to a request for bytes `offset..` (`offset` 0: no `Range` was sent).
/// `known_total` is the length learned earlier, if any.
fn decide(status: StatusCode, offset: u64, known_total: Option<u64>, content_range: Option<&str>, content_length: Option<u64>) -> Reply {
    let cr = content_range.and_then(parse_content_range);
    match status.as_u16() {
        206 => match cr {
            Some(ContentRange::Bytes { first, total, .. })
                if first == offset && (known_total.is_none() || total.is_none() || total == known_total) =>
            {
                Reply::Body { from: offset, total: total.or(known_total) }
            }
            _ if offset == 0 => Reply::Fail(format!("server answered 206 with Content-Range {:?} to a plain GET", content_range.unwrap_or(""))),
            _ => Reply::Restart(format!("server answered 206 with Content-Range {:?} for bytes {offset}-", content_range.unwrap_or(""))),
        },
        416 if offset > 0 => match cr {
            Some(ContentRange::Unsatisfied { total }) if total == offset => Reply::Complete,
            _ => Reply::Restart(format!("server answered 416 for bytes {offset}-")),
        },
        _ if status.is_success() => Reply::Body { from: 0, total: content_length },
        408 | 429 => Reply::Retry(format!("server answered {status}")),
        _ if status.is_server_error() => Reply::Retry(format!("server answered {status}")),
        _ => Reply::Fail(format!("server answered {status}")),
    }
}

/// What `If-Range` can use: a strong ETag, or a Last-Modified date.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Validator {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    etag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_modified: Option<String>,
}

impl Validator {
    fn from_headers(h: &HeaderMap) -> Validator {
        let text = |name| h.get(name).and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok()).map(str::trim);
        let etag = text(ETAG).filter(|e| e.starts_with('"') && e.ends_with('"') && e.len() >= 2).map(String::from);
        let last_modified = text(LAST_MODIFIED).filter(|d| httpdate::parse_http_date(d).is_ok()).map(String::from);
        Validator { etag, last_modified }
    }

    /// Whether `other` (from a 206) names the same version: equal strong ETags, or, without
    /// ETags, equal Last-Modified.
    fn matches(&self, other: &Validator) -> bool {
        match (&self.etag, &other.etag) {
            (Some(a), Some(b)) => a == b,
            (Some(_), None) => false,
            (None, _) => self.last_modified.is_some() && self.last_modified == other.last_modified,
        }
    }

    fn if_range(&self) -> Option<&str> {
        self.etag.as_deref().or(self.last_modified.as_deref())
    }
}

/// The task checkpoint of a `fetch` (module docs).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct FetchCheckpoint {
    cursor: FileCursor,
    start: FileCursor,
    url: String,
    #[serde(flatten)]
    validator: Validator,
    #[serde(default)]
    length: Option<u64>,
}

/// The file being written.
struct Open {
    writer: FileWriter,
    start: FileCursor,
    validator: Validator,
    total: Option<u64>,
    /// Durable length at the last checkpoint.
    synced: u64,
}

impl Open {
    async fn checkpoint(&mut self, ctx: &JobContext, url: &str) -> Result<(), JobError> {
        let cursor = self.writer.sync().await?;
        self.synced = cursor.offset;
        // A partial result per checkpoint: the durable bytes and the validator they belong to
        // (covered by the checkpoint below, so a resumed run does not repeat it).
        ctx.partial(&serde_json::json!({
            "bytes": cursor.offset,
            "total": self.total,
            "etag": self.validator.etag,
            "last_modified": self.validator.last_modified
        }))
        .await?;
        let cp = FetchCheckpoint { cursor, start: self.start.clone(), url: url.to_string(), validator: self.validator.clone(), length: self.total };
        ctx.checkpoint(&cp).await
    }
}

fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut s = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

#[async_trait]
impl Job for FetchJob {
    fn kind(&self) -> &str {
        "fetch"
    }

    fn validate(&self, args: &RawValue) -> Result<(), String> {
        parse_args(&self.allow, args).map(|_| ())
    }

    fn args_schema(&self) -> Option<Value> {
        Some(serde_json::json!({
            "type": "object",
            "properties": {
                "url": {
                    "type": "string",
                    "pattern": "^[hH][tT][tT][pP][sS]?://[^/?#\\s]+",
                    "description": "An absolute http:// or https:// URL of an allow-listed host ([fetch] allow_hosts; others are 403)."
                },
                "name": { "type": ["string", "null"], "description": "File name (default: from the URL or Content-Disposition)." }
            },
            "required": ["url"],
            "additionalProperties": false
        }))
    }

    /// A URL outside the allow list is 403 `unauthorized` (the same on REST and MCP); other
    /// argument problems are 400 `invalid_argument`.
    fn check(&self, args: &RawValue) -> Result<(), crate::error::Refusal> {
        if let Ok(FetchArgs { url, .. }) = serde_json::from_str::<FetchArgs>(args.get()) {
            if let Err(r @ Refusal::NotAllowed(_)) = check_url(&self.allow, &url) {
                return Err(r.into());
            }
        }
        self.validate(args)
            .map_err(|m| crate::error::Refusal::bad_request(format!("invalid args for fetch: {m}"), "Fix the arguments and start the task again."))
    }

    async fn run(&self, ctx: &JobContext, args: &RawValue, checkpoint: Option<Value>) -> Result<Value, JobError> {
        let (url, name) = parse_args(&self.allow, args).map_err(JobError::failed)?;
        let shown = redact(&url);
        let client = self.client()?;
        let mut file: Option<Open> = None;
        if let Some(cp) = checkpoint {
            let cp: FetchCheckpoint = serde_json::from_value(cp).map_err(|e| JobError::Internal(format!("fetch checkpoint: {e}")))?;
            let writer = ctx.reopen_file(&cp.cursor).await?;
            file = Some(Open { writer, start: cp.start, validator: cp.validator, total: cp.length, synced: cp.cursor.offset });
        }
        let mut failures = 0u32;
        let mut requests = 0u32;
        let mut best = file.as_ref().map_or(0, |f| f.writer.position());
        let mut last_error = String::new();
        let mut no_range = false;
        loop {
            ctx.check()?;
            if failures > 0 {
                if failures >= ATTEMPTS {
                    return Err(JobError::failed(format!("fetch {shown}: {last_error} (gave up after {ATTEMPTS} attempts)")));
                }
                let delay = BACKOFF * 2u32.pow(failures - 1);
                tokio::select! {
                    _ = ctx.cancelled().cancelled() => return Err(JobError::Cancelled),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            requests += 1;
            if requests > MAX_REQUESTS {
                return Err(JobError::failed(format!("fetch {shown}: {last_error} (gave up after {MAX_REQUESTS} requests)")));
            }
            // Resume with Range only when a validator (strong ETag or Last-Modified) lets the
            // server refuse a changed file; without one, bytes from two versions could splice.
            let resumable = file.as_ref().is_some_and(|f| f.validator.if_range().is_some());
            let offset = if no_range || !resumable { 0 } else { file.as_ref().map_or(0, |f| f.writer.position()) };
            no_range = false;
            let mut req = client.get(url.clone());
            if offset > 0 {
                req = req.header(RANGE, format!("bytes={offset}-"));
                if let Some(v) = file.as_ref().and_then(|f| f.validator.if_range()) {
                    req = req.header(IF_RANGE, v);
                }
            }
            let resp = tokio::select! {
                _ = ctx.cancelled().cancelled() => return Err(JobError::Cancelled),
                r = req.send() => r,
            };
            let resp = match resp {
                Ok(r) => r,
                Err(e) if e.is_redirect() || e.is_builder() => return Err(JobError::failed(format!("fetch {shown}: {}", describe(e)))),
                Err(e) => {
                    failures += 1;
                    last_error = describe(e);
                    continue;
                }
            };
            let h = resp.headers();
            let known = file.as_ref().and_then(|f| f.total);
            let length = h.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(digits);
            let reply = decide(resp.status(), offset, known, h.get(CONTENT_RANGE).and_then(|v| v.to_str().ok()), length);
            let total = match reply {
                Reply::Body { from, total } => {
                    let same = file.as_ref().is_some_and(|f| f.validator.matches(&Validator::from_headers(resp.headers())));
                    if from > 0 && !same {
                        // The server ignored If-Range and sent bytes of another version.
                        failures += 1;
                        last_error = "the file changed on the server during the download".into();
                        no_range = true;
                        continue;
                    }
                    if from == 0 {
                        file = Some(restart(ctx, file.take(), &url, name.as_deref(), resp.headers(), total, &shown).await?);
                    }
                    total
                }
                Reply::Complete => {
                    let f = file.take().expect("offset > 0 implies a file");
                    return finish(f.writer, &shown).await;
                }
                Reply::Restart(e) => {
                    failures += 1;
                    last_error = e;
                    no_range = true;
                    continue;
                }
                Reply::Retry(e) => {
                    failures += 1;
                    last_error = e;
                    continue;
                }
                Reply::Fail(e) => return Err(JobError::failed(format!("fetch {shown}: {e}"))),
            };
            let f = file.as_mut().expect("file open for a body");
            f.total = total;
            let mut body = resp.bytes_stream();
            loop {
                let next = tokio::select! {
                    _ = ctx.cancelled().cancelled() => return Err(JobError::Cancelled),
                    n = body.next() => n,
                };
                match next {
                    Some(Ok(chunk)) => {
                        if chunk.is_empty() {
                            continue;
                        }
                        f.writer.write(chunk).await?;
                        let pos = f.writer.position();
                        if pos > best {
                            // Only new bytes count as progress: a server that keeps sending
                            // the same prefix cannot keep the task alive forever.
                            best = pos;
                            failures = 0;
                        }
                        if f.total.is_some_and(|t| pos > t) {
                            return Err(JobError::failed(format!(
                                "fetch {shown}: server sent more than the {} bytes it announced",
                                f.total.unwrap_or(0)
                            )));
                        }
                        let fraction = f.total.filter(|&t| t > 0).map(|t| pos as f64 / t as f64);
                        ctx.progress(fraction, None, &[("bytes", pos)]).await?;
                        if pos - f.synced >= CHECKPOINT_EVERY {
                            f.checkpoint(ctx, &shown).await?;
                        }
                    }
                    Some(Err(e)) => {
                        failures += 1;
                        last_error = describe(e);
                        break;
                    }
                    None => {
                        let pos = f.writer.position();
                        match f.total {
                            Some(t) if pos < t => {
                                // A short (or partial 206) answer: ask for the rest.
                                failures += 1;
                                last_error = format!("connection closed after {pos} of {t} bytes");
                                break;
                            }
                            _ => {
                                ctx.progress(Some(1.0), None, &[("bytes", pos)]).await?;
                                let f = file.take().expect("open");
                                return finish(f.writer, &shown).await;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Start the file over at byte 0 for a full (`200`) answer: create it on the first answer
/// (and checkpoint at once), or reopen it at its start.
async fn restart(
    ctx: &JobContext,
    file: Option<Open>,
    url: &Url,
    name: Option<&str>,
    h: &HeaderMap,
    total: Option<u64>,
    shown: &str,
) -> Result<Open, JobError> {
    let validator = Validator::from_headers(h);
    match file {
        Some(f) => {
            let start = f.start;
            drop(f.writer);
            let writer = ctx.reopen_file(&start).await?;
            Ok(Open { writer, start, validator, total, synced: 0 })
        }
        None => {
            let media_type =
                h.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::trim).filter(|t| !t.is_empty()).unwrap_or("application/octet-stream");
            let mut writer = ctx.create_file(&file_name(url, name), media_type).await?;
            let start = writer.sync().await?;
            let mut f = Open { writer, start, validator, total, synced: 0 };
            f.checkpoint(ctx, shown).await?;
            Ok(f)
        }
    }
}

async fn finish(writer: FileWriter, shown: &str) -> Result<Value, JobError> {
    let handle = writer.finish().await?;
    Ok(serde_json::json!({ "file": handle, "url": shown }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(hosts: &[&str]) -> Vec<String> {
        hosts.iter().map(|s| s.to_string()).collect()
    }

    fn check(hosts: &[&str], url: &str) -> Result<(), String> {
        check_target(&allow(hosts), &Url::parse(url).unwrap()).map_err(|r| r.to_string())
    }

    #[test]
    fn allow_list() {
        assert!(check(&["Example.COM"], "http://example.com/a").is_ok());
        assert!(check(&["example.com"], "http://EXAMPLE.com:8080/a").is_ok(), "a bare host allows every port");
        assert!(check(&["example.com:8080"], "http://example.com:8080/a").is_ok());
        assert!(check(&["example.com:80"], "http://example.com/a").is_ok(), "default port");
        assert!(check(&["[::1]:9000"], "http://[::1]:9000/").is_ok());
        let e = check(&["example.com:8080"], "http://example.com:9090/a").unwrap_err();
        assert_eq!(e, "host example.com:9090 is not in [fetch] allow_hosts of ferry.toml");
        let e = check(&[], "http://example.com/a").unwrap_err();
        assert_eq!(e, "host example.com is not in [fetch] allow_hosts of ferry.toml");
        assert!(check(&["example.com"], "http://sub.example.com/").is_err());
        assert!(check(&["example.com"], "https://example.com/").is_ok());
        assert!(check(&["example.com:443"], "https://example.com/").is_ok(), "https's default port");
        assert!(check(&["example.com"], "ftp://example.com/").is_err());
    }

    /// The same URL gets the same answer whatever the spelling of the host or the entry.
    #[test]
    fn allow_list_normalises_hosts_and_sees_through_userinfo() {
        for (hosts, url) in [
            (&["::1"][..], "http://[::1]:9000/"),
            (&["[::1]"][..], "http://[0:0:0:0:0:0:0:1]/"),
            (&["[::1]:9000"][..], "http://[::1]:9000/x"),
            (&["127.0.0.1"][..], "http://0x7f.0.0.1/"),
            (&["Example.com."][..], "http://EXAMPLE.COM/"),
            (&["example.com"][..], "http://example.com./"),
            (&["example.com"][..], "http://user:pw@example.com/"),
        ] {
            assert!(check(hosts, url).is_ok(), "{hosts:?} should allow {url}");
        }
        for (hosts, url) in [
            (&["allowed"][..], "http://allowed@evil/"),
            (&["allowed"][..], "http://allowed:80@evil/"),
            (&["allowed"][..], "http://evil#@allowed/"),
            (&["allowed"][..], "http://allowed.evil/"),
            (&["::1"][..], "http://[::2]/"),
            (&["[::1]:9000"][..], "http://[::1]:9001/"),
            (&["example.com:80"][..], "http://example.com:8080/"),
        ] {
            assert!(check(hosts, url).unwrap_err().contains("allow_hosts"), "{hosts:?} should refuse {url}");
        }
    }

    #[test]
    fn args() {
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        let a = allow(&["h"]);
        assert!(parse_args(&a, &raw(r#"{"url":"http://h/x"}"#)).is_ok());
        assert!(parse_args(&a, &raw(r#"{"url":"http://h/x","name":"a/b"}"#)).is_err());
        assert!(parse_args(&a, &raw(r#"{"url":"not a url"}"#)).is_err());
        assert!(parse_args(&a, &raw(r#"{"url":"http://h/x","extra":1}"#)).is_err());
    }

    #[test]
    fn content_range() {
        assert_eq!(parse_content_range("bytes 10-19/100"), Some(ContentRange::Bytes { first: 10, last: 19, total: Some(100) }));
        assert_eq!(parse_content_range("bytes 10-19/*"), Some(ContentRange::Bytes { first: 10, last: 19, total: None }));
        assert_eq!(parse_content_range("bytes */100"), Some(ContentRange::Unsatisfied { total: 100 }));
        for bad in ["bytes 10-9/100", "bytes 10-100/100", "bytes +1-2/3", "bytes 1-2", "items 1-2/3", "bytes -2/3", "bytes */*", "bytes 1-2/x"] {
            assert_eq!(parse_content_range(bad), None, "{bad}");
        }
    }

    #[test]
    fn decisions() {
        let ok = StatusCode::OK;
        let partial = StatusCode::PARTIAL_CONTENT;
        assert_eq!(decide(ok, 0, None, None, Some(5)), Reply::Body { from: 0, total: Some(5) });
        assert_eq!(decide(ok, 50, Some(100), None, Some(100)), Reply::Body { from: 0, total: Some(100) }, "200 to a range restarts");
        assert_eq!(decide(partial, 50, Some(100), Some("bytes 50-99/100"), Some(50)), Reply::Body { from: 50, total: Some(100) });
        assert_eq!(decide(partial, 50, None, Some("bytes 50-99/*"), None), Reply::Body { from: 50, total: None });
        assert!(matches!(decide(partial, 50, Some(100), Some("bytes 40-99/100"), None), Reply::Restart(_)));
        assert!(matches!(decide(partial, 50, Some(100), Some("bytes 50-119/120"), None), Reply::Restart(_)), "total changed");
        assert!(matches!(decide(partial, 50, None, None, None), Reply::Restart(_)));
        assert_eq!(decide(StatusCode::RANGE_NOT_SATISFIABLE, 100, Some(100), Some("bytes */100"), None), Reply::Complete);
        assert!(matches!(decide(StatusCode::RANGE_NOT_SATISFIABLE, 100, Some(100), Some("bytes */90"), None), Reply::Restart(_)));
        assert!(matches!(decide(StatusCode::SERVICE_UNAVAILABLE, 0, None, None, None), Reply::Retry(_)));
        assert!(matches!(decide(StatusCode::TOO_MANY_REQUESTS, 0, None, None, None), Reply::Retry(_)));
        assert_eq!(decide(StatusCode::NOT_FOUND, 0, None, None, None), Reply::Fail("server answered 404 Not Found".into()));
        assert!(matches!(decide(StatusCode::RANGE_NOT_SATISFIABLE, 0, None, None, None), Reply::Fail(_)));
    }

    #[test]
    fn validators() {
        let mut h = HeaderMap::new();
        h.insert(ETAG, "W/\"weak\"".parse().unwrap());
        h.insert(LAST_MODIFIED, "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap());
        let v = Validator::from_headers(&h);
        assert_eq!(v.if_range(), Some("Wed, 21 Oct 2015 07:28:00 GMT"), "weak ETags are not used with If-Range");
        h.insert(ETAG, "\"abc\"".parse().unwrap());
        assert_eq!(Validator::from_headers(&h).if_range(), Some("\"abc\""));
        h.insert(LAST_MODIFIED, "yesterday".parse().unwrap());
        h.remove(ETAG);
        assert_eq!(Validator::from_headers(&h).if_range(), None);
    }

    #[test]
    fn names_and_redaction() {
        let u = Url::parse("http://user:pw@h/a/report%20v2.csv?x=1").unwrap();
        assert_eq!(file_name(&u, None), "report v2.csv");
        assert_eq!(file_name(&u, Some("mine")), "mine");
        assert_eq!(file_name(&Url::parse("http://h/").unwrap(), None), "download");
        assert_eq!(file_name(&Url::parse("http://h/a/%2F..").unwrap(), None), "_..");
        assert_eq!(redact(&u), "http://h/a/report%20v2.csv?x=1");
    }

    /// A one-resource HTTP server: the first answer is cut after 5 of 10 bytes; later ones
    /// honour `Range` (when `If-Range` matches). Returns the address and the requests' headers.
    async fn flaky_server() -> (std::net::SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            let body = b"0123456789";
            for n in 0.. {
                let (mut sock, _) = listener.accept().await.unwrap();
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.ends_with(b"\r\n\r\n") {
                    let k = sock.read(&mut buf).await.unwrap();
                    if k == 0 {
                        break;
                    }
                    req.extend_from_slice(&buf[..k]);
                }
                let req = String::from_utf8_lossy(&req).to_lowercase();
                log.lock().unwrap().push(req.clone());
                let range = req.lines().find_map(|l| l.strip_prefix("range: bytes=")).and_then(|r| r.trim_end_matches('-').parse::<usize>().ok());
                let if_range_ok = req.lines().any(|l| l == "if-range: \"v1\"");
                let head = "content-type: text/plain\r\netag: \"v1\"\r\nconnection: close\r\n";
                if n == 0 {
                    let _ = sock.write_all(format!("HTTP/1.1 200 OK\r\n{head}content-length: 10\r\n\r\n").as_bytes()).await;
                    let _ = sock.write_all(&body[..5]).await;
                } else if let (Some(from), true) = (range, if_range_ok) {
                    let _ = sock
                        .write_all(
                            format!(
                                "HTTP/1.1 206 Partial Content\r\n{head}content-range: bytes {from}-9/10\r\ncontent-length: {}\r\n\r\n",
                                10 - from
                            )
                            .as_bytes(),
                        )
                        .await;
                    let _ = sock.write_all(&body[from..]).await;
                } else {
                    let _ = sock.write_all(format!("HTTP/1.1 200 OK\r\n{head}content-length: 10\r\n\r\n").as_bytes()).await;
                    let _ = sock.write_all(body).await;
                }
                let _ = sock.shutdown().await;
            }
        });
        (addr, seen)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn resumes_with_range_after_a_cut() {
        use crate::tasks::kinds::command::tests::{engine, file_bytes, settle};
        let (addr, seen) = flaky_server().await;
        let dir = tempfile::tempdir().unwrap();
        let job = FetchJob::new(FetchConfig { allow_hosts: vec![format!("127.0.0.1:{}", addr.port())], ..Default::default() });
        let e = engine(dir.path(), Arc::new(job)).await;
        let args = format!(r#"{{"url":"http://127.0.0.1:{}/dir/data.txt"}}"#, addr.port());
        let t = e.start("p", "fetch", &args, None, None).await.unwrap().task;
        let t = settle(&e, &t.id).await;
        assert_eq!(t.status, crate::tasks::TaskStatus::Completed, "{t:?}");
        let result = t.result.clone().unwrap();
        assert!(result.contains(r#""name":"data.txt""#) && result.contains("text/plain"), "{result}");
        assert_eq!(file_bytes(&e, &result).await, b"0123456789");
        {
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 2, "{seen:?}");
            assert!(seen[1].contains("range: bytes=5-") && seen[1].contains("if-range: \"v1\""), "{}", seen[1]);
        }
        // A partial result per checkpoint: the durable bytes and the validator they belong to.
        let page = e.partials(&t, 0).await.unwrap();
        let first: serde_json::Value = serde_json::from_str(page.fragments.first().expect("a fragment").value.get()).unwrap();
        assert_eq!(first, serde_json::json!({ "bytes": 0, "total": 10, "etag": "\"v1\"", "last_modified": null }), "{page:?}");
        assert!(page.fragments.windows(2).all(|w| w[0].seq + 1 == w[1].seq), "{page:?}");
        e.shutdown();
    }

    #[tokio::test]
    async fn start_refuses_hosts_not_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let e = crate::tasks::kinds::command::tests::engine(dir.path(), Arc::new(FetchJob::new(FetchConfig::default()))).await;
        let err = e.start("p", "fetch", r#"{"url":"http://example.com/x"}"#, None, None).await.unwrap_err();
        assert!(err.to_string().contains("host example.com is not in [fetch] allow_hosts of ferry.toml"), "{err}");
        assert_eq!((err.status, err.code), (403, crate::error::ErrorCode::Unauthorized));
        e.shutdown();
    }
}
