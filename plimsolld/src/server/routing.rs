//! Layer 3: which path is what.
//!
//! `/healthz` and `/readyz` answer here, for any method and without
//! credentials. The service's five procedures go on inward. With
//! authentication on, any other path under the service prefix is refused
//! `permission_denied` (fail closed); every other path is a plain 404.

use std::sync::Arc;

use http::StatusCode;
use plimsoll::refusal::Refusal;
use plimsoll::wire::{PROCEDURES, SERVICE_PREFIX};

use super::exchange::Exchange;
use super::probes::Probes;
use super::{HttpRequest, Inner, ResponseFuture, Step, call, refuse, text};

/// The routing step.
#[derive(Clone)]
pub struct Routing {
    probes: Arc<Probes>,
    auth_on: bool,
}

impl Routing {
    /// Routes with `probes` for `/readyz`; `auth_on` decides how unknown
    /// procedures are refused.
    pub fn new(probes: Arc<Probes>, auth_on: bool) -> Self {
        Routing { probes, auth_on }
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

impl Step for Routing {
    fn handle<S: Inner>(&self, req: HttpRequest, next: S) -> ResponseFuture {
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
                Route::Procedure => call(&next, req).await,
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
