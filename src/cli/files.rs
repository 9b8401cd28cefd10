//! `ferry ls`, `ferry status ID`, `ferry rm ID` and `ferry share ID`: clients of the file API
//! (`/api/v1/files`, see `/api/v1/openapi.json`) and of TUS termination (TUS 1.0
//! §Termination).

use crate::names::display_name;
use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use super::client::{exit_codes_help, parse_duration, print_line, CliError, Client, Connection, Retry, EXIT_FAILURE};

/// Requests of these commands fail after this long without an answer.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Files `ferry ls` lists without `--limit` (the server's default).
const LS_DEFAULT_LIMIT: u32 = 100;

/// `ferry ls`: your files on the server, newest first: the newest 100 unless `--limit` says
/// otherwise (at most 1000).
#[derive(Debug, Args)]
#[command(after_help = exit_codes_help())]
pub struct LsArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// Show at most the newest N files, 1 to 1000 (the server's cap). Default: 100, so older
    /// files are not shown when you have more.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: Option<u32>,
    /// Print the server's JSON (`{"files": [...]}`: sizes in bytes, times in Unix ms) instead of
    /// a table for people (sizes in KiB/MiB/GiB, creation times in UTC).
    #[arg(long)]
    pub json: bool,
    /// Keep retrying network errors and 5xx for this long.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub retry_for: Duration,
}

/// `ferry status ID`: one file's state: name, media type, size, progress, sha256, times, URL
/// and metadata (`--json`: the server's JSON).
#[derive(Debug, Args)]
#[command(after_help = exit_codes_help())]
pub struct StatusArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// File id.
    pub id: String,
    /// Print the server's JSON (`GET /api/v1/files/{id}`) instead of lines for people.
    #[arg(long)]
    pub json: bool,
    /// Keep retrying network errors and 5xx for this long.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub retry_for: Duration,
}

/// `ferry rm ID|URL...`: delete files or unfinished uploads (TUS termination). Every id is
/// tried; each failure is reported on stderr and the exit code is the first failure's.
#[derive(Debug, Args)]
#[command(after_help = exit_codes_help())]
pub struct RmArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// File ids or URLs.
    #[arg(required = true, value_name = "ID|URL")]
    pub ids: Vec<String>,
    /// Keep retrying network errors, 5xx and 423 for this long.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub retry_for: Duration,
}

/// `ferry share ID`: print a signed URL that lets anyone holding it act on one file (no
/// token needed) until it expires. `ferry share ID…` with several files, a message, a
/// passphrase or a download limit prints the page of a link the server keeps (`/l/ID`), which
/// `ferry share --revoke LINK` turns off at once.
#[derive(Debug, Args)]
#[command(after_help = exit_codes_help())]
pub struct ShareArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// File id(s); with --revoke, link id(s) or their URLs.
    #[arg(required = true)]
    pub ids: Vec<String>,
    /// How long the URL is valid (e.g. 15m, 1h, 7d) [default: 1h; for a link 7d, at most 90d].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    #[command(flatten)]
    pub link: super::links::LinkOptions,
    /// At most this many downloads of the link (1: a one-time link); makes a link.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_downloads: Option<u32>,
    /// Make a link the server keeps (a page listing the files, revocable) even for one file
    /// with no other option.
    #[arg(long = "link")]
    pub as_link: bool,
    /// Revoke the links named, at once (their pages, downloads and uploads stop).
    #[arg(long, conflicts_with_all = ["ttl", "max_downloads", "as_link", "message", "passphrase_file", "passphrase_stdin", "passphrase_env"])]
    pub revoke: bool,
    /// What the URL allows: `download` (GET) or `upload` (TUS HEAD/PATCH).
    #[arg(long, value_name = "SCOPE", default_value = "download", value_parser = ["download", "upload"])]
    pub scope: String,
    /// Print the server's JSON (url, page_url, scope, expires_at, expires_at_ms) instead of
    /// the URL. Without it the URL goes to stdout and the page for a browser to stderr.
    #[arg(long)]
    pub json: bool,
    /// Keep retrying network errors and 5xx for this long.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub retry_for: Duration,
}

