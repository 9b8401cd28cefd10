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
    /// `partial`: `Upload-Concat: partial`.
    Create {
        len: u64,
        partial: bool,
    },
    /// A final upload of these uploads (picked as `u` is), when each is finished; a part that
    /// is not a live partial upload is a 400.
    Concat {
        parts: Vec<usize>,
    },
    /// A PATCH at the right offset that declares `bytes + more` bytes, sends `bytes` and
    /// drops the connection: the bytes that arrived are kept (DESIGN §2: a checkpoint on
    /// client disconnect), nothing else.
    Dropped {
        u: usize,
        bytes: u64,
        more: u64,
    },
    Patch {
        u: usize,
        offset: OffsetChoice,
        bytes: u64,
        checksum: Checksum,
    },
    Head {
        u: usize,
    },
    Delete {
        u: usize,
    },
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
        3 => (0u64..48, proptest::bool::weighted(0.3)).prop_map(|(len, partial)| Op::Create { len, partial }),
        1 => proptest::collection::vec(0usize..6, 1..4).prop_map(|parts| Op::Concat { parts }),
        1 => (0usize..4, 0u64..16, 1u64..16).prop_map(|(u, bytes, more)| Op::Dropped { u, bytes, more }),
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
    partial: bool,
    /// A final upload of a concatenation: never takes a PATCH (403).
    is_final: bool,
}

/// Send a PATCH that declares `declared` bytes, send `body` of them and drop the connection.
async fn dropped_patch(base: &str, url: &str, offset: u64, declared: u64, body: &[u8]) {
    use tokio::io::AsyncWriteExt;
    let addr = base.trim_start_matches("http://");
    let path = url.split_once("/files/").map(|(_, p)| format!("/files/{p}")).unwrap();
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "PATCH {path} HTTP/1.1\r\nHost: {addr}\r\nTus-Resumable: 1.0.0\r\nContent-Type: \
         application/offset+octet-stream\r\nUpload-Offset: {offset}\r\nContent-Length: {declared}\r\n\r\n"
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    sock.write_all(body).await.unwrap();
    sock.flush().await.unwrap();
    let _ = sock.shutdown().await;
    // The server has handled the request (and checkpointed what arrived) once it answers and
    // closes; read to its end.
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), sock.read_to_end(&mut answer)).await;
}

/// Wait until the server receives no upload body (`ferry_patches_in_flight` 0): a dropped
/// PATCH has checkpointed what arrived.
async fn settle(server: &Server) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = client().get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
        if text.lines().any(|l| l == "ferry_patches_in_flight 0") {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "a dropped PATCH is still in flight after 30 s");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
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
            Op::Create { len, partial } => {
                let len_s = len.to_string();
                let mut h = vec![("Upload-Length", len_s.as_str())];
                if partial {
                    h.push(("Upload-Concat", "partial"));
                }
                let r = tus.post(&h).await;
                prop_assert_eq!(r.status().as_u16(), 201, "{}", ctx);
                let url = tus.abs(header(&r, "location").unwrap());
                uploads.push(Model { url, len, data: Vec::new(), deleted: false, partial, is_final: false });
            }
            Op::Concat { ref parts } => {
                let Some(_) = pick(0, &uploads) else { continue };
                let picked: Vec<usize> = parts.iter().map(|u| u % uploads.len()).collect();
                let usable = |m: &Model| m.partial && !m.deleted;
                if picked.iter().any(|&i| usable(&uploads[i]) && (uploads[i].data.len() as u64) < uploads[i].len) {
                    continue; // concatenation-unfinished completes later, asynchronously: not modelled
                }
                let list: Vec<String> = picked.iter().map(|&i| uploads[i].url.clone()).collect();
                let r = tus.post(&[("Upload-Concat", &format!("final;{}", list.join(" ")))]).await;
                if !picked.iter().all(|&i| usable(&uploads[i])) {
                    prop_assert_eq!(r.status().as_u16(), 400, "a part that is not a live partial upload: {}", ctx);
                    continue;
                }
                prop_assert_eq!(r.status().as_u16(), 201, "{}", ctx);
                let url = tus.abs(header(&r, "location").unwrap());
                let data: Vec<u8> = picked.iter().flat_map(|&i| uploads[i].data.clone()).collect();
                let h = tus.wait_complete(&url).await;
                prop_assert_eq!(header_u64(&h, "upload-offset"), Some(data.len() as u64), "{}", ctx);
                uploads.push(Model { url, len: data.len() as u64, data, deleted: false, partial: false, is_final: true });
            }
            Op::Dropped { u, bytes, more } => {
                let Some(i) = pick(u, &uploads) else { continue };
                let m = &uploads[i];
                let stored = m.data.len() as u64;
                let data = body(stored, bytes);
                dropped_patch(&server.base, &m.url, stored, bytes + more, &data).await;
                settle(&server).await;
                // Refused before the body (404, 403, 413: nothing kept), or the bytes that arrived are kept.
                if !m.deleted && !m.is_final && stored + bytes + more <= m.len {
                    uploads[i].data.extend_from_slice(&data);
                }
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
                } else if m.is_final {
                    403
                } else if wrong {
                    409
                } else if stored + bytes > m.len {
                    413
                } else if matches!(checksum, Checksum::Bad) {
                    460
                } else {
                    204
                };
                if status != want {
                    let text = r.text().await.unwrap_or_default();
                    prop_assert_eq!(status, want, "{}: {}", ctx, text);
                    unreachable!();
                }
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

