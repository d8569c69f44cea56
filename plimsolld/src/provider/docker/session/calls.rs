//! Snippet and project calls in a session container (providers.md §9.3), each a `docker
//! exec` as the guest uid in `/work`, started through the start script so its marker tells a
//! guest's exit from docker's failure.

use std::time::Duration;

use plimsoll::wire::SessionEnd;
use tokio::time::Instant;

use super::super::DockerError;
use super::super::container::{EXIT_TIMED_OUT, Finished, random_hex};
use super::super::exec::{self, ExecOutcome, ExecSpec};
use super::super::lockdown::START_SCRIPT;
use super::super::project::{self, REPORT_GRACE};
use super::super::runner::{self, ReportKey};
use super::super::settings::OUTPUT_CAP;
use super::DockerSession;
use super::container::end_for;
use crate::grant::GuestGrant;
use crate::provider::{ProjectPlan, ProjectReport, SessionFault, SnippetOutcome};

/// The agent's `/proc` entries a step must fail to open: the agent runs as uid+1 and
/// non-dumpable, every step as the guest uid. gVisor serves every process's `environ`
/// world-readable, so under runsc it is not asked for (the agent's environment is the fixed
/// one plimsolld sets; nothing secret is in it), as for a one-shot runner.
const PROC_CHECKS_RUNC: &[&str] = &["fd/0", "fd/1", "mem", "environ"];
const PROC_CHECKS_RUNSC: &[&str] = &["fd/0", "fd/1", "mem"];

/// A command through the start script, with its marker, as an `env -i` argv.
fn started(marker: &str, env: &[String], command: &[&str]) -> Vec<String> {
    let mut inner = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        START_SCRIPT.to_owned(),
        "sh".to_owned(),
        marker.to_owned(),
    ];
    inner.extend(env.iter().cloned());
    inner.extend(command.iter().map(|s| (*s).to_owned()));
    exec::env_argv(&[], &inner)
}

/// What a session exec produced once docker started its command.
struct Ran {
    out: ExecOutcome,
    stderr: Vec<u8>,
    exit_code: i32,
    duration: Duration,
}

impl DockerSession {
    /// Runs `argv` through the start script with `stdin`; a missing marker or a failed exec
    /// is the session's end when the container stopped, else an infrastructure error.
    async fn exec_started(
        &self,
        marker: &str,
        argv: &[String],
        stdin: &[u8],
        stdout_cap: usize,
        budget: Duration,
    ) -> Result<Ran, SessionFault> {
        let user = self.settings.user();
        let began = Instant::now();
        let marker_line = format!("{marker}\n");
        let ran = exec::run(
            &self.engine,
            &self.id,
            &ExecSpec {
                argv,
                user: &user,
                workdir: Some("/work"),
                stdin,
                stdout_cap,
                stderr_cap: OUTPUT_CAP + marker_line.len(),
                deadline: began + budget,
            },
        )
        .await;
        let duration = began.elapsed();
        let out = match ran {
            Ok(out) if out.stderr.starts_with(marker_line.as_bytes()) => out,
            Ok(_) => return Err(self.lost("docker did not start the session command").await),
            Err(e) => return Err(self.lost(&format!("session exec failed: {e}")).await),
        };
        let exit_code = match (out.timed_out, out.exit_code) {
            (true, _) => EXIT_TIMED_OUT,
            (false, Some(code)) => i32::try_from(code).unwrap_or(i32::MAX),
            (false, None) => {
                return Err(SessionFault::infrastructure(
                    "docker recorded no exit code for a session command",
                ));
            }
        };
        if exit_code != 0 && !out.timed_out {
            // A non-zero exit while the container stopped is the session's end, not a result.
            let reason = end_for(&self.engine, &self.id, SessionEnd::SESSION_END_UNSPECIFIED).await;
            if reason != SessionEnd::SESSION_END_UNSPECIFIED {
                return Err(SessionFault::ended(
                    reason,
                    "the session's sandbox stopped during the call",
                ));
            }
        }
        let stderr = out.stderr[marker_line.len()..].to_vec();
        Ok(Ran {
            out,
            stderr,
            exit_code,
            duration,
        })
    }

    /// A call that failed outside the guest: the session's end when the container is gone,
    /// stopped or paused, else an infrastructure error (the detail goes to the log only).
    async fn lost(&self, detail: &str) -> SessionFault {
        match end_for(&self.engine, &self.id, SessionEnd::SESSION_END_UNSPECIFIED).await {
            SessionEnd::SESSION_END_UNSPECIFIED => SessionFault::infrastructure(detail),
            reason => SessionFault::ended(reason, "the session's sandbox stopped during the call"),
        }
    }

    /// A snippet: `node -` with the code on stdin. A granted call gets the socket's path and
    /// the client library ahead of its code, as a one-shot snippet does.
    pub(super) async fn run_snippet(
        &self,
        code: String,
        timeout: Duration,
        grant: Option<&GuestGrant>,
    ) -> Result<SnippetOutcome, SessionFault> {
        let marker = format!("plimsoll-started:{}", random_hex());
        let (code, grant_env) = super::super::granted_snippet(code, grant);
        let mut env = self.image.env.clone();
        env.extend(grant_env);
        let argv = started(&marker, &env, &["node", "-"]);
        let ran = self
            .exec_started(&marker, &argv, code.as_bytes(), OUTPUT_CAP, timeout)
            .await?;
        Ok(SnippetOutcome {
            stdout: ran.out.stdout,
            stderr: ran.stderr,
            exit_code: ran.exit_code,
            timed_out: ran.out.timed_out,
            stdout_truncated: ran.out.stdout_truncated,
            stderr_truncated: ran.out.stderr_truncated,
            duration: ran.duration,
            environment: self.image.id.clone(),
            software_identity: self.image.software_identity(),
            instance: self.instance(),
        })
    }

    /// A project: the agent runs the runner's role with the key and plan (steps as the guest
    /// uid, the agent as uid+1), its output read as a one-shot runner's is
    /// (`project::classify`). An agent that does not answer ends the session.
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
        let began = Instant::now();
        let Some(agent) = self.agent.get_mut().ok().and_then(Option::as_mut) else {
            return Err(self.agent_lost("the session's agent is gone").await);
        };
        let stdout = match agent.project(&stdin, began + budget + REPORT_GRACE).await {
            Ok(stdout) => stdout,
            Err(e) => {
                tracing::warn!(error = %e, "session agent did not answer a project call");
                self.agent.get_mut().ok().map(Option::take);
                return Err(self.agent_lost("the session's agent did not answer").await);
            }
        };
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

    /// The session's end when its agent failed: the container's state names it, else the
    /// boundary could not be proven.
    async fn agent_lost(&self, detail: &'static str) -> SessionFault {
        let reason = end_for(
            &self.engine,
            &self.id,
            SessionEnd::SESSION_END_BOUNDARY_FAILED,
        )
        .await;
        SessionFault::ended(reason, detail)
    }
}
