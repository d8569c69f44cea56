//! A session: one sandbox kept for many calls, and the chain of records this client saw.
//!
//! Calls are serialized here as the daemon serializes them, so the chain this client keeps
//! follows the daemon's: a record that does not continue it means a call this client did not
//! make ran in the session, or a record was dropped or replayed ([`ClientError::Chain`]).
//! After any outcome this client could not check, it sends nothing more on the session.

use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::answer::{check_floor, check_run};
use super::error::{ClientError, Failure, data_loss, from_record_error, invalid, refused};
use super::options::{self, RunOptions};
use super::transport::Transport;
use crate::payload::PayloadKind;
use crate::record::{self, check, check_chain, check_unanswered};
use crate::refusal::{PROTOCOL, Reason, Refusal};
use crate::tier::Floor;
use crate::validate;
use crate::wire::{
    CellRun, CloseSessionRequest, CloseSessionResponse, JavaScriptRun, OpenSessionResponse,
    ProjectFile, RunRecord, RunResponse, SessionEnd, SessionRunRequest, SessionRunResponse,
    SoftwareRule, session_run_request,
};

/// Everything a session's client side holds, serializable so a command line can keep it in
/// a file between processes. It holds the session id, a capability: keep the file private.
#[derive(Clone, Serialize, Deserialize, Default)]
pub struct SessionState {
    /// The session id the daemon issued (32 hex). Sent only to the daemon.
    pub session_id: String,
    /// SHA-256 of the id, as the session's records carry it.
    pub fingerprint: String,
    /// The provider the session opened on.
    pub provider: String,
    /// The tier the daemon measured at open.
    pub isolation: String,
    /// The software identity stated at open.
    pub software_identity: String,
    /// The floor given at open, sent with every call.
    pub floor: String,
    /// The rule given at open.
    pub rule: Option<SoftwareRule>,
    /// Executed calls this client has seen (unanswered ones included).
    pub calls: u64,
    /// The last checked record's digest; `""` before the first call.
    pub last_record_sha256: String,
    /// Set once a call ended without an answer this client could check: why it stopped.
    pub stopped: Option<String>,
    /// The end the daemon reported, if any.
    pub ended: Option<String>,
    /// Whether this client closed the session.
    pub closed: bool,
}

// By hand: the session id names the session to the daemon, so it is never printed.
impl std::fmt::Debug for SessionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionState")
            .field("session_id", &"<redacted>")
            .field("fingerprint", &self.fingerprint)
            .field("provider", &self.provider)
            .field("isolation", &self.isolation)
            .field("software_identity", &self.software_identity)
            .field("floor", &self.floor)
            .field("rule", &self.rule)
            .field("calls", &self.calls)
            .field("last_record_sha256", &self.last_record_sha256)
            .field("stopped", &self.stopped)
            .field("ended", &self.ended)
            .field("closed", &self.closed)
            .finish()
    }
}

/// A session call's request as sent and its answer as received, after every check passed;
/// or, for a call that ended without an answer (`UnansweredCall`), the request and the
/// record the daemon chained for it, checked ([`ClientError::unanswered_call`]). The chain
/// counts both, so a saved session keeps both, in order.
#[derive(Clone, Serialize, Deserialize)]
pub struct SessionAnswer {
    /// The request exactly as sent.
    pub request: SessionRunRequest,
    /// The answer as received; empty for an unanswered call.
    #[serde(default)]
    pub response: SessionRunResponse,
    /// An unanswered call's record (there is no answer to carry it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unanswered: Option<RunRecord>,
}

// By hand: the request carries the session id, which is never printed.
impl std::fmt::Debug for SessionAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionAnswer")
            .field("response", &self.response)
            .field("unanswered", &self.unanswered)
            .finish_non_exhaustive()
    }
}

impl SessionAnswer {
    /// The run inside the answer (present on every checked answer; empty on an unanswered
    /// call).
    pub fn run(&self) -> &RunResponse {
        static EMPTY: std::sync::OnceLock<RunResponse> = std::sync::OnceLock::new();
        self.response
            .run
            .as_option()
            .unwrap_or_else(|| EMPTY.get_or_init(RunResponse::default))
    }

