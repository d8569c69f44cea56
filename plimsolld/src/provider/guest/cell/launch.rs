//! Starting one language's interpreter and relay in a session's guest, and proving who they
//! are (providers.md §9.6: launcher, host verification, relay).
//!
//! The order is the proof: the launcher reports the interpreter's identity; its command line
//! must be exactly the one started; the relay (non-dumpable: by its own prctl, or the Node relay
//! by the runner guard) reports its own; then a check program out of every session process's reach ([`Checker`]) confirms from
//! `/proc` that the interpreter is live and the only process with its command line and that the
//! relay's parent PID is 0 (only a child of the provider's exec agent has that).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::time::Instant;

use super::frames::{self, Frame};
use super::identity::ProcessId;
use super::{CellError, CellLanguage, CellRelay, Checker, Interpreter, Layout, RelayParent};
use crate::provider::guest::{Command, GuestExec, Ran, guarded};

/// The launcher script.
pub const LAUNCH_SCRIPT: &str = include_str!("launch.sh");
/// The JavaScript kernel.
pub const KERNEL_JS: &str = include_str!("kernel.js");
/// The Python kernel.
pub const KERNEL_PY: &str = include_str!("kernel.py");
/// The Node relay program, for guests without [`RELAY_BINARY`].
pub const RELAY_JS: &str = include_str!("relay.js");
/// The relay binary in plimsoll's project image (the workspace's relay crate, built static).
pub const RELAY_BINARY: &str = "/usr/local/bin/plimsoll-relay";
/// The identity check, run as uid+1.
pub const CHECK_JS: &str = include_str!("check.js");
/// The ender, run as the guest by [`Interpreter::close`], after the identity check it shares
/// with docker's hold (which is why that check lives beside docker's session programs).
pub const END_JS: &str = concat!(include_str!("../same.js"), include_str!("end.js"));

/// The launcher's kernel directory variable.
pub const ENV_INTERP_DIR: &str = "PLIMSOLL_INTERP_DIR";
/// The launcher's work directory variable.
pub const ENV_WORK: &str = "PLIMSOLL_WORK";
/// The parent of every kernel directory.
const INTERP_ROOT: &str = "/tmp/.plimsoll-interp";

/// The whole launch: the launcher polls for 20 s, plus the provider's own time.
const LAUNCH_BUDGET: Duration = Duration::from_secs(40);
/// Output kept from a launcher, the checker or the ender (a report is under 100 KiB).
const REPORT_CAP: usize = 256 * 1024;
/// Relay stderr kept for the log.
const RELAY_STDERR_CAP: usize = 4096;
/// How long the ender may take.
const END_BUDGET: Duration = Duration::from_secs(10);

// === impl CellLanguage ===

impl CellLanguage {
    /// The language a wire name names, if any.
    pub fn from_name(name: &str) -> Option<CellLanguage> {
        match name {
            "javascript" => Some(CellLanguage::JavaScript),
            "python" => Some(CellLanguage::Python),
            _ => None,
        }
    }

    /// The language's name on the wire and in paths.
    pub fn name(self) -> &'static str {
        match self {
            CellLanguage::JavaScript => "javascript",
            CellLanguage::Python => "python",
        }
    }

    /// This language's kernel directory.
    pub fn dir(self) -> String {
        format!("{INTERP_ROOT}/{}", self.name())
    }

    /// The interpreter's argv, kernel directory last: what its command line must be.
    pub fn interpreter_argv(self) -> Vec<String> {
        let (program, flags, kernel) = match self {
            CellLanguage::JavaScript => ("node", ["--expose-internals", "-e"], KERNEL_JS),
            CellLanguage::Python => ("python3", ["-I", "-c"], KERNEL_PY),
        };
        let mut argv = vec![program.to_owned()];
        argv.extend(flags.iter().map(|f| (*f).to_owned()));
        argv.push(kernel.to_owned());
        argv.push(self.dir());
        argv
    }

    /// The relay's argv (after the guard's `exec`, for the Node relay), for cells in `work`:
    /// what its command line must be.
    pub fn relay_argv(self, relay: &CellRelay, work: &str) -> Vec<String> {
        let dir = self.dir();
        let argv: Vec<&str> = match relay {
            CellRelay::Binary(path) => vec![path, "cell", &dir, work],
            CellRelay::Node => vec!["node", "-e", RELAY_JS, &dir, work],
        };
        argv.into_iter().map(str::to_owned).collect()
    }
}

