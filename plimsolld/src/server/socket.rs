//! One connection's socket, shared between hyper and the connection's task,
//! so that after hyper is done the task can keep the socket open a moment
//! longer (the linger of wire.md §1.3) without a second descriptor: a
//! connection costs the listener exactly one, which is what the connection
//! cap (half the descriptor limit) assumes.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// How long a closing connection keeps reading (and discarding) what the
/// client still sends, so the client sees our answer rather than a reset.
pub const LINGER: Duration = Duration::from_millis(500);

/// The socket as hyper's IO. Shutting down is left to [`linger`], which runs
/// once hyper has dropped its handle.
pub struct SharedSocket(pub Arc<TcpStream>);

impl AsyncRead for SharedSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            // A would-block clears the readiness, so the next poll waits again.
            match self.0.try_read_buf(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(done.map(drop)),
            }
        }
    }
}

impl AsyncWrite for SharedSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(done),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(done),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// After hyper is done with `socket`: says the daemon's half is finished,
/// then reads and drops what the peer still sends until it closes or
/// [`LINGER`] passes.
pub async fn linger(socket: Arc<TcpStream>) {
    // Hyper has dropped its handle by now; if something still holds one,
    // closing is left to it.
    let Ok(mut stream) = Arc::try_unwrap(socket) else {
        return;
    };
    let _ = stream.shutdown().await;
    let mut buf = [0u8; 8192];
    let _ = tokio::time::timeout(LINGER, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
}
