//! A guest's Unix socket, `host-api.sock`, and the HTTP/1.1 server on it.
//!
//! The server does not know what it serves: it asks a [`Served`] for the run that answers
//! each request. A run's own socket serves that run for its life; a session's socket serves
//! whichever run is lent when the request arrives ([`crate::session`]); a server that finds
//! the run by a token in the request's head can implement the same trait.
//!
//! The socket has an unguessable name in the broker's socket directory, and a connection is
//! served only when its peer is one [`Peers`] admits: the guest, the broker's uid or root
//! (see [`crate::guest_sockets`]); any other is closed before a byte is read. The target is
//! the request URI exactly as sent; guest headers are never looked at beyond what HTTP
//! framing needs. On a session socket, a request from a process known not to be the lent
//! call's is refused ([`crate::peer_origin`]).
//!
//! Time limits on a connection: its request head must arrive within 5 s, and hyper starts that
//! clock whenever the connection waits for a head, so an idle keep-alive connection is closed
//! after 5 s too (stricter than the 15 s idle limit the spec quotes). A body must arrive within
//! 10 s (`run::BODY_READ_TIMEOUT`). An answer the guest stops reading fails the connection
//! after 30 s without progress ([`WRITE_STALL_TIMEOUT`]). The run's deadline bounds them all.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body as _;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};

use crate::control::server::ACCEPT_PAUSE;
use crate::guest_sockets::{GuestSockets, GuestSocketsError, Peers};
use crate::peer_origin::Peer;
use crate::run::{Reply, Run, message};

/// Connections served at once per socket.
pub const MAX_CONNECTIONS: usize = 32;
/// Time to send a request's headers.
pub const READ_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Most unread request bytes read after an early refusal; more and the connection closes.
const DRAIN_LIMIT: usize = 256 * 1024;
/// How long reading them may take.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an answer may make no progress because the guest does not read it.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may take to finish its answer once the run (or session) has ended.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Why a run socket could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RunSocketError {
    /// Binding or setting its mode failed.
    #[error("run socket {path}: {source}")]
    Create {
        /// What was being created.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A bound guest socket. Dropping it removes the socket.
pub struct RunSocket {
    path: PathBuf,
    removed: bool,
}

// === impl RunSocket ===

impl RunSocket {
    /// Binds a socket with a fresh unguessable name in `sockets`' directory (serve it with
    /// [`RunSocket::serve`]).
    pub fn bind(sockets: &GuestSockets) -> Result<(Self, UnixListener), RunSocketError> {
        let (path, listener) = sockets.bind().map_err(|e| match e {
            GuestSocketsError::Create { path, source } => RunSocketError::Create { path, source },
        })?;
        Ok((
            Self {
                path,
                removed: false,
            },
            listener,
        ))
    }

    /// The socket's absolute path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket now (the broker's sweep of its directory retries a failure).
    pub fn remove(&mut self) {
        if std::mem::replace(&mut self.removed, true) {
            return;
        }
        if let Err(error) = std::fs::remove_file(&self.path) {
            tracing::warn!(socket = %self.path.display(), %error, "guest socket not removed");
        }
    }

    /// Serves `served` on `listener` to the peers `peers` admits, until it is closed.
    pub async fn serve<S: Served>(listener: UnixListener, served: S, peers: Peers) {
        serve_socket(listener, served, peers).await;
    }
}

/// What a socket serves: the run that answers each request, and when serving ends.
pub trait Served: Clone + Send + Sync + 'static {
    /// The run that answers a request with this head, arriving now; `None` answers 503
    /// `host api grant has ended` and is counted nowhere. Resolved per request, so a
    /// keep-alive connection follows whatever the socket serves at the time.
    fn run_for(&self, request: &Parts) -> Option<Arc<Run>>;

    /// Whether `peer` is refused `run` (which [`Served::run_for`] just named) because it is
    /// known not to be the code of the call the run is lent to ([`crate::peer_origin`]).
    /// A run's own socket serves only its run's guest: never.
    fn outside_call(&self, _run: &Arc<Run>, _peer: &Peer) -> bool {
        false
    }

    /// Resolves once the socket stops serving: the listener closes and every connection is
    /// told to finish.
    fn closed(&self) -> impl Future<Output = ()> + Send;
}

/// A run's own socket: that run, until it ends.
impl Served for Arc<Run> {
    fn run_for(&self, _request: &Parts) -> Option<Arc<Run>> {
        Some(self.clone())
    }

    fn closed(&self) -> impl Future<Output = ()> + Send {
        self.wait_ended()
    }
}

