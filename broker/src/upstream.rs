//! The one way calls leave the broker: HTTP/1.1 over TCP (TLS unless the origin is plain
//! http on loopback), one connection per call.
//!
//! Nothing here reads proxy variables, follows redirects or rewrites the target: the
//! request line carries exactly the target the checks approved. Headers are built from
//! scratch (`spec/grants.md` §2.3); only the status, a sanitised `Content-Type`, the body
//! and `Retry-After` (for the breaker) come back.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, RETRY_AFTER};
use http::{Method, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::credential::Credential;
use crate::grants::Origin;

/// Largest response body passed back to the guest.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;
/// Bound on one upstream call, headers and body (never past the run's deadline).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the upstream client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamSetupError {
    /// The extra CA file could not be read.
    #[error("{path}: {source}")]
    CaFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The extra CA file held no usable certificate.
    #[error("{path}: no usable PEM certificate")]
    CaEmpty {
        /// The file.
        path: String,
    },
}

/// Why one upstream call failed: every case is a 502 for the guest.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Connect, TLS or HTTP failure.
    #[error("transport: {0}")]
    Transport(String),
    /// No complete answer in time.
    #[error("timed out")]
    Timeout,
    /// A status outside 100–599.
    #[error("status {0} out of range")]
    BadStatus(u16),
    /// Body over [`MAX_RESPONSE_BYTES`] or unreadable; the upstream status is kept.
    #[error("response body refused (upstream status {status})")]
    Body {
        /// The upstream's status.
        status: u16,
    },
}

/// An upstream answer.
#[derive(Debug, Clone)]
pub struct UpstreamReply {
    /// 100–599.
    pub status: u16,
    /// Sanitised `Content-Type`.
    pub content_type: String,
    /// `Retry-After`, if any and printable.
    pub retry_after: Option<String>,
    /// At most [`MAX_RESPONSE_BYTES`].
    pub body: Bytes,
}

/// The shared client: TLS roots and nothing else.
#[derive(Clone)]
pub struct Upstream {
    tls: TlsConnector,
}

// === impl Upstream ===

impl Upstream {
    /// Trusts the webpki roots plus, when given, every certificate in `extra_ca` (PEM).
    pub fn new(extra_ca: Option<&Path>) -> Result<Self, UpstreamSetupError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(path) = extra_ca {
            let shown = path.display().to_string();
            let pem = std::fs::read(path).map_err(|source| UpstreamSetupError::CaFile {
                path: shown.clone(),
                source,
            })?;
            let mut added = 0;
            for cert in rustls_pemfile::certs(&mut pem.as_slice()).flatten() {
                if roots.add(cert).is_ok() {
                    added += 1;
                }
            }
            if added == 0 {
                return Err(UpstreamSetupError::CaEmpty { path: shown });
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|_| UpstreamSetupError::CaEmpty {
                path: "(protocol versions)".into(),
            })?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            tls: TlsConnector::from(Arc::new(config)),
        })
    }

    /// Sends one call; `target` has passed the route checks and goes on the wire as is.
    pub async fn send(
        &self,
        origin: &Origin,
        method: &str,
        target: &str,
        body: Bytes,
        credential: Option<&Credential>,
        timeout: Duration,
    ) -> Result<UpstreamReply, UpstreamError> {
        let timeout = timeout.min(CALL_TIMEOUT);
        match tokio::time::timeout(
            timeout,
            self.exchange(origin, method, target, body, credential),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(UpstreamError::Timeout),
        }
    }

    async fn exchange(
        &self,
        origin: &Origin,
        method: &str,
        target: &str,
        body: Bytes,
        credential: Option<&Credential>,
    ) -> Result<UpstreamReply, UpstreamError> {
        let transport = |e: &dyn std::fmt::Display| UpstreamError::Transport(e.to_string());
        let method = Method::from_bytes(method.as_bytes()).map_err(|e| transport(&e))?;
        let mut request = Request::builder()
            .method(method)
            .uri(target)
            .header(HOST, origin.authority())
            .header(ACCEPT, "application/json");
        if !body.is_empty() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        if let Some(credential) = credential {
            request = request.header(AUTHORIZATION, credential.header_value());
        }
        let request = request.body(Full::new(body)).map_err(|e| transport(&e))?;
        // What was approved is what goes on the wire.
        let uri = request.uri();
        if uri.scheme().is_some()
            || uri.path_and_query().map(|p| p.as_str()) != Some(target)
            || uri.path() != target
        {
            return Err(UpstreamError::Transport(
                "target changed by encoding".into(),
            ));
        }

        let host = origin.host.trim_start_matches('[').trim_end_matches(']');
        let tcp = TcpStream::connect((host, origin.port))
            .await
            .map_err(|e| transport(&e))?;
        let _ = tcp.set_nodelay(true);
        let (response, _connection) = if origin.is_https() {
            let name = ServerName::try_from(host.to_owned()).map_err(|e| transport(&e))?;
            let tls = self
                .tls
                .connect(name, tcp)
                .await
                .map_err(|e| transport(&e))?;
            send_on(TokioIo::new(tls), request).await?
        } else {
            send_on(TokioIo::new(tcp), request).await?
        };
        // `_connection` lives until the body is read; if this future is dropped first (the
        // run ended, the timeout fired) the connection is aborted with it.
        read_reply(response).await
    }
}

/// The task driving one upstream connection, aborted (closing the socket) when dropped.
struct Connection(tokio::task::JoinHandle<()>);

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn send_on<T>(
    io: T,
    request: Request<Full<Bytes>>,
) -> Result<(http::Response<hyper::body::Incoming>, Connection), UpstreamError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| UpstreamError::Transport(e.to_string()))?;
    let connection = Connection(tokio::spawn(async move {
        let _ = connection.await;
    }));
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| UpstreamError::Transport(e.to_string()))?;
    Ok((response, connection))
}

async fn read_reply(
    response: http::Response<hyper::body::Incoming>,
) -> Result<UpstreamReply, UpstreamError> {
    let status = response.status().as_u16();
    if !(100..=599).contains(&status) {
        return Err(UpstreamError::BadStatus(status));
    }
    let headers = response.headers();
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_RESPONSE_BYTES as u64) {
        return Err(UpstreamError::Body { status });
    }
    let content_type = sanitise_content_type(headers.get(CONTENT_TYPE));
    let retry_after = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|_| UpstreamError::Body { status })?
        .to_bytes();
    Ok(UpstreamReply {
        status,
        content_type,
        retry_after,
        body,
    })
}

/// The upstream's `Content-Type` when printable, else `application/octet-stream`.
fn sanitise_content_type(value: Option<&http::HeaderValue>) -> String {
    value
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.bytes().all(|b| (0x20..0x7f).contains(&b)))
        .map_or_else(|| "application/octet-stream".to_owned(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_type_is_sanitised() {
        let ok = http::HeaderValue::from_static("application/json; charset=utf-8");
        assert_eq!(
            sanitise_content_type(Some(&ok)),
            "application/json; charset=utf-8"
        );
        assert_eq!(sanitise_content_type(None), "application/octet-stream");
        let empty = http::HeaderValue::from_static("");
        assert_eq!(
            sanitise_content_type(Some(&empty)),
            "application/octet-stream"
        );
        let ctl = http::HeaderValue::from_bytes(b"text/\tplain").unwrap();
        assert_eq!(
            sanitise_content_type(Some(&ctl)),
            "application/octet-stream"
        );
    }
}
