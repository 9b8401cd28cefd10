//! tus-js-client 4.x (Node) against the real server, in the modes tests/real_clients.rs does
//! not already cover: the whole file in one PATCH (tus-js-client's default `chunkSize:
//! Infinity`), `chunkSize` 1 MiB, and `parallelUploads: 4` (concatenation). (real_clients.rs
//! covers 256 KiB chunks, `uploadLengthDeferred`, `parallelUploads: 3`, and abort + resume
//! from the stored URL.) Also `addRequestId: true` (an `X-Request-ID` on every request; the
//! browser's CORS side of it is tests/interop_uppy.rs). Every upload is checked by sha256 and
//! `Repr-Digest`.

mod common;
use common::*;

/// 5 MiB plus an odd number of bytes: never a multiple of a chunk size.
const LEN: usize = 5 * 1024 * 1024 + 4_097;

async fn upload_with(options: &str, seed: u64) -> (Server, serde_json::Value, String) {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random(LEN, seed);
    let path = dir.path().join("tus-js.bin");
    std::fs::write(&path, &data).unwrap();
    let out = run_json_client(node_script("tus_options.js", &[&server.base, path.to_str().unwrap(), options]), 300).await;
    let sha = sha256_hex(&data);
    assert_stored_sha256(&server, out["url"].as_str().unwrap(), &sha).await;
    (server, out, sha)
}

#[tokio::test]
async fn tus_js_client_one_patch() {
    let (_s, out, _) = upload_with(r#"{"chunkSize":null}"#, 41).await;
    assert_eq!(out["patches"], 1, "{out}");
}

#[tokio::test]
async fn tus_js_client_chunk_size_1mib() {
    let (_s, out, _) = upload_with(r#"{"chunkSize":1048576}"#, 42).await;
    assert_eq!(out["patches"], 6, "5 MiB + 4097 bytes in 1 MiB chunks: {out}");
}

#[tokio::test]
async fn tus_js_client_parallel_uploads_4() {
    let (s, out, _) = upload_with(r#"{"parallelUploads":4,"chunkSize":1048576}"#, 43).await;
    // 4 partial uploads plus the final one.
    assert_eq!(out["posts"], 5, "{out}");
    let h = Tus::new(&s).head(out["url"].as_str().unwrap()).await;
    let concat = header(&h, "upload-concat").unwrap_or_default().to_string();
    assert!(concat.starts_with("final;") && concat.split(' ').count() == 4, "Upload-Concat {concat:?}");
}

#[tokio::test]
async fn tus_js_client_add_request_id() {
    let (_s, out, _) = upload_with(r#"{"addRequestId":true,"chunkSize":2097152}"#, 44).await;
    // One POST and three PATCHes, each with its own X-Request-ID.
    assert_eq!((out["posts"].as_u64(), out["patches"].as_u64()), (Some(1), Some(3)), "{out}");
    assert_eq!(out["request_ids"], 4, "every request carried X-Request-ID: {out}");
}