async fn serve_socket<S: Served>(listener: UnixListener, served: S, peers: Peers) {
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = served.closed() => break,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(ACCEPT_PAUSE).await;
            continue;
        };
        // Another local user's connection is closed unanswered (issue 12, part 5).
        if !peers.check(&stream) {
            continue;
        }
        // Over the cap the connection is closed at once: shed, never queue.
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let peer = Peer::of(&stream, peers.guest_uid);
        let served = served.clone();
        tokio::spawn(async move {
            let stream = WriteDeadline::new(stream, WRITE_STALL_TIMEOUT);
            serve_connection(TokioIo::new(stream), served, peer).await;
            drop(permit);
        });
    }
}

impl Drop for RunSocket {
    fn drop(&mut self) {
        self.remove();
    }
}

async fn serve_connection<S: Served>(
    io: TokioIo<WriteDeadline<tokio::net::UnixStream>>,
    served: S,
    peer: Peer,
) {
    let service_served = served.clone();
    let peer = Arc::new(peer);
    let service = service_fn(move |request: Request<Incoming>| {
        let served = service_served.clone();
        let peer = peer.clone();
        async move { Ok::<_, std::convert::Infallible>(answer(&served, &peer, request).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(READ_HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        () = served.closed() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
        }
    }
}

async fn answer<S: Served>(
    served: &S,
    peer: &Peer,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let (parts, mut body) = request.into_parts();
    // A session socket with nothing lent: no run to count the call against.
    let Some(run) = served.run_for(&parts) else {
        return to_response(Reply::broker(503, message::ENDED));
    };
    let uri = &parts.uri;
    // A process kept from earlier calls, woken while the grant is lent (issue 12, part 4):
    // refused, and counted on the run's audit line.
    let reply = if served.outside_call(&run, peer) {
        run.note_outside_call();
        Reply::broker(503, message::OUTSIDE_CALL)
    } else {
        // An absolute URI or authority form names no route: the run refuses it like any
        // target outside the grant, and counts it (grants.md §2.2 step 3).
        let target = uri.to_string();
        run.call(parts.method.as_str(), &target, &mut body).await
    };
    drain(&mut body).await;
    to_response(reply)
}

/// Reads what is left of a request body a refusal answered without reading (bounded by
/// [`DRAIN_LIMIT`] and [`DRAIN_TIMEOUT`]). A connection closed with the guest's body still
/// unread can reset before the guest reads the answer, or fail the guest's own write of the
/// body; drained, the guest reliably gets the refusal and the connection stays usable.
async fn drain(body: &mut Incoming) {
    if body.is_end_stream() {
        return;
    }
    let rest = Limited::new(body, DRAIN_LIMIT).collect();
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, rest).await;
}

/// A stream whose writes fail with `TimedOut` once they have made no progress for `limit`: a
/// guest that never reads its answer cannot hold a connection (and its buffers) open.
pub(crate) struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// Armed while a write or flush is pending; reset whenever one makes progress.
    stall: Option<Pin<Box<Sleep>>>,
}

// === impl WriteDeadline ===

impl<S> WriteDeadline<S> {
    pub(crate) fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            stall: None,
        }
    }

    /// Maps a pending write to an error once the stall outlasts the limit.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        let limit = self.limit;
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + limit)));
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the guest stopped reading its answer",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.pending(cx),
            ready => {
                self.stall = None;
                ready
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.pending(cx),
            ready => {
                self.stall = None;
                ready
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        ready!(Pin::new(&mut self.inner).poll_shutdown(cx))?;
        Poll::Ready(Ok(()))
    }
}

fn to_response(reply: Reply) -> Response<Full<Bytes>> {
    Response::builder()
        .status(reply.status)
        .header(CONTENT_TYPE, reply.content_type)
        .body(Full::new(reply.body))
        .unwrap_or_else(|_| {
            let fallback = Reply::broker(502, message::UNAVAILABLE);
            let mut response = Response::new(Full::new(fallback.body));
            *response.status_mut() = http::StatusCode::BAD_GATEWAY;
            response
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_write_the_peer_never_reads_fails_after_the_limit() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut stream = WriteDeadline::new(near, Duration::from_secs(30));
        let started = Instant::now();
        // The duplex buffer takes 64 bytes; the rest waits for a reader that never comes.
        let error = stream.write_all(&[7; 4096]).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        let mut first = [0; 64];
        far.read_exact(&mut first).await.unwrap();
        assert_eq!(first, [7; 64]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_reading_is_never_cut() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut stream = WriteDeadline::new(near, Duration::from_secs(30));
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut chunk = [0; 64];
            while got.len() < 4096 {
                // Each read comes 20 s after the last: slow, but never 30 s without progress.
                tokio::time::sleep(Duration::from_secs(20)).await;
                let n = far.read(&mut chunk).await.unwrap();
                got.extend_from_slice(&chunk[..n]);
            }
            got
        });
        stream.write_all(&[9; 4096]).await.unwrap();
        stream.flush().await.unwrap();
        assert_eq!(reader.await.unwrap(), vec![9; 4096]);
    }
}
