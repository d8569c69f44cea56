//! Snippets and projects in a verified sandbox (grants.md §8.5): a snippet is `node -` with
//! the code on stdin; a project is the shared runner (`/runner.mjs` under its guard, the key
//! and plan on stdin, its authenticated report read back from stdout) in `/tmp/work`, the
//! only writable place the policy leaves. A granted run first starts the relay and gives the
//! guest its socket; the relay is closed (tokens revoked) before the answer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use plimsoll::wire::{ProjectOutcome, ProjectResult};

use super::dial::{self, Relay, RelayError};
use super::exec::{self, Command, EXIT_TIMED_OUT, Ending, Finished};
use super::gateway::GatewayError;
use super::sandbox::Lease;
use crate::grant::{GuestGrant, HOST_API_SOCKET, host_client};
use crate::provider::ProjectPlan;
use crate::provider::docker::settings::OUTPUT_CAP;
use crate::provider::guest::outcome::{GUARD, REPORT_GRACE, RUNNER, classify_output};
use crate::provider::guest::runner::{self, Plan, PlanFile, ReportKey};

/// A project's work directory in the sandbox.
pub const WORK: &str = "/tmp/work";
/// A session snippet's command: `node -` in the work directory, where the session's files are.
const WORK_SNIPPET: &str = "mkdir -p \"$PLIMSOLL_WORK\" && cd \"$PLIMSOLL_WORK\" && exec node -";
/// The project command: the work directory, the guard, then the runner in place of the shell.
fn project_script() -> String {
    format!("mkdir -p \"$PLIMSOLL_WORK\" && export LD_PRELOAD={GUARD} && exec node {RUNNER}")
}

/// Why a run in a verified sandbox has no result.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The gateway refused the exec: nothing ran.
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    /// The relay of a granted run could not start: nothing ran.
    #[error("the relay: {0}")]
    Relay(#[from] RelayError),
    /// The sandbox went away under the code (its exec stream closed without an exit).
    #[error("sandbox {sandbox} ended while the code ran")]
    Lost { sandbox: String },
    /// The plan could not be encoded for the runner.
    #[error("the project plan could not be encoded: {0}")]
    Plan(serde_json::Error),
}

/// A snippet's result.
pub struct SnippetRan {
    /// Output, exit and timing.
    pub finished: Finished,
    /// The exit code (124 when the deadline ended it).
    pub exit_code: i32,
}

/// Starts the relay of a granted run, if it is one.
async fn relay_for(lease: &Lease, grant: Option<&GuestGrant>) -> Result<Option<Relay>, RelayError> {
    match grant {
        Some(g) => {
            let socket = g.socket().ok_or(RelayError::GrantNotASocket)?.to_owned();
            Ok(Some(
                dial::start(lease.gateway(), lease.name(), socket).await?,
            ))
        }
        None => Ok(None),
    }
}

/// Closes a run's relay (if any) before its answer.
async fn close(relay: Option<Relay>) {
    if let Some(relay) = relay {
        relay.close().await;
    }
}

/// Runs a snippet in `lease`; `in_work`: in the work directory (a session's snippet, which
/// sees the files earlier calls left there).
pub async fn snippet(
    lease: &Lease,
    code: String,
    timeout: Duration,
    grant: Option<Arc<GuestGrant>>,
    in_work: bool,
) -> Result<SnippetRan, RunError> {
    let relay = relay_for(lease, grant.as_deref()).await?;
    let mut env = BTreeMap::new();
    let argv = if in_work {
        env.insert("PLIMSOLL_WORK".to_owned(), WORK.to_owned());
        ["sh", "-c", WORK_SNIPPET].map(str::to_owned).to_vec()
    } else {
        ["node", "-"].map(str::to_owned).to_vec()
    };
    let code = match (&relay, grant.as_deref()) {
        (Some(relay), Some(g)) => {
            env.insert(HOST_API_SOCKET.to_owned(), relay.socket.clone());
            format!("{}{code}", host_client::node(g))
        }
        _ => code,
    };
    let command = Command {
        argv,
        env,
        stdin: code.into_bytes(),
        timeout,
        stdout_cap: OUTPUT_CAP,
        stderr_cap: OUTPUT_CAP,
    };
    let ran = exec::run(lease.gateway(), lease.name(), command).await;
    close(relay).await;
    let finished = ran?;
    let exit_code = match finished.ending {
        Ending::Exited(code) => code,
        Ending::TimedOut => EXIT_TIMED_OUT,
        Ending::Lost => {
            return Err(RunError::Lost {
                sandbox: lease.name().to_owned(),
            });
        }
    };
    Ok(SnippetRan {
        finished,
        exit_code,
    })
}

