//! What a project runner's answer means, in any sandbox that runs the project image's runner
//! (docker, openshell, e2b, dockercloud; providers.md §5.9): the image's runner and guard
//! paths, and the typed outcome of a run whose stdout, exit code and deadline state are known.
//!
//! Once the sandbox has started the runner, every ending is a typed outcome:
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
//! No detail ever quotes the sandbox's stderr or a step's output: any process in the sandbox
//! can write those.

use std::time::Duration;

use plimsoll::wire::{ProjectOutcome, ProjectResult};

use super::runner::{self, Report, ReportKey};

/// What the outer deadline adds to the plan's budget, so the runner can still report after
/// its last step used all of it.
pub(crate) const REPORT_GRACE: Duration = Duration::from_secs(5);
/// The runner and the guard library that makes it non-dumpable, in the project image.
pub(crate) const RUNNER: &str = "/runner.mjs";
pub(crate) const GUARD: &str = "/usr/local/lib/plimsoll-runner-guard.so";

/// The longest runner message an outcome detail carries.
const MAX_DETAIL: usize = 512;

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
