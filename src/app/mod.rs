//! What every transport shares (DESIGN §1): the engines' handles, principals, limits, and the
//! one view of each concept (a file, a file a task produced). `http` and `mcp` are siblings
//! over this layer and never import each other; `serve.rs` builds both from one [`AppState`].

use std::sync::Arc;

use crate::metrics::Metrics;
use crate::upload::UploadEngine;

pub mod limits;
pub mod principal;
pub mod views;

pub use principal::{Principal, Tokens, LOCAL_PRINCIPAL};

/// Settings of the HTTP edge (also what `/mcp`'s Streamable HTTP transport needs).
#[derive(Debug, Clone, Default)]
pub struct HttpConfig {
    /// Trust `Forwarded` / `X-Forwarded-*` to build absolute `Location` URLs.
    pub behind_proxy: bool,
    /// `Location` as `{public_url}/files/{id}` (set when `--public-url` is given).
    pub absolute_locations: bool,
    /// `Host` names this server answers to (DNS-rebinding guard for `/mcp`, and for every
    /// route when there are no tokens); empty = any.
    pub allowed_hosts: Vec<String>,
    /// Cancelled at shutdown: ends `/mcp` streams.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Which web origins may use TUS on `/files/`, and extra CORS headers.
    pub cors: crate::config::CorsConfig,
    /// Serve the pages for people (`/share/{id}`, `/assets/`); off with `--no-web`.
    pub web: bool,
}

/// Settings of the MCP facade.
#[derive(Debug, Clone)]
pub struct McpConfig {
    /// Largest decoded `file_upload_chunk` chunk, bytes.
    pub max_chunk: u64,
    /// `[commands.NAME]`: (name, description), each an `export_<name>` tool.
    pub commands: Vec<(String, Option<String>)>,
}

/// Shared state of every transport: cheap to clone (handles only — axum clones it several
/// times per request, once per middleware layer and handler, so every field is an `Arc` or a
/// `Copy` value, never a map or a list).
#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<UploadEngine>,
    pub tasks: Arc<crate::tasks::Engine>,
    /// The outbox's readers: SSE, webhook deliveries (DESIGN §8).
    pub events: Arc<crate::events::Events>,
    pub tokens: Arc<Tokens>,
    pub metrics: Arc<Metrics>,
    pub http: Arc<HttpConfig>,
    /// Absolute and signed URLs of files (DESIGN §6).
    pub links: Arc<crate::signing::Links>,
    /// The MCP facade's settings (`/mcp` and `--stdio`).
    pub mcp: Arc<McpConfig>,
}
