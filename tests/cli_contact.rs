//! The CLI's first contact with a server (issue 13 items 9-11): every command fails at once,
//! saying why, when nothing listens (exit 5) or when what answers is not ferry — Python's
//! `http.server`, which answers `501` with an HTML page (exit 2); `--parallel` (and any upload)
//! checks `Tus-Max-Size` before sending a byte and leaves nothing behind; and the exit codes
//! of `--help` are the book's table (docs/src/clients/cli.md).
//!
//! "At once" is checked by what the CLI did, not by a clock: no `retry` line on stderr and
//! nothing received by the server.

mod common;
use common::cli::*;
use common::*;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Every client command, with arguments that would work against a ferry server.
fn every_command(file: &str) -> Vec<Vec<String>> {
    let id = "aaaaaaaaaaaaaaaaaaaaaaaaaa";
    [
        vec!["upload", file],
        vec!["upload", "--parallel", "3", file],
        vec!["upload", "-", "--name", "x.txt"],
        vec!["download", id, "-o", "/dev/null"],
        vec!["ls"],
        vec!["status", id],
        vec!["rm", id],
        vec!["share", id],
        vec!["task", "list"],
        vec!["task", "get", "--wait", id],
        vec!["task", "start", "external", "--idempotency-key", "k"],
    ]
    .into_iter()
    .map(|v| v.into_iter().map(String::from).collect())
    .collect()
}

