//! `Run`: one payload in a fresh sandbox. The steps follow wire.md §6.1 in
//! order, so a reviewer can hold this file against the spec line by line.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use connectrpc::ConnectError;
use plimsoll::record;
use plimsoll::refusal::Refusal;
use plimsoll::tier::{Floor, IsolationTier};
use plimsoll::validate::{self, PayloadKind};
use plimsoll::wire::{
    ProjectOutcome, RunRequest, RunResponse, SoftwareRule, run_request, run_response,
};

use super::{State, answer_error};
use crate::auth::Principal;
use crate::grant::{self, OpenGrant};
use crate::provider::{
    Description, Hold, ProjectPlan, ProjectReport, ProviderError, SnippetOutcome, SnippetRun,
};
use crate::record::Answer;

/// How long past the run's timeout its grant stays open: a sandbox's start (a container's
/// create and start) comes before the guest's clock begins.
pub(super) const GRANT_SLACK: Duration = Duration::from_secs(5);

/// Handles one `Run` request.
pub(super) async fn handle(
    state: &Arc<State>,
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
    // 5: grant profile selection: the broker opens the run's grant (or refuses). From
    // here on every way out closes it: the open grant closes itself when dropped.
    let description = state.provider.describe();
    let timeout = run_timeout(state, &req, &description);
    let grant = select_grant(state, principal, &req, &description, timeout).await?;
    // 6: the floor against the tier right now.
    let tier = state.current_tier();
    check_floor(floor, tier)?;
    // 7: the software rule against the selected environment.
    let identity = match kind {
        PayloadKind::Project => &description.project.software_identity,
        PayloadKind::Module => &description.module.software_identity,
        _ => &description.javascript.software_identity,
    };
    check_software(rule, identity)?;
    // 8: admission; sheds at once, never queues.
    let permit = state.admission.admit(principal.audit_key())?;
    // 9: dispatch. The slot travels with the job: the provider frees it
    // when the sandbox is gone, which may be after the answer.
    let hold = Hold::new(permit);
    let guest = grant.as_ref().map(OpenGrant::guest);
    let job = match req.payload.as_ref() {
        Some(run_request::Payload::Javascript(js)) => Job::Snippet(SnippetRun {
            code: js.code.clone(),
            timeout,
            hold,
            grant: guest,
        }),
        Some(run_request::Payload::Project(p)) if description.supports_project => {
            Job::Project(ProjectPlan {
                files: p.files.clone(),
                steps: p.steps.clone(),
                artifacts: p.artifacts.clone(),
                timeout,
                hold,
                grant: guest,
            })
        }
        _ => return Err(state.provider.unsupported(kind).into()),
    };
    // The run lives in its own task: if the caller goes away (and this future
    // with it), the sandbox still runs to its end, keeps its slot until it is
    // gone, and is still counted and audited.
    let dispatch = Dispatch {
        state: state.clone(),
        principal: principal.clone(),
        arrived,
        tier,
        description,
        req,
        grant,
    };
    tokio::spawn(dispatch.run(job))
        .await
        .map_err(|e| super::internal(&format!("run task failed: {e}")))?
}

/// What an admitted run executes.
enum Job {
    Snippet(SnippetRun),
    Project(ProjectPlan),
}

// === impl Dispatch ===

/// What an admitted run needs to finish, owned by the task that runs it.
struct Dispatch {
    state: Arc<State>,
    principal: Principal,
    arrived: Answer,
    tier: IsolationTier,
    description: Description,
    req: RunRequest,
    grant: Option<OpenGrant>,
}

