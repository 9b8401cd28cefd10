//! `archive`: a tar or zip of finished uploads of the task's principal, streamed into a new file
//! and resumable mid-member.
//!
//! Args: `{"file_ids": ["<upload id>", …], "format": "tar"|"zip", "name": "optional output name"}`
//! (`files` is accepted as the deprecated name of `file_ids`).
//! Result: `{"file": <FileHandle>, "members": N}`. Partial results: one fragment per member
//! added, `{"member": index, "name", "size", "file_id"}`.
//!
//! The archive layout is a pure function of the members (names, sizes, mtimes), so every byte
//! position is known up front: a checkpoint is `{cursor, member, offset}` (plus, for zip, the
//! crc32 of each finished member and of the part of the current one written so far), and a
//! resumed run reopens the file at the cursor and produces exactly the bytes an uninterrupted
//! run would have. Zip members are Stored (no compression) with a data descriptor (the crc is
//! known only after the data), zip64 where sizes or offsets need it.
//!
//! This file runs the task (arguments, members, checkpoints); `layout` computes the bytes of the
//! headers and trailers and where each goes.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::catalog::UploadRecord;
use crate::tasks::{Job, JobContext, JobError};
use crate::upload::FileCursor;

mod layout;
#[cfg(test)]
mod tests;

use layout::{crc32_combine, Layout};

/// Most members one archive may have.
pub const MAX_MEMBERS: usize = 10_000;
/// Checkpoint at least this often (bytes of member data), also within a member.
const CHECKPOINT_BYTES: u64 = 64 << 20;
/// Between members, checkpoint at most this often (unless `CHECKPOINT_BYTES` were written).
const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);
/// Longest member name kept (bytes); zip names are at most 65 535 bytes.
const MAX_NAME: usize = 1024;

pub struct ArchiveJob;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Format {
    Tar,
    Zip,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    /// Ids of the finished uploads to pack, in order. `files` is the deprecated name (stored
    /// arguments of older tasks, older clients).
    #[serde(alias = "files")]
    file_ids: Vec<String>,
    format: Format,
    #[serde(default)]
    name: Option<String>,
}

fn parse_args(args: &RawValue) -> Result<Args, String> {
    let a: Args = serde_json::from_str(args.get()).map_err(|e| format!("archive arguments: {e}"))?;
    if a.file_ids.is_empty() {
        return Err("archive: \"file_ids\" must list at least one upload id".into());
    }
    if a.file_ids.len() > MAX_MEMBERS {
        return Err(format!("archive: at most {MAX_MEMBERS} files, got {}", a.file_ids.len()));
    }
    if let Some(n) = &a.name {
        if n.is_empty() || n.len() > 255 {
            return Err("archive: \"name\" must be 1 to 255 bytes".into());
        }
    }
    Ok(a)
}

/// What a checkpoint holds while the archive is being written.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Checkpoint {
    /// The output file at the durable point.
    cursor: FileCursor,
    /// Members `[0, member)` are complete (header, data and trailer written).
    member: usize,
    /// Bytes of member `member`'s data written; `0` means its header is not written yet.
    offset: u64,
    /// Zip: crc32 of each complete member.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    crcs: Vec<u32>,
    /// Zip: crc32 of the first `offset` bytes of member `member`.
    #[serde(default)]
    crc: u32,
}

// One member as it goes into the archive (name, size, Unix seconds): the zip records' own.
use crate::zip_layout::Member;

#[async_trait]
impl Job for ArchiveJob {
    fn kind(&self) -> &str {
        "archive"
    }

    fn args_schema(&self) -> Option<serde_json::Value> {
        let ids = serde_json::json!({
            "type": "array",
            "items": { "type": "string" },
            "minItems": 1,
            "maxItems": MAX_MEMBERS,
            "description": "Ids of the finished uploads to pack, in order."
        });
        Some(serde_json::json!({
            "type": "object",
            "properties": {
                "file_ids": ids,
                "files": {
                    "deprecated": true,
                    "description": "Deprecated name of file_ids.",
                    "type": "array",
                    "items": { "type": "string" },
                    "minItems": 1,
                    "maxItems": MAX_MEMBERS
                },
                "format": { "type": "string", "enum": ["tar", "zip"] },
                "name": { "type": ["string", "null"], "minLength": 1, "maxLength": 255, "description": "Archive file name (1 to 255 bytes)." }
            },
            "required": ["format"],
            "oneOf": [{ "required": ["file_ids"] }, { "required": ["files"] }],
            "additionalProperties": false
        }))
    }

