//! Direct writes for the fs blob store (issue 24): a blob's bytes go from an aligned buffer to
//! the disk with `O_DIRECT` (Linux), not through the page cache. Copying a byte into the page
//! cache costs the kernel about as much CPU as hashing it (`benches/RESULTS.md`, "Where an
//! uploaded byte's CPU goes"); a copy into an aligned buffer in user space costs a fraction.
//!
//! `O_DIRECT` wants offsets, lengths and buffers aligned to the device's block ([`ALIGN`]
//! covers 512-byte and 4 KiB blocks). A write covers whole blocks only: the bytes after the
//! last whole block (the *carry*, fewer than [`ALIGN`]) stay in memory and begin the next
//! write, which rewrites their block whole. Before anything that must find every byte in the
//! file (an `fdatasync`, a completion) the carry is written through the page cache
//! ([`Direct::write_carry`]); the next direct write over that block replaces the cached page
//! (the kernel writes back and drops cached pages a direct write covers). A filesystem that
//! refuses `O_DIRECT` (tmpfs, some FUSE filesystems) at open or at the first write gets
//! buffered writes, with the same results.
//!
//! Every call here blocks: the fs writer runs them on a blocking thread.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use bytes::Bytes;

/// Alignment of a direct write's offset, length and buffer, in bytes.
pub(super) const ALIGN: usize = 4096;

/// Size of a transparent huge page with 4 KiB base pages (x86-64, arm64), in bytes: staging
/// buffers for a batch start on such a boundary so the kernel can back them with huge pages.
const HUGE_PAGE: usize = 2 << 20;

/// A staging buffer: bytes on their way to a direct write, starting at an [`ALIGN`] boundary
/// (a [`HUGE_PAGE`] one when it holds a batch).
type Stage = aligned_vec::AVec<u8, aligned_vec::RuntimeAlign>;

/// Staging buffers of direct writes, kept for the next batch of any writer (issue 24). A
/// fresh allocation of a batch's size (2 MiB) is often fresh memory from the kernel: every
/// 4 KiB page of it costs a fault and the kernel's zeroing before the copy fills it. Kept
/// buffers halved the server's page faults of one 512 MiB PATCH (≈ 6 500 → 3 500) and cut
/// those of 64 uploads at once by a fifth (`benches/RESULTS.md`). A batch's buffer is one huge
/// page, offered to the kernel as such (`madvise(MADV_HUGEPAGE)`; it takes effect where
/// `/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` or `always`): one fault and one
/// TLB entry per 2 MiB, and `O_DIRECT`'s pinning of the buffer walks one entry instead of 512
/// (`benches/RESULTS.md`, round 3 session 6: 3.2 % of a large upload's CPU samples → 0.2 %).
/// A shorter write (a short PATCH, a quiet body's flush) gets ordinary pages, so it holds only
/// the memory it touches. At most [`Staging::KEPT`] buffers of at most [`Staging::MAX_BYTES`]
/// wait here: idle memory stays at most 32 MiB.
struct Staging;

static STAGING: std::sync::Mutex<Vec<Stage>> = std::sync::Mutex::new(Vec::new());

impl Staging {
    /// Buffers kept at most.
    const KEPT: usize = 16;
    /// Capacity of a kept buffer at most, in bytes: one huge page (a batch's bytes go out
    /// through it a huge page at a time).
    const MAX_BYTES: usize = HUGE_PAGE;

    fn pool() -> std::sync::MutexGuard<'static, Vec<Stage>> {
        STAGING.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An empty buffer with room for `bytes` (at most [`HUGE_PAGE`]): a kept one when one is
    /// large enough.
    fn take(bytes: usize) -> Stage {
        debug_assert!(bytes <= HUGE_PAGE);
        let mut pool = Self::pool();
        if let Some(i) = pool.iter().position(|v| v.capacity() >= bytes) {
            return pool.swap_remove(i);
        }
        drop(pool);
        if bytes < HUGE_PAGE {
            // Rounded up to 1 MiB, so the next short write finds it big enough.
            return Stage::with_capacity(ALIGN, bytes.next_multiple_of(1 << 20));
        }
        let v = Stage::with_capacity(HUGE_PAGE, HUGE_PAGE);
        if let Some(start) = std::ptr::NonNull::new(v.as_ptr().cast_mut().cast()) {
            // SAFETY: the range is this buffer's own allocation, which lives on; the advice
            // only changes how the kernel backs it. Refused advice (no THP support) is fine.
            let _ = unsafe { nix::sys::mman::madvise(start, v.capacity(), nix::sys::mman::MmapAdvise::MADV_HUGEPAGE) };
        }
        v
    }

