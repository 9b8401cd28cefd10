//! `ferry check [--repair-catalog] [--json] [ID…]`: re-read finished files and compare each with
//! its stored sha256 ([`crate::check`]). Not a client command (`crate::cli`): it does not talk to a
//! server; it opens the catalog and blob store a server is configured with (the same
//! `--config`, `--data`, `--catalog`, `--blobs` and `FERRY_*` variables as `ferry serve`), and
//! may run while that server does.
//!
//! Progress goes to stderr (a bar on a terminal, plain lines otherwise); the summary to stdout:
//! one line per finding, or with `--json` one [`crate::check::CheckReport`] object.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::check::{CheckOptions, Checker, Observer};
use crate::cli::progress::Progress;
use crate::config::{Config, ServeArgs};
use crate::units::parse_size;

/// Exit code: a finished file's bytes mismatch its sha256 or are missing.
pub const EXIT_DAMAGE: u8 = 4;
/// Exit code: no damage, but orphans (blobs, multipart uploads) were found.
pub const EXIT_ORPHANS: u8 = 9;
/// Exit code: some files could not be read (the store failed); no damage found.
pub const EXIT_UNCHECKED: u8 = 1;
/// Exit code: configuration error, or an ID that is unknown or not a finished upload.
pub const EXIT_USAGE: u8 = 2;

const AFTER: &str = "Exit codes: 0 every file checked is whole (and no orphans), 4 a file's bytes do not match its \
                     sha256 or are missing, 9 no damage but orphans (or a blob longer than its upload) found, 1 some \
                     files could not be read (the store failed) or the stores could not be opened, 2 configuration \
                     error or an ID that is unknown or unfinished. Damage wins over orphans, orphans over unread files.";

#[derive(Debug, Args)]
#[command(after_help = AFTER)]
pub struct CheckArgs {
    /// Upload ids to check [default: every finished upload, and the search for orphans].
    pub ids: Vec<String>,
    /// Mark each damaged upload in the catalog, so downloads answer `500 damaged` instead of
    /// wrong bytes, and clear the mark of a marked upload found whole again. Never deletes
    /// or rewrites bytes; orphans are only reported.
    #[arg(long)]
    pub repair_catalog: bool,
    /// Print the summary as one JSON object (README "ferry check").
    #[arg(long)]
    pub json: bool,
    /// Read at most this many bytes per second, e.g. 50MiB [default: no limit].
    #[arg(long, value_parser = parse_size)]
    pub rate: Option<u64>,
    /// No progress on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Configuration file (TOML), as for `ferry serve`. Default: ./ferry.toml when it exists.
    #[arg(long, env = "FERRY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data directory, as for `ferry serve` [default: ./ferry-data].
    #[arg(long, env = "FERRY_DATA")]
    pub data: Option<PathBuf>,
    /// Catalog, as for `ferry serve` [default: sqlite:DATA/ferry.db].
    #[arg(long, env = "FERRY_CATALOG", hide_env_values = true)]
    pub catalog: Option<String>,
    /// Blob store, as for `ferry serve` [default: DATA/blobs].
    #[arg(long, env = "FERRY_BLOBS")]
    pub blobs: Option<String>,
}

struct Bar<'a>(&'a Progress);

impl Observer for Bar<'_> {
    fn read(&self, n: u64) {
        self.0.inc(n);
    }
}

/// Every target, then (no ids given) the orphans, with a progress bar over the bytes.
async fn check_all(checker: &Checker, ids_given: bool, quiet: bool) -> Result<crate::check::CheckReport, crate::check::CheckError> {
    let mut report = crate::check::CheckReport::default();
    let targets = checker.targets(&mut report).await?;
    let progress = Progress::new("check", targets.iter().map(|t| t.size).sum(), 0, quiet);
    let mut pace = checker.pace();
    for t in &targets {
        if let Err(e) = checker.check_one(t, &mut report, &mut pace, &Bar(&progress)).await {
            progress.finish();
            return Err(e);
        }
    }
    progress.finish();
    if !ids_given {
        checker.orphans(&mut report).await?;
    }
    Ok(report)
}

