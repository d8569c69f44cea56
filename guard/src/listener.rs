//! The guard's listener: TCP, TLS when configured (ALPN `h2`, `http/1.1`), HTTP/1.1 and
//! prior-knowledge h2c in cleartext, and the server bounds of grants.md §5.5:
//!
//! - request head within 5 s, at most 32 KiB of headers;
//! - the body within 10 s of its turn (the handler's, stricter than the 30 s read bound);
//! - a request answered within 6 minutes (the write bound); an answer the client stops
//!   reading, like any connection on which no byte moves either way for 2 minutes (the idle
//!   bound), is closed;
//! - at most half the process's descriptor limit in connections: at the cap, accepting waits
//!   (new connections queue in the kernel) and nothing is refused.
//!
//! A closing HTTP/1.x connection keeps reading (and discarding) for a moment after the
//! guard's answer, so a client still sending an unread body reads the refusal instead of a
//! reset.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::answer;
use crate::handler::Guard;

/// Time allowed for a request's line and headers.
pub const READ_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The most header bytes a request may carry.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;
/// How long one request may take, answer included.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(6 * 60);
/// How long a connection may move no byte either way.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(2 * 60);
/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a closed connection keeps discarding what the client still sends.
const LINGER: Duration = Duration::from_millis(500);
/// Streams one HTTP/2 connection may have open.
const MAX_STREAMS: u32 = 256;

/// Serves `guard` on `listener` until `shutdown` resolves, then lets requests in flight
/// finish within `drain`.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    guard: Arc<Guard>,
    max_connections: usize,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(READ_HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_concurrent_streams(MAX_STREAMS);
    let connections = Arc::new(Semaphore::new(max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(error) => {
                    // Out of descriptors and the like: back off, never spin.
                    tracing::warn!(%error, "guard: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let (builder, tls, guard) = (builder.clone(), tls.clone(), guard.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let linger = linger_handle(&tcp);
            let activity = Activity::new();
            let io = Tracked {
                inner: tcp,
                activity: activity.clone(),
            };
            let service = service_fn(move |request: Request<Incoming>| {
                let guard = guard.clone();
                async move {
                    let answer = tokio::time::timeout(WRITE_TIMEOUT, guard.handle(request))
                        .await
                        .unwrap_or_else(|_| answer::too_long());
                    Ok::<_, Infallible>(answer)
                }
            });
            let served = async {
                match tls {
                    None => {
                        let connection = builder.serve_connection(TokioIo::new(io), service);
                        watcher.watch(connection.into_owned()).await
                    }
                    Some(acceptor) => {
                        let Ok(Ok(stream)) =
                            tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await
                        else {
                            return Ok(());
                        };
                        let connection = builder.serve_connection(TokioIo::new(stream), service);
                        watcher.watch(connection.into_owned()).await
                    }
                }
            };
            tokio::select! {
                result = served => if let Err(error) = result {
                    tracing::debug!(%error, "guard: connection ended");
                },
                () = activity.idle_for(IDLE_TIMEOUT) => {
                    tracing::debug!("guard: idle connection closed");
                }
            }
            if let Some(stream) = linger {
                discard_for(stream, LINGER).await;
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("guard: drain budget spent; closing the remaining connections");
    }
}

/// The connection cap: half the soft `RLIMIT_NOFILE`, after raising the soft limit to the
/// hard one (the other half is the broker link's and the process's own). An unknown limit
/// means no cap.
pub fn connection_cap() -> usize {
    usize::try_from(crate::start::open_files_limit() / 2)
        .unwrap_or(usize::MAX)
        .max(1)
}

/// When a connection last moved a byte, in milliseconds since it opened.
#[derive(Clone)]
struct Activity {
    opened: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            opened: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once no byte has moved for `limit`.
    async fn idle_for(&self, limit: Duration) {
        loop {
            let last = self.opened + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            if last.elapsed() >= limit {
                return;
            }
            tokio::time::sleep_until(last + limit).await;
        }
    }
}

/// A stream that notes each byte moved in its [`Activity`].
struct Tracked<S> {
    inner: S,
    activity: Activity,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A second handle on the socket, so it can linger after hyper closed its own.
fn linger_handle(tcp: &TcpStream) -> Option<TcpStream> {
    use std::os::fd::AsFd;
    let owned = tcp.as_fd().try_clone_to_owned().ok()?;
    let std = std::net::TcpStream::from(owned);
    std.set_nonblocking(true).ok()?;
    TcpStream::from_std(std).ok()
}

/// Says the answer is complete (FIN), then reads and drops what the client still sends
/// until it closes or `budget` passes.
async fn discard_for(mut stream: TcpStream, budget: Duration) {
    {
        use std::os::fd::AsFd;
        if let Ok(owned) = stream.as_fd().try_clone_to_owned() {
            let _ = std::net::TcpStream::from(owned).shutdown(std::net::Shutdown::Write);
        }
    }
    let mut sink = [0u8; 8192];
    let _ = tokio::time::timeout(budget, async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_after_the_limit_without_a_byte() {
        let activity = Activity::new();
        let started = Instant::now();
        let watched = activity.clone();
        let idle = tokio::spawn(async move { watched.idle_for(IDLE_TIMEOUT).await });
        tokio::time::sleep(Duration::from_secs(90)).await;
        activity.touch();
        idle.await.unwrap_or(());
        assert_eq!(started.elapsed(), Duration::from_secs(90) + IDLE_TIMEOUT);
    }
}
