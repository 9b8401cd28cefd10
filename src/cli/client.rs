//! Shared plumbing of the client subcommands: where the server is ([`Connection`]), the HTTP
//! client, the first contact with the server (fail fast when nothing or something else than ferry
//! answers), RFC 9457 problem bodies, retry with exponential backoff, and the exit codes of
//! every client command ([`EXIT_CODES`]).
//!
//! One file of ~1 080 lines because every client command shares this plumbing; the commands
//! themselves live in their own files.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Deserialize;

/// One exit code of every client command: its number, and what it means.
pub struct ExitCodeDoc {
    pub code: u8,
    pub meaning: &'static str,
}

/// Exit code: an unexpected answer or a local I/O error.
pub const EXIT_FAILURE: u8 = 1;
/// Exit code: usage or configuration error (also: `--server` is not a ferry server), or a 4xx
/// not listed elsewhere.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: 404 / 410, or a local input file that does not exist.
pub const EXIT_NOT_FOUND: u8 = 3;
/// Exit code: sha256 mismatch, or the server's copy is damaged.
pub const EXIT_VERIFY: u8 = 4;
/// Exit code: no connection to the server (at once), or 5xx / 423 / a dropped connection after
/// the server first answered, until the retry budget ran out.
pub const EXIT_NETWORK: u8 = 5;
/// Exit code: 401 / 403.
pub const EXIT_AUTH: u8 = 6;
/// Exit code: `ferry task … --wait`: the task failed.
pub const EXIT_TASK_FAILED: u8 = 7;
/// Exit code: `ferry task … --wait`: the task was cancelled.
pub const EXIT_TASK_CANCELLED: u8 = 8;

/// Interrupted by Ctrl-C (SIGINT): 128 + 2, as shells report it.
pub const EXIT_INTERRUPTED: u8 = 130;

/// The exit codes of every client command (`upload`, `download`, `ls`, `status`, `rm`,
/// `share`, `task`): the one definition behind `--help` and the README's table
/// (`tests/cli_transfer.rs` checks that the two agree).
pub const EXIT_CODES: &[ExitCodeDoc] = &[
    ExitCodeDoc { code: 0, meaning: "success (`task --wait`: the task completed; `download`: also when PATH already holds the verified file)" },
    ExitCodeDoc { code: EXIT_FAILURE, meaning: "other failure: an unexpected answer from the server, a local I/O error" },
    ExitCodeDoc {
        code: EXIT_USAGE,
        meaning: "usage or configuration error (also: --server answers, but is not a ferry server, or its port speaks the other \
                  scheme: http:// for https:// or back), or the server refused the request as invalid (other 4xx, e.g. 413 too large)",
    },
    ExitCodeDoc { code: EXIT_NOT_FOUND, meaning: "not found: no such file or task on the server (404) or it expired (410); a local FILE is missing" },
    ExitCodeDoc {
        code: EXIT_VERIFY,
        meaning: "verification failed: the sha256 of the bytes differs from the server's or from a declared --meta sha256 (460), the file \
                  changed while it was being uploaded, or the server's copy is damaged (500 damaged: `ferry ls` and `status` show it so)",
    },
    ExitCodeDoc {
        code: EXIT_NETWORK,
        meaning: "network: no connection to the server (at once, no retries), or after it first answered, 5xx \
                  / 423 / dropped connections until --retry-for ran out without progress (re-run to resume)",
    },
    ExitCodeDoc { code: EXIT_AUTH, meaning: "authentication: the token is missing, unknown or not allowed (401, 403)" },
    ExitCodeDoc { code: EXIT_TASK_FAILED, meaning: "`task start --wait`, `task get --wait`, `task respond --wait`: the task failed" },
    ExitCodeDoc { code: EXIT_TASK_CANCELLED, meaning: "`task start --wait`, `task get --wait`, `task respond --wait`: the task was cancelled" },
    ExitCodeDoc { code: EXIT_INTERRUPTED, meaning: "`upload`, `download`: interrupted (Ctrl-C); the same command resumes" },
];

/// The exit codes as `--help` shows them (after every client command's help and `ferry --help`).
pub fn exit_codes_help() -> String {
    let mut s = String::from("Exit codes (every client command: upload, download, ls, status, rm, share, request, task):\n");
    for c in EXIT_CODES {
        s.push_str(&format!("  {}  {}\n", c.code, c.meaning.replace('`', "")));
    }
    s.push_str(
        "With several files (upload) or ids (rm), every one is tried and the exit code is the first\n\
         failure's. A closed stdout (`ferry ls | head`) ends a command quietly with 0.",
    );
    s
}

/// Default `--server` when neither the flag nor `FERRY_SERVER` is set.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

/// Where the server is and who we are.
///
/// `FERRY_SERVER` / `FERRY_TOKEN` are read here rather than through clap's `env`: clap counts
/// a value from the environment as "given", and its usage lines then show the option as if it
/// were required (`Usage: ferry rm --server <URL> <ID|URL>...`).
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// Base URL of the ferry server [env: FERRY_SERVER] [default: http://127.0.0.1:8080]
    #[arg(long, value_name = "URL", global = true, help_heading = "Connection")]
    pub server: Option<String>,
    /// Bearer token (from `ferry token create NAME`); not needed when the server has no
    /// tokens [env: FERRY_TOKEN]
    #[arg(long, value_name = "TOKEN", global = true, help_heading = "Connection")]
    pub token: Option<String>,
    /// Trust the certificates in this PEM file for an https:// server (its authority, or a
    /// self-signed certificate itself), as curl's --cacert does [env: FERRY_CACERT]
    #[arg(long, value_name = "FILE", global = true, help_heading = "Connection")]
    pub cacert: Option<std::path::PathBuf>,
}