/// Run `ferry check`.
pub fn run(args: CheckArgs) -> ExitCode {
    let serve = ServeArgs {
        config: args.config.clone(),
        data: args.data.clone(),
        catalog: args.catalog.clone(),
        blobs: args.blobs.clone(),
        ..ServeArgs::default()
    };
    let cfg = match Config::resolve(&serve) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferry: configuration error: {e:#}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Some(bad) = args.ids.iter().find(|id| !crate::upload::is_valid_id(id)) {
        eprintln!("ferry: {bad:?} is not an upload id (26 characters of a-z and 2-7)");
        return ExitCode::from(EXIT_USAGE);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    rt.block_on(async move {
        let catalog = match cfg.catalog.open_as(false).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("ferry: opening the catalog: {e:#}");
                return ExitCode::from(EXIT_UNCHECKED);
            }
        };
        let blobs = match crate::serve::open_blobs(&cfg, None).await {
            Ok(b) => b,
            Err(e) => {
                eprintln!("ferry: {e:#}");
                return ExitCode::from(EXIT_UNCHECKED);
            }
        };
        // The store must be this catalog's (as `ferry serve` requires): a check against another
        // store (a forgotten `--blobs`) would call every file missing, and `--repair-catalog`
        // would mark every intact file damaged.
        if let Err(e) = crate::serve::check_store_mark(catalog.as_ref(), blobs.as_ref(), &cfg.blobs.to_string(), false).await {
            eprintln!("ferry: {e:#}");
            return ExitCode::from(EXIT_UNCHECKED);
        }
        let checker = Checker::new(
            catalog,
            blobs,
            CheckOptions { ids: args.ids.clone(), repair_catalog: args.repair_catalog, rate: args.rate, principal: None },
        );
        let report = match check_all(&checker, !args.ids.is_empty(), args.quiet).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("ferry: check stopped: {e}");
                return ExitCode::from(EXIT_UNCHECKED);
            }
        };
        if args.json {
            println!("{}", serde_json::to_string(&report).expect("a report serializes"));
        } else {
            for m in &report.mismatched {
                println!("mismatch\t{}\t{} bytes\texpected sha256 {}\tstored bytes hash to {}", m.id, m.size, m.expected_sha256, m.actual_sha256);
            }
            for m in &report.missing {
                println!("missing\t{}\t{} bytes\tthe store has {}", m.id, m.size, m.stored);
            }
            for l in &report.longer {
                println!("longer\t{}\t{} bytes\tthe store has {}", l.id, l.size, l.stored);
            }
            for id in &report.orphan_blobs {
                println!("orphan-blob\t{id}");
            }
            for id in &report.leftovers {
                println!("leftover\t{id}");
            }
            for o in &report.orphan_multiparts {
                println!("orphan-multipart\t{}\t{}", o.id, o.upload_id);
            }
            for s in &report.skipped {
                println!("skipped\t{}\t{}", s.id, s.reason);
            }
            for u in &report.unchecked {
                println!("unchecked\t{}\t{}", u.id, u.error);
            }
            for id in &report.marked_damaged {
                println!("marked-damaged\t{id}");
            }
            for id in &report.cleared_damage {
                println!("cleared-damage\t{id}");
            }
            eprintln!(
                "ferry: checked {} files ({} bytes): {} whole, {} mismatched, {} missing{}",
                report.files_checked,
                report.bytes_read,
                report.ok,
                report.mismatched.len(),
                report.missing.len(),
                if report.orphans_searched {
                    format!(
                        ", {} longer than their upload, {} orphan blobs, {} orphan multipart uploads",
                        report.longer.len(),
                        report.orphan_blobs.len(),
                        report.orphan_multiparts.len()
                    )
                } else {
                    String::new()
                }
            );
        }
        if report.damage_found() {
            ExitCode::from(EXIT_DAMAGE)
        } else if report.orphans_found() {
            ExitCode::from(EXIT_ORPHANS)
        } else if !report.unchecked.is_empty() {
            ExitCode::from(EXIT_UNCHECKED)
        } else if !report.skipped.is_empty() {
            ExitCode::from(EXIT_USAGE)
        } else {
            ExitCode::SUCCESS
        }
    })
}
