//! `kill -9` during long jobs: the task resumes from its last checkpoint after a restart (it
//! does not start again from zero), and the file it produces is byte-identical to an
//! uninterrupted run's.
//!
//! The first server runs with `--task-lease 2s`, the restarted one with `--task-lease 1s`: the
//! dead owner's lease (at most 2 s old) expires quickly and the new process takes the task over.
//! Durability stays at the default (`full`).

mod common;
use common::*;

use std::io::Read;
use std::time::{Duration, Instant};

use serde_json::Value;

const MIB: usize = 1 << 20;

/// The first file named `name` in the principal's file list that is not one of `except`.
async fn file_named(api: &Api, name: &str, except: &[&str]) -> Option<Value> {
    let list = json(api.get("/api/v1/files?limit=1000").await).await;
    list["files"].as_array().unwrap().iter().find(|f| f["name"] == name && !except.contains(&f["id"].as_str().unwrap())).cloned()
}

/// Poll `tid` and its output file (named `out`) until the output is durable past byte 0 (so a
/// checkpoint exists), progress (`counter`) went on past that point, and the job is not done.
/// Returns (progress counter, output file view) at that moment, or `None` when the job completed
/// before the poller could catch it mid-way (the machine was faster than the poll).
async fn try_wait_for_checkpoint(
    api: &Api,
    tid: &str,
    out: &str,
    inputs: &[&str],
    counter: &str,
    past: impl Fn(u64, u64) -> bool,
) -> Option<(u64, Value)> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let v = api.task(tid).await;
        if v["status"] == "completed" {
            return None;
        }
        assert_eq!(v["status"], "working", "{v}");
        let progress = v["progress"]["counters"][counter].as_u64().unwrap_or(0);
        if let Some(f) = file_named(api, out, inputs).await {
            let durable = f["offset"].as_u64().unwrap();
            // A complete file: the job is finishing; the next poll sees it completed.
            if f["complete"] == false && durable > 0 && past(progress, durable) {
                // Still working after we looked at the file: it was caught mid-way.
                let v = api.task(tid).await;
                if v["status"] == "completed" {
                    return None;
                }
                assert_eq!(v["status"], "working", "{v}");
                return Some((progress, f));
            }
        }
        assert!(Instant::now() < deadline, "no durable checkpoint within 120 s: {v}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// [`try_wait_for_checkpoint`] that fails the test when the job was not caught mid-way.
async fn wait_for_checkpoint(api: &Api, tid: &str, out: &str, inputs: &[&str], counter: &str, past: impl Fn(u64, u64) -> bool) -> (u64, Value) {
    try_wait_for_checkpoint(api, tid, out, inputs, counter, past).await.expect("the job ended before it could be interrupted")
}

#[tokio::test]
async fn kill9_during_a_220_mib_archive_resumes_from_its_checkpoint() {
    let mut s = Server::start(&["--task-lease", "2s"]);
    let api = Api::new(&s);
    let a = pseudo_random(110 * MIB, 0xA1);
    let b = pseudo_random(110 * MIB + 12_345, 0xB2);
    let ia = api.upload(&a, "first.bin").await;
    let ib = api.upload(&b, "second.bin").await;
    let total = (a.len() + b.len()) as u64;
    // Kill once the archive is durable past byte 0 and progress went on past that point.
    // Progress counts member bytes, the durable offset archive bytes (headers too), so progress
    // > durable was written after the checkpoint that made that point durable was committed.
    // At page-cache speed the archive can finish before the poller sees that state: then it is
    // tried again under a new key (at most 5 times) — a job too fast to catch is no fault.
    let mut caught = None;
    for attempt in 0..5 {
        let name = format!("crash-{attempt}.tar");
        let args = format!(r#"{{"files":["{ia}","{ib}"],"format":"tar","name":"{name}"}}"#);
        let key = format!("crash-archive-{attempt}");
        let r = api.start_raw("archive", &args, Some(&key), None).await;
        assert_eq!(r.status(), 201);
        let tid = json(r).await["id"].as_str().unwrap().to_string();
        if let Some(got) = try_wait_for_checkpoint(&api, &tid, &name, &[&ia, &ib], "bytes", |bytes, durable| bytes > durable && bytes < total).await {
            caught = Some((tid, args, key, got));
            break;
        }
    }
    let (tid, args, key, (before, partial)) = caught.expect("the archive finished before it could be interrupted, 5 times");
    let durable = partial["offset"].as_u64().unwrap();
    let partial_id = partial["id"].as_str().unwrap().to_string();
    s.kill9();
    assert!(before > 0 && before < total, "interrupted mid-way: {before} of {total}");
    eprintln!("killed at {before} of {total} archived bytes; archive durable to {durable}");

    s.restart_with(&["--task-lease", "1s"]);
    let api = Api::new(&s);
    // After the restart, progress never goes back below the checkpoint (a run from zero would).
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut lowest = u64::MAX;
    let v = loop {
        let v = api.task(&tid).await;
        if v["status"] != "working" {
            break v;
        }
        lowest = lowest.min(v["progress"]["counters"]["bytes"].as_u64().unwrap_or(0));
        assert!(Instant::now() < deadline, "not done within 180 s after the restart: {v}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(v["status"], "completed", "{v}");
    assert!(v["runs"].as_u64().unwrap() >= 2, "resumed by a new run: {v}");
    assert!(lowest >= durable - 4096, "progress went back to {lowest}, below the checkpoint at {durable}");
    let f = &v["result"]["file"];
    assert_eq!(f["id"], partial_id.as_str(), "the resumed run finished the same file (a run from zero would create a new one)");
    assert_eq!(v["progress"]["counters"]["bytes"], total);

    // The bytes: sha256 of the download = the result's, and the members are the inputs.
    let bytes = api.download(&partial_id).await;
    let sha = sha256_hex(&bytes);
    assert_eq!(f["sha256"], sha.as_str());
    assert_eq!(f["size"], bytes.len() as u64);
    let mut ar = tar::Archive::new(&bytes[..]);
    let mut members = Vec::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        let mut buf = Vec::new();
        e.read_to_end(&mut buf).unwrap();
        members.push((name, sha256_hex(&buf)));
    }
    drop(bytes);
    assert_eq!(members, vec![("first.bin".to_string(), sha256_hex(&a)), ("second.bin".to_string(), sha256_hex(&b))]);

    // The reference: the same archive, uninterrupted, on the same server.
    let r = api.start_raw("archive", &args, None, None).await;
    assert_eq!(r.status(), 201);
    let reference = json(r).await["id"].as_str().unwrap().to_string();
    let rv = api.wait_status(&reference, "completed", 180).await;
    assert_eq!(rv["runs"], 1);
    assert_eq!(rv["result"]["file"]["sha256"], sha.as_str(), "resumed archive = uninterrupted archive");
    assert_ne!(rv["result"]["file"]["id"], partial_id.as_str());

    // The idempotency key still names the completed task.
    let r = api.start_raw("archive", &args, Some(&key), None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(json(r).await["id"], tid.as_str());
}

/// Lines the `lines` command writes: `line 1 of N` … `line N of N`.
fn expected_lines(n: u64) -> Vec<u8> {
    (1..=n).map(|i| format!("line {i} of {n}\n")).collect::<String>().into_bytes()
}

#[tokio::test]
async fn kill9_during_a_command_resumes_from_its_checkpoint() {
    const N: u64 = 3000;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs.log");
    // Writes N lines; every 50 lines a checkpoint (bytes written by this run, token = lines
    // done) and a short pause. Resumes after line $FERRY_CHECKPOINT. Logs each start.
    let script = write_script(
        dir.path(),
        "lines.sh",
        &format!(
            r#"echo "start ${{FERRY_CHECKPOINT:-none}} ${{FERRY_OFFSET:-unset}}" >> '{log}'
i=${{FERRY_CHECKPOINT:-0}}
n=0
while [ $i -lt {N} ]; do
  i=$((i+1))
  line="line $i of {N}"
  printf '%s\n' "$line"
  n=$((n + ${{#line}} + 1))
  if [ $((i % 50)) -eq 0 ]; then
    echo "checkpoint $n $i" >&2
    echo "count lines $i" >&2
    printf 'progress 0.%03d wrote %d lines\n' $((i * 999 / {N})) $i >&2
    sleep 0.05
  fi
done
echo "all {N} lines written" >&2
"#,
            log = log.display()
        ),
    );
    let cfg = write_file(
        dir.path(),
        "ferry.toml",
        &format!("[commands.lines]\nprogram = \"{}\"\noutput_name = \"lines.txt\"\nmedia_type = \"text/plain\"\n", script.display()),
    );
    let cfg = cfg.to_str().unwrap();
    let mut s = Server::start(&["--config", cfg, "--task-lease", "2s"]);
    let api = Api::new(&s);
    let tid = api.start("command", r#"{"command":"lines"}"#).await["id"].as_str().unwrap().to_string();
    let (lines, partial) = wait_for_checkpoint(&api, &tid, "lines.txt", &[], "lines", |lines, _| (500..N - 500).contains(&lines)).await;
    let durable = partial["offset"].as_u64().unwrap();
    s.kill9();
    assert!(lines > 0 && lines < N);
    eprintln!("killed after {lines} of {N} lines; output durable to {durable}");

    s.restart_with(&["--config", cfg, "--task-lease", "1s"]);
    let api = Api::new(&s);
    let v = api.wait_status(&tid, "completed", 120).await;
    assert!(v["runs"].as_u64().unwrap() >= 2, "{v}");
    assert_eq!(v["result"]["exit_code"], 0);
    // (Not asserted: the final `count lines N` — see final_progress_is_kept in tasks_api.rs.)
    let f = &v["result"]["file"];
    assert_eq!(f["id"], partial["id"], "the same output file");
    let body = api.download(f["id"].as_str().unwrap()).await;
    let reference = expected_lines(N);
    assert!(body == reference, "output differs from the reference ({} vs {} bytes)", body.len(), reference.len());
    assert_eq!(f["sha256"], sha256_hex(&reference).as_str());
    assert_eq!(f["size"], reference.len() as u64);

    // The program was started again from a checkpoint, not from zero.
    let starts = std::fs::read_to_string(&log).unwrap();
    let starts: Vec<&str> = starts.lines().collect();
    assert!(starts.len() >= 2, "{starts:?}");
    assert_eq!(starts[0], "start none 0", "{starts:?}");
    let resumed: Vec<(u64, u64)> = starts[1..]
        .iter()
        .map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            assert_eq!(p.len(), 3, "{l}");
            (p[1].parse().unwrap_or_else(|_| panic!("resumed without a checkpoint: {starts:?}")), p[2].parse().unwrap())
        })
        .collect();
    let (token, offset) = *resumed.last().unwrap();
    assert!(token >= 50 && token % 50 == 0, "{starts:?}");
    assert_eq!(
        offset,
        expected_lines(N)[..].split_inclusive(|b| *b == b'\n').take(token as usize).map(<[u8]>::len).sum::<usize>() as u64,
        "FERRY_OFFSET = bytes of the first {token} lines"
    );
    assert!(offset >= durable, "resumed from at least the checkpoint seen before the kill ({durable}): {starts:?}");
}
