//! A module run (providers.md §8): one project-runner plan in a fresh container of the module
//! image, whose single step is `sim-worker --table …`, and whose only artifact is the results
//! file.
//!
//! In order: the results budget is checked against the model's output width from the image's
//! [`catalogue`] (over it, the request is refused before any container starts); the parameter
//! table is written as shortest round-trip decimals (`sim_format::table`); the plan runs
//! through [`project::run`] (the authenticated runner, the same lockdown); then the outcome:
//!
//! | What the daemon saw | `ModuleResult` |
//! |---|---|
//! | the runner's own outcome was not `completed` | that outcome (`setup_failed`, `timed_out`), `protocol_error` for anything else |
//! | worker exit 0 and a whole results file | `completed`, one run per row; `timed_out` when the deadline stopped a row |
//! | worker exit 0, the file missing, cut or not this request's | `protocol_error` |
//! | worker exit 1, 2 or 3 (model, arguments, table) | `setup_failed` |
//! | worker exit 4 (the results could pass the budget) | refused: `invalid_argument`, no model ran |
//! | any other exit, or a signal | `protocol_error` |
//!
//! The worker's stdout and stderr are the result's; no detail quotes them.

pub mod catalogue;
mod proof;
pub mod results;

use std::time::Duration;

use plimsoll::refusal::Refusal;
use plimsoll::wire::{ModuleResult, ProjectFile, ProjectOutcome, ProjectResult, StepResult};
use sim_format::{exit, grid, status};

use super::container::Context;
use super::preflight::VerifiedImage;
use super::project;
use crate::provider::{Hold, ModulePlan, ProjectPlan, ProviderError};
use catalogue::Catalogue;
use results::Asked;

/// The worker in the module image, found on the guest's PATH.
pub const WORKER: &str = "sim-worker";
/// The parameter table's file in `/work`.
const PARAMS_FILE: &str = "params.txt";
/// The results file in `/work`: the run's only artifact.
const RESULTS_FILE: &str = "results.bin";
/// The shortest share of a run's budget kept back from the worker's own deadline, so the
/// worker can still write its file and the runner report after the deadline stopped a row.
/// The runner's step limit counts from before its own setup and the step's exec, which the
/// worker's clock does not see: under gVisor they and the worker's exit take about 100 ms,
/// and a busy host has stretched that past a quarter of a second, so a row the deadline
/// stopped came back as the runner's bare `timed_out`, without its rows.
const DEADLINE_MARGIN_MIN: Duration = Duration::from_secs(1);
/// The longest such share.
const DEADLINE_MARGIN_MAX: Duration = Duration::from_secs(2);

/// What a module run produced, and the container that ran it.
pub struct Ran {
    /// The result as it goes on the wire.
    pub result: ModuleResult,
    /// The container id (64 hex).
    pub container_id: String,
    /// The container's run.
    pub duration: Duration,
}

/// Runs `plan` in a fresh container of the module image `image`, whose models are
/// `catalogue`.
pub async fn run(
    ctx: &Context<'_>,
    image: &VerifiedImage,
    catalogue: &Catalogue,
    plan: ModulePlan,
) -> Result<Ran, ProviderError> {
    let asked = Asked {
        rows: plan.rows.len(),
        params: plan.rows.first().map_or(0, |r| r.values.len()),
        end_time: plan.end_time,
        step: plan.step,
    };
    check_budget(catalogue, &plan.model, asked)?;
    let budget = plan.timeout.min(project::MAX_TIMEOUT);
    let table = sim_format::table::write(plan.rows.iter().map(|r| r.values.as_slice()));
    let runner_plan = ProjectPlan {
        files: vec![ProjectFile {
            path: PARAMS_FILE.to_owned(),
            content: table,
            ..Default::default()
        }],
        steps: vec![command(&plan.model, plan.end_time, plan.step, budget)],
        artifacts: vec![RESULTS_FILE.to_owned()],
        timeout: budget,
        hold: Hold::default(),
        grant: None,
    };
    let ran = project::run(ctx, image, &runner_plan, plan.hold)
        .await
        .map_err(ProviderError::infrastructure)?;
    Ok(Ran {
        result: classify(ran.result, &plan.model, asked, catalogue)?,
        container_id: ran.container_id,
        duration: ran.duration,
    })
}

/// Refuses, before anything runs, a request whose results could pass the budget once the
/// model's output width is known (the wire's own check assumes one output per step). A model
/// the image does not hold is left to the worker, which answers `setup_failed` for it.
fn check_budget(catalogue: &Catalogue, model: &str, asked: Asked) -> Result<(), Refusal> {
    let Some(shape) = catalogue.get(model) else {
        return Ok(());
    };
    let steps = grid::step_count(asked.end_time, asked.step);
    let bound = sim_format::results::bound(asked.rows as u64, u64::from(shape.outputs), steps);
    if bound <= sim_format::MAX_RESULT_BYTES {
        return Ok(());
    }
    Err(Refusal::InvalidRequest(format!(
        "module results could reach {bound} bytes for {} rows of up to {steps} steps of {} outputs (model {model}), over the {} byte budget; send fewer rows or a shorter horizon; nothing ran",
        asked.rows,
        shape.outputs,
        sim_format::MAX_RESULT_BYTES
    )))
}

