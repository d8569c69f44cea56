//! The `e2b` provider: each run in a fresh E2B microVM (grants.md §6, providers.md §1),
//! tier `vm`.
//!
//! E2B's control plane ([`api`]) makes, reads back, lists and kills VMs; each VM's envd
//! ([`envd`]) takes files and runs processes as Connect server streams. One HTTP client
//! ([`http`]) serves both: HTTP/1.1, no redirects, vendor errors cut and scrubbed. A VM is
//! made only with both access tokens, deny-all egress, this instance's stamps and a lease
//! tracked before the request leaves, and is read back before use ([`sandbox`]). Snippets and
//! projects run as envd processes the daemon follows itself ([`runs`]); the VM is killed after
//! every run. The startup proof ([`smoke`]) runs the project-step path in one throwaway VM
//! and requires every egress attempt to fail; what crashes leave is swept every minute
//! ([`orphans`]). `/readyz` answers from the configuration only: it never calls E2B.
//!
//! No E2B account can be reached where plimsoll is built and tested: this provider is tested
//! against `tests/simulators/e2b`, itself checked with E2B's published SDK
//! (docs/e2b-simulator.md).

mod api;
mod cells;
pub mod config;
mod envd;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub(crate) mod http;
mod orphans;
mod runs;
mod sandbox;
mod session;
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
use crate::config::env::{ENV_E2B_GUARD_ADDRESS, ENV_E2B_GUARD_URL};
use crate::grant::host_client::{self, TokenPlacement};
use crate::grant::{Delivery, GuestGrant};
use crate::provider::docker::project::MAX_TIMEOUT;
use crate::provider::docker::settings::SNIPPET_MAX_TIMEOUT;
use crate::provider::tracked::Tracked;
use config::{E2bConfig, EnvdRoute, SessionGrants};
use sandbox::{Fleet, GuardRule, SandboxError};

/// The provider id `Describe` and records name.
pub const ID: &str = "e2b";
/// The bound on one orphan sweep.
const SWEEP_BOUND: Duration = Duration::from_secs(45);
/// What a VM's budget adds to a run's timeout: staging files and reading artifacts.
const RUN_SLACK: Duration = Duration::from_secs(30);

