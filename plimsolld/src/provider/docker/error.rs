//! The docker provider's error type. A run that meets one answers an infrastructure
//! failure; a failed readiness check is refused before anything runs instead (`not_ready`
//! in the provider).

use std::path::PathBuf;
use std::time::Duration;

use crate::provider::ProviderError;

/// Everything that can go wrong between plimsolld and docker. Each variant names the step.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// The socket could not be opened.
    #[error("cannot connect to docker at {socket}: {source}")]
    Connect {
        socket: PathBuf,
        source: Box<bollard::errors::Error>,
    },
    /// An Engine API call failed.
    #[error("docker API: {0}")]
    Api(Box<bollard::errors::Error>),
    /// An Engine API call ran out of its budget.
    #[error("docker {call} did not answer within {budget:?}")]
    Timeout {
        call: &'static str,
        budget: Duration,
    },
    /// The wait stream ended without an exit code.
    #[error("docker ended the container wait without an exit code")]
    WaitEnded,
    /// A container is still listed after every removal attempt.
    #[error("container {0} is still present after forced removal")]
    StillPresent(String),
    /// The start marker never came: docker did not start the command.
    #[error(
        "docker did not start the container's command ({container}: no start marker; exit {exit_code}, deadline passed: {timed_out})"
    )]
    NotStarted {
        container: String,
        exit_code: i32,
        timed_out: bool,
    },
    /// `SANDBOX_DISK_MB` cannot hold `/tmp`, `/dev/shm` and 1 MiB of `/work`.
    #[error(
        "SANDBOX_DISK_MB={disk_mb} cannot hold /tmp, /dev/shm and /work: at least {needed_mb} MiB"
    )]
    DiskBudget { disk_mb: u32, needed_mb: u32 },
    /// A host file could not be read or written.
    #[error("{path}: {source}")]
    HostFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The guest uid (or uid+1) is a host account or group.
    #[error(
        "SANDBOX_GUEST_UID: {uid} is used by {entry:?} in {file}; choose a uid that no host account or group uses (uid and uid+1)"
    )]
    GuestUidTaken {
        uid: u32,
        file: PathBuf,
        entry: String,
    },
    /// The seccomp profile is not a Docker profile.
    #[error("SANDBOX_DOCKER_SECCOMP {path}: {source}")]
    SeccompProfile {
        path: PathBuf,
        source: seccomp::SeccompError,
    },
    /// The Engine is not a Linux daemon.
    #[error("the docker daemon runs {0} containers; plimsoll needs linux")]
    NotLinux(String),
    /// The configured runtime is not registered with docker.
    #[error(
        "SANDBOX_DOCKER_RUNTIME={runtime} is not registered with docker (registered: {registered}); register it in /etc/docker/daemon.json (scripts/setup-docker does)"
    )]
    RuntimeNotRegistered { runtime: String, registered: String },
    /// `runsc` is registered under a path that is not runsc.
    #[error(
        "docker's runtime runsc points at {path:?}, whose file name is not runsc; the kernel tier is not proven"
    )]
    RuntimeNotRunsc { path: String },
    /// An image is not on the daemon.
    #[error(
        "image {reference} is not available on the docker daemon ({reason}); build it with images/build (no registry is reachable)"
    )]
    ImageMissing { reference: String, reason: String },
    /// An image breaks a rule.
    #[error("image {reference} is refused: {reason}")]
    ImageRefused { reference: String, reason: String },
    /// A reference names another image than the one proven.
    #[error(
        "the {what} image {reference} now names {now}, not the proven {proven}; restart plimsolld to prove it"
    )]
    ImageMoved {
        what: &'static str,
        reference: String,
        proven: String,
        now: String,
    },
    /// A cached preflight failure, as text.
    #[error("{0}")]
    Preflight(String),
    /// Preflight failed at startup.
    #[error("docker preflight: {0}")]
    StartupPreflight(#[source] Box<DockerError>),
    /// Another caller's preflight did not finish within 2 s.
    #[error("preflight is already in progress")]
    PreflightBusy,
    /// A project plan could not be encoded for the runner.
    #[error("the project plan could not be encoded: {0}")]
    Plan(serde_json::Error),
    /// A startup-proof check failed.
    #[error("startup proof check {check:?} failed: {detail}")]
    Smoke { check: &'static str, detail: String },
}

impl From<DockerError> for ProviderError {
    fn from(e: DockerError) -> ProviderError {
        ProviderError::infrastructure(e)
    }
}