/// The worker's deadline within the run's budget: the budget less a margin of a tenth of it
/// (at least 1 s, at most 2 s, never more than half).
pub fn worker_deadline(budget: Duration) -> Duration {
    let margin = (budget / 10)
        .clamp(DEADLINE_MARGIN_MIN, DEADLINE_MARGIN_MAX)
        .min(budget / 2);
    budget.saturating_sub(margin).max(Duration::from_millis(1))
}

/// The step. The model id matched `[A-Za-z0-9][A-Za-z0-9._-]{0,63}` and numbers are written
/// as `{:e}` (digits, `.`, `e`, `-`), so nothing in it is special to the shell.
fn command(model: &str, end_time: f64, step: f64, budget: Duration) -> String {
    let deadline_ms = worker_deadline(budget).as_millis().max(1);
    format!(
        "{WORKER} --table {model} {PARAMS_FILE} {RESULTS_FILE} {end_time:e} {step:e} {} {deadline_ms}",
        sim_format::MAX_RESULT_BYTES
    )
}

/// The module outcome of a finished runner plan (see the module's table).
pub fn classify(
    project: ProjectResult,
    model: &str,
    asked: Asked,
    catalogue: &Catalogue,
) -> Result<ModuleResult, Refusal> {
    let ProjectResult {
        outcome,
        outcome_detail,
        mut steps,
        artifacts,
        artifacts_truncated,
        ..
    } = project;
    let outcome = outcome.as_known().unwrap_or_default();
    if outcome != ProjectOutcome::PROJECT_OUTCOME_COMPLETED {
        let kind = match outcome {
            ProjectOutcome::PROJECT_OUTCOME_SETUP_FAILED
            | ProjectOutcome::PROJECT_OUTCOME_TIMED_OUT => outcome,
            _ => ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR,
        };
        let (stdout, stderr) = steps
            .pop()
            .map(|s| (s.stdout, s.stderr))
            .unwrap_or_default();
        return Ok(answer(kind, outcome_detail, stdout, stderr));
    }
    let Some(step) = steps.pop().filter(|_| steps.is_empty()) else {
        return Ok(answer(
            ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR,
            "the runner reported another plan than the module run's".into(),
            Vec::new(),
            Vec::new(),
        ));
    };
    let StepResult {
        exit_code,
        stdout,
        stderr,
        ..
    } = step;
    let setup_failed = |detail: String| -> Result<ModuleResult, Refusal> {
        Ok(answer(
            ProjectOutcome::PROJECT_OUTCOME_SETUP_FAILED,
            detail,
            stdout.clone(),
            stderr.clone(),
        ))
    };
    match exit_code {
        exit::OK => {}
        exit::LOAD_FAILED => {
            return setup_failed(format!(
                "the module image has no model {model:?} its worker can load (it holds: {})",
                catalogue.ids().collect::<Vec<_>>().join(", ")
            ));
        }
        exit::USAGE => return setup_failed("the module worker refused its arguments".into()),
        exit::MALFORMED_TABLE => {
            let takes = catalogue
                .get(model)
                .map(|s| format!("; model {model} takes {} parameters a row", s.params))
                .unwrap_or_default();
            return setup_failed(format!(
                "the module worker refused the parameter table of {} rows of {} values{takes}",
                asked.rows, asked.params
            ));
        }
        exit::OVER_BUDGET => {
            return Err(Refusal::InvalidRequest(format!(
                "module results for {} rows of model {model} could pass the {} byte budget; the worker refused before running any row",
                asked.rows,
                sim_format::MAX_RESULT_BYTES
            )));
        }
        other => {
            let how = if other == 137 {
                "killed, possibly for memory".to_owned()
            } else {
                format!("exit {other}")
            };
            return Ok(answer(
                ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR,
                format!("the module worker stopped without a result ({how})"),
                stdout,
                stderr,
            ));
        }
    }
    let file = artifacts
        .into_iter()
        .find(|a| a.path == RESULTS_FILE)
        .filter(|_| !artifacts_truncated);
    let decoded = match file {
        Some(file) => results::decode(&file.content, asked).map_err(|e| e.to_string()),
        None => Err("the results file did not come back whole".to_owned()),
    };
    let decoded = match decoded {
        Ok(decoded) => decoded,
        Err(why) => {
            tracing::warn!(model, error = %why, "module results refused");
            return Ok(answer(
                ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR,
                format!("could not read the module's results: {why}"),
                stdout,
                stderr,
            ));
        }
    };
    let stopped = decoded
        .runs
        .iter()
        .position(|r| r.status == status::DEADLINE);
    let (kind, detail) = match stopped {
        Some(row) => (
            ProjectOutcome::PROJECT_OUTCOME_TIMED_OUT,
            format!(
                "the run's time budget ran out at row {row} (counting from 0): it and the {} rows after it have status {} and no outputs",
                decoded.runs.len() - row - 1,
                status::DEADLINE
            ),
        ),
        None => (ProjectOutcome::PROJECT_OUTCOME_COMPLETED, String::new()),
    };
    Ok(ModuleResult {
        runs: decoded.runs,
        width: decoded.width,
        ..answer(kind, detail, stdout, stderr)
    })
}

fn answer(kind: ProjectOutcome, detail: String, stdout: Vec<u8>, stderr: Vec<u8>) -> ModuleResult {
    ModuleResult {
        outcome: kind.into(),
        outcome_detail: detail,
        stdout,
        stderr,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