/// Everything that can go wrong between plimsolld and E2B. Each variant names the step.
#[derive(Debug, thiserror::Error)]
pub enum E2bError {
    /// The HTTP client could not be made.
    #[error("e2b: {0}")]
    Client(String),
    /// A VM could not be made ready and verified.
    #[error("e2b sandbox: {0}")]
    Sandbox(#[from] SandboxError),
    /// A run could not produce its result.
    #[error("e2b run: {0}")]
    Run(#[from] runs::RunError),
    /// The startup proof failed.
    #[error("e2b {0}")]
    Smoke(#[from] smoke::SmokeError),
}

impl From<E2bError> for ProviderError {
    fn from(e: E2bError) -> ProviderError {
        match e {
            // Nothing ran, and the caller is told why.
            E2bError::Sandbox(SandboxError::Refused(why)) => ProviderError::Refused(
                Refusal::Environment(format!("E2B refused to create a VM ({why}); nothing ran")),
            ),
            E2bError::Sandbox(e @ (SandboxError::Insecure(_) | SandboxError::Readback { .. })) => {
                ProviderError::Refused(Refusal::Environment(format!(
                    "the e2b VM was refused and killed: {e}; nothing ran"
                )))
            }
            other => ProviderError::infrastructure(other),
        }
    }
}

/// The client library of a granted run or call (no token in it): the VM has no nameserver,
/// so it connects to the guard's address ([`sandbox::guard_address`]); an unknown address
/// refuses the run before any VM is made.
async fn guard_library(
    grant: &GuestGrant,
    guard: &Guard,
    configured: Option<std::net::Ipv4Addr>,
) -> Result<String, Refusal> {
    let address = sandbox::guard_address(&guard.host, configured)
        .await
        .map_err(|why| {
            Refusal::Environment(format!("{why} (set {ENV_E2B_GUARD_ADDRESS}); nothing ran"))
        })?;
    Ok(host_client::node_guard(
        grant,
        &guard.url,
        TokenPlacement::Proxy,
        Some(address),
    ))
}

/// The e2b provider.
pub struct E2b {
    guard: Option<Guard>,
    /// `E2B_GUARD_ADDRESS`: where granted VMs connect for the guard's name.
    guard_address: Option<std::net::Ipv4Addr>,
    /// How a session's granted calls reach the guard (`E2B_SESSION_GRANTS`).
    session_grants: SessionGrants,
    /// The daemon-wide paid day: admission reserves runs against it; the proofs charge it.
    paid: Arc<PaidDay>,
    fleet: Arc<Fleet>,
    proof: Proof,
    resources: Resources,
    environment: String,
}

impl E2b {
    /// The provider for `settings` and the daemon's envelope in `config`; calls nothing.
    pub fn new(settings: &E2bConfig, config: &Config) -> Result<E2b, E2bError> {
        let needs_tls = settings.api.tls
            || matches!(&settings.envd, EnvdRoute::Domain(_))
            || matches!(&settings.envd, EnvdRoute::Base(b) if b.tls);
        let tls = if needs_tls {
            Some(http::tls_config().map_err(E2bError::Client)?)
        } else {
            None
        };
        let api = api::Api::new(
            http::Client::new(settings.api.clone(), tls.clone()),
            &settings.api_key,
        )
        .map_err(|e| E2bError::Client(e.to_string()))?;
        let guard = settings
            .guard_url
            .as_ref()
            .map(|g| Guard::at(g, ::guard::E2B_PATH));
        Ok(E2b {
            guard,
            guard_address: settings.guard_address,
            session_grants: settings.session_grants,
            paid: Arc::new(PaidDay::new(config.limits.paid_seconds_per_day)),
            fleet: Arc::new(Fleet {
                api,
                envd_route: settings.envd.clone(),
                tls,
                template: settings.template.clone(),
                instance: hex::encode(rand::random::<[u8; 8]>()),
                resources: config.resources,
                leases: Tracked::default(),
            }),
            proof: Proof::new(ID),
            resources: config.resources,
            environment: format!("e2b-template:{}", settings.template),
        })
    }

    fn evidence(&self) -> TierEvidence {
        TierEvidence {
            tier: IsolationTier::Vm,
            detail: format!(
                "every run is its own E2B microVM (template {}, control plane {}), deny-all egress proven at startup",
                self.fleet.template,
                self.fleet.api.origin()
            ),
        }
    }

    async fn sweep(&self) {
        match tokio::time::timeout(SWEEP_BOUND, orphans::sweep(&self.fleet)).await {
            Ok(swept) if swept != orphans::Swept::default() => tracing::info!(
                killed = swept.killed,
                failed = swept.failed,
                "e2b orphan sweep"
            ),
            Ok(_) => {}
            Err(_) => tracing::warn!("e2b orphan sweep did not finish within {SWEEP_BOUND:?}"),
        }
    }

    /// A granted run's guard rule and client library (no token in it), or a refusal when
    /// the grant did not come as a guard token, no guard is configured or the guard's
    /// address is unknown.
    async fn granted<'a>(
        &'a self,
        grant: Option<&'a GuestGrant>,
    ) -> Result<Option<(GuardRule<'a>, String)>, ProviderError> {
        let Some(grant) = grant else { return Ok(None) };
        let (Some(guard), Some(token)) = (&self.guard, grant.access.guard_token()) else {
            return Err(remote::no_guard(ID, ENV_E2B_GUARD_URL));
        };
        let library = guard_library(grant, guard, self.guard_address)
            .await
            .map_err(ProviderError::Refused)?;
        Ok(Some((
            GuardRule {
                host: &guard.host,
                token: token.expose(),
            },
            library,
        )))
    }

    /// A VM for a run of `timeout`. Its paid seconds, reserved at admission, travel with
    /// the slot and are charged once the VM is killed; a lost create is charged its whole
    /// reservation, as E2B may bill a VM nobody can name (one that never left made none).
    async fn vm(
        &self,
        timeout: Duration,
        hold: Hold,
        rule: Option<GuardRule<'_>>,
        extra: &[(&str, String)],
    ) -> Result<sandbox::Vm, ProviderError> {
        let paid = hold.paid();
        match self
            .fleet
            .lease_stamped(timeout + RUN_SLACK, hold, rule, extra)
            .await
        {
            Ok(vm) => Ok(vm),
            Err(e) => {
                if let (SandboxError::Lost(lost), Some(paid)) = (&e, &paid)
                    && !lost.never_sent()
                {
                    paid.forfeit();
                }
                Err(ProviderError::from(E2bError::from(e)))
            }
        }
    }

    async fn snippet(&self, run: SnippetRun) -> Result<SnippetOutcome, ProviderError> {
        let timeout = run.timeout.min(SNIPPET_MAX_TIMEOUT);
        let granted = self.granted(run.grant.as_deref()).await?;
        let (rule, library) = granted.map_or((None, None), |(r, l)| (Some(r), Some(l)));
        let vm = self.vm(timeout, run.hold, rule, &[]).await?;
        let ran = runs::fresh_snippet(&vm, &run.code, timeout, library.as_deref())
            .await
            .map_err(|e| ProviderError::from(E2bError::from(e)))?;
        let (stdout, stdout_truncated) = ran.finished.stdout.into_parts();
        let (stderr, stderr_truncated) = ran.finished.stderr.into_parts();
        Ok(SnippetOutcome {
            stdout,
            stderr,
            exit_code: ran.exit_code,
            timed_out: ran.finished.ending == envd::Ending::TimedOut,
            stdout_truncated,
            stderr_truncated,
            duration: ran.finished.duration,
            environment: self.environment.clone(),
            software_identity: String::new(),
            instance: format!("e2b-sandbox:{}", vm.id()),
        })
    }

    async fn project(&self, mut plan: ProjectPlan) -> Result<ProjectReport, ProviderError> {
        let budget = plan.timeout.min(MAX_TIMEOUT);
        let hold = std::mem::take(&mut plan.hold);
        let grant = plan.grant.clone();
        let granted = self.granted(grant.as_deref()).await?;
        let (rule, library) = granted.map_or((None, None), |(r, l)| (Some(r), Some(l)));
        let vm = self.vm(budget, hold, rule, &[]).await?;
        let result = runs::project(&vm, &plan, budget, library.as_deref())
            .await
            .map_err(|e| ProviderError::from(E2bError::from(e)))?;
        Ok(ProjectReport {
            result,
            environment: self.environment.clone(),
            software_identity: String::new(),
            instance: format!("e2b-sandbox:{}", vm.id()),
        })
    }
}

#[async_trait]
impl Provider for E2b {
    /// Configuration only (grants.md §6.6): E2B is never called here.
    async fn preflight(&self) -> Result<TierEvidence, ProviderError> {
        Ok(self.evidence())
    }

    async fn prove(&self) -> Result<TierEvidence, ProviderError> {
        // What a crash of an earlier daemon left cannot carry this instance's stamp; the
        // sweep after the proof judges the proof's own VM if its kill failed.
        let started = std::time::Instant::now();
        let proved = smoke::prove(&self.fleet).await;
        // The proof's VM is killed before the daemon serves (or exits).
        self.fleet.leases.settle(Duration::from_secs(40)).await;
        // Its seconds are the daemon's own: charged to the daemon's allowance as spent.
        self.paid.charge_spent(started.elapsed());
        let proven = proved.map_err(|e| ProviderError::from(E2bError::Smoke(e)))?;
        tracing::info!(
            api = %self.fleet.api.origin(),
            template = %self.fleet.template,
            node = %proven.node,
            languages = ?proven.languages,
            instance = %self.fleet.instance,
            "e2b provider proven"
        );
        self.proof.passed(proven);
        Ok(self.evidence())
    }

    /// Configured and proven: nothing is asked of E2B (grants.md §6.6).
    async fn ready(&self) -> Result<(), String> {
        self.proof.ready()
    }

    fn current_tier(&self) -> IsolationTier {
        self.proof.tier()
    }

    /// Snippets and projects; grants reach the broker through the guard, the token added by
    /// E2B's egress proxy. Session calls are snippets and projects in one VM.
    fn describe(&self) -> Description {
        let guarded = self.guard.is_some();
        self.proof
            .describe(&self.environment, guarded, true, self.resources, |max| max)
    }

    fn grant_delivery(&self) -> Delivery {
        Delivery::Guard
    }

    fn session_call_tokens(&self) -> bool {
        self.session_grants == SessionGrants::Call
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

    async fn open_session(
        &self,
        open: super::SessionOpen,
    ) -> Result<super::OpenedSession, ProviderError> {
        self.proof.refuse_unproven()?;
        session::open(self, open).await
    }

    async fn sweep_orphans(&self) {
        if self.proof.is_ready() {
            self.sweep().await;
        }
    }

    async fn drain(&self, budget: Duration) {
        let left = self.fleet.leases.settle(budget).await;
        if left > 0 {
            tracing::warn!(
                vms = left,
                "drain: e2b VMs still being killed; E2B's timeout or the next sweep ends them"
            );
        }
    }
}
