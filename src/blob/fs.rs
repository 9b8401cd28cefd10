//! The embedded [`BlobStore`]: one file per upload under `DATA/blobs/xx/<id>`.
//!
//! Writes go through a 1 MiB buffer and `spawn_blocking`; `sync` is `fdatasync` unless the
//! store was opened with relaxed durability.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::TryStreamExt;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::{BlobError, BlobResult, BlobStore, BlobWriter, ByteStream};

const WRITE_BUFFER: usize = 1 << 20;
const READ_CHUNK: usize = 256 << 10;

/// Files under a root directory.
#[derive(Debug, Clone)]
pub struct FsBlobStore {
    root: PathBuf,
    durable: bool,
}

/// Run blocking file I/O off the async threads.
async fn blocking<T: Send + 'static, E: Into<BlobError> + Send + 'static>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> BlobResult<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(Into::into),
        Err(join) => Err(BlobError::Io(std::io::Error::other(join))),
    }
}

fn not_found(e: std::io::Error) -> BlobError {
    if e.kind() == std::io::ErrorKind::NotFound {
        BlobError::NotFound
    } else {
        BlobError::Io(e)
    }
}

impl FsBlobStore {
    /// Use (creating) `root`. `durable = false` skips every fsync.
    pub fn open(root: &Path, durable: bool) -> std::io::Result<Self> {
        std::fs::create_dir_all(root)?;
        Ok(FsBlobStore { root: root.to_path_buf(), durable })
    }

    /// Path of the blob for `id`. Ids are validated by the caller; this rejects anything but
    /// `[a-z0-9_-]` defensively so no id can name another path.
    fn path(&self, id: &str) -> std::io::Result<PathBuf> {
        if id.len() < 3 || !id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_') {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "invalid blob id"));
        }
        Ok(self.root.join(&id[..2]).join(id))
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[async_trait]
impl BlobStore for FsBlobStore {
    async fn create(&self, id: &str) -> BlobResult<()> {
        let path = self.path(id)?;
        let durable = self.durable;
        blocking(move || -> std::io::Result<_> {
            let dir = path.parent().expect("blob path has a parent");
            std::fs::create_dir_all(dir)?;
            let f = OpenOptions::new().create(true).write(true).truncate(true).open(&path)?;
            if durable {
                f.sync_all()?;
                sync_dir(dir)?;
            }
            Ok(())
        })
        .await
    }

    async fn open_writer(&self, id: &str, offset: u64) -> BlobResult<Box<dyn BlobWriter>> {
        let path = self.path(id)?;
        let durable = self.durable;
        let file = blocking(move || -> BlobResult<File> {
            let mut f = OpenOptions::new().write(true).open(&path).map_err(not_found)?;
            let len = f.metadata()?.len();
            if len < offset {
                return Err(BlobError::OutOfRange { start: offset, end: offset, len });
            }
            if len > offset {
                f.set_len(offset)?;
                if durable {
                    f.sync_data()?;
                }
            }
            f.seek(SeekFrom::Start(offset))?;
            Ok(f)
        })
        .await?;
        Ok(Box::new(FsWriter { file: Some(file), buf: BytesMut::with_capacity(WRITE_BUFFER), flushed: offset, durable }))
    }

    async fn len(&self, id: &str) -> BlobResult<Option<u64>> {
        match tokio::fs::metadata(self.path(id)?).await {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn truncate(&self, id: &str, len: u64) -> BlobResult<()> {
        let path = self.path(id)?;
        let durable = self.durable;
        blocking(move || -> BlobResult<()> {
            let f = OpenOptions::new().write(true).open(&path).map_err(not_found)?;
            if f.metadata()?.len() > len {
                f.set_len(len)?;
                if durable {
                    f.sync_data()?;
                }
            }
            Ok(())
        })
        .await
    }

    async fn read(&self, id: &str, range: Range<u64>) -> BlobResult<ByteStream> {
        let mut f = tokio::fs::File::open(self.path(id)?).await.map_err(not_found)?;
        let len = f.metadata().await?.len();
        if range.start > range.end || range.end > len {
            return Err(BlobError::OutOfRange { start: range.start, end: range.end, len });
        }
        f.seek(SeekFrom::Start(range.start)).await?;
        let limited = f.take(range.end - range.start);
        Ok(Box::pin(tokio_util::io::ReaderStream::with_capacity(limited, READ_CHUNK).map_ok(|b| b)))
    }

    async fn delete(&self, id: &str) -> BlobResult<()> {
        match tokio::fs::remove_file(self.path(id)?).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

struct FsWriter {
    /// `None` only while a blocking write owns it.
    file: Option<File>,
    buf: BytesMut,
    /// Bytes handed to the file so far (excluding `buf`).
    flushed: u64,
    durable: bool,
}

impl FsWriter {
    async fn flush_buf(&mut self, then_sync: bool) -> BlobResult<()> {
        let data = self.buf.split().freeze();
        let mut file = self.file.take().ok_or_else(|| BlobError::Io(std::io::Error::other("writer poisoned by an earlier failure")))?;
        let sync = then_sync && self.durable;
        let n = data.len() as u64;
        let file = blocking(move || -> std::io::Result<_> {
            file.write_all(&data)?;
            if sync {
                file.sync_data()?;
            }
            Ok(file)
        })
        .await?;
        self.file = Some(file);
        self.flushed += n;
        Ok(())
    }
}

#[async_trait]
impl BlobWriter for FsWriter {
    async fn write(&mut self, data: Bytes) -> BlobResult<()> {
        self.buf.extend_from_slice(&data);
        if self.buf.len() >= WRITE_BUFFER {
            self.flush_buf(false).await?;
        }
        Ok(())
    }

    async fn sync(&mut self) -> BlobResult<()> {
        self.flush_buf(true).await
    }

    async fn rewind(&mut self, len: u64) -> BlobResult<()> {
        if len >= self.flushed {
            let keep = (len - self.flushed) as usize;
            self.buf.truncate(keep);
            return Ok(());
        }
        self.buf.clear();
        let mut file = self.file.take().ok_or_else(|| BlobError::Io(std::io::Error::other("writer poisoned by an earlier failure")))?;
        let durable = self.durable;
        let file = blocking(move || -> std::io::Result<_> {
            file.set_len(len)?;
            file.seek(SeekFrom::Start(len))?;
            if durable {
                file.sync_data()?;
            }
            Ok(file)
        })
        .await?;
        self.file = Some(file);
        self.flushed = len;
        Ok(())
    }

    fn position(&self) -> u64 {
        self.flushed + self.buf.len() as u64
    }
}
