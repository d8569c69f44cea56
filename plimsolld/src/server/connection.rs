//! One connection's life, from its slot to its last byte: the HTTP/1.1 and
//! HTTP/2 settings, a request counter around the pipeline, and the task that
//! serves the connection and closes it when its time is up (see
//! [`connections`](super::connections) for how long that is), when the table
//! gives its slot away, or when the daemon drains.
//!
//! Closing is graceful first (HTTP/2 GOAWAY, HTTP/1.1 close after the
//! current answer), then hard after [`CLOSE_GRACE`].

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use tower::{Service, ServiceExt};

use super::connections::Activity;
use super::{BodyError, HttpResponse, RespBody};

/// Time allowed for an HTTP/1.1 request line and headers (config.md §5).
const READ_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The most header bytes one request may carry, HTTP/1.1 or HTTP/2
/// (config.md §5). On HTTP/2 this is SETTINGS_MAX_HEADER_LIST_SIZE; h2
/// answers a larger header block with 431 and ends the connection when one
/// is several times larger.
const MAX_HEADER_BYTES: usize = 32 * 1024;
/// Streams one HTTP/2 connection may have open at once: the smallest value
/// RFC 9113 §6.5.2 recommends. A caller's runs are capped far lower by
/// admission; this bounds what one connection can make the daemon hold.
const MAX_CONCURRENT_STREAMS: u32 = 100;
/// Streams the peer may cancel before the daemon has accepted them, at
/// once (h2's own default, stated here so it cannot change under us).
const MAX_PENDING_ACCEPT_RESETS: usize = 20;
/// Streams the daemon may reset for the peer's protocol errors before the
/// connection is ended. An honest client causes none.
const MAX_LOCAL_ERROR_RESETS: usize = 64;
/// How long an HTTP/2 connection may be silent before the daemon pings it.
/// Only a silent peer is pinged: any frame it sends resets the clock.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// How long the peer has to answer that ping before the connection is
/// dropped: a peer that is gone, or one that stopped reading.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection told to close (stalled, or evicted with a request
/// in flight) may take to finish its answers before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// How long an idle connection told to close gets to write its GOAWAY. Its
/// descriptor must come back quickly: a burst of newcomers that each evict
/// an idle connection would otherwise run the daemon out of descriptors.
const GOAWAY_FLUSH: Duration = Duration::from_millis(100);

/// The protocol settings every connection is served with.
pub fn builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(READ_HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESETS)
        .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESETS)
        .keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT);
    builder
}

/// How a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The peer or the protocol ended it, or it was closed with answers in
    /// flight: linger, so the peer reads what was written.
    Served,
    /// The daemon closed it with nothing in flight (idle, or its slot given
    /// away): nothing to linger for, and its descriptor is freed at once.
    Idle,
}

/// Serves one connection over `io` until it ends or is closed.
pub async fn serve<I, S>(
    io: I,
    builder: &auto::Builder<TokioExecutor>,
    service: S,
    activity: Arc<Activity>,
    mut drain: watch::Receiver<bool>,
    peer: SocketAddr,
) -> Ended
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Service<Request<Incoming>, Response = HttpResponse, Error = Infallible, Future: Send>
        + Clone
        + Send
        + Sync
        + 'static,
{
    let counted = Counted {
        inner: service,
        activity: activity.clone(),
    };
    let conn = builder.serve_connection(TokioIo::new(io), counted);
    tokio::pin!(conn);
    let mut closing = Closing::Open;
    loop {
        let deadline = match closing {
            Closing::Open => Some(activity.snapshot().check_at()),
            Closing::Soon { hard_stop, .. } => Some(hard_stop),
            Closing::Drain => None,
        };
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(peer = %peer, error = %e, "connection ended");
                }
                return closing.ended();
            }
            () = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                if let Closing::Soon { .. } = closing {
                    return closing.ended();
                }
                // Requests since the deadline was read may have moved it.
                if activity.snapshot().close_at() <= Instant::now() {
                    conn.as_mut().graceful_shutdown();
                    closing = Closing::soon(&activity);
                }
            }
            () = activity.evicted(), if closing == Closing::Open => {
                conn.as_mut().graceful_shutdown();
                closing = Closing::soon(&activity);
            }
            _ = drain.wait_for(|d| *d), if closing == Closing::Open => {
                conn.as_mut().graceful_shutdown();
                closing = Closing::Drain;
            }
        }
    }
}

/// Where a connection stands on its way out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closing {
    Open,
    /// Told to close (GOAWAY sent or queued); dropped at `hard_stop`.
    Soon {
        hard_stop: Instant,
        idle: bool,
    },
    /// The daemon drains: the listener's drain budget decides.
    Drain,
}

impl Closing {
    /// Closing because of a deadline or an eviction: an idle connection
    /// gets just long enough to write its GOAWAY, a busy one [`CLOSE_GRACE`]
    /// to finish its answers.
    fn soon(activity: &Activity) -> Closing {
        let idle = activity.snapshot().open_streams == 0;
        let grace = if idle { GOAWAY_FLUSH } else { CLOSE_GRACE };
        Closing::Soon {
            hard_stop: Instant::now() + grace,
            idle,
        }
    }

    fn ended(self) -> Ended {
        match self {
            Closing::Soon { idle: true, .. } => Ended::Idle,
            _ => Ended::Served,
        }
    }
}

// === impl Counted ===

/// The pipeline, counting the connection's requests in flight and handing
/// the authentication step the connection's [`Activity`].
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    activity: Arc<Activity>,
}

/// The connection's activity as the pipeline sees it, in each request's
/// extensions: the authentication step marks it.
#[derive(Clone)]
pub struct ConnectionActivity(pub Arc<Activity>);

impl<S> hyper::service::Service<Request<Incoming>> for Counted<S>
where
    S: Service<Request<Incoming>, Response = HttpResponse, Error = Infallible, Future: Send>
        + Clone
        + Send
        + 'static,
{
    type Response = Response<Guarded>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Guarded>, Infallible>> + Send>>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        self.activity.request_started();
        // Ends the count when dropped: with the answer's body, or with this
        // future if the peer cancels first.
        let guard = StreamGuard(self.activity.clone());
        req.extensions_mut()
            .insert(ConnectionActivity(self.activity.clone()));
        let inner = self.inner.clone();
        Box::pin(async move {
            let resp = match inner.oneshot(req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            };
            Ok(resp.map(|inner| Guarded {
                inner,
                _guard: guard,
            }))
        })
    }
}

/// One request in flight.
struct StreamGuard(Arc<Activity>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

/// An answer's body that ends its request's count when hyper drops it,
/// after the last frame or when the stream is reset.
pub struct Guarded {
    inner: RespBody,
    _guard: StreamGuard,
}

impl Body for Guarded {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
