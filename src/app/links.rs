//! Links a person opens at `/l/{id}` (issue 51), as both transports make and show them: the
//! checks of a new link, its passphrase (argon2id, a PHC string; never logged, never returned),
//! the limit on wrong passphrases, the grants a page holds after the passphrase and after a
//! counted download, and the one JSON view of a link.
//!
//! **When a download counts.** A GET of one of a share's files made without a download grant
//! for the link takes one download ([`crate::catalog::LinkCatalog::take_download`], one
//! compare-and-set across replicas) before its first byte, and gives a download grant (a
//! cookie for [`DOWNLOAD_GRANT_SECS`]). With the grant, that client fetches the link's other
//! files, and resumes any of them with `Range`, without counting again. `HEAD` and the page's
//! info never count. So "one download" is one visitor fetching the link's files within the
//! hour; a client that keeps no cookies (curl) counts once per GET.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::catalog::{LinkKind, LinkRecord, PassphraseHash};
use crate::error::{ErrorCode, Refusal};

use super::AppState;

/// Longest message, in characters.
pub const MAX_MESSAGE_CHARS: usize = 1_000;
/// Most files of a share, and most a request takes.
pub const MAX_LINK_FILES: u32 = 200;
/// Files a request takes when it does not say.
pub const DEFAULT_REQUEST_FILES: u32 = 20;
/// Longest passphrase, in bytes.
pub const MAX_PASSPHRASE_BYTES: usize = 1_024;
/// Lifetime of a link that does not say, ms (7 days).
pub const DEFAULT_LINK_TTL_MS: u64 = 7 * 24 * 3600 * 1000;
/// Longest lifetime of a link, ms (90 days).
pub const MAX_LINK_TTL_MS: u64 = 90 * 24 * 3600 * 1000;
/// How long the right passphrase opens a link in that browser, seconds.
pub const OPEN_GRANT_SECS: i64 = 3600;
/// How long a counted download lets that client fetch and resume the link's files, seconds.
pub const DOWNLOAD_GRANT_SECS: i64 = 3600;
/// Wrong passphrases allowed (per link, and per client address) before each further try waits.
pub const FREE_TRIES: u32 = 3;
/// Longest wait between tries, seconds.
pub const MAX_TRY_WAIT_SECS: u64 = 300;

/// What a new link asks for (REST `POST /api/v1/links`, MCP `file_share` / `file_request`).
#[derive(Debug, Default, Clone)]
pub struct NewLink {
    pub kind: Option<LinkKind>,
    /// A share's files, in the order the page lists them; a request's must be empty.
    pub files: Vec<String>,
    pub message: Option<String>,
    pub passphrase: Option<String>,
    /// A share's download limit.
    pub max_downloads: Option<u32>,
    /// A request's most files ([`DEFAULT_REQUEST_FILES`] when absent).
    pub max_files: Option<u32>,
    /// Lifetime, ms ([`DEFAULT_LINK_TTL_MS`] when absent, at most [`MAX_LINK_TTL_MS`]).
    pub ttl_ms: Option<u64>,
}

/// 422 `invalid_argument`: a request that fits the API's schema but that a link cannot use (a
/// share without files, a request with some, a file listed twice…); what the schema itself
/// bounds was refused before (400).
fn bad(detail: impl Into<String>, next: impl Into<String>) -> Refusal {
    Refusal::new(422, ErrorCode::InvalidArgument, detail.into(), next.into())
}

