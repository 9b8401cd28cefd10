//! Links kept by the server (issue 51) from the command line: `ferry share ID…` with a
//! message, a passphrase or a download limit, `ferry request --files N`, and `ferry share
//! --revoke LINK…`. Each is one call of `/api/v1/links`. A passphrase is never an argument (a
//! command line is visible to every user in `ps`): it comes from a file, stdin or an
//! environment variable.

use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use super::client::{print_line, CliError, Client, Retry, EXIT_FAILURE};

/// What a share link and a request link both take.
#[derive(Debug, Args, Default, Clone)]
pub struct LinkOptions {
    /// A message shown first on the link's page (who asks or sends, and why); at most 1 000
    /// characters.
    #[arg(long, value_name = "TEXT")]
    pub message: Option<String>,
    /// Protect the link with the passphrase in this file (its first line).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["passphrase_stdin", "passphrase_env"])]
    pub passphrase_file: Option<std::path::PathBuf>,
    /// Protect the link with a passphrase read from stdin (its first line).
    #[arg(long, conflicts_with = "passphrase_env")]
    pub passphrase_stdin: bool,
    /// Protect the link with the passphrase in this environment variable.
    #[arg(long, value_name = "VAR")]
    pub passphrase_env: Option<String>,
}

impl LinkOptions {
    /// Whether any option asks for a link (rather than a signed URL).
    pub fn any(&self) -> bool {
        self.message.is_some() || self.passphrase_file.is_some() || self.passphrase_stdin || self.passphrase_env.is_some()
    }

    /// The passphrase from wherever it was said to be, without its line ending.
    fn passphrase(&self) -> Result<Option<String>, CliError> {
        let text = if let Some(f) = &self.passphrase_file {
            std::fs::read_to_string(f).map_err(|e| CliError::usage(format!("--passphrase-file {}: {e}", f.display())))?
        } else if self.passphrase_stdin {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map_err(|e| CliError::usage(format!("--passphrase-stdin: {e}")))?;
            line
        } else if let Some(var) = &self.passphrase_env {
            std::env::var(var).map_err(|_| CliError::usage(format!("--passphrase-env {var}: the variable is not set")))?
        } else {
            return Ok(None);
        };
        let first = text.lines().next().unwrap_or("").to_string();
        if first.is_empty() {
            return Err(CliError::usage("the passphrase is empty"));
        }
        Ok(Some(first))
    }
}

/// The answer of `POST /api/v1/links` the CLI reads.
#[derive(Deserialize)]
struct Link {
    id: String,
    url: String,
    expires_at: String,
    #[serde(default)]
    state: String,
}

/// A link to make: a `share` of `files`, or a `request`.
pub struct NewLink<'a> {
    pub kind: &'a str,
    pub files: &'a [String],
    pub opts: &'a LinkOptions,
    /// `max_downloads` (a share), `max_files` (a request).
    pub limits: (Option<u32>, Option<u32>),
    pub ttl: Duration,
}

/// Make `link` and print its page's URL on stdout; what it is, on stderr. `json`: the
/// server's JSON instead.
pub async fn create(client: &Client, retry_for: Duration, link: NewLink<'_>, json: bool) -> Result<(), CliError> {
    let NewLink { kind, files, opts, limits, ttl } = link;
    let mut body = serde_json::json!({ "kind": kind, "ttl_ms": u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX) });
    if !files.is_empty() {
        body["files"] = files.into();
    }
    if let Some(m) = &opts.message {
        body["message"] = m.as_str().into();
    }
    if let Some(p) = opts.passphrase()? {
        body["passphrase"] = p.into();
    }
    if let Some(n) = limits.0 {
        body["max_downloads"] = n.into();
    }
    if let Some(n) = limits.1 {
        body["max_files"] = n.into();
    }
    let answer = client.api(&mut Retry::new(retry_for), reqwest::Method::POST, "/links", &[], Some(body.to_string())).await?;
    if json {
        return print_line(answer.trim_end());
    }
    let link: Link = serde_json::from_str(&answer)
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("the server's answer has no link ({e}): {}", answer.trim())))?;
    let what = match (kind, limits.0) {
        ("request", _) => format!("a request for up to {} files", limits.1.map_or("20".to_string(), |n| n.to_string())),
        (_, Some(1)) => format!("a one-time link to {} file{}", files.len(), if files.len() == 1 { "" } else { "s" }),
        (_, Some(n)) => format!("a link to {} file{} for {n} downloads", files.len(), if files.len() == 1 { "" } else { "s" }),
        _ => format!("a link to {} file{}", files.len(), if files.len() == 1 { "" } else { "s" }),
    };
    let lock = if body.get("passphrase").is_some() { ", behind the passphrase" } else { "" };
    eprintln!(
        "ferry: link {}: {what}{lock}, valid until {}; `ferry share --revoke {}` turns it off. Send this link:",
        link.id, link.expires_at, link.id
    );
    print_line(client.resolve(&link.url)?.as_str())
}

/// Revoke each link (an id, or its `…/l/ID` URL); prints each on stderr.
pub async fn revoke(client: &Client, retry_for: Duration, links: &[String]) -> Result<(), CliError> {
    for l in links {
        let id = l.trim_end_matches('/').rsplit('/').next().unwrap_or(l);
        super::client::id_segment(id)?;
        let answer = client.api(&mut Retry::new(retry_for), reqwest::Method::POST, &format!("/links/{id}/revoke"), &[], Some(String::new())).await?;
        let link: Link = serde_json::from_str(&answer)
            .map_err(|e| CliError::new(EXIT_FAILURE, format!("the server's answer has no link ({e}): {}", answer.trim())))?;
        eprintln!("ferry: link {} is {}: its page, downloads and uploads stop now", link.id, link.state);
    }
    Ok(())
}
