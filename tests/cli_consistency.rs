//! What the CLI keys, says and exits with agrees with what the server holds (issue 48, kinds 6
//! and 12), each by kind: a remembered upload is the upload of one name and one content (two
//! symlinks to one file are two files on the server); a damaged file is damaged in `ls`,
//! `status` and `download` alike (exit 4, as a failed verify); an upload-only token's signed
//! upload URL is not printed as a link to share.

mod common;
use common::cli::*;
use common::*;

use serde_json::Value;

/// The file list as the API gives it.
async fn files(s: &Server) -> Vec<Value> {
    let v: Value = client().get(s.url("/api/v1/files")).send().await.unwrap().json().await.unwrap();
    v["files"].as_array().unwrap().clone()
}

/// Two names for one file's content — symlinks, a hard link, `--name`, `--meta filename=` —
/// are each an upload of their own: the second never "resumes" the first's finished upload.
/// The same name and content again is the same upload (verified, nothing sent).
#[tokio::test]
async fn each_name_of_one_content_is_its_own_upload() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (target, sha) = source(dir.path(), "disk.img", 300_000, 5);
    let (a, b, hard) = (dir.path().join("a.iso"), dir.path().join("b.iso"), dir.path().join("c.iso"));
    std::os::unix::fs::symlink(&target, &a).unwrap();
    std::os::unix::fs::symlink(&target, &b).unwrap();
    std::fs::hard_link(&target, &hard).unwrap();
    let up = |args: &[&str]| ok_json(&out(ferry(&s.base, &cache, &["upload", "--json"]).args(args)));

    let first = up(&[a.to_str().unwrap()]);
    let mut urls = vec![first["url"].as_str().unwrap().to_string()];
    for args in [
        vec![b.to_str().unwrap()],
        vec![hard.to_str().unwrap()],
        vec!["--name", "renamed.iso", a.to_str().unwrap()],
        vec!["--meta", "filename=meta.iso", a.to_str().unwrap()],
    ] {
        let v = up(&args);
        assert_eq!(v["resumed_from"], 0, "{args:?} is a new upload: {v}");
        assert_eq!(v["sha256"], sha.as_str());
        let url = v["url"].as_str().unwrap().to_string();
        assert!(!urls.contains(&url), "{args:?} got an earlier upload's URL {url}");
        urls.push(url);
    }
    let mut names: Vec<String> = files(&s).await.iter().map(|f| f["name"].as_str().unwrap().to_string()).collect();
    names.sort();
    assert_eq!(names, ["a.iso", "b.iso", "c.iso", "meta.iso", "renamed.iso"]);

    // The same name and content again: the same upload, verified, nothing sent.
    let again = up(&[b.to_str().unwrap()]);
    assert_eq!(
        (again["url"].as_str().unwrap(), &again["sent"], &again["resumed_from"]),
        (urls[1].as_str(), &Value::from(0), &Value::from(300_000)),
        "{again}"
    );
    assert_eq!(files(&s).await.len(), 5, "no sixth upload");
}

