//! tus-js-client 4.3 (Node) speaking the IETF resumable-upload draft against the real server:
//! `protocol: 'ietf-draft-03'` (Upload-Draft-Interop-Version 5) and `'ietf-draft-05'` (6), each
//! in one request, in 1 MiB chunks, aborted and resumed from the URL it stored, and with a
//! deferred length from a stream. Every upload is checked by the sha256 of the stored file and
//! its `Repr-Digest`. The scripts are the TUS ones (tests/clients/node), switched by
//! `TUS_PROTOCOL`.

mod common;
use common::*;

/// 5 MiB plus an odd number of bytes: never a multiple of a chunk size.
const LEN: usize = 5 * 1024 * 1024 + 4_097;

/// Run `script` with tus-js-client speaking `protocol`; returns its JSON line after checking the
/// stored file's sha256.
async fn run(protocol: &str, script: &str, extra: &[&str], seed: u64) -> serde_json::Value {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random(LEN, seed);
    let path = dir.path().join("ietf.bin");
    std::fs::write(&path, &data).unwrap();
    let mut args = vec![server.base.as_str(), path.to_str().unwrap()];
    args.extend_from_slice(extra);
    let mut cmd = node_script(script, &args);
    cmd.env("TUS_PROTOCOL", protocol);
    let out = run_json_client(cmd, 300).await;
    assert_stored_sha256(&server, out["url"].as_str().unwrap(), &sha256_hex(&data)).await;
    out
}

async fn one_request(protocol: &str, seed: u64) {
    let out = run(protocol, "tus_options.js", &[r#"{"chunkSize":null}"#], seed).await;
    assert_eq!((out["posts"].as_u64(), out["patches"].as_u64()), (Some(1), Some(1)), "{out}");
    assert_eq!(out["draft_requests"], 2, "both requests spoke the draft: {out}");
}

async fn chunked_1mib(protocol: &str, seed: u64) {
    let out = run(protocol, "tus_options.js", &[r#"{"chunkSize":1048576}"#], seed).await;
    assert_eq!(out["patches"], 6, "5 MiB + 4097 bytes in 1 MiB chunks: {out}");
    assert_eq!(out["draft_requests"], 7, "{out}");
}

async fn creation_with_upload(protocol: &str, seed: u64) {
    let out = run(protocol, "tus_options.js", &[r#"{"chunkSize":2097152,"uploadDataDuringCreation":true}"#], seed).await;
    assert_eq!((out["posts"].as_u64(), out["patches"].as_u64()), (Some(1), Some(2)), "the POST carried the first 2 MiB: {out}");
}

async fn abort_and_resume(protocol: &str, seed: u64) {
    let out = run(protocol, "abort_resume.js", &["262144"], seed).await;
    assert!(out["server_offset"].as_u64().unwrap() > 0, "{out}");
}

async fn deferred_length(protocol: &str, seed: u64) {
    run(protocol, "deferred.js", &[], seed).await;
}

#[tokio::test]
async fn draft03_one_request() {
    one_request("ietf-draft-03", 51).await;
}

#[tokio::test]
async fn draft05_one_request() {
    one_request("ietf-draft-05", 52).await;
}

#[tokio::test]
async fn draft03_chunked_1mib() {
    chunked_1mib("ietf-draft-03", 53).await;
}

#[tokio::test]
async fn draft05_chunked_1mib() {
    chunked_1mib("ietf-draft-05", 54).await;
}

#[tokio::test]
async fn draft03_creation_with_upload() {
    creation_with_upload("ietf-draft-03", 55).await;
}

#[tokio::test]
async fn draft05_creation_with_upload() {
    creation_with_upload("ietf-draft-05", 56).await;
}

#[tokio::test]
async fn draft03_abort_and_resume_from_the_stored_url() {
    abort_and_resume("ietf-draft-03", 57).await;
}

#[tokio::test]
async fn draft05_abort_and_resume_from_the_stored_url() {
    abort_and_resume("ietf-draft-05", 58).await;
}

#[tokio::test]
async fn draft03_deferred_length() {
    deferred_length("ietf-draft-03", 59).await;
}

#[tokio::test]
async fn draft05_deferred_length() {
    deferred_length("ietf-draft-05", 60).await;
}
