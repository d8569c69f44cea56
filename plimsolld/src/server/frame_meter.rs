//! HTTP/2 frame budgets that the h2 crate does not keep.
//!
//! h2 0.4 already bounds CONTINUATION floods, header blocks far over the
//! list size, runs of tiny DATA frames, streams reset before they were
//! accepted and streams it had to reset itself. It answers every SETTINGS
//! and PING, though, one at a time but without end, and a stream that the
//! server has already accepted can be opened and cancelled in a loop (the
//! "rapid reset" pattern) at no cost to the peer beyond a round of frames.
//!
//! [`Metered`] reads only the 9-byte frame headers of what the peer sends
//! (payloads are skipped, never copied) and keeps a token bucket per
//! connection for each kind below. A peer that overdraws one is cut off:
//! its reads fail, hyper ends the connection, and one log line says why.
//! HTTP/1.1 connections (no preface) pass through untouched.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// The connection preface every HTTP/2 client sends first (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEAD: usize = 9;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;

/// A budget: `burst` frames at once, refilled at `per_second`.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// The frames a peer may send at once.
    pub burst: u32,
    /// The frames a peer may send per second, sustained.
    pub per_second: u32,
}

/// SETTINGS frames (acknowledgements included). An honest client sends one
/// at the start, acknowledges ours, and rarely changes a setting later.
pub const SETTINGS_BUDGET: Budget = Budget {
    burst: 16,
    per_second: 1,
};
/// PING frames (acknowledgements included, since h2 logs a warning for each
/// acknowledgement of a ping it never sent). Keep-alive pings come every few
/// seconds at most; a client measuring bandwidth pings about once per round
/// trip while data flows, backing off as it settles.
pub const PING_BUDGET: Budget = Budget {
    burst: 50,
    per_second: 10,
};
/// RST_STREAM frames: a client cancels a call now and then, not hundreds a
/// second. h2 itself only counts resets of streams not yet accepted (20).
pub const RESET_BUDGET: Budget = Budget {
    burst: 100,
    per_second: 10,
};

