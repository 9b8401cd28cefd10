//! `ferry download ID|URL [-o PATH]`: a resumable, verified download (`--follow`, of a file
//! still arriving: [`super::follow`]).
//!
//! Bytes go to `PATH.part`; next to it `PATH.part.json` remembers the URL and the strong
//! `ETag` they came from. A re-run (or a retry after a dropped connection) asks only for the
//! rest: `Range: bytes=N-` (RFC 9110 §14.2) with `If-Range: <etag>` (RFC 9110 §13.1.5), so a
//! file that changed on the server is sent whole instead of being spliced. The sha256 is
//! computed over every byte written (the kept prefix is re-read on resume) and compared with
//! the server's `Repr-Digest: sha-256=:…:` (RFC 9530 §2); only then is `PATH.part` renamed to
//! `PATH`. A mismatch deletes the partial file and exits with code 4.
//!
//! The rename never replaces anything but a regular file: a symlink `PATH` is followed (the
//! `.part` file goes next to its target, which the rename replaces), and an existing `PATH`
//! that is a character device or FIFO (`-o /dev/null` to only verify) is written straight
//! into — no `.part`, no rename, no resume. A block device is written into only with
//! `--force`. A regular file replaced with `--force` keeps its permissions (and, when
//! allowed, its owner).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use ferry_tus::ContentRange;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::client::{
    describe, exit_codes_help, header_str, id_of, parse_duration, print_line, repr_digest_sha256, stdout_error, typed_header, CliError, Client,
    Connection, Retry, EXIT_FAILURE, EXIT_NETWORK, EXIT_USAGE, EXIT_VERIFY,
};
use super::progress::Progress;

/// A read that sends nothing for this long fails (and is retried).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// `ferry download`: fetch a finished file, resuming a partial one, and verify its sha256.
#[derive(Debug, Args)]
#[command(after_help = exit_codes_help())]
pub struct DownloadArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// A ferry link: file id, file URL, signed URL or page link (`…/share/ID`) from `ferry
    /// share` — each means the file itself; another URL must declare a sha256 (`Repr-Digest`).
    #[arg(value_name = "ID|URL")]
    pub target: String,
    /// Where to write (`-` for stdout, which cannot resume). Default: the file's name from the
    /// server (`Content-Disposition`), else its id, in the current directory; an existing
    /// directory gets that name inside it. A symlink is followed; an existing character device
    /// or FIFO (e.g. `/dev/null`, to only verify) is written into directly, without resuming.
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Replace PATH if it is an existing regular file (keeping its permissions), or write into
    /// it if it is a block device.
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
    /// Keep the bytes even when the server declares no sha256 (`Repr-Digest`) to check them
    /// against (without it such a download fails with exit code 4).
    #[arg(long)]
    pub no_verify: bool,
    /// Download a file that may still be arriving (an upload in progress, a task's output
    /// being written): its bytes as they are committed, until it is complete; then its sha256
    /// (the server's `Repr-Digest` trailer) is checked. Fails (exit 4) when the file is
    /// abandoned, terminated or expires before it is complete.
    #[arg(long, conflicts_with = "no_verify")]
    pub follow: bool,
}

/// Run `ferry download`; returns the process exit code.
pub fn run(args: DownloadArgs) -> std::process::ExitCode {
    super::client::run_interruptible("The part already saved stays: run the same command again to continue from there.", || execute(args))
}

/// What the server says about the file before the transfer.
#[derive(Clone)]
pub(super) struct Probe {
    pub(super) total: u64,
    pub(super) etag: Option<String>,
    pub(super) sha256: Option<String>,
    pub(super) filename: Option<String>,
    /// `Content-Type`'s media type, for messages.
    pub(super) content_type: Option<String>,
}

/// Sidecar of a partial download.
#[derive(Serialize, Deserialize, PartialEq)]
struct PartInfo {
    url: String,
    etag: String,
}

#[derive(Serialize)]
pub(super) struct Done {
    pub(super) path: String,
    pub(super) url: String,
    pub(super) size: u64,
    pub(super) sha256: String,
    /// Bytes of `PATH.part` kept from an earlier run.
    pub(super) resumed_from: u64,
    /// Bytes received by this run.
    pub(super) received: u64,
}

