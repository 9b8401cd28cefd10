//! Python TUS clients against the real server: tuspy with and without `upload_checksum`
//! (sha1 per chunk), and aiotus (asyncio). Every upload is checked by sha256 and
//! `Repr-Digest`. (tests/real_clients.rs covers tuspy's resume, async and wrong-checksum
//! paths.)

mod common;
use common::*;

const LEN: usize = 3 * 1024 * 1024 + 777;

fn source(seed: u64) -> (tempfile::TempDir, std::path::PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let data = pseudo_random(LEN, seed);
    let path = dir.path().join("py.bin");
    std::fs::write(&path, &data).unwrap();
    (dir, path, sha256_hex(&data))
}

#[tokio::test]
async fn tuspy_with_upload_checksum() {
    let s = Server::start(&[]);
    let (_d, path, sha) = source(51);
    let out = run_json_client(python_script("tuspy_upload.py", &[&s.base, path.to_str().unwrap(), "--chunk-size", "1048576"]), 300).await;
    assert_stored_sha256(&s, out["url"].as_str().unwrap(), &sha).await;
}

#[tokio::test]
async fn tuspy_without_upload_checksum() {
    let s = Server::start(&[]);
    let (_d, path, sha) = source(52);
    let out =
        run_json_client(python_script("tuspy_upload.py", &[&s.base, path.to_str().unwrap(), "--chunk-size", "1048576", "--no-checksum"]), 300).await;
    assert_stored_sha256(&s, out["url"].as_str().unwrap(), &sha).await;
}

/// aiotus 1.1 joins the `Location` to the endpoint with yarl's `/`, which refuses a path that
/// starts with a slash — so it needs absolute `Location` URLs: `--behind-proxy` (which builds
/// them from `Host` when no `Forwarded` header is present).
#[tokio::test]
async fn aiotus_upload() {
    let s = Server::start(&["--behind-proxy"]);
    let (_d, path, sha) = source(53);
    let out = run_json_client(python_script("aiotus_upload.py", &[&s.base, path.to_str().unwrap(), "--chunk-size", "1000000"]), 300).await;
    assert_stored_sha256(&s, out["url"].as_str().unwrap(), &sha).await;
}