/// Sequences the model test found, kept as fixed cases.
#[test]
fn found_sequences() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cases: Vec<Vec<Op>> = vec![
        // A PATCH refused before its body (413: its Content-Length runs past the length) whose
        // client then drops the connection; the next PATCH must not find the upload held.
        vec![
            Op::Create { len: 4, partial: true },
            Op::Dropped { u: 0, bytes: 6, more: 10 },
            Op::Patch { u: 0, offset: OffsetChoice::Right, bytes: 4, checksum: Checksum::Good },
        ],
        vec![
            Op::Create { len: 4, partial: true },
            Op::Restart,
            Op::Dropped { u: 0, bytes: 6, more: 10 },
            Op::Patch { u: 0, offset: OffsetChoice::Right, bytes: 4, checksum: Checksum::Good },
        ],
        // A PATCH dropped mid-body keeps what arrived.
        vec![
            Op::Create { len: 14, partial: false },
            Op::Patch { u: 0, offset: OffsetChoice::Right, bytes: 4, checksum: Checksum::None },
            Op::Dropped { u: 0, bytes: 7, more: 2 },
            Op::Patch { u: 0, offset: OffsetChoice::Right, bytes: 3, checksum: Checksum::None },
        ],
    ];
    for ops in cases {
        if let Err(e) = rt.block_on(run(ops.clone())) {
            panic!("{ops:?}: {e}");
        }
    }
}

/// Found by the `draft_planning` fuzz target: a creation of unknown length whose body declares
/// more bytes than the maximum size is refused (413) before any byte is read — TUS
/// (`Upload-Defer-Length: 1`) and the draft (`Upload-Complete: ?0`) alike — and creates nothing.
#[tokio::test]
async fn creation_with_a_body_past_the_max_size_is_refused_before_the_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start(&["--max-size", "1MiB"]);
    let addr = server.base.trim_start_matches("http://").to_string();
    for extra in [
        "Tus-Resumable: 1.0.0\r\nUpload-Defer-Length: 1\r\nContent-Type: application/offset+octet-stream\r\n",
        "Upload-Draft-Interop-Version: 8\r\nUpload-Complete: ?0\r\n",
    ] {
        let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!("POST /files/ HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Length: 2000000\r\n\r\n");
        sock.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(std::time::Duration::from_secs(30), sock.read(&mut buf)).await.expect("an answer before the body").unwrap();
        let answer = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(answer.starts_with("HTTP/1.1 413"), "{extra:?}: {answer}");
    }
    let listed = json(Api::new(&server).get("/api/v1/files").await).await;
    assert_eq!(listed["files"].as_array().map(Vec::len), Some(0), "nothing was created: {listed}");
}
