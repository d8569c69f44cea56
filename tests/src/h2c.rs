//! Prior-knowledge HTTP/2 over cleartext (h2c) through hyper's client.
//!
//! Synchronous on the outside: each call builds a small runtime, so tests stay plain
//! `#[test]` functions. Every exchange is bounded by [`H2_TIMEOUT`].

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// The bound on one h2c exchange, connection included.
pub const H2_TIMEOUT: Duration = Duration::from_secs(20);

/// One HTTP/2 answer: status, headers, the whole body and its trailers.
#[derive(Debug)]
pub struct H2Response {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl H2Response {
    /// A header's value from the headers, else from the trailers (a gRPC
    /// trailers-only answer puts `grpc-status` in the headers).
    pub fn field(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .or_else(|| self.trailers.as_ref().and_then(|t| t.get(name)))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

/// POSTs `body` to `path` over a fresh h2c connection with `headers`.
pub fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> H2Response {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build a runtime");
    rt.block_on(async {
        tokio::time::timeout(H2_TIMEOUT, exchange(addr, path, headers, body))
            .await
            .unwrap_or_else(|_| panic!("h2c POST {path} took longer than {H2_TIMEOUT:?}"))
    })
}

async fn exchange(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> H2Response {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2c handshake (prior knowledge)");
    let driver = tokio::spawn(conn);
    let mut req = Request::post(format!("http://{addr}{path}"));
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .expect("a valid request");
    let resp = sender
        .send_request(req)
        .await
        .expect("h2c request answered");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let collected = resp
        .into_body()
        .collect()
        .await
        .expect("h2c body read to the end");
    let trailers = collected.trailers().cloned();
    let body = collected.to_bytes();
    drop(sender);
    driver.abort();
    H2Response {
        status,
        headers,
        body,
        trailers,
    }
}
