//! Snippets and projects in a sandbox (grants.md §7.5).
//!
//! A snippet is uploaded to `/tmp/plimsoll-snippet.cjs` and run with `node` through the exec
//! wrapper. A project's directories are made first (`mkdir -p`: upload does not make
//! parents), then its files go under `/tmp/plimsoll-project` and each step into
//! `/tmp/plimsoll-step-<i>.sh` in one upload; each step is its own wrapped exec, `sh
//! <script>` in the project directory, with what is left of the budget minus 2 s as its
//! in-guest limit. Timed out = exit 137 or 124 **and** the limit elapsed. Any other death by a
//! signal is the command's own only if the sandbox still answers; if not, the sandbox was
//! lost under the code (a project answers `runner_failed`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use plimsoll::wire::{ProjectOutcome, ProjectResult, StepResult};

use super::api::ApiError;
use super::endpoint::{EXIT_FLOOD, Exec, wrapped};
use super::sandbox::Sandbox;
use crate::provider::ProjectPlan;
use crate::provider::docker::settings::OUTPUT_CAP;
use crate::provider::remote::{self, Read, StepRan, outcome};

/// The snippet's file.
pub const SNIPPET_FILE: &str = "/tmp/plimsoll-snippet.cjs";
/// A project's directory.
pub const PROJECT_DIR: &str = "/tmp/plimsoll-project";
/// A granted project's client module, loaded by every node a step starts.
pub const HOST_LIBRARY: &str = "/tmp/plimsoll-dockercloud-host.mjs";
/// What the in-guest limit leaves of the budget for the call around it.
const GUEST_MARGIN: Duration = Duration::from_secs(2);
/// The exit of a run its deadline ended, as the answer states it.
pub const EXIT_TIMED_OUT: i32 = 124;

/// Why a run has no result.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The command died by a signal and the sandbox no longer answers: it went away under
    /// the code, whose effects are unknown.
    #[error(
        "sandbox {sandbox} stopped answering when its command died by a signal (exit {exit}): {why}"
    )]
    Lost {
        sandbox: String,
        exit: i32,
        why: String,
    },
}

/// One wrapped command's result, judged.
#[derive(Debug, Default)]
pub struct Ran {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub exit_code: i32,
    pub timed_out: bool,
    pub duration: Duration,
}

/// The in-guest limit for what is left of a budget.
fn guest_limit(left: Duration) -> Duration {
    let limit = left.saturating_sub(GUEST_MARGIN);
    limit.max(Duration::from_secs(1))
}

fn cut(mut bytes: Vec<u8>) -> (Vec<u8>, bool) {
    if bytes.len() > OUTPUT_CAP {
        bytes.truncate(OUTPUT_CAP);
        (bytes, true)
    } else {
        (bytes, false)
    }
}

/// Runs `argv` through the wrapper within `left` of the budget.
pub async fn run(
    sandbox: &Sandbox,
    argv: &[&str],
    cwd: &str,
    left: Duration,
) -> Result<Ran, RunError> {
    let limit = guest_limit(left);
    let secs = limit.as_secs().max(1);
    let cmd = wrapped(secs, OUTPUT_CAP, argv);
    let bearer = sandbox.bearer().await?;
    let started = Instant::now();
    let exec: Exec = sandbox
        .endpoint
        .exec(&bearer, &cmd, cwd, Duration::from_secs(secs), OUTPUT_CAP)
        .await?;
    let duration = started.elapsed();
    if exec.flooded {
        return Ok(Ran {
            exit_code: EXIT_FLOOD,
            stdout_truncated: true,
            stderr_truncated: true,
            duration,
            ..Ran::default()
        });
    }
    let timed_out = matches!(exec.exit_code, 137 | 124) && duration >= Duration::from_secs(secs);
    if exec.exit_code > 128
        && !timed_out
        && let Err(why) = still_answers(sandbox).await
    {
        return Err(RunError::Lost {
            sandbox: sandbox.id().to_owned(),
            exit: exec.exit_code,
            why,
        });
    }
    let (stdout, stdout_truncated) = cut(exec.stdout);
    let (stderr, stderr_truncated) = cut(exec.stderr);
    Ok(Ran {
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
        exit_code: if timed_out {
            EXIT_TIMED_OUT
        } else {
            exec.exit_code
        },
        timed_out,
        duration,
    })
}

/// Whether the sandbox still runs commands. A command killed by a signal may have died with
/// its sandbox (the exec reports that as the command's own exit, 137 for a kill), so its exit
/// is the command's only once the sandbox answers an exec of `true`.
async fn still_answers(sandbox: &Sandbox) -> Result<(), String> {
    const PROBE: Duration = Duration::from_secs(10);
    let bearer = sandbox.bearer().await.map_err(|e| e.to_string())?;
    let cmd = wrapped(PROBE.as_secs(), OUTPUT_CAP, &["true"]);
    match sandbox
        .endpoint
        .exec(&bearer, &cmd, "/tmp", PROBE, OUTPUT_CAP)
        .await
    {
        Ok(exec) if exec.exit_code == 0 => Ok(()),
        Ok(exec) => Err(format!("`true` exited {}", exec.exit_code)),
        Err(e) => Err(e.to_string()),
    }
}

