//! ferry's S3 store against a strict S3 and a reference model (issue 47, Build 4): proptest draws
//! sequences of writers on a few uploads under `WriteLease`s (writes, syncs the test commits as
//! the engine's catalog would, takeovers, stalls longer than a lease, clean releases), finishes
//! and finishers, composes of finished uploads into a final, resets, aborts, deletes, restarts
//! (a new `S3BlobStore` on the same S3), and faults the S3 ([`common::s3strict`]: 404 / 411 /
//! 500 / 501 / 503, held requests, parts that land late, lifecycle aborts, slow completions),
//! drives `ferry::blob::S3BlobStore` with them and checks after every step:
//!
//! - **durable success**: a finish or compose that succeeded left an object that holds exactly
//!   the model's bytes;
//! - **finished is for ever**: a finished object keeps its bytes, and no request deletes it;
//! - **acknowledged offsets are kept**: no upload is rolled back while the store still holds its
//!   bytes, and at the end every unfinished upload, taken over at its committed state and
//!   finished, holds exactly the model's bytes;
//! - **nothing left behind**: once finished or deleted, no multipart upload, tail or marker of an
//!   upload is left;
//! - **memory**: `S3BlobStore::buffered()` stays within the budget, and every writer that holds
//!   bytes of an open part holds budget for them;
//! - **time**: every call returns within a deadline;
//! - **the store's rules**: no CompleteMultipartUpload of one multipart upload is in flight twice
//!   at once; every body-less PUT/POST carries `Content-Length`; a call with no fault in its way
//!   succeeds.
//!
//! The model is the engine's side, kept in the test: a small catalog (offset, committed blob
//! state and fence per upload; a commit with a stale fence changes nothing), writers that amend
//! and commit what they sync as `upload::append` does (a failed call: rewind, note the numbers
//! taken, release; a lost lease: note and go; `Lost`: roll back with `create` and a commit at
//! 0), a finisher that takes the upload over at its committed state, and the build of a final
//! (`compose` of the finished uploads, committed under a new fence).
//!
//! The checks a known bug of issue 47 breaks on today's code are switched off in the random
//! search ([`Config::search`], each line names its point) until it is fixed; `found_sequences`
//! replays the sequences that pass, and one `found_point*` test per bug replays its shrunk
//! sequence, ignored while the bug is open. To search with a check back on:
//! `FERRY_S3_MODEL_ON=stale,budget,tail,length,loss,fallback,slow,xml,ping,abort404,notes,moto` (or
//! `all`), with `FERRY_S3_MODEL_CASES=1000`; `FERRY_S3_MODEL_TRACE=1` prints every request of a
//! replayed sequence. Bounded for CI: `FERRY_S3_MODEL_CASES` cases (default 32, about 5 s).

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::s3strict::{Fault, Kind, Rules, S3Strict};
use ferry::blob::{BlobError, BlobState, BlobStore, BlobWriter, S3BlobStore, Unreferenced, WriteLease};
use proptest::prelude::*;

/// The part floor given to ferry and the smallest part the strict S3 accepts.
const PART: u64 = 64 << 10;
const MIB: u64 = 1 << 20;
const BUCKET: &str = "model";
const PREFIX: &str = "p";
/// The uploads writers write, and the final composed of the finished ones.
const IDS: [&str; 3] = ["upa", "upb", "fin"];
const FINAL: usize = 2;
const WRITABLE: usize = 2;
const SLOTS: usize = 3;
/// Longest a call may take (no S3 request here takes long unless a test holds it: a held one is
/// let go within a second, and object_store's retries take under one).
const DEADLINE: Duration = Duration::from_secs(8);
/// Longest a call may take while completions are slow ([`Op::SlowComplete`]).
const SLOW_DEADLINE: Duration = Duration::from_secs(40);
/// How long a held request waits before the test lets it go (or stalls its writer).
const HOLD_FOR: Duration = Duration::from_millis(150);

/// What the checks and the store look like in one run.
#[derive(Debug, Clone, Copy)]
struct Config {
    /// `[s3] max_buffer`.
    max_buffer: u64,
    /// The strict S3 answers 411 to a PUT/POST without Content-Length (AWS does).
    require_length: bool,
    /// Fail when a body-less PUT/POST comes without Content-Length.
    check_length_header: bool,
    /// Fail when a writer holds bytes of an open part without budget for them.
    check_tail_budget: bool,
    /// Run stale composes (a composer that checked the final unfinished before a stall).
    stale_compose: bool,
    /// Run stale resets (a roll back decided before a stall).
    stale_reset: bool,
    /// Fail when one 404 or 411 (a refusal a retry could change) rolls an upload back.
    check_confirmed_loss: bool,
    /// Fail when a store without UploadPartCopy (501) does not fall back to streaming.
    check_compose_fallback: bool,
    /// Run completions slower than ferry's request deadline.
    slow_completions: bool,
    /// Fail when an error's text carries the store's raw XML.
    check_no_xml: bool,
    /// Fail when the readiness probe writes.
    check_ping_reads: bool,
    /// The S3 answers a request on an aborted multipart upload with 500, as moto does.
    moto: bool,
    /// Let the catalog refuse commits ([`Op::CatalogFails`]).
    catalog_faults: bool,
    /// Answer AbortMultipartUpload with 404 while ListMultipartUploads still lists the upload
    /// (otherwise such a fault answers 503).
    abort_404: bool,
}

impl Config {
    /// [`Config::search`], with the checks `FERRY_S3_MODEL_ON` names (comma-separated: `budget`,
    /// `length`, `tail`, `stale`, `stale-compose`, `stale-reset`, `loss`, `fallback`, `slow`, `xml`,
    /// `ping`, `abort404`, `notes`, `moto`, or `all`) on.
    fn from_env() -> Config {
        let mut c = Config::search();
        let on = std::env::var("FERRY_S3_MODEL_ON").unwrap_or_default();
        for name in on.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "all" => c = Config { slow_completions: c.slow_completions, ..Config::strict() },
                "budget" => c.max_buffer = MIB,
                "length" => {
                    c.require_length = true;
                    c.check_length_header = true;
                }
                "tail" => c.check_tail_budget = true,
                "stale" => {
                    c.stale_compose = true;
                    c.stale_reset = true;
                }
                "stale-compose" => c.stale_compose = true,
                "stale-reset" => c.stale_reset = true,
                "loss" => c.check_confirmed_loss = true,
                "fallback" => c.check_compose_fallback = true,
                "slow" => c.slow_completions = true,
                "xml" => c.check_no_xml = true,
                "ping" => c.check_ping_reads = true,
                "abort404" => c.abort_404 = true,
                "notes" => c.catalog_faults = true,
                "moto" => c.moto = true,
                other => panic!("FERRY_S3_MODEL_ON: unknown check {other:?}"),
            }
        }
        c
    }

    /// Everything issue 47 asks for.
    fn strict() -> Config {
        Config {
            max_buffer: MIB,
            require_length: true,
            check_length_header: true,
            check_tail_budget: true,
            stale_compose: true,
            stale_reset: true,
            check_confirmed_loss: true,
            check_compose_fallback: true,
            slow_completions: false,
            check_no_xml: true,
            check_ping_reads: true,
            abort_404: true,
            moto: true,
            catalog_faults: true,
        }
    }

    /// The random search on today's code: the checks an open point of issue 47 breaks are off
    /// (each line says which; switch it back on with the fix).
    fn search() -> Config {
        Config {
            // point 2 is fixed (a bounded wait, then 503), but a budget of one part makes many
            // writes wait those 5 s: found_point2 keeps it; `budget` searches with it.
            max_buffer: 64 * MIB,
            require_length: true,
            check_length_header: true,
            check_tail_budget: true,
            stale_compose: true,
            stale_reset: true,
            check_confirmed_loss: true,
            check_compose_fallback: true,
            // point 5 is fixed; ~11 s a case: found_point5 keeps it.
            slow_completions: false,
            check_no_xml: true,
            // point 6, still open: the probe writes.
            check_ping_reads: false,
            // point 4, still open: a 404 from AbortMultipartUpload is taken as done though the
            // upload is still listed.
            abort_404: false,
            moto: true,
            // point 1 and 6, still open: a roll back whose commit fails wedges the upload; a
            // failed number note followed by a clean release reuses part numbers.
            catalog_faults: false,
        }
    }
}