pub fn ls(args: LsArgs) -> std::process::ExitCode {
    super::client::run_command(|| async move {
        let client = Client::new(&args.conn, READ_TIMEOUT)?;
        let query: Vec<(&str, String)> = args.limit.map(|n| ("limit", n.to_string())).into_iter().collect();
        let body = client.api(&mut Retry::new(args.retry_for), reqwest::Method::GET, "/files", &query, None).await?;
        if args.json {
            return print_line(body.trim_end());
        }
        #[derive(Deserialize)]
        struct List {
            files: Vec<FileInfo>,
        }
        let list: List =
            serde_json::from_str(&body).map_err(|e| CliError::new(EXIT_FAILURE, format!("the server's file list is not as expected: {e}")))?;
        let shown = list.files.len();
        print_line(&format!("{:<26}  {:>10}  {:<14}  {:<17}  NAME", "ID", "SIZE", "STATE", "CREATED (UTC)"))?;
        for f in list.files {
            let size = f.size.map_or_else(|| "?".to_string(), human_size);
            print_line(&format!(
                "{:<26}  {:>10}  {:<14}  {:<17}  {}",
                f.id,
                size,
                f.state_short(),
                utc_minutes(f.created_at),
                display_name(f.name.as_deref().unwrap_or(""))
            ))?;
        }
        let limit = args.limit.unwrap_or(LS_DEFAULT_LIMIT);
        if shown as u64 >= u64::from(limit) && limit < 1000 {
            eprintln!("ferry: showing the newest {shown} files; older ones may exist (--limit N shows up to 1000)");
        }
        Ok(())
    })
}

/// What `ls` and `status` read of the server's file view (`GET /api/v1/files/{id}`).
#[derive(Deserialize)]
struct FileInfo {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    size: Option<u64>,
    offset: u64,
    complete: bool,
    #[serde(default)]
    sha256: Option<String>,
    /// Set when the server's copy is damaged: downloads are refused.
    #[serde(default)]
    damaged: Option<Damaged>,
    /// Every byte is stored; the server finishes it by itself.
    #[serde(default)]
    finishing: bool,
    /// Unix ms.
    #[serde(default)]
    created_at: Option<i64>,
    /// Unix ms.
    #[serde(default)]
    expires_at: Option<i64>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    metadata: serde_json::Map<String, serde_json::Value>,
}

/// What the server found wrong with a complete file's stored bytes.
#[derive(Deserialize)]
struct Damaged {
    /// `sha256_mismatch` or `missing`.
    kind: String,
    /// Unix ms.
    #[serde(default)]
    found_at: Option<i64>,
}

impl Damaged {
    /// `its stored bytes are missing` / `… no longer match its sha256`.
    fn words(&self) -> &'static str {
        if self.kind == "missing" {
            "its stored bytes are missing"
        } else {
            "its stored bytes no longer match its sha256"
        }
    }
}

impl FileInfo {
    /// `damaged`, `complete`, `finishing`, `42.0% uploaded`, or `5.0 MiB uploaded` (length
    /// not known yet): what a download of it gets, in one word or two.
    fn state_short(&self) -> String {
        match (self.complete, self.size) {
            _ if self.damaged.is_some() => "damaged".to_string(),
            (true, _) => "complete".to_string(),
            (false, _) if self.finishing => "finishing".to_string(),
            (false, Some(s)) if s > 0 => format!("{:.1}% uploaded", self.offset as f64 * 100.0 / s as f64),
            (false, _) => format!("{} uploaded", human_size(self.offset)),
        }
    }
}

/// Bytes for people: `0 B`, `512 B`, `5.0 MiB` (IEC units).
pub fn human_size(n: u64) -> String {
    bytesize::ByteSize::b(n).display().iec().to_string()
}

/// Unix ms as `2026-11-30 19:40` (UTC); `-` when unknown.
pub fn utc_minutes(ms: Option<i64>) -> String {
    utc(ms).map(|t| t[..16].to_string()).unwrap_or_else(|| "-".into())
}

/// Unix ms as `2026-11-30 19:40:12 UTC`.
fn utc(ms: Option<i64>) -> Option<String> {
    let ms = u64::try_from(ms?).ok()?;
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    let s = humantime::format_rfc3339_seconds(t).to_string();
    Some(format!("{} UTC", s.trim_end_matches('Z').replacen('T', " ", 1)))
}

