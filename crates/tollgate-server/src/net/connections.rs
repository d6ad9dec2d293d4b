//! The connections of both listeners, bounded, so that no client can stall the service by
//! opening connections and sending nothing, or a byte at a time:
//!
//! - at most `max_connections` are open at once (both listeners together, below the
//!   process's descriptor limit, which [`raise_descriptor_limit`] lifts to its hard limit);
//!   when the cap is reached, a new connection takes the place of the open one that has no
//!   request in flight and whose last request is oldest (one that sent nothing, or no complete
//!   request, goes first), so clients that send requests are always answered;
//! - a connection that has no request in flight and reads or writes nothing for
//!   `idle_timeout` is closed, and so is an HTTP/1 connection whose request head, once begun,
//!   is not whole within `header_timeout` (one that sends a byte at a time).
//!
//! A connection is admitted by [`Registry::admit`] and wrapped in [`Watched`], its IO, which
//! enforces both timeouts with one timer per connection (re-armed only when it fires, never
//! per request) and ends the connection when it is evicted; requests mark their
//! start and end on it ([`Tracked::begin`]), over HTTP by the connection's service and over
//! gRPC by [`GuardsLayer`](crate::grpc::GuardsLayer).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::framing::Framing;
pub use crate::config::Limits;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

/// Descriptors kept for what is not a client connection: Redis, rule files, logs.
const RESERVED_DESCRIPTORS: u64 = 128;

/// Raises the process's soft limit of open descriptors to its hard limit; returns the limit
/// now in force (`None` where it cannot be read).
pub fn raise_descriptor_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => Some(limit),
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the limit of open descriptors");
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .ok()
                .map(|(soft, _)| soft)
        }
    }
}

impl Limits {
    /// These limits with `max_connections` below the descriptor limit `descriptors`.
    pub fn within(mut self, descriptors: Option<u64>) -> Self {
        if let Some(descriptors) = descriptors {
            let room = descriptors.saturating_sub(RESERVED_DESCRIPTORS).max(16);
            self.max_connections = self.max_connections.min(room as usize);
        }
        self
    }
}

/// The open connections; see the module documentation. Shared by both listeners.
#[derive(Debug)]
pub struct Registry {
    limits: Limits,
    epoch: Instant,
    open: Mutex<HashMap<u64, Arc<Tracked>>>,
    next: AtomicU64,
    evicted: AtomicU64,
}

/// One open connection as the registry sees it.
#[derive(Debug)]
pub struct Tracked {
    id: u64,
    /// Requests begun on it.
    requests: AtomicU64,
    /// The index of its first request framed two ways (`u64::MAX`: none), see [`Framing`].
    ambiguous: AtomicU64,
    /// When its last request began (µs since the registry's epoch; its opening at first).
    last_request: AtomicU64,
    in_flight: AtomicUsize,
    evicted: AtomicBool,
    /// Woken when the connection is evicted, to end it.
    waker: Mutex<Option<Waker>>,
    epoch: Instant,
}

impl Tracked {
    /// Marks a request's start; the request ends when the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        let index = self.requests.fetch_add(1, Ordering::AcqRel);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let now = self.epoch.elapsed().as_micros() as u64;
        self.last_request.fetch_max(now, Ordering::Relaxed);
        InFlight {
            tracked: self.clone(),
            ambiguous: self.ambiguous.load(Ordering::Acquire) == index,
        }
    }

    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        if let Some(waker) = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            waker.wake();
        }
    }
}

/// A request in flight on a connection (see [`Tracked::begin`]).
#[derive(Debug)]
pub struct InFlight {
    tracked: Arc<Tracked>,
    ambiguous: bool,
}

impl InFlight {
    /// Whether the request's head had both `Content-Length` and `Transfer-Encoding` (HTTP/1).
    pub fn ambiguous(&self) -> bool {
        self.ambiguous
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.tracked.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's place in the registry, given back when dropped.
#[derive(Debug)]
pub struct Admitted {
    tracked: Arc<Tracked>,
    registry: Arc<Registry>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.registry
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.tracked.id);
    }
}

