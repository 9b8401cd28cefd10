//! `ferry token create | list | revoke`: the `[[tokens]]` of a configuration file. These edit
//! the file, never a running server: `ferry serve` reads them at start-up and on SIGHUP.
//!
//! Every command first checks that the file is a configuration `ferry serve` accepts and
//! refuses to touch one it cannot parse (exit 2, the file unchanged). `revoke` rewrites the file
//! with `toml_edit`, so comments and the other keys stay as written, through a temporary file
//! that is synced and renamed over the original.
//!
//! It lives beside `serve` and `check_command`, not in the client layer (`cli`): it reads and
//! writes the server's configuration through `config`, which only the composition root may
//! import (`tests/layers.rs`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::app::principal::{new_token, token_hash, TokenEntry, TokenScope};

/// Exit code for a configuration that cannot be used, or bad arguments.
const EXIT_USAGE: u8 = 2;
/// Exit code when `revoke` matches no token.
const EXIT_NOT_FOUND: u8 = 3;

/// Characters of a token's sha256 shown as its id by `list`.
const ID_LEN: usize = 12;
/// Fewest hex digits `revoke` takes as an id.
const MIN_ID_LEN: usize = 8;

const AFTER: &str = "Running servers read [[tokens]] at start-up and on SIGHUP (`kill -HUP PID`, `systemctl reload ferry`).\n\
Exit codes: 0 done, 2 the configuration file cannot be parsed or bad arguments (the file is left unchanged), 3 no token matches.";

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token for principal NAME: prints the token once on stdout and appends only its
    /// sha256 to the configuration file.
    #[command(after_help = AFTER)]
    Create(CreateArgs),
    /// List the tokens of the configuration file: id (the start of its sha256), principal,
    /// scope, expiry. Tokens themselves are never stored, so never shown.
    #[command(after_help = AFTER)]
    List(ListArgs),
    /// Remove tokens from the configuration file: by id (as `list` shows it, at least 8 hex
    /// digits), by the token itself, or every token of `--principal NAME`.
    #[command(after_help = AFTER)]
    Revoke(RevokeArgs),
}

#[derive(Debug, Args)]
pub struct ConfigArg {
    /// Configuration file.
    #[arg(long, env = "FERRY_CONFIG", default_value = "ferry.toml")]
    pub config: PathBuf,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Principal name: 1-64 of A-Z a-z 0-9 _ . -
    pub name: String,
    #[command(flatten)]
    pub config: ConfigArg,
    /// `full` (everything NAME may do) or `upload` (only create uploads; each creation answers
    /// a signed URL for that upload — what a web page may hold).
    #[arg(long, value_enum, default_value = "full")]
    pub scope: TokenScope,
    /// The token stops working this long from now, e.g. 1h, 30m, 7d [default: never].
    #[arg(long, value_parser = parse_ttl)]
    pub ttl: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// One JSON array: `[{"id", "principal", "scope", "expires", "expired"}]`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["id", "principal"])))]
pub struct RevokeArgs {
    /// The token's id as `list` shows it (at least 8 hex digits of its sha256), or the token.
    pub id: Option<String>,
    /// Revoke every token of this principal.
    #[arg(long)]
    pub principal: Option<String>,
    #[command(flatten)]
    pub config: ConfigArg,
}

fn parse_ttl(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| format!("invalid duration {s:?}: {e} (e.g. 30m, 1h, 7d)"))?;
    if d < Duration::from_secs(1) {
        return Err(format!("--ttl {s:?} must be at least 1s"));
    }
    Ok(d)
}

/// Run a `ferry token` command.
pub fn run(cmd: TokenCommand) -> ExitCode {
    let result = match cmd {
        TokenCommand::Create(a) => create(&a),
        TokenCommand::List(a) => list(&a),
        TokenCommand::Revoke(a) => revoke(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, e)) => {
            eprintln!("ferry: {e:#}");
            ExitCode::from(code)
        }
    }
}

