//! The API's client connections: how many it holds at once, and how long
//! one may sit without sending a request. Each held connection is a file
//! descriptor and about 36 KiB over TLS (hyper's and rustls' buffers,
//! measured by `bench-connections`); a fleet of
//! agents, or one client that opens connections and never closes them,
//! must not use up the process's open files, which is what ended the
//! N = 100,000 benchmark's deploy.
//!
//! - At most `max_connections` are held. Past the cap the server stops
//!   accepting: new connections wait in the kernel's listen backlog (the
//!   process holds one of them, accepted and waiting for a slot) and are
//!   served as held ones close. (Refusing them would only turn each into a
//!   retry.)
//! - A connection with no request in flight that moves no byte for
//!   `idle_timeout_secs` is closed ([`IdleIo`], under TLS, whatever the
//!   HTTP version: an idle keep-alive, or a peer that went away, such as a
//!   machine powered off), and so is one that takes longer than that to
//!   send a request head (hyper's header timeout: a client sending its head
//!   a byte at a time). A request body (at most axum's 2 MB) must arrive
//!   whole within the same time from its first read ([`BodyDeadline`]): a
//!   client that stalls, or drips a byte now and then, is answered `400`
//!   and its slot freed. A request being answered (a long poll's 30 s) is
//!   not idle.
//! - An answer never promises a connection the server then closes: a body
//!   its handler left unread is read before the answer goes (at most
//!   [`UNREAD_BODY_MAX_BYTES`], within [`UNREAD_BODY_WAIT`]), or the answer
//!   says `Connection: close` ([`settle_bodies`]).
//! - HTTP/1.1 only (what every agent, `metalctl` and the generated clients
//!   speak): an HTTP/2 client could keep an idle connection's bytes moving
//!   with PING frames, and hold a slot for good without a request.

use axum::http::Request;
use serde::Deserialize;
use std::convert::Infallible;
use std::future::Future as _;
use std::net::SocketAddr;
use std::sync::atomic::{
    AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::PollSemaphore;
use tower_service::Service;

use crate::once_per_second::OncePerSecond;

/// The `[api.http]` settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// The most client connections held at once. 0 (the default) sizes it
    /// from the open-file limit: three quarters of it, after the soft limit
    /// is raised to the hard one (the rest is left for the database, the
    /// bus, logs and the other services of one process), and at most
    /// [`MAX_DERIVED_CAP`].
    #[serde(default)]
    pub max_connections: u32,
    /// A connection with no request in flight that moves no byte for this
    /// long (seconds) is closed, and so is one slower than that to send a
    /// request head.
    #[serde(default = "default_idle_timeout_secs")]
    pub idle_timeout_secs: u32,
}

fn default_idle_timeout_secs() -> u32 {
    // Longer than an agent's poll-to-poll gap, shorter than the 90 s
    // reqwest keeps an idle connection, and nginx's keepalive_timeout.
    75
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            max_connections: 0,
            idle_timeout_secs: default_idle_timeout_secs(),
        }
    }
}

/// The fewest connections a cap derived from the open-file limit allows.
const MIN_DERIVED_CAP: u64 = 64;

/// The most a cap derived from the open-file limit allows: about 1.8 GiB
/// of connection buffers at the 36 KiB each measured over TLS. A
/// container's hard limit is often 1,048,576; three quarters of it would
/// be no bound on memory.
pub const MAX_DERIVED_CAP: u64 = 50_000;

impl HttpConfig {
    /// Refuses settings that could not serve: an idle timeout of 0 or over
    /// an hour, a cap over ten million.
    pub fn check(&self) -> Result<(), String> {
        let idle = self.idle_timeout_secs;
        if !(1..=3600).contains(&idle) {
            return Err(format!("http.idle_timeout_secs must be 1-3600, not {idle}"));
        }
        let max = self.max_connections;
        if max > 10_000_000 {
            return Err(format!(
                "http.max_connections must be 0 (from the open-file limit) to 10000000, not {max}"
            ));
        }
        Ok(())
    }

