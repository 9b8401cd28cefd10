//! The upload URL store of `ferry upload`: which upload URL(s) belong to which local file, so
//! that re-running the same command resumes instead of starting over (like tus-js-client's
//! URL storage, keyed by a fingerprint of the server, the token's identity, the name the
//! upload gets, and the file's path, size and modification time).
//!
//! One JSON file, `uploads.json`, in the cache directory: `$FERRY_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/ferry`, else `~/.cache/ferry`. Read-modify-write cycles hold an exclusive
//! lock on `uploads.json.lock`, and the file is replaced atomically (write + rename), so
//! concurrent `ferry upload` processes never corrupt it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::client::{CliError, EXIT_FAILURE};

/// Entries not touched for this long are dropped (ferry expires unfinished uploads after 7
/// days by default; finished ones are kept so a re-run can verify instead of re-sending).
const ENTRY_TTL_MS: i64 = 30 * 24 * 3600 * 1000;

/// What is remembered about one local file's upload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    /// TUS URLs of the parts (one entry without `--parallel`).
    pub parts: Vec<String>,
    /// The final (concatenated) upload's URL once it was created (`--parallel` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_url: Option<String>,
    /// The `Upload-Metadata` header the upload was created with (the final upload's, with
    /// `--parallel`): a run with other `--meta` starts a new upload instead of resuming.
    #[serde(default)]
    pub meta: String,
    /// Unix ms of the last change.
    pub updated_at_ms: i64,
}

/// The fingerprint of what the server will hold: one server, one principal (`identity`, see
/// [`super::client::token_identity`]), the name the upload gets (`name`: its `filename`
/// metadata, `None` without one), the local content (canonical `path`, `size`, modification
/// time) and one way of splitting it: the entry's key. Two tokens on the same server never
/// share (or evict) each other's entries, and two names for one file (symlinks `a.iso` and
/// `b.iso` to one file, or `--name`) are two uploads, never one resumed as the other.
pub fn fingerprint(server: &str, identity: &str, name: Option<&str>, path: &Path, size: u64, mtime_ns: i128, parallel: usize) -> String {
    // The name is JSON-quoted so that no name can spell another key's fields.
    let name = serde_json::to_string(&name).expect("serialises");
    format!("ferry-v3|{server}|{identity}|{name}|{}|{size}|{mtime_ns}|p{parallel}", path.display())
}

/// The cache directory (see the module docs).
pub fn cache_dir() -> Result<PathBuf, CliError> {
    let from_env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = from_env("FERRY_CACHE_DIR") {
        return Ok(d);
    }
    if let Some(d) = from_env("XDG_CACHE_HOME").filter(|d| d.is_absolute()) {
        return Ok(d.join("ferry"));
    }
    if let Some(h) = from_env("HOME") {
        return Ok(h.join(".cache").join("ferry"));
    }
    Err(CliError::usage("no cache directory for the upload URL store: set FERRY_CACHE_DIR, XDG_CACHE_HOME or HOME"))
}

/// The store on disk.
pub struct Store {
    path: PathBuf,
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> CliError {
    CliError::new(EXIT_FAILURE, format!("{what} {}: {e}", path.display())).hint("Set FERRY_CACHE_DIR to a writable directory.")
}

use crate::clock::now_ms;

impl Store {
    /// The store in [`cache_dir`].
    pub fn open() -> Result<Store, CliError> {
        let dir = cache_dir()?;
        std::fs::create_dir_all(&dir).map_err(|e| io_err("cannot create", &dir, e))?;
        Ok(Store { path: dir.join("uploads.json") })
    }

    /// Run `f` on the entries under the lock, then write them back if `f` changed them.
    fn update<T>(&self, f: impl FnOnce(&mut BTreeMap<String, Entry>) -> T) -> Result<T, CliError> {
        let lock_path = self.path.with_extension("json.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io_err("cannot open", &lock_path, e))?;
        lock.lock().map_err(|e| io_err("cannot lock", &lock_path, e))?;
        let mut entries: BTreeMap<String, Entry> = match std::fs::read(&self.path) {
            // A damaged store only costs resumability: start over with an empty one.
            Ok(b) => serde_json::from_slice(&b).unwrap_or_default(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(io_err("cannot read", &self.path, e)),
        };
        let before = entries.clone();
        let now = now_ms();
        entries.retain(|_, e| now - e.updated_at_ms < ENTRY_TTL_MS);
        let out = f(&mut entries);
        if entries != before {
            let tmp = self.path.with_extension(format!("json.{}.tmp", std::process::id()));
            let write = || -> std::io::Result<()> {
                let mut file = std::fs::File::create(&tmp)?;
                file.write_all(&serde_json::to_vec_pretty(&entries).expect("serialises"))?;
                file.sync_all()?;
                std::fs::rename(&tmp, &self.path)
            };
            write().map_err(|e| io_err("cannot write", &self.path, e))?;
        }
        Ok(out)
    }

    /// The entry for `key`, if any.
    pub fn get(&self, key: &str) -> Result<Option<Entry>, CliError> {
        self.update(|m| m.get(key).cloned())
    }

    /// Remember `parts` / `final_url` for `key`.
    pub fn put(&self, key: &str, parts: &[String], final_url: Option<&str>, meta: &str) -> Result<(), CliError> {
        let entry = Entry { parts: parts.to_vec(), final_url: final_url.map(str::to_owned), meta: meta.to_string(), updated_at_ms: now_ms() };
        self.update(|m| {
            m.insert(key.to_string(), entry);
        })
    }

    /// Forget `key`.
    pub fn remove(&self, key: &str) -> Result<(), CliError> {
        self.update(|m| {
            m.remove(key);
        })
    }

    /// Forget every entry that names `url` (after `ferry rm`); returns them.
    pub fn forget_url(&self, url: &str) -> Result<Vec<Entry>, CliError> {
        self.update(|m| {
            let names = |e: &Entry| e.parts.iter().any(|p| p == url) || e.final_url.as_deref() == Some(url);
            let gone: Vec<Entry> = m.values().filter(|e| names(e)).cloned().collect();
            m.retain(|_, e| !names(e));
            gone
        })
    }
}
