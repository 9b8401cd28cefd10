//! One configuration: `ferry.toml` < `FERRY_*` environment < command-line flags.
//!
//! Every key is documented in the README's configuration table; the file uses the flag names
//! with `_` for `-` (e.g. `max_size = "1TiB"`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::catalog::CatalogUrl;

/// How hard ferry works to keep acknowledged bytes across power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// fsync blob bytes before every checkpoint commits, so bytes ferry acknowledged survive
    /// a power loss.
    Full,
    /// Skip fsync. Faster, but after a power loss or kernel crash (not a process crash)
    /// up to the last few seconds of acknowledged bytes can be lost; those uploads are
    /// rolled back to what survived and re-hashed at start-up.
    Relaxed,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Flags of `ferry serve`; each also reads `FERRY_<NAME>` from the environment.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// Configuration file (TOML). Default: ./ferry.toml when it exists.
    #[arg(long, env = "FERRY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on: `IP:PORT` or `HOST:PORT` (e.g. `localhost:8080`; every address
    /// the name resolves to is served) [default: 127.0.0.1:8080]. Port 0 picks a free port;
    /// the chosen address is printed as `listening on http://ADDR`.
    #[arg(long, env = "FERRY_LISTEN")]
    pub listen: Option<String>,
    /// Data directory: the catalog (ferry.db) and blobs/ [default: ./ferry-data].
    #[arg(long, env = "FERRY_DATA")]
    pub data: Option<PathBuf>,
    /// Where metadata lives: `sqlite:PATH`, or `postgres://USER:PASSWORD@HOST:PORT/DATABASE`
    /// for several replicas on one database [default: sqlite:DATA/ferry.db].
    // A String, parsed in `Config::resolve`: clap would echo a rejected value, password and all.
    #[arg(long, env = "FERRY_CATALOG", hide_env_values = true)]
    pub catalog: Option<String>,
    /// Where upload bytes live: a directory, or `s3://bucket/prefix` for S3 or an
    /// S3-compatible store (credentials, region and endpoint from the `AWS_*` variables:
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
    /// `AWS_ALLOW_HTTP`). Replicas sharing one catalog share one blob store [default: DATA/blobs].
    #[arg(long, env = "FERRY_BLOBS")]
    pub blobs: Option<String>,
    /// Largest upload accepted, e.g. 1TiB, 500MB, 1048576 [default: 1TiB].
    #[arg(long, env = "FERRY_MAX_SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// S3 blobs: the smallest part size (`[s3] part_size`), 5MiB to 5GiB; each upload's parts
    /// are this size, or larger so 10 000 parts hold the upload [default: 16MiB].
    #[arg(long, env = "FERRY_S3_PART_SIZE", value_parser = parse_size)]
    pub s3_part_size: Option<u64>,
    /// S3 blobs: most bytes of open parts buffered in memory at once, across all uploads
    /// (`[s3] max_buffer`); writers wait beyond it [default: 512MiB].
    #[arg(long, env = "FERRY_S3_MAX_BUFFER", value_parser = parse_size)]
    pub s3_max_buffer: Option<u64>,
    /// Unfinished uploads expire after this long without progress, e.g. 7d, 12h, 30s;
    /// `never` disables expiry [default: 7d].
    #[arg(long, env = "FERRY_EXPIRE_AFTER", value_parser = parse_expiry)]
    pub expire_after: Option<Expiry>,
    /// `full` fsyncs before every checkpoint; `relaxed` skips fsync and risks losing the last
    /// acknowledged bytes on power loss or OS crash (uploads then resume from what survived)
    /// [default: full].
    #[arg(long, env = "FERRY_DURABILITY", value_enum)]
    pub durability: Option<Durability>,
    /// Trust Forwarded / X-Forwarded-Host / X-Forwarded-Proto to build absolute upload URLs.
    #[arg(long, env = "FERRY_BEHIND_PROXY")]
    pub behind_proxy: bool,
    /// Turn off the pages for people (`/share/{id}` request-a-file and download pages and
    /// their `/assets/`); share links then carry no `page_url`. For API-only deployments.
    #[arg(long, env = "FERRY_NO_WEB")]
    pub no_web: bool,
    /// Checkpoint inside a long PATCH every this many bytes [default: 64MiB].
    #[arg(long, env = "FERRY_CHECKPOINT_EVERY", value_parser = parse_size)]
    pub checkpoint_every: Option<u64>,
    /// End a PATCH whose body stalls this long, keeping what arrived [default: 60s].
    #[arg(long, env = "FERRY_IDLE_TIMEOUT", value_parser = parse_interval)]
    pub idle_timeout: Option<Duration>,
    /// How often expired uploads are swept [default: 60s].
    #[arg(long, env = "FERRY_SWEEP_INTERVAL", value_parser = parse_interval)]
    pub sweep_interval: Option<Duration>,
    /// Log format [default: text]. Logs go to stderr; RUST_LOG sets the filter.
    #[arg(long, env = "FERRY_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Task workers run at once [default: 4].
    #[arg(long, env = "FERRY_TASK_WORKERS")]
    pub task_workers: Option<usize>,
    /// Task lease: a task whose worker died is resumed elsewhere after this long [default: 10s].
    #[arg(long, env = "FERRY_TASK_LEASE", value_parser = parse_interval)]
    pub task_lease: Option<Duration>,
    /// Serve a non-loopback --listen address without bearer tokens (anyone who can connect
    /// can read and write everything).
    #[arg(long, env = "FERRY_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
    /// Also speak MCP over stdin/stdout (for clients that launch ferry as a subprocess).
    /// HTTP keeps serving the bytes; logs go to stderr and the `listening on` line too.
    #[arg(long, env = "FERRY_STDIO")]
    pub stdio: bool,
    /// Absolute base URL clients reach this server at, used in signed URLs and MCP results,
    /// e.g. https://files.example.com [default: http://LISTEN-ADDRESS].
    #[arg(long, env = "FERRY_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Largest decoded chunk `file_upload_chunk` (MCP, base64 in-band) accepts [default: 1MiB].
    #[arg(long, env = "FERRY_MCP_MAX_CHUNK", value_parser = parse_size)]
    pub mcp_max_chunk: Option<u64>,
    /// Free space kept on the blob directory's filesystem (`--blobs`): new uploads, creations whose
    /// Upload-Length does not fit, PATCHes and task files are refused with 507 before the disk
    /// fills. Bytes (`2GiB`), a percentage of the filesystem (`10%`), or `0` for none
    /// [default: 5% of the filesystem, at most 1GiB].
    #[arg(long, env = "FERRY_MIN_FREE_SPACE", value_parser = crate::exhaustion::Reserve::parse)]
    pub min_free_space: Option<crate::exhaustion::Reserve>,
    /// Most client connections served at once; more wait in the kernel's accept queue
    /// [default: 10000, and at most the open-file limit less 256].
    #[arg(long, env = "FERRY_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: Option<u32>,
    /// Web origins that may use TUS on /files/ from a browser: exact origins such as
    /// https://app.example.com, or `*` for any; comma-separated or repeated. Replaces
    /// `[cors] allow_origins` [default: *].
    #[arg(long, env = "FERRY_CORS_ALLOW_ORIGINS", value_delimiter = ',')]
    pub cors_allow_origins: Vec<String>,
    /// Request headers a browser may send to /files/ besides the built-in TUS list
    /// (e.g. a custom header your uploader adds); comma-separated or repeated. Replaces
    /// `[cors] allow_headers`.
    #[arg(long, env = "FERRY_CORS_ALLOW_HEADERS", value_delimiter = ',')]
    pub cors_allow_headers: Vec<String>,
    /// Response headers a browser script may read besides the built-in TUS list;
    /// comma-separated or repeated. Replaces `[cors] expose_headers`.
    #[arg(long, env = "FERRY_CORS_EXPOSE_HEADERS", value_delimiter = ',')]
    pub cors_expose_headers: Vec<String>,
    /// Upload leases: `local` (in-process; one server per catalog) or `catalog` (leases in the
    /// catalog with owner, expiry on the database clock and a fencing token, so several
    /// processes can share one catalog) [default: catalog with a postgres:// catalog, else local].
    #[arg(long, env = "FERRY_LEASES", value_enum)]
    pub leases: Option<LeaseMode>,
    /// Upload lease length with `--leases catalog`: a holder that dies is taken over after this
    /// long [default: 10s].
    #[arg(long, env = "FERRY_UPLOAD_LEASE", value_parser = parse_interval)]
    pub upload_lease: Option<Duration>,
    /// This replica's name in `/metrics` (`ferry_replica_info{replica=…}`) and logs
    /// [default: its lease owner id, kept in DATA/owner-id].
    #[arg(long, env = "FERRY_REPLICA_NAME")]
    pub replica_name: Option<String>,
    /// Serve HTTPS with this PEM certificate chain (server certificate first); needs
    /// --tls-key. Re-read on SIGHUP: new connections get the new certificate, open ones keep theirs.
    #[arg(long, env = "FERRY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1). Re-read on SIGHUP.
    #[arg(long, env = "FERRY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// Where upload bytes live (`--blobs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobLocation {
    /// Files under this directory.
    Dir(PathBuf),
    /// `s3://bucket/prefix`.
    S3(String),
}