/// Which budget a peer overdrew.
#[derive(Debug, thiserror::Error)]
#[error("HTTP/2 {0} flood: the peer sent more than its budget allows")]
pub struct FrameFlood(pub &'static str);

// === impl Bucket ===

struct Bucket {
    budget: Budget,
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    fn new(budget: Budget, now: Instant) -> Bucket {
        Bucket {
            budget,
            tokens: f64::from(budget.burst),
            refilled: now,
        }
    }

    /// Takes one token; `false` when the budget is spent.
    fn take(&mut self, now: Instant) -> bool {
        let earned =
            now.duration_since(self.refilled).as_secs_f64() * f64::from(self.budget.per_second);
        self.tokens = (self.tokens + earned).min(f64::from(self.budget.burst));
        self.refilled = now;
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

// === impl Meter ===

enum Parse {
    /// Comparing the first bytes with the preface; `matched` so far.
    Preface { matched: usize },
    /// Not HTTP/2: nothing to meter.
    Http1,
    /// Between frames: `head` collects a frame header, then `skip` payload
    /// bytes follow.
    Frames {
        head: [u8; FRAME_HEAD],
        have: usize,
        skip: usize,
    },
}

/// The budgets of one connection and where its byte stream stands.
pub(super) struct Meter {
    parse: Parse,
    settings: Bucket,
    pings: Bucket,
    resets: Bucket,
}

impl Meter {
    pub(super) fn new(now: Instant) -> Meter {
        Meter {
            parse: Parse::Preface { matched: 0 },
            settings: Bucket::new(SETTINGS_BUDGET, now),
            pings: Bucket::new(PING_BUDGET, now),
            resets: Bucket::new(RESET_BUDGET, now),
        }
    }

    /// Accounts for `bytes`, the next bytes the peer sent.
    pub(super) fn feed(&mut self, mut bytes: &[u8]) -> Result<(), FrameFlood> {
        while !bytes.is_empty() {
            match &mut self.parse {
                Parse::Http1 => return Ok(()),
                Parse::Preface { matched } => {
                    let n = bytes.len().min(PREFACE.len() - *matched);
                    if bytes[..n] != PREFACE[*matched..*matched + n] {
                        self.parse = Parse::Http1;
                        return Ok(());
                    }
                    *matched += n;
                    bytes = &bytes[n..];
                    if *matched == PREFACE.len() {
                        self.parse = Parse::Frames {
                            head: [0; FRAME_HEAD],
                            have: 0,
                            skip: 0,
                        };
                    }
                }
                Parse::Frames { head, have, skip } => {
                    if *skip > 0 {
                        let n = bytes.len().min(*skip);
                        *skip -= n;
                        bytes = &bytes[n..];
                        continue;
                    }
                    let n = bytes.len().min(FRAME_HEAD - *have);
                    head[*have..*have + n].copy_from_slice(&bytes[..n]);
                    *have += n;
                    bytes = &bytes[n..];
                    if *have == FRAME_HEAD {
                        *have = 0;
                        *skip = usize::from(head[0]) << 16
                            | usize::from(head[1]) << 8
                            | usize::from(head[2]);
                        let kind = head[3];
                        self.count(kind)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn count(&mut self, kind: u8) -> Result<(), FrameFlood> {
        let (bucket, name) = match kind {
            SETTINGS => (&mut self.settings, "SETTINGS"),
            PING => (&mut self.pings, "PING"),
            RST_STREAM => (&mut self.resets, "RST_STREAM"),
            _ => return Ok(()),
        };
        if bucket.take(Instant::now()) {
            Ok(())
        } else {
            Err(FrameFlood(name))
        }
    }
}

// === impl Metered ===

/// A connection's IO, metered on the read side.
pub struct Metered<T> {
    inner: T,
    meter: Meter,
    peer: SocketAddr,
    flooded: Option<&'static str>,
}

impl<T> Metered<T> {
    /// Meters what `peer` sends over `inner`.
    pub fn new(inner: T, peer: SocketAddr) -> Metered<T> {
        Metered {
            inner,
            meter: Meter::new(Instant::now()),
            peer,
            flooded: None,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Metered<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(kind) = self.flooded {
            return Poll::Ready(Err(io::Error::other(FrameFlood(kind))));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let this = &mut *self;
        if let Err(flood) = this.meter.feed(&buf.filled()[before..]) {
            tracing::info!(peer = %this.peer, frame = flood.0, "connection closed: {flood}");
            this.flooded = Some(flood.0);
            return Poll::Ready(Err(io::Error::other(flood)));
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Metered<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            0,
            0,
            0,
            0,
            1,
        ];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn http1_is_never_metered() {
        let mut m = Meter::new(Instant::now());
        let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1000);
        assert!(m.feed(&request).is_ok());
        assert!(matches!(m.parse, Parse::Http1));
    }

    #[test]
    fn pings_past_the_burst_trip_even_split_across_reads() {
        let mut m = Meter::new(Instant::now());
        let mut stream = PREFACE.to_vec();
        for _ in 0..PING_BUDGET.burst + 1 {
            stream.extend(frame(PING, &[0; 8]));
        }
        // One byte at a time: headers and payloads cut anywhere.
        let mut tripped = None;
        for (i, b) in stream.iter().enumerate() {
            if let Err(e) = m.feed(std::slice::from_ref(b)) {
                tripped = Some((i, e.0));
                break;
            }
        }
        let (at, kind) = tripped.expect("the budget trips");
        assert_eq!(kind, "PING");
        // The frame header that overdrew is the last one's.
        assert_eq!(
            at,
            PREFACE.len() + PING_BUDGET.burst as usize * 17 + FRAME_HEAD - 1
        );
    }

    #[test]
    fn payload_bytes_are_skipped_not_counted_as_frames() {
        let mut m = Meter::new(Instant::now());
        let mut stream = PREFACE.to_vec();
        // A DATA payload full of bytes that look like SETTINGS frame headers.
        let fake = frame(SETTINGS, &[]).repeat(1000);
        stream.extend(frame(0x0, &fake));
        assert!(m.feed(&stream).is_ok());
        for _ in 0..SETTINGS_BUDGET.burst {
            assert!(m.feed(&frame(SETTINGS, &[])).is_ok());
        }
        assert_eq!(m.feed(&frame(SETTINGS, &[])).unwrap_err().0, "SETTINGS");
    }

    #[test]
    fn a_bucket_refills_at_its_rate() {
        let start = Instant::now();
        let mut b = Bucket::new(
            Budget {
                burst: 2,
                per_second: 4,
            },
            start,
        );
        assert!(b.take(start) && b.take(start));
        assert!(!b.take(start));
        assert!(b.take(start + std::time::Duration::from_millis(260)));
        assert!(!b.take(start + std::time::Duration::from_millis(270)));
    }
}
