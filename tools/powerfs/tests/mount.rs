//! The filesystem through the kernel: what fsync, directory fsync and O_DSYNC keep over a cut,
//! and what a cut drops; a shared mmap works.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use ferry_powerfs::{Op, PowerFs, Trigger};

fn mounted() -> Option<(tempfile::TempDir, PowerFs)> {
    if let Some(why) = ferry_powerfs::unavailable() {
        eprintln!("skipping: {why}");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let fs = PowerFs::mount(dir.path()).expect("mount the power-loss filesystem (root, or fusermount3 from Debian's fuse3)");
    Some((dir, fs))
}

#[test]
fn a_cut_keeps_exactly_what_was_synced() {
    let Some((dir, mut fs)) = mounted() else { return };
    let m = dir.path();
    fs::create_dir(m.join("d")).unwrap();
    File::open(m).unwrap().sync_all().unwrap();
    let mut a = File::create(m.join("d/a")).unwrap();
    a.write_all(b"synced").unwrap();
    a.sync_all().unwrap();
    a.write_all(b" and not").unwrap();
    let mut b = OpenOptions::new().create(true).truncate(true).write(true).custom_flags(libc::O_DSYNC).open(m.join("d/b")).unwrap();
    b.write_all(b"dsync").unwrap();
    File::open(m.join("d")).unwrap().sync_all().unwrap();
    fs::write(m.join("d/c"), b"never synced").unwrap();
    fs::rename(m.join("d/a"), m.join("d/a2")).unwrap();
    drop((a, b));
    fs.remount().unwrap();
    let mut names: Vec<String> = fs::read_dir(m.join("d")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["a", "b"], "the unsynced create and rename are gone");
    assert_eq!(fs::read(m.join("d/a")).unwrap(), b"synced");
    assert_eq!(fs::read(m.join("d/b")).unwrap(), b"dsync", "an O_DSYNC write is durable when it returns");
}

#[test]
fn an_armed_cut_fails_its_operation_and_everything_after() {
    let Some((dir, mut fs)) = mounted() else { return };
    let m = dir.path();
    let mut f = File::create(m.join("f")).unwrap();
    File::open(m).unwrap().sync_all().unwrap();
    f.write_all(b"one").unwrap();
    f.sync_all().unwrap();
    fs.arm(Trigger { op: Op::Fsync, path_contains: "/f".into(), nth: 1, keep: 0.0, seed: 1 });
    f.write_all(b"two").unwrap();
    assert!(f.sync_all().is_err(), "the fsync the power went in fails");
    let cut = fs.wait_cut(Duration::from_secs(1)).expect("the cut happened");
    assert_eq!(cut.at, "Fsync /f (#1)");
    assert!(f.write_all(b"three").and_then(|()| f.sync_all()).is_err(), "nothing works without power");
    drop(f);
    fs.remount().unwrap();
    assert_eq!(fs::read(m.join("f")).unwrap(), b"one");
}

#[test]
fn a_shared_mmap_reaches_the_file() {
    let Some((dir, fs)) = mounted() else { return };
    let path = dir.path().join("shm");
    let f = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
    f.set_len(4096).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh 4 KiB shared mapping of a 4 KiB file, unmapped below.
    unsafe {
        let p = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0);
        assert_ne!(p, libc::MAP_FAILED);
        std::ptr::copy_nonoverlapping(b"mapped".as_ptr(), p as *mut u8, 6);
        assert_eq!(libc::msync(p, 4096, libc::MS_SYNC), 0);
        libc::munmap(p, 4096);
    }
    assert_eq!(&fs::read(&path).unwrap()[..6], b"mapped");
    drop(f);
    drop(fs);
}
