//! Body and header limits (wire.md §1.3, config.md §5): the 8 MiB cap on the declared
//! length, on a chunked body and on the decompressed message, and what happens to the
//! connection when an answer is written before the body was read.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flate2::Compression;
use flate2::write::GzEncoder;
use plimsoll_tests::Daemon;
use plimsoll_tests::connect::{
    self, BODY_CAP, ConnectError, NOT_DISPATCHED, REQUEST_ID, Reason, SERVICE_PREFIX, assert_bound,
    assert_disabled,
};
use plimsoll_tests::http1::{Connection, Response};

/// The head of a Connect JSON `Run` call with `framing` as its length header line.
fn run_head(addr: SocketAddr, id: &str, framing: &str) -> Vec<u8> {
    format!(
        "POST {SERVICE_PREFIX}Run HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Connect-Protocol-Version: 1\r\nAccept-Encoding: identity\r\n{REQUEST_ID}: {id}\r\n{framing}\r\n\r\n"
    )
    .into_bytes()
}

/// Writes `chunks` on a second handle in a thread (ignoring a server that stops
/// reading), so the answer can be read while the body is still going out.
fn write_in_background(
    stream: TcpStream,
    chunks: Vec<Vec<u8>>,
    pause: Duration,
) -> JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut stream = stream;
        let mut sent = 0;
        for chunk in chunks {
            if stream.write_all(&chunk).is_err() {
                break;
            }
            sent += chunk.len();
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
        }
        sent
    })
}

/// A JSON `Run` body of exactly `len` bytes: a valid snippet request padded with spaces.
fn padded_run_body(len: usize) -> Vec<u8> {
    let mut body = connect::javascript("1").to_string().into_bytes();
    assert!(len >= body.len());
    body.resize(len, b' ');
    body
}

/// One chunk of a chunked body.
fn chunk(data: &[u8]) -> Vec<u8> {
    [format!("{:x}\r\n", data.len()).as_bytes(), data, b"\r\n"].concat()
}

fn assert_oversized_refusal(resp: &Response, id: &str) {
    assert_eq!(resp.status, 429, "{resp}");
    assert_eq!(ConnectError::of(resp).code, "resource_exhausted", "{resp}");
    assert_eq!(resp.all(REQUEST_ID), vec![id], "{resp}");
    assert_eq!(resp.all(NOT_DISPATCHED), vec!["request"], "{resp}");
}

#[test]
fn declared_length_over_the_cap_is_refused_from_the_header_alone() {
    let d = Daemon::open();
    let id = connect::request_id();
    let mut conn = Connection::open(d.addr);
    let started = Instant::now();
    conn.send(&run_head(
        d.addr,
        &id,
        &format!("Content-Length: {}", BODY_CAP + 1),
    ))
    .unwrap();
    conn.set_read_timeout(Duration::from_secs(5));
    let resp = conn
        .read_response(false)
        .expect("answered before any body byte");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
    assert_oversized_refusal(&resp, &id);
    assert_eq!(
        ConnectError::of(&resp).not_dispatched(),
        Some(Reason::Request.detail_bytes()),
        "{resp}"
    );
    assert!(
        resp.closes(),
        "the body is unread: Connection: close\n{resp}"
    );
    assert!(
        conn.closed_within(Duration::from_secs(3)),
        "the server closes the connection"
    );
}

#[test]
fn refusal_closes_the_connection_even_while_the_body_trickles() {
    let d = Daemon::open();
    let id = connect::request_id();
    let mut conn = Connection::open(d.addr);
    conn.send(&run_head(
        d.addr,
        &id,
        &format!("Content-Length: {}", BODY_CAP + 1024),
    ))
    .unwrap();
    let resp = conn.read_response(false).unwrap();
    assert_oversized_refusal(&resp, &id);
    // 1 KiB every 50 ms for at most 10 s: the server discards for about 500 ms, then
    // closes; it never drains the slow body.
    let writer = write_in_background(
        conn.writer(),
        vec![vec![b' '; 1024]; 200],
        Duration::from_millis(50),
    );
    let started = Instant::now();
    assert!(
        conn.closed_within(Duration::from_secs(4)),
        "still open after {:?}",
        started.elapsed()
    );
    drop(writer);
}

#[test]
fn body_of_exactly_the_cap_is_read() {
    let d = Daemon::open();
    let id = connect::request_id();
    let mut conn = Connection::open(d.addr);
    conn.send(&run_head(
        d.addr,
        &id,
        &format!("Content-Length: {BODY_CAP}"),
    ))
    .unwrap();
    let body = padded_run_body(BODY_CAP);
    let chunks: Vec<Vec<u8>> = body.chunks(256 * 1024).map(<[u8]>::to_vec).collect();
    let writer = write_in_background(conn.writer(), chunks, Duration::ZERO);
    let resp = conn.read_response(false).unwrap();
    let sent = writer.join().unwrap();
    assert_eq!(sent, BODY_CAP);
    assert_disabled(&resp, &id);
}

