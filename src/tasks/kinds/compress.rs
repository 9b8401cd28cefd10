//! `compress`: zstd or gzip of one finished upload of the task's principal, streamed into a new
//! file and resumable.
//!
//! Args: `{"file_id": "<upload id>", "format": "zstd"|"gzip", "level": optional int}` (`file` is
//! accepted as the deprecated name of `file_id`).
//! Result: `{"file": <FileHandle>, "input_bytes": N}`. Partial results: one fragment per frame
//! written, `{"frame": index, "input_offset", "input_bytes", "output_end"}` (input bytes the
//! frame holds, output file length after it).
//!
//! Compressor state cannot be saved, so the input is compressed as independent frames (zstd
//! frames / gzip members) of `FRAME` input bytes each; both formats decode a concatenation of
//! frames as one stream (`zstd -d`, `gzip -d`; in Rust `zstd::decode_all`,
//! `flate2::read::MultiGzDecoder`). After each frame the file is synced and the checkpoint
//! `{cursor, input_offset}` saved; a resumed run reopens the file at the cursor and starts a new
//! frame at `input_offset`, so the output is the same as an uninterrupted run's.

use std::io::Write;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::tasks::{Job, JobContext, JobError};
use crate::upload::{FileCursor, FileWriter};

/// Input bytes per frame (and so between checkpoints).
const FRAME: u64 = 64 << 20;
/// Input handed to the compressor per blocking step.
const STEP: usize = 1 << 20;
const ZSTD_LEVELS: std::ops::RangeInclusive<i32> = -7..=22;
const GZIP_LEVELS: std::ops::RangeInclusive<i32> = 0..=9;

pub struct CompressJob;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Format {
    Zstd,
    Gzip,
}

impl Format {
    fn default_level(self) -> i32 {
        match self {
            Format::Zstd => 3,
            Format::Gzip => 6,
        }
    }

    fn levels(self) -> std::ops::RangeInclusive<i32> {
        match self {
            Format::Zstd => ZSTD_LEVELS,
            Format::Gzip => GZIP_LEVELS,
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Format::Zstd => "zst",
            Format::Gzip => "gz",
        }
    }

    fn media_type(self) -> &'static str {
        match self {
            Format::Zstd => "application/zstd",
            Format::Gzip => "application/gzip",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    /// Id of the finished upload to compress. `file` is the deprecated name (stored
    /// arguments of older tasks, older clients).
    #[serde(alias = "file")]
    file_id: String,
    format: Format,
    #[serde(default)]
    level: Option<i32>,
}

fn parse_args(args: &RawValue) -> Result<Args, String> {
    let a: Args = serde_json::from_str(args.get()).map_err(|e| format!("compress arguments: {e}"))?;
    if a.file_id.is_empty() {
        return Err("compress: \"file_id\" must be an upload id".into());
    }
    if let Some(l) = a.level {
        let r = a.format.levels();
        if !r.contains(&l) {
            return Err(format!("compress: level {l} is out of range {}..={} for {:?}", r.start(), r.end(), a.format).to_lowercase());
        }
    }
    Ok(a)
}

/// The checkpoint between frames.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Checkpoint {
    /// The output file after the last complete frame.
    cursor: FileCursor,
    /// Input bytes compressed by the complete frames.
    input_offset: u64,
}

/// One frame's compressor, writing into a buffer that is drained after each step.
enum Encoder {
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
}

impl Encoder {
    fn new(format: Format, level: i32) -> std::io::Result<Self> {
        Ok(match format {
            Format::Zstd => {
                let mut e = zstd::stream::write::Encoder::new(Vec::new(), level)?;
                e.include_checksum(true)?;
                Encoder::Zstd(e)
            }
            Format::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level as u32))),
        })
    }

    /// Compress `data`; returns the output produced so far.
    fn push(&mut self, data: &[u8]) -> std::io::Result<Vec<u8>> {
        Ok(match self {
            Encoder::Zstd(e) => {
                e.write_all(data)?;
                std::mem::take(e.get_mut())
            }
            Encoder::Gzip(e) => {
                e.write_all(data)?;
                std::mem::take(e.get_mut())
            }
        })
    }

    /// End the frame; returns the rest of its output.
    fn finish(self) -> std::io::Result<Vec<u8>> {
        match self {
            Encoder::Zstd(e) => e.finish(),
            Encoder::Gzip(e) => e.finish(),
        }
    }
}

