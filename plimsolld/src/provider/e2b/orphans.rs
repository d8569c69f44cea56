//! The orphan sweep, every minute (grants.md §6.8): a VM stamped with this instance whose
//! lease no run tracks is killed at any age (the server's metadata filter is re-checked here;
//! a VM without a lease stamp is never touched); any instance's session VM more than 5
//! minutes past its `expires` is killed unless its lease is tracked here. Another
//! instance's run VMs are left to that instance and to E2B's own timeout.

use std::time::{Duration, SystemTime};

use super::api::valid_id;
use super::sandbox::{Fleet, SDK, STAMP_INSTANCE, STAMP_LEASE, STAMP_SDK};

/// How long past its `expires` another instance's session VM is left.
const SESSION_GRACE: Duration = Duration::from_secs(300);

/// What one sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub killed: usize,
    pub failed: usize,
}

/// One sweep.
pub async fn sweep(fleet: &Fleet) -> Swept {
    let mut swept = Swept::default();
    let mine = fleet
        .api
        .list(&[(STAMP_SDK, SDK), (STAMP_INSTANCE, &fleet.instance)])
        .await;
    let sessions = fleet.api.list(&[(STAMP_SDK, SDK), ("session", "1")]).await;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let mut doomed = Vec::new();
    match mine {
        Ok(found) => doomed.extend(found.into_iter().filter(|d| {
            d.metadata.get(STAMP_INSTANCE) == Some(&fleet.instance)
                && d.metadata
                    .get(STAMP_LEASE)
                    .is_some_and(|lease| !fleet.leases.contains(lease))
        })),
        Err(e) => tracing::warn!(error = %e, "e2b orphan sweep: listing this instance's VMs"),
    }
    match sessions {
        Ok(found) => doomed.extend(found.into_iter().filter(|d| {
            let expired = d
                .metadata
                .get("expires")
                .and_then(|e| e.parse::<u64>().ok())
                .is_some_and(|e| now.as_secs() > e.saturating_add(SESSION_GRACE.as_secs()));
            let tracked = d
                .metadata
                .get(STAMP_LEASE)
                .is_some_and(|lease| fleet.leases.contains(lease));
            d.metadata.get(STAMP_SDK).map(String::as_str) == Some(SDK)
                && d.metadata.get("session").map(String::as_str) == Some("1")
                && expired
                && !tracked
        })),
        Err(e) => tracing::warn!(error = %e, "e2b orphan sweep: listing session VMs"),
    }
    doomed.sort_by(|a, b| a.sandbox_id.cmp(&b.sandbox_id));
    doomed.dedup_by(|a, b| a.sandbox_id == b.sandbox_id);
    for d in doomed {
        if !valid_id(&d.sandbox_id) {
            continue;
        }
        match fleet.api.kill(&d.sandbox_id).await {
            Ok(()) => {
                tracing::info!(sandbox = %d.sandbox_id, "e2b orphan sweep: killed a VM no run tracks");
                swept.killed += 1;
            }
            Err(e) => {
                tracing::warn!(sandbox = %d.sandbox_id, error = %e, "e2b orphan sweep: kill failed");
                swept.failed += 1;
            }
        }
    }
    swept
}
