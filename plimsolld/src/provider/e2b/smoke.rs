//! The startup proof (grants.md §6.6): one billable throwaway VM made exactly as a run's
//! (secure create with both tokens, resource and network read-back), a probe and a step
//! script staged in **one** multipart upload, and `sh /tmp/plimsoll-smoke-step.sh` run in the
//! project directory, the exact project-step path. The probe must find node (exit 127
//! otherwise: a template without its toolchain), the project directory as its cwd, and every
//! egress attempt blocked; python3 decides whether Python is stated. Never a guarded VM.

use std::time::Duration;

use super::envd::{Command, Ending};
use super::runs::PROJECT_DIR;
use super::sandbox::{Fleet, SandboxError};
use crate::provider::Hold;
use crate::provider::remote::{self, Check, PROBE, PROBE_FILE, Proven, STEP, STEP_FILE};

/// The whole proof's bound.
pub const LIMIT: Duration = Duration::from_secs(90);
/// The probe's own bound inside the VM (two 4 s fetches and node's start).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the proof failed.
#[derive(Debug, thiserror::Error)]
pub enum SmokeError {
    /// The VM could not be made.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// A check failed.
    #[error(transparent)]
    Check(#[from] Check),
    /// The whole proof took longer than [`LIMIT`].
    #[error("the startup proof did not finish within {LIMIT:?}")]
    Timeout,
}

fn check(check: &'static str, detail: impl Into<String>) -> SmokeError {
    SmokeError::Check(remote::check(check, detail))
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
    let proven = remote::judge(finished.stdout.bytes(), PROJECT_DIR)?;
    drop(vm);
    Ok(proven)
}
