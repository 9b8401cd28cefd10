//! Files written by the server itself (task artifacts, DESIGN §4 "Artifacts"): an upload with
//! a deferred length, streamed through the same append path as a PATCH, with the running
//! sha256 and resumable checkpoints.

use std::sync::Arc;

use crate::error::Refusal;
use base64::Engine as _;
use bytes::Bytes;
use ferry_tus::UploadMetadata;
use serde::{Deserialize, Serialize};

use super::append::Appender;
use super::hash::RunningSha256;
use super::locks::{Lease, Want};
use super::{internal, now_ms, UploadEngine};
use crate::catalog::{Checkpoint, Concat, UploadRecord};

/// Where a [`FileWriter`] stood at its last [`FileWriter::sync`]: enough to reopen it after a
/// crash without re-reading the bytes. Store it in the job's checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCursor {
    /// The upload id.
    pub id: String,
    /// Durable bytes.
    pub offset: u64,
    /// Tagged sha256 midstate of those bytes, base64.
    pub hash_state: String,
    /// The blob store's state for those bytes, base64 (empty in cursors saved before it
    /// existed; stores accept the empty state).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub blob_state: String,
}

/// A finished file: an ordinary ferry upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileHandle {
    pub id: String,
    pub name: String,
    pub media_type: String,
    /// Bytes.
    pub size: u64,
    /// Lowercase hex.
    pub sha256: String,
}

/// Bytes of a principal's quota a file reserves ahead of what it has written.
const QUOTA_ROOM_AHEAD: u64 = 16 << 20;

/// Streams bytes into a new file.
pub struct FileWriter {
    app: Appender,
    /// Whose file it is (its bytes count against this principal's quota).
    principal: String,
    /// Free space against the reserve while the file grows.
    space: super::exhausted::SpaceWatch,
    /// The file holds room in its principal's bytes quota up to here (`None`: none reserved yet,
    /// or no quota); see [`UploadEngine::file_room`].
    reserved: Option<u64>,
    name: String,
    media_type: String,
    /// The upload's writer slot, pinned until the file is finished or dropped: TUS requests
    /// and MCP tools on the file answer 423 `locked` meanwhile.
    _slot: Lease,
}

fn metadata(name: &str, media_type: &str) -> Result<String, Refusal> {
    let mut md = UploadMetadata::new();
    let bad = |e: ferry_tus::ParseError| Refusal::bad_request(e.to_string(), "Use a plain file name.");
    md.insert("filename", Some(name.as_bytes().to_vec())).map_err(bad)?;
    md.insert("filetype", Some(media_type.as_bytes().to_vec())).map_err(bad)?;
    Ok(md.to_string())
}

impl UploadEngine {
    /// Create an empty file owned by `principal` and open it for writing.
    pub async fn create_file(self: &Arc<Self>, principal: &str, name: &str, media_type: &str) -> Result<FileWriter, Refusal> {
        // A task's file is named by ferry from its arguments (a URL's last segment, an archive
        // name): shortened to what an upload may be named (bytes ≤ characters) rather than
        // failing the task.
        let name = &crate::names::shorten(name, crate::names::MAX_NAME_CHARS);
        let now = now_ms();
        let rec = UploadRecord {
            id: super::new_id(),
            principal: principal.to_string(),
            length: None,
            offset: 0,
            metadata: metadata(name, media_type)?,
            hash_state: RunningSha256::new().state(),
            sha256: None,
            expected_sha256: None,
            concat: Concat::None,
            created_at_ms: now,
            updated_at_ms: now,
            expires_at_ms: self.expiry_from(now),
            finished_at_ms: None,
            expired: false,
            blob_state: Vec::new(),
            // Announced once finished: a file its task discards (the task failed, or its output
            // passed the quota) leaves no event behind.
            provisional: true,
        };
        self.check_space(0, None)?;
        let began = std::time::Instant::now();
        self.blobs.create(&rec.id).await?;
        self.in_time_to_record(&rec.id, began).await?;
        let inserted = match self.quota_of(principal) {
            Some(quota) => self.catalog.create_upload_within(&rec, None, &quota).await.map(|_| ()),
            None => self.catalog.create_upload(&rec).await,
        };
        if let Err(e) = inserted {
            let _ = self.blobs.delete(&UploadEngine::never_recorded(&rec.id)).await;
            return Err(e.into());
        }
        let slot = self.pin(&rec.id).await?;
        self.metrics.uploads_created.inc();
        let app = Appender::open(self, rec, 0, None, None, &slot).await?;
        Ok(FileWriter {
            app,
            principal: principal.to_string(),
            space: Default::default(),
            reserved: None,
            name: name.to_string(),
            media_type: media_type.to_string(),
            _slot: slot,
        })
    }