    /// Keep `v` for a later write: in a free place, else instead of a smaller kept buffer (so
    /// small PATCHes' buffers do not crowd out a batch's). Dropped when larger than a batch.
    fn give(mut v: Stage) {
        if v.capacity() > Self::MAX_BYTES {
            return;
        }
        v.clear();
        let mut pool = Self::pool();
        if pool.len() < Self::KEPT {
            pool.push(v);
        } else if let Some(small) = pool.iter_mut().filter(|k| k.capacity() < v.capacity()).min_by_key(|k| k.capacity()) {
            *small = v;
        }
    }
}

/// Write `data` at byte `at` of the blob: directly through `direct` while the filesystem
/// takes it, through `buffered` for good once it refuses a direct write (`EINVAL`, which
/// clears `direct`).
fn write_staged(direct: &mut Option<File>, buffered: &File, data: &[u8], at: u64) -> io::Result<()> {
    let Some(f) = direct else { return buffered.write_all_at(data, at) };
    match f.write_all_at(data, at) {
        Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
            tracing::debug!(error = %e, "the filesystem refused a direct write; writing through the page cache");
            *direct = None;
            buffered.write_all_at(data, at)
        }
        r => r,
    }
}

/// One writer's direct descriptor of its blob and the carry.
pub(super) struct Direct {
    /// The blob opened with `O_DIRECT`; `None` once the filesystem refused a direct write.
    file: Option<File>,
    /// Offset in the blob where `carry` starts: a multiple of [`ALIGN`].
    base: u64,
    /// The bytes from `base` on that no direct write has covered yet (fewer than [`ALIGN`]).
    carry: Vec<u8>,
}

impl Direct {
    /// Open the blob at `path` for direct writes that continue at byte `pos`; the partial
    /// block before `pos` is read back through `buffered` (the blob's ordinary descriptor) to
    /// begin the carry. `Ok(None)` when the filesystem refuses `O_DIRECT`.
    pub(super) fn open(path: &Path, buffered: &File, pos: u64) -> io::Result<Option<Direct>> {
        let file = match crate::regular_file::open_with(std::fs::OpenOptions::new().write(true), nix::fcntl::OFlag::O_DIRECT.bits(), path) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut d = Direct { file: Some(file), base: 0, carry: Vec::new() };
        d.restart(buffered, pos)?;
        Ok(Some(d))
    }

    /// Continue at byte `pos` of a blob that was cut there or found that long (a rewind, a
    /// salvage after a full disk): the carry is read back from the file through `buffered`.
    pub(super) fn restart(&mut self, buffered: &File, pos: u64) -> io::Result<()> {
        let base = pos - pos % ALIGN as u64;
        let mut carry = vec![0; (pos - base) as usize];
        buffered.read_exact_at(&mut carry, base)?;
        (self.base, self.carry) = (base, carry);
        Ok(())
    }

    /// Append `bufs` after every byte given so far: the whole blocks go to the disk in one
    /// direct write from an aligned copy, the rest becomes the carry. Falls back to writing
    /// through `buffered` for good when the filesystem refuses the direct write (`EINVAL`).
    pub(super) fn write(&mut self, buffered: &File, bufs: &[Bytes]) -> io::Result<()> {
        let total = self.carry.len() + bufs.iter().map(Bytes::len).sum::<usize>();
        let whole = if self.file.is_some() { total - total % ALIGN } else { total };
        if whole == 0 {
            bufs.iter().for_each(|b| self.carry.extend_from_slice(b));
            return Ok(());
        }
        // The whole blocks go out through one staging buffer of at most a huge page (filled
        // without zeroing, never reallocated), a write per fill; the carry and `base` change
        // only once all of them are written.
        let Direct { file, base, carry } = self;
        let room = whole.min(HUGE_PAGE);
        let mut v = Staging::take(room);
        let (mut at, mut left, mut rest) = (*base, whole, Vec::new());
        for mut src in std::iter::once(carry.as_slice()).chain(bufs.iter().map(|b| &b[..])) {
            while left > 0 && !src.is_empty() {
                let n = src.len().min(left).min(room - v.len());
                v.extend_from_slice(&src[..n]);
                (src, left) = (&src[n..], left - n);
                if v.len() == room || left == 0 {
                    write_staged(file, buffered, &v, at)?;
                    at += v.len() as u64;
                    v.clear();
                }
            }
            rest.extend_from_slice(src);
        }
        Staging::give(v);
        *base += whole as u64;
        *carry = rest;
        Ok(())
    }

    /// Write the carry through `buffered`, so every byte given is in the file (before an
    /// `fdatasync` or a completion). The carry stays: the next direct write begins with it.
    pub(super) fn write_carry(&self, buffered: &File) -> io::Result<()> {
        if self.carry.is_empty() {
            return Ok(());
        }
        buffered.write_all_at(&self.carry, self.base)
    }

