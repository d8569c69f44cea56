//! One unary Connect call with the JSON codec, on a connection of its own.
//!
//! Why not `connectrpc`'s generated client: the answer-binding rules (wire.md §3) need the
//! raw answer — every `Plimsoll-Request-Id` value it carries, the `Plimsoll-Not-Dispatched`
//! header of a refusal written before any handler, the error body's binary details, and the
//! HTTP status of an answer that is not a Connect answer at all. So each call is written
//! here, over hyper's connection API:
//!
//! - a fresh 16-byte request id per call, sent as 32 lowercase hex, and required back exactly
//!   once on the answer;
//! - one connection per call, closed afterwards, like the Python client; HTTP/1.1 or
//!   prior-knowledge HTTP/2 in cleartext, ALPN (`h2`, `http/1.1`) over TLS;
//! - no redirects followed, no proxy variables read;
//! - the client's timeout bounds the whole exchange, from name lookup to the last byte;
//! - answers over 32 MiB are refused;
//! - a failure before any byte of the request could leave (connect, TLS handshake) is marked
//!   `environment`; one after that is unmarked, since the daemon may have run it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::endpoint::Endpoint;
use super::error::{ClientError, Failure};
use super::restore::{NOT_BOUND, error_from_wire};
use crate::refusal::Reason;
use crate::wire::SERVICE_NAME;

/// The header that binds an answer to its request.
pub const REQUEST_ID_HEADER: &str = "plimsoll-request-id";
/// The header that marks an answer written before any procedure's handler.
pub const NOT_DISPATCHED_HEADER: &str = "plimsoll-not-dispatched";
/// The largest answer this client reads: 32 MiB.
pub const MAX_RESPONSE_BYTES: usize = 32 << 20;

/// How the connection is made.
#[derive(Clone)]
pub(crate) struct Transport {
    pub(crate) endpoint: Endpoint,
    pub(crate) token: Option<String>,
    pub(crate) timeout: Duration,
    /// Cleartext only: speak prior-knowledge HTTP/2 (h2c) instead of HTTP/1.1.
    pub(crate) http2: bool,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

/// The raw answer: status, headers, body.
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
}

/// Where an exchange failed: before anything could be sent, or after.
struct Broken {
    sent: bool,
    kind: BrokenKind,
    message: String,
}

enum BrokenKind {
    Io,
    TooLarge,
}

impl Transport {
    /// POSTs `body` to `method` and decodes the answer as `R`, applying the binding rules.
    pub(crate) async fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        body: &B,
    ) -> Result<R, ClientError> {
        let data = serde_json::to_vec(body).map_err(|e| {
            super::error::invalid(format!(
                "{method}: the request does not encode as JSON: {e}"
            ))
        })?;
        let request_id = hex::encode(rand::random::<[u8; 16]>());
        let sent = AtomicBool::new(false);
        let exchange = self.exchange(method, Bytes::from(data), &request_id, &sent);
        let answer = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(broken)) => return Err(self.broken(method, broken)),
            Err(_) => {
                let was_sent = sent.load(Ordering::SeqCst);
                let mut f = Failure::new(
                    "deadline_exceeded",
                    format!(
                        "plimsoll: {method} did not finish within {:?}{}",
                        self.timeout,
                        if was_sent { "" } else { " (nothing was sent)" }
                    ),
                );
                if !was_sent {
                    f = f.marked(Reason::Environment);
                }
                return Err(ClientError::Timeout(Box::new(f)));
            }
        };
        let ids: Vec<&HeaderValue> = answer.headers.get_all(REQUEST_ID_HEADER).iter().collect();
        let bound = ids.len() == 1 && ids[0].as_bytes() == request_id.as_bytes();
        if answer.status != 200 {
            let mark = answer
                .headers
                .get(NOT_DISPATCHED_HEADER)
                .and_then(|v| v.to_str().ok());
            return Err(error_from_wire(answer.status, &answer.body, bound, mark));
        }
        if !bound {
            return Err(ClientError::AnswerNotBound(Box::new(Failure {
                answer_not_bound: true,
                http_status: Some(200),
                ..Failure::new(
                    "data_loss",
                    format!("plimsoll: {method}: {NOT_BOUND}; the call may have run"),
                )
            })));
        }
        let ctype = answer
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let ctype = ctype
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if ctype != "application/json" {
            return Err(malformed(format!(
                "plimsoll: {method} answered with content type {ctype:?}, not application/json"
            )));
        }
        serde_json::from_slice(&answer.body).map_err(|e| {
            malformed(format!(
                "plimsoll: {method}: the answer is not a well-formed message: {e}"
            ))
        })
    }

    fn broken(&self, method: &str, b: Broken) -> ClientError {
        match b.kind {
            BrokenKind::TooLarge => ClientError::ResponseTooLarge(Box::new(Failure::new(
                "resource_exhausted",
                format!("plimsoll: {method}: {}", b.message),
            ))),
            BrokenKind::Io => {
                let mut f = Failure::new(
                    "unavailable",
                    format!(
                        "plimsoll: {method}: {}{}",
                        b.message,
                        if b.sent { "" } else { " (nothing was sent)" }
                    ),
                );
                if !b.sent {
                    f = f.marked(Reason::Environment);
                }
                ClientError::Transport(Box::new(f))
            }
        }
    }

    fn request(
        &self,
        method: &str,
        body: Bytes,
        request_id: &str,
        h2: bool,
    ) -> Result<http::Request<Full<Bytes>>, Broken> {
        let path = format!("{}/{SERVICE_NAME}/{method}", self.endpoint.prefix);
        let uri = if h2 {
            format!(
                "{}://{}{path}",
                self.endpoint.scheme(),
                self.endpoint.authority
            )
        } else {
            path
        };
        let mut builder = http::Request::post(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .header("connect-protocol-version", "1")
            .header(header::ACCEPT_ENCODING, "identity")
            .header(
                header::USER_AGENT,
                concat!("plimsoll-client-rust/", env!("CARGO_PKG_VERSION")),
            )
            .header(REQUEST_ID_HEADER, request_id);
        if !h2 {
            builder = builder.header(header::HOST, &self.endpoint.authority);
        }
        if let Some(token) = &self.token {
            builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        builder.body(Full::new(body)).map_err(|e| Broken {
            sent: false,
            kind: BrokenKind::Io,
            message: format!("the request cannot be written: {e}"),
        })
    }

    async fn exchange(
        &self,
        method: &str,
        body: Bytes,
        request_id: &str,
        sent: &AtomicBool,
    ) -> Result<Answer, Broken> {
        let unsent = |message: String| Broken {
            sent: false,
            kind: BrokenKind::Io,
            message,
        };
        let tcp = TcpStream::connect((self.endpoint.host.as_str(), self.endpoint.port))
            .await
            .map_err(|e| unsent(format!("connect to {}: {e}", self.endpoint.authority)))?;
        // Best effort: a socket without TCP_NODELAY still works, only slower.
        let _ = tcp.set_nodelay(true);
        #[cfg(feature = "tls")]
        if self.endpoint.https {
            let Some(config) = self.tls.clone() else {
                return Err(unsent("https needs TLS settings".to_owned()));
            };
            let name = rustls::pki_types::ServerName::try_from(self.endpoint.host.clone())
                .map_err(|e| unsent(format!("TLS server name {:?}: {e}", self.endpoint.host)))?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| {
                    unsent(format!(
                        "TLS handshake with {}: {e}",
                        self.endpoint.authority
                    ))
                })?;
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            let req = self.request(method, body, request_id, h2)?;
            return send(tls, h2, req, sent).await;
        }
        if self.endpoint.https {
            return Err(unsent(
                "https needs the `tls` feature of the plimsoll crate".to_owned(),
            ));
        }
        let req = self.request(method, body, request_id, self.http2)?;
        send(tcp, self.http2, req, sent).await
    }
}