impl BlobLocation {
    fn parse(v: &str) -> BlobLocation {
        if v.starts_with("s3://") {
            BlobLocation::S3(v.to_string())
        } else {
            BlobLocation::Dir(PathBuf::from(v))
        }
    }
}

/// Where upload leases live (`--leases`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseMode {
    /// In this process only: one server per catalog.
    Local,
    /// In the catalog: several processes may share it.
    Catalog,
}

/// `--expire-after`: a duration, or never.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry(pub Option<Duration>);

/// Largest size any setting accepts: lengths are stored as signed 64-bit integers.
const MAX_SIZE: u64 = i64::MAX as u64;

/// A byte size: plain digits or a number with a unit (`64MiB`, `1TiB`, `500MB`); 1 to 2^63-1.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let n = if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) { s.parse::<u64>().ok() } else { s.parse::<bytesize::ByteSize>().ok().map(|b| b.as_u64()) };
    match n {
        Some(n) if (1..=MAX_SIZE).contains(&n) => Ok(n),
        Some(_) => Err(format!("size {s:?} must be between 1 byte and 8EiB")),
        None => Err(format!("invalid size {s:?}: expected bytes like 1048576, 64MiB or 1TiB")),
    }
}

/// A duration of at least `min` (e.g. `30s`, `12h`, `7d`).
fn parse_duration_min(s: &str, min: Duration) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| format!("invalid duration {s:?}: {e} (e.g. 30s, 12h, 7d)"))?;
    if d < min {
        return Err(format!("duration {s:?} must be at least {}", humantime::format_duration(min)));
    }
    Ok(d)
}

fn parse_expiry(s: &str) -> Result<Expiry, String> {
    match s.trim() {
        "never" => Ok(Expiry(None)),
        // Past 100 years an expiry is `never` in all but name, and dates stay printable.
        other => parse_duration_min(other, Duration::from_secs(1)).map(|d| Expiry(Some(d.min(Duration::from_secs(100 * 365 * 86_400))))),
    }
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    parse_duration_min(s, Duration::from_millis(100))
}

/// The same keys as [`ServeArgs`], read from `ferry.toml`. Sizes and durations are strings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    data: Option<PathBuf>,
    catalog: Option<String>,
    blobs: Option<String>,
    max_size: Option<toml::Value>,
    expire_after: Option<String>,
    durability: Option<Durability>,
    behind_proxy: Option<bool>,
    no_web: Option<bool>,
    checkpoint_every: Option<toml::Value>,
    idle_timeout: Option<String>,
    sweep_interval: Option<String>,
    log_format: Option<LogFormat>,
    public_url: Option<String>,
    /// Secret for signed URLs: 64 hex digits (default: generated into DATA/url-secret).
    url_secret: Option<String>,
    mcp_max_chunk: Option<toml::Value>,
    leases: Option<LeaseMode>,
    upload_lease: Option<String>,
    replica_name: Option<String>,
    min_free_space: Option<toml::Value>,
    max_connections: Option<u32>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    #[serde(default)]
    tokens: Vec<TokenEntry>,
    #[serde(default)]
    commands: BTreeMap<String, CommandSpec>,
    #[serde(default)]
    fetch: FetchConfig,
    #[serde(default)]
    tasks: TasksFileConfig,
    #[serde(default)]
    cors: CorsFileConfig,
    #[serde(default)]
    webhooks: Vec<WebhookFileConfig>,
    #[serde(default)]
    events: EventsFileConfig,
    #[serde(default)]
    hooks: HooksFileConfig,
    #[serde(default)]
    limits: LimitsFileConfig,
    #[serde(default)]
    s3: S3FileConfig,
}

/// `[s3] part_size` / `--s3-part-size`, checked against S3's limits: 5 MiB..=5 GiB.
fn s3_part_size(v: u64) -> anyhow::Result<u64> {
    use crate::blob::s3::{MAX_PART, MIN_PART};
    anyhow::ensure!((MIN_PART..=MAX_PART).contains(&v), "[s3] part_size: {v} bytes is outside what S3 accepts for a part (5MiB to 5GiB)");
    Ok(v)
}

/// `[s3]` in ferry.toml: the S3 blob store's part model and memory bound.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct S3FileConfig {
    part_size: Option<toml::Value>,
    max_buffer: Option<toml::Value>,
}

/// `[limits]` in ferry.toml: defaults for every principal, and `[limits.principals.NAME]`
/// tables that override some of them for one principal.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFileConfig {
    max_bytes: Option<toml::Value>,
    max_uploads_in_progress: Option<toml::Value>,
    retain_finished: Option<String>,
    #[serde(default)]
    principals: BTreeMap<String, LimitsEntry>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsEntry {
    max_bytes: Option<toml::Value>,
    max_uploads_in_progress: Option<toml::Value>,
    retain_finished: Option<String>,
}

/// `max_bytes`: a size (`0` allowed: nothing may be stored) or `"unlimited"`.
fn limit_bytes(v: toml::Value, key: &str) -> anyhow::Result<Option<u64>> {
    match v {
        toml::Value::String(s) if s.trim() == "unlimited" => Ok(None),
        toml::Value::Integer(0) => Ok(Some(0)),
        other => size_value(other, key).map(Some),
    }
}

