//! Snippet and project calls in a session container (providers.md §9.3), each one request to
//! the session's agent ([`super::agent`]), which starts the guest's processes as the guest uid
//! in `/work`: no `docker exec` and no runner start on a call's path.

use std::time::Duration;

use plimsoll::wire::SessionEnd;
use tokio::time::Instant;

use super::super::DockerError;
use super::super::container::Finished;
use super::super::project;
use super::super::settings::OUTPUT_CAP;
use super::agent::{Projection, SpareStart};
use super::container::end_for;
use super::{DockerSession, HOLD_BUDGET};
use crate::grant::GuestGrant;
use crate::provider::guest::outcome::REPORT_GRACE;
use crate::provider::guest::runner::{self, ReportKey};
use crate::provider::{ProjectPlan, ProjectReport, SessionFault, SnippetOutcome};

/// The agent's `/proc` entries a step must fail to open: the agent runs as uid+1 and
/// non-dumpable, every step as the guest uid. gVisor serves every process's `environ`
/// world-readable, so under runsc it is not asked for (the agent's environment is the fixed
/// one plimsolld sets; nothing secret is in it), as for a one-shot runner.
const PROC_CHECKS_RUNC: &[&str] = &["fd/0", "fd/1", "mem", "environ"];
const PROC_CHECKS_RUNSC: &[&str] = &["fd/0", "fd/1", "mem"];
/// How long a lost agent's container may take to read as stopped.
const AGENT_LOST_SETTLE: Duration = Duration::from_secs(1);