/// Runs a snippet; a granted one gets `library` (the guard client with the run's token)
/// prepended.
pub async fn snippet(
    sandbox: &Sandbox,
    code: &str,
    timeout: Duration,
    library: Option<&str>,
) -> Result<Ran, RunError> {
    let started = Instant::now();
    let code = match library {
        Some(library) => format!("{library}{code}"),
        None => code.to_owned(),
    };
    let bearer = sandbox.bearer().await?;
    sandbox
        .endpoint
        .upload(&bearer, &[(SNIPPET_FILE.to_owned(), code.into_bytes())])
        .await?;
    let left = timeout.saturating_sub(started.elapsed()) + GUEST_MARGIN;
    run(sandbox, &["node", SNIPPET_FILE], "/tmp", left).await
}

/// Every directory the files need, parents first.
fn directories(files: &[(String, Vec<u8>)]) -> Vec<String> {
    let mut dirs = BTreeSet::new();
    for (path, _) in files {
        let mut at = path.as_str();
        while let Some((parent, _)) = at.rsplit_once('/') {
            if parent.is_empty() || parent == "/tmp" {
                break;
            }
            dirs.insert(parent.to_owned());
            at = parent;
        }
    }
    dirs.into_iter().collect()
}

/// Runs a project within `budget`; once the files are staged every ending is a result.
pub async fn project(
    sandbox: &Sandbox,
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
    let node_options = format!("NODE_OPTIONS=--import {HOST_LIBRARY}");
    let mut mkdir = vec!["mkdir", "-p", "--"];
    let dirs = directories(&files);
    mkdir.extend(dirs.iter().map(String::as_str));
    let made = run(sandbox, &mkdir, "/tmp", budget).await?;
    let staged = if made.exit_code != 0 {
        Err(format!(
            "the project directories could not be made: {}",
            String::from_utf8_lossy(&made.stderr).trim()
        ))
    } else {
        let bearer = sandbox.bearer().await?;
        sandbox
            .endpoint
            .upload(&bearer, &files)
            .await
            .map_err(|e| format!("the project files could not be written: {e}"))
    };
    if let Err(detail) = staged {
        return Ok(outcome(
            ProjectOutcome::PROJECT_OUTCOME_SETUP_FAILED,
            detail,
        ));
    }
    let ran = remote::run_steps(
        "dockercloud",
        sandbox.id(),
        &plan.steps,
        (started, budget),
        |i, left| {
            let node_options = &node_options;
            async move {
                let script = remote::step_script(i);
                let argv: Vec<&str> = match library {
                    Some(_) => vec!["env", node_options, "sh", &script],
                    None => vec!["sh", &script],
                };
                let ran = match run(sandbox, &argv, PROJECT_DIR, left).await {
                    Ok(ran) => ran,
                    Err(e) => return Ok::<_, RunError>(StepRan::Lost(e.to_string())),
                };
                Ok(StepRan::Ended(StepResult {
                    stdout: ran.stdout,
                    stderr: ran.stderr,
                    exit_code: ran.exit_code,
                    timed_out: ran.timed_out,
                    duration_ms: i64::try_from(ran.duration.as_millis()).unwrap_or(i64::MAX),
                    stdout_truncated: ran.stdout_truncated,
                    stderr_truncated: ran.stderr_truncated,
                    ..Default::default()
                }))
            }
        },
    )
    .await?;
    let steps = match ran {
        Ok(steps) => steps,
        Err(ended) => return Ok(ended),
    };
    let found = match sandbox.bearer().await {
        Ok(bearer) => {
            let bearer = &bearer;
            remote::artifacts(
                sandbox.id(),
                PROJECT_DIR,
                &plan.artifacts,
                started + budget + remote::ARTIFACTS_GRACE,
                |path, limit| async move {
                    match sandbox.endpoint.download(bearer, &path, limit).await {
                        Ok(Some(content)) => Read::Content(content),
                        Ok(None) => Read::Absent,
                        Err(e) => Read::Failed(e.to_string()),
                    }
                },
            )
            .await
        }
        Err(_) => (Vec::new(), !plan.artifacts.is_empty()),
    };
    Ok(remote::completed(steps, found))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_made_first_and_tmp_is_left_alone() {
        let files = vec![
            ("/tmp/plimsoll-project/a/b/c.js".to_owned(), Vec::new()),
            ("/tmp/plimsoll-step-0.sh".to_owned(), Vec::new()),
        ];
        assert_eq!(
            directories(&files),
            [
                "/tmp/plimsoll-project",
                "/tmp/plimsoll-project/a",
                "/tmp/plimsoll-project/a/b"
            ]
        );
    }
}
