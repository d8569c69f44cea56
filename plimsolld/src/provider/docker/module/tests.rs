use std::time::Duration;

use plimsoll::refusal::Refusal;
use plimsoll::wire::{Artifact, ProjectOutcome, ProjectResult, StepResult};
use sim_format::results::Writer;
use sim_format::{exit, status};

use super::catalogue::Catalogue;
use super::results::Asked;
use super::{check_budget, classify, command, worker_deadline};

const ASKED: Asked = Asked {
    rows: 2,
    params: 4,
    end_time: 1.0,
    step: 0.5,
};

fn catalogue() -> Catalogue {
    Catalogue::parse("damped-oscillator params=4 outputs=2\nprobe-spin params=1 outputs=1\n")
        .unwrap()
}

fn ran(exit_code: i32, file: Option<Vec<u8>>, truncated: bool) -> ProjectResult {
    ProjectResult {
        outcome: ProjectOutcome::PROJECT_OUTCOME_COMPLETED.into(),
        steps: vec![StepResult {
            command: "sim-worker …".into(),
            exit_code,
            stdout: b"out".to_vec(),
            stderr: b"worker says".to_vec(),
            ..Default::default()
        }],
        artifacts: file
            .map(|content| Artifact {
                path: "results.bin".into(),
                content,
                ..Default::default()
            })
            .into_iter()
            .collect(),
        artifacts_truncated: truncated,
        ..Default::default()
    }
}

fn two_rows(second: i32) -> Vec<u8> {
    let mut w = Writer::new(2, 2, 4);
    w.row(2, &[1.0, 2.0, 3.0, 4.0]);
    w.row(second, &vec![0.5; second.max(0) as usize * 2]);
    w.finish()
}

fn outcome(r: &plimsoll::wire::ModuleResult) -> ProjectOutcome {
    r.outcome.as_known().unwrap()
}

#[test]
fn a_whole_file_is_a_completed_run_with_the_workers_output() {
    let r = classify(
        ran(0, Some(two_rows(-3)), false),
        "damped-oscillator",
        ASKED,
        &catalogue(),
    )
    .unwrap();
    assert_eq!(outcome(&r), ProjectOutcome::PROJECT_OUTCOME_COMPLETED);
    assert_eq!(r.width, 2);
    assert_eq!(r.runs.len(), 2);
    assert_eq!((r.runs[0].status, r.runs[1].status), (2, -3));
    assert_eq!(
        (r.stdout.as_slice(), r.stderr.as_slice()),
        (&b"out"[..], &b"worker says"[..])
    );
    assert!(r.outcome_detail.is_empty());
}

#[test]
fn a_row_the_deadline_stopped_makes_the_run_timed_out_with_every_row() {
    let r = classify(
        ran(0, Some(two_rows(status::DEADLINE)), false),
        "damped-oscillator",
        ASKED,
        &catalogue(),
    )
    .unwrap();
    assert_eq!(outcome(&r), ProjectOutcome::PROJECT_OUTCOME_TIMED_OUT);
    assert_eq!(r.runs.len(), 2);
    assert!(r.outcome_detail.contains("row 1"), "{}", r.outcome_detail);
}

/// A truncated artifact is protocol_error, never a truncated result (providers.md §8).
#[test]
fn a_missing_cut_or_foreign_file_is_protocol_error_with_no_runs() {
    let whole = two_rows(1);
    for project in [
        ran(0, None, false),
        ran(0, Some(whole[..whole.len() - 3].to_vec()), false),
        ran(0, Some(whole.clone()), true),
        ran(0, Some(b"not a results file at all".to_vec()), false),
    ] {
        let r = classify(project, "damped-oscillator", ASKED, &catalogue()).unwrap();
        assert_eq!(outcome(&r), ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR);
        assert!(r.runs.is_empty() && r.width == 0);
        assert!(!r.outcome_detail.contains("worker says"));
    }
}