    /// The cap on connections: the configured one, or three quarters of
    /// `open_files`, from [`MIN_DERIVED_CAP`] to [`MAX_DERIVED_CAP`] (an
    /// unknown limit counts as 1,024).
    pub fn cap(&self, open_files: Option<u64>) -> usize {
        if self.max_connections > 0 {
            return self.max_connections as usize;
        }
        let files = open_files.unwrap_or(1024);
        let cap = (files / 4 * 3).clamp(MIN_DERIVED_CAP, MAX_DERIVED_CAP);
        usize::try_from(cap).unwrap_or(usize::MAX)
    }

    /// The configuration with its cap resolved for a process whose own
    /// clients hold the other ends of the API's connections (`bcm` with
    /// the simulated site): a derived cap from half the open files, as
    /// each connection is two of them there. A configured cap stands.
    pub fn sharing_descriptors_with_clients(mut self) -> Self {
        if self.max_connections == 0 {
            let files = bcm_telemetry::open_files::raise_to_hard_limit().map(|f| f.soft / 2);
            self.max_connections = u32::try_from(self.cap(files)).unwrap_or(u32::MAX);
        }
        self
    }

    /// How long a connection may be idle, or take to send a head.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_secs(u64::from(self.idle_timeout_secs))
    }

    /// Serves HTTP/1.1 only, with the head timeout (the idle timeout
    /// itself is [`IdleAcceptor`]'s).
    pub fn tune(
        &self,
        builder: &mut hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>,
    ) {
        let fresh =
            hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
        *builder = std::mem::replace(builder, fresh).http1_only();
        builder
            .http1()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(self.idle_timeout());
    }
}

/// Makes one service per accepted connection, each holding one of `cap`
/// slots until the connection ends; with none free it is not ready, and
/// the server accepts nothing until one is.
pub struct Capped {
    app: axum::Router,
    slots: PollSemaphore,
    held: Option<Arc<Slot>>,
    waiting: bool,
    cap: usize,
    at_cap: OncePerSecond,
}

impl Capped {
    /// `app` behind a cap of `cap` connections.
    pub fn new(app: axum::Router, cap: usize) -> Self {
        let cap = cap.max(1);
        metrics::gauge!("bcm_api_http_connections_max").set(cap as f64);
        Self {
            app,
            slots: PollSemaphore::new(Arc::new(Semaphore::new(cap))),
            held: None,
            waiting: false,
            cap,
            at_cap: OncePerSecond::new(),
        }
    }
}

/// One connection's slot: freed (and the open count lowered) when the
/// connection's last handle drops.
struct Slot {
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        metrics::gauge!("bcm_api_http_connections").decrement(1.0);
    }
}

impl Service<SocketAddr> for Capped {
    type Response = Connection;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Connection, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.held.is_some() {
            return Poll::Ready(Ok(()));
        }
        match self.slots.poll_acquire(cx) {
            Poll::Pending => {
                // Counted once per connection that waits, not per wake-up.
                if !self.waiting {
                    self.waiting = true;
                    metrics::counter!("bcm_api_http_connections_at_cap_total").increment(1);
                    if let Some(unlogged) = self.at_cap.due(chrono::Utc::now().timestamp()) {
                        tracing::warn!(
                            cap = self.cap,
                            times_since_last_line = unlogged,
                            "the API holds its most connections (api.http.max_connections); new ones wait in the listen backlog until one closes"
                        );
                    }
                }
                Poll::Pending
            }
            Poll::Ready(permit) => {
                self.waiting = false;
                // The semaphore is never closed, so a permit always comes.
                if let Some(permit) = permit {
                    metrics::gauge!("bcm_api_http_connections").increment(1.0);
                    self.held = Some(Arc::new(Slot { _permit: permit }));
                }
                Poll::Ready(Ok(()))
            }
        }
    }

    fn call(&mut self, _peer: SocketAddr) -> Self::Future {
        if self.held.is_none() {
            // The server always asks `poll_ready` first; were it not to,
            // the connection is served, uncounted, rather than dropped.
            tracing::error!("a connection was made without a slot (call before poll_ready)");
        }
        std::future::ready(Ok(Connection {
            app: self.app.clone(),
            _slot: self.held.take(),
            activity: Arc::new(Activity::new()),
        }))
    }
}

/// The service of one connection: the router, the connection's slot, and
/// its activity (which [`IdleAcceptor`] shares with the connection's IO).
#[derive(Clone)]
pub struct Connection {
    app: axum::Router,
    _slot: Option<Arc<Slot>>,
    activity: Arc<Activity>,
}