/// A non-empty environment variable.
fn env_nonempty(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

impl Connection {
    /// `--server`, else `FERRY_SERVER`, else [`DEFAULT_SERVER`].
    pub fn server(&self) -> String {
        self.server.clone().or_else(|| env_nonempty("FERRY_SERVER")).unwrap_or_else(|| DEFAULT_SERVER.to_string())
    }

    /// The server's base URL without a trailing slash: `http://` or `https://` (verified with
    /// rustls against the system's certificate authorities).
    pub fn base(&self) -> Result<reqwest::Url, CliError> {
        let server = self.server();
        let base = server.trim_end_matches('/');
        let mut url = reqwest::Url::parse(base).map_err(|e| CliError::usage(format!("--server {base:?} is not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(CliError::usage(format!("--server must be an http:// or https:// URL, got {base:?}")));
        }
        // The TUS endpoint (what tus clients are given) names the same server: its base is what
        // precedes `/files`.
        if let Some(prefix) = url.path().strip_suffix("/files").map(str::to_string) {
            url.set_path(&prefix);
        }
        Ok(url)
    }

    /// `--cacert`, else `FERRY_CACERT`.
    pub fn cacert(&self) -> Option<std::path::PathBuf> {
        self.cacert.clone().or_else(|| env_nonempty("FERRY_CACERT").map(Into::into))
    }

    /// The token (`--token`, else `FERRY_TOKEN`), if one is set and not empty.
    pub fn token(&self) -> Option<String> {
        self.token.clone().or_else(|| std::env::var("FERRY_TOKEN").ok()).filter(|t| !t.is_empty())
    }
}

/// Who the token says we are, for keys of local state (the upload URL store): the first 16 hex
/// digits of the token's sha256, or `anonymous`. Never the token itself.
pub fn token_identity(token: Option<&str>) -> String {
    use sha2::Digest as _;
    match token {
        Some(t) => hex::encode(&sha2::Sha256::digest(t.as_bytes())[..8]),
        None => "anonymous".to_string(),
    }
}

/// An HTTP client with the CLI's user agent. `total` bounds a whole request (use `None` for
/// transfers, whose bodies may take hours); `read` bounds each read of an answer.
/// With `cacert` (`--cacert`), https:// servers are trusted by that file only ([`super::tls`]).
pub fn http_client(cacert: Option<&std::path::Path>, total: Option<Duration>, read: Option<Duration>) -> Result<reqwest::Client, CliError> {
    let mut b = reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).user_agent(concat!("ferry-cli/", env!("CARGO_PKG_VERSION")));
    if let Some(file) = cacert {
        b = b.tls_backend_preconfigured(super::tls::client_config(file)?);
    }
    if let Some(t) = total {
        b = b.timeout(t);
    }
    if let Some(r) = read {
        b = b.read_timeout(r);
    }
    b.build().map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot build the HTTP client: {e}")))
}

/// An error and source chain on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let t = c.to_string();
        if !s.ends_with(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = c.source();
    }
    s
}

/// The RFC 9457 problem fields ferry sends (`detail`, our `code`, `recovery_hint`).
#[derive(Deserialize, Default)]
pub struct ProblemBody {
    #[serde(default)]
    pub detail: Option<String>,
    #[serde(default)]
    pub recovery_hint: Option<String>,
    #[serde(default)]
    pub code: Option<String>,
    /// ferry's word on whether repeating the request can succeed (e.g. `false` for
    /// `quota_exceeded`, a 507 that only a person can resolve).
    #[serde(default)]
    pub retryable: Option<bool>,
}

/// Why a command stopped: a message for stderr, an optional hint, and the exit code.
#[derive(Debug)]
pub struct CliError {
    pub code: u8,
    pub message: String,
    pub hint: Option<String>,
    /// The problem's `code` when the error is an answer from the server (e.g.
    /// `checksum_mismatch`).
    pub server_code: Option<String>,
    /// The problem's `retryable` when the server said: [`Retry::wait`] gives up at once on
    /// `false`, whatever the status.
    pub server_retryable: Option<bool>,
    /// The answer's `Retry-After`, as a wait from when it arrived: [`Retry::wait`] pauses at
    /// least this long.
    pub retry_after: Option<Duration>,
}

impl CliError {
    pub fn new(code: u8, message: impl Into<String>) -> CliError {
        CliError { code, message: message.into(), hint: None, server_code: None, server_retryable: None, retry_after: None }
    }

    /// Stop quietly with exit code 0: stdout was closed by its reader (`ferry ls | head`).
    pub fn quiet() -> CliError {
        CliError::new(0, "")
    }

    /// Did the server answer with this problem `code`?
    pub fn is_server_code(&self, code: &str) -> bool {
        self.server_code.as_deref() == Some(code)
    }

    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::new(EXIT_USAGE, message)
    }

    pub fn hint(mut self, hint: impl Into<String>) -> CliError {
        self.hint = Some(hint.into());
        self
    }

    /// Print `ferry: MESSAGE` (and `hint: …`) on stderr.
    pub fn print(&self) {
        if self.message.is_empty() {
            return;
        }
        eprintln!("ferry: {}", self.message);
        if let Some(h) = &self.hint {
            eprintln!("hint: {h}");
        }
    }

    /// An error answer from the server: the exit code follows the status (see
    /// [`EXIT_CODES`]); the message is the problem's `detail` when there is one.
    pub fn from_status(what: &str, status: u16, body: &str) -> CliError {
        let problem: ProblemBody = serde_json::from_str(body).unwrap_or_default();
        let code = match status {
            // The server's copy is damaged (`ferry check`, or a read found its bytes gone): what
            // a download gets is not the file, as when its sha256 does not match.
            _ if problem.code.as_deref() == Some("damaged") => EXIT_VERIFY,
            401 | 403 => EXIT_AUTH,
            404 | 410 => EXIT_NOT_FOUND,
            // The bytes do not match a declared sha256 (or a chunk's Upload-Checksum).
            460 => EXIT_VERIFY,
            // A limit only a person can lift (e.g. 507 `quota_exceeded`) is no network trouble.
            423 | 429 | 500..=599 if problem.retryable == Some(false) => EXIT_FAILURE,
            423 | 429 | 500..=599 => EXIT_NETWORK,
            400..=499 => EXIT_USAGE,
            _ => EXIT_FAILURE,
        };
        let detail = match (&problem.detail, &problem.code) {
            (Some(d), Some(c)) => format!("{d} ({c})"),
            (Some(d), None) => d.clone(),
            _ if body.trim().is_empty() && what.starts_with("HEAD ") => String::from("no details (a HEAD answer has no body)"),
            _ if body.trim().is_empty() => String::from("no details"),
            // A page (a proxy's or another server's error page) is not a message: never
            // print its markup.
            _ if body.trim_start().starts_with('<') => {
                format!("an HTML or XML page of {} bytes (not an answer from ferry: a proxy in between?)", body.len())
            }
            _ => body.trim().chars().take(300).collect(),
        };
        let mut e = CliError::new(code, format!("{what}: HTTP {status}: {detail}"));
        e.server_code = problem.code.clone();
        e.server_retryable = problem.retryable;
        let cli_auth = "Pass a token with --token or FERRY_TOKEN (see `ferry token create`).";
        // A signed link (`…?exp=…&sig=…`) is its own credential: a token would not help.
        let signed = what.split_once('?').is_some_and(|(_, q)| q.split('&').any(|p| p.starts_with("sig=")));
        e.hint = match status {
            401 | 403 if signed => Some(
                "This signed link was refused: it has expired, was changed (copied incompletely?), or \
                 belongs to another server. Ask whoever sent it for a new one (`ferry share ID` makes one)."
                    .into(),
            ),
            // The server's hint for 401 speaks HTTP (`Authorization: Bearer`).
            401 => Some(cli_auth.into()),
            _ => problem.recovery_hint.filter(|h| !h.is_empty()).map(|h| cli_words(&h)).or_else(|| (code == EXIT_AUTH).then(|| cli_auth.into())),
        };
        e
    }

    /// A request that never got an answer.
    /// [`CliError::from_status`] of answer `r` (its body read here), keeping its `Retry-After`.
    pub async fn from_response(what: &str, r: reqwest::Response) -> CliError {
        let status = r.status().as_u16();
        let after = retry_after(r.headers(), std::time::SystemTime::now());
        let body = r.text().await.unwrap_or_default();
        let mut e = CliError::from_status(what, status, &body);
        e.retry_after = after;
        e
    }

    pub fn network(what: &str, e: &reqwest::Error) -> CliError {
        CliError::unreachable(what.to_string(), e, None)
    }

    /// A request that never got an answer: `PREFIX: cause`, with the hint that fits. A TLS
    /// failure is said in words ([`super::tls::TlsFailure`]) with what to do, and is not retried
    /// (a certificate the client does not trust stays untrusted); anything else gets the hint
    /// `not_running` (whether the server runs), if given.
    pub fn unreachable(prefix: String, e: &reqwest::Error, not_running: Option<String>) -> CliError {
        match super::tls::tls_failure(e) {
            Some(f) => {
                let host = e.url().and_then(|u| u.host_str()).unwrap_or("the server");
                let mut err = CliError::new(EXIT_NETWORK, format!("{prefix}: {}", f.words(host))).hint(f.hint());
                err.server_retryable = Some(false);
                err
            }
            None => {
                let err = CliError::new(EXIT_NETWORK, format!("{prefix}: {}", error_chain(e)));
                match not_running {
                    Some(h) => err.hint(h),
                    None => err,
                }
            }
        }
    }
}

