//! `ferry.toml`: the same keys as the flags (sizes and durations as strings), its sections, and
//! the checks that refuse a file whose values could never work. Errors name the key
//! (`[hooks.pre_create] timeout: …`) and never a secret.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

use super::{is_valid_name, parse_expiry, parse_interval, Durability, LeaseMode, LogFormat};
use crate::app::principal::TokenEntry;
use crate::events::settings::{check_webhook_secret, HookConfig, HookFailure, WebhookConfig, EVENT_TYPES};
use crate::tasks::settings::{params_validator, CommandSpec, FetchConfig};
use crate::units::parse_size;

/// The same keys as [`ServeArgs`], read from `ferry.toml`. Sizes and durations are strings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    pub(super) listen: Option<String>,
    pub(super) data: Option<PathBuf>,
    pub(super) catalog: Option<String>,
    pub(super) blobs: Option<String>,
    pub(super) max_size: Option<toml::Value>,
    pub(super) expire_after: Option<String>,
    pub(super) durability: Option<Durability>,
    pub(super) behind_proxy: Option<bool>,
    pub(super) no_web: Option<bool>,
    pub(super) buffered_writes: Option<bool>,
    pub(super) checkpoint_every: Option<toml::Value>,
    pub(super) idle_timeout: Option<String>,
    pub(super) sweep_interval: Option<String>,
    pub(super) log_format: Option<LogFormat>,
    pub(super) public_url: Option<String>,
    /// Secret for signed URLs: 64 hex digits (default: generated into DATA/url-secret).
    pub(super) url_secret: Option<String>,
    pub(super) mcp_max_chunk: Option<toml::Value>,
    pub(super) leases: Option<LeaseMode>,
    pub(super) upload_lease: Option<String>,
    pub(super) replica_name: Option<String>,
    pub(super) min_free_space: Option<toml::Value>,
    pub(super) max_connections: Option<u32>,
    pub(super) tls_cert: Option<PathBuf>,
    pub(super) tls_key: Option<PathBuf>,
    #[serde(default)]
    pub(super) tokens: Vec<TokenEntry>,
    #[serde(default)]
    pub(super) commands: BTreeMap<String, CommandSpec>,
    #[serde(default)]
    pub(super) fetch: FetchConfig,
    #[serde(default)]
    pub(super) tasks: TasksFileConfig,
    #[serde(default)]
    pub(super) cors: CorsFileConfig,
    #[serde(default)]
    pub(super) webhooks: Vec<WebhookFileConfig>,
    #[serde(default)]
    pub(super) events: EventsFileConfig,
    #[serde(default)]
    pub(super) hooks: HooksFileConfig,
    #[serde(default)]
    pub(super) limits: LimitsFileConfig,
    #[serde(default)]
    pub(super) s3: S3FileConfig,
}

/// `[s3] parts_in_flight` / `--s3-parts-in-flight`: 1..=16 parts of one upload on their way at once.
pub(super) fn s3_parts_in_flight(v: u64) -> anyhow::Result<usize> {
    anyhow::ensure!((1..=16).contains(&v), "[s3] parts_in_flight: {v} is outside 1 to 16 (parts of one upload sent at once)");
    Ok(v as usize)
}

/// `[s3] part_size` / `--s3-part-size` (and `deferred_part_size`, named by `key`), checked
/// against S3's limits: 5 MiB..=5 GiB.
pub(super) fn s3_part_size(v: u64, key: &str) -> anyhow::Result<u64> {
    use crate::blob::s3::{MAX_PART, MIN_PART};
    anyhow::ensure!((MIN_PART..=MAX_PART).contains(&v), "[s3] {key}: {v} bytes is outside what S3 accepts for a part (5MiB to 5GiB)");
    Ok(v)
}

/// `[s3]` in ferry.toml: the S3 blob store's part model and memory bound.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct S3FileConfig {
    pub(super) part_size: Option<toml::Value>,
    pub(super) deferred_part_size: Option<toml::Value>,
    pub(super) max_buffer: Option<toml::Value>,
    pub(super) parts_in_flight: Option<u64>,
}

/// `[limits]` in ferry.toml: defaults for every principal, and `[limits.principals.NAME]`
/// tables that override some of them for one principal.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsFileConfig {
    pub(super) max_bytes: Option<toml::Value>,
    pub(super) max_uploads_in_progress: Option<toml::Value>,
    pub(super) retain_finished: Option<String>,
    #[serde(default)]
    pub(super) principals: BTreeMap<String, LimitsEntry>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsEntry {
    pub(super) max_bytes: Option<toml::Value>,
    pub(super) max_uploads_in_progress: Option<toml::Value>,
    pub(super) retain_finished: Option<String>,
}

/// `max_bytes`: a size (`0` allowed: nothing may be stored) or `"unlimited"`.
pub(super) fn limit_bytes(v: toml::Value, key: &str) -> anyhow::Result<Option<u64>> {
    match v {
        toml::Value::String(s) if s.trim() == "unlimited" => Ok(None),
        toml::Value::Integer(0) => Ok(Some(0)),
        other => size_value(other, key).map(Some),
    }
}

