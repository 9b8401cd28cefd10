//! Concatenation inside S3 ([`BlobStore::compose`](super::super::BlobStore::compose)): a final
//! upload's parts are UploadPartCopy requests of its sources' byte ranges, so its bytes never
//! pass through ferry, except where a part spans two sources (such a part is read and uploaded,
//! at most one part per boundary). Every part but the last has the one size
//! [`fixed_part_size`] picks for the total, as for any other upload (R2's rule).

use std::ops::Range;
use std::time::Duration;

use bytes::BytesMut;
use futures::{StreamExt, TryStreamExt};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, MultipartId, ObjectStore, ObjectStoreExt, PutPayload};

use super::state::{fixed_part_size, MAX_PARTS, MIN_PART};
use backon::Retryable;

use super::errors::{refusal, Answer};
use super::{bounded, deadline_for, io, own_retries, own_retries_count, Failure, Inner, REQUEST_DEADLINE};
use crate::blob::{BlobError, BlobResult};

/// Why a composition did not happen.
pub(super) enum ComposeError {
    /// The store refused an UploadPartCopy for good (`501 NotImplemented`, `411`, `403`…): it
    /// cannot compose these sources, and the caller streams them through a writer instead.
    /// `unimplemented`: it said it has no UploadPartCopy at all (501), so no composition will.
    CannotCopy { what: String, unimplemented: bool },
    /// Anything else, as [`BlobError`].
    Blob(BlobError),
}

impl From<BlobError> for ComposeError {
    fn from(e: BlobError) -> Self {
        ComposeError::Blob(e)
    }
}

/// How long a CompleteMultipartUpload of `parts` parts may take before ferry asks whether it
/// happened: S3 may take minutes to assemble thousands of parts (it keeps the connection alive
/// meanwhile and may answer 200 with an error body), so the request is waited out — one
/// minute, plus 100 ms a part — and never sent again while it may still be under way.
pub(super) fn completion_deadline(parts: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_millis(parts as u64 * 100)
}