    /// Reopen a file at `cursor` (after a crash or a resumed job): bytes past the cursor are
    /// discarded and the running sha256 continues from the cursor's midstate.
    pub async fn reopen_file(self: &Arc<Self>, principal: &str, cursor: &FileCursor) -> Result<FileWriter, Refusal> {
        let rec = self.get(principal, &cursor.id).await?;
        let slot = self.pin(&rec.id).await?;
        let state = base64::engine::general_purpose::STANDARD.decode(&cursor.hash_state).map_err(|e| internal("file cursor", e))?;
        RunningSha256::from_state(&state).map_err(|e| internal("file cursor", e))?;
        let md: UploadMetadata = rec.metadata.parse().map_err(|e| internal("file metadata", e))?;
        let d = super::describe(&md);
        let name = d.name.unwrap_or_else(|| "file".to_string());
        let media_type = d.media_type.to_string();
        // Put the catalog back at the cursor first, so the appender resumes from it. A file
        // finished by a run that crashed before checkpointing its result becomes unfinished
        // again (the re-run writes the same bytes); the row and its fence are kept, so the
        // fence stays monotonic and no older writer's token can become current again.
        let fence = self.fence_for(&rec.id, &slot).await?;
        let now = now_ms();
        let cp = Checkpoint {
            offset: cursor.offset,
            hash_state: state,
            blob_state: base64::engine::general_purpose::STANDARD.decode(&cursor.blob_state).map_err(|e| internal("file cursor", e))?,
            blob_entries_from: Some(0),
            length: None,
            finished_sha256: None,
            expires_at_ms: self.expiry_from(now),
            now_ms: now,
        };
        if rec.is_finished() {
            self.catalog.reopen_upload(&rec.id, fence, &cp).await.map_err(|e| self.fenced(&rec.id, e))?;
        } else {
            self.catalog.checkpoint(&rec.id, fence, &cp).await.map_err(|e| self.fenced(&rec.id, e))?;
        }
        self.commits.tell(&rec.id, Some(cursor.offset));
        let rec = self.get(principal, &cursor.id).await?;
        let app = Appender::open(self, rec, cursor.offset, None, None, &slot).await?;
        Ok(FileWriter { app, principal: principal.to_string(), space: Default::default(), reserved: None, name, media_type, _slot: slot })
    }
}

impl UploadEngine {
    /// Hold the writer slot of a job's file for as long as the job writes it.
    async fn pin(&self, id: &str) -> Result<Lease, Refusal> {
        self.lease(id, Want::Pinned).await
    }
}

impl FileWriter {
    /// The upload id.
    pub fn id(&self) -> &str {
        self.app.id()
    }

    /// Bytes written so far.
    pub fn position(&self) -> u64 {
        self.app.position()
    }

    /// Append bytes (not durable until [`FileWriter::sync`]). Errors: 507 when the disk is
    /// full, free space reaches the server's reserve, or the principal's bytes quota is reached
    /// (`quota_exceeded`; room is reserved 16 MiB ahead) (bytes since the last sync are
    /// released; the error's cursor is the last synced offset).
    pub async fn write(&mut self, data: Bytes) -> Result<(), Refusal> {
        let n = data.len() as u64;
        // Room first: bytes past the quota are never written.
        let (engine, kept, to) = (self.app.engine().clone(), self.app.committed_state().0, self.app.position() + n);
        engine.file_room(&self.principal, self.app.id(), to, kept, QUOTA_ROOM_AHEAD, &mut self.reserved).await?;
        // And room on the disk: bytes that would eat into the reserve are never written either.
        if let Err(detail) = self.space.check(&engine.cfg.reserve, to, self.app.unwritten()) {
            return Err(Refusal::insufficient_storage(detail, Some(kept)));
        }
        self.app.write(data).await?;
        engine.metrics.task_bytes_written.inc_by(n);
        Ok(())
    }

    /// 507 `quota_exceeded` when the bytes written since the last commit do not fit the
    /// principal's bytes quota (nothing is committed then; the task fails and its file goes).
    async fn check_quota(&mut self) -> Result<(), Refusal> {
        let (engine, position, kept) = (self.app.engine().clone(), self.app.position(), self.app.committed_state().0);
        engine.file_room(&self.principal, self.app.id(), position, kept, 0, &mut self.reserved).await
    }

    /// Make everything written durable and commit it; returns the cursor to resume from.
    pub async fn sync(&mut self) -> Result<FileCursor, Refusal> {
        self.check_quota().await?;
        self.app.commit().await?;
        let (offset, state, blob) = self.app.committed_state();
        let b64 = &base64::engine::general_purpose::STANDARD;
        Ok(FileCursor { id: self.id().to_string(), offset, hash_state: b64.encode(state), blob_state: b64.encode(blob) })
    }

    /// Complete the file: its length becomes the bytes written; returns its handle.
    pub async fn finish(mut self) -> Result<FileHandle, Refusal> {
        let size = self.app.position();
        self.check_quota().await?;
        self.app.set_final_length(size);
        self.app.commit().await?;
        self.app.engine().catalog.announce_upload(self.app.id()).await?;
        let sha = self.app.digest().await;
        Ok(FileHandle { id: self.id().to_string(), name: self.name, media_type: self.media_type, size, sha256: hex::encode(sha) })
    }
}
