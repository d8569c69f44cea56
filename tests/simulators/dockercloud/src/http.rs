//! Serving plain HTTP/1.1 and h2c on loopback, and the small helpers every API shares:
//! JSON answers, bounded body reads, the bearer token.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::Value;
use tokio::net::TcpListener;

use crate::error::ApiError;
use crate::state::State;

pub type Reply = Response<Full<Bytes>>;

/// An answer with a body and content type.
pub fn bytes_reply(status: u16, content_type: &str, body: Vec<u8>) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::from(body)));
    *reply.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
        reply
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    reply
}

/// A JSON answer.
pub fn json_reply(status: u16, value: &Value) -> Reply {
    bytes_reply(status, "application/json", value.to_string().into_bytes())
}

/// An answer with no body.
pub fn empty_reply(status: u16) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::new()));
    *reply.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    reply
}

/// Adds a header (values the simulator makes are always valid header text).
pub fn with_header(mut reply: Reply, name: &'static str, value: &str) -> Reply {
    if let Ok(value) = hyper::header::HeaderValue::from_str(value) {
        reply.headers_mut().insert(name, value);
    }
    reply
}

/// The whole body, at most `limit` bytes.
pub async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => Err(ApiError::new(
            crate::error::Code::ResourceExhausted,
            format!("request body: {e}"),
        )
        .with_http(413)),
    }
}

/// The `Authorization: Bearer <token>` value.
pub fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(hyper::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Serves `listener` until the task is dropped, each request through `handler`.
pub async fn serve<F, Fut>(state: Arc<State>, listener: TcpListener, handler: F)
where
    F: Fn(Arc<State>, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                // Small writes leave at once: otherwise a streamed answer's frames wait for
                // the client's delayed ACK, a delay the real service does not add.
                let _ = stream.set_nodelay(true);
                stream
            }
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let answer = handler(state.clone(), request);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            if let Err(e) = builder.serve_connection(io, service).await {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
}
