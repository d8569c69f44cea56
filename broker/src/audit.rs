//! One structured audit line per run, when it closes (`spec/grants.md` §2.4): who, which
//! profile, how many calls and of which routes. Never a body, a path or a credential.
//!
//! A session call's line also says when it did not have the sandbox to itself:
//! `kept_from_earlier_calls` counts the processes earlier calls left running (the cell
//! interpreters), which plimsolld held stopped while the grant was lent.
//! `host_calls_from_outside_call` counts the requests the session socket refused because they
//! were known not to come from the call ([`crate::peer_origin`]: a connection from before the
//! lend, and under runc a process outside the call's exec). Under gVisor a request from a
//! woken kept process on a new connection cannot be told apart from the call's own, so the
//! line still marks the whole call rather than charging it silently.

use crate::control::protocol::RunSummary;
use crate::run::Run;

/// Why a run closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// plimsolld closed it.
    Closed,
    /// Its deadline plus the grace passed first.
    Deadline,
    /// The broker shut down.
    Shutdown,
    /// plimsolld closed the session the run's grant was lent to.
    SessionClosed,
}

impl CloseReason {
    /// The audit line's `end` value.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::Closed => "closed",
            CloseReason::Deadline => "deadline",
            CloseReason::Shutdown => "shutdown",
            CloseReason::SessionClosed => "session_closed",
        }
    }
}

/// Logs the run's audit line.
pub fn run_closed(run: &Run, summary: &RunSummary, reason: CloseReason) {
    let nonzero = |n: u64| (n != 0).then_some(n);
    let routes = serde_json::to_string(&summary.routes).unwrap_or_default();
    tracing::info!(
        caller = run.principal.as_str(),
        grant_profile = run.profile.name.as_str(),
        run = run.id.as_str(),
        host_calls = summary.calls,
        host_calls_denied = nonzero(summary.denied),
        host_calls_dropped = nonzero(summary.dropped),
        host_calls_shed = nonzero(summary.shed),
        kept_from_earlier_calls = nonzero(u64::from(run.kept_from_earlier_calls())),
        host_calls_from_outside_call = nonzero(run.outside_call()),
        routes = routes.as_str(),
        end = reason.as_str(),
        "grant run closed"
    );
}
