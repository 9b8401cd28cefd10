//! A request body as the upload engine's input ([`crate::upload::ChunkStream`]): its data
//! frames are the chunk's bytes, its `Upload-Checksum` trailer (TUS 1.0 §Checksum,
//! checksum-trailer) the checksum that follows them. Trailer names and their parsing live here,
//! not in the engine; checksums sent as headers (TUS `Upload-Checksum`, the draft's
//! `Content-Digest`) reach the engine through the request's plan.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::body::Body;
use axum::http::HeaderValue;
use bytes::Bytes;
use ferry_tus::UploadChecksum;
use http_body::Body as _;

use crate::error::{Next, Refusal, TrailerFault};
use crate::upload::{ChunkError, ChunkStream};

/// A PATCH or creation request's body, read frame by frame (no copy, no allocation per frame).
/// A trailers frame is kept aside: its `Upload-Checksum`, parsed, is what
/// [`ChunkStream::trailing_checksum`] returns once the data has ended; other trailers are
/// ignored.
pub(super) struct BodyChunk {
    body: Body,
    trailer: Option<Result<UploadChecksum, Refusal>>,
    /// The client waits for `100 Continue` before it sends the body (`Expect: 100-continue`,
    /// RFC 9110 §10.1.1) and nothing was read yet: hyper sends the `100` on the first read.
    unasked: bool,
}

impl BodyChunk {
    /// The body of a request with headers `h`.
    pub(super) fn new(body: Body, h: &axum::http::HeaderMap) -> Self {
        let unasked = h.get_all(axum::http::header::EXPECT).iter().any(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        BodyChunk { body, trailer: None, unasked }
    }
}

impl futures::Stream for BodyChunk {
    type Item = Result<Bytes, ChunkError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.unasked = false;
        loop {
            let frame = match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                None => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(ChunkError::new(e)))),
                Some(Ok(f)) => f,
            };
            match frame.into_data() {
                Ok(data) => return Poll::Ready(Some(Ok(data))),
                Err(frame) => {
                    if let Some(v) = frame.trailers_ref().and_then(|t| t.get("upload-checksum")) {
                        self.trailer = Some(trailer_checksum(v));
                    }
                }
            }
        }
    }
}

impl ChunkStream for BodyChunk {
    /// The body's exact length when it has one (`Content-Length`), else `None` (chunked).
    fn len_hint(&self) -> Option<u64> {
        self.body.size_hint().upper()
    }

    fn trailing_checksum(&mut self) -> Option<Result<UploadChecksum, Refusal>> {
        self.trailer.take()
    }

    fn waits_to_send(&self) -> bool {
        self.unasked
    }
}

/// The `Upload-Checksum` trailer, parsed as the header is (one parser: malformed or unknown
/// algorithm → 400; a digest of the wrong length parses and then fails to match → 460).
fn trailer_checksum(v: &HeaderValue) -> Result<UploadChecksum, Refusal> {
    let s = v.to_str().map_err(|_| Refusal::bad_request("Upload-Checksum trailer is not ASCII", Next::Trailer(TrailerFault::NotAscii)))?;
    Ok(ferry_tus::parse_upload_checksum(s)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    /// A body of two data frames and a trailers frame, as hyper yields a chunked request.
    fn body_with_trailer(trailer: &'static str) -> Body {
        let mut trailers = axum::http::HeaderMap::new();
        trailers.insert("upload-checksum", HeaderValue::from_static(trailer));
        let frames = vec![
            Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from_static(b"he"))),
            Ok(http_body::Frame::data(Bytes::from_static(b"llo"))),
            Ok(http_body::Frame::trailers(trailers)),
        ];
        Body::new(http_body_util::StreamBody::new(futures::stream::iter(frames)))
    }

    #[tokio::test]
    async fn data_frames_are_the_bytes_and_the_trailer_is_read_after_them() {
        let mut c = BodyChunk::new(body_with_trailer("sha1 qvTGHdzF6KLavt4PO0gs2a6pQ00="), &Default::default());
        let mut got = Vec::new();
        while let Some(b) = c.next().await {
            got.extend_from_slice(&b.unwrap());
        }
        assert_eq!(got, b"hello");
        let t = c.trailing_checksum().expect("the trailer arrived").expect("it parses");
        assert_eq!(t, ferry_tus::parse_upload_checksum("sha1 qvTGHdzF6KLavt4PO0gs2a6pQ00=").unwrap());
        assert!(c.trailing_checksum().is_none(), "asked once");
    }

    #[tokio::test]
    async fn a_malformed_trailer_is_a_400_and_a_plain_body_has_none() {
        let mut c = BodyChunk::new(body_with_trailer("crc32 AAAA"), &Default::default());
        while c.next().await.is_some() {}
        assert_eq!(c.trailing_checksum().unwrap().unwrap_err().status, 400);

        let mut c = BodyChunk::new(Body::from("abc"), &Default::default());
        assert_eq!(c.len_hint(), Some(3), "the exact length of a body that has one");
        assert_eq!(c.next().await.unwrap().unwrap(), Bytes::from_static(b"abc"));
        assert!(c.next().await.is_none());
        assert!(c.trailing_checksum().is_none());
    }
}
