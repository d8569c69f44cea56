//! One command in a sandbox through `ExecSandboxInteractive` (grants.md §8.5).
//!
//! The start frame names the sandbox, the argv, the environment and `no_login_shell`; stdin
//! follows in frames of at most 64 KiB, then the request side is half-closed. The exit event
//! decides the result; output arriving after it is read for up to 1 s more and kept. The
//! gateway's own `execution_timeout` is only a backstop (remaining time + 10 s: it answers
//! exit 124 and leaves the command running); the real deadline is cancelling the stream,
//! which makes the gateway kill the command's process group.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::gateway::{Gateway, GatewayError, workspace};
use super::proto::v1::exec_sandbox_event::Payload as Event;
use super::proto::v1::exec_sandbox_input::Payload as Input;
use super::proto::v1::{ExecSandboxInput, ExecSandboxRequest};
use crate::provider::guest::output::Capped;

/// The largest stdin frame.
const STDIN_FRAME: usize = 64 * 1024;
/// What the gateway's own timeout adds to the deadline.
const BACKSTOP: Duration = Duration::from_secs(10);
/// How long output is read after the exit event.
const AFTER_EXIT: Duration = Duration::from_secs(1);
/// The exit code a deadline gives.
pub const EXIT_TIMED_OUT: i32 = 124;

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The gateway reported its exit code.
    Exited(i32),
    /// The deadline passed and the stream was cancelled.
    TimedOut,
    /// The stream ended without an exit event: the sandbox died or stopped under it.
    Lost,
}

/// One command to run.
#[derive(Debug, Clone)]
pub struct Command {
    /// argv.
    pub argv: Vec<String>,
    /// Its environment (on top of the sandbox's).
    pub env: BTreeMap<String, String>,
    /// Sent whole, then end of file.
    pub stdin: Vec<u8>,
    /// The deadline: the stream is cancelled when it passes.
    pub timeout: Duration,
    /// How much of stdout is kept.
    pub stdout_cap: usize,
    /// How much of stderr is kept.
    pub stderr_cap: usize,
}

/// What a command did.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Standard output, capped.
    pub stdout: Capped,
    /// Standard error, capped.
    pub stderr: Capped,
    /// How it ended.
    pub ending: Ending,
    /// From the start frame to the exit (or the deadline).
    pub duration: Duration,
}

/// The start frame for `argv` in `sandbox`.
pub fn start_frame(
    sandbox: &str,
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    timeout: Duration,
) -> ExecSandboxInput {
    let backstop = timeout + BACKSTOP;
    ExecSandboxInput {
        payload: Some(Input::Start(ExecSandboxRequest {
            workspace_scope: workspace(),
            sandbox: sandbox.to_owned(),
            command: argv,
            environment: env,
            execution_timeout: Some(prost_types::Duration {
                seconds: i64::try_from(backstop.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(backstop.subsec_nanos()).unwrap_or(0),
            }),
            no_login_shell: true,
            ..ExecSandboxRequest::default()
        })),
    }
}

/// Runs `command` in `sandbox` until it exits or its deadline passes. `Err` only when the
/// gateway refused the exec: nothing ran.
pub async fn run(
    gateway: &Gateway,
    sandbox: &str,
    command: Command,
) -> Result<Finished, GatewayError> {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + command.timeout;
    let (tx, rx) = mpsc::channel(4);
    let start = start_frame(sandbox, command.argv, command.env, command.timeout);
    // Feeds stdin while the answer is read; dropping the sender half-closes the request.
    let stdin = command.stdin;
    let feeder = tokio::spawn(async move {
        if tx.send(start).await.is_err() {
            return;
        }
        for chunk in stdin.chunks(STDIN_FRAME) {
            let frame = ExecSandboxInput {
                payload: Some(Input::Stdin(chunk.to_vec())),
            };
            if tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    let mut stdout = Capped::new(command.stdout_cap);
    let mut stderr = Capped::new(command.stderr_cap);
    let opened = tokio::time::timeout_at(deadline, gateway.exec(ReceiverStream::new(rx))).await;
    let mut events = match opened {
        Ok(events) => events?,
        Err(_) => {
            feeder.abort();
            return Ok(finished(stdout, stderr, Ending::TimedOut, started));
        }
    };
    let mut exit = None;
    let mut until = deadline;
    loop {
        let next = tokio::time::timeout_at(until, events.message()).await;
        let event = match next {
            // The deadline (or the second after the exit) passed: dropping the stream
            // cancels it, and the gateway kills the command's process group.
            Err(_) => break,
            Ok(Ok(Some(event))) => event,
            Ok(Ok(None)) => break,
            Ok(Err(status)) => {
                tracing::debug!(%sandbox, code = ?status.code(), exited = exit.is_some(), "exec stream ended with a status");
                break;
            }
        };
        match event.payload {
            Some(Event::Stdout(o)) => stdout.push(&o.data),
            Some(Event::Stderr(e)) => stderr.push(&e.data),
            Some(Event::Exit(x)) if exit.is_none() => {
                exit = Some(x.exit_code);
                until = tokio::time::Instant::now() + AFTER_EXIT;
            }
            Some(Event::Exit(_)) | None => {}
        }
    }
    feeder.abort();
    drop(events);
    let ending = match exit {
        Some(code) => Ending::Exited(code),
        None if tokio::time::Instant::now() >= deadline => Ending::TimedOut,
        None => Ending::Lost,
    };
    Ok(finished(stdout, stderr, ending, started))
}

fn finished(stdout: Capped, stderr: Capped, ending: Ending, started: Instant) -> Finished {
    Finished {
        stdout,
        stderr,
        ending,
        duration: started.elapsed(),
    }
}