/// Which requests a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    UploadPart,
    Complete,
    UploadPartCopy,
    PutObject,
    GetObject,
    HeadObject,
    DeleteObject,
    CreateMultipart,
    AbortMultipart,
    ListObjects,
    ListMultipart,
}

impl On {
    fn kind(self) -> Kind {
        match self {
            On::UploadPart => Kind::UploadPart,
            On::Complete => Kind::Complete,
            On::UploadPartCopy => Kind::UploadPartCopy,
            On::PutObject => Kind::PutObject,
            On::GetObject => Kind::GetObject,
            On::HeadObject => Kind::HeadObject,
            On::DeleteObject => Kind::DeleteObject,
            On::CreateMultipart => Kind::CreateMultipart,
            On::AbortMultipart => Kind::AbortMultipart,
            On::ListObjects => Kind::ListObjects,
            On::ListMultipart => Kind::ListMultipart,
        }
    }
}

/// One step. `w` picks a writer among those there are (modulo their number), `u` an upload
/// (`IDS`).
#[derive(Debug, Clone)]
enum Op {
    /// Open a writer in slot `w` on upload `u` at its committed offset and state: a takeover
    /// (higher fence and generation; a writer still holding `u` has stalled past its lease) or,
    /// after a clean release, the next writer of the same generation.
    Open {
        w: usize,
        u: usize,
    },
    /// Write `n` bytes (`declared`: the request declared where its bytes end, so a part that
    /// fills within it is streamed).
    Write {
        w: usize,
        n: u64,
        declared: bool,
    },
    /// `sync()` and commit the state at the writer's position (the acknowledged offset).
    Sync {
        w: usize,
    },
    /// Declare the length at the writer's position and finish: sync, commit, `complete()`, commit
    /// finished.
    Finish {
        w: usize,
    },
    /// As [`Op::Finish`] up to the commit at the full offset; then the process dies.
    FinishCrash {
        w: usize,
    },
    /// The finisher: `BlobStore::finish` of an upload committed at its full offset.
    Finisher {
        u: usize,
    },
    /// The writer stalls longer than its lease (SIGSTOP, a VM pause).
    Stall {
        w: usize,
    },
    /// The writer is dropped and its lease released.
    Release {
        w: usize,
    },
    /// Build the final from the finished uploads (`stale`: a composer that checked the final
    /// unfinished before a stall composes now, with the sources it saw then).
    Compose {
        stale: bool,
    },
    /// Roll `u` back to 0 (`create`, then a fenced commit); `stale`: decided before a stall, on an
    /// upload finished since.
    Reset {
        u: usize,
        stale: bool,
    },
    /// The sweeper expires unfinished `u` (`abort`).
    Abort {
        u: usize,
    },
    /// `u` is deleted (`delete` once finished, `abort` before).
    Delete {
        u: usize,
    },
    /// A new `S3BlobStore` on the same S3; every writer is gone.
    Restart,
    /// The next `times` requests of `on` answer `status`.
    Fault {
        on: On,
        status: u16,
        times: u32,
    },
    /// The next request of `on` is held; `stall`: its writer stalls past its lease meanwhile.
    Hold {
        on: On,
        stall: bool,
    },
    /// The next UploadPart lands only at the next [`Op::DeliverLate`]; `stall`: its writer stalls
    /// past its lease while it waits (else its connection is dropped and the part sent again).
    Late {
        stall: bool,
    },
    /// The catalog refuses the next `times` commits (PostgreSQL away).
    CatalogFails {
        times: u32,
    },
    DeliverLate,
    /// A bucket lifecycle rule aborts the multipart uploads of `u`.
    LifecycleAbort {
        u: usize,
    },
    /// Completions take longer than ferry's request deadline from now on.
    SlowComplete,
    /// The readiness probe.
    Ping,
}

fn write_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(1u64),
        1 => Just(1000),
        1 => Just(PART - 1),
        1 => Just(PART),
        1 => Just(PART + 1000),
        1 => Just(3 * PART + 7),
        2 => Just(600_000),
        // A source a compose copies from: at least one compose part (1 MiB).
        2 => Just(1_100_000),
    ]
}

fn on() -> impl Strategy<Value = On> {
    prop_oneof![
        3 => Just(On::UploadPart),
        2 => Just(On::Complete),
        2 => Just(On::UploadPartCopy),
        2 => Just(On::PutObject),
        1 => Just(On::GetObject),
        1 => Just(On::HeadObject),
        1 => Just(On::DeleteObject),
        1 => Just(On::CreateMultipart),
        1 => Just(On::AbortMultipart),
        1 => Just(On::ListObjects),
        1 => Just(On::ListMultipart),
    ]
}

fn op(cfg: Config) -> impl Strategy<Value = Op> {
    let w = 0usize..SLOTS;
    let u = 0usize..WRITABLE;
    let stale_compose = if cfg.stale_compose { 0.4 } else { 0.0 };
    let stale_reset = if cfg.stale_reset { 0.4 } else { 0.0 };
    let mut v: Vec<(u32, BoxedStrategy<Op>)> = vec![
        (8, (w.clone(), u.clone()).prop_map(|(w, u)| Op::Open { w, u }).boxed()),
        (10, (w.clone(), write_size(), proptest::bool::ANY).prop_map(|(w, n, declared)| Op::Write { w, n, declared }).boxed()),
        (6, w.clone().prop_map(|w| Op::Sync { w }).boxed()),
        (6, w.clone().prop_map(|w| Op::Finish { w }).boxed()),
        (1, w.clone().prop_map(|w| Op::FinishCrash { w }).boxed()),
        (1, u.clone().prop_map(|u| Op::Finisher { u }).boxed()),
        (2, w.clone().prop_map(|w| Op::Stall { w }).boxed()),
        (1, w.clone().prop_map(|w| Op::Release { w }).boxed()),
        (4, proptest::bool::weighted(stale_compose).prop_map(|stale| Op::Compose { stale }).boxed()),
        (1, (0usize..IDS.len(), proptest::bool::weighted(stale_reset)).prop_map(|(u, stale)| Op::Reset { u, stale }).boxed()),
        (1, u.clone().prop_map(|u| Op::Abort { u }).boxed()),
        (1, (0usize..IDS.len()).prop_map(|u| Op::Delete { u }).boxed()),
        (1, Just(Op::Restart).boxed()),
        (
            2,
            (on(), prop_oneof![Just(404u16), Just(411), Just(500), Just(501), Just(503)], 1u32..4)
                .prop_map(|(on, status, times)| Op::Fault { on, status, times })
                .boxed(),
        ),
        (1, (on(), proptest::bool::ANY).prop_map(|(on, stall)| Op::Hold { on, stall }).boxed()),
        (1, proptest::bool::ANY.prop_map(|stall| Op::Late { stall }).boxed()),
        (1, Just(Op::DeliverLate).boxed()),
        (1, u.prop_map(|u| Op::LifecycleAbort { u }).boxed()),
        (1, Just(Op::Ping).boxed()),
    ];
    if cfg.catalog_faults {
        v.push((1, (1u32..3).prop_map(|times| Op::CatalogFails { times }).boxed()));
    }
    if cfg.slow_completions {
        v.push((1, Just(Op::SlowComplete).boxed()));
    }
    proptest::strategy::Union::new_weighted(v)
}

/// The bytes writer `serial` writes at `from..from + n`: each writer's its own, so a stale
/// writer's part that lands in place of another's shows.
fn bytes_of(serial: u64, from: u64, n: u64) -> Vec<u8> {
    (from..from + n).map(|i| (i.wrapping_mul(31) ^ serial.wrapping_mul(0x9e37) ^ (i >> 9)) as u8).collect()
}

/// One upload as the engine's catalog holds it, with the bytes it must hold.
#[derive(Debug, Clone, Default)]
struct Row {
    live: bool,
    finished: bool,
    /// Committed at its full offset with its length declared; not finished yet.
    pending_finish: bool,
    offset: u64,
    state: BlobState,
    /// The committed bytes (`offset` of them).
    data: Vec<u8>,
    fence: u64,
    generation: u64,
    /// The last holder released the lease cleanly: the next writer is of the same generation.
    released: bool,
    /// The store lost this upload's bytes for real (a lifecycle abort): a roll back is right.
    lost_for_real: bool,
    /// The sources (id, length) the final was composed of.
    sources: Vec<(String, u64)>,
}

/// The lease a writer writes under: renewed (valid for the next 200 ms, always) until it stalls.
#[derive(Clone)]
struct Lease(Arc<Mutex<Option<Instant>>>);

