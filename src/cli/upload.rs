//! `ferry upload FILE...`: a resumable TUS 1.0 client.
//!
//! - **Resumable.** The upload URL of each file is remembered in the URL store
//!   ([`super::store`]) under a fingerprint of the server, the canonical path, the size and
//!   the modification time. Re-running the same command HEADs the stored URL (TUS 1.0 §HEAD)
//!   and continues from the server's `Upload-Offset`; a finished upload is only verified again.
//! - **Retries** network errors, 5xx, 423 and 429 with exponential backoff until `--retry-for`
//!   has passed without progress (then exit code 5); after a failed PATCH a HEAD tells what
//!   the server kept (TUS 1.0 §PATCH: the offset is authoritative).
//! - **Verified.** The file's sha256 is computed while its bytes are sent; on resume the
//!   prefix already on the server is re-read locally (a snapshot of the hash state is kept
//!   every 16 MiB, so a failed request re-reads at most that much). At the end the local
//!   sha256 must equal the server's `Repr-Digest: sha-256=:…:` (RFC 9530 §2) of the finished
//!   upload, else exit code 4.
//! - **`--parallel N`** creates N partial uploads (`Upload-Concat: partial`, TUS 1.0
//!   §Concatenation), sends them side by side, then creates the final upload
//!   (`Upload-Concat: final;/files/a /files/b …`); the whole-file sha256 is then computed by
//!   one sequential read running alongside the parts.

use std::io::SeekFrom;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use clap::Args;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::client::{
    header_u64, id_of, parse_duration, parse_size, repr_digest_sha256, CliError, Client, Connection, Retry, EXIT_FAILURE, EXIT_NOT_FOUND,
    EXIT_VERIFY, TRANSFER_EXIT_CODES,
};
use super::progress::Progress;
use super::store::{fingerprint, Store};

/// `Tus-Resumable` value of every request (TUS 1.0 §Tus-Resumable).
pub const TUS_VERSION: &str = "1.0.0";
/// PATCH body media type (TUS 1.0 §PATCH).
const OFFSET_OCTET_STREAM: &str = "application/offset+octet-stream";
/// A snapshot of the sha256 state is kept every this many bytes, in bytes.
const SNAPSHOT_EVERY: u64 = 16 << 20;
/// Read size for request bodies and local hashing, in bytes.
const READ_CHUNK: usize = 256 << 10;
/// A request whose answer sends nothing for this long fails (and is retried).
const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// Most parts for `--parallel`.
const MAX_PARALLEL: usize = 64;

/// `ferry upload`: send files to a ferry server (TUS 1.0), resumably, and verify them.
#[derive(Debug, Args)]
#[command(after_help = TRANSFER_EXIT_CODES)]
pub struct UploadArgs {
    #[command(flatten)]
    pub conn: Connection,
    /// Files to upload, one after the other.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
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
    /// Print one JSON object per file (file, id, url, size, sha256, resumed_from, sent)
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
    super::client::run_command(|| execute(args))
}

