//! Digests: the running sha256 of a whole upload with a durable midstate, and the per-chunk
//! checksums of TUS 1.0 §Checksum.

use digest::common::hazmat::{SerializableState, SerializedState};
use digest::Digest;
use ferry_tus::ChecksumAlgorithm;

/// Format tag of a stored sha256 midstate: sha2 0.11 `SerializableState` of `Sha256`, version 1.
/// Any other tag is refused, so a future format change cannot be misread.
const STATE_TAG: &[u8; 8] = b"sha256v1";

/// The sha256 of bytes `[0, offset)` of an upload, resumable from its stored midstate.
#[derive(Clone, Default)]
pub struct RunningSha256(sha2::Sha256);

/// A stored midstate that cannot be decoded.
#[derive(Debug, thiserror::Error)]
#[error("stored sha256 midstate is not in format sha256v1")]
pub struct BadState;

impl RunningSha256 {
    pub fn new() -> Self {
        Self::default()
    }

    /// Restore from [`RunningSha256::state`] output. An empty slice is the state of no bytes.
    pub fn from_state(state: &[u8]) -> Result<Self, BadState> {
        if state.is_empty() {
            return Ok(Self::new());
        }
        let body = state.strip_prefix(STATE_TAG.as_slice()).ok_or(BadState)?;
        let ser = SerializedState::<sha2::Sha256>::try_from(body).map_err(|_| BadState)?;
        sha2::Sha256::deserialize(&ser).map(RunningSha256).map_err(|_| BadState)
    }

    /// The tagged midstate: 8-byte tag + sha2's serialized state (104 bytes).
    pub fn state(&self) -> Vec<u8> {
        let ser = self.0.serialize();
        let mut out = Vec::with_capacity(STATE_TAG.len() + ser.len());
        out.extend_from_slice(STATE_TAG);
        out.extend_from_slice(ser.as_slice());
        out
    }

    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// The digest of everything so far (the running state is not consumed).
    pub fn digest(&self) -> [u8; 32] {
        self.0.clone().finalize().into()
    }
}

/// One per-chunk digest for `Upload-Checksum`.
#[derive(Clone)]
pub enum ChunkDigest {
    Sha1(sha1::Sha1),
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
    Md5(md5::Md5),
}

impl ChunkDigest {
    pub fn new(alg: ChecksumAlgorithm) -> Self {
        match alg {
            ChecksumAlgorithm::Sha1 => ChunkDigest::Sha1(Default::default()),
            ChecksumAlgorithm::Sha256 => ChunkDigest::Sha256(Default::default()),
            ChecksumAlgorithm::Sha512 => ChunkDigest::Sha512(Default::default()),
            ChecksumAlgorithm::Md5 => ChunkDigest::Md5(Default::default()),
        }
    }

    pub fn algorithm(&self) -> ChecksumAlgorithm {
        match self {
            ChunkDigest::Sha1(_) => ChecksumAlgorithm::Sha1,
            ChunkDigest::Sha256(_) => ChecksumAlgorithm::Sha256,
            ChunkDigest::Sha512(_) => ChecksumAlgorithm::Sha512,
            ChunkDigest::Md5(_) => ChecksumAlgorithm::Md5,
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match self {
            ChunkDigest::Sha1(h) => h.update(data),
            ChunkDigest::Sha256(h) => h.update(data),
            ChunkDigest::Sha512(h) => h.update(data),
            ChunkDigest::Md5(h) => h.update(data),
        }
    }

    pub fn finish(self) -> Vec<u8> {
        match self {
            ChunkDigest::Sha1(h) => h.finalize().to_vec(),
            ChunkDigest::Sha256(h) => h.finalize().to_vec(),
            ChunkDigest::Sha512(h) => h.finalize().to_vec(),
            ChunkDigest::Md5(h) => h.finalize().to_vec(),
        }
    }
}

/// The chunk digests a PATCH must compute: the one its `Upload-Checksum` header names, or
/// every supported algorithm when the checksum will only arrive as a trailer.
#[derive(Clone, Default)]
pub struct ChunkDigests(Vec<ChunkDigest>);

impl ChunkDigests {
    pub fn for_header(alg: ChecksumAlgorithm) -> Self {
        ChunkDigests(vec![ChunkDigest::new(alg)])
    }

