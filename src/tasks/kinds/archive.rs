//! `archive`: a tar or zip of finished uploads of the task's principal, streamed into a new file
//! and resumable mid-member.
//!
//! Args: `{"file_ids": ["<upload id>", …], "format": "tar"|"zip", "name": "optional output name"}` (`files` is accepted as the deprecated name of `file_ids`).
//! Result: `{"file": <FileHandle>, "members": N}`. Partial results: one fragment per member
//! added, `{"member": index, "name", "size", "file_id"}`.
//!
//! The archive layout is a pure function of the members (names, sizes, mtimes), so every byte
//! position is known up front: a checkpoint is `{cursor, member, offset}` (plus, for zip, the
//! crc32 of each finished member and of the part of the current one written so far), and a
//! resumed run reopens the file at the cursor and produces exactly the bytes an uninterrupted
//! run would have. Zip members are Stored (no compression) with a data descriptor (the crc is
//! known only after the data), zip64 where sizes or offsets need it.

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

/// One member as it goes into the archive.
#[derive(Debug, Clone)]
struct Member {
    name: String,
    size: u64,
    /// Unix seconds.
    mtime: u64,
}

#[async_trait]
impl Job for ArchiveJob {
    fn kind(&self) -> &str {
        "archive"
    }

    fn args_schema(&self) -> Option<serde_json::Value> {
        let ids = serde_json::json!({ "type": "array", "items": { "type": "string" }, "minItems": 1, "maxItems": MAX_MEMBERS, "description": "Ids of the finished uploads to pack, in order." });
        Some(serde_json::json!({
            "type": "object",
            "properties": {
                "file_ids": ids,
                "files": { "deprecated": true, "description": "Deprecated name of file_ids.", "type": "array", "items": { "type": "string" }, "minItems": 1, "maxItems": MAX_MEMBERS },
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
        let members: Vec<Member> =
            recs.iter().zip(names).map(|(r, name)| Member { name, size: r.length.unwrap_or(0), mtime: r.finished_at_ms.unwrap_or(0).max(0) as u64 / 1000 }).collect();
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

// ---------------------------------------------------------------------------------------------
// Layout

/// Where everything goes: a pure function of the format and the members.
struct Layout<'a> {
    format: Format,
    members: &'a [Member],
    /// Start of each member's header, then the start of the trailer (zip: central directory).
    starts: Vec<u64>,
    /// Total archive length.
    len: u64,
}

impl<'a> Layout<'a> {
    fn new(format: Format, members: &'a [Member]) -> Self {
        let mut starts = Vec::with_capacity(members.len() + 1);
        let mut pos = 0u64;
        for m in members {
            starts.push(pos);
            pos += match format {
                Format::Tar => tar_header(m).len() as u64 + m.size + tar_padding(m.size) as u64,
                Format::Zip => zip_local_header(m, pos).len() as u64 + m.size + zip_descriptor_len(m),
            };
        }
        starts.push(pos);
        let len = match format {
            Format::Tar => pos + 1024,
            Format::Zip => pos + zip_end(members, &starts[..members.len()], &vec![0; members.len()], pos).len() as u64,
        };
        Layout { format, members, starts, len }
    }

    /// The header bytes of member `i`.
    fn header(&self, i: usize) -> Vec<u8> {
        match self.format {
            Format::Tar => tar_header(&self.members[i]),
            Format::Zip => zip_local_header(&self.members[i], self.starts[i]),
        }
    }

    /// The bytes after member `i`'s data (tar padding, zip data descriptor).
    fn trailer(&self, i: usize, crc: u32) -> Vec<u8> {
        match self.format {
            Format::Tar => vec![0; tar_padding(self.members[i].size)],
            Format::Zip => zip_descriptor(&self.members[i], crc),
        }
    }

    /// The archive's end (tar: two zero blocks; zip: central directory and end records).
    fn end(&self, crcs: &[u32]) -> Vec<u8> {
        let n = self.members.len();
        match self.format {
            Format::Tar => vec![0; 1024],
            Format::Zip => zip_end(self.members, &self.starts[..n], crcs, self.starts[n]),
        }
    }

    /// The archive offset once members `[0, member)` are complete and `offset` bytes of member
    /// `member`'s data are written (`offset == 0`: before its header).
    fn position(&self, member: usize, offset: u64) -> u64 {
        if offset == 0 {
            return self.starts[member];
        }
        let header = match self.format {
            Format::Tar => tar_header(&self.members[member]).len(),
            Format::Zip => zip_local_header(&self.members[member], self.starts[member]).len(),
        };
        self.starts[member] + header as u64 + offset
    }
}

// ---------------------------------------------------------------------------------------------
// Tar (GNU format: long names as `././@LongLink` entries, big sizes in base-256)

fn tar_padding(size: u64) -> usize {
    ((512 - size % 512) % 512) as usize
}

fn tar_block(name: &[u8], size: u64, mtime: u64, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    let n = name.len().min(100);
    h.as_old_mut().name[..n].copy_from_slice(&name[..n]);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    h.set_entry_type(kind);
    h.set_cksum();
    h
}

/// The header block(s) of a member: a GNU long-name entry first when the name exceeds 100 bytes.
fn tar_header(m: &Member) -> Vec<u8> {
    let name = m.name.as_bytes();
    let mut out = Vec::with_capacity(512);
    if name.len() > 100 {
        let long = tar_block(b"././@LongLink", name.len() as u64 + 1, 0, tar::EntryType::GNULongName);
        out.extend_from_slice(long.as_bytes());
        out.extend_from_slice(name);
        out.push(0);
        out.resize(out.len() + tar_padding(name.len() as u64 + 1), 0);
    }
    out.extend_from_slice(tar_block(name, m.size, m.mtime, tar::EntryType::Regular).as_bytes());
    out
}

// ---------------------------------------------------------------------------------------------
// Zip (Stored members, data descriptors, UTF-8 names, zip64 where needed)

const U32_MAX: u64 = 0xFFFF_FFFF;
/// General purpose flags: bit 3 (data descriptor), bit 11 (UTF-8 names).
const ZIP_FLAGS: u16 = 0x0808;

fn zip_size64(m: &Member) -> bool {
    m.size >= U32_MAX
}

fn zip_version(m: &Member, offset: u64) -> u16 {
    if zip_size64(m) || offset >= U32_MAX {
        45
    } else {
        20
    }
}

/// MS-DOS (time, date) of Unix seconds, UTC, clamped to 1980..=2107.
fn dos_datetime(secs: u64) -> (u16, u16) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    if year < 1980 {
        return (0, (1 << 5) | 1);
    }
    if year > 2107 {
        return ((23 << 11) | (59 << 5) | 29, (127 << 9) | (12 << 5) | 31);
    }
    let time = ((rem / 3600) << 11) | (((rem % 3600) / 60) << 5) | ((rem % 60) / 2);
    let date = ((year - 1980) << 9) | (month << 5) | day;
    (time as u16, date as u16)
}

fn put16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

/// Local file header of a member starting at `offset`: crc and sizes are in the descriptor.
fn zip_local_header(m: &Member, offset: u64) -> Vec<u8> {
    let name = m.name.as_bytes();
    let (time, date) = dos_datetime(m.mtime);
    let z64 = zip_size64(m);
    let mut b = Vec::with_capacity(30 + name.len() + 20);
    put32(&mut b, 0x0403_4b50);
    put16(&mut b, zip_version(m, offset));
    put16(&mut b, ZIP_FLAGS);
    put16(&mut b, 0); // stored
    put16(&mut b, time);
    put16(&mut b, date);
    put32(&mut b, 0); // crc: in the descriptor
    let sizes = if z64 { U32_MAX as u32 } else { 0 };
    put32(&mut b, sizes);
    put32(&mut b, sizes);
    put16(&mut b, name.len() as u16);
    put16(&mut b, if z64 { 20 } else { 0 });
    b.extend_from_slice(name);
    if z64 {
        put16(&mut b, 0x0001);
        put16(&mut b, 16);
        put64(&mut b, 0);
        put64(&mut b, 0);
    }
    b
}

fn zip_descriptor_len(m: &Member) -> u64 {
    if zip_size64(m) {
        24
    } else {
        16
    }
}

/// Data descriptor after a member's data (8-byte sizes for a zip64 member).
fn zip_descriptor(m: &Member, crc: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(24);
    put32(&mut b, 0x0807_4b50);
    put32(&mut b, crc);
    if zip_size64(m) {
        put64(&mut b, m.size);
        put64(&mut b, m.size);
    } else {
        put32(&mut b, m.size as u32);
        put32(&mut b, m.size as u32);
    }
    b
}

/// Central directory, then (if needed) the zip64 end record and locator, then the end record.
/// `cd_offset` is where the central directory starts.
fn zip_end(members: &[Member], starts: &[u64], crcs: &[u32], cd_offset: u64) -> Vec<u8> {
    let mut b = Vec::new();
    for ((m, &offset), &crc) in members.iter().zip(starts).zip(crcs) {
        let name = m.name.as_bytes();
        let (time, date) = dos_datetime(m.mtime);
        let z_size = zip_size64(m);
        let z_off = offset >= U32_MAX;
        let mut extra = Vec::new();
        if z_size || z_off {
            let mut fields = Vec::new();
            if z_size {
                put64(&mut fields, m.size); // uncompressed
                put64(&mut fields, m.size); // compressed
            }
            if z_off {
                put64(&mut fields, offset);
            }
            put16(&mut extra, 0x0001);
            put16(&mut extra, fields.len() as u16);
            extra.extend_from_slice(&fields);
        }
        let version = zip_version(m, offset);
        put32(&mut b, 0x0201_4b50);
        put16(&mut b, (3 << 8) | version); // made by: Unix
        put16(&mut b, version);
        put16(&mut b, ZIP_FLAGS);
        put16(&mut b, 0);
        put16(&mut b, time);
        put16(&mut b, date);
        put32(&mut b, crc);
        let size32 = if z_size { U32_MAX as u32 } else { m.size as u32 };
        put32(&mut b, size32);
        put32(&mut b, size32);
        put16(&mut b, name.len() as u16);
        put16(&mut b, extra.len() as u16);
        put16(&mut b, 0); // comment
        put16(&mut b, 0); // disk
        put16(&mut b, 0); // internal attributes
        put32(&mut b, 0o100644 << 16); // external: regular file, rw-r--r--
        put32(&mut b, if z_off { U32_MAX as u32 } else { offset as u32 });
        b.extend_from_slice(name);
        b.extend_from_slice(&extra);
    }
    let cd_size = b.len() as u64;
    let n = members.len() as u64;
    let z64 = n >= 0xFFFF || cd_size >= U32_MAX || cd_offset >= U32_MAX;
    if z64 {
        let eocd64 = cd_offset + cd_size;
        put32(&mut b, 0x0606_4b50);
        put64(&mut b, 44);
        put16(&mut b, (3 << 8) | 45);
        put16(&mut b, 45);
        put32(&mut b, 0);
        put32(&mut b, 0);
        put64(&mut b, n);
        put64(&mut b, n);
        put64(&mut b, cd_size);
        put64(&mut b, cd_offset);
        put32(&mut b, 0x0706_4b50);
        put32(&mut b, 0);
        put64(&mut b, eocd64);
        put32(&mut b, 1);
    }
    put32(&mut b, 0x0605_4b50);
    put16(&mut b, 0);
    put16(&mut b, 0);
    let n16 = n.min(0xFFFF) as u16;
    put16(&mut b, n16);
    put16(&mut b, n16);
    put32(&mut b, cd_size.min(U32_MAX) as u32);
    put32(&mut b, cd_offset.min(U32_MAX) as u32);
    put16(&mut b, 0);
    b
}

// ---------------------------------------------------------------------------------------------
// crc32 resumption

fn gf2_times(mat: &[u32; 32], mut vec: u32) -> u32 {
    let mut sum = 0;
    let mut rows = mat.iter();
    while vec != 0 {
        let row = rows.next().expect("32 rows");
        if vec & 1 != 0 {
            sum ^= row;
        }
        vec >>= 1;
    }
    sum
}

fn gf2_square(mat: &[u32; 32]) -> [u32; 32] {
    let mut sq = [0u32; 32];
    for (s, &row) in sq.iter_mut().zip(mat) {
        *s = gf2_times(mat, row);
    }
    sq
}

/// crc32 of `A ‖ B` from crc32(A), crc32(B) and len(B) (zlib's `crc32_combine`).
fn crc32_combine(crc1: u32, crc2: u32, len2: u64) -> u32 {
    if len2 == 0 {
        return crc1;
    }
    // The operator for one zero bit, then squared to 2 and 4 zero bits.
    let mut odd = [0u32; 32];
    odd[0] = 0xEDB8_8320;
    for (n, r) in odd.iter_mut().enumerate().skip(1) {
        *r = 1 << (n - 1);
    }
    let even = gf2_square(&odd);
    let mut odd = gf2_square(&even);
    let mut crc1 = crc1;
    let mut len2 = len2;
    loop {
        let even = gf2_square(&odd);
        if len2 & 1 != 0 {
            crc1 = gf2_times(&even, crc1);
        }
        len2 >>= 1;
        if len2 == 0 {
            break;
        }
        odd = gf2_square(&even);
        if len2 & 1 != 0 {
            crc1 = gf2_times(&odd, crc1);
        }
        len2 >>= 1;
        if len2 == 0 {
            break;
        }
    }
    crc1 ^ crc2
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn crc(data: &[u8]) -> u32 {
        let mut c = flate2::Crc::new();
        c.update(data);
        c.sum()
    }

    fn md(filename: &str) -> String {
        let mut m = ferry_tus::UploadMetadata::new();
        m.insert("filename", Some(filename.as_bytes().to_vec())).unwrap();
        m.to_string()
    }

    /// Build an archive in memory the way the job does, resuming (layout-wise) nowhere.
    fn build(format: Format, files: &[(&str, &[u8])]) -> Vec<u8> {
        let members: Vec<Member> = files.iter().map(|(n, d)| Member { name: n.to_string(), size: d.len() as u64, mtime: 1_700_000_000 }).collect();
        let layout = Layout::new(format, &members);
        let mut out = Vec::new();
        let mut crcs = Vec::new();
        for (i, (_, d)) in files.iter().enumerate() {
            assert_eq!(out.len() as u64, layout.position(i, 0));
            out.extend(layout.header(i));
            if !d.is_empty() {
                out.extend_from_slice(&d[..1]);
                assert_eq!(out.len() as u64, layout.position(i, 1));
                out.extend_from_slice(&d[1..]);
            }
            let c = crc(d);
            out.extend(layout.trailer(i, c));
            crcs.push(c);
        }
        out.extend(layout.end(&crcs));
        assert_eq!(out.len() as u64, layout.len);
        out
    }

    #[test]
    fn sanitizes_names() {
        assert_eq!(sanitize_name("/etc/passwd").as_deref(), Some("etc/passwd"));
        assert_eq!(sanitize_name("../../x/./y//z").as_deref(), Some("x/y/z"));
        assert_eq!(sanitize_name("C:\\dir\\f.txt").as_deref(), Some("C:/dir/f.txt"));
        assert_eq!(sanitize_name("a\nb\0c").as_deref(), Some("a_b_c"));
        assert_eq!(sanitize_name("../.."), None);
        assert_eq!(sanitize_name(""), None);
        assert_eq!(sanitize_name(&"é".repeat(1000)).unwrap().len(), 1024);
    }

    #[test]
    fn dedupes_and_falls_back_to_ids() {
        let a = md("report.pdf");
        let b = md("/report.pdf");
        let c = md("report-1.pdf");
        let d = md("..");
        let e = md(".bashrc");
        let names = member_names([
            ("id1", a.as_str()),
            ("id2", b.as_str()),
            ("id3", c.as_str()),
            ("id4", d.as_str()),
            ("id5", ""),
            ("id6", e.as_str()),
            ("id7", e.as_str()),
            ("id8", "garbage !!"),
        ]);
        assert_eq!(names, ["report.pdf", "report-1.pdf", "report-1-1.pdf", "id4", "id5", ".bashrc", ".bashrc-1", "id8"]);
        let mut t = HashSet::new();
        assert_eq!(dedupe("d.x/f", &mut t), "d.x/f");
        assert_eq!(dedupe("d.x/f", &mut t), "d.x/f-1");
    }

    #[test]
    fn crc_combines() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for split in [0, 1, 5, 4096, 77_777, 100_000] {
            let (a, b) = data.split_at(split);
            assert_eq!(crc32_combine(crc(a), crc(b), b.len() as u64), crc(&data), "split {split}");
        }
        // Resuming twice.
        let (a, rest) = data.split_at(10);
        let (b, c) = rest.split_at(50_000);
        let ab = crc32_combine(crc(a), crc(b), b.len() as u64);
        assert_eq!(crc32_combine(ab, crc(c), c.len() as u64), crc(&data));
    }

    #[test]
    fn tar_reads_back() {
        let long = format!("{}/{}.bin", "d".repeat(80), "n".repeat(60));
        let big = vec![7u8; 1000];
        let files: Vec<(&str, &[u8])> = vec![("a.txt", b"hello"), ("dir/empty", b""), (&long, &big), ("x", &[1u8; 512])];
        let bytes = build(Format::Tar, &files);
        assert_eq!(bytes.len() % 512, 0);
        let mut ar = tar::Archive::new(&bytes[..]);
        let mut seen = Vec::new();
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            assert_eq!(e.header().mode().unwrap(), 0o644);
            assert_eq!(e.header().mtime().unwrap(), 1_700_000_000);
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            seen.push((path, data));
        }
        let want: Vec<(String, Vec<u8>)> = files.iter().map(|(n, d)| (n.to_string(), d.to_vec())).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn tar_header_sizes() {
        let m = Member { name: "a".into(), size: 10 << 30, mtime: 0 };
        let h = tar_header(&m);
        assert_eq!(h.len(), 512);
        let hdr = tar::Header::from_byte_slice(&h);
        assert_eq!(hdr.size().unwrap(), 10 << 30);
        assert_eq!(hdr.cksum().unwrap(), {
            let mut c = hdr.clone();
            c.set_cksum();
            c.cksum().unwrap()
        });
        let long = Member { name: "x".repeat(300), size: 1, mtime: 0 };
        assert_eq!(tar_header(&long).len(), 512 + 512 + 512);
    }

    #[test]
    fn zip_reads_back() {
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let files: Vec<(&str, &[u8])> = vec![("a.txt", b"hello"), ("dir/empty", b""), ("caf\u{e9}/b.bin", &big)];
        let bytes = build(Format::Zip, &files);
        let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
        assert_eq!(z.len(), 3);
        for (i, (name, data)) in files.iter().enumerate() {
            let mut f = z.by_index(i).unwrap();
            assert_eq!(f.name().unwrap(), *name);
            assert_eq!(f.size(), data.len() as u64);
            assert_eq!(f.crc32(), crc(data));
            assert_eq!(f.unix_mode(), Some(0o100644));
            let mut got = Vec::new();
            f.read_to_end(&mut got).unwrap();
            assert_eq!(&got, data);
        }
    }

    #[test]
    fn zip64_records() {
        // A member over 4 GiB: zip64 local extra, 8-byte descriptor, zip64 central extra, and
        // the central directory past 4 GiB needs the zip64 end records.
        let m = Member { name: "big".into(), size: 5 << 30, mtime: 0 };
        let lh = zip_local_header(&m, 0);
        assert_eq!(lh.len(), 30 + 3 + 20);
        assert_eq!(&lh[18..26], &[0xFF; 8]);
        assert_eq!(zip_descriptor(&m, 1).len() as u64, zip_descriptor_len(&m));
        let members = [m];
        let layout = Layout::new(Format::Zip, &members);
        let cd_offset = layout.starts[1];
        assert_eq!(cd_offset, 53 + (5 << 30) + 24);
        let end = layout.end(&[42]);
        assert_eq!(end.len() as u64, layout.len - cd_offset);
        // central header (46 + 3 + 4 + 16) + zip64 end (56) + locator (20) + end (22)
        assert_eq!(end.len(), 69 + 56 + 20 + 22);
        let eocd = &end[end.len() - 22..];
        assert_eq!(&eocd[16..20], &[0xFF; 4]);
        let eocd64 = &end[69..69 + 56];
        assert_eq!(u64::from_le_bytes(eocd64[48..56].try_into().unwrap()), cd_offset);
    }

    #[test]
    fn dos_dates() {
        // 2023-11-14 22:13:20 UTC
        let (t, d) = dos_datetime(1_700_000_000);
        assert_eq!(d, ((2023 - 1980) << 9) | (11 << 5) | 14);
        assert_eq!(t, (22 << 11) | (13 << 5) | 10);
        assert_eq!(dos_datetime(0), (0, (1 << 5) | 1));
        // 2000-02-29 00:00:00
        assert_eq!(dos_datetime(951_782_400).1, (20 << 9) | (2 << 5) | 29);
    }

    #[test]
    fn validates_shape() {
        let ok = |s: &str| parse_args(&RawValue::from_string(s.to_string()).unwrap()).is_ok();
        assert!(ok(r#"{"files":["a"],"format":"tar"}"#), "the deprecated name");
        assert!(ok(r#"{"file_ids":["a"],"format":"tar"}"#));
        assert!(!ok(r#"{"file_ids":["a"],"files":["b"],"format":"tar"}"#), "one name at a time");
        assert!(ok(r#"{"files":["a","b"],"format":"zip","name":"out.zip"}"#));
        assert!(!ok(r#"{"files":[],"format":"tar"}"#));
        assert!(!ok(r#"{"files":["a"],"format":"rar"}"#));
        assert!(!ok(r#"{"files":[1],"format":"tar"}"#));
        assert!(!ok(r#"{"files":"a","format":"tar"}"#));
        let many = serde_json::json!({"files": vec!["a"; MAX_MEMBERS + 1], "format": "tar"}).to_string();
        assert!(!ok(&many));
    }
}
