//! The startup proof (grants.md §7.6, 120 s): the account's capabilities (permissions, CPU
//! and memory ranges); one throwaway sandbox made and sealed exactly as a run's; a probe and
//! a step script uploaded after `mkdir`, and the step run through the exec wrapper in the
//! project directory (node, its cwd, every egress attempt blocked); `sleep 30` under a 1 s
//! limit must be killed; `yes` under a 10 s limit must come back capped at exactly the output
//! cap with a non-zero exit. Never a guarded sandbox.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use super::api::ApiError;
use super::runs::{self, PROJECT_DIR};
use super::sandbox::{Fleet, SandboxError};
use crate::provider::Hold;
use crate::provider::docker::settings::OUTPUT_CAP;

/// The whole proof's bound.
pub const LIMIT: Duration = Duration::from_secs(120);
/// The e2b provider's probe: node's version, its cwd, python3's presence, egress attempts.
const PROBE: &str = include_str!("../e2b/smoke_probe.cjs");
const PROBE_FILE: &str = "/tmp/plimsoll-smoke-probe.cjs";
const STEP_FILE: &str = "/tmp/plimsoll-smoke-step.sh";
const STEP: &str = "if command -v python3 >/dev/null 2>&1; then py=1; else py=0; fi\nexec node /tmp/plimsoll-smoke-probe.cjs \"$py\"\n";
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
    #[error("startup proof check {check:?} failed: {detail}")]
    Check { check: &'static str, detail: String },
    #[error("the startup proof did not finish within {LIMIT:?}")]
    Timeout,
}

impl From<runs::RunError> for SmokeError {
    fn from(e: runs::RunError) -> SmokeError {
        match e {
            runs::RunError::Api(e) => SmokeError::Api(e),
        }
    }
}

fn check(check: &'static str, detail: impl Into<String>) -> SmokeError {
    SmokeError::Check {
        check,
        detail: detail.into(),
    }
}

#[derive(Deserialize)]
struct Report {
    node: String,
    cwd: String,
    python: bool,
    egress: std::collections::BTreeMap<String, String>,
}

/// What the proof found.
#[derive(Debug, Clone, Default)]
pub struct Proven {
    pub languages: Vec<String>,
    pub node: String,
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
    let report: Report = serde_json::from_slice(&probe.stdout)
        .map_err(|e| check("probe", format!("its report could not be read: {e}")))?;
    if report.cwd != PROJECT_DIR {
        return Err(check(
            "cwd",
            format!("the step ran in {:?}, not {PROJECT_DIR}", report.cwd),
        ));
    }
    if report.egress.len() != 2 || report.egress.values().any(|v| v != "blocked") {
        return Err(check(
            "egress",
            format!("a sandbox reached the outside world: {:?}", report.egress),
        ));
    }
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
    let mut languages = vec!["javascript".to_owned()];
    if report.python {
        languages.push("python".to_owned());
    }
    drop(sandbox);
    Ok(Proven {
        languages,
        node: report.node,
    })
}
