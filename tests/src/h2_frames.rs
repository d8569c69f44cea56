//! Raw HTTP/2 frames over a blocking socket (cleartext or TLS), for tests whose
//! client must misbehave in ways a library client never would: stay silent after
//! the preface, never answer a ping, flood SETTINGS, open and cancel streams in a
//! loop, send a header block over the limit.
//!
//! Frames follow RFC 9113 §4.1 (a 9-byte header: 24-bit length, type, flags,
//! 31-bit stream id). Header blocks are written with HPACK's literal-without-
//! indexing form only (RFC 7541 §6.2.2, no Huffman), which every decoder must
//! accept; [`status`] reads back just the `:status` of an answer.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types (RFC 9113 §6).
pub mod kind {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
}

/// Settings identifiers (RFC 9113 §6.5.2).
pub mod setting {
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// Error codes (RFC 9113 §7).
pub mod code {
    pub const NO_ERROR: u32 = 0x0;
    pub const PROTOCOL_ERROR: u32 = 0x1;
    pub const REFUSED_STREAM: u32 = 0x7;
    pub const CANCEL: u32 = 0x8;
    pub const ENHANCE_YOUR_CALM: u32 = 0xb;
}

/// One frame as read from the daemon.
#[derive(Clone, Debug)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// A SETTINGS frame's (identifier, value) pairs.
    pub fn settings(&self) -> Vec<(u16, u32)> {
        self.payload
            .chunks_exact(6)
            .map(|c| {
                (
                    u16::from_be_bytes([c[0], c[1]]),
                    u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                )
            })
            .collect()
    }

    /// The error code of a RST_STREAM or GOAWAY frame.
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.kind {
            kind::RST_STREAM => 0,
            kind::GOAWAY => 4,
            _ => return None,
        };
        let b = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// One frame's bytes.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    assert!(len < 1 << 24, "a frame payload fits in 24 bits");
    let mut f = Vec::with_capacity(9 + len);
    f.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A SETTINGS frame with `values`.
pub fn settings(values: &[(u16, u32)]) -> Vec<u8> {
    let mut p = Vec::new();
    for (id, v) in values {
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&v.to_be_bytes());
    }
    frame(kind::SETTINGS, 0, 0, &p)
}

/// A RST_STREAM frame.
pub fn rst_stream(stream: u32, error: u32) -> Vec<u8> {
    frame(kind::RST_STREAM, 0, stream, &error.to_be_bytes())
}

/// A PING frame (or its acknowledgement).
pub fn ping(payload: [u8; 8], ack: bool) -> Vec<u8> {
    frame(kind::PING, if ack { flag::ACK } else { 0 }, 0, &payload)
}

/// HPACK's integer form with an `n`-bit prefix whose high bits are `high`.
fn hpack_int(out: &mut Vec<u8>, high: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(high | value as u8);
        return;
    }
    out.push(high | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A header block of `fields`, each a literal without indexing with a new name.
pub fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        hpack_int(&mut out, 0, 7, name.len());
        out.extend_from_slice(name.as_bytes());
        hpack_int(&mut out, 0, 7, value.len());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// The header block of a request: pseudo-headers first, then `extra`.
pub fn request(method: &str, path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut fields = vec![
        (":method", method),
        (":scheme", "http"),
        (":authority", "127.0.0.1"),
        (":path", path),
    ];
    fields.extend_from_slice(extra);
    header_block(&fields)
}

/// A HEADERS frame carrying a whole header block.
pub fn headers(stream: u32, block: &[u8], end_stream: bool) -> Vec<u8> {
    let flags = flag::END_HEADERS | if end_stream { flag::END_STREAM } else { 0 };
    frame(kind::HEADERS, flags, stream, block)
}

/// The `:status` of an answer's header block, which the daemon (h2) writes first:
/// either a static-table index or a literal whose value may be Huffman-coded
/// (only the ten digit codes of RFC 7541 Appendix B are needed for a status).
pub fn status(block: &[u8]) -> Option<u16> {
    let first = *block.first()?;
    if first & 0x80 != 0 {
        return match first & 0x7f {
            8 => Some(200),
            9 => Some(204),
            10 => Some(206),
            11 => Some(304),
            12 => Some(400),
            13 => Some(404),
            14 => Some(500),
            _ => None,
        };
    }
    // A literal with an indexed name: 01xxxxxx, 0000xxxx or 0001xxxx.
    let index = if first & 0x40 != 0 {
        first & 0x3f
    } else {
        first & 0x0f
    };
    if !(8..=14).contains(&index) {
        return None;
    }
    let head = *block.get(1)?;
    let len = usize::from(head & 0x7f);
    let value = block.get(2..2 + len)?;
    let text = if head & 0x80 != 0 {
        huffman_digits(value)?
    } else {
        String::from_utf8(value.to_vec()).ok()?
    };
    text.parse().ok()
}

fn huffman_digits(bytes: &[u8]) -> Option<String> {
    // (code, bits) for '0'..='9'.
    const CODES: [(u32, u32); 10] = [
        (0x0, 5),
        (0x1, 5),
        (0x2, 5),
        (0x19, 6),
        (0x1a, 6),
        (0x1b, 6),
        (0x1c, 6),
        (0x1d, 6),
        (0x1e, 6),
        (0x1f, 6),
    ];
    let bits: Vec<u32> = bytes
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| u32::from((b >> i) & 1)))
        .collect();
    let mut out = String::new();
    let mut at = 0;
    'next: while at < bits.len() {
        for (digit, (code, n)) in CODES.iter().enumerate() {
            let n = *n as usize;
            if at + n <= bits.len() {
                let v = bits[at..at + n].iter().fold(0, |acc, b| acc << 1 | b);
                if v == *code {
                    out.push(char::from(b'0' + digit as u8));
                    at += n;
                    continue 'next;
                }
            }
        }
        // What is left must be the end-of-string padding: all ones, under a byte.
        return (bits.len() - at < 8 && bits[at..].iter().all(|b| *b == 1)).then_some(out);
    }
    Some(out)
}

