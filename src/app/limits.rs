//! Limits every transport enforces the same way (DESIGN §6).

use ferry_tus::CreationLimits;

use crate::upload::UploadEngine;

/// Largest `Upload-Metadata` accepted (TUS header or MCP `file_upload_begin`), in bytes; the
/// engine checks it (and the file name's length) again after a pre-create hook.
pub use crate::upload::MAX_METADATA_BYTES;

/// Limits of a creation request (POST /files/, RUFH, MCP `file_upload_begin`): the engine's
/// max upload size (bytes) and [`MAX_METADATA_BYTES`].
pub fn creation_limits(engine: &UploadEngine) -> CreationLimits {
    CreationLimits { max_size: engine.config().max_size, max_metadata: MAX_METADATA_BYTES }
}
