//! Power cuts, simulated for real: ferry's data directory (SQLite catalog + blobs) lives on
//! `tools/powerfs`, a FUSE filesystem that keeps only what was made durable (fsync of a file
//! for its bytes, fsync of a directory for its entries; see that crate's `model` for the rules
//! and why they are at least as harsh as ext4 `data=ordered`). Each round arms a cut at a
//! point drawn from the seed (the n-th fsync of a blob — inside a checkpoint —, of the SQLite
//! WAL — a catalog commit, among them a finishing PATCH's —, a directory fsync, a blob write,
//! any operation, or at rest; a few also inside ferry's start, e.g. in SQLite's checkpoint of
//! the WAL into `ferry.db`), runs uploads (TUS, the IETF draft, concatenation), deletes and
//! archive tasks against the real binary until the power goes, kills the server, remounts what
//! survived and starts ferry again. Then every promise is checked against what the clients
//! were told (the ledger):
//! - an acknowledged offset (a 2xx, or a HEAD, which reports committed offsets) is still there:
//!   HEAD ≥ it, never less than an earlier HEAD, and the stored bytes below it are the source's;
//! - an upload acknowledged finished stays finished, GET serves exactly its bytes and its
//!   `Repr-Digest` is their sha256; every other upload, resumed at the end, finishes with it;
//! - an acknowledged DELETE stays deleted; an acknowledged task is still there, and one seen
//!   completed keeps its result, whose file's bytes match its sha256;
//! - `--durability relaxed` (no fsync): what README promises, that uploads resume from what
//!   survived — each one finishes byte-exact by following HEAD and 409's `Upload-Offset`.
//!
//! `FERRY_POWERLOSS_SEED` replays other cut points; every round's cut is printed (and shown
//! by nextest for a failing test). Skipped only when `/dev/fuse` does not exist.

mod common;
use common::*;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_powerfs::{Op, PowerFs, Trigger};
use rand::{Rng, SeedableRng};

const DRAFT: &str = "8";

/// What clients were told about one upload.
#[derive(Debug, Clone)]
struct Up {
    /// `/files/<id>`
    path: String,
    data: Arc<Vec<u8>>,
    draft: bool,
    /// Highest offset a 2xx or a HEAD reported.
    floor: u64,
    finished: bool,
    /// A DELETE was sent; `deleted` once one was answered 204.
    delete_sent: bool,
    deleted: bool,
    /// A final upload (concatenation): finished by the server, not by PATCHes.
    is_final: bool,
    /// Part of a final: stays unchanged and is never deleted.
    partial: bool,
    /// Made to be deleted (never a task's input).
    spare: bool,
}

/// What clients were told about one task.
#[derive(Debug, Clone)]
struct TaskSeen {
    id: String,
    /// The uploads it reads (never deleted: the task would fail for want of them).
    inputs: Vec<String>,
    /// `(file id, sha256)` once seen completed.
    result: Option<(String, String)>,
}

#[derive(Default)]
struct Ledger {
    ups: Vec<Up>,
    tasks: Vec<TaskSeen>,
}

type Shared = Arc<Mutex<Ledger>>;

fn id_of(path: &str) -> String {
    path.rsplit('/').next().unwrap().to_string()
}

/// The data dir on a power-loss filesystem, and the server on it.
struct Rig {
    // Fields drop in this order: the server (killed), then the mount, then its directory.
    server: Option<Server>,
    fs: PowerFs,
    data: PathBuf,
    args: Vec<String>,
    rng: rand::rngs::StdRng,
    seed: u64,
    cuts: Vec<String>,
    /// Cuts that happened inside an operation (the rest: at rest, after the round's work).
    inside: usize,
    /// Operations of the last round, by kind.
    last_round: ferry_powerfs::Counts,
    // Dropped last: the mount point.
    _dir: tempfile::TempDir,
}

