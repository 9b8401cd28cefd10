//! Resource exhaustion (DESIGN §9): recognising it, the free-space reserve, and the process's
//! open-file limit.
//!
//! Disk full, quota reached, too many open files and a catalog that cannot write are expected
//! states, not internal errors. This module names them ([`Exhausted`]) from the errors the
//! stores return (`io::Error`, `sqlx::Error`), measures free space against the operator's
//! reserve ([`SpaceReserve`]), and raises `RLIMIT_NOFILE` at start-up ([`raise_nofile_limit`]).
//! The stores map what it finds into their own error variants; the upload engine turns them
//! into `507 insufficient_storage` / `503 unavailable`.

use std::path::{Path, PathBuf};

/// A resource that ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exhausted {
    /// No room: `ENOSPC`, `EDQUOT`, SQLite `SQLITE_FULL`, PostgreSQL `53100 disk_full`.
    Space,
    /// Something that passes by itself: `EMFILE`/`ENFILE`, a busy or locked database, a pool
    /// out of connections, PostgreSQL `53xxx` insufficient resources other than disk.
    Transient,
}

/// What an I/O error says about resources (`None`: not an exhaustion).
pub fn classify_io(e: &std::io::Error) -> Option<Exhausted> {
    if e.kind() == std::io::ErrorKind::StorageFull || e.kind() == std::io::ErrorKind::QuotaExceeded {
        return Some(Exhausted::Space);
    }
    match e.raw_os_error() {
        Some(nix::libc::ENOSPC | nix::libc::EDQUOT) => Some(Exhausted::Space),
        Some(nix::libc::EMFILE | nix::libc::ENFILE | nix::libc::ENOMEM) => Some(Exhausted::Transient),
        _ => None,
    }
}

/// Whether any error in `e`'s source chain is an exhaustion (the first one found).
pub fn classify_chain(e: &(dyn std::error::Error + 'static)) -> Option<Exhausted> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if let Some(x) = classify_io(io) {
                return Some(x);
            }
        }
        if let Some(sq) = err.downcast_ref::<sqlx::Error>() {
            if let Some(x) = classify_sqlx(sq) {
                return Some(x);
            }
        }
        cur = err.source();
    }
    None
}

/// What a database error says about resources. SQLite result codes (primary code = low byte
/// of the extended one): 13 `SQLITE_FULL`; 5 `BUSY`, 6 `LOCKED`, 7 `NOMEM`, 10 `IOERR`,
/// 14 `CANTOPEN` (often `EMFILE`). PostgreSQL's SQLSTATEs: see [`classify_sqlstate`].
pub fn classify_sqlx(e: &sqlx::Error) -> Option<Exhausted> {
    match e {
        sqlx::Error::Io(io) => classify_io(io).or(Some(Exhausted::Transient)),
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed | sqlx::Error::Protocol(_) => Some(Exhausted::Transient),
        sqlx::Error::Database(d) => {
            let code = d.code()?;
            // SQLite's codes are numbers; PostgreSQL's SQLSTATEs may be all digits too (`53300`,
            // `55000`), so the backend decides how the code is read, not its shape.
            if d.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                let Ok(n) = code.parse::<i32>() else { return None };
                return match n & 0xff {
                    13 => Some(Exhausted::Space),
                    5 | 6 | 7 | 10 | 14 => Some(Exhausted::Transient),
                    _ => None,
                };
            }
            classify_sqlstate(&code)
        }
        _ => None,
    }
}

/// What a PostgreSQL error code (SQLSTATE, PostgreSQL Appendix A) says about retrying: `53100`
/// (disk full) is [`Exhausted::Space`]; these are [`Exhausted::Transient`], the database being
/// away or busy for now: class 53 (insufficient resources: too many connections, out of
/// memory), class 08 (connection exception), class 40 (the transaction was rolled back:
/// serialization failure, deadlock), `55000` (among others, "database is not currently
/// accepting connections"), `55P03` (lock not available), `57014` (statement cancelled or timed
/// out), `57P01`–`57P03` (the server shutting down or not yet accepting). Anything else: `None`.
pub fn classify_sqlstate(code: &str) -> Option<Exhausted> {
    match code {
        "53100" => Some(Exhausted::Space),
        c if c.starts_with("53") || c.starts_with("08") || c.starts_with("40") => Some(Exhausted::Transient),
        "55000" | "55P03" | "57014" | "57P01" | "57P02" | "57P03" => Some(Exhausted::Transient),
        _ => None,
    }
}