type CmdResult = Result<(), (u8, anyhow::Error)>;

fn usage(e: anyhow::Error) -> (u8, anyhow::Error) {
    (EXIT_USAGE, e)
}

/// The file's tokens after checking it is a configuration `ferry serve` accepts; an absent
/// file has none.
fn checked_tokens(path: &Path) -> Result<Vec<TokenEntry>, (u8, anyhow::Error)> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    crate::config::file_tokens(path)
        .map_err(|e| usage(e.context(format!("{} is not a configuration ferry serve accepts; fix it first (nothing was changed)", path.display()))))
}

fn create(a: &CreateArgs) -> CmdResult {
    let name = &a.name;
    if !crate::config::is_valid_name(name) {
        return Err(usage(anyhow::anyhow!("principal name must be 1-64 characters of A-Z a-z 0-9 _ . -")));
    }
    let path = &a.config.config;
    checked_tokens(path)?;
    let token = new_token();
    let expires = a.ttl.map(|ttl| humantime::format_rfc3339_seconds(std::time::SystemTime::now() + ttl).to_string());
    let entry = TokenEntry {
        principal: name.clone(),
        sha256: token_hash(&token),
        scope: (a.scope != TokenScope::Full).then_some(a.scope),
        expires: expires.clone(),
    };
    let mut text = format!("\n[[tokens]]\nprincipal = \"{name}\"\nsha256 = \"{}\"\n", entry.sha256);
    if let Some(scope) = entry.scope {
        text.push_str(&format!("scope = \"{}\"\n", scope.as_str()));
    }
    if let Some(e) = &expires {
        text.push_str(&format!("expires = \"{e}\"\n"));
    }
    // "created if missing" (README): its directory too, e.g. /etc/ferry on a fresh machine.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| usage(anyhow::anyhow!("creating the directory {}: {e}", dir.display())))?;
    }
    let mut f =
        std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| usage(anyhow::anyhow!("opening {}: {e}", path.display())))?;
    f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).map_err(|e| (1, anyhow::anyhow!("writing {}: {e}", path.display())))?;
    let what = match (&entry.scope, &expires) {
        (Some(s), Some(e)) => format!(" (scope {}, expires {e})", s.as_str()),
        (Some(s), None) => format!(" (scope {})", s.as_str()),
        (None, Some(e)) => format!(" (expires {e})"),
        (None, None) => String::new(),
    };
    eprintln!(
        "token {} for principal {name:?}{what} added to {} (only its sha256 is stored; this is the only time it is shown). \
         Running servers pick it up on SIGHUP (`kill -HUP PID`). The token follows on stdout.",
        &entry.sha256[..ID_LEN],
        path.display()
    );
    println!("{token}");
    Ok(())
}

