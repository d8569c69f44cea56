//! The call boundary of a session (providers.md §9.1 baseline, §9.4 sweep, §9.5 disk budget).
//!
//! At open, the lister proves the container holds exactly docker-init and its `sleep`, and
//! their identities (`pid:starttime:cmdlinehex`) become the keep set (the agent's joins it).
//! After each call, the session's agent sweeps in-container ([`agent_sweep`]): it kills
//! everything else and measures the disk; anything but a clean answer ends the session. The
//! sweep program run by `docker exec` still quiesces a session whose interpreters could not be
//! held.
//!
//! The guest-side programs (lister, sweep) and the baseline rule live in
//! [`crate::provider::guest::boundary`], shared with sessions on openshell.

use std::time::Duration;

use plimsoll::wire::SessionEnd;
use tokio::time::Instant;

use super::super::engine::Engine;
use super::super::exec::{self, ExecSpec};
use super::agent::Agent;
use super::container::end_for;
use crate::provider::SessionFault;
use crate::provider::guest::boundary::{
    LISTER, Listed, MAX_ENTRIES, SWEEP, check_baseline, guarded_node,
};
use plimsoll::refusal::Refusal;

/// The sweep's and the lister's budget.
const BUDGET: Duration = Duration::from_secs(20);
/// What the sweep may print (nothing of it is trusted).
const SWEEP_OUTPUT_CAP: usize = 4096;
/// What the lister may print.
const LISTER_OUTPUT_CAP: usize = 64 * 1024;
/// The mounts the disk budget covers.
const MOUNTS: &str = "/tmp,/work,/dev/shm";

/// The baseline: exactly PID 1 and one child of PID 1 whose command line is `sleep
/// 2147483647`; answers their identities.
pub(in crate::provider::docker) async fn baseline(
    engine: &Engine,
    container: &str,
    user: &str,
) -> Result<Vec<String>, String> {
    let command = ["node".to_owned(), "-e".to_owned(), LISTER.to_owned()];
    let out = run_bounded(engine, container, user, &command, LISTER_OUTPUT_CAP)
        .await
        .map_err(|e| e.to_string())?;
    if out.exit_code != Some(0) || out.stdout_truncated {
        return Err(format!(
            "the process lister ended with {:?} (timed out: {})",
            out.exit_code, out.timed_out
        ));
    }
    let listed: Vec<Listed> = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("the process lister's answer does not parse: {e}"))?;
    check_baseline(&listed)
}

/// The sweep after a call, run by the session's agent in-container; `Ok` only on a clean
/// result. An agent that does not answer (its stream ended, a frame that does not parse, late)
/// ends the session as an unproven boundary does.
pub(super) async fn agent_sweep(
    engine: &Engine,
    container: &str,
    agent: &mut Agent,
    disk_mb: u32,
    keep: &[String],
) -> Result<(), SessionFault> {
    let disk_bytes = u64::from(disk_mb) * 1024 * 1024;
    let mounts: Vec<&str> = MOUNTS.split(',').collect();
    let exit = match agent
        .sweep(disk_bytes, &mounts, keep, Instant::now() + BUDGET)
        .await
    {
        Ok(code) => Some(i64::from(code)),
        Err(e) => {
            tracing::warn!(error = %e, "session agent did not sweep");
            None
        }
    };
    judge_exit(engine, container, exit).await
}

/// The sweep before a project call (providers.md §9.3), or before a granted call under gVisor:
/// a dirty result ends the session as [`sweep`] does, but a sweep docker could not even start
/// refuses the call and keeps the session — nothing ran, and the next call's read-back and
/// sweep decide again.
pub(in crate::provider::docker) async fn quiesce(
    engine: &Engine,
    container: &str,
    user: &str,
    keep: &[String],
) -> Result<(), SessionFault> {
    match launch(engine, container, user, 0, keep).await {
        Err(e) => {
            tracing::warn!(error = %e, "session quiesce could not run");
            Err(SessionFault::Refused(Refusal::Environment(
                "the session could not be quiesced before the call; nothing ran".into(),
            )))
        }
        ran => judge(engine, container, ran.map_err(|e| e.to_string())).await,
    }
}

/// Starts the sweep program and waits for it (bounded by [`BUDGET`]).
async fn launch(
    engine: &Engine,
    container: &str,
    user: &str,
    disk_mb: u32,
    keep: &[String],
) -> Result<exec::ExecOutcome, exec::ExecError> {
    let disk_bytes = u64::from(disk_mb) * 1024 * 1024;
    let args = [
        disk_bytes.to_string(),
        MAX_ENTRIES.to_owned(),
        "statfs".to_owned(),
        MOUNTS.to_owned(),
    ];
    let command = guarded_node(SWEEP, args.iter().chain(keep));
    run_bounded(engine, container, user, &command, SWEEP_OUTPUT_CAP).await
}

/// Runs one of the boundary's programs under an empty environment, within [`BUDGET`].
async fn run_bounded(
    engine: &Engine,
    container: &str,
    user: &str,
    command: &[String],
    stdout_cap: usize,
) -> Result<exec::ExecOutcome, exec::ExecError> {
    let argv = exec::env_argv(&[], command);
    exec::run(
        engine,
        container,
        &ExecSpec {
            argv: &argv,
            user,
            workdir: None,
            stdin: &[],
            stdout_cap,
            stderr_cap: SWEEP_OUTPUT_CAP,
            deadline: Instant::now() + BUDGET,
        },
    )
    .await
}

/// What a sweep's exit means for the session (providers.md §9.4's table).
async fn judge(
    engine: &Engine,
    container: &str,
    ran: Result<exec::ExecOutcome, String>,
) -> Result<(), SessionFault> {
    let exit = match &ran {
        Ok(out) => out.exit_code,
        Err(e) => {
            tracing::warn!(error = %e, "session sweep could not run");
            None
        }
    };
    judge_exit(engine, container, exit).await
}

/// What a sweep's exit code (`None`: it did not finish) means for the session.
async fn judge_exit(
    engine: &Engine,
    container: &str,
    exit: Option<i64>,
) -> Result<(), SessionFault> {
    match exit {
        Some(0) => Ok(()),
        Some(10) | Some(11) => Err(SessionFault::ended(
            SessionEnd::SESSION_END_DISK_EXCEEDED,
            "the session's files went over its disk budget",
        )),
        other => {
            tracing::warn!(exit = ?other, "session sweep did not prove the call boundary");
            let reason = end_for(engine, container, SessionEnd::SESSION_END_BOUNDARY_FAILED).await;
            Err(SessionFault::ended(
                reason,
                "the between-calls cleanup could not be proven",
            ))
        }
    }
}
