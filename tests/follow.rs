//! Following an upload that is still arriving (`GET /files/{id}?follow=1`, issue 51): curl
//! (HTTP/1.1 with `TE: trailers`, and HTTP/2) receives the committed bytes, then the rest as
//! the test PATCHes it, and ends with the `Repr-Digest` trailer; an upload terminated mid-way
//! makes curl fail; a Range of committed bytes is an ordinary 206; `ferry download --follow`
//! verifies the trailer. With `FERRY_TEST_BLOBS=s3` the same tests show what S3 offers: the
//! follow waits for the completion (parts cannot be read before it), then streams.

mod common;
use common::cli::*;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;

/// Create an upload of `data.len()` bytes named `name` and PATCH its first `first` bytes.
async fn started(t: &Tus, data: &[u8], first: usize) -> String {
    let len = data.len().to_string();
    let name = format!("filename {}", base64::engine::general_purpose::STANDARD.encode("followed.bin"));
    let r = t.post(&[("Upload-Length", &len), ("Upload-Metadata", &name)]).await;
    assert_eq!(r.status(), 201);
    let url = t.abs(header(&r, "location").unwrap());
    assert_eq!(t.patch(&url, 0, data[..first].to_vec(), &[]).await.status(), 204);
    url
}

/// PATCH `data[from..]` in pieces of `piece` bytes.
async fn send_rest(t: &Tus, url: &str, data: &[u8], from: usize, piece: usize) {
    let mut at = from;
    while at < data.len() {
        let end = (at + piece).min(data.len());
        let r = t.patch(url, at as u64, data[at..end].to_vec(), &[]).await;
        assert_eq!(r.status(), 204, "PATCH at {at}");
        at = end;
    }
}

/// curl following `url`: headers (and trailers) to `dir/headers`, the body to `dir/out`.
fn curl_follow(url: &str, dir: &Path, extra: &[&str]) -> Child {
    Command::new("curl")
        .args(["-sS", "-N", "--fail", "--noproxy", "*", "-D"])
        .arg(dir.join("headers"))
        .arg("-o")
        .arg(dir.join("out"))
        .args(extra)
        .arg(format!("{url}?follow=1"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("curl on PATH")
}

fn len_of(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// Wait (at most a minute) until `what` holds.
async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..3000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("waited a minute for {what}");
}

/// Wait until the follower has begun: on files it holds the committed `first` bytes; on S3
/// it has the answer's headers and no byte (parts are not readable before completion).
async fn until_following(dir: &Path, body: &Path, first: u64) {
    let headers = dir.join("headers");
    until("the follower's headers", || std::fs::read_to_string(&headers).is_ok_and(|h| h.contains("\r\n\r\n"))).await;
    let h = std::fs::read_to_string(&headers).unwrap().to_ascii_lowercase();
    assert!(h.contains("trailer: repr-digest"), "{h}");
    assert!(!h.lines().any(|l| l.starts_with("content-length:")), "a followed body has no length: {h}");
    if blobs_are_s3() {
        assert_eq!(len_of(body), 0, "S3: no byte before the upload completes");
    } else {
        until("the committed bytes", || len_of(body) >= first).await;
    }
}

async fn wait_child(mut c: Child) -> (std::process::ExitStatus, String) {
    tokio::task::spawn_blocking(move || {
        let status = c.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut err).unwrap();
        (status, err)
    })
    .await
    .unwrap()
}

/// curl follows a 64 MiB upload started at 10 %, ends byte-exact, with the sha256 trailer.
async fn curl_follows(extra: &[&str]) {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(64 << 20, 51);
    let first = data.len() / 10;
    let url = started(&t, &data, first).await;
    let dir = tempfile::tempdir().unwrap();
    let curl = curl_follow(&url, dir.path(), extra);
    until_following(dir.path(), &dir.path().join("out"), first as u64).await;
    send_rest(&t, &url, &data, first, 8 << 20).await;
    let (status, err) = wait_child(curl).await;
    assert!(status.success(), "curl: {status} {err}");
    assert_eq!(std::fs::read(dir.path().join("out")).unwrap(), data, "byte-exact");
    let headers = std::fs::read_to_string(dir.path().join("headers")).unwrap().to_ascii_lowercase();
    let want = format!("repr-digest: sha-256=:{}:", base64::engine::general_purpose::STANDARD.encode(hex::decode(sha256_hex(&data)).unwrap()));
    let body_end = headers.find("\r\n\r\n").unwrap();
    assert!(headers[body_end..].contains(&want.to_ascii_lowercase()), "the trailer after the headers: {headers}");
    assert!(!headers[..body_end].lines().any(|l| l.starts_with("repr-digest:")), "not a header: the file was unfinished when the answer began");
}

#[tokio::test]
async fn curl_follows_an_upload_over_http1_with_te_trailers() {
    curl_follows(&["-H", "TE: trailers"]).await;
}

#[tokio::test]
async fn curl_follows_an_upload_over_http2() {
    curl_follows(&["--http2-prior-knowledge"]).await;
}

/// A terminated upload ends the follow as a failure: curl exits non-zero with a short file.
#[tokio::test]
async fn a_terminated_upload_fails_the_follower() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(4 << 20, 52);
    let url = started(&t, &data, 1 << 20).await;
    for extra in [&["-H", "TE: trailers"][..], &["--http2-prior-knowledge"][..]] {
        let url = if extra[0] == "-H" { url.clone() } else { started(&t, &data, 1 << 20).await };
        let dir = tempfile::tempdir().unwrap();
        let curl = curl_follow(&url, dir.path(), extra);
        until_following(dir.path(), &dir.path().join("out"), 1 << 20).await;
        let r = t.request("DELETE", &url, &[("Tus-Resumable", "1.0.0")], None).await;
        assert_eq!(r.status(), 204);
        let (status, err) = wait_child(curl).await;
        assert!(!status.success(), "curl {extra:?} must fail on a terminated upload: {status} {err}");
        assert!(len_of(&dir.path().join("out")) < data.len() as u64);
    }
}

