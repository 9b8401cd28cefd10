//! Which finished uploads a SQLite catalog's server may call undamaged without asking the
//! database (issue 24, goal 5: every range GET asked `SELECT … FROM upload_damage`, a round trip
//! to sqlx's connection thread costing ≈ 3 % of a 1 MiB range's CPU).
//!
//! Damage marks are written by `ferry check --repair-catalog`, a process of its own beside the
//! server, so the server's read cache (which only sees its own writes) cannot hold them. Instead
//! every process that commits a mark appends one byte to the **marks file** next to the database
//! (`ferry.db-damage-marks`) after the commit. The server remembers the ids it found unmarked
//! together with the file's identity and length as it was *before* it asked the database; a
//! longer (or new, or replaced) file forgets them all. Since the append follows the commit, a
//! reader that saw the old length either asked before the commit (and forgets at its next look)
//! or saw the mark. What is remembered is also forgotten after [`CLEAN_FOR`], so a mark whose
//! writer died between its commit and its append (or a binary from before this file) is served
//! undamaged for at most that long.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an id found unmarked is believed without asking again, whatever the marks file says.
pub const CLEAN_FOR: Duration = Duration::from_secs(1);

/// At most this many ids are remembered at once (beyond it, the rest are asked each time).
const MAX_REMEMBERED: usize = 65_536;

/// The marks file's identity and length (`None`: it does not exist yet).
pub type Stamp = Option<(u64, u64, u64)>;

/// The marks file of one SQLite database file.
#[derive(Debug, Clone)]
pub struct MarksFile(PathBuf);

impl MarksFile {
    /// The marks file of the database at `db` (`DB-damage-marks`, beside SQLite's `-wal`).
    pub fn beside(db: &Path) -> Self {
        let mut name = db.as_os_str().to_owned();
        name.push("-damage-marks");
        MarksFile(PathBuf::from(name))
    }

    /// Say that a mark was committed: one byte appended (created if missing). Call after the
    /// commit. Errors: the file cannot be opened or written (a full disk): servers then take up
    /// to [`CLEAN_FOR`] to see the mark.
    pub fn bump(&self) -> std::io::Result<()> {
        use std::io::Write;
        // Something other than a file put in its place (a FIFO) fails the open instead of
        // holding the check up forever.
        crate::regular_file::open(std::fs::OpenOptions::new().create(true).append(true), &self.0)?.write_all(b"+")
    }

    fn stamp(&self) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.0).ok().map(|m| (m.dev(), m.ino(), m.len()))
    }
}

/// Ids found unmarked, under the marks file's stamp at the time (see the module docs).
#[derive(Debug)]
pub struct CleanIds {
    file: MarksFile,
    seen: Mutex<Seen>,
}

#[derive(Debug)]
struct Seen {
    stamp: Stamp,
    since: Instant,
    ids: HashSet<String>,
}

/// What [`CleanIds::look`] found: either the id is known unmarked, or the stamp to pass to
/// [`CleanIds::found_clean`] once the database said so.
pub enum Look {
    Clean,
    Ask(Stamp),
}

impl CleanIds {
    pub fn new(file: MarksFile) -> Self {
        CleanIds { file, seen: Mutex::new(Seen { stamp: None, since: Instant::now(), ids: HashSet::new() }) }
    }

    /// Whether `id` is known unmarked now; otherwise the stamp, read before the caller asks the
    /// database. One `stat` of the marks file.
    pub fn look(&self, id: &str) -> Look {
        let stamp = self.file.stamp();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.stamp != stamp || seen.since.elapsed() >= CLEAN_FOR {
            *seen = Seen { stamp, since: Instant::now(), ids: HashSet::new() };
            return Look::Ask(stamp);
        }
        if seen.ids.contains(id) {
            Look::Clean
        } else {
            Look::Ask(stamp)
        }
    }

    /// The database found no mark on `id` after [`CleanIds::look`] returned `Ask(stamp)`.
    pub fn found_clean(&self, id: &str, stamp: Stamp) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.stamp == stamp && seen.since.elapsed() < CLEAN_FOR && seen.ids.len() < MAX_REMEMBERED {
            seen.ids.insert(id.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asks(c: &CleanIds, id: &str) -> Stamp {
        match c.look(id) {
            Look::Ask(s) => s,
            Look::Clean => panic!("{id} believed clean"),
        }
    }

    #[test]
    fn a_mark_committed_after_the_look_is_seen_at_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = MarksFile::beside(&dir.path().join("ferry.db"));
        let clean = CleanIds::new(file.clone());
        // No marks file yet: ask, remember, then believe.
        let s = asks(&clean, "a");
        clean.found_clean("a", s);
        assert!(matches!(clean.look("a"), Look::Clean));
        assert_eq!(asks(&clean, "b"), s, "an id never asked is asked");
        // A mark committed (the file created): everything is asked again.
        file.bump().unwrap();
        let s2 = asks(&clean, "a");
        assert_ne!(s2, s);
        // An answer read before a bump is not remembered after it.
        file.bump().unwrap();
        clean.found_clean("a", s2);
        let s3 = asks(&clean, "a");
        clean.found_clean("a", s3);
        assert!(matches!(clean.look("a"), Look::Clean));
    }

    #[test]
    fn a_fifo_in_place_of_the_marks_file_fails_the_append_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ferry.db");
        let file = MarksFile::beside(&db);
        nix::unistd::mkfifo(&file.0, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(file.bump().is_err());
    }

    #[test]
    fn what_is_remembered_is_forgotten_after_its_time() {
        let dir = tempfile::tempdir().unwrap();
        let clean = CleanIds::new(MarksFile::beside(&dir.path().join("ferry.db")));
        let s = asks(&clean, "a");
        clean.found_clean("a", s);
        clean.seen.lock().unwrap().since -= CLEAN_FOR;
        asks(&clean, "a");
    }
}
