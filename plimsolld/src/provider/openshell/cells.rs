//! Cells in an openshell session (wire.md §7.4, providers.md §9.6), as on docker: at most one
//! live [`Interpreter`] per language, launched on the language's first cell (or after the
//! last one ended), kept by the sweep between calls, and ended before a project call and
//! before a granted call (the relay's socket is the grant; a kept interpreter must not reach
//! it). A suspend (`StopSandbox`) ends every process, so the next cell after a resume starts
//! a fresh interpreter and says so.

use plimsoll::refusal::Refusal;
use tokio::time::Instant;

use super::cell::Interpreter;
use super::session::OpenShellSession;
use crate::provider::docker::session_cell::{CellError, CellLanguage};
use crate::provider::docker::settings::OUTPUT_CAP;
use crate::provider::{CellCall, CellOutcome, SessionFault};

impl OpenShellSession {
    /// The identities the sweep keeps besides the baseline: every live interpreter and relay.
    pub(super) fn interpreter_ids(&self) -> Vec<String> {
        self.interpreters
            .iter()
            .filter(|i| i.is_alive())
            .flat_map(Interpreter::keep_ids)
            .collect()
    }

    /// Ends interpreters that died or were dropped, so a fresh one can be proven unique.
    async fn forget_dead_interpreters(&mut self) {
        let (alive, dead): (Vec<Interpreter>, Vec<Interpreter>) =
            std::mem::take(&mut self.interpreters)
                .into_iter()
                .partition(Interpreter::is_alive);
        self.interpreters = alive;
        for interpreter in dead {
            interpreter.close().await;
        }
    }

    /// Ends every interpreter; answers whether there was one. Their state is gone.
    pub(super) async fn end_interpreters(&mut self) -> bool {
        let all = std::mem::take(&mut self.interpreters);
        let had = !all.is_empty();
        for interpreter in all {
            interpreter.close().await;
        }
        had
    }

    /// Forgets every interpreter without ending it: the sandbox's processes are gone (a stop).
    pub(super) fn drop_interpreters(&mut self) {
        self.interpreters.clear();
    }

    /// Runs one cell.
    pub(super) async fn run_cell(&mut self, call: CellCall) -> Result<CellOutcome, SessionFault> {
        let language = match call.language.as_str() {
            "javascript" => CellLanguage::JavaScript,
            "python" => CellLanguage::Python,
            other => {
                return Err(Refusal::InvalidRequest(format!(
                    "cell.language {other:?} is unknown: use javascript or python"
                ))
                .into());
            }
        };
        if !self.languages().iter().any(|l| l == &call.language) {
            return Err(Refusal::Unsupported(format!(
                "the session image runs no {}; nothing ran",
                call.language
            ))
            .into());
        }
        let began = Instant::now();
        let deadline = began + call.timeout;
        self.forget_dead_interpreters().await;
        let mut started = false;
        let found = self
            .interpreters
            .iter()
            .position(|i| i.language() == language);
        let index = match found {
            Some(index) => index,
            None => {
                let (gateway, sandbox) = self.target()?;
                let launch = Interpreter::launch(&gateway, &sandbox, language);
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
                self.interpreters.push(fresh);
                self.interpreters.len() - 1
            }
        };
        let interpreter = &mut self.interpreters[index];
        let outcome = interpreter
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
}

/// A cell error on the wire: only a lost interpreter may have run code.
fn refusal(e: CellError) -> SessionFault {
    match e {
        CellError::FileRefused { index, errno } => SessionFault::Refused(Refusal::InvalidRequest(
            format!("cell file {index} could not be written ({errno}); nothing ran"),
        )),
        CellError::Unsent { language } => SessionFault::Refused(Refusal::DeadlineBeforeDispatch(
            format!("the {language} cell's deadline passed before its code was sent; nothing ran"),
        )),
        CellError::Launch { language, reason } | CellError::Unreachable { language, reason } => {
            tracing::warn!(language, reason = %reason, "openshell cell interpreter unavailable");
            SessionFault::Refused(Refusal::Environment(format!(
                "the {language} interpreter could not be started or reached; nothing ran"
            )))
        }
        lost @ CellError::Lost { .. } => SessionFault::infrastructure(lost),
    }
}
