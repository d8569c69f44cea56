//! Cells in a docker session (wire.md §7.4, providers.md §9.6): the session keeps at most one
//! live [`Interpreter`] per language, launches one on the language's first cell (or after the
//! last one ended), adds its identities to the sweep's keep set, and ends every interpreter
//! before a project call (cell state is lost there, by design: a same-uid interpreter could
//! otherwise read the runner's stdin).

use plimsoll::refusal::Refusal;
use tokio::time::Instant;

use super::super::settings::OUTPUT_CAP;
use super::DockerSession;
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

    /// Ends every interpreter (before a project call): their state is gone afterwards.
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
