//! `ferry download ID|URL [-o PATH]`: a resumable, verified download.
//!
//! Bytes go to `PATH.part`; next to it `PATH.part.json` remembers the URL and the strong
//! `ETag` they came from. A re-run (or a retry after a dropped connection) asks only for the
//! rest: `Range: bytes=N-` (RFC 9110 §14.2) with `If-Range: <etag>` (RFC 9110 §13.1.5), so a
//! file that changed on the server is sent whole instead of being spliced. The sha256 is
//! computed over every byte written (the kept prefix is re-read on resume) and compared with
//! the server's `Repr-Digest: sha-256=:…:` (RFC 9530 §2); only then is `PATH.part` renamed to
//! `PATH`. A mismatch deletes the partial file and exits with code 4.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::client::{
    header_str, id_of, parse_duration, repr_digest_sha256, CliError, Client, Connection, Retry, EXIT_FAILURE, EXIT_NETWORK, EXIT_USAGE,
    EXIT_VERIFY, TRANSFER_EXIT_CODES,
};
use super::progress::Progress;

/// A read that sends nothing for this long fails (and is retried).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// `ferry download`: fetch a finished file, resuming a partial one, and verify its sha256.
#[derive(Debug, Args)]
#[command(after_help = TRANSFER_EXIT_CODES)]
pub struct DownloadArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// File id, or a URL (e.g. a signed URL from `ferry share`).
    #[arg(value_name = "ID|URL")]
    pub target: String,
    /// Where to write (`-` for stdout, which cannot resume). Default: the file's name from the
    /// server (`Content-Disposition`), else its id, in the current directory.
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Overwrite PATH if it exists.
    #[arg(long)]
    pub force: bool,
    /// Keep retrying network errors and 5xx for this long without progress, then give up with
    /// exit code 5 (re-run the command to resume).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration)]
    pub retry_for: Duration,
    /// Print a JSON object (path, url, size, sha256, resumed_from, received) instead of
    /// `PATH<TAB>SHA256`.
    #[arg(long)]
    pub json: bool,
    /// No progress output on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Run `ferry download`; returns the process exit code.
pub fn run(args: DownloadArgs) -> std::process::ExitCode {
    super::client::run_command(|| execute(args))
}

/// What the server says about the file before the transfer.
struct Probe {
    total: u64,
    etag: Option<String>,
    sha256: Option<String>,
    filename: Option<String>,
}

/// Sidecar of a partial download.
#[derive(Serialize, Deserialize, PartialEq)]
struct PartInfo {
    url: String,
    etag: String,
}

#[derive(Serialize)]
struct Done {
    path: String,
    url: String,
    size: u64,
    sha256: String,
    /// Bytes of `PATH.part` kept from an earlier run.
    resumed_from: u64,
    /// Bytes received by this run.
    received: u64,
}

async fn execute(args: DownloadArgs) -> Result<(), CliError> {
    let client = Client::new(&args.conn, READ_TIMEOUT)?;
    let url = client.file_url(&args.target)?;
    let mut retry = Retry::new(args.retry_for);
    let probe = probe(&client, &mut retry, &url).await?;
    let to_stdout = args.output.as_deref() == Some(Path::new("-"));
    let path = match &args.output {
        Some(p) => p.clone(),
        None => PathBuf::from(probe.filename.clone().unwrap_or_else(|| id_of(&url))),
    };
    let label = if to_stdout { id_of(&url) } else { path.display().to_string() };
    if !to_stdout && path.exists() && !args.force {
        return Err(CliError::new(EXIT_USAGE, format!("{} already exists", path.display())).hint("Pass --force to overwrite it, or -o PATH to write elsewhere."));
    }
    let progress = Progress::new(&label, probe.total, 0, args.quiet);
    let result = transfer(&client, &mut retry, &url, &probe, if to_stdout { None } else { Some(&path) }, &progress).await;
    progress.finish();
    let (resumed_from, received, local) = result?;
    if let Some(server) = &probe.sha256 {
        if *server != local {
            if !to_stdout {
                let _ = std::fs::remove_file(part_path(&path));
                let _ = std::fs::remove_file(info_path(&path));
            }
            return Err(CliError::new(EXIT_VERIFY, format!("sha256 mismatch: received {local}, the server declares {server} for {url}"))
                .hint("The partial file was deleted; re-run to download it again."));
        }
    } else {
        eprintln!("ferry: warning: the server sent no Repr-Digest for {url}; the sha256 {local} is not verified");
    }
    if to_stdout {
        return Ok(());
    }
    std::fs::rename(part_path(&path), &path).map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot rename {} to {}: {e}", part_path(&path).display(), path.display())))?;
    let _ = std::fs::remove_file(info_path(&path));
    let done = Done { path: path.display().to_string(), url: url.to_string(), size: probe.total, sha256: local, resumed_from, received };
    if args.json {
        println!("{}", serde_json::to_string(&done).expect("serialises"));
    } else {
        println!("{}\t{}", done.path, done.sha256);
    }
    Ok(())
}

