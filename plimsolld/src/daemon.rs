//! The daemon's life, top to bottom (config.md §9): free checks first, then
//! bind every listener, then the (possibly billed) startup proof, then the
//! floor, then serve until a signal, then drain.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use plimsoll::tier::IsolationTier;
use tokio::net::TcpListener;

use crate::admission::Admission;
use crate::auth::Verifier;
use crate::config::hardened::enforce_hardened;
use crate::config::{AuthConfig, Config};
use crate::grant::Grants;
use crate::metrics::Metrics;
use crate::provider::ProviderError;
use crate::server::listener::{METRICS_CONNECTION_CAP, bound, rpc_connection_cap, serve};
use crate::server::metrics_listener::MetricsService;
use crate::server::{Pipeline, tls};
use crate::service::State;

/// How long the startup proof may take.
const PROOF_BUDGET: Duration = Duration::from_secs(120);
/// The bound of starting the warm session pool (config.md §9, step 19).
const POOL_START_BUDGET: Duration = Duration::from_secs(180);
/// How long in-flight work may take to finish after a signal (above the
/// 5-minute run ceiling, like the write timeout).
const DRAIN_BUDGET: Duration = Duration::from_secs(360);
/// How often the background loop sweeps what crashes left (providers.md §5.13).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Why the daemon did not start. Each is one log line, then exit 1.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The provider could not be built from its configuration.
    #[error("cannot build the sandbox provider: {0}")]
    Provider(ProviderError),
    /// TLS files could not be loaded.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// Hardened mode found violations.
    #[error(transparent)]
    Hardened(#[from] crate::config::hardened::HardenedError),
    /// A listener could not bind.
    #[error("{what} on {addr}: {source}")]
    Listen {
        /// `cannot listen` or `cannot listen for metrics`.
        what: &'static str,
        /// The address asked for.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The startup proof failed or took too long.
    #[error("the sandbox provider failed its startup proof: {0}")]
    Proof(#[source] ProviderError),
    /// The grant path could not start.
    #[error("grants: {0}")]
    Grants(#[from] crate::grant::GrantError),
    /// Profiles exist but the provider has no way to hand a grant to a guest safely.
    #[error(
        "grants: the {provider} provider supports no credential-safe grant path, \
         but the grant broker has {profiles} profile(s)"
    )]
    NoGrantPath {
        /// The provider id.
        provider: &'static str,
        /// How many profiles the broker holds.
        profiles: u32,
    },
    /// The bound address could not be written to `PLIMSOLL_ADDR_FILE`.
    #[error("PLIMSOLL_ADDR_FILE {path}: {source}")]
    AddrFile {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// SIGTERM and SIGINT handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// The proven tier is below `SANDBOX_MIN_ISOLATION`.
    #[error(
        "provider does not meet the required isolation tier: SANDBOX_MIN_ISOLATION is {floor}, the provider proved {proven}"
    )]
    BelowFloor {
        /// The configured floor.
        floor: IsolationTier,
        /// The proven tier.
        proven: IsolationTier,
    },
}

