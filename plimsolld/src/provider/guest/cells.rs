//! A session's interpreters (wire.md §7.4, providers.md §9.6), the same on every provider: at
//! most one live [`Interpreter`] per language, launched on the language's first cell (or after
//! the last one ended), and the cell's answer or refusal on the wire. Where the interpreters
//! live, and what happens to them around project and granted calls, is the session's.

use std::sync::Arc;

use plimsoll::refusal::Refusal;
use tokio::time::Instant;

use super::GuestExec;
use super::cell::{CellError, CellLanguage, Interpreter, Layout};
use super::output::OUTPUT_CAP;
use crate::provider::{CellCall, CellOutcome, SessionFault};

/// Where a session's interpreters run: the provider's exec into its guest and its layout.
pub type Target = (Arc<dyn GuestExec>, Layout);

/// The cell's language, if the session offers it (`offered`: the languages Describe lists).
pub fn language(call: &CellCall, offered: &[String]) -> Result<CellLanguage, SessionFault> {
    let language = CellLanguage::from_name(&call.language).ok_or_else(|| {
        Refusal::InvalidRequest(format!(
            "cell.language {:?} is unknown: use javascript or python",
            call.language
        ))
    })?;
    if !offered.iter().any(|l| l == &call.language) {
        return Err(Refusal::Unsupported(format!(
            "the session image runs no {}; nothing ran",
            call.language
        ))
        .into());
    }
    Ok(language)
}

/// The identities the sweep keeps besides the baseline: every live interpreter and relay.
pub fn keep_ids(interpreters: &[Interpreter]) -> Vec<String> {
    interpreters
        .iter()
        .filter(|i| i.is_alive())
        .flat_map(Interpreter::keep_ids)
        .collect()
}

/// Ends interpreters that died or were dropped, so a fresh one can be proven unique.
pub async fn forget_dead(interpreters: &mut Vec<Interpreter>) {
    let (alive, dead): (Vec<Interpreter>, Vec<Interpreter>) = std::mem::take(interpreters)
        .into_iter()
        .partition(Interpreter::is_alive);
    *interpreters = alive;
    for interpreter in dead {
        interpreter.close().await;
    }
}

/// Ends every interpreter; answers whether there was one. Their state is gone.
pub async fn end_all(interpreters: &mut Vec<Interpreter>) -> bool {
    let all = std::mem::take(interpreters);
    let had = !all.is_empty();
    for interpreter in all {
        interpreter.close().await;
    }
    had
}

/// Runs one cell of `language` among `interpreters`, launching one through `target` when none
/// is live. `unused`: languages whose interpreter was warmed before any cell (a pool member's);
/// the first cell of each says `interpreter_started`.
pub async fn run(
    interpreters: &mut Vec<Interpreter>,
    unused: &mut Vec<CellLanguage>,
    target: impl FnOnce() -> Result<Target, SessionFault>,
    language: CellLanguage,
    call: CellCall,
) -> Result<CellOutcome, SessionFault> {
    let began = Instant::now();
    let deadline = began + call.timeout;
    forget_dead(interpreters).await;
    unused.retain(|l| interpreters.iter().any(|i| i.language() == *l));
    let mut started = false;
    let found = interpreters.iter().position(|i| i.language() == language);
    let index = match found {
        Some(index) => {
            if unused.contains(&language) {
                unused.retain(|l| *l != language);
                started = true;
            }
            index
        }
        None => {
            let (exec, layout) = target()?;
            let launch = Interpreter::launch(exec, layout, language);
            let fresh = match tokio::time::timeout_at(deadline, launch).await {
                Ok(Ok(fresh)) => fresh,
                Ok(Err(e)) => return Err(refusal(e)),
                Err(_) => {
                    return Err(refusal(CellError::Unsent {
                        language: language.name(),
                    }));
                }
            };
            started = true;
            interpreters.push(fresh);
            interpreters.len() - 1
        }
    };
    let outcome = interpreters[index]
        .run(&call.files, &call.code, OUTPUT_CAP, OUTPUT_CAP, deadline)
        .await
        .map_err(refusal)?;
    Ok(CellOutcome {
        stdout: outcome.stdout,
        stderr: outcome.stderr,
        exit_code: outcome.exit_code,
        timed_out: outcome.timed_out,
        stdout_truncated: outcome.stdout_truncated,
        stderr_truncated: outcome.stderr_truncated,
        interpreter_started: started || outcome.interpreter_started,
        interpreter_ended: outcome.interpreter_ended,
        duration: began.elapsed(),
    })
}

/// A cell error on the wire: only a lost interpreter may have run code.
pub fn refusal(e: CellError) -> SessionFault {
    match e {
        CellError::FileRefused { index, errno } => SessionFault::Refused(Refusal::InvalidRequest(
            format!("cell file {index} could not be written ({errno}); nothing ran"),
        )),
        CellError::Unsent { language } => SessionFault::Refused(Refusal::DeadlineBeforeDispatch(
            format!("the {language} cell's deadline passed before its code was sent; nothing ran"),
        )),
        CellError::Launch { language, reason } | CellError::Unreachable { language, reason } => {
            tracing::warn!(language, reason = %reason, "cell interpreter unavailable");
            SessionFault::Refused(Refusal::Environment(format!(
                "the {language} interpreter could not be started or reached; nothing ran"
            )))
        }
        lost @ CellError::Lost { .. } => SessionFault::infrastructure(lost),
    }
}
