//! Instruction counts of ferry's hot paths (issue 14): repeatable numbers on a noisy machine.
//!
//!     cargo bench --bench instructions
//!
//! The release `ferry` binary (`env!("CARGO_BIN_EXE_ferry")`, default flags: SQLite catalog,
//! fs blob store, `--durability full`) runs under valgrind's callgrind
//! (`valgrind --tool=callgrind`, needs `/usr/bin/valgrind` and `callgrind_control`). For each
//! scenario the bench prepares what it needs (uploads, a finished file, a task) *outside* the
//! counted window, zeroes callgrind's counters (`callgrind_control --zero`), sends the
//! scenario's requests from this process (plain HTTP/1.1 over one keep-alive loopback
//! connection, the client not under valgrind), then dumps the counters
//! (`callgrind_control --dump`) and reads the dump's `summary:` — every instruction the server
//! executed in that window, on every thread (tokio workers, blocking threads, SQLite).
//!
//! Scenarios (per operation = the window's total ÷ operations):
//! - `tus_patch_8mib`: 3 TUS PATCHes of 8 MiB each into one upload of 32 MiB (none completes
//!   it): offset check, lease, sha256, write, fdatasync, catalog checkpoint.
//! - `tus_patch_64kib`: 200 TUS PATCHes of 64 KiB each into one upload (issue 24's fixed cost
//!   of a PATCH: its bytes are a small share; the rest is the lease, catalog reads and the
//!   commit, the blob's open and fdatasync, HTTP and thread hand-offs).
//! - `draft_append_8mib`: the same 3 × 8 MiB as IETF draft appends (interop version 8,
//!   `application/partial-upload`, `Upload-Complete: ?0`).
//! - `range_get_1mib`: 16 GETs of 1 MiB ranges at fixed, scattered offsets of a finished 64 MiB
//!   upload.
//! - `task_get`: 200 `GET /api/v1/tasks/{id}` of one `external` task.
//! - `tus_head`: 200 TUS HEADs of an unfinished upload.
//!
//! Under valgrind the CPU has no SHA-NI (callgrind emulates a baseline x86-64), so sha2 runs its
//! portable code: the sha256 share of a PATCH's count is larger than on the real machine
//! (`callgrind_annotate` on the dumps, kept with `FERRY_IR_KEEP=DIR`, shows it per function).
//! Counts are exact for one binary and one workload and move by well under 1 % between runs
//! (thread interleavings); compare binaries, not machines.
//!
//! Knobs (environment): `FERRY_IR_KEEP=DIR` keeps the dumps (`DIR/after/callgrind.<scenario>`);
//! `FERRY_IR_BASE=/path/to/ferry` also measures that binary in the same run
//! and prints the ratio (after ÷ before) per scenario — e.g. a build of `main` copied aside.
//! `FERRY_IR_ONLY=name,name` runs only those scenarios.

#[path = "support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// One keep-alive HTTP/1.1 connection to the server (no proxy, no TLS).
struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
    host: String,
}

/// A response: status, headers (lowercase names), body.
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

impl Conn {
    fn open(addr: &str) -> Conn {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
        Conn { r: BufReader::new(s.try_clone().unwrap()), w: s, host: addr.to_string() }
    }

    fn send(&mut self, method: &str, path: &str, headers: &[(&str, String)], body: &[u8]) -> Resp {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n", self.host, body.len());
        for (n, v) in headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        head.push_str("\r\n");
        self.w.write_all(head.as_bytes()).unwrap();
        self.w.write_all(body).unwrap();
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        let status: u16 = line.split_whitespace().nth(1).unwrap_or_else(|| panic!("bad status line {line:?}")).parse().unwrap();
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.r.read_line(&mut line).unwrap();
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (n, v) = l.split_once(':').unwrap();
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let len: usize = if method == "HEAD" || status == 204 || status == 304 {
            0
        } else {
            headers.iter().find(|(n, _)| n == "content-length").map(|(_, v)| v.parse().unwrap()).expect("responses carry Content-Length")
        };
        let mut body = vec![0; len];
        self.r.read_exact(&mut body).unwrap();
        Resp { status, headers, body }
    }
}

/// `ferry serve` under callgrind, with counting to be switched on per window.
struct Server {
    child: Child,
    addr: String,
    out_dir: PathBuf,
    dumps: usize,
}

