//! The RPC listener and its request pipeline (wire.md §1.4), outermost first:
//!
//! 1. [`unread_body`] — `Connection: close` when an answer leaves a body unread;
//! 2. [`binding`] — the request-id echo, the not-dispatched header, the audit line;
//! 3. [`routing`] — probes, the service's paths, 404 for the rest;
//! 4. [`authenticate`] — credentials and scope, before any body byte is read;
//! 5. [`body_limit`] — the 8 MiB cap on a declared body;
//! 6. [`decode_gate`] — at most `2 × max_concurrent` bodies being read at once;
//! 7. [`raw_grant`] — a grant sent in full (not named by profile) is refused;
//! 8. the Connect service, whose handlers mark the procedure reached.
//!
//! Each layer is one file. Around them, outermost first:
//!
//! - [`listener`] — the accept loop: a slot for each connection, or a refusal;
//! - [`connections`] — the slots: how many, how long each may stay, which
//!   one gives way when the listener is full;
//! - [`connection`] — one connection's protocol settings and life;
//! - [`frame_meter`] — HTTP/2 frame budgets the h2 crate does not keep;
//! - [`socket`] — the socket shared by hyper and the connection's linger.

pub mod authenticate;
pub mod binding;
pub mod body_limit;
pub mod connection;
pub mod connections;
pub mod decode_gate;
pub mod exchange;
pub mod frame_meter;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod listener;
pub mod metrics_listener;
pub mod probes;
pub mod raw_grant;
pub mod routing;
pub mod socket;
pub mod tls;
pub mod unread_body;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use connectrpc::{ConnectError, ConnectRpcService, Limits};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use plimsoll::refusal::Refusal;
use plimsoll::validate::MAX_MESSAGE_BYTES;
use plimsoll::wire::SandboxServiceServer;
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::auth::{FailureLog, Verifier};
use crate::service::{SandboxApi, State};
use exchange::Exchange;

/// An error inside a body stream.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BodyError(pub Box<dyn std::error::Error + Send + Sync>);

/// A request body as the inner layers see it.
pub type ReqBody = UnsyncBoxBody<Bytes, BodyError>;
/// A response body from any layer.
pub type RespBody = UnsyncBoxBody<Bytes, BodyError>;
/// A request inside the pipeline.
pub type HttpRequest = Request<ReqBody>;
/// An answer inside the pipeline.
pub type HttpResponse = Response<RespBody>;
/// The future every layer returns.
pub type ResponseFuture = Pin<Box<dyn Future<Output = Result<HttpResponse, Infallible>> + Send>>;

/// What a layer needs of the service inside it.
pub trait Inner:
    Service<HttpRequest, Response = HttpResponse, Error = Infallible, Future: Send>
    + Clone
    + Send
    + 'static
{
}

impl<S> Inner for S where
    S: Service<HttpRequest, Response = HttpResponse, Error = Infallible, Future: Send>
        + Clone
        + Send
        + 'static
{
}

/// One step of the pipeline: it looks at a request and either answers it
/// itself or hands it on to `next`, the rest of the pipeline.
pub trait Step: Clone + Send + Sync + 'static {
    /// Handles `req`.
    fn handle<S: Inner>(&self, req: HttpRequest, next: S) -> ResponseFuture;
}

/// A [`Step`] wrapped around the rest of the pipeline: the tower service each
/// layer becomes.
#[derive(Clone)]
pub struct Layered<T, S> {
    step: T,
    next: S,
}

impl<T: Step, S: Inner> Service<HttpRequest> for Layered<T, S> {
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: HttpRequest) -> ResponseFuture {
        self.step.handle(req, self.next.clone())
    }
}

/// Wraps `step` around whatever comes next: `ServiceBuilder::layer_fn(layer(step))`.
pub fn layer<T: Step, S>(step: T) -> impl Fn(S) -> Layered<T, S> {
    move |next| Layered {
        step: step.clone(),
        next,
    }
}

/// Answers without going further.
pub fn answer(resp: HttpResponse) -> ResponseFuture {
    Box::pin(async move { Ok(resp) })
}

