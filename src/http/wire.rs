//! Below the router, on the connection itself (hyper's HTTP/1 server), two things hyper does not
//! do for ferry:
//!
//! - **An early answer reaches its client.** An answer sent before its request's body was read
//!   (a 409, 412, 413, 415, 423, 460 or 507 from the headers alone, an upload taken over
//!   mid-PATCH, a refusal of hyper's) leaves the rest of the body on its way. Closing the socket
//!   with unread bytes in it makes the kernel send a reset, and a reset destroys the answer on
//!   its way to the client, which sees a broken pipe or a connection reset instead (and
//!   tus-js-client behind a balancer saw neither success nor error). So when a connection whose
//!   last body was let go unread closes, ferry closes *lingering*, as nginx does
//!   (`lingering_close`): it shuts down its sending side (the client reads the whole answer,
//!   then the end of the stream), reads and drops what the client still sends until the client
//!   closes too, and closes only then — or after [`LINGER_IDLE`] without a byte, or
//!   [`LINGER_TIME`] in all.
//! - **hyper's own refusals explain themselves.** hyper refuses a request it cannot parse before
//!   any handler runs — more than 100 header fields or a head over 408 KiB (431), a target over
//!   64 KiB (414), a malformed request line or header, or a body length it cannot trust (400) —
//!   with an empty body. [`Worded`] writes ferry's problem+json body instead, with the cause it
//!   finds in the request head.
//!
//! - **Informational answers before the final one (HTTP/1.1).** hyper 1.x has no server API for a
//!   1xx response other than its own `100 Continue` (hyperium/hyper PR #4114, which would add one
//!   over HTTP/2, is open). A handler that wants one (the draft's `104 Upload Resumption
//!   Supported`) queues it through the request's [`Interim`]; [`Worded`], which sits between
//!   hyper and the socket, writes it at the next read or write of that connection while hyper
//!   is between writes — before the request's body is read, and always before the final
//!   answer's head. Over HTTP/2 the bytes are frames hyper owns, so [`Interim::send`] says no.
//!
//! [`ConnState`] is what the request and response of a connection tell its socket: serve.rs
//! wraps each request with [`on_request`] and each response with [`on_response`].

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use bytes::Bytes;
use http_body::Body as _;
use std::future::Future as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::{ErrorCode, Refusal};

/// Longest a lingering close waits for the next bytes of a client that neither sends nor closes.
pub const LINGER_IDLE: Duration = Duration::from_secs(2);
/// Longest a lingering close lasts in all (nginx's `lingering_time` is 30 s): a client still
/// sending after this long has had the answer for as long.
pub const LINGER_TIME: Duration = Duration::from_secs(15);
/// Most bytes a lingering close reads per wake-up before it lets other tasks run.
const LINGER_BURST: usize = 1 << 20;
/// Bytes of a request head [`Worded`] keeps to say what was wrong with it.
const HEAD_COPY: usize = 16 << 10;
/// hyper's limits (`hyper::proto::h1`): header fields, head bytes (its read buffer), URI bytes.
const MAX_HEADERS: usize = 100;
/// The largest request head HTTP/1.1 reads, in bytes (hyper's read buffer); HTTP/2 takes it
/// as its header list size (RFC 9113 §6.5.2: names and values plus 32 bytes a field).
pub const MAX_HEAD_BYTES: usize = 8192 + 4096 * 100;
const MAX_URI_BYTES: usize = u16::MAX as usize - 1;

/// What one connection's requests and responses tell its socket, and what eviction reads.
#[derive(Debug)]
pub struct ConnState {
    accepted: Instant,
    /// A request body was let go before its end: close lingering.
    unread: AtomicBool,
    /// Requests being answered: the router was called and the response body is not done.
    busy: AtomicUsize,
    /// A complete request head arrived at least once (the router was called).
    requested: AtomicBool,
    /// Bytes arrived while no request was being answered, since the router was last called:
    /// the head of the next request, which hyper may refuse.
    idle_read: AtomicBool,
    /// When the last answer was done, in ms since `accepted`.
    idle_since_ms: AtomicU64,
    /// Close after the first answer (`Connection: close`): the connection holds a descriptor
    /// lent for one request.
    once: AtomicBool,
    /// The connection speaks HTTP/2 (its requests say so): `Connection: close` means nothing
    /// there (RFC 9113 §8.2.2).
    h2: AtomicBool,
    /// Informational answers queued by [`Interim::send`], not yet taken by [`Worded`].
    interim: std::sync::Mutex<Vec<u8>>,
    /// Bytes are in `interim`: [`Worded`] looks without taking the lock.
    interim_queued: AtomicBool,
}

