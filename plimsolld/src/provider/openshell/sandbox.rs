//! This daemon's sandboxes on the gateway (grants.md §8.3–8.5): made, waited for, read back,
//! and deleted in the background while the run's admission slot is still held.
//!
//! A [`Lease`] is one sandbox. Its name is tracked before the create is sent, so neither a
//! crash nor the orphan sweep can lose it; every way a lease ends (the run's end, a failed
//! create, a read-back that differs, a dropped task) deletes the sandbox in the background
//! and gives the slot back only once the gateway says it is gone. The drain waits for those
//! deletes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::gateway::{Gateway, GatewayError};
use super::proto::sandbox::v1::SandboxPolicy;
use super::proto::v1::{DeletionOutcome, Sandbox, SandboxPhase};
use super::readback::{self, Mismatch};
use super::shape::{Envelope, Shape};
use crate::provider::Hold;
use crate::provider::tracked::Tracked;

/// How often readiness is polled after a create or a start.
const READY_POLL: Duration = Duration::from_millis(50);
/// How long a sandbox may take to become READY.
pub const READY_BOUND: Duration = Duration::from_secs(60);
/// A delete's whole budget, over at most three attempts.
const DELETE_BUDGET: Duration = Duration::from_secs(60);
/// The pauses between delete attempts.
const DELETE_BACKOFF: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(2)];
/// How often an ACCEPTED delete is polled until the sandbox is gone.
const DELETE_POLL: Duration = Duration::from_millis(100);
/// The slack on each side of a clock-skew measurement (grants.md §8.6).
const SKEW_SLACK_MS: i64 = 1_000;

/// Why a sandbox could not be made ready and verified.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A gateway call failed.
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    /// The sandbox reached a phase other than provisioning, starting or ready.
    #[error("sandbox {name} went to phase {phase:?} instead of READY")]
    Phase { name: String, phase: SandboxPhase },
    /// It was not READY in time.
    #[error("sandbox {name} was not READY within {READY_BOUND:?}")]
    NotReady { name: String },
    /// What came back is not what was asked for: nothing may run in it.
    #[error("sandbox {name} read back wrong: {mismatch}")]
    Readback { name: String, mismatch: Mismatch },
}

// === impl Skew ===

/// The gateway's clock against ours, measured at each create (grants.md §8.6).
#[derive(Default)]
pub struct Skew {
    /// The smallest offset (gateway − local, ms) the last create allows: the gateway's clock
    /// read as far behind as the evidence permits, so a sandbox never looks older than it is.
    low_ms: Mutex<Option<i64>>,
}

impl Skew {
    /// Records a create issued at `sent` and seen READY at `ready`, created at `created`
    /// (Unix ms) on the gateway's clock.
    pub fn measure(&self, sent: SystemTime, ready: SystemTime, created_ms: i64) {
        let (sent, ready) = (unix_ms(sent), unix_ms(ready));
        let low = created_ms - ready - SKEW_SLACK_MS;
        let high = created_ms - sent + SKEW_SLACK_MS;
        // A fifth of the orphan margin (5 min): worth an operator's look.
        if low > 60_000 || high < -60_000 {
            tracing::warn!(
                skew_low_ms = low,
                skew_high_ms = high,
                "the gateway's clock differs from this host's by more than a minute"
            );
        }
        *self.low_ms.lock().unwrap_or_else(|e| e.into_inner()) = Some(low);
    }

    /// The gateway's time now (Unix ms), read conservatively; `None` before any create.
    pub fn gateway_now_ms(&self) -> Option<i64> {
        let low = (*self.low_ms.lock().unwrap_or_else(|e| e.into_inner()))?;
        Some(unix_ms(SystemTime::now()) + low)
    }
}