/// A Range of committed bytes is an ordinary 206 (files); one past them follows; without
/// `follow=1` an unfinished upload still answers 409.
#[tokio::test]
async fn ranges_of_an_unfinished_upload() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(1_000_000, 53);
    let url = started(&t, &data, 500_000).await;
    let r = t.c.get(&url).header("Range", "bytes=1000-1999").send().await.unwrap();
    problem(r, 409, "upload_incomplete").await;
    let get = |range: &'static str| t.c.get(format!("{url}?follow=1")).header("Range", range).send();
    if !blobs_are_s3() {
        let r = get("bytes=1000-1999").await.unwrap();
        assert_eq!(r.status(), 206);
        assert_eq!(header(&r, "content-range"), Some("bytes 1000-1999/1000000"));
        assert_eq!(header_u64(&r, "content-length"), Some(1000));
        assert_eq!(r.bytes().await.unwrap().as_ref(), &data[1000..2000]);
    }
    let r = t.c.get(format!("{url}?follow=1")).header("If-Match", "\"abc\"").send().await.unwrap();
    problem(r, 412, "conflict").await;
    let r = get("bytes=1000000-").await.unwrap();
    assert_eq!(header(&r, "content-range"), Some("bytes */1000000"));
    problem(r, 416, "invalid_argument").await;
    // Past the committed bytes: 206 whose body follows the upload to its end.
    let tail = get("bytes=400000-").await.unwrap();
    assert_eq!(tail.status(), 206);
    assert_eq!(header(&tail, "content-range"), Some("bytes 400000-999999/1000000"));
    let inside = get("bytes=100-199").await.unwrap();
    assert_eq!(inside.status(), 206);
    send_rest(&t, &url, &data, 500_000, 100_000).await;
    assert_eq!(tail.bytes().await.unwrap().as_ref(), &data[400_000..]);
    assert_eq!(inside.bytes().await.unwrap().as_ref(), &data[100..200]);
    // Finished: `follow=1` is an ordinary download.
    let r = t.c.get(format!("{url}?follow=1")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header_u64(&r, "content-length"), Some(1_000_000));
}

/// `ferry download --follow` writes the file as it arrives and checks the trailer's sha256;
/// a follow of an upload terminated mid-way fails and leaves no file.
#[tokio::test]
async fn cli_download_follow() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(4 << 20, 54);
    let url = started(&t, &data, 1 << 20).await;
    let id = url.rsplit('/').next().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let target: PathBuf = dir.path().join("got.bin");
    let part = dir.path().join("got.bin.part");
    let mut cmd = ferry(&s.base, &cache, &["download", "--follow", &id, "-o", target.to_str().unwrap(), "--quiet"]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    if !blobs_are_s3() {
        until("the CLI's first bytes", || len_of(&part) >= 1 << 20).await;
    }
    send_rest(&t, &url, &data, 1 << 20, 1 << 20).await;
    let o = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(&target).unwrap(), data);
    assert!(String::from_utf8_lossy(&o.stdout).contains(&sha256_hex(&data)));

    let url = started(&t, &data, 1 << 20).await;
    let id = url.rsplit('/').next().unwrap().to_string();
    let target = dir.path().join("cut.bin");
    let part = dir.path().join("cut.bin.part");
    let mut cmd = ferry(&s.base, &cache, &["download", "--follow", &id, "-o", target.to_str().unwrap(), "--quiet", "--retry-for", "2s"]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    if !blobs_are_s3() {
        until("the CLI's first bytes", || len_of(&part) >= 1 << 20).await;
    } else {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(t.request("DELETE", &url, &[("Tus-Resumable", "1.0.0")], None).await.status(), 204);
    let o = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    assert!(!o.status.success(), "a terminated upload is no download");
    assert!(!target.exists() && !part.exists(), "nothing that looks like the file is left");
}