/// Bytes of free space the server keeps on the filesystem of its data directory: new uploads,
/// creations whose `Upload-Length` would eat into it, PATCHes and task files are refused with
/// 507 before the disk is full (`--min-free-space`, `min_free_space`, `FERRY_MIN_FREE_SPACE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    /// A fixed number of bytes (`0` turns the reserve off).
    Bytes(u64),
    /// A share of the filesystem's size, in percent (`5%`).
    Percent(u8),
    /// The default: 5 % of the filesystem, at most 1 GiB.
    Default,
}

impl Reserve {
    /// The reserve in bytes on a filesystem of `total` bytes.
    pub fn bytes(self, total: u64) -> u64 {
        match self {
            Reserve::Bytes(b) => b,
            Reserve::Percent(p) => total / 100 * u64::from(p),
            Reserve::Default => (total / 20).min(1 << 30),
        }
    }

    /// Parse `0`, `512MiB`, `1GiB`, `1073741824` or `5%` (0–99 %).
    pub fn parse(s: &str) -> Result<Reserve, String> {
        let s = s.trim();
        if let Some(p) = s.strip_suffix('%') {
            return match p.trim().parse::<u8>() {
                Ok(p) if p < 100 && p.to_string() == p.to_string().trim() => Ok(Reserve::Percent(p)),
                _ => Err(format!("invalid free-space reserve {s:?}: a percentage must be 0% to 99%")),
            };
        }
        let n = if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            s.parse::<u64>().ok()
        } else {
            s.parse::<bytesize::ByteSize>().ok().map(|b| b.as_u64())
        };
        n.map(Reserve::Bytes).ok_or_else(|| format!("invalid free-space reserve {s:?}: expected bytes like 0, 512MiB, 1GiB, or a percentage like 5%"))
    }
}

/// Free space on a filesystem, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes an unprivileged writer may still use (`f_bavail × f_frsize`).
    pub available: u64,
    /// The filesystem's size.
    pub total: u64,
    /// The reserve in force on it.
    pub reserve: u64,
}

impl Space {
    /// Bytes that may be written before the reserve is reached.
    pub fn usable(&self) -> u64 {
        self.available.saturating_sub(self.reserve)
    }
}

/// Measures the free space of the data directory's filesystem against a [`Reserve`]. Clones
/// share one [`SpaceLedger`]: what every writer of the server took since the last measurement.
#[derive(Debug, Clone)]
pub struct SpaceReserve {
    dir: PathBuf,
    reserve: Reserve,
    ledger: std::sync::Arc<SpaceLedger>,
}

/// The bytes all writers streaming into one filesystem took since its free space was last
/// measured, against the room that measurement left (DESIGN §9). Each writer used to measure
/// on its own, after half the room *it* had seen: twenty at once each took their half and
/// filled the disk past the reserve. Now the room is shared: whichever writer finds that the
/// writers together took half of it measures again, so between two measurements they take at
/// most half of what was left above the reserve, however many they are.
#[derive(Debug, Default)]
pub struct SpaceLedger {
    /// Bytes taken by all writers since the last measurement.
    taken: std::sync::atomic::AtomicU64,
    /// Bytes they may take before the next one (`0`: measure at every check).
    budget: std::sync::atomic::AtomicU64,
    /// Sum of what each writer holds that free space may not show yet (gathered, not written).
    unflushed: std::sync::atomic::AtomicU64,
    /// One measurement at a time.
    measuring: std::sync::Mutex<()>,
}

impl SpaceLedger {
    /// May a writer write `n` bytes more? It holds `held` bytes the disk does not show yet (it
    /// held `*was_held` at its last call). `Ok`: go on, the `n` bytes are counted; `Err(detail)`:
    /// they would eat into the reserve, write none of them. `measure` is called (under the
    /// ledger's lock) when the shared budget is spent; `None` = cannot measure (the reserve is
    /// off): never refuse.
    pub fn take(&self, n: u64, held: u64, was_held: &mut u64, measure: impl FnOnce() -> Option<Space>) -> Result<(), String> {
        use std::sync::atomic::Ordering::SeqCst;
        if held >= *was_held {
            self.unflushed.fetch_add(held - *was_held, SeqCst);
        } else {
            self.unflushed.fetch_sub(*was_held - held, SeqCst);
        }
        *was_held = held;
        if self.taken.fetch_add(n, SeqCst) + n <= self.budget.load(SeqCst) {
            return Ok(());
        }
        let _one = self.measuring.lock().unwrap_or_else(|e| e.into_inner());
        let before = self.taken.load(SeqCst);
        if before <= self.budget.load(SeqCst) {
            return Ok(()); // another writer measured meanwhile, counting these bytes
        }
        let Some(s) = measure() else {
            self.budget.store(u64::MAX, SeqCst);
            return Ok(());
        };
        // What was taken before is on the disk now, or held unflushed by its writer; these `n`
        // bytes are neither yet.
        let left = s.usable().saturating_sub(self.unflushed.load(SeqCst));
        if s.available <= s.reserve || left < n {
            self.taken.fetch_sub(n, SeqCst);
            self.budget.store(0, SeqCst);
            return Err(format!("the server's disk reached its free-space reserve: {} bytes free, {} bytes kept in reserve", s.available, s.reserve));
        }
        self.taken.fetch_sub(before - n, SeqCst);
        self.budget.store(((left - n) / 2).clamp(1, SPACE_STEP_MAX), SeqCst);
        Ok(())
    }

