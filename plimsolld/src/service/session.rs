//! `OpenSession`, `SessionRun` and `CloseSession` (wire.md §7). Each handler is a list of
//! named steps in the spec's order; the session table (`crate::session`) keeps the turn, the
//! chain and the ends, and the call itself runs in its own task, so a caller that hangs up
//! never leaves a call half-recorded.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use buffa::MessageField;
use connectrpc::{ConnectError, ErrorCode, ErrorDetail};
use plimsoll::payload::{Payload, PayloadKind};
use plimsoll::record;
use plimsoll::refusal::{Refusal, UNANSWERED_CALL_TYPE, session_ended_under_call};
use plimsoll::validate;
use plimsoll::wire::{
    CellResult, CloseSessionRequest, CloseSessionResponse, OpenSessionRequest, OpenSessionResponse,
    RunResponse, SessionEnd, SessionRunRequest, SessionRunResponse, UnansweredCall, run_response,
};

use super::run::{GRANT_SLACK, check_floor, check_profile, check_software};
use super::{State, internal, provider_error};
use crate::auth::Principal;
use crate::grant::{Closed, GuestGrant, OpenGrant, SessionSlot};
use crate::provider::{CellCall, Hold, ProjectPlan, SessionFault, SessionSandbox};
use crate::record::Arrival;
use crate::session::{Entry, OpenTerms, Sessions, Stated, Turn, TurnGuard, terms};
use broker::control::protocol::RunSummary;
use tokio::sync::oneshot;

// === OpenSession ===

/// Opens a session: the request's rate token, envelope checks, sessions on, owner,
/// languages, floor and rule against the session environment, then the table (caps,
/// admission), the broker's socket and the provider's sandbox.
pub(super) async fn open(
    state: &Arc<State>,
    principal: &Principal,
    req: OpenSessionRequest,
) -> Result<OpenSessionResponse, ConnectError> {
    state.admission.take_token(principal.audit_key())?;
    validate::check_protocol(req.protocol)?;
    let floor = validate::check_floor(&req.minimum_isolation)?;
    let rule = req.software_rule.as_option().cloned();
    validate::check_software_rule(rule.as_ref())?;
    let description = state.provider.describe();
    let config = *state.sessions.config();
    if !config.enabled() || !description.supports_sessions {
        return Err(Refusal::Unsupported(format!(
            "sessions are off: the {} provider keeps no sessions on this daemon",
            description.sandbox
        ))
        .into());
    }
    terms::check_owner(&req.owner)?;
    let languages = terms::languages(&req.languages, &description.session.languages)?;
    let tier = state.current_tier();
    check_floor(floor, tier)?;
    check_software(rule.as_ref(), &description.session.software_identity)?;
    let lifetime = terms::lifetime(req.lifetime_ms, config.lifetime);
    let idle = terms::idle(req.idle_timeout_ms, config.idle);
    let id = hex::encode(rand::random::<[u8; 16]>());
    let fingerprint = record::session_fingerprint(&id);
    let expires_unix_ms = unix_ms_now().saturating_add(duration_ms_i64(lifetime));
    let expires_at = tokio::time::Instant::now() + lifetime;
    let terms = OpenTerms {
        caller: principal.audit_key().to_owned(),
        owner: req.owner.clone(),
        lifetime,
        languages,
        paid_allowance: principal.paid_seconds_per_day,
    };
    let sandbox = description.sandbox;
    let policy = description.policy.clone();
    let caller = terms.caller.clone();
    let owner = terms.owner.clone();
    // Grants (grants.md §3): a running sandbox cannot gain a mount, so the session's broker
    // socket is opened at open, whenever this provider has a grant path at all; the table
    // asks for it only once the open is admitted.
    let grant_path = description.supports_javascript_grants || description.supports_project_grants;
    let grants = Arc::clone(&state.grants);
    let delivery = state.provider.grant_delivery();
    let call_tokens = state.provider.session_call_tokens();
    let slot = async move {
        if grant_path {
            grants
                .open_session_slot(SystemTime::now() + lifetime, delivery, call_tokens)
                .await
        } else {
            None
        }
    };
    let sessions = Arc::clone(&state.sessions);
    let stated_id = id.clone();
    let stated_fingerprint = fingerprint.clone();
    // In its own task: a caller that hangs up mid-open leaves a session that ends unclaimed,
    // never a container nobody tracks.
    let opening = tokio::spawn(async move {
        sessions
            .open(terms, slot, move |opened| Stated {
                id: stated_id,
                fingerprint: stated_fingerprint,
                caller,
                owner,
                sandbox,
                tier,
                environment: opened.environment.clone(),
                software_identity: opened.software_identity.clone(),
                instance: crate::record::checked_instance(opened.instance.clone()),
                policy,
                rule,
                expires_unix_ms,
                expires_at,
                idle,
            })
            .await
    });
    let entry = opening
        .await
        .map_err(|e| internal(&format!("session open task failed: {e}")))?
        .map_err(provider_error)?;
    tracing::info!(
        op = "open_session",
        caller = principal.audit_key(),
        session = %short(&entry.stated.fingerprint),
        isolation = %tier,
        lifetime_ms = duration_ms_i64(lifetime),
        idle_ms = duration_ms_i64(idle),
        "session opened"
    );
    Ok(OpenSessionResponse {
        session_id: id,
        session: fingerprint,
        sandbox: sandbox.to_owned(),
        isolation: tier.as_str().to_owned(),
        expires_unix_ms,
        idle_timeout_ms: u32::try_from(idle.as_millis()).unwrap_or(u32::MAX),
        software_identity: entry.stated.software_identity.clone(),
        ..Default::default()
    })
}

