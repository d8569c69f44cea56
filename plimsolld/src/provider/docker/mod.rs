//! The `docker` provider: each run in a fresh, locked-down container on the local Docker
//! Engine (providers.md §4–§6).
//!
//! The Engine is reached only through bollard over the local Unix socket named by
//! `DOCKER_HOST` (resolved once, at configuration); no docker CLI runs on any path. The tier is
//! painted from evidence: `container` under runc (with a loud warning: runc shares the host
//! kernel and is not a boundary for hostile code), `kernel` only under gVisor's `runsc` whose
//! registration preflight read from the daemon, and only after the startup proof passed under
//! it.
//!
//! The files, in the order a daemon uses them:
//! - [`settings`]: the envelope and mounts derived from the configuration;
//! - [`preflight`] and [`readiness`]: the cheap checks and their 5 s cache, with [`identity`]
//!   (each image's software identity, from docker's records);
//! - [`smoke`]: the startup proof's probe containers and their checks;
//! - [`lockdown`]: the one container shape (§5.4); [`container`]: one run start to finish,
//!   with [`output`] (caps and the start marker) and [`removal`] (force-remove, confirmed);
//! - [`project`]: a project run in the project image (the runner's authenticated protocol is
//!   [`crate::provider::guest::runner`]);
//! - [`module`]: a module run, one runner step of `sim-worker` in the module image, and its
//!   results file;
//! - [`pool`]: the next snippet's container, created (never started) ahead of demand;
//! - [`orphans`]: the sweep of what crashes left;
//! - [`engine`]: the Engine API with a timeout on every call; [`error`]: what can go wrong,
//!   each variant naming its step.

pub mod config;
mod container;
mod engine;
mod error;
pub(crate) mod exec;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod guest;
mod identity;
mod lockdown;
mod module;
mod orphans;
mod pool;
mod preflight;
pub(crate) mod project;
mod readiness;
mod removal;
mod session;
pub(crate) mod settings;
mod smoke;

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use plimsoll::refusal::Refusal;
use plimsoll::tier::IsolationTier;

use super::{
    Description, Environment, Hold, ModulePlan, ModuleReport, ProjectPlan, ProjectReport, Provider,
    ProviderError, Resources, SnippetOutcome, SnippetRun, TierEvidence,
};
use crate::config::Config;
use config::{DockerConfig, SeccompSetting};
use container::{Context, Held, Prepare};
pub use error::DockerError;
use lockdown::Identity;
use readiness::{ProvenIds, Readiness};
use settings::Settings;

/// The provider id `Describe` and records name.
pub const ID: &str = "docker";

/// How often the background loop re-checks readiness and refills the pool.
const BACKGROUND_EVERY: Duration = Duration::from_secs(60);
/// The bound on one orphan sweep.
const SWEEP_BOUND: Duration = Duration::from_secs(30);
/// What the startup snippet prints.
const SMOKE_SNIPPET: &str = "console.log(\"plimsoll-snippet-ok\")";
/// How long the proof waits for its containers' removal (the daemon may exit next).
const FAILED_PROOF_CLEANUP: Duration = Duration::from_secs(35);
/// The startup snippet's budget.
const SMOKE_SNIPPET_TIMEOUT: Duration = Duration::from_secs(20);
/// The language probe on the project image: JavaScript required, Python optional.
const LANGUAGE_PROBE: &str = "node -e 'console.log(\"javascript\")' && { python3 -c 'print(\"python\")' 2>/dev/null || true; }";

