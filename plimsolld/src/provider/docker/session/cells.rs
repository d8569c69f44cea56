//! Cells in a docker session (wire.md §7.4, providers.md §9.6): the session keeps at most one
//! live [`Interpreter`] per language, launches one on the language's first cell (or after the
//! last one ended), adds its identities to the sweep's keep set, and has the agent hold every
//! interpreter stopped through a project call, so cell state survives it
//! ([`DockerSession::project_hold`]).

use super::DockerSession;
use super::agent::{Agent, container_stopped};
use super::boundary;
use super::cell::{self, CellError, CellLanguage, Guest, Interpreter};
use crate::provider::guest::cells;
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
        cells::keep_ids(self.interpreters())
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
        cells::forget_dead(self.interpreters()).await;
        let live: Vec<CellLanguage> = self
            .interpreters()
            .iter()
            .map(Interpreter::language)
            .collect();
        self.unused.retain(|l| live.contains(l));
    }

    /// The interpreters a project call holds stopped (the agent holds them around the call in
    /// the project request itself): every live one, or none when a granted call's hold already
    /// covers them.
    ///
    /// Why: nothing of an earlier call runs beside the call's steps, nor beside the probe the
    /// agent makes again should its state have changed (its verdict must be the kernel's, not
    /// a guest process's). A step may wake one (same uid), but only after the agent proved
    /// the call could start; a woken interpreter can do no more than that step.
    pub(super) async fn project_hold(&mut self) -> Vec<String> {
        self.forget_dead_interpreters().await;
        if !self.held.is_empty() {
            return Vec::new();
        }
        self.interpreter_process_ids()
    }

    /// The hold of [`Self::project_hold`] could not be proven and nothing ran: the
    /// interpreters end and the container is proven quiet, as before. The next cell then
    /// reports `interpreter_started`.
    pub(super) async fn project_hold_failed(&mut self) -> Result<(), SessionFault> {
        tracing::warn!("interpreters could not be held for a project call; ending them");
        let user = self.settings.user();
        self.end_interpreters().await;
        boundary::quiesce(&self.engine, &self.id, &user, &self.keep).await
    }

    /// Ends every interpreter: their state is gone afterwards.
    pub(super) async fn end_interpreters(&mut self) -> bool {
        self.unused.clear();
        cells::end_all(self.interpreters()).await
    }

    /// Starts and proves an interpreter for each of `languages` before any guest code (a
    /// pool member's warm set, providers.md §9.8). Unknown names are skipped.
    pub(super) async fn warm(&mut self, languages: &[String]) -> Result<(), CellError> {
        for name in languages {
            let Some(language) = CellLanguage::from_name(name) else {
                continue;
            };
            let (exec, layout) = cell::target(&self.engine, &self.id, &self.guest());
            let fresh = Interpreter::launch(exec, layout, language).await?;
            self.interpreters().push(fresh);
            self.unused.push(language);
        }
        Ok(())
    }

    /// Whether every warmed interpreter's relay is still attached.
    pub(super) fn warm_alive(&mut self) -> bool {
        self.interpreters().iter().all(Interpreter::is_alive)
    }

    /// Runs one cell. A container that stops under it (a host failure, an outside kill) ends
    /// the session then, named by the container's state: docker does not always end the
    /// relay's stream when a gVisor container dies, so the agent's watch is read beside it.
    pub(super) async fn run_cell(&mut self, call: CellCall) -> Result<CellOutcome, SessionFault> {
        let language = cells::language(&call, &self.languages)?;
        let target = cell::target(&self.engine, &self.id, &self.guest());
        let stop = self
            .agent
            .get_mut()
            .ok()
            .and_then(|a| a.as_ref().map(Agent::stop_signal));
        let Some(mut stopped) = stop else {
            return Err(self.agent_lost("the session's agent is gone").await);
        };
        let interpreters = self
            .interpreters
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let ran = tokio::select! {
            // An answer already read counts even if the container then stopped.
            biased;
            ran = cells::run(interpreters, &mut self.unused, || Ok(target), language, call) => ran,
            () = container_stopped(&mut stopped) => Err(SessionFault::infrastructure(
                "the session's container stopped during a cell",
            )),
        };
        match ran {
            Err(SessionFault::Infrastructure(cause)) => match self.container_end().await {
                Some(reason) => {
                    tracing::warn!(error = %cause, "a session's container stopped during a cell");
                    self.agent.get_mut().ok().map(Option::take);
                    Err(SessionFault::ended(
                        reason,
                        "the session's container stopped during the cell",
                    ))
                }
                None => Err(SessionFault::Infrastructure(cause)),
            },
            other => other,
        }
    }
}
