//! The guest's stdout and stderr: in-memory pipes that keep the first [`OUTPUT_CAP`] bytes
//! and drop the rest.
//!
//! A write past the cap succeeds at once from the guest's point of view, so a guest that
//! prints without end is neither blocked nor slowed by a full pipe: the bytes are counted
//! and dropped, and the pipe remembers that it truncated. What is kept is exactly what the
//! guest wrote, never a marker (wire.md §6.7). The host's own buffer is the cap, whatever
//! the guest writes.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// How much of each stream a run keeps (providers.md §3.2: 64 KiB).
pub const OUTPUT_CAP: usize = 64 * 1024;

/// The largest write the pipe announces it can take at once. Any size works, since the
/// pipe never refuses bytes; WASI preview 1 writes in 4 KiB pieces anyway.
const WRITE_PERMIT: usize = 1024 * 1024;

/// What one stream captured.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Captured {
    /// The bytes kept, at most the cap.
    pub bytes: Vec<u8>,
    /// Whether any byte was dropped.
    pub truncated: bool,
}

/// One capped stream. Clones share the same buffer: the store keeps one, the run reads
/// the other after the guest has finished.
#[derive(Debug, Clone)]
pub struct CappedPipe {
    cap: usize,
    captured: Arc<Mutex<Captured>>,
}

// === impl CappedPipe ===

impl CappedPipe {
    /// An empty pipe keeping at most `cap` bytes.
    pub fn new(cap: usize) -> CappedPipe {
        CappedPipe {
            cap,
            captured: Arc::default(),
        }
    }

    /// Keeps what fits under the cap and drops the rest.
    pub fn push(&self, bytes: &[u8]) {
        // A poisoned lock only means another writer panicked mid-push; the buffer is
        // still a valid prefix of the output.
        let mut captured = self.captured.lock().unwrap_or_else(PoisonError::into_inner);
        let room = self.cap.saturating_sub(captured.bytes.len());
        let kept = bytes.len().min(room);
        captured.bytes.extend_from_slice(&bytes[..kept]);
        if kept < bytes.len() {
            captured.truncated = true;
        }
    }

    /// What the pipe holds now.
    pub fn take(&self) -> Captured {
        std::mem::take(&mut *self.captured.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedPipe {
    async fn ready(&mut self) {}
}

impl OutputStream for CappedPipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

impl tokio::io::AsyncWrite for CappedPipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_past_the_cap_are_dropped_and_flagged() {
        let pipe = CappedPipe::new(8);
        pipe.push(b"hello");
        pipe.push(b" world");
        pipe.push(b"!");
        let got = pipe.take();
        assert_eq!(got.bytes, b"hello wo");
        assert!(got.truncated);
    }

    #[test]
    fn output_that_fits_exactly_is_not_truncated() {
        let pipe = CappedPipe::new(4);
        pipe.push(b"abcd");
        pipe.push(b"");
        let got = pipe.take();
        assert_eq!(got.bytes, b"abcd");
        assert!(!got.truncated);
    }

    #[test]
    fn a_full_pipe_still_accepts_writes_at_once() {
        let mut pipe = CappedPipe::new(2);
        for _ in 0..1000 {
            OutputStream::write(&mut pipe, Bytes::from_static(b"xyz")).expect("never refused");
            assert_eq!(pipe.check_write().expect("always ready"), WRITE_PERMIT);
        }
        assert_eq!(pipe.take().bytes.len(), 2);
    }
}
