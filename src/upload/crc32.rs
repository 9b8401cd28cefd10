//! The CRC-32 (ISO 3309 / ITU-T V.42, the one zip uses) of a finished upload's bytes: a zip of
//! several files needs each member's value in its data descriptor and central directory.
//! Computed once — while a zip streams the member, or by reading it — and kept in the catalog
//! ([`crate::catalog::Catalog::keep_crc32`]), so a resumed or ranged zip download, on any
//! replica, never reads a member again for it.

use futures::TryStreamExt;

use super::UploadEngine;
use crate::catalog::UploadRecord;
use crate::error::Refusal;

impl UploadEngine {
    /// The CRC-32 kept for finished upload `rec`, if one was. Errors: the catalog's (503/500).
    pub async fn kept_crc32(&self, rec: &UploadRecord) -> Result<Option<u32>, Refusal> {
        Ok(self.catalog.crc32(&rec.id).await?)
    }

    /// Keep `crc32` as finished upload `rec`'s CRC-32. Best effort: a catalog that fails is
    /// logged, and the value is computed again the next time it is needed.
    pub async fn keep_crc32(&self, rec: &UploadRecord, crc32: u32) {
        if let Err(e) = self.catalog.keep_crc32(&rec.id, crc32).await {
            tracing::warn!(upload = rec.id, error = %e, "could not keep a file's CRC-32; it is computed again when a zip needs it");
        }
    }

    /// The CRC-32 state of bytes `range` of finished upload `rec`, read through the blob store
    /// (an empty range reads nothing). Errors: a read that cannot start (the upload is
    /// damaged, its bytes are gone, the store is away) or fails on the way, as `io::Error`.
    pub async fn crc32_of(&self, rec: &UploadRecord, range: std::ops::Range<u64>) -> std::io::Result<crc32fast::Hasher> {
        let mut hasher = crc32fast::Hasher::new();
        if range.is_empty() {
            return Ok(hasher);
        }
        let mut bytes = self.read(rec, range).await.map_err(std::io::Error::other)?;
        while let Some(chunk) = bytes.try_next().await? {
            hasher.update(&chunk);
        }
        Ok(hasher)
    }
}