/// `url` with the other scheme (`http` ↔ `https`), its port kept (`https://h` is `http://h:443`).
fn other_scheme(url: &reqwest::Url) -> reqwest::Url {
    let mut out = url.clone();
    let port = url.port_or_known_default();
    let scheme = if url.scheme() == "https" { "http" } else { "https" };
    let _ = out.set_scheme(scheme);
    let _ = out.set_port(port);
    out
}

/// This command line as it should be run again with `right`'s scheme for every URL of
/// origin `wrong` (`--server`, a link argument), quoted for a POSIX shell: `ferry upload
/// --server http://h:1 f.bin`. When no argument names `wrong` (the server came from
/// `FERRY_SERVER` or the default), `FERRY_SERVER=…` goes in front, or `--server …` at the end.
pub fn command_with_origin(wrong: &reqwest::Url, right: &reqwest::Url) -> String {
    let swap = |a: &str| -> Option<String> {
        let (flag, value) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (Some(f), v),
            _ => (None, a),
        };
        let mut u = reqwest::Url::parse(value).ok()?;
        if u.origin() != wrong.origin() {
            return None;
        }
        let port = u.port_or_known_default();
        u.set_scheme(right.scheme()).ok()?;
        u.set_port(port).ok()?;
        // Written as it was given: no trailing `/` added to a bare origin.
        let mut text = u.to_string();
        if !value.ends_with('/') && u.path() == "/" && u.query().is_none() {
            text.pop();
        }
        Some(flag.map_or(text.clone(), |f| format!("{f}={text}")))
    };
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut swapped = false;
    for a in &mut args {
        if let Some(n) = swap(a) {
            *a = n;
            swapped = true;
        }
    }
    let mut words = Vec::new();
    if !swapped {
        match env_nonempty("FERRY_SERVER").and_then(|v| swap(&v)) {
            Some(v) => words.push(format!("FERRY_SERVER={}", shlex::try_quote(&v).map(|q| q.into_owned()).unwrap_or(v))),
            None => args.extend(["--server".to_string(), right.origin().ascii_serialization()]),
        }
    }
    words.push(
        shlex::try_join(std::iter::once("ferry").chain(args.iter().map(String::as_str))).unwrap_or_else(|_| format!("ferry {}", args.join(" "))),
    );
    words.join(" ")
}

/// The file URL (`…/files/ID`, query kept) of a ferry page or API link (`…/share/ID`,
/// `…/api/v1/files/ID`), if `url` is one.
fn file_url_of(url: &reqwest::Url) -> Option<reqwest::Url> {
    let path = url.path();
    let (prefix, id) = [crate::signing::PAGE_PATH, "/api/v1/files/"].iter().find_map(|marker| {
        let at = path.rfind(marker)?;
        let id = &path[at + marker.len()..];
        (!id.is_empty() && !id.contains('/')).then(|| (&path[..at], id))
    })?;
    let mut out = url.clone();
    out.set_path(&format!("{prefix}/files/{id}"));
    Some(out)
}