impl Lease {
    fn new() -> Lease {
        Lease(Arc::new(Mutex::new(None)))
    }
    fn expire(&self) {
        let mut l = self.0.lock().unwrap();
        if l.is_none() {
            *l = Some(Instant::now());
        }
    }
    fn expired(&self) -> bool {
        self.0.lock().unwrap().is_some()
    }
    fn write_lease(&self, fence: u64, generation: u64) -> WriteLease {
        let me = self.0.clone();
        WriteLease {
            size_hint: 0,
            fence,
            generation,
            valid_until: Arc::new(move || Some(me.lock().unwrap().unwrap_or_else(|| Instant::now() + Duration::from_millis(200)))),
            cut: tokio_util::sync::CancellationToken::new(),
        }
    }
}

struct Slot {
    u: usize,
    w: Box<dyn BlobWriter>,
    fence: u64,
    lease: Lease,
    /// The lease as the store sees it (a roll back runs under it).
    wl: WriteLease,
    serial: u64,
    /// The offset and state this writer last committed (or opened at), and the bytes to it.
    committed: u64,
    committed_state: BlobState,
    /// Bytes written past `committed`.
    written: Vec<u8>,
    broken: bool,
    /// The S3's fault count when this writer opened.
    mark: u64,
}

impl Slot {
    fn position(&self) -> u64 {
        self.committed + self.written.len() as u64
    }
}

struct Model {
    cfg: Config,
    s3: S3Strict,
    store: S3BlobStore,
    rows: Vec<Row>,
    slots: Vec<Option<Slot>>,
    serial: u64,
    /// The steps so far, with the writers after each (`FERRY_S3_MODEL_STATS=ops`).
    log: Vec<String>,
    slow: bool,
    /// A held request's writer stalls past its lease ([`Op::Hold`]).
    stall_holds: bool,
    /// A late part's writer stalls past its lease ([`Op::Late`]).
    stall_late: bool,
    /// The next commits the catalog refuses ([`Op::CatalogFails`]).
    catalog_down: u32,
    /// The last commit was refused by a catalog that is away (not fenced).
    refused: bool,
    /// Budget reservations the store refused so far (`BudgetStats::refused`).
    budget_refusals: u64,
    /// A 404 was injected (a `Lost` may then be one 404 taken as proof of loss).
    saw_404: bool,
    /// A 411 was injected: a completion refused for good rolls back (an open question,
    /// `found_point4_a_refused_completion_rolls_back_acknowledged_bytes`).
    saw_411: bool,
}

/// Only one model builds its store at a time: `S3BlobStore::from_url` reads the process's
/// `AWS_*` environment.
static ENV: Mutex<()> = Mutex::new(());

fn key(u: usize) -> String {
    format!("{BUCKET}/{PREFIX}/{}", IDS[u])
}

async fn new_store(s3: &S3Strict, cfg: Config) -> S3BlobStore {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    for (k, v) in s3.env() {
        std::env::set_var(k, v);
    }
    S3BlobStore::from_url(&format!("s3://{BUCKET}/{PREFIX}"), PART).unwrap().with_max_buffer(cfg.max_buffer)
}

/// A broken invariant.
type Check = Result<(), String>;

macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

impl Model {
    async fn new(cfg: Config) -> Model {
        let rules = Rules { min_part: PART, require_length: cfg.require_length, gone_is_500: cfg.moto, ..Rules::default() };
        let s3 = S3Strict::start(rules).await;
        let store = new_store(&s3, cfg).await;
        let mut rows = vec![Row::default(); IDS.len()];
        for (u, id) in IDS.iter().enumerate() {
            store.create(id).await.unwrap_or_else(|e| panic!("create {id}: {e}"));
            rows[u].live = true;
            rows[u].released = true;
        }
        Model {
            cfg,
            s3,
            store,
            rows,
            slots: (0..SLOTS).map(|_| None).collect(),
            serial: 0,
            log: Vec::new(),
            slow: false,
            stall_holds: false,
            stall_late: true,
            catalog_down: 0,
            refused: false,
            saw_404: false,
            saw_411: false,
            budget_refusals: 0,
        }
    }

    /// Run `fut` (a call of the store) within the deadline ([`drive_free`]).
    async fn drive<T>(&self, what: &str, stall: Option<&Lease>, fut: impl std::future::Future<Output = T>) -> Result<T, String> {
        drive_free(&self.s3, self.slow, self.stall_holds, self.stall_late, what, stall, fut).await
    }

    /// Open a writer as `Appender::open` does: a blob that is gone at offset 0 is created again.
    async fn open_at(
        &self,
        u: usize,
        offset: u64,
        state: &BlobState,
        wl: &WriteLease,
        stall: Option<&Lease>,
    ) -> Result<Result<Box<dyn BlobWriter>, BlobError>, String> {
        match self.drive("open_writer_under", stall, self.store.open_writer_under(IDS[u], offset, state, wl)).await? {
            Err(BlobError::NotFound) if offset == 0 => {
                if let Err(e) = self.drive("reset (open)", stall, self.store.reset(IDS[u], wl)).await? {
                    return Ok(Err(e));
                }
                self.drive("open_writer_under", stall, self.store.open_writer_under(IDS[u], offset, state, wl)).await
            }
            r => Ok(r),
        }
    }

    /// A fenced catalog commit; `false` when the fence is stale.
    fn commit(&mut self, u: usize, fence: u64, offset: u64, state: &BlobState, data: &[u8]) -> bool {
        self.refused = false;
        if self.catalog_down > 0 {
            // The catalog is away ([`Op::CatalogFails`]).
            self.catalog_down -= 1;
            self.refused = true;
            return false;
        }
        let row = &mut self.rows[u];
        if !row.live || row.finished || fence != row.fence {
            return false;
        }
        assert_eq!(data.len() as u64, offset);
        row.offset = offset;
        row.state = state.clone();
        row.data = data.to_vec();
        true
    }

    fn committed_data(&self, s: &Slot) -> Vec<u8> {
        let mut d = self.rows[s.u].data[..(s.committed as usize).min(self.rows[s.u].data.len())].to_vec();
        if d.len() as u64 != s.committed {
            // Another writer committed less since (this one's view is stale): use its own view.
            d.resize(s.committed as usize, 0);
        }
        d
    }

    fn no_xml(&self, what: &str, e: &BlobError) -> Check {
        if self.cfg.check_no_xml {
            let t = e.to_string();
            check!(
                !(t.contains("<Error>") || t.contains("<Code>") || t.contains("RequestId")),
                "{what}: the store's raw XML reaches the caller: {t}"
            );
        }
        Ok(())
    }

    /// Whether the store's memory budget refused a reservation since the last look (a 503 by
    /// design: no room within its bound).
    fn budget_refused(&mut self) -> bool {
        let refused = self.store.memory().map_or(0, |m| m.refused);
        let by_budget = refused > self.budget_refusals;
        self.budget_refusals = refused;
        by_budget
    }

    /// A roll back of `u` from its acknowledged offset because the store answered `Lost`: right
    /// only when the store lost the bytes for real (a lifecycle abort). After an injected 404 the
    /// check is [`Config::check_confirmed_loss`]'s; after a 411 there is none (see `saw_411`).
    fn loss_is_real(&self, u: usize, what: &str, e: &BlobError) -> Check {
        let row = &self.rows[u];
        if row.lost_for_real || row.offset == 0 || self.saw_411 || (self.saw_404 && !self.cfg.check_confirmed_loss) {
            return Ok(());
        }
        let open = self.s3.open_uploads(&key(u));
        Err(format!(
            "{what}: answered {e}, and the engine rolls {} back from its acknowledged offset \
             {}, though no lifecycle rule took its bytes (open multipart uploads: {open:?})",
            IDS[u], row.offset
        ))
    }