/// `PATH.part`.
fn part_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".part");
    PathBuf::from(s)
}

/// `PATH.part.json`.
fn info_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".part.json");
    PathBuf::from(s)
}

/// `GET` the first byte (`Range: bytes=0-0`): length, validators, digest and file name
/// without transferring the body.
async fn probe(client: &Client, retry: &mut Retry, url: &reqwest::Url) -> Result<Probe, CliError> {
    let what = format!("GET {url}");
    let res = client.send_retrying(retry, &what, || client.request(reqwest::Method::GET, url).header("range", "bytes=0-0")).await?;
    let status = res.status().as_u16();
    let h = res.headers().clone();
    let total = match status {
        206 => header_str(&h, "content-range").and_then(|v| v.rsplit('/').next()).and_then(|t| t.parse().ok()),
        200 => res.content_length(),
        // An empty file: no byte satisfies 0-0 (RFC 9110 §15.5.17).
        416 => header_str(&h, "content-range").filter(|v| v.trim() == "bytes */0").map(|_| 0),
        _ => None,
    };
    let Some(total) = total else {
        let body = res.text().await.unwrap_or_default();
        if (200..300).contains(&status) {
            return Err(CliError::new(EXIT_FAILURE, format!("{what}: HTTP {status} without a usable length")));
        }
        return Err(CliError::from_status(&what, status, &body));
    };
    drop(res);
    Ok(Probe {
        total,
        etag: header_str(&h, "etag").map(str::to_owned).filter(|e| e.starts_with('"')),
        sha256: repr_digest_sha256(&h),
        filename: header_str(&h, "content-disposition").and_then(disposition_filename),
    })
}

/// A safe local file name from `Content-Disposition` (RFC 6266 §4.3): `filename*` (RFC 8187,
/// UTF-8) over `filename`; only the last path component, never `.`/`..` or hidden.
fn disposition_filename(cd: &str) -> Option<String> {
    let mut plain = None;
    let mut ext = None;
    for param in cd.split(';').skip(1) {
        let Some((k, v)) = param.trim().split_once('=') else { continue };
        match k.trim().to_ascii_lowercase().as_str() {
            "filename*" => {
                let v = v.trim();
                if let Some(rest) = v.strip_prefix("UTF-8''").or_else(|| v.strip_prefix("utf-8''")) {
                    ext = percent_encoding::percent_decode_str(rest).decode_utf8().ok().map(|s| s.into_owned());
                }
            }
            "filename" => plain = Some(v.trim().trim_matches('"').to_string()),
            _ => {}
        }
    }
    let name = ext.or(plain)?;
    let name = name.rsplit(['/', '\\']).next().unwrap_or("").trim().to_string();
    (!name.is_empty() && !name.starts_with('.') && !name.chars().any(char::is_control)).then_some(name)
}

