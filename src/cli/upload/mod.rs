//! `ferry upload FILE...`: a resumable TUS 1.0 client.
//!
//! - **Resumable.** The upload URL of each file is remembered in the URL store
//!   ([`super::store`]) under a fingerprint of what the server will hold: the server, the
//!   token's identity, the name the upload gets (`--name`, `--meta filename=…`, else FILE's
//!   own name, not its target's: two symlinks to one file are two uploads), and the canonical
//!   path, size and modification time of the content. Re-running the same command HEADs the stored
//!   URL (TUS 1.0 §HEAD) and continues from the server's `Upload-Offset`; a finished upload is
//!   only verified again. A remembered upload created with other `--meta` is not resumed.
//! - **Retries** network errors, 5xx, 423 and 429 with exponential backoff (at least an
//!   answer's `Retry-After`, RFC 9110 §10.2.3) until `--retry-for` has passed without progress
//!   (then exit code 5); after a failed PATCH a HEAD tells what the server kept (TUS 1.0 §PATCH:
//!   the offset is authoritative).
//! - **Verified.** The file's sha256 is computed while its bytes are sent; on resume the
//!   prefix already on the server is re-read locally (a snapshot of the hash state is kept
//!   every 16 MiB, so a failed request re-reads at most that much). At the end the local
//!   sha256 must equal the server's `Repr-Digest: sha-256=:…:` (RFC 9530 §2) of the finished
//!   upload, and the file's size and modification time must be what they were at the start,
//!   else exit code 4. A `460 checksum_mismatch` (the bytes do not match a declared
//!   `--meta sha256=…`) forgets and deletes the server upload, so the next run starts afresh.
//! - **`--parallel N`** creates N partial uploads (`Upload-Concat: partial`, TUS 1.0
//!   §Concatenation), sends them side by side, then creates the final upload
//!   (`Upload-Concat: final;/files/a /files/b …`); the whole-file sha256 is then computed by
//!   one sequential read running alongside the parts. Once the final upload verifies, the
//!   partial uploads are deleted (TUS 1.0 §Termination).

use std::io::SeekFrom;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use ferry_tus::{UploadLength, UploadMetadata, UploadOffset};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::client::{
    describe, exit_codes_help, id_of, parse_duration, parse_size, print_line, repr_digest_sha256, token_identity, typed_header, CliError, Client,
    Connection, Retry, EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_VERIFY,
};
use super::progress::Progress;
use super::store::{fingerprint, Store};

mod parallel;
mod send;

use parallel::concatenated;
use send::{push, Hashing};

/// `Tus-Resumable` value of every request (TUS 1.0 §Tus-Resumable).
pub const TUS_VERSION: &str = "1.0.0";
/// PATCH body media type (TUS 1.0 §PATCH).
pub(super) const OFFSET_OCTET_STREAM: &str = "application/offset+octet-stream";
/// A snapshot of the sha256 state is kept every this many bytes, in bytes.
const SNAPSHOT_EVERY: u64 = 16 << 20;
/// Read size for request bodies and local hashing, in bytes.
pub(super) const READ_CHUNK: usize = 256 << 10;
/// A request whose answer sends nothing for this long fails (and is retried).
const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// Most parts for `--parallel`.
const MAX_PARALLEL: usize = 64;

/// `ferry upload`: send files to a ferry server (TUS 1.0), resumably, and verify them.
#[derive(Debug, Args)]
#[command(after_help = exit_codes_help())]
pub struct UploadArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// Files to upload, one after the other. `-` reads standard input, and a path that is a
    /// pipe, FIFO or device (`/dev/stdin`) is read the same way: an upload of unknown length
    /// (TUS creation-defer-length) sent in --chunk-size pieces (default 16 MiB, held in memory
    /// so a failed request is sent again), whose length is declared with the last piece.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Send FILE into this existing upload instead of creating one, continuing from the
    /// server's offset: a signed upload URL (`ferry share ID --scope upload`, MCP
    /// `file_upload_begin`'s `upload_url`, or its `/share/…` page link), or a `/files/ID` URL
    /// of yours. With `-`, the bytes the server already has are read from stdin again, not
    /// sent, and checked by the final sha256.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// The name stored with the upload (metadata `filename`). Default: FILE's name (none
    /// for `-`). The media type (`filetype`) is guessed from this name unless --meta gives one.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Bytes per PATCH request (e.g. 1048576, 8MiB). Default: the rest of the file in one
    /// request (the server checkpoints a long request on its own).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub chunk_size: Option<u64>,
    /// Split each file into N partial uploads sent side by side, then join them on the server
    /// (TUS concatenation). 1 to 64.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub parallel: usize,
    /// Upload metadata KEY=VALUE (repeatable); `filename` defaults to the file's name.
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    pub meta: Vec<String>,
    /// Keep retrying network errors, 5xx and 423 for this long without progress, then give
    /// up with exit code 5 (re-run the command to resume).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration)]
    pub retry_for: Duration,
    /// Ignore a remembered upload of the same file: start a new upload.
    #[arg(long)]
    pub fresh: bool,
    /// Print one JSON object per file (file, id, url, size, sha256, resumed_from, sent; and
    /// upload_url when it was sent through a signed upload URL)
    /// instead of `URL<TAB>SHA256`.
    #[arg(long)]
    pub json: bool,
    /// No progress output on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Run `ferry upload`; returns the process exit code (the first failure's, after trying