impl Registry {
    /// A registry under `limits`.
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            epoch: Instant::now(),
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        })
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Connections closed so far to make room for new ones.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Admits a new connection: at the cap, in the place of the open one with no request in
    /// flight whose last request is oldest; `None` when every open connection has a request
    /// in flight (the new one is then closed at once).
    pub fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.len() >= self.limits.max_connections {
            let oldest = open
                .values()
                .filter(|t| t.in_flight.load(Ordering::Acquire) == 0)
                .filter(|t| !t.evicted.load(Ordering::Acquire))
                .min_by_key(|t| t.last_request.load(Ordering::Relaxed))
                .cloned();
            let oldest = oldest?;
            oldest.evict();
            open.remove(&oldest.id);
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let tracked = Arc::new(Tracked {
            id,
            requests: AtomicU64::new(0),
            ambiguous: AtomicU64::new(u64::MAX),
            last_request: AtomicU64::new(self.epoch.elapsed().as_micros() as u64),
            in_flight: AtomicUsize::new(0),
            evicted: AtomicBool::new(false),
            waker: Mutex::new(None),
            epoch: self.epoch,
        });
        open.insert(id, tracked.clone());
        Some(Admitted {
            tracked,
            registry: self.clone(),
        })
    }

    /// Accepts the next connection of `listener` that the registry admits, with Nagle's
    /// algorithm off (an answer written while the one before is not yet acknowledged would
    /// otherwise wait for that acknowledgement, up to 40 ms). Errors of `accept` (no
    /// descriptor left, a connection reset before it was accepted) are logged, and accepting
    /// goes on after a pause.
    ///
    /// With `http1`, the requests' heads are followed to find those framed two ways (see
    /// `Framing`).
    pub async fn accept(
        self: &Arc<Self>,
        listener: &TcpListener,
        http1: bool,
    ) -> Watched<TcpStream> {
        let (tcp, peer, admitted) = self.accept_admitted(listener).await;
        self.watched(tcp, peer, admitted, http1)
    }

    /// Accepts the next connection of `listener` that the registry admits, as
    /// [`accept`](Self::accept) does, not yet watched: for a TLS handshake first, whose
    /// stream is then watched.
    pub async fn accept_admitted(
        self: &Arc<Self>,
        listener: &TcpListener,
    ) -> (TcpStream, SocketAddr, Admitted) {
        loop {
            match listener.accept().await {
                Ok((tcp, peer)) => {
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!(error = %e, "cannot turn Nagle's algorithm off");
                    }
                    match self.admit() {
                        Some(admitted) => return (tcp, peer, admitted),
                        None => {
                            tracing::debug!(%peer, "every connection has a request in flight: refused");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// `tcp`, from `peer`, admitted and watched (its HTTP/1 heads followed with `http1`);
    /// `None` when it cannot be admitted.
    pub fn watch(
        self: &Arc<Self>,
        tcp: TcpStream,
        peer: SocketAddr,
        http1: bool,
    ) -> Option<Watched<TcpStream>> {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot turn Nagle's algorithm off");
        }
        let Some(admitted) = self.admit() else {
            tracing::debug!(%peer, "every connection has a request in flight: refused");
            return None;
        };
        Some(self.watched(tcp, peer, admitted, http1))
    }

    /// `io`, from `peer`, in the place `admitted` holds, watched from now (its HTTP/1 heads
    /// followed with `http1`).
    pub fn watched<IO>(
        self: &Arc<Self>,
        io: IO,
        peer: SocketAddr,
        admitted: Admitted,
        http1: bool,
    ) -> Watched<IO> {
        let limits = self.limits;
        let now = tokio::time::Instant::now();
        Watched {
            io,
            peer,
            timer: Box::pin(tokio::time::sleep(
                limits.idle_timeout.min(limits.header_timeout),
            )),
            limits,
            last_active: now,
            head_started: None,
            admitted,
            framing: http1.then(Framing::default),
        }
    }
}

/// A connection's IO, watched: reading fails once the connection was idle for too long or was
/// evicted, which ends it.
#[derive(Debug)]
pub struct Watched<IO> {
    io: IO,
    peer: SocketAddr,
    /// Fires at the earliest a timeout can have run out; re-armed from `last_active` and
    /// `head_started` then, rather than on every read and write.
    timer: Pin<Box<Sleep>>,
    limits: Limits,
    last_active: tokio::time::Instant,
    /// When the HTTP/1 request head being read began.
    head_started: Option<tokio::time::Instant>,
    admitted: Admitted,
    framing: Option<Framing>,
}

impl<IO> Watched<IO> {
    /// The IO watched.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// The connection as the registry tracks it.
    pub fn tracked(&self) -> &Arc<Tracked> {
        &self.admitted.tracked
    }

    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn active(&mut self) {
        self.last_active = tokio::time::Instant::now();
    }

    /// Why the connection is to be closed now, if a timeout ran out; else `cx` is woken when
    /// one may. `idle` says whether no request is in flight.
    fn timed_out(&mut self, cx: &mut Context<'_>, idle: bool) -> Option<&'static str> {
        while self.timer.as_mut().poll(cx).is_ready() {
            let now = tokio::time::Instant::now();
            let head = self.head_started.map(|at| at + self.limits.header_timeout);
            if head.is_some_and(|deadline| deadline <= now) {
                return Some("a request head did not arrive whole in time");
            }
            let quiet = self.last_active + self.limits.idle_timeout;
            if idle && quiet <= now {
                return Some("idle for too long");
            }
            let next = match head {
                Some(head) => head.min(quiet),
                None => quiet,
            };
            // While a request is in flight, look again an idle timeout later.
            let next = if next <= now {
                now + self.limits.idle_timeout
            } else {
                next
            };
            self.timer.as_mut().reset(next);
        }
        None
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.active();
                    if let Some(framing) = &mut this.framing {
                        framing.feed(&buf.filled()[before..]);
                        this.head_started = match (framing.in_head(), this.head_started) {
                            (true, None) => Some(this.last_active),
                            (true, started) => started,
                            (false, _) => None,
                        };
                        if let Some(index) = framing.ambiguous() {
                            let tracked = &this.admitted.tracked;
                            tracked.ambiguous.store(index, Ordering::Release);
                        }
                        if framing.ambiguous().is_some() || framing.off() {
                            this.framing = None;
                        }
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let tracked = &this.admitted.tracked;
                {
                    let mut waker = tracked.waker.lock().unwrap_or_else(|e| e.into_inner());
                    if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        *waker = Some(cx.waker().clone());
                    }
                }
                if tracked.evicted.load(Ordering::Acquire) {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "closed to make room for a new connection",
                    )));
                }
                let idle = tracked.in_flight.load(Ordering::Acquire) == 0;
                if let Some(why) = this.timed_out(cx, idle) {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)));
                }
                Poll::Pending
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.active();
        }
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.active();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// What a gRPC request learns of its connection.
#[derive(Debug, Clone)]
pub struct ConnectInfo {
    /// The client's address.
    pub peer: SocketAddr,
    /// The connection as the registry tracks it.
    pub tracked: Arc<Tracked>,
}

impl tonic::transport::server::Connected for Watched<TcpStream> {
    type ConnectInfo = ConnectInfo;

    fn connect_info(&self) -> ConnectInfo {
        ConnectInfo {
            peer: self.peer,
            tracked: self.admitted.tracked.clone(),
        }
    }
}

/// The admitted connections of a listener as a stream, for tonic's `serve_with_incoming`:
/// accepted by a task of their own, which ends when the stream is dropped.
pub fn incoming(
    registry: Arc<Registry>,
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = io::Result<Watched<TcpStream>>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let watched = registry.accept(&listener, false).await;
            if tx.send(Ok(watched)).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
