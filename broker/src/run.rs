//! One open run: its grant, credential, budgets and trace, and the order of checks every
//! call goes through (`spec/grants.md` §2.2, steps numbered as there).
//!
//! A run holds the profile it opened with (an immutable snapshot), so a registry swap
//! never changes it. A run lent to a session charges its route caps to the session's shared
//! counts instead of its own ([`crate::route_caps`]). Ending a run flips a watch channel that
//! every in-flight upstream call selects on: the call is cut and answered 503, and later calls
//! get the same 503.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use crate::breaker::{Breaker, Gate};
use crate::control::protocol::RunSummary;
use crate::credential::Credential;
use crate::grants::{Profile, Target};
use crate::route_caps::{RouteCaps, SessionCounts};
use crate::trace::{Trace, TraceRow};
use crate::upstream::{Upstream, UpstreamError, UpstreamReply};

/// Calls of one run in flight at once.
pub const SLOTS: u32 = 16;
/// Largest request body.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// How long ending a run waits for calls in flight, so the trace is complete.
pub const END_WAIT: Duration = Duration::from_secs(2);
/// Time the guest has to send a request body.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on a health-check probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The broker's messages (`text/plain`, newline added on the wire).
pub mod message {
    /// Step 1 and any call after the end.
    pub const ENDED: &str = "host api grant has ended";
    /// Step 2.
    pub const CAPACITY: &str = "host api broker is at capacity";
    /// Step 3.
    pub const BUDGET: &str = "host api call budget exhausted";
    /// Step 4.
    pub const FORBIDDEN: &str = "forbidden by sandbox capability allowlist";
    /// Step 5.
    pub const ROUTE_CAP: &str = "host api route call limit reached";
    /// Step 6.
    pub const SHED: &str = "host api is shedding load; retry later";
    /// Step 7.
    pub const TOO_LARGE: &str = "host api request body too large";
    /// Step 7, a body slower than the read timeout.
    pub const BODY_TIMEOUT: &str = "host api request body not received in time";
    /// Upstream failures.
    pub const UNAVAILABLE: &str = "host api unavailable";
    /// A session socket's request from a process that is not the lent call's.
    pub const OUTSIDE_CALL: &str = "host api grant is lent to another call";
}

/// What the guest gets back.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: String,
    /// Body.
    pub body: Bytes,
}

impl Reply {
    /// A broker-generated answer: the message and a newline, `text/plain`.
    pub fn broker(status: u16, message: &str) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8".into(),
            body: Bytes::from(format!("{message}\n")),
        }
    }
}

struct State {
    trace: Trace,
    breaker: Breaker,
}

/// One open run.
pub struct Run {
    /// The run id plimsolld chose.
    pub id: String,
    /// The caller.
    pub principal: String,
    /// The grant, as it was when the run opened.
    pub profile: Arc<Profile>,
    credential: Option<Credential>,
    deadline: Instant,
    upstream: Upstream,
    ended: watch::Sender<bool>,
    slots: Arc<Semaphore>,
    state: Mutex<State>,
    caps: RouteCaps,
    kept_from_earlier_calls: u32,
    /// Requests refused because they came from outside the call ([`crate::peer_origin`]).
    outside_call: AtomicU64,
}

// === impl Run ===

impl Run {
    /// A run that may call until `deadline` (and is revoked by its owner after that).
    pub fn new(
        id: String,
        principal: String,
        profile: Arc<Profile>,
        credential: Option<Credential>,
        deadline: Instant,
        upstream: Upstream,
    ) -> Self {
        Self {
            caps: RouteCaps::own(&profile),
            id,
            principal,
            profile,
            credential,
            deadline,
            upstream,
            ended: watch::Sender::new(false),
            slots: Arc::new(Semaphore::new(SLOTS as usize)),
            state: Mutex::new(State {
                trace: Trace::default(),
                breaker: Breaker::default(),
            }),
            kept_from_earlier_calls: 0,
            outside_call: AtomicU64::new(0),
        }
    }

    /// Records that `n` processes earlier session calls left running shared the sandbox
    /// with this lent call (its audit line says so).
    pub fn with_kept_from_earlier_calls(mut self, n: u32) -> Self {
        self.kept_from_earlier_calls = n;
        self
    }

    /// How many processes of earlier session calls shared the sandbox with this call.
    pub fn kept_from_earlier_calls(&self) -> u32 {
        self.kept_from_earlier_calls
    }

    /// Counts one request refused because it came from outside the call.
    pub fn note_outside_call(&self) {
        self.outside_call.fetch_add(1, Ordering::Relaxed);
    }

    /// How many requests were refused because they came from outside the call.
    pub fn outside_call(&self) -> u64 {
        self.outside_call.load(Ordering::Relaxed)
    }

    /// Makes the run count its route caps in a session's `counts` (kept for the session's
    /// life) rather than in fresh counts of its own.
    pub fn with_session_counts(mut self, counts: Arc<SessionCounts>) -> Self {
        self.caps = RouteCaps::shared(&self.profile, counts);
        self
    }

    /// Whether the run has ended.
    pub fn is_ended(&self) -> bool {
        *self.ended.borrow()
    }

    /// Resolves once the run has ended.
    pub async fn wait_ended(&self) {
        let mut rx = self.ended.subscribe();
        let _ = rx.wait_for(|ended| *ended).await;
    }

    /// Calls of this run inside [`Run::call`] right now (each holds one of its slots).
    pub fn in_flight(&self) -> u64 {
        (SLOTS as usize).saturating_sub(self.slots.available_permits()) as u64
    }

