//! The TUS 1.0 upload state machine against a reference model: proptest draws sequences of
//! create / PATCH (the right offset and wrong ones, checksums good and bad, bodies past the
//! length) / HEAD / DELETE / restart, drives a real `ferry serve` with them, and compares every
//! answer (status, `Upload-Offset`, `Upload-Length`) with what a small model of TUS 1.0 says;
//! at the end every finished upload's bytes are downloaded and compared. A failure shrinks to
//! a short sequence (proptest shrinks the operation list and each operation).
//!
//! Bounded for CI: `FERRY_MODEL_CASES` cases (default 24) of at most 24 operations.

mod common;

use base64::Engine as _;
use common::*;
use proptest::prelude::*;
use sha1::Digest as _;

/// One step of a sequence. `u` picks an upload among those created so far (modulo their count).
#[derive(Debug, Clone)]
enum Op {
    Create { len: u64 },
    Patch { u: usize, offset: OffsetChoice, bytes: u64, checksum: Checksum },
    Head { u: usize },
    Delete { u: usize },
    Restart,
}

#[derive(Debug, Clone, Copy)]
enum OffsetChoice {
    Right,
    /// The stored offset plus this (never 0).
    Off(i64),
}

#[derive(Debug, Clone, Copy)]
enum Checksum {
    None,
    Good,
    Bad,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..48).prop_map(|len| Op::Create { len }),
        6 => (0usize..4, prop_oneof![4 => Just(OffsetChoice::Right), 1 => prop_oneof![-5i64..0, 1i64..5].prop_map(OffsetChoice::Off)], 1u64..24,
              prop_oneof![3 => Just(Checksum::None), 1 => Just(Checksum::Good), 1 => Just(Checksum::Bad)])
            .prop_map(|(u, offset, bytes, checksum)| Op::Patch { u, offset, bytes, checksum }),
        2 => (0usize..4).prop_map(|u| Op::Head { u }),
        1 => (0usize..4).prop_map(|u| Op::Delete { u }),
        1 => Just(Op::Restart),
    ]
}

/// The model of one upload.
#[derive(Debug, Clone)]
struct Model {
    url: String,
    len: u64,
    data: Vec<u8>,
    deleted: bool,
}

/// The bytes a PATCH of `n` bytes at `offset` sends: a function of the position, so a resent
/// range is the same bytes.
fn body(offset: u64, n: u64) -> Vec<u8> {
    (offset..offset + n).map(|i| (i.wrapping_mul(31) ^ 0x5a) as u8).collect()
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut server = Server::start(&[]);
    let mut tus = Tus::new(&server);
    let mut uploads: Vec<Model> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let ctx = format!("step {step}: {op:?}");
        let pick = |u: usize, uploads: &[Model]| (!uploads.is_empty()).then(|| u % uploads.len());
        match *op {
            Op::Create { len } => {
                let r = tus.post(&[("Upload-Length", &len.to_string())]).await;
                prop_assert_eq!(r.status().as_u16(), 201, "{}", ctx);
                let url = tus.abs(header(&r, "location").unwrap());
                uploads.push(Model { url, len, data: Vec::new(), deleted: false });
            }
            Op::Patch { u, offset, bytes, checksum } => {
                let Some(i) = pick(u, &uploads) else { continue };
                let m = &uploads[i];
                let stored = m.data.len() as u64;
                let at = match offset {
                    OffsetChoice::Right => stored,
                    OffsetChoice::Off(d) => stored.saturating_add_signed(d),
                };
                let wrong = at != stored;
                let data = body(at, bytes);
                let sum = match checksum {
                    Checksum::None => None,
                    Checksum::Good => Some(base64::engine::general_purpose::STANDARD.encode(sha1::Sha1::digest(&data))),
                    Checksum::Bad => Some(base64::engine::general_purpose::STANDARD.encode(sha1::Sha1::digest(b"not these bytes"))),
                };
                let sum_header = sum.map(|s| format!("sha1 {s}"));
                let extra: Vec<(&str, &str)> = sum_header.iter().map(|s| ("Upload-Checksum", s.as_str())).collect();
                let r = tus.patch(&m.url, at, data.clone(), &extra).await;
                let status = r.status().as_u16();
                // TUS 1.0: unknown → 404; offset ≠ stored → 409; past Upload-Length → 413;
                // checksum mismatch → 460; else 204 at the new offset. Nothing but 204 moves it.
                let want = if m.deleted {
                    404
                } else if wrong {
                    409
                } else if stored + bytes > m.len {
                    413
                } else if matches!(checksum, Checksum::Bad) {
                    460
                } else {
                    204
                };
                prop_assert_eq!(status, want, "{}", ctx);
                if want == 204 {
                    prop_assert_eq!(header_u64(&r, "upload-offset"), Some(stored + bytes), "{}", ctx);
                    uploads[i].data.extend_from_slice(&data);
                }
            }
            Op::Head { u } => {
                let Some(i) = pick(u, &uploads) else { continue };
                let m = &uploads[i];
                let r = tus.head(&m.url).await;
                if m.deleted {
                    prop_assert_eq!(r.status().as_u16(), 404, "{}", ctx);
                    prop_assert!(header(&r, "upload-offset").is_none(), "a 404 never carries Upload-Offset: {}", ctx);
                } else {
                    prop_assert_eq!(r.status().as_u16(), 200, "{}", ctx);
                    prop_assert_eq!(header_u64(&r, "upload-offset"), Some(m.data.len() as u64), "{}", ctx);
                    prop_assert_eq!(header_u64(&r, "upload-length"), Some(m.len), "{}", ctx);
                }
            }
            Op::Delete { u } => {
                let Some(i) = pick(u, &uploads) else { continue };
                let r = tus.request("DELETE", &uploads[i].url, &[("Tus-Resumable", "1.0.0")], None).await;
                prop_assert_eq!(r.status().as_u16(), if uploads[i].deleted { 404 } else { 204 }, "{}", ctx);
                uploads[i].deleted = true;
            }
            Op::Restart => {
                server.restart();
                tus = Tus::new(&server);
                for m in &mut uploads {
                    // The port may change: the path stays.
                    let path = m.url.split_once("/files/").map(|(_, p)| format!("/files/{p}")).unwrap();
                    m.url = server.url(&path);
                }
            }
        }
    }
    for m in uploads.iter().filter(|m| !m.deleted && m.data.len() as u64 == m.len) {
        let r = tus.request("GET", &m.url, &[], None).await;
        prop_assert_eq!(r.status().as_u16(), 200, "GET of finished {}", m.url);
        prop_assert_eq!(r.bytes().await.unwrap().to_vec(), m.data.clone(), "bytes of {}", m.url);
    }
    Ok(())
}

#[test]
fn tus_state_machine_matches_the_model() {
    let cases = std::env::var("FERRY_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let config = ProptestConfig { cases, max_shrink_iters: 200, failure_persistence: None, ..ProptestConfig::default() };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..24))| {
        rt.block_on(run(ops))?;
    });
}
