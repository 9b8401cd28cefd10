//! What one append reads: a chunk's bytes, in order, and — for a transport that can send it
//! after them — the chunk's checksum (TUS 1.0 §Checksum, checksum-trailer).
//!
//! The engine knows no transport. The HTTP layer adapts a request body (TUS, the IETF draft)
//! and alone knows trailer names and how to parse them; MCP hands over the chunk it decoded
//! ([`WholeChunk`]); a test may stream anything. A checksum announced before the bytes (TUS's
//! `Upload-Checksum` header, the draft's `Content-Digest`) is not part of this input: the
//! transport's plan carries it (`ferry_tus::PatchPlan::checksum`), as it carries
//! `checksum_in_trailer`, the announcement that one follows the bytes.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use ferry_tus::UploadChecksum;
use futures::Stream;

use crate::error::Refusal;

/// The bytes of one append (a PATCH or creation body, an MCP chunk) as a transport receives
/// them: a [`Stream`] of byte slices in order, of any sizes (an empty slice is allowed and adds
/// nothing), ending with `None` when the chunk is whole, or with one [`ChunkError`] when its
/// bytes stopped arriving before their end. The engine reads each slice once, as it comes; it
/// never buffers the whole chunk.
///
/// A stream that neither yields nor ends is cut by the engine's idle timeout (408).
pub trait ChunkStream: Stream<Item = Result<Bytes, ChunkError>> + Unpin {
    /// Most bytes the chunk carries, if the transport knows before reading them (HTTP: the
    /// `Content-Length`; MCP: the decoded chunk's length); `None` when it does not (HTTP/1.1
    /// chunked transfer coding). A quota's room is checked against it before any byte is
    /// read, so it must not be smaller than what the stream yields. Default: `None`.
    fn len_hint(&self) -> Option<u64> {
        None
    }

    /// The chunk checksum that arrived after the bytes (TUS 1.0 §Checksum with the
    /// checksum-trailer extension: the `Upload-Checksum` trailer), asked once, after the stream
    /// ended with `None`. `None`: no such checksum arrived. `Some(Err)`: one arrived and is
    /// malformed (400, with the transport's words); an unknown algorithm is an error too. A
    /// digest of the wrong length parses and then fails to match (460). Default: `None`, for
    /// a transport that has no way to send one.
    fn trailing_checksum(&mut self) -> Option<Result<UploadChecksum, Refusal>> {
        None
    }

    /// True while the client has sent none of the bytes and waits to be told to (HTTP
    /// `Expect: 100-continue`, RFC 9110 §10.1.1, before the first read): a refusal now costs
    /// it nothing, and the stream is dropped unread. Default: false.
    fn waits_to_send(&self) -> bool {
        false
    }
}

/// Why a chunk's bytes stopped arriving before their end: the client went away, its framing
/// was malformed (a bad chunked encoding), the connection failed. The engine keeps what
/// arrived (unless a checksum had to verify it) and answers 400 with the durable offset; the
/// cause is logged at debug level, never sent to the client.
#[derive(Debug, thiserror::Error)]
#[error("the chunk's bytes stopped before their end: {0}")]
pub struct ChunkError(Box<dyn std::error::Error + Send + Sync>);

impl ChunkError {
    /// The transport's own error (made once per failed request, not per slice).
    pub fn new(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        ChunkError(cause.into())
    }
}

/// A chunk already whole in memory (MCP's `file_upload_chunk`, after base64 decoding): yields
/// its bytes as one slice, then ends. Its [`ChunkStream::len_hint`] is exact.
#[derive(Debug, Clone, Default)]
pub struct WholeChunk(Option<Bytes>);

impl From<Bytes> for WholeChunk {
    fn from(b: Bytes) -> Self {
        WholeChunk(Some(b))
    }
}

impl From<Vec<u8>> for WholeChunk {
    fn from(b: Vec<u8>) -> Self {
        WholeChunk(Some(Bytes::from(b)))
    }
}

impl Stream for WholeChunk {
    type Item = Result<Bytes, ChunkError>;

    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(self.0.take().map(Ok))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::from(self.0.is_some());
        (n, Some(n))
    }
}

impl ChunkStream for WholeChunk {
    fn len_hint(&self) -> Option<u64> {
        Some(self.0.as_ref().map_or(0, |b| b.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn a_whole_chunk_yields_its_bytes_once_and_knows_its_length() {
        let mut c = WholeChunk::from(Bytes::from_static(b"hello"));
        assert_eq!(c.len_hint(), Some(5));
        assert_eq!(c.next().await.unwrap().unwrap(), Bytes::from_static(b"hello"));
        assert_eq!(c.len_hint(), Some(0), "nothing more to come");
        assert!(c.next().await.is_none());
        assert!(c.trailing_checksum().is_none(), "no trailer: MCP has none");
    }
}