impl<B> Service<Request<B>> for Connection
where
    axum::Router: Service<Request<B>, Response = axum::response::Response, Error = Infallible>,
    <axum::Router as Service<Request<B>>>::Future: Send + 'static,
{
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<axum::response::Response, Infallible>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<Request<B>>::poll_ready(&mut self.app, cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let answering = InFlight::begin(self.activity.clone());
        let answer = self.app.call(req);
        Box::pin(async move {
            let answer = answer.await;
            drop(answering);
            answer
        })
    }
}

/// What one connection is doing: requests being answered, and when it
/// last moved a byte (milliseconds since [`epoch`]).
#[derive(Debug, Default)]
pub struct Activity {
    in_flight: AtomicUsize,
    last_ms: AtomicU64,
}

/// The instant activity times count from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Activity {
    fn new() -> Self {
        let a = Self::default();
        a.touch();
        a
    }

    fn touch(&self) {
        let ms = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Release);
    }

    /// When the connection is idle long enough to close, if no request is
    /// in flight: `idle` after its last byte.
    fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        (self.in_flight.load(Acquire) == 0)
            .then(|| epoch() + Duration::from_millis(self.last_ms.load(Acquire)) + idle)
    }
}

/// A request in flight on a connection, until dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Relaxed);
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // The answer's time first: a reader that sees no request in flight
        // also sees when the last one ended.
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Release);
    }
}

/// Wraps each accepted TCP stream in an [`IdleIo`] sharing its
/// [`Connection`]'s activity.
#[derive(Debug, Clone, Copy)]
pub struct IdleAcceptor {
    idle: Duration,
}

impl IdleAcceptor {
    /// Connections idle for `idle` are closed.
    pub fn new(idle: Duration) -> Self {
        Self { idle }
    }
}

impl<I> axum_server::accept::Accept<I, Connection> for IdleAcceptor {
    type Stream = IdleIo<I>;
    type Service = Connection;
    type Future = std::future::Ready<std::io::Result<(IdleIo<I>, Connection)>>;

    fn accept(&self, stream: I, service: Connection) -> Self::Future {
        let io = IdleIo::new(stream, service.activity.clone(), self.idle);
        std::future::ready(Ok((io, service)))
    }
}

/// A connection's byte stream that records its activity and, once no
/// request is in flight and no byte has moved for the idle timeout, fails
/// its next read (`TimedOut`), which ends the connection.
pub struct IdleIo<I> {
    inner: I,
    activity: Arc<Activity>,
    idle: Duration,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// Closed for idleness (counted once).
    closed: bool,
}

impl<I> IdleIo<I> {
    fn new(inner: I, activity: Arc<Activity>, idle: Duration) -> Self {
        Self {
            inner,
            activity,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            closed: false,
        }
    }

    /// Ready with an error once the connection is idle past its timeout;
    /// otherwise the timer is set to wake the reader when it may be.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        loop {
            let now = tokio::time::Instant::now();
            let wake_at = match self.activity.idle_deadline(self.idle) {
                Some(deadline) => tokio::time::Instant::from_std(deadline),
                // A request in flight: look again in one timeout.
                None => now + self.idle,
            };
            if wake_at <= now {
                if !self.closed {
                    self.closed = true;
                    metrics::counter!("bcm_api_http_connections_idle_closed_total").increment(1);
                }
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "idle past api.http.idle_timeout_secs",
                )));
            }
            if self.timer.deadline() != wake_at {
                self.timer.as_mut().reset(wake_at);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for IdleIo<I> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(done) => {
                if buf.filled().len() > before {
                    this.activity.touch();
                }
                Poll::Ready(done)
            }
            Poll::Pending => match this.poll_idle(cx) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Pending,
            },
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for IdleIo<I> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let written = std::pin::Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        written
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let written = std::pin::Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A request body that must arrive whole within `within` of its first read
/// (the handler's, or [`settle_bodies`]'), whatever pace its bytes come at:
/// what a per-read timeout misses is a client that sends a byte just inside
/// each wait and so holds its connection's slot for as long as it likes.
/// Past the deadline every read fails (counted once), the handler answers
/// `400`, and the answer says `Connection: close` ([`settle_bodies`]: its
/// body was not read to the end).
pub(crate) struct BodyDeadline {
    body: axum::body::Body,
    within: Duration,
    /// Set at the first read.
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// The deadline passed (and was counted).
    expired: bool,
}

