//! `ferry upload|download|ls|status|rm|share` against the real server: round trips verified by
//! sha256, resume after the client is killed mid-transfer (SIGKILL), `--parallel`
//! concatenation, signed URLs, and the documented exit codes.
//!
//! Interruptions are made deterministic with a small loopback proxy between the CLI and the
//! server that forwards only a byte budget and then holds the rest: the test waits until the
//! server has what the budget let through, kills the CLI, lifts the budget and re-runs the
//! same command. Nothing depends on how fast this machine is.

mod common;
use common::cli::*;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn upload_download_ls_status_rm() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (src, sha) = source(dir.path(), "hello world.bin", 5 * 1024 * 1024 + 7, 1);

    // Upload: one line `URL<TAB>SHA256`.
    let o = out(ferry(&s.base, &cache, &["upload", src.to_str().unwrap(), "--meta", "owner=tests"]).arg("--chunk-size").arg("1MiB"));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let line = stdout(&o);
    let (url, printed) = line.trim_end().split_once('\t').unwrap_or_else(|| panic!("URL<TAB>SHA256 expected: {line:?}"));
    assert_eq!(printed, sha);
    assert!(url.starts_with(&s.url("/files/")), "{url}");
    assert_eq!(server_sha256(url).await, sha);
    let id = url.rsplit('/').next().unwrap().to_string();
    // Not a terminal: plain progress lines on stderr.
    assert!(stderr(&o).contains(" bytes ("), "no progress lines: {}", stderr(&o));

    // The same command again: the remembered upload is complete, nothing is re-sent.
    let again = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", src.to_str().unwrap()])));
    assert_eq!(again["url"], url);
    assert_eq!(again["sent"], 0);
    assert_eq!(again["sha256"], sha.as_str());
    // --fresh starts a new upload.
    let fresh = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "--fresh", "-q", src.to_str().unwrap()])));
    assert_ne!(fresh["url"], url);
    assert_eq!(fresh["sent"], 5 * 1024 * 1024 + 7);

    // status: the server's JSON, with the metadata name.
    let st = ok_json(&out(&mut ferry(&s.base, &cache, &["status", "--json", &id])));
    assert_eq!(st["sha256"], sha.as_str());
    assert_eq!(st["complete"], true);
    assert_eq!(st["name"], "hello world.bin");

    // ls: a table, and --json.
    let o = out(&mut ferry(&s.base, &cache, &["ls"]));
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).lines().any(|l| l.starts_with(&id) && l.contains("complete") && l.ends_with("hello world.bin")), "{}", stdout(&o));
    let l = ok_json(&out(&mut ferry(&s.base, &cache, &["ls", "--json"])));
    assert_eq!(l["files"].as_array().unwrap().len(), 2);

    // download: by id into a directory, named from Content-Disposition; then by URL.
    let dl = dir.path().join("dl");
    std::fs::create_dir(&dl).unwrap();
    let o = out(ferry(&s.base, &cache, &["download", &id]).current_dir(&dl));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("hello world.bin\t{sha}\n"));
    assert_eq!(sha256_hex(&std::fs::read(dl.join("hello world.bin")).unwrap()), sha);
    // A re-run: the file is already there and matches: 0, nothing received.
    let o = out(ferry(&s.base, &cache, &["download", &id, "--json"]).current_dir(&dl));
    let again = ok_json(&o);
    assert_eq!((again["received"].as_u64(), again["sha256"].as_str()), (Some(0), Some(sha.as_str())), "{}", stderr(&o));
    assert!(stderr(&o).contains("already downloaded"), "{}", stderr(&o));
    // Another file under that name: refused (2) without --force, and left as it is.
    std::fs::write(dl.join("hello world.bin"), vec![7u8; 5 * 1024 * 1024 + 7]).unwrap();
    let o = out(ferry(&s.base, &cache, &["download", &id]).current_dir(&dl));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("sha256 differs"), "{}", stderr(&o));
    assert_eq!(std::fs::read(dl.join("hello world.bin")).unwrap(), vec![7u8; 5 * 1024 * 1024 + 7]);
    let o = out(ferry(&s.base, &cache, &["download", &id, "--force", "-q"]).current_dir(&dl));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(sha256_hex(&std::fs::read(dl.join("hello world.bin")).unwrap()), sha);
    let target = dl.join("by-url.bin");
    let d = ok_json(&out(&mut ferry(&s.base, &cache, &["download", "--json", url, "-o", target.to_str().unwrap()])));
    assert_eq!(d["sha256"], sha.as_str());
    assert_eq!(d["received"], 5 * 1024 * 1024 + 7);
    assert_eq!(sha256_hex(&std::fs::read(&target).unwrap()), sha);
    // To stdout.
    let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", "-", "-q"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(sha256_hex(&o.stdout), sha);

    // rm: gone (status 3), and the next upload of the file starts a new one.
    let o = out(&mut ferry(&s.base, &cache, &["rm", &id]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = out(&mut ferry(&s.base, &cache, &["status", &id]));
    assert_eq!(code(&o), 3, "{}", stderr(&o));
    assert!(stderr(&o).contains("not_found"), "{}", stderr(&o));
    let o = out(&mut ferry(&s.base, &cache, &["rm", &id]));
    assert_eq!(code(&o), 3);
    let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", dl.join("x").to_str().unwrap()]));
    assert_eq!(code(&o), 3);
}

#[tokio::test]
async fn upload_parallel_concatenation_and_empty_file() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (src, sha) = source(dir.path(), "p.bin", 9 * 1024 * 1024 + 3, 2);
    let o = out(&mut ferry(&s.base, &cache, &["upload", "--json", "--parallel", "4", "--chunk-size", "1MiB", src.to_str().unwrap()]));
    // Parts confirmed while others are still sending are not bytes the server lost.
    assert!(!stderr(&o).contains("sending again"), "{}", stderr(&o));
    let v = ok_json(&o);
    assert_eq!(v["sha256"], sha.as_str());
    assert_eq!(v["sent"], 9 * 1024 * 1024 + 3);
    let url = v["url"].as_str().unwrap();
    assert_eq!(server_sha256(url).await, sha);
    // The final upload names its 4 parts.
    let h = Tus::new(&s).head(url).await;
    let concat = header(&h, "upload-concat").unwrap().to_string();
    assert!(concat.starts_with("final;") && concat.split(' ').count() == 4, "{concat}");
    // Re-run: remembered, verified, nothing sent.
    let again = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "--parallel", "4", src.to_str().unwrap()])));
    assert_eq!((again["url"].as_str(), again["sent"].as_u64()), (Some(url), Some(0)));

    // An empty file: complete at creation, sha256 of nothing.
    let (empty, esha) = source(dir.path(), "empty", 0, 3);
    let v = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "--parallel", "3", empty.to_str().unwrap()])));
    assert_eq!(v["sha256"], esha.as_str());
    let target = dir.path().join("empty.out");
    let d = ok_json(&out(&mut ferry(&s.base, &cache, &["download", "--json", v["id"].as_str().unwrap(), "-o", target.to_str().unwrap()])));
    assert_eq!(d["size"], 0);
    assert_eq!(std::fs::read(&target).unwrap().len(), 0);
    // Without -o it takes the file's name, as any other file does, and a second run finds it
    // there, verified (issue 48, kind 12: it was saved under its id and the re-run exited 2).
    let here = dir.path().join("here");
    std::fs::create_dir(&here).unwrap();
    for run in 0..2 {
        let o = out(ferry(&s.base, &cache, &["download", v["id"].as_str().unwrap()]).current_dir(&here));
        assert_eq!(code(&o), 0, "run {run}: {}", stderr(&o));
        assert_eq!(std::fs::read(here.join("empty")).map(|b| b.len()).ok(), Some(0), "run {run}: saved under the file's name");
    }
}

