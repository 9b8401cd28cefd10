//! The filesystem as two images: what processes see (*volatile*) and what would survive a power
//! cut (*durable*). Pure data, no FUSE: the rules of what becomes durable live here.
//!
//! **The model** (POSIX's minimum, stricter than ext4 `data=ordered`):
//! - A file's bytes and size become durable only by `fsync`/`fdatasync` of that file (or a write
//!   through an `O_SYNC`/`O_DSYNC` handle): the whole file as it is then.
//! - A directory's entries (create, mkdir, unlink, rmdir, rename in or out) become durable only
//!   by `fsync` of that directory: all its entries as they are then. A rename needs both
//!   directories synced; a new file's own fsync does not make its name durable.
//! - At a cut, by default nothing else survives. Optionally ([`Model::cut`]'s `keep`) each inode
//!   with unsynced changes is written back whole with that probability, in no particular order —
//!   what the kernel's flusher may have done before the power went.
//!
//! ext4 `data=ordered` loses no more than this: its fsync commits the whole journal (every
//! earlier create/rename/unlink of the filesystem, not just the file's), and its flusher writes
//! data back every few seconds; each state this model leaves after a cut is one ext4 could leave
//! too (a prefix of the journal and data written before the metadata naming it), only with less
//! written back.
//!
//! Not modelled: a file written back in part (a torn page, some unsynced writes and not others);
//! at a cut each file is as last synced, or whole as it was then. Attributes other than the size
//! (mode, times) are not part of either image.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::sync::Arc;

/// Page size of file contents: syncing a file copies page pointers, not bytes (copy on write).
const PAGE: usize = 64 << 10;

/// Bytes of a file: pages shared between the volatile and durable images until one is written.
#[derive(Clone, Default, Debug)]
pub struct Data {
    pages: Vec<Option<Arc<Vec<u8>>>>,
    len: u64,
}

impl Data {
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Up to `size` bytes at `off` (fewer at the end of the file; holes read as zeros).
    pub fn read(&self, off: u64, size: usize) -> Vec<u8> {
        if off >= self.len {
            return Vec::new();
        }
        let end = (off + size as u64).min(self.len);
        let mut out = Vec::with_capacity((end - off) as usize);
        let mut pos = off;
        while pos < end {
            let (p, within) = ((pos / PAGE as u64) as usize, (pos % PAGE as u64) as usize);
            let n = ((end - pos) as usize).min(PAGE - within);
            match self.pages.get(p).and_then(|x| x.as_ref()) {
                Some(page) => out.extend_from_slice(&page[within..within + n]),
                None => out.resize(out.len() + n, 0),
            }
            pos += n as u64;
        }
        out
    }

    pub fn write(&mut self, off: u64, data: &[u8]) {
        let mut pos = off;
        let mut rest = data;
        while !rest.is_empty() {
            let (p, within) = ((pos / PAGE as u64) as usize, (pos % PAGE as u64) as usize);
            let n = rest.len().min(PAGE - within);
            if self.pages.len() <= p {
                self.pages.resize(p + 1, None);
            }
            let page = self.pages[p].get_or_insert_with(|| Arc::new(vec![0; PAGE]));
            Arc::make_mut(page)[within..within + n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            pos += n as u64;
        }
        self.len = self.len.max(off + data.len() as u64);
    }

    /// Cut or extend (with zeros) to `len`.
    pub fn set_len(&mut self, len: u64) {
        if len < self.len {
            let keep = len.div_ceil(PAGE as u64) as usize;
            self.pages.truncate(keep);
            let within = (len % PAGE as u64) as usize;
            if within != 0 {
                if let Some(Some(page)) = self.pages.last_mut() {
                    Arc::make_mut(page)[within..].fill(0);
                }
            }
        }
        self.len = len;
    }
}

/// What an inode is.
#[derive(Clone, Debug)]
pub enum Body {
    File { vol: Data, dur: Data },
    Dir { vol: BTreeMap<OsString, u64>, dur: BTreeMap<OsString, u64> },
}

/// One inode. `dirty`: changed since its last sync.
#[derive(Clone, Debug)]
pub struct Node {
    pub body: Body,
    pub perm: u16,
    /// The path it was last linked at (for cut triggers and reports), e.g. `/data/ferry.db-wal`.
    pub path: String,
    pub dirty: bool,
    pub mtime: std::time::SystemTime,
}

impl Node {
    pub fn is_dir(&self) -> bool {
        matches!(self.body, Body::Dir { .. })
    }