#[test]
fn chunked_body_over_the_cap_is_cut() {
    let d = Daemon::open();
    let id = connect::request_id();
    let mut conn = Connection::open(d.addr);
    conn.send(&run_head(d.addr, &id, "Transfer-Encoding: chunked"))
        .unwrap();
    let piece = vec![b'a'; 64 * 1024];
    let mut chunks = vec![chunk(br#"{"protocol":4,"javascript":{"code":""#)];
    for _ in 0..(BODY_CAP / piece.len() + 16) {
        chunks.push(chunk(&piece));
    }
    chunks.push(chunk(br#""}}"#));
    chunks.push(b"0\r\n\r\n".to_vec());
    let writer = write_in_background(conn.writer(), chunks, Duration::ZERO);
    let resp = conn
        .read_response(false)
        .expect("an answer to the oversized chunked body");
    assert_oversized_refusal(&resp, &id);
    drop(writer);
}

#[test]
fn small_chunked_body_is_accepted() {
    let d = Daemon::open();
    let id = connect::request_id();
    let mut conn = Connection::open(d.addr);
    let body = connect::javascript("1").to_string();
    let (a, b) = body.split_at(10);
    let bytes = [
        run_head(d.addr, &id, "Transfer-Encoding: chunked"),
        chunk(a.as_bytes()),
        chunk(b.as_bytes()),
        b"0\r\n\r\n".to_vec(),
    ]
    .concat();
    conn.send(&bytes).unwrap();
    let resp = conn.read_response(false).unwrap();
    assert_disabled(&resp, &id);
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::best());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

#[test]
fn gzip_request_within_the_cap_is_decoded() {
    let d = Daemon::open();
    let req = connect::call("Run", &serde_json::json!({}))
        .header("Content-Encoding", "gzip")
        .body(gzip(
            connect::javascript("console.log(1)").to_string().as_bytes(),
        ));
    assert_disabled(&req.send(d.addr), &req);
}

#[test]
fn gzip_bomb_is_refused_at_the_decoded_cap() {
    let d = Daemon::open();
    let body = connect::javascript(&"a".repeat(BODY_CAP + 1024 * 1024)).to_string();
    let compressed = gzip(body.as_bytes());
    assert!(
        compressed.len() < 64 * 1024,
        "the bomb is small on the wire"
    );
    let req = connect::call("Run", &serde_json::json!({}))
        .header("Content-Encoding", "gzip")
        .body(compressed);
    let resp = req.send(d.addr);
    assert_eq!(resp.status, 429, "{resp}");
    assert_eq!(ConnectError::of(&resp).code, "resource_exhausted", "{resp}");
    assert_bound(&resp, &req);
    assert_eq!(resp.all(NOT_DISPATCHED), vec!["request"], "{resp}");
}

#[test]
fn oversized_header_block_is_a_client_error() {
    let d = Daemon::open();
    let resp = connect::call("Describe", &serde_json::json!({}))
        .header("X-Padding", &"p".repeat(40 * 1024))
        .send(d.addr);
    assert!((400..500).contains(&resp.status), "{resp}");
}

#[test]
fn header_block_under_32_kib_is_served() {
    let d = Daemon::open();
    let resp = connect::call("Describe", &serde_json::json!({}))
        .header("X-Padding", &"p".repeat(24 * 1024))
        .send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
}

/// A body that cannot be read (here a malformed chunk) is the caller's fault on every
/// procedure: `invalid_argument`, marked `request`, never the Connect service's internal
/// error (it was a 500 on `Describe`, `OpenSession` and `CloseSession`, whose bodies no
/// earlier step read).
#[test]
fn a_body_that_cannot_be_read_is_invalid_argument_on_every_procedure() {
    let d = Daemon::open();
    for procedure in [
        "Describe",
        "OpenSession",
        "CloseSession",
        "SessionRun",
        "Run",
    ] {
        let id = connect::request_id();
        let mut conn = Connection::open(d.addr);
        let head = format!(
            "POST {SERVICE_PREFIX}{procedure} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Connect-Protocol-Version: 1\r\nAccept-Encoding: identity\r\n{REQUEST_ID}: {id}\r\n\
             Transfer-Encoding: chunked\r\n\r\n",
            d.addr
        );
        let bytes = [head.as_bytes(), &chunk(b"{}"), b"zz\r\n"].concat();
        conn.send(&bytes).unwrap();
        let resp = conn.read_response(false).unwrap();
        assert_eq!(resp.status, 400, "{procedure}: {resp}");
        assert_eq!(
            ConnectError::of(&resp).code,
            "invalid_argument",
            "{procedure}: {resp}"
        );
        assert_eq!(
            resp.all(NOT_DISPATCHED),
            vec!["request"],
            "{procedure}: {resp}"
        );
        assert_eq!(
            resp.all(REQUEST_ID),
            vec![id.as_str()],
            "{procedure}: {resp}"
        );
    }
}
