//! `ferry request NAME`: ask someone for a file of any size in one step. It creates an
//! upload whose length is not known yet (TUS 1.0 `creation-defer-length`: the page sets
//! `Upload-Length` when the person picks the file), named NAME, and prints the signed link of
//! its upload page (`POST /api/v1/files/{id}/share`, scope `upload`) to send them.

use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use super::client::{describe, exit_codes_help, parse_duration, print_line, CliError, Client, Connection, Retry, EXIT_FAILURE};
use super::upload::TUS_VERSION;

/// Requests of this command fail after this long without an answer.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// `ferry request NAME`: make a link that asks someone for a file (any size); it lands in
/// your files as NAME.
#[derive(Debug, Args)]
#[command(after_help = exit_codes_help())]
pub struct RequestArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// Name the file gets on the server (e.g. signed-contract.pdf); leave it out with --files.
    #[arg(required_unless_present = "files")]
    pub name: Option<String>,
    /// Ask for up to N files of any names instead (a link the server keeps, `/l/ID`: a person
    /// drops them, or a folder, at once).
    #[arg(long, value_name = "N", conflicts_with = "name", value_parser = clap::value_parser!(u32).range(1..=200))]
    pub files: Option<u32>,
    #[command(flatten)]
    pub link: super::links::LinkOptions,
    /// How long the link is valid, at most 7 days, with --files 90 days (e.g. 1h, 2d).
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = parse_duration)]
    pub ttl: Duration,
    /// Print the server's JSON (id, url, page_url, scope, expires_at, expires_at_ms) instead of
    /// the page link.
    #[arg(long)]
    pub json: bool,
    /// Keep retrying network errors and 5xx for this long.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub retry_for: Duration,
}

/// The page link goes to stdout (the one line to send); what it is, to stderr.
pub fn run(args: RequestArgs) -> std::process::ExitCode {
    super::client::run_command(|| async move {
        let ttl_ms = u64::try_from(args.ttl.as_millis()).unwrap_or(u64::MAX);
        let Some(name) = args.name.clone().filter(|_| args.files.is_none() && !args.link.any()) else {
            let client = Client::new(&args.conn, READ_TIMEOUT)?;
            if args.name.is_some() {
                return Err(CliError::usage("--message and a passphrase are for a request of several files: use --files N instead of NAME"));
            }
            return super::links::create(
                &client,
                args.retry_for,
                super::links::NewLink { kind: "request", files: &[], opts: &args.link, limits: (None, args.files), ttl: args.ttl },
                args.json,
            )
            .await;
        };
        if ttl_ms == 0 || ttl_ms > crate::signing::MAX_URL_TTL_MS {
            return Err(CliError::usage("--ttl must be more than 0 and at most 7d"));
        }
        if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
            return Err(CliError::usage("NAME must be 1 to 255 bytes without control characters, e.g. signed-contract.pdf"));
        }
        let client = Client::new(&args.conn, READ_TIMEOUT)?;
        let id = create_deferred(&client, &name, args.retry_for).await?;
        let path = format!("/files/{}/share", super::client::id_segment(&id)?);
        let req = serde_json::json!({ "scope": "upload", "ttl_ms": ttl_ms }).to_string();
        let body = client.api(&mut Retry::new(args.retry_for), reqwest::Method::POST, &path, &[], Some(req)).await?;
        #[derive(Deserialize)]
        struct Shared {
            url: String,
            #[serde(default)]
            page_url: Option<String>,
            #[serde(default)]
            expires_at: Option<String>,
        }
        let shared: Shared =
            serde_json::from_str(&body).map_err(|e| CliError::new(EXIT_FAILURE, format!("the server's answer has no url ({e}): {}", body.trim())))?;
        if args.json {
            let mut v: serde_json::Value =
                serde_json::from_str(&body).map_err(|e| CliError::new(EXIT_FAILURE, format!("the server's answer is not JSON: {e}")))?;
            v["id"] = serde_json::Value::String(id);
            return print_line(&v.to_string());
        }
        let until = shared.expires_at.map(|t| format!(", valid until {t}")).unwrap_or_default();
        let name = crate::names::display_name(&name);
        match &shared.page_url {
            Some(page) => {
                eprintln!(
                    "ferry: request {id} for a file of any size, stored as {name}{until}. Send this link; `ferry status {id}` shows what arrived:"
                );
                print_line(client.resolve(page)?.as_str())
            }
            None => {
                // `--no-web`: no page; the signed TUS URL is what a program can upload to.
                eprintln!("ferry: this server has no web pages (--no-web): printing the signed TUS upload URL of request {id} instead{until}");
                print_line(client.resolve(&shared.url)?.as_str())
            }
        }
    })
}

/// `POST /files/` with `Upload-Defer-Length: 1`, `filename` NAME and the `filetype` its
/// extension suggests (as `ferry upload` sends); the new upload's id. An `Idempotency-Key`
/// makes a retried creation the same upload, not a second one.
async fn create_deferred(client: &Client, name: &str, retry_for: Duration) -> Result<String, CliError> {
    let endpoint = client.url("/files/");
    let what = describe(&reqwest::Method::POST, &endpoint);
    let meta = super::upload::metadata_header(Some(name), &[(crate::names::REQUESTED_METADATA_KEY.to_string(), "1".to_string())]);
    let key = format!("ferry-request-{:032x}", rand::random::<u128>());
    let res = client
        .send_retrying(&mut Retry::new(retry_for), &what, || {
            client
                .request(reqwest::Method::POST, &endpoint)
                .header("tus-resumable", TUS_VERSION)
                .header("upload-defer-length", "1")
                .header("upload-metadata", &meta)
                .header("idempotency-key", &key)
        })
        .await?;
    Ok(super::client::id_of(&client.created(&what, res).await?))
}
