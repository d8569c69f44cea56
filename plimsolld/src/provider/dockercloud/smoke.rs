//! The startup proof (grants.md §7.6, 120 s): the account's capabilities (permissions, CPU
//! and memory ranges); one throwaway sandbox made and sealed exactly as a run's; a probe and
//! a step script uploaded after `mkdir`, and the step run through the exec wrapper in the
//! project directory (node, its cwd, every egress attempt blocked); `sleep 30` under a 1 s
//! limit must be killed; `yes` under a 10 s limit must come back capped at exactly the output
//! cap with a non-zero exit. Never a guarded sandbox.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::api::ApiError;
use super::runs::{self, PROJECT_DIR};
use super::sandbox::{Fleet, SandboxError};
use crate::provider::Hold;
use crate::provider::docker::settings::OUTPUT_CAP;
use crate::provider::remote::{self, Check, PROBE, PROBE_FILE, Proven, STEP, STEP_FILE};

/// The whole proof's bound.
pub const LIMIT: Duration = Duration::from_secs(120);
/// What the account must be allowed (when it reports permissions at all).
const PERMISSIONS: [&str; 4] = [
    "PERMISSION_SANDBOXES_READ",
    "PERMISSION_SANDBOXES_CREATE",
    "PERMISSION_SANDBOXES_DELETE",
    "PERMISSION_NETWORK_POLICIES_READ",
];

/// Why the proof failed.
#[derive(Debug, thiserror::Error)]
pub enum SmokeError {
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error(transparent)]
    Check(#[from] Check),
    #[error("the startup proof did not finish within {LIMIT:?}")]
    Timeout,
}

impl From<runs::RunError> for SmokeError {
    fn from(e: runs::RunError) -> SmokeError {
        match e {
            runs::RunError::Api(e) => SmokeError::Api(e),
            lost @ runs::RunError::Lost { .. } => check("sandbox still answers", lost.to_string()),
        }
    }
}

fn check(check: &'static str, detail: impl Into<String>) -> SmokeError {
    SmokeError::Check(remote::check(check, detail))
}

/// Runs the proof.
pub async fn prove(fleet: &Arc<Fleet>, with_resources: bool) -> Result<Proven, SmokeError> {
    tokio::time::timeout(LIMIT, run(fleet, with_resources))
        .await
        .unwrap_or(Err(SmokeError::Timeout))
}

fn number(v: &serde_json::Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// Permissions and, for sized creates, the CPU and memory ranges.
async fn capabilities(fleet: &Fleet, with_resources: bool) -> Result<(), SmokeError> {
    let caps = fleet
        .call(
            "/docker.sbx.v1.CapabilityService/GetCapabilities",
            &json!({}),
        )
        .await?;
    let listed: Vec<&str> = caps["permissions"]
        .as_array()
        .map(|p| p.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    // An empty list reads as "not reported".
    if !listed.is_empty() {
        let missing: Vec<&str> = PERMISSIONS
            .into_iter()
            .filter(|p| !listed.contains(p))
            .collect();
        if !missing.is_empty() {
            return Err(check("permissions", format!("the token lacks {missing:?}")));
        }
    }
    if with_resources {
        let r = &caps["resources"];
        let in_range = |value: u64, min: &str, max: &str| {
            number(&r[min]).is_none_or(|m| value >= m) && number(&r[max]).is_none_or(|m| value <= m)
        };
        if !in_range(u64::from(fleet.cpus), "cpuMin", "cpuMax") {
            return Err(check(
                "resources",
                format!("{} CPUs are outside the account's range", fleet.cpus),
            ));
        }
        if !in_range(fleet.memory_mib, "memoryMibMin", "memoryMibMax") {
            return Err(check(
                "resources",
                format!("{} MiB are outside the account's range", fleet.memory_mib),
            ));
        }
    }
    Ok(())
}

async fn run(fleet: &Arc<Fleet>, with_resources: bool) -> Result<Proven, SmokeError> {
    // The REST API reports no capabilities: its permissions show in the calls themselves.
    if fleet.transport == super::config::Transport::Connect {
        capabilities(fleet, with_resources).await?;
    }
    let sandbox = fleet.lease(LIMIT, Hold::default(), None).await?;
    let made = runs::run(
        &sandbox,
        &["mkdir", "-p", "--", PROJECT_DIR],
        "/tmp",
        Duration::from_secs(20),
    )
    .await?;
    if made.exit_code != 0 {
        return Err(check("mkdir", format!("exit {}", made.exit_code)));
    }
    let bearer = sandbox.bearer().await?;
    sandbox
        .endpoint
        .upload(
            &bearer,
            &[
                (PROBE_FILE.to_owned(), PROBE.as_bytes().to_vec()),
                (STEP_FILE.to_owned(), STEP.as_bytes().to_vec()),
            ],
        )
        .await
        .map_err(|e| check("upload", e.to_string()))?;
    let probe = runs::run(
        &sandbox,
        &["sh", STEP_FILE],
        PROJECT_DIR,
        Duration::from_secs(32),
    )
    .await?;
    match probe.exit_code {
        0 => {}
        127 => return Err(check("toolchain", "node is missing (exit 127)")),
        other => {
            return Err(check(
                "probe",
                format!(
                    "exit {other}: {}",
                    String::from_utf8_lossy(&probe.stderr).trim()
                ),
            ));
        }
    }
    let proven = remote::judge(&probe.stdout, PROJECT_DIR)?;
    // The wrapper's timeout really kills (3 s left = a 1 s limit in the guest).
    let slept = runs::run(&sandbox, &["sleep", "30"], "/tmp", Duration::from_secs(3)).await?;
    if !slept.timed_out || slept.duration >= Duration::from_secs(15) {
        return Err(check(
            "timeout",
            format!(
                "sleep 30 under a 1 s limit ended {} after {:?}",
                slept.exit_code, slept.duration
            ),
        ));
    }
    // The wrapper's head really caps.
    let flood = runs::run(&sandbox, &["yes"], "/tmp", Duration::from_secs(12)).await?;
    if flood.stdout.len() != OUTPUT_CAP || !flood.stdout_truncated || flood.exit_code == 0 {
        return Err(check(
            "output cap",
            format!(
                "yes came back with {} bytes (truncated {}), exit {}",
                flood.stdout.len(),
                flood.stdout_truncated,
                flood.exit_code
            ),
        ));
    }
    drop(sandbox);
    Ok(proven)
}