/// The sha256 of a local file, lowercase hex (a local check, not transfer: no progress).
async fn sha256_of(path: &Path) -> Result<String, CliError> {
    let io = |e: std::io::Error| CliError::new(EXIT_FAILURE, format!("cannot read {}: {e}", path.display()));
    let mut f = tokio::fs::File::open(path).await.map_err(io)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).await.map_err(io)?;
        if n == 0 {
            return Ok(hex::encode(h.finalize()));
        }
        h.update(&buf[..n]);
    }
}

/// Where the bytes go.
pub(super) enum Output {
    /// Nothing to do: PATH is already the server's file.
    Verified(PathBuf),
    Stdout,
    /// An existing device or FIFO, written into directly (no `.part`, no rename, no resume).
    Direct(PathBuf),
    /// `PATH.part`, renamed to `PATH` once verified (`PATH` has no symlink left to follow).
    Part(PathBuf),
}

/// At most this many symlinks are followed (like the kernel's `ELOOP` limit).
const MAX_SYMLINKS: usize = 40;

/// `path` with every symlink it names followed (also a dangling one: its target is where the
/// file will be created).
fn follow_symlinks(path: &Path) -> Result<PathBuf, CliError> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_SYMLINKS {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target =
                    std::fs::read_link(&p).map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot read the symlink {}: {e}", p.display())))?;
                p = match p.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(CliError::usage(format!("{}: too many levels of symbolic links", path.display())))
}

/// Decide what to do with the output path (see the module docs). An existing regular file
/// that already is the server's file (same length, same sha256 as its `Repr-Digest`) needs
/// nothing: [`Output::Verified`].
pub(super) async fn output_for(path: &Path, force: bool, probe: &Probe) -> Result<Output, CliError> {
    use std::os::unix::fs::FileTypeExt as _;
    let resolved = follow_symlinks(path)?;
    let md = match std::fs::metadata(&resolved) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Said before any byte moves, not as a failure to create `PATH.part` later.
            if path.as_os_str().as_encoded_bytes().ends_with(b"/") {
                return Err(CliError::new(EXIT_USAGE, format!("{} is not an existing directory", path.display()))
                    .hint("Create the directory first, or give -o a file name."));
            }
            let dir = resolved.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            if !std::fs::metadata(dir).is_ok_and(|m| m.is_dir()) {
                return Err(CliError::new(EXIT_USAGE, format!("{}: the directory {} does not exist", path.display(), dir.display()))
                    .hint("Create the directory first, or give -o a path in an existing one."));
            }
            return Ok(Output::Part(resolved));
        }
        Err(e) => return Err(CliError::new(EXIT_FAILURE, format!("cannot inspect {}: {e}", path.display()))),
    };
    let ft = md.file_type();
    if ft.is_file() {
        if !force {
            if let Some(want) = probe.sha256.as_deref().filter(|_| md.len() == probe.total) {
                if sha256_of(&resolved).await? == want {
                    return Ok(Output::Verified(resolved));
                }
                return Err(CliError::new(
                    EXIT_USAGE,
                    format!("{} already exists, and is not the server's file (its sha256 differs)", path.display()),
                )
                .hint("Pass --force to overwrite it, or -o PATH to write elsewhere."));
            }
            return Err(CliError::new(EXIT_USAGE, format!("{} already exists", path.display()))
                .hint("Pass --force to overwrite it, or -o PATH to write elsewhere."));
        }
        return Ok(Output::Part(resolved));
    }
    if ft.is_char_device() || ft.is_fifo() {
        return Ok(Output::Direct(resolved));
    }
    if ft.is_block_device() {
        if !force {
            return Err(CliError::new(EXIT_USAGE, format!("{} is a block device", path.display())).hint("Pass --force to write the file onto it."));
        }
        return Ok(Output::Direct(resolved));
    }
    if ft.is_dir() {
        return Err(CliError::new(EXIT_USAGE, format!("{} is a directory", path.display())).hint("Pass -o DIR/NAME."));
    }
    Err(CliError::new(EXIT_USAGE, format!("{} exists and is not a regular file, device or FIFO", path.display())))
}