/// Runs the daemon until a signal has been handled and everything drained.
pub async fn run(config: Config) -> Result<(), StartupError> {
    // 3: unknown variables only warn.
    for name in &config.unknown_vars {
        tracing::warn!(variable = %name, "unknown variable ignored: this plimsolld has no such setting");
    }
    for warning in config.warnings(&crate::config::env::ProcessEnv) {
        tracing::warn!("{warning}");
    }
    // 4: the provider, from configuration only.
    let provider = config
        .provider
        .build(&config)
        .map_err(StartupError::Provider)?;
    // 11: grants: the broker must answer, and profiles need a provider with a grant path.
    // A provider with a guard URL (e2b) gets a supervised guard child beside a supervised
    // broker, listening on PLIMSOLL_GUARD_ADDR.
    let guest_uid = config.provider.settings().guest_uid();
    let guard = config
        .guard_addr
        .as_ref()
        .map(|addr| crate::grant::GuardChild {
            addr: addr.clone(),
            max_concurrent: config.limits.max_concurrent,
        });
    let grants = Arc::new(Grants::start(&config.grants, guest_uid, guard.as_ref()).await?);
    reap_stale_broker_dirs();
    let description = provider.describe();
    if grants.profiles() > 0
        && !description.supports_javascript_grants
        && !description.supports_project_grants
    {
        return Err(StartupError::NoGrantPath {
            provider: description.sandbox,
            profiles: grants.profiles(),
        });
    }
    // 12: authentication.
    let verifier = Arc::new(Verifier::from_config(&config.auth));
    if let AuthConfig::Clients(file) = &config.auth {
        tracing::info!(clients = file.clients.len(), "multi-client auth enabled");
    }
    // 13: TLS.
    let tls = match &config.tls {
        Some(files) => Some(tls::acceptor(&files.cert, &files.key)?),
        None => None,
    };
    // 14: first hardened pass, before anything is paid for.
    if config.hardened {
        enforce_hardened(&config, None)?;
    }
    // 9: the limiter, after the memory clamp.
    if config.limits.clamped {
        tracing::warn!(
            max_concurrent = config.limits.max_concurrent,
            total_memory_mb = config.limits.total_memory_mb,
            per_run_memory_mb = config.limits.per_run_memory_mb,
            "SANDBOX_MAX_CONCURRENT lowered to what fits in SANDBOX_TOTAL_MEMORY_MB"
        );
    }
    // 15: bind every listener.
    let rpc = bind(&config.addr, "cannot listen").await?;
    let metrics_listener = match &config.metrics_addr {
        Some(addr) => Some(bind(addr, "cannot listen for metrics").await?),
        None => None,
    };
    // 16: preflight and the startup proof.
    let evidence = tokio::time::timeout(PROOF_BUDGET, async {
        provider.preflight().await?;
        provider.prove().await
    })
    .await
    .map_err(|_| {
        StartupError::Proof(ProviderError::infrastructure(format!(
            "no answer within {PROOF_BUDGET:?}"
        )))
    })?
    .map_err(StartupError::Proof)?;
    tracing::info!(
        provider = provider.describe().sandbox,
        isolation = %evidence.tier,
        evidence = %evidence.detail,
        "sandbox provider ready"
    );
    // 17 and 20: the floor and the second hardened pass, against the proven
    // tier. A refusal here still lets the provider clean up what the proof made.
    if let Err(e) = after_proof(&config, evidence.tier) {
        provider.drain(Duration::from_secs(30)).await;
        return Err(e);
    }
    // 19: the warm session pool (its first member made now), then, with sessions on, one
    // session through the provider's session path (served by a member when the pool is on).
    if config.sessions.pool > 0 {
        let started = tokio::time::timeout(
            POOL_START_BUDGET,
            provider.start_session_pool(config.sessions.pool, config.sessions.lifetime),
        )
        .await
        .unwrap_or_else(|_| {
            Err(ProviderError::infrastructure(format!(
                "the warm session pool's first member was not ready within {POOL_START_BUDGET:?}"
            )))
        });
        if let Err(e) = started {
            provider.drain(Duration::from_secs(30)).await;
            return Err(StartupError::Proof(e));
        }
        tracing::info!(size = config.sessions.pool, "warm session pool started");
    }
    if config.sessions.enabled() && provider.describe().supports_sessions {
        if let Err(e) = crate::session::proof::prove(provider.as_ref(), &config.sessions).await {
            provider.drain(Duration::from_secs(30)).await;
            return Err(StartupError::Proof(ProviderError::infrastructure(e)));
        }
        tracing::info!("session path proven");
    }
    // 21: serve.
    let metrics = Arc::new(Metrics::default());
    let admission = Admission::metered(config.limits, metrics.clone(), provider.paid_day());
    let sessions =
        crate::session::Sessions::new(config.sessions, provider.clone(), admission.clone());
    let state = Arc::new(State {
        provider: provider.clone(),
        proven: evidence.tier,
        resources: config.resources,
        metrics: metrics.clone(),
        admission: admission.clone(),
        grants: grants.clone(),
        sessions: sessions.clone(),
    });
    let stack = Pipeline {
        state: state.clone(),
        verifier: verifier.clone(),
        decode_slots: 2 * config.max_concurrent as usize,
    }
    .build();
    let max_connections = rpc_connection_cap();
    // Handlers first: a signal that follows the listening line must drain, not kill.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let handlers = install_signal_handlers()?;
    tokio::spawn(signals(handlers, stop_tx));
    let sweeper = tokio::spawn(sweep_orphans(provider.clone(), stop_rx.clone()));
    // Before the listening line: a daemon that cannot write it never says it listens. The
    // listener is bound, so a script that reads the address may connect at once.
    let addr_file = match &config.addr_file {
        Some(path) => Some(AddrFile::write(path, &bound(&rpc))?),
        None => None,
    };
    tracing::info!(
        addr = %bound(&rpc),
        provider = provider.describe().sandbox,
        isolation = %state.current_tier(),
        auth = verifier.label(),
        max_concurrent = config.limits.max_concurrent,
        per_key_concurrent = config.limits.per_key_concurrent,
        rate_per_min = config.limits.rate_per_min,
        rate_burst = config.limits.rate_burst,
        tls = tls.is_some(),
        metrics_addr = %metrics_listener.as_ref().map_or_else(|| "off".to_owned(), bound),
        guard_addr = %grants.guard_addr().unwrap_or_else(|| "none".to_owned()),
        max_connections,
        "plimsolld listening"
    );
    // The metrics listener stays up while the RPC listener drains, and stops after it.
    let (metrics_stop_tx, metrics_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let metrics_task = metrics_listener.map(|l| {
        let tls = tls.clone();
        let pool_provider = provider.clone();
        tokio::spawn(async move {
            let done = async move {
                let _ = metrics_stop_rx.await;
            };
            serve(
                l,
                MetricsService::new(metrics, pool_provider),
                tls,
                METRICS_CONNECTION_CAP,
                done,
                Duration::from_secs(10),
            )
            .await;
        })
    });
    let mut stop = stop_rx.clone();
    let rpc_stop = async move {
        let _ = stop.wait_for(|s| *s).await;
        tracing::info!("shutting down: draining in-flight requests");
    };
    serve(rpc, stack, tls, max_connections, rpc_stop, DRAIN_BUDGET).await;
    sweeper.abort();
    // Sessions end as `shutdown`, and their sandboxes go, before the provider drains.
    sessions.drain(DRAIN_BUDGET).await;
    provider.drain(DRAIN_BUDGET).await;
    // After the drain: no run still needs its grant.
    grants.shutdown().await;
    let _ = metrics_stop_tx.send(());
    if let Some(t) = metrics_task {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
    drop(addr_file);
    tracing::info!("plimsolld stopped");
    Ok(())
}

/// `PLIMSOLL_ADDR_FILE` while the daemon serves: written whole (a reader never sees half an
/// address), removed when dropped.
struct AddrFile(PathBuf);

impl AddrFile {
    fn write(path: &Path, addr: &str) -> Result<AddrFile, StartupError> {
        let failed = |source| StartupError::AddrFile {
            path: path.to_owned(),
            source,
        };
        let mut staging = path.as_os_str().to_owned();
        staging.push(format!(".{}.tmp", std::process::id()));
        let staging = PathBuf::from(staging);
        std::fs::write(&staging, format!("{addr}\n"))
            .and_then(|()| std::fs::rename(&staging, path))
            .map_err(|e| {
                let _ = std::fs::remove_file(&staging);
                failed(e)
            })?;
        Ok(AddrFile(path.to_owned()))
    }
}

impl Drop for AddrFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The background loop: every [`SWEEP_EVERY`], what crashes left. The provider sweeps its
/// own sandboxes ([`Provider::sweep_orphans`](crate::provider::Provider::sweep_orphans)), then
/// the broker's stale socket directories go, whichever provider runs. Ends with `stop`.
async fn sweep_orphans(
    provider: Arc<dyn crate::provider::Provider>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(SWEEP_EVERY) => {}
        }
        provider.sweep_orphans().await;
        reap_stale_broker_dirs();
    }
}

