//! Serving HTTP connections: accept, a cap per address, hyper's own timers, an idle bound, a
//! deadline on request bodies and a shutdown that does not wait for slow peers.
//!
//! `axum::serve` runs hyper without a timer and keeps a connection for as long as its peer
//! likes: an idle keep-alive connection, a request head or body dripped a byte a second, an
//! h2c connection after its preface all held a descriptor forever, and shutdown waited for them
//! (one client holding a body kept the process from exiting). [`serve`] is the accept loop
//! every listener runs instead:
//!
//! - each accepted socket first asks [`Admission::try_connect`]: beyond `max_connections_per_ip`
//!   it is answered `429` with one non-blocking write and closed at once. The permit travels
//!   with the socket ([`CountedStream`]), so an upgraded WebSocket session keeps its place;
//! - hyper's HTTP/1 header-read timer (`header_timeout_secs`) bounds every request head,
//!   including the wait for the next one on a keep-alive connection; HTTP/2 keep-alive pings
//!   (`ping_interval_secs`) find dead h2c peers;
//! - a watchdog per connection closes it (gracefully: hyper's `graceful_shutdown`, a GOAWAY on
//!   HTTP/2) once it has had no request in flight for `http_idle_timeout_secs`, or no request
//!   at all within `header_timeout_secs` of the accept (the bytes before hyper knows the
//!   protocol, a bare HTTP/2 preface). hyper has no idle bound for HTTP/2, and an HTTP/2 peer
//!   that answers pings is never idle to it;
//! - [`body_deadline`] fails a request body not complete within `body_timeout_secs` and answers
//!   `408`;
//! - when `stop` turns, connections stop taking requests and get `shutdown_grace_secs` (and
//!   [`CLOSE_MARGIN`]) to finish the ones in flight; then they are dropped.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt as _;

use crate::admission::{Admission, ConnectionPermit};
use crate::config::LimitsConfig;

/// After a connection was asked to close (idle, or shutdown past its grace), how long it may
/// take to finish before it is dropped: a peer that ignores the GOAWAY, a response still
/// being written.
pub(crate) const CLOSE_MARGIN: Duration = Duration::from_secs(1);

/// How long the accept loop waits after an `accept` failure that is not the peer's (most
/// likely out of descriptors) before trying again, rather than spin.
const ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// The bounds one listener's connections run under, from `[limits]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    /// Each HTTP/1 request head, and a connection's first request of any protocol.
    header_timeout: Option<Duration>,
    /// No request in flight.
    idle_timeout: Option<Duration>,
    /// HTTP/2 keep-alive pings (and how long to wait for their answer).
    ping_interval: Option<Duration>,
    /// From shutdown to dropping a connection still open.
    shutdown_wait: Duration,
}

impl ConnectionLimits {
    pub(crate) fn from_config(limits: &LimitsConfig) -> Self {
        Self {
            header_timeout: limits.header_timeout(),
            idle_timeout: limits.http_idle_timeout(),
            ping_interval: limits.ping_interval(),
            shutdown_wait: limits.shutdown_grace() + CLOSE_MARGIN,
        }
    }

    /// hyper's connection builder with these timers (HTTP/1.1 and h2c, as `axum::serve`).
    fn builder(&self) -> Builder<TokioExecutor> {
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout);
        let mut h2 = builder.http2();
        // WebSockets over HTTP/2 (RFC 8441), as `axum::serve` offers them.
        h2.timer(TokioTimer::new()).enable_connect_protocol();
        if let Some(every) = self.ping_interval {
            h2.keep_alive_interval(every).keep_alive_timeout(every);
        }
        builder
    }
}

/// Serves `routes` on `listener` until `stop` turns true (or its sender goes), then lets the
/// open connections finish within the shutdown wait and returns once all are gone.
pub(crate) async fn serve(
    listener: TcpListener,
    routes: Router,
    admission: Admission,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
) {
    let builder = limits.builder();
    // Each connection task holds a receiver; `closed` completes when the last one is gone.
    let (open_tx, open_rx) = watch::channel(());
    loop {
        let (stream, peer) = tokio::select! {
            accepted = accept(&listener) => accepted,
            _ = stop.wait_for(|s| *s) => break,
        };
        let permit = match admission.try_connect(peer.ip()) {
            Ok(p) => p,
            Err(refusal) => {
                tracing::debug!(%peer, ?refusal, "connection refused");
                // Best effort, never waiting: the socket is closed right after.
                let _ = stream.try_write(refusal.response());
                continue;
            }
        };
        let io = CountedStream {
            inner: stream,
            _permit: permit,
        };
        let connection = Connection {
            builder: builder.clone(),
            routes: routes.clone(),
            peer,
            limits,
            stop: stop.clone(),
            _open: open_rx.clone(),
        };
        tokio::spawn(connection.run(io));
    }
    drop(listener);
    drop(open_rx);
    open_tx.closed().await;
}