impl Default for ConnState {
    fn default() -> Self {
        ConnState {
            accepted: Instant::now(),
            unread: false.into(),
            busy: 0.into(),
            requested: false.into(),
            idle_read: false.into(),
            idle_since_ms: 0.into(),
            once: false.into(),
            h2: false.into(),
            interim: Default::default(),
            interim_queued: false.into(),
        }
    }
}

impl ConnState {
    /// Close the connection after its first answer (it says `Connection: close`).
    pub fn answer_once(&self) {
        self.once.store(true, Ordering::Relaxed);
    }

    /// When the connection was accepted.
    pub fn accepted(&self) -> Instant {
        self.accepted
    }

    /// A complete request arrived at least once.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::Relaxed)
    }

    /// No request is being answered: the connection waits for its first or its next request.
    pub fn idle(&self) -> bool {
        self.busy.load(Ordering::Relaxed) == 0
    }

    /// Since when the connection has been idle (its accept, or its last answer's end).
    pub fn idle_since(&self) -> Instant {
        self.accepted + Duration::from_millis(self.idle_since_ms.load(Ordering::Relaxed))
    }
}

/// A request as the router gets it: its body tracked, so that a body let go before its end
/// makes the connection close lingering.
pub fn on_request(conn: &Arc<ConnState>, req: Request<hyper::body::Incoming>) -> Request<Body> {
    conn.requested.store(true, Ordering::Relaxed);
    if req.version() == axum::http::Version::HTTP_2 {
        conn.h2.store(true, Ordering::Relaxed);
    }
    conn.busy.fetch_add(1, Ordering::Relaxed);
    conn.idle_read.store(false, Ordering::Relaxed);
    // A new request on this connection: whatever an earlier body left was read after all.
    conn.unread.store(false, Ordering::Relaxed);
    let (mut parts, body) = req.into_parts();
    parts.extensions.insert(Interim { conn: conn.clone(), http1: parts.version <= axum::http::Version::HTTP_11 });
    let ended = http_body::Body::is_end_stream(&body);
    Request::from_parts(parts, Body::new(Tracked { inner: body, ended, conn: conn.clone() }))
}

/// A response as hyper gets it: when its body is done (sent or dropped) the connection is idle
/// again.
pub fn on_response(conn: &Arc<ConnState>, mut res: Response<Body>) -> Response<Body> {
    if conn.once.load(Ordering::Relaxed) && !conn.h2.load(Ordering::Relaxed) {
        res.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    }
    let done = Answered(conn.clone());
    res.map(|b| {
        Body::new(http_body_util::BodyExt::map_frame(b, move |f| {
            let _ = &done;
            f
        }))
    })
}

/// Sends informational (1xx) answers ahead of a request's final answer; every request carries
/// one in its extensions ([`on_request`]).
#[derive(Clone, Debug)]
pub struct Interim {
    conn: Arc<ConnState>,
    http1: bool,
}

impl Interim {
    /// Whether [`Interim::send`] can send anything on this request's connection: HTTP/1.x.
    pub fn can_send(&self) -> bool {
        self.http1
    }

