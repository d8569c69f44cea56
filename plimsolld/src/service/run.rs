//! `Run`: one payload in a fresh sandbox. The steps follow wire.md §6.1 in
//! order, so a reviewer can hold this file against the spec line by line.

use std::time::{Duration, Instant};

use connectrpc::ConnectError;
use plimsoll::record;
use plimsoll::refusal::Refusal;
use plimsoll::tier::{Floor, IsolationTier};
use plimsoll::validate::{self, PayloadKind};
use plimsoll::wire::{
    JavaScriptResult, RunRequest, RunResponse, SoftwareRule, run_request, run_response,
};

use super::{State, answer_error};
use crate::auth::Principal;
use crate::provider::{ProviderError, SnippetOutcome, SnippetRun};
use crate::record::Answer;

/// Handles one `Run` request.
pub(super) async fn handle(
    state: &State,
    principal: &Principal,
    req: RunRequest,
) -> Result<RunResponse, ConnectError> {
    let arrived = Answer::arrived();
    // 1–4: envelope and payload, before anything else is looked at.
    validate::check_protocol(req.protocol)?;
    let floor = validate::check_floor(&req.minimum_isolation)?;
    let rule = req.software_rule.as_option();
    validate::check_software_rule(rule)?;
    let kind = validate::check_run_payload(req.payload.as_ref())?;
    // 5: grant profile selection. No profile exists until the broker lands,
    // so a named profile is unavailable to every caller.
    check_grant_profile(&req)?;
    // 6: the floor against the tier right now.
    let tier = state.current_tier();
    check_floor(floor, tier)?;
    // 7: the software rule against the selected environment.
    let description = state.provider.describe();
    let identity = match kind {
        PayloadKind::Project => description.project.software_identity,
        PayloadKind::Module => description.module.software_identity,
        _ => description.javascript.software_identity,
    };
    check_software(rule, &identity)?;
    // 8: admission; sheds at once, never queues.
    let permit = state.admission.admit(principal.audit_key())?;
    // 9: dispatch.
    let Some(run_request::Payload::Javascript(js)) = req.payload.as_ref() else {
        return Err(state.provider.unsupported(kind).into());
    };
    let timeout_ms = validate::effective_timeout_ms(
        req.timeout_ms,
        state.provider.default_timeout_ms(),
        description.javascript.max_timeout_ms,
    );
    let run = SnippetRun {
        code: js.code.clone(),
        timeout: Duration::from_millis(u64::from(timeout_ms)),
    };
    // The run lives in its own task holding the permit: if the caller goes
    // away, the sandbox still runs to its end and only then frees the slot.
    let provider = state.provider.clone();
    let outcome = tokio::spawn(async move {
        let outcome = provider.run_snippet(run).await;
        drop(permit);
        outcome
    })
    .await
    .map_err(|e| super::internal(&format!("run task failed: {e}")))?;
    // A provider's own refusal ran nothing, so it is not counted as a run.
    if !matches!(outcome, Err(ProviderError::Refused(_))) {
        state.metrics.run_dispatched();
    }
    let outcome = outcome.map_err(|e| answer_error(e, &state.metrics))?;
    let resp = answer_snippet(
        &arrived,
        &req,
        description.sandbox,
        tier,
        &description.policy,
        outcome,
    );
    audit(principal, &req, js.code.len(), &resp, arrived.started);
    Ok(resp)
}

fn check_grant_profile(req: &RunRequest) -> Result<(), Refusal> {
    let profile = match req.payload.as_ref() {
        Some(run_request::Payload::Javascript(js)) => js.grant_profile.as_str(),
        Some(run_request::Payload::Project(p)) => p.grant_profile.as_str(),
        _ => "",
    };
    if profile.is_empty() {
        return Ok(());
    }
    Err(Refusal::PermissionDenied(format!(
        "grant_profile {profile:?} is not available to this caller"
    )))
}

/// Refuses a run whose floor is above the tier right now.
pub(super) fn check_floor(floor: Floor, tier: IsolationTier) -> Result<(), Refusal> {
    if floor.is_met_by(tier) {
        Ok(())
    } else {
        Err(Refusal::InsufficientIsolation { floor, tier })
    }
}

/// Refuses a run whose selected software is outside the caller's rule. An
/// empty identity never satisfies a rule.
pub(super) fn check_software(rule: Option<&SoftwareRule>, identity: &str) -> Result<(), Refusal> {
    if record::software_rule_id(rule).is_empty() || record::rule_allows(rule, identity) {
        return Ok(());
    }
    let shown = if identity.is_empty() {
        "no stated software"
    } else {
        identity
    };
    Err(Refusal::SoftwareMismatch(format!(
        "the selected environment runs {shown}, which the request's software rule does not allow; nothing ran"
    )))
}

fn answer_snippet(
    arrived: &Answer,
    req: &RunRequest,
    sandbox: &str,
    tier: IsolationTier,
    policy: &str,
    out: SnippetOutcome,
) -> RunResponse {
    let resp = RunResponse {
        sandbox: sandbox.to_owned(),
        isolation: tier.as_str().to_owned(),
        duration_ms: i64::try_from(out.duration.as_millis()).unwrap_or(i64::MAX),
        software_identity: out.software_identity,
        environment: out.environment,
        instance: out.instance,
        result: Some(run_response::Result::Javascript(Box::new(
            JavaScriptResult {
                stdout: out.stdout,
                stderr: out.stderr,
                exit_code: out.exit_code,
                timed_out: out.timed_out,
                stdout_truncated: out.stdout_truncated,
                stderr_truncated: out.stderr_truncated,
                ..Default::default()
            },
        ))),
        ..Default::default()
    };
    arrived.seal_single(resp, req, policy)
}

fn audit(
    principal: &Principal,
    req: &RunRequest,
    code_bytes: usize,
    resp: &RunResponse,
    started: Instant,
) {
    let (exit_code, timed_out) = match &resp.result {
        Some(run_response::Result::Javascript(js)) => (js.exit_code, js.timed_out),
        _ => (0, false),
    };
    let trace = validate::trace_id(&req.trace_id);
    tracing::info!(
        op = "run",
        caller = principal.audit_key(),
        code_bytes,
        sandbox = %resp.sandbox,
        isolation = %resp.isolation,
        exit_code,
        timed_out,
        duration_ms = started.elapsed().as_millis() as u64,
        trace_id = trace.unwrap_or_default(),
        trace_id_rejected = trace.is_none() && !req.trace_id.is_empty(),
        "code run"
    );
}
