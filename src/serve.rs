//! `ferry serve`: open the stores, recover, and serve HTTP until SIGINT/SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::app::{AppParts, AppState, HttpConfig, McpConfig, Tokens};
use crate::blob::{BlobStore, FsBlobStore, S3BlobStore};
use crate::config::{BlobLocation, Config, Durability, LeaseMode};
use crate::http::app;
use crate::mcp::FerryMcp;
use crate::metrics::Metrics;
use crate::signing::{Links, UrlSigner};
use crate::tasks::{Engine, TaskConfig};
use crate::upload::locks::{CatalogLeaseConfig, CatalogLocker, LocalLocker, Locker};
use crate::upload::{EngineConfig, UploadEngine};

/// Make glibc's allocator keep freed memory for reuse rather than hand it back to the kernel
/// after each request body: `mallopt(M_MMAP_THRESHOLD, 4 MiB)` and `mallopt(M_TRIM_THRESHOLD,
/// 32 MiB)` (glibc malloc(3), "M_TRIM_THRESHOLD"). Call before any thread starts.
///
/// With glibc's defaults an upload's receive buffers (hyper reads up to ≈ 400 KiB at a time)
/// were mostly fresh pages: 8 MiB PATCHes took a page fault on over half of their bytes
/// (≈ 200 000 faults per 1.5 GiB), ≈ 15 % of the server's CPU. The cost: each heap keeps up to
/// 32 MiB of freed memory instead of returning it. Skipped when `GLIBC_TUNABLES` sets malloc
/// tunables (the operator chose), and on other C libraries.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if !std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.")) {
        // SAFETY: mallopt only sets allocator parameters; it is called before other threads run.
        unsafe {
            nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, 4 << 20);
            nix::libc::mallopt(nix::libc::M_TRIM_THRESHOLD, 32 << 20);
        }
    }
}

/// Ignore SIGHUP until [`catch_hangups`] catches it: call first thing in `main` for `ferry
/// serve`. The runtime [`catch_hangups`] needs takes a few milliseconds to start, and a SIGHUP
/// in that time (a `ferry token create` followed by `kill -HUP` as the server is launched)
/// ended the process with status 129 by the signal's default action. A SIGHUP that arrives
/// before it is caught is lost; [`catch_hangups`] replaces the disposition, so commands the
/// server runs later (hooks, tasks) start with the default again (execve(2)).
pub fn ignore_hangups() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to SIG_IGN runs no handler code, and this is
    // called before any other thread exists.
    unsafe {
        nix::libc::signal(nix::libc::SIGHUP, nix::libc::SIG_IGN);
    }
}

/// SIGHUPs, caught from now on ([`run`] reloads on each). Call before the configuration is
/// read, in the runtime `run` will use: a reload sent while the server starts (after `ferry
/// token create`, say) must not end it by the signal's default action, and one that arrives
/// before the server listens reloads once it does. SIGTERM and SIGINT keep their default until
/// the server listens, so a start-up that hangs can still be stopped.
#[cfg(unix)]
pub fn catch_hangups() -> Hangups {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
}
#[cfg(not(unix))]
pub fn catch_hangups() -> Hangups {
    Ok(())
}

/// What [`catch_hangups`] returns (an error: SIGHUP cannot be caught, reloads are off).
#[cfg(unix)]
pub type Hangups = std::io::Result<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
pub type Hangups = std::io::Result<()>;