/// The next connection; errors that are one peer's are skipped, others waited out.
async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(e) if is_connection_error(&e) => {}
            Err(e) => {
                tracing::error!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// One accepted connection and what its task needs.
struct Connection {
    builder: Builder<TokioExecutor>,
    routes: Router,
    peer: SocketAddr,
    limits: ConnectionLimits,
    stop: watch::Receiver<bool>,
    /// Dropped when the task ends (see [`serve`]).
    _open: watch::Receiver<()>,
}

impl Connection {
    /// Serves the connection until it ends, is closed for being idle, or shutdown drops it.
    async fn run(mut self, io: CountedStream) {
        let activity = Arc::new(Activity::new());
        let service = ConnectionService {
            routes: self.routes.clone(),
            peer: self.peer,
            activity: Arc::clone(&activity),
        };
        let conn = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), service);
        tokio::pin!(conn);
        // Set once the connection was asked to close: when it is dropped if still open.
        let mut drop_at: Option<Instant> = None;
        let mut stopping = false;
        loop {
            let idle_check = if drop_at.is_none() {
                activity.next_check(&self.limits)
            } else {
                None
            };
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(peer = %self.peer, error = %e, "connection ended");
                    }
                    return;
                }
                _ = self.stop.wait_for(|s| *s), if !stopping => {
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                    let at = Instant::now() + self.limits.shutdown_wait;
                    drop_at = Some(drop_at.map_or(at, |d| d.min(at)));
                }
                () = activity.turned_idle.notified() => {}
                () = sleep_until(idle_check), if idle_check.is_some() => {
                    if activity.idle_past(&self.limits) {
                        tracing::debug!(peer = %self.peer, "closing an idle connection");
                        conn.as_mut().graceful_shutdown();
                        drop_at = Some(Instant::now() + CLOSE_MARGIN);
                    }
                }
                () = sleep_until(drop_at), if drop_at.is_some() => {
                    tracing::debug!(peer = %self.peer, "dropping a connection that did not close");
                    return;
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// What a connection's watchdog needs: its requests in flight and since when it has had none.
#[derive(Debug)]
struct Activity {
    born: Instant,
    in_flight: AtomicUsize,
    /// Whether a request ever arrived (before that, the header timeout applies).
    served: AtomicBool,
    /// Milliseconds after `born` when the last request in flight ended.
    idle_since_ms: AtomicU64,
    /// An HTTP/2 stream was upgraded (a WebSocket over extended CONNECT): it lives on after its
    /// response, invisible here, and has its own session timeouts, so the connection is never
    /// idle.
    tunnel: AtomicBool,
    /// Signalled when the last request in flight ends, so the watchdog sets its deadline
    /// (a permit is kept if it is not waiting at that moment).
    turned_idle: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            born: Instant::now(),
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            tunnel: AtomicBool::new(false),
            turned_idle: Notify::new(),
        }
    }

    /// The bound that applies now: the header timeout until a first request arrived, then the
    /// idle timeout.
    fn timeout(&self, limits: &ConnectionLimits) -> Option<Duration> {
        if self.served.load(Ordering::Acquire) {
            limits.idle_timeout
        } else {
            limits.header_timeout.or(limits.idle_timeout)
        }
    }

    /// When the connection will have been idle too long if nothing happens; `None` while a
    /// request is in flight (its end wakes the watchdog through `turned_idle`).
    fn next_check(&self, limits: &ConnectionLimits) -> Option<Instant> {
        if self.tunnel.load(Ordering::Acquire) || self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let timeout = self.timeout(limits)?;
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        Some(self.born + since + timeout)
    }

    /// No request in flight, and none for longer than the timeout.
    fn idle_past(&self, limits: &ConnectionLimits) -> bool {
        if self.tunnel.load(Ordering::Acquire) || self.in_flight.load(Ordering::Acquire) > 0 {
            return false;
        }
        let Some(timeout) = self.timeout(limits) else {
            return false;
        };
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        Instant::now() >= self.born + since + timeout
    }
}

