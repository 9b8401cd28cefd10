//! One configuration: `ferry.toml` < `FERRY_*` environment < command-line flags.
//!
//! Every key is documented in the configuration reference, which `reference` renders from these
//! definitions (`ferry config reference`, the book's configuration chapter); the file uses the
//! flag names with `_` for `-` (e.g. `max_size = "1TiB"`).
//!
//! This module only reads: it maps the three sources onto the settings types each engine defines
//! for itself ([`crate::tasks::settings`], [`crate::events::settings`], [`crate::app::CorsConfig`],
//! [`crate::app::principal::TokenEntry`], [`crate::upload::PrincipalLimits`],
//! [`crate::blob::s3::S3Settings`], [`crate::exhaustion::Reserve`]). `args` holds the flags,
//! `file` the shape of `ferry.toml` and its checks; no engine imports this module
//! (`tests/layers.rs`), only the composition root (`serve`, `check_command`, `token_command`, `main`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::ValueEnum;
use std::collections::BTreeMap;

use serde::Deserialize;

use crate::app::principal::TokenEntry;
use crate::app::CorsConfig;
use crate::catalog::CatalogUrl;
use crate::events::settings::{HookConfig, WebhookConfig};
use crate::tasks::settings::{CommandSpec, FetchConfig};

mod args;
mod file;
pub mod reference;
#[cfg(test)]
mod tests;

pub use args::ServeArgs;
use file::{read_file, s3_part_size, s3_parts_in_flight, size_value, WebhookFileConfig};

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

/// Where upload bytes live (`--blobs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobLocation {
    /// Files under this directory.
    Dir(PathBuf),
    /// `s3://bucket/prefix`.
    S3(String),
}

impl std::fmt::Display for BlobLocation {
    /// The store as messages name it: the directory, or the `s3://` URL.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlobLocation::Dir(dir) => write!(f, "{}", dir.display()),
            BlobLocation::S3(url) => f.write_str(url),
        }
    }
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