/// Run the server with `cfg`, reloading on `hangups` (from [`catch_hangups`]). Prints
/// `listening on http://ADDR` to stdout once it accepts.
pub async fn run(cfg: Config, hangups: Hangups) -> anyhow::Result<()> {
    // Its name made durable too: a power cut must not take the whole data dir away.
    crate::blob::fs::create_dir_all_synced(&cfg.data).with_context(|| format!("creating data dir {}", cfg.data.display()))?;
    if let Some(public) = open_to_anyone(&cfg, &cfg.tokens) {
        anyhow::bail!(
            "refusing to listen on {public} without bearer tokens: create one with `ferry token create NAME`, \
             or pass --insecure-no-auth to let anyone who can connect read and write everything",
        );
    }
    // A certificate that cannot serve stops start-up before anything else is opened.
    let tls = match &cfg.tls {
        Some((cert, key)) => Some(crate::tls::TlsCertificate::load(cert, key)?),
        None => None,
    };
    let tokens = Tokens::new(&cfg.tokens)?;
    let _data_lock = lock_data_dir(&cfg.data)?;
    // Holding DATA/lock proves this data dir's previous process is dead: whatever its owner id
    // held in the catalog (task and upload leases) is reclaimed at once instead of expiring.
    let owner = load_owner_id(&cfg.data)?;
    let max_connections = crate::listen::connection_cap(cfg.max_connections);
    // With in-process leases this server is the catalog's only writer (one server per catalog):
    // held for the process's life, so a second server on the catalog refuses to start.
    let _catalog_lock = cfg.catalog.hold(cfg.leases == LeaseMode::Local).await?;
    let catalog = cfg.catalog.open_as(cfg.leases == LeaseMode::Local).await.map_err(|e| crate::exhaustion::note_full_disk(e, &cfg.data))?;
    tracing::info!(catalog = %cfg.catalog.redacted(), leases = ?cfg.leases, "catalog open");
    let (uploads_back, tasks_back) = catalog.reclaim_owner(&owner).await.context("reclaiming the leases of this data dir's previous process")?;
    if uploads_back + tasks_back > 0 {
        tracing::info!(owner, uploads = uploads_back, tasks = tasks_back, "resuming what this server held before it stopped");
    }
    let replica = cfg.replica_name.clone().unwrap_or_else(|| owner.clone());
    let metrics = Arc::new(Metrics::for_replica(&replica));
    let blobs = open_blobs(&cfg, Some(&metrics)).await?;
    check_store_mark(catalog.as_ref(), blobs.as_ref(), &cfg.blobs.to_string(), true).await?;
    let locker: Arc<dyn Locker> = match cfg.leases {
        LeaseMode::Local => Arc::new(LocalLocker::new()),
        LeaseMode::Catalog => Arc::new(
            CatalogLocker::start(
                catalog.clone(),
                CatalogLeaseConfig { owner: owner.clone(), ttl: cfg.upload_lease, retry: Duration::from_millis(50) },
            )
            .await
            .context("listening for upload release requests")?,
        ),
    };
    // Bytes in S3 use no local disk: the reserve then guards the data directory (catalog, logs).
    let reserve = crate::exhaustion::SpaceReserve::new(
        match &cfg.blobs {
            BlobLocation::Dir(dir) => dir,
            BlobLocation::S3(_) => &cfg.data,
        },
        cfg.min_free_space,
    );
    reserve.fits_the_disk().map_err(anyhow::Error::msg)?;
    let engine = UploadEngine::with_locker(
        catalog.clone(),
        blobs,
        EngineConfig {
            max_size: cfg.max_size,
            expire_after: cfg.expire_after,
            checkpoint_every: cfg.checkpoint_every,
            idle_timeout: cfg.idle_timeout,
            sweep_interval: cfg.sweep_interval,
            reserve,
            limits: cfg.limits.clone(),
            disk_dirs: match &cfg.blobs {
                BlobLocation::Dir(dir) => vec![("data", cfg.data.clone()), ("blobs", dir.clone())],
                BlobLocation::S3(_) => vec![("data", cfg.data.clone())],
            },
            ..EngineConfig::default()
        },
        metrics.clone(),
        locker,
    );
    let hooks = crate::events::HttpHooks::new(cfg.pre_create_hook.clone(), cfg.pre_finish_hook.clone())?;
    if hooks.any() {
        engine.set_hooks(Arc::new(hooks));
    }
    // Deletions a crash cut off between the row and the bytes (issue 48) are finished before the
    // first request; a blob store that does not answer in time leaves the rest to the sweeper.
    match tokio::time::timeout(Duration::from_secs(10), engine.finish_removals()).await {
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => tracing::info!(removed = n, "removed the bytes of uploads whose deletion a crash interrupted"),
        Ok(Err(e)) => tracing::warn!(error = %e, "could not finish interrupted deletions yet; the sweeper tries again"),
        Err(_) => tracing::warn!("finishing interrupted deletions took too long; the sweeper goes on with them"),
    }
    let sweeper = engine.spawn_sweeper();
    let signer = UrlSigner::load_shared(catalog.as_ref(), &cfg.data, cfg.url_secret.as_deref()).await.context("loading the URL-signing secret")?;
    let events = Arc::new(crate::events::Events::new(catalog.clone(), cfg.event_retention));
    let webhooks = crate::events::WebhookWorker::new(catalog.clone(), &cfg.webhooks, owner.clone(), metrics.clone(), events.head())?;
    // Before the first request: a new webhook receives every event from this start on.
    webhooks.start_cursors().await.context("starting the webhook cursors")?;
    let background_stop = tokio_util::sync::CancellationToken::new();
    let webhook_worker = webhooks.spawn(background_stop.clone());
    let pruner = events.spawn_pruner(Duration::from_secs(600), background_stop.clone());
    let head_watcher = events.spawn_head_watcher(background_stop.clone());
    let closing = catalog.clone();
    let mut tasks = Engine::new(
        catalog,
        engine.clone(),
        TaskConfig { workers: cfg.task_workers, lease: cfg.task_lease, default_ttl: cfg.task_ttl, owner: owner.clone(), ..TaskConfig::default() },
    );
    for job in crate::tasks::kinds::builtin(cfg.fetch.clone(), cfg.commands.clone()) {
        tasks.register(job);
    }
    let tasks = Arc::new(tasks);
    let workers = tasks.spawn();
    let finisher = spawn_finisher(&engine, &tasks);

    let listener = tokio::net::TcpListener::bind(cfg.listen).await.with_context(|| format!("binding {}", cfg.listen))?;
    let addr = listener.local_addr()?;
    let mut listeners = vec![listener];
    // The other addresses a `--listen` host name names (`localhost`: ::1 too), on the same port.
    for more in &cfg.listen_more {
        let more = std::net::SocketAddr::new(more.ip(), addr.port());
        match tokio::net::TcpListener::bind(more).await {
            Ok(l) => listeners.push(l),
            Err(e) => tracing::warn!(addr = %more, error = %e, "not listening on this address of the --listen host name"),
        }
    }
    if cfg.public_url.is_none() && addr.ip().is_unspecified() {
        tracing::warn!(
            %addr,
            "listening on a wildcard address without --public-url: signed URLs and MCP \
             results will name {addr}, which clients cannot reach; set --public-url"
        );
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let links = Links::new(cfg.public_url.clone().unwrap_or_else(|| format!("{scheme}://{addr}")), signer).with_pages(!cfg.no_web);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let state = AppState::new(AppParts {
        engine: engine.clone(),
        tasks: tasks.clone(),
        events,
        tokens: Arc::new(tokens.clone()),
        metrics,
        http: Arc::new(HttpConfig {
            behind_proxy: cfg.behind_proxy,
            absolute_locations: cfg.public_url.is_some(),
            allowed_hosts: allowed_hosts(&cfg, addr),
            own_origins: cfg.public_url.as_deref().and_then(crate::app::origin_of).into_iter().collect(),
            shutdown: shutdown.clone(),
            cors: cfg.cors.clone(),
            web: !cfg.no_web,
        }),
        links: Arc::new(links),
        mcp: Arc::new(McpConfig {
            max_chunk: cfg.mcp_max_chunk,
            commands: cfg
                .commands
                .iter()
                .map(|(n, c)| crate::app::CommandTool { name: n.clone(), description: c.description.clone(), params_schema: c.params_schema.clone() })
                .collect(),
        }),
    });
    // The MCP service is built here, once, and nested at `/mcp`: http and mcp never import
    // each other (DESIGN §1).
    let router = app(state.clone(), crate::mcp::streamable_http_service(&state));
    tracing::info!(
        %addr,
        data = %cfg.data.display(),
        durability = ?cfg.durability,
        replica,
        leases = ?cfg.leases,
        tls = tls.is_some(),
        "ferry serving"
    );
    log_principals(&tokens, "configured");
    if tokens.is_empty() && cfg.cors.allow_origins == crate::app::Origins::Any {
        tracing::warn!("[cors] allow_origins is `*` on a server without tokens: any web page a browser visits may upload to it");
    }
    if tokens.is_empty() && matches!(&cfg.cors.allow_origins, crate::app::Origins::Only(list) if list.iter().any(|o| o == "null")) {
        tracing::warn!(
            "[cors] allow_origins lists `null` on a server without tokens: any web page can make itself `null` (a sandboxed \
             iframe) and upload to it; serve the uploading page from an origin of its own and list that one instead"
        );
    }
    let acceptor = tls.as_ref().map(|t| t.acceptor()).transpose()?;
    let reloader = tokio::spawn(reload_on_sighup(hangups, cfg.clone(), tokens.clone(), tls.clone()));
    // SIGTERM and SIGINT are caught before `listening on` is printed: a supervisor may stop the
    // server the moment it does, and that stop must checkpoint, not kill.
    let stop_requested = shutdown_signal()?;
    if cfg.stdio {
        // stdout carries MCP messages only.
        eprintln!("listening on {scheme}://{addr}");
    } else {
        println!("listening on {scheme}://{addr}");
    }
    let stdio_done = tokio_util::sync::CancellationToken::new();
    if cfg.stdio {
        let mcp = crate::mcp::FerryService(FerryMcp::new(state.clone(), (*state.mcp).clone()));
        let done = stdio_done.clone();
        tokio::spawn(async move {
            use rmcp::ServiceExt;
            match mcp.serve(rmcp::transport::stdio()).await {
                Ok(running) => {
                    if let Err(e) = running.waiting().await {
                        tracing::warn!(error = %e, "MCP over stdio ended");
                    }
                }
                Err(e) => tracing::error!(error = %e, "MCP over stdio failed to start"),
            }
            // The client that launched us is gone: shut down like on SIGTERM.
            done.cancel();
        });
    }

    let shutdown_engine = engine.clone();
    let signal = async move {
        tokio::select! {
            _ = stop_requested => {}
            _ = stdio_done.cancelled() => tracing::info!("stdin closed"),
        }
        tracing::info!("shutting down: checkpointing in-flight uploads");
        shutdown.cancel();
        shutdown_engine.begin_shutdown();
    };
    crate::listen::serve_http(listeners, router, signal, max_connections, acceptor).await;
    reloader.abort();
    tasks.shutdown();
    sweeper.abort();
    finisher.abort();
    background_stop.cancel();
    pruner.abort();
    head_watcher.abort();
    // A delivery in flight is settled or, if cut off here, retried after its lease lapses.
    let _ = tokio::time::timeout(Duration::from_secs(5), webhook_worker).await;
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(5), w).await;
    }
    // Last: nothing uses the catalog any more (SQLite folds its WAL back into the file).
    let _ = tokio::time::timeout(Duration::from_secs(5), closing.close()).await;
    Ok(())
}