    /// A writer that held `held` unflushed bytes is gone.
    pub fn release(&self, held: u64) {
        self.unflushed.fetch_sub(held, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Most bytes all writers take between two measurements of free space (fewer as the room left
/// above the reserve shrinks).
pub const SPACE_STEP_MAX: u64 = 16 << 20;

impl SpaceReserve {
    pub fn new(dir: &Path, reserve: Reserve) -> SpaceReserve {
        SpaceReserve { dir: dir.to_path_buf(), reserve, ledger: Default::default() }
    }

    /// Off: never refuses (tests, embedders without a local disk).
    pub fn none() -> SpaceReserve {
        SpaceReserve { dir: PathBuf::new(), reserve: Reserve::Bytes(0), ledger: Default::default() }
    }

    /// The ledger every writer streaming into this filesystem shares.
    pub fn ledger(&self) -> &std::sync::Arc<SpaceLedger> {
        &self.ledger
    }

    /// The free space now (`statvfs`, a cheap system call). `None` when the reserve is off or
    /// the filesystem cannot be asked.
    pub fn measure(&self) -> Option<Space> {
        if self.reserve == Reserve::Bytes(0) || self.dir.as_os_str().is_empty() {
            return None;
        }
        let st = nix::sys::statvfs::statvfs(&self.dir).ok()?;
        let unit = st.fragment_size() as u64;
        let total = (st.blocks() as u64).saturating_mul(unit);
        Some(Space { available: (st.blocks_available() as u64).saturating_mul(unit), total, reserve: self.reserve.bytes(total) })
    }

    /// `Err(detail)` when the reserve is as large as the whole filesystem (`--min-free-space
    /// 1TiB` on a smaller disk): nothing could ever be stored, and every creation would be told
    /// to retry later. Checked once at start.
    pub fn fits_the_disk(&self) -> Result<(), String> {
        match self.measure() {
            Some(s) if s.reserve >= s.total => Err(format!(
                "the free-space reserve (--min-free-space) of {} bytes is not smaller than \
                 the filesystem holding {} ({} bytes): nothing could be stored; lower it",
                s.reserve,
                self.dir.display(),
                s.total
            )),
            _ => Ok(()),
        }
    }

    /// `Err(detail)` when writing `bytes` more would eat into the reserve (or the reserve is
    /// already reached, for `bytes = 0`).
    pub fn check(&self, bytes: u64) -> Result<(), String> {
        self.check_freeing(bytes, 0)
    }

    /// [`SpaceReserve::check`] for a writer that first frees `freed` bytes (it cuts its blob
    /// back to the committed offset).
    pub fn check_freeing(&self, bytes: u64, freed: u64) -> Result<(), String> {
        let Some(mut s) = self.measure() else { return Ok(()) };
        s.available = s.available.saturating_add(freed);
        if s.available <= s.reserve || bytes > s.usable() {
            return Err(if bytes == 0 || s.available <= s.reserve {
                format!("the server's disk is nearly full: {} bytes free, and it keeps {} bytes in reserve", s.available, s.reserve)
            } else {
                format!("{bytes} bytes do not fit: the server's disk has {} bytes free and keeps {} bytes in reserve", s.available, s.reserve)
            });
        }
        Ok(())
    }
}

/// `err`, and when the filesystem of `dir` has less than 1 MiB free, a word that this is why
/// (SQLite says only "disk I/O error" when it cannot grow its shared-memory file).
pub fn note_full_disk(err: anyhow::Error, dir: &Path) -> anyhow::Error {
    let free = nix::sys::statvfs::statvfs(dir).map(|st| st.blocks_available().saturating_mul(st.fragment_size()));
    match free {
        Ok(free) if free < 1 << 20 => {
            err.context(format!("the disk holding {} is full ({free} bytes free): free some space and start again", dir.display()))
        }
        _ => err,
    }
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit (each connection, blob and database file
/// is a descriptor; distributions default the soft limit to 1024). Returns `(before, after)`
/// soft limits. Errors: the limit cannot be read or set.
pub fn raise_nofile_limit() -> std::io::Result<(u64, u64)> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(std::io::Error::from)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(std::io::Error::from)?;
    }
    let (now, _) = getrlimit(Resource::RLIMIT_NOFILE).map_err(std::io::Error::from)?;
    Ok((soft, now))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Twenty writers streaming at once into a filesystem whose free space shows every byte
    /// written: together they stop at the reserve, and use the room above it (all but less
    /// than one frame).
    #[test]
    fn writers_at_once_share_the_room_above_the_reserve() {
        let (total, reserve, frame, writers) = (100_000_000u64, 10_000_000u64, 400_000u64, 20);
        let ledger = SpaceLedger::default();
        let written = std::cell::Cell::new(0u64);
        let measure = || Some(Space { available: total - written.get(), total, reserve });
        let mut held = vec![0u64; writers];
        let mut stopped = vec![false; writers];
        while stopped.iter().any(|s| !s) {
            for w in 0..writers {
                if stopped[w] {
                    continue;
                }
                stopped[w] = ledger.take(frame, 0, &mut held[w], measure).is_err();
                if !stopped[w] {
                    written.set(written.get() + frame);
                }
            }
        }
        let w = written.get();
        assert!(w + frame > total - reserve, "stopped early: {w}");
        assert!(w <= total - reserve, "ate into the reserve: {w}");
    }

    /// Bytes writers hold that free space does not show yet count against the room, until the
    /// writer is gone.
    #[test]
    fn what_writers_hold_unflushed_counts_against_the_room() {
        let ledger = SpaceLedger::default();
        let space = Space { available: 30, total: 100, reserve: 10 };
        let (mut a, mut b) = (0, 0);
        assert!(ledger.take(15, 0, &mut a, || Some(space)).is_ok());
        assert!(ledger.take(0, 15, &mut a, || Some(space)).is_ok(), "a's 15 bytes are not on the disk yet");
        assert!(ledger.take(6, 0, &mut b, || Some(space)).is_err(), "15 unflushed leave 5 above the reserve, not 6");
        ledger.release(a);
        assert!(ledger.take(6, 0, &mut b, || Some(space)).is_ok());
    }

    #[test]
    fn postgres_codes_that_say_try_again_are_transient() {
        for c in ["53300", "08006", "40001", "40P01", "55000", "55P03", "57014", "57P01", "57P03"] {
            assert_eq!(classify_sqlstate(c), Some(Exhausted::Transient), "{c}");
        }
        assert_eq!(classify_sqlstate("53100"), Some(Exhausted::Space));
        for c in ["23505", "42P01", "3D000", "28P01", "22001"] {
            assert_eq!(classify_sqlstate(c), None, "{c}");
        }
    }

    #[test]
    fn io_errors_are_classified() {
        assert_eq!(classify_io(&std::io::Error::from_raw_os_error(nix::libc::ENOSPC)), Some(Exhausted::Space));
        assert_eq!(classify_io(&std::io::Error::from_raw_os_error(nix::libc::EDQUOT)), Some(Exhausted::Space));
        assert_eq!(classify_io(&std::io::Error::from_raw_os_error(nix::libc::EMFILE)), Some(Exhausted::Transient));
        assert_eq!(classify_io(&std::io::Error::from_raw_os_error(nix::libc::ENFILE)), Some(Exhausted::Transient));
        assert_eq!(classify_io(&std::io::Error::from_raw_os_error(nix::libc::EACCES)), None);
        let wrapped = sqlx::Error::Io(std::io::Error::from_raw_os_error(nix::libc::ENOSPC));
        assert_eq!(classify_sqlx(&wrapped), Some(Exhausted::Space));
        assert_eq!(classify_sqlx(&sqlx::Error::PoolTimedOut), Some(Exhausted::Transient));
        assert_eq!(classify_sqlx(&sqlx::Error::RowNotFound), None);
    }

    #[test]
    fn reserve_parses_bytes_and_percentages() {
        assert_eq!(Reserve::parse("0"), Ok(Reserve::Bytes(0)));
        assert_eq!(Reserve::parse("1GiB"), Ok(Reserve::Bytes(1 << 30)));
        assert_eq!(Reserve::parse("5%"), Ok(Reserve::Percent(5)));
        assert!(Reserve::parse("100%").is_err());
        assert!(Reserve::parse("-1%").is_err());
        assert!(Reserve::parse("lots").is_err());
        assert_eq!(Reserve::Default.bytes(100 << 30), 1 << 30);
        assert_eq!(Reserve::Default.bytes(1000), 50);
        assert_eq!(Reserve::Percent(10).bytes(1000), 100);
    }
}
