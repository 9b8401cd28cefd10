//! How an export tool written in Rust plugs into ferry's task engine.
//!
//! `cargo run --example paged_export`
//!
//! 1. A stand-in upstream API (an axum server on 127.0.0.1:0) serves
//!    `GET /items?page=N` → `{"items": [...], "next": N+1 | null, "total_pages": 25}`.
//! 2. The job `paged_export` walks the pages, writes one JSON line per item into a ferry file
//!    (`ctx.create_file`), reports the counters `pages` and `items` and a fraction, and after
//!    each page makes the bytes durable (`writer.sync()`) and checkpoints `{cursor, next_page}`.
//! 3. An [`Engine`] over a temporary data dir (SQLite catalog + file blob store, as
//!    `ferry serve` builds it) runs a task. Halfway through, the engine is stopped — as a
//!    restart or a crash would — and a new engine on the same data dir resumes the job from
//!    its last checkpoint instead of starting over.
//! 4. The result is an ordinary ferry file handle (id, size, sha256); the example reads the
//!    file back and checks every item is there exactly once.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use async_trait::async_trait;
use axum::extract::Query;
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use ferry::blob::FsBlobStore;
use ferry::catalog::{Catalog, SqliteCatalog};
use ferry::metrics::Metrics;
use ferry::tasks::{Engine, Job, JobContext, JobError, TaskConfig, TaskStatus};
use ferry::upload::{EngineConfig, FileCursor, FileHandle, UploadEngine};

// ---------------------------------------------------------------------------------------------
// The stand-in upstream API.

const PAGES: u64 = 25;
const PER_PAGE: u64 = 40;
/// Upstream latency per page, so progress is visible and the restart lands mid-export.
const PAGE_LATENCY: Duration = Duration::from_millis(40);

#[derive(Deserialize)]
struct PageQuery {
    page: u64,
}

async fn items(Query(q): Query<PageQuery>) -> Result<Json<Value>, (axum::http::StatusCode, String)> {
    if q.page == 0 || q.page > PAGES {
        return Err((axum::http::StatusCode::NOT_FOUND, format!("no page {}", q.page)));
    }
    tokio::time::sleep(PAGE_LATENCY).await;
    let first = (q.page - 1) * PER_PAGE;
    let items: Vec<Value> =
        (first..first + PER_PAGE).map(|i| json!({ "id": i, "name": format!("item-{i:05}"), "price_cents": i * 7 % 1000 })).collect();
    let next = (q.page < PAGES).then_some(q.page + 1);
    Ok(Json(json!({ "items": items, "next": next, "total_pages": PAGES })))
}

/// Serve the upstream on 127.0.0.1:0; returns its base URL.
async fn start_upstream() -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, Router::new().route("/items", get(items))).await });
    Ok(format!("http://{addr}"))
}

// ---------------------------------------------------------------------------------------------
// The job.

/// Arguments of a `paged_export` task.
#[derive(Deserialize)]
struct ExportArgs {
    /// Upstream base URL; pages are fetched from `{base_url}/items?page=N`.
    base_url: String,
}

/// What the job persists after each page: where the file stands and which page is next.
#[derive(Serialize, Deserialize)]
struct ExportCheckpoint {
    cursor: FileCursor,
    /// `None` once the last page is written.
    next_page: Option<u64>,
    pages: u64,
    items: u64,
}

/// One page of the upstream API.
#[derive(Deserialize)]
struct Page {
    items: Vec<Box<RawValue>>,
    next: Option<u64>,
    #[serde(default)]
    total_pages: Option<u64>,
}

struct PagedExport {
    http: reqwest::Client,
}