    pub fn size(&self) -> u64 {
        match &self.body {
            Body::File { vol, .. } => vol.len(),
            Body::Dir { vol, .. } => vol.len() as u64,
        }
    }
}

/// Errors as errno values.
pub type Res<T> = Result<T, i32>;

pub const ROOT: u64 = 1;

/// Both images of the whole filesystem.
#[derive(Debug)]
pub struct Model {
    pub nodes: HashMap<u64, Node>,
    next_ino: u64,
}

impl Default for Model {
    fn default() -> Self {
        let root = Node {
            body: Body::Dir { vol: BTreeMap::new(), dur: BTreeMap::new() },
            perm: 0o755,
            path: String::new(),
            dirty: false,
            mtime: std::time::SystemTime::now(),
        };
        Model { nodes: HashMap::from([(ROOT, root)]), next_ino: ROOT + 1 }
    }
}

/// What a cut kept and dropped, for the test's log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CutReport {
    /// Inodes with unsynced changes when the power went.
    pub unsynced: usize,
    /// Of those, written back whole by the simulated flusher.
    pub written_back: usize,
}

impl Model {
    pub fn node(&self, ino: u64) -> Res<&Node> {
        self.nodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Res<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn entries(&self, dir: u64) -> Res<&BTreeMap<OsString, u64>> {
        match &self.node(dir)?.body {
            Body::Dir { vol, .. } => Ok(vol),
            Body::File { .. } => Err(libc::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> Res<&mut BTreeMap<OsString, u64>> {
        let n = self.node_mut(dir)?;
        n.dirty = true;
        n.mtime = std::time::SystemTime::now();
        match &mut n.body {
            Body::Dir { vol, .. } => Ok(vol),
            Body::File { .. } => Err(libc::ENOTDIR),
        }
    }

    pub fn lookup(&self, dir: u64, name: &OsStr) -> Res<u64> {
        self.entries(dir)?.get(name).copied().ok_or(libc::ENOENT)
    }

    /// Entries of `dir` in name order.
    pub fn list(&self, dir: u64) -> Res<Vec<(OsString, u64)>> {
        Ok(self.entries(dir)?.iter().map(|(k, v)| (k.clone(), *v)).collect())
    }

    /// Create a file or directory `name` in `dir`. `EEXIST` if the name is taken.
    pub fn create(&mut self, dir: u64, name: &OsStr, is_dir: bool, perm: u16) -> Res<u64> {
        if self.entries(dir)?.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let path = format!("{}/{}", self.node(dir)?.path, name.to_string_lossy());
        let body =
            if is_dir { Body::Dir { vol: BTreeMap::new(), dur: BTreeMap::new() } } else { Body::File { vol: Data::default(), dur: Data::default() } };
        self.nodes.insert(ino, Node { body, perm, path, dirty: true, mtime: std::time::SystemTime::now() });
        self.entries_mut(dir)?.insert(name.to_os_string(), ino);
        Ok(ino)
    }

    /// Unlink a file (`rmdir = false`) or remove an empty directory. The inode lives on (open
    /// handles, a durable entry elsewhere) until the next cut collects what nothing names.
    pub fn remove(&mut self, dir: u64, name: &OsStr, rmdir: bool) -> Res<()> {
        let ino = self.lookup(dir, name)?;
        let n = self.node(ino)?;
        match (rmdir, n.is_dir()) {
            (true, false) => return Err(libc::ENOTDIR),
            (false, true) => return Err(libc::EISDIR),
            (true, true) if n.size() > 0 => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        self.entries_mut(dir)?.remove(name);
        Ok(())
    }

    /// `rename(2)` without flags (`noreplace` for `RENAME_NOREPLACE`).
    pub fn rename(&mut self, dir: u64, name: &OsStr, to_dir: u64, to_name: &OsStr, noreplace: bool) -> Res<()> {
        let ino = self.lookup(dir, name)?;
        if let Ok(target) = self.lookup(to_dir, to_name) {
            if target == ino {
                return Ok(());
            }
            if noreplace {
                return Err(libc::EEXIST);
            }
            let (src_dir, dst) = (self.node(ino)?.is_dir(), self.node(target)?);
            match (src_dir, dst.is_dir()) {
                (false, true) => return Err(libc::EISDIR),
                (true, false) => return Err(libc::ENOTDIR),
                (true, true) if dst.size() > 0 => return Err(libc::ENOTEMPTY),
                _ => {}
            }
        }
        self.entries(to_dir)?;
        self.entries_mut(dir)?.remove(name);
        self.entries_mut(to_dir)?.insert(to_name.to_os_string(), ino);
        let path = format!("{}/{}", self.node(to_dir)?.path, to_name.to_string_lossy());
        self.node_mut(ino)?.path = path;
        Ok(())
    }

    pub fn read(&self, ino: u64, off: u64, size: usize) -> Res<Vec<u8>> {
        match &self.node(ino)?.body {
            Body::File { vol, .. } => Ok(vol.read(off, size)),
            Body::Dir { .. } => Err(libc::EISDIR),
        }
    }

    pub fn write(&mut self, ino: u64, off: u64, data: &[u8]) -> Res<()> {
        let n = self.node_mut(ino)?;
        n.dirty = true;
        n.mtime = std::time::SystemTime::now();
        match &mut n.body {
            Body::File { vol, .. } => {
                vol.write(off, data);
                Ok(())
            }
            Body::Dir { .. } => Err(libc::EISDIR),
        }
    }

    pub fn set_len(&mut self, ino: u64, len: u64) -> Res<()> {
        let n = self.node_mut(ino)?;
        n.dirty = true;
        n.mtime = std::time::SystemTime::now();
        match &mut n.body {
            Body::File { vol, .. } => {
                vol.set_len(len);
                Ok(())
            }
            Body::Dir { .. } => Err(libc::EISDIR),
        }
    }

    pub fn set_perm(&mut self, ino: u64, perm: u16) -> Res<()> {
        self.node_mut(ino)?.perm = perm;
        Ok(())
    }

    /// `fsync`/`fdatasync` of a file, `fsync` of a directory: its volatile image becomes its
    /// durable one.
    pub fn sync(&mut self, ino: u64) -> Res<()> {
        let n = self.node_mut(ino)?;
        n.dirty = false;
        match &mut n.body {
            Body::File { vol, dur } => *dur = vol.clone(),
            Body::Dir { vol, dur } => *dur = vol.clone(),
        }
        Ok(())
    }

    /// The power goes: each inode with unsynced changes is first written back whole with
    /// probability `keep` (`pick(i)` in `[0, 1)` decides the i-th, in inode order), then only
    /// the durable image is left, and inodes no durable directory entry reaches are gone.
    pub fn cut(&mut self, keep: f64, mut pick: impl FnMut() -> f64) -> CutReport {
        let mut dirty: Vec<u64> = self.nodes.iter().filter(|(_, n)| n.dirty).map(|(i, _)| *i).collect();
        dirty.sort_unstable();
        let mut report = CutReport { unsynced: dirty.len(), written_back: 0 };
        for ino in dirty {
            if pick() < keep {
                let _ = self.sync(ino);
                report.written_back += 1;
            }
        }
        for n in self.nodes.values_mut() {
            n.dirty = false;
            match &mut n.body {
                Body::File { vol, dur } => *vol = dur.clone(),
                Body::Dir { vol, dur } => *vol = dur.clone(),
            }
        }
        // Keep what the root reaches.
        let mut seen = HashSet::from([ROOT]);
        let mut todo = vec![(ROOT, String::new())];
        while let Some((ino, path)) = todo.pop() {
            let children: Vec<(OsString, u64)> = match &self.nodes[&ino].body {
                Body::Dir { vol, .. } => vol.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                Body::File { .. } => Vec::new(),
            };
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.path = path.clone();
            }
            for (name, child) in children {
                if seen.insert(child) {
                    todo.push((child, format!("{path}/{}", name.to_string_lossy())));
                }
            }
        }
        self.nodes.retain(|ino, _| seen.contains(ino));
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(m: &Model, dir: u64) -> Vec<String> {
        m.list(dir).unwrap().into_iter().map(|(n, _)| n.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn data_reads_writes_truncates_across_pages() {
        let mut d = Data::default();
        d.write(PAGE as u64 - 2, b"abcd");
        assert_eq!(d.len(), PAGE as u64 + 2);
        assert_eq!(d.read(0, 2), vec![0, 0], "a hole reads as zeros");
        assert_eq!(d.read(PAGE as u64 - 2, 10), b"abcd");
        let snap = d.clone();
        d.set_len(PAGE as u64 - 1);
        d.set_len(PAGE as u64 + 2);
        assert_eq!(d.read(PAGE as u64 - 2, 4), vec![b'a', 0, 0, 0], "bytes past a cut come back as zeros");
        assert_eq!(snap.read(PAGE as u64 - 2, 4), b"abcd", "a synced image is not changed by later writes");
    }

    #[test]
    fn unsynced_data_and_names_are_lost_at_a_cut() {
        let mut m = Model::default();
        let f = m.create(ROOT, "f".as_ref(), false, 0o644).unwrap();
        m.write(f, 0, b"hello").unwrap();
        m.sync(f).unwrap();
        m.cut(0.0, || 0.5);
        assert!(names(&m, ROOT).is_empty(), "the file's fsync does not make its name durable");
        let f = m.create(ROOT, "f".as_ref(), false, 0o644).unwrap();
        m.write(f, 0, b"hello").unwrap();
        m.sync(ROOT).unwrap();
        m.cut(0.0, || 0.5);
        let f = m.lookup(ROOT, "f".as_ref()).unwrap();
        assert_eq!(m.read(f, 0, 10).unwrap(), b"", "the name is durable, the bytes were never synced");
        m.write(f, 0, b"hello").unwrap();
        m.sync(f).unwrap();
        m.write(f, 5, b" world").unwrap();
        m.set_len(f, 2).unwrap();
        m.cut(0.0, || 0.5);
        assert_eq!(m.read(f, 0, 20).unwrap(), b"hello", "the last fsync's image, not the later writes nor the truncate");
    }

    #[test]
    fn renames_and_unlinks_need_the_directory_synced() {
        let mut m = Model::default();
        let d = m.create(ROOT, "d".as_ref(), true, 0o755).unwrap();
        let f = m.create(d, "tmp".as_ref(), false, 0o644).unwrap();
        m.write(f, 0, b"x").unwrap();
        m.sync(f).unwrap();
        m.sync(d).unwrap();
        m.sync(ROOT).unwrap();
        m.rename(d, "tmp".as_ref(), d, "final".as_ref(), false).unwrap();
        m.cut(0.0, || 0.5);
        assert_eq!(names(&m, d), ["tmp"], "an unsynced rename is undone");
        m.remove(d, "tmp".as_ref(), false).unwrap();
        m.cut(0.0, || 0.5);
        assert_eq!(names(&m, d), ["tmp"], "an unsynced unlink is undone");
        m.remove(d, "tmp".as_ref(), false).unwrap();
        m.sync(d).unwrap();
        m.cut(0.0, || 0.5);
        assert!(names(&m, d).is_empty());
        assert!(!m.nodes.contains_key(&f), "an inode nothing names is collected");
    }

    #[test]
    fn written_back_inodes_survive_whole() {
        let mut m = Model::default();
        let f = m.create(ROOT, "f".as_ref(), false, 0o644).unwrap();
        m.write(f, 0, b"abc").unwrap();
        let r = m.cut(1.0, || 0.5);
        assert_eq!(r, CutReport { unsynced: 2, written_back: 2 });
        assert_eq!(m.read(m.lookup(ROOT, "f".as_ref()).unwrap(), 0, 9).unwrap(), b"abc");
        assert_eq!(m.node(ROOT).unwrap().path, "");
        assert_eq!(m.node(f).unwrap().path, "/f");
    }

    #[test]
    fn rename_refuses_what_posix_refuses() {
        let mut m = Model::default();
        let d = m.create(ROOT, "d".as_ref(), true, 0o755).unwrap();
        m.create(d, "x".as_ref(), false, 0o644).unwrap();
        m.create(ROOT, "f".as_ref(), false, 0o644).unwrap();
        assert_eq!(m.rename(ROOT, "f".as_ref(), ROOT, "d".as_ref(), false), Err(libc::EISDIR));
        assert_eq!(m.rename(ROOT, "d".as_ref(), ROOT, "f".as_ref(), false), Err(libc::ENOTDIR));
        assert_eq!(m.remove(ROOT, "d".as_ref(), true), Err(libc::ENOTEMPTY));
        let e = m.create(ROOT, "e".as_ref(), true, 0o755).unwrap();
        assert_eq!(m.rename(ROOT, "e".as_ref(), ROOT, "d".as_ref(), false), Err(libc::ENOTEMPTY));
        assert_eq!(m.rename(ROOT, "f".as_ref(), d, "x".as_ref(), true), Err(libc::EEXIST));
        m.rename(ROOT, "f".as_ref(), d, "x".as_ref(), false).unwrap();
        assert_eq!(names(&m, ROOT), ["d", "e"]);
        assert_eq!(m.node(m.lookup(d, "x".as_ref()).unwrap()).unwrap().path, "/d/x");
        let _ = e;
    }
}