fn list(a: &ListArgs) -> CmdResult {
    let path = &a.config.config;
    if !path.exists() {
        return Err(usage(anyhow::anyhow!("{} does not exist (ferry token create NAME --config PATH makes it)", path.display())));
    }
    let tokens = checked_tokens(path)?;
    let now = crate::clock::now_ms();
    let rows: Vec<serde_json::Value> = tokens
        .iter()
        .map(|t| {
            let expired = t.expires_ms().ok().flatten().is_some_and(|e| e <= now);
            serde_json::json!({
                "id": &t.sha256[..ID_LEN],
                "principal": t.principal,
                "scope": t.scope.unwrap_or_default().as_str(),
                "expires": t.expires,
                "expired": expired,
            })
        })
        .collect();
    if a.json {
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    if rows.is_empty() {
        eprintln!("no tokens in {}: every request to a server using it acts as the principal `local`", path.display());
        return Ok(());
    }
    println!("{:<12}  {:<20}  {:<6}  EXPIRES", "ID", "PRINCIPAL", "SCOPE");
    for r in rows {
        let expires = match (r["expires"].as_str(), r["expired"].as_bool()) {
            (Some(e), Some(true)) => format!("{e} (expired)"),
            (Some(e), _) => e.to_string(),
            (None, _) => "never".into(),
        };
        println!(
            "{:<12}  {:<20}  {:<6}  {expires}",
            r["id"].as_str().unwrap_or(""),
            r["principal"].as_str().unwrap_or(""),
            r["scope"].as_str().unwrap_or("")
        );
    }
    Ok(())
}

fn revoke(a: &RevokeArgs) -> CmdResult {
    let path = &a.config.config;
    if !path.exists() {
        return Err(usage(anyhow::anyhow!("{} does not exist", path.display())));
    }
    checked_tokens(path)?;
    // What to match: a sha256 prefix (an id, or the hash of a whole token), or a principal.
    let which = match (&a.id, &a.principal) {
        (Some(id), None) => {
            let want = if id.starts_with("fy_") { token_hash(id) } else { id.trim().to_ascii_lowercase() };
            if want.len() < MIN_ID_LEN || !want.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(usage(anyhow::anyhow!(
                    "{id:?} is not a token id: give at least {MIN_ID_LEN} hex digits as \
                     `ferry token list` shows them, the token itself, or --principal NAME"
                )));
            }
            Which::HashPrefix(want)
        }
        (None, Some(p)) => Which::Principal(p.clone()),
        _ => return Err(usage(anyhow::anyhow!("give a token id or --principal NAME, not both"))),
    };
    let text = std::fs::read_to_string(path).map_err(|e| usage(anyhow::anyhow!("reading {}: {e}", path.display())))?;
    let mut doc: toml_edit::DocumentMut = text.parse().map_err(|e| usage(anyhow::anyhow!("parsing {}: {e}", path.display())))?;
    let mut removed = Vec::new();
    let mut now_empty = false;
    if let Some(tables) = doc.get_mut("tokens").and_then(|i| i.as_array_of_tables_mut()) {
        tables.retain(|t| {
            let sha = t.get("sha256").and_then(|v| v.as_str()).unwrap_or("");
            let principal = t.get("principal").and_then(|v| v.as_str()).unwrap_or("");
            let hit = which.matches(sha, principal);
            if hit {
                removed.push((sha.chars().take(ID_LEN).collect::<String>(), principal.to_string()));
            }
            !hit
        });
        now_empty = tables.is_empty();
    }
    if removed.is_empty() {
        return Err((EXIT_NOT_FOUND, anyhow::anyhow!("no token in {} matches; `ferry token list` shows them", path.display())));
    }
    if now_empty {
        doc.remove("tokens");
    }
    write_atomically(path, doc.to_string().as_bytes()).map_err(|e| (1, e))?;
    for (id, principal) in &removed {
        eprintln!("revoked token {id} of principal {principal:?}");
    }
    if now_empty {
        eprintln!(
            "{} has no tokens left: a server using it serves everything as the principal `local` \
             (loopback only), and a server on another address keeps its old tokens on SIGHUP",
            path.display()
        );
    }
    eprintln!("running servers stop accepting it on SIGHUP (`kill -HUP PID`)");
    Ok(())
}

/// Which tokens `revoke` removes.
enum Which {
    /// Those whose sha256 starts with these (lowercase) hex digits.
    HashPrefix(String),
    /// Every token of this principal.
    Principal(String),
}

impl Which {
    fn matches(&self, sha256: &str, principal: &str) -> bool {
        match self {
            Which::HashPrefix(want) => sha256.to_ascii_lowercase().starts_with(want.as_str()),
            Which::Principal(p) => principal == p,
        }
    }
}

/// Replace `path` with `bytes`: a temporary file beside it (same permissions), synced, renamed
/// over it, and the directory synced.
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "ferry.toml".into());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        if let Ok(meta) = std::fs::metadata(path) {
            f.set_permissions(meta.permissions())?;
        }
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::anyhow!("writing {}: {e}", path.display())
    })
}
