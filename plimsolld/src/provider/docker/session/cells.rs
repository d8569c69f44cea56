//! Cells in a docker session (wire.md §7.4, providers.md §9.6): the session keeps at most one
//! live [`Interpreter`] per language, launches one on the language's first cell (or after the
//! last one ended), adds its identities to the sweep's keep set, and holds every interpreter
//! stopped through a project call, so cell state survives it ([`DockerSession::hold_for_project`]).

use plimsoll::refusal::Refusal;
use tokio::time::Instant;

use super::super::settings::OUTPUT_CAP;
use super::DockerSession;
use super::boundary;
use super::cell::{CellError, CellLanguage, Guest, Interpreter};
use crate::provider::{CellCall, CellOutcome, SessionFault};

impl DockerSession {
    /// The guest the interpreters run as.
    fn guest(&self) -> Guest {
        Guest {
            uid: self.settings.guest_uid,
            image_env: self.image.env.clone(),
        }
    }

    /// The interpreters, without locking: `&mut self` proves nobody else holds them.
    fn interpreters(&mut self) -> &mut Vec<Interpreter> {
        self.interpreters
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The identities the sweep keeps besides the baseline: every live interpreter and relay.
    pub(super) fn interpreter_ids(&mut self) -> Vec<String> {
        self.interpreters()
            .iter()
            .filter(|i| i.is_alive())
            .flat_map(Interpreter::keep_ids)
            .collect()
    }

    /// The identities of every live interpreter (without the relays, which are plimsoll's).
    pub(super) fn interpreter_process_ids(&mut self) -> Vec<String> {
        self.interpreters()
            .iter()
            .filter(|i| i.is_alive())
            .map(Interpreter::interpreter_id)
            .collect()
    }

    /// Ends interpreters that died or were dropped, so a fresh one can be proven unique.
    pub(super) async fn forget_dead_interpreters(&mut self) {
        let (alive, dead): (Vec<Interpreter>, Vec<Interpreter>) =
            std::mem::take(self.interpreters())
                .into_iter()
                .partition(Interpreter::is_alive);
        *self.interpreters() = alive;
        let live: Vec<CellLanguage> = self
            .interpreters()
            .iter()
            .map(Interpreter::language)
            .collect();
        self.unused.retain(|l| live.contains(l));
        for interpreter in dead {
            interpreter.close().await;
        }
    }

    /// Holds the live interpreters stopped for a project call; answers the identities held
    /// (empty when there is nothing to hold, or a granted call's hold already covers them).
    ///
    /// Why: the runner is exec'd as the guest uid, the interpreters' uid, and only its guard
    /// (non-dumpable before node runs) keeps a same-uid process from opening its stdin, which
    /// carries the report key. Stopped from before the exec, no interpreter can race the
    /// guard. A step may wake one (same uid), but steps start only after the runner read its
    /// whole plan, so a woken interpreter can do no more than that step. When the hold cannot
    /// be proven the interpreters end and the container is proven quiet, as before: the next
    /// cell then reports `interpreter_started`.
    pub(super) async fn hold_for_project(&mut self) -> Result<Vec<String>, SessionFault> {
        self.forget_dead_interpreters().await;
        if !self.held.is_empty() {
            return Ok(Vec::new());
        }
        let ids = self.interpreter_process_ids();
        if ids.is_empty() {
            return Ok(ids);
        }
        let user = self.settings.user();
        match self.agent_hold(true, &ids).await {
            Ok(_) => Ok(ids),
            Err(e) => {
                tracing::warn!(error = %e, "interpreters could not be held for a project call; ending them");
                self.end_interpreters().await;
                boundary::quiesce(&self.engine, &self.id, &user, &self.keep).await?;
                Ok(Vec::new())
            }
        }
    }

    /// Resumes what [`Self::hold_for_project`] held. One a step already woke is no matter
    /// (see there); one that cannot be resumed would hang the next cell, so all then end.
    pub(super) async fn release_after_project(&mut self, ids: &[String]) {
        match self.agent_hold(false, ids).await {
            Ok(true) => {}
            Ok(false) => tracing::debug!("a held interpreter was woken during the project call"),
            Err(e) => {
                tracing::warn!(error = %e, "interpreters held for a project call could not be resumed; ending them");
                self.end_interpreters().await;
            }
        }
    }

    /// Ends every interpreter: their state is gone afterwards.
    pub(super) async fn end_interpreters(&mut self) -> bool {
        let all = std::mem::take(self.interpreters());
        self.unused.clear();
        let had = !all.is_empty();
        for interpreter in all {
            interpreter.close().await;
        }
        had
    }

    /// Starts and proves an interpreter for each of `languages` before any guest code (a
    /// pool member's warm set, providers.md §9.8). Unknown names are skipped.
    pub(super) async fn warm(&mut self, languages: &[String]) -> Result<(), CellError> {
        for name in languages {
            let language = match name.as_str() {
                "javascript" => CellLanguage::JavaScript,
                "python" => CellLanguage::Python,
                _ => continue,
            };
            let guest = self.guest();
            let fresh = Interpreter::launch(&self.engine, &self.id, language, &guest).await?;
            self.interpreters().push(fresh);
            self.unused.push(language);
        }
        Ok(())
    }

    /// Whether every warmed interpreter's relay is still attached.
    pub(super) fn warm_alive(&mut self) -> bool {
        self.interpreters().iter().all(Interpreter::is_alive)
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
        if !self.languages.iter().any(|l| l == &call.language) {
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
            .interpreters()
            .iter()
            .position(|i| i.language() == language);
        let index = match found {
            // A pool member's warm interpreter: fresh for its first cell.
            Some(index) if self.unused.contains(&language) => {
                self.unused.retain(|l| *l != language);
                started = true;
                index
            }
            Some(index) => index,
            None => {
                let guest = self.guest();
                let launch = Interpreter::launch(&self.engine, &self.id, language, &guest);
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
                self.interpreters().push(fresh);
                self.interpreters().len() - 1
            }
        };
        let interpreter = &mut self.interpreters()[index];
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
            tracing::warn!(language, reason = %reason, "cell interpreter unavailable");
            SessionFault::Refused(Refusal::Environment(format!(
                "the {language} interpreter could not be started or reached; nothing ran"
            )))
        }
        lost @ CellError::Lost { .. } => SessionFault::infrastructure(lost),
    }
}
