//! Built-in job kinds (DESIGN §4): `archive`, `compress`, `fetch`, `command` (one per program
//! declared in ferry.toml), `external` (driven over REST by its producer) and `concat` (the
//! final upload of a TUS concatenation).

use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::{Job, JobError};
use crate::config::Config;

pub mod archive;
pub mod command;
pub mod compress;
pub mod concat;
pub mod external;
pub mod fetch;

/// Every built-in kind, configured from `cfg`.
pub fn builtin(cfg: &Config) -> Vec<Arc<dyn Job>> {
    vec![
        Arc::new(archive::ArchiveJob),
        Arc::new(compress::CompressJob),
        Arc::new(fetch::FetchJob::new(cfg.fetch.clone())),
        Arc::new(command::CommandJob::new(cfg.commands.clone())),
        Arc::new(external::ExternalJob),
        Arc::new(concat::ConcatJob),
    ]
}

/// Where a resumable built-in job starts, from the checkpoint it was given.
pub(crate) enum Resume<T> {
    /// The job already finished (it crashed between finishing its file and recording the
    /// result, which its last checkpoint holds as `{"result": …}`).
    Done(serde_json::Value),
    /// Continue from this checkpoint (`None`: from the start).
    From(Option<T>),
}

/// Decode `checkpoint` for job `kind` into [`Resume`].
pub(crate) fn resume<T: DeserializeOwned>(kind: &str, checkpoint: Option<serde_json::Value>) -> Result<Resume<T>, JobError> {
    match checkpoint {
        None => Ok(Resume::From(None)),
        Some(c) => match c.get("result") {
            Some(done) => Ok(Resume::Done(done.clone())),
            None => serde_json::from_value(c).map(|cp| Resume::From(Some(cp))).map_err(|e| JobError::Internal(format!("{kind} checkpoint: {e}"))),
        },
    }
}
