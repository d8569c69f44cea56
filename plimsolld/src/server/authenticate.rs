//! Layer 4: who is calling, decided from the headers before any body byte
//! is read (wire.md §2). The principal rides in the request's extensions to
//! the handler, which re-checks that it is there.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::Service;

use super::exchange::Exchange;
use super::{HttpRequest, HttpResponse, Inner, ResponseFuture, call, refuse};
use crate::auth::{FailureLog, SCOPE_RUN, Verifier, authorize};

/// The authentication layer.
#[derive(Clone)]
pub struct Authenticate<S> {
    inner: S,
    verifier: Arc<Verifier>,
    failures: Arc<FailureLog>,
}

impl<S> Authenticate<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, verifier: Arc<Verifier>, failures: Arc<FailureLog>) -> Self {
        Authenticate {
            inner,
            verifier,
            failures,
        }
    }
}

impl<S: Inner> Service<HttpRequest> for Authenticate<S> {
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: HttpRequest) -> ResponseFuture {
        let exchange = Exchange::of(req.extensions());
        let checked = self
            .verifier
            .authenticate(req.headers())
            .inspect_err(|_| self.failures.record())
            .and_then(|p| authorize(&p, SCOPE_RUN).map(|()| p));
        match checked {
            Ok(principal) => {
                exchange.set_caller(principal.audit_key());
                req.extensions_mut().insert(principal);
                let inner = self.inner.clone();
                Box::pin(async move { Ok(call(&inner, req).await) })
            }
            Err(refusal) => {
                let resp: HttpResponse = refuse(req.headers(), &exchange, refusal);
                Box::pin(async move { Ok(resp) })
            }
        }
    }
}
