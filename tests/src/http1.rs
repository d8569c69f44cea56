//! Raw HTTP/1.1 over a `TcpStream`: the test writes the exact bytes.
//!
//! A [`Request`] renders to bytes with only what it was told (plus `Host` and a
//! `Content-Length` matching the body, each unless the test set its own), so tests can
//! declare a length they never send, send a header twice, or stream a chunked body.
//! A [`Connection`] reads answers back, framed by `Content-Length`, chunked encoding or
//! the end of the connection.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long one read or write may block before the test fails.
pub const IO_TIMEOUT: Duration = Duration::from_secs(15);

// === impl Request ===

/// An HTTP/1.1 request, rendered exactly.
#[derive(Clone, Debug)]
pub struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    auto_length: bool,
}

impl Request {
    pub fn new(method: &str, target: &str) -> Request {
        Request {
            method: method.to_string(),
            target: target.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
            auto_length: true,
        }
    }

    pub fn get(target: &str) -> Request {
        Request::new("GET", target)
    }

    pub fn post(target: &str) -> Request {
        Request::new("POST", target)
    }

    /// Adds a header line; adding a name twice sends it twice.
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Removes every header line named `name`.
    pub fn without(mut self, name: &str) -> Request {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    /// Sends no `Content-Length` of its own (the test sets framing itself, or sends none).
    pub fn no_auto_length(mut self) -> Request {
        self.auto_length = false;
        self
    }

    /// The first value of a header this request carries.
    pub fn header_value(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The request line and headers, ending with the blank line.
    pub fn head_bytes(&self, host: SocketAddr) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.target);
        if self.header_value("Host").is_none() {
            out.push_str(&format!("Host: {host}\r\n"));
        }
        for (n, v) in &self.headers {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        let framed = self.header_value("Content-Length").is_some()
            || self.header_value("Transfer-Encoding").is_some();
        if self.auto_length && !framed {
            out.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        out.push_str("\r\n");
        out.into_bytes()
    }

    /// The whole request: head then body.
    pub fn to_bytes(&self, host: SocketAddr) -> Vec<u8> {
        let mut out = self.head_bytes(host);
        out.extend_from_slice(&self.body);
        out
    }

    /// Opens a connection, sends the request and reads one answer.
    pub fn send(&self, addr: SocketAddr) -> Response {
        let mut conn = Connection::open(addr);
        conn.send(&self.to_bytes(addr))
            .unwrap_or_else(|e| panic!("send {} {}: {e}", self.method, self.target));
        conn.read_response(self.method == "HEAD")
            .unwrap_or_else(|e| panic!("answer to {} {}: {e}", self.method, self.target))
    }
}

// === impl Response ===

/// One HTTP answer as it arrived.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Trailer fields of a chunked answer.
    pub trailers: Vec<(String, String)>,
}

impl Response {
    /// The first value of a header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.all(name).into_iter().next()
    }

    /// Every value of a header, one per line it arrived on, in order.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// Whether the answer says the connection closes after it.
    pub fn closes(&self) -> bool {
        self.all("Connection")
            .iter()
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("close"))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON, panicking with the answer when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("answer body is not JSON ({e}): {self}"))
    }

    /// The media type of `Content-Type`, lower-cased, without parameters.
    pub fn media_type(&self) -> String {
        self.header("Content-Type")
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    }
}

impl std::fmt::Display for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "HTTP {}", self.status)?;
        for (n, v) in &self.headers {
            writeln!(f, "{n}: {v}")?;
        }
        let body = String::from_utf8_lossy(&self.body);
        let cut: String = body.chars().take(2000).collect();
        write!(f, "\n{cut}")
    }
}

// === impl Connection ===

/// One client connection, read with a buffer so answers can follow each other.
pub struct Connection {
    stream: TcpStream,
    buf: Vec<u8>,
    eof: bool,
}