fn io_err(e: std::io::Error) -> JobError {
    JobError::Internal(format!("compressing: {e}"))
}

/// Run `f` on the blocking pool (compression is CPU-bound).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> std::io::Result<T> + Send + 'static) -> Result<T, JobError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| JobError::Internal(format!("compressor: {e}")))?.map_err(io_err)
}

async fn write_out(w: &mut FileWriter, out: Vec<u8>) -> Result<(), JobError> {
    if !out.is_empty() {
        w.write(Bytes::from(out)).await?;
    }
    Ok(())
}

/// The output name: the last component of the input's `filename` (else its id) plus the
/// format's extension.
fn output_name(id: &str, metadata: &str, format: Format) -> String {
    let base = crate::upload::describe_raw(metadata)
        .name
        .as_deref()
        .and_then(|f| f.rsplit(['/', '\\']).find(|p| !p.is_empty() && *p != "." && *p != ".."))
        .map(|f| f.chars().map(|c| if crate::names::is_hidden_control(c) { '_' } else { c }).collect::<String>())
        .unwrap_or_else(|| id.to_string());
    format!("{base}.{}", format.extension())
}

#[async_trait]
impl Job for CompressJob {
    fn kind(&self) -> &str {
        "compress"
    }

    fn args_schema(&self) -> Option<serde_json::Value> {
        let levels = |r: std::ops::RangeInclusive<i32>| {
            serde_json::json!({
                "properties": { "level": { "type": ["integer", "null"], "minimum": r.start(), "maximum": r.end() } }
            })
        };
        let level_range = format!("zstd {}..={}, gzip {}..={}", ZSTD_LEVELS.start(), ZSTD_LEVELS.end(), GZIP_LEVELS.start(), GZIP_LEVELS.end());
        Some(serde_json::json!({
            "type": "object",
            "properties": {
                "file_id": { "type": "string", "minLength": 1, "description": "Id of the finished upload to compress." },
                "file": { "type": "string", "minLength": 1, "deprecated": true, "description": "Deprecated name of file_id." },
                "format": { "type": "string", "enum": ["zstd", "gzip"] },
                "level": { "type": ["integer", "null"], "description": level_range }
            },
            "required": ["format"],
            "oneOf": [{ "required": ["file_id"] }, { "required": ["file"] }],
            "allOf": [
                { "if": { "properties": { "format": { "const": "zstd" } } }, "then": levels(ZSTD_LEVELS) },
                { "if": { "properties": { "format": { "const": "gzip" } } }, "then": levels(GZIP_LEVELS) }
            ],
            "additionalProperties": false
        }))
    }

    fn validate(&self, args: &RawValue) -> Result<(), String> {
        parse_args(args).map(|_| ())
    }

    async fn check_inputs(&self, principal: &str, args: &RawValue, uploads: &crate::upload::UploadEngine) -> Result<(), crate::error::Refusal> {
        let a = parse_args(args).map_err(|m| crate::error::Refusal::bad_request(m, "Fix the arguments and start the task again."))?;
        super::check_input_files("compress", principal, std::slice::from_ref(&a.file_id), uploads).await
    }