#[test]
fn worker_exits_map_as_the_spec_says() {
    let c = catalogue();
    for (code, want) in [
        (
            exit::LOAD_FAILED,
            ProjectOutcome::PROJECT_OUTCOME_SETUP_FAILED,
        ),
        (exit::USAGE, ProjectOutcome::PROJECT_OUTCOME_SETUP_FAILED),
        (
            exit::MALFORMED_TABLE,
            ProjectOutcome::PROJECT_OUTCOME_SETUP_FAILED,
        ),
        (
            exit::NOT_WRITTEN,
            ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR,
        ),
        (101, ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR),
        (137, ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR),
    ] {
        let r = classify(ran(code, Some(two_rows(1)), false), "nope", ASKED, &c).unwrap();
        assert_eq!(outcome(&r), want, "exit {code}");
        assert!(
            r.runs.is_empty(),
            "exit {code}: no results are read after a failure"
        );
    }
    let unknown = classify(ran(exit::LOAD_FAILED, None, false), "nope", ASKED, &c).unwrap();
    assert!(
        unknown
            .outcome_detail
            .contains("damped-oscillator, probe-spin")
    );
    let over = classify(ran(exit::OVER_BUDGET, None, false), "x", ASKED, &c).unwrap_err();
    assert!(matches!(over, Refusal::InvalidRequest(_)));
}

#[test]
fn the_runners_own_outcomes_carry_over_and_anything_else_is_protocol_error() {
    let c = catalogue();
    for (given, want) in [
        (
            ProjectOutcome::PROJECT_OUTCOME_SETUP_FAILED,
            ProjectOutcome::PROJECT_OUTCOME_SETUP_FAILED,
        ),
        (
            ProjectOutcome::PROJECT_OUTCOME_TIMED_OUT,
            ProjectOutcome::PROJECT_OUTCOME_TIMED_OUT,
        ),
        (
            ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR,
            ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR,
        ),
        (
            ProjectOutcome::PROJECT_OUTCOME_RUNNER_FAILED,
            ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR,
        ),
    ] {
        let project = ProjectResult {
            outcome: given.into(),
            outcome_detail: "runner words".into(),
            ..Default::default()
        };
        let r = classify(project, "damped-oscillator", ASKED, &c).unwrap();
        assert_eq!(outcome(&r), want);
        assert_eq!(r.outcome_detail, "runner words");
    }
    let mut two_steps = ran(0, Some(two_rows(1)), false);
    two_steps.steps.push(StepResult::default());
    let r = classify(two_steps, "damped-oscillator", ASKED, &c).unwrap();
    assert_eq!(outcome(&r), ProjectOutcome::PROJECT_OUTCOME_PROTOCOL_ERROR);
}

#[test]
fn the_budget_counts_the_models_outputs_before_anything_runs() {
    let c = catalogue();
    // 2 outputs × 8 bytes × 1 000 000 steps is 16 MB for one row: over, though the wire's
    // one-output rule (8 MB + 20 bytes for 1 row) passed it.
    let one_row = Asked {
        rows: 1,
        end_time: 1000.0,
        step: 0.001,
        ..ASKED
    };
    let err = check_budget(&c, "damped-oscillator", one_row).unwrap_err();
    assert!(err.to_string().contains("nothing ran"), "{err}");
    assert!(check_budget(&c, "probe-spin", one_row).is_ok());
    // An unknown model is the worker's to refuse (setup_failed).
    assert!(check_budget(&c, "unknown", one_row).is_ok());
}

#[test]
fn the_step_and_the_worker_deadline() {
    assert_eq!(
        command("damped-oscillator", 10.0, 0.01, Duration::from_secs(30)),
        "sim-worker --table damped-oscillator params.txt results.bin 1e1 1e-2 8388608 28000"
    );
    assert_eq!(
        worker_deadline(Duration::from_secs(120)),
        Duration::from_secs(118)
    );
    assert_eq!(
        worker_deadline(Duration::from_secs(3)),
        Duration::from_secs(2)
    );
    assert_eq!(
        worker_deadline(Duration::from_secs(1)),
        Duration::from_millis(500)
    );
    assert_eq!(
        worker_deadline(Duration::from_millis(100)),
        Duration::from_millis(50)
    );
    assert_eq!(
        worker_deadline(Duration::from_millis(1)),
        Duration::from_millis(1)
    );
}