async fn execute(args: DownloadArgs) -> Result<(), CliError> {
    if args.follow {
        return super::follow::execute(args).await;
    }
    let mut client = Client::new(&args.conn, READ_TIMEOUT)?;
    let url = client.file_url(&args.target)?;
    // A URL of another server (a signed link): the first contact goes to that one.
    client.discover_at(&url);
    let mut retry = Retry::new(args.retry_for);
    let probe = probe(&client, &mut retry, &url).await?;
    if probe.sha256.is_none() && probe.total > 0 && !args.no_verify {
        // Bytes that cannot be checked are not a download (a page link's HTML is not the file;
        // an empty file has no byte to check: ferry answers its probe 416 without a digest).
        let kind = probe.content_type.as_deref().map(|t| format!(", {t}")).unwrap_or_default();
        return Err(CliError::new(
            EXIT_VERIFY,
            format!("{url} declares no sha256 (Repr-Digest{kind}), so its bytes cannot be verified; nothing was written"),
        )
        .hint("Pass a ferry link (a file id, …/files/ID, a signed link or a …/share/ID page link), or --no-verify to keep unverified bytes."));
    }
    let server_name = || PathBuf::from(probe.filename.clone().unwrap_or_else(|| id_of(&url)));
    let (shown, output) = match &args.output {
        Some(p) if p.as_os_str() == "-" => (PathBuf::from("-"), Output::Stdout),
        Some(p) => {
            // `-o DIR` (not a symlink to a device): the server's name inside it.
            let p = if std::fs::metadata(p).is_ok_and(|m| m.is_dir()) { p.join(server_name()) } else { p.clone() };
            let o = output_for(&p, args.force, &probe).await?;
            (p, o)
        }
        None => {
            let p = server_name();
            let o = output_for(&p, args.force, &probe).await?;
            (p, o)
        }
    };
    let label = match output {
        Output::Stdout => id_of(&url),
        _ => shown.display().to_string(),
    };
    if let Output::Verified(path) = &output {
        // A re-run after the download finished: PATH already is the server's file.
        let done = Done {
            path: shown.display().to_string(),
            url: url.to_string(),
            size: probe.total,
            sha256: probe.sha256.clone().unwrap_or_default(),
            resumed_from: probe.total,
            received: 0,
        };
        if !args.quiet {
            eprintln!("ferry: {}: already downloaded (same size and sha256 as the server's file); nothing to do", path.display());
        }
        return if args.json {
            print_line(&serde_json::to_string(&done).expect("serialises"))
        } else {
            print_line(&format!("{}\t{}", done.path, done.sha256))
        };
    }
    let progress = Progress::new(&label, probe.total, 0, args.quiet);
    let result = transfer(&client, &mut retry, &url, &probe, &output, &progress).await;
    progress.finish();
    let (resumed_from, received, local) = result?;
    if let Some(server) = &probe.sha256 {
        if *server != local {
            let hint = match &output {
                Output::Part(path) => {
                    let _ = std::fs::remove_file(part_path(path));
                    let _ = std::fs::remove_file(info_path(path));
                    "The partial file was deleted; re-run to download it again. If it fails again the server's \
                     own copy no longer matches its sha256: ask the operator to run `ferry check` on it."
                }
                _ => {
                    "Re-run to download it again. If it fails again the server's own copy no \
                     longer matches its sha256: ask the operator to run `ferry check` on it."
                }
            };
            return Err(CliError::new(EXIT_VERIFY, format!("sha256 mismatch: received {local}, the server declares {server} for {url}")).hint(hint));
        }
    } else if probe.total > 0 {
        eprintln!("ferry: warning: the server sent no Repr-Digest for {url}; the sha256 {local} is not verified (--no-verify)");
    }
    match &output {
        Output::Stdout => return Ok(()),
        Output::Direct(_) | Output::Verified(_) => {}
        Output::Part(path) => {
            replace(&part_path(path), path)?;
            let _ = std::fs::remove_file(info_path(path));
        }
    }
    let done = Done { path: shown.display().to_string(), url: url.to_string(), size: probe.total, sha256: local, resumed_from, received };
    if args.json {
        print_line(&serde_json::to_string(&done).expect("serialises"))
    } else {
        print_line(&format!("{}\t{}", done.path, done.sha256))
    }
}