/// Is this answer worth retrying (RFC 9110 §15.6 server errors, TUS `423 locked`, 429)?
/// A server hint in the words of the CLI: the HTTP and MCP steps it names, as commands.
pub fn cli_words(hint: &str) -> String {
    const SAME: [(&str, &str); 4] = [
        ("file_list (MCP) or GET /api/v1/files", "`ferry ls`"),
        ("; to upload anew, POST to the upload collection", "; `ferry ls` lists yours, and `ferry upload FILE` starts a new upload"),
        ("file_status or GET /api/v1/files/ID", "`ferry status ID`"),
        ("Send `Authorization: Bearer <token>`", "Pass a token with --token or FERRY_TOKEN"),
    ];
    SAME.iter().fold(hint.to_string(), |h, (http, cli)| h.replace(http, cli))
}

/// `Retry-After` of an answer received at `now`, as a wait: delay-seconds or an HTTP-date
/// (RFC 9110 §10.2.3). `None` when absent, malformed or already past.
fn retry_after(h: &reqwest::header::HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    let v = h.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    httpdate::parse_http_date(v).ok()?.duration_since(now).ok()
}

pub fn retryable_status(status: u16) -> bool {
    matches!(status, 423 | 429 | 500..=599)
}

/// Retries with exponential backoff (250 ms doubling to 10 s) until `budget` has passed
/// since the last success ([`Retry::success`]): a flaky link that keeps making progress is
/// never given up on, a dead one is after `budget`.
pub struct Retry {
    budget: Duration,
    since: Instant,
    next: Duration,
    pub attempts: u32,
}

/// First pause between retries.
const BACKOFF_START: Duration = Duration::from_millis(250);
/// Longest pause between retries.
const BACKOFF_MAX: Duration = Duration::from_secs(10);

impl Retry {
    pub fn new(budget: Duration) -> Retry {
        Retry { budget, since: Instant::now(), next: BACKOFF_START, attempts: 0 }
    }

    /// Progress was made: the budget and the backoff start over.
    pub fn success(&mut self) {
        self.since = Instant::now();
        self.next = BACKOFF_START;
        self.attempts = 0;
    }

    /// The pause before the next attempt after `err`, `spent` into the budget: the backoff's,
    /// or the server's `Retry-After` when that is longer (RFC 9110 §10.2.3), never past the
    /// budget's end.
    fn pause(&self, err: &CliError, spent: Duration) -> Duration {
        self.next.max(err.retry_after.unwrap_or_default()).min(self.budget.saturating_sub(spent))
    }

    /// After a retryable failure `err`: sleep and return `Ok`, or return the error (with a
    /// "gave up" message) once the budget is spent.
    pub async fn wait(&mut self, err: CliError) -> Result<(), CliError> {
        let spent = self.since.elapsed();
        if self.budget.is_zero() || err.server_retryable == Some(false) {
            // No retries asked for (e.g. a POST that must not run twice), or the server says
            // repeating cannot help (`retryable: false`): the error as it is.
            return Err(err);
        }
        if spent >= self.budget {
            let mut e = CliError::new(
                EXIT_NETWORK,
                format!(
                    "gave up after {} of failures ({} attempts): {}",
                    humantime::format_duration(Duration::from_secs(spent.as_secs().max(1))),
                    self.attempts + 1,
                    err.message
                ),
            );
            // Still what the server said: callers may act on its code.
            (e.server_code, e.server_retryable, e.retry_after) = (err.server_code, err.server_retryable, err.retry_after);
            let rerun = "Re-run the same command to resume where it stopped; --retry-for sets how long to keep trying.";
            e.hint = Some(match err.hint {
                Some(server) => format!("{server} With this command: {}{}", rerun[..1].to_lowercase(), &rerun[1..]),
                None => rerun.into(),
            });
            return Err(e);
        }
        let pause = self.pause(&err, spent);
        self.attempts += 1;
        let asked = if err.retry_after.is_some_and(|a| a > self.next) { ", as the server asked" } else { "" };
        eprintln!("ferry: {} (retry {} in {} ms{asked})", err.message, self.attempts, pause.as_millis());
        tokio::time::sleep(pause).await;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        Ok(())
    }
}

/// What the server said at the first contact (TUS discovery, `OPTIONS /files/`).
#[derive(Debug, Clone, Default)]
pub struct ServerInfo {
    /// `Tus-Max-Size`: the largest upload it accepts, in bytes (TUS 1.0 §Tus-Max-Size).
    pub max_size: Option<u64>,
}

/// Transfer client: the HTTP client, the server's base URL and the token.
#[derive(Clone)]
pub struct Client {
    pub http: reqwest::Client,
    pub base: reqwest::Url,
    token: Option<String>,
    /// `--cacert`, for further HTTP clients to the same server.
    pub cacert: Option<std::path::PathBuf>,
    /// Where the first contact goes: `{server}/files/`, or the `/files/` of a URL argument.
    discovery: reqwest::Url,
    /// The first contact's answer, once it was a ferry server's.
    contact: Arc<tokio::sync::OnceCell<ServerInfo>>,
}

impl Client {
    /// A client for transfers: no overall timeout, but a read that sends nothing for
    /// `read_timeout` fails (and is retried).
    pub fn new(conn: &Connection, read_timeout: Duration) -> Result<Client, CliError> {
        Client::with_http(conn, http_client(conn.cacert().as_deref(), None, Some(read_timeout))?)
    }

    /// A client on `http` (e.g. one with an overall timeout, for API calls).
    pub fn with_http(conn: &Connection, http: reqwest::Client) -> Result<Client, CliError> {
        let base = conn.base()?;
        let mut c = Client {
            http,
            base,
            token: conn.token(),
            cacert: conn.cacert(),
            discovery: reqwest::Url::parse("http://invalid/").expect("valid"),
            contact: Default::default(),
        };
        c.discovery = c.url("/files/");
        Ok(c)
    }

    /// The same server, token and first contact as `other`, on another HTTP client (e.g. one
    /// without an overall timeout, for a stream).
    pub fn with_http_of(other: &Client, http: reqwest::Client) -> Client {
        Client { http, ..other.clone() }
    }

    /// Make the first contact at the ferry that serves `url` (a `/files/{id}` URL, e.g. a
    /// signed one from another server) instead of `--server`.
    pub fn discover_at(&mut self, url: &reqwest::Url) {
        let mut d = url.clone();
        d.set_query(None);
        d.set_fragment(None);
        let path = d.path().to_string();
        let prefix = match path.rfind("/files/") {
            Some(i) => &path[..i],
            None => path.trim_end_matches('/').rsplit_once('/').map_or("", |(p, _)| p),
        };
        d.set_path(&format!("{prefix}/files/"));
        self.discovery = d;
    }

