//! The startup proof (grants.md §6.6): one billable throwaway VM made exactly as a run's
//! (secure create with both tokens, resource and network read-back), a probe and a step
//! script staged in **one** multipart upload, and `sh /tmp/plimsoll-smoke-step.sh` run in the
//! project directory, the exact project-step path. The probe must find node (exit 127
//! otherwise: a template without its toolchain), the project directory as its cwd, and every
//! egress attempt blocked; python3 decides whether Python is stated. Never a guarded VM.

use std::time::Duration;

use serde::Deserialize;

use super::envd::{Command, Ending};
use super::runs::PROJECT_DIR;
use super::sandbox::{Fleet, SandboxError};
use crate::provider::Hold;

/// The whole proof's bound.
pub const LIMIT: Duration = Duration::from_secs(90);
/// The probe's own bound inside the VM (two 4 s fetches and node's start).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
const PROBE: &str = include_str!("smoke_probe.cjs");
const PROBE_FILE: &str = "/tmp/plimsoll-smoke-probe.cjs";
const STEP_FILE: &str = "/tmp/plimsoll-smoke-step.sh";
/// The step: python3's presence as the probe's argument, then node in the shell's place.
const STEP: &str = "if command -v python3 >/dev/null 2>&1; then py=1; else py=0; fi\nexec node /tmp/plimsoll-smoke-probe.cjs \"$py\"\n";

/// Why the proof failed.
#[derive(Debug, thiserror::Error)]
pub enum SmokeError {
    /// The VM could not be made.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// A check failed.
    #[error("startup proof check {check:?} failed: {detail}")]
    Check { check: &'static str, detail: String },
    /// The whole proof took longer than [`LIMIT`].
    #[error("the startup proof did not finish within {LIMIT:?}")]
    Timeout,
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
    /// The languages a project can use (JavaScript first).
    pub languages: Vec<String>,
    /// node's version, for the log.
    pub node: String,
}

/// Runs the proof.
pub async fn prove(fleet: &std::sync::Arc<Fleet>) -> Result<Proven, SmokeError> {
    tokio::time::timeout(LIMIT, run(fleet))
        .await
        .unwrap_or(Err(SmokeError::Timeout))
}

async fn run(fleet: &std::sync::Arc<Fleet>) -> Result<Proven, SmokeError> {
    let vm = fleet.lease(LIMIT, Hold::default(), None).await?;
    vm.envd
        .upload(&[
            (PROBE_FILE.to_owned(), PROBE.as_bytes().to_vec()),
            (STEP_FILE.to_owned(), STEP.as_bytes().to_vec()),
            (format!("{PROJECT_DIR}/.plimsoll"), Vec::new()),
        ])
        .await
        .map_err(|e| check("upload", e.to_string()))?;
    let finished = vm
        .envd
        .run(&Command {
            cmd: "sh",
            args: &[STEP_FILE],
            cwd: Some(PROJECT_DIR),
            envs: &[],
            timeout: PROBE_TIMEOUT,
            stdout_cap: 16 * 1024,
            stderr_cap: 16 * 1024,
        })
        .await
        .map_err(|e| check("probe", e.to_string()))?;
    match finished.ending {
        Ending::Exited(0) => {}
        Ending::Exited(127) => {
            return Err(check(
                "toolchain",
                "node is missing (exit 127): the template lacks its toolchain",
            ));
        }
        other => return Err(check("probe", format!("the probe ended {other:?}"))),
    }
    let line = String::from_utf8_lossy(finished.stdout.bytes()).into_owned();
    let report: Report = serde_json::from_str(line.trim())
        .map_err(|e| check("probe", format!("its report could not be read: {e}")))?;
    if report.cwd != PROJECT_DIR {
        return Err(check(
            "cwd",
            format!("a step ran in {:?}, not {PROJECT_DIR}", report.cwd),
        ));
    }
    if report.egress.len() != 2 || report.egress.values().any(|v| v != "blocked") {
        return Err(check(
            "egress",
            format!("a VM reached the outside world: {:?}", report.egress),
        ));
    }
    let mut languages = vec!["javascript".to_owned()];
    if report.python {
        languages.push("python".to_owned());
    }
    drop(vm);
    Ok(Proven {
        languages,
        node: report.node,
    })
}
