//! `ferry ls`, `ferry status ID`, `ferry rm ID` and `ferry share ID`: clients of the file API
//! (`/api/v1/files`, see `/api/v1/openapi.json`) and of TUS termination (TUS 1.0
//! §Termination).

use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use super::client::{parse_duration, CliError, Client, Connection, Retry, EXIT_FAILURE, TRANSFER_EXIT_CODES};
use super::upload::TUS_VERSION;

/// Requests of these commands fail after this long without an answer.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// `ferry ls`: your files on the server.
#[derive(Debug, Args)]
#[command(after_help = TRANSFER_EXIT_CODES)]
pub struct LsArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// At most this many, newest first (server default 100, at most 1000).
    #[arg(long, value_name = "N")]
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

/// `ferry rm ID|URL`: delete a file or an unfinished upload (TUS termination).
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
    /// Print the server's JSON (url, scope, expires_at, expires_at_ms) instead of the URL.
    #[arg(long)]
    pub json: bool,
    /// Keep retrying network errors and 5xx for this long.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub retry_for: Duration,
}

pub fn ls(args: LsArgs) -> std::process::ExitCode {
    super::client::run_command(|| async move {
        let client = Client::new(&args.conn, READ_TIMEOUT)?;
        let path = match args.limit {
            Some(0) => return Err(CliError::usage("--limit must be at least 1")),
            Some(n) => format!("/files?limit={n}"),
            None => "/files".into(),
        };
        let body = client.api(&mut Retry::new(args.retry_for), reqwest::Method::GET, &path, None).await?;
        if args.json {
            println!("{}", body.trim_end());
            return Ok(());
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
        println!("{:<26}  {:>15}  {:<16}  NAME", "ID", "SIZE", "STATE");
        for f in list.files {
            let state = match (f.complete, f.size) {
                (true, _) => "complete".to_string(),
                (false, Some(s)) if s > 0 => format!("{:.1}% uploaded", f.offset as f64 * 100.0 / s as f64),
                (false, _) => format!("{} bytes uploaded", f.offset),
            };
            let size = f.size.map_or_else(|| "?".to_string(), |s| s.to_string());
            println!("{:<26}  {:>15}  {:<16}  {}", f.id, size, state, f.name.unwrap_or_default());
        }
        Ok(())
    })
}

pub fn status(args: StatusArgs) -> std::process::ExitCode {
    super::client::run_command(|| async move {
        let client = Client::new(&args.conn, READ_TIMEOUT)?;
        let path = format!("/files/{}", super::client::id_segment(&args.id)?);
        let body = client.api(&mut Retry::new(args.retry_for), reqwest::Method::GET, &path, None).await?;
        println!("{}", body.trim_end());
        Ok(())
    })
}

pub fn rm(args: RmArgs) -> std::process::ExitCode {
    super::client::run_command(|| async move {
        let client = Client::new(&args.conn, READ_TIMEOUT)?;
        let store = super::store::Store::open().ok();
        for id in &args.ids {
            let url = client.file_url(id)?;
            let what = format!("DELETE {url}");
            let res = client
                .send_retrying(&mut Retry::new(args.retry_for), &what, || client.request(reqwest::Method::DELETE, &url).header("tus-resumable", TUS_VERSION))
                .await?;
            let status = res.status().as_u16();
            if !(200..300).contains(&status) {
                let body = res.text().await.unwrap_or_default();
                return Err(CliError::from_status(&what, status, &body));
            }
            if let Some(s) = &store {
                let _ = s.forget_url(url.as_str());
            }
            eprintln!("ferry: deleted {url}");
        }
        Ok(())
    })
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
        let body = client.api(&mut Retry::new(args.retry_for), reqwest::Method::POST, &path, Some(req)).await?;
        if args.json {
            println!("{}", body.trim_end());
            return Ok(());
        }
        #[derive(Deserialize)]
        struct Shared {
            url: String,
        }
        let shared: Shared = serde_json::from_str(&body).map_err(|e| CliError::new(EXIT_FAILURE, format!("the server's answer has no url ({e}): {}", body.trim())))?;
        println!("{}", client.resolve(&shared.url)?);
        Ok(())
    })
}
