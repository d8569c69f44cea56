//! Layer 1: answers that leave the request body unread close the connection.
//!
//! On HTTP/1.x a refusal written before the body was read to the end (a
//! missing token, an oversized declared length) cannot leave the rest of the
//! body on the connection for the next request to trip over, so the answer
//! says `Connection: close`. The listener then lingers briefly, discarding
//! what the client is still sending, so the client reads the refusal instead
//! of a reset. The body is never drained *before* refusing.
//!
//! The same wrapper bounds how long a body may take to arrive (30 s from the
//! request's start, wire.md §1.3), so a client trickling bytes cannot hold a
//! decode slot.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep, sleep_until};
use tower::Service;

use super::{BodyError, HttpResponse, Inner, ResponseFuture, call};

/// The outermost layer: hyper's body in, the pipeline's body types inside.
#[derive(Clone)]
pub struct UnreadBody<S> {
    inner: S,
}

impl<S> UnreadBody<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        UnreadBody { inner }
    }
}

impl<S: Inner> Service<Request<Incoming>> for UnreadBody<S> {
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> ResponseFuture {
        let http1 = req.version() < Version::HTTP_2;
        let (parts, body) = req.into_parts();
        let finished = Arc::new(AtomicBool::new(body.is_end_stream()));
        let tracked = Tracked {
            inner: body,
            finished: finished.clone(),
            deadline: Box::pin(sleep_until(Instant::now() + READ_TIMEOUT)),
        };
        let req = Request::from_parts(parts, tracked.boxed_unsync());
        let inner = self.inner.clone();
        Box::pin(async move {
            let mut resp = call(&inner, req).await;
            if http1 && !finished.load(Ordering::Acquire) {
                resp.headers_mut()
                    .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(resp)
        })
    }
}

/// How long the headers and body of one request may take to arrive.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The body did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {READ_TIMEOUT:?}")]
pub struct BodyTimeout;

/// Hyper's body, noting when it has been read to the end, and failing once
/// the read deadline passes.
struct Tracked {
    inner: Incoming,
    finished: Arc<AtomicBool>,
    deadline: Pin<Box<Sleep>>,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if polled.is_pending() {
            return match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(BodyError(Box::new(BodyTimeout))))),
                Poll::Pending => Poll::Pending,
            };
        }
        match &polled {
            Poll::Ready(None) => self.finished.store(true, Ordering::Release),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => {
                self.finished.store(true, Ordering::Release)
            }
            _ => {}
        }
        polled.map_err(|e| BodyError(Box::new(e)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
