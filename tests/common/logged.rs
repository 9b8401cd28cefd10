//! A `ferry serve` whose log lines (stderr) the test reads, and that it can send SIGHUP to:
//! for tests that wait on what the server says (a reload, a refused reload, the principals line).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::ferry_bin;

/// A running `ferry serve` (killed on drop) with its stderr collected line by line.
pub struct LoggedServer {
    pub child: Child,
    /// `http://127.0.0.1:PORT` or `https://127.0.0.1:PORT`, from the `listening on` line.
    pub base: String,
    lines: Arc<Mutex<Vec<String>>>,
    /// Set once stderr is closed and every line of it is in `lines`.
    closed: Arc<std::sync::atomic::AtomicBool>,
    /// Lines already matched by [`LoggedServer::wait_log`] (each wait looks past them).
    seen: usize,
}

impl LoggedServer {
    /// The command [`LoggedServer::start`] runs: `ferry serve --listen 127.0.0.1:0 --data DATA
    /// ARGS…`, info logs as plain text on stderr (piped), stdout piped.
    pub fn command(data: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(ferry_bin());
        c.arg("serve")
            .args(["--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .args(args)
            .env_remove("FERRY_LISTEN")
            .env_remove("FERRY_CATALOG")
            .env_remove("FERRY_CONFIG")
            .env(super::TEST_MIN_FREE_SPACE.0, super::TEST_MIN_FREE_SPACE.1)
            .env("RUST_LOG", "info")
            .env("FERRY_LOG_FORMAT", "text")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// `ferry serve --listen 127.0.0.1:0 --data DATA ARGS…` with `RUST_LOG=info`; waits for the
    /// `listening on` line (panics with the log if the process exits first).
    pub fn start(data: &Path, args: &[&str]) -> LoggedServer {
        let mut child = LoggedServer::command(data, args).spawn().expect("spawn ferry");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let (sink, closed) = (lines.clone(), Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let eof = closed.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("ferry: {line}");
                sink.lock().unwrap().push(line);
            }
            eof.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let base = loop {
            match out.next() {
                Some(Ok(line)) => {
                    if let Some(rest) = line.strip_prefix("listening on ") {
                        break rest.trim().to_string();
                    }
                }
                _ => {
                    let _ = child.wait();
                    std::thread::sleep(Duration::from_millis(200));
                    panic!("ferry exited before listening:\n{}", lines.lock().unwrap().join("\n"));
                }
            }
        };
        std::thread::spawn(move || for _ in out.by_ref() {});
        LoggedServer { child, base, lines, closed, seen: 0 }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn port(&self) -> u16 {
        self.base.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// `kill -HUP`.
    pub fn sighup(&self) {
        let st = Command::new("kill").arg("-HUP").arg(self.child.id().to_string()).status().unwrap();
        assert!(st.success());
    }

    /// `kill -TERM`, wait for the process to exit, and return its status with every line it
    /// logged (stderr read to its end, at most 10 s after the exit).
    pub fn terminate(&mut self) -> (std::process::ExitStatus, Vec<String>) {
        let st = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status().unwrap();
        assert!(st.success());
        let status = self.child.wait().expect("wait");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.closed.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        (status, self.log())
    }

    /// Every log line so far.
    pub fn log(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Wait (up to `secs`) for a log line after the last one matched that contains every one
    /// of `parts`; returns it.
    pub fn wait_log(&mut self, parts: &[&str], secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            {
                let lines = self.lines.lock().unwrap();
                if let Some((i, l)) = lines.iter().enumerate().skip(self.seen).find(|(_, l)| parts.iter().all(|p| l.contains(p))) {
                    self.seen = i + 1;
                    return l.clone();
                }
            }
            if Instant::now() > deadline {
                panic!("no log line with {parts:?} within {secs} s; log:\n{}", self.log().join("\n"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for LoggedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