impl Dispatch {
    /// Runs the job (the provider frees its slot once the sandbox is gone),
    /// then counts, answers and audits the run, whether or not anyone still
    /// waits for it.
    async fn run(mut self, job: Job) -> Result<RunResponse, ConnectError> {
        let (outcome, code_bytes) = match job {
            Job::Snippet(run) => {
                let bytes = run.code.len();
                let out = self.state.provider.run_snippet(run).await;
                (out.map(Done::Snippet), bytes)
            }
            Job::Project(plan) => {
                // A project's code: its files and its steps.
                let bytes = plan.files.iter().map(|f| f.content.len()).sum::<usize>()
                    + plan.steps.iter().map(String::len).sum::<usize>();
                let out = self.state.provider.run_project(plan).await;
                (out.map(Done::Project), bytes)
            }
        };
        // A provider's own refusal ran nothing, so it is not counted as a run.
        // Counted as soon as the provider is done; a provider whose sandbox
        // outlives the answer (docker's removal) still holds the slot.
        if !matches!(outcome, Err(ProviderError::Refused(_))) {
            self.state.metrics.run_dispatched();
        }
        // The sandbox has ended (whatever the outcome): revoke the grant before answering.
        let host_calls = match self.grant.take() {
            Some(grant) => grant.close().await,
            None => None,
        };
        if let Some(summary) = &host_calls {
            self.state
                .metrics
                .host_calls(grant_profile(&self.req), summary);
        }
        let outcome = outcome.map_err(|e| answer_error(e, &self.state.metrics))?;
        let resp = match outcome {
            Done::Snippet(out) => answer_snippet(
                &self.arrived,
                &self.req,
                self.description.sandbox,
                self.tier,
                &self.description.policy,
                out,
            ),
            Done::Project(out) => answer_project(
                &self.arrived,
                &self.req,
                self.description.sandbox,
                self.tier,
                &self.description.policy,
                out,
            ),
        };
        audit(
            &self.principal,
            &self.req,
            code_bytes,
            &resp,
            self.arrived.started,
            host_calls.as_ref(),
        );
        Ok(resp)
    }
}

/// What a job produced.
enum Done {
    Snippet(SnippetOutcome),
    Project(ProjectReport),
}

/// The run's effective timeout: the request's, defaulted and clamped to the payload
/// kind's ceiling.
fn run_timeout(state: &State, req: &RunRequest, description: &Description) -> Duration {
    let (default_ms, ceiling_ms) = match req.payload.as_ref() {
        Some(run_request::Payload::Project(_)) => (
            state.provider.default_project_timeout_ms(),
            description.project.max_timeout_ms,
        ),
        _ => (
            state.provider.default_timeout_ms(),
            description.javascript.max_timeout_ms,
        ),
    };
    let ms = validate::effective_timeout_ms(req.timeout_ms, default_ms, ceiling_ms);
    Duration::from_millis(u64::from(ms))
}

/// Step 5 (wire.md §6.6): no profile, no grant; a profile name over 128 bytes is invalid;
/// with grants off every profile is unavailable; a payload kind without a credential-safe
/// path on this provider is unsupported; else the broker opens the run's grant for this
/// caller, until the run's deadline, or refuses.
async fn select_grant(
    state: &State,
    principal: &Principal,
    req: &RunRequest,
    description: &Description,
    timeout: Duration,
) -> Result<Option<OpenGrant>, Refusal> {
    let (profile, supported, kind) = match req.payload.as_ref() {
        Some(run_request::Payload::Javascript(js)) => (
            js.grant_profile.as_str(),
            description.supports_javascript_grants,
            PayloadKind::Javascript,
        ),
        Some(run_request::Payload::Project(p)) => (
            p.grant_profile.as_str(),
            description.supports_project_grants,
            PayloadKind::Project,
        ),
        _ => return Ok(None),
    };
    let Some(profile) = check_profile(state, profile, supported, kind, description)? else {
        return Ok(None);
    };
    let deadline = SystemTime::now() + timeout + GRANT_SLACK;
    state
        .grants
        .open(profile, principal, deadline)
        .await
        .map(Some)
}

/// Step 5's checks before the broker is asked, for a run or a session call: no profile, no
/// grant; a name over 128 bytes is invalid; with grants off every profile is unavailable; a
/// payload kind without a credential-safe path on this provider is unsupported.
pub(super) fn check_profile<'a>(
    state: &State,
    profile: &'a str,
    supported: bool,
    kind: PayloadKind,
    description: &Description,
) -> Result<Option<&'a str>, Refusal> {
    if profile.is_empty() {
        return Ok(None);
    }
    if profile.len() > grant::MAX_PROFILE_NAME_BYTES {
        return Err(Refusal::InvalidRequest(format!(
            "grant_profile is {} bytes; at most {} are allowed",
            profile.len(),
            grant::MAX_PROFILE_NAME_BYTES
        )));
    }
    // Grants off: every profile is unknown, whatever the provider could do.
    if !state.grants.enabled() {
        return Err(grant::unavailable(profile));
    }
    if !supported {
        return Err(Refusal::Unsupported(format!(
            "the {} provider has no credential-safe grant path for a {} payload; nothing ran",
            description.sandbox,
            kind.as_str()
        )));
    }
    Ok(Some(profile))
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
    mut out: SnippetOutcome,
) -> RunResponse {
    let result = out.take_result();
    let resp = RunResponse {
        sandbox: sandbox.to_owned(),
        isolation: tier.as_str().to_owned(),
        duration_ms: i64::try_from(out.duration.as_millis()).unwrap_or(i64::MAX),
        software_identity: out.software_identity,
        environment: out.environment,
        instance: out.instance,
        result: Some(run_response::Result::Javascript(Box::new(result))),
        ..Default::default()
    };
    arrived.seal_single(resp, req, policy)
}