    /// The first contact with the server: TUS discovery (`OPTIONS /files/`, TUS 1.0 §OPTIONS),
    /// made once per command before any other request. It fails at once, without retries:
    /// when no connection can be made (exit code 5: nothing to resume yet, and minutes of
    /// retries would only hide a wrong `--server` or a stopped server), and when what answers
    /// is not ferry — no `Tus-Resumable` in the answer, e.g. a static file server's `501` HTML
    /// page (exit code 2; a proxy's `502`/`503`/`504` without it: 5). Retries are for failures
    /// after this.
    pub async fn contact(&self) -> Result<ServerInfo, CliError> {
        self.contact.get_or_try_init(|| self.discover()).await.cloned()
    }

    async fn discover(&self) -> Result<ServerInfo, CliError> {
        let url = &self.discovery;
        let origin = url.origin().ascii_serialization();
        let what = describe(&reqwest::Method::OPTIONS, url);
        let res = match self.http.request(reqwest::Method::OPTIONS, url.clone()).header("tus-resumable", super::upload::TUS_VERSION).send().await {
            Ok(r) => r,
            Err(e) if super::tls::tls_failure(&e) == Some(super::tls::TlsFailure::NotTls) => return Err(self.speaks_http(url).await),
            Err(e) => {
                return Err(CliError::unreachable(
                    format!("cannot connect to {origin}"),
                    &e,
                    Some(format!(
                    "Is `ferry serve` running at {origin}? Set --server or FERRY_SERVER. Nothing was sent; a failed first connection is not retried."
                )),
                ))
            }
        };
        let status = res.status().as_u16();
        let h = res.headers();
        if h.contains_key("tus-resumable") {
            return Ok(ServerInfo { max_size: typed_header::<ferry_tus::UploadLength>(h, "tus-max-size").map(|l| l.0) });
        }
        let kind = header_str(h, "content-type").map(|t| format!(", {}", t.split(';').next().unwrap_or(t).trim())).unwrap_or_default();
        let server = header_str(h, "server").map(|s| format!(", Server: {s}")).unwrap_or_default();
        let seen = format!("{what} answered HTTP {status}{kind}{server} without Tus-Resumable");
        if url.scheme() == "http" && status == 400 {
            // A TLS port answers plain HTTP with 400 (ferry's says "use https://"): ask it in TLS.
            if let Some(e) = self.speaks_https(url).await {
                return Err(e);
            }
        }
        if matches!(status, 502..=504) {
            return Err(CliError::new(EXIT_NETWORK, format!("{origin} is not answering as ferry: {seen}"))
                .hint("A proxy answered for ferry: is `ferry serve` behind it running? Re-run once it is."));
        }
        Err(CliError::new(EXIT_USAGE, format!("{origin} is not a ferry server: {seen}"))
            .hint("Set --server or FERRY_SERVER to the base URL of a running `ferry serve` (e.g. http://127.0.0.1:8080)."))
    }

    /// `https://` to `url`'s port met no TLS (rustls saw a record that is not TLS's): ask the
    /// port in plain HTTP. Exit code 2, naming the scheme the port speaks and the command to
    /// run, when anything answers there; else the TLS failure as it is (exit code 5).
    async fn speaks_http(&self, url: &reqwest::Url) -> CliError {
        let plain = other_scheme(url);
        let answered = match http_client(None, Some(Duration::from_secs(10)), None) {
            Ok(c) => c.request(reqwest::Method::OPTIONS, plain.clone()).header("tus-resumable", super::upload::TUS_VERSION).send().await.ok(),
            Err(_) => None,
        };
        let origin = url.origin().ascii_serialization();
        let Some(r) = answered else {
            let host = url.host_str().unwrap_or("the server");
            return CliError::new(EXIT_NETWORK, format!("cannot connect to {origin}: {}", super::tls::TlsFailure::NotTls.words(host)))
                .hint("Is it an https:// server? Check --server.");
        };
        let who = if r.headers().contains_key("tus-resumable") { "ferry answers there" } else { "something answers there" };
        CliError::usage(format!("{origin} speaks plain HTTP, not HTTPS: {who} over http://")).hint(format!(
            "Use http:// for this port: `{}`. (A ferry server speaks https:// only when started with --tls-cert and --tls-key.)",
            command_with_origin(url, &plain)
        ))
    }

    /// Plain HTTP to `url` was answered 400 without `Tus-Resumable`: does the port speak TLS?
    /// A handshake that succeeds, or fails only on the certificate, says so: exit code 2 with
    /// the command to run (and what the certificate needs, when it is not trusted here).
    /// `None` when the port does not speak TLS either.
    async fn speaks_https(&self, url: &reqwest::Url) -> Option<CliError> {
        use super::tls::TlsFailure;
        let tls = other_scheme(url);
        let untrusted =
            match self.http.request(reqwest::Method::OPTIONS, tls.clone()).header("tus-resumable", super::upload::TUS_VERSION).send().await {
                Ok(_) => None,
                Err(e) => match super::tls::tls_failure(&e) {
                    Some(f @ (TlsFailure::Untrusted { .. } | TlsFailure::WrongName { .. } | TlsFailure::OutOfDate { .. })) => Some(f),
                    _ => return None,
                },
            };
        let origin = url.origin().ascii_serialization();
        let host = url.host_str().unwrap_or("the server");
        let then = match &untrusted {
            None => String::new(),
            Some(f) => format!(" Over https://, {}. {}", f.words(host), f.hint()),
        };
        Some(
            CliError::usage(format!("{origin} speaks HTTPS, not plain HTTP: it answered http:// with HTTP 400"))
                .hint(format!("Use https:// for this port: `{}`.{then}", command_with_origin(url, &tls))),
        )
    }

    /// A request with the bearer token, which is sent only to the configured server's origin
    /// (never to another host named by a URL argument).
    pub fn request(&self, method: reqwest::Method, url: &reqwest::Url) -> reqwest::RequestBuilder {
        let mut r = self.http.request(method, url.clone());
        if let Some(t) = &self.token {
            if url.origin() == self.base.origin() {
                r = r.bearer_auth(t);
            }
        }
        r
    }