/// Receive the file into `PATH.part` (or stdout), resuming and retrying. Returns
/// (resumed_from, received, sha256 hex).
async fn transfer(client: &Client, retry: &mut Retry, url: &reqwest::Url, probe: &Probe, path: Option<&Path>, progress: &Progress) -> Result<(u64, u64, String), CliError> {
    let mut hasher = Sha256::new();
    let mut pos = 0u64;
    let mut out: Box<dyn tokio::io::AsyncWrite + Unpin + Send> = match path {
        None => Box::new(tokio::io::stdout()),
        Some(p) => {
            let part = part_path(p);
            let info = PartInfo { url: url.to_string(), etag: probe.etag.clone().unwrap_or_default() };
            let same = std::fs::read(info_path(p)).ok().and_then(|b| serde_json::from_slice::<PartInfo>(&b).ok()).is_some_and(|old| old == info && !info.etag.is_empty());
            let kept = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
            if same && kept <= probe.total {
                pos = kept;
            }
            let io = |e: std::io::Error| CliError::new(EXIT_FAILURE, format!("cannot write {}: {e}", part.display()));
            std::fs::write(info_path(p), serde_json::to_vec(&info).expect("serialises")).map_err(io)?;
            let mut f = tokio::fs::OpenOptions::new().create(true).read(true).write(true).truncate(false).open(&part).await.map_err(io)?;
            f.set_len(pos).await.map_err(io)?;
            if pos > 0 {
                progress.note(&format!("resuming at byte {pos} of {}", probe.total));
                let mut buf = vec![0u8; 1 << 20];
                let mut left = pos;
                while left > 0 {
                    let n = f.read(&mut buf[..(left as usize).min(1 << 20)]).await.map_err(io)?;
                    if n == 0 {
                        return Err(CliError::new(EXIT_FAILURE, format!("{} became shorter while it was read", part.display())));
                    }
                    hasher.update(&buf[..n]);
                    left -= n as u64;
                }
            }
            Box::new(f)
        }
    };
    let resumed_from = pos;
    let mut received = 0u64;
    progress.set(pos, false);
    while pos < probe.total {
        let what = format!("GET {url} from byte {pos}");
        let res = client
            .send_retrying(retry, &what, || {
                let mut r = client.request(reqwest::Method::GET, url);
                if pos > 0 {
                    r = r.header("range", format!("bytes={pos}-"));
                    if let Some(e) = &probe.etag {
                        r = r.header("if-range", e);
                    }
                }
                r
            })
            .await?;
        let status = res.status().as_u16();
        match status {
            200 => {
                if pos > 0 {
                    // The validator no longer matches (or Range was ignored): start over.
                    progress.note("the server sent the whole file; starting over");
                    if path.is_none() {
                        return Err(CliError::new(EXIT_FAILURE, "the file changed on the server during the download"));
                    }
                    hasher = Sha256::new();
                    pos = 0;
                    received = 0;
                    restart(&mut out, path).await?;
                    progress.set(0, false);
                }
            }
            206 => {
                let start = header_str(res.headers(), "content-range").and_then(|v| v.strip_prefix("bytes ")).and_then(|v| v.split('-').next()).and_then(|s| s.parse::<u64>().ok());
                if start != Some(pos) {
                    return Err(CliError::new(EXIT_FAILURE, format!("{what}: the server answered a different range ({:?})", header_str(res.headers(), "content-range"))));
                }
            }
            _ => {
                let body = res.text().await.unwrap_or_default();
                return Err(CliError::from_status(&what, status, &body));
            }
        }
        if res.headers().get("etag").and_then(|v| v.to_str().ok()) != probe.etag.as_deref() && probe.etag.is_some() {
            return Err(CliError::new(EXIT_FAILURE, "the file changed on the server during the download").hint("Re-run to download the new version."));
        }
        let mut body = res.bytes_stream();
        let mut failed = None;
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(b) => {
                    let b = if pos + b.len() as u64 > probe.total { b.slice(..(probe.total - pos) as usize) } else { b };
                    out.write_all(&b).await.map_err(|e| CliError::new(EXIT_FAILURE, format!("writing the download: {e}")))?;
                    hasher.update(&b);
                    pos += b.len() as u64;
                    received += b.len() as u64;
                    progress.inc(b.len() as u64);
                    retry.success();
                }
                Err(e) => {
                    failed = Some(CliError::network(&what, &e));
                    break;
                }
            }
        }
        out.flush().await.map_err(|e| CliError::new(EXIT_FAILURE, format!("writing the download: {e}")))?;
        if pos < probe.total {
            let err = failed.unwrap_or_else(|| CliError::new(EXIT_NETWORK, format!("{what}: the answer ended at byte {pos} of {}", probe.total)));
            retry.wait(err).await?;
        }
    }
    if let Some(p) = path {
        // Durable before the rename makes it look complete.
        let f = std::fs::OpenOptions::new().write(true).open(part_path(p)).map_err(|e| CliError::new(EXIT_FAILURE, format!("syncing {}: {e}", part_path(p).display())))?;
        f.sync_all().map_err(|e| CliError::new(EXIT_FAILURE, format!("syncing {}: {e}", part_path(p).display())))?;
    }
    Ok((resumed_from, received, hex::encode(hasher.finalize())))
}

/// Truncate the partial file to empty and write from its start again.
async fn restart(out: &mut Box<dyn tokio::io::AsyncWrite + Unpin + Send>, path: Option<&Path>) -> Result<(), CliError> {
    let Some(p) = path else { return Ok(()) };
    out.flush().await.ok();
    let part = part_path(p);
    let f = tokio::fs::OpenOptions::new().write(true).truncate(true).open(&part).await.map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot write {}: {e}", part.display())))?;
    *out = Box::new(f);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filenames_from_disposition() {
        assert_eq!(disposition_filename("inline; filename=\"a.bin\"").as_deref(), Some("a.bin"));
        assert_eq!(disposition_filename("attachment; filename=\"r_sum_.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9.pdf").as_deref(), Some("résumé.pdf"));
        assert_eq!(disposition_filename("inline; filename=\"../../etc/passwd\"").as_deref(), Some("passwd"));
        assert_eq!(disposition_filename("inline; filename=\"..\""), None);
        assert_eq!(disposition_filename("inline; filename=\".bashrc\""), None);
        assert_eq!(disposition_filename("inline"), None);
    }
}
