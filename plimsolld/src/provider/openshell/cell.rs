//! Cells in an openshell session (providers.md §9.6 over grants.md §8.5): the provider-neutral
//! cell machinery ([`crate::provider::guest::cell`]) carried by the gateway's
//! `ExecSandboxInteractive` ([`SandboxExec`]) instead of `docker exec`.
//!
//! - launch: the launcher runs in one exec (its `setsid` takes the interpreter out of the
//!   exec's process group, so the interpreter outlives it); the relay then runs in a second
//!   exec that stays open: its stdin frames are the host's lines and its stdout events the
//!   relay's frames. Cancelling that stream (dropping the relay's output) makes the gateway
//!   kill the relay's process group.
//! - proof: the gateway's exec cannot choose a uid, so the identity check runs as the guest
//!   under the runner guard (non-dumpable), in a sandbox the startup proof showed to have Yama
//!   `ptrace_scope >= 1` (no session process can trace it). What a same-uid process can still
//!   do there (write into the relay's or the checker's descriptors under gVisor) shapes its
//!   own session's cell answers only: the nonce, the frame bounds and the deadline are checked
//!   on the host, as on docker.
//! - the work directory is the session's (`/tmp/work`, the only writable place the policy
//!   leaves), passed to the launcher and the relay.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::exec::{self, Ending, start_frame};
use super::gateway::Gateway;
use super::proto::v1::exec_sandbox_event::Payload as Event;
use super::proto::v1::exec_sandbox_input::Payload as Input;
use super::proto::v1::{ExecSandboxEvent, ExecSandboxInput};
use super::runs::WORK;
use crate::provider::guest::GuestExec;
pub use crate::provider::guest::cell::Interpreter;
use crate::provider::guest::cell::{CellRelay, Checker, Layout, RelayParent};
use crate::provider::guest::cells::Target;
use crate::provider::guest::outcome::GUARD;
use crate::provider::guest::output::Capped;
use crate::provider::guest::{Command, ExecError, Held, HeldInput, HeldOutput, Ran};

/// How long the relay's exec may live (the session's lifetime ends it first).
const RELAY_LIFETIME: Duration = Duration::from_secs(13 * 3600);

/// One sandbox, reached through the gateway.
#[derive(Clone)]
struct SandboxExec {
    gateway: Gateway,
    sandbox: String,
}

/// A held exec's stdin: frames on the request stream; closing it half-closes the request.
struct Stdin(Option<mpsc::Sender<ExecSandboxInput>>);

/// A held exec's stdout: the event stream (dropping it cancels the exec).
struct Stdout {
    events: tonic::Streaming<ExecSandboxEvent>,
    stderr: Capped,
    ended: bool,
}

/// Where a session's interpreters run in `sandbox`: as the sandbox's user (the gateway picks
/// it), in the session's work directory, checked under the runner guard.
pub fn target(gateway: Gateway, sandbox: String) -> Target {
    let layout = Layout {
        work: WORK.to_owned(),
        // The gateway's exec has no user to choose.
        user: String::new(),
        checker: Checker::GuardedGuest,
        // `env` execs the interpreter, so the PID and command line are the interpreter's.
        interpreter_prefix: vec!["env".to_owned(), format!("LD_PRELOAD={GUARD}")],
        guard: Some(GUARD.to_owned()),
        relay_parent: RelayParent::Outside,
        // The sandbox image carries the relay already (grants use it).
        relay: CellRelay::Binary(super::dial::RELAY_BINARY.to_owned()),
    };
    let exec: Arc<dyn GuestExec> = Arc::new(SandboxExec { gateway, sandbox });
    (exec, layout)
}

/// `NAME=value` entries as the gateway's environment map.
fn env_map(env: &[String]) -> BTreeMap<String, String> {
    env.iter()
        .filter_map(|entry| entry.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

#[async_trait]
impl GuestExec for SandboxExec {
    async fn run(&self, command: Command<'_>) -> Result<Ran, ExecError> {
        let command = exec::Command {
            argv: command.argv.to_vec(),
            env: env_map(command.env),
            stdin: command.stdin.to_vec(),
            timeout: command
                .deadline
                .saturating_duration_since(tokio::time::Instant::now()),
            stdout_cap: command.stdout_cap,
            stderr_cap: command.stderr_cap,
        };
        let ran = exec::run(&self.gateway, &self.sandbox, command)
            .await
            .map_err(|e| ExecError::Refused(e.to_string()))?;
        let (stdout, stdout_truncated) = ran.stdout.into_parts();
        let (stderr, stderr_truncated) = ran.stderr.into_parts();
        let exit_code = match ran.ending {
            Ending::Exited(code) => Some(i64::from(code)),
            Ending::TimedOut | Ending::Lost => None,
        };
        Ok(Ran {
            exit_code,
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
            timed_out: ran.ending == Ending::TimedOut,
        })
    }

    async fn start(&self, command: Command<'_>) -> Result<Held, ExecError> {
        let (stdin, rx) = mpsc::channel(4);
        let start = start_frame(
            &self.sandbox,
            command.argv.to_vec(),
            env_map(command.env),
            RELAY_LIFETIME,
        );
        stdin
            .send(start)
            .await
            .map_err(|_| ExecError::Refused("the exec's stream closed at once".to_owned()))?;
        let opened =
            tokio::time::timeout_at(command.deadline, self.gateway.exec(ReceiverStream::new(rx)))
                .await;
        let events = match opened {
            Ok(Ok(events)) => events,
            Ok(Err(e)) => return Err(ExecError::Refused(e.to_string())),
            Err(_) => {
                return Err(ExecError::Refused(
                    "the gateway did not open the exec in time".to_owned(),
                ));
            }
        };
        Ok(Held {
            stdin: Box::new(Stdin(Some(stdin))),
            stdout: Box::new(Stdout {
                events,
                stderr: Capped::new(command.stderr_cap),
                ended: false,
            }),
        })
    }
}

#[async_trait]
impl HeldInput for Stdin {
    async fn write(&mut self, bytes: Vec<u8>) -> Result<(), ExecError> {
        let closed = || ExecError::Closed("the exec's stream is closed".to_owned());
        let sender = self.0.as_ref().ok_or_else(closed)?;
        let frame = ExecSandboxInput {
            payload: Some(Input::Stdin(bytes)),
        };
        sender.send(frame).await.map_err(|_| closed())
    }

    async fn close(&mut self) {
        self.0 = None;
    }
}

#[async_trait]
impl HeldOutput for Stdout {
    async fn next(&mut self) -> Option<Vec<u8>> {
        while !self.ended {
            match self.events.message().await {
                Ok(Some(event)) => match event.payload {
                    Some(Event::Stdout(o)) => return Some(o.data),
                    Some(Event::Stderr(e)) => self.stderr.push(&e.data),
                    Some(Event::Exit(_)) => self.ended = true,
                    None => {}
                },
                Ok(None) | Err(_) => self.ended = true,
            }
        }
        None
    }

    fn stderr(&self) -> &[u8] {
        self.stderr.bytes()
    }
}
