//! The one HTTP client the e2b provider uses for E2B's control plane and envd: HTTP/1.1 over
//! a fresh connection per request, TLS through rustls with the system's roots for `https`,
//! plain TCP only to a loopback host (checked when the settings were read).
//!
//! Redirects are never followed (they would carry `X-API-Key` or `X-Access-Token` elsewhere):
//! a 3xx is just a status. Vendor error bodies leave this module only cut and scrubbed
//! ([`scrub`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::config::BaseUrl;

/// How long a connection (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest vendor error text kept (grants.md §6.1).
const MAX_ERROR_TEXT: usize = 512;

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The TCP connection or the TLS handshake failed: the request never left.
    #[error("connecting to {origin}: {detail}")]
    Connect { origin: String, detail: String },
    /// The request was sent (or may have been) and no full response came back.
    #[error("{method} {origin}{path}: {detail}")]
    Exchange {
        method: Method,
        origin: String,
        path: String,
        detail: String,
    },
    /// The request could not be built (a header value that is not one).
    #[error("building a request: {0}")]
    Build(String),
    /// No response within the request's bound.
    #[error("{method} {origin}{path}: no response within {bound:?}")]
    Timeout {
        method: Method,
        origin: String,
        path: String,
        bound: Duration,
    },
}

impl HttpError {
    /// Whether the request certainly never reached the server.
    pub fn never_sent(&self) -> bool {
        matches!(self, HttpError::Connect { .. } | HttpError::Build(_))
    }
}

/// A response whose body is still to be read.
pub struct Response {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Incoming,
}

impl Response {
    /// The whole body, at most `limit` bytes (more is an error), within `bound`.
    pub async fn bytes(self, limit: usize, bound: Duration) -> Result<Bytes, String> {
        let limited = http_body_util::Limited::new(self.body, limit);
        match tokio::time::timeout(bound, limited.collect()).await {
            Ok(Ok(body)) => Ok(body.to_bytes()),
            Ok(Err(e)) => Err(format!("reading the body: {e}")),
            Err(_) => Err(format!("reading the body took more than {bound:?}")),
        }
    }

    /// The body as scrubbed text for an error message (at most 512 bytes kept).
    pub async fn error_text(self) -> String {
        let status = self.status;
        match self.bytes(64 * 1024, Duration::from_secs(5)).await {
            Ok(body) => format!("{status}: {}", scrub(&String::from_utf8_lossy(&body))),
            Err(e) => format!("{status} ({e})"),
        }
    }
}

/// A client for one origin.
#[derive(Clone)]
pub struct Client {
    base: BaseUrl,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.base.origin())
    }
}