/// `max_uploads_in_progress`: a count (`0` allowed) or `"unlimited"`.
pub(super) fn limit_count(v: toml::Value, key: &str) -> anyhow::Result<Option<u64>> {
    match v {
        toml::Value::String(s) if s.trim() == "unlimited" => Ok(None),
        toml::Value::Integer(i) if i >= 0 => Ok(Some(i as u64)),
        other => anyhow::bail!("{key}: expected a number of uploads or \"unlimited\", got {other}"),
    }
}

/// `retain_finished`: a duration (at least 1 s) or `"never"`.
pub(super) fn limit_retention(v: &str, key: &str) -> anyhow::Result<Option<Duration>> {
    parse_expiry(v).map(|e| e.0).map_err(|e| anyhow::anyhow!("{key}: {e}"))
}

impl LimitsFileConfig {
    /// Resolve: the default table, then each principal's over it.
    pub(super) fn resolve(self) -> anyhow::Result<crate::upload::PrincipalLimits> {
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
        let top =
            LimitsEntry { max_bytes: self.max_bytes, max_uploads_in_progress: self.max_uploads_in_progress, retain_finished: self.retain_finished };
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

/// `[hooks]` in ferry.toml: `[hooks.pre_create]` and `[hooks.pre_finish]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HooksFileConfig {
    pub(super) pre_create: Option<HookFileConfig>,
    pub(super) pre_finish: Option<HookFileConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HookFileConfig {
    pub(super) url: String,
    pub(super) timeout: Option<String>,
    pub(super) on_failure: Option<HookFailure>,
}

impl HookFileConfig {
    pub(super) fn resolve(self, which: &str) -> anyhow::Result<HookConfig> {
        let url = url::Url::parse(&self.url).map_err(|e| anyhow::anyhow!("[hooks.{which}] url {:?}: {e}", self.url))?;
        if !matches!(url.scheme(), "http" | "https") {
            anyhow::bail!("[hooks.{which}] url {:?} must be http:// or https://", self.url);
        }
        let timeout = self
            .timeout
            .map(|t| parse_interval(&t).map_err(|e| anyhow::anyhow!("[hooks.{which}] timeout: {e}")))
            .transpose()?
            .unwrap_or(Duration::from_secs(5));
        Ok(HookConfig { url, timeout, on_failure: self.on_failure.unwrap_or(HookFailure::Reject) })
    }
}

/// `[[webhooks]]` in ferry.toml (see [`WebhookConfig`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WebhookFileConfig {
    pub(super) name: Option<String>,
    pub(super) url: String,
    #[serde(default)]
    pub(super) events: Vec<String>,
    #[serde(default)]
    pub(super) principals: Vec<String>,
    pub(super) secret: String,
    pub(super) retry_for: Option<String>,
    pub(super) timeout: Option<String>,
}

/// `[events]` in ferry.toml.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsFileConfig {
    pub(super) retention: Option<String>,
}

impl WebhookFileConfig {
    pub(super) fn resolve(self) -> anyhow::Result<WebhookConfig> {
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
pub(super) struct CorsFileConfig {
    pub(super) allow_origins: Option<Vec<String>>,
    #[serde(default)]
    pub(super) allow_headers: Vec<String>,
    #[serde(default)]
    pub(super) expose_headers: Vec<String>,
}

/// `[tasks]` in ferry.toml.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TasksFileConfig {
    pub(super) workers: Option<usize>,
    pub(super) lease: Option<String>,
    pub(super) default_ttl: Option<String>,
}

pub(super) fn size_value(v: toml::Value, key: &str) -> anyhow::Result<u64> {
    match v {
        toml::Value::Integer(i) => parse_size(&i.to_string()).map_err(|e| anyhow::anyhow!("{key}: {e}")),
        toml::Value::String(s) => parse_size(&s).map_err(|e| anyhow::anyhow!("{key}: {e}")),
        other => anyhow::bail!("{key}: expected a size, got {other}"),
    }
}

/// The sha256 of the empty token: a `[[tokens]]` entry with it would let `Authorization: Bearer `
/// (nothing after it) in.
const EMPTY_TOKEN_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

pub(super) fn read_file(p: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    let file: FileConfig = toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
    file.check().with_context(|| format!("in {}", p.display()))?;
    Ok(file)
}

impl FileConfig {
    /// Refuse values that would silently never work.
    pub(super) fn check(&self) -> anyhow::Result<()> {
        for t in &self.tokens {
            if !is_valid_name(&t.principal) {
                anyhow::bail!("[[tokens]] principal {:?} must be 1-64 characters of A-Z a-z 0-9 _ . -", t.principal);
            }
            if t.sha256.len() != 64 || !t.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                anyhow::bail!("[[tokens]] sha256 for {:?} must be 64 hex digits (write it with `ferry token create NAME`)", t.principal);
            }
            t.expires_ms()?;
            if t.sha256.eq_ignore_ascii_case(EMPTY_TOKEN_SHA256) {
                anyhow::bail!(
                    "[[tokens]] sha256 for {:?} is the hash of an empty token; write a real one with `ferry token create NAME`",
                    t.principal
                );
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
        if let Some(w) = self.tasks.workers {
            super::task_workers(w).map_err(|e| anyhow::anyhow!("[tasks] workers {e}"))?;
        }
        for entry in &self.fetch.allow_hosts {
            crate::tasks::kinds::fetch::check_allow_entry(entry).map_err(|e| anyhow::anyhow!("[fetch] allow_hosts: {e}"))?;
        }
        Ok(())
    }
}