/// Hands `req` on to the rest of the pipeline.
pub fn pass<S: Inner>(next: S, req: HttpRequest) -> ResponseFuture {
    Box::pin(async move { Ok(call(&next, req).await) })
}

/// Calls `inner` with `req` (the services here are always ready).
pub fn call<S: Inner>(inner: &S, req: HttpRequest) -> impl Future<Output = HttpResponse> + Send {
    let svc = inner.clone();
    async move {
        match svc.oneshot(req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        }
    }
}

/// A fixed plain-text answer.
pub fn text(status: StatusCode, body: &'static str) -> HttpResponse {
    let mut resp = Response::new(
        Full::new(Bytes::from_static(body.as_bytes()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// A refusal written by a layer before the procedure: the protocol-correct
/// Connect error for the request's content type, recorded for the audit line.
pub fn refuse(headers: &HeaderMap, exchange: &Exchange, refusal: Refusal) -> HttpResponse {
    let (code, reason) = refusal.code_and_reason();
    exchange.set_outcome(code.as_str(), Some(reason.as_str()));
    connect_error(refusal.to_connect_error(), headers)
}

/// Any Connect error as an HTTP answer shaped for the request's protocol.
pub fn connect_error(err: ConnectError, headers: &HeaderMap) -> HttpResponse {
    err.into_http_response(headers)
        .map(|b| b.map_err(|never| match never {}).boxed_unsync())
}

/// Everything the pipeline needs, built once at startup.
pub struct Pipeline {
    /// Handler state.
    pub state: Arc<State>,
    /// The caller verifier.
    pub verifier: Arc<Verifier>,
    /// The decode gate's size: `2 × max_concurrent`.
    pub decode_slots: usize,
}

/// The Connect service adapted to the pipeline's body types.
#[derive(Clone)]
pub struct ConnectInner {
    svc: ConnectRpcService<SandboxServiceServer<SandboxApi>>,
}

impl Service<HttpRequest> for ConnectInner {
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: HttpRequest) -> ResponseFuture {
        let svc = self.svc.clone();
        Box::pin(async move {
            let resp = match svc.oneshot(req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            };
            Ok(resp.map(|b| b.map_err(|never| match never {}).boxed_unsync()))
        })
    }
}

/// The whole pipeline as one service over hyper's request body.
pub type Stack = unread_body::UnreadBody<
    Layered<
        binding::Binding,
        Layered<
            routing::Routing,
            Layered<
                authenticate::Authenticate,
                Layered<
                    body_limit::BodyLimit,
                    Layered<decode_gate::DecodeGate, Layered<raw_grant::RawGrant, ConnectInner>>,
                >,
            >,
        >,
    >,
>;

impl Pipeline {
    /// Assembles the layers in the order of wire.md §1.4.
    pub fn build(self) -> Stack {
        let limits = Limits::default()
            .with_max_request_body_size(MAX_MESSAGE_BYTES)
            .with_max_message_size(MAX_MESSAGE_BYTES);
        let connect = ConnectInner {
            svc: ConnectRpcService::new(SandboxServiceServer::new(SandboxApi::new(
                self.state.clone(),
            )))
            .with_limits(limits),
        };
        let probes = Arc::new(
            probes::Probes::new(self.state.provider.clone()).with_grants(self.state.grants.clone()),
        );
        let auth_on = self.verifier.is_on();
        ServiceBuilder::new()
            .layer_fn(unread_body::UnreadBody::new)
            .layer_fn(layer(binding::Binding))
            .layer_fn(layer(routing::Routing::new(probes, auth_on)))
            .layer_fn(layer(authenticate::Authenticate::new(
                self.verifier.clone(),
                Arc::new(FailureLog::new()),
            )))
            .layer_fn(layer(body_limit::BodyLimit))
            .layer_fn(layer(decode_gate::DecodeGate::new(Arc::new(
                decode_gate::Gate::new(self.decode_slots),
            ))))
            .layer_fn(layer(raw_grant::RawGrant))
            .service(connect)
    }
}
