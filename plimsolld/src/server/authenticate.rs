//! Layer 4: who is calling, decided from the headers before any body byte
//! is read (wire.md §2). The principal rides in the request's extensions to
//! the handler, which re-checks that it is there. A connection that carried
//! an authenticated request is marked so (see [`super::connections`]).

use std::sync::Arc;

use super::connection::ConnectionActivity;
use super::exchange::Exchange;
use super::{HttpRequest, Inner, ResponseFuture, Step, answer, pass, refuse};
use crate::auth::{FailureLog, SCOPE_RUN, Verifier, authorize};

/// The authentication step.
#[derive(Clone)]
pub struct Authenticate {
    verifier: Arc<Verifier>,
    failures: Arc<FailureLog>,
}

impl Authenticate {
    /// Checks callers with `verifier`, counting failures in `failures`.
    pub fn new(verifier: Arc<Verifier>, failures: Arc<FailureLog>) -> Self {
        Authenticate { verifier, failures }
    }
}

impl Step for Authenticate {
    fn handle<S: Inner>(&self, mut req: HttpRequest, next: S) -> ResponseFuture {
        let exchange = Exchange::of(req.extensions());
        let checked = self
            .verifier
            .authenticate(req.headers())
            .inspect_err(|_| self.failures.record())
            .and_then(|p| authorize(&p, SCOPE_RUN).map(|()| p));
        match checked {
            Ok(principal) => {
                // The connection has proven a caller: it keeps the spec's
                // idle time rather than an anonymous connection's.
                if let Some(conn) = req.extensions().get::<ConnectionActivity>() {
                    conn.0.authenticated();
                }
                exchange.set_caller(principal.audit_key());
                req.extensions_mut().insert(principal);
                pass(next, req)
            }
            Err(refusal) => answer(refuse(req.headers(), &exchange, refusal)),
        }
    }
}