// === SessionRun ===

/// Runs one call in a session: the request's rate token, the envelope, the lookup (which
/// claims the session, even for a request refused later), payload, grant, the restated
/// rule, floor and rule against the session, then the turn (no slot: the session holds
/// its own).
pub(super) async fn run(
    state: &Arc<State>,
    principal: &Principal,
    req: SessionRunRequest,
) -> Result<SessionRunResponse, ConnectError> {
    let arrived = Arrival::now();
    state.admission.take_token(principal.audit_key())?;
    validate::check_protocol(req.protocol)?;
    let floor = validate::check_floor(&req.minimum_isolation)?;
    let rule = req.software_rule.as_option();
    validate::check_software_rule(rule)?;
    let entry = state
        .sessions
        .find(&req.session_id, principal.audit_key())?;
    entry.claim();
    let payload = Payload::of_session_run(req.payload.as_ref());
    let kind = validate::check_payload(payload, true)?;
    let profile = check_grant_profile(state, principal, payload, kind)?;
    terms::check_call_rule(entry.stated.rule.as_ref(), rule)?;
    check_floor(floor, entry.stated.tier)?;
    check_software(rule, &entry.stated.software_identity)?;
    let job = job(state, payload, req.timeout_ms)?;
    let call = Call {
        state: Arc::clone(state),
        entry,
        arrived,
        req,
        kind,
        principal: principal.clone(),
        profile,
    };
    // The call runs in its own task, so a caller going away cannot cut a started call (and
    // its record) in half. Until it has the turn nothing has run: a caller gone by then
    // withdraws it (`caller` is dropped with this handler's future).
    let (_caller, gone) = oneshot::channel::<Infallible>();
    tokio::spawn(call.run(job, gone))
        .await
        .map_err(|e| internal(&format!("session call task failed: {e}")))?
}

/// The grant checks made before the turn (wire.md §6.6): the request's, then the profile,
/// the caller and `allow_in_sessions` against the broker's catalogue. The broker checks
/// them again when the call lends the grant, holding the turn.
fn check_grant_profile(
    state: &State,
    principal: &Principal,
    payload: Payload<'_>,
    kind: PayloadKind,
) -> Result<Option<String>, Refusal> {
    let description = state.provider.describe();
    let Some(profile) = check_profile(state, payload.grant_profile(), kind, &description)? else {
        return Ok(None);
    };
    state.grants.select(profile, principal, true)?;
    Ok(Some(profile.to_owned()))
}

/// What a session call runs.
enum Job {
    /// The code, its timeout and the grant the call lent, if any.
    Snippet(String, Duration, Option<Arc<GuestGrant>>),
    Project(ProjectPlan),
    Cell(CellCall),
}

/// The call's job. Snippets get the JavaScript environment's timeouts, projects the project
/// environment's and cells the session environment's (the project timeouts, providers.md §7).
fn job(state: &State, payload: Payload<'_>, timeout_ms: i32) -> Result<Job, Refusal> {
    let d = state.provider.describe();
    Ok(match payload {
        Payload::Javascript(js) => {
            Job::Snippet(js.code.clone(), d.javascript.timeout(timeout_ms), None)
        }
        Payload::Project(p) => Job::Project(ProjectPlan {
            files: p.files.clone(),
            steps: p.steps.clone(),
            artifacts: p.artifacts.clone(),
            timeout: d.project.timeout(timeout_ms),
            hold: Hold::default(),
            // Set once the call has lent its grant, holding the turn.
            grant: None,
        }),
        Payload::Cell(c) => Job::Cell(CellCall {
            language: c.language.clone(),
            code: c.code.clone(),
            files: c.files.clone(),
            timeout: d.session.timeout(timeout_ms),
        }),
        Payload::None | Payload::Module(_) => {
            return Err(Refusal::InvalidRequest(
                "payload must be exactly one of javascript, project or cell".to_owned(),
            ));
        }
    })
}