async fn execute(args: UploadArgs) -> Result<(), CliError> {
    if args.parallel == 0 || args.parallel > MAX_PARALLEL {
        return Err(CliError::usage(format!("--parallel must be 1 to {MAX_PARALLEL}, got {}", args.parallel)));
    }
    if args.chunk_size == Some(0) {
        return Err(CliError::usage("--chunk-size must be at least 1 byte"));
    }
    let metadata = metadata_pairs(&args.meta)?;
    let client = Client::new(&args.conn, READ_TIMEOUT)?;
    let store = Store::open()?;
    let mut first_err: Option<CliError> = None;
    for path in &args.files {
        match upload_one(&client, &store, &args, &metadata, path).await {
            Ok(done) => {
                if args.json {
                    println!("{}", serde_json::to_string(&done).expect("serialises"));
                } else {
                    println!("{}\t{}", done.url, done.sha256);
                }
            }
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
        Some(e) if args.files.len() > 1 => Err(CliError { message: "some files were not uploaded (see above)".into(), hint: None, code: e.code }),
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The `--meta` pairs, checked for TUS 1.0 §Upload-Metadata keys (no spaces or commas).
fn metadata_pairs(meta: &[String]) -> Result<Vec<(String, String)>, CliError> {
    meta.iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').ok_or_else(|| CliError::usage(format!("--meta {kv:?} is not KEY=VALUE")))?;
            if k.is_empty() || !k.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
                return Err(CliError::usage(format!("--meta key {k:?} must be non-empty ASCII without spaces or commas")));
            }
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

/// The `Upload-Metadata` header: `filename` (the file's name) unless given, then the rest.
fn metadata_header(path: &Path, pairs: &[(String, String)]) -> String {
    let b64 = |v: &str| base64::engine::general_purpose::STANDARD.encode(v);
    let mut items = Vec::new();
    if !pairs.iter().any(|(k, _)| k == "filename") {
        if let Some(name) = path.file_name() {
            items.push(format!("filename {}", b64(&name.to_string_lossy())));
        }
    }
    for (k, v) in pairs {
        items.push(if v.is_empty() { k.clone() } else { format!("{k} {}", b64(v)) });
    }
    items.join(",")
}

/// What `ferry upload` prints for one file.
#[derive(serde::Serialize)]
struct Done {
    file: String,
    id: String,
    url: String,
    size: u64,
    sha256: String,
    /// Bytes already on the server when this run started (over all parts).
    resumed_from: u64,
    /// Bytes this run put on the wire in PATCH bodies (including any that were re-sent).
    sent: u64,
}

/// One local file being uploaded.
struct Job<'a> {
    client: &'a Client,
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
struct HeadInfo {
    offset: Option<u64>,
    length: Option<u64>,
    sha256: Option<String>,
}

async fn upload_one(client: &Client, store: &Store, args: &UploadArgs, meta: &[(String, String)], path: &Path) -> Result<Done, CliError> {
    let canon = std::fs::canonicalize(path).map_err(|e| local_error(path, e))?;
    let md = std::fs::metadata(&canon).map_err(|e| local_error(path, e))?;
    if !md.is_file() {
        return Err(CliError::usage("not a regular file"));
    }
    let size = md.len();
    let mtime_ns = md.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos() as i128);
    let parallel = args.parallel.min(size.max(1) as usize);
    let key = fingerprint(client.base.as_str(), &canon, size, mtime_ns, parallel);
    let label = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string());
    let job = Job {
        client,
        path: canon.clone(),
        size,
        chunk_size: args.chunk_size.unwrap_or(u64::MAX),
        retry_for: args.retry_for,
        progress: Arc::new(Progress::new(&label, size, 0, args.quiet)),
        sent: Arc::new(AtomicU64::new(0)),
        part_offsets: Mutex::new(Default::default()),
    };
    let stored = if args.fresh { None } else { store.get(&key)? };
    let meta_header = metadata_header(path, meta);
    let result = if parallel <= 1 {
        single(&job, store, &key, stored.map(|e| e.parts).unwrap_or_default(), &meta_header).await
    } else {
        concatenated(&job, store, &key, stored, parallel, &meta_header).await
    };
    job.progress.finish();
    let (url, resumed_from, local, server) = result?;
    if local != server {
        store.remove(&key)?;
        return Err(CliError::new(EXIT_VERIFY, format!("sha256 mismatch: the local file is {local}, the server stored {server} at {url}"))
            .hint("The file may have changed while it was uploaded. Re-run the command to upload it again from the start."));
    }
    Ok(Done {
        file: path.display().to_string(),
        id: id_of(&url),
        url: url.to_string(),
        size,
        sha256: local,
        resumed_from,
        sent: job.sent.load(Ordering::Relaxed),
    })
}

fn local_error(path: &Path, e: std::io::Error) -> CliError {
    let code = if e.kind() == std::io::ErrorKind::NotFound { EXIT_NOT_FOUND } else { EXIT_FAILURE };
    CliError::new(code, format!("cannot read {}: {e}", path.display()))
}

/// Upload as one TUS upload. Returns (url, resumed_from, local sha256, server sha256).
async fn single(job: &Job<'_>, store: &Store, key: &str, stored: Vec<String>, meta: &str) -> Result<(reqwest::Url, u64, String, String), CliError> {
    let mut existing = None;
    if let [url] = stored.as_slice() {
        let url = job.client.resolve(url)?;
        if let Some(offset) = usable(job, &url, job.size).await? {
            existing = Some((url, offset));
        }
    }
    let (url, offset) = match existing {
        Some((url, offset)) => {
            job.progress.note(&format!("resuming {url} at byte {offset} of {}", job.size));
            (url, offset)
        }
        None => {
            let url = create(job, job.size, meta, None).await?;
            store.put(key, &[url.to_string()], None)?;
            (url, 0)
        }
    };
    let hashing = Arc::new(Mutex::new(Hashing::new()));
    if offset > 0 {
        job.progress.note(&format!("hashing the {offset} bytes already on the server"));
    }
    push(job, &url, 0, job.size, offset, Some(&hashing)).await?;
    // Every byte was hashed in order: the state now covers the whole file.
    let local = {
        let h = hashing.lock().expect("hash lock");
        debug_assert_eq!(h.at, job.size);
        hex::encode(h.cur.clone().finalize())
    };
    let mut retry = Retry::new(job.retry_for);
    let info = head(job.client, &mut retry, &url).await?;
    let server = info.sha256.ok_or_else(|| CliError::new(EXIT_FAILURE, format!("the server did not report a sha256 (Repr-Digest) for the finished upload {url}")))?;
    Ok((url, offset, local, server))
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

/// `POST /files/` (TUS 1.0 §Creation, §Concatenation): a new upload of `len` bytes.
async fn create(job: &Job<'_>, len: u64, meta: &str, concat: Option<&str>) -> Result<reqwest::Url, CliError> {
    let endpoint = job.client.url("/files/");
    let mut retry = Retry::new(job.retry_for);
    let res = job
        .client
        .send_retrying(&mut retry, "creating the upload", || {
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
    let status = res.status().as_u16();
    let loc = res.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_owned);
    if status != 201 {
        let body = res.text().await.unwrap_or_default();
        return Err(CliError::from_status(&format!("POST {endpoint}"), status, &body));
    }
    let loc = loc.ok_or_else(|| CliError::new(EXIT_FAILURE, "the server created an upload but sent no Location"))?;
    job.client.resolve(&loc)
}

/// `HEAD` an upload (TUS 1.0 §HEAD): offset, length and, once finished, the sha256.
async fn head(client: &Client, retry: &mut Retry, url: &reqwest::Url) -> Result<HeadInfo, CliError> {
    let res = client.send_retrying(retry, &format!("HEAD {url}"), || client.request(reqwest::Method::HEAD, url).header("tus-resumable", TUS_VERSION)).await?;
    let status = res.status().as_u16();
    if status != 200 && status != 204 {
        return Err(CliError::from_status(&format!("HEAD {url}"), status, ""));
    }
    let h = res.headers();
    Ok(HeadInfo { offset: header_u64(h, "upload-offset"), length: header_u64(h, "upload-length"), sha256: repr_digest_sha256(h) })
}

/// The sha256 of a prefix of the file, with snapshots to rewind to.
struct Hashing {
    /// `(offset, state after offset bytes)`, ascending; always starts with `(0, empty)`.
    snaps: Vec<(u64, Sha256)>,
    cur: Sha256,
    /// Bytes hashed so far.
    at: u64,
}

impl Hashing {
    fn new() -> Hashing {
        Hashing { snaps: vec![(0, Sha256::new())], cur: Sha256::new(), at: 0 }
    }

    /// Hash `data`, which starts at file offset `pos`; bytes before `at` are skipped, and a
    /// gap (pos > at) is ignored (the next [`Hashing::rewind`] + re-read fills it).
    fn feed(&mut self, pos: u64, mut data: &[u8]) {
        if pos > self.at {
            return;
        }
        let skip = (self.at - pos) as usize;
        if skip >= data.len() {
            return;
        }
        data = &data[skip..];
        while !data.is_empty() {
            let next = (self.at / SNAPSHOT_EVERY + 1) * SNAPSHOT_EVERY;
            let take = ((next - self.at) as usize).min(data.len());
            self.cur.update(&data[..take]);
            self.at += take as u64;
            data = &data[take..];
            if self.at == next {
                self.snaps.push((self.at, self.cur.clone()));
            }
        }
    }

    /// Move back to the last snapshot at or before `target`; returns its offset.
    fn rewind(&mut self, target: u64) -> u64 {
        self.snaps.retain(|(o, _)| *o <= target);
        let (o, h) = self.snaps.last().expect("the snapshot at 0 is kept").clone();
        self.cur = h;
        self.at = o;
        o
    }
}

/// Make `hashing` cover exactly `[0, target)` of the file, re-reading what is missing.
async fn hash_to(path: &Path, hashing: &Mutex<Hashing>, target: u64) -> Result<(), CliError> {
    let from = {
        let mut h = hashing.lock().expect("hash lock");
        if h.at == target {
            return Ok(());
        }
        h.rewind(target)
    };
    let mut f = tokio::fs::File::open(path).await.map_err(|e| local_error(path, e))?;
    f.seek(SeekFrom::Start(from)).await.map_err(|e| local_error(path, e))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = from;
    while pos < target {
        let want = ((target - pos) as usize).min(buf.len());
        let n = f.read(&mut buf[..want]).await.map_err(|e| local_error(path, e))?;
        if n == 0 {
            return Err(CliError::new(EXIT_FAILURE, format!("{} became shorter while it was uploaded", path.display())));
        }
        hashing.lock().expect("hash lock").feed(pos, &buf[..n]);
        pos += n as u64;
    }
    Ok(())
}

/// Send bytes `[base + offset, base + len)` of the file to upload `url` (whose own offsets
/// run from 0 to `len`), starting at its current `offset`, in PATCHes of at most
/// `chunk_size` (TUS 1.0 §PATCH). With `hashing`, the bytes are hashed as they are sent.
async fn push(job: &Job<'_>, url: &reqwest::Url, base: u64, len: u64, mut offset: u64, hashing: Option<&Arc<Mutex<Hashing>>>) -> Result<(), CliError> {
    let mut retry = Retry::new(job.retry_for);
    let mut conflicts = 0;
    job.progress.set(job.progress_pos(base, offset), false);
    loop {
        if let Some(h) = hashing {
            hash_to(&job.path, h, base + offset).await?;
        }
        if offset >= len {
            return Ok(());
        }
        let current = tokio::fs::metadata(&job.path).await.map_err(|e| local_error(&job.path, e))?.len();
        if current != job.size {
            return Err(CliError::new(EXIT_FAILURE, format!("the file changed size while it was uploaded ({} → {current} bytes)", job.size))
                .hint("Upload a file that is not being written to; re-run to start over."));
        }
        let end = offset.saturating_add(job.chunk_size).min(len);
        let body = body_stream(job, base + offset, end - offset, hashing.cloned()).await?;
        let what = format!("PATCH {url} at {offset}");
        let res = job
            .client
            .request(reqwest::Method::PATCH, url)
            .header("tus-resumable", TUS_VERSION)
            .header("content-type", OFFSET_OCTET_STREAM)
            .header("upload-offset", offset)
            .header("content-length", end - offset)
            .body(body)
            .send()
            .await;
        let failure = match res {
            Ok(r) => {
                let status = r.status().as_u16();
                let server_offset = header_u64(r.headers(), "upload-offset");
                match (status, server_offset) {
                    (204 | 200, Some(o)) if o <= len => {
                        offset = o;
                        conflicts = 0;
                        retry.success();
                        job.progress.set(job.progress_pos(base, offset), true);
                        continue;
                    }
                    // TUS 1.0 §PATCH: the offsets disagree; the answer carries the server's.
                    (409, Some(o)) if o <= len && conflicts < 3 => {
                        conflicts += 1;
                        job.progress.note(&format!("the server has {o} bytes, not {offset}; continuing from there"));
                        offset = o;
                        job.progress.set(job.progress_pos(base, offset), false);
                        continue;
                    }
                    (s, _) if super::client::retryable_status(s) => {
                        let body = r.text().await.unwrap_or_default();
                        CliError::from_status(&what, s, &body)
                    }
                    (s, _) => {
                        let body = r.text().await.unwrap_or_default();
                        return Err(CliError::from_status(&what, s, &body));
                    }
                }
            }
            Err(e) => CliError::network(&what, &e),
        };
        retry.wait(failure).await?;
        // Ask the server what it kept (a new HEAD also ends a PATCH of ours still in flight).
        let info = head(job.client, &mut retry, url).await?;
        offset = info.offset.filter(|o| *o <= len).ok_or_else(|| CliError::new(EXIT_FAILURE, format!("HEAD {url} reported no usable Upload-Offset")))?;
        job.progress.set(job.progress_pos(base, offset), false);
    }
}

impl Job<'_> {
    /// The overall progress position once the part starting at file offset `base` has
    /// `offset` bytes on the server: the sum over all parts.
    fn progress_pos(&self, base: u64, offset: u64) -> u64 {
        let mut parts = self.part_offsets.lock().expect("offsets lock");
        parts.insert(base, offset);
        parts.values().sum()
    }
}

/// The body of one PATCH: `len` bytes of the file from `from`, read in 256 KiB pieces, each
/// hashed (with `hashing`), counted as sent and shown as progress as it goes out.
async fn body_stream(job: &Job<'_>, from: u64, len: u64, hashing: Option<Arc<Mutex<Hashing>>>) -> Result<reqwest::Body, CliError> {
    let mut f = tokio::fs::File::open(&job.path).await.map_err(|e| local_error(&job.path, e))?;
    f.seek(SeekFrom::Start(from)).await.map_err(|e| local_error(&job.path, e))?;
    let progress = job.progress.clone();
    let sent = job.sent.clone();
    let mut pos = from;
    let stream = tokio_util::io::ReaderStream::with_capacity(f.take(len), READ_CHUNK).map(move |chunk| {
        if let Ok(b) = &chunk {
            if let Some(h) = &hashing {
                h.lock().expect("hash lock").feed(pos, b);
            }
            pos += b.len() as u64;
            sent.fetch_add(b.len() as u64, Ordering::Relaxed);
            progress.inc(b.len() as u64);
        }
        chunk
    });
    Ok(reqwest::Body::wrap_stream(stream))
}

/// The whole file's sha256 by one sequential read (used alongside parallel parts).
async fn hash_file(path: PathBuf) -> Result<String, CliError> {
    let h = Mutex::new(Hashing::new());
    let len = tokio::fs::metadata(&path).await.map_err(|e| local_error(&path, e))?.len();
    hash_to(&path, &h, len).await?;
    let h = h.into_inner().expect("hash lock");
    Ok(hex::encode(h.cur.finalize()))
}

/// Upload as `n` partial uploads plus a final one (TUS 1.0 §Concatenation). Returns (final
/// url, resumed_from, local sha256, server sha256).
async fn concatenated(
    job: &Job<'_>,
    store: &Store,
    key: &str,
    stored: Option<super::store::Entry>,
    n: usize,
    meta: &str,
) -> Result<(reqwest::Url, u64, String, String), CliError> {
    let size = job.size;
    let ranges: Vec<(u64, u64)> = (0..n as u64).map(|i| (i * size / n as u64, (i + 1) * size / n as u64)).collect();
    let hasher = tokio::spawn(hash_file(job.path.clone()));
    // A final upload from an earlier run: it only needs to finish and be verified.
    if let Some(final_url) = stored.as_ref().and_then(|e| e.final_url.clone()) {
        let url = job.client.resolve(&final_url)?;
        let mut retry = Retry::new(job.retry_for);
        match head(job.client, &mut retry, &url).await {
            Ok(_) => {
                job.progress.note(&format!("the parts were already joined into {url}"));
                job.progress.set(size, false);
                let server = wait_final(job, &url).await?;
                let local = hasher.await.map_err(|e| CliError::new(EXIT_FAILURE, format!("hashing failed: {e}")))??;
                return Ok((url, size, local, server));
            }
            Err(e) if e.code == EXIT_NOT_FOUND => job.progress.note(&format!("the remembered upload {url} is gone; starting over")),
            Err(e) => return Err(e),
        }
    }
    let mut parts: Vec<(reqwest::Url, u64)> = Vec::new();
    if let Some(e) = stored.filter(|e| e.final_url.is_none() && e.parts.len() == n) {
        for (u, (a, b)) in e.parts.iter().zip(&ranges) {
            let url = job.client.resolve(u)?;
            match usable(job, &url, b - a).await? {
                Some(o) => parts.push((url, o)),
                None => {
                    parts.clear();
                    break;
                }
            }
        }
    }
    let resumed_from: u64 = parts.iter().map(|(_, o)| o).sum();
    if parts.is_empty() {
        for (a, b) in &ranges {
            parts.push((create(job, b - a, "", Some("partial")).await?, 0));
        }
        store.put(key, &parts.iter().map(|(u, _)| u.to_string()).collect::<Vec<_>>(), None)?;
    } else {
        job.progress.note(&format!("resuming {n} parts with {resumed_from} of {size} bytes on the server"));
    }
    let sends = parts.iter().zip(&ranges).map(|((url, off), (a, b))| push(job, url, *a, b - a, *off, None));
    futures::future::try_join_all(sends).await?;
    let list: Vec<&str> = parts.iter().map(|(u, _)| u.path()).collect();
    let final_url = create(job, size, meta, Some(&format!("final;{}", list.join(" ")))).await?;
    store.put(key, &parts.iter().map(|(u, _)| u.to_string()).collect::<Vec<_>>(), Some(final_url.as_str()))?;
    let server = wait_final(job, &final_url).await?;
    let local = hasher.await.map_err(|e| CliError::new(EXIT_FAILURE, format!("hashing failed: {e}")))??;
    Ok((final_url, resumed_from, local, server))
}

/// Poll a final upload until the server has joined its parts (HEAD shows `Upload-Offset`
/// equal to `Upload-Length`); returns its sha256. Gives up after `--retry-for` or 10
/// minutes, whichever is longer (re-running resumes the wait).
async fn wait_final(job: &Job<'_>, url: &reqwest::Url) -> Result<String, CliError> {
    let deadline = std::time::Instant::now() + job.retry_for.max(Duration::from_secs(600));
    let mut pause = Duration::from_millis(50);
    let mut noted = false;
    loop {
        let mut retry = Retry::new(job.retry_for);
        let info = head(job.client, &mut retry, url).await?;
        if let (Some(o), Some(l)) = (info.offset, info.length) {
            if o == l {
                return info.sha256.ok_or_else(|| CliError::new(EXIT_FAILURE, format!("the server did not report a sha256 (Repr-Digest) for {url}")));
            }
        }
        if std::time::Instant::now() >= deadline {
            return Err(CliError::new(super::client::EXIT_NETWORK, format!("the server has not finished joining the parts into {url}"))
                .hint("Re-run the same command later to check it again."));
        }
        if !noted && pause >= Duration::from_millis(800) {
            job.progress.note("waiting for the server to join the parts");
            noted = true;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
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
        assert_eq!(metadata_header(Path::new("/x/r.bin"), &pairs), "filename ci5iaW4=,a Yg==,flag");
        assert!(metadata_pairs(&["no".into()]).is_err());
        assert!(metadata_pairs(&["a b=c".into()]).is_err());
    }
}