/// The one rule for start-up and SIGHUP reload: `tokens` on the addresses `cfg` listens on
/// would let anyone who can connect in. Returns the first address that is not loopback when
/// there are no tokens (and no `--insecure-no-auth`); every address counts, not the first only.
fn open_to_anyone(cfg: &Config, tokens: &[crate::app::principal::TokenEntry]) -> Option<std::net::SocketAddr> {
    if !tokens.is_empty() || cfg.insecure_no_auth {
        return None;
    }
    std::iter::once(&cfg.listen).chain(&cfg.listen_more).find(|a| !a.ip().is_loopback()).copied()
}

/// The start-up (and reload) line saying who may use this server.
fn log_principals(tokens: &Tokens, what: &str) {
    let (principals, count) = tokens.counts();
    if count == 0 {
        tracing::info!(principals = 0, tokens = 0, "no bearer tokens {what}: every request acts as the principal `local`");
    } else {
        tracing::info!(principals, tokens = count, "{principals} principal(s) {what} with {count} bearer token(s)");
    }
}

/// On SIGHUP: resolve the configuration again (the file re-read under the same flags and
/// environment), swap in its `[[tokens]]`, and re-read the TLS certificate and key. Requests
/// and connections in flight are untouched. Whatever cannot be loaded — a file that does not
/// parse, a token set that would leave a non-loopback server open, a certificate that is
/// missing or does not match its key — is logged with the reason and the old one stays.
#[cfg(unix)]
async fn reload_on_sighup(hangups: Hangups, cfg: Config, tokens: Tokens, tls: Option<Arc<crate::tls::TlsCertificate>>) {
    {
        let mut hup = match hangups {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP: tokens and the TLS certificate are read only at start-up");
                return;
            }
        };
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading tokens and the TLS certificate");
            match Config::resolve(&cfg.args) {
                Err(e) => {
                    tracing::error!(
                        error = %format!("{e:#}"),
                        "reload refused: the configuration does not load; the tokens and certificate in use stay"
                    )
                }
                Ok(new) => {
                    if let Some(public) = open_to_anyone(&cfg, &new.tokens) {
                        tracing::error!(
                            listen = %public,
                            "reload refused: the new configuration has no bearer tokens, which \
                             would open this non-loopback server to anyone; the tokens in use stay"
                        );
                    } else {
                        match tokens.replace(&new.tokens) {
                            Ok(()) => log_principals(&tokens, "loaded"),
                            Err(e) => tracing::error!(error = %format!("{e:#}"), "reload refused for tokens; the tokens in use stay"),
                        }
                    }
                    match (&tls, &new.tls) {
                        (Some(t), Some((cert, key))) if (cert.as_path(), key.as_path()) != t.paths() => tracing::warn!(
                            cert = %cert.display(), key = %key.display(),
                            "the certificate paths changed; a reload re-reads the files ferry started with (restart to use other paths)"
                        ),
                        (None, Some(_)) => tracing::warn!("TLS was configured after start-up; restart ferry to serve HTTPS"),
                        (Some(_), None) => tracing::warn!("TLS was removed from the configuration; still serving HTTPS until a restart"),
                        _ => {}
                    }
                    if let Some(t) = &tls {
                        let (cert, key) = t.paths();
                        match t.reload() {
                            Ok(()) => tracing::info!(cert = %cert.display(), key = %key.display(), "TLS certificate reloaded"),
                            Err(e) => tracing::error!(error = %format!("{e:#}"), "TLS certificate not reloaded; the one in use stays"),
                        }
                    }
                }
            }
        }
    }
}

