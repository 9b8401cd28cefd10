//! Client subcommands of the `ferry` binary: they talk to a running server over its REST API
//! (`/api/v1`), never to the data directory.

pub mod task;
