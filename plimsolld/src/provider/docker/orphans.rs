//! Orphan reconciliation (providers.md §5.13): what a crash, a lost removal or another
//! daemon's crash left behind.
//!
//! 1. Host directories: the smoke test's socket directories (`crsbx-smoke-sock-…`) older than
//!    a minute whose socket refuses connections (what a killed daemon left). The broker's own
//!    directories are reaped by the daemon's background loop for every provider
//!    (`crate::grant::reap_stale_socket_dirs`).
//! 2. Containers labelled `io.plimsoll.expires`: this instance's that it no longer holds, at
//!    once; other instances' when at least 5 minutes past their label. A container this
//!    process holds (a run in flight, a removal under way) is never touched.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::container::{Held, unix_now};
use super::engine::Engine;
use super::lockdown::{LABEL_EXPIRES, LABEL_INSTANCE};
use super::removal;
use super::smoke::SOCKET_DIR_PREFIX;

/// How long past its label another instance's container is left alone (its daemon may still
/// be removing it).
pub const OTHER_INSTANCE_GRACE: Duration = Duration::from_secs(5 * 60);

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Containers removed.
    pub removed: usize,
    /// Containers whose removal failed (left for the next sweep).
    pub failed: usize,
    /// Host directories removed.
    pub directories: usize,
}

/// Whether the container with these labels should go now.
pub fn is_orphan(labels: &HashMap<String, String>, instance: &str, now: u64) -> bool {
    if labels.get(LABEL_INSTANCE).is_some_and(|i| i == instance) {
        return true;
    }
    match labels
        .get(LABEL_EXPIRES)
        .and_then(|e| e.parse::<u64>().ok())
    {
        Some(expires) => now >= expires.saturating_add(OTHER_INSTANCE_GRACE.as_secs()),
        // A plimsoll label that does not parse was never written by plimsolld; leave it.
        None => false,
    }
}

/// One sweep: stale host directories, then orphan containers.
pub async fn sweep(engine: &Engine, instance: &str, held: &Held) -> Swept {
    let mut swept = Swept {
        directories: reap_socket_dirs(),
        ..Swept::default()
    };
    let containers = match engine.list_labelled(LABEL_EXPIRES).await {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(error = %e, "orphan sweep: cannot list containers");
            return swept;
        }
    };
    let now = unix_now();
    for summary in containers {
        let Some(name) = summary
            .names
            .as_ref()
            .and_then(|n| n.first())
            .map(|n| n.trim_start_matches('/').to_owned())
        else {
            continue;
        };
        let labels = summary.labels.unwrap_or_default();
        if held.contains(&name) || !is_orphan(&labels, instance, now) {
            continue;
        }
        match removal::force_remove(engine, &name).await {
            Ok(()) => {
                swept.removed += 1;
                tracing::info!(container = %name, owner = labels.get(LABEL_INSTANCE).map_or("", String::as_str), "orphan container removed");
            }
            Err(_) => swept.failed += 1,
        }
    }
    swept
}

/// The smoke test's socket directories a dead daemon left: they have the broker's layout (one
/// `host-api.sock` alone in a private directory), so the broker's reaper judges them.
fn reap_socket_dirs() -> usize {
    broker::socket_dirs::reap_stale(
        &std::env::temp_dir(),
        &[SOCKET_DIR_PREFIX],
        SystemTime::now(),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn labels(instance: &str, expires: &str) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_INSTANCE.to_owned(), instance.to_owned()),
            (LABEL_EXPIRES.to_owned(), expires.to_owned()),
        ])
    }

    #[test]
    fn this_instances_containers_go_at_once_whatever_their_expiry() {
        assert!(is_orphan(&labels("me", "9999999999"), "me", 100));
    }

    #[test]
    fn other_instances_containers_go_five_minutes_after_expiry() {
        let l = labels("other", "1000");
        assert!(!is_orphan(&l, "me", 1000));
        assert!(!is_orphan(&l, "me", 1299));
        assert!(is_orphan(&l, "me", 1300));
        assert!(!is_orphan(&labels("other", "soon"), "me", u64::MAX));
    }
}
