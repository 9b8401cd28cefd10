//! Client subcommands of the `ferry` binary: they talk to a running server over HTTP (TUS on
//! `/files/`, the REST API on `/api/v1`), never to the data directory (`ferry check`, which
//! re-reads the stores a server is configured with, is `crate::check_command`; `ferry token`, which
//! edits its configuration file, is `crate::token_command`).

pub mod client;
pub mod download;
pub mod files;
pub mod follow;
pub mod links;
pub mod progress;
pub mod request;
pub mod store;
pub mod stream;
pub mod task;
pub mod tls;
pub mod upload;
