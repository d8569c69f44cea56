//! Commands in a running container, over the Engine's exec API (providers.md §9.1–§9.6: the
//! session baseline, snippet and project calls, the sweep, the cell launcher and the relays).
//!
//! Two shapes:
//! - [`run`]: one command to its end, with stdin bytes, both streams capped and a deadline;
//!   it answers the exit code, what was kept and whether anything was dropped.
//! - [`attach`]: a long-lived command whose stdin and stdout the daemon holds (a cell relay).
//!
//! The environment is the caller's to state: a docker exec inherits the container's `Env`, so
//! every command here should start with [`env_argv`] (`/usr/bin/env -i PATH=… NAME=value…`), the
//! way every guest process of §5.5 starts. Docker has no call that kills an exec: when a deadline
//! passes, the process is left to the session's sweep (§9.4), and the answer says so.

use std::pin::Pin;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures::{Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::engine::Engine;
use super::lockdown::GUEST_PATH;
use crate::provider::guest::output::Capped;

#[cfg(test)]
pub(super) mod testbed;
#[cfg(test)]
mod tests;

/// The budget of creating an exec and of inspecting it.
const QUICK: Duration = Duration::from_secs(10);
/// The budget of starting an exec (under gVisor this spawns inside the sandbox).
const START: Duration = Duration::from_secs(20);
/// How long a finished exec's stream may run ahead of docker recording its exit code.
const EXIT_SETTLE: Duration = Duration::from_secs(2);
/// The pause between two inspections while the exit code settles.
const EXIT_POLL: Duration = Duration::from_millis(20);
/// The largest piece bollard's decoder buffers before handing it on.
const FRAME_CAPACITY: usize = 64 * 1024;

/// What can go wrong running an exec. Each variant names the step.
#[derive(Debug, thiserror::Error)]
pub(super) enum ExecError {
    /// An Engine API call failed (the container may be gone, stopped or paused).
    #[error("docker exec {call} in {container}: {source}")]
    Api {
        call: &'static str,
        container: String,
        source: Box<bollard::errors::Error>,
    },
    /// An Engine API call ran out of its budget.
    #[error("docker exec {call} in {container} did not answer within {budget:?}")]
    Timeout {
        call: &'static str,
        container: String,
        budget: Duration,
    },
    /// Docker started the exec detached although an attached one was asked for.
    #[error("docker exec in {0} did not attach")]
    NotAttached(String),
}

/// One command for [`run`].
#[derive(Debug, Clone)]
pub(super) struct ExecSpec<'a> {
    /// The argv, usually built with [`env_argv`].
    pub argv: &'a [String],
    /// `uid:gid`; the image's `USER` never applies.
    pub user: &'a str,
    /// The working directory, or the container's.
    pub workdir: Option<&'a str>,
    /// Bytes written to stdin, which is then closed (nothing is attached when empty).
    pub stdin: &'a [u8],
    /// Stdout bytes kept; the rest is read and dropped.
    pub stdout_cap: usize,
    /// Stderr bytes kept; the rest is read and dropped.
    pub stderr_cap: usize,
    /// When the answer is due, whether or not the command ended.
    pub deadline: Instant,
}

/// What [`run`] saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ExecOutcome {
    /// The exit code, or `None` when the deadline passed first or docker did not record one.
    pub exit_code: Option<i64>,
    /// The kept stdout.
    pub stdout: Vec<u8>,
    /// The kept stderr.
    pub stderr: Vec<u8>,
    /// Stdout bytes were dropped past the cap.
    pub stdout_truncated: bool,
    /// Stderr bytes were dropped past the cap.
    pub stderr_truncated: bool,
    /// The deadline passed before the output ended; the process may still be running.
    pub timed_out: bool,
}

/// `/usr/bin/env -i PATH=<guest path> <env…> <command…>`: the command with exactly `env`, the
/// fixed search path and nothing a docker exec would otherwise inherit.
pub(super) fn env_argv(env: &[String], command: &[String]) -> Vec<String> {
    let mut argv = vec![
        "/usr/bin/env".to_owned(),
        "-i".to_owned(),
        format!("PATH={GUEST_PATH}"),
    ];
    argv.extend(env.iter().cloned());
    argv.extend(command.iter().cloned());
    argv
}

async fn bounded<T>(
    call: &'static str,
    container: &str,
    budget: Duration,
    fut: impl Future<Output = Result<T, bollard::errors::Error>>,
) -> Result<T, ExecError> {
    match tokio::time::timeout(budget, fut).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(ExecError::Api {
            call,
            container: container.to_owned(),
            source: Box::new(source),
        }),
        Err(_) => Err(ExecError::Timeout {
            call,
            container: container.to_owned(),
            budget,
        }),
    }
}

