//! `ferry upload -` (and any pipe, FIFO or device): an upload of unknown length.
//!
//! The upload is created with `Upload-Defer-Length: 1` (TUS 1.0 §Creation Defer Length) —
//! unless the whole input fits in the first piece, when its length is known at once — and the
//! input is sent in pieces of `--chunk-size` (default [`STREAM_CHUNK`]). One byte more than a
//! piece is read ahead, so the piece that ends the input is known as such and carries
//! `Upload-Length` (no empty closing request). Every byte read is hashed; at the end the sha256
//! must equal the server's `Repr-Digest` (exit code 4 otherwise), as for a file.
//!
//! **What survives what.** The piece being sent is held in memory until the server confirms
//! it, so a dropped connection, a 5xx or a server restart is retried within `--retry-for` and
//! resumes from the server's offset (HEAD) without losing a byte. A pipe cannot be read twice:
//! if this process dies, the bytes it had read are gone, and the server keeps what it
//! acknowledged as an unfinished upload (it expires like any other). The run prints that
//! upload's URL first; running the same producer again into `ferry upload - --url URL`
//! continues it: the first OFFSET bytes of the new input are read and hashed but not sent, and
//! the final sha256 comparison tells whether the producer wrote the same bytes again (exit
//! code 4 if not: a `pg_dump` of a changed database is another file).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::client::{describe, id_of, typed_header, CliError, Client, Retry, EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_VERIFY};
use super::progress::Progress;
use super::upload::{head, local_error, too_large, Done, UploadArgs, OFFSET_OCTET_STREAM, READ_CHUNK, TUS_VERSION};

/// Default bytes per PATCH of a streamed upload (held in memory until acknowledged).
pub const STREAM_CHUNK: u64 = 16 << 20;

/// Upload the stream `path` (`-` for stdin) into a new upload with `meta` as its
/// `Upload-Metadata`, or into the existing upload `given` (`--url`).
pub(super) async fn upload(
    client: &Client,
    args: &UploadArgs,
    meta: Option<String>,
    path: &Path,
    given: Option<reqwest::Url>,
) -> Result<Done, CliError> {
    let mut src: Box<dyn AsyncRead + Unpin + Send> = if path.as_os_str() == "-" {
        Box::new(tokio::io::stdin())
    } else {
        Box::new(tokio::fs::File::open(path).await.map_err(|e| local_error(path, e))?)
    };
    let chunk = usize::try_from(args.chunk_size.unwrap_or(STREAM_CHUNK)).unwrap_or(usize::MAX - 1).max(1);
    let label = if path.as_os_str() == "-" { "stdin".to_string() } else { path.display().to_string() };
    let progress = Arc::new(Progress::unknown(&label, args.quiet));
    let max = client.contact().await?.max_size;
    let mut s = Sender { client, progress: progress.clone(), retry_for: args.retry_for, hasher: Sha256::new(), read: 0, sent: 0, max };
    let result = s.run(&mut *src, chunk, meta, given).await;
    progress.finish();
    result
}

/// The state of one streamed upload.
struct Sender<'a> {
    client: &'a Client,
    progress: Arc<Progress>,
    retry_for: Duration,
    /// sha256 of every byte read so far.
    hasher: Sha256,
    /// Bytes read from the input so far.
    read: u64,
    /// Bytes put on the wire in PATCH bodies (including any sent again).
    sent: u64,
    /// The server's `Tus-Max-Size`.
    max: Option<u64>,
}