/// A damaged file is damaged everywhere the CLI looks (issue 48 kind 6): `ferry ls` and
/// `ferry status` say so, whether `ferry check --repair-catalog` found it (the `check` task
/// here) or a download found its bytes gone; `ferry download` exits 4 as a failed verify does;
/// `ferry share` warns; and `ferry upload` of the same file sends it again instead of
/// "verifying" the sha256 the server recorded for bytes it no longer has.
#[tokio::test]
async fn a_damaged_file_is_damaged_in_every_command() {
    if blobs_are_s3() {
        return; // the bytes are damaged under DATA/blobs
    }
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let run = |args: &[&str]| out(ferry(&s.base, &cache, args).current_dir(dir.path()));
    let mut ids = Vec::new();
    for (name, seed) in [("flipped.bin", 1), ("lost.bin", 2), ("read.bin", 3)] {
        let (p, _) = source(dir.path(), name, 200_000, seed);
        let v = ok_json(&run(&["upload", "--json", p.to_str().unwrap()]));
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    let blob = |id: &str| s.data.join("blobs").join(&id[..2]).join(id);
    let mut bytes = std::fs::read(blob(&ids[0])).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(blob(&ids[0]), bytes).unwrap();
    std::fs::remove_file(blob(&ids[1])).unwrap();
    let api = Api::new(&s);
    let t = api.start("check", r#"{"repair_catalog": true}"#).await;
    api.wait_status(t["id"].as_str().unwrap(), "completed", 60).await;
    // Found by a read, not by a check.
    std::fs::remove_file(blob(&ids[2])).unwrap();

    for (id, words) in [(&ids[0], "no longer match its sha256"), (&ids[1], "are missing"), (&ids[2], "are missing")] {
        let o = run(&["download", id, "-o", dir.path().join(format!("{id}.out")).to_str().unwrap()]);
        assert_eq!(code(&o), 4, "a damaged file exits as a failed verify: {}", stderr(&o));
        assert!(stderr(&o).contains("damaged"), "{}", stderr(&o));
        let o = run(&["status", id]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let state = stdout(&o).lines().find(|l| l.starts_with("state")).unwrap().to_string();
        assert!(state.contains("damaged") && state.contains(words) && !state.contains("complete"), "{state}");
        let o = run(&["share", id]);
        assert!(stderr(&o).contains("damaged"), "{}", stderr(&o));
    }
    let o = run(&["ls"]);
    let listed = stdout(&o);
    for id in &ids {
        let row = listed.lines().find(|l| l.starts_with(id.as_str())).unwrap_or_else(|| panic!("{id} not listed: {listed}"));
        assert!(row.contains("damaged") && !row.contains("complete"), "{row}");
    }
    let v: Value = serde_json::from_str(&stdout(&run(&["ls", "--json"]))).unwrap();
    assert!(v["files"].as_array().unwrap().iter().all(|f| f["damaged"]["kind"].is_string()), "{v}");

    // Uploading the same file again sends it again: a new, whole upload.
    let again = ok_json(&run(&["upload", "--json", dir.path().join("lost.bin").to_str().unwrap()]));
    assert_ne!(again["id"].as_str().unwrap(), ids[1]);
    assert_eq!(again["sent"], 200_000, "{again}");
    let o = run(&["download", again["id"].as_str().unwrap(), "-o", dir.path().join("lost.out").to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(std::fs::read(dir.path().join("lost.out")).unwrap(), std::fs::read(dir.path().join("lost.bin")).unwrap());
}

/// `ferry token create PRINCIPAL ARGS…` in `cfg`: the token.
fn token(cfg: &std::path::Path, principal: &str, extra: &[&str]) -> String {
    let o =
        std::process::Command::new(ferry_bin()).args(["token", "create", principal, "--config", cfg.to_str().unwrap()]).args(extra).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// Issue 48 kind 12: an upload sent through a signed upload URL — an upload-only token's
/// creation, or `--url` of a request link — prints the file's plain URL, never the signed
/// one as if it were a link to share; stderr says what the signed one is and that the owner
/// makes a share link with `ferry share ID`, which then works.
#[tokio::test]
async fn a_signed_upload_url_is_not_printed_as_a_link_to_share() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ferry.toml");
    std::fs::write(&cfg, "").unwrap();
    let full = token(&cfg, "shop", &[]);
    let upload_only = token(&cfg, "shop", &["--scope", "upload", "--ttl", "1h"]);
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let cache = dir.path().join("cache");
    let (src, sha) = source(dir.path(), "order.pdf", 90_000, 8);
    let with = |t: &str, args: &[&str]| out(ferry(&s.base, &cache, args).env("FERRY_TOKEN", t));

    let o = with(&upload_only, &["upload", src.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let line = stdout(&o);
    let (url, printed) = line.trim_end().split_once('\t').unwrap();
    assert_eq!(printed, sha);
    assert!(!url.contains('?') && url.starts_with(&s.url("/files/")), "the plain file URL, no signature: {url}");
    let id = url.rsplit('/').next().unwrap();
    assert!(stderr(&o).contains("no link to share") && stderr(&o).contains(&format!("ferry share {id}")), "{}", stderr(&o));
    let v = ok_json(&with(&upload_only, &["upload", "--json", "--fresh", src.to_str().unwrap()]));
    assert!(!v["url"].as_str().unwrap().contains("sig=") && v["upload_url"].as_str().unwrap().contains("sig="), "{v}");

    // The owner's share link downloads it.
    let link = stdout(&with(&full, &["share", id]));
    let r = client().get(link.trim()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(sha256_hex(&r.bytes().await.unwrap()), sha);

    // The person a request link was sent to: the same words.
    let page = stdout(&with(&full, &["request", "scan.pdf"]));
    let o = out(&mut ferry(&s.base, &cache, &["upload", "--url", page.trim(), src.to_str().unwrap()]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(!stdout(&o).contains("sig="), "{}", stdout(&o));
    assert!(stderr(&o).contains("no link to share"), "{}", stderr(&o));
    // A full token's upload prints its URL as before, without a note.
    let o = with(&full, &["upload", "--name", "mine.pdf", src.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(!stderr(&o).contains("no link to share"), "{}", stderr(&o));
}