/// every file).
pub fn run(args: UploadArgs) -> std::process::ExitCode {
    super::client::run_interruptible(
        "The server keeps what it received: run the same command again to continue \
         from there (for standard input, the `--url` command printed above).",
        || execute(args),
    )
}

async fn execute(args: UploadArgs) -> Result<(), CliError> {
    if args.parallel == 0 || args.parallel > MAX_PARALLEL {
        return Err(CliError::usage(format!("--parallel must be 1 to {MAX_PARALLEL}, got {}", args.parallel)));
    }
    if args.chunk_size == Some(0) {
        return Err(CliError::usage("--chunk-size must be at least 1 byte"));
    }
    let metadata = metadata_pairs(&args.meta)?;
    if args.files.iter().filter(|f| f.as_os_str() == "-").count() > 1 {
        return Err(CliError::usage("`-` (standard input) can be given once"));
    }
    if let Some(n) = &args.name {
        if n.is_empty() || metadata.iter().any(|(k, _)| k == "filename") {
            return Err(CliError::usage("--name must be a non-empty name, and not given together with --meta filename=…"));
        }
    }
    let mut client = Client::new(&args.conn, READ_TIMEOUT)?;
    if let Some(u) = &args.url {
        if args.files.len() != 1 || args.parallel != 1 || !metadata.is_empty() || args.name.is_some() || args.fresh {
            return Err(CliError::usage(
                "--url takes one FILE, and no --parallel, --meta, --name or --fresh (the upload already exists, with its metadata)",
            ));
        }
        let url = upload_url(u)?;
        client.discover_at(&url);
        let path = &args.files[0];
        let done = if is_stream(path)? {
            super::stream::upload(&client, &args, None, path, Some(url)).await
        } else {
            let store = Store::open()?;
            upload_one(&client, &store, None, &args, &[], path, Some(url)).await
        };
        let done = done.map_err(|e| CliError { message: format!("{}: {}", path.display(), e.message), ..e })?;
        return print_done(&args, &done);
    }
    let identity = token_identity(args.conn.token().as_deref());
    let store = Store::open()?;
    let mut first_err: Option<CliError> = None;
    for path in &args.files {
        let result = match is_stream(path) {
            Err(e) => Err(e),
            Ok(true) if args.parallel > 1 => Err(CliError::usage("--parallel needs a regular file (a pipe can be read only once, in order)")),
            Ok(true) => {
                super::stream::upload(&client, &args, Some(metadata_header(display_name(&args, path).as_deref(), &metadata)), path, None).await
            }
            Ok(false) => upload_one(&client, &store, Some(&identity), &args, &metadata, path, None).await,
        };
        match result {
            Ok(done) => print_done(&args, &done)?,
            Err(e) => {
                let e = CliError { message: format!("{}: {}", path.display(), e.message), ..e };
                if args.files.len() > 1 {
                    e.print();
                }
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) if args.files.len() > 1 => Err(CliError::new(e.code, "some files were not uploaded (see above)")),
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Print one uploaded file: `URL<TAB>SHA256`, or the JSON object with `--json`.
///
/// An upload sent through a signed upload URL (an upload-only token's creations, `--url` of a
/// request link) prints the file's plain URL, never the signed one: that one only lets its
/// holder send bytes into this upload, and read as a link to share it would fail whoever got it.
/// A note on stderr says so and how a link to share is made; `--json` keeps the signed URL as
/// `upload_url`.
fn print_done(args: &UploadArgs, done: &Done) -> Result<(), CliError> {
    let mut done = done.clone();
    if let Some(plain) = unsigned(&done.url) {
        done.upload_url = Some(std::mem::replace(&mut done.url, plain));
        eprintln!(
            "ferry: note: {} was sent through a signed upload URL (an upload-only token, or a request link), \
             which lets its holder only send bytes into this upload: it is no link to share. {} names the \
             file; a link to download it is made by its owner, with a full token: `ferry share {}`.",
            done.file, done.url, done.id
        );
    }
    if args.json {
        print_line(&serde_json::to_string(&done).expect("serialises"))
    } else {
        print_line(&format!("{}\t{}", done.url, done.sha256))
    }
}

/// `url` without its signature (`?scope=…&exp=…&sig=…`, see `crate::signing`), if it has one.
fn unsigned(url: &str) -> Option<String> {
    let mut u = reqwest::Url::parse(url).ok()?;
    if !u.query_pairs().any(|(k, _)| k == "sig") {
        return None;
    }
    u.set_query(None);
    Some(u.to_string())
}

/// Is FILE read as a stream (`-`, a pipe, FIFO or device) rather than a regular file?
fn is_stream(path: &Path) -> Result<bool, CliError> {
    if path.as_os_str() == "-" {
        return Ok(true);
    }
    let md = std::fs::metadata(path).map_err(|e| local_error(path, e))?;
    if md.is_dir() {
        return Err(CliError::usage(format!("{} is a directory", path.display()))
            .hint("Upload its files, or an archive of it (e.g. `tar c DIR | ferry upload - --name DIR.tar`)."));
    }
    Ok(!md.is_file())
}

/// The `filename` to store: `--name`, else FILE's last component (none for `-`).
pub(super) fn display_name(args: &UploadArgs, path: &Path) -> Option<String> {
    args.name.clone().or_else(|| (path.as_os_str() != "-").then(|| path.file_name().map(|n| n.to_string_lossy().into_owned())).flatten())
}

/// The TUS URL of `--url`: a `/files/{id}` URL as given, or a link page
/// (`/share/{id}?scope=upload&…`) turned into the upload URL it stands for (same signature).
fn upload_url(given: &str) -> Result<reqwest::Url, CliError> {
    let mut url = reqwest::Url::parse(given).map_err(|e| CliError::usage(format!("--url {given:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(CliError::usage(format!("--url must be an http:// or https:// URL, got {given:?}")));
    }
    let path = url.path().to_string();
    if let Some(i) = path.rfind("/share/") {
        let id = path[i + "/share/".len()..].trim_end_matches('/').to_string();
        url.set_path(&format!("{}/files/{id}", &path[..i]));
    }
    if !url.path().contains("/files/") {
        return Err(CliError::usage(format!("--url {given:?} is not an upload URL (…/files/ID or …/share/ID)")));
    }
    Ok(url)
}

/// The `--meta` pairs, checked with ferry-tus's `Upload-Metadata` grammar (the server's):
/// keys non-empty ASCII without spaces or commas, each key once.
fn metadata_pairs(meta: &[String]) -> Result<Vec<(String, String)>, CliError> {
    let mut check = UploadMetadata::new();
    meta.iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').ok_or_else(|| CliError::usage(format!("--meta {kv:?} is not KEY=VALUE")))?;
            check.insert(k, Some(v.as_bytes().to_vec())).map_err(|e| {
                CliError::usage(format!("--meta key {k:?}: {e} (keys are non-empty ASCII without spaces or commas, each given once)"))
            })?;
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

/// Metadata keys ferry reads a media type from (README: "A file's name and media type").
const MEDIA_TYPE_KEYS: [&str; 5] = ["filetype", "contentType", "content-type", "type", "mimetype"];

/// The `Upload-Metadata` header: `filename` (`name`, see [`display_name`]) unless `--meta` gives
/// one, `filetype` guessed from the file name (mime_guess) unless `--meta` gives a media type or
/// the guess is only `application/octet-stream`, then the `--meta` pairs.
pub(super) fn metadata_header(name: Option<&str>, pairs: &[(String, String)]) -> String {
    let mut md = UploadMetadata::new();
    let given_name = pairs.iter().find(|(k, _)| k == "filename").map(|(_, v)| v.as_str());
    if given_name.is_none() {
        if let Some(n) = name {
            let _ = md.insert("filename", Some(n.as_bytes().to_vec()));
        }
    }
    if !pairs.iter().any(|(k, _)| MEDIA_TYPE_KEYS.contains(&k.as_str())) {
        if let Some(guess) = given_name.or(name).map(crate::names::guess_media_type).filter(|m| *m != mime::APPLICATION_OCTET_STREAM) {
            let _ = md.insert("filetype", Some(guess.essence_str().as_bytes().to_vec()));
        }
    }
    for (k, v) in pairs {
        // Checked by `metadata_pairs`.
        let _ = md.insert(k.as_str(), (!v.is_empty()).then(|| v.as_bytes().to_vec()));
    }
    md.to_string()
}

/// What `ferry upload` prints for one file.
#[derive(serde::Serialize, Clone)]
pub(super) struct Done {
    pub(super) file: String,
    pub(super) id: String,
    /// The file's URL (never a signed one: see [`print_done`]).
    pub(super) url: String,
    /// The signed upload URL it was sent through, when it was (`--json` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) upload_url: Option<String>,
    pub(super) size: u64,
    pub(super) sha256: String,
    /// Bytes already on the server when this run started (over all parts).
    pub(super) resumed_from: u64,
    /// Bytes this run put on the wire in PATCH bodies (including any that were re-sent).
    pub(super) sent: u64,
}

/// One local file being uploaded.
struct Job<'a> {
    client: &'a Client,
    store: &'a Store,
    /// The file's key in the URL store; `None` with `--url` (the URL is what is remembered).
    key: Option<String>,
    /// Send `Upload-Length` with every PATCH: the upload's length was deferred (an upload
    /// created without a size, continued with `--url`).
    declare_length: bool,
    /// The `Upload-Metadata` header (of the final upload, with `--parallel`).
    meta: String,
    /// The file as the user named it (for messages).
    display: String,
    path: PathBuf,
    size: u64,
    chunk_size: u64,
    retry_for: Duration,
    progress: Arc<Progress>,
    sent: Arc<AtomicU64>,
    /// Server offset of each part, by the part's first byte in the file.
    part_offsets: Mutex<std::collections::BTreeMap<u64, u64>>,
}

/// The TUS state of an upload from a HEAD.
pub(super) struct HeadInfo {
    pub(super) offset: Option<u64>,
    pub(super) length: Option<u64>,
    pub(super) sha256: Option<String>,
}

/// What [`single`] / [`concatenated`] hand back for the final checks.
struct Outcome {
    url: reqwest::Url,
    /// Bytes already on the server when this run started.
    resumed_from: u64,
    /// The sha256 of the local file's bytes.
    local: String,
    /// The sha256 the server reports for the finished upload.
    server: String,
    /// Partial uploads to delete once the final upload verified (`--parallel`).
    parts: Vec<reqwest::Url>,
}

/// The modification time of `md` in nanoseconds since the epoch (0 if unknown).
fn mtime_ns(md: &std::fs::Metadata) -> i128 {
    md.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos() as i128)
}

/// Exit code 4: the local file is not the one whose upload started.
fn changed_error(display: &str) -> CliError {
    CliError::new(EXIT_VERIFY, format!("{display} changed while it was being uploaded; re-run with --fresh"))
        .hint("The server may hold a mix of the old and new contents. Upload a file that is not being written to.")
}

/// Partial uploads are deleted with this retry budget at most (a failure only warns).
const CLEANUP_RETRY: Duration = Duration::from_secs(10);

/// Upload one regular file: a new upload, a remembered one (`identity` names the principal
/// in the URL store), or the existing upload `given` (`--url`).
async fn upload_one(
    client: &Client,
    store: &Store,
    identity: Option<&str>,
    args: &UploadArgs,
    meta: &[(String, String)],
    path: &Path,
    given: Option<reqwest::Url>,
) -> Result<Done, CliError> {
    let canon = std::fs::canonicalize(path).map_err(|e| local_error(path, e))?;
    let md = std::fs::metadata(&canon).map_err(|e| local_error(path, e))?;
    if !md.is_file() {
        return Err(CliError::usage("not a regular file"));
    }
    let size = md.len();
    let mtime = mtime_ns(&md);
    let server = client.contact().await?;
    if let (Some(max), None) = (server.max_size, &given) {
        if size > max {
            return Err(too_large(size, max));
        }
    }
    let parallel = args.parallel.min(size.max(1) as usize);
    let label = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string());
    let progress = Arc::new(Progress::new(&label, size, 0, args.quiet));
    let mut header = metadata_header(display_name(args, path).as_deref(), meta);
    // The name the server will hold the upload under: `--meta filename=…`, else `--name` or
    // FILE's own name.
    let name = meta.iter().find(|(k, _)| k == "filename").map(|(_, v)| v.clone()).or_else(|| display_name(args, path));
    let key = identity.map(|id| fingerprint(client.base.as_str(), id, name.as_deref(), &canon, size, mtime, parallel));
    let mut stored = match &key {
        Some(k) if !args.fresh => store.get(k)?,
        _ => None,
    };
    // Metadata is fixed when an upload is created: other --meta means another upload, while
    // no --meta at all resumes whatever is remembered, with its metadata. The parts of a
    // --parallel upload carry none; only its final upload has to be made again.
    if let Some(e) = stored.take() {
        let old = e.final_url.clone().or_else(|| e.parts.first().cloned()).unwrap_or_default();
        stored = if e.meta == header {
            Some(e)
        } else if meta.is_empty() && args.name.is_none() {
            if !e.meta.is_empty() {
                header = e.meta.clone();
            }
            Some(e)
        } else if parallel <= 1 {
            progress.note(&format!("the remembered upload {old} has other metadata (--meta, --name); starting a new upload"));
            None
        } else if e.final_url.is_some() {
            progress.note(&format!("the remembered upload {old} has other metadata (--meta, --name); joining the parts again"));
            Some(super::store::Entry { final_url: None, ..e })
        } else {
            Some(e)
        };
    }
    // An existing upload (--url): its length must be this file's, or not declared yet.
    let mut declare_length = false;
    let given = match given {
        None => None,
        Some(url) => {
            let info = head(client, &mut Retry::new(args.retry_for), &url).await?;
            let offset = info
                .offset
                .ok_or_else(|| CliError::new(EXIT_FAILURE, format!("{} reported no Upload-Offset", describe(&reqwest::Method::HEAD, &url))))?;
            match info.length {
                Some(l) if l != size => {
                    return Err(CliError::usage(format!("the upload at {url} expects {l} bytes, and this file has {size}"))
                        .hint("Upload the file the link was made for (its size is on the link's page)."))
                }
                None => declare_length = true,
                Some(_) => {}
            }
            if offset > size {
                return Err(CliError::usage(format!("the upload at {url} already has {offset} bytes, more than this file's {size}")));
            }
            Some((url, offset))
        }
    };
    let job = Job {
        client,
        store,
        key,
        declare_length,
        meta: header,
        display: path.display().to_string(),
        path: canon.clone(),
        size,
        chunk_size: args.chunk_size.unwrap_or(u64::MAX),
        retry_for: args.retry_for,
        progress,
        sent: Arc::new(AtomicU64::new(0)),
        part_offsets: Mutex::new(Default::default()),
    };
    let result = match given {
        Some(g) => single(&job, Vec::new(), Some(g)).await,
        None if parallel <= 1 => single(&job, stored.map(|e| e.parts).unwrap_or_default(), None).await,
        None => concatenated(&job, stored, parallel).await,
    };
    job.progress.finish();
    let out = result?;
    // The bytes sent are the bytes hashed, so a file rewritten during the upload hashes the
    // same as what the server got: only its size and mtime tell.
    let now = std::fs::metadata(&canon).map_err(|e| local_error(path, e))?;
    if now.len() != size || mtime_ns(&now) != mtime {
        job.forget()?;
        return Err(changed_error(&job.display));
    }
    if out.local != out.server {
        job.forget()?;
        return Err(CliError::new(
            EXIT_VERIFY,
            format!("sha256 mismatch: the local file is {}, the server stored {} at {}", out.local, out.server, out.url),
        )
        .hint("The file may have changed while it was uploaded. Re-run with --fresh to upload it again from the start."));
    }
    if !out.parts.is_empty() {
        // The final upload is a copy: the parts only take space now (TUS 1.0 §Termination).
        for part in &out.parts {
            match client.terminate(&mut Retry::new(job.retry_for.min(CLEANUP_RETRY)), part).await {
                Ok(()) => {}
                Err(e) if e.code == EXIT_NOT_FOUND => {}
                Err(e) => eprintln!(
                    "ferry: warning: {}: could not delete the partial upload {part} ({}); delete it with `ferry rm {part}`",
                    job.display, e.message
                ),
            }
        }
        job.remember(&[], Some(out.url.as_str()), &job.meta)?;
    }
    Ok(Done {
        file: path.display().to_string(),
        id: id_of(&out.url),
        url: out.url.to_string(),
        upload_url: None,
        size,
        sha256: out.local,
        resumed_from: out.resumed_from,
        sent: job.sent.load(Ordering::Relaxed),
    })
}

/// Exit code 2: the upload is larger than the server's `Tus-Max-Size`; nothing was sent.
pub(super) fn too_large(size: u64, max: u64) -> CliError {
    let b = |n: u64| bytesize::ByteSize::b(n).display().iec().to_string();
    CliError::usage(format!(
        "{size} bytes ({}) is more than this server accepts: Tus-Max-Size is {max} bytes ({}); nothing was sent",
        b(size),
        b(max)
    ))
    .hint("--parallel does not help (the joined upload counts). Upload a smaller file, or ask the operator to raise --max-size.")
}

pub(super) fn local_error(path: &Path, e: std::io::Error) -> CliError {
    let code = if e.kind() == std::io::ErrorKind::NotFound { EXIT_NOT_FOUND } else { EXIT_FAILURE };
    CliError::new(code, format!("cannot read {}: {e}", path.display()))
}

/// The server refused the finished upload with `460 checksum_mismatch` (its bytes do not
/// match the declared `--meta sha256=…`): a re-run must not resume it (it would fail the same
/// way), so forget it and delete it on the server. Returns the error to report (exit code 4).
async fn rejected(job: &Job<'_>, url: &reqwest::Url, e: CliError) -> CliError {
    let _ = job.forget();
    let deleted = match job.client.terminate(&mut Retry::new(job.retry_for.min(CLEANUP_RETRY)), url).await {
        Ok(()) => "deleted it on the server".to_string(),
        Err(d) if d.code == EXIT_NOT_FOUND => "the server already discarded it".to_string(),
        Err(d) => format!("could not delete it on the server ({})", d.message),
    };
    CliError::new(EXIT_VERIFY, format!("{}; forgot the remembered upload {url} and {deleted}: the next run starts a new upload", e.message))
        .hint("The file's sha256 differs from the declared one: check --meta sha256=… (or leave it out).")
}

/// Upload as one TUS upload: the remembered one (`stored`), the `given` one at its offset
/// (`--url`), or a new one.
async fn single(job: &Job<'_>, stored: Vec<String>, given: Option<(reqwest::Url, u64)>) -> Result<Outcome, CliError> {
    let from_link = given.is_some();
    let mut existing = given;
    if let (true, [url]) = (existing.is_none(), stored.as_slice()) {
        let url = job.client.resolve(url)?;
        match usable(job, &url, job.size).await? {
            Some(offset) if offset == job.size && damaged_on_server(job.client, &url).await => {
                job.progress.note(&format!("the remembered upload {url} is damaged on the server (downloads are refused); starting a new upload"));
            }
            Some(offset) => existing = Some((url, offset)),
            None => {}
        }
    }
    let (url, offset) = match existing {
        Some((url, offset)) => {
            let verb = if from_link && offset == 0 { "sending into" } else { "resuming" };
            job.progress.note(&format!("{verb} {url} at byte {offset} of {}", job.size));
            (url, offset)
        }
        None => {
            let url = create(job, job.size, &job.meta, None).await?;
            job.remember(&[url.to_string()], None, &job.meta)?;
            (url, 0)
        }
    };
    let hashing = Arc::new(Mutex::new(Hashing::new()));
    if offset > 0 {
        job.progress.note(&format!("hashing the {offset} bytes already on the server"));
    }
    match push(job, &url, 0, job.size, offset, Some(&hashing)).await {
        Err(e) if e.is_server_code("checksum_mismatch") => return Err(rejected(job, &url, e).await),
        r => r?,
    }
    // Every byte was hashed in order: the state now covers the whole file.
    let local = {
        let h = hashing.lock().expect("hash lock");
        debug_assert_eq!(h.at, job.size);
        hex::encode(h.cur.clone().finalize())
    };
    let server = finished_sha256(job.client, job.retry_for, &url, job.size).await?;
    Ok(Outcome { url, resumed_from: offset, local, server, parts: Vec::new() })
}

/// A stored upload URL's offset if it can be continued (same length, still there); `None`
/// when it is gone or unusable (a new upload is created).
async fn usable(job: &Job<'_>, url: &reqwest::Url, length: u64) -> Result<Option<u64>, CliError> {
    let mut retry = Retry::new(job.retry_for);
    match head(job.client, &mut retry, url).await {
        Ok(HeadInfo { offset: Some(o), length: Some(l), .. }) if l == length && o <= l => Ok(Some(o)),
        Ok(_) => {
            job.progress.note(&format!("the remembered upload {url} does not match this file; starting a new upload"));
            Ok(None)
        }
        Err(e) if e.code == EXIT_NOT_FOUND => {
            job.progress.note(&format!("the remembered upload {url} is gone ({}); starting a new upload", e.message));
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Is the upload at `url` (one of ours, all bytes sent) damaged on the server: does its file
/// view (`GET /api/v1/files/{id}`) say `damaged`? Then re-running `ferry upload` must send
/// the file again rather than "verify" the sha256 the server recorded for bytes it no longer
/// has. `false` when the view cannot be read (an upload-only token may not read it).
pub(super) async fn damaged_on_server(client: &Client, url: &reqwest::Url) -> bool {
    let Ok(id) = super::client::id_segment(&id_of(url)) else { return false };
    match client.api(&mut Retry::new(Duration::ZERO), reqwest::Method::GET, &format!("/files/{id}"), &[], None).await {
        Ok(body) => serde_json::from_str::<serde_json::Value>(&body).is_ok_and(|v| v.get("damaged").is_some_and(|d| !d.is_null())),
        Err(_) => false,
    }
}

/// `POST /files/` (TUS 1.0 §Creation, §Concatenation): a new upload of `len` bytes.
async fn create(job: &Job<'_>, len: u64, meta: &str, concat: Option<&str>) -> Result<reqwest::Url, CliError> {
    let endpoint = job.client.url("/files/");
    let what = describe(&reqwest::Method::POST, &endpoint);
    let mut retry = Retry::new(job.retry_for);
    let res = job
        .client
        .send_retrying(&mut retry, &what, || {
            let mut r = job.client.request(reqwest::Method::POST, &endpoint).header("tus-resumable", TUS_VERSION);
            match concat {
                Some(c) if c.starts_with("final;") => r = r.header("upload-concat", c),
                Some(c) => r = r.header("upload-concat", c).header("upload-length", len),
                None => r = r.header("upload-length", len),
            }
            if !meta.is_empty() {
                r = r.header("upload-metadata", meta);
            }
            r
        })
        .await?;
    job.client.created(&what, res).await
}

/// `HEAD` an upload (TUS 1.0 §HEAD): offset, length and, once finished, the sha256.
pub(super) async fn head(client: &Client, retry: &mut Retry, url: &reqwest::Url) -> Result<HeadInfo, CliError> {
    let what = describe(&reqwest::Method::HEAD, url);
    let res = client.send_retrying(retry, &what, || client.request(reqwest::Method::HEAD, url).header("tus-resumable", TUS_VERSION)).await?;
    let status = res.status().as_u16();
    if status != 200 && status != 204 {
        return Err(CliError::from_status(&what, status, ""));
    }
    let h = res.headers();
    Ok(HeadInfo {
        offset: typed_header::<UploadOffset>(h, "upload-offset").map(|o| o.0),
        length: typed_header::<UploadLength>(h, "upload-length").map(|l| l.0),
        sha256: repr_digest_sha256(h),
    })
}

/// The sha256 the server reports (`Repr-Digest`) for upload `url` of `len` bytes, all of them
/// sent. An upload whose bytes are all stored but that the server has not finished yet (a
/// pre-finish hook or a store that cannot answer: HEAD answers 423, or, from an older server,
/// `Upload-Offset` = `Upload-Length` without `Repr-Digest`) is retryable: it is asked about again
/// with backoff — with an empty PATCH at the full offset, which asks a server to finish — until
/// `--retry-for` passes without it finishing (exit 5: re-run to keep waiting).
pub(super) async fn finished_sha256(client: &Client, retry_for: Duration, url: &reqwest::Url, len: u64) -> Result<String, CliError> {
    let mut retry = Retry::new(retry_for);
    loop {
        let info = head(client, &mut retry, url).await?;
        if let Some(sha) = info.sha256 {
            return Ok(sha);
        }
        if info.offset == Some(len) {
            let _ = client
                .request(reqwest::Method::PATCH, url)
                .header("tus-resumable", TUS_VERSION)
                .header("content-type", OFFSET_OCTET_STREAM)
                .header("upload-offset", len)
                .header("content-length", 0)
                .send()
                .await;
        }
        retry
            .wait(
                CliError::new(
                    super::client::EXIT_NETWORK,
                    format!("the server has every byte of {url} but has not finished the upload yet (no Repr-Digest)"),
                )
                .hint("Re-run the same command to keep waiting: the server finishes it once its pre-finish hook or store answers again."),
            )
            .await?;
    }
}

impl Job<'_> {
    /// Remember the upload URL(s) of this file (not with `--url`).
    fn remember(&self, parts: &[String], final_url: Option<&str>, meta: &str) -> Result<(), CliError> {
        match &self.key {
            Some(k) => self.store.put(k, parts, final_url, meta),
            None => Ok(()),
        }
    }

    /// Forget the remembered upload of this file.
    fn forget(&self) -> Result<(), CliError> {
        match &self.key {
            Some(k) => self.store.remove(k),
            None => Ok(()),
        }
    }

    /// The overall progress position once the part starting at file offset `base` has
    /// `offset` bytes on the server: the sum over all parts.
    fn progress_pos(&self, base: u64, offset: u64) -> u64 {
        let mut parts = self.part_offsets.lock().expect("offsets lock");
        parts.insert(base, offset);
        parts.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashing_rewinds_to_snapshots() {
        let data: Vec<u8> = (0..(SNAPSHOT_EVERY * 2 + 1000)).map(|i| (i % 251) as u8).collect();
        let mut h = Hashing::new();
        for (i, c) in data.chunks(100_000).enumerate() {
            h.feed(i as u64 * 100_000, c);
        }
        assert_eq!(h.at, data.len() as u64);
        let want = hex::encode(Sha256::digest(&data));
        assert_eq!(hex::encode(h.cur.clone().finalize()), want);
        // Rewind into the middle; re-feeding (with overlap) gives the same digest.
        let back = h.rewind(SNAPSHOT_EVERY + 5);
        assert_eq!(back, SNAPSHOT_EVERY);
        h.feed(SNAPSHOT_EVERY - 10, &data[(SNAPSHOT_EVERY - 10) as usize..]);
        assert_eq!(hex::encode(h.cur.clone().finalize()), want);
        assert_eq!(h.rewind(3), 0);
    }

    #[test]
    fn metadata() {
        let pairs = metadata_pairs(&["a=b".into(), "flag=".into()]).unwrap();
        assert_eq!(metadata_header(Some("r.bin"), &pairs), "filename ci5iaW4=,a Yg==,flag", "octet-stream is not stored: it is the default");
        // Issue 13 item 11: the media type is guessed from the name, unless given.
        let md: UploadMetadata = metadata_header(Some("notes.txt"), &[]).parse().unwrap();
        assert_eq!(md.get_str("filetype"), Some("text/plain"));
        let md: UploadMetadata = metadata_header(None, &[("filename".into(), "db.json".into())]).parse().unwrap();
        assert_eq!((md.get_str("filename"), md.get_str("filetype")), (Some("db.json"), Some("application/json")));
        let md: UploadMetadata = metadata_header(Some("a.txt"), &[("contentType".into(), "text/csv".into())]).parse().unwrap();
        assert_eq!((md.get_str("filetype"), md.get_str("contentType")), (None, Some("text/csv")));
        assert_eq!(metadata_header(None, &[]), "");
        assert_eq!(upload_url("http://h:1/share/abc?scope=upload&sig=x").unwrap().as_str(), "http://h:1/files/abc?scope=upload&sig=x");
        assert_eq!(upload_url("http://h:1/p/files/abc").unwrap().as_str(), "http://h:1/p/files/abc");
        assert!(upload_url("http://h:1/nothing").is_err());
        assert_eq!(unsigned("http://h:1/files/abc?scope=upload&exp=9&sig=x").as_deref(), Some("http://h:1/files/abc"));
        assert_eq!(unsigned("http://h:1/files/abc"), None);
        assert!(metadata_pairs(&["no".into()]).is_err());
        assert!(metadata_pairs(&["a b=c".into()]).is_err());
        assert!(metadata_pairs(&["a=1".into(), "a=2".into()]).is_err(), "a key twice is refused here as the server refuses it");
    }
}
