//! `Run`: one payload in a fresh sandbox. The steps follow wire.md §6.1 in
//! order, so a reviewer can hold this file against the spec line by line, with two
//! additions (issue 12, part 1): the request's rate token is taken before step 1, and the
//! broker opens the run's grant only after admission, between steps 8 and 9. Step 5 judges
//! the profile from the broker's catalogue, so the answers and their order are the spec's,
//! and nothing a refused request causes reaches the broker.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use connectrpc::ConnectError;
use plimsoll::payload::{Payload, PayloadKind};
use plimsoll::record;
use plimsoll::refusal::Refusal;
use plimsoll::tier::{Floor, IsolationTier};
use plimsoll::validate;
use plimsoll::wire::{ProjectOutcome, RunRequest, RunResponse, SoftwareRule, run_response};

use super::{State, answer_error};
use crate::auth::Principal;
use crate::grant::{self, OpenGrant};
use crate::provider::{
    Description, Hold, ModulePlan, ModuleReport, ProjectPlan, ProjectReport, ProviderError,
    SnippetOutcome, SnippetRun,
};
use crate::record::Arrival;

/// How long past the run's timeout its grant stays open: a sandbox's start (a container's
/// create and start) comes before the guest's clock begins.
pub(super) const GRANT_SLACK: Duration = Duration::from_secs(5);

