//! One configuration: `ferry.toml` < `FERRY_*` environment < command-line flags.
//!
//! Every key is documented in the README's configuration table; the file uses the flag names
//! with `_` for `-` (e.g. `max_size = "1TiB"`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use serde::Deserialize;

/// How hard ferry works to keep acknowledged bytes across power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// fsync blob bytes before every checkpoint commits (the DESIGN §2 invariant).
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
    /// Address to listen on [default: 127.0.0.1:8080]. Port 0 picks a free port; the
    /// chosen address is printed as `listening on http://ADDR`.
    #[arg(long, env = "FERRY_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Data directory: the catalog (ferry.db) and blobs/ [default: ./ferry-data].
    #[arg(long, env = "FERRY_DATA")]
    pub data: Option<PathBuf>,
    /// Largest upload accepted, e.g. 1TiB, 500MB, 1048576 [default: 1TiB].
    #[arg(long, env = "FERRY_MAX_SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,
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
    /// Checkpoint inside a long PATCH every this many bytes [default: 64MiB].
    #[arg(long, env = "FERRY_CHECKPOINT_EVERY", value_parser = parse_size)]
    pub checkpoint_every: Option<u64>,
    /// End a PATCH whose body stalls this long, keeping what arrived [default: 60s].
    #[arg(long, env = "FERRY_IDLE_TIMEOUT", value_parser = humantime::parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// How often expired uploads are swept [default: 60s].
    #[arg(long, env = "FERRY_SWEEP_INTERVAL", value_parser = humantime::parse_duration)]
    pub sweep_interval: Option<Duration>,
    /// Log format [default: text]. Logs go to stderr; RUST_LOG sets the filter.
    #[arg(long, env = "FERRY_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
}

/// `--expire-after`: a duration, or never.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry(pub Option<Duration>);

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse::<u64>().map_err(|e| e.to_string());
    }
    s.parse::<bytesize::ByteSize>().map(|b| b.as_u64()).map_err(|e| format!("invalid size {s:?}: {e}"))
}

fn parse_expiry(s: &str) -> Result<Expiry, String> {
    match s.trim() {
        "never" | "0" => Ok(Expiry(None)),
        other => humantime::parse_duration(other).map(|d| Expiry(Some(d))).map_err(|e| e.to_string()),
    }
}

/// The same keys as [`ServeArgs`], read from `ferry.toml`. Sizes and durations are strings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    data: Option<PathBuf>,
    max_size: Option<toml::Value>,
    expire_after: Option<String>,
    durability: Option<Durability>,
    behind_proxy: Option<bool>,
    checkpoint_every: Option<toml::Value>,
    idle_timeout: Option<String>,
    sweep_interval: Option<String>,
    log_format: Option<LogFormat>,
}

/// The resolved configuration of `ferry serve`.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub data: PathBuf,
    pub max_size: u64,
    pub expire_after: Option<Duration>,
    pub durability: Durability,
    pub behind_proxy: bool,
    pub checkpoint_every: u64,
    pub idle_timeout: Duration,
    pub sweep_interval: Duration,
    pub log_format: LogFormat,
}

fn size_value(v: toml::Value, key: &str) -> anyhow::Result<u64> {
    match v {
        toml::Value::Integer(i) if i >= 0 => Ok(i as u64),
        toml::Value::String(s) => parse_size(&s).map_err(|e| anyhow::anyhow!("{key}: {e}")),
        other => anyhow::bail!("{key}: expected a size, got {other}"),
    }
}

impl Config {
    /// Resolve flags/env over the file over defaults.
    pub fn resolve(args: &ServeArgs) -> anyhow::Result<Config> {
        let file = match &args.config {
            Some(p) => Some(read_file(p)?),
            None if Path::new("ferry.toml").exists() => Some(read_file(Path::new("ferry.toml"))?),
            None => None,
        }
        .unwrap_or_default();
        let dur = |v: Option<String>, key: &str| -> anyhow::Result<Option<Duration>> {
            v.map(|s| humantime::parse_duration(&s).with_context(|| format!("{key}: invalid duration {s:?}"))).transpose()
        };
        let expire_file = file.expire_after.map(|s| parse_expiry(&s).map_err(|e| anyhow::anyhow!("expire_after: {e}"))).transpose()?;
        Ok(Config {
            listen: args.listen.or(file.listen).unwrap_or_else(|| "127.0.0.1:8080".parse().expect("valid")),
            data: args.data.clone().or(file.data).unwrap_or_else(|| PathBuf::from("ferry-data")),
            max_size: match args.max_size {
                Some(v) => v,
                None => file.max_size.map(|v| size_value(v, "max_size")).transpose()?.unwrap_or(1 << 40),
            },
            expire_after: args.expire_after.or(expire_file).unwrap_or(Expiry(Some(Duration::from_secs(7 * 24 * 3600)))).0,
            durability: args.durability.or(file.durability).unwrap_or(Durability::Full),
            behind_proxy: args.behind_proxy || file.behind_proxy.unwrap_or(false),
            checkpoint_every: match args.checkpoint_every {
                Some(v) => v,
                None => file.checkpoint_every.map(|v| size_value(v, "checkpoint_every")).transpose()?.unwrap_or(64 << 20),
            }
            .max(1),
            idle_timeout: args.idle_timeout.or(dur(file.idle_timeout, "idle_timeout")?).unwrap_or(Duration::from_secs(60)),
            sweep_interval: args.sweep_interval.or(dur(file.sweep_interval, "sweep_interval")?).unwrap_or(Duration::from_secs(60)),
            log_format: args.log_format.or(file.log_format).unwrap_or(LogFormat::Text),
        })
    }
}

fn read_file(p: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))
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
        assert_eq!(parse_expiry("never").unwrap(), Expiry(None));
        assert_eq!(parse_expiry("2s").unwrap(), Expiry(Some(Duration::from_secs(2))));
    }

    #[test]
    fn flags_beat_file_beats_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.toml");
        std::fs::write(&path, "max_size = \"2GiB\"\nlisten = \"127.0.0.1:9000\"\ndurability = \"relaxed\"\n").unwrap();
        let args = ServeArgs { config: Some(path), listen: Some("127.0.0.1:9999".parse().unwrap()), ..Default::default() };
        let c = Config::resolve(&args).unwrap();
        assert_eq!(c.listen.port(), 9999);
        assert_eq!(c.max_size, 2 << 30);
        assert_eq!(c.durability, Durability::Relaxed);
        assert_eq!(c.checkpoint_every, 64 << 20);
    }
}