impl Server {
    fn start(binary: &Path, dir: &Path) -> Server {
        let out_dir = dir.join("callgrind");
        std::fs::create_dir_all(&out_dir).unwrap();
        let mut child = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}/callgrind.out", out_dir.display()))
            .args(["--vgdb=yes", "--vgdb-poll=50000"])
            .arg(binary)
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(dir.join("data"))
            .env_remove("FERRY_LISTEN")
            .env_remove("FERRY_CONFIG")
            .env("RUST_LOG", "warn")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn valgrind (is valgrind installed?)");
        let addr = support::wait_listening(&mut child).trim_start_matches("http://").to_string();
        Server { child, addr, out_dir, dumps: 0 }
    }

    fn control(&self, arg: &str) {
        let ok = Command::new("callgrind_control")
            .arg(arg)
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .status()
            .expect("callgrind_control")
            .success();
        assert!(ok, "callgrind_control {arg} failed");
    }

    /// Instructions the server executes while `work` runs.
    fn count(&mut self, work: impl FnOnce()) -> u64 {
        self.control("--zero");
        work();
        self.dumps += 1;
        self.control("--dump");
        // The dump lands as callgrind.out.<n> (n counts dumps); its `summary:` is the window's count.
        let path = self.out_dir.join(format!("callgrind.out.{}", self.dumps));
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(text) = std::fs::read_to_string(&path) {
                if let Some(v) = text.lines().find_map(|l| l.strip_prefix("summary:")) {
                    return v.split_whitespace().next().unwrap().parse().unwrap();
                }
            }
            assert!(Instant::now() < deadline, "no callgrind dump at {}", path.display());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TUS: (&str, &str) = ("Tus-Resumable", "1.0.0");

fn tus_create(c: &mut Conn, len: usize) -> String {
    let r = c.send("POST", "/files/", &[(TUS.0, TUS.1.into()), ("Upload-Length", len.to_string())], &[]);
    assert_eq!(r.status, 201);
    r.header("location").unwrap().to_string()
}

fn tus_patch(c: &mut Conn, url: &str, offset: usize, data: &[u8]) {
    let r = c.send(
        "PATCH",
        url,
        &[(TUS.0, TUS.1.into()), ("Content-Type", "application/offset+octet-stream".into()), ("Upload-Offset", offset.to_string())],
        data,
    );
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
}

fn draft_create(c: &mut Conn) -> String {
    let r = c.send("POST", "/files/", &[("Upload-Draft-Interop-Version", "8".into()), ("Upload-Complete", "?0".into())], &[]);
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    r.header("location").unwrap().to_string()
}

fn draft_append(c: &mut Conn, url: &str, offset: usize, data: &[u8]) {
    let r = c.send(
        "PATCH",
        url,
        &[
            ("Upload-Draft-Interop-Version", "8".into()),
            ("Upload-Complete", "?0".into()),
            ("Content-Type", "application/partial-upload".into()),
            ("Upload-Offset", offset.to_string()),
        ],
        data,
    );
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
}

/// (name, operations, bytes per operation, Ir of the window)
type Row = (&'static str, u64, usize, u64);

fn wanted(name: &str) -> bool {
    match std::env::var("FERRY_IR_ONLY") {
        Ok(only) => only.split(',').any(|n| n.trim() == name),
        Err(_) => true,
    }
}

fn measure(label: &str, binary: &Path, root: &Path) -> Vec<Row> {
    let dir = tempfile::Builder::new().prefix("ir-").tempdir_in(root).unwrap();
    let mut s = Server::start(binary, dir.path());
    let mut c = Conn::open(&s.addr);
    let chunk = support::pseudo_random(8 * MIB, 14);
    let mut rows = Vec::new();

    if wanted("tus_patch_8mib") {
        let url = tus_create(&mut c, 32 * MIB);
        tus_patch(&mut c, &url, 0, &chunk[..MIB]); // first PATCH: blob created, catalog warmed
        let ir = s.count(|| {
            for i in 0..3 {
                tus_patch(&mut c, &url, MIB + i * 8 * MIB, &chunk);
            }
        });
        rows.push(("tus_patch_8mib", 3, 8 * MIB, ir));
    }
    if wanted("tus_patch_64kib") {
        const N: usize = 200;
        let url = tus_create(&mut c, (N + 1) * 64 * 1024);
        tus_patch(&mut c, &url, 0, &chunk[..64 * 1024]);
        let ir = s.count(|| {
            for i in 1..=N {
                tus_patch(&mut c, &url, i * 64 * 1024, &chunk[i * 4096..i * 4096 + 64 * 1024]);
            }
        });
        rows.push(("tus_patch_64kib", N as u64, 64 * 1024, ir));
    }
    if wanted("draft_append_8mib") {
        let url = draft_create(&mut c);
        draft_append(&mut c, &url, 0, &chunk[..MIB]);
        let ir = s.count(|| {
            for i in 0..3 {
                draft_append(&mut c, &url, MIB + i * 8 * MIB, &chunk);
            }
        });
        rows.push(("draft_append_8mib", 3, 8 * MIB, ir));
    }
    if wanted("range_get_1mib") {
        let url = tus_create(&mut c, 64 * MIB);
        for i in 0..8 {
            tus_patch(&mut c, &url, i * 8 * MIB, &chunk);
        }
        let offsets: Vec<usize> = (0..16).map(|i| (i * 37 + 11) % 63 * MIB + (i * 4099) % 65536).collect();
        let get = |c: &mut Conn, off: usize| {
            let r = c.send("GET", &url, &[("Range", format!("bytes={off}-{}", off + MIB - 1))], &[]);
            assert_eq!(r.status, 206);
            assert_eq!(r.body.len(), MIB);
        };
        get(&mut c, 0);
        let ir = s.count(|| {
            for &off in &offsets {
                get(&mut c, off);
            }
        });
        rows.push(("range_get_1mib", offsets.len() as u64, MIB, ir));
    }
    if wanted("task_get") {
        let r = c.send("POST", "/api/v1/tasks", &[("Content-Type", "application/json".into())], br#"{"kind":"external","args":{"i":1}}"#);
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let path = format!("/api/v1/tasks/{}", v["id"].as_str().unwrap());
        assert_eq!(c.send("GET", &path, &[], &[]).status, 200);
        let ir = s.count(|| {
            for _ in 0..200 {
                assert_eq!(c.send("GET", &path, &[], &[]).status, 200);
            }
        });
        rows.push(("task_get", 200, 0, ir));
    }
    if wanted("tus_head") {
        let url = tus_create(&mut c, 2 * MIB);
        tus_patch(&mut c, &url, 0, &chunk[..MIB]);
        let ir = s.count(|| {
            for _ in 0..200 {
                assert_eq!(c.send("HEAD", &url, &[(TUS.0, TUS.1.into())], &[]).status, 200);
            }
        });
        rows.push(("tus_head", 200, 0, ir));
    }
    drop(c);
    if let Some(keep) = std::env::var_os("FERRY_IR_KEEP") {
        let to = Path::new(&keep).join(label);
        std::fs::create_dir_all(&to).unwrap();
        for (i, (name, ..)) in rows.iter().enumerate() {
            let _ = std::fs::copy(s.out_dir.join(format!("callgrind.out.{}", i + 1)), to.join(format!("callgrind.{name}")));
        }
    }
    drop(s);
    rows
}

fn main() {
    if Command::new("callgrind_control").arg("--version").stdout(Stdio::null()).status().is_err() {
        eprintln!("instructions: valgrind's callgrind_control is not installed; skipped");
        return;
    }
    let root = tempfile::Builder::new().prefix("ferry-ir-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let after = measure("after", Path::new(env!("CARGO_BIN_EXE_ferry")), root.path());
    let before = std::env::var_os("FERRY_IR_BASE").map(|b| measure("before", Path::new(&b), root.path()));

    println!("## Instructions per operation (callgrind, release ferry, SQLite + fs, durability=full)\n");
    if before.is_some() {
        println!("| scenario | ops | Ir/op before | Ir/op | Ir/byte | after/before |");
        println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    } else {
        println!("| scenario | ops | Ir/op | Ir/byte |");
        println!("| --- | ---: | ---: | ---: |");
    }
    for &(name, ops, bytes, ir) in &after {
        let per = ir / ops;
        let per_byte = if bytes > 0 { format!("{:.2}", per as f64 / bytes as f64) } else { "—".into() };
        match before.as_ref().and_then(|b| b.iter().find(|r| r.0 == name)) {
            Some(&(_, bops, _, bir)) => {
                let bper = bir / bops;
                println!("| {name} | {ops} | {bper} | {per} | {per_byte} | {:.3} |", per as f64 / bper as f64);
            }
            None if before.is_some() => println!("| {name} | {ops} | — | {per} | {per_byte} | — |"),
            None => println!("| {name} | {ops} | {per} | {per_byte} |"),
        }
    }
}
