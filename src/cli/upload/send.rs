//! Sending one upload's bytes: the PATCH loop with its retries and HEAD after a failure, the
//! streamed request bodies, and the running sha256 of what was sent with snapshots to rewind to.

use super::*;

/// The sha256 of a prefix of the file, with snapshots to rewind to.
pub(super) struct Hashing {
    /// `(offset, state after offset bytes)`, ascending; always starts with `(0, empty)`.
    pub(super) snaps: Vec<(u64, Sha256)>,
    pub(super) cur: Sha256,
    /// Bytes hashed so far.
    pub(super) at: u64,
}

impl Hashing {
    pub(super) fn new() -> Hashing {
        Hashing { snaps: vec![(0, Sha256::new())], cur: Sha256::new(), at: 0 }
    }

    /// Hash `data`, which starts at file offset `pos`; bytes before `at` are skipped, and a
    /// gap (pos > at) is ignored (the next [`Hashing::rewind`] + re-read fills it).
    pub(super) fn feed(&mut self, pos: u64, mut data: &[u8]) {
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
    pub(super) fn rewind(&mut self, target: u64) -> u64 {
        self.snaps.retain(|(o, _)| *o <= target);
        let (o, h) = self.snaps.last().expect("the snapshot at 0 is kept").clone();
        self.cur = h;
        self.at = o;
        o
    }
}

/// Make `hashing` cover exactly `[0, target)` of the file, re-reading what is missing.
pub(super) async fn hash_to(path: &Path, display: &str, hashing: &Mutex<Hashing>, target: u64) -> Result<(), CliError> {
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
            return Err(changed_error(display));
        }
        hashing.lock().expect("hash lock").feed(pos, &buf[..n]);
        pos += n as u64;
    }
    Ok(())
}

/// Send bytes `[base + offset, base + len)` of the file to upload `url` (whose own offsets
/// run from 0 to `len`), starting at its current `offset`, in PATCHes of at most
/// `chunk_size` (TUS 1.0 §PATCH). With `hashing`, the bytes are hashed as they are sent.
pub(super) async fn push(
    job: &Job<'_>,
    url: &reqwest::Url,
    base: u64,
    len: u64,
    mut offset: u64,
    hashing: Option<&Arc<Mutex<Hashing>>>,
) -> Result<(), CliError> {
    let mut retry = Retry::new(job.retry_for);
    let mut conflicts = 0;
    job.progress.reached(job.progress_pos(base, offset));
    loop {
        if let Some(h) = hashing {
            hash_to(&job.path, &job.display, h, base + offset).await?;
        }
        if offset >= len {
            return Ok(());
        }
        let current = tokio::fs::metadata(&job.path).await.map_err(|e| local_error(&job.path, e))?.len();
        if current != job.size {
            return Err(changed_error(&job.display));
        }
        let end = offset.saturating_add(job.chunk_size).min(len);
        let body = body_stream(job, base + offset, end - offset, hashing.cloned()).await?;
        let what = format!("{} at offset {offset}", describe(&reqwest::Method::PATCH, url));
        let res = job
            .client
            .request(reqwest::Method::PATCH, url)
            .header("tus-resumable", TUS_VERSION)
            .header("content-type", OFFSET_OCTET_STREAM)
            .header("upload-offset", offset)
            .header("content-length", end - offset);
        let res = if job.declare_length { res.header("upload-length", len) } else { res };
        let res = res.body(body).send().await;
        let failure = match res {
            Ok(r) => {
                let status = r.status().as_u16();
                let server_offset = typed_header::<UploadOffset>(r.headers(), "upload-offset").map(|o| o.0);
                match (status, server_offset) {
                    (204 | 200, Some(o)) if o <= len => {
                        if o > offset {
                            // Bytes were kept: the --retry-for budget starts over.
                            retry.success();
                        }
                        offset = o;
                        conflicts = 0;
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
                    (s, _) if crate::cli::client::retryable_status(s) => CliError::from_response(&what, r).await,
                    _ => return Err(CliError::from_response(&what, r).await),
                }
            }
            Err(e) => CliError::network(&what, &e),
        };
        retry.wait(failure).await?;
        // Ask the server what it kept (a new HEAD also ends a PATCH of ours still in flight).
        let info = head(job.client, &mut retry, url).await?;
        offset = info
            .offset
            .filter(|o| *o <= len)
            .ok_or_else(|| CliError::new(EXIT_FAILURE, format!("{} reported no usable Upload-Offset", describe(&reqwest::Method::HEAD, url))))?;
        job.progress.set(job.progress_pos(base, offset), false);
    }
}

/// The body of one PATCH: `len` bytes of the file from `from`, read in 256 KiB pieces, each
/// hashed (with `hashing`), counted as sent and shown as progress as it goes out.
pub(super) async fn body_stream(job: &Job<'_>, from: u64, len: u64, hashing: Option<Arc<Mutex<Hashing>>>) -> Result<reqwest::Body, CliError> {
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
pub(super) async fn hash_file(path: PathBuf, display: String) -> Result<String, CliError> {
    let h = Mutex::new(Hashing::new());
    let len = tokio::fs::metadata(&path).await.map_err(|e| local_error(&path, e))?.len();
    hash_to(&path, &display, &h, len).await?;
    let h = h.into_inner().expect("hash lock");
    Ok(hex::encode(h.cur.finalize()))
}