/// Handles one `Run` request.
pub(super) async fn handle(
    state: &Arc<State>,
    principal: &Principal,
    req: RunRequest,
) -> Result<RunResponse, ConnectError> {
    let arrived = Arrival::now();
    // 0: the request's rate token, kept whether it runs or is refused (README, Admission).
    state.admission.take_token(principal.audit_key())?;
    // 1–4: envelope and payload.
    validate::check_protocol(req.protocol)?;
    let floor = validate::check_floor(&req.minimum_isolation)?;
    let rule = req.software_rule.as_option();
    validate::check_software_rule(rule)?;
    let payload = Payload::of_run(req.payload.as_ref());
    let kind = validate::check_payload(payload, false)?;
    // 5: grant profile selection, judged here from the broker's catalogue.
    let description = state.provider.describe();
    let environment = description.environment(kind);
    let timeout = environment.timeout(req.timeout_ms);
    let profile = select_grant(state, principal, payload, kind, &description)?;
    // 6: the floor against the tier right now.
    let tier = state.current_tier();
    check_floor(floor, tier)?;
    // 7: the software rule against the selected environment.
    check_software(rule, &environment.software_identity)?;
    // 8: admission (slots, then the paid allowances on a metered provider); sheds at
    // once, never queues.
    let permit = state.admission.admit_run(
        principal.audit_key(),
        principal.paid_seconds_per_day,
        timeout,
    )?;
    // 8½: the broker opens the admitted run's grant (or refuses it; the slot is freed).
    // From here on every way out closes it: the open grant closes itself when dropped.
    let grant = match profile {
        Some(profile) => {
            let deadline = SystemTime::now() + timeout + GRANT_SLACK;
            let delivery = state.provider.grant_delivery();
            Some(
                state
                    .grants
                    .open(profile, principal, deadline, delivery)
                    .await?,
            )
        }
        None => None,
    };
    // 9: dispatch. The slot travels with the job: the provider frees it
    // when the sandbox is gone, which may be after the answer.
    let hold = Hold::admitted(permit);
    let guest = grant.as_ref().map(OpenGrant::guest);
    let job = match payload {
        Payload::Javascript(js) => Job::Snippet(SnippetRun {
            code: js.code.clone(),
            timeout,
            hold,
            grant: guest,
        }),
        Payload::Project(p) if description.supports_project => Job::Project(ProjectPlan {
            files: p.files.clone(),
            steps: p.steps.clone(),
            artifacts: p.artifacts.clone(),
            timeout,
            hold,
            grant: guest,
        }),
        Payload::Module(m) if description.supports_module => {
            Job::Module(module_plan(m, timeout, hold))
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
    Module(ModulePlan),
}

/// A module payload's plan (wire.md §6.5): validated in step 4; it never has a grant.
fn module_plan(m: &plimsoll::wire::ModuleRun, timeout: Duration, hold: Hold) -> ModulePlan {
    ModulePlan {
        model: m.model.clone(),
        rows: m.rows.clone(),
        end_time: m.end_time,
        step: m.step,
        timeout,
        hold,
    }
}

// === impl Dispatch ===

/// What an admitted run needs to finish, owned by the task that runs it.
struct Dispatch {
    state: Arc<State>,
    principal: Principal,
    arrived: Arrival,
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
        let outcome = match job {
            Job::Snippet(run) => self
                .state
                .provider
                .run_snippet(run)
                .await
                .map(Done::Snippet),
            Job::Project(plan) => self
                .state
                .provider
                .run_project(plan)
                .await
                .map(Done::Project),
            Job::Module(plan) => self.state.provider.run_module(plan).await.map(Done::Module),
        };
        // A provider's own refusal ran nothing, so it is not counted as a run.
        // Counted as soon as the provider is done; a provider whose sandbox
        // outlives the answer (docker's removal) still holds the slot.
        if !matches!(outcome, Err(ProviderError::Refused(_))) {
            self.state.metrics.run_dispatched();
        }
        // The sandbox has ended (whatever the outcome): revoke the grant before answering.
        let host_calls = match self.grant.take() {
            Some(grant) => grant.close().await.summary(),
            None => None,
        };
        let payload = Payload::of_run(self.req.payload.as_ref());
        if let Some(summary) = &host_calls {
            self.state
                .metrics
                .host_calls(payload.grant_profile(), summary);
        }
        let outcome = outcome.map_err(|e| answer_error(e, &self.state.metrics))?;
        let answer = match outcome {
            Done::Snippet(mut out) => {
                let result = out.take_result();
                Answer {
                    duration: out.duration,
                    software_identity: out.software_identity,
                    environment: out.environment,
                    instance: out.instance,
                    result: run_response::Result::Javascript(Box::new(result)),
                }
            }
            // wire.md §5.3: for projects, the handler's own clock.
            Done::Project(out) => Answer {
                duration: self.arrived.started.elapsed(),
                software_identity: out.software_identity,
                environment: out.environment,
                instance: out.instance,
                result: run_response::Result::Project(Box::new(out.result)),
            },
            // wire.md §5.3: for modules, the provider's own measure.
            Done::Module(out) => Answer {
                duration: out.duration,
                software_identity: out.software_identity,
                environment: out.environment,
                instance: out.instance,
                result: run_response::Result::Module(Box::new(out.result)),
            },
        };
        let resp = answer.seal(
            &self.arrived,
            &self.req,
            self.description.sandbox,
            self.tier,
            &self.description.policy,
        );
        audit(
            &self.principal,
            &self.req,
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
    Module(ModuleReport),
}

/// Step 5 (wire.md §6.6): no profile, no grant; a profile name over 128 bytes is invalid;
/// with grants off every profile is unavailable; a payload kind without a credential-safe
/// path on this provider is unsupported; an unknown profile or one this caller may not use
/// is unavailable (the broker's catalogue says). Returns the profile to open once the run
/// is admitted.
fn select_grant<'a>(
    state: &State,
    principal: &Principal,
    payload: Payload<'a>,
    kind: PayloadKind,
    description: &Description,
) -> Result<Option<&'a str>, Refusal> {
    let Some(profile) = check_profile(state, payload.grant_profile(), kind, description)? else {
        return Ok(None);
    };
    state.grants.select(profile, principal, false)?;
    Ok(Some(profile))
}

/// Step 5's checks of the request itself, for a run or a session call: no profile, no
/// grant; a name over 128 bytes is invalid; with grants off every profile is unavailable; a
/// payload kind without a credential-safe path on this provider is unsupported.
pub(super) fn check_profile<'a>(
    state: &State,
    profile: &'a str,
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
    if !description.supports_grants(kind) {
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

/// What a finished run answers, whatever its payload: sealed into the response and its record.
struct Answer {
    duration: Duration,
    software_identity: String,
    environment: String,
    instance: String,
    result: run_response::Result,
}

impl Answer {
    fn seal(
        self,
        arrived: &Arrival,
        req: &RunRequest,
        sandbox: &str,
        tier: IsolationTier,
        policy: &str,
    ) -> RunResponse {
        let resp = RunResponse {
            sandbox: sandbox.to_owned(),
            isolation: tier.as_str().to_owned(),
            duration_ms: i64::try_from(self.duration.as_millis()).unwrap_or(i64::MAX),
            software_identity: self.software_identity,
            environment: self.environment,
            instance: self.instance,
            result: Some(self.result),
            ..Default::default()
        };
        arrived.seal_single(resp, req, policy)
    }
}

fn audit(
    principal: &Principal,
    req: &RunRequest,
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
        Some(run_response::Result::Module(m)) => (
            0,
            m.outcome == ProjectOutcome::PROJECT_OUTCOME_TIMED_OUT,
            outcome_name(m.outcome.to_i32()),
        ),
        _ => (0, false, ""),
    };
    let trace = validate::trace_id(&req.trace_id);
    let nonzero = |n: u64| (n > 0).then_some(n);
    let payload = Payload::of_run(req.payload.as_ref());
    tracing::info!(
        op = "run",
        caller = principal.audit_key(),
        grant_profile = payload.grant_profile(),
        host_calls = host_calls.map(|h| h.calls),
        host_calls_denied = host_calls.and_then(|h| nonzero(h.denied)),
        host_calls_shed = host_calls.and_then(|h| nonzero(h.shed)),
        host_calls_dropped = host_calls.and_then(|h| nonzero(h.dropped)),
        code_bytes = payload.code_bytes(),
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
                    default_timeout_ms: 30_000,
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
            paid_seconds_per_day: None,
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
            paid_seconds_per_day: 0,
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

    #[tokio::test(start_paused = true)]
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

    #[tokio::test(start_paused = true)]
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