/// What reading from the daemon gave.
#[derive(Debug)]
pub enum Event {
    Frame(Frame),
    /// The daemon closed the connection (end of stream or reset).
    Closed,
    /// Nothing complete arrived in time.
    TimedOut,
}

/// A byte stream with a settable read timeout.
pub trait Socket: Read + Write + Send {
    fn tcp(&self) -> &TcpStream;
}

impl Socket for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Socket for rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }
}

/// One raw HTTP/2 connection.
pub struct H2 {
    socket: Box<dyn Socket>,
    buf: Vec<u8>,
    closed: bool,
}

impl H2 {
    /// Connects over cleartext and sends the preface and an empty SETTINGS frame.
    pub fn h2c(addr: SocketAddr) -> H2 {
        let tcp = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        H2::over(Box::new(tcp))
    }

    /// Sends the preface and an empty SETTINGS frame over `socket`.
    pub fn over(socket: Box<dyn Socket>) -> H2 {
        let _ = socket.tcp().set_nodelay(true);
        let mut h2 = H2 {
            socket,
            buf: Vec::new(),
            closed: false,
        };
        let mut hello = PREFACE.to_vec();
        hello.extend(settings(&[]));
        h2.send(&hello);
        h2
    }

    /// Reads the daemon's SETTINGS (answering nothing else) and acknowledges them.
    pub fn handshake(&mut self) -> Frame {
        let theirs = self
            .wait_for(Duration::from_secs(10), |f| {
                f.kind == kind::SETTINGS && f.flags & flag::ACK == 0
            })
            .expect("the daemon sends its SETTINGS first");
        self.send(&frame(kind::SETTINGS, flag::ACK, 0, &[]));
        theirs
    }

    /// Writes `bytes`; `false` once the daemon has closed the connection.
    pub fn try_send(&mut self, bytes: &[u8]) -> bool {
        self.socket
            .write_all(bytes)
            .and_then(|()| self.socket.flush())
            .is_ok()
    }

    /// Writes `bytes`, panicking if the connection is gone.
    pub fn send(&mut self, bytes: &[u8]) {
        assert!(self.try_send(bytes), "the daemon closed the connection");
    }

    /// The next frame, or what ended the wait, within `timeout`.
    pub fn next(&mut self, timeout: Duration) -> Event {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(f) = self.parse() {
                return Event::Frame(f);
            }
            if self.closed {
                return Event::Closed;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Event::TimedOut;
            }
            let _ = self.socket.tcp().set_read_timeout(Some(left));
            let mut chunk = [0u8; 16 * 1024];
            match self.socket.read(&mut chunk) {
                Ok(0) => self.closed = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => self.closed = true,
            }
        }
    }

    /// Reads until a frame matches `pred` (returned) or `timeout` passes or the
    /// connection closes (`None`). Frames before it are dropped.
    pub fn wait_for(&mut self, timeout: Duration, pred: impl Fn(&Frame) -> bool) -> Option<Frame> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.next(deadline.saturating_duration_since(Instant::now())) {
                Event::Frame(f) if pred(&f) => return Some(f),
                Event::Frame(_) => {}
                Event::Closed | Event::TimedOut => return None,
            }
        }
    }

    /// Reads (and keeps) frames until the daemon closes the connection: `Some` with
    /// every frame read, or `None` when it is still open after `timeout`.
    pub fn until_closed(&mut self, timeout: Duration) -> Option<Vec<Frame>> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            match self.next(deadline.saturating_duration_since(Instant::now())) {
                Event::Frame(f) => seen.push(f),
                Event::Closed => return Some(seen),
                Event::TimedOut => return None,
            }
        }
    }

    fn parse(&mut self) -> Option<Frame> {
        if self.buf.len() < 9 {
            return None;
        }
        let len = usize::from(self.buf[0]) << 16
            | usize::from(self.buf[1]) << 8
            | usize::from(self.buf[2]);
        if self.buf.len() < 9 + len {
            return None;
        }
        let f = Frame {
            kind: self.buf[3],
            flags: self.buf[4],
            stream: u32::from_be_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]])
                & 0x7fff_ffff,
            payload: self.buf[9..9 + len].to_vec(),
        };
        self.buf.drain(..9 + len);
        Some(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hpack_integers_use_the_prefix_then_seven_bit_groups() {
        let mut out = Vec::new();
        hpack_int(&mut out, 0, 7, 10);
        hpack_int(&mut out, 0, 5, 1337);
        assert_eq!(out, vec![10, 31, 154, 10]);
    }

    #[test]
    fn a_huffman_coded_status_is_read() {
        // ":status: 431" as h2 writes it: literal, indexed name 8, Huffman "431".
        assert_eq!(status(&[0x08, 0x83, 0x69, 0x90, 0xff]), Some(431));
        assert_eq!(status(&[0x88]), Some(200));
        assert_eq!(status(&[0x08, 0x03, b'4', b'2', b'9']), Some(429));
    }
}