/// Runs a project in `lease`; `proc_checks` are the runner's `/proc` entries a step must
/// fail to open here (what the startup proof found this gateway's sandboxes enforce).
pub async fn project(
    lease: &Lease,
    plan: &ProjectPlan,
    budget: Duration,
    proc_checks: &[&str],
) -> Result<ProjectResult, RunError> {
    let relay = relay_for(lease, plan.grant.as_deref()).await?;
    let host_sdk = plan.grant.as_deref().map(host_client::node);
    let mut env: HashMap<&str, &str> = HashMap::new();
    if let Some(relay) = &relay {
        env.insert(HOST_API_SOCKET, &relay.socket);
    }
    let runner_plan = Plan {
        files: plan.files.iter().map(PlanFile::of).collect(),
        steps: &plan.steps,
        artifacts: &plan.artifacts,
        timeout_ms: u64::try_from(budget.as_millis()).unwrap_or(u64::MAX),
        env,
        proc_checks,
        host_sdk: host_sdk.as_deref(),
    };
    let key = ReportKey::fresh();
    let stdin = runner::stdin(&key, &runner_plan).map_err(RunError::Plan)?;
    let command = Command {
        argv: vec!["sh".to_owned(), "-c".to_owned(), project_script()],
        env: [("PLIMSOLL_WORK".to_owned(), WORK.to_owned())].into(),
        stdin,
        timeout: budget + REPORT_GRACE,
        stdout_cap: runner::STDOUT_CAP,
        stderr_cap: OUTPUT_CAP,
    };
    let ran = exec::run(lease.gateway(), lease.name(), command).await;
    close(relay).await;
    let finished = ran?;
    let stdout = finished.stdout.bytes();
    Ok(match finished.ending {
        Ending::Exited(code) => {
            classify_output(stdout, code, false, lease.name(), &key, &plan.artifacts)
        }
        Ending::TimedOut => classify_output(
            stdout,
            EXIT_TIMED_OUT,
            true,
            lease.name(),
            &key,
            &plan.artifacts,
        ),
        Ending::Lost => lost(stdout, &key, &plan.artifacts, lease.name()),
    })
}

/// The outcome when the sandbox went away under the runner: its report if one verified,
/// else what the step frames say.
fn lost(stdout: &[u8], key: &ReportKey, asked: &[String], sandbox: &str) -> ProjectResult {
    let found = runner::scan(stdout, key);
    if found.report.is_some() {
        return classify_output(stdout, 0, false, sandbox, key, asked);
    }
    tracing::warn!(sandbox, step_began = ?found.step_began, "the sandbox ended under the project runner");
    let (outcome, detail) = match found.step_began {
        Some(step) => (
            ProjectOutcome::PROJECT_OUTCOME_RUNNER_FAILED,
            format!(
                "the sandbox ended after step {} began; code ran and its effects are unknown",
                step + 1
            ),
        ),
        None => (
            ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR,
            "the sandbox ended before the runner reported".to_owned(),
        ),
    };
    ProjectResult {
        outcome: outcome.into(),
        outcome_detail: detail,
        ..ProjectResult::default()
    }
}