impl PagedExport {
    /// Fetch one page, retrying transient failures a few times; cancellable.
    async fn fetch(&self, ctx: &JobContext, base: &str, page: u64) -> Result<Page, JobError> {
        let url = format!("{base}/items?page={page}");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let res = tokio::select! {
                _ = ctx.cancelled().cancelled() => return Err(JobError::Cancelled),
                r = self.http.get(&url).send() => r,
            };
            let err = match res {
                Ok(r) if r.status().is_success() => match r.json::<Page>().await {
                    Ok(p) => return Ok(p),
                    Err(e) => return Err(JobError::failed(format!("page {page}: not the expected JSON: {e}"))),
                },
                Ok(r) if r.status().is_client_error() => return Err(JobError::failed(format!("page {page}: upstream answered {}", r.status()))),
                Ok(r) => format!("upstream answered {}", r.status()),
                Err(e) => e.to_string(),
            };
            if attempt >= 5 {
                return Err(JobError::failed(format!("page {page}: {err} (after {attempt} attempts)")));
            }
            tokio::select! {
                _ = ctx.cancelled().cancelled() => return Err(JobError::Cancelled),
                _ = tokio::time::sleep(Duration::from_millis(200 * attempt)) => {}
            }
        }
    }
}

#[async_trait]
impl Job for PagedExport {
    fn kind(&self) -> &str {
        "paged_export"
    }

    fn validate(&self, args: &RawValue) -> Result<(), String> {
        let a: ExportArgs = serde_json::from_str(args.get()).map_err(|e| e.to_string())?;
        if !a.base_url.starts_with("http://") && !a.base_url.starts_with("https://") {
            return Err("base_url must be an http(s) URL".into());
        }
        Ok(())
    }

    async fn run(&self, ctx: &JobContext, args: &RawValue, checkpoint: Option<Value>) -> Result<Value, JobError> {
        let args: ExportArgs = serde_json::from_str(args.get()).map_err(|e| JobError::failed(e.to_string()))?;
        // Fresh start, or resume exactly where the last checkpoint says.
        let (mut file, mut next, mut pages, mut items) = match checkpoint {
            Some(cp) => {
                let cp: ExportCheckpoint = serde_json::from_value(cp).map_err(|e| JobError::Internal(format!("bad checkpoint: {e}")))?;
                (ctx.reopen_file(&cp.cursor).await?, cp.next_page, cp.pages, cp.items)
            }
            None => (ctx.create_file("export.jsonl", "application/x-ndjson").await?, Some(1), 0, 0),
        };
        while let Some(page) = next {
            ctx.check()?;
            let p = self.fetch(ctx, &args.base_url, page).await?;
            let mut buf = Vec::with_capacity(p.items.len() * 64);
            for item in &p.items {
                buf.extend_from_slice(item.get().as_bytes());
                buf.push(b'\n');
            }
            file.write(Bytes::from(buf)).await?;
            // Durable first, then the checkpoint that points at it: a crash in between only
            // repeats this page (bytes past the older cursor are discarded on reopen).
            let cursor = file.sync().await?;
            pages += 1;
            items += p.items.len() as u64;
            next = p.next;
            let fraction = p.total_pages.map(|t| pages as f64 / t.max(1) as f64);
            ctx.progress(fraction, Some(&format!("exported page {page}")), &[("pages", pages), ("items", items)]).await?;
            ctx.checkpoint(&ExportCheckpoint { cursor, next_page: next, pages, items }).await?;
        }
        let handle = file.finish().await?;
        ctx.progress(Some(1.0), Some("done"), &[("pages", pages), ("items", items)]).await?;
        Ok(json!({ "file": handle, "pages": pages, "items": items }))
    }
}

// ---------------------------------------------------------------------------------------------
// Embedding: stores and engine as `ferry serve` builds them.

