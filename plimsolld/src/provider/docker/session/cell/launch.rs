//! Starting one language's interpreter and relay in a session container, and proving who they
//! are (providers.md §9.6: launcher, host verification, relay).
//!
//! The order is the proof: the launcher reports the interpreter's identity; its command line
//! must be exactly the one started; the relay (under the runner guard, non-dumpable) reports its
//! own; then a check program running as uid+1, an identity no session process has, confirms
//! from `/proc` that the interpreter is live and the only process with its command line and
//! that the relay's parent PID is 0 (only a `docker exec` child has that).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::time::Instant;

use super::frames::{self, Frame};
use super::identity::ProcessId;
use super::{CellError, CellLanguage, Guest, Interpreter};
use crate::provider::docker::engine::Engine;
use crate::provider::docker::exec::{self, ExecSpec};
use crate::provider::docker::lockdown::START_SCRIPT;
use crate::provider::docker::project::GUARD;

/// The launcher script.
pub const LAUNCH_SCRIPT: &str = include_str!("launch.sh");
/// The JavaScript kernel.
pub const KERNEL_JS: &str = include_str!("kernel.js");
/// The Python kernel.
pub const KERNEL_PY: &str = include_str!("kernel.py");
/// The relay program.
pub const RELAY_JS: &str = include_str!("relay.js");
/// The identity check, run as uid+1.
pub const CHECK_JS: &str = include_str!("check.js");
/// The ender, run as the guest uid by [`Interpreter::close`], after the identity check it
/// shares with the hold.
pub const END_JS: &str = concat!(include_str!("../same.js"), include_str!("end.js"));

/// The launcher's kernel directory variable.
pub const ENV_INTERP_DIR: &str = "PLIMSOLL_INTERP_DIR";
/// The launcher's work directory variable.
pub const ENV_WORK: &str = "PLIMSOLL_WORK";
/// Where cells run and files land.
pub const WORK: &str = "/work";
/// The parent of every kernel directory.
const INTERP_ROOT: &str = "/tmp/.plimsoll-interp";

/// The whole launch: the launcher polls for 20 s, plus docker's own time.
const LAUNCH_BUDGET: Duration = Duration::from_secs(40);
/// Output kept from a launcher, the checker or the ender (a report is under 100 KiB).
const REPORT_CAP: usize = 256 * 1024;
/// Relay stderr kept for the log.
const RELAY_STDERR_CAP: usize = 4096;

// === impl CellLanguage ===

impl CellLanguage {
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

    /// The relay's argv after the guard's `exec`: what its command line must be.
    pub fn relay_argv(self) -> Vec<String> {
        ["node", "-e", RELAY_JS, &self.dir(), WORK]
            .iter()
            .map(|a| (*a).to_owned())
            .collect()
    }
}

/// The launcher exec's argv: the launch script, then the start-script prefix (which hands the
/// interpreter the image environment and execs it), then the interpreter.
pub fn launcher_argv(language: CellLanguage, guest: &Guest) -> Vec<String> {
    let marker = format!(
        "plimsoll-started:{}",
        hex::encode(rand::random::<[u8; 8]>())
    );
    let mut command = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        LAUNCH_SCRIPT.to_owned(),
        "sh".to_owned(),
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        START_SCRIPT.to_owned(),
        "sh".to_owned(),
        marker,
    ];
    command.extend(guest.image_env.iter().cloned());
    // The runner guard makes the interpreter non-dumpable before its first instruction, so
    // no other session process (a snippet, the other language's cells) can trace it or open
    // its memory, with or without Yama. The kernel takes the variable out of its own
    // environment, so the processes cells start are as before.
    command.push(format!("LD_PRELOAD={GUARD}"));
    command.extend(language.interpreter_argv());
    let env = [
        format!("{ENV_INTERP_DIR}={}", language.dir()),
        format!("{ENV_WORK}={WORK}"),
    ];
    exec::env_argv(&env, &command)
}

