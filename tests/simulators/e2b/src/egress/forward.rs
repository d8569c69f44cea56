//! HTTP through the egress proxy: requests with the sandbox's header transforms applied,
//! forwarded to the destination's loopback upstream (or answered by the simulator).

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

use http::header::{HOST, HeaderName, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use super::Verdict;
use crate::app::App;
use crate::config::Upstream;
use crate::http::{Response, full};

/// What the simulator answers for a host it stands in for (`example.com`).
const ANSWER: &str = "<!doctype html>\n<html><head><title>Example Domain</title></head>\
<body><h1>Example Domain</h1><p>Answered by the E2B simulator's egress proxy: egress from \
this sandbox is open.</p></body></html>\n";

/// Serves a guest's plain-HTTP connection: each request is judged by its `Host`. A request
/// to a destination that is not allowed ends the connection without an answer.
pub async fn serve_plain(app: Arc<App>, id: String, stream: UnixStream) {
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let app = Arc::clone(&app);
        let id = id.clone();
        async move {
            let host = request
                .headers()
                .get(HOST)
                .and_then(|h| h.to_str().ok())
                .map(|h| h.rsplit_once(':').map_or(h, |(name, _)| name).to_owned())
                .unwrap_or_default();
            match super::verdict(&app, &id, &host) {
                Verdict::Closed => Err(io::Error::other("egress not allowed")),
                Verdict::PassThrough(upstream) => {
                    forward(request, &host, Some(&upstream), &BTreeMap::new()).await
                }
                Verdict::Intercept { upstream, headers } => {
                    forward(request, &host, upstream.as_ref(), &headers).await
                }
            }
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// Serves one intercepted TLS connection to `host`.
pub async fn serve_intercepted<S>(
    tls: S,
    host: String,
    upstream: Option<Upstream>,
    headers: BTreeMap<String, String>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let host = host.clone();
        let upstream = upstream.clone();
        let headers = headers.clone();
        async move { forward(request, &host, upstream.as_ref(), &headers).await }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), service)
        .await;
}

async fn forward(
    mut request: Request<Incoming>,
    host: &str,
    upstream: Option<&Upstream>,
    headers: &BTreeMap<String, String>,
) -> Result<Response, io::Error> {
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            request.headers_mut().insert(name, value);
        }
    }
    let Some(upstream) = upstream else {
        // Read what the guest sent first: closing on an unread body resets the connection
        // before the answer arrives.
        let _ = http_body_util::Limited::new(request.into_body(), 1 << 20)
            .collect()
            .await;
        return Ok(full(
            StatusCode::OK,
            Some("text/html; charset=UTF-8"),
            ANSWER,
        ));
    };
    let tcp = TcpStream::connect((upstream.ip, upstream.port)).await?;
    if !upstream.tls {
        return send(tcp, request).await;
    }
    let config = client_config(upstream.ca_pem.as_deref().unwrap_or_default())?;
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| io::Error::other(format!("server name {host}: {e}")))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?;
    send(tls, request).await
}

async fn send<S>(io: S, request: Request<Incoming>) -> Result<Response, io::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // E2B's proxy is Go: header names go out in canonical case (`X-Plimsoll-Guard`).
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(TokioIo::new(io))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(io::Error::other)?;
    Ok(response.map(|body| body.map_err(io::Error::other).boxed()))
}

/// A client config trusting exactly the upstream's CA.
fn client_config(ca_pem: &str) -> Result<Arc<rustls::ClientConfig>, io::Error> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert?).map_err(io::Error::other)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
