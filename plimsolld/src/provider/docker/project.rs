//! A project run (providers.md §5.9): one fresh container of the project image with a `/work`
//! tmpfs, the runner as its command, the key and plan on its stdin, and the runner's
//! authenticated report read back from its stdout.
//!
//! Once docker has started the command (the start marker), every ending is a typed outcome:
//!
//! | What the daemon saw | Outcome |
//! |---|---|
//! | a verified report with `error` | `setup_failed`, the runner's words |
//! | a verified report whose last step timed out | `timed_out`, with the steps that ran |
//! | a verified report | `completed` (a failing step is a normal answer) |
//! | a verified report that does not decode | `protocol_error` |
//! | no verified report, the outer deadline passed | `timed_out`, no steps |
//! | no verified report, a step had begun | `runner_failed`: code ran, its state is unknown |
//! | no verified report, no step had begun | `protocol_error` |
//!
//! No detail ever quotes the container's stderr or a step's output: any process in the
//! sandbox can write those.

use std::collections::HashMap;
use std::time::Duration;

use plimsoll::wire::{ProjectOutcome, ProjectResult};

use super::DockerError;
use super::container::{self, Context, Finished, Request};
use super::lockdown::{self, Identity};
use super::preflight::VerifiedImage;
use super::runner::{self, Plan, PlanFile, Report, ReportKey};
use crate::provider::{Hold, ProjectPlan};

/// A project's timeout when the request states none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest timeout a project may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(120);
/// What the outer deadline adds to the plan's budget, so the runner can still report after
/// its last step used all of it.
pub(crate) const REPORT_GRACE: Duration = Duration::from_secs(5);
/// The runner and the guard library that makes it non-dumpable, in the project image.
pub(crate) const RUNNER: &str = "/runner.mjs";
pub(crate) const GUARD: &str = "/usr/local/lib/plimsoll-runner-guard.so";
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
/// The longest runner message an outcome detail carries.
const MAX_DETAIL: usize = 512;

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

/// The outcome of a runner whose stdout, exit code and deadline state are known, in
/// whichever sandbox `instance` names (see the module's table).
pub(crate) fn classify_output(
    stdout: &[u8],
    exit: i32,
    timed_out: bool,
    instance: &str,
    key: &ReportKey,
    asked: &[String],
) -> ProjectResult {
    let found = runner::scan(stdout, key);
    if let Some(body) = found.report {
        return from_report(body, asked, found.step_began);
    }
    tracing::warn!(
        sandbox = %instance,
        exit_code = exit,
        deadline_passed = timed_out,
        stdout_bytes = stdout.len(),
        unauthenticated_frames = found.unauthenticated,
        step_began = ?found.step_began,
        "the project runner did not report"
    );
    if timed_out {
        return outcome(
            ProjectOutcome::PROJECT_OUTCOME_TIMED_OUT,
            "the run exceeded its time budget before the runner reported".to_owned(),
        );
    }
    let how = match exit {
        137 => format!("container exit {exit}: killed, possibly for memory"),
        125 => format!("container exit {exit}: the runner could not make itself non-dumpable"),
        _ => format!("container exit {exit}"),
    };
    let unauthenticated = if found.unauthenticated {
        "; a report frame that did not authenticate was ignored"
    } else {
        ""
    };
    match found.step_began {
        Some(step) => outcome(
            ProjectOutcome::PROJECT_OUTCOME_RUNNER_FAILED,
            format!(
                "the runner stopped without reporting after step {} began ({how}){unauthenticated}; code ran and its effects are unknown",
                step + 1
            ),
        ),
        None => outcome(
            ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR,
            format!("the runner did not report ({how}){unauthenticated}"),
        ),
    }
}

/// The outcome of a verified report. A runner error before any step began is the request's
/// (`setup_failed`); after one began, code ran and the runner failed (`runner_failed`).
fn from_report(body: &[u8], asked: &[String], step_began: Option<u32>) -> ProjectResult {
    let parse_error = || {
        outcome(
            ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR,
            "could not parse the sandbox's result".to_owned(),
        )
    };
    let ran = match runner::decode(body) {
        Ok(Report::Ran(ran)) => ran,
        Ok(Report::Failed(failed)) => {
            let mut detail: String = failed.error.chars().take(MAX_DETAIL).collect();
            if detail.is_empty() {
                detail = "the runner could not set the project up".to_owned();
            }
            return match step_began {
                None => outcome(ProjectOutcome::PROJECT_OUTCOME_SETUP_FAILED, detail),
                Some(step) => outcome(
                    ProjectOutcome::PROJECT_OUTCOME_RUNNER_FAILED,
                    format!("the runner failed after step {} began: {detail}", step + 1),
                ),
            };
        }
        Err(e) => {
            tracing::warn!(error = %e, "project runner report does not decode");
            return parse_error();
        }
    };
    let artifacts_truncated = ran.artifacts_truncated;
    let (steps, artifacts) = match ran.into_wire(asked) {
        Ok(parts) => parts,
        Err(e) => {
            tracing::warn!(error = %e, "project runner report does not decode");
            return parse_error();
        }
    };
    let (kind, detail) = match steps.last() {
        Some(last) if last.timed_out => (
            ProjectOutcome::PROJECT_OUTCOME_TIMED_OUT,
            format!("step {} exceeded its time budget", steps.len()),
        ),
        Some(last) if last.exit_code != 0 => (
            ProjectOutcome::PROJECT_OUTCOME_COMPLETED,
            format!(
                "step {} exited {}; the steps after it did not run",
                steps.len(),
                last.exit_code
            ),
        ),
        _ => (ProjectOutcome::PROJECT_OUTCOME_COMPLETED, String::new()),
    };
    ProjectResult {
        steps,
        outcome: kind.into(),
        artifacts,
        outcome_detail: detail,
        artifacts_truncated,
        ..Default::default()
    }
}

fn outcome(kind: ProjectOutcome, detail: String) -> ProjectResult {
    ProjectResult {
        outcome: kind.into(),
        outcome_detail: detail,
        ..Default::default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

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

    #[test]
    fn a_failing_step_is_a_completed_plan_and_a_runner_error_is_setup_failed() {
        let ran = from_report(
            br#"{"steps":[{"command":"false","stdout":"","stderr":"","exitCode":1,"timedOut":false,"durationMs":1,"stdoutTruncated":false,"stderrTruncated":false}],"artifacts":[],"artifactsTruncated":false}"#,
            &[],
            Some(0),
        );
        assert_eq!(ran.outcome, ProjectOutcome::PROJECT_OUTCOME_COMPLETED);
        assert_eq!(ran.steps[0].exit_code, 1);
        let failed = from_report(br#"{"error":"file \"a\" could not be written"}"#, &[], None);
        assert_eq!(failed.outcome, ProjectOutcome::PROJECT_OUTCOME_SETUP_FAILED);
        let late = from_report(br#"{"error":"x"}"#, &[], Some(1));
        assert_eq!(late.outcome, ProjectOutcome::PROJECT_OUTCOME_RUNNER_FAILED);
        let junk = from_report(b"{]", &[], None);
        assert_eq!(junk.outcome, ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR);
    }
}