struct Stores {
    tasks: Arc<Engine>,
    uploads: Arc<UploadEngine>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

async fn open(data: &std::path::Path) -> anyhow::Result<Stores> {
    let catalog: Arc<dyn Catalog> = Arc::new(SqliteCatalog::open(&data.join("ferry.db")).await.context("opening the catalog")?);
    let blobs = FsBlobStore::open(&data.join("blobs"), true).context("opening the blob store")?;
    let uploads = UploadEngine::new(catalog.clone(), Arc::new(blobs), EngineConfig::default(), Arc::new(Metrics::default()));
    let mut tasks = Engine::new(catalog, uploads.clone(), TaskConfig { workers: 2, ..TaskConfig::default() });
    tasks.register(Arc::new(PagedExport { http: reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build()? }));
    let tasks = Arc::new(tasks);
    let workers = tasks.spawn();
    Ok(Stores { tasks, uploads, workers })
}

impl Stores {
    /// Stop the workers; a running job stops at its next cancellable wait and its task stays
    /// `working`, to be resumed from its checkpoint by the next engine.
    async fn stop(&mut self) {
        self.tasks.shutdown();
        for w in self.workers.drain(..) {
            let _ = w.await;
        }
    }
}

/// Principal the example's tasks belong to (what `ferry serve` uses without tokens).
const PRINCIPAL: &str = "local";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let upstream = start_upstream().await?;
    println!("upstream API on {upstream} ({PAGES} pages of {PER_PAGE} items)");
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data)?;

    // Start the task: answered at once with a durable id. The idempotency key makes a retried
    // start join this task instead of exporting twice.
    let mut engine = open(&data).await?;
    let args = json!({ "base_url": upstream }).to_string();
    let started = engine.tasks.start(PRINCIPAL, "paged_export", &args, Some("export-demo"), None).await?;
    let id = started.task.id.clone();
    println!("task {id} started ({})", started.task.status.as_str());

    // Let it export part of the pages, then stop the engine mid-export.
    let stop_after = PAGES / 2;
    loop {
        let t = engine.tasks.get(PRINCIPAL, &id).await?;
        let pages = t.progress.counters.get("pages").copied().unwrap_or(0);
        if pages >= stop_after || t.status.is_terminal() {
            println!("stopping the engine at {pages} pages, {} items", t.progress.counters.get("items").copied().unwrap_or(0));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    engine.stop().await;
    let t = engine.tasks.get(PRINCIPAL, &id).await?;
    drop(engine);
    let resumed_from: ExportCheckpoint = serde_json::from_str(t.checkpoint.as_deref().context("a checkpoint")?)?;
    let resume_page = resumed_from.next_page.map_or("(none: all written)".to_string(), |p| p.to_string());
    println!(
        "task is {} with a checkpoint: next page {resume_page}, {} bytes of export.jsonl durable",
        t.status.as_str(),
        resumed_from.cursor.offset
    );

    // A new engine on the same data dir (a restart) resumes the task from its checkpoint.
    let mut engine = open(&data).await?;
    let done = loop {
        let t = engine.tasks.get(PRINCIPAL, &id).await?;
        if t.status.is_terminal() {
            break t;
        }
        let p = &t.progress;
        println!(
            "  {} {:>3.0}%  pages={} items={}  {}",
            t.status.as_str(),
            p.fraction.unwrap_or(0.0) * 100.0,
            p.counters.get("pages").copied().unwrap_or(0),
            p.counters.get("items").copied().unwrap_or(0),
            p.message.as_deref().unwrap_or("")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    if done.status != TaskStatus::Completed {
        bail!("task ended {}: {}", done.status.as_str(), done.error.unwrap_or_default());
    }
    let result: Value = serde_json::from_str(done.result.as_deref().context("a result")?)?;
    println!("completed after {} runs; result:\n{}", done.runs, serde_json::to_string_pretty(&result)?);

    // The result names an ordinary ferry file: read it back and check it.
    let handle: FileHandle = serde_json::from_value(result["file"].clone())?;
    let rec = engine.uploads.get(PRINCIPAL, &handle.id).await?;
    let bytes: Vec<Bytes> = engine.uploads.read(&rec, 0..handle.size).await?.try_collect().await?;
    let body = bytes.concat();
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&body))
    };
    let ids: Vec<u64> = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice::<Value>(l).map(|v| v["id"].as_u64().unwrap_or(u64::MAX)))
        .collect::<Result<_, _>>()?;
    let expected: Vec<u64> = (0..PAGES * PER_PAGE).collect();
    println!("export.jsonl: {} lines, {} bytes, sha256 {sha}", ids.len(), body.len());
    if ids != expected {
        bail!("expected items 0..{} once each, in order; got {} lines", PAGES * PER_PAGE, ids.len());
    }
    if sha != handle.sha256 || body.len() as u64 != handle.size {
        bail!("the file does not match its handle");
    }
    if (resumed_from.next_page.is_some() && done.runs < 2) || result["pages"] != PAGES {
        bail!("expected a resumed run covering all pages (runs {}, pages {})", done.runs, result["pages"]);
    }
    println!("ok: every item exactly once; size and sha256 match the handle; run 2 resumed at page {resume_page} instead of starting over");
    engine.stop().await;
    Ok(())
}