/// Check `req` and make the link for `principal` at `now_ms`. Errors: 400 for a bad field
/// (named), 404 for a share's file the principal does not have, catalog failures.
pub async fn create(s: &AppState, principal: &str, req: NewLink, now_ms: i64) -> Result<LinkRecord, Refusal> {
    let kind = req
        .kind
        .ok_or_else(|| bad("kind is required: \"share\" or \"request\"", r#"Send {"kind":"share","files":["ID"]} or {"kind":"request"}."#))?;
    let message = req.message.unwrap_or_default();
    if message.chars().count() > MAX_MESSAGE_CHARS {
        return Err(bad(format!("message has {} characters; at most {MAX_MESSAGE_CHARS}", message.chars().count()), "Shorten the message."));
    }
    if message.chars().any(|c| c.is_control() && c != '\n') {
        return Err(bad("message holds a control character other than a line break", "Send plain text; lines may be separated by \\n."));
    }
    let ttl = req.ttl_ms.unwrap_or(DEFAULT_LINK_TTL_MS);
    if !(1..=MAX_LINK_TTL_MS).contains(&ttl) {
        return Err(bad(
            format!("ttl_ms must be from 1 to {MAX_LINK_TTL_MS} (90 days)"),
            format!("Send a ttl_ms in that range, e.g. {DEFAULT_LINK_TTL_MS} for 7 days."),
        ));
    }
    let (files, max_files, max_downloads) = match kind {
        LinkKind::Share => {
            if req.files.is_empty() || req.files.len() > MAX_LINK_FILES as usize {
                return Err(bad(
                    format!("a share lists 1 to {MAX_LINK_FILES} files; this one lists {}", req.files.len()),
                    "Send the files' ids in files[].",
                ));
            }
            if req.max_files.is_some() {
                return Err(bad("max_files is for a request; a share has the files it lists", "Leave max_files out."));
            }
            let mut seen = std::collections::HashSet::new();
            for id in &req.files {
                if !seen.insert(id) {
                    return Err(bad(format!("file {id} is listed twice"), "List each file once."));
                }
                s.engine.get(principal, id).await?;
            }
            if req.max_downloads == Some(0) {
                return Err(bad("max_downloads must be at least 1", "Leave it out for no limit, or send 1 for a one-time link."));
            }
            let n = req.files.len() as u32;
            (req.files, n, req.max_downloads)
        }
        LinkKind::Request => {
            if !req.files.is_empty() {
                return Err(bad("a request link starts with no files (people add them)", "Leave files out; set max_files for how many it takes."));
            }
            if req.max_downloads.is_some() {
                return Err(bad("max_downloads is for a share", "Leave max_downloads out of a request."));
            }
            let max = req.max_files.unwrap_or(DEFAULT_REQUEST_FILES);
            if !(1..=MAX_LINK_FILES).contains(&max) {
                return Err(bad(
                    format!("max_files must be from 1 to {MAX_LINK_FILES}"),
                    format!("Send a max_files in that range (default {DEFAULT_REQUEST_FILES})."),
                ));
            }
            (Vec::new(), max, None)
        }
    };
    let passphrase_hash = match req.passphrase {
        None => None,
        Some(p) if p.is_empty() || p.len() > MAX_PASSPHRASE_BYTES => {
            return Err(bad(format!("a passphrase has 1 to {MAX_PASSPHRASE_BYTES} bytes"), "Leave it out for no passphrase."));
        }
        Some(p) => Some(hash_passphrase(p).await?),
    };
    let link = LinkRecord {
        id: crate::upload::new_id(),
        principal: principal.to_string(),
        kind,
        files,
        message,
        passphrase_hash,
        max_downloads,
        downloads: 0,
        max_files,
        expires_at_ms: now_ms.saturating_add(ttl as i64),
        revoked_at_ms: None,
        created_at_ms: now_ms,
    };
    s.engine.catalog.create_link(&link).await?;
    tracing::info!(link = %link.id, kind = kind.as_str(), files = link.files.len(), passphrase = link.passphrase_hash.is_some(), "link created");
    Ok(link)
}

/// argon2id with the crate's default parameters (19 MiB, 2 passes: OWASP's minimum), on a
/// blocking thread.
async fn hash_passphrase(p: String) -> Result<PassphraseHash, Refusal> {
    tokio::task::spawn_blocking(move || {
        use argon2::password_hash::{PasswordHasher, SaltString};
        let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>()).map_err(|e| crate::upload::internal("making a passphrase salt", e))?;
        let hash = argon2::Argon2::default().hash_password(p.as_bytes(), &salt).map_err(|e| crate::upload::internal("hashing a passphrase", e))?;
        Ok(PassphraseHash(hash.to_string()))
    })
    .await
    .map_err(|e| crate::upload::internal("hashing a passphrase", e))?
}

async fn passphrase_matches(hash: &PassphraseHash, p: String) -> Result<bool, Refusal> {
    let hash = hash.0.clone();
    tokio::task::spawn_blocking(move || {
        use argon2::password_hash::{PasswordHash, PasswordVerifier};
        let parsed = PasswordHash::new(&hash).map_err(|e| crate::upload::internal("reading a stored passphrase hash", e))?;
        Ok(argon2::Argon2::default().verify_password(p.as_bytes(), &parsed).is_ok())
    })
    .await
    .map_err(|e| crate::upload::internal("checking a passphrase", e))?
}

/// Whether a link can be used now, and if not, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkState {
    Open,
    Revoked,
    Expired,
    /// A share whose every download was taken.
    UsedUp,
    /// A request that took all the files it takes.
    Full,
}

