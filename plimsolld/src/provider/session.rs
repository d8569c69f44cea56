//! What a provider that keeps sessions hands the daemon: one live sandbox reused by many calls
//! (wire.md §7, providers.md §9).
//!
//! The daemon's session table (`crate::session`) owns the order of things — the turn, the
//! chain, idle and lifetime, the ends — and calls a [`SessionSandbox`] for the parts only the
//! provider can do: prove the sandbox is still the one opened, run a call in it, prove the
//! call boundary afterwards, suspend it, and remove it.

use std::future::Future;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use plimsoll::refusal::Refusal;
use plimsoll::wire::{ProjectFile, SessionEnd};

use super::{Cause, ProjectPlan, ProjectReport, SnippetOutcome};
use crate::grant::GuestGrant;

/// What an open asks of the provider.
#[derive(Debug, Clone)]
pub struct SessionOpen {
    /// How long the session may live (already bounded by the daemon's setting).
    pub lifetime: Duration,
    /// The languages the caller hinted, already checked; empty means every language.
    pub languages: Vec<String>,
    /// The disk budget measured after each call, in MiB; 0 = no bound.
    pub disk_mb: u32,
    /// The session's broker socket, mounted at open because a running sandbox cannot gain a
    /// mount; it serves only the grant a call lends (grants.md §3, providers.md §9.3).
    pub host_socket: Option<PathBuf>,
    /// The session's guard token when the provider delivers grants through the guard (e2b):
    /// a VM whose network rule must name it is made with it (grants.md §6.7).
    pub guard_token: Option<crate::grant::GuardToken>,
    /// On a metered provider, the paid seconds admission reserved for the session's whole
    /// lifetime; the VM holds them until it is gone. `None` for the daemon's own startup
    /// proof, which the provider charges to the daemon's day.
    pub paid: Option<std::sync::Arc<crate::admission::paid::Paid>>,
}

/// A session sandbox the provider opened and verified.
pub struct OpenedSession {
    /// The live sandbox.
    pub sandbox: Box<dyn SessionSandbox>,
    /// The outer artifact every call runs on (the record's `environment`).
    pub environment: String,
    /// The software identity stated at open and on every record.
    pub software_identity: String,
    /// The sandbox instance, as a typed reference, or "".
    pub instance: String,
}

/// What a warm session pool holds and has done (providers.md §9.8), as `Describe` and
/// `/metrics` show it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStatus {
    /// The configured size (`SANDBOX_SESSION_POOL`).
    pub size: u32,
    /// Members ready to be claimed, per warm language set (sorted names), in set order.
    pub warm: Vec<(Vec<String>, u32)>,
    /// Opens served by a member.
    pub claims: u64,
    /// Opens that made their own sandbox while the pool was on.
    pub misses: u64,
}

/// How long a hosted sandbox whose call just lost its stream may still read back as running
/// before it counts as alive: a service notices a dead sandbox a moment after its streams
/// drop, and a session must not be kept on a sandbox that is already gone.
pub const LOST_SETTLE: Duration = Duration::from_secs(3);

/// Asks `read` every `every` until it settles (`Break`) or `within` has passed; then the
/// last unsettled answer (`Continue`). `read` runs at least once.
pub async fn settle<T, F, Fut>(within: Duration, every: Duration, mut read: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ControlFlow<T, T>>,
{
    let until = tokio::time::Instant::now() + within;
    loop {
        match read().await {
            ControlFlow::Break(settled) => return settled,
            ControlFlow::Continue(so_far) if tokio::time::Instant::now() >= until => {
                return so_far;
            }
            ControlFlow::Continue(_) => tokio::time::sleep(every).await,
        }
    }
}

/// Why a session step did not produce its result.
#[derive(Debug, thiserror::Error)]
pub enum SessionFault {
    /// Nothing ran and the session goes on (for example docker did not answer the read-back).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The session is over; `reason` is what callers are told.
    #[error("session ended ({reason:?}): {detail}")]
    Ended {
        /// The end reason.
        reason: SessionEnd,
        /// One sentence for the caller; never container output.
        detail: String,
    },
    /// Something failed after code may have run; the cause goes only to the log.
    #[error(transparent)]
    Infrastructure(Cause),
}

impl SessionFault {
    /// An infrastructure failure caused by `cause` (a typed error, or a sentence).
    pub fn infrastructure(cause: impl Into<Cause>) -> SessionFault {
        SessionFault::Infrastructure(cause.into())
    }

    /// A session end.
    pub fn ended(reason: SessionEnd, detail: impl Into<String>) -> SessionFault {
        SessionFault::Ended {
            reason,
            detail: detail.into(),
        }
    }

    /// The end a fault of the daemon's own step (`step`: the sweep, a suspend) gives the
    /// session: its own end, else `boundary_failed` with `detail`; the cause goes to the log
    /// only, never to the caller.
    pub fn into_end(self, step: &'static str, detail: &str) -> (SessionEnd, String) {
        match self {
            SessionFault::Ended { reason, detail } => (reason, detail),
            other => {
                tracing::warn!(error = %other, step, "session step failed");
                (SessionEnd::SESSION_END_BOUNDARY_FAILED, detail.to_owned())
            }
        }
    }
}

/// One cell: code for a language's long-lived interpreter, after files are written.
#[derive(Debug, Clone)]
pub struct CellCall {
    /// `javascript` or `python`.
    pub language: String,
    /// The code, already validated.
    pub code: String,
    /// Files written under `/work` before the code runs.
    pub files: Vec<ProjectFile>,
    /// The call's effective timeout.
    pub timeout: Duration,
}

/// What a cell produced (wire.md §7.4).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CellOutcome {
    /// Output between the cell's markers, capped.
    pub stdout: Vec<u8>,
    /// Error output between the cell's markers, capped.
    pub stderr: Vec<u8>,
    /// 0 ran, 1 raised, 124 the deadline ended it.
    pub exit_code: i32,
    /// Whether the deadline ended it.
    pub timed_out: bool,
    /// Whether stdout was cut at the cap.
    pub stdout_truncated: bool,
    /// Whether stderr was cut at the cap.
    pub stderr_truncated: bool,
    /// This call ran in a fresh interpreter.
    pub interpreter_started: bool,
    /// The interpreter died, was killed or hit the deadline during this call.
    pub interpreter_ended: bool,
    /// The provider's own measure of the cell.
    pub duration: Duration,
}

