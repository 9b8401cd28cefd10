//! Synchronous upload hooks (DESIGN §8): questions the engine asks before it creates an upload
//! (pre-create) and before it calls one finished (pre-finish). The engine owns the seam; the
//! HTTP implementation lives in `events::hooks`, installed by `serve.rs`.

use crate::error::Refusal;
use async_trait::async_trait;

/// An upload about to be created, as a pre-create hook sees it.
#[derive(Debug, Clone)]
pub struct PlannedUpload<'a> {
    pub principal: &'a str,
    /// Bytes; `None` while deferred (or a final upload's unknown total).
    pub length: Option<u64>,
    /// `Upload-Metadata` as received (may be empty).
    pub metadata: &'a str,
    /// `none`, `partial` or `final`.
    pub concat: &'a str,
}

/// A complete upload about to be called finished, as a pre-finish hook sees it.
#[derive(Debug, Clone)]
pub struct FinishingUpload<'a> {
    pub id: &'a str,
    pub principal: &'a str,
    /// Bytes.
    pub size: u64,
    pub sha256: [u8; 32],
    pub metadata: &'a str,
}

/// The hooks. Each call is bounded by the implementation's timeout; a failure to reach the hook
/// follows its configured policy inside the implementation.
#[async_trait]
pub trait UploadHooks: Send + Sync {
    /// `Ok(None)`: create as planned; `Ok(Some(raw))`: create with this `Upload-Metadata`
    /// instead; `Err`: refuse with that error (the hook's status and message, or the policy's).
    async fn pre_create(&self, upload: &PlannedUpload<'_>) -> Result<Option<String>, Refusal>;

    /// `Ok`: finish; `Err`: the upload is failed — the engine removes it and its bytes and
    /// answers the final request with this error.
    async fn pre_finish(&self, upload: &FinishingUpload<'_>) -> Result<(), Refusal>;

    /// Whether a pre-finish hook is configured (the engine skips the call otherwise).
    fn has_pre_finish(&self) -> bool;
}