impl Job {
    /// The job with the grant its call lent (cells never carry one: validation refuses it).
    fn with_grant(self, grant: Arc<GuestGrant>) -> Job {
        match self {
            Job::Snippet(code, timeout, _) => Job::Snippet(code, timeout, Some(grant)),
            Job::Project(mut plan) => {
                plan.grant = Some(grant);
                Job::Project(plan)
            }
            cell @ Job::Cell(_) => cell,
        }
    }
}

/// One admitted session call, owned by the task that runs it.
struct Call {
    state: Arc<State>,
    entry: Arc<Entry>,
    arrived: Arrival,
    req: SessionRunRequest,
    kind: PayloadKind,
    principal: Principal,
    /// The `grant_profile` the call names, checked as far as the daemon can.
    profile: Option<String>,
}

impl Call {
    /// Takes the turn, proves the sandbox, runs the job, chains the record, answers, and
    /// leaves the sweep to run after the answer (its verdict reaches the next call).
    async fn run(
        self,
        job: Job,
        mut gone: oneshot::Receiver<Infallible>,
    ) -> Result<SessionRunResponse, ConnectError> {
        let withdrawn = || {
            tracing::debug!("a session call's caller went away before its turn; nothing ran");
            Refusal::AtCapacity(
                "the caller went away while the call waited for the session's turn; nothing ran"
                    .to_owned(),
            )
        };
        let mut turn = tokio::select! {
            biased;
            turn = self.entry.take_turn() => turn?,
            _ = &mut gone => return Err(withdrawn().into()),
        };
        // Gone at the same instant: the turn is handed on untouched.
        if !matches!(gone.try_recv(), Err(oneshot::error::TryRecvError::Empty)) {
            drop(turn);
            return Err(withdrawn().into());
        }
        if let Err(fault) = self.entry.prepare(&mut turn, &self.state.admission).await {
            drop(turn);
            return Err(self.refuse_before(fault).into());
        }
        let Turn { sandbox, slot, .. } = &mut *turn;
        let Some(sandbox) = sandbox.as_mut() else {
            return Err(self.entry.ended_refusal().into());
        };
        // The grant is lent only now: the turn keeps one call's grant on the socket at a time.
        // What earlier calls left running (cell interpreters) is held stopped first, so only
        // this call's processes can use it.
        let mut lent = None;
        let job = match &self.profile {
            None => job,
            Some(profile) => {
                let kept = match sandbox.hold_kept().await {
                    Ok(kept) => kept,
                    Err(fault) => {
                        drop(turn);
                        return Err(self.refuse_before(fault).into());
                    }
                };
                match self.lend(slot.as_ref(), profile, &job, kept).await {
                    Ok(grant) => {
                        let job = job.with_grant(grant.guest());
                        lent = Some(grant);
                        job
                    }
                    Err(refusal) => {
                        sandbox.release_kept().await;
                        drop(turn);
                        return Err(refusal.into());
                    }
                }
            }
        };
        // A session that ends under the call (its lifetime, the drain) cuts the call short:
        // its sandbox is being removed, and what ran is recorded as unanswered.
        let ran = tokio::select! {
            ran = run_job(sandbox.as_mut(), job) => ran,
            ended = self.entry.until_ended() => Err(SessionFault::Ended {
                reason: ended.reason,
                detail: ended.detail,
            }),
        };
        if !matches!(ran, Err(SessionFault::Refused(_))) {
            self.state.metrics.run_dispatched();
        }
        // The call's code has ended: the socket goes back to answering 503 before the answer
        // (and before the sweep), so nothing the call left running keeps its grant.
        let mut host_calls = None;
        let mut unrevoked = false;
        if let (Some(grant), Some(profile)) = (lent, &self.profile) {
            match grant.close().await {
                Closed::Counted(summary) => {
                    self.state.metrics.host_calls(profile, &summary);
                    host_calls = Some(summary);
                }
                Closed::Gone => {}
                Closed::Unconfirmed => unrevoked = true,
            }
        }
        // A grant the broker may still answer with: what earlier calls left stays held, and
        // the session ends below (its sandbox goes), so nothing left in it can use the grant.
        if self.profile.is_some() && !unrevoked {
            sandbox.release_kept().await;
        }
        let answer = match ran {
            Ok((result, measured)) => {
                Ok(self.answer(&mut turn, result, measured, host_calls.as_ref()))
            }
            // Nothing of the call ran, but a cell may have started launching an interpreter:
            // the sweep still proves the boundary before the next call.
            Err(SessionFault::Refused(r)) => Err(r.into()),
            Err(SessionFault::Ended { reason, detail }) => {
                let err = session_ended_under_call(reason, &detail, |code| {
                    self.unanswered_detail(&mut turn, code)
                });
                drop(turn);
                self.state.sessions.end(&self.entry, reason, &detail);
                return Err(err);
            }
            Err(SessionFault::Infrastructure(cause)) => {
                self.state.metrics.run_failed();
                let id = internal(&cause.to_string());
                Err(self.unanswered_from(&mut turn, id))
            }
        };
        if unrevoked {
            drop(turn);
            self.state.sessions.end(
                &self.entry,
                SessionEnd::SESSION_END_BOUNDARY_FAILED,
                "the grant broker did not confirm that the call's grant was taken back, so the \
                 session ended: nothing left in its sandbox can use the grant",
            );
            return answer;
        }
        sweep_after(
            Arc::clone(&self.state.sessions),
            Arc::clone(&self.entry),
            turn,
        );
        answer
    }