    /// What the engine does when a writer's call failed (`Appender::released`).
    async fn writer_failed(&mut self, w: usize, what: &str, e: BlobError, faulted: bool) -> Check {
        if std::env::var("FERRY_S3_MODEL_TRACE").is_ok() {
            eprintln!("  {what} failed: {e}");
        }
        self.no_xml(what, &e)?;
        let Some(mut s) = self.slots[w].take() else { return Ok(()) };
        let u = s.u;
        // A fault since this writer opened may be the cause (its parts go in tasks of their own),
        // or a budget that had no room within its bound (503, by design).
        let faulted = faulted || self.budget_refused() || self.s3.hits() != s.mark;
        match &e {
            BlobError::LeaseLost | BlobError::Cut => {
                check!(s.lease.expired() || faulted, "{what}: {e} while the lease held and the store answered");
                s.broken = true;
                // note_in_transit: the last committed state amended, under this writer's fence.
                if let Some(b) = s.w.amend(&s.committed_state) {
                    let data = self.committed_data(&s);
                    self.commit(u, s.fence, s.committed, &b, &data);
                }
                // Its request is over: the writer goes (the engine drops it with the request).
                return Ok(());
            }
            BlobError::Lost { kept, .. } => {
                self.loss_is_real(u, what, &e)?;
                let kept = *kept;
                let (wl, lease, fence) = (s.wl.clone(), s.lease.clone(), s.fence);
                drop(s);
                // roll_back_to(kept): the engine's reset under the writer's lease + fenced commit at 0.
                if kept == 0 && self.rows[u].live && !self.rows[u].finished {
                    let created = self.drive("reset (roll back)", Some(&lease), self.store.reset(IDS[u], &wl)).await?;
                    if created.is_ok() && self.commit(u, fence, 0, &BlobState::default(), &[]) {
                        self.rows[u].lost_for_real = false;
                    }
                }
                self.rows[u].released = true;
                return Ok(());
            }
            _ => {}
        }
        check!(faulted, "{what} failed on a store that answered every request: {e}");
        // Rewind to the committed offset, note the numbers taken, release.
        let back = self.drive("rewind", Some(&s.lease.clone()), s.w.rewind(s.committed)).await?;
        if back.is_ok() {
            s.written.clear();
        }
        // A note that fails lets the lease run out (`LetRunOut`): the next holder is a takeover.
        let noted = match s.w.amend(&s.committed_state) {
            Some(b) => {
                let data = self.committed_data(&s);
                self.commit(u, s.fence, s.committed, &b, &data)
            }
            None => true,
        };
        if noted && s.fence == self.rows[u].fence {
            self.rows[u].released = true;
        }
        Ok(())
    }

    /// `op` with its writer picked among the writers there are (`w` modulo their number), and an
    /// [`Op::Open`] given the first free slot.
    fn resolve(&self, op: &Op) -> Op {
        let live: Vec<usize> = (0..SLOTS).filter(|&i| self.slots[i].is_some()).collect();
        let pick = |w: usize| if live.is_empty() { w } else { live[w % live.len()] };
        match op.clone() {
            Op::Open { u, .. } => Op::Open { w: (0..SLOTS).find(|&i| self.slots[i].is_none()).unwrap_or(0), u },
            Op::Write { w, n, declared } => Op::Write { w: pick(w), n, declared },
            Op::Sync { w } => Op::Sync { w: pick(w) },
            Op::Finish { w } => Op::Finish { w: pick(w) },
            Op::FinishCrash { w } => Op::FinishCrash { w: pick(w) },
            Op::Stall { w } => Op::Stall { w: pick(w) },
            Op::Release { w } => Op::Release { w: pick(w) },
            other => other,
        }
    }

    async fn step(&mut self, op: &Op) -> Check {
        let op = &self.resolve(op);
        let hits = self.s3.hits();
        let faults_before = self.s3.faults_left();
        let _ = faults_before;
        let from = self.s3.next_seq();
        let finished_before: Vec<bool> = self.rows.iter().map(|r| r.live && r.finished).collect();
        let faulted = |m: &Model| m.s3.hits() != hits;
        match *op {
            Op::Open { w, u } => {
                if self.slots[w].is_some() || !self.rows[u].live || self.rows[u].finished || self.rows[u].pending_finish {
                    return Ok(());
                }
                // Whoever holds `u` now stalls past its lease: this is a takeover.
                let mut takeover = !self.rows[u].released;
                for s in self.slots.iter().flatten().filter(|s| s.u == u && !s.broken) {
                    s.lease.expire();
                    takeover = true;
                }
                let row = &mut self.rows[u];
                row.fence += 1;
                if takeover {
                    row.generation += 1;
                }
                row.released = false;
                let (fence, generation, offset, state) = (row.fence, row.generation, row.offset, row.state.clone());
                let lease = Lease::new();
                let wl = lease.write_lease(fence, generation);
                let opened = self.open_at(u, offset, &state, &wl, Some(&lease)).await?;
                match opened {
                    Ok(writer) => {
                        check!(writer.position() == offset, "a writer opened at {offset} says it is at {}", writer.position());
                        self.serial += 1;
                        self.slots[w] = Some(Slot {
                            u,
                            w: writer,
                            fence,
                            lease,
                            wl: wl.clone(),
                            serial: self.serial,
                            committed: offset,
                            committed_state: state,
                            written: Vec::new(),
                            broken: false,
                            mark: hits,
                        });
                    }
                    Err(e) => {
                        self.no_xml("open_writer_under", &e)?;
                        let by_budget = self.budget_refused();
                        check!(
                            by_budget || faulted(self),
                            "open_writer_under({}, {offset}) failed on a store that answered every request: {e}",
                            IDS[u]
                        );
                        self.rows[u].released = true;
                    }
                }
            }
            Op::Write { w, n, declared } => {
                let Some(s) = self.slots[w].as_mut() else { return Ok(()) };
                if s.broken {
                    return Ok(());
                }
                let pos = s.position();
                let data = bytes_of(s.serial, pos, n);
                if declared {
                    s.w.expecting(pos + n);
                }
                let lease = s.lease.clone();
                let s = self.slots[w].as_mut().unwrap();
                let fut = s.w.write(Bytes::from(data.clone()));
                let r = drive_free(&self.s3, self.slow, self.stall_holds, self.stall_late, "write", Some(&lease), fut).await?;
                match r {
                    Ok(()) => self.slots[w].as_mut().unwrap().written.extend_from_slice(&data),
                    Err(e) => {
                        let f = faulted(self);
                        self.writer_failed(w, "write", e, f).await?
                    }
                }
            }
            Op::Sync { w } => {
                self.sync(w, hits).await?;
            }
            Op::Finish { w } | Op::FinishCrash { w } => {
                let crash = matches!(op, Op::FinishCrash { .. });
                if !self.sync(w, hits).await? {
                    return self.after(from, &finished_before).await;
                }
                let Some(s) = self.slots[w].as_mut() else { return Ok(()) };
                let u = s.u;
                if s.broken || s.fence != self.rows[u].fence {
                    return self.after(from, &finished_before).await;
                }
                // That commit declared the length: the upload takes no more bytes, and a
                // completion that fails from here is the finisher's to repeat.
                self.rows[u].pending_finish = true;
                if crash {
                    self.slots[w] = None;
                    return self.after(from, &finished_before).await;
                }
                let lease = s.lease.clone();
                let s = self.slots[w].as_mut().unwrap();
                let r = drive_free(&self.s3, self.slow, self.stall_holds, self.stall_late, "complete", Some(&lease), s.w.complete()).await?;
                match r {
                    Ok(whole) => {
                        let s = self.slots[w].take().unwrap();
                        let state = whole.unwrap_or_else(|| s.committed_state.clone());
                        let data = self.rows[u].data.clone();
                        check!(
                            self.s3.object(&key(u)).as_deref() == Some(&data[..]),
                            "complete() succeeded but the object of {} does not hold the {} bytes committed (it holds {:?} bytes)",
                            IDS[u],
                            data.len(),
                            self.s3.object(&key(u)).map(|o| o.len())
                        );
                        if s.fence == self.rows[u].fence {
                            self.rows[u].state = state;
                            self.rows[u].finished = true;
                            self.rows[u].released = true;
                        }
                    }
                    Err(e) => {
                        let f = faulted(self);
                        self.writer_failed(w, "complete", e, f).await?
                    }
                }
            }
            Op::Finisher { u } => {
                let row = &self.rows[u];
                if !row.live || row.finished || !row.pending_finish {
                    return Ok(());
                }
                for s in self.slots.iter().flatten().filter(|s| s.u == u) {
                    s.lease.expire();
                }
                let f = self.finish_committed(u, false).await?;
                if let Err(e) = f {
                    check!(faulted(self), "{e}");
                }
            }
            Op::Stall { w } => {
                if let Some(s) = &self.slots[w] {
                    s.lease.expire();
                }
            }
            Op::Release { w } => {
                if let Some(s) = self.slots[w].take() {
                    if !s.broken && !s.lease.expired() && s.fence == self.rows[s.u].fence {
                        self.rows[s.u].released = true;
                    }
                }
            }
            Op::Compose { stale } => self.compose(stale, hits).await?,
            Op::Reset { u, stale } => {
                let row = &self.rows[u];
                if !row.live || (row.finished && !stale) || (stale && !row.finished) {
                    return Ok(());
                }
                let fence = if stale { row.fence } else { row.fence + 1 };
                if !stale {
                    for s in self.slots.iter().flatten().filter(|s| s.u == u) {
                        s.lease.expire();
                    }
                    self.rows[u].fence = fence;
                    self.rows[u].generation += 1;
                    self.rows[u].pending_finish = false;
                }
                // The roll back's lease: a stale one ran out during the stall.
                let lease = Lease::new();
                if stale {
                    lease.expire();
                }
                let wl = lease.write_lease(fence, self.rows[u].generation);
                let r = self.drive("reset", None, self.store.reset(IDS[u], &wl)).await?;
                match r {
                    Err(BlobError::LeaseLost) if stale => {}
                    Ok(()) => {
                        // A stale reset's commit is fenced: its fence is the one it saw before the stall.
                        if !stale && self.commit(u, fence, 0, &BlobState::default(), &[]) {
                            self.rows[u].released = true;
                            self.rows[u].lost_for_real = false;
                        }
                    }
                    Err(e) => {
                        self.no_xml("reset", &e)?;
                        check!(faulted(self), "reset({}) failed on a store that answered every request: {e}", IDS[u]);
                    }
                }
            }
            Op::Abort { u } | Op::Delete { u } => {
                let row = &self.rows[u];
                if !row.live || (matches!(op, Op::Abort { .. }) && row.finished) {
                    return Ok(());
                }
                // The sweeper or DELETE runs only once no writer holds the lease.
                for s in self.slots.iter().flatten().filter(|s| s.u == u) {
                    s.lease.expire();
                }
                // The row is gone (or tombstoned) first: nothing names the bytes any more.
                let gone = Unreferenced::vouched(IDS[u]);
                let r = self.drive("delete", None, self.store.delete(&gone)).await?;
                match r {
                    Ok(()) => {
                        self.rows[u].live = false;
                        self.rows[u].finished = false;
                        self.rows[u].fence += 1;
                    }
                    Err(e) => {
                        self.no_xml("delete", &e)?;
                        check!(faulted(self), "delete/abort({}) failed on a store that answered every request: {e}", IDS[u]);
                    }
                }
            }
            Op::Restart => {
                for s in self.slots.iter_mut() {
                    if let Some(s) = s.take() {
                        // The process died holding it: the next writer takes over.
                        if s.fence == self.rows[s.u].fence {
                            self.rows[s.u].released = false;
                        }
                    }
                }
                self.store = new_store(&self.s3, self.cfg).await;
                self.budget_refusals = 0;
            }
            Op::Fault { on, status, times } => {
                let times = if status == 501 && on == On::UploadPartCopy { 1000 } else { times };
                let status = if status == 404 && on == On::AbortMultipart && !self.cfg.abort_404 { 503 } else { status };
                self.saw_404 |= status == 404;
                self.saw_411 |= status == 411;
                self.s3.inject(on.kind(), &format!("{PREFIX}/"), Fault::Status(status), times);
            }
            Op::Hold { on, stall } => {
                self.stall_holds = stall;
                self.s3.inject(on.kind(), &format!("{PREFIX}/"), Fault::Hold, 1);
            }
            Op::Late { stall } => {
                self.stall_late = stall;
                self.s3.inject(Kind::UploadPart, &format!("{PREFIX}/"), Fault::Late, 1);
            }
            Op::CatalogFails { times } => self.catalog_down = times,
            Op::DeliverLate => {
                self.s3.deliver_late();
            }
            Op::LifecycleAbort { u } => {
                if !self.s3.lifecycle_abort(&key(u)).is_empty() && self.rows[u].live && !self.rows[u].finished {
                    self.rows[u].lost_for_real = true;
                }
            }
            Op::SlowComplete => {
                self.slow = true;
                self.s3.hold_completions_for(Some(ferry::blob::s3::REQUEST_DEADLINE + Duration::from_secs(1)));
            }
            Op::Ping => {
                let from = self.s3.next_seq();
                let r = self.drive("ping", None, self.store.ping()).await?;
                if let Err(e) = &r {
                    self.no_xml("ping", e)?;
                    check!(faulted(self), "ping failed on a store that answered every request: {e}");
                }
                if self.cfg.check_ping_reads {
                    let writes: Vec<String> =
                        self.s3.seen_since(from).iter().filter(|s| s.kind.writes()).map(|s| format!("{:?} {}", s.kind, s.key)).collect();
                    check!(writes.is_empty(), "the readiness probe changed the store: {writes:?}");
                }
            }
        }
        self.after(from, &finished_before).await
    }