type OutputStream = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;
type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// Creates and starts an attached exec; answers its id and both ends.
async fn start(
    engine: &Engine,
    container: &str,
    argv: &[String],
    user: &str,
    workdir: Option<&str>,
    stdin: bool,
) -> Result<(String, Input, OutputStream), ExecError> {
    let options = CreateExecOptions {
        attach_stdin: Some(stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        // Inherited container variables are cleared by `env -i` in the argv; this keeps docker
        // from adding any of its own.
        env: Some(Vec::new()),
        cmd: Some(argv.to_vec()),
        privileged: Some(false),
        user: Some(user.to_owned()),
        working_dir: workdir.map(str::to_owned),
        detach_keys: None,
    };
    let api = engine.api();
    let created = bounded(
        "create",
        container,
        QUICK,
        api.create_exec(container, options),
    )
    .await?;
    let start = StartExecOptions {
        detach: false,
        tty: false,
        output_capacity: Some(FRAME_CAPACITY),
    };
    match bounded(
        "start",
        container,
        START,
        api.start_exec(&created.id, Some(start)),
    )
    .await?
    {
        StartExecResults::Attached { output, input } => Ok((created.id, input, output)),
        StartExecResults::Detached => Err(ExecError::NotAttached(container.to_owned())),
    }
}

/// The exec's exit code once docker recorded it (`None` if it is still running after
/// [`EXIT_SETTLE`]).
async fn exit_code(engine: &Engine, container: &str, id: &str) -> Result<Option<i64>, ExecError> {
    let settle = Instant::now() + EXIT_SETTLE;
    loop {
        let inspected = bounded("inspect", container, QUICK, engine.api().inspect_exec(id)).await?;
        if inspected.running != Some(true) {
            return Ok(inspected.exit_code);
        }
        if Instant::now() >= settle {
            return Ok(None);
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
}

/// Runs `spec.argv` in `container` to its end or its deadline.
///
/// Stdin is written while the output is read, so neither side can block the other. A deadline
/// that passes leaves the process running (docker cannot kill an exec) and answers
/// `timed_out` with what was read so far; an error means docker did not run the command or
/// could not be asked how it ended.
pub(super) async fn run(
    engine: &Engine,
    container: &str,
    spec: &ExecSpec<'_>,
) -> Result<ExecOutcome, ExecError> {
    let create_and_start = start(
        engine,
        container,
        spec.argv,
        spec.user,
        spec.workdir,
        !spec.stdin.is_empty(),
    );
    let (id, mut input, mut output) =
        match tokio::time::timeout_at(spec.deadline, create_and_start).await {
            Ok(started) => started?,
            Err(_) => {
                return Ok(ExecOutcome {
                    timed_out: true,
                    ..ExecOutcome::default()
                });
            }
        };
    let mut stdout = Capped::new(spec.stdout_cap);
    let mut stderr = Capped::new(spec.stderr_cap);
    let feed = async {
        if !spec.stdin.is_empty() {
            // A command that exits without reading its input closes the pipe; that is its
            // business, not an error of the exec.
            let _ = input.write_all(spec.stdin).await;
        }
        let _ = input.shutdown().await;
    };
    let drain = async {
        while let Some(item) = output.next().await {
            match item {
                Ok(LogOutput::StdOut { message }) => stdout.push(&message),
                Ok(LogOutput::StdErr { message }) => stderr.push(&message),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(container, error = %e, "exec output ended with an error");
                    break;
                }
            }
        }
    };
    let finished = tokio::time::timeout_at(spec.deadline, async {
        tokio::join!(feed, drain);
    })
    .await
    .is_ok();
    let exit_code = if finished {
        exit_code(engine, container, &id).await?
    } else {
        None
    };
    let (stdout, stdout_truncated) = stdout.into_parts();
    let (stderr, stderr_truncated) = stderr.into_parts();
    Ok(ExecOutcome {
        exit_code,
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
        timed_out: !finished,
    })
}

/// A long-lived exec whose stdin and stdout the daemon holds.
pub(super) struct Attached {
    /// The command's stdin. Shutting it down closes the command's stdin.
    pub stdin: Input,
    /// The command's stdout (stderr is kept apart, up to a cap, for diagnostics).
    pub stdout: AttachedStdout,
}

/// The stdout half of an [`Attached`] exec.
pub(super) struct AttachedStdout {
    output: OutputStream,
    stderr: Capped,
}

/// Starts `argv` in `container` with stdin and stdout attached; it lives until its stdin
/// closes, it exits, or the container stops. `stderr_cap` bytes of its stderr are kept.
pub(super) async fn attach(
    engine: &Engine,
    container: &str,
    argv: &[String],
    user: &str,
    workdir: Option<&str>,
    stderr_cap: usize,
) -> Result<Attached, ExecError> {
    let (_, stdin, output) = start(engine, container, argv, user, workdir, true).await?;
    Ok(Attached {
        stdin,
        stdout: AttachedStdout {
            output,
            stderr: Capped::new(stderr_cap),
        },
    })
}

// === impl AttachedStdout ===

impl AttachedStdout {
    /// The next stdout bytes, or `None` once the stream ended (the command exited, or docker
    /// dropped the connection). Stderr read on the way is kept up to its cap. Cancel-safe: no
    /// bytes are lost when the future is dropped.
    pub(super) async fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            match self.output.next().await? {
                Ok(LogOutput::StdOut { message }) => return Some(message.to_vec()),
                Ok(LogOutput::StdErr { message }) => self.stderr.push(&message),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "attached exec output ended with an error");
                    return None;
                }
            }
        }
    }

    /// What the command wrote to stderr so far (up to the cap).
    pub(super) fn stderr(&self) -> &[u8] {
        self.stderr.bytes()
    }
}
