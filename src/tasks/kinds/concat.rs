//! `concat`: builds the final upload of a TUS concatenation (TUS 1.0 §Concatenation) once all
//! its partial uploads are complete. Started by the HTTP layer with the idempotency key
//! `final:<id>`, so a final is built by exactly one task, which survives a crash (the copy then
//! starts again). Until it completes, HEAD of the final shows no `Upload-Offset`.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::ErrorCode;
use crate::tasks::{Job, JobContext, JobError};

/// The `concat` kind: args `{"final": "<upload id>"}`.
pub struct ConcatJob;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    #[serde(rename = "final")]
    final_id: String,
}

#[async_trait]
impl Job for ConcatJob {
    fn kind(&self) -> &str {
        "concat"
    }

    fn validate(&self, args: &RawValue) -> Result<(), String> {
        serde_json::from_str::<Args>(args.get()).map(|_| ()).map_err(|e| e.to_string())
    }

    async fn run(&self, ctx: &JobContext, args: &RawValue, _checkpoint: Option<serde_json::Value>) -> Result<serde_json::Value, JobError> {
        let a: Args = serde_json::from_str(args.get()).map_err(|e| JobError::failed(e.to_string()))?;
        let uploads = ctx.uploads();
        // Ownership: the final must belong to the task's principal.
        uploads.get(ctx.principal(), &a.final_id).await?;
        ctx.progress(Some(0.0), Some("concatenating"), &[]).await?;
        match uploads.build_final(&a.final_id).await {
            // Built never (too large for a limit): the final says so too (`failed_final`).
            Err(e) if e.status == 409 && matches!(e.code, ErrorCode::SizeExceeded | ErrorCode::QuotaExceeded) => {
                return Err(JobError::failed(e.detail))
            }
            r => r?,
        }
        let rec = match uploads.get(ctx.principal(), &a.final_id).await {
            Err(e) if e.status == 409 && matches!(e.code, ErrorCode::SizeExceeded | ErrorCode::QuotaExceeded) => {
                return Err(JobError::failed(e.detail))
            }
            r => r?,
        };
        if !rec.is_finished() {
            return Err(JobError::failed("a partial upload of this final is not complete"));
        }
        let size = rec.length.unwrap_or(0);
        ctx.progress(Some(1.0), Some(&format!("concatenated {size} bytes")), &[("bytes", size)]).await?;
        Ok(serde_json::json!({
            "file": { "id": rec.id, "size": rec.length, "sha256": rec.sha256.map(hex::encode) }
        }))
    }
}

/// The idempotency key of the `concat` task that builds final upload `id`.
pub fn concat_key(final_id: &str) -> String {
    format!("final:{final_id}")
}
