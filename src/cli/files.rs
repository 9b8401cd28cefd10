//! `ferry ls`, `ferry status ID`, `ferry rm ID` and `ferry share ID`: clients of the file API
//! (`/api/v1/files`, see `/api/v1/openapi.json`) and of TUS termination (TUS 1.0
//! §Termination).

use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use super::client::{parse_duration, print_line, CliError, Client, Connection, Retry, EXIT_FAILURE, TRANSFER_EXIT_CODES};

/// Requests of these commands fail after this long without an answer.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Files `ferry ls` lists without `--limit` (the server's default).
const LS_DEFAULT_LIMIT: u32 = 100;

/// `ferry ls`: your files on the server, newest first: the newest 100 unless `--limit` says
/// otherwise (at most 1000).
#[derive(Debug, Args)]
#[command(after_help = TRANSFER_EXIT_CODES)]
pub struct LsArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// Show at most the newest N files, 1 to 1000 (the server's cap). Default: 100, so older
    /// files are not shown when you have more.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: Option<u32>,
    /// Print the server's JSON (`{"files": [...]}`) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Keep retrying network errors and 5xx for this long.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub retry_for: Duration,
}

/// `ferry status ID`: one file's state as JSON (name, size, offset, complete, sha256, url).
#[derive(Debug, Args)]
#[command(after_help = TRANSFER_EXIT_CODES)]
pub struct StatusArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// File id.
    pub id: String,
    /// Keep retrying network errors and 5xx for this long.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub retry_for: Duration,
}

/// `ferry rm ID|URL...`: delete files or unfinished uploads (TUS termination). Every id is
/// tried; each failure is reported on stderr and the exit code is the first failure's.
#[derive(Debug, Args)]
#[command(after_help = TRANSFER_EXIT_CODES)]
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
/// token needed) until it expires.
#[derive(Debug, Args)]
#[command(after_help = TRANSFER_EXIT_CODES)]
pub struct ShareArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// File id.
    pub id: String,
    /// How long the URL is valid (e.g. 15m, 1h, 7d).
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    pub ttl: Duration,
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
            files: Vec<File>,
        }
        #[derive(Deserialize)]
        struct File {
            id: String,
            #[serde(default)]
            name: Option<String>,
            #[serde(default)]
            size: Option<u64>,
            offset: u64,
            complete: bool,
        }
        let list: List = serde_json::from_str(&body).map_err(|e| CliError::new(EXIT_FAILURE, format!("the server's file list is not as expected: {e}")))?;
        let shown = list.files.len();
        print_line(&format!("{:<26}  {:>15}  {:<16}  NAME", "ID", "SIZE", "STATE"))?;
        for f in list.files {
            let state = match (f.complete, f.size) {
                (true, _) => "complete".to_string(),
                (false, Some(s)) if s > 0 => format!("{:.1}% uploaded", f.offset as f64 * 100.0 / s as f64),
                (false, _) => format!("{} bytes uploaded", f.offset),
            };
            let size = f.size.map_or_else(|| "?".to_string(), |s| s.to_string());
            print_line(&format!("{:<26}  {:>15}  {:<16}  {}", f.id, size, state, f.name.unwrap_or_default()))?;
        }
        let limit = args.limit.unwrap_or(LS_DEFAULT_LIMIT);
        if shown as u64 >= u64::from(limit) && limit < 1000 {
            eprintln!("ferry: showing the newest {shown} files; older ones may exist (--limit N shows up to 1000)");
        }
        Ok(())
    })
}

pub fn status(args: StatusArgs) -> std::process::ExitCode {
    super::client::run_command(|| async move {
        let client = Client::new(&args.conn, READ_TIMEOUT)?;
        let path = format!("/files/{}", super::client::id_segment(&args.id)?);
        let body = client.api(&mut Retry::new(args.retry_for), reqwest::Method::GET, &path, &[], None).await?;
        print_line(body.trim_end())
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
        let client = Client::new(&args.conn, READ_TIMEOUT)?;
        let ttl_ms = u64::try_from(args.ttl.as_millis()).unwrap_or(u64::MAX);
        if ttl_ms == 0 {
            return Err(CliError::usage("--ttl must be positive"));
        }
        let path = format!("/files/{}/share", super::client::id_segment(&args.id)?);
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
        let shared: Shared = serde_json::from_str(&body).map_err(|e| CliError::new(EXIT_FAILURE, format!("the server's answer has no url ({e}): {}", body.trim())))?;
        if let Some(page) = &shared.page_url {
            eprintln!("ferry: page for a browser: {}", client.resolve(page)?);
        }
        print_line(client.resolve(&shared.url)?.as_str())
    })
}
