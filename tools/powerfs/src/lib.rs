//! A FUSE filesystem, for tests only, that loses every write not made durable when its "power"
//! is cut. It keeps the whole filesystem in the test process's memory as two images (see
//! [`model`] for the rules: fsync of a file makes its bytes durable, fsync of a directory its
//! entries; a cut keeps the durable image only), and [`PowerFs`] mounts it, cuts the power —
//! now ([`PowerFs::cut_now`]) or at the n-th operation of a kind on a path ([`PowerFs::arm`]),
//! inside that operation, which then fails with `EIO` like everything after it — and mounts the
//! survivors again ([`PowerFs::remount`]).
//!
//! The kernel keeps its page cache (a shared `mmap`, e.g. SQLite's `-shm`, works as on any
//! filesystem: its pages reach the model when the kernel writes them back), and handles
//! `flock` and POSIX locks itself (the filesystem asks for neither), which is right for one
//! mount. Mounting needs `/dev/fuse` and root (`mount(2)`), or Debian's `fuse3` (`fusermount3`).

pub mod model;

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, WriteFlags,
};

pub use model::CutReport;
use model::{Model, Res};

/// How long the kernel may cache names and attributes. Every change goes through the kernel, so
/// its caches stay right; a remount drops them.
const TTL: Duration = Duration::from_secs(1);

/// Kinds of operation a cut can be armed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `write(2)` (also `fallocate`).
    Write,
    /// `fsync`/`fdatasync` of a file.
    Fsync,
    /// `fsync` of a directory.
    FsyncDir,
    /// create, mkdir, mknod.
    Create,
    Rename,
    /// unlink, rmdir.
    Unlink,
    /// A size change (`truncate`, `ftruncate`, `O_TRUNC`).
    Truncate,
    /// Any of the above.
    Any,
}

/// Cut the power inside the `nth` (1-based, counted from arming) operation of kind `op` on a
/// path containing `path_contains` (paths start at the mount's root: `/data/ferry.db-wal`; a
/// trailing `$` makes it a suffix: `ferry.db$` is the database, not its `-wal`).
/// At the cut each inode with unsynced changes is written back whole with probability `keep`,
/// drawn from `seed`.
#[derive(Debug, Clone, PartialEq)]
pub struct Trigger {
    pub op: Op,
    pub path_contains: String,
    pub nth: u64,
    pub keep: f64,
    pub seed: u64,
}

/// Where a cut happened and what it dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutInfo {
    /// e.g. `fsync /data/blobs/ab/ab12… (#3)`, or `at rest`.
    pub at: String,
    pub report: CutReport,
}

/// Operations seen since mounting, by kind (a cut's [`Trigger`] counts its own).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub writes: u64,
    pub fsyncs: u64,
    pub dir_fsyncs: u64,
    pub creates: u64,
    pub renames: u64,
    pub unlinks: u64,
    pub truncates: u64,
}

#[derive(Debug, Default)]
struct Inner {
    model: Model,
    /// The mount whose requests are served; an older one's get `EIO`.
    generation: u64,
    cut: Option<CutInfo>,
    trigger: Option<(Trigger, u64)>,
    counts: Counts,
}

#[derive(Debug, Default)]
struct Shared {
    inner: Mutex<Inner>,
    cut_happened: Condvar,
}