    /// The checked, chained record: the answer's, or an unanswered call's.
    pub fn record(&self) -> Option<&RunRecord> {
        match &self.unanswered {
            Some(rec) => Some(rec),
            None => self.run().record.as_option(),
        }
    }
}

/// What a session stated at open, against which an unanswered call's record is checked
/// (it has no answer of its own to be compared with).
#[derive(Debug, Clone, Copy)]
pub struct Opened<'a> {
    /// The session fingerprint its records carry.
    pub fingerprint: &'a str,
    /// The provider the session opened on.
    pub provider: &'a str,
    /// The tier measured at open.
    pub isolation: &'a str,
    /// The software identity stated at open.
    pub software_identity: &'a str,
}

impl SessionState {
    /// What this session stated at open.
    pub fn opened(&self) -> Opened<'_> {
        Opened {
            fingerprint: &self.fingerprint,
            provider: &self.provider,
            isolation: &self.isolation,
            software_identity: &self.software_identity,
        }
    }
}

struct Inner {
    state: SessionState,
    close: Option<Result<CloseSessionResponse, ClientError>>,
}

/// An open session on a daemon. Use [`Session::close`] when done: it checks the daemon's
/// count and last record against this client's chain.
pub struct Session {
    transport: Transport,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The id is a capability and is never printed.
        f.debug_struct("Session").finish_non_exhaustive()
    }
}

/// Which payload a session call carries.
enum Payload {
    Javascript(JavaScriptRun),
    Project(crate::wire::ProjectRun),
    Cell(CellRun),
}

impl Session {
    pub(crate) fn new(
        transport: Transport,
        open: &OpenSessionResponse,
        rule: Option<SoftwareRule>,
        floor: Floor,
    ) -> Session {
        Session::resume(
            transport,
            SessionState {
                session_id: open.session_id.clone(),
                fingerprint: open.session.clone(),
                provider: open.sandbox.clone(),
                isolation: open.isolation.clone(),
                software_identity: open.software_identity.clone(),
                floor: floor.to_string(),
                rule,
                ..SessionState::default()
            },
        )
    }

    pub(crate) fn resume(transport: Transport, state: SessionState) -> Session {
        Session {
            transport,
            inner: Mutex::new(Inner { state, close: None }),
        }
    }

    /// A copy of what this client holds about the session.
    pub async fn state(&self) -> SessionState {
        self.inner.lock().await.state.clone()
    }

    /// Runs a snippet in the session. `opts.minimum_isolation` may raise the session's floor
    /// for this call; a rule narrows the session's.
    pub async fn run_javascript(
        &self,
        code: &str,
        opts: &RunOptions,
    ) -> Result<SessionAnswer, ClientError> {
        let js = super::javascript(code, &opts.grant_profile);
        self.call(PayloadKind::Javascript, Payload::Javascript(js), opts)
            .await
    }

    /// Runs a project in the session; its files persist for later calls.
    pub async fn run_project(
        &self,
        files: &[(String, String)],
        steps: &[String],
        artifacts: &[String],
        opts: &RunOptions,
    ) -> Result<SessionAnswer, ClientError> {
        let p = super::project(files, steps, artifacts, &opts.grant_profile)?;
        self.call(PayloadKind::Project, Payload::Project(p), opts)
            .await
    }

