//! The `dockercloud` provider: each run in a fresh Docker Cloud sandbox (a microVM; grants.md
//! §7, providers.md §1), tier `vm`.
//!
//! The token exchange and Connect JSON ([`api`]) reach the management API, which makes,
//! reads, lists and deletes sandboxes ([`sandbox`]): names tracked before the create, the
//! create followed to RUNNING, what booted checked, and the seal (the effective network
//! policy deny-all with exactly the run's entitlement) read back on every run before code
//! runs. Each sandbox's endpoint ([`endpoint`]) takes files and runs commands under the
//! timeout/head wrapper ([`runs`]). The startup proof is [`smoke`]; the orphan sweep deletes
//! this instance's names no run tracks. Granted runs reach the broker through the guard; the
//! guest's client carries its own run's guard token (Docker's proxy cannot add headers).
//!
//! No Docker account can be reached where plimsoll is built and tested: this provider is
//! tested against `tests/simulators/dockercloud` (docs/dockercloud-simulator.md), never the
//! live service.

mod api;
pub mod config;
mod endpoint;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod rest;
mod rest_endpoint;
mod runs;
mod sandbox;
mod smoke;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use plimsoll::refusal::Refusal;
use plimsoll::tier::IsolationTier;

use super::remote::{self, Guard, Proof};
use super::{
    Description, Hold, ProjectPlan, ProjectReport, Provider, ProviderError, Resources,
    SnippetOutcome, SnippetRun, TierEvidence,
};
use crate::admission::paid::PaidDay;
use crate::config::Config;
use crate::config::env::ENV_DOCKERCLOUD_GUARD_URL;
use crate::grant::host_client::{self, TokenPlacement};
use crate::grant::{Delivery, GuestGrant};
use crate::provider::docker::project::MAX_TIMEOUT;
use crate::provider::docker::settings::SNIPPET_MAX_TIMEOUT;
use crate::provider::e2b::http::{Client, tls_config};
use config::{DockerCloudConfig, Transport};
use sandbox::{Fleet, Image, SandboxError};

/// The provider id `Describe` and records name.
pub const ID: &str = "dockercloud";
/// The bound on one orphan sweep.
const SWEEP_BOUND: Duration = Duration::from_secs(30);
/// What a sandbox's budget adds to a run's timeout: staging files and reading artifacts.
const RUN_SLACK: Duration = Duration::from_secs(30);
/// The longest REST run: its endpoint credential lives at most 300 s (grants.md §7.3).
const REST_MAX_TIMEOUT: Duration = Duration::from_secs(270);
// A run and the calls around it fit in one endpoint credential's life.
const _: () = assert!(REST_MAX_TIMEOUT.as_secs() < rest::CREDENTIAL_TTL.as_secs());
/// The "Micro" size, asked for without an envelope.
const MICRO_CPUS: u32 = 1;
const MICRO_MEMORY_MIB: u64 = 2048;

