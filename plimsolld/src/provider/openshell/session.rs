//! Sessions on openshell (providers.md §9, grants.md §8): one gateway sandbox per session
//! whose main process does nothing (`sleep 2147483647`), reached only through the gateway's
//! exec.
//!
//! - open: the same create, wait and read-back as a one-shot run, then the process baseline
//!   (the docker session's lister and rule: exactly the init and its `sleep`);
//! - before each call: `StartSandbox` if the idle watcher stopped it (and a new baseline, the
//!   processes being new), then the full read-back again; any difference ends the session;
//! - the calls: snippets (`node -` in the work directory) and projects (the shared runner),
//!   exactly as one-shot runs, granted ones through the relay; cells in the docker session's
//!   kernels over the gateway's exec ([`super::cell`], [`super::cells`]), their state kept
//!   between calls, ended before a project or a granted call;
//! - after each call: the docker session's sweep, non-dumpable under the runner guard, kills
//!   whatever the call left running and measures the disk;
//! - suspend is `StopSandbox` (files stay, processes end, the admission slot is given back);
//!   the end is a confirmed delete.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use plimsoll::refusal::Refusal;
use plimsoll::wire::{ProjectOutcome, SessionEnd};

use super::exec::{self, Command, Ending};
use super::gateway::GatewayError;
use super::proto::v1::SandboxPhase;
use super::runs::{self, RunError};
use super::sandbox::{Lease, SandboxError, phase};
use super::{Inner, Proven};
use crate::grant::GuestGrant;
use crate::provider::guest::boundary::{self, Listed};
use crate::provider::session::{LOST_SETTLE, settle};
use crate::provider::{
    CellCall, CellOutcome, Hold, OpenedSession, ProjectPlan, ProjectReport, ProviderError,
    SessionFault, SessionOpen, SessionSandbox, SnippetOutcome,
};

/// The lister's and the sweep's budget.
const BOUNDARY_BUDGET: Duration = Duration::from_secs(20);
/// What the lister may print.
const LISTER_OUTPUT_CAP: usize = 64 * 1024;
/// What the sweep may print (nothing of it is trusted).
const SWEEP_OUTPUT_CAP: usize = 4096;
/// Where the disk budget is measured: the only writable place the policy leaves.
const MOUNTS: &str = "/tmp";
/// How often the gateway is asked whether a sandbox whose exec was lost still runs (for up
/// to [`LOST_SETTLE`]: the gateway notices a dead container a moment later).
const END_POLL: Duration = Duration::from_millis(100);
/// What the caller is told when the sandbox went away under a call.
const STOPPED_DURING_CALL: &str = "the session's sandbox stopped during the call";

/// One session's sandbox.
pub struct OpenShellSession {
    inner: Arc<Inner>,
    proven: Proven,
    /// The sandbox, until the session's end deletes it.
    lease: Option<Lease>,
    /// The baseline's identities (`pid:starttime:cmdlinehex`): what the sweep spares.
    keep: Vec<String>,
    /// Stopped by the idle watcher; the next call starts it.
    stopped: bool,
    /// The live cell interpreters, at most one per language.
    pub(super) interpreters: Vec<super::cell::Interpreter>,
    disk_mb: u32,
    /// Whether guest code may have run since the last sweep: an interpreter outlived it (its
    /// code runs between calls, and what it starts stays even once the interpreter is gone).
    unswept: bool,
}

/// Opens a session sandbox for `open`.
pub(super) async fn open(
    inner: &Arc<Inner>,
    open: SessionOpen,
) -> Result<OpenedSession, ProviderError> {
    let proven = inner.ready_or_refuse()?;
    // The session's admission slot is the table's; the lease holds none of its own.
    let lease = inner
        .fleet
        .lease(open.lifetime, Hold::default())
        .await
        .map_err(|e| ProviderError::from(super::OpenShellError::Sandbox(e)))?;
    let mut session = OpenShellSession {
        inner: Arc::clone(inner),
        proven,
        lease: Some(lease),
        keep: Vec::new(),
        unswept: false,
        stopped: false,
        interpreters: Vec::new(),
        disk_mb: open.disk_mb,
    };
    match session.baseline().await {
        Ok(()) => {
            let instance = session.instance();
            tracing::info!(sandbox = %session.name(), "session sandbox verified");
            Ok(OpenedSession {
                environment: inner.environment.clone(),
                software_identity: session.proven.software_identity.clone(),
                instance,
                sandbox: Box::new(session),
            })
        }
        Err(detail) => {
            session.finish().await;
            Err(ProviderError::infrastructure(format!(
                "session open: {detail}"
            )))
        }
    }
}

