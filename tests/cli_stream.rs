//! `ferry upload -` (issue 13 item 7) and `ferry upload --url` (item 8) against the real server:
//! a real program's output piped in (`head -c … /dev/urandom | tee`), deferred length, the
//! sha256 checked against what the program wrote; `/dev/stdin` and a FIFO; the media type
//! guessed from `--name`; an upload link (signed, no token) filled by the CLI and resumed after
//! the CLI is killed; and a pipe continued with `--url` after the CLI is killed mid-pipe.

mod common;
use common::cli::*;
use common::*;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

/// `bash -c SCRIPT` with `ferry` as `$FERRY_BIN`, the server and cache set as for [`ferry`].
fn shell(server: &str, cache: &std::path::Path, script: &str) -> Command {
    let mut c = loopback_command("bash");
    c.arg("-c")
        .arg(format!("set -euo pipefail\n{script}"))
        .env("FERRY_BIN", ferry_bin())
        .env("FERRY_SERVER", server)
        .env("FERRY_CACHE_DIR", cache)
        .env_remove("FERRY_TOKEN");
    c
}

#[tokio::test]
async fn stdin_from_a_real_program() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let copy = dir.path().join("what-head-wrote");
    // 50 MiB from /dev/urandom through tee: the CLI's sha256 must be that of what tee saw, in
    // 4 MiB pieces (13 PATCHes, the length declared with the last).
    let o = out(&mut shell(
        &s.base,
        &cache,
        &format!("head -c 50M /dev/urandom | tee '{}' | \"$FERRY_BIN\" upload - --name db.sql --chunk-size 4MiB --json", copy.display()),
    ));
    let v = ok_json(&o);
    let want = sha256_hex(&std::fs::read(&copy).unwrap());
    assert_eq!(v["sha256"], want.as_str());
    assert_eq!(v["size"], 50 << 20);
    assert_eq!(v["file"], "-");
    assert_eq!(server_sha256(v["url"].as_str().unwrap()).await, want);
    assert!(stderr(&o).contains("length unknown until the input ends"), "{}", stderr(&o));
    let st = ok_json(&out(&mut ferry(&s.base, &cache, &["status", "--json", v["id"].as_str().unwrap()])));
    assert_eq!((st["name"].as_str(), st["complete"].as_bool(), st["size"].as_u64()), (Some("db.sql"), Some(true), Some(50 << 20)));
    assert_eq!(st["media_type"], "application/x-sql", "guessed from --name (mime_guess)");

    // Lengths around the piece size: empty, smaller, exactly two pieces, one byte more.
    for len in [0usize, 1000, 2 << 20, (2 << 20) + 1] {
        let data = pseudo_random(len, len as u64 + 1);
        let mut child = ferry(&s.base, &cache, &["upload", "-", "--chunk-size", "1MiB", "--json", "-q"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let feed = std::thread::spawn(move || stdin.write_all(&data).unwrap());
        let o = child.wait_with_output().unwrap();
        feed.join().unwrap();
        let v = ok_json(&o);
        assert_eq!(v["size"], len, "{v}");
        assert_eq!(v["sha256"], sha256_hex(&pseudo_random(len, len as u64 + 1)).as_str(), "{len}: {v}");
        assert_eq!(server_sha256(v["url"].as_str().unwrap()).await, v["sha256"].as_str().unwrap());
    }

    // /dev/stdin, and a FIFO named as FILE: read the same way; named after the path.
    let o = out(&mut shell(&s.base, &cache, "printf 'hello, pipe\\n' | \"$FERRY_BIN\" upload /dev/stdin --json -q"));
    let v = ok_json(&o);
    assert_eq!(v["sha256"], sha256_hex(b"hello, pipe\n").as_str());
    let fifo = dir.path().join("notes.txt");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(fifo, b"from a fifo\n").unwrap())
    };
    let v = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", fifo.to_str().unwrap(), "--json", "-q"])));
    writer.join().unwrap();
    assert_eq!(v["sha256"], sha256_hex(b"from a fifo\n").as_str());
    let st = ok_json(&out(&mut ferry(&s.base, &cache, &["status", "--json", v["id"].as_str().unwrap()])));
    assert_eq!((st["name"].as_str(), st["media_type"].as_str()), (Some("notes.txt"), Some("text/plain")));
    assert_eq!(st["metadata"]["filetype"], "text/plain");

    // Usage errors: a pipe cannot be split for --parallel; a directory is no file.
    let o = out(ferry(&s.base, &cache, &["upload", "-", "--parallel", "2"]).stdin(Stdio::null()));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let o = out(&mut ferry(&s.base, &cache, &["upload", dir.path().to_str().unwrap()]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}

/// Spawn `args` with stderr read line by line on a thread; returns the child and the lines.
fn spawn_with_stderr(mut c: Command) -> (std::process::Child, StderrLines) {
    let mut child = c.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let lines = StderrLines::take(&mut child);
    (child, lines)
}

/// Item 7, "what happens when the CLI dies mid-pipe": the server keeps what it acknowledged;
/// the URL the CLI printed first continues it with the producer run again, sending only the
/// rest, and the final sha256 proves the producer wrote the same bytes. A producer that
/// writes other bytes is caught (exit 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipe_continued_with_url_after_the_cli_is_killed() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let size = 24 << 20;
    let (src, _) = source(dir.path(), "dump.sql", size, 9);
    let (url, _proxy) = pipe_killed_midway(&s, &cache, &src, &["--name", "dump.sql"]).await;

    // Another producer's bytes: the prefix does not match, exit 4 (nothing is spliced).
    let (other, _) = source(dir.path(), "other.sql", size, 10);
    let o = out(ferry(&s.base, &cache, &["upload", "-", "--url", &url, "--json", "-q"]).stdin(std::fs::File::open(&other).unwrap()));
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    assert!(stderr(&o).contains("sha256 mismatch"), "{}", stderr(&o));
}

