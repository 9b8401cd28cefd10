//! Loopback proxies that put a backing service (PostgreSQL, S3) out of reach the way the network
//! or the service would, while the test watches ferry:
//!
//! - [`TcpProxy`]: forwards TCP; [`TcpProxy::cut`] drops every connection and refuses new ones
//!   (a partition, a service restart), [`TcpProxy::restore`] listens again on the same port;
//!   [`TcpProxy::hang`] keeps every connection open and accepts new ones but forwards nothing
//!   (a partition where packets vanish, a stalled proxy) until it is lifted.
//! - [`HttpFaultProxy`]: forwards HTTP/1.1 requests; while a [`Fault`] is set, the requests it
//!   matches are answered as S3 answers when it sheds load (`503 SlowDown`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy on a fixed loopback port that can be cut and restored, or hung.
pub struct TcpProxy {
    pub port: u16,
    target: SocketAddr,
    serving: Option<tokio::task::JoinHandle<()>>,
    /// `true` while nothing is forwarded.
    hung: tokio::sync::watch::Sender<bool>,
}

impl TcpProxy {
    pub async fn start(target: SocketAddr) -> TcpProxy {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let hung = tokio::sync::watch::channel(false).0;
        TcpProxy { port, target, serving: Some(tokio::spawn(serve_tcp(l, target, hung.clone()))), hung }
    }

    /// While `on`, forward nothing either way (connections stay open, new ones are accepted
    /// and wait); afterwards everything held goes on.
    pub fn hang(&self, on: bool) {
        self.hung.send_replace(on);
    }

    /// `http://127.0.0.1:PORT`.
    pub fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Drop every proxied connection and stop listening (new connections are refused).
    pub async fn cut(&mut self) {
        if let Some(h) = self.serving.take() {
            h.abort();
            let _ = h.await;
        }
    }

    /// Listen again on the same port.
    pub async fn restore(&mut self) {
        let l = TcpListener::bind(("127.0.0.1", self.port)).await.expect("rebind the proxy port");
        self.serving = Some(tokio::spawn(serve_tcp(l, self.target, self.hung.clone())));
    }
}

/// Accept and forward; the connections live in a `JoinSet`, so aborting this task drops them all.
async fn serve_tcp(l: TcpListener, target: SocketAddr, hung: tokio::sync::watch::Sender<bool>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((inbound, _)) = l.accept().await else { continue };
        while conns.try_join_next().is_some() {}
        let hung = hung.clone();
        conns.spawn(async move {
            let _ = hung.subscribe().wait_for(|h| !*h).await;
            if let Ok(out) = TcpStream::connect(target).await {
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = out.into_split();
                tokio::join!(pipe(ri, wo, hung.subscribe()), pipe(ro, wi, hung.subscribe()));
            }
        });
    }
}

/// Copy `from` to `to`, holding each piece while the proxy is hung.
async fn pipe(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, mut hung: tokio::sync::watch::Receiver<bool>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if hung.wait_for(|h| !*h).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Which requests an [`HttpFaultProxy`] refuses: given the method and the path with its query.
pub type Fault = Arc<dyn Fn(&http::Method, &str) -> bool + Send + Sync>;

/// Every request.
pub fn every_request() -> Fault {
    Arc::new(|_, _| true)
}

/// S3's CompleteMultipartUpload: `POST /bucket/key?uploadId=…`.
pub fn complete_multipart_upload() -> Fault {
    Arc::new(|m, pq| m == http::Method::POST && pq.contains("uploadId="))
}

struct FaultState {
    upstream: String,
    fault: Mutex<Option<Fault>>,
    refused: AtomicU64,
    /// `METHOD path?query`, with ` copy-source` for a request carrying `x-amz-copy-source`.
    seen: Mutex<Vec<String>>,
    http: reqwest::Client,
}

/// An HTTP forwarding proxy in front of an S3 endpoint that answers `503 SlowDown` to the
/// requests a [`Fault`] matches.
pub struct HttpFaultProxy {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    state: Arc<FaultState>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpFaultProxy {
    /// Forward to `upstream` (e.g. `http://127.0.0.1:41234`).
    pub async fn start(upstream: &str) -> HttpFaultProxy {
        let state = Arc::new(FaultState {
            upstream: upstream.trim_end_matches('/').to_string(),
            fault: Mutex::new(None),
            refused: AtomicU64::new(0),
            seen: Mutex::new(Vec::new()),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
        });
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let app = axum::Router::new().fallback(forward).with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        HttpFaultProxy { url, state, task }
    }

    /// Refuse what `fault` matches from now on (`None`: forward everything).
    pub fn set(&self, fault: Option<Fault>) {
        *self.state.fault.lock().unwrap() = fault;
    }

    /// Every request so far: `METHOD path?query`, then ` copy-source` when it carried
    /// `x-amz-copy-source` (CopyObject, UploadPartCopy).
    pub fn seen(&self) -> Vec<String> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Requests answered with 503 so far.
    pub fn refused(&self) -> u64 {
        self.state.refused.load(Ordering::SeqCst)
    }
}

impl Drop for HttpFaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(axum::extract::State(s): axum::extract::State<Arc<FaultState>>, req: axum::extract::Request) -> axum::response::Response {
    use axum::response::IntoResponse;
    let method = req.method().clone();
    let pq = req.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
    let copy = if req.headers().contains_key("x-amz-copy-source") { " copy-source" } else { "" };
    s.seen.lock().unwrap().push(format!("{method} {pq}{copy}"));
    let refuse = s.fault.lock().unwrap().as_ref().is_some_and(|f| f(&method, &pq));
    if refuse {
        s.refused.fetch_add(1, Ordering::SeqCst);
        let body =
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
        return (http::StatusCode::SERVICE_UNAVAILABLE, [("content-type", "application/xml")], body).into_response();
    }
    let headers = req.headers().clone();
    let body = axum::body::to_bytes(req.into_body(), usize::MAX).await.unwrap_or_default();
    let mut out = s.http.request(method, format!("{}{pq}", s.upstream)).body(body);
    for (k, v) in headers.iter() {
        if !matches!(k.as_str(), "content-length" | "transfer-encoding" | "connection") {
            out = out.header(k, v);
        }
    }
    match out.send().await {
        Ok(r) => {
            let status = r.status();
            let mut headers = r.headers().clone();
            headers.remove("transfer-encoding");
            headers.remove("connection");
            let body = r.bytes().await.unwrap_or_default();
            let mut res = (status, body).into_response();
            res.headers_mut().extend(headers);
            res
        }
        Err(e) => (http::StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
