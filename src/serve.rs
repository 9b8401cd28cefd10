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

/// How long graceful shutdown waits for in-flight requests after asking PATCHes to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

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
    let max_connections = connection_cap(cfg.max_connections);
    // With in-process leases this server is the catalog's only writer (one server per catalog):
    // held for the process's life, so a second server on the catalog refuses to start.
    let _catalog_lock = cfg.catalog.hold(cfg.leases == LeaseMode::Local).await?;
    let catalog = cfg.catalog.open_as(cfg.leases == LeaseMode::Local).await.map_err(|e| crate::exhaustion::note_full_disk(e, &cfg.data))?;
    tracing::info!(catalog = %cfg.catalog.redacted(), leases = ?cfg.leases, "catalog open");
    let (uploads_back, tasks_back) = catalog.reclaim_owner(&owner).await.context("reclaiming the leases of this data dir's previous process")?;
    if uploads_back + tasks_back > 0 {
        tracing::info!(owner, uploads = uploads_back, tasks = tasks_back, "resuming what this server held before it stopped");
    }
    let blobs = open_blobs(&cfg).await?;
    let store = match &cfg.blobs {
        BlobLocation::Dir(dir) => dir.display().to_string(),
        BlobLocation::S3(url) => url.to_string(),
    };
    check_store_mark(catalog.as_ref(), blobs.as_ref(), &store).await?;
    let replica = cfg.replica_name.clone().unwrap_or_else(|| owner.clone());
    let metrics = Arc::new(Metrics::for_replica(&replica));
    let locker: Arc<dyn Locker> = match cfg.leases {
        LeaseMode::Local => Arc::new(LocalLocker::new()),
        LeaseMode::Catalog => Arc::new(
            CatalogLocker::start(catalog.clone(), CatalogLeaseConfig { owner: owner.clone(), ttl: cfg.upload_lease, retry: Duration::from_millis(50) })
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
        tracing::warn!(%addr, "listening on a wildcard address without --public-url: signed URLs and MCP results will name {addr}, which clients cannot reach; set --public-url");
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
    tracing::info!(%addr, data = %cfg.data.display(), durability = ?cfg.durability, replica, leases = ?cfg.leases, tls = tls.is_some(), "ferry serving");
    log_principals(&tokens, "configured");
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
    serve_http(listeners, router, signal, max_connections, acceptor).await;
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
                Err(e) => tracing::error!(error = %format!("{e:#}"), "reload refused: the configuration does not load; the tokens and certificate in use stay"),
                Ok(new) => {
                    if let Some(public) = open_to_anyone(&cfg, &new.tokens) {
                        tracing::error!(listen = %public, "reload refused: the new configuration has no bearer tokens, which would open this non-loopback server to anyone; the tokens in use stay");
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
pub async fn open_blobs(cfg: &Config) -> anyhow::Result<Arc<dyn BlobStore>> {
    match &cfg.blobs {
        BlobLocation::Dir(dir) => {
            Ok(Arc::new(FsBlobStore::open(dir, cfg.durability == Durability::Full).context("opening the blob store")?.with_direct_writes(!cfg.buffered_writes)))
        }
        BlobLocation::S3(url) => {
            let store = S3BlobStore::from_url(url, cfg.s3.part_size)?.with_max_buffer(cfg.s3.max_buffer).with_parts_in_flight(cfg.s3.parts_in_flight);
            store.ping().await.map_err(|e| match e {
                // S3 answers NoSuchBucket (404) to a put into a bucket that is not there.
                crate::blob::BlobError::NotFound => {
                    anyhow::anyhow!("cannot write to the blob store {url}: its bucket does not exist (create it, or correct the bucket in --blobs)")
                }
                e => anyhow::anyhow!("cannot write to the blob store {url}: {e}"),
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
///   be missing — and is then marked; else refuse.
///
/// Errors: the refusals above (naming `store` and what to do), a catalog or store failure.
async fn check_store_mark(catalog: &dyn crate::catalog::Catalog, blobs: &dyn BlobStore, store: &str) -> anyhow::Result<()> {
    let here = blobs.mark().await.map_err(|e| anyhow::anyhow!("reading the mark of the blob store {store}: {e}"))?;
    let candidate = hex::encode(rand::random::<[u8; 16]>());
    let offered = here.clone().unwrap_or(candidate);
    let theirs = catalog.shared_secret(STORE_MARK_NAME, offered.as_bytes()).await.context("reading the blob store's mark from the catalog")?;
    let theirs = String::from_utf8_lossy(&theirs).into_owned();
    match here {
        Some(mark) if mark == theirs => return Ok(()),
        Some(mark) => anyhow::bail!(
            "the blob store {store} belongs to another catalog (its {} is {mark}, this catalog's store is marked {theirs}): every server of one catalog must use the same blob store (--blobs, bucket and prefix); give this catalog its own store, or this server the catalog that store belongs to",
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
        for rec in page.iter().filter(|r| r.offset > 0 && !r.expired && r.concat == crate::catalog::Concat::None) {
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
            "the blob store {store} is not the one this catalog's uploads are in: none of the {checked} uploads with bytes looked up is in it, and it lacks the catalog's mark ({} = {theirs}). Every server of one catalog must use the same blob store (--blobs, bucket and prefix); if the bytes were moved on purpose, copy {} with them",
            crate::blob::STORE_MARK,
            crate::blob::STORE_MARK
        );
    }
    blobs.set_mark(&theirs).await.map_err(|e| anyhow::anyhow!("marking the blob store {store}: {e}"))?;
    tracing::info!(store, "blob store marked as this catalog's");
    Ok(())
}

/// Hold `DATA/lock` exclusively for the life of the process: two servers on one data dir
/// would interleave writes to the same blobs. Errors: the lock is held by another process.
fn lock_data_dir(data: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let path = data.join("lock");
    let f = crate::regular_file::open(std::fs::OpenOptions::new().create(true).truncate(false).write(true), &path).with_context(|| format!("opening {}", path.display()))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => {
            anyhow::bail!("another ferry process is serving the data directory {} (it holds {}); stop it, or give this one its own --data", data.display(), path.display())
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
    let mut hosts: Vec<String> = if addr.ip().is_loopback() { vec!["localhost".into(), "127.0.0.1".into(), "::1".into()] } else { vec![addr.ip().to_string()] };
    hosts.extend(cfg.listen_more.iter().map(|a| a.ip().to_string()));
    hosts.extend(cfg.listen_name.clone());
    if let Some(host) = cfg.public_url.as_deref().and_then(|u| u.parse::<http::Uri>().ok()).and_then(|u| u.host().map(str::to_owned)) {
        hosts.push(host.trim_start_matches('[').trim_end_matches(']').to_string());
    }
    hosts
}

/// How long a client may take to send a request's headers (slow-loris guard).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The same while the server is under pressure (at least 90 % of the connection cap in use):
/// a connection that has not sent a complete request by then is closed.
const PRESSURE_HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// One accepted connection, as eviction sees it.
struct ConnSlot {
    /// What its requests and responses tell: idle or answering, ever requested.
    state: Arc<crate::http::wire::ConnState>,
    /// Cancelled to close the connection.
    close: tokio_util::sync::CancellationToken,
}

/// The connections being served, so that a server at its cap can close the ones that hold a
/// slot without using it: accepted, but no complete request yet (idle, or a slow-loris
/// trickling its headers); and a server out of descriptors, idle keep-alive ones too.
#[derive(Default)]
struct Conns {
    next: std::sync::atomic::AtomicU64,
    live: std::sync::Mutex<std::collections::HashMap<u64, Arc<ConnSlot>>>,
    /// Notified whenever a connection ends (its descriptor is free again).
    ended: tokio::sync::Notify,
}

impl Conns {
    fn add(&self) -> (u64, Arc<ConnSlot>) {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let c = Arc::new(ConnSlot { state: Default::default(), close: Default::default() });
        self.live.lock().unwrap_or_else(|e| e.into_inner()).insert(id, c.clone());
        (id, c)
    }

    fn remove(&self, id: u64) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        self.ended.notify_waiters();
    }

    /// Close up to `n` connections accepted at least `older_than` ago that have not sent a
    /// complete request, longest-waiting first. Returns how many.
    fn evict(&self, n: usize, older_than: Duration) -> usize {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let mut idle: Vec<&Arc<ConnSlot>> =
            live.values().filter(|c| !c.state.requested() && c.state.idle() && !c.close.is_cancelled() && c.state.accepted().elapsed() >= older_than).collect();
        idle.sort_by_key(|c| c.state.accepted());
        idle.iter().take(n).for_each(|c| c.close.cancel());
        idle.len().min(n)
    }

    /// Close up to `n` connections that are answering no request: first those that never sent
    /// one (longest-waiting first), then idle keep-alive ones (longest-idle first). Returns how
    /// many.
    fn shed_idle(&self, n: usize) -> usize {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let mut idle: Vec<&Arc<ConnSlot>> = live.values().filter(|c| c.state.idle() && !c.close.is_cancelled()).collect();
        idle.sort_by_key(|c| (c.state.requested(), c.state.idle_since()));
        idle.iter().take(n).for_each(|c| c.close.cancel());
        idle.len().min(n)
    }
}

/// A descriptor held open (`/dev/null`) to be given up when `accept` fails for want of
/// descriptors (`EMFILE`, `ENFILE`): closing it lets one connection be accepted and answered
/// instead of left waiting in the kernel's queue. That connection serves one request and
/// closes, and the descriptor is taken back.
#[derive(Clone, Default)]
struct Spare(Arc<std::sync::Mutex<Option<std::fs::File>>>);

impl Spare {
    fn open() -> Spare {
        let s = Spare::default();
        s.restore();
        s
    }

    /// Hold the spare descriptor again if it is not held; whether it is held now.
    fn restore(&self) -> bool {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if held.is_none() {
            *held = std::fs::File::open("/dev/null").ok();
        }
        held.is_some()
    }

    /// Close the spare descriptor; whether there was one.
    fn give_up(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take().is_some()
    }
}

/// `accept` failed for want of descriptors: the process's (`EMFILE`) or the system's (`ENFILE`).
fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(nix::libc::EMFILE) | Some(nix::libc::ENFILE))
}

/// How many idle connections one `accept` that failed for want of descriptors closes.
const SHED_PER_EMFILE: usize = 8;

/// Descriptors kept free of connections for the catalog, blobs being written or read, task
/// programs and the like.
const FD_HEADROOM: u64 = 256;
/// Default cap on concurrent connections.
const DEFAULT_MAX_CONNECTIONS: u64 = 10_000;

/// Raise the soft open-file limit to the hard one (issue 9, item 8) and derive the connection
/// cap: `--max-connections`, else 10 000; never more than the open-file limit less
/// [`FD_HEADROOM`] (at least 16), so connections cannot starve the stores of descriptors.
fn connection_cap(configured: Option<u32>) -> usize {
    let limit = match crate::exhaustion::raise_nofile_limit() {
        Ok((before, after)) => {
            if after > before {
                tracing::info!(before, after, "raised the soft open-file limit (RLIMIT_NOFILE) to the hard limit");
            } else {
                tracing::info!(limit = after, "open-file limit (RLIMIT_NOFILE)");
            }
            Some(after)
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not read or raise the open-file limit");
            None
        }
    };
    let fit = limit.map_or(u64::MAX, |l| l.saturating_sub(FD_HEADROOM).max(16));
    let wanted = configured.map_or(DEFAULT_MAX_CONNECTIONS, u64::from);
    if wanted > fit {
        tracing::warn!(wanted, cap = fit, "max connections lowered to fit the open-file limit");
    }
    let cap = wanted.min(fit) as usize;
    tracing::info!(max_connections = cap, "connection cap");
    cap
}

/// Accept HTTP/1.1 connections until `signal` resolves, then wait up to [`SHUTDOWN_GRACE`]
/// for in-flight requests (PATCHes checkpoint and end on the engine's shutdown token).
///
/// At most `max_connections` are served at once. At the cap, a newcomer makes room by closing
/// the connection that has waited longest without sending a complete request (idle, or a
/// slow-loris trickling its headers); only when every connection has sent one does it wait
/// until one closes. Under pressure (90 % of the cap) the header timeout drops from
/// [`HEADER_READ_TIMEOUT`] to [`PRESSURE_HEADER_TIMEOUT`] for connections that never sent a
/// complete request. Connections that have sent one are never closed this way.
///
/// When `accept` fails for want of descriptors (`EMFILE`, `ENFILE`: other files leave fewer
/// than the cap assumes), the server treats it as the cap: it closes up to
/// [`SHED_PER_EMFILE`] idle connections (never-requested first, then idle keep-alive ones),
/// gives up its [`Spare`] descriptor to accept the newcomer, serves it one request (`Connection:
/// close`) and takes the spare back. Without a spare it waits for a connection to end, at most
/// 100 ms at a time. Other `accept` failures (`ENOBUFS`…) back off 10 ms doubling to 100 ms.
///
/// Every connection closes lingering when a body was left unread ([`crate::http::wire`]), and
/// hyper's own refusals carry ferry's problem+json body.
///
/// With `tls`, each accepted connection first completes a TLS handshake (within
/// [`HEADER_READ_TIMEOUT`], on its own task, so a slow handshake never holds up accepting).
async fn serve_http(
    listeners: Vec<tokio::net::TcpListener>,
    router: axum::Router,
    signal: impl std::future::Future<Output = ()>,
    max_connections: usize,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    use hyper_util::rt::TokioTimer;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    let mut one_request = http.clone();
    one_request.keep_alive(false);
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let conns = Arc::new(Conns::default());
    let spare = Spare::open();
    let mut backoff = Duration::from_millis(10);
    let mut at_cap_logged = false;
    let mut emfile_logged: Option<std::time::Instant> = None;
    let mut last_sweep = std::time::Instant::now();
    tokio::pin!(signal);
    loop {
        let (stream, borrowed) = tokio::select! {
            accepted = accept_any(&listeners) => match accepted {
                Ok((s, _)) => (s, false),
                Err(e) if out_of_descriptors(&e) => {
                    // The cap assumed descriptors that other files hold: make room as at the cap.
                    let shed = conns.shed_idle(SHED_PER_EMFILE);
                    if emfile_logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                        tracing::warn!(error = %e, shed, live = conns.live.lock().unwrap_or_else(|e| e.into_inner()).len(), "accept failed: out of file descriptors below the connection cap; closing idle connections and answering with the spare descriptor");
                        emfile_logged = Some(std::time::Instant::now());
                    }
                    if spare.give_up() || spare.restore() && spare.give_up() {
                        // The freed descriptor is the newcomer's: accept it now (it is waiting).
                        match tokio::time::timeout(Duration::from_millis(100), accept_any(&listeners)).await {
                            Ok(Ok((s, _))) => (s, true),
                            _ => {
                                spare.restore();
                                continue;
                            }
                        }
                    } else {
                        // No spare: wait for a connection to end (bounded), then try again.
                        tokio::select! {
                            _ = conns.ended.notified() => {}
                            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                            _ = &mut signal => break,
                        }
                        continue;
                    }
                }
                Err(e) => {
                    // Out of kernel memory and the like: back off briefly instead of spinning;
                    // the connections already accepted keep being served.
                    tracing::warn!(error = %e, retry_in = ?backoff, "accept failed");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = &mut signal => break,
                    }
                    backoff = (backoff * 2).min(Duration::from_millis(100));
                    continue;
                }
            },
            _ = &mut signal => break,
        };
        backoff = Duration::from_millis(10);
        // Under pressure the header timeout is shorter: connections that have not sent a
        // complete request within PRESSURE_HEADER_TIMEOUT make room (checked once a second).
        if slots.available_permits() < max_connections.div_ceil(10) && last_sweep.elapsed() >= Duration::from_secs(1) {
            last_sweep = std::time::Instant::now();
            let n = conns.evict(usize::MAX, PRESSURE_HEADER_TIMEOUT);
            if n > 0 {
                tracing::info!(closed = n, "near the connection cap: closed connections that sent no complete request within {PRESSURE_HEADER_TIMEOUT:?}");
            }
        }
        let slot = match slots.clone().try_acquire_owned() {
            Ok(s) => s,
            Err(_) => {
                // At the cap with a newcomer waiting: close the connection that has waited
                // longest without a complete request, so health checks and real requests get
                // in; when every connection is busy with a request, the newcomer waits.
                let evicted = conns.evict(1, Duration::ZERO);
                if !at_cap_logged {
                    tracing::warn!(max_connections, "connection cap reached: closing connections that sent no complete request; otherwise new ones wait until one closes");
                    at_cap_logged = true;
                }
                tracing::debug!(evicted, "at the connection cap");
                tokio::select! {
                    s = slots.clone().acquire_owned() => s.expect("the semaphore is never closed"),
                    _ = &mut signal => break,
                }
            }
        };
        if slots.available_permits() > max_connections / 10 {
            at_cap_logged = false;
        }
        let (id, conn) = conns.add();
        let (on_req, on_res) = (conn.state.clone(), conn.state.clone());
        let service = hyper_util::service::TowerToHyperService::new(tower::ServiceExt::map_response(
            tower::ServiceExt::map_request(router.clone(), move |req| crate::http::wire::on_request(&on_req, req)),
            move |res| crate::http::wire::on_response(&on_res, res),
        ));
        let (conns, spare, watcher) = (conns.clone(), spare.clone(), graceful.watcher());
        let http = if borrowed { one_request.clone() } else { http.clone() };
        let acceptor = tls.clone();
        tokio::spawn(async move {
            let state = conn.state.clone();
            let serve = async {
                use crate::http::wire::{Lingering, Worded};
                use hyper_util::rt::TokioIo;
                match acceptor {
                    None => {
                        let io = TokioIo::new(Worded::new(Lingering::new(stream, state.clone()), state));
                        if let Err(e) = watcher.watch(http.serve_connection(io, service)).await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                    }
                    Some(acceptor) => {
                        let mut stream = stream;
                        if crate::tls::refused_plain_http(&mut stream, HEADER_READ_TIMEOUT).await {
                            return;
                        }
                        let stream = match tokio::time::timeout(HEADER_READ_TIMEOUT, acceptor.accept(Lingering::new(stream, state.clone()))).await {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => return tracing::debug!(error = %e, "TLS handshake failed"),
                            Err(_) => return tracing::debug!("TLS handshake timed out"),
                        };
                        if let Err(e) = watcher.watch(http.serve_connection(TokioIo::new(Worded::new(stream, state)), service)).await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                    }
                }
            };
            tokio::select! {
                () = serve => {}
                _ = conn.close.cancelled() => tracing::debug!("closed an idle connection to make room"),
            }
            conns.remove(id);
            if borrowed {
                // This connection's descriptor was the spare's: hold it again.
                spare.restore();
            }
            drop(slot);
        });
    }
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await.is_err() {
        tracing::warn!("in-flight requests did not finish within {SHUTDOWN_GRACE:?}; exiting");
    }
}

/// The next connection on any of `listeners`.
async fn accept_any(listeners: &[tokio::net::TcpListener]) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    futures::future::select_all(listeners.iter().map(|l| Box::pin(l.accept()))).await.0
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
        let args = crate::config::ServeArgs { listen: Some("127.0.0.1:8080".into()), data: Some("/nonexistent-ferry-test".into()), ..Default::default() };
        let mut cfg = Config::resolve(&args).unwrap();
        assert_eq!(open_to_anyone(&cfg, &[]), None, "loopback only");
        cfg.listen_more = vec!["192.0.2.7:8080".parse().unwrap()];
        assert_eq!(open_to_anyone(&cfg, &[]), Some("192.0.2.7:8080".parse().unwrap()), "a public second address");
        let token = crate::app::principal::TokenEntry { principal: "p".into(), sha256: crate::app::principal::token_hash("t"), scope: None, expires: None };
        assert_eq!(open_to_anyone(&cfg, &[token]), None, "tokens close it");
        cfg.insecure_no_auth = true;
        assert_eq!(open_to_anyone(&cfg, &[]), None, "--insecure-no-auth opens it on purpose");
    }
}