/// A program of the call boundary: `node -e <script> <args…>` under the runner guard, with
/// nothing on stdin, within [`BOUNDARY_BUDGET`].
fn boundary_command<'a>(
    script: &str,
    guarded: bool,
    args: impl Iterator<Item = &'a String>,
    stdout_cap: usize,
) -> Command {
    let argv = if guarded {
        boundary::guarded_node(script, args)
    } else {
        let mut argv = vec!["node".to_owned(), "-e".to_owned(), script.to_owned()];
        argv.extend(args.cloned());
        argv
    };
    Command {
        argv,
        env: Default::default(),
        stdin: Vec::new(),
        timeout: BOUNDARY_BUDGET,
        stdout_cap,
        stderr_cap: SWEEP_OUTPUT_CAP,
    }
}

impl OpenShellSession {
    /// Before a project call or a granted one: ends the kept interpreters and, when any
    /// lived since the last sweep, sweeps, so nothing they started (gone themselves or not)
    /// is left to see the runner's key or meet the grant. A dirty sweep ends the session.
    async fn clear_kept(&mut self) -> Result<(), SessionFault> {
        if self.end_interpreters().await || self.unswept {
            self.sweep().await?;
        }
        Ok(())
    }

    fn lease(&self) -> Result<&Lease, SessionFault> {
        self.lease.as_ref().ok_or_else(|| {
            SessionFault::ended(
                SessionEnd::SESSION_END_SANDBOX_CHANGED,
                "the session's sandbox is gone",
            )
        })
    }

    /// The languages the image runs (proven at startup).
    pub(super) fn languages(&self) -> &[String] {
        &self.proven.languages
    }

    /// The gateway and the sandbox name, for a cell interpreter.
    pub(super) fn target(&self) -> Result<(super::gateway::Gateway, String), SessionFault> {
        let lease = self.lease()?;
        Ok((lease.gateway().clone(), lease.name().to_owned()))
    }

    fn name(&self) -> &str {
        self.lease.as_ref().map(Lease::name).unwrap_or_default()
    }

    fn instance(&self) -> String {
        format!(
            "openshell-sandbox:{}",
            self.lease.as_ref().map(Lease::id).unwrap_or_default()
        )
    }

    /// Lists the sandbox's processes and keeps their identities when they are exactly the
    /// init and its `sleep` (the docker session's rule).
    async fn baseline(&mut self) -> Result<(), String> {
        let lease = self.lease().map_err(|e| e.to_string())?;
        let command = boundary_command(
            boundary::LISTER,
            false,
            std::iter::empty(),
            LISTER_OUTPUT_CAP,
        );
        let ran = exec::run(lease.gateway(), lease.name(), command)
            .await
            .map_err(|e| format!("the process lister could not run: {e}"))?;
        if ran.ending != Ending::Exited(0) || ran.stdout.truncated() {
            return Err(format!("the process lister ended with {:?}", ran.ending));
        }
        let listed: Vec<Listed> = serde_json::from_slice(ran.stdout.bytes())
            .map_err(|e| format!("the process lister's answer does not parse: {e}"))?;
        self.keep = boundary::check_baseline(&listed)?;
        Ok(())
    }