/// One request in flight, from its head until its response body is done.
#[derive(Debug)]
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: &Arc<Activity>) -> Self {
        activity.served.store(true, Ordering::Release);
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        let ms = u64::try_from(a.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        // Stored before the count drops, so a watchdog that sees zero sees this time.
        a.idle_since_ms.fetch_max(ms, Ordering::AcqRel);
        if a.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            a.turned_idle.notify_one();
        }
    }
}

/// The router as hyper's service for one connection: the peer address for `ConnectInfo`, and
/// each request counted in flight until its response body is done.
#[derive(Clone)]
struct ConnectionService {
    routes: Router,
    peer: SocketAddr,
    activity: Arc<Activity>,
}

impl hyper::service::Service<axum::http::Request<Incoming>> for ConnectionService {
    type Response = Response<CountedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: axum::http::Request<Incoming>) -> Self::Future {
        let in_flight = InFlight::start(&self.activity);
        let tunnel = req.method() == Method::CONNECT;
        let mut req = req.map(Body::new);
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let routes = self.routes.clone();
        Box::pin(async move {
            let response = routes.oneshot(req).await?;
            if tunnel && response.status().is_success() {
                in_flight.0.tunnel.store(true, Ordering::Release);
            }
            Ok(response.map(|body| CountedBody {
                inner: body,
                _in_flight: in_flight,
            }))
        })
    }
}

/// A response body that keeps its request counted in flight until hyper has sent (or dropped)
/// it.
struct CountedBody {
    inner: Body,
    _in_flight: InFlight,
}

impl HttpBody for CountedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A TCP stream that holds its address's connection permit for as long as it is open (through
/// an upgrade too: the upgraded session owns the stream).
#[derive(Debug)]
struct CountedStream {
    inner: TcpStream,
    _permit: ConnectionPermit,
}

impl AsyncRead for CountedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Middleware: a request body must be complete within `timeout` of its head, or reading it
/// fails and the request is answered `408` (whatever the handler made of the failure). A
/// request without a body passes untouched.
pub(crate) async fn body_deadline(
    State(timeout): State<Duration>,
    req: Request,
    next: Next,
) -> Response {
    if req.body().is_end_stream() {
        return next.run(req).await;
    }
    let late = Arc::new(AtomicBool::new(false));
    let deadline = tokio::time::sleep(timeout);
    let req = req.map(|inner| {
        Body::new(DeadlineBody {
            inner,
            deadline: Box::pin(deadline),
            late: Arc::clone(&late),
        })
    });
    let response = next.run(req).await;
    if late.load(Ordering::Acquire) {
        return (
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                timeout.as_secs()
            ),
        )
            .into_response();
    }
    response
}

/// Why a request body read failed: its deadline passed.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time (the client is too slow)")]
struct BodyTimedOut;

/// A request body that fails once its deadline passes before its end.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    late: Arc<AtomicBool>,
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.late.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut))));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(header: u64, idle: u64) -> ConnectionLimits {
        ConnectionLimits::from_config(&LimitsConfig {
            header_timeout_secs: header,
            http_idle_timeout_secs: idle,
            ..LimitsConfig::default()
        })
    }

    #[test]
    fn the_header_timeout_bounds_the_wait_for_a_first_request_then_the_idle_timeout() {
        let a = Arc::new(Activity::new());
        let l = limits(10, 60);
        assert_eq!(a.timeout(&l), Some(Duration::from_secs(10)));
        let request = InFlight::start(&a);
        assert!(!a.idle_past(&l), "a request is in flight");
        assert_eq!(a.next_check(&l), None);
        drop(request);
        assert!(a.next_check(&l).is_some());
        assert_eq!(a.timeout(&l), Some(Duration::from_secs(60)));
        // Without a header timeout the idle timeout applies from the start; with neither, none.
        let fresh = Activity::new();
        assert_eq!(fresh.timeout(&limits(0, 60)), Some(Duration::from_secs(60)));
        assert_eq!(fresh.timeout(&limits(0, 0)), None);
        assert_eq!(fresh.next_check(&limits(0, 0)), None);
    }

    #[test]
    fn an_upgraded_http2_stream_keeps_the_connection_from_idling() {
        let a = Arc::new(Activity::new());
        let l = limits(0, 1);
        drop(InFlight::start(&a));
        assert!(a.next_check(&l).is_some());
        a.tunnel.store(true, Ordering::Release);
        assert_eq!(a.next_check(&l), None);
        assert!(!a.idle_past(&l));
    }
}