/// Kill `ferry upload` (SIGKILL) once the server has part of the file, re-run it: it resumes
/// from the server's offset (sends less than the file), and the result verifies.
async fn kill_and_resume_upload(chunk_size: Option<&str>) {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let size = 64 * 1024 * 1024 + 11;
    let (src, sha) = source(dir.path(), "big.bin", size, 4);
    // 8 MiB reach the server, then the proxy holds every further byte.
    let proxy = Proxy::start(s.addr(), 8 << 20, u64::MAX).await;
    let mut args = vec!["upload", "--json", src.to_str().unwrap()];
    if let Some(c) = chunk_size {
        args.extend(["--chunk-size", c]);
    }
    let mut first = ferry(&proxy.base, &cache, &args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    // The server has at least 1 MiB of it (counted as its PATCH handler receives bytes).
    wait_until("1 MiB at the server", || async { metric(&s, "ferry_bytes_received_total").await >= 1 << 20 }).await;
    kill9(&mut first);
    proxy.up.open();

    let o = out_async(ferry(&proxy.base, &cache, &args)).await;
    let v = ok_json(&o);
    let resumed = v["resumed_from"].as_u64().unwrap();
    let sent = v["sent"].as_u64().unwrap();
    assert!(resumed > 0, "the re-run started over: {v}\n{}", stderr(&o));
    assert!(sent < size as u64, "the re-run sent {sent} of {size} bytes: {v}");
    assert_eq!(resumed + sent, size as u64, "{v}");
    assert!(stderr(&o).contains("resuming"), "{}", stderr(&o));
    assert_eq!(v["sha256"], sha.as_str());
    assert_eq!(server_sha256(&s.url(&format!("/files/{}", v["id"].as_str().unwrap()))).await, sha);
}

#[tokio::test]
async fn upload_killed_midway_resumes_chunked() {
    kill_and_resume_upload(Some("1MiB")).await;
}

#[tokio::test]
async fn upload_killed_midway_resumes_single_patch() {
    kill_and_resume_upload(None).await;
}

/// Kill `ferry download` once part of the file is on disk, re-run it: Range + If-Range
/// continue the `.part` file, and the result verifies.
#[tokio::test]
async fn download_killed_midway_resumes() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let size = 64 * 1024 * 1024 + 13;
    let data = pseudo_random(size, 5);
    let sha = sha256_hex(&data);
    let id = Api::new(&s).upload(&data, "down.bin").await;
    drop(data);
    let proxy = Proxy::start(s.addr(), u64::MAX, 8 << 20).await;
    let target = dir.path().join("down.bin");
    let part = dir.path().join("down.bin.part");
    let args = ["download", "--json", id.as_str(), "-o", target.to_str().unwrap()];
    let mut first = ferry(&proxy.base, &cache, &args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_until("1 MiB in the .part file", || async { std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0) >= 1 << 20 }).await;
    kill9(&mut first);
    let kept = std::fs::metadata(&part).unwrap().len();
    assert!(kept < size as u64);
    assert!(!target.exists());
    proxy.down.open();

    let o = out_async(ferry(&proxy.base, &cache, &args)).await;
    let v = ok_json(&o);
    assert_eq!(v["resumed_from"], kept, "{v}");
    assert!(v["received"].as_u64().unwrap() < size as u64, "{v}");
    assert_eq!(v["received"].as_u64().unwrap() + kept, size as u64, "{v}");
    assert_eq!(v["sha256"], sha.as_str());
    assert_eq!(sha256_hex(&std::fs::read(&target).unwrap()), sha);
    assert!(!part.exists() && !dir.path().join("down.bin.part.json").exists());
}