/// `max_uploads_in_progress`: a count (`0` allowed) or `"unlimited"`.
fn limit_count(v: toml::Value, key: &str) -> anyhow::Result<Option<u64>> {
    match v {
        toml::Value::String(s) if s.trim() == "unlimited" => Ok(None),
        toml::Value::Integer(i) if i >= 0 => Ok(Some(i as u64)),
        other => anyhow::bail!("{key}: expected a number of uploads or \"unlimited\", got {other}"),
    }
}

/// `retain_finished`: a duration (at least 1 s) or `"never"`.
fn limit_retention(v: &str, key: &str) -> anyhow::Result<Option<Duration>> {
    parse_expiry(v).map(|e| e.0).map_err(|e| anyhow::anyhow!("{key}: {e}"))
}

impl LimitsFileConfig {
    /// Resolve: the default table, then each principal's over it.
    fn resolve(self) -> anyhow::Result<crate::upload::PrincipalLimits> {
        fn apply(base: crate::upload::Limits, e: LimitsEntry, at: &str) -> anyhow::Result<crate::upload::Limits> {
            let mut l = base;
            if let Some(v) = e.max_bytes {
                l.max_bytes = limit_bytes(v, &format!("{at} max_bytes"))?;
            }
            if let Some(v) = e.max_uploads_in_progress {
                l.max_uploads_in_progress = limit_count(v, &format!("{at} max_uploads_in_progress"))?;
            }
            if let Some(v) = e.retain_finished {
                l.retain_finished = limit_retention(&v, &format!("{at} retain_finished"))?;
            }
            Ok(l)
        }
        let top = LimitsEntry { max_bytes: self.max_bytes, max_uploads_in_progress: self.max_uploads_in_progress, retain_finished: self.retain_finished };
        let default = apply(crate::upload::Limits::default(), top, "[limits]")?;
        let mut principals = BTreeMap::new();
        for (name, e) in self.principals {
            if !is_valid_name(&name) {
                anyhow::bail!("[limits.principals.{name:?}]: a principal name is 1-64 characters of A-Z a-z 0-9 _ . -");
            }
            let l = apply(default, e, &format!("[limits.principals.{name}]"))?;
            principals.insert(name, l);
        }
        Ok(crate::upload::PrincipalLimits { default, principals })
    }
}

/// `--listen`: `IP:PORT`, `[IPv6]:PORT` or `HOST:PORT`. A host name is resolved (as
/// `getaddrinfo` does: `/etc/hosts`, then DNS) to every address it names, IPv4 first.
pub fn parse_listen(s: &str) -> Result<Vec<SocketAddr>, String> {
    let s = s.trim();
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    let (host, port) = s.rsplit_once(':').ok_or_else(|| format!("listen address {s:?} needs a port: HOST:PORT, e.g. localhost:8080 or 127.0.0.1:8080"))?;
    let port: u16 = port.parse().map_err(|_| format!("listen address {s:?}: {port:?} is not a port (0-65535)"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("listen address {s:?} needs a host: HOST:PORT, e.g. localhost:8080 or 0.0.0.0:8080"));
    }
    use std::net::ToSocketAddrs;
    let mut addrs: Vec<SocketAddr> = (host, port).to_socket_addrs().map_err(|e| format!("listen address {s:?}: cannot resolve {host:?}: {e}"))?.collect();
    addrs.sort_by_key(|a| a.is_ipv6());
    addrs.dedup();
    if addrs.is_empty() {
        return Err(format!("listen address {s:?}: {host:?} resolves to no address"));
    }
    Ok(addrs)
}

/// `[hooks]` in ferry.toml: `[hooks.pre_create]` and `[hooks.pre_finish]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HooksFileConfig {
    pre_create: Option<HookFileConfig>,
    pre_finish: Option<HookFileConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct HookFileConfig {
    url: String,
    timeout: Option<String>,
    on_failure: Option<HookFailure>,
}

/// What a synchronous hook that fails (times out, cannot be reached, answers 5xx or not JSON)
/// means for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HookFailure {
    /// Refuse the request with 503 `unavailable` (retryable). The default.
    Reject,
    /// Go on as if the hook had allowed it.
    Allow,
}

/// A synchronous upload hook (`[hooks.pre_create]`, `[hooks.pre_finish]`; see `events::hooks`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookConfig {
    pub url: url::Url,
    /// The longest a request waits for the hook (default 5 s).
    pub timeout: Duration,
    pub on_failure: HookFailure,
}

impl HookFileConfig {
    fn resolve(self, which: &str) -> anyhow::Result<HookConfig> {
        let url = url::Url::parse(&self.url).map_err(|e| anyhow::anyhow!("[hooks.{which}] url {:?}: {e}", self.url))?;
        if !matches!(url.scheme(), "http" | "https") {
            anyhow::bail!("[hooks.{which}] url {:?} must be http:// or https://", self.url);
        }
        let timeout = self.timeout.map(|t| parse_interval(&t).map_err(|e| anyhow::anyhow!("[hooks.{which}] timeout: {e}"))).transpose()?.unwrap_or(Duration::from_secs(5));
        Ok(HookConfig { url, timeout, on_failure: self.on_failure.unwrap_or(HookFailure::Reject) })
    }
}

/// `[[webhooks]]` in ferry.toml (see [`WebhookConfig`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookFileConfig {
    name: Option<String>,
    url: String,
    #[serde(default)]
    events: Vec<String>,
    #[serde(default)]
    principals: Vec<String>,
    secret: String,
    retry_for: Option<String>,
    timeout: Option<String>,
}

/// `[events]` in ferry.toml.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsFileConfig {
    retention: Option<String>,
}

/// Event types ferry writes (DESIGN §8).
pub const EVENT_TYPES: [&str; 6] = ["upload.created", "upload.finished", "upload.terminated", "upload.expired", "task.status_changed", "task.partial"];

/// One `[[webhooks]]` receiver: every event of `events` (types, or prefixes like `upload.*`;
/// empty = all) of `principals` (empty = all) is POSTed to `url` in the Standard Webhooks
/// shape, signed with `secret`, and retried with exponential backoff for `retry_for` until a 2xx.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Names the delivery cursor and the deliveries (default: the URL). Renaming it starts
    /// the webhook afresh.
    pub name: String,
    pub url: url::Url,
    pub events: Vec<String>,
    pub principals: Vec<String>,
    /// `whsec_` + base64 of the key, as Standard Webhooks libraries take it.
    pub secret: String,
    /// How long a delivery is retried before it is given up (default 24 h).
    pub retry_for: Duration,
    /// How long one attempt may take, connect to last byte (default 10 s).
    pub timeout: Duration,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("name", &self.name)
            .field("url", &self.url.as_str())
            .field("events", &self.events)
            .field("principals", &self.principals)
            .finish_non_exhaustive()
    }
}