fn reap_stale_broker_dirs() {
    let reaped = crate::grant::reap_stale_socket_dirs();
    if reaped > 0 {
        tracing::info!(
            directories = reaped,
            "stale broker socket directories removed"
        );
    }
}

/// The checks that need the proven tier: `SANDBOX_MIN_ISOLATION` (step 17)
/// and the second hardened-mode pass (step 20).
fn after_proof(config: &Config, proven: IsolationTier) -> Result<(), StartupError> {
    if let Some(floor) = config.min_isolation
        && proven < floor
    {
        return Err(StartupError::BelowFloor { floor, proven });
    }
    if config.hardened {
        enforce_hardened(config, Some(proven))?;
        tracing::info!("hardened mode: production policy verified and enforced");
    }
    Ok(())
}

async fn bind(addr: &str, what: &'static str) -> Result<TcpListener, StartupError> {
    // Go-style ":port" means every interface.
    let target = if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_owned()
    };
    TcpListener::bind(&target)
        .await
        .map_err(|source| StartupError::Listen {
            what,
            addr: addr.to_owned(),
            source,
        })
}

type SignalPair = (tokio::signal::unix::Signal, tokio::signal::unix::Signal);

fn install_signal_handlers() -> Result<SignalPair, StartupError> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate()).map_err(StartupError::Signals)?;
    let int = signal(SignalKind::interrupt()).map_err(StartupError::Signals)?;
    Ok((term, int))
}

/// Waits for SIGTERM or SIGINT and flips `stop`. A second signal ends the
/// process at once, as restoring the default handler would.
async fn signals((mut term, mut int): SignalPair, stop: tokio::sync::watch::Sender<bool>) {
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    let _ = stop.send(true);
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::warn!("second signal: exiting now");
    std::process::exit(1);
}