/// A corrupted blob on the server: the download's sha256 differs from `Repr-Digest` → 4, and
/// the partial file is removed.
#[tokio::test]
async fn download_verification_failure_exits_4() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let data = pseudo_random(300_000, 6);
    let id = Api::new(&s).upload(&data, "c.bin").await;
    // Flip a byte of the stored blob behind the server's back.
    let blob = walk(&s.data.join("blobs")).into_iter().find(|p| p.file_name().unwrap().to_string_lossy().contains(&id)).expect("blob file");
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    let target = dir.path().join("c.bin");
    let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", target.to_str().unwrap()]));
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    assert!(stderr(&o).contains("sha256 mismatch"), "{}", stderr(&o));
    assert!(!target.exists() && !dir.path().join("c.bin.part").exists());
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (src, _) = source(dir.path(), "f.bin", 1000, 7);
    // Nobody listens on port 1: 5 at once (tests/cli_contact.rs checks more).
    let o = out(&mut ferry("http://127.0.0.1:1", &cache, &["upload", src.to_str().unwrap()]));
    assert_eq!(code(&o), 5, "{}", stderr(&o));
    assert!(stderr(&o).contains("cannot connect to") && stderr(&o).contains("hint: "), "{}", stderr(&o));
    let o = out(&mut ferry("http://127.0.0.1:1", &cache, &["download", "abc"]));
    assert_eq!(code(&o), 5, "{}", stderr(&o));
    // Usage: a bad --server, bad flags.
    assert_eq!(code(&out(&mut ferry("ftp://x", &cache, &["ls"]))), 2);
    assert_eq!(code(&out(&mut ferry("http://127.0.0.1:1", &cache, &["upload", "--parallel", "0", src.to_str().unwrap()]))), 2);
    assert_eq!(code(&out(&mut ferry("http://127.0.0.1:1", &cache, &["upload", "--meta", "novalue", src.to_str().unwrap()]))), 2);
    // A local file that does not exist: 3.
    let s = Server::start(&[]);
    let o = out(&mut ferry(&s.base, &cache, &["upload", dir.path().join("missing").to_str().unwrap()]));
    assert_eq!(code(&o), 3, "{}", stderr(&o));

    // Tokens: none → 6 with a hint; the right one works.
    let token = "fy_cli_transfer_token";
    let cfg = dir.path().join("ferry.toml");
    std::fs::write(&cfg, format!("[[tokens]]\nprincipal = \"cli\"\nsha256 = \"{}\"\n", sha256_hex(token.as_bytes()))).unwrap();
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let o = out(&mut ferry(&s.base, &cache, &["ls"]));
    assert_eq!(code(&o), 6, "{}", stderr(&o));
    assert!(stderr(&o).contains("hint: "), "{}", stderr(&o));
    let o = out(&mut ferry(&s.base, &cache, &["upload", "-q", src.to_str().unwrap()]));
    assert_eq!(code(&o), 6, "{}", stderr(&o));
    let o = out(ferry(&s.base, &cache, &["upload", "-q", src.to_str().unwrap()]).env("FERRY_TOKEN", token));
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    // The exit codes are documented in --help.
    let o = out(&mut ferry(&s.base, &cache, &["--help"]));
    for needle in [
        "Exit codes",
        "4  verification failed",
        "5  network",
        "6  authentication",
        "7  task start --wait, task get --wait, task respond --wait: the task failed",
    ] {
        assert!(stdout(&o).contains(needle), "--help lacks {needle:?}: {}", stdout(&o));
    }
}