impl WebhookFileConfig {
    fn resolve(self) -> anyhow::Result<WebhookConfig> {
        let url = url::Url::parse(&self.url).map_err(|e| anyhow::anyhow!("[[webhooks]] url {:?}: {e}", self.url))?;
        if !matches!(url.scheme(), "http" | "https") {
            anyhow::bail!("[[webhooks]] url {:?} must be http:// or https://", self.url);
        }
        let name = self.name.unwrap_or_else(|| url.as_str().to_string());
        if name.is_empty() || name.len() > 512 {
            anyhow::bail!("[[webhooks]] name must be 1-512 characters");
        }
        check_webhook_secret(&self.secret).map_err(|why| anyhow::anyhow!("[[webhooks]] {name}: secret {why}"))?;
        for t in &self.events {
            let known = match t.strip_suffix('*') {
                Some(prefix) => EVENT_TYPES.iter().any(|k| k.starts_with(prefix)),
                None => EVENT_TYPES.contains(&t.as_str()),
            };
            if !known {
                anyhow::bail!("[[webhooks]] {name}: unknown event type {t:?} (known: {}, or a prefix such as upload.*)", EVENT_TYPES.join(", "));
            }
        }
        let dur = |v: Option<String>, key: &str, default: Duration| -> anyhow::Result<Duration> {
            v.map(|s| parse_interval(&s).map_err(|e| anyhow::anyhow!("[[webhooks]] {name}: {key}: {e}"))).transpose().map(|d| d.unwrap_or(default))
        };
        Ok(WebhookConfig {
            retry_for: dur(self.retry_for, "retry_for", Duration::from_secs(24 * 3600))?,
            timeout: dur(self.timeout, "timeout", Duration::from_secs(10))?,
            name: name.clone(),
            url,
            events: self.events,
            principals: self.principals,
            secret: self.secret,
        })
    }
}

/// `[cors]` in ferry.toml (see [`CorsConfig`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CorsFileConfig {
    allow_origins: Option<Vec<String>>,
    #[serde(default)]
    allow_headers: Vec<String>,
    #[serde(default)]
    expose_headers: Vec<String>,
}

/// Cross-origin access to the TUS endpoints (`/files/`) from web pages (`[cors]` in ferry.toml,
/// `--cors-*` flags, `FERRY_CORS_*`). The API and `/mcp` are never open to other origins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CorsConfig {
    /// `None`: any origin (`*`). Otherwise the exact origins (`scheme://host[:port]`, lowercase,
    /// default ports removed) allowed; a request from another origin is refused with 403. A page
    /// served from ferry's own host is always allowed.
    pub allow_origins: Option<Vec<String>>,
    /// Lowercase request header names allowed in addition to the built-in TUS list.
    pub allow_headers: Vec<String>,
    /// Lowercase response header names exposed in addition to the built-in TUS list.
    pub expose_headers: Vec<String>,
}

impl CorsConfig {
    /// Validate and normalise. Errors name the offending value.
    fn new(origins: Option<Vec<String>>, allow_headers: Vec<String>, expose_headers: Vec<String>) -> anyhow::Result<CorsConfig> {
        let allow_origins = match origins {
            None => None,
            Some(list) if list.iter().any(|o| o.trim() == "*") => {
                if list.len() > 1 {
                    anyhow::bail!("cors allow_origins: `*` allows every origin; list exact origins or only `*`, not both");
                }
                None
            }
            Some(list) if list.is_empty() => anyhow::bail!("cors allow_origins: list at least one origin, or `*` for any"),
            Some(list) => Some(list.iter().map(|o| normalize_origin(o)).collect::<anyhow::Result<Vec<_>>>()?),
        };
        let names = |list: Vec<String>, key: &str| -> anyhow::Result<Vec<String>> {
            list.iter()
                .map(|h| {
                    let h = h.trim().to_ascii_lowercase();
                    http::HeaderName::from_bytes(h.as_bytes()).map(|_| h.clone()).map_err(|_| anyhow::anyhow!("cors {key}: {h:?} is not a header name"))
                })
                .collect()
        };
        Ok(CorsConfig { allow_origins, allow_headers: names(allow_headers, "allow_headers")?, expose_headers: names(expose_headers, "expose_headers")? })
    }
}

/// An origin as browsers send it (RFC 6454 §6.1): `scheme://host[:port]`, lowercase, without
/// the scheme's default port and without a path; or `null`.
fn normalize_origin(o: &str) -> anyhow::Result<String> {
    let o = o.trim();
    if o == "null" {
        return Ok(o.to_string());
    }
    let bad = || anyhow::anyhow!("cors allow_origins: {o:?} is not an origin like https://app.example.com (scheme://host[:port], no path)");
    let (scheme, authority) = o.split_once("://").ok_or_else(bad)?;
    let uri: http::Uri = o.parse().map_err(|_| bad())?;
    if scheme.is_empty() || authority.is_empty() || authority.contains(['/', '?', '#', '@']) || uri.host().is_none() {
        return Err(bad());
    }
    let scheme = scheme.to_ascii_lowercase();
    let mut authority = authority.to_ascii_lowercase();
    for (s, port) in [("http", ":80"), ("https", ":443")] {
        if scheme == s && authority.ends_with(port) {
            authority.truncate(authority.len() - port.len());
        }
    }
    Ok(format!("{scheme}://{authority}"))
}

/// `[[tokens]]` in ferry.toml: a bearer token's sha256 (hex) and the principal it names.
/// Written by `ferry token create NAME [--scope upload] [--ttl 1h]`; the token itself is never
/// stored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    pub principal: String,
    pub sha256: String,
    /// What the token may do (default `full`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<TokenScope>,
    /// RFC 3339 time after which the token is refused (401), e.g. `2026-11-30T21:00:00Z`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
}

impl TokenEntry {
    /// `expires` as unix ms. Errors: not an RFC 3339 time.
    pub fn expires_ms(&self) -> anyhow::Result<Option<i64>> {
        self.expires
            .as_deref()
            .map(|e| {
                let t = humantime::parse_rfc3339_weak(e.trim())
                    .map_err(|err| anyhow::anyhow!("[[tokens]] expires {e:?} for {:?}: {err} (write e.g. 2026-11-30T21:00:00Z)", self.principal))?;
                let ms = t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
                Ok(ms)
            })
            .transpose()
    }
}

/// sha256 of a bearer token, lowercase hex: what ferry.toml stores.
pub fn token_hash(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// Generate a new bearer token: 32 random bytes, base32, prefixed `fy_`.
pub fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("fy_{}", data_encoding::BASE32_NOPAD.encode(&bytes).to_ascii_lowercase())
}

/// What a bearer token may do (`scope` of a `[[tokens]]` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TokenScope {
    /// Everything its principal may do.
    #[default]
    Full,
    /// Only create uploads (`POST /files/`); each creation answers a signed upload URL in
    /// `Location`, good for that one upload's HEAD and PATCH. Cannot list, read, download or
    /// delete anything, nor use the API or MCP: what a web page may hold.
    Upload,
}

impl TokenScope {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenScope::Full => "full",
            TokenScope::Upload => "upload",
        }
    }
}

