//! The accept loop: a slot per connection from the listener's
//! [`Connections`] table (refused at once when there is none), one task per
//! connection serving HTTP/1.1 and prior-knowledge h2c (or h2 over TLS)
//! through [`connection::serve`], with HTTP/2 frames metered
//! ([`Metered`]), graceful shutdown, and a short linger after a connection
//! ends so a client still sending an unread body reads our answer instead of
//! a reset.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower::Service;

use super::HttpResponse;
use super::connection::{self, Ended};
use super::connections::{Activity, Admission, Connections, Slot};
use super::frame_meter::Metered;
use super::socket::{SharedSocket, linger};

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `service` on `listener` until `shutdown` resolves, then lets open
/// connections finish within `drain`. At most `max_connections` are open at
/// once; past that a newcomer takes the slot of a connection that has
/// proven nothing or is idle, and when there is none it is closed at once
/// (never left waiting in the kernel's backlog, where it would only time
/// out later).
pub async fn serve<S>(
    listener: TcpListener,
    service: S,
    tls: Option<TlsAcceptor>,
    max_connections: usize,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) where
    S: Service<Request<Incoming>, Response = HttpResponse, Error = Infallible, Future: Send>
        + Clone
        + Send
        + Sync
        + 'static,
{
    let builder = connection::builder();
    let table = Connections::new(max_connections);
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut pressure = Pressure::default();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of descriptors and the like: back off, never spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let slot = match table.admit() {
            Admission::Admitted(slot) => {
                if slot.took_over() {
                    pressure.evicted += 1;
                }
                pressure.report(max_connections);
                slot
            }
            Admission::Refused => {
                drop(tcp);
                pressure.refused += 1;
                pressure.report(max_connections);
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let task = Task {
            service: service.clone(),
            builder: builder.clone(),
            tls: tls.clone(),
            drain: drain_rx.clone(),
            peer,
        };
        tokio::spawn(task.run(tcp, slot));
    }
    drop(listener);
    let _ = drain_tx.send(true);
    if tokio::time::timeout(drain, table.emptied()).await.is_err() {
        tracing::warn!("drain budget spent; closing the remaining connections");
    }
}

/// Connections that found the listener full, reported at most once per
/// [`PRESSURE_REPORT_EVERY`] so that a flood of connections is visible in the
/// log without writing a line for each.
#[derive(Default)]
struct Pressure {
    evicted: u64,
    refused: u64,
    reported: Option<tokio::time::Instant>,
}

/// How often slot pressure may be logged.
const PRESSURE_REPORT_EVERY: Duration = Duration::from_secs(30);

impl Pressure {
    fn report(&mut self, cap: usize) {
        if self.evicted == 0 && self.refused == 0 {
            return;
        }
        let now = tokio::time::Instant::now();
        if self
            .reported
            .is_some_and(|at| now.duration_since(at) < PRESSURE_REPORT_EVERY)
        {
            return;
        }
        tracing::warn!(
            max_connections = cap,
            evicted = self.evicted,
            refused = self.refused,
            "the listener is full: newcomers took the slots of idle or unauthenticated \
             connections (evicted) or, with every slot busy, were closed at once (refused)"
        );
        *self = Pressure {
            reported: Some(now),
            ..Pressure::default()
        };
    }
}

/// What one connection's task needs.
struct Task<S> {
    service: S,
    builder: hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>,
    tls: Option<TlsAcceptor>,
    drain: watch::Receiver<bool>,
    peer: SocketAddr,
}

impl<S> Task<S>
where
    S: Service<Request<Incoming>, Response = HttpResponse, Error = Infallible, Future: Send>
        + Clone
        + Send
        + Sync
        + 'static,
{
    async fn run(self, tcp: TcpStream, slot: Slot) {
        let socket = Arc::new(tcp);
        let io = SharedSocket(socket.clone());
        let activity = slot.activity().clone();
        let ended = match self.tls.clone() {
            None => self.serve(io, activity).await,
            Some(acceptor) => {
                // The handshake counts against the connection's first-request
                // deadline, and gives way to eviction and drain like a request.
                let mut drain = self.drain.clone();
                let stream = tokio::select! {
                    done = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)) => match done {
                        Ok(Ok(s)) => s,
                        _ => return,
                    },
                    () = tokio::time::sleep_until(activity.snapshot().close_at()) => return,
                    () = activity.evicted() => return,
                    _ = drain.wait_for(|d| *d) => return,
                };
                self.serve(stream, activity).await
            }
        };
        if ended == Ended::Served {
            linger(socket).await;
        }
        drop(slot);
    }

    /// Serves the connection over `io` (the socket, or the TLS stream on it).
    async fn serve<I>(self, io: I, activity: Arc<Activity>) -> Ended
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = Metered::new(io, self.peer);
        connection::serve(
            io,
            &self.builder,
            self.service,
            activity,
            self.drain,
            self.peer,
        )
        .await
    }
}

/// The address a listener is bound to, for the startup log.
pub fn bound(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map_or_else(|_| "unknown".to_owned(), |a: SocketAddr| a.to_string())
}

/// The RPC listener's connection cap: half the soft `RLIMIT_NOFILE`, after
/// raising the soft limit to the hard one. An unknown limit means no cap.
pub fn rpc_connection_cap() -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return usize::MAX;
    };
    let soft = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    };
    usize::try_from(soft / 2).unwrap_or(usize::MAX).max(1)
}

/// The metrics listener's connection cap.
pub const METRICS_CONNECTION_CAP: usize = 64;
