//! Response and body helpers shared by the listeners, and the accept loop that serves one.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use http::{HeaderValue, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, LengthLimitError, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Every response body: whole, empty or streamed; an error aborts the stream (HTTP/1.1
/// closes the connection, HTTP/2 resets the stream), which is how a dying VM looks.
pub type Body = BoxBody<Bytes, io::Error>;
pub type Response = http::Response<Body>;
pub type Request = http::Request<Incoming>;

pub fn full(status: StatusCode, content_type: Option<&str>, bytes: impl Into<Bytes>) -> Response {
    let mut response = http::Response::new(
        Full::new(bytes.into())
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    if let Some(ct) = content_type
        && let Ok(value) = HeaderValue::from_str(ct)
    {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}

pub fn empty(status: StatusCode) -> Response {
    let mut response = http::Response::new(
        Empty::new()
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
}

/// A JSON body with Go's `application/json; charset=utf-8` (gin and envd both send that).
pub fn json(status: StatusCode, value: &impl Serialize) -> Response {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    full(status, Some("application/json; charset=utf-8"), bytes)
}

/// Go's `http.Error`: plain text with a newline.
pub fn text(status: StatusCode, message: &str) -> Response {
    let mut response = full(
        status,
        Some("text/plain; charset=utf-8"),
        format!("{message}\n"),
    );
    response.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// A body fed frame by frame from a sender; dropping the sender ends it cleanly, sending an
/// `Err` aborts it.
pub fn channel(capacity: usize) -> (BodySender, Body) {
    let (tx, rx) = mpsc::channel(capacity);
    let body = StreamBody::new(rx.map(|item: Result<Bytes, io::Error>| item.map(Frame::data)));
    (BodySender(tx), BodyExt::boxed(body))
}

/// The feeding end of [`channel`].
#[derive(Debug, Clone)]
pub struct BodySender(mpsc::Sender<Result<Bytes, io::Error>>);

impl BodySender {
    /// Sends bytes; `false` when the client is gone.
    pub async fn send(&mut self, bytes: Bytes) -> bool {
        self.0.send(Ok(bytes)).await.is_ok()
    }

    /// Ends the body with an error: the connection (or HTTP/2 stream) is dropped.
    pub async fn abort(&mut self, why: &str) {
        let _ = self.0.send(Err(io::Error::other(why.to_owned()))).await;
    }

    /// Whether the client has gone away.
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("request body is over {0} bytes")]
    TooLarge(usize),
    #[error("request body: {0}")]
    Read(String),
}

/// The whole body, at most `limit` bytes.
pub async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, BodyError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(BodyError::TooLarge(limit)),
        Err(e) => Err(BodyError::Read(e.to_string())),
    }
}

/// A query string's decoded `name=value` pairs.
pub fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(name), percent_decode(value))
        })
        .collect()
}

/// The first value of `name` in a query.
pub fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    query_pairs(query)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
}

/// Go's `url.QueryUnescape`: `+` is a space, `%XX` a byte; a bad escape is an error.
pub fn query_unescape(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        format!("invalid URL escape {:?}", &text[i..text.len().min(i + 3)])
                    })?;
                out.push(hex);
                i += 2;
            }
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| "escaped text is not UTF-8".to_owned())
}

fn percent_decode(text: &str) -> String {
    query_unescape(text).unwrap_or_else(|_| text.to_owned())
}

/// Serves `handler` on `listener` (HTTP/1.1 and h2c) until `shutdown` turns true.
pub async fn serve<H, F>(listener: TcpListener, handler: H, mut shutdown: watch::Receiver<bool>)
where
    H: Fn(Request, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = Response> + Send + 'static,
{
    let handler = Arc::new(handler);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        let Ok((stream, peer)) = accepted else {
            // Out of descriptors, most likely: give connections time to close.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        // E2B's services are Go, whose TCP connections never delay small writes (Nagle off):
        // with it on, each frame of a streamed answer after the first waits for the client's
        // delayed ACK, tens of milliseconds no real E2B answer has.
        let _ = stream.set_nodelay(true);
        let handler = Arc::clone(&handler);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let handler = Arc::clone(&handler);
                async move { Ok::<_, Infallible>(handler(request, peer).await) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_unescape_is_gos() {
        assert_eq!(query_unescape("a%20b+c").as_deref(), Ok("a b c"));
        assert!(query_unescape("bad%zz").is_err());
        assert!(query_unescape("cut%2").is_err());
    }
}