/// `ferry share`: a signed download URL that works without the token, until it expires.
#[tokio::test]
async fn share_prints_a_signed_url() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let token = "fy_cli_share_token";
    let cfg = dir.path().join("ferry.toml");
    std::fs::write(&cfg, format!("[[tokens]]\nprincipal = \"cli\"\nsha256 = \"{}\"\n", sha256_hex(token.as_bytes()))).unwrap();
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let (src, sha) = source(dir.path(), "shared.bin", 200_000, 8);
    let v = ok_json(&out(ferry(&s.base, &cache, &["upload", "--json", "-q", src.to_str().unwrap()]).env("FERRY_TOKEN", token)));
    let id = v["id"].as_str().unwrap();
    let o = out(ferry(&s.base, &cache, &["share", id, "--ttl", "1h"]).env("FERRY_TOKEN", token));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let url = stdout(&o).trim().to_string();
    assert!(url.starts_with(&s.url(&format!("/files/{id}?"))), "{url}");
    // No token needed: plain GET, and `ferry download URL` with no token.
    assert_eq!(server_sha256(&url).await, sha);
    let target = dir.path().join("via-share.bin");
    let d = ok_json(&out(&mut ferry(&s.base, &cache, &["download", "--json", &url, "-o", target.to_str().unwrap()])));
    assert_eq!(d["sha256"], sha.as_str());
    // --json: the server's answer.
    let o = out(ferry(&s.base, &cache, &["share", id, "--ttl", "10m", "--json"]).env("FERRY_TOKEN", token));
    let j: Value = serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&o)));
    assert_eq!(j["scope"], "download");
    assert!(j["expires_at_ms"].as_u64().is_some(), "{j}");
    // Unknown file: 3.
    let o = out(ferry(&s.base, &cache, &["share", "nosuchfile", "--ttl", "1h"]).env("FERRY_TOKEN", token));
    assert_eq!(code(&o), 3, "{}", stderr(&o));
}

// ---------------------------------------------------------------------------------------------
// Regressions from a new user's first session.