    /// The session's end when the sandbox is gone or no longer running, else `default`.
    /// `lost`: an exec stream just ended without an exit, so the sandbox has probably died
    /// and the gateway may take a moment to say so: a READY answer is asked again for up to
    /// [`LOST_SETTLE`].
    async fn end_for(&self, default: SessionEnd, lost: bool) -> SessionEnd {
        let Some(lease) = self.lease.as_ref() else {
            return SessionEnd::SESSION_END_SANDBOX_CHANGED;
        };
        let within = if lost { LOST_SETTLE } else { Duration::ZERO };
        settle(within, END_POLL, || async {
            match lease.gateway().get(lease.name()).await {
                Err(e) if e.is_not_found() => {
                    ControlFlow::Break(SessionEnd::SESSION_END_SANDBOX_CHANGED)
                }
                Err(_) => ControlFlow::Break(default),
                Ok(got) => match phase(&got) {
                    SandboxPhase::Ready => ControlFlow::Continue(default),
                    // Stopped or deleted by someone else.
                    SandboxPhase::Deleting | SandboxPhase::Stopping | SandboxPhase::Stopped => {
                        ControlFlow::Break(SessionEnd::SESSION_END_SANDBOX_CHANGED)
                    }
                    _ => ControlFlow::Break(SessionEnd::SESSION_END_MAIN_PROCESS_ENDED),
                },
            }
        })
        .await
    }

    /// A call that failed outside the guest: the session's end when the sandbox is gone or
    /// not running, else an infrastructure error (the detail goes to the log only).
    pub(super) async fn lost(&self, detail: impl Into<crate::provider::Cause>) -> SessionFault {
        match self
            .end_for(SessionEnd::SESSION_END_UNSPECIFIED, true)
            .await
        {
            SessionEnd::SESSION_END_UNSPECIFIED => SessionFault::infrastructure(detail),
            reason => SessionFault::ended(reason, STOPPED_DURING_CALL),
        }
    }

    /// What a failed snippet or project means for the session.
    async fn run_fault(&self, e: RunError) -> SessionFault {
        match e {
            // Nothing ran: the relay of a granted call could not start.
            RunError::Relay(e) => {
                tracing::warn!(error = %e, "the session call's relay could not start");
                SessionFault::Refused(Refusal::Environment(
                    "the relay for the call's grant could not be started in the session's sandbox; nothing ran"
                        .to_owned(),
                ))
            }
            other => self.lost(other).await,
        }
    }

    /// Starts a stopped sandbox and waits until it is READY; its processes are new, so the
    /// baseline is taken again.
    async fn resume(&mut self) -> Result<(), String> {
        let lease = self.lease().map_err(|e| e.to_string())?;
        lease
            .gateway()
            .start(lease.name())
            .await
            .map_err(|e| e.to_string())?;
        lease.wait_ready().await.map_err(|e| e.to_string())?;
        self.stopped = false;
        self.baseline().await
    }
}

/// What a read-back that failed means for the session (providers.md §9.2's table).
fn readback_fault(e: SandboxError) -> SessionFault {
    match e {
        SandboxError::Gateway(e) if e.is_not_found() => SessionFault::ended(
            SessionEnd::SESSION_END_SANDBOX_CHANGED,
            "the session's sandbox is gone",
        ),
        // The gateway did not answer: nothing ran and the session goes on.
        SandboxError::Gateway(e) => gateway_refusal(&e),
        SandboxError::Phase {
            phase: SandboxPhase::Deleting | SandboxPhase::Stopping | SandboxPhase::Stopped,
            ..
        } => SessionFault::ended(
            SessionEnd::SESSION_END_SANDBOX_CHANGED,
            "the session's sandbox was stopped or deleted by someone else",
        ),
        SandboxError::Phase { .. } | SandboxError::NotReady { .. } => SessionFault::ended(
            SessionEnd::SESSION_END_MAIN_PROCESS_ENDED,
            "the session's sandbox is no longer running",
        ),
        SandboxError::Readback { mismatch, .. } => {
            tracing::warn!(%mismatch, "the session's sandbox read back differently");
            SessionFault::ended(
                SessionEnd::SESSION_END_SANDBOX_CHANGED,
                "the session's sandbox no longer reads back as it was opened",
            )
        }
    }
}

fn gateway_refusal(e: &GatewayError) -> SessionFault {
    tracing::warn!(error = %e, "the gateway did not answer the session's read-back");
    SessionFault::Refused(Refusal::Environment(
        "the openshell gateway did not answer the session's read-back; nothing ran".to_owned(),
    ))
}