impl Rig {
    fn new(name: &str, args: &[&str]) -> Option<Rig> {
        if let Some(why) = ferry_powerfs::unavailable() {
            eprintln!("skipping the power-loss suite: {why}");
            return None;
        }
        let seed = std::env::var("FERRY_POWERLOSS_SEED")
            .ok()
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().expect("FERRY_POWERLOSS_SEED: a number"))
            .unwrap_or(0x9E11);
        // One stream of draws per test, from the one seed.
        let seed = seed ^ name.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        eprintln!("power-loss {name}: seed {seed} (FERRY_POWERLOSS_SEED to change)");
        let dir = tempfile::tempdir().unwrap();
        let fs = PowerFs::mount(dir.path()).expect("mount the power-loss filesystem (needs root for mount(2), or fusermount3 from Debian's fuse3)");
        // DATA is created by ferry itself, so its own entry must be made durable too.
        let data = dir.path().join("data");
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let server = Some(Server::start_in(&data, &args.iter().map(String::as_str).collect::<Vec<_>>()));
        let last_round = ferry_powerfs::Counts { writes: 40, fsyncs: 12, dir_fsyncs: 4, ..Default::default() };
        Some(Rig { fs, server, data, args, rng: rand::rngs::StdRng::seed_from_u64(seed), seed, cuts: Vec::new(), inside: 0, last_round, _dir: dir })
    }

    fn base(&self) -> String {
        self.server.as_ref().unwrap().base.clone()
    }

    /// A cut point drawn from the seed: where, which occurrence, and how much unsynced state
    /// the simulated flusher wrote back before the power went.
    /// The n-th is drawn below half of what the last round did of that kind, so most cuts land
    /// inside the work rather than after it.
    fn draw(&mut self) -> Option<Trigger> {
        let keep = if self.rng.random_bool(0.3) { 0.5 } else { 0.0 };
        let seed = self.rng.random();
        let c = self.last_round;
        let any = c.writes + c.fsyncs + c.dir_fsyncs + c.creates + c.renames + c.unlinks + c.truncates;
        let kind = self.rng.random_range(0..10);
        let mut upto = |n: u64| self.rng.random_range(1..=(n / 2).max(1));
        let (op, path, nth) = match kind {
            0..=2 => (Op::Fsync, "/blobs/", upto(c.fsyncs)),
            3..=4 => (Op::Fsync, "ferry.db-wal", upto(c.fsyncs)),
            5 => (Op::FsyncDir, "", upto(c.dir_fsyncs)),
            6 => (Op::Write, "/blobs/", upto(c.writes)),
            7 => (Op::Write, "ferry.db-wal", upto(c.writes / 4)),
            8 => (Op::Any, "", upto(any)),
            _ => return None,
        };
        Some(Trigger { op, path_contains: path.into(), nth, keep, seed })
    }

    /// Arm `trigger` (None: cut at rest), run `work` until the power goes (or the work ends:
    /// then cut at rest), kill the server, remount what survived, start ferry again.
    async fn cut_during(&mut self, trigger: Option<Trigger>, work: impl std::future::Future<Output = ()> + Send + 'static) -> ferry_powerfs::CutInfo {
        let round = self.cuts.len();
        let before = self.fs.counts();
        let keep = trigger.as_ref().map(|t| t.keep).unwrap_or(0.0);
        let seed = trigger.as_ref().map(|t| t.seed).unwrap_or(round as u64);
        if let Some(t) = &trigger {
            self.fs.arm(t.clone());
        }
        let mut work = tokio::spawn(work);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while self.fs.cut_info().is_none() && !work.is_finished() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let cut = self.fs.cut_now(keep, seed);
        let after = self.fs.counts();
        self.last_round = ferry_powerfs::Counts {
            writes: after.writes - before.writes,
            fsyncs: after.fsyncs - before.fsyncs,
            dir_fsyncs: after.dir_fsyncs - before.dir_fsyncs,
            creates: after.creates - before.creates,
            renames: after.renames - before.renames,
            unlinks: after.unlinks - before.unlinks,
            truncates: after.truncates - before.truncates,
        };
        if cut.at != "at rest" {
            self.inside += 1;
        }
        self.server.as_mut().unwrap().kill9();
        // The clients' requests fail now; whatever they were told before is in the ledger.
        if tokio::time::timeout(Duration::from_secs(10), &mut work).await.is_err() {
            work.abort();
        }
        let line = format!(
            "cut {round}: armed {trigger:?}; happened {} ({}/{} unsynced inodes written back)",
            cut.at, cut.report.written_back, cut.report.unsynced
        );
        eprintln!("{line}");
        self.cuts.push(line);
        self.fs.remount().expect("remount after the cut");
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.server = Some(Server::start_in(&self.data, &args));
        cut
    }

    /// A cut while ferry starts: after `work`, the power goes at rest, and then again inside ferry's start on
    /// what survived — where SQLite checkpoints the WAL into `ferry.db` and ferry writes its
    /// lock files and directories — as `t` says; then it starts for good.
    async fn cut_during_startup(&mut self, t: Trigger, work: impl std::future::Future<Output = ()>) {
        // Commits since the last start, for SQLite to checkpoint at the next.
        work.await;
        let round = self.cuts.len();
        let at_rest = self.fs.cut_now(0.0, t.seed);
        self.server.take().unwrap().kill9();
        self.cuts.push(format!("cut {round}: {} (before a start)", at_rest.at));
        self.fs.remount().expect("remount");
        let round = self.cuts.len();
        self.fs.arm(t.clone());
        let mut child = std::process::Command::new(ferry_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(&self.data)
            .args(&self.args)
            .env_remove("FERRY_CATALOG")
            .env_remove("FERRY_BLOBS")
            .env(common::TEST_MIN_FREE_SPACE.0, common::TEST_MIN_FREE_SPACE.1)
            .env("RUST_LOG", "error")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn ferry");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.fs.cut_info().is_none() && child.try_wait().unwrap().is_none() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let cut = self.fs.cut_now(0.0, t.seed);
        let _ = child.kill();
        let _ = child.wait();
        if cut.at != "at rest" {
            self.inside += 1;
        }
        let line = format!("cut {round}: while ferry starts, armed {t:?}; happened {}", cut.at);
        eprintln!("{line}");
        self.cuts.push(line);
        self.fs.remount().expect("remount after the cut");
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.server = Some(Server::start_in(&self.data, &args));
    }

    /// The bytes of upload `path`'s blob as they survived (`DATA/blobs/xx/<id>`), read straight
    /// from the file: no store is opened, so the check syncs nothing ferry did not.
    fn stored(&self, path: &str) -> Option<Vec<u8>> {
        let id = id_of(path);
        std::fs::read(self.data.join("blobs").join(&id[..2]).join(&id)).ok()
    }

    /// The closing line: how many cuts, how many inside an operation.
    fn summary(&self) {
        eprintln!("{} cuts, {} inside an operation; operations seen {:?}", self.cuts.len(), self.inside, self.fs.counts());
    }

    /// Everything failed so far, for the panic message.
    fn context(&self) -> String {
        format!("seed {} (FERRY_POWERLOSS_SEED), cuts so far:\n{}", self.seed, self.cuts.join("\n"))
    }
}