/// The mode bits of `p` (following symlinks).
fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// `-o` naming something other than a missing path or a regular file: a character device or a
/// FIFO is written into (no `.part`, no rename, no `--force` needed), a symlink is followed,
/// a replaced regular file keeps its mode, and `-o DIR` writes the server's name inside DIR.
#[tokio::test]
async fn download_writes_through_devices_fifos_and_symlinks() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let data = pseudo_random(700_000, 20);
    let sha = sha256_hex(&data);
    let id = Api::new(&s).upload(&data, "dev.bin").await;

    // -o into a directory that does not exist: said at once (exit 2), nothing written.
    for (o_arg, says) in [("missing/", "is not an existing directory"), ("missing/x.bin", "the directory")] {
        let target = format!("{}/{o_arg}", dir.path().display());
        let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", &target]));
        assert_eq!(code(&o), 2, "{}", stderr(&o));
        assert!(stderr(&o).contains(says) && !stderr(&o).contains(".part"), "{}", stderr(&o));
        assert!(!dir.path().join("missing").exists());
    }

    // -o /dev/null: a verify-only download, without --force; /dev/null stays a device.
    let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", "/dev/null", "-q"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("/dev/null\t{sha}\n"));
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
    assert!(!Path::new("/dev/null.part").exists() && !Path::new("/dev/null.part.json").exists());
    // With --force, on a null device of our own (root only: mknod), so a regression can never
    // replace the real /dev/null.
    let null = dir.path().join("null");
    if Command::new("mknod").arg(&null).args(["c", "1", "3"]).status().is_ok_and(|st| st.success()) {
        let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", null.to_str().unwrap(), "--force", "-q"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        assert!(std::fs::metadata(&null).unwrap().file_type().is_char_device(), "the device was replaced");
    }

    // A FIFO: the bytes arrive at its reader; it is still a FIFO afterwards.
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(&fifo).unwrap())
    };
    let o = out_async(ferry(&s.base, &cache, &["download", &id, "-o", fifo.to_str().unwrap(), "-q"])).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(sha256_hex(&reader.join().unwrap()), sha);
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");

    // A symlink to a regular file (mode 600), with --force: the target is replaced, keeping its
    // mode; the link stays a link.
    let target = dir.path().join("real.bin");
    std::fs::write(&target, b"old").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = dir.path().join("link.bin");
    std::os::unix::fs::symlink("real.bin", &link).unwrap();
    let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", link.to_str().unwrap(), "-q"]));
    assert_eq!(code(&o), 2, "an existing target needs --force: {}", stderr(&o));
    let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", link.to_str().unwrap(), "--force", "-q"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the symlink was replaced");
    assert_eq!(sha256_hex(&std::fs::read(&target).unwrap()), sha);
    assert_eq!(mode(&target), 0o600);
    // A dangling symlink: its target is created.
    let dangling = dir.path().join("dangling.bin");
    std::os::unix::fs::symlink(dir.path().join("sub-target.bin"), &dangling).unwrap();
    let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", dangling.to_str().unwrap(), "-q"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(std::fs::symlink_metadata(&dangling).unwrap().file_type().is_symlink());
    assert_eq!(sha256_hex(&std::fs::read(dir.path().join("sub-target.bin")).unwrap()), sha);

    // A plain regular file (mode 640) replaced with --force keeps its mode.
    let plain = dir.path().join("plain.bin");
    std::fs::write(&plain, b"old").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o640)).unwrap();
    let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", plain.to_str().unwrap(), "--force", "-q"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!((sha256_hex(&std::fs::read(&plain).unwrap()), mode(&plain)), (sha.clone(), 0o640));

    // -o DIR: the server's file name inside it.
    let into = dir.path().join("into");
    std::fs::create_dir(&into).unwrap();
    let o = out(&mut ferry(&s.base, &cache, &["download", &id, "-o", into.to_str().unwrap(), "-q"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(sha256_hex(&std::fs::read(into.join("dev.bin")).unwrap()), sha);
}

/// `ferry ls --limit N` sends `?limit=N` as a query (it once went into the path: 404), and
/// the API's range 1..=1000 is checked locally.
#[tokio::test]
async fn ls_limit_is_a_query_parameter() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let api = Api::new(&s);
    for i in 0..3 {
        api.upload(&pseudo_random(1000, 30 + i), &format!("f{i}.bin")).await;
    }
    let l = ok_json(&out(&mut ferry(&s.base, &cache, &["ls", "--json", "--limit", "2"])));
    assert_eq!(l["files"].as_array().unwrap().len(), 2, "{l}");
    let o = out(&mut ferry(&s.base, &cache, &["ls", "--limit", "2"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 3, "header + 2 rows: {}", stdout(&o));
    assert!(stderr(&o).contains("--limit"), "a note that older files are not shown: {}", stderr(&o));
    let o = out(&mut ferry(&s.base, &cache, &["ls"]));
    assert_eq!(stdout(&o).lines().count(), 4, "{}", stdout(&o));
    assert!(!stderr(&o).contains("--limit"), "{}", stderr(&o));
    for bad in ["0", "1001"] {
        let o = out(&mut ferry(&s.base, &cache, &["ls", "--limit", bad]));
        assert_eq!(code(&o), 2, "--limit {bad}: {}", stderr(&o));
    }
    let o = out(&mut ferry(&s.base, &cache, &["ls", "--help"]));
    assert!(stdout(&o).contains("1000") && stdout(&o).contains("100"), "{}", stdout(&o));
}

/// A reader that closes stdout early (`ferry ls | head`): exit 0, no panic, no backtrace.
#[tokio::test]
async fn closed_stdout_is_a_quiet_exit() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let data = pseudo_random(3 << 20, 31);
    let id = Api::new(&s).upload(&data, "pipe.bin").await;
    let runs: [&[&str]; 6] = [&["ls"], &["ls", "--json"], &["status", &id], &["share", &id], &["download", &id, "-o", "-", "-q"], &["task", "list"]];
    for args in runs {
        let mut c = ferry(&s.base, &cache, args);
        c.stdout(Stdio::piped()).stderr(Stdio::piped()).env("RUST_BACKTRACE", "1");
        let mut child = c.spawn().unwrap();
        // Close the read end before the command has its answer to print.
        drop(child.stdout.take());
        let o = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked") && !stderr(&o).contains("Broken pipe"), "{args:?}: {}", stderr(&o));
    }
}

/// `ferry rm A nope B`: every id is tried, each failure reported, exit code of the first.
#[tokio::test]
async fn rm_tries_every_id() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let api = Api::new(&s);
    let a = api.upload(&pseudo_random(1000, 40), "a.bin").await;
    let b = api.upload(&pseudo_random(1000, 41), "b.bin").await;
    let o = out(&mut ferry(&s.base, &cache, &["rm", &a, "nope", "zzz", &b]));
    assert_eq!(code(&o), 3, "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("nope:") && err.contains("zzz:"), "every failure is reported: {err}");
    assert!(err.contains("DELETE /files/nope"), "{err}");
    for id in [&a, &b] {
        assert_eq!(api.get(&format!("/api/v1/files/{id}")).await.status(), 404, "{id} was not deleted: {err}");
    }
}

/// `--parallel`: once the final upload verifies, its partial uploads are deleted (they held a
/// second copy of the file), and `ferry rm FINAL` leaves nothing behind.
#[tokio::test]
async fn parallel_upload_deletes_its_parts() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (src, sha) = source(dir.path(), "parts.bin", 3 * 1024 * 1024 + 5, 50);
    let v = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "-q", "--parallel", "3", src.to_str().unwrap()])));
    assert_eq!(v["sha256"], sha.as_str());
    let url = v["url"].as_str().unwrap();
    let tus = Tus::new(&s);
    let concat = header(&tus.head(url).await, "upload-concat").unwrap().to_string();
    let parts: Vec<String> = concat.strip_prefix("final;").unwrap().split(' ').map(|p| tus.abs(p)).collect();
    assert_eq!(parts.len(), 3);
    for p in &parts {
        assert_eq!(tus.head(p).await.status(), 404, "part {p} is still there");
    }
    let l = ok_json(&out(&mut ferry(&s.base, &cache, &["ls", "--json"])));
    assert_eq!(l["files"].as_array().unwrap().len(), 1, "{l}");
    assert_eq!(server_sha256(url).await, sha);
    // Re-run: verified from the remembered final upload, nothing sent.
    let again = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "-q", "--parallel", "3", src.to_str().unwrap()])));
    assert_eq!((again["url"].as_str(), again["sent"].as_u64()), (Some(url), Some(0)));
    let o = out(&mut ferry(&s.base, &cache, &["rm", url]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let l = ok_json(&out(&mut ferry(&s.base, &cache, &["ls", "--json"])));
    assert_eq!(l["files"].as_array().unwrap().len(), 0, "{l}");
}

/// A wrong `--meta sha256=` fails with exit 4 once, and the next run starts a new upload
/// (the rejected one is forgotten and deleted); other `--meta` starts a new upload too.
#[tokio::test]
async fn wrong_declared_sha256_is_not_resumed_forever() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (src, sha) = source(dir.path(), "decl.bin", 2 * 1024 * 1024 + 1, 60);
    let wrong = format!("sha256={}", "0".repeat(64));
    for parallel in ["1", "3"] {
        let o = out(&mut ferry(&s.base, &cache, &["upload", "-q", "--fresh", "--parallel", parallel, "--meta", &wrong, src.to_str().unwrap()]));
        assert_eq!(code(&o), 4, "--parallel {parallel}: {}", stderr(&o));
        assert!(stderr(&o).contains("sha256"), "{}", stderr(&o));
        let v = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "-q", "--parallel", parallel, src.to_str().unwrap()])));
        assert_eq!(v["sha256"], sha.as_str());
        assert_eq!(server_sha256(v["url"].as_str().unwrap()).await, sha);
    }
    let o = out(&mut ferry(&s.base, &cache, &["upload", "-q", "--fresh", "--meta", &wrong, src.to_str().unwrap()]));
    assert!(stderr(&o).contains("next run starts a new upload"), "{}", stderr(&o));
    // The rejected single upload is gone from the server: only the two good ones are listed.
    let l = ok_json(&out(&mut ferry(&s.base, &cache, &["ls", "--json"])));
    assert_eq!(l["files"].as_array().unwrap().len(), 2, "{l}");

    // Other --meta: a new upload carrying it, not the remembered one.
    let (src2, _) = source(dir.path(), "meta.bin", 10_000, 61);
    let a = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "-q", "--meta", "filename=one.bin", src2.to_str().unwrap()])));
    let b = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "-q", "--meta", "filename=two.bin", src2.to_str().unwrap()])));
    assert_ne!(a["url"], b["url"]);
    assert_eq!(b["resumed_from"], 0);
    let st = ok_json(&out(&mut ferry(&s.base, &cache, &["status", "--json", b["id"].as_str().unwrap()])));
    assert_eq!(st["name"], "two.bin");
    // No --meta: the upload of the name the server will hold (the file's own, meta.bin), not
    // one of another name; a second run resumes it.
    let c = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "-q", src2.to_str().unwrap()])));
    assert!(c["url"] != a["url"] && c["url"] != b["url"], "{c}");
    let st = ok_json(&out(&mut ferry(&s.base, &cache, &["status", "--json", c["id"].as_str().unwrap()])));
    assert_eq!(st["name"], "meta.bin");
    let again = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "-q", src2.to_str().unwrap()])));
    assert_eq!((&again["url"], &again["sent"]), (&c["url"], &Value::from(0)), "{again}");
}