/// The docker provider.
pub struct Docker {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Arc<Settings>,
    /// This daemon's id on its containers' labels.
    instance: String,
    readiness: Arc<Readiness>,
    held: Arc<Held>,
    /// What the language probe found on the project image.
    languages: RwLock<Vec<String>>,
    /// The models the module image's worker listed at the startup proof.
    models: RwLock<Option<Arc<module::catalogue::Catalogue>>>,
    /// The configured disk budget, as `Describe` states it.
    disk_mb: u32,
    /// The next snippet's container.
    pool: pool::Pool,
    /// The warm session pool (off unless `SANDBOX_SESSION_POOL` is above 0).
    session_pool: Arc<session::pool::SessionPool>,
    stop: tokio::sync::watch::Sender<bool>,
    background: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Docker {
    /// The provider for `docker`'s settings and the daemon's envelope in `config`; reads
    /// configuration only.
    pub fn new(docker: &DockerConfig, config: &Config) -> Result<Docker, DockerError> {
        let settings = Arc::new(Settings::new(docker, config.resources)?);
        let (stop, _) = tokio::sync::watch::channel(false);
        Ok(Docker {
            inner: Arc::new(Inner {
                readiness: Arc::new(Readiness::new(Arc::clone(&settings))),
                settings,
                instance: container::random_hex(),
                held: Arc::new(Held::default()),
                languages: RwLock::new(Vec::new()),
                models: RwLock::new(None),
                disk_mb: config.resources.disk_mb,
                pool: pool::Pool::default(),
                session_pool: Arc::default(),
                stop,
                background: Mutex::new(None),
            }),
        })
    }
}

impl Inner {
    fn context<'a>(&'a self, verified: &'a preflight::Verified) -> Context<'a> {
        Context {
            engine: &verified.engine,
            settings: &self.settings,
            seccomp: verified.seccomp.as_deref(),
            instance: &self.instance,
            held: &self.held,
        }
    }

    fn tier_evidence(&self, verified: &preflight::Verified) -> TierEvidence {
        let runtime = &verified.runtime;
        if runtime.runsc_verified {
            TierEvidence {
                tier: IsolationTier::Kernel,
                detail: format!(
                    "docker {} runs containers under gVisor: runtime runsc registered at {}",
                    verified.server_version,
                    runtime.path.as_deref().unwrap_or("?")
                ),
            }
        } else {
            TierEvidence {
                tier: IsolationTier::Container,
                detail: format!(
                    "docker {} runs containers under {}, which shares the host kernel",
                    verified.server_version, runtime.name
                ),
            }
        }
    }

    async fn sweep(&self, engine: &engine::Engine) {
        match tokio::time::timeout(
            SWEEP_BOUND,
            orphans::sweep(engine, &self.instance, &self.held),
        )
        .await
        {
            Ok(swept) if swept != orphans::Swept::default() => {
                tracing::info!(
                    removed = swept.removed,
                    failed = swept.failed,
                    directories = swept.directories,
                    "orphan sweep"
                );
            }
            Ok(_) => {}
            Err(_) => tracing::warn!("orphan sweep did not finish within {SWEEP_BOUND:?}"),
        }
    }

    /// Starts making the next snippet's container, unless one is waiting or being made.
    fn refill(self: &Arc<Self>, verified: &Arc<preflight::Verified>) {
        if !self.pool.begin_fill() {
            return;
        }
        let inner = Arc::clone(self);
        let verified = Arc::clone(verified);
        tokio::spawn(async move {
            let ctx = inner.context(&verified);
            let argv = snippet_argv();
            let shape = Prepare {
                image: &verified.snippet,
                argv: &argv,
                run_env: &[],
                image_env: true,
                work: false,
                socket: None,
                identity: Identity::Guest,
                role: "run",
                lifetime: pool::MAX_AGE
                    + settings::SNIPPET_MAX_TIMEOUT
                    + engine::START
                    + Duration::from_secs(1),
            };
            match container::prepare(&ctx, &shape).await {
                Ok(member) => inner.pool.put(member),
                Err(e) => {
                    tracing::debug!(error = %e, "could not make the next snippet container ahead");
                    inner.pool.fill_failed();
                }
            }
        });
    }

    /// Every minute: re-run preflight when the tier has fallen, and make the next snippet's
    /// container. (Orphans are swept from the daemon's own loop: [`Provider::sweep_orphans`].)
    async fn background(self: Arc<Self>) {
        let mut stop = self.stop.subscribe();
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(BACKGROUND_EVERY) => {}
            }
            self.pool.expire_stale();
            match self.readiness.check().await {
                Ok(verified) => self.refill(&verified),
                Err(e) => tracing::warn!(error = %e, "docker provider not ready"),
            }
        }
    }
}

