//! The startup session proof (providers.md §9.9): with sessions on, the daemon opens one
//! session through exactly the provider's session path, runs a snippet in it, proves the
//! call boundary and removes it, before it serves. A daemon whose sessions cannot work
//! refuses to start rather than failing every open later.

use std::time::Duration;

use crate::config::session::SessionConfig;
use crate::provider::{Provider, SessionOpen};

/// The proof's bound.
pub const PROOF_BUDGET: Duration = Duration::from_secs(120);
/// The proof session's lifetime (its expiry label, should the daemon die mid-proof).
const PROOF_LIFETIME: Duration = Duration::from_secs(180);
/// What the proof snippet prints.
const PROOF_OUTPUT: &[u8] = b"plimsoll-session-ok\n";

/// Opens, uses, sweeps and removes one session; `Err` names the failing step.
pub async fn prove(provider: &dyn Provider, config: &SessionConfig) -> Result<(), String> {
    let bounded = tokio::time::timeout(PROOF_BUDGET, prove_once(provider, config));
    bounded
        .await
        .map_err(|_| format!("the session proof did not finish within {PROOF_BUDGET:?}"))?
}

async fn prove_once(provider: &dyn Provider, config: &SessionConfig) -> Result<(), String> {
    let opened = provider
        .open_session(SessionOpen {
            lifetime: PROOF_LIFETIME,
            languages: Vec::new(),
            disk_mb: config.disk_mb,
            host_socket: None,
            guard_token: None,
            paid: None,
        })
        .await
        .map_err(|e| format!("session proof: open: {e}"))?;
    let mut sandbox = opened.sandbox;
    let used = async {
        sandbox
            .prepare()
            .await
            .map_err(|e| format!("session proof: read-back: {e}"))?;
        let out = sandbox
            .snippet(
                "console.log('plimsoll-session-ok')".to_owned(),
                Duration::from_secs(20),
                None,
            )
            .await
            .map_err(|e| format!("session proof: snippet: {e}"))?;
        if out.exit_code != 0 || out.stdout != PROOF_OUTPUT {
            return Err(format!(
                "session proof: the snippet answered exit {} with stdout {:?}",
                out.exit_code,
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        sandbox
            .sweep()
            .await
            .map_err(|e| format!("session proof: sweep: {e}"))
    }
    .await;
    sandbox.finish().await;
    used
}