/// The launcher's argv: the launch script, then the provider's prefix (which execs what
/// follows with the runner guard preloaded), then the interpreter.
pub fn launcher_argv(language: CellLanguage, layout: &Layout) -> Vec<String> {
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        LAUNCH_SCRIPT.to_owned(),
        "sh".to_owned(),
    ];
    // The runner guard makes the interpreter non-dumpable before its first instruction, so
    // no other session process (a snippet, the other language's cells) can trace it or open
    // its memory, with or without Yama. The kernel takes the variable out of its own
    // environment, so the processes cells start are as before.
    argv.extend(layout.interpreter_prefix.iter().cloned());
    argv.extend(language.interpreter_argv());
    argv
}

/// The launcher's environment: its kernel directory and the work directory.
fn launcher_env(language: CellLanguage, layout: &Layout) -> Vec<String> {
    vec![
        format!("{ENV_INTERP_DIR}={}", language.dir()),
        format!("{ENV_WORK}={}", layout.work),
    ]
}

/// A short command, with no stdin, whose report is at most [`REPORT_CAP`].
fn short<'a>(
    argv: &'a [String],
    user: &'a str,
    env: &'a [String],
    deadline: Instant,
) -> Command<'a> {
    Command {
        argv,
        user,
        env,
        stdin: b"",
        stdout_cap: REPORT_CAP,
        stderr_cap: REPORT_CAP,
        deadline,
    }
}

/// The check's argv and user.
fn checker(layout: &Layout, interpreter: &ProcessId, relay: &ProcessId) -> (Vec<String>, String) {
    let parent = match layout.relay_parent {
        RelayParent::Outside => "outside",
        RelayParent::Root => "root",
    };
    let program = [
        "node".to_owned(),
        "-e".to_owned(),
        CHECK_JS.to_owned(),
        interpreter.to_string(),
        relay.to_string(),
        parent.to_owned(),
    ];
    match &layout.checker {
        Checker::User(user) => (program.to_vec(), user.clone()),
        Checker::GuardedGuest => (with_guard(layout, program), layout.user.clone()),
    }
}

/// `argv` under the layout's runner guard, if the guest has one.
fn with_guard(layout: &Layout, argv: impl IntoIterator<Item = String>) -> Vec<String> {
    match &layout.guard {
        Some(guard) => guarded(guard, argv),
        None => argv.into_iter().collect(),
    }
}

/// Why a launcher's run did not report.
fn launcher_failed(out: &Ran) -> String {
    match out.exit_code {
        _ if out.timed_out => "the launcher did not finish".to_owned(),
        Some(3) => "the interpreter exited before it was ready".to_owned(),
        Some(4) => "the interpreter was not ready within 20 s".to_owned(),
        Some(code) => format!("the launcher exited {code}"),
        None => "the launcher did not finish".to_owned(),
    }
}