/// Rename the verified `part` to `path`, which must be missing or a regular file (never a
/// symlink, device or FIFO that appeared since); a replaced file's mode (and owner, when
/// allowed) carry over.
pub(super) fn replace(part: &Path, path: &Path) -> Result<(), CliError> {
    use std::os::unix::fs::MetadataExt as _;
    let fail = |e: std::io::Error| CliError::new(EXIT_FAILURE, format!("cannot rename {} to {}: {e}", part.display(), path.display()));
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => {
            // Only root may give a file away; for anyone else this fails quietly. (Before the
            // mode: chown clears set-user-ID bits.)
            let _ = std::os::unix::fs::chown(part, Some(m.uid()), Some(m.gid()));
            std::fs::set_permissions(part, m.permissions()).map_err(fail)?;
        }
        Ok(_) => {
            return Err(CliError::new(
                EXIT_FAILURE,
                format!("{} is no longer a regular file; not replacing it (the download is in {})", path.display(), part.display()),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e)),
    }
    std::fs::rename(part, path).map_err(fail)
}

/// `PATH.part`.
pub(super) fn part_path(path: &Path) -> PathBuf {
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
    let what = describe(&reqwest::Method::GET, url);
    let res = client.send_retrying(retry, &what, || client.request(reqwest::Method::GET, url).header("range", "bytes=0-0")).await?;
    let status = res.status().as_u16();
    let h = res.headers().clone();
    let total = match status {
        206 => typed_header::<ContentRange>(&h, "content-range").and_then(|r| r.total()),
        200 => res.content_length(),
        // An empty file: no byte satisfies 0-0 (RFC 9110 §15.5.17).
        416 => typed_header::<ContentRange>(&h, "content-range").filter(|r| *r == ContentRange::Unsatisfied { total: 0 }).map(|_| 0),
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
    // An empty file's 416 carries no representation headers (name, digest, validators): ask for
    // the whole file, which is no bytes, to have them.
    let h = if status == 416 {
        let res = client.send_retrying(retry, &what, || client.request(reqwest::Method::GET, url)).await?;
        if !res.status().is_success() {
            let status = res.status().as_u16();
            return Err(CliError::from_status(&what, status, &res.text().await.unwrap_or_default()));
        }
        res.headers().clone()
    } else {
        h
    };
    Ok(Probe {
        total,
        etag: header_str(&h, "etag").map(str::to_owned).filter(|e| e.starts_with('"')),
        sha256: repr_digest_sha256(&h),
        filename: header_str(&h, "content-disposition").and_then(disposition_filename),
        content_type: header_str(&h, "content-type").map(|t| t.split(';').next().unwrap_or(t).trim().to_string()),
    })
}

/// A safe local file name from `Content-Disposition` (RFC 6266 §4.3): `filename*` (RFC 8187,
/// UTF-8) over `filename`; only the last path component, never `.`/`..` or hidden.
pub(super) fn disposition_filename(cd: &str) -> Option<String> {
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

/// Receive the file into `PATH.part` (or stdout, or a device), resuming and retrying.
/// Returns (resumed_from, received, sha256 hex).
async fn transfer(
    client: &Client,
    retry: &mut Retry,
    url: &reqwest::Url,
    probe: &Probe,
    output: &Output,
    progress: &Progress,
) -> Result<(u64, u64, String), CliError> {
    let mut hasher = Sha256::new();
    let mut pos = 0u64;
    let path = match output {
        Output::Part(p) => Some(p.as_path()),
        _ => None,
    };
    let write_error = |e: std::io::Error| match output {
        Output::Stdout => stdout_error(&e),
        Output::Direct(p) | Output::Part(p) | Output::Verified(p) => {
            CliError::new(EXIT_FAILURE, format!("writing the download to {}: {e}", p.display()))
        }
    };
    let mut out: Box<dyn tokio::io::AsyncWrite + Unpin + Send> = match output {
        Output::Stdout => Box::new(tokio::io::stdout()),
        Output::Verified(_) => unreachable!("a verified PATH is not transferred"),
        Output::Direct(p) => {
            // Never created, truncated or renamed: it is a device or FIFO.
            let f = tokio::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .await
                .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot open {}: {e}", p.display())))?;
            Box::new(f)
        }
        Output::Part(p) => {
            let part = part_path(p);
            let info = PartInfo { url: url.to_string(), etag: probe.etag.clone().unwrap_or_default() };
            let same = std::fs::read(info_path(p))
                .ok()
                .and_then(|b| serde_json::from_slice::<PartInfo>(&b).ok())
                .is_some_and(|old| old == info && !info.etag.is_empty());
            let kept = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
            if same && kept <= probe.total {
                pos = kept;
            }
            let io = |e: std::io::Error| CliError::new(EXIT_FAILURE, format!("cannot write {}: {e}", part.display()));
            std::fs::write(info_path(p), serde_json::to_vec(&info).expect("serialises")).map_err(io)?;
            let mut f = tokio::fs::OpenOptions::new().create(true).read(true).write(true).truncate(false).open(&part).await.map_err(io)?;
            f.set_len(pos).await.map_err(io)?;
            // Replacing a regular file: its bytes are no more readable while they arrive.
            if let Some(m) = std::fs::symlink_metadata(p).ok().filter(|m| m.file_type().is_file()) {
                std::fs::set_permissions(&part, m.permissions()).map_err(io)?;
            }
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
        let what = format!("{} from byte {pos}", describe(&reqwest::Method::GET, url));
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
                let start = match typed_header::<ContentRange>(res.headers(), "content-range") {
                    Some(ContentRange::Bytes { first, .. }) => Some(first),
                    _ => None,
                };
                if start != Some(pos) {
                    return Err(CliError::new(
                        EXIT_FAILURE,
                        format!("{what}: the server answered a different range ({:?})", header_str(res.headers(), "content-range")),
                    ));
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
                    out.write_all(&b).await.map_err(write_error)?;
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
        out.flush().await.map_err(write_error)?;
        if pos < probe.total {
            let err = failed.unwrap_or_else(|| CliError::new(EXIT_NETWORK, format!("{what}: the answer ended at byte {pos} of {}", probe.total)));
            retry.wait(err).await?;
        }
    }
    if let Some(p) = path {
        // Durable before the rename makes it look complete.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(part_path(p))
            .map_err(|e| CliError::new(EXIT_FAILURE, format!("syncing {}: {e}", part_path(p).display())))?;
        f.sync_all().map_err(|e| CliError::new(EXIT_FAILURE, format!("syncing {}: {e}", part_path(p).display())))?;
    }
    Ok((resumed_from, received, hex::encode(hasher.finalize())))
}

/// Truncate the partial file to empty and write from its start again.
async fn restart(out: &mut Box<dyn tokio::io::AsyncWrite + Unpin + Send>, path: Option<&Path>) -> Result<(), CliError> {
    let Some(p) = path else { return Ok(()) };
    out.flush().await.ok();
    let part = part_path(p);
    let f = tokio::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&part)
        .await
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("cannot write {}: {e}", part.display())))?;
    *out = Box::new(f);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filenames_from_disposition() {
        assert_eq!(disposition_filename("inline; filename=\"a.bin\"").as_deref(), Some("a.bin"));
        let both = "attachment; filename=\"r_sum_.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9.pdf";
        assert_eq!(disposition_filename(both).as_deref(), Some("résumé.pdf"));
        assert_eq!(disposition_filename("inline; filename=\"../../etc/passwd\"").as_deref(), Some("passwd"));
        assert_eq!(disposition_filename("inline; filename=\"..\""), None);
        assert_eq!(disposition_filename("inline; filename=\".bashrc\""), None);
        assert_eq!(disposition_filename("inline"), None);
    }
}