    /// Sync writer `w` and commit its state; `Ok(false)` when there was nothing to commit.
    async fn sync(&mut self, w: usize, hits: u64) -> Result<bool, String> {
        let Some(s) = self.slots[w].as_mut() else { return Ok(false) };
        if s.broken {
            return Ok(false);
        }
        let lease = s.lease.clone();
        let r = drive_free(&self.s3, self.slow, self.stall_holds, self.stall_late, "sync", Some(&lease), s.w.sync()).await?;
        let faulted = self.s3.hits() != hits;
        match r {
            Ok(state) => {
                let s = self.slots[w].as_mut().unwrap();
                let state = s.w.amend(&state).unwrap_or(state);
                let pos = s.position();
                check!(s.w.position() == pos, "the writer says it is at {} where the model has {pos}", s.w.position());
                let (u, fence) = (s.u, s.fence);
                let mut data = self.committed_data(self.slots[w].as_ref().unwrap());
                data.extend_from_slice(&self.slots[w].as_ref().unwrap().written);
                let ok = self.commit(u, fence, pos, &state, &data);
                if !ok && self.refused {
                    // The PATCH fails (503); the writer's bytes since the last commit are released.
                    self.writer_failed(w, "sync's commit", BlobError::Unavailable("the catalog is away".into()), true).await?;
                    return Ok(false);
                }
                if ok {
                    let s = self.slots[w].as_mut().unwrap();
                    s.committed = pos;
                    s.committed_state = state;
                    s.written.clear();
                    Ok(true)
                } else {
                    // Fenced: another writer took the upload over; this one goes.
                    self.slots[w] = None;
                    Ok(false)
                }
            }
            Err(e) => {
                self.writer_failed(w, "sync", e, faulted).await?;
                Ok(false)
            }
        }
    }

    async fn compose(&mut self, stale: bool, hits: u64) -> Check {
        let f = FINAL;
        let row = &self.rows[f];
        if !row.live {
            return Ok(());
        }
        let sources: Vec<(String, u64)> = if row.finished {
            if !stale {
                return Ok(());
            }
            // The composer checked the final unfinished, saw these sources, then stalled.
            row.sources.clone()
        } else {
            (0..WRITABLE).filter(|&u| self.rows[u].live && self.rows[u].finished).map(|u| (IDS[u].to_string(), self.rows[u].offset)).collect()
        };
        if sources.is_empty() || sources.iter().all(|s| s.1 == 0) {
            return Ok(());
        }
        let fence = if stale && row.finished { row.fence } else { row.fence + 1 };
        if !(stale && row.finished) {
            self.rows[f].fence = fence;
        }
        let want: Vec<u8> = sources.iter().flat_map(|(id, _)| self.rows[IDS.iter().position(|x| x == id).unwrap()].data.clone()).collect();
        // The final's lease: a stale composer's ran out during its stall.
        let lease = Lease::new();
        if stale && self.rows[f].finished {
            lease.expire();
        }
        let wl = lease.write_lease(fence, self.rows[f].generation);
        let r = self.drive("compose", None, self.store.compose(IDS[f], &sources, &wl)).await?;
        let faulted = self.s3.hits() != hits;
        let no_copy = self.s3.seen().iter().any(|s| s.kind == Kind::UploadPartCopy && s.status == 501);
        match r {
            Ok(true) => {
                if stale && self.rows[f].finished {
                    // Its commit is fenced.
                    return Ok(());
                }
                check!(
                    self.s3.object(&key(f)).as_deref() == Some(&want[..]),
                    "compose({:?}) succeeded but the final does not hold their {} bytes",
                    sources,
                    want.len()
                );
                let row = &mut self.rows[f];
                if row.fence == fence {
                    row.finished = true;
                    row.offset = want.len() as u64;
                    row.data = want;
                    row.state = BlobState::default();
                    row.sources = sources;
                    row.released = true;
                }
            }
            Ok(false) => {}
            Err(e) => {
                self.no_xml("compose", &e)?;
                if self.cfg.check_compose_fallback && no_copy {
                    return Err(format!("compose on a store without UploadPartCopy (501 NotImplemented) did not fall back to streaming: {e}"));
                }
                check!(faulted || (stale && self.rows[f].finished), "compose({sources:?}) failed on a store that answered every request: {e}");
            }
        }
        Ok(())
    }

