//! `external`: a task owned by a producer outside ferry (any language). It reports progress,
//! uploads its file with TUS, and completes or fails the task over REST
//! (`/api/v1/tasks/{id}/progress|complete|fail`). Workers never run it.

use async_trait::async_trait;
use serde_json::value::RawValue;

use crate::tasks::{Job, JobContext, JobError};

/// The `external` kind.
pub struct ExternalJob;

#[async_trait]
impl Job for ExternalJob {
    fn kind(&self) -> &str {
        "external"
    }

    fn runnable(&self) -> bool {
        false
    }

    async fn run(&self, _ctx: &JobContext, _args: &RawValue, _checkpoint: Option<serde_json::Value>) -> Result<serde_json::Value, JobError> {
        Err(JobError::failed("external tasks are driven by their producer over REST"))
    }
}
