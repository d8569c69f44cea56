//! Snippets and projects in a VM (grants.md §6.5).
//!
//! A snippet is written to `/tmp/plimsoll-snippet.cjs` and run with `node`: in a VM made for
//! one run, up to 64 KiB travels in the process start's environment and the process writes the
//! file itself; larger code, and a session's, is uploaded first (no argv or environment limits).
//! A project's files go under `/home/user/project` and each step into its own
//! `/tmp/plimsoll-step-<i>.sh`, all in one multipart upload; each step is then its own envd
//! process, `sh <script>` in the project directory, with what is left of the budget. The
//! daemon sees every step's exit and output itself from envd's stream, so no report from
//! inside the VM needs to be trusted: the VM is killed after the run either way.

use std::time::{Duration, Instant};

use plimsoll::wire::{ProjectOutcome, ProjectResult, StepResult};

use super::envd::{Command, EXIT_FLOOD, EXIT_TIMED_OUT, Ending, EnvdError, Finished};
use super::sandbox::Vm;
use crate::provider::ProjectPlan;
use crate::provider::docker::settings::OUTPUT_CAP;
use crate::provider::remote::{self, Read, StepRan, outcome};

/// The snippet's file.
pub const SNIPPET_FILE: &str = "/tmp/plimsoll-snippet.cjs";
/// The longest snippet that travels in the process's environment: Linux bounds one
/// environment string at 128 KiB, and the guard library may be prepended.
const INLINE_MAX: usize = 64 << 10;
/// The variable an inline snippet travels in; unset before node starts.
const INLINE_VAR: &str = "PLIMSOLL_SNIPPET";

/// The shell line that writes an inline snippet to its file, as an upload would (same path,
/// same owner), and replaces itself with node on it: the code sees the same file, argv and
/// environment either way.
fn inline_script() -> String {
    format!(
        "printf '%s' \"${INLINE_VAR}\" > {SNIPPET_FILE} && unset {INLINE_VAR} && exec node {SNIPPET_FILE}"
    )
}

/// A project's directory.
pub const PROJECT_DIR: &str = "/home/user/project";
/// A granted project's client library, loaded by every node a step starts.
pub const HOST_LIBRARY: &str = "/tmp/plimsoll-e2b-host.mjs";
/// The VM's CA bundle, which holds E2B's egress proxy's CA: node trusts only what
/// `NODE_EXTRA_CA_CERTS` names.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Why a run has no result.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// envd failed before the code's outcome was known.
    #[error(transparent)]
    Envd(#[from] EnvdError),
    /// The VM went away under the code.
    #[error("sandbox {sandbox} ended while the code ran")]
    Lost { sandbox: String },
}

/// A snippet's result: output, exit (124 at the deadline, 153 on a flood) and timing.
pub struct SnippetRan {
    pub finished: Finished,
    pub exit_code: i32,
}

/// The exit code of an ending, or the loss.
fn exit_of(ending: Ending, vm: &Vm) -> Result<i32, RunError> {
    match ending {
        Ending::Exited(code) => Ok(code),
        Ending::TimedOut => Ok(EXIT_TIMED_OUT),
        Ending::Flooded => Ok(EXIT_FLOOD),
        Ending::Lost => Err(RunError::Lost {
            sandbox: vm.id().to_owned(),
        }),
    }
}

/// Runs a snippet in `vm`; a granted one gets `library` (the guard client, no token)
/// prepended. Code that fits in one environment string travels with the process start and
/// the process writes its own file: one envd call where an upload and a start were two.
/// Larger code (or code with a NUL, which no environment can hold) is uploaded first.
/// A session's VM always gets the file uploaded: its later calls never see the code in a
/// process's arguments or environment.
pub async fn snippet(
    vm: &Vm,
    code: &str,
    timeout: Duration,
    library: Option<&str>,
) -> Result<SnippetRan, RunError> {
    run_snippet(vm, code, timeout, library, false).await
}

/// [`snippet`] in a VM made for this one run (nothing runs in it after), inline when it fits.
pub async fn fresh_snippet(
    vm: &Vm,
    code: &str,
    timeout: Duration,
    library: Option<&str>,
) -> Result<SnippetRan, RunError> {
    run_snippet(vm, code, timeout, library, true).await
}

