//! The accept loop: one task per connection, HTTP/1.1 and prior-knowledge
//! h2c (or h2 over TLS), graceful shutdown, and a short linger after a
//! connection ends so a client still sending an unread body reads our
//! answer instead of a reset.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tower::Service;

use super::HttpResponse;

/// How long a closing connection keeps reading (and discarding) what the
/// client still sends, so the client sees our answer rather than a reset.
const LINGER: Duration = Duration::from_millis(500);
/// Time allowed for the request line and headers.
const READ_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The most header bytes one request may carry.
const MAX_HEADER_BYTES: usize = 32 * 1024;
/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new cleartext connection may stay silent before its first byte
/// (hyper's header timer only starts once bytes arrive).
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Serves `service` on `listener` until `shutdown` resolves, then lets open
/// connections finish within `drain`. At most `max_connections` are open at
/// once; at the cap, accepting waits (new connections queue in the kernel's
/// backlog) and nothing is refused.
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
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(READ_HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEADER_BYTES as u32);
    tokio::pin!(shutdown);
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
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
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(service.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let linger = linger_handle(&tcp);
            match tls {
                None => {
                    if !first_byte_within(&tcp, IDLE_TIMEOUT).await {
                        return;
                    }
                    let conn = builder.serve_connection(TokioIo::new(tcp), service);
                    if let Err(e) = watcher.watch(conn.into_owned()).await {
                        tracing::debug!(peer = %peer, error = %e, "connection ended");
                    }
                }
                Some(acceptor) => {
                    let stream =
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(s)) => s,
                            _ => return,
                        };
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    if let Err(e) = watcher.watch(conn.into_owned()).await {
                        tracing::debug!(peer = %peer, error = %e, "connection ended");
                    }
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
        tracing::warn!("drain budget spent; closing the remaining connections");
    }
}

/// Whether the peer sends something (or closes) within `budget`; a silent
/// connection would otherwise hold a connection slot forever.
async fn first_byte_within(tcp: &TcpStream, budget: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(budget, tcp.peek(&mut byte)).await,
        Ok(Ok(_))
    )
}

/// A second handle on the connection's socket, so that after hyper has
/// finished and closed its own, the socket stays open a moment longer.
fn linger_handle(tcp: &TcpStream) -> Option<TcpStream> {
    let std = socket_clone(tcp)?;
    std.set_nonblocking(true).ok()?;
    TcpStream::from_std(std).ok()
}

fn socket_clone(tcp: &TcpStream) -> Option<std::net::TcpStream> {
    use std::os::fd::AsFd;
    let owned = tcp.as_fd().try_clone_to_owned().ok()?;
    Some(std::net::TcpStream::from(owned))
}

/// Reads and drops what the peer still sends, until it closes or `budget` passes.
async fn discard_for(mut stream: TcpStream, budget: Duration) {
    // Our half is done: say so, so a client waiting for the end stops waiting.
    let _ = socket2_shutdown_write(&stream);
    let mut buf = [0u8; 8192];
    let _ = tokio::time::timeout(budget, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
}

fn socket2_shutdown_write(stream: &TcpStream) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    let owned = stream.as_fd().try_clone_to_owned()?;
    std::net::TcpStream::from(owned).shutdown(std::net::Shutdown::Write)
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_silent_connection_is_given_up_and_a_talking_one_is_not() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _silent = TcpStream::connect(addr).await.unwrap();
        let (server_side, _) = listener.accept().await.unwrap();
        assert!(!first_byte_within(&server_side, Duration::from_millis(50)).await);

        let mut talking = TcpStream::connect(addr).await.unwrap();
        let (server_side, _) = listener.accept().await.unwrap();
        talking.write_all(b"G").await.unwrap();
        assert!(first_byte_within(&server_side, Duration::from_secs(5)).await);
    }
}