/// `ferry upload - --chunk-size 1MiB EXTRA` fed from `src` through a proxy that lets 6 MiB reach
/// the server and then holds the rest; the CLI is killed (-9) once 2 MiB arrived. Returns the
/// upload URL the CLI named, and the proxy (opened again).
async fn pipe_killed_midway(s: &Server, cache: &Path, src: &Path, extra: &[&str]) -> (String, Proxy) {
    let proxy = Proxy::start(s.addr(), 6 << 20, u64::MAX).await;
    let mut args = vec!["upload", "-", "--chunk-size", "1MiB"];
    args.extend_from_slice(extra);
    let mut c = ferry(&proxy.base, cache, &args);
    c.stdin(std::fs::File::open(src).unwrap());
    let (mut first, lines) = spawn_with_stderr(c);
    let url = tokio::task::block_in_place(|| loop {
        let l = lines.next().expect("the CLI names its upload");
        if let Some(rest) = l.split("uploading into ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    });
    wait_bytes_received(s, 2 << 20).await;
    kill9(&mut first);
    proxy.up.open();
    (url, proxy)
}

/// The same producer again: continued, only the rest sent, verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipe_resumes_with_the_same_producer() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let size = 24 << 20;
    let (src, sha) = source(dir.path(), "dump.sql", size, 11);
    let (url, _proxy) = pipe_killed_midway(&s, &cache, &src, &[]).await;
    let o = out(ferry(&s.base, &cache, &["upload", "-", "--url", &url, "--json"]).stdin(std::fs::File::open(&src).unwrap()));
    let v: Value = ok_json(&o);
    let resumed = v["resumed_from"].as_u64().unwrap();
    assert!(resumed >= 1 << 20, "the server kept what it acknowledged: {v}\n{}", stderr(&o));
    assert_eq!(v["sent"].as_u64().unwrap(), size as u64 - resumed, "only the rest was sent: {v}");
    assert_eq!(v["sha256"], sha.as_str());
    assert_eq!(server_sha256(&url).await, sha);
    assert!(stderr(&o).contains("reading them from the input again"), "{}", stderr(&o));
}

/// Item 8: an upload link (`ferry share ID --scope upload`, here on a server with tokens)
/// filled with `ferry upload --url` and no token; killed midway, the same command continues
/// from the server's offset. The `/share/` page link works too, and a file of another size is
/// refused before anything is sent.
#[tokio::test]
async fn upload_link_filled_and_resumed_without_a_token() {
    let token = "fy_cli_stream_token";
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ferry.toml");
    std::fs::write(&cfg, format!("[[tokens]]\nprincipal = \"owner\"\nsha256 = \"{}\"\n", sha256_hex(token.as_bytes()))).unwrap();
    let s = Server::start(&["--config", cfg.to_str().unwrap()]);
    let cache = dir.path().join("cache");
    let size = 40 << 20;
    let (src, sha) = source(dir.path(), "asked-for.bin", size, 12);
    // The owner creates the upload and an upload link for it.
    let owner = Api::with_token(&s, token);
    let r = owner.send("POST", "/files/", &[("tus-resumable", "1.0.0"), ("upload-length", &size.to_string())], None).await;
    assert_eq!(r.status(), 201);
    let id = r.headers()["location"].to_str().unwrap().rsplit('/').next().unwrap().to_string();
    let share = json(owner.post(&format!("/api/v1/files/{id}/share"), r#"{"scope":"upload","ttl_ms":3600000}"#).await).await;
    let abs = |u: &str| if u.starts_with("http") { u.to_string() } else { format!("{}{u}", s.base) };
    let link = abs(share["url"].as_str().unwrap());

    // A file of another size: refused, nothing sent.
    let (wrong, _) = source(dir.path(), "wrong.bin", 1000, 13);
    let o = out(&mut ferry(&s.base, &cache, &["upload", "--url", &link, wrong.to_str().unwrap()]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("expects {size} bytes")), "{}", stderr(&o));

    // Through a proxy that lets 8 MiB pass; killed once the server has some of it.
    let proxy = Proxy::start(s.addr(), 8 << 20, u64::MAX).await;
    let plink = link.replace(&s.base, &proxy.base);
    let mut first =
        ferry(&proxy.base, &cache, &["upload", "--url", &plink, src.to_str().unwrap()]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_bytes_received(&s, 1 << 20).await;
    kill9(&mut first);
    proxy.up.open();
    // The page link of the same upload (as a person would copy it): the same upload.
    let page = abs(share["page_url"].as_str().expect("page_url")).replace(&s.base, &proxy.base);
    // (On a blocking thread: the proxy runs on this test's runtime.)
    let o = out_async(ferry(&proxy.base, &cache, &["upload", "--url", &page, "--json", src.to_str().unwrap()])).await;
    let v = ok_json(&o);
    let resumed = v["resumed_from"].as_u64().unwrap();
    assert!(resumed > 0, "continued from the server's offset: {v}\n{}", stderr(&o));
    assert_eq!(resumed + v["sent"].as_u64().unwrap(), size as u64, "{v}");
    assert_eq!((v["id"].as_str(), v["sha256"].as_str()), (Some(id.as_str()), Some(sha.as_str())));
    assert_eq!(sha256_hex(&owner.download(&id).await), sha);
    // Again: finished, verified, nothing sent.
    let v = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--url", &link, "--json", "-q", src.to_str().unwrap()])));
    assert_eq!(v["sent"], 0);
    // --url with options that would change the upload is a usage error.
    let o = out(&mut ferry(&s.base, &cache, &["upload", "--url", &link, "--meta", "a=b", src.to_str().unwrap()]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}

/// Retries stay for failures after the transfer started: the connection of a pipe upload is
/// dropped in the middle of a PATCH (a byte-budget proxy holds the request halfway, a proxy in
/// front of it is cut); the CLI retries, asks the server's offset, sends the rest of the piece
/// it holds in memory, and the result verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipe_survives_a_dropped_connection() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // CLI → cuttable proxy → proxy that lets 2.5 MiB through → server.
    let gate = Proxy::start(s.addr(), (5 << 20) / 2, u64::MAX).await;
    let mut front = proxy::TcpProxy::start(gate.base.trim_start_matches("http://").parse().unwrap()).await;
    let data = pseudo_random(6 << 20, 21);
    let mut child = ferry(&front.http_url(), &cache, &["upload", "-", "--chunk-size", "1MiB", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = data.clone();
    let feed = std::thread::spawn(move || stdin.write_all(&input).unwrap());
    // The third PATCH (bytes 2 to 3 MiB) is under way, and held at about 2.5 MiB.
    wait_bytes_received(&s, (9 << 20) / 4).await;
    front.cut().await;
    gate.up.open();
    front.restore().await;
    let o = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    feed.join().unwrap();
    let v = ok_json(&o);
    assert!(stderr(&o).contains("(retry 1 in"), "the dropped connection was retried: {}", stderr(&o));
    assert_eq!((v["size"].as_u64(), v["sha256"].as_str()), (Some(6 << 20), Some(sha256_hex(&data).as_str())), "{v}");
    assert_eq!(server_sha256(&s.url(&format!("/files/{}", v["id"].as_str().unwrap()))).await, sha256_hex(&data));
}

/// An upload created without a length (TUS `Upload-Defer-Length`, or MCP `file_upload_begin`
/// without `size`), filled through its upload link: the CLI declares the length, from a file
/// and from a pipe alike.
#[tokio::test]
async fn upload_link_of_unknown_length() {
    let s = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let link = |s: &Server| {
        let (tus, api) = (Tus::new(s), Api::new(s));
        async move {
            let r = tus.post(&[("Upload-Defer-Length", "1")]).await;
            assert_eq!(r.status(), 201);
            let id = r.headers()["location"].to_str().unwrap().rsplit('/').next().unwrap().to_string();
            let share = json(api.post(&format!("/api/v1/files/{id}/share"), r#"{"scope":"upload"}"#).await).await;
            let url = share["url"].as_str().unwrap().to_string();
            if url.starts_with("http") {
                url
            } else {
                format!("{}{url}", tus.base)
            }
        }
    };
    let (src, sha) = source(dir.path(), "late.bin", 3_000_000, 14);
    let u = link(&s).await;
    let v = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--url", &u, "--json", "-q", src.to_str().unwrap()])));
    assert_eq!((v["size"].as_u64(), v["sha256"].as_str()), (Some(3_000_000), Some(sha.as_str())), "{v}");
    let u = link(&s).await;
    let v = ok_json(&out(
        ferry(&s.base, &cache, &["upload", "-", "--url", &u, "--chunk-size", "1MiB", "--json", "-q"]).stdin(std::fs::File::open(&src).unwrap())
    ));
    assert_eq!((v["size"].as_u64(), v["sha256"].as_str()), (Some(3_000_000), Some(sha.as_str())), "{v}");
    assert_eq!(server_sha256(u.split('?').next().unwrap()).await, sha);
}