/// `ferry status` for people: one `key  value` line per field, then the metadata.
fn status_lines(f: &FileInfo, client: &Client) -> Vec<String> {
    let mut out = Vec::new();
    let mut line = |k: &str, v: String| out.push(format!("{k:<11} {v}"));
    line("id", f.id.clone());
    // Names and metadata come from whoever uploaded: never pass their control characters
    // (terminal escapes, bidi overrides) to this terminal.
    if let Some(n) = &f.name {
        line("name", display_name(n));
    }
    if let Some(t) = &f.media_type {
        line("media type", display_name(t));
    }
    line("size", f.size.map_or_else(|| "not known yet (deferred length)".to_string(), |s| format!("{} ({s} bytes)", human_size(s))));
    let state = match (f.complete, f.size) {
        _ if f.damaged.is_some() => {
            let d = f.damaged.as_ref().expect("matched");
            let when = utc(d.found_at).map(|t| format!(" (found {t})")).unwrap_or_default();
            format!("damaged: {}{when}; downloads are refused (upload it again, or ask the operator to restore it)", d.words())
        }
        (true, _) => "complete".to_string(),
        (false, _) if f.finishing => "finishing: every byte is stored; the server completes it by itself".to_string(),
        (false, Some(s)) => format!("uploading: {} of {} ({} bytes)", human_size(f.offset), human_size(s), f.offset),
        (false, None) => format!("uploading: {} so far ({} bytes)", human_size(f.offset), f.offset),
    };
    line("state", state);
    if let Some(h) = &f.sha256 {
        line("sha256", h.clone());
    }
    if let Some(t) = utc(f.created_at) {
        line("created", t);
    }
    if let Some(t) = utc(f.expires_at) {
        line("expires", format!("{t} (unless more bytes arrive)"));
    }
    if let Some(u) = f.url.as_deref().and_then(|u| client.resolve(u).ok()) {
        line("url", u.to_string());
    }
    let mut first = true;
    for (k, v) in &f.metadata {
        let v = match v {
            serde_json::Value::String(s) => display_name(&format!("{k}={s}")),
            _ => display_name(k),
        };
        line(if first { "metadata" } else { "" }, v);
        first = false;
    }
    out
}

pub fn status(args: StatusArgs) -> std::process::ExitCode {
    super::client::run_command(|| async move {
        let (client, id) = Client::new(&args.conn, READ_TIMEOUT)?.at_link(&args.id)?;
        let path = format!("/files/{}", super::client::id_segment(&id)?);
        let body = client.api(&mut Retry::new(args.retry_for), reqwest::Method::GET, &path, &[], None).await?;
        if args.json {
            return print_line(body.trim_end());
        }
        let f: FileInfo =
            serde_json::from_str(&body).map_err(|e| CliError::new(EXIT_FAILURE, format!("the server's file view is not as expected: {e}")))?;
        for l in status_lines(&f, &client) {
            print_line(&l)?;
        }
        Ok(())
    })
}