#[async_trait::async_trait]
impl SessionSandbox for OpenShellSession {
    async fn prepare(&mut self) -> Result<(), SessionFault> {
        if self.stopped
            && let Err(e) = self.resume().await
        {
            tracing::warn!(error = %e, "session resume failed");
            return Err(SessionFault::ended(
                SessionEnd::SESSION_END_BOUNDARY_FAILED,
                "the suspended session could not be resumed",
            ));
        }
        let lease = self.lease.as_mut().ok_or_else(|| {
            SessionFault::ended(
                SessionEnd::SESSION_END_SANDBOX_CHANGED,
                "the session's sandbox is gone",
            )
        })?;
        lease.verify_again().await.map_err(readback_fault)
    }

    async fn snippet(
        &mut self,
        code: String,
        timeout: Duration,
        grant: Option<Arc<GuestGrant>>,
    ) -> Result<SnippetOutcome, SessionFault> {
        let lease = self.lease()?;
        let timeout = timeout.min(crate::provider::docker::settings::SNIPPET_MAX_TIMEOUT);
        let ran = match runs::snippet(lease, code, timeout, grant, true).await {
            Ok(ran) => ran,
            Err(e) => return Err(self.run_fault(e).await),
        };
        if ran.exit_code != 0 && ran.finished.ending != Ending::TimedOut {
            // A non-zero exit while the sandbox stopped is the session's end, not a result.
            let reason = self
                .end_for(SessionEnd::SESSION_END_UNSPECIFIED, false)
                .await;
            if reason != SessionEnd::SESSION_END_UNSPECIFIED {
                return Err(SessionFault::ended(reason, STOPPED_DURING_CALL));
            }
        }
        let (stdout, stdout_truncated) = ran.finished.stdout.into_parts();
        let (stderr, stderr_truncated) = ran.finished.stderr.into_parts();
        Ok(SnippetOutcome {
            stdout,
            stderr,
            exit_code: ran.exit_code,
            timed_out: ran.finished.ending == Ending::TimedOut,
            stdout_truncated,
            stderr_truncated,
            duration: ran.finished.duration,
            environment: self.inner.environment.clone(),
            software_identity: self.proven.software_identity.clone(),
            instance: self.instance(),
        })
    }

    async fn hold_kept(&mut self) -> Result<u32, SessionFault> {
        // The relay's socket is the grant and every session process runs as the guest: the
        // interpreters end before the grant is lent (the next cell starts a fresh one and
        // says so), and the sweep proves they are gone.
        self.clear_kept().await?;
        Ok(0)
    }

    async fn cell(&mut self, call: CellCall) -> Result<CellOutcome, SessionFault> {
        self.run_cell(call).await
    }

    async fn project(&mut self, plan: ProjectPlan) -> Result<ProjectReport, SessionFault> {
        // A same-uid interpreter could read the runner's stdin (its report key): they end.
        self.clear_kept().await?;
        let lease = self.lease()?;
        let budget = plan
            .timeout
            .min(crate::provider::docker::project::MAX_TIMEOUT);
        let result = match runs::project(lease, &plan, budget, &self.proven.proc_checks).await {
            Ok(result) => result,
            Err(e) => return Err(self.run_fault(e).await),
        };
        // A runner that never reported may have lost its sandbox: then the session is over.
        if result.outcome == ProjectOutcome::PROJECT_OUTCOME_RUNNER_FAILED
            || result.outcome == ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR
        {
            let reason = self
                .end_for(SessionEnd::SESSION_END_UNSPECIFIED, true)
                .await;
            if reason != SessionEnd::SESSION_END_UNSPECIFIED {
                return Err(SessionFault::ended(reason, STOPPED_DURING_CALL));
            }
        }
        Ok(ProjectReport {
            result,
            environment: self.inner.environment.clone(),
            software_identity: self.proven.software_identity.clone(),
            instance: self.instance(),
        })
    }