    /// Lends the call's grant to the session's socket until the job's deadline.
    async fn lend(
        &self,
        slot: Option<&SessionSlot>,
        profile: &str,
        job: &Job,
        kept_from_earlier_calls: u32,
    ) -> Result<OpenGrant, Refusal> {
        let timeout = match job {
            Job::Snippet(_, timeout, _) => *timeout,
            Job::Project(plan) => plan.timeout,
            Job::Cell(call) => call.timeout,
        };
        self.state
            .grants
            .lend(
                slot,
                profile,
                &self.principal,
                SystemTime::now() + timeout + GRANT_SLACK,
                kept_from_earlier_calls,
            )
            .await
    }

    /// A fault before the call ran: the session either goes on (a refusal) or ends here.
    fn refuse_before(&self, fault: SessionFault) -> Refusal {
        match fault {
            SessionFault::Refused(r) => r,
            SessionFault::Ended { reason, detail } => {
                self.state.sessions.end(&self.entry, reason, &detail);
                self.entry.ended_refusal()
            }
            SessionFault::Infrastructure(cause) => {
                tracing::warn!(error = %cause, "session read-back failed");
                Refusal::Environment(
                    "the session's sandbox could not be shown to be the one opened; nothing ran"
                        .to_owned(),
                )
            }
        }
    }

    /// The answer, sealed into the chain; `measured` is the provider's measure of the run,
    /// `None` for the handler's clock.
    fn answer(
        &self,
        turn: &mut TurnGuard,
        result: run_response::Result,
        measured: Option<Duration>,
        host_calls: Option<&RunSummary>,
    ) -> SessionRunResponse {
        let s = &self.entry.stated;
        let duration = measured.unwrap_or_else(|| self.arrived.started.elapsed());
        let resp = RunResponse {
            sandbox: s.sandbox.to_owned(),
            isolation: s.tier.as_str().to_owned(),
            duration_ms: duration_ms_i64(duration),
            software_identity: s.software_identity.clone(),
            environment: s.environment.clone(),
            instance: s.instance.clone(),
            result: Some(result),
            ..Default::default()
        };
        let resp = self.arrived.seal_call(resp, &self.req, s, &mut turn.chain);
        let ended = self.entry.ended();
        let trace = validate::trace_id(&self.req.trace_id);
        tracing::info!(
            op = "session_run",
            caller = %self.entry.stated.caller,
            session = %short(&self.entry.stated.fingerprint),
            kind = self.kind.as_str(),
            sequence = turn.chain.sequence,
            grant_profile = self.profile.as_deref().unwrap_or_default(),
            host_calls = host_calls.map(|h| h.calls),
            host_calls_denied = host_calls.map(|h| h.denied).filter(|&n| n > 0),
            duration_ms = resp.duration_ms,
            trace_id = trace.unwrap_or_default(),
            trace_id_rejected = trace.is_none() && !self.req.trace_id.is_empty(),
            "code run"
        );
        SessionRunResponse {
            run: MessageField::some(resp),
            ended: ended
                .as_ref()
                .map_or(SessionEnd::SESSION_END_UNSPECIFIED, |e| e.reason)
                .into(),
            end_detail: ended.map(|e| e.detail).unwrap_or_default(),
            ..Default::default()
        }
    }