/// The most of a request body [`settle_bodies`] reads once the answer is
/// ready: a request refused unread (a missing credential, a bad path)
/// rarely carries more, and a larger one is cheaper to close than to read.
pub const UNREAD_BODY_MAX_BYTES: u64 = 64 * 1024;

/// How long [`settle_bodies`] waits for the rest of a body the handler left
/// unread: a client sends its body just after its head, so a body this
/// late is not coming soon.
pub const UNREAD_BODY_WAIT: Duration = Duration::from_secs(1);

/// Gives every request's body its [`BodyDeadline`] and, once the answer is
/// ready, settles a body the handler left unread, so the answer tells the
/// truth about its connection. hyper keeps a connection only if it can read
/// the rest of the body at once after the answer; otherwise it closes it,
/// after an answer that did not say so, and a client pooling connections
/// sends its next request into the closing one ("EOF occurred in violation
/// of protocol": the conformance run's intermittent "Network Error"). Here
/// the rest (at most [`UNREAD_BODY_MAX_BYTES`], within
/// [`UNREAD_BODY_WAIT`]) is read before the answer goes, and the connection
/// is kept; past either, the answer says `Connection: close`
/// (`bcm_api_http_unread_bodies_total{outcome}`).
pub async fn settle_bodies(
    within: Duration,
    req: Request<axum::body::Body>,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let shared = Arc::new(std::sync::Mutex::new(SharedBody::default()));
    // A client that asked to be told to go on waits for a `100 Continue`
    // before it sends its body; reading the body of a request already
    // refused would ask it for one.
    let expects_continue = req
        .headers()
        .get(axum::http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let req = req.map(|body| {
        let body = BodyDeadline {
            body,
            within,
            deadline: None,
            expired: false,
        };
        let mut s = lock(&shared);
        s.ended = http_body::Body::is_end_stream(&body);
        s.body = Some(body);
        axum::body::Body::new(HandlerBody(shared.clone()))
    });
    let mut answer = next.run(req).await;
    let unread = {
        let mut s = lock(&shared);
        if s.ended {
            None
        } else {
            s.taken = true;
            s.body.take()
        }
    };
    if let Some(body) = unread {
        let read = !expects_continue
            && read_to_end(body, UNREAD_BODY_MAX_BYTES, UNREAD_BODY_WAIT.min(within)).await;
        let outcome = if read { "read" } else { "closed" };
        metrics::counter!("bcm_api_http_unread_bodies_total", "outcome" => outcome).increment(1);
        if !read {
            answer.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
    }
    answer
}

/// A request's body, shared between the handler (reading it through
/// [`HandlerBody`]) and [`settle_bodies`] (reading what it left).
#[derive(Default)]
struct SharedBody {
    body: Option<BodyDeadline>,
    /// Read to its end (or empty from the start).
    ended: bool,
    /// Taken by [`settle_bodies`] once the answer was ready.
    taken: bool,
}

fn lock(shared: &std::sync::Mutex<SharedBody>) -> std::sync::MutexGuard<'_, SharedBody> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The handler's view of a [`SharedBody`]: ends when taken away.
struct HandlerBody(Arc<std::sync::Mutex<SharedBody>>);

impl http_body::Body for HandlerBody {
    type Data = bytes::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, axum::BoxError>>> {
        let mut s = lock(&self.0);
        let Some(body) = s.body.as_mut() else {
            // A read after the answer (nothing reads one today) sees an
            // error, never a truncated body that looks whole.
            return Poll::Ready(
                s.taken
                    .then(|| Err("the request body was read after its answer".into())),
            );
        };
        let frame = http_body::Body::poll_frame(std::pin::Pin::new(&mut *body), cx);
        let ended = match &frame {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => http_body::Body::is_end_stream(&*body),
            _ => false,
        };
        if ended {
            s.ended = true;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        let s = lock(&self.0);
        s.ended || s.body.as_ref().is_some_and(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        lock(&self.0)
            .body
            .as_ref()
            .map(http_body::Body::size_hint)
            .unwrap_or_else(|| http_body::SizeHint::with_exact(0))
    }
}

/// Reads `body` to its end if that is at most `max` bytes more and comes
/// within `wait`.
async fn read_to_end(mut body: BodyDeadline, max: u64, wait: Duration) -> bool {
    if http_body::Body::size_hint(&body).lower() > max {
        return false;
    }
    let read = async move {
        let mut read = 0u64;
        loop {
            let frame = std::future::poll_fn(|cx| {
                http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
            })
            .await;
            match frame {
                None => return true,
                Some(Err(_)) => return false,
                Some(Ok(frame)) => {
                    read += frame.data_ref().map_or(0, |d| d.len() as u64);
                    if read > max {
                        return false;
                    }
                }
            }
        }
    };
    tokio::time::timeout(wait, read).await.unwrap_or(false)
}

/// A request body not whole within its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive whole within {0:?}")]
pub struct BodyTooSlow(Duration);

impl http_body::Body for BodyDeadline {
    type Data = bytes::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, axum::BoxError>>> {
        let within = self.within;
        if self.expired {
            return Poll::Ready(Some(Err(Box::new(BodyTooSlow(within)))));
        }
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(within)));
        if deadline.as_mut().poll(cx).is_ready() {
            self.expired = true;
            metrics::counter!("bcm_api_http_body_too_slow_total").increment(1);
            return Poll::Ready(Some(Err(Box::new(BodyTooSlow(within)))));
        }
        std::pin::Pin::new(&mut self.body)
            .poll_frame(cx)
            .map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::{Activity, HttpConfig, IdleIo, InFlight};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn idle_io(idle: Duration) -> (tokio::io::DuplexStream, IdleIo<tokio::io::DuplexStream>) {
        let (client, server) = tokio::io::duplex(64);
        (client, IdleIo::new(server, Arc::new(Activity::new()), idle))
    }

    #[tokio::test]
    async fn a_connection_is_idle_only_with_no_request_in_flight_and_no_bytes() {
        let idle = Duration::from_millis(300);
        let (mut client, mut io) = idle_io(idle);
        let mut buf = [0u8; 8];
        // A request being answered (a long poll): three timeouts, open.
        let answering = InFlight::begin(io.activity.clone());
        assert!(
            tokio::time::timeout(idle * 3, io.read(&mut buf))
                .await
                .is_err(),
            "closed with a request in flight"
        );
        drop(answering);
        // Bytes keep it open too.
        for _ in 0..6 {
            tokio::time::sleep(idle / 3).await;
            client.write_all(b"x").await.expect("write");
            let n = tokio::time::timeout(idle, io.read(&mut buf))
                .await
                .expect("a byte arrived")
                .expect("read");
            assert_eq!(n, 1);
        }
        // Then nothing: closed after the timeout, not before.
        let quiet = Instant::now();
        let err = tokio::time::timeout(idle * 10, io.read(&mut buf))
            .await
            .expect("closed")
            .expect_err("an idle connection's read fails");
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(quiet.elapsed() >= idle * 2 / 3, "{:?}", quiet.elapsed());
    }

    #[test]
    fn the_cap_is_configured_or_three_quarters_of_the_open_files() {
        let derived = HttpConfig::default();
        assert_eq!(derived.cap(Some(20_000)), 15_000);
        assert_eq!(
            derived.cap(Some(1_048_576)),
            50_000,
            "a container's million: 50,000"
        );
        assert_eq!(derived.cap(Some(u64::MAX)), 50_000, "unbounded");
        assert_eq!(derived.cap(Some(16)), 64, "never below 64");
        assert_eq!(derived.cap(None), 768, "unknown: as if 1,024");
        let set = HttpConfig {
            max_connections: 500,
            ..HttpConfig::default()
        };
        assert_eq!(set.cap(Some(20_000)), 500);
    }

    #[test]
    fn settings_that_could_not_serve_are_refused_by_name() {
        assert!(HttpConfig::default().check().is_ok());
        for (max_connections, idle_timeout_secs, name) in [
            (0, 0, "http.idle_timeout_secs"),
            (0, 3601, "http.idle_timeout_secs"),
            (10_000_001, 75, "http.max_connections"),
        ] {
            let err = HttpConfig {
                max_connections,
                idle_timeout_secs,
            }
            .check()
            .expect_err("refused");
            assert!(err.contains(name), "{err}");
        }
    }
}