    fn validate(&self, args: &RawValue) -> Result<(), String> {
        parse_args(args).map(|_| ())
    }

    async fn check_inputs(&self, principal: &str, args: &RawValue, uploads: &crate::upload::UploadEngine) -> Result<(), crate::error::Refusal> {
        let a = parse_args(args).map_err(|m| crate::error::Refusal::bad_request(m, "Fix the arguments and start the task again."))?;
        super::check_input_files("archive", principal, &a.file_ids, uploads).await
    }

    async fn run(&self, ctx: &JobContext, args: &RawValue, checkpoint: Option<serde_json::Value>) -> Result<serde_json::Value, JobError> {
        let args = parse_args(args).map_err(JobError::failed)?;
        let cp: Option<Checkpoint> = match super::resume("archive", checkpoint)? {
            super::Resume::Done(result) => return Ok(result),
            super::Resume::From(cp) => cp,
        };

        // Resolve every member first: a bad id fails the task before anything is written.
        let mut recs = Vec::with_capacity(args.file_ids.len());
        for id in &args.file_ids {
            recs.push(member_record(ctx, id).await?);
        }
        let names = member_names(recs.iter().map(|r| (r.id.as_str(), r.metadata.as_str())));
        let members: Vec<Member> = recs
            .iter()
            .zip(names)
            .map(|(r, name)| Member { name, size: r.length.unwrap_or(0), mtime: r.finished_at_ms.unwrap_or(0).max(0) as u64 / 1000 })
            .collect();
        let layout = Layout::new(args.format, &members);
        let total: u64 = members.iter().map(|m| m.size).sum();
        let n = members.len();

        let (mut w, mut member, mut offset, mut crcs, mut crc) = match cp {
            None => {
                let (default, media) = match args.format {
                    Format::Tar => ("archive.tar", "application/x-tar"),
                    Format::Zip => ("archive.zip", "application/zip"),
                };
                let w = ctx.create_file(args.name.as_deref().unwrap_or(default), media).await?;
                (w, 0, 0, Vec::new(), 0)
            }
            Some(c) => {
                let ok = c.member <= n
                    && (c.offset == 0 || (c.member < n && c.offset <= members[c.member].size))
                    && (args.format == Format::Tar || c.crcs.len() == c.member)
                    && c.cursor.offset == layout.position(c.member, c.offset);
                if !ok {
                    return Err(JobError::Internal("archive checkpoint does not match the archive layout".into()));
                }
                let w = ctx.reopen_file(&c.cursor).await?;
                (w, c.member, c.offset, c.crcs, c.crc)
            }
        };

        let mut done: u64 = members[..member].iter().map(|m| m.size).sum::<u64>() + offset;
        let mut since_cp: u64 = 0;
        let mut last_cp = Instant::now();
        let report = |member: usize, done: u64| {
            let fraction = if total == 0 { member as f64 / n as f64 } else { done as f64 / total as f64 };
            (fraction, format!("archived {member} of {n} files"))
        };

        while member < n {
            ctx.check()?;
            let m = &members[member];
            let rec = &recs[member];
            if offset == 0 {
                w.write(Bytes::from(layout.header(member))).await?;
            }
            // Zip: the crc of the bytes before `offset` (restored on resume), combined with the
            // crc of what this run writes.
            let mut part = flate2::Crc::new();
            let mut part_len: u64 = 0;
            if offset < m.size {
                let mut stream = ctx.uploads().read(rec, offset..m.size).await?;
                while let Some(chunk) = stream.next().await {
                    ctx.check()?;
                    let chunk = chunk.map_err(|e| JobError::Internal(format!("reading upload {}: {e}", rec.id)))?;
                    if chunk.is_empty() {
                        continue;
                    }
                    if offset + chunk.len() as u64 > m.size {
                        return Err(JobError::Internal(format!("upload {} is longer than its length", rec.id)));
                    }
                    if args.format == Format::Zip {
                        part.update(&chunk);
                        part_len += chunk.len() as u64;
                    }
                    offset += chunk.len() as u64;
                    done += chunk.len() as u64;
                    since_cp += chunk.len() as u64;
                    w.write(chunk).await?;
                    let (f, msg) = report(member, done);
                    ctx.progress(Some(f), Some(&msg), &[("files", member as u64), ("bytes", done)]).await?;
                    if since_cp >= CHECKPOINT_BYTES && offset < m.size {
                        crc = crc32_combine(crc, part.sum(), part_len);
                        part.reset();
                        part_len = 0;
                        let cursor = w.sync().await?;
                        ctx.checkpoint(&Checkpoint { cursor, member, offset, crcs: crcs.clone(), crc }).await?;
                        since_cp = 0;
                        last_cp = Instant::now();
                    }
                }
                if offset != m.size {
                    return Err(JobError::Internal(format!("upload {} ended at {offset} of {} bytes", rec.id, m.size)));
                }
            }
            crc = crc32_combine(crc, part.sum(), part_len);
            w.write(Bytes::from(layout.trailer(member, crc))).await?;
            if args.format == Format::Zip {
                crcs.push(crc);
            }
            // A partial result per member added (a resumed run re-adding it is not stored twice).
            ctx.partial(&serde_json::json!({ "member": member, "name": m.name, "size": m.size, "file_id": rec.id })).await?;
            member += 1;
            offset = 0;
            crc = 0;
            let (f, msg) = report(member, done);
            ctx.progress(Some(f), Some(&msg), &[("files", member as u64), ("bytes", done)]).await?;
            if member < n && (since_cp >= CHECKPOINT_BYTES || last_cp.elapsed() >= CHECKPOINT_EVERY) {
                let cursor = w.sync().await?;
                ctx.checkpoint(&Checkpoint { cursor, member, offset: 0, crcs: crcs.clone(), crc: 0 }).await?;
                since_cp = 0;
                last_cp = Instant::now();
            }
        }

        ctx.check()?;
        for piece in layout.end(&crcs).chunks(1 << 20) {
            w.write(Bytes::copy_from_slice(piece)).await?;
        }
        debug_assert_eq!(w.position(), layout.len);
        let file = w.finish().await?;
        let result = serde_json::json!({ "file": file, "members": n });
        ctx.checkpoint(&serde_json::json!({ "result": result })).await?;
        Ok(result)
    }
}