    async fn run(&self, ctx: &JobContext, args: &RawValue, checkpoint: Option<serde_json::Value>) -> Result<serde_json::Value, JobError> {
        let args = parse_args(args).map_err(JobError::failed)?;
        let cp: Option<Checkpoint> = match super::resume("compress", checkpoint)? {
            super::Resume::Done(result) => return Ok(result),
            super::Resume::From(cp) => cp,
        };
        let id = &args.file_id;
        let rec = match ctx.uploads().get(ctx.principal(), id).await {
            Ok(r) => r,
            Err(e) if e.code == crate::error::ErrorCode::NotFound => return Err(JobError::failed(format!("compress: no upload {id:?}"))),
            Err(e) if e.code == crate::error::ErrorCode::UploadExpired => {
                return Err(JobError::failed(format!("compress: upload {id:?} has expired")))
            }
            Err(e) => return Err(e.into()),
        };
        let len = match rec.length {
            Some(l) if rec.is_finished() => l,
            _ => return Err(JobError::failed(format!("compress: upload {id:?} is not complete"))),
        };
        let level = args.level.unwrap_or(args.format.default_level());

        let (mut w, mut offset) = match cp {
            None => (ctx.create_file(&output_name(&rec.id, &rec.metadata, args.format), args.format.media_type()).await?, 0),
            Some(c) => {
                if c.input_offset > len || c.input_offset % FRAME != 0 {
                    return Err(JobError::Internal("compress checkpoint does not match the input".into()));
                }
                (ctx.reopen_file(&c.cursor).await?, c.input_offset)
            }
        };

        loop {
            ctx.check()?;
            let frame_start = offset;
            let frame_end = (offset + FRAME).min(len);
            let mut enc = Some(blocking(move || Encoder::new(args.format, level)).await?);
            if offset < frame_end {
                let mut stream = ctx.uploads().read(&rec, offset..frame_end).await?;
                let mut pending: Vec<u8> = Vec::with_capacity(STEP);
                let mut read = offset;
                loop {
                    let chunk = stream.next().await.transpose().map_err(|e| JobError::Internal(format!("reading upload {}: {e}", rec.id)))?;
                    ctx.check()?;
                    let last = chunk.is_none();
                    if let Some(c) = chunk {
                        read += c.len() as u64;
                        if read > frame_end {
                            return Err(JobError::Internal(format!("upload {} is longer than its length", rec.id)));
                        }
                        pending.extend_from_slice(&c);
                    }
                    // Exactly `STEP`-byte pieces from the frame start (deflate output depends
                    // on how the input is fed), so a resumed run writes the same bytes.
                    while pending.len() >= STEP || (last && !pending.is_empty()) {
                        let data = if pending.len() > STEP {
                            let rest = pending.split_off(STEP);
                            std::mem::replace(&mut pending, rest)
                        } else {
                            std::mem::take(&mut pending)
                        };
                        let n = data.len() as u64;
                        let mut e = enc.take().expect("encoder");
                        let (e, out) = blocking(move || {
                            let out = e.push(&data)?;
                            Ok((e, out))
                        })
                        .await?;
                        enc = Some(e);
                        write_out(&mut w, out).await?;
                        offset += n;
                        let msg = format!("compressed {offset} of {len} bytes");
                        let fraction = if len == 0 { 1.0 } else { offset as f64 / len as f64 };
                        ctx.progress(Some(fraction), Some(&msg), &[("input_bytes", offset), ("output_bytes", w.position())]).await?;
                    }
                    if last {
                        break;
                    }
                }
                if offset != frame_end {
                    return Err(JobError::Internal(format!("upload {} ended at {offset} of {len} bytes", rec.id)));
                }
            }
            let e = enc.take().expect("encoder");
            let out = blocking(move || e.finish()).await?;
            write_out(&mut w, out).await?;
            // A partial result per frame (before the checkpoint that covers it).
            ctx.partial(&serde_json::json!({
                "frame": frame_start / FRAME,
                "input_offset": frame_start,
                "input_bytes": offset - frame_start,
                "output_end": w.position()
            }))
            .await?;
            if offset >= len {
                break;
            }
            let cursor = w.sync().await?;
            ctx.checkpoint(&Checkpoint { cursor, input_offset: offset }).await?;
        }

        let output_bytes = w.position();
        let file = w.finish().await?;
        ctx.progress(
            Some(1.0),
            Some(&format!("compressed {len} bytes into {output_bytes}")),
            &[("input_bytes", len), ("output_bytes", output_bytes)],
        )
        .await?;
        let result = serde_json::json!({ "file": file, "input_bytes": len });
        ctx.checkpoint(&serde_json::json!({ "result": result })).await?;
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn md(filename: &str) -> String {
        let mut m = ferry_tus::UploadMetadata::new();
        m.insert("filename", Some(filename.as_bytes().to_vec())).unwrap();
        m.to_string()
    }

    /// Compress `data` in frames of `frame` bytes, pushing `step`-byte pieces, as the job does.
    fn frames(format: Format, data: &[u8], frame: usize, step: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut frames: Vec<&[u8]> = data.chunks(frame).collect();
        if frames.is_empty() {
            frames.push(&[]);
        }
        for f in frames {
            let mut e = Encoder::new(format, format.default_level()).unwrap();
            for piece in f.chunks(step) {
                out.extend(e.push(piece).unwrap());
            }
            out.extend(e.finish().unwrap());
        }
        out
    }

    fn sample() -> Vec<u8> {
        (0..500_000u32).map(|i| ((i / 7) % 97) as u8 ^ (i % 3) as u8).collect()
    }

    #[test]
    fn zstd_frames_concatenate() {
        let data = sample();
        let z = frames(Format::Zstd, &data, 123_456, 10_000);
        assert_eq!(zstd::decode_all(&z[..]).unwrap(), data);
        assert!(z.len() < data.len());
        assert_eq!(zstd::decode_all(&frames(Format::Zstd, &[], 10, 10)[..]).unwrap(), b"");
    }

    #[test]
    fn gzip_members_concatenate() {
        let data = sample();
        let g = frames(Format::Gzip, &data, 123_456, 10_000);
        let mut got = Vec::new();
        flate2::read::MultiGzDecoder::new(&g[..]).read_to_end(&mut got).unwrap();
        assert_eq!(got, data);
        let empty = frames(Format::Gzip, &[], 10, 10);
        got.clear();
        flate2::read::MultiGzDecoder::new(&empty[..]).read_to_end(&mut got).unwrap();
        assert!(got.is_empty());
    }

    #[test]
    fn output_is_deterministic() {
        // zstd output does not depend on how the input is fed; deflate's does, hence the job's
        // fixed pieces.
        let data = sample();
        assert_eq!(frames(Format::Zstd, &data, 200_000, 4096), frames(Format::Zstd, &data, 200_000, 65_536));
        assert_eq!(frames(Format::Gzip, &data, 200_000, 4096), frames(Format::Gzip, &data, 200_000, 4096));
    }

    #[test]
    fn names_outputs() {
        assert_eq!(output_name("id1", &md("dir/report.csv"), Format::Zstd), "report.csv.zst");
        assert_eq!(output_name("id1", &md("C:\\x\\a.txt"), Format::Gzip), "a.txt.gz");
        assert_eq!(output_name("id1", &md("../"), Format::Gzip), "id1.gz");
        assert_eq!(output_name("id1", "", Format::Zstd), "id1.zst");
    }

    #[test]
    fn validates_args() {
        let ok = |s: &str| parse_args(&RawValue::from_string(s.to_string()).unwrap()).is_ok();
        assert!(ok(r#"{"file":"a","format":"zstd"}"#));
        assert!(ok(r#"{"file":"a","format":"gzip","level":9}"#));
        assert!(ok(r#"{"file":"a","format":"zstd","level":19}"#));
        assert!(!ok(r#"{"file":"a","format":"gzip","level":10}"#));
        assert!(!ok(r#"{"file":"a","format":"zstd","level":23}"#));
        assert!(!ok(r#"{"file":"a","format":"xz"}"#));
        assert!(!ok(r#"{"format":"zstd"}"#));
        assert!(!ok(r#"{"file":"","format":"zstd"}"#));
    }
}