    /// `{server}{path}`, e.g. `/api/v1/files`.
    pub fn url(&self, path: &str) -> reqwest::Url {
        let mut u = self.base.clone();
        let prefix = u.path().trim_end_matches('/').to_string();
        u.set_path(&format!("{prefix}{path}"));
        u
    }

    /// A `Location` (relative or absolute) resolved against the server.
    pub fn resolve(&self, location: &str) -> Result<reqwest::Url, CliError> {
        self.base.join(location).map_err(|e| CliError::new(EXIT_FAILURE, format!("the server sent a bad URL {location:?}: {e}")))
    }

    /// The upload a creation request made (TUS 1.0 §Creation): `201` and its `Location`,
    /// resolved against the server. Errors: another status, as [`CliError::from_status`] says
    /// it for `what`; a `201` without `Location`.
    pub async fn created(&self, what: &str, res: reqwest::Response) -> Result<reqwest::Url, CliError> {
        let status = res.status().as_u16();
        let loc = res.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_owned);
        if status != 201 {
            let body = res.text().await.unwrap_or_default();
            return Err(CliError::from_status(what, status, &body));
        }
        self.resolve(&loc.ok_or_else(|| CliError::new(EXIT_FAILURE, "the server created an upload but sent no Location"))?)
    }

    /// The TUS/download URL of a ferry link: a file id, a file URL (`…/files/ID`), a signed
    /// link (`…/files/ID?scope=…&sig=…`), a page link (`…/share/ID?…`, what `ferry share`
    /// and MCP hand out as `page_url`) or an API URL (`…/api/v1/files/ID`). Every form means
    /// the same file: a page or API URL becomes the file URL on the same server with the same
    /// query (the signature covers the id, not the path). Another URL is used as it is.
    pub fn file_url(&self, link: &str) -> Result<reqwest::Url, CliError> {
        if link.starts_with("http://") || link.starts_with("https://") {
            let url = reqwest::Url::parse(link).map_err(|e| CliError::usage(format!("{link:?} is not a URL: {e}")))?;
            return Ok(file_url_of(&url).unwrap_or(url));
        }
        Ok(self.url(&format!("/files/{}", id_segment(link)?)))
    }

    /// The client for the server a file link names, and the file's id (see
    /// [`Client::file_id`]): a URL's own server — what precedes its `/files/ID` — so `status`,
    /// `share` and `rm` act on the file the link names, as `download` does; a bare id on this
    /// client's server. The bearer token still goes only to the configured server's origin
    /// ([`Client::request`]).
    pub fn at_link(&self, link: &str) -> Result<(Client, String), CliError> {
        let id = self.file_id(link)?;
        if !(link.starts_with("http://") || link.starts_with("https://")) {
            return Ok((self.clone(), id));
        }
        let url = self.file_url(link)?;
        let mut base = url.clone();
        let prefix = url.path().strip_suffix(&format!("/files/{id}")).unwrap_or("").to_string();
        base.set_path(&format!("{prefix}/"));
        base.set_query(None);
        base.set_fragment(None);
        let token = if base.origin() == self.base.origin() { self.token.clone() } else { None };
        let mut c = Client { base, token, contact: Default::default(), ..self.clone() };
        c.discovery = c.url("/files/");
        Ok((c, id))
    }

    /// The file id a ferry link names (see [`Client::file_url`]); a bare id as it is.
    pub fn file_id(&self, link: &str) -> Result<String, CliError> {
        if !(link.starts_with("http://") || link.starts_with("https://")) {
            id_segment(link)?;
            return Ok(link.to_string());
        }
        let url = self.file_url(link)?;
        let id = id_of(&url);
        id_segment(&id).map_err(|_| CliError::usage(format!("{link:?} is not a ferry file link (…/files/ID, …/share/ID or a file id)")))?;
        Ok(id)
    }

    /// Send, retrying network errors and retryable statuses within `retry`; returns the
    /// first answer that is not retryable (which may be an error status).
    pub async fn send_retrying(
        &self,
        retry: &mut Retry,
        what: &str,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, CliError> {
        self.contact().await?;
        loop {
            match build().send().await {
                Ok(r) if retryable_status(r.status().as_u16()) => retry.wait(CliError::from_response(what, r).await).await?,
                // An answer is not progress: only the caller knows whether bytes moved (and
                // calls `Retry::success`), so a PATCH that keeps failing between successful
                // HEADs still runs out of `--retry-for` (issue 9, item 6).
                Ok(r) => return Ok(r),
                Err(e) => {
                    let err = CliError::unreachable(
                        what.to_string(),
                        &e,
                        Some(format!("Is `ferry serve` running at {}? Set --server or FERRY_SERVER.", self.base)),
                    );
                    retry.wait(err).await?
                }
            }
        }
    }

    /// A JSON API call (`/api/v1{path}` with the `query` pairs) with retries; a non-2xx answer
    /// becomes a [`CliError`] naming the request (`GET /api/v1/files?limit=5`).
    pub async fn api(
        &self,
        retry: &mut Retry,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<String>,
    ) -> Result<String, CliError> {
        self.api_with(retry, method, path, query, &[], body).await.map(|(_, text)| text)
    }

    /// [`Client::api`] with extra request headers; returns the (2xx) status and the body.
    pub async fn api_with(
        &self,
        retry: &mut Retry,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        headers: &[(&str, String)],
        body: Option<String>,
    ) -> Result<(u16, String), CliError> {
        let mut url = self.url(&format!("/api/v1{path}"));
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        let what = describe(&method, &url);
        let res = self
            .send_retrying(retry, &what, || {
                let mut r = self.request(method.clone(), &url);
                for (k, v) in headers {
                    r = r.header(*k, v);
                }
                if let Some(b) = &body {
                    r = r.header("content-type", "application/json").body(b.clone());
                }
                r
            })
            .await?;
        let status = res.status().as_u16();
        let text = res.text().await.map_err(|e| CliError::network(&what, &e))?;
        if !(200..300).contains(&status) {
            return Err(CliError::from_status(&what, status, &text));
        }
        Ok((status, text))
    }

    /// `DELETE` an upload (TUS 1.0 §Termination) with retries.
    pub async fn terminate(&self, retry: &mut Retry, url: &reqwest::Url) -> Result<(), CliError> {
        let what = describe(&reqwest::Method::DELETE, url);
        let res = self
            .send_retrying(retry, &what, || self.request(reqwest::Method::DELETE, url).header("tus-resumable", super::upload::TUS_VERSION))
            .await?;
        let status = res.status().as_u16();
        if !(200..300).contains(&status) {
            let body = res.text().await.unwrap_or_default();
            return Err(CliError::from_status(&what, status, &body));
        }
        Ok(())
    }
}