fn tus(r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    r.header("Tus-Resumable", "1.0.0")
}

fn hdr_u64(r: &reqwest::Response, name: &str) -> Option<u64> {
    r.headers().get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok())
}

/// Record an offset the server reported for `path`; reaching the length is finishing it.
fn set_floor(ledger: &Shared, path: &str, off: u64) {
    let mut l = ledger.lock().unwrap();
    if let Some(u) = l.ups.iter_mut().find(|u| u.path == path) {
        u.floor = u.floor.max(off);
        u.finished |= off == u.data.len() as u64;
    }
}

/// Create an upload of `data` (TUS, or the draft with careful creation); recorded once 201.
async fn create(base: &str, ledger: &Shared, data: Arc<Vec<u8>>, draft: bool, concat: Option<&str>) -> Option<String> {
    let c = client();
    let mut r = c.post(format!("{base}/files/"));
    r = if draft {
        r.header("Upload-Draft-Interop-Version", DRAFT).header("Upload-Complete", "?0").header("Upload-Length", data.len().to_string())
    } else {
        let r = tus(r);
        match concat {
            Some(c) if c.starts_with("final") => r.header("Upload-Concat", c),
            Some(c) => r.header("Upload-Concat", c).header("Upload-Length", data.len().to_string()),
            None => r.header("Upload-Length", data.len().to_string()),
        }
    };
    let r = r.send().await.ok()?;
    if r.status() != 201 {
        return None;
    }
    let loc = r.headers()["location"].to_str().unwrap();
    let path = format!("/files/{}", id_of(loc));
    let is_final = concat.is_some_and(|c| c.starts_with("final"));
    let up = Up {
        path: path.clone(),
        data,
        draft,
        floor: 0,
        finished: false,
        delete_sent: false,
        deleted: false,
        is_final,
        partial: concat == Some("partial"),
        spare: false,
    };
    ledger.lock().unwrap().ups.push(up);
    Some(path)
}

/// Send the rest of an upload from its HEAD offset in `chunk`-sized PATCHes, recording every
/// acknowledged offset; a 409 (relaxed durability's roll-back) resumes from its offset.
async fn send_rest(base: &str, ledger: &Shared, up: &Up, chunk: usize) -> Option<()> {
    let c = client();
    let url = format!("{base}{}", up.path);
    let r = tus(c.head(&url)).send().await.ok()?;
    let mut off = hdr_u64(&r, "upload-offset")? as usize;
    set_floor(ledger, &up.path, off as u64);
    let len = up.data.len();
    while off < len {
        let end = (off + chunk).min(len);
        let body = up.data[off..end].to_vec();
        let r = if up.draft {
            let complete = if end == len { "?1" } else { "?0" };
            c.patch(&url)
                .header("Upload-Draft-Interop-Version", DRAFT)
                .header("Content-Type", "application/partial-upload")
                .header("Upload-Offset", off.to_string())
                .header("Upload-Complete", complete)
        } else {
            tus(c.patch(&url)).header("Content-Type", OCTET).header("Upload-Offset", off.to_string())
        };
        let r = r.body(body).send().await.ok()?;
        match r.status().as_u16() {
            200 | 204 => {
                let new = hdr_u64(&r, "upload-offset").unwrap_or(end as u64);
                set_floor(ledger, &up.path, new);
                off = new as usize;
            }
            409 => off = hdr_u64(&r, "upload-offset")? as usize,
            _ => return None,
        }
    }
    Some(())
}

