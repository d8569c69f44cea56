//! Force-removing a container (providers.md §5.8).
//!
//! Up to three attempts, 1 s then 2 s apart. Each attempt is a forced remove; whether it
//! worked is judged only by listing the exact name afterwards, never by the remove call's
//! answer (docker answers success for a container that is already gone, and its error texts
//! change between versions). When every attempt fails, the error is logged and the expiry label
//! leaves the container to the orphan sweep.

use std::time::Duration;

use super::DockerError;
use super::engine::Engine;

/// The pauses between attempts.
const BACKOFF: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(2)];

/// Removes `name` and confirms it is gone. `Ok` means an exact-name listing came back empty.
pub async fn force_remove(engine: &Engine, name: &str) -> Result<(), DockerError> {
    let mut last = None;
    for attempt in 0..=BACKOFF.len() {
        if attempt > 0 {
            tokio::time::sleep(BACKOFF[attempt - 1]).await;
        }
        // The answer is not evidence either way; the listing is.
        if let Err(e) = engine.force_remove(name).await {
            tracing::debug!(container = name, error = %e, "remove call failed; checking the listing");
        }
        match engine.list_named(name).await {
            Ok(found) if found.is_empty() => return Ok(()),
            Ok(_) => last = Some(DockerError::StillPresent(name.to_owned())),
            Err(e) => last = Some(e),
        }
    }
    let error = last.unwrap_or_else(|| DockerError::StillPresent(name.to_owned()));
    tracing::error!(
        container = name,
        error = %error,
        "could not remove a container after 3 attempts; the orphan sweep will retry after its expiry"
    );
    Err(error)
}