/// Python's `http.server` on a free port, serving an empty directory (it answers OPTIONS,
/// PATCH and POST with `501` and an HTML page, like many static servers).
struct PythonHttp {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl PythonHttp {
    fn start() -> PythonHttp {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new("python3")
            .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 (installed by .ci/run)");
        // "Serving HTTP on 127.0.0.1 port 40123 (http://127.0.0.1:40123/) ..."
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let base = loop {
            let line = lines.next().expect("http.server exited before serving").unwrap();
            if let Some(url) = line.split('(').nth(1).and_then(|r| r.split(')').next()) {
                break url.trim_end_matches('/').to_string();
            }
        };
        std::thread::spawn(move || for _ in lines.by_ref() {});
        PythonHttp { child, base, _dir: dir }
    }
}

impl Drop for PythonHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run `args` against `server` with stdin from /dev/null.
fn run(server: &str, cache: &std::path::Path, args: &[String]) -> std::process::Output {
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    out(&mut ferry(server, cache, &argv))
}

#[tokio::test]
async fn not_ferry_fails_at_once_with_the_reason() {
    let py = PythonHttp::start();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (src, _) = source(dir.path(), "f.bin", 100_000, 1);
    for args in every_command(src.to_str().unwrap()) {
        let o = run(&py.base, &cache, &args);
        let e = stderr(&o);
        assert_eq!(code(&o), 2, "{args:?}: {e}");
        assert!(
            e.contains("is not a ferry server") && e.contains("HTTP 501") && e.contains("text/html") && e.contains("without Tus-Resumable"),
            "{args:?}: {e}"
        );
        assert!(e.contains("hint: Set --server or FERRY_SERVER"), "{args:?}: {e}");
        assert!(!e.contains("retry"), "{args:?} retried: {e}");
        assert!(!e.contains("<html") && !e.contains("<!DOCTYPE"), "{args:?} printed the HTML page: {e}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}

#[tokio::test]
async fn refused_first_connection_fails_at_once() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (src, _) = source(dir.path(), "f.bin", 100_000, 2);
    for args in every_command(src.to_str().unwrap()) {
        let o = run(&closed, &cache, &args);
        let e = stderr(&o);
        assert_eq!(code(&o), 5, "{args:?}: {e}");
        assert!(e.contains(&format!("cannot connect to {closed}")) && e.to_lowercase().contains("connection refused"), "{args:?}: {e}");
        assert!(e.contains("hint: Is `ferry serve` running at"), "{args:?}: {e}");
        assert!(!e.contains("retry"), "{args:?} retried: {e}");
    }
    // The same for a URL argument naming another server (a signed link): it is the one asked.
    let s = Server::start(&[]);
    let o = out(&mut ferry(&s.base, &cache, &["download", &format!("{closed}/files/abc?sig=x"), "-o", "/dev/null"]));
    assert_eq!(code(&o), 5, "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("cannot connect to {closed}")), "{}", stderr(&o));
    let o = out(&mut ferry(&s.base, &cache, &["upload", "--url", &format!("{closed}/files/abc?sig=x"), src.to_str().unwrap()]));
    assert_eq!(code(&o), 5, "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("cannot connect to {closed}")), "{}", stderr(&o));
}

/// Issue 13 item 10: a file larger than `Tus-Max-Size` is refused before anything is sent —
/// also with `--parallel`, whose parts would each fit — and leaves no upload behind.
#[tokio::test]
async fn uploads_above_tus_max_size_send_nothing() {
    let s = Server::start(&["--max-size", "1MiB"]);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (src, _) = source(dir.path(), "big.bin", 3 << 20, 3);
    for extra in [&[][..], &["--parallel", "4"][..]] {
        let mut args = vec!["upload", src.to_str().unwrap()];
        args.extend_from_slice(extra);
        let o = out(&mut ferry(&s.base, &cache, &args));
        let e = stderr(&o);
        assert_eq!(code(&o), 2, "{args:?}: {e}");
        assert!(e.contains("Tus-Max-Size is 1048576 bytes (1.0 MiB)") && e.contains("nothing was sent"), "{e}");
        assert!(e.contains("--parallel does not help"), "{e}");
    }
    // From a pipe whose end fits the first piece: refused before the upload is created.
    let o = out(ferry(&s.base, &cache, &["upload", "-"]).stdin(std::fs::File::open(&src).unwrap()));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert_eq!(bytes_received(&s).await, 0, "nothing was sent");
    // A longer pipe, in small pieces: stopped at the piece that would pass the limit, and the
    // unfinished upload deleted.
    let o = out(ferry(&s.base, &cache, &["upload", "-", "--chunk-size", "256KiB"]).stdin(std::fs::File::open(&src).unwrap()));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("the unfinished upload was deleted"), "{}", stderr(&o));
    assert!(bytes_received(&s).await <= 1 << 20, "no piece past the limit was sent");
    let files = json(Api::new(&s).get("/api/v1/files").await).await;
    assert_eq!(files["files"].as_array().unwrap().len(), 0, "nothing left behind: {files}");
    // A file that fits still goes (and --parallel with it).
    let (ok, sha) = source(dir.path(), "ok.bin", 1 << 20, 4);
    let v = ok_json(&out(&mut ferry(&s.base, &cache, &["upload", "--json", "-q", "--parallel", "4", ok.to_str().unwrap()])));
    assert_eq!(v["sha256"], sha.as_str());
}

/// The server's own answer to a concatenation above the limit (a client that does not check
/// `Tus-Max-Size`) names the size and the limit, and does not suggest fewer parts.
#[tokio::test]
async fn concatenation_above_the_limit_says_why() {
    let s = Server::start(&["--max-size", "1MiB"]);
    let tus = Tus::new(&s);
    let mut parts = Vec::new();
    for _ in 0..2 {
        let r = tus.post(&[("Upload-Concat", "partial"), ("Upload-Length", "700000")]).await;
        assert_eq!(r.status(), 201);
        parts.push(r.headers()["location"].to_str().unwrap().to_string());
    }
    let fin = format!("final;{}", parts.join(" "));
    let r = tus.post(&[("Upload-Concat", fin.as_str())]).await;
    let p = problem(r, 413, "size_exceeded").await;
    let text = p.to_string();
    assert!(text.contains("1400000 bytes") && text.contains("1048576 bytes"), "{text}");
    assert!(!text.contains("fewer parts"), "{text}");
}

/// Issue 13 item 11: one table of exit codes, the same in `--help` (of every command) and in
/// the book's CLI chapter.
#[test]
fn exit_codes_in_help_are_the_books() {
    let readme = book::text("docs/src/clients/cli.md");
    let start = readme.find("| exit code | meaning").expect("the CLI chapter has the exit code table");
    let rows: Vec<(String, String)> = readme[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            (cells[0].to_string(), cells[1].replace('`', ""))
        })
        .collect();
    assert!(rows.len() >= 9, "{rows:?}");
    let dir = tempfile::tempdir().unwrap();
    for cmd in [&["--help"][..], &["upload", "--help"], &["download", "--help"], &["ls", "--help"], &["task", "--help"], &["task", "get", "--help"]] {
        let o = out(&mut ferry("http://127.0.0.1:1", dir.path(), cmd));
        let help = stdout(&o);
        for (code, meaning) in &rows {
            let line = format!("  {code}  {meaning}");
            assert!(help.contains(&line), "`ferry {}` lacks {line:?}:\n{help}", cmd.join(" "));
        }
    }
}
