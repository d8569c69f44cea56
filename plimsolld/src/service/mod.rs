//! The Connect handlers: one file per procedure, each a short list of named
//! steps in the order of wire.md §6.1.

mod describe;
mod run;
mod session;

use std::sync::Arc;

use connectrpc::{ConnectError, RequestContext, Response, ServiceRequest, ServiceResult};
use plimsoll::refusal::{Reason, Refusal, internal_error, not_dispatched_reason};
use plimsoll::tier::IsolationTier;
use plimsoll::wire;

use crate::admission::Admission;
use crate::auth::Principal;
use crate::metrics::Metrics;
use crate::provider::{Provider, ProviderError, Resources};
use crate::server::exchange::Exchange;

/// What every handler shares: the provider, the tier proven at startup, the
/// operator's envelope and the metrics.
pub struct State {
    /// The one provider this daemon runs.
    pub provider: Arc<dyn Provider>,
    /// The tier the startup proof established; the current tier never
    /// exceeds it.
    pub proven: IsolationTier,
    /// The operator's per-run envelope, as `Describe` states it.
    pub resources: Resources,
    /// Counters for the metrics listener.
    pub metrics: Arc<Metrics>,
    /// Run caps, per-caller caps and rate limits.
    pub admission: Arc<Admission>,
    /// Host-API grants: off, or the broker that opens and closes each run's grant.
    pub grants: Arc<crate::grant::Grants>,
    /// The live sessions.
    pub sessions: Arc<crate::session::Sessions>,
}

impl State {
    /// The tier right now: the provider's own view, never above what startup
    /// proved.
    pub fn current_tier(&self) -> IsolationTier {
        self.provider.current_tier().min(self.proven)
    }
}

/// The `plimsoll.v1.SandboxService` implementation.
#[derive(Clone)]
pub struct SandboxApi {
    state: Arc<State>,
}

impl SandboxApi {
    /// The service over shared state.
    pub fn new(state: Arc<State>) -> SandboxApi {
        SandboxApi { state }
    }
}

/// The handler's first step on every procedure: mark the procedure reached
/// (so the transport no longer marks failures as not dispatched), give the
/// decode slot back, and re-check that authentication ran.
fn enter(ctx: &RequestContext) -> Result<Principal, ConnectError> {
    Exchange::of(ctx.extensions()).mark_reached();
    ctx.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| Refusal::Unauthenticated("missing bearer token".into()).into())
}

/// Turns a provider failure into the caller's answer: a refusal keeps its
/// code and mark; anything else is an unmarked `internal` error whose detail
/// goes only to the log, under a fresh id.
fn answer_error(err: ProviderError, metrics: &Metrics) -> ConnectError {
    if matches!(err, ProviderError::Infrastructure(_)) {
        metrics.run_failed();
    }
    provider_error(err)
}

/// A provider's error as the caller's answer, counted nowhere: for what is not a run (a
/// session's open), which `plimsoll_runs_failed_total` must not count (config.md §7: its
/// failures are runs' failures, beside `plimsoll_runs_total`).
fn provider_error(err: ProviderError) -> ConnectError {
    match err {
        ProviderError::Refused(r) => r.into(),
        ProviderError::Infrastructure(cause) => internal(&cause.to_string()),
    }
}

/// Logs an internal fault under a fresh 16-hex id (detail cut to 4 KiB) and
/// returns the caller's `internal error <id>` answer.
pub fn internal(detail: &str) -> ConnectError {
    let id = hex::encode(rand::random::<[u8; 8]>());
    let mut cut = detail.len().min(4096);
    while !detail.is_char_boundary(cut) {
        cut -= 1;
    }
    tracing::error!(error_id = %id, detail = &detail[..cut], "internal error");
    internal_error(&id)
}

/// Records the answer's code and not-dispatched reason for the audit line.
fn finish<T>(ctx: &RequestContext, result: ServiceResult<T>) -> ServiceResult<T> {
    if let Err(err) = &result {
        let reason = not_dispatched_reason(err).map(Reason::as_str);
        Exchange::of(ctx.extensions()).set_outcome(err.code.as_str(), reason);
    }
    result
}

#[allow(refining_impl_trait)]
impl wire::SandboxService for SandboxApi {
    async fn run(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, wire::RunRequest>,
    ) -> ServiceResult<wire::RunResponse> {
        let principal = enter(&ctx)?;
        let req = request.to_owned_message();
        let result = run::handle(&self.state, &principal, req)
            .await
            .map(Response::new);
        finish(&ctx, result)
    }

    async fn describe(
        &self,
        ctx: RequestContext,
        _request: ServiceRequest<'_, wire::DescribeRequest>,
    ) -> ServiceResult<wire::DescribeResponse> {
        enter(&ctx)?;
        Ok(Response::new(describe::handle(&self.state)))
    }

    async fn open_session(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, wire::OpenSessionRequest>,
    ) -> ServiceResult<wire::OpenSessionResponse> {
        let principal = enter(&ctx)?;
        let req = request.to_owned_message();
        let result = session::open(&self.state, &principal, req)
            .await
            .map(Response::new);
        finish(&ctx, result)
    }

    async fn session_run(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, wire::SessionRunRequest>,
    ) -> ServiceResult<wire::SessionRunResponse> {
        let principal = enter(&ctx)?;
        let req = request.to_owned_message();
        let result = session::run(&self.state, &principal, req)
            .await
            .map(Response::new);
        finish(&ctx, result)
    }

    async fn close_session(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, wire::CloseSessionRequest>,
    ) -> ServiceResult<wire::CloseSessionResponse> {
        let principal = enter(&ctx)?;
        let req = request.to_owned_message();
        let result = session::close(&self.state, &principal, req)
            .await
            .map(Response::new);
        finish(&ctx, result)
    }
}