#[cfg(not(unix))]
async fn reload_on_sighup(_: Hangups, _: Config, _: Tokens, _: Option<Arc<crate::tls::TlsCertificate>>) {}

/// The blob store `--blobs` names. An S3 bucket is checked at once (a probe object is put and
/// deleted), so a server that cannot reach or write it fails at start-up with one line that
/// names the bucket and the cause (never a credential).
pub async fn open_blobs(cfg: &Config, metrics: Option<&Arc<Metrics>>) -> anyhow::Result<Arc<dyn BlobStore>> {
    match &cfg.blobs {
        BlobLocation::Dir(dir) => Ok(Arc::new(
            FsBlobStore::open(dir, cfg.durability == Durability::Full).context("opening the blob store")?.with_direct_writes(!cfg.buffered_writes),
        )),
        BlobLocation::S3(url) => {
            let mut store = S3BlobStore::from_url(url, cfg.s3.part_size)?;
            if let Some(m) = metrics {
                // Every S3 request, as `ferry_s3_request_duration_seconds{operation,outcome}`.
                let m = m.clone();
                store = store.with_request_observer(Arc::new(move |seen: crate::blob::s3::RequestSeen| {
                    m.s3_request_duration
                        .get_or_create(&crate::metrics::S3RequestLabels { operation: seen.operation, outcome: seen.outcome })
                        .observe(seen.seconds)
                }));
            }
            let store = store
                .with_max_buffer(cfg.s3.max_buffer)
                .with_deferred_part_size(cfg.s3.deferred_part_size)
                .with_parts_in_flight(cfg.s3.parts_in_flight);
            store.ping().await.map_err(|e| {
                // S3 answers NoSuchBucket (404) to a put into a bucket that is not there.
                let no_bucket = match &e {
                    crate::blob::BlobError::NotFound => true,
                    crate::blob::BlobError::Refused { code, .. } => code.as_deref() == Some("NoSuchBucket"),
                    _ => false,
                };
                // What an operator changes for the refusals a start-up meets most.
                let hint = match &e {
                    crate::blob::BlobError::Refused { status, code, .. } => match code.as_deref() {
                        Some("InvalidAccessKeyId" | "SignatureDoesNotMatch") => Some("check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
                        Some("AuthorizationHeaderMalformed" | "IllegalLocationConstraintException" | "PermanentRedirect") => {
                            Some("check AWS_REGION (and AWS_ENDPOINT_URL)")
                        }
                        _ if *status == Some(403) || *status == Some(401) => Some(
                            "check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and the bucket's policy (ferry \
                             needs to put, get, list and delete objects and multipart uploads under the prefix)",
                        ),
                        _ => None,
                    },
                    _ => None,
                };
                if no_bucket {
                    anyhow::anyhow!("cannot write to the blob store {url}: its bucket does not exist (create it, or correct the bucket in --blobs)")
                } else if let Some(hint) = hint {
                    anyhow::anyhow!("cannot write to the blob store {url}: {e}; {hint}")
                } else {
                    anyhow::anyhow!("cannot write to the blob store {url}: {e}")
                }
            })?;
            Ok(Arc::new(store))
        }
    }
}

/// The catalog's name for the mark of its blob store ([`check_store_mark`]).
const STORE_MARK_NAME: &str = "blob-store-mark-v1";

/// Uploads with bytes whose blobs [`check_store_mark`] looks for in an unmarked store.
const MARK_SAMPLE: usize = 20;

/// One catalog, one blob store: every server of a catalog must keep the bytes where the others
/// do, or one of them would find an upload's bytes "gone" and take it back to 0 (a replica
/// started with another `--blobs` prefix did, in a test of three replicas). The catalog keeps a
/// random mark (created once, atomically, by the first server to start); the store keeps the
/// same text ([`BlobStore::mark`]). At start:
/// - a store marked with the catalog's mark: go on;
/// - a store marked with another: refuse (it is another catalog's store);
/// - an unmarked store (a new deployment, a store from before marks, or a server that stopped
///   between the catalog's write and the store's): it is the catalog's store if it holds the
///   bytes of the catalog's uploads — of up to [`MARK_SAMPLE`] uploads with bytes, not all may
///   be missing — and is then marked (when `mark`; `ferry check` only looks); else refuse.
///
/// Errors: the refusals above (naming `store` and what to do), a catalog or store failure.
pub(crate) async fn check_store_mark(catalog: &dyn crate::catalog::Catalog, blobs: &dyn BlobStore, store: &str, mark: bool) -> anyhow::Result<()> {
    let here = blobs.mark().await.map_err(|e| anyhow::anyhow!("reading the mark of the blob store {store}: {e}"))?;
    let candidate = hex::encode(rand::random::<[u8; 16]>());
    let offered = here.clone().unwrap_or(candidate);
    let theirs = catalog.shared_secret(STORE_MARK_NAME, offered.as_bytes()).await.context("reading the blob store's mark from the catalog")?;
    let theirs = String::from_utf8_lossy(&theirs).into_owned();
    match here {
        Some(mark) if mark == theirs => return Ok(()),
        Some(mark) => anyhow::bail!(
            "the blob store {store} belongs to another catalog (its {} is {mark}, this catalog's store is \
             marked {theirs}): every server of one catalog must use the same blob store (--blobs, bucket \
             and prefix); give this catalog its own store, or this server the catalog that store belongs to",
            crate::blob::STORE_MARK
        ),
        None => {}
    }
    let (mut checked, mut missing) = (0usize, 0usize);
    let mut after = String::new();
    'pages: loop {
        let page = catalog.list_uploads_after(&after, 500).await.context("listing uploads to check the blob store")?;
        let Some(last) = page.last() else { break };
        after = last.id.clone();
        // Every upload with bytes has a blob, concatenations' partials and finals included (a
        // catalog whose only files are `ferry upload --parallel` finals was taken for an empty one).
        for rec in page.iter().filter(|r| r.offset > 0 && !r.expired) {
            checked += 1;
            if blobs.len(&rec.id).await.map_err(|e| anyhow::anyhow!("reading the blob store {store}: {e}"))?.is_none() {
                missing += 1;
            }
            if checked >= MARK_SAMPLE {
                break 'pages;
            }
        }
    }
    if checked > 0 && missing == checked {
        anyhow::bail!(
            "the blob store {store} is not the one this catalog's uploads are in: none of the {checked} uploads with \
             bytes looked up is in it, and it lacks the catalog's mark ({} = {theirs}). Every server of one catalog must \
             use the same blob store (--blobs, bucket and prefix); if the bytes were moved on purpose, copy {} with them",
            crate::blob::STORE_MARK,
            crate::blob::STORE_MARK
        );
    }
    if !mark {
        return Ok(());
    }
    blobs.set_mark(&theirs).await.map_err(|e| anyhow::anyhow!("marking the blob store {store}: {e}"))?;
    tracing::info!(store, "blob store marked as this catalog's");
    Ok(())
}

