//! A project run (providers.md §5.9): one fresh container of the project image with a `/work`
//! tmpfs, the runner as its command, the key and plan on its stdin, and the runner's
//! authenticated report read back from its stdout.
//!
//! Once docker has started the command (the start marker), the runner's answer is read as
//! [`crate::provider::guest::outcome`] says.

use std::collections::HashMap;
use std::time::Duration;

use plimsoll::wire::ProjectResult;

use super::DockerError;
use super::container::{self, Context, Finished, Request};
use super::lockdown::{self, Identity};
use super::preflight::VerifiedImage;
use crate::provider::guest::outcome::{GUARD, REPORT_GRACE, RUNNER, classify_output};
use crate::provider::guest::runner::{self, Plan, PlanFile, ReportKey};
use crate::provider::{Hold, ProjectPlan};

/// A project's timeout when the request states none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest timeout a project may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(120);
/// The runner's `/proc` entries a step must fail to open. The steps run as the guest uid and
/// the runner as uid+1 ([`Identity::Runner`]), so the ptrace access check refuses them `mem`
/// and every `fd/*` entry under both runtimes. gVisor serves every process's `environ`
/// world-readable whatever its owner, so under runsc it is not asked for: the runner's
/// environment is the fixed one plimsolld sets (no key, no credential; the key arrives on
/// stdin and stays in memory).
const PROC_CHECKS_RUNC: &[&str] = &["fd/0", "fd/1", "mem", "environ"];
const PROC_CHECKS_RUNSC: &[&str] = &["fd/0", "fd/1", "mem"];
/// Names the guest identity to the runner's guard (images/project/guard/guard.c), which
/// moves the runner to uid+1 and starts the steps as this identity.
const GUEST_ID_VAR: &str = "PLIMSOLL_GUEST_ID";

/// What a project run produced, and the container that ran it.
pub struct Ran {
    /// The result as it goes on the wire.
    pub result: ProjectResult,
    /// The container id (64 hex).
    pub container_id: String,
    /// The container's run, from its start to the end of its output.
    pub duration: Duration,
}

/// Runs `plan` in a fresh project container.
pub(super) async fn run(
    ctx: &Context<'_>,
    image: &VerifiedImage,
    plan: &ProjectPlan,
    hold: Hold,
) -> Result<Ran, DockerError> {
    let budget = plan.timeout.min(MAX_TIMEOUT);
    let key = ReportKey::fresh();
    let proc_checks = if ctx.settings.runtime.is_runsc() {
        PROC_CHECKS_RUNSC
    } else {
        PROC_CHECKS_RUNC
    };
    // A granted project (grants.md §3, docker row): the run's socket mounted, its path in
    // every step's environment and the client library preloaded into every node a step
    // starts. Nothing of the credential is in any of them.
    let host_sdk = plan.grant.as_deref().map(crate::grant::host_client::node);
    let runner_plan = runner_plan(plan, image, budget, proc_checks, host_sdk.as_deref());
    let stdin = runner::stdin(&key, &runner_plan).map_err(DockerError::Plan)?;
    let finished = container::run_holding(
        ctx,
        Request {
            image,
            argv: vec!["node".to_owned(), RUNNER.to_owned()],
            run_env: vec![
                format!("LD_PRELOAD={GUARD}"),
                format!("{GUEST_ID_VAR}={}", ctx.settings.user()),
            ],
            image_env: false,
            stdin,
            timeout: budget + REPORT_GRACE,
            work: true,
            socket: plan.grant.as_deref().and_then(|g| g.socket()),
            identity: Identity::Runner,
            role: "run",
            stdout_cap: runner::STDOUT_CAP,
            started: None,
        },
        hold,
    )
    .await?;
    Ok(Ran {
        result: classify(&finished, &key, &plan.artifacts),
        container_id: finished.container_id,
        duration: finished.duration,
    })
}

/// What the runner reads for `plan` in `image`, one-shot or in a session. The runner does
/// not get the image's ENV; its steps do, with the socket's path when the run has a grant.
pub(super) fn runner_plan<'a>(
    plan: &'a ProjectPlan,
    image: &'a VerifiedImage,
    budget: Duration,
    proc_checks: &'a [&'a str],
    host_sdk: Option<&'a str>,
) -> Plan<'a> {
    let mut env: HashMap<&str, &str> = image
        .env
        .iter()
        .filter_map(|entry| entry.split_once('='))
        .collect();
    if plan.grant.is_some() {
        env.insert(crate::grant::HOST_API_SOCKET, lockdown::GUEST_SOCKET);
    }
    Plan {
        files: plan.files.iter().map(PlanFile::of).collect(),
        steps: &plan.steps,
        artifacts: &plan.artifacts,
        timeout_ms: u64::try_from(budget.as_millis()).unwrap_or(u64::MAX),
        env,
        proc_checks,
        host_sdk,
    }
}

/// The outcome of a run docker started (see the module's table).
pub(super) fn classify(finished: &Finished, key: &ReportKey, asked: &[String]) -> ProjectResult {
    classify_output(
        &finished.stdout.0,
        finished.exit_code,
        finished.timed_out,
        &finished.container_id,
        key,
        asked,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use plimsoll::wire::ProjectOutcome;

    fn finished(stdout: Vec<u8>, exit_code: i32, timed_out: bool) -> Finished {
        Finished {
            stdout: (stdout, false),
            stderr: (b"<<<PLIMSOLL_REPORT_V3>>> guest text".to_vec(), false),
            exit_code,
            timed_out,
            container_id: "c".repeat(64),
            duration: Duration::from_millis(5),
        }
    }

    #[test]
    fn no_report_is_protocol_error_before_a_step_and_runner_failed_after() {
        let key = ReportKey::fresh();
        let none = classify(&finished(Vec::new(), 1, false), &key, &[]);
        assert_eq!(none.outcome, ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR);
        assert!(none.outcome_detail.contains("exit 1"));
        assert!(!none.outcome_detail.contains("guest text"));
        let forged = b"\n<<<PLIMSOLL_STEP_V1>>> 0 00\n\n<<<PLIMSOLL_REPORT_V3>>> 2 00\n{}".to_vec();
        let forged = classify(&finished(forged, 0, false), &key, &[]);
        assert_eq!(
            forged.outcome,
            ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR
        );
        assert!(forged.steps.is_empty());
        let timed = classify(&finished(Vec::new(), 124, true), &key, &[]);
        assert_eq!(timed.outcome, ProjectOutcome::PROJECT_OUTCOME_TIMED_OUT);
    }
}