/// The server's `(offset, length known and reached)` for `path`, or its status when not 2xx.
/// A 423 (every byte stored, the server still finishing it — or, in relaxed durability,
/// finding the bytes gone and rolling back) is asked again, as TUS clients do.
async fn head(base: &str, path: &str) -> Result<(u64, bool), u16> {
    let mut r = tus(client().head(format!("{base}{path}"))).send().await.expect("HEAD reaches the restarted server");
    for _ in 0..100 {
        if r.status() != 423 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        r = tus(client().head(format!("{base}{path}"))).send().await.expect("HEAD reaches the restarted server");
    }
    if !r.status().is_success() {
        return Err(r.status().as_u16());
    }
    let off = hdr_u64(&r, "upload-offset").expect("HEAD has Upload-Offset");
    Ok((off, hdr_u64(&r, "upload-length") == Some(off)))
}

fn repr_digest(data: &[u8]) -> String {
    use base64::Engine as _;
    format!("sha-256=:{}:", base64::engine::general_purpose::STANDARD.encode(hex::decode(sha256_hex(data)).unwrap()))
}

/// GET a finished upload: exactly its bytes, and its `Repr-Digest` is their sha256.
async fn assert_served(base: &str, up: &Up, ctx: &str) {
    let r = client().get(format!("{base}{}", up.path)).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}: a finished upload is served\n{ctx}", up.path);
    let digest = r.headers().get("repr-digest").map(|v| v.to_str().unwrap().to_string());
    let body = r.bytes().await.unwrap();
    assert!(body[..] == up.data[..], "{}: GET serves the uploaded bytes ({} of {} bytes)\n{ctx}", up.path, body.len(), up.data.len());
    assert_eq!(digest.as_deref(), Some(repr_digest(&up.data).as_str()), "{}: the stored sha256 is the bytes' sha256\n{ctx}", up.path);
}

/// After a restart: every promise made to a client still holds (full durability).
async fn check_promises(rig: &Rig, ledger: &Shared) {
    let ctx = rig.context();
    let base = rig.base();
    let ups = ledger.lock().unwrap().ups.clone();
    for up in &ups {
        let got = head(&base, &up.path).await;
        if up.deleted {
            assert!(matches!(got, Err(404 | 410)), "{}: acknowledged as deleted, HEAD says {got:?}\n{ctx}", up.path);
            continue;
        }
        if up.delete_sent {
            // An unacknowledged DELETE may have taken the bytes and not the row: the client
            // sends it again, which must finish the job.
            let r = tus(client().delete(format!("{base}{}", up.path))).send().await.unwrap();
            assert!(matches!(r.status().as_u16(), 204 | 404), "{}: DELETE again after the cut: {}\n{ctx}", up.path, r.status());
            let again = head(&base, &up.path).await;
            assert!(matches!(again, Err(404 | 410)), "{}: deleted, HEAD says {again:?}\n{ctx}", up.path);
            ledger.lock().unwrap().ups.iter_mut().filter(|u| u.path == up.path).for_each(|u| u.deleted = true);
            continue;
        }
        let (off, complete) = got.unwrap_or_else(|s| panic!("{}: acknowledged upload gone after the cut (HEAD {s})\n{ctx}", up.path));
        assert!(off >= up.floor, "{}: offset went back from {} to {off}\n{ctx}", up.path, up.floor);
        assert!(off as usize <= up.data.len(), "{}: offset {off} past the length\n{ctx}", up.path);
        if up.finished {
            assert!(complete, "{}: acknowledged finished, now at {off} of {}\n{ctx}", up.path, up.data.len());
        }
        if complete {
            assert_served(&base, up, &ctx).await;
        } else {
            let stored = rig.stored(&up.path).unwrap_or_else(|| panic!("{}: HEAD says {off} bytes, and the blob is gone\n{ctx}", up.path));
            assert!(stored.len() as u64 >= off, "{}: HEAD says {off} bytes, the blob holds {}\n{ctx}", up.path, stored.len());
            let stored = &stored[..off as usize];
            assert!(stored[..] == up.data[..off as usize], "{}: the stored bytes below offset {off} are the uploaded ones\n{ctx}", up.path);
        }
        set_floor(ledger, &up.path, off);
    }
    let tasks = ledger.lock().unwrap().tasks.clone();
    for t in &tasks {
        let r = client().get(format!("{base}/api/v1/tasks/{}", t.id)).send().await.unwrap();
        assert_eq!(r.status(), 200, "task {}: acknowledged, gone after the cut\n{ctx}", t.id);
        let v: serde_json::Value = r.json().await.unwrap();
        if let Some((file, sha)) = &t.result {
            assert_eq!(v["status"], "completed", "task {}: completed before the cut: {v}\n{ctx}", t.id);
            assert_eq!(v["result"]["file"]["id"].as_str(), Some(file.as_str()), "task {}: same result file\n{ctx}", t.id);
            let body = client().get(format!("{base}/files/{file}")).send().await.unwrap().bytes().await.unwrap();
            assert_eq!(&sha256_hex(&body), sha, "task {}: the result file's bytes match its sha256\n{ctx}", t.id);
        }
    }
}

