//! Layer 3: which path is what.
//!
//! `/healthz` and `/readyz` answer here, for any method and without
//! credentials. The service's five procedures go on inward. With
//! authentication on, any other path under the service prefix is refused
//! `permission_denied` (fail closed); every other path is a plain 404.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::StatusCode;
use plimsoll::refusal::Refusal;
use plimsoll::wire::{PROCEDURES, SERVICE_PREFIX};
use tower::Service;

use super::exchange::Exchange;
use super::probes::Probes;
use super::{HttpRequest, HttpResponse, Inner, ResponseFuture, call, refuse, text};

/// The routing layer.
#[derive(Clone)]
pub struct Routing<S> {
    inner: S,
    probes: Arc<Probes>,
    auth_on: bool,
}

impl<S> Routing<S> {
    /// Wraps `inner`; `auth_on` decides how unknown procedures are refused.
    pub fn new(inner: S, probes: Arc<Probes>, auth_on: bool) -> Self {
        Routing {
            inner,
            probes,
            auth_on,
        }
    }
}

/// Where a path leads.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Healthz,
    Readyz,
    Procedure,
    UnknownProcedure,
    NotFound,
}

fn route(path: &str) -> Route {
    match path {
        "/healthz" => Route::Healthz,
        "/readyz" => Route::Readyz,
        _ => match path.strip_prefix(SERVICE_PREFIX) {
            Some(name) if PROCEDURES.contains(&name) => Route::Procedure,
            Some(_) => Route::UnknownProcedure,
            None => Route::NotFound,
        },
    }
}

impl<S: Inner> Service<HttpRequest> for Routing<S> {
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: HttpRequest) -> ResponseFuture {
        let inner = self.inner.clone();
        let probes = self.probes.clone();
        let auth_on = self.auth_on;
        Box::pin(async move {
            let resp = match route(req.uri().path()) {
                Route::Healthz => text(StatusCode::OK, "ok\n"),
                Route::Readyz => {
                    if probes.ready().await {
                        text(StatusCode::OK, "ready\n")
                    } else {
                        text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                }
                Route::Procedure => call(&inner, req).await,
                Route::UnknownProcedure if auth_on => refuse(
                    req.headers(),
                    &Exchange::of(req.extensions()),
                    Refusal::PermissionDenied("no such procedure for this caller".to_owned()),
                ),
                Route::UnknownProcedure | Route::NotFound => {
                    text(StatusCode::NOT_FOUND, "404 page not found\n")
                }
            };
            Ok(resp)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_route_as_the_spec_says() {
        assert_eq!(route("/healthz"), Route::Healthz);
        assert_eq!(route("/readyz"), Route::Readyz);
        for p in PROCEDURES {
            assert_eq!(route(&format!("{SERVICE_PREFIX}{p}")), Route::Procedure);
        }
        assert_eq!(
            route("/plimsoll.v1.SandboxService/Nope"),
            Route::UnknownProcedure
        );
        assert_eq!(
            route("/plimsoll.v1.SandboxService/"),
            Route::UnknownProcedure
        );
        assert_eq!(route("/metrics"), Route::NotFound);
        assert_eq!(route("*"), Route::NotFound);
        assert_eq!(route("/healthz/"), Route::NotFound);
    }
}
