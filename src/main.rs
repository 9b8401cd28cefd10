//! The `ferry` command line.

use clap::{Parser, Subcommand};
use ferry::config::{Config, LogFormat, ServeArgs};
use tracing_subscriber::EnvFilter;

/// ferry — resumable large-file transfer server (TUS 1.0) with streaming sha256.
#[derive(Parser)]
#[command(version, about, long_about = None, after_help = ferry::cli::client::exit_codes_help())]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve TUS uploads on /files/, downloads, the task API on /api/v1, /healthz, /readyz
    /// and /metrics.
    Serve(Box<ServeArgs>),
    /// Manage bearer tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Start, inspect, list and cancel tasks on a running server (a client of /api/v1/tasks).
    Task(ferry::cli::task::TaskArgs),
    /// Upload files (TUS), resuming a remembered upload of the same file; prints
    /// `URL<TAB>SHA256` per file once the server's sha256 matches.
    Upload(ferry::cli::upload::UploadArgs),
    /// Download a file (resumes a partial one) and verify its sha256.
    Download(ferry::cli::download::DownloadArgs),
    /// List your files on the server.
    Ls(ferry::cli::files::LsArgs),
    /// Print one file's state (JSON).
    Status(ferry::cli::files::StatusArgs),
    /// Delete files or unfinished uploads.
    Rm(ferry::cli::files::RmArgs),
    /// Print a signed, expiring URL for one file (download or upload).
    Share(ferry::cli::files::ShareArgs),
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a token for principal NAME: prints the token once and appends only its sha256
    /// to the configuration file. Restart `ferry serve` to use it.
    Create {
        /// Principal name: 1-64 of A-Z a-z 0-9 _ . -
        name: String,
        /// Configuration file to append to.
        #[arg(long, env = "FERRY_CONFIG", default_value = "ferry.toml")]
        config: std::path::PathBuf,
    },
}

fn token_create(name: &str, config: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Write;
    if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)) {
        anyhow::bail!("principal name must be 1-64 characters of A-Z a-z 0-9 _ . -");
    }
    let token = ferry::app::principal::new_token();
    let entry = format!("\n[[tokens]]\nprincipal = \"{name}\"\nsha256 = \"{}\"\n", ferry::app::principal::token_hash(&token));
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(config).map_err(|e| anyhow::anyhow!("opening {}: {e}", config.display()))?;
    f.write_all(entry.as_bytes())?;
    f.sync_all()?;
    Ok(token)
}

fn init_logs(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,rmcp=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Task(args) => ferry::cli::task::run(args),
        Command::Upload(args) => ferry::cli::upload::run(args),
        Command::Download(args) => ferry::cli::download::run(args),
        Command::Ls(args) => ferry::cli::files::ls(args),
        Command::Status(args) => ferry::cli::files::status(args),
        Command::Rm(args) => ferry::cli::files::rm(args),
        Command::Share(args) => ferry::cli::files::share(args),
        Command::Token(TokenCommand::Create { name, config }) => match token_create(&name, &config) {
            Ok(token) => {
                eprintln!("token for principal {name:?} added to {} (only its sha256 is stored; this is the only time it is shown):", config.display());
                println!("{token}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("ferry: {e:#}");
                std::process::ExitCode::from(2)
            }
        },
        Command::Serve(args) => {
            let cfg = match Config::resolve(&args) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("ferry: configuration error: {e:#}");
                    return std::process::ExitCode::from(2);
                }
            };
            init_logs(cfg.log_format);
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
            match rt.block_on(ferry::serve::run(cfg)) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ferry: {e:#}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
    }
}