    async fn sweep(&mut self) -> Result<(), SessionFault> {
        let kept = self.interpreter_ids();
        let lease = self.lease()?;
        let disk_bytes = u64::from(self.disk_mb) * 1024 * 1024;
        let args = [
            disk_bytes.to_string(),
            boundary::MAX_ENTRIES.to_owned(),
            // `/tmp` is a directory on the gateway's disk unless `SANDBOX_DISK_MB` makes it a
            // tmpfs: only the session's own files count, so they are walked.
            "walk".to_owned(),
            MOUNTS.to_owned(),
        ];
        let command = boundary_command(
            boundary::SWEEP,
            true,
            args.iter().chain(&self.keep).chain(&kept),
            SWEEP_OUTPUT_CAP,
        );
        let ran = exec::run(lease.gateway(), lease.name(), command).await;
        let exit = match &ran {
            Ok(finished) => match finished.ending {
                Ending::Exited(code) => Some(code),
                Ending::TimedOut | Ending::Lost => None,
            },
            Err(e) => {
                tracing::warn!(error = %e, "session sweep could not run");
                None
            }
        };
        match exit {
            Some(0) => {
                self.unswept = !kept.is_empty();
                Ok(())
            }
            Some(10) | Some(11) => Err(SessionFault::ended(
                SessionEnd::SESSION_END_DISK_EXCEEDED,
                "the session's files went over its disk budget",
            )),
            other => {
                tracing::warn!(exit = ?other, "session sweep did not prove the call boundary");
                let reason = self
                    .end_for(SessionEnd::SESSION_END_BOUNDARY_FAILED, other.is_none())
                    .await;
                Err(SessionFault::ended(
                    reason,
                    "the between-calls cleanup could not be proven",
                ))
            }
        }
    }

    async fn suspend(&mut self) -> Result<(), SessionFault> {
        let lease = self.lease()?;
        match lease.gateway().stop(lease.name()).await {
            Ok(_) => {
                self.stopped = true;
                // The stop ended every process: the next cell starts a fresh interpreter.
                self.drop_interpreters();
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "session suspend failed");
                Err(SessionFault::ended(
                    SessionEnd::SESSION_END_BOUNDARY_FAILED,
                    "the idle session could not be suspended",
                ))
            }
        }
    }

    fn suspend_frees_slot(&self) -> bool {
        true
    }

    async fn finish(&mut self) {
        if let Some(lease) = self.lease.take() {
            let name = lease.name().to_owned();
            if lease.remove().await {
                tracing::info!(sandbox = %name, "session sandbox deleted");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::openshell::readback::Mismatch;

    fn end_of(fault: SessionFault) -> Option<SessionEnd> {
        match fault {
            SessionFault::Ended { reason, .. } => Some(reason),
            SessionFault::Refused(_) | SessionFault::Infrastructure(_) => None,
        }
    }

    fn status(code: tonic::Code) -> SandboxError {
        SandboxError::Gateway(GatewayError::Status {
            call: "GetSandbox",
            code,
            message: String::new(),
        })
    }

    fn in_phase(phase: SandboxPhase) -> SandboxError {
        SandboxError::Phase {
            name: "plp-0".to_owned(),
            phase,
        }
    }

    #[test]
    fn a_read_back_ends_the_session_by_the_table_and_a_silent_gateway_only_refuses() {
        use SessionEnd::*;
        let changed = Some(SESSION_END_SANDBOX_CHANGED);
        assert_eq!(
            end_of(readback_fault(status(tonic::Code::NotFound))),
            changed
        );
        let wrong = SandboxError::Readback {
            name: "plp-0".to_owned(),
            mismatch: Mismatch::Labels,
        };
        assert_eq!(end_of(readback_fault(wrong)), changed);
        for phase in [
            SandboxPhase::Stopped,
            SandboxPhase::Stopping,
            SandboxPhase::Deleting,
        ] {
            assert_eq!(
                end_of(readback_fault(in_phase(phase))),
                changed,
                "{phase:?}"
            );
        }
        assert_eq!(
            end_of(readback_fault(in_phase(SandboxPhase::Error))),
            Some(SESSION_END_MAIN_PROCESS_ENDED)
        );
        // The gateway did not answer: nothing ran and the session goes on.
        assert!(matches!(
            readback_fault(status(tonic::Code::Unavailable)),
            SessionFault::Refused(_)
        ));
        let timeout = SandboxError::Gateway(GatewayError::Timeout {
            call: "GetSandbox",
            budget: Duration::from_secs(1),
        });
        assert!(matches!(readback_fault(timeout), SessionFault::Refused(_)));
    }
}