pub fn rm(args: RmArgs) -> std::process::ExitCode {
    super::client::run_command(|| async move {
        let client = Client::new(&args.conn, READ_TIMEOUT)?;
        let store = super::store::Store::open().ok();
        let mut first_err: Option<CliError> = None;
        for id in &args.ids {
            match rm_one(&client, store.as_ref(), id, args.retry_for).await {
                Ok(url) => eprintln!("ferry: deleted {url}"),
                Err(e) => {
                    let e = CliError { message: format!("{id}: {}", e.message), ..e };
                    if args.ids.len() > 1 {
                        e.print();
                    }
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) if args.ids.len() > 1 => Err(CliError::new(e.code, "some files were not deleted (see above)")),
            Some(e) => Err(e),
            None => Ok(()),
        }
    })
}

/// Delete one upload; also the partial uploads a remembered `--parallel` upload of it left.
async fn rm_one(client: &Client, store: Option<&super::store::Store>, id: &str, retry_for: Duration) -> Result<reqwest::Url, CliError> {
    let url = client.file_url(id)?;
    client.terminate(&mut Retry::new(retry_for), &url).await?;
    if let Some(s) = store {
        for entry in s.forget_url(url.as_str()).unwrap_or_default() {
            if entry.final_url.as_deref() != Some(url.as_str()) {
                continue;
            }
            for part in &entry.parts {
                let Ok(part) = client.resolve(part) else { continue };
                match client.terminate(&mut Retry::new(retry_for.min(Duration::from_secs(10))), &part).await {
                    Ok(()) => eprintln!("ferry: deleted its partial upload {part}"),
                    Err(e) if e.code == super::client::EXIT_NOT_FOUND => {}
                    Err(e) => eprintln!("ferry: warning: could not delete its partial upload {part}: {}", e.message),
                }
            }
        }
    }
    Ok(url)
}

pub fn share(args: ShareArgs) -> std::process::ExitCode {
    super::client::run_command(|| async move {
        if args.revoke {
            return super::links::revoke(&Client::new(&args.conn, READ_TIMEOUT)?, args.retry_for, &args.ids).await;
        }
        if args.ids.len() > 1 || args.link.any() || args.max_downloads.is_some() || args.as_link {
            if args.scope != "download" {
                return Err(CliError::usage(
                    "a link of several files (or with --message, a passphrase, --max-downloads) is for downloads; \
                     --scope upload signs one file's URL",
                ));
            }
            let client = Client::new(&args.conn, READ_TIMEOUT)?;
            let mut ids = Vec::with_capacity(args.ids.len());
            for l in &args.ids {
                ids.push(client.file_id(l)?);
            }
            let ttl = args.ttl.unwrap_or(Duration::from_secs(7 * 24 * 3600));
            return super::links::create(
                &client,
                args.retry_for,
                super::links::NewLink { kind: "share", files: &ids, opts: &args.link, limits: (args.max_downloads, None), ttl },
                args.json,
            )
            .await;
        }
        let (client, id) = Client::new(&args.conn, READ_TIMEOUT)?.at_link(&args.ids[0])?;
        let ttl_ms = u64::try_from(args.ttl.unwrap_or(Duration::from_secs(3600)).as_millis()).unwrap_or(u64::MAX);
        if ttl_ms == 0 {
            return Err(CliError::usage("--ttl must be positive"));
        }
        let path = format!("/files/{}/share", super::client::id_segment(&id)?);
        let req = serde_json::json!({ "scope": args.scope, "ttl_ms": ttl_ms }).to_string();
        let body = client.api(&mut Retry::new(args.retry_for), reqwest::Method::POST, &path, &[], Some(req)).await?;
        if args.json {
            return print_line(body.trim_end());
        }
        #[derive(Deserialize)]
        struct Shared {
            url: String,
            #[serde(default)]
            page_url: Option<String>,
        }
        let shared: Shared =
            serde_json::from_str(&body).map_err(|e| CliError::new(EXIT_FAILURE, format!("the server's answer has no url ({e}): {}", body.trim())))?;
        if let Some(page) = &shared.page_url {
            eprintln!("ferry: page for a browser: {}", client.resolve(page)?);
        }
        if args.scope == "download" {
            // A download link of an upload still in progress works only once it is complete.
            let info = client
                .api(&mut Retry::new(args.retry_for), reqwest::Method::GET, &format!("/files/{}", super::client::id_segment(&id)?), &[], None)
                .await;
            let info = info.ok().and_then(|b| serde_json::from_str::<FileInfo>(&b).ok());
            if let Some(d) = info.as_ref().and_then(|f| f.damaged.as_ref()) {
                eprintln!("ferry: warning: {id} is damaged on the server ({}): this download link is refused until it is uploaded again", d.words());
            }
            if let Some(f) = info.filter(|f| !f.complete) {
                eprintln!(
                    "ferry: note: {} is not complete yet ({}); this download link works \
                     once it is. To let someone send the rest, use --scope upload.",
                    f.id,
                    f.state_short()
                );
            }
        }
        print_line(client.resolve(&shared.url)?.as_str())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_for_people() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(5 * 1024 * 1024 + 7), "5.0 MiB");
        assert_eq!(utc_minutes(Some(1_764_531_612_000)), "2025-11-30 19:40");
        assert_eq!(utc(Some(1_764_531_612_345)).as_deref(), Some("2025-11-30 19:40:12 UTC"));
        assert_eq!(utc_minutes(None), "-");
        assert_eq!(utc_minutes(Some(-5)), "-");
    }
}
