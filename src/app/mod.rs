//! What every transport shares (DESIGN §1): the engines' handles, principals, limits, and the
//! one view of each concept (a file, a file a task produced). `http` and `mcp` are siblings
//! over this layer and never import each other; `serve.rs` builds both from one [`AppState`].

use std::sync::Arc;

use crate::metrics::Metrics;
use crate::upload::UploadEngine;

#[cfg(test)]
pub mod arb;
pub mod cors;
pub mod limits;
pub mod links;
pub mod principal;
pub use crate::tasks::schema_check;
pub mod views;

pub use cors::{listable, CorsConfig, Listable, Origins};
pub use principal::{Principal, Tokens, LOCAL_PRINCIPAL};

/// Marks a request authenticated by an upload-scoped token (`scope = "upload"`): it may only
/// create uploads, and the creation's `Location` is a signed upload URL for that one upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadOnly {
    /// When the token stops working (unix ms), if it expires.
    pub token_expires_ms: Option<i64>,
}

/// How long the signed upload URL answered to an upload-scoped token's creation works: a day
/// (ms) — an upload started by a page can be resumed after the page's token expired.
pub const UPLOAD_ONLY_URL_TTL_MS: u64 = 24 * 3600 * 1000;

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
    /// Web origins that are this server's own besides the request's `Host`: `--public-url`'s
    /// (`scheme://host[:port]`, lowercase, default port omitted as browsers send `Origin`). A
    /// proxy may rewrite `Host` (nginx `$host` drops the port); pages served through it still
    /// carry this origin.
    pub own_origins: Vec<String>,
    /// Cancelled at shutdown: ends `/mcp` streams.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Which web origins may use TUS on `/files/`, and extra CORS headers.
    pub cors: CorsConfig,
    /// Serve the pages for people (`/share/{id}`, `/assets/`); off with `--no-web`.
    pub web: bool,
}

/// Settings of the MCP facade.
#[derive(Debug, Clone)]
pub struct McpConfig {
    /// Largest decoded `file_upload_chunk` chunk, bytes.
    pub max_chunk: u64,
    /// `[commands.NAME]`, each an `export_<name>` tool.
    pub commands: Vec<CommandTool>,
}

/// What the MCP tool `export_<name>` shows of `[commands.NAME]`.
#[derive(Debug, Clone)]
pub struct CommandTool {
    pub name: String,
    pub description: Option<String>,
    /// `params_schema`: the `params` member of the tool's inputSchema.
    pub params_schema: Option<serde_json::Value>,
}

/// Shared state of every transport: one `Arc`, since axum clones it several times per request
/// (once per middleware layer and handler): a clone is one reference count, not one per part
/// (issue 24: the fixed CPU of a request). Reads its parts through `Deref` (`state.engine`).
#[derive(Clone)]
pub struct AppState(Arc<AppParts>);

impl AppState {
    pub fn new(parts: AppParts) -> Self {
        AppState(Arc::new(parts))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppParts;

    fn deref(&self) -> &AppParts {
        &self.0
    }
}

/// What [`AppState`] holds: handles each transport shares with the others (the engines, the
/// outbox, the configuration).
pub struct AppParts {
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

/// The web origin (RFC 6454 serialisation: `scheme://host[:port]`, lowercase, the scheme's
/// default port omitted) of an absolute http(s) URL; `None` for anything else.
pub fn origin_of(url: &str) -> Option<String> {
    let uri: http::Uri = url.trim().parse().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let host = uri.host()?.to_ascii_lowercase();
    Some(match uri.port_u16().filter(|p| *p != default_port) {
        Some(p) => format!("{scheme}://{host}:{p}"),
        None => format!("{scheme}://{host}"),
    })
}

#[cfg(test)]
mod origin_tests {
    #[test]
    fn origins_are_normalised_as_browsers_send_them() {
        use super::origin_of;
        assert_eq!(origin_of("https://Files.Example.com/").as_deref(), Some("https://files.example.com"));
        assert_eq!(origin_of("https://files.example.com:443/x").as_deref(), Some("https://files.example.com"));
        assert_eq!(origin_of("http://127.0.0.1:8443").as_deref(), Some("http://127.0.0.1:8443"));
        assert_eq!(origin_of("http://[::1]:80").as_deref(), Some("http://[::1]"));
        assert_eq!(origin_of("null"), None);
        assert_eq!(origin_of("ftp://x"), None);
    }
}
