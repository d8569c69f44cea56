//! The broker's guard socket: where the guard binary hands on what it admitted
//! (grants.md §5.5 steps 2 and 8), over HTTP/2 (see [`guard::link`] for the two requests).
//!
//! The guard holds no credential and no grant. It names a token only by its SHA-256; the run
//! a request reaches is whatever that token serves at the moment ([`GuardTokens`]): the
//! run's own grant, or the grant lent to a session's slot. The call then goes through
//! [`Run::call`] exactly like a request on a run's socket, so the route checks, budgets,
//! breaker, trace and audit line apply unchanged.
//!
//! The socket is 0660 (its directory, when the broker creates it, 0750): the guard may run
//! under its own uid in the broker's group, and then it reaches this socket and nothing else
//! of the broker's. It is the broker's only socket that serves a network-facing process, so
//! it answers only these two requests, by a token's hash.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use guard::envelope::{Envelope, MAX_ENVELOPE_BYTES};
use guard::link;
use guard::token::TokenHash;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

use crate::control::server::{ACCEPT_PAUSE, ControlServerError, bind_socket};
use crate::guard_tokens::GuardTokens;
use crate::run::{Reply, Run, message};

/// Guard connections served at once (the guard keeps one; more only across its restarts).
pub const MAX_CONNECTIONS: usize = 16;
/// Calls one connection may carry at once: above what the guard admits at any moment for
/// the runs a broker can hold.
const MAX_STREAMS: u32 = 16_384;
/// How long an envelope may take to arrive from the guard (which has read it already).
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds the guard socket at `path` (0660; a missing parent is made 0750).
pub async fn bind(path: &Path) -> Result<UnixListener, ControlServerError> {
    bind_socket(path, 0o660, 0o750).await
}

/// Serves the guard on `listener` until the task is dropped.
pub async fn serve(listener: UnixListener, tokens: Arc<GuardTokens>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(ACCEPT_PAUSE).await;
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let tokens = tokens.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let tokens = tokens.clone();
                async move { Ok::<_, Infallible>(answer(&tokens, request).await) }
            });
            let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_concurrent_streams(MAX_STREAMS)
                .initial_stream_window_size(4 * 1024 * 1024)
                .initial_connection_window_size(16 * 1024 * 1024)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, "guard connection ended");
            }
            drop(permit);
        });
    }
}

async fn answer(tokens: &GuardTokens, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let hash = request
        .headers()
        .get(link::TOKEN_SHA256)
        .and_then(|v| TokenHash::from_hex(v.as_bytes()));
    let Some(hash) = hash else {
        return verdict(StatusCode::UNAUTHORIZED, link::UNKNOWN_TOKEN);
    };
    match (request.method(), request.uri().path()) {
        (&Method::GET, link::LOOKUP_PATH) => match tokens.lookup(&hash) {
            Some(_) => empty(StatusCode::NO_CONTENT),
            None => verdict(StatusCode::UNAUTHORIZED, link::UNKNOWN_TOKEN),
        },
        (&Method::POST, link::CALL_PATH) => {
            // The run the token serves as the call arrives: a session's slot may have been
            // emptied since the guard's lookup.
            let Some(run) = tokens.lookup(&hash) else {
                return verdict(StatusCode::UNAUTHORIZED, link::UNKNOWN_TOKEN);
            };
            call(&run, request.into_body()).await
        }
        _ => empty(StatusCode::NOT_FOUND),
    }
}

/// One call: the envelope, then [`Run::call`] with the envelope's method, path and body.
async fn call(run: &Run, body: Incoming) -> Response<Full<Bytes>> {
    let read = Limited::new(body, MAX_ENVELOPE_BYTES).collect();
    let envelope = match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(Ok(body)) => Envelope::decode(&body.to_bytes()),
        _ => return verdict(StatusCode::BAD_REQUEST, link::BAD_ENVELOPE),
    };
    let Ok(envelope) = envelope else {
        return verdict(StatusCode::BAD_REQUEST, link::BAD_ENVELOPE);
    };
    let reply = run
        .call(
            &envelope.method,
            &envelope.path,
            Full::new(Bytes::from(envelope.body)),
        )
        .await;
    relay(reply)
}

fn relay(reply: Reply) -> Response<Full<Bytes>> {
    let content_type = HeaderValue::from_str(&reply.content_type)
        .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
    let Ok(status) = StatusCode::from_u16(reply.status) else {
        let fallback = Reply::broker(502, message::UNAVAILABLE);
        return relay(fallback);
    };
    let mut response = Response::new(Full::new(reply.body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, content_type);
    response
}

fn empty(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

fn verdict(status: StatusCode, verdict: &'static str) -> Response<Full<Bytes>> {
    let mut response = empty(status);
    response
        .headers_mut()
        .insert(link::VERDICT, HeaderValue::from_static(verdict));
    response
}
