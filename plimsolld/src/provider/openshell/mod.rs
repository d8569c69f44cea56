//! The `openshell` provider: each run in a fresh sandbox of NVIDIA OpenShell's gateway
//! (grants.md §8, providers.md §1), tier `container`.
//!
//! The gateway is reached over gRPC with mutual TLS ([`gateway`]). Nothing runs before the
//! gateway's driver check ([`readiness`]: exactly one docker driver with memory and CPU
//! limits, asked at most once per 5 s) and the full read-back of the sandbox that was made
//! ([`readback`]: every field sent, the fields that must stay empty, and the policy verified
//! by OpenShell's own hash, [`policy`]). Code runs through `ExecSandboxInteractive` whose
//! deadline is enforced by cancelling the stream ([`exec`]); projects use the shared runner
//! ([`runs`]). A granted run starts `plimsoll-relay` in the sandbox and dials into it
//! ([`dial`]): the sandbox keeps its no-network policy. Sandboxes are deleted in the
//! background while the run's admission slot is held ([`sandbox`]); what crashes leave is
//! swept every minute on the gateway's clock ([`orphans`]). The startup proof ([`smoke`])
//! checks from inside one throwaway sandbox everything grants.md §8.6 lists. Sessions keep
//! one sandbox across calls ([`session`]), stopped while idle.
//!
//! No OpenShell gateway can be reached where plimsoll is built and tested: this provider is
//! tested against `tests/simulators/openshell`, itself checked with OpenShell's published
//! client (docs/openshell-simulator.md).

mod cell;
mod cells;
pub mod config;
mod dial;
mod exec;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod gateway;
mod lines;
mod orphans;
mod policy;
mod proto;
mod readback;
mod readiness;
mod runs;
mod sandbox;
mod session;
mod shape;
mod smoke;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use plimsoll::refusal::Refusal;
use plimsoll::tier::IsolationTier;

use super::{
    Description, Environment, ProjectPlan, ProjectReport, Provider, ProviderError, Resources,
    SnippetOutcome, SnippetRun, TierEvidence,
};
use crate::config::Config;
use crate::provider::docker::project::{DEFAULT_TIMEOUT, MAX_TIMEOUT};
use crate::provider::docker::settings::{SNIPPET_DEFAULT_TIMEOUT, SNIPPET_MAX_TIMEOUT};
use crate::provider::tracked::Tracked;
use config::OpenShellConfig;
use readiness::{DriverError, Readiness};
use sandbox::{Fleet, SandboxError};

/// The provider id `Describe` and records name.
pub const ID: &str = "openshell";
/// Memory when `SANDBOX_MEMORY_MB` is unset.
pub const DEFAULT_MEMORY_MB: u32 = 256;
/// CPUs when `SANDBOX_CPUS` is unset.
pub const DEFAULT_CPUS: f64 = 1.0;
/// The bound on one orphan sweep.
const SWEEP_BOUND: Duration = Duration::from_secs(30);
/// What a sandbox's lifetime label adds to a run's timeout: its start and its report.
const LIFETIME_SLACK: Duration = Duration::from_secs(70);