impl Inner {
    /// UploadPartCopy (S3 API reference): part `idx` (0-based) of multipart upload `mp` on
    /// `to` becomes bytes `range` of object `from`, copied inside S3. object_store 0.14 sends
    /// UploadPartCopy only within its own whole-object `copy` and does not expose it; it does
    /// expose SigV4 presigning with signed query parameters and headers
    /// ([`Signer::signed_url_opts`]), so this request goes to a URL object_store signs
    /// (`partNumber`, `uploadId`, `x-amz-copy-source`, `x-amz-copy-source-range` all under
    /// the signature) — no signing code of ferry's own. It has no body and says so
    /// (`Content-Length: 0`: AWS answers 411 to a body-less PUT without one). Failures are
    /// decided by status and code ([`Answer`]); S3 may answer 200 with an `<Error>` body,
    /// which is one too. A refusal for good is [`ComposeError::CannotCopy`].
    async fn copy_part(&self, to: &Path, mp: &str, idx: usize, from: &Path, range: Range<u64>) -> Result<PartId, ComposeError> {
        use object_store::signer::Signer;
        const KEY: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b'/');
        let source = format!("{}/{}", self.bucket, percent_encoding::utf8_percent_encode(from.as_ref(), KEY));
        let source_range = format!("bytes={}-{}", range.start, range.end - 1);
        let header = |v: &str| http::HeaderValue::from_str(v).map_err(|e| BlobError::Io(std::io::Error::other(e)));
        let (src_h, range_h) = (header(&source)?, header(&source_range)?);
        let opts = part_query(mp, idx + 1)
            .with_signed_header(http::HeaderName::from_static("x-amz-copy-source"), src_h.clone())
            .with_signed_header(http::HeaderName::from_static("x-amz-copy-source-range"), range_h.clone());
        let url = self.s3.signed_url_opts(http::Method::PUT, to, Duration::from_secs(3600), &opts).await.map_err(io)?;
        let op = format!("UploadPartCopy of {source_range} into part {}", idx + 1);
        let attempt = || async {
            let request = self
                .http
                .put(url.clone())
                .header("x-amz-copy-source", src_h.clone())
                .header("x-amz-copy-source-range", range_h.clone())
                .header(http::header::CONTENT_LENGTH, 0)
                .timeout(REQUEST_DEADLINE + Duration::from_secs(range.end.saturating_sub(range.start) / (64 << 20)));
            let sent = self.requests.send("UploadPartCopy", request).await;
            Err(match sent {
                Ok(r) => {
                    let status = r.status().as_u16();
                    match r.text().await {
                        Ok(body) if (200..300).contains(&status) && !body.contains("<Error>") => return Ok(body),
                        Ok(body) => Answer::of(status, &body),
                        Err(_) => Answer::default(),
                    }
                }
                Err(_) => Answer::default(),
            })
        };
        let body = match attempt.retry(own_retries()).when(|a: &Answer| a.failure() == Failure::Unavailable).await {
            Ok(body) => body,
            Err(a) if a.failure() == Failure::Refused => {
                let unimplemented = a.status == Some(501) || a.code.as_deref() == Some("NotImplemented");
                return Err(ComposeError::CannotCopy { what: a.refused(&op).to_string(), unimplemented });
            }
            Err(a) => return Err(refusal(&op, &a).into()),
        };
        let etag = body
            .split("<ETag>")
            .nth(1)
            .and_then(|t| t.split("</ETag>").next())
            .ok_or_else(|| BlobError::Unavailable(format!("S3 {op}: no ETag in the answer")))?;
        Ok(PartId { content_id: etag.replace("&quot;", "\"").replace("&#34;", "\"").replace("&amp;", "&") })
    }

    /// UploadPart (S3 API reference) of part number `number` of multipart upload `mp` on `to`,
    /// its body exactly `size` bytes taken from `body` as they arrive, so a part is on its way
    /// while it is still being received. object_store 0.14's `put_part` takes a whole part in
    /// memory, so this request goes to a URL object_store signs (`partNumber` and `uploadId`
    /// under the signature; the body is an unsigned payload, as presigned requests' are — the
    /// caller streams only over TLS or loopback, see [`Inner::stream_part`]). Not retried
    /// (its body is gone once sent) and not bounded in time here: the caller bounds the wait
    /// for S3's answer once the body is whole. Errors: a body that ends short of `size` (the
    /// sender went away) or any refusal, as [`BlobError::Unavailable`] with S3's status and
    /// code; the caller then sends the part whole.
    pub(super) async fn stream_part(
        &self,
        to: &Path,
        mp: &str,
        number: u32,
        size: u64,
        mut body: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    ) -> BlobResult<PartId> {
        use object_store::signer::Signer;
        let url = self.s3.signed_url_opts(http::Method::PUT, to, Duration::from_secs(3600), &part_query(mp, number as usize)).await.map_err(io)?;
        let unavailable = |what: String| BlobError::Unavailable(format!("S3 UploadPart {number}, streamed: {what}"));
        let feed = futures::stream::poll_fn(move |cx| body.poll_recv(cx).map(|b| b.map(Ok::<_, std::io::Error>)));
        let sent = async {
            let r = self.requests.send("UploadPart", streamed_put(&self.http, url, size, feed)).await?;
            let etag = r.headers().get(http::header::ETAG).and_then(|v| v.to_str().ok()).map(str::to_string);
            let status = r.status();
            Ok::<_, reqwest::Error>((status, etag, r.text().await?))
        };
        match sent.await {
            Ok((status, Some(etag), _)) if status.is_success() => Ok(PartId { content_id: etag }),
            Ok((status, _, body)) => Err(unavailable(Answer::of(status.as_u16(), &body).to_string())),
            Err(_) => Err(unavailable("the request stopped".into())),
        }
    }

    /// CompleteMultipartUpload (S3 API reference) of multipart upload `mp` on `to` from
    /// `parts` (`(part number, content id)`, ascending). object_store 0.14 numbers the parts it
    /// completes 1, 2, 3… by position, and ferry's parts have numbers of their own (each
    /// attempt at a part a new one: [`super::state::Numbering`]), so this request goes to a URL
    /// object_store signs (`uploadId` under the signature; the body is sent as an unsigned
    /// payload, as presigned requests are).
    ///
    /// A completion is never sent twice while the first may still be under way: it is waited
    /// out ([`completion_deadline`]); when no answer came (a deadline, a dropped connection)
    /// its outcome is confirmed first — the object of `expect` bytes is there: done; the
    /// multipart upload is gone without it: lost — and only a multipart upload still open is
    /// completed again (a retry S3 treats as the same completion: the same parts).
    /// Errors: `NoSuchUpload` (confirmed) and refusals that repeating cannot change
    /// (`InvalidPart`, `EntityTooSmall`, …) are [`BlobError::Lost`]; a store that is away is
    /// `Unavailable` after the same bounded retries as object_store's.
    pub(super) async fn complete_numbered(&self, to: &Path, mp: &str, parts: &[(u32, String)], expect: Option<u64>) -> BlobResult<()> {
        use object_store::signer::{SignedUrlOptions, Signer};
        let esc = |v: &str| v.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        let mut xml = String::from("<CompleteMultipartUpload>");
        for (number, cid) in parts {
            // object_store keeps a part's ETag as its content id (with no checksums configured).
            xml.push_str(&format!("<Part><PartNumber>{number}</PartNumber><ETag>{}</ETag></Part>", esc(cid)));
        }
        xml.push_str("</CompleteMultipartUpload>");
        let opts = SignedUrlOptions::new().with_query([("uploadId", mp.to_string())]);
        let url = self.s3.signed_url_opts(http::Method::POST, to, Duration::from_secs(3600), &opts).await.map_err(io)?;
        let lost = |what: String| BlobError::Lost { kept: 0, why: format!("S3 refused to complete its multipart upload: {what}") };
        let deadline = completion_deadline(parts.len());
        let attempt = || async {
            let sent = tokio::time::timeout(deadline, async {
                let r = self
                    .requests
                    .send("CompleteMultipartUpload", self.http.post(url.clone()).header("content-type", "application/xml").body(xml.clone()))
                    .await?;
                let status = r.status();
                Ok::<_, reqwest::Error>((status, r.text().await?))
            })
            .await;
            Err(match sent {
                Ok(Ok((status, body))) if status.is_success() && !body.contains("<Error>") => return Ok(()),
                Ok(Ok((status, body))) => Answer::of(status.as_u16(), &body),
                Ok(Err(_)) | Err(_) => Answer::default(),
            })
        };
        let mut tries = 0;
        let result = loop {
            tries += 1;
            let Err(a): Result<(), Answer> = attempt().await else { break Ok(()) };
            if a.failure() == Failure::Refused {
                break Err(a);
            }
            // No answer, a 404, or a failure that may be a store's word for an upload that is
            // gone (moto answers 500): look before deciding, and before sending it again.
            match self.completion_outcome(to, mp, expect).await {
                Some(true) => break Ok(()),
                Some(false) => break Err(Answer { status: Some(404), code: Some("NoSuchUpload".into()) }),
                None => {}
            }
            if tries > own_retries_count() {
                // Still listed (or the store cannot tell): one that may pass.
                break Err(Answer { status: a.status.filter(|&s| s != 404).or(Some(503)), code: a.code.filter(|c| c != "NoSuchUpload") });
            }
            tokio::time::sleep(Duration::from_millis(100 << tries.min(4))).await;
        };
        match result {
            Ok(()) => Ok(()),
            Err(a) => match a.failure() {
                Failure::Unavailable => Err(BlobError::Unavailable(format!("S3 CompleteMultipartUpload: {a}"))),
                Failure::NotFound => {
                    Err(lost(format!("NoSuchUpload (a bucket lifecycle rule, or someone else aborted it; confirmed by listing): {a}")))
                }
                // The parts cannot make the object (S3 API reference, CompleteMultipartUpload
                // errors): the upload is rolled back to what the store still has.
                Failure::Refused
                    if matches!(
                        a.code.as_deref(),
                        Some("InvalidPart" | "InvalidPartOrder" | "EntityTooSmall" | "EntityTooLarge" | "MalformedXML")
                    ) =>
                {
                    Err(lost(a.to_string()))
                }
                // Refused for another reason (credentials, a policy, a request it does not
                // take): the parts are fine, and nothing is rolled back.
                Failure::Refused => Err(a.refused("CompleteMultipartUpload")),
            },
        }
    }

    /// Whether a completion of multipart upload `mp` on `to` happened: `Some(true)` when the
    /// object is there with `expect` bytes (or at all, when `expect` is unknown) and the
    /// multipart upload is gone; `Some(false)` when both are gone (lost); `None` when the
    /// multipart upload is still open, or the store cannot tell now.
    pub(super) async fn completion_outcome(&self, to: &Path, mp: &str, expect: Option<u64>) -> Option<bool> {
        let open = self.multiparts_under(to.as_ref()).await.ok()?.into_iter().any(|(k, u)| k == to.as_ref() && u == mp);
        if open {
            return None;
        }
        // A completion under way elsewhere removes the multipart upload before the object
        // shows (seen on Garage): give it the moment a finisher gives it.
        for poll in 0..=super::COMPLETION_POLLS {
            let len = self.exists(to).await.ok()?;
            match (len, expect) {
                (Some(n), Some(e)) if n == e => return Some(true),
                (Some(_), None) => return Some(true),
                _ if poll < super::COMPLETION_POLLS => tokio::time::sleep(super::COMPLETION_POLL).await,
                _ => {}
            }
        }
        Some(false)
    }

    /// Whether multipart upload `mp` on `to` is gone for sure (ListMultipartUploads does not
    /// list it): a 404 from one request is confirmed so before anything is rolled back. `false`
    /// when it is listed or the store cannot tell now.
    pub(super) async fn multipart_gone(&self, to: &Path, mp: &str) -> bool {
        match self.multiparts_under(to.as_ref()).await {
            Ok(open) => !open.iter().any(|(k, u)| k == to.as_ref() && u == mp),
            Err(_) => false,
        }
    }

    /// [`Inner::compose_part`] for [`WriteLease::run`](crate::blob::WriteLease::run).
    async fn compose_part_under(
        &self,
        path: &Path,
        mp: &str,
        idx: usize,
        piece: &Piece,
        sources: &[(String, u64)],
    ) -> BlobResult<Result<PartId, ComposeError>> {
        Ok(self.compose_part(path, mp, idx, piece, sources).await)
    }

    /// Part `idx` of a composition on `path` (multipart upload `mp`): copied, or streamed
    /// within the store's memory budget.
    async fn compose_part(&self, path: &Path, mp: &str, idx: usize, piece: &Piece, sources: &[(String, u64)]) -> Result<PartId, ComposeError> {
        match piece {
            Piece::Copy { src, range } => self.copy_part(path, mp, idx, &self.object(&sources[*src].0), range.clone()).await,
            Piece::Stream(ranges) => {
                let len: u64 = ranges.iter().map(|(_, r)| r.end - r.start).sum();
                let _room = self.budget.reserve(len, &self.parked).await?;
                let mut buf = BytesMut::with_capacity(len as usize);
                for (src, range) in ranges {
                    let opts = GetOptions { range: Some(GetRange::Bounded(range.clone())), ..Default::default() };
                    let got = bounded(REQUEST_DEADLINE, self.s3.get_opts(&self.object(&sources[*src].0), opts)).await.map_err(io)?;
                    buf.extend_from_slice(&bounded(deadline_for(range.end - range.start), got.bytes()).await.map_err(io)?);
                }
                let mpid = MultipartId::from(mp.to_string());
                let deadline = deadline_for(buf.len() as u64);
                Ok(bounded(deadline, self.s3.put_part(path, &mpid, idx, PutPayload::from(buf.freeze()))).await.map_err(io)?)
            }
        }
    }

    /// Build `id` from finished objects (see [`BlobStore::compose`]) along `plan`, every
    /// request under `lease`. The object `<id>` is never removed: an earlier attempt's
    /// multipart uploads and tail go, a fresh multipart upload is completed on the key, so a
    /// composer whose lease ran out mid-way (a stall, a pause) can at most complete the same
    /// bytes again — a final another composer finished stays readable.
    pub(super) async fn compose(
        &self,
        id: &str,
        sources: &[(String, u64)],
        plan: &[Piece],
        lease: &crate::blob::WriteLease,
    ) -> Result<(), ComposeError> {
        let total: u64 = sources.iter().map(|s| s.1).sum();
        lease
            .run(async {
                self.abort_multiparts(id, None).await?;
                self.delete_segments(id, &std::collections::HashSet::new()).await
            })
            .await?;
        let path = self.object(id);
        let mp = lease
            .run(async {
                let mp = bounded(REQUEST_DEADLINE, self.s3.create_multipart(&path)).await.map_err(io)?;
                bounded(REQUEST_DEADLINE, self.s3.put(&self.mpu_marker(id, &mp), PutPayload::new())).await.map_err(io)?;
                Ok(mp)
            })
            .await?;
        // Up to 4 parts at once (UploadPartCopy of a large range takes S3 a while).
        type PartFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<PartId, ComposeError>> + Send + 'a>>;
        let mut pending: Vec<PartFuture<'_>> = Vec::with_capacity(plan.len());
        for (idx, piece) in plan.iter().enumerate() {
            let (path, mp) = (&path, &mp);
            pending.push(Box::pin(async move {
                match lease.run(self.compose_part_under(path, mp, idx, piece, sources)).await {
                    Ok(r) => r,
                    Err(e) => Err(ComposeError::Blob(e)),
                }
            }));
        }
        let parts = futures::stream::iter(pending).buffered(4).try_collect::<Vec<PartId>>().await;
        let done = match parts {
            Ok(parts) => {
                let numbered: Vec<(u32, String)> = parts.into_iter().enumerate().map(|(i, p)| (i as u32 + 1, p.content_id)).collect();
                lease.run(self.complete_numbered(&path, &mp, &numbered, Some(total))).await.map_err(ComposeError::Blob)
            }
            Err(e) => Err(e),
        };
        if let Err(e) = done {
            // Best effort: if S3 is away, the marker lets a later abort or delete find it.
            if self.s3.abort_multipart(&path, &MultipartId::from(mp.clone())).await.is_ok() {
                let _ = self.delete_quiet(&self.mpu_marker(id, &mp)).await;
            }
            return Err(e);
        }
        self.delete_quiet(&self.mpu_marker(id, &mp)).await?;
        self.delete_quiet(&self.created(id)).await?;
        Ok(())
    }
}