/// A path segment for an upload id (ids are base32; a typo must never reach another route).
pub fn id_segment(id: &str) -> Result<String, CliError> {
    if id.is_empty() {
        return Err(CliError::usage("the file id is empty"));
    }
    Ok(percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC).to_string())
}

/// The upload id of a `/files/{id}` URL: its last non-empty path segment.
pub fn id_of(url: &reqwest::Url) -> String {
    url.path_segments().and_then(|mut s| s.rfind(|s| !s.is_empty())).unwrap_or_default().to_string()
}

/// Parse a duration flag (`30s`, `1h`, `2m`, or plain milliseconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(Duration::from_millis(ms));
    }
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 30s, 5m, 1h)"))
}

/// Parse a size flag (`1048576`, `8MiB`, `1GB`) in bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    if let Ok(n) = s.parse::<u64>() {
        return Ok(n);
    }
    s.parse::<bytesize::ByteSize>().map(|b| b.as_u64()).map_err(|e| format!("{e} (examples: 1048576, 8MiB, 1GiB)"))
}

/// The `sha-256` member of an RFC 9530 `Repr-Digest` header, as lowercase hex.
pub fn repr_digest_sha256(h: &reqwest::header::HeaderMap) -> Option<String> {
    typed_header::<ferry_tus::ReprDigest>(h, "repr-digest").and_then(|d| d.sha256).map(hex::encode)
}

/// A header as text.
pub fn header_str<'a>(h: &'a reqwest::header::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A header parsed with its ferry-tus type (`UploadOffset`, `UploadLength`, `ContentRange`…):
/// the grammar the server enforces, so `+5` is refused here as it is there. `None` when absent
/// or malformed.
pub fn typed_header<T: std::str::FromStr>(h: &reqwest::header::HeaderMap, name: &str) -> Option<T> {
    header_str(h, name).and_then(|v| v.parse().ok())
}

/// A two-worker tokio runtime, or exit code 1.
pub fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot start the async runtime: {e}")))
}

/// Run an async command body and map it to a process exit code (printing the error).
pub fn run_command<F: std::future::Future<Output = Result<(), CliError>>>(f: impl FnOnce() -> F) -> std::process::ExitCode {
    let result = runtime().and_then(|rt| rt.block_on(f()));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            e.print();
            std::process::ExitCode::from(e.code)
        }
    }
}

/// [`run_command`] for a transfer: Ctrl-C stops it with a line that says what to do next
/// (`resume`) and exit code 130, instead of ending the process without a word. The server
/// keeps what it acknowledged, and the local state (URL store, `.part` sidecar) is written as
/// the transfer goes, so nothing else needs saving here.
pub fn run_interruptible<F: std::future::Future<Output = Result<(), CliError>>>(
    resume: &'static str,
    f: impl FnOnce() -> F,
) -> std::process::ExitCode {
    run_command(|| async move {
        tokio::select! {
            r = f() => r,
            _ = tokio::signal::ctrl_c() => {
                // After a progress bar or a plain progress line, start on a line of its own.
                eprintln!();
                Err(CliError::new(EXIT_INTERRUPTED, "interrupted (Ctrl-C)").hint(resume))
            }
        }
    })
}

/// Print `line` and a newline on stdout. A closed stdout (`EPIPE`, e.g. `ferry ls | head`)
/// becomes [`CliError::quiet`]: the command stops with exit code 0 and prints nothing more.
pub fn print_line(line: &str) -> Result<(), CliError> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let r = out.write_all(line.as_bytes()).and_then(|()| out.write_all(b"\n")).and_then(|()| out.flush());
    r.map_err(|e| stdout_error(&e))
}

/// A failed write to stdout: quiet for `EPIPE`, else exit code 1.
pub fn stdout_error(e: &std::io::Error) -> CliError {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        CliError::quiet()
    } else {
        CliError::new(EXIT_FAILURE, format!("writing to stdout: {e}"))
    }
}