/// Starts, proves and returns one interpreter with its relay.
pub async fn launch(
    exec: Arc<dyn GuestExec>,
    layout: Layout,
    language: CellLanguage,
) -> Result<Interpreter, CellError> {
    let deadline = Instant::now() + LAUNCH_BUDGET;
    let failed = |why: String| CellError::Launch {
        language: language.name(),
        reason: why,
    };

    let argv = launcher_argv(language, &layout);
    let env = launcher_env(language, &layout);
    let out = exec
        .run(short(&argv, &layout.user, &env, deadline))
        .await
        .map_err(|e| failed(e.to_string()))?;
    if out.timed_out || out.exit_code != Some(0) || out.stdout_truncated {
        return Err(failed(launcher_failed(&out)));
    }
    let report = String::from_utf8_lossy(&out.stdout);
    let interpreter =
        ProcessId::verify(report.trim_end_matches('\n'), &language.interpreter_argv())
            .map_err(|e| failed(e.to_string()))?;

    let relay_argv = language.relay_argv(&layout.relay, &layout.work);
    // The binary guards itself (a static binary ignores LD_PRELOAD); Node needs the guard.
    let relay_argv = match layout.relay {
        CellRelay::Binary(_) => relay_argv,
        CellRelay::Node => with_guard(&layout, relay_argv),
    };
    let relay_command = Command {
        stderr_cap: RELAY_STDERR_CAP,
        ..short(&relay_argv, &layout.user, &[], deadline)
    };
    let held = match exec.start(relay_command).await {
        Ok(held) => held,
        Err(e) => {
            end(exec.as_ref(), &layout, std::slice::from_ref(&interpreter)).await;
            return Err(failed(e.to_string()));
        }
    };
    let alive = Arc::new(AtomicBool::new(true));
    let (frames, reader) = frames::spawn_reader(held.stdout, Arc::clone(&alive));
    let mut pending = Interpreter {
        exec: Arc::clone(&exec),
        layout: layout.clone(),
        language,
        interpreter: interpreter.clone(),
        relay: None,
        stdin: tokio::sync::Mutex::new(held.stdin),
        frames,
        reader,
        alive,
    };
    let relay = match tokio::time::timeout_at(deadline, pending.frames.recv()).await {
        Ok(Some(Ok(Frame::Ready(text)))) => {
            ProcessId::verify(&text, &language.relay_argv(&layout.relay, &layout.work))
                .map_err(|e| failed(e.to_string()))
        }
        Ok(Some(Ok(other))) => Err(failed(format!("the relay began with {other:?}"))),
        Ok(Some(Err(e))) => Err(failed(e.to_string())),
        Ok(None) => Err(failed("the relay's reader stopped".to_owned())),
        Err(_) => Err(failed(
            "the relay did not report within the launch budget".to_owned(),
        )),
    };
    let relay = match relay {
        Ok(relay) => relay,
        Err(e) => {
            pending.end().await;
            return Err(e);
        }
    };
    pending.relay = Some(relay.clone());

    let (check, user) = checker(&layout, &interpreter, &relay);
    let verdict = exec.run(short(&check, &user, &[], deadline)).await;
    let why = match verdict {
        Ok(out) if out.exit_code == Some(0) && out.stdout == b"{\"ok\":true}\n" => None,
        Ok(out) if out.exit_code == Some(0) => Some(format!(
            "the identity check refused: {}",
            String::from_utf8_lossy(&out.stdout).trim()
        )),
        Ok(out) => Some(format!(
            "the identity check did not finish (exit {:?}, deadline passed: {})",
            out.exit_code, out.timed_out
        )),
        Err(e) => Some(e.to_string()),
    };
    if let Some(why) = why {
        pending.end().await;
        return Err(failed(why));
    }
    Ok(pending)
}

/// SIGKILLs each process in `ids` that is still the same process, as the guest.
pub async fn end(exec: &dyn GuestExec, layout: &Layout, ids: &[ProcessId]) {
    if ids.is_empty() {
        return;
    }
    let mut argv = vec!["node".to_owned(), "-e".to_owned(), END_JS.to_owned()];
    argv.extend(ids.iter().map(ToString::to_string));
    let deadline = Instant::now() + END_BUDGET;
    if let Err(e) = exec.run(short(&argv, &layout.user, &[], deadline)).await {
        tracing::debug!(error = %e, "could not end cell processes; the sweep will");
    }
}