/// A PUT of exactly `size` bytes taken from `feed` as they come: `Content-Length: size`, not
/// chunked (S3 refuses an UploadPart without a length: 411 `MissingContentLength`).
fn streamed_put<S>(http: &reqwest::Client, url: url::Url, size: u64, feed: S) -> reqwest::RequestBuilder
where
    S: futures::Stream<Item = std::io::Result<bytes::Bytes>> + Send + Sync + 'static,
{
    http.put(url).header(http::header::CONTENT_LENGTH, size).body(reqwest::Body::wrap_stream(feed))
}

/// Presigning options of a request on part number `number` (1-based) of multipart upload `mp`
/// (UploadPart, UploadPartCopy): both under the signature.
fn part_query(mp: &str, number: usize) -> object_store::signer::SignedUrlOptions {
    object_store::signer::SignedUrlOptions::new().with_query([("partNumber", number.to_string()), ("uploadId", mp.to_string())])
}

/// One part of a composed blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Bytes `range` of source `src`, copied inside S3 (UploadPartCopy).
    Copy { src: usize, range: Range<u64> },
    /// These source ranges, read and uploaded as one part (a part that spans sources).
    Stream(Vec<(usize, Range<u64>)>),
}

/// How to compose sources of lengths `lens` (bytes) into parts of `part` bytes each but the
/// last: a part inside one source is copied inside S3 unless it is shorter than a part and than
/// [`MIN_PART`] (a short last part is streamed: Garage refuses smaller copies); a part
/// that spans sources is streamed.
/// `None` when nothing would be copied (streaming through a writer is as good), or the parts
/// would exceed [`MAX_PARTS`].
pub(crate) fn compose_plan(lens: &[u64], part: u64) -> Option<Vec<Piece>> {
    let total: u64 = lens.iter().sum();
    if total == 0 || part == 0 || total.div_ceil(part) > MAX_PARTS {
        return None;
    }
    let mut plan = Vec::with_capacity(total.div_ceil(part) as usize);
    // Sources as (index, start in the whole, length), empty ones left out.
    let mut at = 0;
    let sources: Vec<(usize, u64, u64)> = lens
        .iter()
        .enumerate()
        .filter(|(_, &l)| l > 0)
        .map(|(i, &l)| {
            let s = (i, at, l);
            at += l;
            s
        })
        .collect();
    let mut first = 0;
    let mut start = 0;
    while start < total {
        let end = (start + part).min(total);
        while sources[first].1 + sources[first].2 <= start {
            first += 1;
        }
        let mut ranges = Vec::new();
        for &(i, s, l) in &sources[first..] {
            if s >= end {
                break;
            }
            ranges.push((i, start.max(s) - s..end.min(s + l) - s));
        }
        plan.push(match <[_; 1]>::try_from(ranges) {
            // Garage refuses an UploadPartCopy of less than 5 MiB, even as the last part.
            Ok([(src, range)]) if range.end - range.start >= part.min(MIN_PART) => Piece::Copy { src, range },
            Ok([one]) => Piece::Stream(vec![one]),
            Err(ranges) => Piece::Stream(ranges),
        });
        start = end;
    }
    plan.iter().any(|p| matches!(p, Piece::Copy { .. })).then_some(plan)
}

