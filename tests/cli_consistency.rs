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
    assert_eq!((again["url"].as_str().unwrap(), &again["sent"], &again["resumed_from"]), (urls[1].as_str(), &Value::from(0), &Value::from(300_000)), "{again}");
    assert_eq!(files(&s).await.len(), 5, "no sixth upload");
}