/// With no more cuts: finish every upload still open and check each one's bytes and sha256
/// (the stored midstate continued correctly), and wait for every task.
async fn finish_all(rig: &Rig, ledger: &Shared) {
    let ctx = rig.context();
    let base = rig.base();
    let ups = ledger.lock().unwrap().ups.clone();
    for up in ups.iter().filter(|u| !u.deleted) {
        if up.is_final {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while !matches!(head(&base, &up.path).await, Ok((_, true))) {
                assert!(std::time::Instant::now() < deadline, "{}: the concatenation never finished\n{ctx}", up.path);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        } else {
            send_rest(&base, ledger, up, 1 << 20).await.unwrap_or_else(|| panic!("{}: resuming failed\n{ctx}", up.path));
        }
        assert_served(&base, up, &ctx).await;
    }
    let tasks = ledger.lock().unwrap().tasks.clone();
    for t in &tasks {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let v: serde_json::Value = client().get(format!("{base}/api/v1/tasks/{}", t.id)).send().await.unwrap().json().await.unwrap();
            if v["status"] == "completed" {
                let file = v["result"]["file"]["id"].as_str().unwrap();
                let body = client().get(format!("{base}/files/{file}")).send().await.unwrap().bytes().await.unwrap();
                assert_eq!(v["result"]["file"]["sha256"].as_str(), Some(sha256_hex(&body).as_str()), "task {}: result bytes\n{ctx}", t.id);
                break;
            }
            assert!(v["status"] == "working" && std::time::Instant::now() < deadline, "task {}: {v}\n{ctx}", t.id);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One round's client work: continue every open upload (two at a time) and start `new` more.
async fn uploads_work(base: String, ledger: Shared, new: Vec<(Arc<Vec<u8>>, bool)>, chunk: usize) {
    for (data, draft) in new {
        create(&base, &ledger, data, draft, None).await;
    }
    let open: Vec<Up> = ledger.lock().unwrap().ups.iter().filter(|u| !u.finished && !u.deleted && !u.delete_sent && !u.is_final).cloned().collect();
    let mut it = open.chunks(2);
    for pair in &mut it {
        futures::future::join_all(pair.iter().map(|u| send_rest(&base, &ledger, u, chunk))).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tus_and_draft_uploads_survive_power_cuts() {
    let Some(mut rig) = Rig::new("uploads", &["--checkpoint-every", "256KiB"]) else { return };
    let ledger = Shared::default();
    for round in 0..20u64 {
        let len = rig.rng.random_range(500_000..2 << 20);
        let new = vec![(Arc::new(pseudo_random(len, round)), round % 2 == 1)];
        let trigger = match round {
            // A cut inside a checkpoint (the blob's fsync) and inside a finish (the commit of
            // the last PATCH: the WAL's fsync once the last chunk is on its way).
            0 => Some(Trigger { op: Op::Fsync, path_contains: "/blobs/".into(), nth: 3, keep: 0.0, seed: 1 }),
            1 => Some(Trigger { op: Op::FsyncDir, path_contains: "/blobs".into(), nth: 1, keep: 0.0, seed: 2 }),
            _ => rig.draw(),
        };
        let chunk = [256 << 10, 512 << 10, 1 << 20][round as usize % 3];
        rig.cut_during(trigger, uploads_work(rig.base(), ledger.clone(), new, chunk)).await;
        check_promises(&rig, &ledger).await;
    }
    // Cuts while ferry starts: in SQLite's checkpoint of the WAL into the database, and
    // anywhere among its first operations.
    for t in [
        Trigger { op: Op::Fsync, path_contains: "ferry.db$".into(), nth: 1, keep: 0.0, seed: 60 },
        Trigger { op: Op::Any, path_contains: String::new(), nth: rig.rng.random_range(1..=12), keep: 0.0, seed: 61 },
    ] {
        let data = Arc::new(pseudo_random(300_000, t.seed));
        rig.cut_during_startup(t, uploads_work(rig.base(), ledger.clone(), vec![(data, false)], 64 << 10)).await;
        check_promises(&rig, &ledger).await;
    }
    // Cuts inside finishes: a fresh upload sent up to its last chunk, then the power goes in
    // the last PATCH's blob fsync or its catalog commit.
    let finishes = [
        (Op::Fsync, "/blobs/", 1),
        (Op::Fsync, "ferry.db-wal", 1),
        (Op::Fsync, "ferry.db-wal", 2),
        (Op::Write, "ferry.db-wal", 1),
        (Op::Write, "ferry.db-wal", 2),
    ];
    for (i, (op, path, nth)) in finishes.into_iter().enumerate() {
        let data = Arc::new(pseudo_random(1 << 20, 100 + i as u64));
        let base = rig.base();
        let path_up = create(&base, &ledger, data.clone(), i == 1, None).await.expect("create");
        let up = ledger.lock().unwrap().ups.iter().find(|u| u.path == path_up).cloned().unwrap();
        let head_part = Up { data: Arc::new(data[..(1 << 20) - 4096].to_vec()), ..up.clone() };
        // Everything but the last 4 KiB (a TUS PATCH below the length does not finish it).
        send_rest(&base, &ledger, &Up { draft: false, ..head_part }, 1 << 20).await.expect("first part");
        let t = Trigger { op, path_contains: path.into(), nth, keep: 0.0, seed: 50 + i as u64 };
        let l = ledger.clone();
        let cut = rig
            .cut_during(Some(t), async move {
                send_rest(&base, &l, &up, 1 << 20).await;
            })
            .await;
        // The first of each kind is certain to come in that PATCH (later ones depend on
        // which catalog commits it needs).
        if nth == 1 {
            assert_ne!(cut.at, "at rest", "the cut armed for the finishing PATCH happened inside it\n{}", rig.context());
        }
        check_promises(&rig, &ledger).await;
    }
    finish_all(&rig, &ledger).await;
    rig.summary();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concatenation_deletes_and_tasks_survive_power_cuts() {
    let Some(mut rig) = Rig::new("concat-tasks", &["--checkpoint-every", "256KiB"]) else { return };
    let ledger = Shared::default();
    for round in 0..18u64 {
        let base = rig.base();
        let l = ledger.clone();
        let seed = rig.rng.random::<u64>();
        let trigger = match round {
            0 => Some(Trigger { op: Op::Fsync, path_contains: "/blobs/".into(), nth: 2, keep: 0.0, seed: 3 }),
            _ => rig.draw(),
        };
        let work = async move {
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            // Each round does all three, in turn from a different one: the cut lands in any.
            for step in 0..3u64 {
                let seed = seed.wrapping_add(step * 1000);
                match (round + step) % 3 {
                    // Two partials, then their final (composed by a task in the background).
                    0 => {
                        let a = Arc::new(pseudo_random(r.random_range(300_000..900_000), seed));
                        let b = Arc::new(pseudo_random(r.random_range(300_000..900_000), seed + 1));
                        let Some(pa) = create(&base, &l, a.clone(), false, Some("partial")).await else { return };
                        let Some(pb) = create(&base, &l, b.clone(), false, Some("partial")).await else { return };
                        for p in [&pa, &pb] {
                            let up = l.lock().unwrap().ups.iter().find(|u| &u.path == p).cloned().unwrap();
                            if send_rest(&base, &l, &up, 256 << 10).await.is_none() {
                                return;
                            }
                        }
                        let all = Arc::new([&a[..], &b[..]].concat());
                        create(&base, &l, all, false, Some(&format!("final;{pa} {pb}"))).await;
                    }
                    // An archive of finished uploads with a new one among them, and an upload to
                    // delete later.
                    1 => {
                        for (i, spare) in [false, true].into_iter().enumerate() {
                            let d = Arc::new(pseudo_random(r.random_range(200_000..700_000), seed + i as u64));
                            let Some(p) = create(&base, &l, d, (round / 3 + i as u64).is_multiple_of(2), None).await else { return };
                            let up = {
                                let mut g = l.lock().unwrap();
                                let u = g.ups.iter_mut().find(|u| u.path == p).unwrap();
                                u.spare = spare;
                                u.clone()
                            };
                            if send_rest(&base, &l, &up, 256 << 10).await.is_none() {
                                return;
                            }
                        }
                        let done: Vec<String> = l
                            .lock()
                            .unwrap()
                            .ups
                            .iter()
                            .filter(|u| u.finished && !u.spare && !u.partial)
                            .map(|u| id_of(&u.path))
                            .rev()
                            .take(3)
                            .collect();
                        let args =
                            serde_json::json!({"kind": "archive", "args": {"file_ids": &done, "format": if round % 2 == 0 { "tar" } else { "zip" }}});
                        let Ok(r) = client().post(format!("{base}/api/v1/tasks")).json(&args).send().await else { return };
                        if r.status() == 201 {
                            let v: serde_json::Value = r.json().await.unwrap();
                            l.lock().unwrap().tasks.push(TaskSeen { id: v["id"].as_str().unwrap().to_string(), inputs: done, result: None });
                        }
                    }
                    // Delete a finished upload (not a partial, which a final may still be reading, nor
                    // a task's input).
                    _ => {
                        let victim = {
                            let mut guard = l.lock().unwrap();
                            let inputs: Vec<String> = guard.tasks.iter().flat_map(|t| t.inputs.clone()).collect();
                            guard.ups.iter_mut().find(|u| u.spare && u.finished && !u.delete_sent && !inputs.contains(&id_of(&u.path))).map(|u| {
                                u.delete_sent = true;
                                u.path.clone()
                            })
                        };
                        if let Some(p) = victim {
                            if let Ok(r) = tus(client().delete(format!("{base}{p}"))).send().await {
                                if r.status() == 204 {
                                    l.lock().unwrap().ups.iter_mut().filter(|u| u.path == p).for_each(|u| u.deleted = true);
                                }
                            }
                        }
                    }
                }
            }
            // Watch tasks and finals: what is seen completed is a promise too.
            for _ in 0..40 {
                let tasks = l.lock().unwrap().tasks.clone();
                for t in tasks.iter().filter(|t| t.result.is_none()) {
                    let Ok(r) = client().get(format!("{base}/api/v1/tasks/{}", t.id)).send().await else { return };
                    let Ok(v) = r.json::<serde_json::Value>().await else { return };
                    if v["status"] == "completed" {
                        let res =
                            (v["result"]["file"]["id"].as_str().unwrap().to_string(), v["result"]["file"]["sha256"].as_str().unwrap().to_string());
                        l.lock().unwrap().tasks.iter_mut().filter(|x| x.id == t.id).for_each(|x| x.result = Some(res.clone()));
                    }
                }
                let finals: Vec<String> = l.lock().unwrap().ups.iter().filter(|u| u.is_final && !u.finished).map(|u| u.path.clone()).collect();
                for p in finals {
                    let Ok(r) = tus(client().head(format!("{base}{p}"))).send().await else { return };
                    if let (Some(o), Some(_)) = (hdr_u64(&r, "upload-offset"), hdr_u64(&r, "upload-length")) {
                        set_floor(&l, &p, o);
                    }
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        };
        rig.cut_during(trigger, work).await;
        check_promises(&rig, &ledger).await;
    }
    finish_all(&rig, &ledger).await;
    rig.summary();
    let l = ledger.lock().unwrap();
    let (deleted, finals, tasks) = (l.ups.iter().filter(|u| u.deleted).count(), l.ups.iter().filter(|u| u.is_final).count(), l.tasks.len());
    eprintln!("{deleted} uploads deleted, {finals} concatenations, {tasks} archive tasks");
    assert!(deleted > 0 && finals > 0 && tasks > 0, "each kind of work was done at least once\n{}", rig.context());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relaxed_durability_resumes_from_what_survived() {
    let Some(mut rig) = Rig::new("relaxed", &["--checkpoint-every", "256KiB", "--durability", "relaxed"]) else { return };
    let ledger = Shared::default();
    for round in 0..12u64 {
        let new = vec![(Arc::new(pseudo_random(rig.rng.random_range(500_000..2 << 20), 200 + round)), round % 2 == 1)];
        // Relaxed never fsyncs blobs: cut on catalog commits, writes, anything, or at rest, with
        // the flusher writing back some of the rest half the time.
        let mut trigger = rig.draw();
        if let Some(t) = &mut trigger {
            t.keep = if round % 2 == 0 { 0.5 } else { 0.0 };
            // No checkpoint fsyncs a blob here: cut in its writes instead.
            if t.op == Op::Fsync && t.path_contains == "/blobs/" {
                t.op = Op::Write;
            }
        }
        rig.cut_during(trigger, uploads_work(rig.base(), ledger.clone(), new, 512 << 10)).await;
        // The catalog is still synchronous: every upload created is there, within its length;
        // the bytes may be fewer than HEAD says, but those stored are the source's; and a
        // finished upload (its blob is fsynced before it is called finished) stays served.
        let ctx = rig.context();
        let ups = ledger.lock().unwrap().ups.clone();
        for up in &ups {
            let (off, complete) =
                head(&rig.base(), &up.path).await.unwrap_or_else(|s| panic!("{}: created, gone after the cut (HEAD {s})\n{ctx}", up.path));
            assert!(off as usize <= up.data.len(), "{}: offset {off} past the length\n{ctx}", up.path);
            if up.finished || complete {
                assert_served(&rig.base(), up, &ctx).await;
                set_floor(&ledger, &up.path, off);
            } else {
                let stored = rig.stored(&up.path).unwrap_or_default();
                let have = (stored.len() as u64).min(off);
                let stored = &stored[..have as usize];
                assert!(stored[..] == up.data[..have as usize], "{}: the {have} stored bytes are the uploaded ones\n{ctx}", up.path);
            }
        }
    }
    // What README promises: every upload resumes from what survived and finishes byte-exact.
    let ctx = rig.context();
    let base = rig.base();
    let ups = ledger.lock().unwrap().ups.clone();
    for up in &ups {
        // A 409 (the roll-back to what survived) ends one attempt; the next resumes from it.
        use futures::StreamExt as _;
        let resumed = futures::stream::iter(0..3).any(|_| async { send_rest(&base, &ledger, up, 1 << 20).await.is_some() }).await;
        assert!(resumed, "{}: resuming from what survived failed three times\n{ctx}", up.path);
        assert_served(&base, up, &ctx).await;
    }
    rig.summary();
}

/// Issue 48 kind 3: a DELETE cut off by a power loss at each step of its order — the catalog's
/// commit, the unlink, the directory's fsync, or at rest once answered — leaves the upload
/// either whole (GET serves its bytes; only when the DELETE was not answered 204) or gone
/// (404/410) with no bytes left, never a finished upload without bytes (HEAD finished, GET
/// `damaged`) nor bytes without an upload; and `ferry check` on what survived finds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_cut_anywhere_leaves_the_upload_whole_or_gone_and_no_orphan() {
    let Some(mut rig) = Rig::new("delete-order", &[]) else { return };
    let triggers = [
        // The DELETE's catalog commit: cut inside its fsync, and before its first write with
        // everything else written back — as a kill -9 there leaves it (the old order had
        // unlinked the blob by then: a finished upload without bytes).
        Some(Trigger { op: Op::Fsync, path_contains: "ferry.db-wal".into(), nth: 1, keep: 1.0, seed: 1 }),
        Some(Trigger { op: Op::Write, path_contains: "ferry.db-wal".into(), nth: 1, keep: 1.0, seed: 5 }),
        Some(Trigger { op: Op::Unlink, path_contains: "/blobs/".into(), nth: 1, keep: 1.0, seed: 2 }),
        Some(Trigger { op: Op::Unlink, path_contains: "/blobs/".into(), nth: 1, keep: 0.0, seed: 3 }),
        Some(Trigger { op: Op::FsyncDir, path_contains: "/blobs/".into(), nth: 1, keep: 0.0, seed: 4 }),
        None,
    ];
    for (round, trigger) in triggers.into_iter().enumerate() {
        let base = rig.base();
        let data = pseudo_random(200_000, round as u64);
        let c = client();
        let r = tus(c.post(format!("{base}/files/"))).header("Upload-Length", data.len().to_string()).send().await.unwrap();
        assert_eq!(r.status(), 201);
        let path = format!("/files/{}", id_of(r.headers()["location"].to_str().unwrap()));
        let r = tus(c.patch(format!("{base}{path}")))
            .header("Upload-Offset", "0")
            .header("Content-Type", "application/offset+octet-stream")
            .body(data.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "{path}");
        let answered = Arc::new(Mutex::new(None));
        let work = {
            let (url, answered) = (format!("{base}{path}"), answered.clone());
            async move {
                if let Ok(r) = tus(client().delete(url)).send().await {
                    *answered.lock().unwrap() = Some(r.status().as_u16());
                }
            }
        };
        let cut = rig.cut_during(trigger, work).await;
        let answered = *answered.lock().unwrap();
        let ctx = format!("round {round}: cut {}, DELETE answered {answered:?}; {}", cut.at, rig.context());
        let base = rig.base();
        let head = tus(client().head(format!("{base}{path}"))).send().await.unwrap();
        match head.status().as_u16() {
            200 => {
                assert_ne!(answered, Some(204), "a DELETE answered 204 came back: {ctx}");
                assert_eq!(hdr_u64(&head, "upload-offset"), Some(data.len() as u64), "{ctx}");
                let got = client().get(format!("{base}{path}")).send().await.unwrap();
                assert_eq!(got.status(), 200, "a finished upload whose bytes are gone: {ctx}");
                assert!(got.bytes().await.unwrap()[..] == data[..], "{ctx}");
            }
            404 | 410 => assert!(rig.stored(&path).is_none(), "the upload is gone but its bytes are back: {ctx}"),
            other => panic!("HEAD answered {other}: {ctx}"),
        }
    }
    let out = output_within(
        std::process::Command::new(ferry_bin()).args(["check", "--quiet", "--json", "--data"]).arg(&rig.data).env_remove("FERRY_CONFIG"),
        Duration::from_secs(60),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "ferry check after the cuts: {} {}; {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        rig.context()
    );
    rig.summary();
}