/// The plan [`Inner::compose`] follows for sources of `lens` bytes under part floor `floor`.
pub(crate) fn plan_for(lens: &[u64], floor: u64) -> Option<Vec<Piece>> {
    compose_plan(lens, fixed_part_size(lens.iter().sum(), floor))
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_streamed_part_goes_with_its_length_not_chunked() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = url::Url::parse(&format!("http://{}/b/k?partNumber=1&uploadId=u", listener.local_addr().unwrap())).unwrap();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(5).any(|w| w == b"world") {
                let n = sock.read(&mut buf).await.unwrap();
                assert!(n > 0, "the body ended early: {}", String::from_utf8_lossy(&got));
                got.extend_from_slice(&buf[..n]);
            }
            sock.write_all(b"HTTP/1.1 200 OK\r\netag: \"e\"\r\ncontent-length: 0\r\n\r\n").await.unwrap();
            String::from_utf8_lossy(&got).to_ascii_lowercase()
        });
        let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(2);
        let feed = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|b| b.map(Ok::<_, std::io::Error>)));
        let sending = tokio::spawn(super::streamed_put(&reqwest::Client::new(), url, 10, feed).send());
        tx.send(bytes::Bytes::from_static(b"hel")).await.unwrap();
        tx.send(bytes::Bytes::from_static(b"lo")).await.unwrap();
        tx.send(bytes::Bytes::from_static(b"world")).await.unwrap();
        drop(tx);
        let head = server.await.unwrap();
        assert!(head.contains("content-length: 10\r\n") && !head.contains("transfer-encoding"), "{head}");
        assert_eq!(sending.await.unwrap().unwrap().status(), 200);
    }

    use super::*;

    /// Each part: its byte count, and whether it is copied.
    fn sizes(plan: &[Piece]) -> Vec<(u64, bool)> {
        plan.iter()
            .map(|p| match p {
                Piece::Copy { range, .. } => (range.end - range.start, true),
                Piece::Stream(rs) => (rs.iter().map(|(_, r)| r.end - r.start).sum(), false),
            })
            .collect()
    }

    #[test]
    fn compose_plans_copy_inside_sources_and_stream_across_them() {
        let c = |src, range| Piece::Copy { src, range };
        let one = |src, range| Piece::Stream(vec![(src, range)]);
        assert_eq!(compose_plan(&[6], 5), Some(vec![c(0, 0..5), one(0, 5..6)]), "a short last part is streamed (Garage refuses copies under 5 MiB)");
        assert_eq!(compose_plan(&[3], 5), None, "a source shorter than a part is never copied");
        assert_eq!(compose_plan(&[10, 10], 5), Some(vec![c(0, 0..5), c(0, 5..10), c(1, 0..5), c(1, 5..10)]));
        assert_eq!(compose_plan(&[1, 12], 5), Some(vec![Piece::Stream(vec![(0, 0..1), (1, 0..4)]), c(1, 4..9), one(1, 9..12)]));
        assert_eq!(compose_plan(&[1, 1], 5), None, "nothing to copy: stream");
        assert_eq!(compose_plan(&[0, 0], 5), None);
        assert_eq!(compose_plan(&[], 5), None);
        assert_eq!(compose_plan(&vec![MIN_PART; 10_001], MIN_PART), None, "more than 10 000 parts: stream");
        assert_eq!(compose_plan(&[3], MIN_PART), None, "a source under 5 MiB is never copied (Garage refuses it)");
        let p = compose_plan(&[MIN_PART + 3], MIN_PART).unwrap();
        assert!(matches!(p[0], Piece::Copy { .. }) && matches!(&p[1], Piece::Stream(r) if r.len() == 1), "a short last part is streamed");
        assert!(plan_for(&[3 << 40, 2 << 40], MIN_PART).is_some(), "5 TiB: parts sized to fit");

        // Any lengths: the parts cover every source in order, every part but the last has
        // exactly the part size, and a streamed part always spans sources.
        let mut seed = 0x9e3779b97f4a7c15u64;
        for _ in 0..2_000 {
            let mut next = |m: u64| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (seed >> 33) % m
            };
            let n = 1 + next(7) as usize;
            let lens: Vec<u64> = (0..n).map(|_| [0, 1, 4, 5, 6, 9, 10, 11, 23][next(9) as usize]).collect();
            let Some(plan) = compose_plan(&lens, 5) else { continue };
            let mut at = vec![0u64; n];
            let mut order = Vec::new();
            for p in &plan {
                let ranges = match p {
                    Piece::Copy { src, range } => vec![(*src, range.clone())],
                    Piece::Stream(rs) => {
                        let short = rs.iter().map(|(_, r)| r.end - r.start).sum::<u64>() < 5;
                        assert!(rs.len() > 1 || short, "one source streamed only when short: {lens:?} {plan:?}");
                        rs.clone()
                    }
                };
                for (src, r) in ranges {
                    assert_eq!(r.start, at[src], "{lens:?} {plan:?}");
                    assert!(r.end > r.start);
                    at[src] = r.end;
                    order.push(src);
                }
            }
            assert_eq!(at, lens, "every byte once: {plan:?}");
            assert!(order.windows(2).all(|w| w[0] <= w[1]), "in order: {plan:?}");
            let sz = sizes(&plan);
            assert!(sz[..sz.len() - 1].iter().all(|&(b, _)| b == 5), "{lens:?} {plan:?}");
        }
    }
}