fn answer_project(
    arrived: &Answer,
    req: &RunRequest,
    sandbox: &str,
    tier: IsolationTier,
    policy: &str,
    out: ProjectReport,
) -> RunResponse {
    let resp = RunResponse {
        sandbox: sandbox.to_owned(),
        isolation: tier.as_str().to_owned(),
        // wire.md §5.3: for projects, the handler's own clock.
        duration_ms: i64::try_from(arrived.started.elapsed().as_millis()).unwrap_or(i64::MAX),
        software_identity: out.software_identity,
        environment: out.environment,
        instance: out.instance,
        result: Some(run_response::Result::Project(Box::new(out.result))),
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
    host_calls: Option<&broker::control::protocol::RunSummary>,
) {
    let (exit_code, timed_out, outcome) = match &resp.result {
        Some(run_response::Result::Javascript(js)) => (js.exit_code, js.timed_out, ""),
        Some(run_response::Result::Project(p)) => (
            p.steps.last().map_or(0, |s| s.exit_code),
            p.outcome == ProjectOutcome::PROJECT_OUTCOME_TIMED_OUT,
            outcome_name(p.outcome.to_i32()),
        ),
        _ => (0, false, ""),
    };
    let trace = validate::trace_id(&req.trace_id);
    let nonzero = |n: u64| (n > 0).then_some(n);
    tracing::info!(
        op = "run",
        caller = principal.audit_key(),
        grant_profile = grant_profile(req),
        host_calls = host_calls.map(|h| h.calls),
        host_calls_denied = host_calls.and_then(|h| nonzero(h.denied)),
        host_calls_shed = host_calls.and_then(|h| nonzero(h.shed)),
        host_calls_dropped = host_calls.and_then(|h| nonzero(h.dropped)),
        code_bytes,
        sandbox = %resp.sandbox,
        isolation = %resp.isolation,
        exit_code,
        timed_out,
        outcome,
        duration_ms = started.elapsed().as_millis() as u64,
        trace_id = trace.unwrap_or_default(),
        trace_id_rejected = trace.is_none() && !req.trace_id.is_empty(),
        "code run"
    );
}

/// The request's `grant_profile`, or "".
fn grant_profile(req: &RunRequest) -> &str {
    match req.payload.as_ref() {
        Some(run_request::Payload::Javascript(js)) => &js.grant_profile,
        Some(run_request::Payload::Project(p)) => &p.grant_profile,
        _ => "",
    }
}

/// A project outcome's client name (wire.md §5.4), for the log.
fn outcome_name(number: i32) -> &'static str {
    match number {
        1 => "completed",
        2 => "setup_failed",
        3 => "timed_out",
        4 => "protocol_error",
        5 => "runner_failed",
        _ => "unspecified",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;
    use plimsoll::refusal::PROTOCOL;
    use plimsoll::tier::IsolationTier;
    use plimsoll::wire::{JavaScriptRun, RunRequest};
    use tokio::sync::Notify;

    use super::*;
    use crate::admission::Admission;
    use crate::config::admission::Limits;
    use crate::metrics::Metrics;
    use crate::provider::{Environment, Provider, TierEvidence};

    /// A provider whose one run lasts until the test opens its gate: it stands in for
    /// a sandbox that outlives its caller.
    struct Gated {
        gate: Notify,
    }

    #[async_trait]
    impl Provider for Gated {
        async fn preflight(&self) -> Result<TierEvidence, ProviderError> {
            unreachable!("the handler never preflights")
        }

        async fn prove(&self) -> Result<TierEvidence, ProviderError> {
            unreachable!("the handler never proves")
        }

        async fn ready(&self) -> Result<(), String> {
            Ok(())
        }

        fn current_tier(&self) -> IsolationTier {
            IsolationTier::Process
        }

        fn describe(&self) -> Description {
            Description {
                sandbox: "gated",
                javascript: Environment {
                    max_timeout_ms: 30_000,
                    ..Environment::default()
                },
                ..Description::default()
            }
        }

        async fn run_snippet(&self, _run: SnippetRun) -> Result<SnippetOutcome, ProviderError> {
            self.gate.notified().await;
            Ok(SnippetOutcome::default())
        }
    }

    /// A gated provider, the handler state around it, and a caller `a` with every scope.
    fn gated() -> (Arc<Gated>, Arc<State>, Principal) {
        let provider = Arc::new(Gated {
            gate: Notify::new(),
        });
        let caller = Principal {
            id: Some("a".to_owned()),
            scopes: vec!["*".to_owned()],
        };
        (provider.clone(), state(provider), caller)
    }

    fn state(provider: Arc<Gated>) -> Arc<State> {
        let metrics = Arc::new(Metrics::default());
        let limits = Limits {
            max_concurrent: 1,
            per_key_concurrent: 0,
            rate_per_min: 0,
            rate_burst: 0,
            total_memory_mb: 0,
            per_run_memory_mb: 256,
            clamped: false,
        };
        Arc::new(State {
            sessions: crate::session::Sessions::new(
                Default::default(),
                provider.clone(),
                Admission::new(limits, metrics.clone()),
            ),
            provider,
            proven: IsolationTier::Process,
            resources: Default::default(),
            admission: Admission::new(limits, metrics.clone()),
            metrics,
            grants: Arc::new(crate::grant::Grants::off()),
        })
    }

    fn snippet() -> RunRequest {
        RunRequest {
            protocol: PROTOCOL,
            payload: Some(
                JavaScriptRun {
                    code: "1".to_owned(),
                    ..Default::default()
                }
                .into(),
            ),
            ..Default::default()
        }
    }

    async fn until(what: &str, done: impl Fn() -> bool) {
        for _ in 0..1_000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("{what} did not happen within 2 s");
    }

    #[tokio::test]
    async fn a_run_whose_caller_hangs_up_keeps_its_slot_to_the_end_and_is_still_counted() {
        let (provider, state, caller) = gated();
        // The caller waits a moment, then goes away: its handler future is dropped.
        let gone = tokio::time::timeout(
            Duration::from_millis(50),
            handle(&state, &caller, snippet()),
        )
        .await;
        assert!(gone.is_err(), "the gated run cannot have answered");
        assert_eq!(state.admission.in_flight(), 1, "the sandbox still runs");
        assert!(
            state.admission.admit("b").is_err(),
            "no over-admission while it runs"
        );
        assert!(state.metrics.render().contains("plimsoll_runs_total 0\n"));

        provider.gate.notify_one();
        until("the slot's release", || state.admission.in_flight() == 0).await;
        assert!(
            state.metrics.render().contains("plimsoll_runs_total 1\n"),
            "the run was counted by the time its slot came back"
        );
        assert!(state.admission.admit("b").is_ok());
    }

    #[tokio::test]
    async fn a_project_on_a_provider_without_projects_is_refused_and_runs_nothing() {
        let (provider, state, caller) = gated();
        let req = RunRequest {
            protocol: PROTOCOL,
            payload: Some(
                plimsoll::wire::ProjectRun {
                    steps: vec!["true".to_owned()],
                    ..Default::default()
                }
                .into(),
            ),
            ..Default::default()
        };
        let refused = handle(&state, &caller, req).await;
        let err = refused.expect_err("projects are unsupported here");
        assert!(
            err.to_string().contains("cannot run a project payload"),
            "{err}"
        );
        assert_eq!(state.admission.in_flight(), 0);
        assert!(state.metrics.render().contains("plimsoll_runs_total 0\n"));
        // The trait's own default refuses too, for a provider that claims support by mistake.
        let plan = ProjectPlan {
            files: Vec::new(),
            steps: vec!["true".to_owned()],
            artifacts: Vec::new(),
            timeout: Duration::from_secs(1),
            hold: Hold::default(),
            grant: None,
        };
        assert!(matches!(
            provider.run_project(plan).await,
            Err(ProviderError::Refused(_))
        ));
    }
}
