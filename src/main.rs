//! The `ferry` command line.

use clap::{Parser, Subcommand};
use ferry::config::{Config, LogFormat, ServeArgs};
use tracing_subscriber::EnvFilter;

/// ferry — resumable large-file transfer server (TUS 1.0) with streaming sha256.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve TUS uploads on /files/, downloads, /healthz, /readyz and /metrics.
    Serve(ServeArgs),
}

fn init_logs(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
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