    /// The counts so far.
    pub fn summary(&self) -> RunSummary {
        self.state().trace.summary()
    }

    /// A copy of the trace rows so far.
    pub fn rows(&self) -> Vec<TraceRow> {
        self.state().trace.rows.clone()
    }

    /// Ends the run: later calls get 503, calls in flight are cut; waits up to
    /// [`END_WAIT`] for them so the counts are final.
    pub async fn end(&self) -> RunSummary {
        self.ended.send_replace(true);
        let _ = tokio::time::timeout(END_WAIT, self.slots.acquire_many(SLOTS)).await;
        self.summary()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the counts half-updated in a way
        // that weakens a check: every update is a single increment or push.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn deny(&self, status: u16, message: &str) -> Reply {
        self.state().trace.denied += 1;
        Reply::broker(status, message)
    }

    /// Handles one guest call: `target` is the request URI exactly as sent.
    pub async fn call<B>(&self, method: &str, target: &str, body: B) -> Reply
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        // 1. Ended.
        if self.is_ended() || Instant::now() >= self.deadline {
            return self.deny(503, message::ENDED);
        }
        // 2. A slot, held until the answer is ready.
        let Ok(_slot) = self.slots.clone().try_acquire_owned() else {
            return self.deny(429, message::CAPACITY);
        };
        // 3. The budget moves before any validation, so denied calls count.
        {
            let mut state = self.state();
            state.trace.calls += 1;
            if state.trace.calls > u64::from(self.profile.max_calls) {
                state.trace.denied += 1;
                return Reply::broker(429, message::BUDGET);
            }
        }
        // 4. Target and route.
        let Ok(checked) = Target::check(target) else {
            return self.deny(403, message::FORBIDDEN);
        };
        let Some(route) = self
            .profile
            .allow
            .iter()
            .find(|r| r.matches(method, &checked, false))
        else {
            return self.deny(403, message::FORBIDDEN);
        };
        let template = route.template().to_owned();
        // 5. Route caps: every matching cap, all or nothing.
        {
            let mut state = self.state();
            *state.trace.routes.entry(template.clone()).or_default() += 1;
            if !self.caps.charge(&self.profile, method, &checked) {
                state.trace.denied += 1;
                return Reply::broker(429, message::ROUTE_CAP);
            }
        }
        // 6. Circuit breaker.
        let gate = self
            .state()
            .breaker
            .gate(Instant::now(), self.profile.health_check.is_some());
        match gate {
            Gate::Pass => {}
            Gate::Shed => return self.shed(),
            Gate::Probe => {
                if self.probe().await {
                    self.state().breaker.close();
                } else {
                    return self.shed();
                }
            }
        }
        // 7. The body, at most 1 MiB.
        let read = Limited::new(body, MAX_REQUEST_BYTES).collect();
        let body = match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
            Ok(Ok(body)) => body,
            Ok(Err(_)) => return self.deny(413, message::TOO_LARGE),
            Err(_) => return self.deny(408, message::BODY_TIMEOUT),
        };
        let body = body.to_bytes();
        // 8–9. Send exactly the approved target, unless the run ended meanwhile.
        if self.is_ended() {
            return self.deny(503, message::ENDED);
        }
        self.forward(method, checked.as_str(), template, body).await
    }

    fn shed(&self) -> Reply {
        self.state().trace.shed += 1;
        Reply::broker(503, message::SHED)
    }

    async fn forward(&self, method: &str, target: &str, route: String, body: Bytes) -> Reply {
        let started = Instant::now();
        let request_bytes = body.len() as u64;
        let timeout = self.deadline.saturating_duration_since(started);
        let send = self.upstream.send(
            &self.profile.origin,
            method,
            target,
            body,
            self.credential.as_ref(),
            timeout,
        );
        let outcome = tokio::select! {
            outcome = send => Some(outcome),
            () = self.wait_ended() => None,
        };
        let mut row = TraceRow {
            sequence: 0,
            method: method.to_owned(),
            route,
            status: 0,
            delivered: false,
            request_bytes,
            response_bytes: 0,
            latency: started.elapsed(),
        };
        let reply = match outcome {
            None => Reply::broker(503, message::ENDED),
            Some(Ok(UpstreamReply {
                status,
                content_type,
                retry_after,
                body,
            })) => {
                self.state()
                    .breaker
                    .observe(Instant::now(), status, retry_after.as_deref());
                row.status = status;
                row.delivered = true;
                row.response_bytes = body.len() as u64;
                Reply {
                    status,
                    content_type,
                    body,
                }
            }
            Some(Err(error)) => {
                if let UpstreamError::Body { status } = error {
                    row.status = status;
                }
                tracing::debug!(run = %self.id, %error, "upstream call failed");
                Reply::broker(502, message::UNAVAILABLE)
            }
        };
        self.state().trace.record(row);
        reply
    }

    /// The elected caller's health-check probe: untraced, uncharged, 2 s.
    async fn probe(&self) -> bool {
        let Some(check) = &self.profile.health_check else {
            return false;
        };
        let timeout = PROBE_TIMEOUT.min(self.deadline.saturating_duration_since(Instant::now()));
        let probe = self.upstream.send(
            &self.profile.origin,
            "GET",
            check.path(),
            Bytes::new(),
            self.credential.as_ref(),
            timeout,
        );
        tokio::select! {
            outcome = probe => outcome.is_ok_and(|r| (200..300).contains(&r.status)),
            () = self.wait_ended() => false,
        }
    }
}