impl DockerSession {
    /// A snippet: `node -` as the guest, started by the agent with the code on its stdin (or
    /// the node the agent started ahead during the previous ungranted snippet, when nothing
    /// was done to it meanwhile). A granted call gets the socket's path and the client
    /// library ahead of its code, as a one-shot snippet does, and never a node started ahead.
    /// An agent that does not answer ends the session.
    pub(super) async fn run_snippet(
        &mut self,
        code: String,
        timeout: Duration,
        grant: Option<&GuestGrant>,
    ) -> Result<SnippetOutcome, SessionFault> {
        let (code, grant_env) = super::super::granted_snippet(code, grant);
        let mut env = self.image.env.clone();
        env.extend(grant_env);
        // A granted call's node is never started ahead: its grant is this call's. Under
        // gVisor a node's start is slow and CPU-bound, and one starting beside the next call
        // slows that call on a small machine; nor does gVisor make a node from a file its uid
        // cannot read non-dumpable at its exec: there it starts only once the session is idle.
        let spare = match grant {
            Some(_) => None,
            None if self.settings.runtime.is_runsc() => Some(SpareStart::Idle),
            None => Some(SpareStart::Early),
        };
        let began = Instant::now();
        let Some(agent) = self.agent.get_mut().ok().and_then(Option::as_mut) else {
            return Err(self.agent_lost("the session's agent is gone").await);
        };
        let ran = agent
            .snippet(
                code.as_bytes(),
                &env,
                timeout,
                OUTPUT_CAP,
                spare,
                began + timeout + REPORT_GRACE,
            )
            .await;
        let out = match ran {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!(error = %e, "session agent did not answer a snippet call");
                self.agent.get_mut().ok().map(Option::take);
                return Err(self.agent_lost("the session's agent did not answer").await);
            }
        };
        Ok(SnippetOutcome {
            stdout: out.stdout,
            stderr: out.stderr,
            exit_code: out.answer.exit,
            timed_out: out.answer.timed_out,
            stdout_truncated: out.answer.stdout_truncated,
            stderr_truncated: out.answer.stderr_truncated,
            duration: began.elapsed(),
            environment: self.image.id.clone(),
            software_identity: self.image.software_identity(),
            instance: self.instance(),
        })
    }

    /// A project: the agent runs the runner's role with the key and plan (steps as the guest
    /// uid, the agent as uid+1), its output read as a one-shot runner's is
    /// (`project::classify`). The kept interpreters are held stopped around it in the same
    /// request ([`DockerSession::project_hold`]); when that hold cannot be proven nothing ran,
    /// and the interpreters end before the call runs without them. An agent that does not
    /// answer ends the session.
    pub(super) async fn run_project(
        &mut self,
        plan: ProjectPlan,
    ) -> Result<ProjectReport, SessionFault> {
        let budget = plan.timeout.min(project::MAX_TIMEOUT);
        let key = ReportKey::fresh();
        let host_sdk = plan.grant.as_deref().map(crate::grant::host_client::node);
        let proc_checks = if self.settings.runtime.is_runsc() {
            PROC_CHECKS_RUNSC
        } else {
            PROC_CHECKS_RUNC
        };
        let runner_plan =
            project::runner_plan(&plan, &self.image, budget, proc_checks, host_sdk.as_deref());
        let stdin = runner::stdin(&key, &runner_plan)
            .map_err(|e| SessionFault::infrastructure(DockerError::Plan(e)))?;
        let hold = self.project_hold().await;
        let mut began = Instant::now();
        // The hold is proven (or given up) within its own budget, before the call's starts.
        let held_by = if hold.is_empty() {
            budget
        } else {
            budget + HOLD_BUDGET
        };
        let mut ran = self.agent_project(&stdin, &hold, began + held_by).await?;
        if matches!(ran, Projection::NotHeld) {
            self.project_hold_failed().await?;
            began = Instant::now();
            ran = self.agent_project(&stdin, &[], began + budget).await?;
        }
        let Projection::Ran { stdout, still_held } = ran else {
            // Nothing to hold cannot fail to be held.
            return Err(self
                .agent_lost("the session's agent answered out of turn")
                .await);
        };
        if !still_held {
            tracing::debug!("a held interpreter was woken during the project call");
        }
        let truncated = stdout.len() > runner::STDOUT_CAP;
        let finished = Finished {
            stdout: (stdout, truncated),
            stderr: (Vec::new(), false),
            exit_code: 0,
            timed_out: false,
            container_id: self.id.clone(),
            duration: began.elapsed(),
        };
        Ok(ProjectReport {
            result: project::classify(&finished, &key, &plan.artifacts),
            environment: self.image.id.clone(),
            software_identity: self.image.software_identity(),
            instance: self.instance(),
        })
    }

    /// One project request to the agent, answered by `until` (plus the report's grace). An
    /// agent that does not answer ends the session.
    async fn agent_project(
        &mut self,
        stdin: &[u8],
        hold: &[String],
        until: Instant,
    ) -> Result<Projection, SessionFault> {
        let Some(agent) = self.agent.get_mut().ok().and_then(Option::as_mut) else {
            return Err(self.agent_lost("the session's agent is gone").await);
        };
        match agent.project(stdin, hold, until + REPORT_GRACE).await {
            Ok(ran) => Ok(ran),
            Err(e) => {
                tracing::warn!(error = %e, "session agent did not answer a project call");
                self.agent.get_mut().ok().map(Option::take);
                Err(self.agent_lost("the session's agent did not answer").await)
            }
        }
    }

    /// The session's end when its agent failed: the container's state names it, else the
    /// boundary could not be proven.
    pub(super) async fn agent_lost(&self, detail: &'static str) -> SessionFault {
        let reason = self
            .container_end()
            .await
            .unwrap_or(SessionEnd::SESSION_END_BOUNDARY_FAILED);
        SessionFault::ended(reason, detail)
    }

    /// The end the container's state names (stopped, gone or paused), once it had a moment
    /// to read so; none while it runs. A container killed under a call ends the streams into
    /// it before docker reads it as stopped.
    pub(super) async fn container_end(&self) -> Option<SessionEnd> {
        let _ = self.engine.wait(&self.id, AGENT_LOST_SETTLE).await;
        let end = end_for(&self.engine, &self.id, SessionEnd::SESSION_END_UNSPECIFIED).await;
        (end != SessionEnd::SESSION_END_UNSPECIFIED).then_some(end)
    }
}
