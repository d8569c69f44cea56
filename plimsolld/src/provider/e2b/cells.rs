//! Cells in an e2b session (wire.md §7.4, providers.md §9.6): the provider-neutral cell
//! machinery ([`crate::provider::guest::cell`]) over envd ([`VmExec`]).
//!
//! - the interpreter, its launcher and its relay run as `user`, in `user`'s home (where the
//!   session's files are); the identity check runs as root, which no session process can
//!   reach, and accepts a relay only when its parent is a root process (envd);
//! - the relay is held as an envd process with stdin open: its stdout events are the relay's
//!   frames, the host's lines go in by `SendInput`, and `CloseStdin` ends it;
//! - E2B's template has no runner guard, so the relay is an ordinary process of `user`: a cell
//!   can reach its descriptors and so shape its own session's cell answers, nothing more (the
//!   nonce, the frame bounds and the deadline are checked on the host);
//! - between calls the sweep spares the live interpreters and relays (by identity); they end
//!   before a project call and before a granted call (a kept interpreter must not run beside
//!   the runner's report key or inside a call's window to the guard), and before a suspend
//!   (the relay's stream does not survive a pause): the next cell then starts a fresh
//!   interpreter and says `interpreter_started`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::envd::{self, Command as EnvdCommand, Ending, Envd, HeldStdin, HeldStdout};
use super::session::E2bSession;
use crate::provider::guest::cell::{CellRelay, Checker, Layout, RelayParent};
use crate::provider::guest::cells::{self, Target};
use crate::provider::guest::{Command, ExecError, GuestExec, Held, HeldInput, HeldOutput, Ran};
use crate::provider::{CellCall, CellOutcome, SessionFault};

/// Where cells run and files land: `user`'s home, the session's files.
const WORK: &str = "/home/user";
/// How long a relay's envd process may live (the session's lifetime ends it first).
const RELAY_LIFETIME: Duration = Duration::from_secs(13 * 3600);

/// One VM's envd, as `user` and as root.
struct VmExec {
    user: Envd,
    root: Envd,
}

/// Where a session's interpreters run in the VM of `user` (its envd) and `root`.
pub(super) fn target(user: &Envd, root: &Envd) -> Target {
    let layout = Layout {
        work: WORK.to_owned(),
        user: envd::USER.to_owned(),
        checker: Checker::User("root".to_owned()),
        // The launcher's `setsid` execs the interpreter itself.
        interpreter_prefix: Vec::new(),
        guard: None,
        relay_parent: RelayParent::Root,
        // E2B's template is E2B's, not plimsoll's image: it has node but no relay binary.
        relay: CellRelay::Node,
    };
    let exec: Arc<dyn GuestExec> = Arc::new(VmExec {
        user: user.clone(),
        root: root.clone(),
    });
    (exec, layout)
}

// === impl VmExec ===

impl VmExec {
    fn envd(&self, user: &str) -> &Envd {
        if user == "root" {
            &self.root
        } else {
            &self.user
        }
    }
}

/// `NAME=value` entries as envd's pairs.
fn env_pairs(env: &[String]) -> Vec<(&str, &str)> {
    env.iter().filter_map(|e| e.split_once('=')).collect()
}

#[async_trait]
impl GuestExec for VmExec {
    async fn run(&self, command: Command<'_>) -> Result<Ran, ExecError> {
        // Cells never feed a short command; envd's stdin is reached only through a held one.
        if !command.stdin.is_empty() {
            return Err(ExecError::Refused(
                "stdin bytes for a one-shot e2b command are not offered".to_owned(),
            ));
        }
        let (cmd, args) = command
            .argv
            .split_first()
            .ok_or_else(|| ExecError::Refused("an empty argv".to_owned()))?;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let envs = env_pairs(command.env);
        let timeout = command
            .deadline
            .saturating_duration_since(tokio::time::Instant::now());
        let ran = self
            .envd(command.user)
            .run(&EnvdCommand {
                cmd,
                args: &args,
                cwd: None,
                envs: &envs,
                timeout,
                stdout_cap: command.stdout_cap,
                stderr_cap: command.stderr_cap,
            })
            .await
            .map_err(|e| ExecError::Refused(e.to_string()))?;
        let (stdout, stdout_truncated) = ran.stdout.into_parts();
        let (stderr, stderr_truncated) = ran.stderr.into_parts();
        let exit_code = match ran.ending {
            Ending::Exited(code) => Some(i64::from(code)),
            Ending::TimedOut | Ending::Flooded | Ending::Lost => None,
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
        let (cmd, args) = command
            .argv
            .split_first()
            .ok_or_else(|| ExecError::Refused("an empty argv".to_owned()))?;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let envs = env_pairs(command.env);
        let relay = EnvdCommand {
            cmd,
            args: &args,
            cwd: None,
            envs: &envs,
            timeout: RELAY_LIFETIME,
            stdout_cap: 0,
            stderr_cap: command.stderr_cap,
        };
        let held = self.envd(command.user).start_held(&relay);
        let (stdin, stdout) = match tokio::time::timeout_at(command.deadline, held).await {
            Ok(held) => held.map_err(|e| ExecError::Refused(e.to_string()))?,
            Err(_) => {
                return Err(ExecError::Refused(
                    "envd did not start the process in time".to_owned(),
                ));
            }
        };
        Ok(Held {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
        })
    }
}

#[async_trait]
impl HeldInput for HeldStdin {
    async fn write(&mut self, bytes: Vec<u8>) -> Result<(), ExecError> {
        HeldStdin::write(self, &bytes)
            .await
            .map_err(|e| ExecError::Closed(e.to_string()))
    }

    async fn close(&mut self) {
        HeldStdin::close(self).await;
    }
}

#[async_trait]
impl HeldOutput for HeldStdout {
    async fn next(&mut self) -> Option<Vec<u8>> {
        HeldStdout::next(self).await
    }

    fn stderr(&self) -> &[u8] {
        HeldStdout::stderr(self)
    }
}

// === impl E2bSession ===

impl E2bSession {
    /// The identities the sweep spares: every live interpreter and relay.
    pub(super) fn interpreter_ids(&self) -> Vec<String> {
        cells::keep_ids(&self.interpreters)
    }

    /// Ends every interpreter; answers whether there was one. Their state is gone.
    pub(super) async fn end_interpreters(&mut self) -> bool {
        cells::end_all(&mut self.interpreters).await
    }

    /// Runs one cell.
    pub(super) async fn run_cell(&mut self, call: CellCall) -> Result<CellOutcome, SessionFault> {
        let language = cells::language(&call, &self.languages)?;
        let target = self.vm().map(|vm| target(&vm.envd, &self.root));
        // No warmed interpreters on e2b: nothing is ever unused.
        let mut unused = Vec::new();
        let ran = cells::run(
            &mut self.interpreters,
            &mut unused,
            || target,
            language,
            call,
        )
        .await;
        match ran {
            // A relay lost with its VM is the session's end.
            Err(SessionFault::Infrastructure(cause)) => Err(self.lost(cause).await),
            other => other,
        }
    }
}