/// The relay exec's argv: the runner guard preloaded, then the relay.
pub fn relay_exec_argv(language: CellLanguage) -> Vec<String> {
    let mut command = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        format!("export LD_PRELOAD={GUARD}; exec \"$@\""),
        "sh".to_owned(),
    ];
    command.extend(language.relay_argv());
    exec::env_argv(&[], &command)
}

fn spec<'a>(argv: &'a [String], user: &'a str, deadline: Instant) -> ExecSpec<'a> {
    ExecSpec {
        argv,
        user,
        workdir: Some(WORK),
        stdin: b"",
        stdout_cap: REPORT_CAP,
        stderr_cap: REPORT_CAP,
        deadline,
    }
}

/// Starts, proves and returns one interpreter with its relay.
pub async fn launch(
    engine: &Engine,
    container: &str,
    language: CellLanguage,
    guest: &Guest,
) -> Result<Interpreter, CellError> {
    let deadline = Instant::now() + LAUNCH_BUDGET;
    let failed = |why: String| CellError::Launch {
        language: language.name(),
        reason: why,
    };
    let user = guest.user();

    let argv = launcher_argv(language, guest);
    let out = exec::run(engine, container, &spec(&argv, &user, deadline))
        .await
        .map_err(|e| failed(e.to_string()))?;
    if out.timed_out || out.exit_code != Some(0) {
        let why = match out.exit_code {
            Some(3) => "the interpreter exited before it was ready".to_owned(),
            Some(4) => "the interpreter was not ready within 20 s".to_owned(),
            Some(code) => format!("the launcher exited {code}"),
            None => "the launcher did not finish".to_owned(),
        };
        return Err(failed(why));
    }
    let report = String::from_utf8_lossy(&out.stdout);
    let interpreter =
        ProcessId::verify(report.trim_end_matches('\n'), &language.interpreter_argv())
            .map_err(|e| failed(e.to_string()))?;

    let argv = relay_exec_argv(language);
    let attached = exec::attach(
        engine,
        container,
        &argv,
        &user,
        Some(WORK),
        RELAY_STDERR_CAP,
    )
    .await
    .map_err(|e| failed(e.to_string()))?;
    let alive = Arc::new(AtomicBool::new(true));
    let (frames, reader) = frames::spawn_reader(attached.stdout, Arc::clone(&alive));
    let mut pending = Interpreter {
        engine: engine.clone(),
        container: container.to_owned(),
        language,
        guest: guest.clone(),
        interpreter: interpreter.clone(),
        relay: None,
        stdin: tokio::sync::Mutex::new(attached.stdin),
        frames,
        reader,
        alive,
    };
    let relay = match tokio::time::timeout_at(deadline, pending.frames.recv()).await {
        Ok(Some(Ok(Frame::Ready(text)))) => {
            ProcessId::verify(&text, &language.relay_argv()).map_err(|e| failed(e.to_string()))
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

    let check = exec::env_argv(
        &[],
        &[
            "node".to_owned(),
            "-e".to_owned(),
            CHECK_JS.to_owned(),
            interpreter.to_string(),
            relay.to_string(),
        ],
    );
    let checker = guest.checker_user();
    let verdict = exec::run(engine, container, &spec(&check, &checker, deadline)).await;
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

/// SIGKILLs each process in `ids` that is still the same process, as the guest uid.
pub async fn end(engine: &Engine, container: &str, user: &str, ids: &[ProcessId]) {
    if ids.is_empty() {
        return;
    }
    let mut command = vec!["node".to_owned(), "-e".to_owned(), END_JS.to_owned()];
    command.extend(ids.iter().map(ToString::to_string));
    let argv = exec::env_argv(&[], &command);
    let deadline = Instant::now() + Duration::from_secs(10);
    if let Err(e) = exec::run(engine, container, &spec(&argv, user, deadline)).await {
        tracing::debug!(container, error = %e, "could not end cell processes; the sweep will");
    }
}