/// `METHOD /path?query` of a request, for messages.
pub fn describe(method: &reqwest::Method, url: &reqwest::Url) -> String {
    match url.query() {
        Some(q) => format!("{method} {}?{q}", url.path()),
        None => format!("{method} {}", url.path()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_seconds_or_a_date_to_come() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let with = |v: &str| {
            let mut h = reqwest::header::HeaderMap::new();
            h.insert(reqwest::header::RETRY_AFTER, v.parse().unwrap());
            retry_after(&h, now)
        };
        assert_eq!(with("30"), Some(Duration::from_secs(30)));
        assert_eq!(with(&httpdate::fmt_http_date(now + Duration::from_secs(90))), Some(Duration::from_secs(90)));
        assert_eq!(with(&httpdate::fmt_http_date(now - Duration::from_secs(5))), None, "a date gone by");
        assert_eq!(with("soon"), None);
        assert_eq!(with("-3"), None);
        assert_eq!(retry_after(&reqwest::header::HeaderMap::new(), now), None);
    }

    #[test]
    fn a_retry_waits_as_long_as_the_server_asks_within_the_budget() {
        let r = Retry::new(Duration::from_secs(120));
        let mut e = CliError::from_status("PATCH /files/x", 507, r#"{"code":"insufficient_storage","retryable":true}"#);
        assert_eq!(r.pause(&e, Duration::ZERO), BACKOFF_START, "no Retry-After: the backoff");
        e.retry_after = Some(Duration::from_secs(30));
        assert_eq!(r.pause(&e, Duration::ZERO), Duration::from_secs(30));
        assert_eq!(r.pause(&e, Duration::from_secs(100)), Duration::from_secs(20), "never past the budget");
        e.retry_after = Some(Duration::from_millis(10));
        assert_eq!(r.pause(&e, Duration::ZERO), BACKOFF_START, "a shorter Retry-After does not hurry the backoff");
    }

    #[test]
    fn a_server_given_as_its_tus_endpoint_is_its_base() {
        for (given, base) in [
            ("http://127.0.0.1:8080/files/", "http://127.0.0.1:8080/"),
            ("http://h/app/files", "http://h/app"),
            ("http://h:1/", "http://h:1/"),
            ("https://h/filesystem", "https://h/filesystem"),
        ] {
            let conn = Connection { server: Some(given.into()), token: None, cacert: None };
            assert_eq!(conn.base().unwrap().as_str(), base, "{given}");
        }
    }

    #[test]
    fn a_refused_signed_link_is_not_told_to_use_a_token() {
        let e = CliError::from_status("HEAD /files/abc?exp=1&sig=AAAA", 403, "");
        assert_eq!(e.code, EXIT_AUTH);
        assert!(e.hint.as_deref().is_some_and(|h| h.contains("signed link") && !h.contains("--token")), "{:?}", e.hint);
        assert!(e.message.contains("a HEAD answer has no body"), "{}", e.message);
        let e = CliError::from_status("GET /api/v1/files", 401, "");
        assert!(e.hint.as_deref().is_some_and(|h| h.contains("--token")), "{:?}", e.hint);
    }

    #[test]
    fn a_link_names_its_own_server_and_the_token_stays_home() {
        let conn = Connection { server: Some("http://127.0.0.1:8080".into()), token: Some("secret".into()), cacert: None };
        let c = Client::with_http(&conn, reqwest::Client::new()).unwrap();
        let (other, id) = c.at_link("http://10.0.0.9:18084/ferry/files/abc123").unwrap();
        assert_eq!((other.base.as_str(), id.as_str()), ("http://10.0.0.9:18084/ferry/", "abc123"));
        assert_eq!(other.url("/api/v1/files/abc123").as_str(), "http://10.0.0.9:18084/ferry/api/v1/files/abc123");
        let sent = other.request(reqwest::Method::GET, &other.url("/api/v1/files/abc123")).build().unwrap();
        assert!(sent.headers().get("authorization").is_none(), "the token goes to the configured server only");
        let (home, id) = c.at_link("http://127.0.0.1:8080/share/xyz").unwrap();
        assert_eq!((home.base.as_str(), id.as_str()), ("http://127.0.0.1:8080/", "xyz"));
        assert!(home.request(reqwest::Method::GET, &home.url("/api/v1/files/xyz")).build().unwrap().headers().get("authorization").is_some());
        let (same, id) = c.at_link("abc").unwrap();
        assert_eq!((same.base.as_str(), id.as_str()), (c.base.as_str(), "abc"));
    }

    #[test]
    fn digest_and_sizes() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("repr-digest", "sha-512=:AA==:, sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:".parse().unwrap());
        assert_eq!(repr_digest_sha256(&h).unwrap(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(parse_size("8MiB").unwrap(), 8 << 20);
        assert_eq!(parse_size("123").unwrap(), 123);
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("250").unwrap(), Duration::from_millis(250));
        assert_eq!(id_of(&reqwest::Url::parse("http://h/files/abc?x=1").unwrap()), "abc");
    }

    /// Issue 9 item 2: TUS headers are read with the server's grammar (ferry-tus), not
    /// `str::parse::<u64>`, which takes `+5`.
    #[test]
    fn tus_headers_use_the_server_grammar() {
        use ferry_tus::{ContentRange, UploadLength, UploadOffset};
        let mut h = reqwest::header::HeaderMap::new();
        for bad in ["+5", " 5", "5 ", "-1", "0x5", "", "18446744073709551616"] {
            h.insert("upload-offset", bad.parse().unwrap());
            h.insert("upload-length", bad.parse().unwrap());
            h.insert("content-range", format!("bytes {bad}-9/10").parse().unwrap());
            assert_eq!(typed_header::<UploadOffset>(&h, "upload-offset"), None, "{bad:?}");
            assert_eq!(typed_header::<UploadLength>(&h, "upload-length"), None, "{bad:?}");
            assert_eq!(typed_header::<ContentRange>(&h, "content-range"), None, "{bad:?}");
        }
        h.insert("upload-offset", "007".parse().unwrap());
        assert_eq!(typed_header::<UploadOffset>(&h, "upload-offset"), Some(UploadOffset(7)));
        h.insert("content-range", "bytes 5-9/10".parse().unwrap());
        assert_eq!(typed_header::<ContentRange>(&h, "content-range"), Some(ContentRange::Bytes { first: 5, last: 9, total: Some(10) }));
        h.insert("repr-digest", "sha-256=:AAAA:".parse().unwrap());
        assert_eq!(repr_digest_sha256(&h), None, "a sha-256 that is not 32 bytes is no digest");
    }

    #[test]
    fn status_exit_codes() {
        assert_eq!(CliError::from_status("x", 404, "").code, EXIT_NOT_FOUND);
        assert_eq!(CliError::from_status("x", 410, "").code, EXIT_NOT_FOUND);
        assert_eq!(CliError::from_status("x", 401, "").code, EXIT_AUTH);
        assert_eq!(CliError::from_status("x", 413, "").code, EXIT_USAGE);
        assert_eq!(CliError::from_status("x", 503, "").code, EXIT_NETWORK);
        assert_eq!(
            CliError::from_status("GET /files/x", 500, r#"{"code":"damaged","retryable":false}"#).code,
            EXIT_VERIFY,
            "as a failed verify (issue 48 kind 6)"
        );
        let page = CliError::from_status("PATCH /files/x", 502, "<html><body><h1>502 Bad Gateway</h1></body></html>");
        assert_eq!(page.code, EXIT_NETWORK);
        assert!(!page.message.contains("<h1>") && page.message.contains("an HTML or XML page"), "{}", page.message);
        let e = CliError::from_status("GET /x", 404, r#"{"detail":"no such upload","code":"not_found","recovery_hint":"Check the id."}"#);
        assert_eq!(e.message, "GET /x: HTTP 404: no such upload (not_found)");
        assert_eq!(e.hint.as_deref(), Some("Check the id."));
    }
}
