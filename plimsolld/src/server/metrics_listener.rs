//! The metrics listener: `GET /metrics` and nothing else (404 for every other
//! path, `/healthz` included). No authentication; keep it on loopback.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tower::Service;

use super::{HttpResponse, ResponseFuture, text};
use crate::metrics::{Metrics, render_pool};
use crate::provider::Provider;

/// The metrics service.
#[derive(Clone)]
pub struct MetricsService {
    metrics: Arc<Metrics>,
    /// Asked for its warm session pool on each scrape.
    provider: Arc<dyn Provider>,
}

impl MetricsService {
    /// Serves `metrics`, and the warm session pool of `provider` when it keeps one.
    pub fn new(metrics: Arc<Metrics>, provider: Arc<dyn Provider>) -> MetricsService {
        MetricsService { metrics, provider }
    }
}

impl Service<Request<Incoming>> for MetricsService {
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> ResponseFuture {
        let resp = if req.uri().path() != "/metrics" {
            text(StatusCode::NOT_FOUND, "404 page not found\n")
        } else if req.method() != Method::GET {
            text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
        } else {
            let mut body = self.metrics.render();
            if let Some(pool) = self.provider.session_pool() {
                body.push_str(&render_pool(&pool));
            }
            let mut resp = Response::new(
                Full::new(Bytes::from(body))
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            );
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            resp
        };
        Box::pin(async move { Ok(resp) })
    }
}