/// The TLS client configuration: the system's roots, HTTP/1.1 only.
pub fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for cert in found.certs {
        // A system certificate rustls cannot read is skipped, as every client does.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err("no system root certificates could be loaded".to_owned());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

impl Client {
    /// A client for `base`; `tls` is needed only when `base` is `https`.
    pub fn new(base: BaseUrl, tls: Option<Arc<rustls::ClientConfig>>) -> Client {
        Client {
            tls: tls.map(tokio_rustls::TlsConnector::from),
            base,
        }
    }

    /// The origin, for logs.
    pub fn origin(&self) -> String {
        self.base.origin()
    }

    /// Whether it speaks `https`.
    pub fn is_tls(&self) -> bool {
        self.base.tls
    }

    /// Sends one request and waits (at most `bound`) for the response's head. `host` is the
    /// `Host` header (the origin's own when `None`).
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        headers: HeaderMap,
        body: Bytes,
        host: Option<&str>,
        bound: Duration,
    ) -> Result<Response, HttpError> {
        let timeout = || HttpError::Timeout {
            method: method.clone(),
            origin: self.origin(),
            path: path_only(path_and_query).to_owned(),
            bound,
        };
        tokio::time::timeout(
            bound,
            self.exchange(method.clone(), path_and_query, headers, body, host),
        )
        .await
        .unwrap_or_else(|_| Err(timeout()))
    }

    async fn exchange(
        &self,
        method: Method,
        path_and_query: &str,
        headers: HeaderMap,
        body: Bytes,
        host: Option<&str>,
    ) -> Result<Response, HttpError> {
        let origin = self.origin();
        let connect_error = |detail: String| HttpError::Connect {
            origin: origin.clone(),
            detail,
        };
        let tcp = tokio::time::timeout(
            CONNECT_TIMEOUT,
            TcpStream::connect((self.base.server_name(), self.base.port)),
        )
        .await
        .map_err(|_| connect_error(format!("no connection within {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| connect_error(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        let host = host.map_or_else(
            || format!("{}:{}", self.base.host, self.base.port),
            str::to_owned,
        );
        let mut request = Request::builder()
            .method(method.clone())
            .uri(path_and_query)
            .body(Full::new(body))
            .map_err(|e| HttpError::Build(e.to_string()))?;
        *request.headers_mut() = headers;
        request.headers_mut().insert(
            http::header::HOST,
            HeaderValue::from_str(&host).map_err(|e| HttpError::Build(e.to_string()))?,
        );
        let exchange_error = |detail: String| HttpError::Exchange {
            method: method.clone(),
            origin: origin.clone(),
            path: path_only(path_and_query).to_owned(),
            detail,
        };
        let response = if self.base.tls {
            let connector = self
                .tls
                .as_ref()
                .ok_or_else(|| connect_error("no TLS configuration".to_owned()))?;
            let name = rustls::pki_types::ServerName::try_from(self.base.server_name().to_owned())
                .map_err(|e| connect_error(e.to_string()))?;
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, tcp))
                .await
                .map_err(|_| connect_error("TLS handshake timed out".to_owned()))?
                .map_err(|e| connect_error(format!("TLS: {e}")))?;
            roundtrip(TokioIo::new(stream), request)
                .await
                .map_err(exchange_error)?
        } else {
            roundtrip(TokioIo::new(tcp), request)
                .await
                .map_err(exchange_error)?
        };
        let (parts, body) = response.into_parts();
        Ok(Response {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
}

async fn roundtrip<T>(
    io: T,
    request: Request<Full<Bytes>>,
) -> Result<http::Response<Incoming>, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    // The connection task ends with the response body (or when the response is dropped).
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())
}

/// The path without its query (queries can carry signatures; never logged).
fn path_only(path_and_query: &str) -> &str {
    path_and_query.split('?').next().unwrap_or_default()
}

/// `text` cut to 512 bytes and with every credential-shaped word replaced (grants.md §6.1):
/// bearer values, JWTs, `dckr_pat_…`, `crg_…`, `e2b_…` and long hex runs (envd tokens).
pub fn scrub(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_ERROR_TEXT));
    let mut redact_next = false;
    for word in text.split_inclusive(|c: char| c.is_whitespace() || matches!(c, '"' | ',')) {
        let bare = word.trim_end_matches(|c: char| c.is_whitespace() || matches!(c, '"' | ','));
        let tail = &word[bare.len()..];
        if redact_next && !bare.is_empty() {
            out.push_str("[redacted]");
            out.push_str(tail);
            redact_next = false;
            continue;
        }
        if bare.eq_ignore_ascii_case("bearer") {
            redact_next = true;
            out.push_str(word);
            continue;
        }
        if is_secret(bare) {
            out.push_str("[redacted]");
            out.push_str(tail);
        } else {
            out.push_str(word);
        }
    }
    cut(&out, MAX_ERROR_TEXT)
}

fn is_secret(word: &str) -> bool {
    let word = word.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    let jwt = word.starts_with("eyJ") && word.matches('.').count() >= 2;
    let long_hex = word.len() >= 32 && word.bytes().all(|b| b.is_ascii_hexdigit());
    jwt || long_hex
        || ["dckr_pat_", "crg_", "e2b_", "sk_e2b_"]
            .iter()
            .any(|p| word.contains(p))
}

/// `text` cut to at most `max` bytes on a character boundary.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrubbing_removes_every_credential_shape_and_cuts() {
        let text = format!(
            "{{\"code\":401,\"message\":\"bad key e2b_abcdef, token crg_{h} Bearer sekrit jwt eyJa.eyJb.sig dckr_pat_x {h}\"}}",
            h = "ab".repeat(32)
        );
        let out = scrub(&text);
        for secret in [
            "e2b_abcdef",
            "crg_",
            "sekrit",
            "eyJa",
            "dckr_pat_x",
            &"ab".repeat(32),
        ] {
            assert!(!out.contains(secret), "{secret} in {out}");
        }
        assert!(out.contains("bad key"), "{out}");
        assert!(scrub(&"é".repeat(1000)).len() <= MAX_ERROR_TEXT);
    }

    #[test]
    fn paths_are_logged_without_their_queries() {
        assert_eq!(path_only("/files?path=/a&signature=x"), "/files");
    }
}
