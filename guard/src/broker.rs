//! The guard's side of the link to the broker ([`crate::link`]): one HTTP/2 connection over
//! the broker's guard socket, shared by every request and opened again when it breaks (a
//! broker that restarts costs the requests in flight at that moment, nothing more). A live
//! lookup is reused for a moment ([`crate::live`]); the call itself is always the broker's.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::UnixStream;

use crate::link;
use crate::live::LiveTokens;
use crate::token::TokenHash;

/// Bound on a lookup, connecting included.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer body the link reads: the broker's 4 MiB plus room for its messages.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024 + 64 * 1024;

/// Why the broker could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The guard socket could not be reached.
    #[error("broker guard socket {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP/2 exchange failed.
    #[error("broker guard socket: {0}")]
    Exchange(#[from] hyper::Error),
    /// The answer body was unreadable or too large.
    #[error("broker guard socket: the answer body could not be read")]
    Body,
    /// No answer in time.
    #[error("broker guard socket: no answer within {0:?}")]
    Timeout(Duration),
    /// The request could not be built (a bug; never the guest's input).
    #[error("broker guard socket: request not built: {0}")]
    Build(#[from] http::Error),
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The token serves a run now.
    Live,
    /// Unknown, ended, or a session slot with nothing lent.
    Unknown,
}

/// What a call came back with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallAnswer {
    /// The token stopped being live before the call.
    Unknown,
    /// The broker could not decode the envelope.
    BadEnvelope,
    /// The call's answer, to relay.
    Relay {
        /// The status.
        status: u16,
        /// The `Content-Type`, if any.
        content_type: Option<http::HeaderValue>,
        /// The body.
        body: Bytes,
    },
}

/// The link to the broker.
pub struct BrokerLink {
    socket: PathBuf,
    sender: tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>,
    live: LiveTokens,
}

// === impl BrokerLink ===

impl BrokerLink {
    /// A link to the guard socket at `socket`; connects on first use.
    pub fn new(socket: impl Into<PathBuf>) -> BrokerLink {
        BrokerLink {
            socket: socket.into(),
            sender: tokio::sync::Mutex::new(None),
            live: LiveTokens::default(),
        }
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Whether `hash` names a live token now.
    pub async fn lookup(&self, hash: &TokenHash) -> Result<Lookup, LinkError> {
        if self.live.recently_live(hash, Instant::now()) {
            return Ok(Lookup::Live);
        }
        let ask = async {
            // Idempotent: one retry on a fresh connection if the kept one broke.
            let first = self.lookup_once(hash).await;
            match first {
                Err(LinkError::Exchange(_)) => self.lookup_once(hash).await,
                other => other,
            }
        };
        let found = tokio::time::timeout(LOOKUP_TIMEOUT, ask)
            .await
            .map_err(|_| LinkError::Timeout(LOOKUP_TIMEOUT))??;
        if found == Lookup::Live {
            self.live.remember(*hash, Instant::now());
        }
        Ok(found)
    }

    async fn lookup_once(&self, hash: &TokenHash) -> Result<Lookup, LinkError> {
        let request = request(Method::GET, link::LOOKUP_PATH, hash, Bytes::new())?;
        let (status, verdict, _, _) = self.exchange(request).await?;
        Ok(match (status, verdict.as_deref()) {
            (StatusCode::NO_CONTENT, None) => Lookup::Live,
            _ => Lookup::Unknown,
        })
    }

    /// Makes one call with `envelope` (already decoded once by the guard, sent as received).
    pub async fn call(&self, hash: &TokenHash, envelope: Bytes) -> Result<CallAnswer, LinkError> {
        let request = request(Method::POST, link::CALL_PATH, hash, envelope)?;
        let (status, verdict, content_type, body) = self.exchange(request).await?;
        Ok(match verdict.as_deref() {
            Some(link::UNKNOWN_TOKEN) => {
                self.live.forget(hash);
                CallAnswer::Unknown
            }
            Some(link::BAD_ENVELOPE) => CallAnswer::BadEnvelope,
            _ => CallAnswer::Relay {
                status: status.as_u16(),
                content_type,
                body,
            },
        })
    }

    async fn exchange(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, Option<String>, Option<http::HeaderValue>, Bytes), LinkError> {
        let mut sender = self.sender().await?;
        let answer = match sender.send_request(request).await {
            Ok(answer) => answer,
            Err(error) => {
                self.forget(&sender).await;
                return Err(error.into());
            }
        };
        let (parts, body) = answer.into_parts();
        let verdict = parts
            .headers
            .get(link::VERDICT)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let content_type = parts.headers.get(CONTENT_TYPE).cloned();
        let body = Limited::new(body, MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|_| LinkError::Body)?
            .to_bytes();
        Ok((parts.status, verdict, content_type, body))
    }

    /// The live connection's sender, connecting when there is none or it closed.
    async fn sender(&self) -> Result<SendRequest<Full<Bytes>>, LinkError> {
        let mut kept = self.sender.lock().await;
        if let Some(sender) = kept.as_ref()
            && !sender.is_closed()
        {
            return Ok(sender.clone());
        }
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| LinkError::Connect {
                    path: self.socket.clone(),
                    source,
                })?;
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(4 * 1024 * 1024)
            .initial_connection_window_size(16 * 1024 * 1024)
            .max_concurrent_reset_streams(1024)
            .handshake(TokioIo::new(stream))
            .await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "broker link closed");
            }
        });
        *kept = Some(sender.clone());
        Ok(sender)
    }

    /// Drops the kept connection if it is still `broken`'s.
    async fn forget(&self, broken: &SendRequest<Full<Bytes>>) {
        let mut kept = self.sender.lock().await;
        if kept
            .as_ref()
            .is_some_and(|s| s.is_closed() || broken.is_closed())
        {
            *kept = None;
        }
    }
}

fn request(
    method: Method,
    path: &str,
    hash: &TokenHash,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, http::Error> {
    Request::builder()
        .method(method)
        .uri(format!("http://broker{path}"))
        .header(link::TOKEN_SHA256, hash.to_hex())
        .body(Full::new(body))
}