/// Hold `DATA/lock` exclusively for the life of the process: two servers on one data dir
/// would interleave writes to the same blobs. Errors: the lock is held by another process.
fn lock_data_dir(data: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let path = data.join("lock");
    let f = crate::regular_file::open(std::fs::OpenOptions::new().create(true).truncate(false).write(true), &path)
        .with_context(|| format!("opening {}", path.display()))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => {
            anyhow::bail!(
                "another ferry process is serving the data directory {} (it holds {}); stop it, or give this one its own --data",
                data.display(),
                path.display()
            )
        }
        Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", path.display())),
    }
}

/// This data dir's lease owner id (`DATA/owner-id`), created once: stable across restarts, so
/// a restarted server knows which leases were its own. Errors: unreadable or unwritable file.
fn load_owner_id(data: &std::path::Path) -> anyhow::Result<String> {
    let path = data.join("owner-id");
    match crate::regular_file::read_to_string(&path) {
        Ok(text) if crate::upload::is_valid_id(text.trim().trim_start_matches("ferry-")) => Ok(text.trim().to_string()),
        Ok(_) => anyhow::bail!("{} is not an owner id written by ferry; delete it to make a new one", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = format!("ferry-{}", crate::upload::new_id());
            let tmp = data.join("owner-id.tmp");
            crate::regular_file::create(&tmp)
                .and_then(|mut f| std::io::Write::write_all(&mut f, id.as_bytes()).and_then(|()| f.sync_all()))
                .with_context(|| format!("writing {}", tmp.display()))?;
            std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
            std::fs::File::open(data)?.sync_all()?;
            Ok(id)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// `Host` values `/mcp` accepts, from `--listen` and `--public-url`: the loopback names for a
/// loopback address, the address itself otherwise; none (any host) for a wildcard address,
/// where bearer tokens are required anyway.
fn allowed_hosts(cfg: &Config, addr: std::net::SocketAddr) -> Vec<String> {
    if addr.ip().is_unspecified() {
        return Vec::new();
    }
    let mut hosts: Vec<String> =
        if addr.ip().is_loopback() { vec!["localhost".into(), "127.0.0.1".into(), "::1".into()] } else { vec![addr.ip().to_string()] };
    hosts.extend(cfg.listen_more.iter().map(|a| a.ip().to_string()));
    hosts.extend(cfg.listen_name.clone());
    if let Some(host) = cfg.public_url.as_deref().and_then(|u| u.parse::<http::Uri>().ok()).and_then(|u| u.host().map(str::to_owned)) {
        hosts.push(host.trim_start_matches('[').trim_end_matches(']').to_string());
    }
    hosts
}

/// SIGTERM or SIGINT (Ctrl-C), registered now — before the caller announces it is listening —
/// so a stop that arrives at once is caught rather than ending the process by its default action.
/// Errors: the handlers cannot be registered (no signal support in this process).
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (mut term, mut interrupt) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = interrupt.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// The background finisher ([`crate::upload::finishing`]): uploads whose bytes are all stored
/// but that are not finished are finished once the hook or store lets them; a partial upload
/// finished that way starts building every final upload now ready (as its last PATCH would).
fn spawn_finisher(engine: &Arc<UploadEngine>, tasks: &Arc<Engine>) -> tokio::task::JoinHandle<()> {
    let (uploads, tasks) = (engine.clone(), tasks.clone());
    engine.spawn_finisher(move |rec| {
        if rec.concat != crate::catalog::Concat::Partial {
            return;
        }
        let (uploads, tasks) = (uploads.clone(), tasks.clone());
        tokio::spawn(async move {
            let finals = match uploads.finals_ready(&rec.id).await {
                Ok(f) => f,
                Err(e) => return tracing::warn!(upload = rec.id, detail = e.detail, "looking up final uploads of a finished part"),
            };
            for f in finals {
                let args = serde_json::json!({ "final": f }).to_string();
                if let Err(e) = tasks.start(&rec.principal, "concat", &args, Some(&crate::tasks::kinds::concat::concat_key(&f)), None).await {
                    tracing::warn!(upload = f, detail = e.detail, "starting the concatenation of a final upload");
                }
            }
        });
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Start-up and reload judge one rule: a server whose first address is loopback but another
    /// is not is open to anyone without tokens (the reload used to look at the first only).
    #[test]
    fn an_empty_token_set_is_refused_when_any_address_is_public() {
        let args =
            crate::config::ServeArgs { listen: Some("127.0.0.1:8080".into()), data: Some("/nonexistent-ferry-test".into()), ..Default::default() };
        let mut cfg = Config::resolve(&args).unwrap();
        assert_eq!(open_to_anyone(&cfg, &[]), None, "loopback only");
        cfg.listen_more = vec!["192.0.2.7:8080".parse().unwrap()];
        assert_eq!(open_to_anyone(&cfg, &[]), Some("192.0.2.7:8080".parse().unwrap()), "a public second address");
        let token =
            crate::app::principal::TokenEntry { principal: "p".into(), sha256: crate::app::principal::token_hash("t"), scope: None, expires: None };
        assert_eq!(open_to_anyone(&cfg, &[token]), None, "tokens close it");
        cfg.insecure_no_auth = true;
        assert_eq!(open_to_anyone(&cfg, &[]), None, "--insecure-no-auth opens it on purpose");
    }
}
