//! A PostgreSQL catalog that goes away mid-run (issue 10, DESIGN §9): requests get
//! `503 unavailable` with `retryable: true`, no acknowledged byte is lost, and ferry serves
//! again by itself once the database is back. The outage is a loopback TCP proxy between ferry
//! and PostgreSQL that the test cuts (connections reset, new ones refused) and restores on the
//! same port — what a network partition or a database restart looks like to ferry.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::pg::TestDb;
use common::*;
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy on a fixed loopback port that can be cut and restored.
struct Proxy {
    port: u16,
    target: SocketAddr,
    serving: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        Proxy { port, target, serving: Some(tokio::spawn(serve(l, target))) }
    }

    /// Drop every proxied connection and stop listening (new connections are refused).
    async fn cut(&mut self) {
        if let Some(h) = self.serving.take() {
            h.abort();
            let _ = h.await;
        }
    }

    /// Listen again on the same port.
    async fn restore(&mut self) {
        let l = TcpListener::bind(("127.0.0.1", self.port)).await.expect("rebind the proxy port");
        self.serving = Some(tokio::spawn(serve(l, self.target)));
    }
}

/// Accept and forward; the connections live in a `JoinSet`, so aborting this task drops them all.
async fn serve(l: TcpListener, target: SocketAddr) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((mut inbound, _)) = l.accept().await else { continue };
        while conns.try_join_next().is_some() {}
        conns.spawn(async move {
            if let Ok(mut out) = TcpStream::connect(target).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_that_goes_away_gives_503_and_ferry_recovers_when_it_returns() {
    let db = TestDb::create().await;
    let mut url = url::Url::parse(&db.url).unwrap();
    let target: SocketAddr = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432)).parse().expect("FERRY_TEST_PG names an IP address");
    let mut proxy = Proxy::start(target).await;
    url.set_port(Some(proxy.port)).unwrap();
    let s = Server::start(&["--catalog", url.as_str()]);
    let tus = Tus::new(&s);
    let data = pseudo_random(1 << 20, 21);
    let upload = tus.create(data.len() as u64).await;
    assert_eq!(tus.patch(&upload, 0, data[..400_000].to_vec(), &[]).await.status(), 204);

    proxy.cut().await;
    // Creation and append are refused as retryable, never as an internal error.
    let p = problem(tus.post(&[("Upload-Length", "10")]).await, 503, "unavailable").await;
    assert_eq!(p["retryable"], true, "{p}");
    let r = tus.patch(&upload, 400_000, data[400_000..].to_vec(), &[]).await;
    assert!(r.headers().contains_key("retry-after"), "{:?}", r.headers());
    let p = problem(r, 503, "unavailable").await;
    assert_eq!(p["retryable"], true, "{p}");
    let ready = client().get(s.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503, "readyz says the catalog is away");

    proxy.restore().await;
    // Back by itself: the offset is what was acknowledged, and the upload completes.
    let deadline = Instant::now() + Duration::from_secs(90);
    let offset = loop {
        let r = tus.head(&upload).await;
        if r.status() == 200 {
            break header_u64(&r, "upload-offset").unwrap();
        }
        assert!(Instant::now() < deadline, "ferry never recovered: HEAD answers {}", r.status());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(offset, 400_000, "no acknowledged byte lost, nothing unacknowledged kept");
    assert_eq!(tus.patch(&upload, 400_000, data[400_000..].to_vec(), &[]).await.status(), 204);
    assert_eq!(tus.download(&upload).await, data);
    assert_eq!(tus.post(&[("Upload-Length", "10")]).await.status(), 201);
}