/// A finished upload of the task's principal, or a failure naming the id.
async fn member_record(ctx: &JobContext, id: &str) -> Result<UploadRecord, JobError> {
    let rec = match ctx.uploads().get(ctx.principal(), id).await {
        Ok(r) => r,
        Err(e) if e.code == crate::error::ErrorCode::NotFound => return Err(JobError::failed(format!("archive: no upload {id:?}"))),
        Err(e) if e.code == crate::error::ErrorCode::UploadExpired => return Err(JobError::failed(format!("archive: upload {id:?} has expired"))),
        Err(e) => return Err(e.into()),
    };
    if !rec.is_finished() || rec.length.is_none() {
        return Err(JobError::failed(format!("archive: upload {id:?} is not complete")));
    }
    Ok(rec)
}

// ---------------------------------------------------------------------------------------------
// Names

/// The member names for `(id, raw Upload-Metadata)` pairs: the sanitised `filename`, else the
/// id; clashes get `-1`, `-2`, … before the extension.
fn member_names<'a>(members: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<String> {
    let mut taken = HashSet::new();
    let mut out = Vec::new();
    for (id, metadata) in members {
        let base = crate::upload::describe_raw(metadata).name.as_deref().and_then(sanitize_name).unwrap_or_else(|| id.to_string());
        out.push(dedupe(&base, &mut taken));
    }
    out
}

/// A relative path safe to extract: `/` or `\` separated, without empty, `.` or `..`
/// components, control characters replaced by `_`, at most `MAX_NAME` bytes. `None` if nothing
/// is left.
fn sanitize_name(raw: &str) -> Option<String> {
    let cleaned: String = raw.chars().map(|c| if crate::names::is_hidden_control(c) { '_' } else { c }).collect();
    let parts: Vec<&str> = cleaned.split(['/', '\\']).filter(|p| !p.is_empty() && *p != "." && *p != "..").collect();
    let mut name = parts.join("/");
    if name.len() > MAX_NAME {
        let mut end = MAX_NAME;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
        while name.ends_with('/') {
            name.pop();
        }
    }
    (!name.is_empty()).then_some(name)
}

/// `name`, or `stem-K.ext` with the smallest K ≥ 1 not yet taken; records the choice.
fn dedupe(name: &str, taken: &mut HashSet<String>) -> String {
    if taken.insert(name.to_string()) {
        return name.to_string();
    }
    let last = name.rfind('/').map_or(0, |i| i + 1);
    let split = match name[last..].rfind('.') {
        Some(dot) if dot > 0 => last + dot,
        _ => name.len(),
    };
    let (stem, ext) = name.split_at(split);
    (1u64..).map(|k| format!("{stem}-{k}{ext}")).find(|c| taken.insert(c.clone())).expect("some suffix is free")
}