    pub fn for_trailer() -> Self {
        ChunkDigests(ChecksumAlgorithm::ALL.iter().map(|a| ChunkDigest::new(*a)).collect())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn update(&mut self, data: &[u8]) {
        for d in &mut self.0 {
            d.update(data);
        }
    }

    /// Whether `expected` matches the digest of its algorithm (false if it was not computed,
    /// and for a digest of the wrong length, which no bytes can match).
    pub fn matches(self, expected: &ferry_tus::UploadChecksum) -> bool {
        self.0.into_iter().find(|d| d.algorithm() == expected.algorithm).is_some_and(|d| expected.matches(&d.finish()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn midstate_roundtrip_resumes_the_same_digest() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let whole = sha2::Sha256::digest(&data);
        let mut a = RunningSha256::new();
        a.update(&data[..4_321]);
        let state = a.state();
        assert_eq!(state.len(), 8 + 104);
        let mut b = RunningSha256::from_state(&state).unwrap();
        b.update(&data[4_321..]);
        assert_eq!(b.digest().as_slice(), whole.as_slice());
        assert!(RunningSha256::from_state(b"garbage!").is_err());
        assert!(RunningSha256::from_state(&state[..50]).is_err());
        assert_eq!(RunningSha256::from_state(&[]).unwrap().digest(), RunningSha256::new().digest());
    }
}

/// Bytes gathered before one batch is hashed on a blocking thread by [`PipelinedSha256`].
pub const HASH_BATCH: usize = 2 << 20;

/// A [`RunningSha256`] fed from the receive path without hashing on it: `update` only gathers
/// the `Bytes` (no copy) and hands each [`HASH_BATCH`] to a blocking thread, at most one batch
/// in flight, so receiving, hashing and writing (the blob writer's own pipeline) overlap
/// instead of taking turns on the request's task. [`PipelinedSha256::snapshot`] waits for
/// what was handed over and hashes the rest: the state of exactly the bytes fed so far.
#[derive(Default)]
pub struct PipelinedSha256 {
    /// The state after every batch handed over so far, when no batch is in flight.
    ready: Option<RunningSha256>,
    in_flight: Option<tokio::task::JoinHandle<RunningSha256>>,
    gathered: Vec<bytes::Bytes>,
    gathered_len: usize,
}

impl PipelinedSha256 {
    /// Continue from `state`.
    pub fn new(state: RunningSha256) -> Self {
        PipelinedSha256 { ready: Some(state), in_flight: None, gathered: Vec::new(), gathered_len: 0 }
    }

    /// Feed `data`; hashes a full batch in the background.
    pub async fn update(&mut self, data: bytes::Bytes) {
        self.gathered_len += data.len();
        self.gathered.push(data);
        if self.gathered_len >= HASH_BATCH {
            self.flush().await;
        }
    }

    /// Hand what was gathered to the hashing thread now, full batch or not (a quiet body's
    /// bytes are not kept waiting for more).
    pub async fn flush(&mut self) {
        if self.gathered.is_empty() {
            return;
        }
        let mut h = self.settle().await;
        let batch = std::mem::take(&mut self.gathered);
        self.gathered_len = 0;
        self.in_flight = Some(tokio::task::spawn_blocking(move || {
            for b in &batch {
                h.update(b);
            }
            h
        }));
    }

    /// The state after the batches handed over (waits for the one in flight).
    async fn settle(&mut self) -> RunningSha256 {
        if let Some(j) = self.in_flight.take() {
            // A hashing thread cannot fail but by a panic in sha2: re-raise it here.
            return j.await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        }
        self.ready.take().unwrap_or_default()
    }

    /// The state of exactly the bytes fed so far (the rest of a batch is hashed here).
    pub async fn snapshot(&mut self) -> RunningSha256 {
        let mut h = self.settle().await;
        for b in self.gathered.drain(..) {
            h.update(&b);
        }
        self.gathered_len = 0;
        self.ready = Some(h.clone());
        h
    }

    /// Start over from `state`, dropping whatever was fed since (a batch still being hashed
    /// finishes on its own and is ignored).
    pub fn reset(&mut self, state: RunningSha256) {
        self.in_flight = None;
        self.gathered.clear();
        self.gathered_len = 0;
        self.ready = Some(state);
    }
}
