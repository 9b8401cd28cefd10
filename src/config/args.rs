//! The flags of `ferry serve` (clap), each also read from `FERRY_<NAME>`: the top layer of
//! file < environment < flags.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{parse_expiry, parse_interval, Durability, Expiry, LeaseMode, LogFormat};
use crate::units::parse_size;

/// Flags of `ferry serve`; each also reads `FERRY_<NAME>` from the environment.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// Configuration file (TOML) [default: ./ferry.toml when it exists].
    #[arg(long, env = "FERRY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on: `IP:PORT` or `HOST:PORT` (e.g. `localhost:8080`; every address
    /// the name resolves to is served) [default: 127.0.0.1:8080]. Port 0 picks a free port;
    /// the chosen address is printed as `listening on http://ADDR`.
    #[arg(long, env = "FERRY_LISTEN")]
    pub listen: Option<String>,
    /// Data directory: the catalog (ferry.db) and blobs/ [default: ./ferry-data].
    #[arg(long, env = "FERRY_DATA")]
    pub data: Option<PathBuf>,
    /// Where metadata lives: `sqlite:PATH`, or `postgres://USER:PASSWORD@HOST:PORT/DATABASE`
    /// for several replicas on one database [default: sqlite:DATA/ferry.db].
    // A String, parsed in `Config::resolve`: clap would echo a rejected value, password and all.
    #[arg(long, env = "FERRY_CATALOG", hide_env_values = true)]
    pub catalog: Option<String>,
    /// Where upload bytes live: a directory, or `s3://bucket/prefix` for S3 or an
    /// S3-compatible store (credentials, region and endpoint from the `AWS_*` variables:
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
    /// `AWS_ALLOW_HTTP`). Replicas sharing one catalog share one blob store [default: DATA/blobs].
    #[arg(long, env = "FERRY_BLOBS")]
    pub blobs: Option<String>,
    /// Largest upload accepted, e.g. 1TiB, 500MB, 1048576 [default: 1TiB].
    #[arg(long, env = "FERRY_MAX_SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// S3 blobs: the smallest part size (`[s3] part_size`), 5MiB to 5GiB; each upload's parts
    /// are this size, or larger so 5 000 parts hold the upload (each part has two part numbers of S3's 10 000) [default: 16MiB].
    #[arg(long, env = "FERRY_S3_PART_SIZE", value_parser = parse_size)]
    pub s3_part_size: Option<u64>,
    /// S3 blobs: the part size of an upload created without a length (`Upload-Defer-Length`,
    /// `ferry upload -`), whose size is not known when its first part is cut (`[s3]
    /// deferred_part_size`), 5MiB to 5GiB, never below `--s3-part-size`: such an upload holds
    /// at most 10 000 parts of it on S3 (≈ 625 GiB at the default) [default: 64MiB].
    #[arg(long, env = "FERRY_S3_DEFERRED_PART_SIZE", value_parser = parse_size)]
    pub s3_deferred_part_size: Option<u64>,
    /// S3 blobs: most bytes of open parts buffered in memory at once, across all uploads
    /// (`[s3] max_buffer`); writers wait beyond it [default: 512MiB].
    #[arg(long, env = "FERRY_S3_MAX_BUFFER", value_parser = parse_size)]
    pub s3_max_buffer: Option<u64>,
    /// S3 blobs: full parts of one upload sent at once while its next part is received
    /// (`[s3] parts_in_flight`), 1 to 16 [default: 2].
    #[arg(long, env = "FERRY_S3_PARTS_IN_FLIGHT")]
    pub s3_parts_in_flight: Option<u64>,
    /// Unfinished uploads expire after this long without progress, e.g. 7d, 12h, 30s;
    /// `never` disables expiry [default: 7d].
    #[arg(long, env = "FERRY_EXPIRE_AFTER", value_parser = parse_expiry)]
    pub expire_after: Option<Expiry>,
    /// `full` fsyncs before every checkpoint; `relaxed` skips fsync and risks losing the
    /// acknowledged bytes of unfinished uploads on power loss or OS crash: after a restart an
    /// unfinished upload resumes from its checkpoint only if its stored bytes still hash to
    /// the checkpointed sha256, else from 0; finished files are synced [default: full].
    #[arg(long, env = "FERRY_DURABILITY", value_enum)]
    pub durability: Option<Durability>,
    /// Trust Forwarded / X-Forwarded-Host / X-Forwarded-Proto to build absolute upload URLs.
    #[arg(long, env = "FERRY_BEHIND_PROXY")]
    pub behind_proxy: bool,
    /// Turn off the pages for people (`/share/{id}` request-a-file and download pages and
    /// their `/assets/`); share links then carry no `page_url`. For API-only deployments.
    #[arg(long, env = "FERRY_NO_WEB")]
    pub no_web: bool,
    /// Blobs in a directory: write them through the page cache instead of with O_DIRECT (a
    /// file just uploaded is then still in memory for its first download, at about twice the
    /// server's CPU per uploaded byte).
    #[arg(long, env = "FERRY_BUFFERED_WRITES")]
    pub buffered_writes: bool,
    /// Checkpoint inside a long PATCH every this many bytes [default: 64MiB].
    #[arg(long, env = "FERRY_CHECKPOINT_EVERY", value_parser = parse_size)]
    pub checkpoint_every: Option<u64>,
    /// End a PATCH whose body stalls this long, keeping what arrived [default: 60s].
    #[arg(long, env = "FERRY_IDLE_TIMEOUT", value_parser = parse_interval)]
    pub idle_timeout: Option<Duration>,
    /// How often expired uploads are swept [default: 60s].
    #[arg(long, env = "FERRY_SWEEP_INTERVAL", value_parser = parse_interval)]
    pub sweep_interval: Option<Duration>,
    /// Log format [default: text]. Logs go to stderr; RUST_LOG sets the filter.
    #[arg(long, env = "FERRY_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Task workers run at once [default: 4].
    #[arg(long, env = "FERRY_TASK_WORKERS", value_parser = super::parse_task_workers)]
    pub task_workers: Option<usize>,
    /// Task lease: a task whose worker died is resumed elsewhere after this long [default: 10s].
    #[arg(long, env = "FERRY_TASK_LEASE", value_parser = parse_interval)]
    pub task_lease: Option<Duration>,
    /// Serve a non-loopback --listen address without bearer tokens (anyone who can connect
    /// can read and write everything).
    #[arg(long, env = "FERRY_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
    /// Also speak MCP over stdin/stdout (for clients that launch ferry as a subprocess).
    /// HTTP keeps serving the bytes; logs go to stderr and the `listening on` line too.
    #[arg(long, env = "FERRY_STDIO")]
    pub stdio: bool,
    /// Absolute base URL clients reach this server at, used in signed URLs and MCP results,
    /// e.g. https://files.example.com [default: http://LISTEN-ADDRESS].
    #[arg(long, env = "FERRY_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Largest decoded chunk `file_upload_chunk` (MCP, base64 in-band) accepts [default: 1MiB].
    #[arg(long, env = "FERRY_MCP_MAX_CHUNK", value_parser = parse_size)]
    pub mcp_max_chunk: Option<u64>,
    /// Free space kept on the blob directory's filesystem (`--blobs`): new uploads, creations whose
    /// Upload-Length does not fit, PATCHes and task files are refused with 507 before the disk
    /// fills. Bytes (`2GiB`), a percentage of the filesystem (`10%`), or `0` for none
    /// [default: 5% of the filesystem, at most 1GiB].
    #[arg(long, env = "FERRY_MIN_FREE_SPACE", value_parser = crate::exhaustion::Reserve::parse)]
    pub min_free_space: Option<crate::exhaustion::Reserve>,
    /// Most client connections served at once; more wait in the kernel's accept queue
    /// [default: 10000, and at most the open-file limit less 256].
    #[arg(long, env = "FERRY_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: Option<u32>,
    /// Web origins that may use TUS on /files/ from a browser: exact origins such as
    /// https://app.example.com, or `*` for any; comma-separated or repeated. Replaces
    /// `[cors] allow_origins` [default: any origin when the server has tokens; without tokens,
    /// only the server's own].
    #[arg(long, env = "FERRY_CORS_ALLOW_ORIGINS", value_delimiter = ',')]
    pub cors_allow_origins: Vec<String>,
    /// Request headers a browser may send to /files/ besides the built-in TUS list
    /// (e.g. a custom header your uploader adds); comma-separated or repeated. Replaces
    /// `[cors] allow_headers`.
    #[arg(long, env = "FERRY_CORS_ALLOW_HEADERS", value_delimiter = ',')]
    pub cors_allow_headers: Vec<String>,
    /// Response headers a browser script may read besides the built-in TUS list;
    /// comma-separated or repeated. Replaces `[cors] expose_headers`.
    #[arg(long, env = "FERRY_CORS_EXPOSE_HEADERS", value_delimiter = ',')]
    pub cors_expose_headers: Vec<String>,
    /// Upload leases: `local` (in-process; one server per catalog) or `catalog` (leases in the
    /// catalog with owner, expiry on the database clock and a fencing token, so several
    /// processes can share one catalog) [default: catalog with a postgres:// catalog, else local].
    #[arg(long, env = "FERRY_LEASES", value_enum)]
    pub leases: Option<LeaseMode>,
    /// Upload lease length with `--leases catalog`: a holder that dies is taken over after this
    /// long [default: 10s].
    #[arg(long, env = "FERRY_UPLOAD_LEASE", value_parser = parse_interval)]
    pub upload_lease: Option<Duration>,
    /// This replica's name in `/metrics` (`ferry_replica_info{replica=…}`) and logs
    /// [default: its lease owner id, kept in DATA/owner-id].
    #[arg(long, env = "FERRY_REPLICA_NAME")]
    pub replica_name: Option<String>,
    /// Serve HTTPS with this PEM certificate chain (server certificate first); needs
    /// --tls-key. Re-read on SIGHUP: new connections get the new certificate, open ones keep theirs.
    #[arg(long, env = "FERRY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1). Re-read on SIGHUP.
    #[arg(long, env = "FERRY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}
