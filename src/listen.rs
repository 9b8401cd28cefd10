//! Accepting connections and serving HTTP/1.1 and HTTP/2 on them (hyper): the connection cap and what
//! closes idle connections to make room, the spare descriptor that answers when `accept` runs
//! out of descriptors below the cap, TLS handshakes, and graceful shutdown. What happens on
//! each connection below the router (a lingering close, hyper's refusals worded) is
//! [`crate::http::wire`]. `serve.rs` builds the router and calls [`serve_http`].

use std::sync::Arc;
use std::time::Duration;

/// How long graceful shutdown waits for in-flight requests after asking PATCHes to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

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
        let mut idle: Vec<&Arc<ConnSlot>> = live
            .values()
            .filter(|c| !c.state.requested() && c.state.idle() && !c.close.is_cancelled() && c.state.accepted().elapsed() >= older_than)
            .collect();
        idle.sort_by_key(|c| c.state.accepted());
        idle.iter().take(n).for_each(|c| c.close.cancel());
        idle.len().min(n)
    }

    /// Close up to `n` connections that have answered no request for `idle_for` at least: first
    /// those that never sent one (longest-waiting first), then idle keep-alive ones
    /// (longest-idle first). Returns how many.
    fn shed_idle(&self, n: usize, idle_for: Duration) -> usize {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let mut idle: Vec<&Arc<ConnSlot>> =
            live.values().filter(|c| c.state.idle() && !c.close.is_cancelled() && c.state.idle_since().elapsed() >= idle_for).collect();
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
pub fn connection_cap(configured: Option<u32>) -> usize {
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

/// Accept HTTP/1.1 and HTTP/2 connections ([`http_builder`]) until `signal` resolves, then wait up to [`SHUTDOWN_GRACE`]
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
/// than the cap assumes), the server treats it as the cap: it gives up its [`Spare`]
/// descriptor to accept the newcomer (when one waits: `accept` fails whether or not one does),
/// closes up to [`SHED_PER_EMFILE`] idle connections for the next ones (never-requested first,
/// then idle keep-alive ones), serves it one request (answered
/// with `Connection: close`) and takes the spare back. Without a spare it waits for a connection to end, at most
/// 100 ms at a time. Other `accept` failures (`ENOBUFS`…) back off 10 ms doubling to 100 ms.
///
/// Every connection closes lingering when a body was left unread ([`crate::http::wire`]), and
/// hyper's own refusals carry ferry's problem+json body.
///
/// With `tls`, each accepted connection first completes a TLS handshake (within
/// [`HEADER_READ_TIMEOUT`], on its own task, so a slow handshake never holds up accepting).
pub async fn serve_http(
    listeners: Vec<tokio::net::TcpListener>,
    router: axum::Router,
    signal: impl std::future::Future<Output = ()>,
    max_connections: usize,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let http = http_builder();
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
                    // The cap assumed descriptors that other files hold. accept() fails so
                    // whether or not a client waits: the spare descriptor tells which.
                    if emfile_logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                        tracing::warn!(
                            error = %e,
                            live = conns.live.lock().unwrap_or_else(|e| e.into_inner()).len(),
                            "accept failed: out of file descriptors below the connection cap; \
                             answering with the spare descriptor and closing idle connections"
                        );
                        emfile_logged = Some(std::time::Instant::now());
                    }
                    if spare.give_up() || spare.restore() && spare.give_up() {
                        // The freed descriptor is for a newcomer, if one waits.
                        match tokio::time::timeout(Duration::from_millis(100), accept_any(&listeners)).await {
                            Ok(Ok((s, _))) => {
                                // A client waited: make room for the next ones as at the cap
                                // (before this one joins the connections, so it is not closed).
                                let shed = conns.shed_idle(SHED_PER_EMFILE, Duration::ZERO);
                                tracing::debug!(shed, "accepted with the spare descriptor");
                                (s, true)
                            }
                            _ => {
                                // Nobody waits (the listener is no longer reported ready).
                                spare.restore();
                                continue;
                            }
                        }
                    } else {
                        // No spare (a newcomer holds it): close connections idle for a
                        // second (the spare's own, if its client sends nothing), wait for a
                        // connection to end (bounded); the descriptor it frees becomes the
                        // spare before anything else is accepted.
                        conns.shed_idle(SHED_PER_EMFILE, Duration::from_secs(1));
                        tokio::select! {
                            _ = conns.ended.notified() => {}
                            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                            _ = &mut signal => break,
                        }
                        spare.restore();
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
                tracing::info!(
                    closed = n,
                    "near the connection cap: closed connections that sent no complete request within {PRESSURE_HEADER_TIMEOUT:?}"
                );
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
                    tracing::warn!(
                        max_connections,
                        "connection cap reached: closing connections that sent no complete request; otherwise new ones wait until one closes"
                    );
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
        if borrowed {
            // One request on the spare's descriptor, then it is given back. (Not hyper's
            // `keep_alive(false)`: that closes a connection still waiting for its first request.)
            conn.state.answer_once();
        }
        let (on_req, on_res) = (conn.state.clone(), conn.state.clone());
        // The client's address, for what is limited per address (a link's passphrase tries).
        let peer = stream.peer_addr().ok();
        let service = hyper_util::service::TowerToHyperService::new(tower::ServiceExt::map_response(
            tower::ServiceExt::map_request(router.clone(), move |req| {
                let mut req = crate::http::wire::on_request(&on_req, req);
                if let Some(peer) = peer {
                    req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                }
                req
            }),
            move |res| crate::http::wire::on_response(&on_res, res),
        ));
        let (conns, spare, watcher) = (conns.clone(), spare.clone(), graceful.watcher());
        let http = http.clone();
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

/// Most concurrent streams (requests) one HTTP/2 connection may have open: RFC 9113 §6.5.2
/// recommends no fewer than 100. An HTTP/1.1 connection has one at a time; the connection cap
/// bounds connections, this bounds what one connection multiplexes.
pub const H2_MAX_STREAMS: u32 = 100;
/// HTTP/2 flow control (RFC 9113 §6.9): the window each stream starts with, in bytes. 64 KiB
/// (the protocol's default) holds a large PATCH to one window per round trip; 4 MiB lets a
/// client keep sending while the server writes the previous chunk to the blob.
pub const H2_STREAM_WINDOW: u32 = 4 << 20;
/// The connection's window, in bytes: room for eight streams' full windows at once, so eight
/// uploads over one connection are not held back by each other's unread bytes.
pub const H2_CONNECTION_WINDOW: u32 = 32 << 20;

/// The largest HTTP/2 frame payload a client may send, in bytes (RFC 9113 §4.2: 16 KiB unless
/// the server says more, at most 16 MiB − 1). A body arrives frame by frame, each a chunk the
/// upload engine hashes and writes: at 16 KiB, eight uploads over one connection took 1.4× the
/// CPU per GiB of eight HTTP/1.1 connections; at 1 MiB, less than they (benches/RESULTS.md).
/// The h2 crate's guard against CONTINUATION floods then lets a header block span at most 5
/// frames (about 80 KiB in the 16 KiB frames clients split headers into; a TUS client sends
/// under 2 KiB); a longer one ends the connection (`ENHANCE_YOUR_CALM`).
pub const H2_MAX_FRAME: u32 = 1 << 20;

/// The connection builder: HTTP/1.1, and HTTP/2 when the client starts with its connection
/// preface (h2c with prior knowledge on a plain port, RFC 9113 §3.3) or chose `h2` by ALPN over
/// TLS (§3.2). HTTP/1.1 keeps [`HEADER_READ_TIMEOUT`] and hyper's limits (100 header fields, a
/// head of 408 KiB); HTTP/2 gets the same head limit as a header list size, at most
/// [`H2_MAX_STREAMS`] streams, and windows sized for large bodies ([`H2_STREAM_WINDOW`],
/// [`H2_CONNECTION_WINDOW`]) and frames of up to [`H2_MAX_FRAME`].
fn http_builder() -> hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor> {
    use hyper_util::rt::{TokioExecutor, TokioTimer};
    let mut http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    http.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    http.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(crate::http::wire::MAX_HEAD_BYTES as u32)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_frame_size(H2_MAX_FRAME);
    http
}

/// The next connection on any of `listeners`.
async fn accept_any(listeners: &[tokio::net::TcpListener]) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    futures::future::select_all(listeners.iter().map(|l| Box::pin(l.accept()))).await.0
}