impl Sender<'_> {
    async fn run(
        &mut self,
        src: &mut (dyn AsyncRead + Unpin + Send),
        chunk: usize,
        meta: Option<String>,
        given: Option<reqwest::Url>,
    ) -> Result<Done, CliError> {
        let mut buf: Vec<u8> = Vec::with_capacity(chunk.saturating_add(1).min(64 << 20));
        let known_length;
        let (url, mut offset, resumed_from) = match given {
            Some(url) => {
                let info = head(self.client, &mut Retry::new(self.retry_for), &url).await?;
                known_length = info.length;
                let offset = info
                    .offset
                    .ok_or_else(|| CliError::new(EXIT_FAILURE, format!("{} reported no Upload-Offset", describe(&reqwest::Method::HEAD, &url))))?;
                if offset > 0 {
                    self.progress.note(&format!(
                        "the server has {offset} bytes of {url}: reading them from the input \
                         again (not sent; the final sha256 tells whether they are the same)"
                    ));
                    self.skip(src, offset).await?;
                }
                (url, offset, offset)
            }
            None => {
                let eof = self.fill(src, &mut buf, chunk.saturating_add(1)).await?;
                let length = eof.then_some(buf.len() as u64);
                if let (Some(max), Some(l)) = (self.max, length) {
                    if l > max {
                        return Err(too_large(l, max));
                    }
                }
                let url = self.create(length, meta.as_deref().unwrap_or("")).await?;
                known_length = length;
                if !eof {
                    self.progress.note(&format!(
                        "uploading into {url} (length unknown until the input ends). A pipe cannot be read twice: if this run stops, \
                         run the producer again into `ferry upload - --url {url}` to continue"
                    ));
                }
                (url, 0, 0)
            }
        };
        let mut retry = Retry::new(self.retry_for);
        loop {
            let eof = self.fill(src, &mut buf, chunk.saturating_add(1)).await?;
            let piece = if eof { buf.len() } else { chunk };
            if let Some(max) = self.max.filter(|m| offset + buf.len() as u64 > *m) {
                // More than the server accepts: stop before sending it, and leave nothing behind.
                let deleted = match self.client.terminate(&mut Retry::new(self.retry_for.min(Duration::from_secs(10))), &url).await {
                    Ok(()) => "the unfinished upload was deleted".to_string(),
                    Err(e) => format!("the unfinished upload {url} could not be deleted ({}); delete it with `ferry rm {url}`", e.message),
                };
                let e = too_large(offset + buf.len() as u64, max);
                return Err(CliError { message: format!("the input is more than this server accepts: Tus-Max-Size is {max} bytes; {deleted}"), ..e });
            }
            let total = eof.then_some(offset + piece as u64);
            if piece > 0 || known_length != total {
                offset = self
                    .send(&url, offset, Bytes::copy_from_slice(&buf[..piece]), total, &mut retry)
                    .await
                    .map_err(|e| self.continue_hint(e, &url, eof))?;
                buf.drain(..piece);
            }
            if eof {
                break;
            }
        }
        self.progress.set_total(offset);
        let local = hex::encode(std::mem::take(&mut self.hasher).finalize());
        // Retryable while the server is still finishing it (a pre-finish hook that is down).
        let server = super::upload::finished_sha256(self.client, self.retry_for, &url, offset).await?;
        if local != server {
            return Err(CliError::new(EXIT_VERIFY, format!("sha256 mismatch: the input was {local}, the server stored {server} at {url}")).hint(
                if resumed_from > 0 {
                    "The producer did not write the same bytes as the first time; upload its output as a new upload (without --url)."
                } else {
                    "Upload it again."
                },
            ));
        }
        Ok(Done {
            file: "-".into(),
            id: id_of(&url),
            url: url.to_string(),
            upload_url: None,
            size: offset,
            sha256: local,
            resumed_from,
            sent: self.sent,
        })
    }

    /// After a failure mid-stream: how to continue with a new run.
    fn continue_hint(&self, e: CliError, url: &reqwest::Url, eof: bool) -> CliError {
        if eof && e.code == EXIT_NOT_FOUND {
            return e;
        }
        e.hint(format!(
            "The server keeps what it acknowledged in {url}. To continue, run the same producer again into `ferry upload - --url {url}` \
             (the bytes already there are read again and checked by the final sha256, not sent)."
        ))
    }

    /// Read until `buf` holds `want` bytes or the input ends (`true`), hashing what is read.
    async fn fill(&mut self, src: &mut (dyn AsyncRead + Unpin + Send), buf: &mut Vec<u8>, want: usize) -> Result<bool, CliError> {
        let mut tmp = vec![0u8; READ_CHUNK];
        while buf.len() < want {
            let room = (want - buf.len()).min(tmp.len());
            let n = src.read(&mut tmp[..room]).await.map_err(|e| CliError::new(EXIT_FAILURE, format!("reading the input: {e}")))?;
            if n == 0 {
                return Ok(true);
            }
            self.hasher.update(&tmp[..n]);
            self.read += n as u64;
            buf.extend_from_slice(&tmp[..n]);
        }
        Ok(false)
    }

    /// Read and hash the first `n` bytes of the input without keeping them (`--url` resume).
    async fn skip(&mut self, src: &mut (dyn AsyncRead + Unpin + Send), n: u64) -> Result<(), CliError> {
        let mut tmp = vec![0u8; READ_CHUNK];
        while self.read < n {
            let room = ((n - self.read) as usize).min(tmp.len());
            let got = src.read(&mut tmp[..room]).await.map_err(|e| CliError::new(EXIT_FAILURE, format!("reading the input: {e}")))?;
            if got == 0 {
                return Err(CliError::new(
                    EXIT_VERIFY,
                    format!("the input ended after {} bytes, before the {n} bytes the server already has: it is not the same data", self.read),
                ));
            }
            self.hasher.update(&tmp[..got]);
            self.read += got as u64;
        }
        Ok(())
    }

    /// `POST /files/`: a new upload of `length` bytes, or of deferred length.
    async fn create(&self, length: Option<u64>, meta: &str) -> Result<reqwest::Url, CliError> {
        let endpoint = self.client.url("/files/");
        let what = describe(&reqwest::Method::POST, &endpoint);
        let res = self
            .client
            .send_retrying(&mut Retry::new(self.retry_for), &what, || {
                let r = self.client.request(reqwest::Method::POST, &endpoint).header("tus-resumable", TUS_VERSION);
                let r = match length {
                    Some(l) => r.header("upload-length", l),
                    None => r.header("upload-defer-length", "1"),
                };
                if meta.is_empty() {
                    r
                } else {
                    r.header("upload-metadata", meta)
                }
            })
            .await?;
        self.client.created(&what, res).await
    }

    /// Send `piece` (the input from `offset`) until the server has all of it; with `total`,
    /// declare the upload's length. Failures are retried from the server's offset (HEAD)
    /// within `retry`. Returns the new offset.
    async fn send(&mut self, url: &reqwest::Url, offset: u64, piece: Bytes, total: Option<u64>, retry: &mut Retry) -> Result<u64, CliError> {
        let end = offset + piece.len() as u64;
        let mut at = offset;
        loop {
            let body = piece.slice((at - offset) as usize..);
            let len = body.len() as u64;
            let progress = self.progress.clone();
            // Counted as it goes out, in READ_CHUNK slices.
            let slices: Vec<Bytes> = (0..body.len()).step_by(READ_CHUNK).map(|i| body.slice(i..(i + READ_CHUNK).min(body.len()))).collect();
            let stream = futures::stream::iter(slices).map(move |b| {
                progress.inc(b.len() as u64);
                Ok::<_, std::io::Error>(b)
            });
            let what = format!("{} at offset {at}", describe(&reqwest::Method::PATCH, url));
            let mut req = self
                .client
                .request(reqwest::Method::PATCH, url)
                .header("tus-resumable", TUS_VERSION)
                .header("content-type", OFFSET_OCTET_STREAM)
                .header("upload-offset", at)
                .header("content-length", len);
            if let Some(t) = total {
                req = req.header("upload-length", t);
            }
            self.sent += len;
            let failure = match req.body(reqwest::Body::wrap_stream(stream)).send().await {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let o = typed_header::<ferry_tus::UploadOffset>(r.headers(), "upload-offset").map(|o| o.0);
                    match (status, o) {
                        (200 | 204, Some(o)) if o == end => {
                            retry.success();
                            return Ok(o);
                        }
                        // The server stopped early (it was asked to checkpoint) or its offset
                        // differs: continue from its offset while it is inside this piece.
                        (200 | 204 | 409, Some(o)) if (offset..end).contains(&o) => {
                            let progressed = o > at;
                            at = o;
                            if progressed {
                                retry.success();
                                continue;
                            }
                            CliError::new(super::client::EXIT_NETWORK, format!("{what}: HTTP {status}, and the server kept none of it"))
                        }
                        (s, _) if super::client::retryable_status(s) => CliError::from_response(&what, r).await,
                        _ => return Err(CliError::from_response(&what, r).await),
                    }
                }
                Err(e) => CliError::network(&what, &e),
            };
            retry.wait(failure).await?;
            let info = head(self.client, retry, url).await?;
            match info.offset {
                Some(o) if (offset..=end).contains(&o) => at = o,
                o => {
                    return Err(CliError::new(
                        EXIT_FAILURE,
                        format!(
                            "the server's offset for {url} is {o:?}, outside the piece still \
                             held in memory ({offset} to {end}); a pipe cannot be read again"
                        ),
                    ))
                }
            }
        }
    }
}
