//! `ferry serve`: open the stores, recover, and serve HTTP until SIGINT/SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::blob::FsBlobStore;
use crate::catalog::SqliteCatalog;
use crate::config::{Config, Durability};
use crate::http::auth::Tokens;
use crate::http::{app, AppState, HttpConfig};
use crate::tasks::{Engine, TaskConfig};
use crate::metrics::Metrics;
use crate::upload::{EngineConfig, UploadEngine};

/// How long graceful shutdown waits for in-flight requests after asking PATCHes to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Run the server with `cfg`. Prints `listening on http://ADDR` to stdout once it accepts.
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(&cfg.data).with_context(|| format!("creating data dir {}", cfg.data.display()))?;
    if !cfg.listen.ip().is_loopback() && cfg.tokens.is_empty() && !cfg.insecure_no_auth {
        anyhow::bail!(
            "refusing to listen on {} without bearer tokens: create one with `ferry token create NAME`, \
             or pass --insecure-no-auth to let anyone who can connect read and write everything",
            cfg.listen
        );
    }
    let catalog: Arc<dyn crate::catalog::Catalog> = Arc::new(SqliteCatalog::open(&cfg.data.join("ferry.db")).await.context("opening the catalog")?);
    let blobs = FsBlobStore::open(&cfg.data.join("blobs"), cfg.durability == Durability::Full).context("opening the blob store")?;
    let metrics = Arc::new(Metrics::default());
    let engine = UploadEngine::new(
        catalog.clone(),
        Arc::new(blobs),
        EngineConfig {
            max_size: cfg.max_size,
            expire_after: cfg.expire_after,
            checkpoint_every: cfg.checkpoint_every,
            idle_timeout: cfg.idle_timeout,
            sweep_interval: cfg.sweep_interval,
            ..EngineConfig::default()
        },
        metrics.clone(),
    );
    engine.recover().await.context("start-up recovery")?;
    let sweeper = engine.spawn_sweeper();
    let mut tasks = Engine::new(catalog, engine.clone(), TaskConfig { workers: cfg.task_workers, lease: cfg.task_lease, default_ttl: cfg.task_ttl, ..TaskConfig::default() });
    for job in crate::tasks::kinds::builtin(&cfg) {
        tasks.register(job);
    }
    let tasks = Arc::new(tasks);
    let workers = tasks.spawn();

    let router = app(AppState {
        engine: engine.clone(),
        tasks: tasks.clone(),
        tokens: Tokens::new(&cfg.tokens),
        metrics,
        http: HttpConfig { behind_proxy: cfg.behind_proxy },
    });
    let listener = tokio::net::TcpListener::bind(cfg.listen).await.with_context(|| format!("binding {}", cfg.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, data = %cfg.data.display(), durability = ?cfg.durability, "ferry serving");
    println!("listening on http://{addr}");

    let shutdown_engine = engine.clone();
    let signal = async move {
        shutdown_signal().await;
        tracing::info!("shutting down: checkpointing in-flight uploads");
        shutdown_engine.begin_shutdown();
    };
    let shutdown_tasks = tasks.clone();
    let server = axum::serve(listener, router).with_graceful_shutdown(signal);
    let server = tokio::spawn(async move { server.await });
    engine.shutdown_requested().await;
    shutdown_tasks.shutdown();
    match tokio::time::timeout(SHUTDOWN_GRACE, server).await {
        Ok(r) => r??,
        Err(_) => tracing::warn!("in-flight requests did not finish within {SHUTDOWN_GRACE:?}; exiting"),
    }
    sweeper.abort();
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(5), w).await;
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