    /// Runs `code` in the session's interpreter for `language` (`python` or `javascript`),
    /// after writing `files` into the work directory. A cell carries no grant profile: one
    /// in `opts` is refused before anything is sent, not dropped.
    pub async fn run_cell(
        &self,
        language: &str,
        code: &str,
        files: &[(String, String)],
        opts: &RunOptions,
    ) -> Result<SessionAnswer, ClientError> {
        if !opts.grant_profile.is_empty() {
            return Err(invalid(
                "a cell cannot be granted (grant_profile is for snippets and projects)",
            ));
        }
        let cell = CellRun {
            language: language.to_owned(),
            code: code.to_owned(),
            files: files
                .iter()
                .map(|(p, c)| ProjectFile {
                    path: p.clone(),
                    content: c.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        self.call(PayloadKind::Cell, Payload::Cell(cell), opts)
            .await
    }

    async fn call(
        &self,
        kind: PayloadKind,
        payload: Payload,
        opts: &RunOptions,
    ) -> Result<SessionAnswer, ClientError> {
        let mut inner = self.inner.lock().await;
        let close_called = inner.close.is_some();
        let st = &mut inner.state;
        if st.closed || close_called {
            let closed = Refusal::SessionEnded {
                reason: SessionEnd::SESSION_END_CLOSED,
                detail: String::new(),
            };
            return Err(refused(
                &closed,
                "plimsoll: this session was closed; nothing was sent",
            ));
        }
        // No row of the daemon's table: the session has not ended, this client stops on it
        // (wire.md §8.4 gives its code and mark).
        if let Some(why) = &st.stopped {
            return Err(ClientError::Other(Box::new(
                Failure::new(
                    "failed_precondition",
                    format!(
                        "plimsoll: an earlier call of this session ended without an answer this \
                         client could check ({why}); it may have run, so this client sends \
                         nothing more on the session: open a new one"
                    ),
                )
                .marked(Reason::Request),
            )));
        }
        let session_floor = options::floor(&st.floor)?;
        let floor = session_floor.stronger(options::floor(&opts.floor)?);
        let call_rule = options::rule(opts.rule.as_ref())?;
        let rule = options::merge_rules(st.rule.as_ref(), call_rule.as_ref())?;
        let payload = match payload {
            Payload::Javascript(j) => session_run_request::Payload::Javascript(Box::new(j)),
            Payload::Project(p) => session_run_request::Payload::Project(Box::new(p)),
            Payload::Cell(c) => session_run_request::Payload::Cell(Box::new(c)),
        };
        validate::check_session_payload(Some(&payload)).map_err(|r| invalid(r.to_string()))?;
        let request = SessionRunRequest {
            protocol: PROTOCOL,
            minimum_isolation: floor.to_string(),
            trace_id: options::trace_id(&opts.trace_id)?,
            timeout_ms: options::timeout_ms(opts.timeout),
            session_id: st.session_id.clone(),
            software_rule: rule.clone().into(),
            payload: Some(payload),
            ..Default::default()
        };
        let digest = record::session_request_digest(&request);
        let calls_before = st.calls;
        let result = self
            .exchange(st, kind, &request, rule.as_ref(), floor, &digest)
            .await;
        match result {
            Ok(response) => Ok(SessionAnswer {
                request,
                response,
                unanswered: None,
            }),
            Err(mut e) => {
                // Whatever ended the exchange, the call may have run: unless the error says
                // nothing ran, or the chain moved past this call, this client can no longer
                // follow the daemon's chain, so it sends nothing more.
                if e.not_dispatched_reason().is_none()
                    && st.calls == calls_before
                    && st.stopped.is_none()
                {
                    st.stopped = Some(e.to_string());
                }
                if let Some(rec) = e.unanswered_record().cloned() {
                    // Kept with its request, so the call can be saved and checked again.
                    e.failure_mut().unanswered_call = Some(Box::new(SessionAnswer {
                        request,
                        response: SessionRunResponse::default(),
                        unanswered: Some(rec),
                    }));
                }
                Err(e)
            }
        }
    }

    async fn exchange(
        &self,
        st: &mut SessionState,
        kind: PayloadKind,
        request: &SessionRunRequest,
        rule: Option<&SoftwareRule>,
        floor: Floor,
        digest: &str,
    ) -> Result<SessionRunResponse, ClientError> {
        let resp: SessionRunResponse = match self.transport.call("SessionRun", request).await {
            Ok(r) => r,
            Err(mut e) => {
                if let Some((reason, _)) = &e.failure().session_end {
                    st.ended = Some(end_name(*reason));
                }
                let Some(rec) = e.failure().unanswered.clone() else {
                    return Err(e);
                };
                if e.not_dispatched_reason().is_some() {
                    return Err(e);
                }
                // The call may have run and the daemon chained its record: check it and keep
                // it, so the session goes on and the call is not hidden.
                check_unanswered_record(
                    st.opened(),
                    (st.calls, &st.last_record_sha256),
                    &rec,
                    rule,
                    floor,
                    digest,
                )?;
                st.calls = rec.sequence;
                st.last_record_sha256 = rec.record_sha256.clone();
                e.failure_mut().unanswered_checked = true;
                return Err(e);
            }
        };
        let Some(run) = resp.run.as_option() else {
            return Err(ClientError::ResultKindMismatch(data_loss(
                "the session call's answer carries no run",
            )));
        };
        if let Some(end) = resp.ended.as_known() {
            if end != SessionEnd::SESSION_END_UNSPECIFIED {
                st.ended = Some(end_name(end));
            }
        } else {
            st.ended = Some("unknown".to_owned());
        }
        let rec = check_run(kind, run, floor, || {
            let rec = check(digest, rule, run)?;
            check_chain(rec, &st.fingerprint, st.calls, &st.last_record_sha256)?;
            Ok(rec.clone())
        })?;
        st.calls = rec.sequence;
        st.last_record_sha256 = rec.record_sha256;
        Ok(resp)
    }

    /// Ends the session (or collects one that ended by itself) and checks the daemon's
    /// `calls` and `last_record_sha256` against this client's chain: a difference is
    /// [`ClientError::Chain`] with the summary in [`Failure::close`]. Closing again returns
    /// the same outcome without another request.
    pub async fn close(&self) -> Result<CloseSessionResponse, ClientError> {
        let mut inner = self.inner.lock().await;
        if let Some(done) = &inner.close {
            return done.clone();
        }
        let request = CloseSessionRequest {
            protocol: PROTOCOL,
            session_id: inner.state.session_id.clone(),
            ..Default::default()
        };
        let summary: CloseSessionResponse = self.transport.call("CloseSession", &request).await?;
        let st = &mut inner.state;
        st.closed = true;
        if st.ended.is_none()
            && let Some(end) = summary.ended.as_known()
            && end != SessionEnd::SESSION_END_UNSPECIFIED
        {
            st.ended = Some(end_name(end));
        }
        let outcome = if summary.session != st.fingerprint
            || summary.calls != st.calls
            || summary.last_record_sha256 != st.last_record_sha256
        {
            let mut f = data_loss(format!(
                "the daemon counts {} calls ending {:?}, this client saw {} ending {:?}",
                summary.calls, summary.last_record_sha256, st.calls, st.last_record_sha256
            ));
            f.close = Some(Box::new(summary));
            Err(ClientError::Chain(f))
        } else {
            Ok(summary)
        };
        inner.close = Some(outcome.clone());
        outcome
    }
}

/// The checks on an unanswered call's record: the record's own (version, no result, a
/// Connect code, request digest, rule, own digest), the floor, the evidence stated at open,
/// and its place in the chain after call `calls` whose record was `last`.
fn check_unanswered_record(
    opened: Opened<'_>,
    (calls, last): (u64, &str),
    rec: &RunRecord,
    rule: Option<&SoftwareRule>,
    floor: Floor,
    digest: &str,
) -> Result<(), ClientError> {
    check_unanswered(digest, rule, rec).map_err(from_record_error)?;
    check_floor(floor, &rec.isolation)?;
    if (
        rec.provider.as_str(),
        rec.isolation.as_str(),
        rec.software_identity.as_str(),
    ) != (opened.provider, opened.isolation, opened.software_identity)
    {
        return Err(ClientError::RecordMismatch(data_loss(format!(
            "the unanswered call's record names {} at {:?} running {:?}, the session opened as \
             {} at {:?} running {:?}",
            rec.provider,
            rec.isolation,
            rec.software_identity,
            opened.provider,
            opened.isolation,
            opened.software_identity
        ))));
    }
    check_chain(rec, opened.fingerprint, calls, last).map_err(from_record_error)
}

/// A session end's short name, as the published client spells it.
pub(crate) fn end_name(end: SessionEnd) -> String {
    match end {
        SessionEnd::SESSION_END_UNSPECIFIED => "open",
        SessionEnd::SESSION_END_CLOSED => "closed",
        SessionEnd::SESSION_END_EXPIRED => "expired",
        SessionEnd::SESSION_END_DISK_EXCEEDED => "disk_exceeded",
        SessionEnd::SESSION_END_MAIN_PROCESS_ENDED => "main_process_ended",
        SessionEnd::SESSION_END_BOUNDARY_FAILED => "boundary_failed",
        SessionEnd::SESSION_END_SANDBOX_CHANGED => "sandbox_changed",
        SessionEnd::SESSION_END_SHUTDOWN => "shutdown",
        SessionEnd::SESSION_END_REPLACED => "replaced",
        SessionEnd::SESSION_END_NOT_FOUND => "not_found",
        SessionEnd::SESSION_END_UNCLAIMED => "unclaimed",
    }
    .to_owned()
}

/// Re-checks a session's saved calls offline, as the live client checked them: each
/// answered call's record against its saved request and response, each unanswered call's
/// record against its request and what the session stated at open, the floor, and the chain
/// from call 1. Returns the number of calls and the last record digest.
pub fn verify_chain(
    opened: Opened<'_>,
    answers: &[SessionAnswer],
) -> Result<(u64, String), ClientError> {
    let mut calls = 0u64;
    let mut last = String::new();
    for a in answers {
        let saved = |e: String| ClientError::RecordMismatch(data_loss(format!("a saved {e}")));
        let floor = Floor::parse(&a.request.minimum_isolation)
            .map_err(|e| saved(format!("request's floor: {e}")))?;
        let kind = validate::check_session_payload(a.request.payload.as_ref())
            .map_err(|e| saved(format!("request: {e}")))?;
        let digest = record::session_request_digest(&a.request);
        let rule = a.request.software_rule.as_option();
        let rec = match &a.unanswered {
            Some(rec) => {
                if a.response != SessionRunResponse::default() {
                    return Err(saved("unanswered call carries an answer".to_owned()));
                }
                check_unanswered_record(opened, (calls, &last), rec, rule, floor, &digest)?;
                rec.clone()
            }
            None => {
                let run = a.run();
                check_run(kind, run, floor, || {
                    let rec = check(&digest, rule, run)?;
                    check_chain(rec, opened.fingerprint, calls, &last)?;
                    Ok(rec.clone())
                })?
            }
        };
        calls = rec.sequence;
        last = rec.record_sha256;
    }
    Ok((calls, last))
}

/// Re-checks a saved session whole: the calls as [`verify_chain`] does, that each was sent
/// on this session with at least its floor, and that the totals are the state's own.
/// Returns the number of calls and the last record digest.
pub fn verify_session(
    state: &SessionState,
    answers: &[SessionAnswer],
) -> Result<(u64, String), ClientError> {
    let bad = |e: String| ClientError::RecordMismatch(data_loss(e));
    if record::session_fingerprint(&state.session_id) != state.fingerprint {
        return Err(bad(
            "the state's fingerprint is not its session id's".to_owned()
        ));
    }
    let session_floor = options::floor(&state.floor)?;
    for (n, a) in answers.iter().enumerate() {
        if a.request.session_id != state.session_id {
            return Err(bad(format!("saved call {} names another session", n + 1)));
        }
        let floor = Floor::parse(&a.request.minimum_isolation)
            .map_err(|e| bad(format!("saved call {}'s floor: {e}", n + 1)))?;
        if floor.stronger(session_floor) != floor {
            return Err(bad(format!(
                "saved call {} was sent below the session's floor {:?}",
                n + 1,
                state.floor
            )));
        }
    }
    let (calls, last) = verify_chain(state.opened(), answers)?;
    if calls != state.calls || last != state.last_record_sha256 {
        return Err(ClientError::Chain(data_loss(format!(
            "the state counts {} calls ending {:?}, the saved calls {calls} ending {last:?}",
            state.calls, state.last_record_sha256
        ))));
    }
    Ok((calls, last))
}