/// The URL store is keyed by server and token: two principals uploading the same file keep
/// their own remembered uploads.
#[tokio::test]
async fn url_store_is_per_token() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cfg = dir.path().join("ferry.toml");
    let (t1, t2) = ("fy_cli_store_one", "fy_cli_store_two");
    std::fs::write(
        &cfg,
        format!(
            "[[tokens]]\nprincipal = \"one\"\nsha256 = \"{}\"\n[[tokens]]\nprincipal = \"two\"\nsha256 = \"{}\"\n",
            sha256_hex(t1.as_bytes()),
            sha256_hex(t2.as_bytes())
        ),
    )
    .unwrap();
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let (src, _) = source(dir.path(), "shared.bin", 100_000, 70);
    let up = |token: &str| out(ferry(&s.base, &cache, &["upload", "--json", "-q", src.to_str().unwrap()]).env("FERRY_TOKEN", token));
    let a = ok_json(&up(t1));
    let b = ok_json(&up(t2));
    assert_ne!(a["url"], b["url"]);
    assert_eq!(b["sent"], 100_000);
    let a2 = ok_json(&up(t1));
    let b2 = ok_json(&up(t2));
    assert_eq!((&a2["url"], &a2["sent"]), (&a["url"], &Value::from(0)), "{a2}");
    assert_eq!((&b2["url"], &b2["sent"]), (&b["url"], &Value::from(0)), "{b2}");
    // The store never holds a token.
    let store = std::fs::read_to_string(cache.join("uploads.json")).unwrap();
    assert!(!store.contains(t1) && !store.contains(t2), "{store}");
}

