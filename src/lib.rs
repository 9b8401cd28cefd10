//! ferry: a resumable large-file transfer server.
//!
//! Layers (DESIGN §1), arrows pointing down only: [`http`] and [`mcp`] (siblings, never
//! importing each other) → [`app`] → [`tasks`] → [`upload`] → [`catalog`] and [`blob`].
//! The protocol itself lives in the sans-I/O crate `ferry_tus`; the error catalogue every layer
//! shares (codes, [`error::Refusal`]) in the leaf module [`error`]. `tests/layers.rs` enforces it.

pub mod app;
pub mod blob;
pub mod catalog;
pub mod check;
pub mod check_command;
pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod events;
pub mod exhaustion;
pub mod framed;
pub mod http;
pub mod listen;
pub mod mcp;
pub mod metrics;
pub mod names;
pub mod regular_file;
pub mod retry;
pub mod serve;
pub mod signing;
pub mod tasks;
pub mod tls;
pub mod token_command;
pub mod units;
pub mod upload;
pub mod zip_layout;

#[cfg(test)]
mod error_catalogue_tests;