async fn run_snippet(
    vm: &Vm,
    code: &str,
    timeout: Duration,
    library: Option<&str>,
    fresh: bool,
) -> Result<SnippetRan, RunError> {
    let code = match library {
        Some(library) => format!("{library}{code}"),
        None => code.to_owned(),
    };
    let inline = fresh && code.len() <= INLINE_MAX && !code.contains('\0');
    if !inline {
        vm.envd
            .upload(&[(SNIPPET_FILE.to_owned(), code.clone().into_bytes())])
            .await?;
    }
    let mut envs: Vec<(&str, &str)> = Vec::new();
    if library.is_some() {
        envs.push(("NODE_EXTRA_CA_CERTS", CA_BUNDLE));
    }
    let script = inline_script();
    let (cmd, args): (&str, &[&str]) = if inline {
        envs.push((INLINE_VAR, &code));
        ("sh", &["-c", &script])
    } else {
        ("node", &[SNIPPET_FILE])
    };
    let finished = vm
        .envd
        .run(&Command {
            cmd,
            args,
            cwd: None,
            envs: &envs,
            timeout,
            stdout_cap: OUTPUT_CAP,
            stderr_cap: OUTPUT_CAP,
        })
        .await?;
    let exit_code = exit_of(finished.ending, vm)?;
    Ok(SnippetRan {
        finished,
        exit_code,
    })
}

/// Runs a project in `vm` within `budget`. Once the files are staged every ending is a
/// result; only a VM lost before any step ran is an error. A granted project's steps load
/// `library` (the guard client, no token) into every node they start.
pub async fn project(
    vm: &Vm,
    plan: &ProjectPlan,
    budget: Duration,
    library: Option<&str>,
) -> Result<ProjectResult, RunError> {
    let started = Instant::now();
    let files = remote::staged_files(
        &plan.files,
        &plan.steps,
        PROJECT_DIR,
        library.map(|l| (HOST_LIBRARY, l)),
    );
    let node_options = format!("--import {HOST_LIBRARY}");
    let envs: Vec<(&str, &str)> = match library {
        Some(_) => vec![
            ("NODE_OPTIONS", node_options.as_str()),
            ("NODE_EXTRA_CA_CERTS", CA_BUNDLE),
        ],
        None => Vec::new(),
    };
    if let Err(e) = vm.envd.upload(&files).await {
        return Ok(outcome(
            ProjectOutcome::PROJECT_OUTCOME_SETUP_FAILED,
            format!("the project files could not be written: {e}"),
        ));
    }
    let ran = remote::run_steps("e2b", vm.id(), &plan.steps, (started, budget), |i, left| {
        let envs = &envs;
        async move {
            let script = remote::step_script(i);
            let ran = vm
                .envd
                .run(&Command {
                    cmd: "sh",
                    args: &[&script],
                    cwd: Some(PROJECT_DIR),
                    envs,
                    timeout: left,
                    stdout_cap: OUTPUT_CAP,
                    stderr_cap: OUTPUT_CAP,
                })
                .await;
            let finished = match ran {
                Ok(finished) if finished.ending != Ending::Lost => finished,
                Ok(_) => return Ok::<_, RunError>(StepRan::Lost("the VM ended".to_owned())),
                Err(e) => return Ok(StepRan::Lost(e.to_string())),
            };
            let exit_code = exit_of(finished.ending, vm)?;
            let (stdout, stdout_truncated) = finished.stdout.into_parts();
            let (stderr, stderr_truncated) = finished.stderr.into_parts();
            Ok(StepRan::Ended(StepResult {
                stdout,
                stderr,
                exit_code,
                timed_out: finished.ending == Ending::TimedOut,
                duration_ms: i64::try_from(finished.duration.as_millis()).unwrap_or(i64::MAX),
                stdout_truncated,
                stderr_truncated,
                ..Default::default()
            }))
        }
    })
    .await?;
    let steps = match ran {
        Ok(steps) => steps,
        Err(ended) => return Ok(ended),
    };
    let found = remote::artifacts(
        vm.id(),
        PROJECT_DIR,
        &plan.artifacts,
        started + budget + remote::ARTIFACTS_GRACE,
        |path, limit| async move {
            match vm.envd.download(&path, limit).await {
                Ok(Some(content)) => Read::Content(content),
                Ok(None) => Read::Absent,
                Err(EnvdError::Refused(_)) => Read::TooLarge,
                Err(e) => Read::Failed(e.to_string()),
            }
        },
    )
    .await;
    Ok(remote::completed(steps, found))
}