impl Inner {
    /// The module image's models, once the proof listed them.
    fn models(&self) -> Option<Arc<module::catalogue::Catalogue>> {
        self.models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn not_ready(e: DockerError) -> ProviderError {
    ProviderError::Refused(Refusal::Environment(format!(
        "the docker provider is not ready ({e}); nothing ran"
    )))
}

#[async_trait]
impl Provider for Docker {
    async fn preflight(&self) -> Result<TierEvidence, ProviderError> {
        let verified = self.inner.readiness.check().await.map_err(|e| {
            ProviderError::infrastructure(DockerError::StartupPreflight(Box::new(e)))
        })?;
        Ok(self.inner.tier_evidence(&verified))
    }

    async fn prove(&self) -> Result<TierEvidence, ProviderError> {
        let proved = self.prove_once().await;
        if proved.is_err() {
            // The daemon exits next: let the probe containers' removals finish first.
            self.inner.held.settle(FAILED_PROOF_CLEANUP).await;
        }
        proved
    }

    async fn ready(&self) -> Result<(), String> {
        self.inner
            .readiness
            .check()
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn current_tier(&self) -> IsolationTier {
        self.inner.readiness.current_tier()
    }

    fn describe(&self) -> Description {
        let s = &self.inner.settings;
        let ids = self.inner.readiness.proven_ids().cloned();
        let languages = self
            .inner
            .languages
            .read()
            .map(|l| l.clone())
            .unwrap_or_default();
        // Modules run in the module image when one is configured (providers.md §8); like
        // projects, within the project timeouts. The wire has no field for the models it
        // holds: the startup log names them.
        let module = match (&s.module_image, &ids) {
            (Some(_), ids) => Environment {
                identity: ids
                    .as_ref()
                    .and_then(|i| i.module.clone())
                    .unwrap_or_default(),
                default_timeout_ms: duration_ms(project::DEFAULT_TIMEOUT),
                max_timeout_ms: duration_ms(project::MAX_TIMEOUT),
                software_identity: ids
                    .as_ref()
                    .map(|i| i.module_software.clone())
                    .unwrap_or_default(),
                languages: Vec::new(),
            },
            (None, _) => Environment::default(),
        };
        Description {
            sandbox: ID,
            // Snippets get the run's broker socket mounted (grants.md §3, docker row).
            supports_javascript_grants: true,
            javascript: Environment {
                identity: ids.as_ref().map(|i| i.snippet.clone()).unwrap_or_default(),
                default_timeout_ms: duration_ms(settings::SNIPPET_DEFAULT_TIMEOUT),
                max_timeout_ms: duration_ms(settings::SNIPPET_MAX_TIMEOUT),
                software_identity: ids
                    .as_ref()
                    .map(|i| i.snippet_software.clone())
                    .unwrap_or_default(),
                languages: vec!["javascript".to_owned()],
            },
            // Session calls run in the project image (providers.md §9).
            supports_sessions: true,
            session: Environment {
                identity: ids.as_ref().map(|i| i.project.clone()).unwrap_or_default(),
                default_timeout_ms: duration_ms(project::DEFAULT_TIMEOUT),
                max_timeout_ms: duration_ms(project::MAX_TIMEOUT),
                software_identity: ids
                    .as_ref()
                    .map(|i| i.project_software.clone())
                    .unwrap_or_default(),
                languages: languages.clone(),
            },
            supports_project: true,
            // Projects get the run's broker socket mounted and the client library preloaded
            // into every node a step starts (grants.md §3, docker row; project.rs).
            supports_project_grants: true,
            project: Environment {
                default_timeout_ms: duration_ms(project::DEFAULT_TIMEOUT),
                max_timeout_ms: duration_ms(project::MAX_TIMEOUT),
                software_identity: ids
                    .as_ref()
                    .map(|i| i.project_software.clone())
                    .unwrap_or_default(),
                identity: ids.map(|i| i.project).unwrap_or_default(),
                languages,
            },
            supports_module: s.module_image.is_some(),
            module,
            resources: Resources {
                memory_mb: s.memory_mb,
                cpus: s.cpus,
                pids: s.pids,
                disk_mb: self.inner.disk_mb,
            },
            ..Description::default()
        }
    }

    async fn run_snippet(&self, run: SnippetRun) -> Result<SnippetOutcome, ProviderError> {
        let SnippetRun {
            code,
            timeout,
            hold,
            grant,
        } = run;
        let inner = &self.inner;
        let verified = inner.readiness.check().await.map_err(not_ready)?;
        let timeout = timeout.min(settings::SNIPPET_MAX_TIMEOUT);
        // A granted snippet: its socket mounted, its variable set and the client library
        // before its code; a pooled container has none of them, so it gets a fresh one.
        let (code, grant_env) = granted_snippet(code, grant.as_deref());
        let socket = grant.as_deref().and_then(|g| g.socket());
        let claimed = match grant {
            Some(_) => None,
            None => inner
                .pool
                .claim(&verified.snippet.id, verified.seccomp.as_deref()),
        };
        let mut prepared = match claimed {
            Some(member) => member,
            None => {
                let argv = snippet_argv();
                let shape = Prepare {
                    image: &verified.snippet,
                    argv: &argv,
                    run_env: &grant_env,
                    image_env: true,
                    work: false,
                    socket,
                    identity: Identity::Guest,
                    role: "run",
                    lifetime: timeout + engine::START + Duration::from_secs(1),
                };
                container::prepare(&inner.context(&verified), &shape).await?
            }
        };
        // The slot goes with the container: it is freed when removal is done.
        prepared.keep_until_removed(hold);
        let finished = prepared
            .run(
                &verified.engine,
                code.into_bytes(),
                timeout,
                settings::OUTPUT_CAP,
                None,
            )
            .await;
        // The next snippet's container is made after this run, not during it: on a small
        // machine a create beside a start slows the start more than the create saves. Not
        // before the proof is complete: a daemon that then refuses to start leaves nothing.
        if !*inner.stop.borrow() && inner.readiness.proven_ids().is_some() {
            inner.refill(&verified);
        }
        let finished = finished?;
        Ok(SnippetOutcome {
            stdout: finished.stdout.0,
            stdout_truncated: finished.stdout.1,
            stderr: finished.stderr.0,
            stderr_truncated: finished.stderr.1,
            exit_code: finished.exit_code,
            timed_out: finished.timed_out,
            duration: finished.duration,
            environment: verified.snippet.id.clone(),
            software_identity: verified.snippet.software_identity(),
            instance: format!("docker-container:{}", finished.container_id),
        })
    }

    async fn run_project(&self, mut plan: ProjectPlan) -> Result<ProjectReport, ProviderError> {
        let inner = &self.inner;
        let verified = inner.readiness.check().await.map_err(not_ready)?;
        // The slot goes with the container: it is freed when removal is done.
        let hold = std::mem::take(&mut plan.hold);
        let ran = project::run(&inner.context(&verified), &verified.project, &plan, hold).await?;
        Ok(ProjectReport {
            result: ran.result,
            environment: verified.project.id.clone(),
            software_identity: verified.project.software_identity(),
            instance: format!("docker-container:{}", ran.container_id),
        })
    }

    async fn run_module(&self, plan: ModulePlan) -> Result<ModuleReport, ProviderError> {
        let inner = &self.inner;
        let (Some(_), Some(models)) = (&inner.settings.module_image, inner.models()) else {
            return Err(ProviderError::Refused(
                self.unsupported(plimsoll::payload::PayloadKind::Module),
            ));
        };
        let verified = inner.readiness.check().await.map_err(not_ready)?;
        let Some(image) = verified.module.as_ref() else {
            return Err(ProviderError::infrastructure(
                "preflight verified no module image though one is configured",
            ));
        };
        // The slot goes with the container: it is freed when removal is done.
        let ran = module::run(&inner.context(&verified), image, &models, plan).await?;
        Ok(ModuleReport {
            result: ran.result,
            duration: ran.duration,
            environment: image.id.clone(),
            software_identity: image.software_identity(),
            instance: format!("docker-container:{}", ran.container_id),
        })
    }

    async fn open_session(
        &self,
        open: super::SessionOpen,
    ) -> Result<super::OpenedSession, ProviderError> {
        session::open(&self.inner, open).await
    }

    async fn sweep_orphans(&self) {
        if let Some(engine) = self.inner.readiness.engine() {
            self.inner.sweep(engine).await;
        }
    }

    async fn start_session_pool(
        &self,
        size: u32,
        max_lifetime: Duration,
    ) -> Result<(), ProviderError> {
        let pool = Arc::clone(&self.inner.session_pool);
        pool.start(&self.inner, size, max_lifetime).await
    }

    fn session_pool(&self) -> Option<crate::provider::PoolStatus> {
        self.inner.session_pool.status()
    }

    async fn drain(&self, budget: Duration) {
        let inner = &self.inner;
        inner.stop.send_replace(true);
        inner.pool.close();
        inner.session_pool.drain(budget).await;
        let task = inner
            .background
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = task {
            task.abort();
        }
        let left = inner.held.settle(budget).await;
        if left > 0 {
            tracing::warn!(
                containers = left,
                "drain: containers still being removed; the orphan sweep of the next start removes them"
            );
        }
        if let Some(engine) = inner.readiness.engine() {
            inner.sweep(engine).await;
        }
    }
}

impl Docker {
    /// The startup proof (providers.md §5.12), in the spec's step order.
    async fn prove_once(&self) -> Result<TierEvidence, ProviderError> {
        let fail = ProviderError::from;
        let inner = &self.inner;
        // 1. Preflight, without the proof check (there is no proof yet).
        let verified = inner.readiness.check().await.map_err(fail)?;
        let evidence = inner.tier_evidence(&verified);
        if inner.settings.runtime.is_runsc()
            && inner.settings.seccomp != SeccompSetting::DockerDefault
        {
            tracing::info!(
                "SANDBOX_DOCKER_SECCOMP is ignored under runsc: gVisor filters the guest's syscalls itself"
            );
        }
        inner.sweep(&verified.engine).await;
        let ctx = inner.context(&verified);
        // 2–4. One probe container per image, each with the throwaway host socket.
        let socket = smoke::HostSocket::bind().map_err(fail)?;
        smoke::probe_image(&ctx, &verified.snippet, false, &socket)
            .await
            .map_err(fail)?;
        smoke::probe_image(&ctx, &verified.project, true, &socket)
            .await
            .map_err(fail)?;
        if let Some(module) = verified
            .module
            .as_ref()
            .filter(|m| m.id != verified.project.id)
        {
            smoke::probe_image(&ctx, module, true, &socket)
                .await
                .map_err(fail)?;
        }
        drop(socket);
        // 8. Under runsc, evidence of gVisor: a live sandbox's host process is the runsc
        //    binary, its host cgroup carries the host pids limit, its guest another kernel.
        if inner.settings.runtime.is_runsc() {
            smoke::prove_gvisor(&ctx, &verified.snippet, verified.runtime.path.as_deref())
                .await
                .map_err(fail)?;
        }
        // 7. The languages of the project image.
        let languages = self.languages(&ctx, &verified).await.map_err(fail)?;
        *inner.languages.write().unwrap_or_else(|e| e.into_inner()) = languages;
        // 5 and 7 for the module image: its runner is not inspectable, its worker lists its
        // models, and one model runs through exactly the module run path.
        if let Some(image) = &verified.module {
            let models = self.models(&ctx, image).await.map_err(fail)?;
            *inner.models.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(models));
            self.prove_module_run().await?;
        }
        // 6. A real snippet through exactly the run path.
        let out = self
            .run_snippet(SnippetRun {
                code: SMOKE_SNIPPET.to_owned(),
                timeout: SMOKE_SNIPPET_TIMEOUT,
                hold: Hold::default(),
                grant: None,
            })
            .await?;
        if out.exit_code != 0 || out.timed_out || out.stdout != b"plimsoll-snippet-ok\n" {
            return Err(fail(DockerError::Smoke {
                check: "snippet",
                detail: format!(
                    "exit {}, timed out {}, stdout {:?}, stderr {:?}",
                    out.exit_code,
                    out.timed_out,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            }));
        }
        // 9. Record what was proven; from now on preflight also checks the ids.
        inner
            .readiness
            .set_proven(ProvenIds::of(&verified), evidence.tier);
        for image in [&verified.snippet, &verified.project]
            .into_iter()
            .chain(verified.module.as_ref())
        {
            if let Err(why) = &image.software {
                tracing::warn!(
                    image = %image.reference,
                    "no software identity: {why}; runs with a software rule are refused"
                );
            }
        }
        if evidence.tier == IsolationTier::Container {
            tracing::warn!(
                runtime = %verified.runtime.name,
                "docker provider under runc: containers share the host kernel; this is NOT a hostile-code boundary (set SANDBOX_DOCKER_RUNTIME=runsc for gVisor)"
            );
        }
        tracing::info!(
            snippet_image = %verified.snippet.id,
            snippet_software = %verified.snippet.software_identity(),
            project_image = %verified.project.id,
            project_software = %verified.project.software_identity(),
            module_image = verified.module.as_ref().map(|m| m.id.as_str()),
            module_software = verified.module.as_ref().map(|m| m.software_identity()),
            models = inner.models().map(|m| m.ids().collect::<Vec<_>>().join(",")),
            runtime = %verified.runtime.name,
            instance = %inner.instance,
            "docker provider proven"
        );
        // Nothing of the proof outlives it (the daemon may still refuse to start, at its floor).
        inner.held.settle(FAILED_PROOF_CLEANUP).await;
        let task = tokio::spawn(Arc::clone(inner).background());
        *inner.background.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        Ok(evidence)
    }

    /// A step that fails when it can open the runner's `/proc` entries (§5.12 step 5, from
    /// the outside; the runner proves it from the inside on every run).
    fn inspect_step(&self) -> String {
        let entries = if self.inner.settings.runtime.is_runsc() {
            "mem"
        } else {
            "mem fd/0 fd/1 environ"
        };
        format!(
            "for f in {entries}; do if (: <\"/proc/$PLIMSOLL_RUNNER_PID/$f\") 2>/dev/null; then echo \"runner $f is readable\"; exit 1; fi; done"
        )
    }

    /// §5.12 steps 5 and 7 through the project run path: the runner proves it is not
    /// inspectable (on every run), a first step proves it again from the outside, and a
    /// second step names the languages (JavaScript required, Python optional).
    async fn languages(
        &self,
        ctx: &Context<'_>,
        verified: &preflight::Verified,
    ) -> Result<Vec<String>, DockerError> {
        let plan = ProjectPlan {
            files: Vec::new(),
            steps: vec![self.inspect_step(), LANGUAGE_PROBE.to_owned()],
            artifacts: Vec::new(),
            timeout: Duration::from_secs(30),
            hold: Hold::default(),
            grant: None,
        };
        let ran = project::run(ctx, &verified.project, &plan, Hold::default()).await?;
        let result = &ran.result;
        let smoke = |detail: String| DockerError::Smoke {
            check: "project runner",
            detail: format!("the project image {}: {detail}", verified.project.reference),
        };
        if result.outcome != plimsoll::wire::ProjectOutcome::PROJECT_OUTCOME_COMPLETED
            || result.steps.len() != 2
            || result.steps.iter().any(|s| s.exit_code != 0)
        {
            return Err(smoke(format!(
                "outcome {:?} ({}), steps {:?}",
                result.outcome,
                result.outcome_detail,
                result
                    .steps
                    .iter()
                    .map(|s| (s.exit_code, String::from_utf8_lossy(&s.stdout)))
                    .collect::<Vec<_>>()
            )));
        }
        let stdout = String::from_utf8_lossy(&result.steps[1].stdout);
        let languages: Vec<String> = stdout
            .lines()
            .filter(|l| matches!(*l, "javascript" | "python"))
            .map(str::to_owned)
            .collect();
        if languages.first().map(String::as_str) != Some("javascript") {
            return Err(smoke(format!("the language probe answered {stdout:?}")));
        }
        Ok(languages)
    }
}

/// A granted snippet, one-shot or in a session (grants.md §3, docker row): the client
/// library goes before its code and its socket's path into its environment. Without a grant,
/// the code as is and nothing added.
fn granted_snippet(
    code: String,
    grant: Option<&crate::grant::GuestGrant>,
) -> (String, Vec<String>) {
    match grant {
        Some(g) => (
            format!("{}{code}", crate::grant::host_client::node(g)),
            vec![format!(
                "{}={}",
                crate::grant::HOST_API_SOCKET,
                lockdown::GUEST_SOCKET
            )],
        ),
        None => (code, Vec::new()),
    }
}

/// A snippet's command: node reads the code on stdin.
fn snippet_argv() -> Vec<String> {
    vec!["node".to_owned(), "-".to_owned()]
}

fn duration_ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}