/// `--listen`: `IP:PORT`, `[IPv6]:PORT` or `HOST:PORT`. A host name is resolved (as
/// `getaddrinfo` does: `/etc/hosts`, then DNS) to every address it names, IPv4 first.
pub fn parse_listen(s: &str) -> Result<Vec<SocketAddr>, String> {
    let s = s.trim();
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    let (host, port) =
        s.rsplit_once(':').ok_or_else(|| format!("listen address {s:?} needs a port: HOST:PORT, e.g. localhost:8080 or 127.0.0.1:8080"))?;
    let port: u16 = port.parse().map_err(|_| format!("listen address {s:?}: {port:?} is not a port (0-65535)"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("listen address {s:?} needs a host: HOST:PORT, e.g. localhost:8080 or 0.0.0.0:8080"));
    }
    use std::net::ToSocketAddrs;
    let mut addrs: Vec<SocketAddr> =
        (host, port).to_socket_addrs().map_err(|e| format!("listen address {s:?}: cannot resolve {host:?}: {e}"))?.collect();
    addrs.sort_by_key(|a| a.is_ipv6());
    addrs.dedup();
    if addrs.is_empty() {
        return Err(format!("listen address {s:?}: {host:?} resolves to no address"));
    }
    Ok(addrs)
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
    /// `[s3] part_size` and `max_buffer` (bytes), `parts_in_flight`.
    pub s3: crate::blob::s3::S3Settings,
    pub max_size: u64,
    pub expire_after: Option<Duration>,
    pub durability: Durability,
    pub behind_proxy: bool,
    /// Serve no web pages (`--no-web`).
    pub no_web: bool,
    /// Write fs blobs through the page cache, not with O_DIRECT (`--buffered-writes`).
    pub buffered_writes: bool,
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
        let dur = |v: Option<String>, key: &str| -> anyhow::Result<Option<Duration>> {
            v.map(|s| parse_interval(&s).map_err(|e| anyhow::anyhow!("{key}: {e}"))).transpose()
        };
        let expire_file = file.expire_after.map(|s| parse_expiry(&s).map_err(|e| anyhow::anyhow!("expire_after: {e}"))).transpose()?;
        let data = args.data.clone().or(file.data).unwrap_or_else(|| PathBuf::from("ferry-data"));
        let catalog = match args.catalog.as_deref().or(file.catalog.as_deref()) {
            Some(c) => CatalogUrl::parse(c).map_err(|e| anyhow::anyhow!("catalog: {e}"))?,
            None => CatalogUrl::Sqlite(data.join("ferry.db")),
        };
        // A shared catalog means several processes: leases must live in it too.
        let leases =
            args.leases.or(file.leases).unwrap_or(if matches!(catalog, CatalogUrl::Postgres(_)) { LeaseMode::Catalog } else { LeaseMode::Local });
        let listen_text = args.listen.clone().or(file.listen).unwrap_or_else(|| "127.0.0.1:8080".to_string());
        let mut listen_addrs = parse_listen(&listen_text).map_err(|e| anyhow::anyhow!("listen: {e}"))?;
        let listen = listen_addrs.remove(0);
        let listen_name =
            listen_text.trim().parse::<SocketAddr>().is_err().then(|| listen_text.trim().rsplit_once(':').map_or("", |(h, _)| h).to_string());
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
                part_size: s3_part_size(
                    match args.s3_part_size {
                        Some(v) => v,
                        None => file
                            .s3
                            .part_size
                            .clone()
                            .map(|v| size_value(v, "[s3] part_size"))
                            .transpose()?
                            .unwrap_or(crate::blob::s3::DEFAULT_PART_FLOOR),
                    },
                    "part_size",
                )?,
                deferred_part_size: s3_part_size(
                    match args.s3_deferred_part_size {
                        Some(v) => v,
                        None => file
                            .s3
                            .deferred_part_size
                            .clone()
                            .map(|v| size_value(v, "[s3] deferred_part_size"))
                            .transpose()?
                            .unwrap_or(crate::blob::s3::DEFAULT_DEFERRED_PART),
                    },
                    "deferred_part_size",
                )?,
                max_buffer: match args.s3_max_buffer {
                    Some(v) => v,
                    None => file
                        .s3
                        .max_buffer
                        .clone()
                        .map(|v| size_value(v, "[s3] max_buffer"))
                        .transpose()?
                        .unwrap_or(crate::blob::s3::DEFAULT_MAX_BUFFER),
                },
                parts_in_flight: s3_parts_in_flight(
                    args.s3_parts_in_flight.or(file.s3.parts_in_flight).unwrap_or(crate::blob::s3::DEFAULT_PARTS_IN_FLIGHT as u64),
                )?,
            },
            max_size: match args.max_size {
                Some(v) => v,
                None => file.max_size.map(|v| size_value(v, "max_size")).transpose()?.unwrap_or(1 << 40),
            },
            expire_after: args.expire_after.or(expire_file).unwrap_or(Expiry(Some(Duration::from_secs(7 * 24 * 3600)))).0,
            durability: args.durability.or(file.durability).unwrap_or(Durability::Full),
            behind_proxy: args.behind_proxy || file.behind_proxy.unwrap_or(false),
            no_web: args.no_web || file.no_web.unwrap_or(false),
            buffered_writes: args.buffered_writes || file.buffered_writes.unwrap_or(false),
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
            task_workers: args.task_workers.or(tasks.workers).unwrap_or(4),
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
                (Some(_), None) => {
                    anyhow::bail!("tls_cert is set but tls_key is not: give both (--tls-cert and --tls-key, or both keys in ferry.toml)")
                }
                (None, Some(_)) => {
                    anyhow::bail!("tls_key is set but tls_cert is not: give both (--tls-cert and --tls-key, or both keys in ferry.toml)")
                }
            },
            args: args.clone(),
        })
    }
}

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

/// `[A-Za-z0-9_.-]{1,64}`: principal and command names.
pub fn is_valid_name(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Most task workers one process runs.
pub const MAX_TASK_WORKERS: usize = 256;

/// The one range check of a task worker count, whatever its source (`--task-workers`,
/// `FERRY_TASK_WORKERS`, `[tasks] workers`): 1 to [`MAX_TASK_WORKERS`].
pub(crate) fn task_workers(n: usize) -> Result<usize, String> {
    (1..=MAX_TASK_WORKERS).contains(&n).then_some(n).ok_or_else(|| format!("must be 1 to {MAX_TASK_WORKERS}, not {n}"))
}

/// `--task-workers` / `FERRY_TASK_WORKERS`: a whole number, then [`task_workers`].
pub(crate) fn parse_task_workers(s: &str) -> Result<usize, String> {
    let n = s.trim().parse::<usize>().map_err(|_| format!("{s:?} is not a whole number of workers (1 to {MAX_TASK_WORKERS})"))?;
    task_workers(n)
}
