//! Layer 5: a declared body over 8 MiB is refused from its header alone,
//! without reading a byte of it (`resource_exhausted`, `NotDispatched{request}`).
//!
//! A chunked body is cut at 8 MiB, and the decoded (decompressed) message
//! capped at 8 MiB, by the Connect service's own limits, set in
//! [`super::Pipeline::build`].

use std::convert::Infallible;
use std::task::{Context, Poll};

use plimsoll::refusal::Refusal;
use plimsoll::validate::MAX_MESSAGE_BYTES;
use tower::Service;

use super::exchange::Exchange;
use super::{HttpRequest, HttpResponse, Inner, ResponseFuture, call, refuse};

/// The body-limit layer.
#[derive(Clone)]
pub struct BodyLimit<S> {
    inner: S,
}

impl<S> BodyLimit<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        BodyLimit { inner }
    }
}

/// The declared length, when it is over the cap. An unparseable length is
/// left to hyper, which refuses it before this layer runs.
fn declared_over_cap(req: &HttpRequest) -> Option<u64> {
    let len: u64 = req
        .headers()
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (len > MAX_MESSAGE_BYTES as u64).then_some(len)
}

impl<S: Inner> Service<HttpRequest> for BodyLimit<S> {
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: HttpRequest) -> ResponseFuture {
        if let Some(len) = declared_over_cap(&req) {
            let resp: HttpResponse = refuse(
                req.headers(),
                &Exchange::of(req.extensions()),
                Refusal::BodyTooLarge(format!(
                    "request body of {len} bytes is over the {MAX_MESSAGE_BYTES} byte limit; nothing ran"
                )),
            );
            return Box::pin(async move { Ok(resp) });
        }
        let inner = self.inner.clone();
        Box::pin(async move { Ok(call(&inner, req).await) })
    }
}