    /// `err` for a call that may have run but has no result, with its `UnansweredCall` detail.
    fn unanswered_from(&self, turn: &mut TurnGuard, err: ConnectError) -> ConnectError {
        let detail = self.unanswered_detail(turn, err.code);
        err.with_detail(detail)
    }

    /// The `UnansweredCall` detail of a call whose error has `code`: its version-4 record
    /// states the code and counts in the chain.
    fn unanswered_detail(&self, turn: &mut TurnGuard, code: ErrorCode) -> ErrorDetail {
        let sealed = self.arrived.seal_unanswered_call(
            &self.req,
            code.as_str(),
            &self.entry.stated,
            &mut turn.chain,
        );
        let detail = UnansweredCall {
            record: MessageField::some(sealed),
            ..Default::default()
        };
        ErrorDetail::from_message(UNANSWERED_CALL_TYPE, &detail)
    }
}

/// Runs the job; answers its result and, for snippets and cells, the provider's own measure
/// of it (wire.md §5.3: a project's duration is the handler's clock).
async fn run_job(
    sandbox: &mut dyn SessionSandbox,
    job: Job,
) -> Result<(run_response::Result, Option<Duration>), SessionFault> {
    Ok(match job {
        Job::Snippet(code, timeout, grant) => {
            let mut out = sandbox.snippet(code, timeout, grant).await?;
            let duration = out.duration;
            (
                run_response::Result::Javascript(Box::new(out.take_result())),
                Some(duration),
            )
        }
        Job::Project(plan) => {
            let report = sandbox.project(plan).await?;
            (run_response::Result::Project(Box::new(report.result)), None)
        }
        Job::Cell(call) => {
            let out = sandbox.cell(call).await?;
            let cell = CellResult {
                stdout: out.stdout,
                stderr: out.stderr,
                exit_code: out.exit_code,
                timed_out: out.timed_out,
                stdout_truncated: out.stdout_truncated,
                stderr_truncated: out.stderr_truncated,
                interpreter_started: out.interpreter_started,
                interpreter_ended: out.interpreter_ended,
                ..Default::default()
            };
            (
                run_response::Result::Cell(Box::new(cell)),
                Some(out.duration),
            )
        }
    })
}

/// The sweep after the answer, still holding the turn: the next call waits for it, and a
/// session it ends is reported to that call.
fn sweep_after(sessions: Arc<Sessions>, entry: Arc<Entry>, mut turn: TurnGuard) {
    tokio::spawn(async move {
        let Some(sandbox) = turn.sandbox.as_mut() else {
            return;
        };
        let swept = sandbox.sweep().await;
        drop(turn);
        if let Err(fault) = swept {
            let (reason, detail) =
                fault.into_end("sweep", "the between-calls cleanup could not be proven");
            sessions.end(&entry, reason, &detail);
        }
    });
}

// === CloseSession ===

/// Closes a session: the protocol check, the lookup, then the close, which waits for an
/// in-flight call and for the sandbox's removal. The entry is gone afterwards. Never
/// refused for want of a rate token (closing frees what the caller holds), but a refused
/// close costs one if one is left.
pub(super) async fn close(
    state: &Arc<State>,
    principal: &Principal,
    req: CloseSessionRequest,
) -> Result<CloseSessionResponse, ConnectError> {
    let charged = |refusal: Refusal| {
        state.admission.spend_token(principal.audit_key());
        refusal
    };
    validate::check_protocol(req.protocol).map_err(charged)?;
    let entry = state
        .sessions
        .find(&req.session_id, principal.audit_key())
        .map_err(charged)?;
    let sessions = Arc::clone(&state.sessions);
    let closing = Arc::clone(&entry);
    let (calls, last, ended) = tokio::spawn(async move { sessions.close(&closing).await })
        .await
        .map_err(|e| internal(&format!("session close task failed: {e}")))??;
    tracing::info!(
        op = "close_session",
        caller = principal.audit_key(),
        session = %short(&entry.stated.fingerprint),
        calls,
        "session closed"
    );
    Ok(CloseSessionResponse {
        session: entry.stated.fingerprint.clone(),
        calls,
        last_record_sha256: last,
        ended: ended.reason.into(),
        ..Default::default()
    })
}

// === helpers ===

fn unix_ms_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn duration_ms_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The first 12 hex of a fingerprint, for the log (never the id).
fn short(fingerprint: &str) -> &str {
    fingerprint.get(..12).unwrap_or(fingerprint)
}