/// A file rewritten while it is being uploaded: exit 4, not success.
#[tokio::test]
async fn upload_of_a_file_that_changes_exits_4() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let size = 16 * 1024 * 1024;
    let (src, _) = source(dir.path(), "moving.bin", size, 80);
    let proxy = Proxy::start(s.addr(), 2 << 20, u64::MAX).await;
    let child = ferry(&proxy.base, &cache, &["upload", "-q", "--chunk-size", "1MiB", src.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("1 MiB at the server", || async { metric(&s, "ferry_bytes_received_total").await >= 1 << 20 }).await;
    // Same size, new bytes, a later mtime.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&src, pseudo_random(size, 81)).unwrap();
    proxy.up.open();
    let o = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("{} changed while it was being uploaded; re-run with --fresh", src.display())), "{}", stderr(&o));
}

/// Error messages name the request really sent; `--server` is optional in usage lines even
/// when FERRY_SERVER / FERRY_TOKEN are set, and its default is in --help.
#[tokio::test]
async fn messages_name_real_routes_and_server_is_optional() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let o = out(&mut ferry(&s.base, &cache, &["status", "nosuchfile"]));
    assert_eq!(code(&o), 3);
    assert!(stderr(&o).contains("GET /api/v1/files/nosuchfile:"), "{}", stderr(&o));
    let o = out(&mut ferry(&s.base, &cache, &["share", "nosuchfile"]));
    assert_eq!(code(&o), 3);
    assert!(stderr(&o).contains("POST /api/v1/files/nosuchfile/share:"), "{}", stderr(&o));
    for cmd in ["upload", "rm", "download"] {
        let o = out(ferry(&s.base, &cache, &[cmd]).env("FERRY_TOKEN", "x"));
        assert_eq!(code(&o), 2);
        let usage = stderr(&o).lines().find(|l| l.starts_with("Usage:")).unwrap_or_default().to_string();
        assert!(usage.starts_with(&format!("Usage: ferry {cmd} <")), "{usage}\n{}", stderr(&o));
        let o = out(&mut ferry(&s.base, &cache, &[cmd, "--help"]));
        assert!(stdout(&o).contains("[default: http://127.0.0.1:8080]") && stdout(&o).contains("FERRY_SERVER"), "{}", stdout(&o));
    }
    // --server beats FERRY_SERVER; FERRY_SERVER is used without it.
    let o = out(ferry("http://127.0.0.1:1", &cache, &["ls", "--server", &s.base]).arg("--retry-for").arg("1s"));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// Issue 23 kind 17: Ctrl-C (SIGINT) during `ferry upload` or `ferry download` says it was
/// interrupted and how to continue, and exits 130; the same command then resumes.
#[tokio::test]
async fn ctrl_c_says_how_to_resume() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let size = 32 * 1024 * 1024 + 3;
    let (src, sha) = source(dir.path(), "interrupted.bin", size, 30);
    let interrupt = |child: std::process::Child| async move {
        let pid = child.id().to_string();
        assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
        tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap()
    };

    let proxy = Proxy::start(s.addr(), 4 << 20, u64::MAX).await;
    let args = ["upload", "--json", src.to_str().unwrap()];
    let first = ferry(&proxy.base, &cache, &args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_until("1 MiB at the server", || async { metric(&s, "ferry_bytes_received_total").await >= 1 << 20 }).await;
    let o = interrupt(first).await;
    assert_eq!(code(&o), 130, "{}", stderr(&o));
    assert!(stderr(&o).contains("ferry: interrupted (Ctrl-C)") && stderr(&o).contains("run the same command again"), "{}", stderr(&o));
    proxy.up.open();
    let v = ok_json(&out_async(ferry(&proxy.base, &cache, &args)).await);
    assert_eq!(v["sha256"], sha.as_str());
    assert!(v["resumed_from"].as_u64().unwrap() > 0, "{v}");

    let down = Proxy::start(s.addr(), u64::MAX, 4 << 20).await;
    let target = dir.path().join("copy.bin");
    let part = dir.path().join("copy.bin.part");
    let id = v["id"].as_str().unwrap();
    let args = ["download", "--json", id, "-o", target.to_str().unwrap()];
    let first = ferry(&down.base, &cache, &args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_until("1 MiB in the .part file", || async { std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0) >= 1 << 20 }).await;
    let o = interrupt(first).await;
    assert_eq!(code(&o), 130, "{}", stderr(&o));
    assert!(stderr(&o).contains("ferry: interrupted (Ctrl-C)") && stderr(&o).contains("run the same command again"), "{}", stderr(&o));
    down.down.open();
    let o = out_async(ferry(&down.base, &cache, &args)).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(sha256_hex(&std::fs::read(&target).unwrap()), sha);
}