/// Everything that can go wrong between plimsolld and Docker Cloud.
#[derive(Debug, thiserror::Error)]
pub enum DockerCloudError {
    #[error("dockercloud: {0}")]
    Client(String),
    #[error("dockercloud sandbox: {0}")]
    Sandbox(#[from] SandboxError),
    #[error("dockercloud run: {0}")]
    Run(#[from] runs::RunError),
    #[error("dockercloud {0}")]
    Smoke(#[from] smoke::SmokeError),
}

impl From<DockerCloudError> for ProviderError {
    fn from(e: DockerCloudError) -> ProviderError {
        match e {
            DockerCloudError::Sandbox(SandboxError::Quota(why)) => {
                ProviderError::Refused(Refusal::AtCapacity(format!(
                    "Docker Cloud's running-sandbox quota is reached ({why}); nothing ran"
                )))
            }
            DockerCloudError::Sandbox(SandboxError::Refused(why)) => {
                ProviderError::Refused(Refusal::Environment(format!(
                    "the dockercloud sandbox was refused and deleted: {why}; nothing ran"
                )))
            }
            other => ProviderError::infrastructure(other),
        }
    }
}

/// The dockercloud provider.
pub struct DockerCloud {
    guard: Option<Guard>,
    paid: Arc<PaidDay>,
    fleet: Arc<Fleet>,
    sized: bool,
    proof: Proof,
    resources: Resources,
    environment: String,
}

impl DockerCloud {
    /// The provider for `settings`; calls nothing.
    pub fn new(
        settings: &DockerCloudConfig,
        config: &Config,
    ) -> Result<DockerCloud, DockerCloudError> {
        let needs_tls = [&settings.auth_url, &settings.api_url, &settings.policy_url]
            .iter()
            .any(|u| u.base.tls);
        // Endpoints may be https even when the management base is a loopback test double.
        let tls = match tls_config() {
            Ok(tls) => Some(tls),
            Err(e) if needs_tls => return Err(DockerCloudError::Client(e)),
            Err(_) => None,
        };
        let (image, environment) = if settings.store_image.is_empty() {
            (
                Image::Reference(settings.image.clone()),
                format!("dockercloud-image:{}", settings.image),
            )
        } else {
            (
                Image::Store(settings.store_image.clone()),
                format!("dockercloud-store-image:{}", settings.store_image),
            )
        };
        let guard = settings
            .guard_url
            .as_ref()
            .map(|g| Guard::at(g, ::guard::DOCKERCLOUD_PATH));
        let memory_mib = match config.resources.memory_mb {
            0 => MICRO_MEMORY_MIB,
            mb => u64::from(mb),
        };
        let fleet = Fleet {
            transport: settings.transport,
            auth: api::Auth::new(
                &settings.auth_url,
                tls.clone(),
                &settings.username,
                &settings.token,
            ),
            api: Client::new(settings.api_url.base.clone(), tls.clone()),
            prefix: settings.api_url.path.clone(),
            policy: Client::new(settings.policy_url.base.clone(), tls.clone()),
            policy_prefix: settings.policy_url.path.clone(),
            tls,
            instance: hex::encode(rand::random::<[u8; 4]>()),
            image,
            pinned: settings.pinned_digest(),
            cpus: if settings.cpus == 0 {
                MICRO_CPUS
            } else {
                settings.cpus
            },
            memory_mib,
            names: crate::provider::tracked::Tracked::default(),
        };
        Ok(DockerCloud {
            guard,
            paid: Arc::new(PaidDay::new(config.limits.paid_seconds_per_day)),
            sized: settings.store_image.is_empty(),
            fleet: Arc::new(fleet),
            proof: Proof::new(ID),
            resources: config.resources,
            environment,
        })
    }

    fn max_timeout(&self, max: Duration) -> Duration {
        capped(self.fleet.transport, max)
    }

    fn evidence(&self) -> TierEvidence {
        TierEvidence {
            tier: IsolationTier::Vm,
            detail: format!(
                "every run is its own Docker Cloud sandbox ({}, {} API), its network policy read back deny-all before code runs",
                self.environment,
                match self.fleet.transport {
                    Transport::Connect => "Connect",
                    Transport::Rest => "REST",
                }
            ),
        }
    }

    /// A granted run's guard host and client library (carrying the run's token), or a
    /// refusal when the grant did not come as a guard token or no guard is configured.
    fn granted<'a>(
        &'a self,
        grant: Option<&GuestGrant>,
    ) -> Result<Option<(&'a str, String)>, ProviderError> {
        let Some(grant) = grant else { return Ok(None) };
        let (Some(guard), Some(_)) = (&self.guard, grant.access.guard_token()) else {
            return Err(remote::no_guard(ID, ENV_DOCKERCLOUD_GUARD_URL));
        };
        let library = host_client::node_guard(grant, &guard.url, TokenPlacement::Guest, None);
        Ok(Some((&guard.host, library)))
    }

    /// A sandbox for a run of `timeout`: its paid seconds, reserved at admission, travel
    /// with the slot and are charged once it is deleted.
    async fn sandbox(
        &self,
        timeout: Duration,
        hold: Hold,
        guard: Option<&str>,
    ) -> Result<sandbox::Sandbox, ProviderError> {
        let paid = hold.paid();
        match self.fleet.lease(timeout + RUN_SLACK, hold, guard).await {
            Ok(sandbox) => Ok(sandbox),
            Err(e) => {
                // A create whose fate is unknown may be billed whole (one never sent is
                // `Unsent`, and charged only the time held).
                if let (SandboxError::Api(_), Some(paid)) = (&e, &paid) {
                    paid.forfeit();
                }
                Err(ProviderError::from(DockerCloudError::from(e)))
            }
        }
    }

    async fn snippet(&self, run: SnippetRun) -> Result<SnippetOutcome, ProviderError> {
        let timeout = run.timeout.min(self.max_timeout(SNIPPET_MAX_TIMEOUT));
        let granted = self.granted(run.grant.as_deref())?;
        let (host, library) = granted.map_or((None, None), |(h, l)| (Some(h), Some(l)));
        let sandbox = self.sandbox(timeout, run.hold, host).await?;
        let ran = runs::snippet(&sandbox, &run.code, timeout, library.as_deref())
            .await
            .map_err(|e| ProviderError::from(DockerCloudError::from(e)))?;
        Ok(SnippetOutcome {
            stdout: ran.stdout,
            stderr: ran.stderr,
            exit_code: ran.exit_code,
            timed_out: ran.timed_out,
            stdout_truncated: ran.stdout_truncated,
            stderr_truncated: ran.stderr_truncated,
            duration: ran.duration,
            environment: self.environment.clone(),
            software_identity: String::new(),
            instance: format!("dockercloud-sandbox:{}", sandbox.id()),
        })
    }

    async fn project(&self, mut plan: ProjectPlan) -> Result<ProjectReport, ProviderError> {
        let budget = plan.timeout.min(self.max_timeout(MAX_TIMEOUT));
        let hold = std::mem::take(&mut plan.hold);
        let grant = plan.grant.clone();
        let granted = self.granted(grant.as_deref())?;
        let (host, library) = granted.map_or((None, None), |(h, l)| (Some(h), Some(l)));
        let sandbox = self.sandbox(budget, hold, host).await?;
        let result = runs::project(&sandbox, &plan, budget, library.as_deref())
            .await
            .map_err(|e| ProviderError::from(DockerCloudError::from(e)))?;
        Ok(ProjectReport {
            result,
            environment: self.environment.clone(),
            software_identity: String::new(),
            instance: format!("dockercloud-sandbox:{}", sandbox.id()),
        })
    }

    /// Deletes this instance's sandboxes that no run tracks (grants.md §7.7).
    async fn sweep(&self) -> Result<(usize, usize), api::ApiError> {
        let prefix = sandbox::name_prefix(&self.fleet.instance);
        let (mut deleted, mut failed) = (0, 0);
        for (name, id) in self.fleet.list().await? {
            if !name.starts_with(&prefix)
                || self.fleet.names.contains(&name)
                || !sandbox::valid_id(&id)
            {
                continue;
            }
            match self.fleet.delete(Some(&id), &name).await {
                Ok(()) => {
                    tracing::info!(sandbox = %name, "dockercloud orphan sweep: deleted a sandbox no run tracks");
                    deleted += 1;
                }
                Err(e) => {
                    tracing::warn!(sandbox = %name, error = %e, "dockercloud orphan sweep: delete failed");
                    failed += 1;
                }
            }
        }
        Ok((deleted, failed))
    }
}

/// The longest run of a kind whose own maximum is `max`: REST runs are capped at 270 s.
fn capped(transport: Transport, max: Duration) -> Duration {
    match transport {
        Transport::Connect => max,
        Transport::Rest => max.min(REST_MAX_TIMEOUT),
    }
}

#[async_trait]
impl Provider for DockerCloud {
    /// Configuration only: Docker's service is not called here.
    async fn preflight(&self) -> Result<TierEvidence, ProviderError> {
        Ok(self.evidence())
    }

    async fn prove(&self) -> Result<TierEvidence, ProviderError> {
        let proved = smoke::prove(&self.fleet, self.sized).await;
        // The proof's sandbox is deleted before the daemon serves (or exits).
        self.fleet.names.settle(Duration::from_secs(40)).await;
        let proven = proved.map_err(|e| ProviderError::from(DockerCloudError::Smoke(e)))?;
        tracing::info!(
            api = %self.fleet.api.origin(),
            environment = %self.environment,
            node = %proven.node,
            languages = ?proven.languages,
            instance = %self.fleet.instance,
            "dockercloud provider proven"
        );
        self.proof.passed(proven);
        Ok(self.evidence())
    }

    /// Configured and proven: nothing is asked of Docker's service.
    async fn ready(&self) -> Result<(), String> {
        self.proof.ready()
    }

    fn current_tier(&self) -> IsolationTier {
        self.proof.tier()
    }

    fn describe(&self) -> Description {
        let guarded = self.guard.is_some();
        self.proof
            .describe(&self.environment, guarded, false, self.resources, |max| {
                self.max_timeout(max)
            })
    }

    fn grant_delivery(&self) -> Delivery {
        Delivery::Guard
    }

    fn paid_day(&self) -> Option<Arc<PaidDay>> {
        Some(self.paid.clone())
    }

    async fn run_snippet(&self, run: SnippetRun) -> Result<SnippetOutcome, ProviderError> {
        self.proof.refuse_unproven()?;
        self.snippet(run).await
    }

    async fn run_project(&self, plan: ProjectPlan) -> Result<ProjectReport, ProviderError> {
        self.proof.refuse_unproven()?;
        self.project(plan).await
    }

    async fn sweep_orphans(&self) {
        if !self.proof.is_ready() {
            return;
        }
        match tokio::time::timeout(SWEEP_BOUND, self.sweep()).await {
            Ok(Ok((0, 0))) => {}
            Ok(Ok((deleted, failed))) => {
                tracing::info!(deleted, failed, "dockercloud orphan sweep");
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "dockercloud orphan sweep: listing sandboxes"),
            Err(_) => {
                tracing::warn!("dockercloud orphan sweep did not finish within {SWEEP_BOUND:?}")
            }
        }
    }

    async fn drain(&self, budget: Duration) {
        let left = self.fleet.names.settle(budget).await;
        if left > 0 {
            tracing::warn!(
                sandboxes = left,
                "drain: dockercloud sandboxes still being deleted; their timeout or the next sweep ends them"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rest_runs_fit_in_one_endpoint_credential() {
        let long = Duration::from_secs(600);
        assert_eq!(capped(Transport::Rest, long), REST_MAX_TIMEOUT);
        assert_eq!(capped(Transport::Connect, long), long);
        assert_eq!(capped(Transport::Rest, MAX_TIMEOUT), MAX_TIMEOUT);
    }
}