pub fn state(l: &LinkRecord, now_ms: i64) -> LinkState {
    if l.revoked_at_ms.is_some() {
        LinkState::Revoked
    } else if l.expires_at_ms <= now_ms {
        LinkState::Expired
    } else if l.used_up() {
        LinkState::UsedUp
    } else if l.kind == LinkKind::Request && l.files.len() as u32 >= l.max_files {
        LinkState::Full
    } else {
        LinkState::Open
    }
}

/// The refusal for a link that cannot be used: 410 `unauthorized`, the detail and next step in
/// plain words; `None` while it is open.
pub fn refusal(l: &LinkRecord, now_ms: i64) -> Option<Refusal> {
    let (detail, next) = match state(l, now_ms) {
        LinkState::Open => return None,
        LinkState::Revoked => ("this link was revoked by the person who made it".to_string(), "Ask them for a new link."),
        LinkState::Expired => {
            (format!("this link expired at {}", crate::upload::rfc3339(l.expires_at_ms)), "Ask the person who sent it for a new link.")
        }
        LinkState::UsedUp => (
            format!(
                "this link allowed {} download{} and {} used",
                l.max_downloads.unwrap_or(0),
                plural(l.max_downloads.unwrap_or(0)),
                if l.downloads == 1 { "it was" } else { "they were" }
            ),
            "Ask the person who sent it to share the files again.",
        ),
        LinkState::Full => {
            (format!("this request took the {} file{} it asked for", l.max_files, plural(l.max_files)), "Ask the person who sent it for a new link.")
        }
    };
    Some(Refusal::new(410, ErrorCode::Unauthorized, detail, next))
}

fn plural(n: u32) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The one JSON view of a link (REST, MCP, the dashboard). Never the passphrase hash.
pub fn view(s: &AppState, l: &LinkRecord, now_ms: i64) -> serde_json::Value {
    serde_json::json!({
        "id": l.id,
        "kind": l.kind,
        "url": s.links.link_url(&l.id),
        "state": state(l, now_ms),
        "files": l.files,
        "message": l.message,
        "passphrase": l.passphrase_hash.is_some(),
        "max_downloads": l.max_downloads,
        "downloads": l.downloads,
        "max_files": l.max_files,
        "expires_at_ms": l.expires_at_ms,
        "expires_at": crate::upload::rfc3339(l.expires_at_ms),
        "revoked_at_ms": l.revoked_at_ms,
        "created_at_ms": l.created_at_ms,
    })
}

/// Look a link up: 404 for an unknown id.
pub async fn get(s: &AppState, id: &str) -> Result<LinkRecord, Refusal> {
    if !crate::upload::is_valid_id(id) {
        return Err(Refusal::not_found());
    }
    s.engine.catalog.get_link(id).await?.ok_or_else(Refusal::not_found)
}

/// A principal's own link: 404 for another's (its existence is not told).
pub async fn get_own(s: &AppState, principal: &str, id: &str) -> Result<LinkRecord, Refusal> {
    let l = get(s, id).await?;
    if l.principal != principal {
        return Err(Refusal::not_found());
    }
    Ok(l)
}