/// `time` in Unix milliseconds.
pub fn unix_ms(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// A sandbox's creation time on the gateway's clock (Unix ms), if it has one.
pub fn created_ms(sandbox: &Sandbox) -> Option<i64> {
    let t = sandbox.metadata.as_ref()?.created_time?;
    Some(t.seconds.checked_mul(1000)? + i64::from(t.nanos) / 1_000_000)
}

/// A sandbox's phase.
pub fn phase(sandbox: &Sandbox) -> SandboxPhase {
    sandbox
        .status
        .as_ref()
        .and_then(|s| SandboxPhase::try_from(s.phase).ok())
        .unwrap_or(SandboxPhase::Unspecified)
}

// === impl Fleet ===

/// Everything the provider's sandboxes share.
pub struct Fleet {
    /// The gateway.
    pub gateway: Gateway,
    /// This daemon's id on its sandboxes' labels (16 hex).
    pub instance: String,
    /// The envelope and image every sandbox gets.
    pub envelope: Envelope,
    /// The policy every sandbox gets.
    pub policy: SandboxPolicy,
    /// The names tracked.
    pub held: Tracked,
    /// The gateway's clock.
    pub skew: Skew,
}

impl Fleet {
    /// Makes a sandbox that lives `lifetime`, waits until it is READY and reads it back.
    /// `hold` (the run's admission slot) goes with the sandbox: it is given back only once
    /// the sandbox is deleted.
    pub async fn lease(
        self: &Arc<Self>,
        lifetime: Duration,
        hold: Hold,
    ) -> Result<Lease, SandboxError> {
        let shape = self.envelope.shape(&self.instance, lifetime, &self.policy);
        // Tracked before the create is sent: from here on the lease deletes it.
        self.held.track(&shape.name);
        let mut lease = Lease {
            fleet: Arc::clone(self),
            shape,
            id: String::new(),
            policy_hash: String::new(),
            hold: Some(hold),
            removed: false,
        };
        let sent = SystemTime::now();
        self.gateway.create(lease.shape.request()).await?;
        let ready = lease.wait_ready().await?;
        if let Some(created) = created_ms(&ready) {
            self.skew.measure(sent, SystemTime::now(), created);
        }
        lease.verify(&ready).await?;
        Ok(lease)
    }

    /// Deletes `name` (three attempts within 60 s; an ACCEPTED delete is polled until the
    /// sandbox is gone). Answers whether it is gone.
    pub async fn delete(&self, name: &str) -> bool {
        let started = Instant::now();
        let attempts = async {
            for attempt in 0..=DELETE_BACKOFF.len() {
                if attempt > 0 {
                    tokio::time::sleep(DELETE_BACKOFF[attempt - 1]).await;
                }
                match self.gateway.delete(name).await {
                    Ok(DeletionOutcome::Completed | DeletionOutcome::AlreadyAbsent) => return true,
                    Ok(DeletionOutcome::Accepted) => {
                        if self.gone_eventually(name).await {
                            return true;
                        }
                    }
                    Ok(other) => {
                        tracing::warn!(sandbox = name, outcome = ?other, "the gateway answered a delete with an unknown outcome");
                    }
                    Err(e) => tracing::debug!(sandbox = name, error = %e, "delete attempt failed"),
                }
            }
            false
        };
        let gone = tokio::time::timeout(DELETE_BUDGET, attempts)
            .await
            .unwrap_or(false);
        if !gone {
            tracing::error!(
                sandbox = name,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "could not delete a sandbox; the orphan sweep retries"
            );
        }
        gone
    }

    /// Polls until `GetSandbox` answers NOT_FOUND (for at most a third of the budget).
    async fn gone_eventually(&self, name: &str) -> bool {
        let until = tokio::time::Instant::now() + DELETE_BUDGET / 3;
        while tokio::time::Instant::now() < until {
            match self.gateway.get(name).await {
                Err(e) if e.is_not_found() => return true,
                _ => tokio::time::sleep(DELETE_POLL).await,
            }
        }
        false
    }
}

// === impl Lease ===

/// One sandbox this daemon made; dropping it deletes the sandbox in the background.
pub struct Lease {
    fleet: Arc<Fleet>,
    shape: Shape,
    id: String,
    policy_hash: String,
    hold: Option<Hold>,
    /// Deleted by [`Lease::remove`]: nothing is left for the drop to do.
    removed: bool,
}

impl Lease {
    /// The sandbox's name.
    pub fn name(&self) -> &str {
        &self.shape.name
    }

    /// The gateway's id of the sandbox.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The policy hash the read-back verified.
    pub fn policy_hash(&self) -> &str {
        &self.policy_hash
    }

    /// The gateway.
    pub fn gateway(&self) -> &Gateway {
        &self.fleet.gateway
    }

    /// Polls until READY; answers the READY sandbox.
    pub async fn wait_ready(&self) -> Result<Sandbox, SandboxError> {
        let name = self.name();
        let poll = async {
            loop {
                let got = self.fleet.gateway.get(name).await?;
                match phase(&got) {
                    SandboxPhase::Ready => return Ok(got),
                    SandboxPhase::Provisioning
                    | SandboxPhase::Starting
                    | SandboxPhase::Unspecified => {}
                    other => {
                        return Err(SandboxError::Phase {
                            name: name.to_owned(),
                            phase: other,
                        });
                    }
                }
                tokio::time::sleep(READY_POLL).await;
            }
        };
        tokio::time::timeout(READY_BOUND, poll)
            .await
            .unwrap_or_else(|_| {
                Err(SandboxError::NotReady {
                    name: name.to_owned(),
                })
            })
    }

    /// The read-back (grants.md §8.4) of `got` and of the sandbox's configuration.
    pub async fn verify(&mut self, got: &Sandbox) -> Result<(), SandboxError> {
        let wrong = |mismatch| SandboxError::Readback {
            name: self.shape.name.clone(),
            mismatch,
        };
        readback::sandbox(&self.shape, got).map_err(wrong)?;
        let id = got
            .metadata
            .as_ref()
            .map(|m| m.id.clone())
            .unwrap_or_default();
        if !self.id.is_empty() && self.id != id {
            return Err(wrong(Mismatch::Id));
        }
        let config = self.fleet.gateway.config(&self.shape.name).await?;
        let hash = readback::config(&self.shape, &config).map_err(wrong)?;
        self.id = id;
        self.policy_hash = hash;
        Ok(())
    }

    /// Deletes the sandbox now and waits for the gateway to say it is gone (a session's
    /// end, which counts as done only after removal); answers whether it is gone. The name
    /// is untracked either way: a sandbox still there is the orphan sweep's.
    pub async fn remove(mut self) -> bool {
        let gone = self.fleet.delete(&self.shape.name).await;
        self.fleet.held.release(&self.shape.name);
        self.removed = true;
        gone
    }

    /// Reads the sandbox back again (a session, before each call).
    pub async fn verify_again(&mut self) -> Result<(), SandboxError> {
        let got = self.fleet.gateway.get(self.name()).await?;
        match phase(&got) {
            SandboxPhase::Ready => self.verify(&got).await,
            other => Err(SandboxError::Phase {
                name: self.name().to_owned(),
                phase: other,
            }),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let fleet = Arc::clone(&self.fleet);
        let name = self.shape.name.clone();
        let hold = self.hold.take();
        let delete = async move {
            fleet.delete(&name).await;
            // Untracked either way: a sandbox still there is the orphan sweep's now.
            fleet.held.release(&name);
            drop(hold);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(delete);
            }
            // No runtime (the daemon is gone): the next start's orphan sweep deletes it.
            Err(_) => self.fleet.held.release(&self.shape.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skew_reads_the_gateway_clock_as_far_behind_as_the_evidence_allows() {
        let skew = Skew::default();
        assert_eq!(skew.gateway_now_ms(), None);
        let sent = UNIX_EPOCH + Duration::from_secs(1_000);
        let ready = sent + Duration::from_millis(800);
        // The gateway stamped the create 10 s ahead of our clock.
        skew.measure(sent, ready, 1_010_000);
        let low = skew
            .low_ms
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap();
        assert_eq!(low, 1_010_000 - 1_000_800 - 1_000);
        let now = unix_ms(SystemTime::now());
        let gw = skew.gateway_now_ms().unwrap_or_default();
        assert!((gw - now - low).abs() < 1_000);
    }
}