/// `[commands.NAME]` in ferry.toml: a program the `command` task kind may run. Requests name
/// the command; they never supply a command line.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CommandSpec {
    /// Program path.
    pub program: PathBuf,
    /// Fixed arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Name of the produced file (default: `NAME.out`).
    #[serde(default)]
    pub output_name: Option<String>,
    /// Media type of the produced file (default: application/octet-stream).
    #[serde(default)]
    pub media_type: Option<String>,
    /// Working directory (default: the server's).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// What the command does, for tool descriptions.
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON Schema (draft 2020-12 unless `$schema` says otherwise) of the task's `params`:
    /// the MCP tool `export_NAME` shows it as the `params` of its inputSchema, and every start
    /// (MCP or REST) whose params do not match it is refused with 400 `invalid_argument`.
    /// Must describe an object (`type = "object"`); checked at start-up. Absent params are
    /// validated as `{}`.
    #[serde(default)]
    pub params_schema: Option<serde_json::Value>,
}

/// The validator of a `params_schema`, or why it is not a usable schema for params.
pub fn params_validator(schema: &serde_json::Value) -> Result<jsonschema::Validator, String> {
    if schema.get("type").and_then(serde_json::Value::as_str) != Some("object") {
        return Err("it must describe a JSON object (type = \"object\"), as params are one".into());
    }
    jsonschema::validator_for(schema).map_err(|e| format!("it is not a valid JSON Schema: {e} (at {})", e.instance_path()))
}

/// `[fetch]` in ferry.toml: hosts the `fetch` task kind may download from (none by default),
/// and extra certificate authorities it trusts for `https://`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FetchConfig {
    /// Host names or `host:port`, matched exactly (case-insensitive).
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// PEM file of certificate authorities trusted for `https://` besides the system's (a
    /// company CA, a test CA). Checked at start-up.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// `[tasks]` in ferry.toml.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TasksFileConfig {
    workers: Option<usize>,
    lease: Option<String>,
    default_ttl: Option<String>,
}

/// The resolved configuration of `ferry serve`.
#[derive(Debug, Clone)]
pub struct Config {
    /// The address to listen on (the first `--listen` resolves to; IPv4 first).
    pub listen: SocketAddr,
    /// Further addresses a `--listen` host name resolves to (e.g. `::1` for `localhost`),
    /// served on the same port as `listen`.
    pub listen_more: Vec<SocketAddr>,
    /// The host name `--listen` gave, when it was not an IP address.
    pub listen_name: Option<String>,
    pub data: PathBuf,
    /// The catalog (default: SQLite in `DATA/ferry.db`).
    pub catalog: CatalogUrl,
    /// Where upload bytes live (default: the directory `DATA/blobs`).
    pub blobs: BlobLocation,
    /// `[s3] part_size` and `max_buffer` (bytes).
    pub s3: crate::blob::s3::S3Settings,
    pub max_size: u64,
    pub expire_after: Option<Duration>,
    pub durability: Durability,
    pub behind_proxy: bool,
    /// Serve no web pages (`--no-web`).
    pub no_web: bool,
    pub checkpoint_every: u64,
    pub idle_timeout: Duration,
    pub sweep_interval: Duration,
    pub log_format: LogFormat,
    /// Bearer tokens; empty = everything belongs to the principal `local`.
    pub tokens: Vec<TokenEntry>,
    pub commands: BTreeMap<String, CommandSpec>,
    pub fetch: FetchConfig,
    /// Task workers in this process.
    pub task_workers: usize,
    /// Task lease length.
    pub task_lease: Duration,
    /// Default time terminal tasks are kept.
    pub task_ttl: Duration,
    /// Serve without tokens on a non-loopback address.
    pub insecure_no_auth: bool,
    /// The configuration file in use (where `ferry token create` writes).
    pub config_path: Option<PathBuf>,
    /// Speak MCP over stdin/stdout too.
    pub stdio: bool,
    /// Absolute base URL without a trailing `/` (None: derived from the bound address).
    pub public_url: Option<String>,
    /// Secret for signed URLs, hex (None: DATA/url-secret).
    pub url_secret: Option<String>,
    /// Largest decoded `file_upload_chunk` chunk, bytes.
    pub mcp_max_chunk: u64,
    /// Browser access to /files/ from other origins.
    pub cors: CorsConfig,
    /// Where upload leases live.
    pub leases: LeaseMode,
    /// Upload lease length (catalog leases).
    pub upload_lease: Duration,
    /// Replica name for metrics (None: the owner id).
    pub replica_name: Option<String>,
    /// Free space kept on the blob directory's filesystem (DESIGN §9).
    pub min_free_space: crate::exhaustion::Reserve,
    /// Most connections served at once (`None`: derived from the open-file limit).
    pub max_connections: Option<u32>,
    /// `[[webhooks]]`: receivers of events.
    pub webhooks: Vec<WebhookConfig>,
    /// `[events] retention`: how long events are kept for SSE resumption (default 24 h).
    pub event_retention: Duration,
    /// `[hooks.pre_create]`: asked before every upload is created.
    pub pre_create_hook: Option<HookConfig>,
    /// `[hooks.pre_finish]`: asked before an upload is called finished.
    pub pre_finish_hook: Option<HookConfig>,
    /// Serve HTTPS: (certificate chain, private key), PEM files re-read on SIGHUP.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The flags and environment this configuration was resolved from: a SIGHUP resolves them
    /// again over the re-read file (tokens, certificate).
    pub args: ServeArgs,
    /// `[limits]`: per-principal quotas and retention of finished files.
    pub limits: crate::upload::PrincipalLimits,
}

fn size_value(v: toml::Value, key: &str) -> anyhow::Result<u64> {
    match v {
        toml::Value::Integer(i) if i >= 1 => Ok(i as u64),
        toml::Value::String(s) => parse_size(&s).map_err(|e| anyhow::anyhow!("{key}: {e}")),
        other => anyhow::bail!("{key}: expected a size, got {other}"),
    }
}

