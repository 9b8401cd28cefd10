//! What the replica and S3 benches share (include with `#[path = "support/replicas.rs"] mod support;`):
//! a fresh PostgreSQL database per measurement and a real
//! `ferry serve` process on a free port.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use sqlx::{Connection, Executor};

/// `name` parsed as a u64 from the environment, else `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `FERRY_TEST_PG`, default the role `.ci/run` creates.
pub fn admin_url() -> String {
    std::env::var("FERRY_TEST_PG").unwrap_or_else(|_| "postgres://ferry:ferry-ci@127.0.0.1:5432/postgres".into())
}

/// A fresh database: (name, URL); dropped by [`drop_db`].
pub async fn create_db() -> (String, String) {
    let mut c = sqlx::PgConnection::connect(&admin_url()).await.expect("PostgreSQL at FERRY_TEST_PG (start it as .ci/run does)");
    let name = format!("ferry_bench_{:016x}", rand::random::<u64>());
    c.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\""))).await.unwrap();
    let mut u = url::Url::parse(&admin_url()).unwrap();
    u.set_path(&format!("/{name}"));
    (name, u.to_string())
}

pub async fn drop_db(name: &str) {
    let mut c = sqlx::PgConnection::connect(&admin_url()).await.unwrap();
    let _ = c.execute(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))).await;
}

/// `ferry serve` on `data` with `args` and extra environment; returns the child and its base
/// URL. The binary is the bench profile's, or `FERRY_BENCH_BIN` (a release build measured by
/// a bench built in the test profile, whose dependencies are already built by the tests).
pub fn start_server(data: &Path, args: &[&str], env: &[(&'static str, String)]) -> (Child, String) {
    let bin = std::env::var_os("FERRY_BENCH_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_ferry").into());
    let mut child = Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let base = loop {
        let l = lines.next().expect("ferry exited").unwrap();
        if let Some(a) = l.strip_prefix("listening on ") {
            break a.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, base)
}

/// Kill and reap a server.
pub fn stop(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// utime + stime of process `pid` in seconds, from /proc/PID/stat (USER_HZ is 100 on every
/// Linux ABI); 0 when it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after `(comm)`, which may contain spaces: utime and stime are the 12th and 13th.
    let f: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("").split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// A field of /proc/PID/status in MiB (`VmHWM`: peak RSS, `VmRSS`).
pub fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    kib as f64 / 1024.0
}

/// Reset the peak RSS (`VmHWM`) of `pid` to its current RSS (needs to own the process or root).
pub fn reset_peak_rss(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}
