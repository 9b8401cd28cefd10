//! Opening the files ferry keeps in its own directories — blobs, `DATA/lock`, `DATA/owner-id`,
//! the URL secret, the blob store's mark, the catalog's lock and damage marks — so that
//! whatever else sits at such a path is refused at once instead of waited on.
//!
//! A plain `open(2)` of a FIFO waits until another process opens its other end (fifo(7)): one
//! `mkfifo` in `DATA/blobs` held both of a server's worker threads in `open`, hanging every
//! request, and hung `ferry check` for good. Here every open adds `O_NONBLOCK`, which makes
//! the open of a FIFO return at once (fifo(7)) and changes nothing for a regular file
//! (open(2)); the opened file must then be a regular file (`fstat`), and the flag is cleared
//! again, so reads and writes behave as they always did.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// What was found at a path where ferry keeps a regular file: a FIFO, a directory, a socket or
/// a device. Carried inside an [`io::Error`] of kind [`io::ErrorKind::InvalidInput`]; tell it
/// apart with [`is_not_regular`].
#[derive(Debug, thiserror::Error)]
#[error("{} is {what}, not a regular file", path.display())]
pub struct NotRegular {
    pub path: PathBuf,
    pub what: &'static str,
}

/// Whether `e` is the refusal of something that is not a regular file ([`NotRegular`]).
pub fn is_not_regular(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<NotRegular>())
}

/// `opts.open(path)`, refusing at once anything but a regular file ([`NotRegular`]).
/// `flags`: more `open(2)` flags (`O_DIRECT`), added to `O_NONBLOCK`. Errors: `open(2)`'s, or
/// [`NotRegular`].
pub fn open_with(opts: &mut OpenOptions, flags: i32, path: &Path) -> io::Result<File> {
    let file = match opts.custom_flags(flags | nix::libc::O_NONBLOCK).open(path) {
        Ok(f) => f,
        // A FIFO opened for writing with no reader answers ENXIO (fifo(7)).
        Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) => {
            return Err(match std::fs::metadata(path) {
                Ok(m) if !m.is_file() => not_regular(path, &m),
                _ => e,
            });
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(path, &meta));
    }
    let fl = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL)?;
    let without = nix::fcntl::OFlag::from_bits_retain(fl) & !nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(without))?;
    Ok(file)
}

/// [`open_with`] with no more flags.
pub fn open(opts: &mut OpenOptions, path: &Path) -> io::Result<File> {
    open_with(opts, 0, path)
}

/// The whole file at `path` as UTF-8 text ([`open`] for reading). Errors: as [`open`], and
/// text that is not UTF-8.
pub fn read_to_string(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    io::Read::read_to_string(&mut open(OpenOptions::new().read(true), path)?, &mut text)?;
    Ok(text)
}

/// A new file at `path` (created, or emptied if it is one already), open for writing.
pub fn create(path: &Path) -> io::Result<File> {
    open(OpenOptions::new().create(true).write(true).truncate(true), path)
}

fn not_regular(path: &Path, meta: &std::fs::Metadata) -> io::Error {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    let what = if t.is_fifo() {
        "a FIFO"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "something else"
    };
    io::Error::new(io::ErrorKind::InvalidInput, NotRegular { path: path.to_path_buf(), what })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_at_once_for_reading_and_writing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pipe");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        for opts in [OpenOptions::new().read(true).clone(), OpenOptions::new().write(true).clone(), OpenOptions::new().read(true).write(true).clone()]
        {
            let e = open(&mut opts.clone(), &p).unwrap_err();
            assert!(is_not_regular(&e), "{e}");
            assert!(e.to_string().contains("is a FIFO, not a regular file"), "{e}");
        }
        assert!(is_not_regular(&read_to_string(&p).unwrap_err()));
        assert!(is_not_regular(&create(&p).unwrap_err()));
    }

    #[test]
    fn a_directory_is_refused_and_a_regular_file_reads_and_writes_as_usual() {
        let dir = tempfile::tempdir().unwrap();
        assert!(is_not_regular(&read_to_string(dir.path()).unwrap_err()));
        let p = dir.path().join("f");
        io::Write::write_all(&mut create(&p).unwrap(), b"hello").unwrap();
        assert_eq!(read_to_string(&p).unwrap(), "hello");
        let f = open(OpenOptions::new().read(true), &p).unwrap();
        let fl = nix::fcntl::fcntl(&f, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        assert_eq!(fl & nix::libc::O_NONBLOCK, 0, "the flag is cleared after the open");
        assert_eq!(read_to_string(&dir.path().join("none")).unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