    /// Whether writes still bypass the page cache.
    #[cfg(test)]
    pub(super) fn is_direct(&self) -> bool {
        self.file.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn pieces(data: &[u8], sizes: &[usize]) -> Vec<Bytes> {
        let mut at = 0;
        sizes
            .iter()
            .map(|&n| {
                let b = Bytes::copy_from_slice(&data[at..at + n]);
                at += n;
                b
            })
            .collect()
    }

    fn read_all(path: &Path) -> Vec<u8> {
        let mut v = Vec::new();
        File::open(path).unwrap().read_to_end(&mut v).unwrap();
        v
    }

    /// A batch's staging buffer starts on a huge-page boundary, a short write's on a block
    /// boundary; both have the room asked for.
    #[test]
    fn staging_buffers_are_aligned() {
        let batch = Staging::take(HUGE_PAGE);
        assert_eq!(batch.as_ptr().align_offset(HUGE_PAGE), 0);
        assert!(batch.capacity() >= HUGE_PAGE);
        let short = Staging::take(70_000);
        assert_eq!(short.as_ptr().align_offset(ALIGN), 0);
        assert!(short.capacity() >= 70_000);
        Staging::give(batch);
        let again = Staging::take(HUGE_PAGE);
        assert_eq!(again.as_ptr().align_offset(HUGE_PAGE), 0, "a kept or new batch buffer");
    }

    /// A direct write the filesystem refuses (`EINVAL`: here a buffer off the alignment
    /// `O_DIRECT` needs) is written through the page cache instead, and every later write too.
    #[test]
    fn a_refused_direct_write_falls_back_to_the_page_cache_for_good() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::Builder::new().tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/target")).unwrap();
        let path = dir.path().join("blob");
        let buffered = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
        let mut direct = Some(std::fs::OpenOptions::new().write(true).custom_flags(nix::libc::O_DIRECT).open(&path).unwrap());
        let data: Vec<u8> = (0..3 * ALIGN + 1).map(|i| (i % 251) as u8).collect();
        // One byte past an aligned start: the kernel refuses this buffer for a direct write.
        let unaligned = &data[1..1 + 2 * ALIGN];
        assert_ne!(unaligned.as_ptr().align_offset(512), 0);
        write_staged(&mut direct, &buffered, unaligned, 0).unwrap();
        assert!(direct.is_none(), "the refusal switched this writer to the page cache");
        write_staged(&mut direct, &buffered, &data[..ALIGN], 2 * ALIGN as u64).unwrap();
        let mut want = unaligned.to_vec();
        want.extend_from_slice(&data[..ALIGN]);
        assert_eq!(read_all(&path), want);
    }

    /// Writes of every alignment, with the carry made whole before each read, and a restart
    /// at an unaligned offset after a cut, give the file exactly the bytes given.
    #[test]
    fn unaligned_writes_carry_and_restart_keep_every_byte() {
        // Under target/ (the disk), not /tmp, which may be a tmpfs without O_DIRECT.
        let dir = tempfile::Builder::new().tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/target")).unwrap();
        let path = dir.path().join("blob");
        let data: Vec<u8> = (0..7 * 1024 * 1024 + 77).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let buffered = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
        let mut d = Direct::open(&path, &buffered, 0).unwrap().expect("this filesystem takes O_DIRECT");
        let sizes = [1, 4095, 4096, 5000, 1 << 20, 123_457, 2 * 1024 * 1024 - 138_649 - 4096 + 77];
        let given: usize = sizes.iter().sum();
        assert!(given <= data.len());
        let bufs = pieces(&data, &sizes);
        for (i, b) in bufs.chunks(2).enumerate() {
            d.write(&buffered, b).unwrap();
            if i % 2 == 0 {
                d.write_carry(&buffered).unwrap();
                let at: usize = bufs.chunks(2).take(i + 1).flatten().map(Bytes::len).sum();
                assert_eq!(read_all(&path), data[..at], "after write {i}");
            }
        }
        d.write_carry(&buffered).unwrap();
        assert_eq!(read_all(&path), data[..given]);
        assert!(d.is_direct(), "the disk kept taking direct writes");

        // Cut at an unaligned offset, restart there, and write the rest: more than one
        // staging buffer's worth in one write.
        let cut = 1_000_003;
        buffered.set_len(cut as u64).unwrap();
        d.restart(&buffered, cut as u64).unwrap();
        d.write(&buffered, &[Bytes::copy_from_slice(&data[cut..])]).unwrap();
        d.write_carry(&buffered).unwrap();
        assert_eq!(read_all(&path), data);
    }
}