/// Wrong passphrases seen, per link and per client address, in this process.
struct Tries {
    map: HashMap<String, Attempts>,
}

struct Attempts {
    wrong: u32,
    /// No try is checked before this.
    not_before: Instant,
    last: Instant,
}

fn tries() -> &'static Mutex<Tries> {
    static TRIES: std::sync::OnceLock<Mutex<Tries>> = std::sync::OnceLock::new();
    TRIES.get_or_init(|| Mutex::new(Tries { map: HashMap::new() }))
}

/// Wrong tries are forgotten this long after the last one.
const FORGET_TRIES_AFTER: Duration = Duration::from_secs(3600);

/// How long (seconds) before `keys` may try again; 0: now.
fn wait_for(keys: &[String]) -> u64 {
    let now = Instant::now();
    let t = tries().lock().unwrap_or_else(|e| e.into_inner());
    keys.iter().filter_map(|k| t.map.get(k)).map(|a| a.not_before.saturating_duration_since(now).as_secs_f64().ceil() as u64).max().unwrap_or(0)
}

/// One more wrong try for each of `keys`: after [`FREE_TRIES`], the next waits 2, 4, 8… s (at
/// most [`MAX_TRY_WAIT_SECS`]).
fn note_wrong(keys: &[String]) {
    let now = Instant::now();
    let mut t = tries().lock().unwrap_or_else(|e| e.into_inner());
    t.map.retain(|_, a| now.duration_since(a.last) < FORGET_TRIES_AFTER);
    for k in keys {
        let a = t.map.entry(k.clone()).or_insert(Attempts { wrong: 0, not_before: now, last: now });
        a.wrong += 1;
        a.last = now;
        if a.wrong >= FREE_TRIES {
            let secs = 2u64.saturating_pow(a.wrong + 1 - FREE_TRIES).min(MAX_TRY_WAIT_SECS);
            a.not_before = now + Duration::from_secs(secs);
        }
    }
}

fn forget(keys: &[String]) {
    let mut t = tries().lock().unwrap_or_else(|e| e.into_inner());
    for k in keys {
        t.map.remove(k);
    }
}

/// Check `passphrase` for link `l` from `client`: `Ok` gives an open grant (the cookie's
/// value). Errors: 429 with `Retry-After` while the link or the address must wait, 403
/// `unauthorized` for a wrong passphrase, 400 for a link without one.
pub async fn unlock(s: &AppState, l: &LinkRecord, passphrase: String, client: Option<IpAddr>, now_ms: i64) -> Result<String, Refusal> {
    let Some(hash) = &l.passphrase_hash else {
        return Err(Refusal::bad_request("this link has no passphrase", "Open the link: it needs none."));
    };
    let mut keys = vec![format!("link:{}", l.id)];
    if let Some(ip) = client {
        keys.push(format!("addr:{ip}"));
    }
    let wait = wait_for(&keys);
    if wait > 0 {
        return Err(Refusal::new(
            429,
            ErrorCode::Unauthorized,
            "too many wrong passphrases for this link (or from this address)",
            format!("Check the passphrase with the person who sent the link; the next one is checked after {wait} s."),
        )
        .with_retry_after(wait as u32));
    }
    if passphrase.len() > MAX_PASSPHRASE_BYTES || !passphrase_matches(hash, passphrase).await? {
        note_wrong(&keys);
        tracing::info!(link = %l.id, "a wrong passphrase for a link");
        return Err(Refusal::new(
            403,
            ErrorCode::Unauthorized,
            "the passphrase is not right",
            "Check it with the person who sent the link, and type it again.",
        ));
    }
    forget(&keys[..1]);
    Ok(s.links.signer().grant("open", &l.id, now_ms.div_euclid(1000) + OPEN_GRANT_SECS))
}

/// Name of the cookie that holds a grant of `what` for link `id`.
pub fn cookie_name(what: &str, id: &str) -> String {
    format!("ferry_{what}_{id}")
}