/// splitmix64: the cut's draws, reproducible from the trigger's seed.
fn draws(mut seed: u64) -> impl FnMut() -> f64 {
    move || {
        seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Inner {
    fn cut(&mut self, at: String, keep: f64, seed: u64) -> CutInfo {
        let report = self.model.cut(keep, draws(seed));
        let info = CutInfo { at, report };
        self.cut = Some(info.clone());
        self.trigger = None;
        info
    }

    /// Before a mutating operation: `EIO` once the power is cut, and the cut itself when this
    /// operation is the armed one.
    fn before(&mut self, op: Op, path: &str, shared: &Shared) -> Res<()> {
        if self.cut.is_some() {
            return Err(libc::EIO);
        }
        let c = &mut self.counts;
        *match op {
            Op::Write => &mut c.writes,
            Op::Fsync => &mut c.fsyncs,
            Op::FsyncDir => &mut c.dir_fsyncs,
            Op::Create => &mut c.creates,
            Op::Rename => &mut c.renames,
            Op::Unlink => &mut c.unlinks,
            Op::Truncate | Op::Any => &mut c.truncates,
        } += 1;
        if let Some((t, seen)) = &mut self.trigger {
            let on_path = match t.path_contains.strip_suffix('$') {
                Some(suffix) => path.ends_with(suffix),
                None => path.contains(&t.path_contains),
            };
            if (t.op == op || t.op == Op::Any) && on_path {
                *seen += 1;
                if *seen >= t.nth {
                    let (keep, seed, n) = (t.keep, t.seed, *seen);
                    self.cut(format!("{op:?} {path} (#{n})"), keep, seed);
                    shared.cut_happened.notify_all();
                    return Err(libc::EIO);
                }
            }
        }
        Ok(())
    }

    fn path(&self, ino: u64) -> String {
        self.model.node(ino).map(|n| n.path.clone()).unwrap_or_default()
    }

    fn child_path(&self, dir: u64, name: &OsStr) -> String {
        format!("{}/{}", self.path(dir), name.to_string_lossy())
    }

    fn attr(&self, ino: u64) -> Res<FileAttr> {
        let n = self.model.node(ino)?;
        let (kind, nlink) = if n.is_dir() { (FileType::Directory, 2) } else { (FileType::RegularFile, 1) };
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size: n.size(),
            blocks: n.size().div_ceil(512),
            atime: n.mtime,
            mtime: n.mtime,
            ctime: n.mtime,
            crtime: n.mtime,
            kind,
            perm: n.perm,
            nlink,
            uid,
            gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }
}

/// The `fuser` side: one per mount, serving the shared model while its generation is current.
struct Ops {
    shared: Arc<Shared>,
    generation: u64,
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

impl Ops {
    fn lock(&self) -> Res<MutexGuard<'_, Inner>> {
        let g = self.shared.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.generation != self.generation {
            return Err(libc::EIO);
        }
        Ok(g)
    }

    /// A mutating operation of kind `op` on `path` (computed under the lock by `path`).
    fn mutate<T>(&self, op: Op, path: impl FnOnce(&Inner) -> String, f: impl FnOnce(&mut Inner) -> Res<T>) -> Res<T> {
        let mut g = self.lock()?;
        let p = path(&g);
        g.before(op, &p, &self.shared)?;
        f(&mut g)
    }

    fn entry(&self, make: impl FnOnce(&mut Inner) -> Res<u64>, op: Op, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self.mutate(op, |g| g.child_path(parent.0, name), |g| make(g).and_then(|ino| g.attr(ino)));
        match r {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }
}

impl Filesystem for Ops {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lock().and_then(|g| g.model.lookup(parent.0, name).and_then(|ino| g.attr(ino))) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.lock().and_then(|g| g.attr(ino.0)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = (|| {
            if let Some(len) = size {
                self.mutate(Op::Truncate, |g| g.path(ino.0), |g| g.model.set_len(ino.0, len))?;
            }
            let mut g = self.lock()?;
            if let Some(mode) = mode {
                g.model.set_perm(ino.0, (mode & 0o7777) as u16)?;
            }
            g.attr(ino.0)
        })();
        match r {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, _rdev: u32, reply: ReplyEntry) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        self.entry(|g| g.model.create(parent.0, name, false, (mode & !umask & 0o7777) as u16), Op::Create, parent, name, reply)
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        self.entry(|g| g.model.create(parent.0, name, true, (mode & !umask & 0o7777) as u16), Op::Create, parent, name, reply)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.mutate(Op::Unlink, |g| g.child_path(parent.0, name), |g| g.model.remove(parent.0, name, false)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.mutate(Op::Unlink, |g| g.child_path(parent.0, name), |g| g.model.remove(parent.0, name, true)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rename(&self, _req: &Request, parent: INodeNo, name: &OsStr, newparent: INodeNo, newname: &OsStr, flags: RenameFlags, reply: ReplyEmpty) {
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        match self.mutate(Op::Rename, |g| g.child_path(parent.0, name), |g| g.model.rename(parent.0, name, newparent.0, newname, noreplace)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.lock().and_then(|g| g.attr(ino.0)) {
            // Keep the page cache across opens: only this mount changes the files.
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        match self.lock().and_then(|g| g.model.read(ino.0, offset, size as usize)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _wf: WriteFlags,
        flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let r = self.mutate(
            Op::Write,
            |g| g.path(ino.0),
            |g| {
                g.model.write(ino.0, offset, data)?;
                // O_SYNC includes O_DSYNC's bit on Linux.
                if flags.0 & libc::O_DSYNC != 0 {
                    g.model.sync(ino.0)?;
                }
                Ok(())
            },
        );
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock: fuser::LockOwner, reply: ReplyEmpty) {
        reply.ok()
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.mutate(Op::Fsync, |g| g.path(ino.0), |g| g.model.sync(ino.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let listed = self.lock().and_then(|g| {
            let mut all =
                vec![(OsStr::new(".").to_os_string(), ino.0, FileType::Directory), (OsStr::new("..").to_os_string(), ino.0, FileType::Directory)];
            for (name, child) in g.model.list(ino.0)? {
                let kind = if g.model.node(child)?.is_dir() { FileType::Directory } else { FileType::RegularFile };
                all.push((name, child, kind));
            }
            Ok(all)
        });
        match listed {
            Ok(all) => {
                for (i, (name, child, kind)) in all.into_iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.mutate(Op::FsyncDir, |g| g.path(ino.0), |g| g.model.sync(ino.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Plenty of room (1 TiB free): ferry's free-space reserve must not refuse uploads.
        reply.statfs(1 << 28, 1 << 28, 1 << 28, 1 << 20, 1 << 20, 4096, 255, 4096)
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok()
    }

    fn create(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, _flags: i32, reply: ReplyCreate) {
        let r = self.mutate(
            Op::Create,
            |g| g.child_path(parent.0, name),
            |g| g.model.create(parent.0, name, false, (mode & !umask & 0o7777) as u16).and_then(|ino| g.attr(ino)),
        );
        match r {
            Ok(attr) => reply.created(&TTL, &attr, Generation(0), FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        if mode != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let r = self.mutate(
            Op::Write,
            |g| g.path(ino.0),
            |g| {
                let len = g.model.node(ino.0)?.size();
                if offset + length > len {
                    g.model.set_len(ino.0, offset + length)?;
                }
                Ok(())
            },
        );
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }
}

/// A mounted power-loss filesystem. Unmounted on drop.
#[derive(Debug)]
pub struct PowerFs {
    shared: Arc<Shared>,
    mountpoint: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

/// Why this machine cannot mount the filesystem, if it cannot (`/dev/fuse` absent).
pub fn unavailable() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse does not exist (no FUSE in this kernel or container)".into());
    }
    None
}

impl PowerFs {
    /// Mount an empty filesystem on `mountpoint` (an existing empty directory).
    pub fn mount(mountpoint: &Path) -> io::Result<PowerFs> {
        let mut fs = PowerFs { shared: Arc::default(), mountpoint: mountpoint.to_path_buf(), session: None };
        fs.mount_current()?;
        Ok(fs)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mount_current(&mut self) -> io::Result<()> {
        let generation = {
            let mut g = self.lock();
            g.generation += 1;
            g.cut = None;
            g.trigger = None;
            g.generation
        };
        let mut config = fuser::Config::default();
        config.mount_options =
            vec![fuser::MountOption::FSName("powerfs".into()), fuser::MountOption::DefaultPermissions, fuser::MountOption::NoAtime];
        let session = fuser::spawn_mount(Ops { shared: self.shared.clone(), generation }, &self.mountpoint, &config)?;
        self.session = Some(session);
        Ok(())
    }

    /// Cut inside the operation `t` describes (replacing any armed cut).
    pub fn arm(&self, t: Trigger) {
        let mut g = self.lock();
        if g.cut.is_none() {
            g.trigger = Some((t, 0));
        }
    }

    /// Cut the power now (unless it already was), keeping each unsynced inode with probability
    /// `keep`. Returns the cut that happened, this one or an armed one before it.
    pub fn cut_now(&self, keep: f64, seed: u64) -> CutInfo {
        let mut g = self.lock();
        if let Some(c) = &g.cut {
            return c.clone();
        }
        let info = g.cut("at rest".into(), keep, seed);
        self.shared.cut_happened.notify_all();
        info
    }

    /// Wait up to `timeout` for an armed cut; the cut, if it happened.
    pub fn wait_cut(&self, timeout: Duration) -> Option<CutInfo> {
        let g = self.lock();
        let (g, _) = self.shared.cut_happened.wait_timeout_while(g, timeout, |g| g.cut.is_none()).unwrap_or_else(|p| p.into_inner());
        g.cut.clone()
    }

    /// The cut, if the power is off.
    pub fn cut_info(&self) -> Option<CutInfo> {
        self.lock().cut.clone()
    }

    /// Operations since the first mount.
    pub fn counts(&self) -> Counts {
        self.lock().counts
    }

    /// Unmount (after a cut, once the processes using the mount are gone) and mount what
    /// survived. A mount still in use is detached (`MNT_DETACH`) and its requests fail.
    pub fn remount(&mut self) -> io::Result<()> {
        self.cut_now(0.0, 0);
        self.unmount();
        self.mount_current()
    }

    fn unmount(&mut self) {
        let Some(session) = self.session.take() else { return };
        let mut busy = true;
        for _ in 0..40 {
            match nix::mount::umount(&self.mountpoint) {
                Ok(()) => {
                    busy = false;
                    break;
                }
                Err(nix::errno::Errno::EBUSY) => std::thread::sleep(Duration::from_millis(50)),
                Err(_) => {
                    busy = false;
                    break;
                }
            }
        }
        if busy {
            eprintln!("powerfs: {} still in use after 2 s; detaching it (MNT_DETACH)", self.mountpoint.display());
            let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
        }
        // Unmounted: its thread ends when the kernel closes the connection, which a detached
        // mount's last user delays; the generation check keeps it off the model meanwhile.
        drop(session);
    }
}

impl Drop for PowerFs {
    fn drop(&mut self) {
        self.cut_now(0.0, 0);
        self.unmount();
    }
}
