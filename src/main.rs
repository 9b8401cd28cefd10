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
    /// Manage bearer tokens: create, list, revoke (the `[[tokens]]` of ferry.toml).
    #[command(subcommand)]
    Token(ferry::token_command::TokenCommand),
    /// Start, inspect, list, answer and cancel tasks on a running server (a client of /api/v1/tasks).
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
    /// Print a link that asks someone for a file of any size (a page to drop it in); it
    /// arrives in your files under NAME.
    Request(ferry::cli::request::RequestArgs),
    /// Re-read finished files from the blob store and compare each with its stored sha256;
    /// report mismatches, missing bytes and orphans (opens the stores a server is configured
    /// with, like `serve`; it may run while the server does).
    Check(ferry::check_command::CheckArgs),
    /// Documentation generated from the configuration's definitions: `ferry config reference`
    /// prints the table of every setting (flag, environment variable, ferry.toml key, default).
    #[command(subcommand, hide = true)]
    Config(ferry::config::reference::ConfigCommand),
}

/// Logs on stderr: `RUST_LOG` filters; colours only on a terminal (a pipe, a file or journald
/// gets plain lines) and never with `NO_COLOR` set (https://no-color.org). Without `RUST_LOG`:
/// `info`, except PostgreSQL's notices (`relation … already exists, skipping` at every start)
/// and, under `--stdio`, everything below `warn` — an MCP host shows each stderr line of its
/// server as a log entry, often as an error.
fn init_logs(format: LogFormat, stdio: bool) {
    use std::io::IsTerminal;
    let default = if stdio { "warn" } else { "info,rmcp=warn,sqlx::postgres::notice=warn" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> std::process::ExitCode {
    // Before anything else, even parsing: a server's SIGHUP means "reload", never "end"
    // (see `ignore_hangups`); only `serve` is asked, the other commands keep the default.
    if std::env::args_os().nth(1).is_some_and(|a| a == "serve") {
        ferry::serve::ignore_hangups();
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Task(args) => ferry::cli::task::run(args),
        Command::Upload(args) => ferry::cli::upload::run(args),
        Command::Download(args) => ferry::cli::download::run(args),
        Command::Ls(args) => ferry::cli::files::ls(args),
        Command::Status(args) => ferry::cli::files::status(args),
        Command::Rm(args) => ferry::cli::files::rm(args),
        Command::Share(args) => ferry::cli::files::share(args),
        Command::Request(args) => ferry::cli::request::run(args),
        Command::Token(cmd) => ferry::token_command::run(cmd),
        Command::Check(args) => ferry::check_command::run(args),
        Command::Config(cmd) => ferry::config::reference::run(cmd),
        Command::Serve(args) => {
            ferry::serve::tune_allocator();
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
            let hangups = {
                let _in_runtime = rt.enter();
                ferry::serve::catch_hangups()
            };
            let cfg = match Config::resolve(&args) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("ferry: configuration error: {e:#}");
                    return std::process::ExitCode::from(2);
                }
            };
            init_logs(cfg.log_format, cfg.stdio);
            match rt.block_on(ferry::serve::run(cfg, hangups)) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ferry: {e:#}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
    }
}
