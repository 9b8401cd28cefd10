//! A round-robin HTTP load balancer on loopback for replica tests: every HTTP *request* goes to
//! the next replica in turn (not every connection, as a TCP proxy would do), so consecutive
//! requests of one client on one keep-alive connection land on different replicas — the
//! cross-replica paths (lease takeover, release requests, catalog-only state) run on every
//! step. Request and response bodies are streamed both ways (PATCH bodies, SSE responses).
//!
//! Like nginx's `upstream` with a health check, a replica can be taken out of rotation
//! ([`RoundRobin::set_down`]) and put back at a new address after a restart
//! ([`RoundRobin::set_backend`]). A replica that refuses the connection while still in
//! rotation gets the request's 502, which clients retry. The proxy records which replica
//! served every request and which ones are in flight (to find the replica holding a PATCH).
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use futures::StreamExt;

/// Headers that belong to one hop (RFC 9110 §7.6.1), never forwarded.
const HOP: &[&str] = &["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"];

#[derive(Debug, Clone)]
struct Backend {
    base: String,
    up: bool,
}

/// One request as the proxy saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// Index of the replica that got it.
    pub replica: usize,
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Response status (502 when the replica could not be reached).
    pub status: u16,
}

#[derive(Debug, Clone)]
struct InFlight {
    seq: u64,
    replica: usize,
    method: String,
    path: String,
}

struct Shared {
    backends: Mutex<Vec<Backend>>,
    next: AtomicUsize,
    seq: AtomicU64,
    inflight: Mutex<Vec<InFlight>>,
    served: Mutex<Vec<Served>>,
    client: reqwest::Client,
    /// A pause after each piece of a request body forwarded (a slow client's upload).
    body_delay: Mutex<std::time::Duration>,
}

impl Shared {
    /// The next replica in rotation: (index, base URL).
    fn pick(&self) -> Option<(usize, String)> {
        let b = self.backends.lock().unwrap();
        let n = b.len();
        for _ in 0..n {
            let i = self.next.fetch_add(1, Ordering::SeqCst) % n;
            if b[i].up {
                return Some((i, b[i].base.clone()));
            }
        }
        None
    }
}

/// Removes an in-flight entry when the response body is done (or dropped).
struct Leave(Arc<Shared>, u64);
impl Drop for Leave {
    fn drop(&mut self) {
        self.0.inflight.lock().unwrap().retain(|f| f.seq != self.1);
    }
}

/// The running balancer. Stops when dropped.
pub struct RoundRobin {
    /// e.g. `http://127.0.0.1:41234`.
    pub base: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl RoundRobin {
    /// Listen on a free loopback port, in front of replicas at `bases` (`http://host:port`).
    pub async fn start(bases: &[String]) -> RoundRobin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        RoundRobin::serve(listener, bases)
    }

    /// Serve on `listener` (bind it first when the replicas must know the proxy's URL, e.g.
    /// for `--public-url`).
    pub fn serve(listener: tokio::net::TcpListener, bases: &[String]) -> RoundRobin {
        let base = format!("http://{}", listener.local_addr().unwrap());
        let client = reqwest::Client::builder().no_proxy().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        let shared = Arc::new(Shared {
            backends: Mutex::new(bases.iter().map(|b| Backend { base: b.clone(), up: true }).collect()),
            next: AtomicUsize::new(0),
            seq: AtomicU64::new(0),
            inflight: Mutex::new(Vec::new()),
            served: Mutex::new(Vec::new()),
            client,
            body_delay: Mutex::new(std::time::Duration::ZERO),
        });
        let app = axum::Router::new().fallback(forward).with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        RoundRobin { base, shared, task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Take replica `i` out of rotation (it was killed or frozen).
    pub fn set_down(&self, i: usize) {
        self.shared.backends.lock().unwrap()[i].up = false;
    }

    /// Put replica `i` (back) into rotation at `base`.
    pub fn set_backend(&self, i: usize, base: &str) {
        self.shared.backends.lock().unwrap()[i] = Backend { base: base.to_string(), up: true };
    }

    /// Send the next request to replica `i` (then continue the rotation from there): tests
    /// use it to have each replica in turn hold a PATCH.
    pub fn aim(&self, i: usize) {
        self.shared.next.store(i, Ordering::SeqCst);
    }

    /// Every request answered so far (in the order the answers started).
    pub fn served(&self) -> Vec<Served> {
        self.shared.served.lock().unwrap().clone()
    }

    /// Forward request bodies slowly: a pause of `d` after each piece (an upload that takes a
    /// while, so that a test can act while its PATCH is in flight).
    pub fn slow_request_bodies(&self, d: std::time::Duration) {
        *self.shared.body_delay.lock().unwrap() = d;
    }

    /// The unfinished requests `method`: (replica, path), oldest first.
    pub fn in_flight_paths(&self, method: &str) -> Vec<(usize, String)> {
        self.shared.inflight.lock().unwrap().iter().filter(|f| f.method == method).map(|f| (f.replica, f.path.clone())).collect()
    }

    /// Replicas with an unfinished request `method` whose path contains `path_part`.
    pub fn in_flight(&self, method: &str, path_part: &str) -> Vec<usize> {
        self.shared.inflight.lock().unwrap().iter().filter(|f| f.method == method && f.path.contains(path_part)).map(|f| f.replica).collect()
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(State(p): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map(|pq| pq.as_str().to_string()).unwrap_or_else(|| "/".into());
    let method = parts.method.to_string();
    let Some((replica, base)) = p.pick() else {
        return Response::builder().status(503).body(Body::from("no replica in rotation")).unwrap();
    };
    let seq = p.seq.fetch_add(1, Ordering::SeqCst);
    p.inflight.lock().unwrap().push(InFlight { seq, replica, method: method.clone(), path: path.clone() });
    let leave = Leave(p.clone(), seq);
    let mut rb = p.client.request(parts.method.clone(), format!("{base}{path}"));
    for (k, v) in parts.headers.iter() {
        if !HOP.contains(&k.as_str()) {
            rb = rb.header(k, v);
        }
    }
    // A request without a body (no Content-Length, no chunked encoding) is forwarded without
    // one: a streamed body would reach the replica as `Transfer-Encoding: chunked`.
    let has_body = parts.headers.contains_key(http::header::CONTENT_LENGTH) || parts.headers.contains_key(http::header::TRANSFER_ENCODING);
    if has_body {
        let delay = *p.body_delay.lock().unwrap();
        let stream = body.into_data_stream().then(move |piece| async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            piece
        });
        rb = rb.body(reqwest::Body::wrap_stream(stream));
    }
    let resp = match rb.send().await {
        Ok(r) => r,
        Err(e) => {
            p.served.lock().unwrap().push(Served { replica, method, path, status: 502 });
            return Response::builder().status(502).body(Body::from(format!("replica {replica} at {base}: {e}"))).unwrap();
        }
    };
    let status = resp.status();
    p.served.lock().unwrap().push(Served { replica, method, path, status: status.as_u16() });
    let mut out = Response::builder().status(status);
    for (k, v) in resp.headers().iter() {
        if !HOP.contains(&k.as_str()) {
            out = out.header(k, v);
        }
    }
    // The entry stays in flight until the response body is done.
    let stream = resp.bytes_stream().map(move |r| {
        let _ = &leave;
        r
    });
    out.body(Body::from_stream(stream)).unwrap()
}