    /// Queue an informational answer (`status` 100–199 other than 101, `reason` its phrase, then
    /// `headers`) to be written before the final answer. Over HTTP/1.x it reaches the client
    /// when the request's body is read next (or, at the latest, just before the final answer's
    /// head); returns false and sends nothing over HTTP/2, where hyper 1.x offers no way to send
    /// one (hyperium/hyper PR #4114), or for a status that is not informational.
    pub fn send(&self, status: StatusCode, reason: &str, headers: &axum::http::HeaderMap) -> bool {
        if !self.http1 || !status.is_informational() || status == StatusCode::SWITCHING_PROTOCOLS {
            return false;
        }
        let mut head = format!("HTTP/1.1 {} {reason}\r\n", status.as_u16()).into_bytes();
        for (name, value) in headers {
            head.extend_from_slice(name.as_str().as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"\r\n");
        self.conn.interim.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(&head);
        self.conn.interim_queued.store(true, Ordering::Release);
        true
    }
}

struct Answered(Arc<ConnState>);

impl Drop for Answered {
    fn drop(&mut self) {
        let ms = self.0.accepted.elapsed().as_millis() as u64;
        self.0.idle_since_ms.store(ms, Ordering::Relaxed);
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request body that notes, when dropped before its end, that the client may still be sending.
struct Tracked {
    inner: hyper::body::Incoming,
    ended: bool,
    conn: Arc<ConnState>,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        let r = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if r.is_none() || self.inner.is_end_stream() {
            self.ended = true;
        }
        Poll::Ready(r)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.ended && !self.inner.is_end_stream() {
            self.conn.unread.store(true, Ordering::Relaxed);
        }
    }
}

/// The socket under hyper (under TLS, when there is TLS): closes lingering when the
/// connection's last body was not read to its end ([`ConnState`]).
pub struct Lingering<S> {
    inner: S,
    conn: Arc<ConnState>,
    state: Linger,
}

enum Linger {
    Open,
    Draining { until: tokio::time::Instant, quiet: Pin<Box<tokio::time::Sleep>>, dropped: u64 },
    Closed,
}

impl<S> Lingering<S> {
    pub fn new(inner: S, conn: Arc<ConnState>) -> Self {
        Lingering { inner, conn, state: Linger::Open }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Lingering<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Lingering<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    /// Shut down the sending side; then, if a body was let go unread, read and drop what the
    /// client still sends until it closes, goes quiet for [`LINGER_IDLE`], or [`LINGER_TIME`]
    /// has passed.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                Linger::Closed => return Poll::Ready(Ok(())),
                Linger::Open => {
                    let shut = ready!(Pin::new(&mut this.inner).poll_shutdown(cx));
                    if shut.is_err() || !this.conn.unread.load(Ordering::Relaxed) {
                        this.state = Linger::Closed;
                        return Poll::Ready(shut);
                    }
                    let now = tokio::time::Instant::now();
                    let until = now + LINGER_TIME;
                    this.state = Linger::Draining { until, quiet: Box::pin(tokio::time::sleep_until(now + LINGER_IDLE)), dropped: 0 };
                }
                Linger::Draining { until, quiet, dropped } => {
                    let mut scratch = [0u8; 16 << 10];
                    let mut burst = 0;
                    while burst < LINGER_BURST {
                        let mut rb = ReadBuf::new(&mut scratch);
                        match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                            Poll::Ready(Ok(())) if !rb.filled().is_empty() => {
                                burst += rb.filled().len();
                                *dropped += rb.filled().len() as u64;
                            }
                            // The client closed (or the socket failed): done.
                            Poll::Ready(_) => {
                                tracing::debug!(dropped = *dropped, "lingering close: the client closed");
                                this.state = Linger::Closed;
                                return Poll::Ready(Ok(()));
                            }
                            Poll::Pending => break,
                        }
                    }
                    if burst > 0 {
                        let next = (tokio::time::Instant::now() + LINGER_IDLE).min(*until);
                        quiet.as_mut().reset(next);
                    }
                    if quiet.as_mut().poll(cx).is_ready() {
                        tracing::debug!(dropped = *dropped, "lingering close: gave up waiting for the client to close");
                        this.state = Linger::Closed;
                        return Poll::Ready(Ok(()));
                    }
                    if burst >= LINGER_BURST {
                        // More may be waiting: come back after other tasks ran.
                        cx.waker().wake_by_ref();
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

/// The stream hyper reads and writes: hyper's own refusals (an unparsable request, before any
/// handler ran) are written with ferry's problem+json body instead of an empty one.
pub struct Worded<S> {
    inner: S,
    conn: Arc<ConnState>,
    /// The first [`HEAD_COPY`] bytes read since the router was last called.
    head: Vec<u8>,
    /// The answer being written in place of hyper's, how much of it is written, and how many
    /// bytes of hyper's it stands for.
    rewriting: Option<(Vec<u8>, usize, usize)>,
    /// Informational answers ([`Interim`]) being written, and how much of them is written.
    interim: (Vec<u8>, usize),
    /// hyper's last write took only part of what it offered: the rest follows, and nothing may
    /// be written between.
    mid_write: bool,
}

impl<S> Worded<S> {
    pub fn new(inner: S, conn: Arc<ConnState>) -> Self {
        Worded { inner, conn, head: Vec::new(), rewriting: None, interim: (Vec::new(), 0), mid_write: false }
    }

    /// Write the informational answers queued by [`Interim::send`], unless hyper is in the
    /// middle of a write.
    fn poll_interim(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>
    where
        S: AsyncWrite + Unpin,
    {
        if self.mid_write {
            return Poll::Ready(Ok(()));
        }
        if self.interim.0.is_empty() && self.conn.interim_queued.swap(false, Ordering::Acquire) {
            self.interim = (std::mem::take(&mut *self.conn.interim.lock().unwrap_or_else(|e| e.into_inner())), 0);
        }
        while self.interim.1 < self.interim.0.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.interim.0[self.interim.1..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.interim.1 += n;
        }
        if !self.interim.0.is_empty() {
            self.interim = (Vec::new(), 0);
            ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
        }
        Poll::Ready(Ok(()))
    }

    /// The answer to write in place of `buf`, when `buf` is hyper's refusal of a request head
    /// read while no request was being answered.
    fn replacement(&self, buf: &[u8]) -> Option<Vec<u8>> {
        if !self.conn.idle() || !self.conn.idle_read.load(Ordering::Relaxed) {
            return None;
        }
        let status = hyper_refusal(buf)?;
        self.conn.unread.store(true, Ordering::Relaxed);
        Some(refusal_bytes(status, &self.head))
    }

    fn poll_rewrite(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>>
    where
        S: AsyncWrite + Unpin,
    {
        let (bytes, written, stands_for) = self.rewriting.as_mut().expect("rewriting");
        while *written < bytes.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        let n = *stands_for;
        self.rewriting = None;
        Poll::Ready(Ok(n))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Worded<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        // hyper reads when the handler asks for the body: an informational answer queued
        // before that goes out first.
        ready!(self.poll_interim(cx))?;
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let got = &buf.filled()[before..];
        if !got.is_empty() && self.conn.idle() {
            if !self.conn.idle_read.swap(true, Ordering::Relaxed) {
                self.head.clear();
            }
            let room = HEAD_COPY.saturating_sub(self.head.len());
            let take = got.len().min(room);
            self.head.extend_from_slice(&got[..take]);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Worded<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.rewriting.is_none() {
            match self.replacement(buf) {
                Some(bytes) => self.rewriting = Some((bytes, 0, buf.len())),
                None => {
                    ready!(self.poll_interim(cx))?;
                    let n = ready!(Pin::new(&mut self.inner).poll_write(cx, buf))?;
                    self.mid_write = n < buf.len();
                    return Poll::Ready(Ok(n));
                }
            }
        }
        self.poll_rewrite(cx)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        if self.rewriting.is_none() {
            let mut filled = bufs.iter().filter(|b| !b.is_empty());
            let only = match (filled.next(), filled.next()) {
                (Some(first), None) => self.replacement(first).map(|bytes| (bytes, first.len())),
                _ => None,
            };
            match only {
                Some((bytes, n)) => self.rewriting = Some((bytes, 0, n)),
                None => {
                    ready!(self.poll_interim(cx))?;
                    let n = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, bufs))?;
                    self.mid_write = n < bufs.iter().map(|b| b.len()).sum::<usize>();
                    return Poll::Ready(Ok(n));
                }
            }
        }
        self.poll_rewrite(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_interim(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The status of `buf` when it is an answer hyper wrote by itself for a request it could not
/// parse: a whole head of status 400, 414 or 431 with an empty body and no `Content-Type`
/// (`hyper::proto::h1::role::Server::on_error`); ferry's own answers always carry a body.
fn hyper_refusal(buf: &[u8]) -> Option<u16> {
    let rest = buf.strip_prefix(b"HTTP/1.1 ")?;
    let status = match rest.get(..4)? {
        b"400 " => 400,
        b"414 " => 414,
        b"431 " => 431,
        _ => return None,
    };
    if !buf.ends_with(b"\r\n\r\n") || buf.len() > 1024 {
        return None;
    }
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut res = httparse::Response::new(&mut headers);
    if !matches!(res.parse(buf), Ok(httparse::Status::Complete(n)) if n == buf.len()) {
        return None;
    }
    let empty = res.headers.iter().any(|h| h.name.eq_ignore_ascii_case("content-length") && h.value == b"0");
    let typed = res.headers.iter().any(|h| h.name.eq_ignore_ascii_case("content-type"));
    (empty && !typed).then_some(status)
}

/// The whole answer written in place of hyper's refusal of status `status`, for the request
/// head that begins with `head`.
fn refusal_bytes(status: u16, head: &[u8]) -> Vec<u8> {
    let refusal = refusal_of(status, head);
    let (status, headers, body) = super::problem_parts(refusal, None);
    let mut out = format!("HTTP/1.1 {} {}\r\n", status.as_u16(), status.canonical_reason().unwrap_or("Error")).into_bytes();
    for (name, value) in headers.iter() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let date = httpdate::fmt_http_date(std::time::SystemTime::now());
    out.extend_from_slice(format!("connection: close\r\ndate: {date}\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(body.as_bytes());
    out
}

/// What was wrong with a request hyper refused with `status`, from its first bytes `head`.
fn refusal_of(status: u16, head: &[u8]) -> Refusal {
    let refuse = |detail: String, hint: &str| Refusal::new(status, ErrorCode::InvalidArgument, detail, hint.to_string());
    match status {
        414 => refuse(
            format!("the request target (the URL's path and query) is longer than {MAX_URI_BYTES} bytes"),
            "Send a shorter URL: ferry's URLs are short; put data in headers or the body.",
        ),
        431 => {
            let fields = header_lines(head);
            let detail = match fields {
                Some(n) if n > MAX_HEADERS => format!("the request has {n} header fields; at most {MAX_HEADERS} are read"),
                None if too_many_headers(head) => format!("the request has more than {MAX_HEADERS} header fields; at most {MAX_HEADERS} are read"),
                _ => format!("the request's head (its request line and headers) is larger than {MAX_HEAD_BYTES} bytes, the most that is read"),
            };
            refuse(
                detail,
                "Send at most 100 header fields and a head of at most 400 KiB (a TUS client needs \
                 fewer than 20 headers); a proxy or script that adds headers may be the cause.",
            )
        }
        _ => {
            let (detail, hint) = malformed(head);
            Refusal::new(StatusCode::BAD_REQUEST.as_u16(), ErrorCode::InvalidArgument, detail, hint)
        }
    }
}

/// How many header fields a complete head in `head` has (`None`: its end is not in `head`).
fn header_lines(head: &[u8]) -> Option<usize> {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")?;
    Some(head[..end].split(|b| *b == b'\n').count().saturating_sub(1))
}

fn too_many_headers(head: &[u8]) -> bool {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    matches!(httparse::Request::new(&mut headers).parse(head), Err(httparse::Error::TooManyHeaders))
}

/// Why a head hyper refused with 400 is malformed, and the next step.
fn malformed(head: &[u8]) -> (String, String) {
    let shown = |line: &[u8]| {
        let text = String::from_utf8_lossy(&line[..line.len().min(120)]).to_string();
        if line.len() > 120 {
            format!("{text:?}…")
        } else {
            format!("{text:?}")
        }
    };
    let mut lines = head.split(|b| *b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let first = lines.next().unwrap_or_default();
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let parsed = req.parse(head);
    let line_ok = {
        let mut probe = [httparse::EMPTY_HEADER; 0];
        let mut only = first.to_vec();
        only.extend_from_slice(b"\r\n\r\n");
        !matches!(httparse::Request::new(&mut probe).parse(&only), Err(e) if e != httparse::Error::TooManyHeaders)
    };
    if !line_ok {
        return (
            format!("the request line {} is not `METHOD TARGET HTTP/1.1`", shown(first)),
            "Send a request line such as `PATCH /files/ID HTTP/1.1` (HTTP/1.0 and HTTP/1.1 are served).".into(),
        );
    }
    if let Err(e) = parsed {
        for (i, line) in lines.enumerate() {
            if line.is_empty() {
                break;
            }
            let good = match line.iter().position(|b| *b == b':') {
                Some(colon) => {
                    colon > 0
                        && line[..colon].iter().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b))
                        && line[colon + 1..].iter().all(|b| *b == b'\t' || *b >= 0x20 && *b != 0x7f)
                }
                None => false,
            };
            if !good {
                return (
                    format!("header line {} ({}) is not `Name: value` ({e})", i + 1, shown(line)),
                    "Send each header as `Name: value` on a line of its own, the name a token, the value without control characters.".into(),
                );
            }
        }
        return (format!("the request head is malformed ({e})"), "Send a well-formed HTTP/1.1 request head.".into());
    }
    let values = |name: &str| {
        req.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
            .collect::<Vec<_>>()
    };
    let lengths = values("content-length");
    let codings = values("transfer-encoding");
    if !codings.is_empty() {
        let last = codings.last().and_then(|v| v.rsplit(',').next()).map(|c| c.trim().to_ascii_lowercase());
        if last.as_deref() != Some("chunked") {
            return (
                format!("Transfer-Encoding {:?} does not end in chunked, so the body's length cannot be known", codings.join(", ")),
                "Send the body with Content-Length, or with Transfer-Encoding: chunked alone.".into(),
            );
        }
        if req.version == Some(0) {
            return ("Transfer-Encoding is not allowed in an HTTP/1.0 request".into(), "Send the body with Content-Length, or send HTTP/1.1.".into());
        }
    }
    let mut distinct: Vec<&str> = lengths.iter().flat_map(|v| v.split(',')).map(str::trim).collect();
    distinct.dedup();
    if distinct.iter().any(|v| v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) || v.len() > 19) || distinct.len() > 1 {
        return (
            format!("Content-Length {:?} is not one length in bytes, so the body's length cannot be known", lengths.join(", ")),
            "Send one Content-Length with the body's length in bytes (digits only), or Transfer-Encoding: chunked.".into(),
        );
    }
    ("the request could not be read as HTTP/1.1".into(), "Send a well-formed HTTP/1.1 request (RFC 9112).".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_refusals_are_recognised_and_ferrys_answers_are_not() {
        let hyper = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Mon, 07 Dec 2026 18:00:00 GMT\r\n\r\n";
        assert_eq!(hyper_refusal(hyper), Some(431));
        assert_eq!(hyper_refusal(b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"), Some(400));
        assert_eq!(hyper_refusal(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: 0\r\n\r\n"), None);
        assert_eq!(hyper_refusal(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n"), None);
        assert_eq!(hyper_refusal(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"), None);
        assert_eq!(hyper_refusal(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nmore"), None);
    }

    fn detail(status: u16, head: &str) -> String {
        refusal_of(status, head.as_bytes()).detail.to_string()
    }

    #[test]
    fn each_cause_is_named() {
        let many: String = (0..150).map(|i| format!("X-{i}: v\r\n")).collect();
        assert!(detail(431, &format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n")).contains("151 header fields"));
        assert!(detail(431, &format!("GET / HTTP/1.1\r\nHost: a\r\n{many}")).contains("more than 100 header fields"));
        assert!(detail(431, "GET / HTTP/1.1\r\nX-Big: aaaa").contains("larger than"));
        assert!(detail(400, "GET / HTTP/9.9\r\nHost: a\r\n\r\n").contains("request line"), "{}", detail(400, "GET / HTTP/9.9\r\n\r\n"));
        assert!(detail(400, "GET / HTTP/1.1\r\nHost: a\r\nbad header\r\n\r\n").contains("header line 2"));
        assert!(detail(400, "PATCH / HTTP/1.1\r\nHost: a\r\nContent-Length: 12x\r\n\r\n").contains("Content-Length"));
        assert!(detail(400, "PATCH / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").contains("Content-Length"));
        assert!(detail(400, "PATCH / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n").contains("Transfer-Encoding"));
        assert!(detail(414, "GET /").contains("longer than"));
    }

    #[test]
    fn the_written_answer_is_problem_json_and_closes() {
        let bytes = refusal_bytes(431, b"GET / HTTP/1.1\r\n");
        let text = String::from_utf8(bytes).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{head}");
        assert!(head.contains("content-type: application/problem+json") && head.contains("connection: close"), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!((v["status"].as_u64(), v["code"].as_str()), (Some(431), Some("invalid_argument")));
    }
}