/// One live session sandbox. The daemon calls it only while holding the session's turn, so
/// no two of these methods ever run at once for one session.
#[async_trait]
pub trait SessionSandbox: Send + Sync + 'static {
    /// Before each call: resume a suspended sandbox and prove it is still the one opened
    /// (providers.md §9.2). [`SessionFault::Refused`] keeps the session; `Ended` ends it. A
    /// resume that fails must end it: any other fault is taken to leave the sandbox running.
    async fn prepare(&mut self) -> Result<(), SessionFault>;

    /// Runs a JavaScript snippet in the sandbox; `grant` is the grant this call lent to the
    /// session's socket, if any.
    async fn snippet(
        &mut self,
        code: String,
        timeout: Duration,
        grant: Option<Arc<GuestGrant>>,
    ) -> Result<SnippetOutcome, SessionFault>;

    /// Before a call is lent a grant: holds stopped every process earlier calls left running
    /// that the sweep keeps (cell interpreters), so that only this call's processes can use
    /// the grant. Answers how many it holds (the broker's audit line says the call shared the
    /// sandbox with them). A refusal means nothing ran and nothing is held.
    async fn hold_kept(&mut self) -> Result<u32, SessionFault> {
        Ok(0)
    }

    /// Once the grant is back: lets what [`SessionSandbox::hold_kept`] held go on (or ends
    /// it, if it cannot be resumed).
    async fn release_kept(&mut self) {}

    /// Runs a project in the sandbox; its files stay in `/work` for later calls.
    async fn project(&mut self, plan: ProjectPlan) -> Result<ProjectReport, SessionFault>;

    /// Runs a cell in the language's interpreter. By default cells are unsupported: nothing
    /// runs.
    async fn cell(&mut self, call: CellCall) -> Result<CellOutcome, SessionFault> {
        Err(SessionFault::Refused(Refusal::Unsupported(format!(
            "this session cannot run {} cells yet; nothing ran",
            call.language
        ))))
    }

    /// After each call: prove the boundary (nothing the call left running survives) and
    /// measure the disk budget. Any error ends the session; it never assumes clean.
    async fn sweep(&mut self) -> Result<(), SessionFault>;

    /// Suspends an idle sandbox; the next [`SessionSandbox::prepare`] resumes it. An error
    /// ends the session.
    async fn suspend(&mut self) -> Result<(), SessionFault>;

    /// Whether a suspended sandbox gives its admission slot back (providers.md §10: a
    /// suspended session holds no slot, except on docker, where suspend is a pause that keeps
    /// memory and processes). When it does, the next call must be admitted again first.
    fn suspend_frees_slot(&self) -> bool {
        false
    }

    /// Removes the sandbox; returns once it is gone (or every attempt failed, logged).
    async fn finish(&mut self);
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn settle_returns_the_first_settled_answer() {
        let asked = Cell::new(0);
        let got = settle(Duration::from_secs(3), Duration::from_millis(100), || {
            asked.set(asked.get() + 1);
            let n = asked.get();
            async move {
                if n == 3 {
                    ControlFlow::Break("gone")
                } else {
                    ControlFlow::Continue("running")
                }
            }
        })
        .await;
        assert_eq!((got, asked.get()), ("gone", 3));
    }

    #[tokio::test(start_paused = true)]
    async fn settle_gives_the_last_answer_when_time_is_up() {
        let asked = Cell::new(0);
        let started = tokio::time::Instant::now();
        let got = settle(Duration::from_secs(3), Duration::from_millis(250), || {
            asked.set(asked.get() + 1);
            let n = asked.get();
            async move { ControlFlow::<u32, u32>::Continue(n) }
        })
        .await;
        // Asked at 0, 250 ms, …, 3 s: thirteen times, and the answer is the thirteenth.
        assert_eq!((got, asked.get()), (13, 13));
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn settle_within_nothing_asks_once() {
        let asked = Cell::new(0);
        let got = settle(Duration::ZERO, Duration::from_millis(100), || {
            asked.set(asked.get() + 1);
            async { ControlFlow::<&str, &str>::Continue("running") }
        })
        .await;
        assert_eq!((got, asked.get()), ("running", 1));
    }
}
