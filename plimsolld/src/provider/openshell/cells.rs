//! Cells in an openshell session (wire.md §7.4, providers.md §9.6), as on docker (the shared
//! [`cells`]): at most one live interpreter per language, launched on the language's first
//! cell (or after the last one ended), kept by the sweep between calls, and ended before a
//! project call and before a granted call (the relay's socket is the grant; a kept interpreter
//! must not reach it). A suspend (`StopSandbox`) ends every process, so the next cell after a
//! resume starts a fresh interpreter and says so.

use super::cell;
use super::session::OpenShellSession;
use crate::provider::guest::cells;
use crate::provider::{CellCall, CellOutcome, SessionFault};

impl OpenShellSession {
    /// The identities the sweep keeps besides the baseline: every live interpreter and relay.
    pub(super) fn interpreter_ids(&self) -> Vec<String> {
        cells::keep_ids(&self.interpreters)
    }

    /// Ends every interpreter; answers whether there was one. Their state is gone.
    pub(super) async fn end_interpreters(&mut self) -> bool {
        cells::end_all(&mut self.interpreters).await
    }

    /// Forgets every interpreter without ending it: the sandbox's processes are gone (a stop).
    pub(super) fn drop_interpreters(&mut self) {
        self.interpreters.clear();
    }

    /// Runs one cell.
    pub(super) async fn run_cell(&mut self, call: CellCall) -> Result<CellOutcome, SessionFault> {
        let language = cells::language(&call, self.languages())?;
        let target = self
            .target()
            .map(|(gateway, sandbox)| cell::target(gateway, sandbox));
        // No warmed interpreters on openshell: nothing is ever unused.
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
            // A relay lost with its sandbox is the session's end.
            Err(SessionFault::Infrastructure(cause)) => Err(self.lost(cause).await),
            other => other,
        }
    }
}