/// Everything that can go wrong between plimsolld and the gateway. Each variant names the
/// step.
#[derive(Debug, thiserror::Error)]
pub enum OpenShellError {
    /// The client could not be made from the operator's files.
    #[error("openshell: {0}")]
    Client(#[from] gateway::ClientError),
    /// The driver check failed.
    #[error("openshell driver check: {0}")]
    Driver(#[from] DriverError),
    /// A sandbox could not be made ready and verified.
    #[error("openshell sandbox: {0}")]
    Sandbox(#[from] SandboxError),
    /// A run could not produce its result.
    #[error("openshell run: {0}")]
    Run(#[from] runs::RunError),
    /// A startup-proof check failed.
    #[error("openshell startup proof check {check:?} failed: {detail}")]
    Smoke { check: &'static str, detail: String },
}

impl From<OpenShellError> for ProviderError {
    fn from(e: OpenShellError) -> ProviderError {
        match e {
            // The sandbox is not the one asked for: nothing ran, and the caller is told why.
            OpenShellError::Sandbox(SandboxError::Readback { mismatch, .. }) => {
                ProviderError::Refused(Refusal::Environment(format!(
                    "the openshell sandbox did not read back as sent: {mismatch}; nothing ran"
                )))
            }
            other => ProviderError::infrastructure(other),
        }
    }
}

/// What the startup proof established.
#[derive(Debug, Clone, Default)]
struct Proven {
    /// The languages of the image (JavaScript first).
    languages: Vec<String>,
    /// The runner's `/proc` entries a step must fail to open in these sandboxes.
    proc_checks: Vec<&'static str>,
    /// The image's software identity, when the image is pinned.
    software_identity: String,
    /// The verified policy hash.
    policy_hash: String,
}

/// The openshell provider.
pub struct OpenShell {
    inner: Arc<Inner>,
}

struct Inner {
    fleet: Arc<Fleet>,
    readiness: Arc<Readiness>,
    proven: RwLock<Option<Proven>>,
    resources: Resources,
    /// The record's `environment` for every run.
    environment: String,
    /// Whether sessions are on: the proof then also requires Yama (grants.md §8.6).
    sessions: bool,
}

impl OpenShell {
    /// The provider for `settings` and the daemon's envelope in `config`; reads the TLS files,
    /// dials nothing.
    pub fn new(settings: &OpenShellConfig, config: &Config) -> Result<OpenShell, OpenShellError> {
        let gateway = gateway::Gateway::new(settings)?;
        let r = config.resources;
        let resources = Resources {
            memory_mb: if r.memory_mb == 0 {
                DEFAULT_MEMORY_MB
            } else {
                r.memory_mb
            },
            cpus: if r.cpus == 0.0 { DEFAULT_CPUS } else { r.cpus },
            pids: 0,
            disk_mb: r.disk_mb,
        };
        let envelope = shape::Envelope {
            image: settings.image.clone(),
            memory_mb: resources.memory_mb,
            cpus: resources.cpus,
            disk_mb: resources.disk_mb,
        };
        Ok(OpenShell {
            inner: Arc::new(Inner {
                readiness: Arc::new(Readiness::new(gateway.clone())),
                fleet: Arc::new(Fleet {
                    gateway,
                    instance: hex::encode(rand::random::<[u8; 8]>()),
                    envelope,
                    policy: policy::sandbox_policy(),
                    held: Tracked::default(),
                    skew: sandbox::Skew::default(),
                }),
                proven: RwLock::new(None),
                resources,
                environment: image_identity(&settings.image),
                sessions: config.sessions.enabled(),
            }),
        })
    }
}

/// The record's `environment`: the image by digest when it is pinned, else as named.
fn image_identity(image: &str) -> String {
    match image.rsplit_once('@') {
        Some((_, digest)) if digest.starts_with("sha256:") => format!("openshell-image:{digest}"),
        _ => format!("openshell-image:{image}"),
    }
}

/// The software identity of a pinned image on `platform`, else "".
fn software_identity(image: &str, platform: &str) -> String {
    match image.rsplit_once('@') {
        Some((_, digest))
            if crate::provider::docker::config::is_pinned(image) && !platform.is_empty() =>
        {
            format!("oci-manifest:{platform}@{digest}")
        }
        _ => String::new(),
    }
}

impl Inner {
    fn proven(&self) -> Option<Proven> {
        self.proven
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The refusal when the gateway is not fit to serve right now.
    fn ready_or_refuse(self: &Arc<Self>) -> Result<Proven, ProviderError> {
        let proven = self.proven();
        if let Err(e) = self.readiness.answer() {
            return Err(ProviderError::Refused(Refusal::Environment(format!(
                "the openshell provider is not ready ({e}); nothing ran"
            ))));
        }
        // Before the proof only the proof's own runs come here.
        Ok(proven.unwrap_or_else(|| Proven {
            proc_checks: smoke::PROC_CHECKS_ALL.to_vec(),
            ..Proven::default()
        }))
    }

    fn evidence(&self) -> TierEvidence {
        TierEvidence {
            tier: IsolationTier::Container,
            detail: format!(
                "the OpenShell gateway at {} runs sandboxes on exactly one docker driver with memory and CPU limits",
                self.fleet.gateway.uri()
            ),
        }
    }

    async fn snippet(
        self: &Arc<Self>,
        run: SnippetRun,
        proven: &Proven,
    ) -> Result<SnippetOutcome, OpenShellError> {
        let SnippetRun {
            code,
            timeout,
            hold,
            grant,
        } = run;
        let timeout = timeout.min(SNIPPET_MAX_TIMEOUT);
        let lease = self.fleet.lease(timeout + LIFETIME_SLACK, hold).await?;
        let ran = runs::snippet(&lease, code, timeout, grant, false).await?;
        let (stdout, stdout_truncated) = ran.finished.stdout.into_parts();
        let (stderr, stderr_truncated) = ran.finished.stderr.into_parts();
        Ok(SnippetOutcome {
            stdout,
            stderr,
            exit_code: ran.exit_code,
            timed_out: ran.finished.ending == exec::Ending::TimedOut,
            stdout_truncated,
            stderr_truncated,
            duration: ran.finished.duration,
            environment: self.environment.clone(),
            software_identity: proven.software_identity.clone(),
            instance: format!("openshell-sandbox:{}", lease.id()),
        })
    }

    async fn project(
        self: &Arc<Self>,
        mut plan: ProjectPlan,
        proven: &Proven,
    ) -> Result<ProjectReport, OpenShellError> {
        let budget = plan.timeout.min(MAX_TIMEOUT);
        let hold = std::mem::take(&mut plan.hold);
        let lease = self.fleet.lease(budget + LIFETIME_SLACK, hold).await?;
        let result = runs::project(&lease, &plan, budget, &proven.proc_checks).await?;
        Ok(ProjectReport {
            result,
            environment: self.environment.clone(),
            software_identity: proven.software_identity.clone(),
            instance: format!("openshell-sandbox:{}", lease.id()),
        })
    }

    async fn sweep(&self) {
        match tokio::time::timeout(SWEEP_BOUND, orphans::sweep(&self.fleet)).await {
            Ok(swept) if swept != orphans::Swept::default() => tracing::info!(
                deleted = swept.deleted,
                failed = swept.failed,
                "openshell orphan sweep"
            ),
            Ok(_) => {}
            Err(_) => {
                tracing::warn!("openshell orphan sweep did not finish within {SWEEP_BOUND:?}")
            }
        }
    }
}

fn duration_ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

#[async_trait]
impl Provider for OpenShell {
    async fn preflight(&self) -> Result<TierEvidence, ProviderError> {
        self.inner
            .readiness
            .fresh()
            .await
            .map_err(|e| ProviderError::from(OpenShellError::Driver(e)))?;
        Ok(self.inner.evidence())
    }

    async fn prove(&self) -> Result<TierEvidence, ProviderError> {
        let inner = &self.inner;
        inner
            .readiness
            .fresh()
            .await
            .map_err(|e| ProviderError::from(OpenShellError::Driver(e)))?;
        // What a crash of an earlier daemon left, before the proof adds its own.
        inner.sweep().await;
        let proved = smoke::prove(inner).await;
        // The proof's sandboxes are deleted before the daemon serves (or exits).
        inner.fleet.held.settle(Duration::from_secs(65)).await;
        let proven = proved.map_err(ProviderError::from)?;
        // Again now that the proof's creates measured the gateway's clock: another daemon's
        // expired sandboxes can be judged only from here on.
        inner.sweep().await;
        let evidence = inner.evidence();
        tracing::info!(
            gateway = %inner.fleet.gateway.uri(),
            image = %inner.fleet.envelope.image,
            policy = %policy::policy_digest(&proven.policy_hash),
            languages = ?proven.languages,
            proc_checks = ?proven.proc_checks,
            instance = %inner.fleet.instance,
            "openshell provider proven"
        );
        *inner.proven.write().unwrap_or_else(|e| e.into_inner()) = Some(proven);
        inner.readiness.set_proven(evidence.tier);
        Ok(evidence)
    }

    async fn ready(&self) -> Result<(), String> {
        self.inner.readiness.answer().map_err(|e| e.to_string())
    }

    fn current_tier(&self) -> IsolationTier {
        self.inner.readiness.current_tier()
    }

    fn describe(&self) -> Description {
        let inner = &self.inner;
        let proven = inner.proven().unwrap_or_default();
        let environment = |default: Duration, max: Duration, languages: Vec<String>| Environment {
            identity: inner.environment.clone(),
            default_timeout_ms: duration_ms(default),
            max_timeout_ms: duration_ms(max),
            software_identity: proven.software_identity.clone(),
            languages,
        };
        Description {
            sandbox: ID,
            supports_project: true,
            // Both reach the broker through the relay (grants.md §3, openshell row).
            supports_javascript_grants: true,
            supports_project_grants: true,
            javascript: environment(
                SNIPPET_DEFAULT_TIMEOUT,
                SNIPPET_MAX_TIMEOUT,
                vec!["javascript".to_owned()],
            ),
            project: environment(DEFAULT_TIMEOUT, MAX_TIMEOUT, proven.languages.clone()),
            // Session calls run in the same image, with the project timeouts.
            supports_sessions: true,
            session: environment(DEFAULT_TIMEOUT, MAX_TIMEOUT, proven.languages.clone()),
            resources: inner.resources,
            policy: if proven.policy_hash.is_empty() {
                String::new()
            } else {
                policy::policy_digest(&proven.policy_hash)
            },
            ..Description::default()
        }
    }

    async fn run_snippet(&self, run: SnippetRun) -> Result<SnippetOutcome, ProviderError> {
        let proven = self.inner.ready_or_refuse()?;
        Ok(self.inner.snippet(run, &proven).await?)
    }

    async fn run_project(&self, plan: ProjectPlan) -> Result<ProjectReport, ProviderError> {
        let proven = self.inner.ready_or_refuse()?;
        Ok(self.inner.project(plan, &proven).await?)
    }

    async fn open_session(
        &self,
        open: super::SessionOpen,
    ) -> Result<super::OpenedSession, ProviderError> {
        session::open(&self.inner, open).await
    }

    async fn sweep_orphans(&self) {
        if self.inner.readiness.proven() {
            self.inner.sweep().await;
        }
    }

    async fn drain(&self, budget: Duration) {
        let left = self.inner.fleet.held.settle(budget).await;
        if left > 0 {
            tracing::warn!(
                sandboxes = left,
                "drain: sandboxes still being deleted; the orphan sweep of the next start deletes them"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_name_the_digest_only_when_pinned() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let pinned = format!("plimsoll/sandbox@{digest}");
        assert_eq!(image_identity(&pinned), format!("openshell-image:{digest}"));
        assert_eq!(
            image_identity("plimsoll/sandbox:latest"),
            "openshell-image:plimsoll/sandbox:latest"
        );
        assert_eq!(
            software_identity(&pinned, "linux/amd64"),
            format!("oci-manifest:linux/amd64@{digest}")
        );
        assert_eq!(
            software_identity("plimsoll/sandbox:latest", "linux/amd64"),
            ""
        );
    }
}
