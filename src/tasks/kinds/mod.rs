//! Built-in job kinds (DESIGN §4): `archive`, `compress`, `fetch`, `command` (one per program
//! declared in ferry.toml), `external` (driven over REST by its producer) and `concat` (the
//! final upload of a TUS concatenation).

use std::sync::Arc;

use super::Job;
use crate::config::Config;

pub mod archive;
pub mod command;
pub mod concat;
pub mod compress;
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