impl Config {
    /// Resolve flags/env over the file over defaults.
    pub fn resolve(args: &ServeArgs) -> anyhow::Result<Config> {
        let config_path = match &args.config {
            Some(p) => Some(p.clone()),
            None if Path::new("ferry.toml").exists() => Some(PathBuf::from("ferry.toml")),
            None => None,
        };
        let file = config_path.as_deref().map(read_file).transpose()?.unwrap_or_default();
        let tasks = file.tasks;
        let flag_list = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        let cors = CorsConfig::new(
            flag_list(&args.cors_allow_origins).or(file.cors.allow_origins),
            flag_list(&args.cors_allow_headers).unwrap_or(file.cors.allow_headers),
            flag_list(&args.cors_expose_headers).unwrap_or(file.cors.expose_headers),
        )?;
        let dur = |v: Option<String>, key: &str| -> anyhow::Result<Option<Duration>> { v.map(|s| parse_interval(&s).map_err(|e| anyhow::anyhow!("{key}: {e}"))).transpose() };
        let expire_file = file.expire_after.map(|s| parse_expiry(&s).map_err(|e| anyhow::anyhow!("expire_after: {e}"))).transpose()?;
        let data = args.data.clone().or(file.data).unwrap_or_else(|| PathBuf::from("ferry-data"));
        let catalog = match args.catalog.as_deref().or(file.catalog.as_deref()) {
            Some(c) => CatalogUrl::parse(c).map_err(|e| anyhow::anyhow!("catalog: {e}"))?,
            None => CatalogUrl::Sqlite(data.join("ferry.db")),
        };
        // A shared catalog means several processes: leases must live in it too.
        let leases = args.leases.or(file.leases).unwrap_or(if matches!(catalog, CatalogUrl::Postgres(_)) { LeaseMode::Catalog } else { LeaseMode::Local });
        let listen_text = args.listen.clone().or(file.listen).unwrap_or_else(|| "127.0.0.1:8080".to_string());
        let mut listen_addrs = parse_listen(&listen_text).map_err(|e| anyhow::anyhow!("listen: {e}"))?;
        let listen = listen_addrs.remove(0);
        let listen_name = listen_text.trim().parse::<SocketAddr>().is_err().then(|| listen_text.trim().rsplit_once(':').map_or("", |(h, _)| h).to_string());
        Ok(Config {
            listen,
            listen_more: listen_addrs,
            listen_name,
            limits: file.limits.resolve()?,
            blobs: match args.blobs.as_deref().or(file.blobs.as_deref()) {
                Some(v) => BlobLocation::parse(v),
                None => BlobLocation::Dir(data.join("blobs")),
            },
            catalog,
            data,
            s3: crate::blob::s3::S3Settings {
                part_size: s3_part_size(match args.s3_part_size {
                    Some(v) => v,
                    None => file.s3.part_size.clone().map(|v| size_value(v, "[s3] part_size")).transpose()?.unwrap_or(crate::blob::s3::DEFAULT_PART_FLOOR),
                })?,
                max_buffer: match args.s3_max_buffer {
                    Some(v) => v,
                    None => file.s3.max_buffer.clone().map(|v| size_value(v, "[s3] max_buffer")).transpose()?.unwrap_or(crate::blob::s3::DEFAULT_MAX_BUFFER),
                },
            },
            max_size: match args.max_size {
                Some(v) => v,
                None => file.max_size.map(|v| size_value(v, "max_size")).transpose()?.unwrap_or(1 << 40),
            },
            expire_after: args.expire_after.or(expire_file).unwrap_or(Expiry(Some(Duration::from_secs(7 * 24 * 3600)))).0,
            durability: args.durability.or(file.durability).unwrap_or(Durability::Full),
            behind_proxy: args.behind_proxy || file.behind_proxy.unwrap_or(false),
            no_web: args.no_web || file.no_web.unwrap_or(false),
            checkpoint_every: match args.checkpoint_every {
                Some(v) => v,
                None => file.checkpoint_every.map(|v| size_value(v, "checkpoint_every")).transpose()?.unwrap_or(64 << 20),
            }
            .max(64 << 10),
            idle_timeout: args.idle_timeout.or(dur(file.idle_timeout, "idle_timeout")?).unwrap_or(Duration::from_secs(60)),
            sweep_interval: args.sweep_interval.or(dur(file.sweep_interval, "sweep_interval")?).unwrap_or(Duration::from_secs(60)),
            log_format: args.log_format.or(file.log_format).unwrap_or(LogFormat::Text),
            tokens: file.tokens,
            commands: file.commands,
            fetch: {
                if let Some(path) = &file.fetch.ca_file {
                    crate::tasks::kinds::fetch::load_roots(path).map_err(|e| anyhow::anyhow!("[fetch] ca_file: {e}"))?;
                }
                file.fetch
            },
            task_workers: args.task_workers.or(tasks.workers).unwrap_or(4).clamp(1, MAX_TASK_WORKERS),
            task_lease: args.task_lease.or(dur(tasks.lease, "tasks.lease")?).unwrap_or(Duration::from_secs(10)),
            task_ttl: dur(tasks.default_ttl, "tasks.default_ttl")?.unwrap_or(Duration::from_secs(24 * 3600)),
            insecure_no_auth: args.insecure_no_auth,
            config_path,
            stdio: args.stdio,
            public_url: match args.public_url.clone().or(file.public_url) {
                Some(u) => Some(parse_public_url(&u)?),
                None => None,
            },
            url_secret: file.url_secret,
            mcp_max_chunk: match args.mcp_max_chunk {
                Some(v) => v,
                None => file.mcp_max_chunk.map(|v| size_value(v, "mcp_max_chunk")).transpose()?.unwrap_or(1 << 20),
            },
            cors,
            leases,
            upload_lease: args.upload_lease.or(dur(file.upload_lease, "upload_lease")?).unwrap_or(Duration::from_secs(10)),
            replica_name: args.replica_name.clone().or(file.replica_name),
            min_free_space: match args.min_free_space {
                Some(r) => r,
                None => match file.min_free_space {
                    None => crate::exhaustion::Reserve::Default,
                    Some(toml::Value::Integer(i)) if i >= 0 => crate::exhaustion::Reserve::Bytes(i as u64),
                    Some(toml::Value::String(s)) => crate::exhaustion::Reserve::parse(&s).map_err(|e| anyhow::anyhow!("min_free_space: {e}"))?,
                    Some(other) => anyhow::bail!("min_free_space: expected a size or a percentage, got {other}"),
                },
            },
            max_connections: match args.max_connections.or(file.max_connections) {
                Some(0) => anyhow::bail!("max_connections must be at least 1"),
                n => n,
            },
            webhooks: {
                let hooks = file.webhooks.into_iter().map(WebhookFileConfig::resolve).collect::<anyhow::Result<Vec<_>>>()?;
                let mut names = std::collections::HashSet::new();
                if let Some(dup) = hooks.iter().find(|h| !names.insert(h.name.clone())) {
                    anyhow::bail!("[[webhooks]]: two webhooks are named {:?}; give each its own `name`", dup.name);
                }
                hooks
            },
            event_retention: dur(file.events.retention, "events.retention")?.unwrap_or(Duration::from_secs(24 * 3600)),
            pre_create_hook: file.hooks.pre_create.map(|h| h.resolve("pre_create")).transpose()?,
            pre_finish_hook: file.hooks.pre_finish.map(|h| h.resolve("pre_finish")).transpose()?,
            tls: match (args.tls_cert.clone().or(file.tls_cert), args.tls_key.clone().or(file.tls_key)) {
                (Some(cert), Some(key)) => Some((cert, key)),
                (None, None) => None,
                (Some(_), None) => anyhow::bail!("tls_cert is set but tls_key is not: give both (--tls-cert and --tls-key, or both keys in ferry.toml)"),
                (None, Some(_)) => anyhow::bail!("tls_key is set but tls_cert is not: give both (--tls-cert and --tls-key, or both keys in ferry.toml)"),
            },
            args: args.clone(),
        })
    }
}

/// A duration as a person reads it in a message: `1 day`, `2 days 3 h`, `30 s`, `1 min 30 s`,
/// `250 ms` (humantime's units with a space before each, `m` spelt `min`, `days` plural).
pub fn human_duration(d: Duration) -> String {
    let text = humantime::format_duration(d).to_string();
    let words: Vec<String> = text
        .split(' ')
        .map(|part| {
            let digits = part.bytes().take_while(u8::is_ascii_digit).count();
            let (n, unit) = part.split_at(digits);
            let unit = match unit {
                "days" | "day" if n == "1" => "day",
                "days" | "day" => "days",
                "m" => "min",
                "months" | "month" | "years" | "year" | "y" | "M" => unit,
                other => other,
            };
            format!("{n} {unit}")
        })
        .collect();
    words.join(" ")
}