impl Connection {
    /// Connects with 15 s read and write timeouts.
    pub fn open(addr: SocketAddr) -> Connection {
        let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .expect("set read timeout");
        stream
            .set_write_timeout(Some(IO_TIMEOUT))
            .expect("set write timeout");
        let _ = stream.set_nodelay(true);
        Connection {
            stream,
            buf: Vec::new(),
            eof: false,
        }
    }

    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// A second handle on the socket, for a writer thread.
    pub fn writer(&self) -> TcpStream {
        self.stream.try_clone().expect("clone the socket")
    }

    /// Sets the read timeout for what follows.
    pub fn set_read_timeout(&self, t: Duration) {
        self.stream
            .set_read_timeout(Some(t))
            .expect("set read timeout");
    }

    fn fill(&mut self) -> io::Result<bool> {
        if self.eof {
            return Ok(false);
        }
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            self.eof = true;
            return Ok(false);
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(true)
    }

    fn unexpected_end(what: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("connection ended in {what}"),
        )
    }

    /// Reads up to and including the next CRLF.
    fn line(&mut self) -> io::Result<String> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..i + 2).collect();
                return Ok(String::from_utf8_lossy(&line[..i]).into_owned());
            }
            if !self.fill()? {
                return Err(Self::unexpected_end("a line"));
            }
        }
    }

    fn exact(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill()? {
                return Err(Self::unexpected_end("a body"));
            }
        }
        Ok(self.buf.drain(..n).collect())
    }

    fn fields(&mut self) -> io::Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        loop {
            let line = self.line()?;
            if line.is_empty() {
                return Ok(out);
            }
            let (n, v) = line
                .split_once(':')
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, line.clone()))?;
            out.push((n.trim().to_string(), v.trim().to_string()));
        }
    }

    /// Reads one final answer (interim 1xx answers other than 101 are skipped).
    /// `head` says the request was HEAD, whose answer has no body.
    pub fn read_response(&mut self, head: bool) -> io::Result<Response> {
        loop {
            let status_line = self.line()?;
            let mut parts = status_line.splitn(3, ' ');
            let version = parts.next().unwrap_or("");
            let status: u16 = parts
                .next()
                .and_then(|s| s.parse().ok())
                .filter(|_| version.starts_with("HTTP/1."))
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, status_line.clone()))?;
            let headers = self.fields()?;
            let mut resp = Response {
                status,
                headers,
                body: Vec::new(),
                trailers: Vec::new(),
            };
            if (100..200).contains(&status) && status != 101 {
                continue;
            }
            if head || status == 101 || status == 204 || status == 304 {
                return Ok(resp);
            }
            let chunked = resp
                .all("Transfer-Encoding")
                .iter()
                .any(|v| v.to_ascii_lowercase().contains("chunked"));
            if chunked {
                loop {
                    let size_line = self.line()?;
                    let size =
                        usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                            .map_err(|_| {
                                io::Error::new(io::ErrorKind::InvalidData, size_line.clone())
                            })?;
                    if size == 0 {
                        resp.trailers = self.fields()?;
                        return Ok(resp);
                    }
                    let data = self.exact(size)?;
                    resp.body.extend_from_slice(&data);
                    self.exact(2)?;
                }
            }
            if let Some(len) = resp.header("Content-Length") {
                let len: usize = len
                    .parse()
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, len.to_string()))?;
                resp.body = self.exact(len)?;
                return Ok(resp);
            }
            while self.fill()? {}
            resp.body = std::mem::take(&mut self.buf);
            return Ok(resp);
        }
    }

    /// Whether the server ends the connection within `within`: reads (and discards)
    /// until end of stream or reset. `false` when it is still open at the deadline.
    pub fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        self.buf.clear();
        loop {
            if self.eof {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.set_read_timeout(left);
            match self.fill() {
                Ok(_) => self.buf.clear(),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return false;
                }
                Err(_) => return true,
            }
        }
    }
}