/// Issue 23 kinds 12 and 17 in the CLI's words: `ferry request` (JSON with the id, a too long
/// `--ttl` refused before anything is made), `share` of an unfinished upload says so, hints
/// name CLI commands rather than HTTP requests, and `token create` ends its line saying where
/// the token is.
#[tokio::test]
async fn cli_messages_speak_cli() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let token = "fy_cli_words_token";
    let cfg = dir.path().join("ferry.toml");
    std::fs::write(&cfg, format!("[[tokens]]\nprincipal = \"cli\"\nsha256 = \"{}\"\n", sha256_hex(token.as_bytes()))).unwrap();
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let with_token = |args: &[&str]| {
        let mut c = ferry(&s.base, &cache, args);
        c.env("FERRY_TOKEN", token);
        c
    };

    let v = ok_json(&out(&mut with_token(&["request", "report.pdf", "--json"])));
    let id = v["id"].as_str().unwrap();
    assert!(v["page_url"].as_str().unwrap().contains(&format!("/share/{id}?scope=upload")), "{v}");
    assert_eq!(v["scope"], "upload", "{v}");
    let f = Api::with_token(&s, token).file(id).await;
    assert!(f["size"].is_null() && f["name"] == "report.pdf", "{f}");
    assert_eq!(f["media_type"], "application/pdf", "guessed from the name, as `ferry upload` does: {f}");
    let before = Api::with_token(&s, token).get("/api/v1/files").await.json::<Value>().await.unwrap()["files"].as_array().unwrap().len();
    let o = out(&mut with_token(&["request", "x.bin", "--ttl", "8d"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let after = Api::with_token(&s, token).get("/api/v1/files").await.json::<Value>().await.unwrap()["files"].as_array().unwrap().len();
    assert_eq!(before, after, "a refused request made nothing");

    // A download link of an unfinished upload: the CLI says so.
    let o = out(&mut with_token(&["share", id]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("not complete yet") && stderr(&o).contains("--scope upload"), "{}", stderr(&o));

    // Hints in the CLI's words.
    let o = out(&mut ferry(&s.base, &cache, &["ls"]));
    assert_eq!(code(&o), 6);
    assert!(stderr(&o).contains("hint: Pass a token with --token or FERRY_TOKEN") && !stderr(&o).contains("Authorization"), "{}", stderr(&o));
    let o = out(&mut with_token(&["rm", "nosuchfileid"]));
    assert_eq!(code(&o), 3);
    assert!(stderr(&o).contains("`ferry ls`") && !stderr(&o).contains("POST to the upload collection"), "{}", stderr(&o));
    let o = out(&mut with_token(&["task", "start", "compress", "--args", r#"{"file_id":"nosuchfileid","format":"zstd"}"#]));
    assert_eq!(code(&o), 3, "{}", stderr(&o));
    assert!(stderr(&o).contains("`ferry ls`") && !stderr(&o).contains("GET /api/v1/files"), "{}", stderr(&o));

    let o = Command::new(ferry_bin()).args(["token", "create", "bob", "--config"]).arg(dir.path().join("t.toml")).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.trim_end().ends_with(':') && err.contains("kill -HUP") && err.contains("stdout"), "{err}");
}

/// Every ferry link means the same file to every command: a file id, the file URL, the signed
/// link and the page link (`/share/…`, the `page_url` of `ferry share` and MCP) all download
/// the file itself, verified (the page link used to save the 2 KiB HTML page as the file and
/// exit 0 with a warning), and `status` takes each too. A URL that declares no sha256 fails
/// with exit 4 and writes nothing, unless `--no-verify`.
#[tokio::test]
async fn every_ferry_link_downloads_the_same_verified_file() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let s = Server::start(&[]);
    let (src, sha) = source(dir.path(), "linked.bin", 300_000, 10);
    let v = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "-q", src.to_str().unwrap()])));
    let id = v["id"].as_str().unwrap().to_string();
    let shared: Value = serde_json::from_str(&stdout(&out(&mut ferry(&s.base, &cache, &["share", &id, "--ttl", "1h", "--json"])))).unwrap();
    let (signed, page) = (shared["url"].as_str().unwrap().to_string(), shared["page_url"].as_str().expect("a page link").to_string());
    assert!(page.contains("/share/"), "{page}");
    let links = [id.clone(), s.url(&format!("/files/{id}")), signed, page];
    for (i, link) in links.iter().enumerate() {
        let target = dir.path().join(format!("copy-{i}.bin"));
        let d = ok_json(&out(&mut ferry(&s.base, &cache, &["download", "--json", "-q", link, "-o", target.to_str().unwrap()])));
        assert_eq!(d["sha256"], sha.as_str(), "{link}");
        assert_eq!(sha256_hex(&std::fs::read(&target).unwrap()), sha, "the file itself from {link}");
        let st = out(&mut ferry(&s.base, &cache, &["status", "--json", link]));
        assert_eq!(code(&st), 0, "status {link}: {}", stderr(&st));
        assert!(stdout(&st).contains(&id), "status {link}: {}", stdout(&st));
    }
    // Bytes that cannot be checked: exit 4, nothing written; --no-verify keeps them.
    let page = s.url("/");
    let target = dir.path().join("unverifiable.html");
    let o = out(&mut ferry(&s.base, &cache, &["download", "-q", &page, "-o", target.to_str().unwrap()]));
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    assert!(stderr(&o).contains("--no-verify"), "{}", stderr(&o));
    assert!(!target.exists() && !dir.path().join("unverifiable.html.part").exists(), "nothing written");
    let o = out(&mut ferry(&s.base, &cache, &["download", "-q", "--no-verify", &page, "-o", target.to_str().unwrap()]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(target.exists());
}