    /// The invariants after a step whose requests start at `from`.
    async fn after(&mut self, from: u64, finished_before: &[bool]) -> Check {
        let seen = self.s3.seen_since(from);
        for (u, id) in IDS.iter().enumerate() {
            let row = &self.rows[u];
            let k = key(u);
            if row.live && row.finished {
                let obj = self.s3.object(&k);
                check!(
                    obj.as_deref() == Some(&row.data[..]),
                    "finished {id} no longer holds its {} bytes: the store has {}",
                    row.data.len(),
                    obj.map_or("no object".to_string(), |o| format!("{} other bytes", o.len()))
                );
                if finished_before[u] {
                    let deleted: Vec<String> = seen
                        .iter()
                        .filter(|s| s.key == k && matches!(s.kind, Kind::DeleteObject | Kind::DeleteObjects) && s.status < 300)
                        .map(|s| format!("{:?}", s.kind))
                        .collect();
                    check!(deleted.is_empty(), "finished {id} was deleted ({deleted:?}) while it stayed finished");
                }
            }
            if !row.live || row.finished {
                let what = if row.live { "finished" } else { "deleted" };
                let mps: Vec<(String, String)> = self.s3.open_uploads(&k).into_iter().filter(|(kk, _)| *kk == k).collect();
                check!(mps.is_empty(), "{what} {id} still has multipart uploads {mps:?}");
                let left: Vec<String> = self.s3.keys(&format!("{k}.")).into_iter().collect();
                check!(left.is_empty(), "{what} {id} left {left:?}");
                if !row.live {
                    check!(self.s3.object(&k).is_none(), "deleted {id} still has its object");
                }
            }
        }
        // Memory.
        let buffered = self.store.buffered();
        let writers = self.slots.iter().flatten().count() as u64;
        check!(
            buffered <= self.cfg.max_buffer.div_ceil(MIB) * MIB + writers * MIB,
            "{buffered} bytes buffered, over the budget of {}",
            self.cfg.max_buffer
        );
        if self.cfg.check_tail_budget {
            let holding = self.slots.iter().flatten().filter(|s| s.position() % PART != 0).count() as u64;
            check!(
                buffered >= holding * ferry::blob::s3::BUDGET_UNIT,
                "{holding} writers hold bytes of an open part but only {buffered} bytes of budget are reserved: bytes read or kept outside the budget"
            );
        }
        // The store's rules.
        let twice: Vec<(String, u32)> = self.s3.completions_at_once().into_iter().filter(|(_, n)| *n > 1).collect();
        check!(twice.is_empty(), "CompleteMultipartUpload of one multipart upload was in flight more than once at a time: {twice:?}");
        if self.cfg.check_length_header {
            let bare: Vec<String> = seen.iter().filter(|s| s.no_length).map(|s| format!("{:?} {}", s.kind, s.key)).collect();
            check!(bare.is_empty(), "PUT/POST requests without Content-Length: {bare:?}");
        }
        Ok(())
    }

    /// The finisher (`finishing.rs`): a writer taken over at `u`'s committed state completes it,
    /// which must then hold exactly the committed bytes. `Ok(Err)`: it failed where a fault may
    /// be the cause; a loss the store really had rolls `u` back (`end`: then nothing is
    /// compared).
    async fn finish_committed(&mut self, u: usize, end: bool) -> Result<Check, String> {
        let row = self.rows[u].clone();
        self.rows[u].fence += 1;
        self.rows[u].generation += 1;
        let (fence, generation) = (self.rows[u].fence, self.rows[u].generation);
        let lease = Lease::new();
        let wl = lease.write_lease(fence, generation);
        let what = if end { "at the end, a finisher" } else { "a finisher" };
        let mut w = match self.open_at(u, row.offset, &row.state, &wl, None).await? {
            Ok(w) => w,
            Err(e) => return Ok(Err(format!("{} acknowledged {} bytes; {what} opened at that committed state fails: {e}", IDS[u], row.offset))),
        };
        let mut done = match self.drive("sync (finisher)", None, w.sync()).await? {
            Ok(_) => self.drive("complete (finisher)", None, w.complete()).await?.map(drop),
            Err(e) => Err(e),
        };
        drop(w);
        if let Err(e) = done {
            self.no_xml(what, &e)?;
            if matches!(e, BlobError::Lost { kept: 0, .. }) {
                self.loss_is_real(u, what, &e)?;
                let created = self.drive("reset (roll back)", None, self.store.reset(IDS[u], &wl)).await?;
                if created.is_ok() && self.commit(u, fence, 0, &BlobState::default(), &[]) {
                    self.rows[u].lost_for_real = false;
                    self.rows[u].pending_finish = false;
                }
                self.rows[u].released = true;
                return Ok(Ok(()));
            }
            done = Err(e);
            return Ok(Err(format!("{} acknowledged {} bytes; {what} cannot complete them: {}", IDS[u], row.offset, done.unwrap_err())));
        }
        let obj = self.s3.object(&key(u));
        check!(
            obj.as_deref() == Some(&row.data[..]),
            "{} acknowledged {} bytes, but {what} completed it from its committed state holding {}",
            IDS[u],
            row.offset,
            obj.map_or("no object".into(), |o| if o.len() == row.data.len() {
                format!("{} other bytes", o.len())
            } else {
                format!("{} bytes", o.len())
            })
        );
        if self.rows[u].fence == fence {
            let r = &mut self.rows[u];
            r.finished = true;
            r.pending_finish = false;
            r.state = BlobState::default();
            r.released = true;
        }
        Ok(Ok(()))
    }