/// Fewest key bytes a webhook secret may have: Standard Webhooks asks for keys of 24 to 64
/// bytes (a shorter key is guessable; `whsec_` alone is an empty key).
pub const MIN_WEBHOOK_KEY_BYTES: usize = 24;

/// A Standard Webhooks secret, `whsec_` + base64 of a key of at least
/// [`MIN_WEBHOOK_KEY_BYTES`] bytes. Errors: what is wrong with it, never the secret itself.
fn check_webhook_secret(secret: &str) -> Result<(), String> {
    use base64::Engine as _;
    let Some(b64) = secret.strip_prefix("whsec_") else {
        return Err("must be `whsec_` followed by base64 (Standard Webhooks)".into());
    };
    let key = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| "must be `whsec_` followed by base64 (Standard Webhooks)".to_string())?;
    if key.len() < MIN_WEBHOOK_KEY_BYTES {
        return Err(format!("has a {}-byte key; Standard Webhooks keys are {MIN_WEBHOOK_KEY_BYTES} to 64 random bytes (e.g. `whsec_$(openssl rand -base64 32)`)", key.len()));
    }
    if key.iter().all(|b| *b == key[0]) {
        return Err("is one byte repeated; use random bytes (e.g. `whsec_$(openssl rand -base64 32)`)".into());
    }
    standardwebhooks::Webhook::new(secret).map_err(|_| "must be `whsec_` followed by base64 (Standard Webhooks)".to_string())?;
    Ok(())
}