fn malformed(message: String) -> ClientError {
    ClientError::MalformedResponse(Box::new(Failure::new("internal", message)))
}

/// Sends `req` over `io` and reads the whole answer, at most [`MAX_RESPONSE_BYTES`].
async fn send<IO>(
    io: IO,
    h2: bool,
    req: http::Request<Full<Bytes>>,
    sent: &AtomicBool,
) -> Result<Answer, Broken>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(io);
    let after = |message: String| Broken {
        sent: true,
        kind: BrokenKind::Io,
        message,
    };
    let refused = |what: &'static str| {
        move |e: hyper::Error| Broken {
            sent: false,
            kind: BrokenKind::Io,
            message: format!("{what} handshake: {e}"),
        }
    };
    // The connection's driver runs until the answer's body is read, then is stopped.
    let (response, driver) = if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(refused("HTTP/2"))?;
        let driver = tokio::spawn(conn);
        sent.store(true, Ordering::SeqCst);
        (sender.send_request(req).await, driver)
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(refused("HTTP/1.1"))?;
        let driver = tokio::spawn(conn);
        sent.store(true, Ordering::SeqCst);
        (sender.send_request(req).await, driver)
    };
    let out = answer(response, after).await;
    driver.abort();
    out
}

/// The answer to a sent request, or the failure after sending it.
async fn answer(
    result: Result<http::Response<hyper::body::Incoming>, hyper::Error>,
    after: impl FnOnce(String) -> Broken,
) -> Result<Answer, Broken> {
    match result {
        Ok(resp) => read(resp).await,
        Err(e) => Err(after(format!("{e}"))),
    }
}

async fn read(resp: http::Response<hyper::body::Incoming>) -> Result<Answer, Broken> {
    let (parts, body) = resp.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let too_large = |message: String| Broken {
        sent: true,
        kind: BrokenKind::TooLarge,
        message,
    };
    if declared.is_some_and(|n| n > MAX_RESPONSE_BYTES as u64) {
        return Err(too_large(format!(
            "the daemon's answer is {} bytes, over the {MAX_RESPONSE_BYTES} byte limit",
            declared.unwrap_or_default()
        )));
    }
    let collected = Limited::new(body, MAX_RESPONSE_BYTES).collect().await;
    let body = match collected {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(too_large(format!(
                "the daemon's answer exceeds {MAX_RESPONSE_BYTES} bytes"
            )));
        }
        Err(e) => {
            return Err(Broken {
                sent: true,
                kind: BrokenKind::Io,
                message: format!("reading the answer: {e}"),
            });
        }
    };
    Ok(Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    })
}