    /// The end: every fault gone, late parts landed; each live unfinished upload is taken over at
    /// its committed state and finished, and must hold exactly the model's bytes.
    async fn finale(&mut self) -> Check {
        self.s3.clear_faults();
        self.s3.hold_completions_for(None);
        self.s3.release_holds();
        self.s3.deliver_late();
        self.slow = false;
        for s in self.slots.iter_mut() {
            *s = None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.s3.deliver_late();
        for u in 0..WRITABLE {
            let row = self.rows[u].clone();
            if !row.live || row.finished {
                continue;
            }
            self.finish_committed(u, true).await??;
        }
        Ok(())
    }
}

/// Run `fut` (a call of the store or a writer) within the deadline, handling what the S3 holds
/// meanwhile: after [`HOLD_FOR`], the lease `stall` (the caller's, if it has one) runs out when a
/// late part's request hangs (or a held one, with `stall_holds`) — its writer stalls past its
/// lease while its request hangs; then, or at once without one, held requests are let go and
/// late parts' clients dropped.
async fn drive_free<T>(
    s3: &S3Strict,
    slow: bool,
    stall_holds: bool,
    stall_late: bool,
    what: &str,
    stall: Option<&Lease>,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, String> {
    let start = Instant::now();
    let deadline = if slow { SLOW_DEADLINE } else { DEADLINE };
    tokio::pin!(fut);
    let mut stalled_at: Option<Instant> = None;
    loop {
        tokio::select! {
            r = &mut fut => return Ok(r),
            _ = tokio::time::sleep(Duration::from_millis(25)) => {}
        }
        let waited = start.elapsed();
        let (held, late) = (s3.held(), s3.late_waiting());
        if (held > 0 || late > 0) && waited > HOLD_FOR {
            let stalls = (late > 0 && stall_late) || (held > 0 && stall_holds);
            match (stall.filter(|_| stalls), stalled_at) {
                (Some(l), None) => {
                    l.expire();
                    stalled_at = Some(Instant::now());
                }
                (Some(_), Some(at)) if at.elapsed() < Duration::from_millis(600) => {}
                _ => {
                    s3.release_holds();
                    s3.drop_late_clients();
                }
            }
        }
        if waited > deadline {
            s3.release_holds();
            s3.drop_late_clients();
            return Err(format!("{what} did not return within {} s", deadline.as_secs()));
        }
    }
}

async fn run(cfg: Config, ops: &[Op]) -> Result<(), String> {
    let mut m = Model::new(cfg).await;
    let trace = std::env::var("FERRY_S3_MODEL_TRACE").is_ok();
    for (i, op) in ops.iter().enumerate() {
        let from = m.s3.next_seq();
        let r = m.step(op).await.map_err(|e| format!("step {i} {op:?}: {e}"));
        if trace {
            eprintln!("step {i} {op:?}");
            for s in m.s3.seen_since(from) {
                eprintln!("    {:?} {} ?{} -> {} ({} bytes)", s.kind, s.key, s.query, s.status, s.len);
            }
        }
        r?;
        let w = m
            .slots
            .iter()
            .map(|s| s.as_ref().map_or("-".to_string(), |s| format!("{}{}", IDS[s.u], if s.broken || s.lease.expired() { "!" } else { "" })))
            .collect::<Vec<_>>()
            .join(",");
        m.log.push(format!("{op:?} [{w}]"));
    }
    if std::env::var("FERRY_S3_MODEL_STATS").is_ok() {
        let finished: Vec<bool> = m.rows.iter().map(|r| r.finished).collect();
        eprintln!("STATS ops {} finished {:?} requests {}", ops.len(), finished, m.s3.next_seq());
        if std::env::var("FERRY_S3_MODEL_STATS").as_deref() == Ok("ops") {
            eprintln!("OPS {}", m.log.join(" | "));
        }
    }
    m.finale().await.map_err(|e| format!("at the end: {e}"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn s3_store_keeps_the_models_promises() {
    let cases = std::env::var("FERRY_S3_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(32);
    let cfg = Config::from_env();
    let rt = runtime();
    let config = ProptestConfig { cases, max_shrink_iters: 400, failure_persistence: None, ..ProptestConfig::default() };
    proptest!(config, |(ops in proptest::collection::vec(op(cfg), 1..32))| {
        let r = rt.block_on(run(cfg, &ops));
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    });
}

/// Replay a sequence the search found (`FERRY_S3_MODEL_TRACE=1` prints every request).
fn replay(cfg: Config, ops: Vec<Op>) {
    if let Err(e) = runtime().block_on(run(cfg, &ops)) {
        panic!("{ops:?}: {e}");
    }
}

/// Sequences the search found that pass, kept as fixed cases.
#[test]
fn found_sequences() {
    use Op::*;
    // A lifecycle abort of an upload committed at its full offset: the finisher rolls it back
    // (the store lost it), never "finished".
    replay(
        Config::search(),
        vec![Open { w: 1, u: 0 }, Write { w: 1, n: 66536, declared: false }, Delete { u: 1 }, LifecycleAbort { u: 0 }, FinishCrash { w: 1 }],
    );
    // A reset whose `.created` PUT fails leaves no blob at offset 0; the next writer creates it.
    replay(Config::search(), vec![Fault { on: On::PutObject, status: 404, times: 1 }, Reset { u: 0, stale: false }]);
}

/// Point 1: a composer that checked the final unfinished and stalled composes after another
/// built it: `compose` begins with `remove_all`, which deletes the finished final (here the
/// sources are still there, so it is built again; had the client deleted them, as
/// `ferry upload --parallel` does, the final would be gone for good).
/// Found by the search with `FERRY_S3_MODEL_ON=stale-compose`.
#[test]
fn found_point1_stale_compose_deletes_the_finished_final() {
    use Op::*;
    replay(
        Config { stale_compose: true, ..Config::search() },
        vec![
            Open { w: 0, u: 0 },
            Write { w: 0, n: 600000, declared: false },
            Write { w: 0, n: 600000, declared: false },
            Finish { w: 0 },
            Compose { stale: false },
            Compose { stale: true },
        ],
    );
}

/// Point 1: a roll back to 0 decided before a stall (`create` → `remove_all`, before its fenced
/// commit) deletes the upload finished meanwhile. Found with `FERRY_S3_MODEL_ON=stale`.
#[test]
fn found_point1_stale_reset_deletes_a_finished_upload() {
    use Op::*;
    replay(Config { stale_reset: true, ..Config::search() }, vec![Open { w: 2, u: 0 }, Finish { w: 2 }, Reset { u: 0, stale: true }]);
}

/// Point 1 (roll_back_to's shape): after a lifecycle abort, the writer's roll back runs `create`
/// (which removes the tail) and then its commit fails (the catalog is away): the committed
/// state names a tail that is gone, and every later writer fails on it — the upload can be
/// neither resumed nor rolled back. Found with `FERRY_S3_MODEL_ON=notes`.
#[test]
fn found_point1_rollback_removes_the_tail_before_its_commit() {
    use Op::*;
    replay(
        Config { catalog_faults: true, ..Config::search() },
        vec![
            Open { w: 0, u: 0 },
            Write { w: 0, n: 66536, declared: false },
            Sync { w: 0 },
            Finisher { u: 0 },
            CatalogFails { times: 1 },
            LifecycleAbort { u: 0 },
            Open { w: 0, u: 0 },
            Write { w: 0, n: 1, declared: false },
            Write { w: 0, n: 196615, declared: false },
        ],
    );
}

/// Point 2: with a budget of one part, a writer holding one byte of an open part keeps the
/// next writer waiting for budget without bound: a writer of another upload, and the taker of
/// the same upload (the stalled writer still holds its reservation).
/// Found with `FERRY_S3_MODEL_ON=budget` (the second sequence; the first is its two-upload twin).
#[test]
fn found_point2_a_writer_waits_for_budget_without_bound() {
    use Op::*;
    replay(
        Config { max_buffer: MIB, ..Config::search() },
        vec![Open { w: 0, u: 0 }, Write { w: 0, n: 1, declared: false }, Open { w: 1, u: 1 }, Write { w: 1, n: 1, declared: false }],
    );
    replay(
        Config { max_buffer: MIB, ..Config::search() },
        vec![Open { w: 0, u: 0 }, Write { w: 0, n: 1, declared: false }, Open { w: 0, u: 0 }, Write { w: 1, n: 1, declared: false }],
    );
}

/// Point 3: a writer that takes an upload over reads its tail into memory with no reservation.
/// Found with `FERRY_S3_MODEL_ON=tail`.
#[test]
fn found_point3_a_resumed_tail_is_read_outside_the_budget() {
    use Op::*;
    replay(
        Config { check_tail_budget: true, ..Config::search() },
        vec![Open { w: 0, u: 0 }, Write { w: 0, n: 66536, declared: false }, Sync { w: 0 }, Open { w: 0, u: 0 }],
    );
}

/// Point 4: UploadPartCopy goes without `Content-Length`; a store that requires it (AWS: 411
/// MissingContentLength) fails every compose, and the refusal is `Io`, retried as internal.
/// Found with `FERRY_S3_MODEL_ON=length`.
#[test]
fn found_point4_upload_part_copy_goes_without_content_length() {
    use Op::*;
    replay(
        Config { require_length: true, check_length_header: true, ..Config::search() },
        vec![Open { w: 0, u: 0 }, Write { w: 0, n: 1100000, declared: false }, Finish { w: 0 }, Compose { stale: false }],
    );
}

/// Point 4: one 404 from CompleteMultipartUpload is taken as proof that the multipart upload
/// is gone: the upload is rolled back from its acknowledged 65 536 bytes while the store still
/// has them. Found with `FERRY_S3_MODEL_ON=loss`.
#[test]
fn found_point4_one_404_is_taken_as_proof_of_loss() {
    use Op::*;
    let cfg = Config { check_confirmed_loss: true, ..Config::search() };
    replay(
        cfg,
        vec![Open { w: 0, u: 0 }, Write { w: 0, n: 65536, declared: false }, Fault { on: On::Complete, status: 404, times: 1 }, Finish { w: 0 }],
    );
}

/// Point 4, an open question: one refusal for good of CompleteMultipartUpload (a 411 here) rolls
/// the upload back from its acknowledged 65 536 bytes while the store still has every part. The
/// design says a completion the store refuses for good rolls back (it can never succeed with
/// those parts); Build 3 says a permanent refusal fails the operation and names the store. Found
/// by the search on e8a2599 (the model exempts 411s from the loss check until this is decided).
#[test]
fn found_point4_a_refused_completion_rolls_back_acknowledged_bytes() {
    use Op::*;
    let rt = runtime();
    let ops =
        vec![Fault { on: On::Complete, status: 411, times: 1 }, Open { w: 0, u: 0 }, Write { w: 0, n: 65536, declared: false }, Finish { w: 0 }];
    // Without the 411 exemption: a roll back of acknowledged bytes is a failure.
    let r = rt.block_on(async {
        let mut model = Model::new(Config { check_confirmed_loss: true, ..Config::search() }).await;
        for (i, op) in ops.iter().enumerate() {
            model.saw_411 = false;
            model.step(op).await.map_err(|e| format!("step {i} {op:?}: {e}"))?;
        }
        Ok::<(), String>(())
    });
    if let Err(e) = r {
        panic!("{ops:?}: {e}");
    }
}

/// Point 4: a store without UploadPartCopy (501 NotImplemented) is retried as unavailable
/// instead of composing by streaming. Written by hand (the search did not reach a 501 on
/// UploadPartCopy after a finished source of 1 MiB in 1 500 cases).
#[test]
fn found_point4_no_upload_part_copy_no_fallback() {
    use Op::*;
    replay(
        Config { check_compose_fallback: true, ..Config::search() },
        vec![
            Open { w: 0, u: 0 },
            Write { w: 0, n: 1_100_000, declared: false },
            Finish { w: 0 },
            Fault { on: On::UploadPartCopy, status: 501, times: 1 },
            Compose { stale: false },
        ],
    );
}

/// Point 4 (of the same kind): a 404 from AbortMultipartUpload is taken as done, though
/// ListMultipartUploads still lists the upload: after `abort` returned, a multipart upload is
/// left. Found by the search on today's code with every 404 allowed (`FERRY_S3_MODEL_ON=abort404`).
#[test]
fn found_point4_a_404_from_abort_leaves_the_multipart_upload() {
    use Op::*;
    replay(
        Config { abort_404: true, ..Config::search() },
        vec![
            Open { w: 0, u: 0 },
            Write { w: 0, n: 65536, declared: false },
            Fault { on: On::AbortMultipart, status: 404, times: 3 },
            FinishCrash { w: 0 },
            Abort { u: 0 },
        ],
    );
}

/// Point 4: a multipart upload a lifecycle rule aborted, on a store that answers requests on it
/// with 500 (moto does): the finisher's UploadPart is retried as unavailable, for ever, instead
/// of the upload being rolled back to what the store still has. Found with
/// `FERRY_S3_MODEL_ON=moto` (in a 29-step sequence; this one is cut by hand).
#[test]
fn found_point4_an_aborted_upload_answered_with_500_is_retried_for_ever() {
    use Op::*;
    replay(
        Config { moto: true, ..Config::search() },
        vec![Open { w: 0, u: 0 }, Write { w: 0, n: 66536, declared: false }, Sync { w: 0 }, LifecycleAbort { u: 0 }],
    );
}

/// Point 4, on the lead's fixes (14b3a6e): a multipart upload a lifecycle rule aborted, on a
/// store that answers CompleteMultipartUpload on it with 500 (moto): the finisher's completion
/// is retried as unavailable for ever (UploadPart's 500 is confirmed by listing; the
/// completion's is not). Found by the search with the fixed points' checks on.
#[test]
fn found_point4_a_completion_of_an_aborted_upload_answered_with_500_is_retried_for_ever() {
    use Op::*;
    replay(
        Config { moto: true, ..Config::search() },
        vec![
            Open { w: 0, u: 0 },
            Write { w: 0, n: 65536, declared: false },
            Sync { w: 0 },
            Open { w: 0, u: 0 },
            Open { w: 0, u: 0 },
            FinishCrash { w: 0 },
            LifecycleAbort { u: 0 },
        ],
    );
}

/// Point 5: a completion the store takes longer than ferry's request deadline to assemble is
/// sent again while the first is still in flight. Found with `FERRY_S3_MODEL_ON=slow` (≈ 11 s).
#[test]
fn found_point5_a_slow_completion_is_sent_again() {
    use Op::*;
    replay(
        Config { slow_completions: true, ..Config::search() },
        vec![SlowComplete, Open { w: 0, u: 0 }, Write { w: 0, n: 65536, declared: false }, Finish { w: 0 }],
    );
}

/// Point 6: after a part failed (it may still land: here it does), a failed number note
/// followed by a clean release lets the next writer of the same generation send the same part
/// number again; the late part replaces its part and the completion fails (`InvalidPart`), so the
/// acknowledged 131 072 bytes are rolled back. Written by hand from the description.
/// Fixed: a holder whose note failed does not let its lease go cleanly (`LetRunOut`), so the
/// next writer is a takeover and skips past the numbers.
#[test]
fn found_point6_a_failed_note_and_a_clean_release_reuse_numbers() {
    use Op::*;
    replay(
        Config { catalog_faults: true, ..Config::search() },
        vec![
            Open { w: 0, u: 0 },
            Write { w: 0, n: PART, declared: false },
            Sync { w: 0 },
            Late { stall: false },
            Fault { on: On::UploadPart, status: 503, times: 3 },
            Write { w: 0, n: PART, declared: false },
            CatalogFails { times: 1 },
            Sync { w: 0 },
            Open { w: 0, u: 0 },
            Write { w: 0, n: PART, declared: false },
            Sync { w: 0 },
            DeliverLate,
            Finish { w: 0 },
        ],
    );
}

/// Point 6: the store's raw error XML (bucket, key, request id) reaches the caller. Found with
/// `FERRY_S3_MODEL_ON=xml` (in a longer sequence, through a compose's 411); this one is cut by
/// hand.
#[test]
fn found_point6_raw_store_xml_reaches_the_caller() {
    use Op::*;
    replay(Config { check_no_xml: true, ..Config::search() }, vec![Fault { on: On::PutObject, status: 503, times: 4 }, Reset { u: 0, stale: false }]);
}

/// Point 6: the readiness probe PUTs and DELETEs an object. Found with `FERRY_S3_MODEL_ON=ping`.
#[test]
#[ignore = "judgement (issue 47 point 6): /readyz still writes its probe object, at most every 10 s, so \
            a bucket that stops taking writes shows as not ready; this test asserts a probe never writes"]
fn found_point6_the_readiness_probe_writes() {
    replay(Config { check_ping_reads: true, ..Config::search() }, vec![Op::Ping]);
}

/// The machinery itself: a plain sequence passes every check, with every kind of request seen.
#[test]
fn a_plain_sequence_keeps_every_promise() {
    use Op::*;
    let ops = vec![
        Open { w: 0, u: 0 },
        Write { w: 0, n: 600_000, declared: true },
        Write { w: 0, n: 600_000, declared: false },
        Sync { w: 0 },
        Write { w: 0, n: 1000, declared: false },
        Sync { w: 0 },
        Release { w: 0 },
        Open { w: 1, u: 0 },
        Write { w: 1, n: 70_000, declared: false },
        Finish { w: 1 },
        Open { w: 2, u: 1 },
        Write { w: 2, n: 1000, declared: false },
        Sync { w: 2 },
        Restart,
        Open { w: 2, u: 1 },
        Write { w: 2, n: 1000, declared: false },
        Sync { w: 2 },
        Compose { stale: false },
        Delete { u: 0 },
    ];
    let rt = runtime();
    rt.block_on(async {
        let mut m = Model::new(Config::search()).await;
        for (i, op) in ops.iter().enumerate() {
            m.step(op).await.unwrap_or_else(|e| panic!("step {i} {op:?}: {e}"));
        }
        assert!(m.rows[FINAL].finished, "the final was composed");
        assert_eq!(m.rows[1].offset, 2000);
        let kinds: std::collections::HashSet<Kind> = m.s3.seen().iter().map(|s| s.kind).collect();
        for k in [
            Kind::UploadPart,
            Kind::UploadPartCopy,
            Kind::Complete,
            Kind::CreateMultipart,
            Kind::PutObject,
            Kind::GetObject,
            Kind::HeadObject,
            Kind::ListObjects,
            Kind::ListMultipart,
        ] {
            assert!(kinds.contains(&k), "{k:?} never sent: {kinds:?}");
        }
        m.finale().await.unwrap();
        assert!(m.rows[1].finished || m.s3.object(&key(1)).is_some());
    });
}