/// The sha256 of the empty token: a `[[tokens]]` entry with it would let `Authorization: Bearer `
/// (nothing after it) in.
const EMPTY_TOKEN_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// `public_url`: an absolute http(s) URL; stored without a trailing `/`.
fn parse_public_url(u: &str) -> anyhow::Result<String> {
    let uri: http::Uri = u.trim().parse().with_context(|| format!("public_url {u:?} is not a URL"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() || uri.query().is_some() {
        anyhow::bail!("public_url {u:?} must be an absolute http:// or https:// URL without a query");
    }
    Ok(u.trim().trim_end_matches('/').to_string())
}

/// Whether `p` is a configuration `ferry serve` would accept: TOML, known keys, valid
/// values. `ferry token create` and `revoke` check this before they write. Errors say what
/// and where.
pub fn check_file(p: &Path) -> anyhow::Result<()> {
    read_file(p).map(|_| ())
}

/// The `[[tokens]]` of the configuration file `p` (its other keys are checked too).
pub fn file_tokens(p: &Path) -> anyhow::Result<Vec<TokenEntry>> {
    read_file(p).map(|f| f.tokens)
}

fn read_file(p: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    let file: FileConfig = toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
    file.check().with_context(|| format!("in {}", p.display()))?;
    Ok(file)
}

/// `[A-Za-z0-9_.-]{1,64}`: principal and command names.
pub fn is_valid_name(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Most task workers one process runs.
pub const MAX_TASK_WORKERS: usize = 256;

impl FileConfig {
    /// Refuse values that would silently never work.
    fn check(&self) -> anyhow::Result<()> {
        for t in &self.tokens {
            if !is_valid_name(&t.principal) {
                anyhow::bail!("[[tokens]] principal {:?} must be 1-64 characters of A-Z a-z 0-9 _ . -", t.principal);
            }
            if t.sha256.len() != 64 || !t.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                anyhow::bail!("[[tokens]] sha256 for {:?} must be 64 hex digits (write it with `ferry token create NAME`)", t.principal);
            }
            t.expires_ms()?;
            if t.sha256.eq_ignore_ascii_case(EMPTY_TOKEN_SHA256) {
                anyhow::bail!("[[tokens]] sha256 for {:?} is the hash of an empty token; write a real one with `ferry token create NAME`", t.principal);
            }
        }
        if let Some(secret) = &self.url_secret {
            let hex_text = secret.trim();
            if hex_text.len() != 64 || !hex_text.bytes().all(|b| b.is_ascii_hexdigit()) {
                anyhow::bail!("url_secret must be 64 hex digits (32 random bytes, e.g. `openssl rand -hex 32`); it has {} characters", secret.len());
            }
            if hex::decode(hex_text).is_ok_and(|k| k.iter().all(|b| *b == k[0])) {
                anyhow::bail!("url_secret is one byte repeated; use 32 random bytes (e.g. `openssl rand -hex 32`)");
            }
        }
        for (name, spec) in &self.commands {
            if !is_valid_name(name) || name.contains('.') {
                anyhow::bail!("[commands.{name:?}]: a command name must be 1-64 characters of A-Z a-z 0-9 _ - (it becomes the MCP tool export_NAME)");
            }
            if let Some(schema) = &spec.params_schema {
                params_validator(schema).map_err(|e| anyhow::anyhow!("[commands.{name}] params_schema: {e}"))?;
            }
        }
        if self.tasks.workers.is_some_and(|w| w == 0 || w > MAX_TASK_WORKERS) {
            anyhow::bail!("[tasks] workers must be 1 to {MAX_TASK_WORKERS}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_expiry() {
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1TiB").unwrap(), 1 << 40);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("16EiB").is_err());
        assert!(parse_expiry("0s").is_err());
        assert_eq!(parse_expiry("8000y").unwrap(), Expiry(Some(Duration::from_secs(100 * 365 * 86_400))));
        assert!(parse_interval("0s").is_err());
        assert_eq!(parse_expiry("never").unwrap(), Expiry(None));
        assert_eq!(parse_expiry("2s").unwrap(), Expiry(Some(Duration::from_secs(2))));
    }

    #[test]
    fn durations_read_as_words() {
        assert_eq!(human_duration(Duration::from_secs(86_400)), "1 day");
        assert_eq!(human_duration(Duration::from_secs(2 * 86_400 + 3 * 3600)), "2 days 3 h");
        assert_eq!(human_duration(Duration::from_secs(90)), "1 min 30 s");
        assert_eq!(human_duration(Duration::from_millis(250)), "250 ms");
    }

    #[test]
    fn file_values_that_could_never_work_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.toml");
        let bad = [
            "[[tokens]]\nprincipal = \"a\"\nsha256 = \"nothex\"\n",
            "[[tokens]]\nprincipal = \"a b/../x\"\nsha256 = \"0000000000000000000000000000000000000000000000000000000000000000\"\n",
            "[commands.\"bad name\"]\nprogram = \"/bin/true\"\n",
            "[tasks]\nworkers = 100000\n",
            "[[tokens]]\nprincipal = \"a\"\nsha256 = \"E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855\"\n",
            "url_secret = \"\"\n",
            "url_secret = \"0000000000000000000000000000000000000000000000000000000000000000\"\n",
            "[[webhooks]]\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_\"\n",
            "[[webhooks]]\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_c2hvcnQ=\"\n",
            "[[webhooks]]\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"\n",
            "[[webhooks]]\nurl = \"http://127.0.0.1:9/\"\nsecret = \"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
        ];
        for text in bad {
            std::fs::write(&path, text).unwrap();
            let args = ServeArgs { config: Some(path.clone()), ..Default::default() };
            assert!(Config::resolve(&args).is_err(), "accepted: {text}");
        }
    }

    #[test]
    fn cors_origins_and_headers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.toml");
        std::fs::write(&path, "[cors]\nallow_origins = [\"HTTPS://App.Example:443\", \"http://localhost:5173\", \"null\"]\nallow_headers = [\"X-Custom\"]\n").unwrap();
        let c = Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap();
        assert_eq!(c.cors.allow_origins, Some(vec!["https://app.example".to_string(), "http://localhost:5173".into(), "null".into()]));
        assert_eq!(c.cors.allow_headers, vec!["x-custom".to_string()]);
        // Flags replace the file's list.
        let args = ServeArgs { config: Some(path.clone()), cors_allow_origins: vec!["*".into()], ..Default::default() };
        assert_eq!(Config::resolve(&args).unwrap().cors.allow_origins, None);
        assert_eq!(Config::resolve(&ServeArgs::default()).unwrap().cors, CorsConfig::default(), "default: any origin");
        for bad in [
            "[cors]\nallow_origins = [\"https://app.example/path\"]\n",
            "[cors]\nallow_origins = [\"app.example\"]\n",
            "[cors]\nallow_origins = [\"*\", \"https://a.example\"]\n",
            "[cors]\nallow_origins = []\n",
            "[cors]\nallow_headers = [\"bad header\"]\n",
            "[cors]\nexpose = [\"x\"]\n",
        ] {
            std::fs::write(&path, bad).unwrap();
            assert!(Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).is_err(), "accepted: {bad}");
        }
    }

    #[test]
    fn flags_beat_file_beats_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.toml");
        std::fs::write(&path, "max_size = \"2GiB\"\nlisten = \"127.0.0.1:9000\"\ndurability = \"relaxed\"\n").unwrap();
        let args = ServeArgs { config: Some(path), listen: Some("127.0.0.1:9999".into()), ..Default::default() };
        let c = Config::resolve(&args).unwrap();
        assert_eq!(c.listen.port(), 9999);
        assert_eq!(c.max_size, 2 << 30);
        assert_eq!(c.durability, Durability::Relaxed);
        assert_eq!(c.checkpoint_every, 64 << 20);
        assert_eq!(c.min_free_space, crate::exhaustion::Reserve::Default);
        assert_eq!(c.max_connections, None);
        assert_eq!(c.catalog, CatalogUrl::Sqlite(c.data.join("ferry.db")), "default catalog: SQLite in the data dir");
        assert_eq!(c.blobs, BlobLocation::Dir(c.data.join("blobs")));
    }

    #[test]
    fn free_space_reserve_and_connection_cap_from_file_and_flags() {
        use crate::exhaustion::Reserve;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.toml");
        std::fs::write(&path, "min_free_space = \"10%\"\nmax_connections = 500\n").unwrap();
        let c = Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap();
        assert_eq!((c.min_free_space, c.max_connections), (Reserve::Percent(10), Some(500)));
        let c = Config::resolve(&ServeArgs { config: Some(path.clone()), min_free_space: Some(Reserve::Bytes(0)), ..Default::default() }).unwrap();
        assert_eq!(c.min_free_space, Reserve::Bytes(0));
        std::fs::write(&path, "min_free_space = 1048576\n").unwrap();
        assert_eq!(Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap().min_free_space, Reserve::Bytes(1 << 20));
        for bad in ["min_free_space = \"lots\"\n", "min_free_space = \"150%\"\n", "max_connections = 0\n"] {
            std::fs::write(&path, bad).unwrap();
            assert!(Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).is_err(), "accepted: {bad}");
        }
    }

    #[test]
    fn limits_default_and_per_principal_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.toml");
        std::fs::write(
            &path,
            "[limits]\nmax_bytes = \"1GiB\"\nmax_uploads_in_progress = 5\nretain_finished = \"30d\"\n\n[limits.principals.alice]\nmax_bytes = \"unlimited\"\nretain_finished = \"never\"\n\n[limits.principals.bob]\nmax_uploads_in_progress = 0\n",
        )
        .unwrap();
        let l = Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap().limits;
        let day = Duration::from_secs(86_400);
        assert_eq!(l.of("carol"), crate::upload::Limits { max_bytes: Some(1 << 30), max_uploads_in_progress: Some(5), retain_finished: Some(30 * day) });
        assert_eq!(l.of("alice"), crate::upload::Limits { max_bytes: None, max_uploads_in_progress: Some(5), retain_finished: None }, "keys left out are the default's");
        assert_eq!(l.of("bob").max_uploads_in_progress, Some(0));
        assert_eq!(Config::resolve(&ServeArgs::default()).unwrap().limits, crate::upload::PrincipalLimits::default(), "no limits by default");
        for bad in [
            "[limits]\nmax_bytes = \"lots\"\n",
            "[limits]\nmax_uploads_in_progress = -1\n",
            "[limits]\nretain_finished = \"0s\"\n",
            "[limits]\nmax_files = 3\n",
            "[limits.principals.\"a b\"]\nmax_bytes = 1\n",
            "[limits.principals.x]\nmax = 1\n",
        ] {
            std::fs::write(&path, bad).unwrap();
            assert!(Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).is_err(), "accepted: {bad}");
        }
    }

    #[test]
    fn listen_takes_ip_addresses_and_host_names() {
        assert_eq!(parse_listen("127.0.0.1:8080").unwrap(), vec!["127.0.0.1:8080".parse::<SocketAddr>().unwrap()]);
        assert_eq!(parse_listen("[::1]:0").unwrap(), vec!["[::1]:0".parse::<SocketAddr>().unwrap()]);
        let local = parse_listen("localhost:8080").unwrap();
        assert!(local.iter().all(|a| a.ip().is_loopback() && a.port() == 8080), "{local:?}");
        assert!(local[0].is_ipv4() || local.iter().all(|a| a.is_ipv6()), "IPv4 first: {local:?}");
        for bad in ["localhost", ":8080", "localhost:http", "localhost:70000", "no-such-host.invalid:1"] {
            assert!(parse_listen(bad).is_err(), "accepted {bad}");
        }
    }

    #[test]
    fn catalog_from_flag_file_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.toml");
        std::fs::write(&path, "catalog = \"postgres://ferry:hunter2@127.0.0.1/ferry\"\n").unwrap();
        let c = Config::resolve(&ServeArgs { config: Some(path.clone()), ..Default::default() }).unwrap();
        assert_eq!(c.catalog, CatalogUrl::Postgres("postgres://ferry:hunter2@127.0.0.1/ferry".into()));
        let args = ServeArgs { config: Some(path.clone()), catalog: Some("sqlite:/var/lib/ferry/x.db".into()), ..Default::default() };
        assert_eq!(Config::resolve(&args).unwrap().catalog, CatalogUrl::Sqlite("/var/lib/ferry/x.db".into()), "the flag beats the file");
        let args = ServeArgs { catalog: Some("mysql://u:hunter2@h/db".into()), ..Default::default() };
        let e = format!("{:#}", Config::resolve(&args).unwrap_err());
        assert!(e.contains("sqlite:PATH") && !e.contains("hunter2"), "{e}");
    }
}
