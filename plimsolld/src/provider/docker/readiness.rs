//! Preflight's cache and the tier it keeps (providers.md §5.11).
//!
//! - A success is reused for 5 s; during that time no docker call is made.
//! - One refresh at a time. A caller that finds one under way waits up to 2 s and takes its
//!   published result (success or failure); only then does it fail ("preflight is already in
//!   progress"). Failing fast on contention loses runs at every cache expiry.
//! - The refresh runs in its own task, bounded to 10 s, so a caller that goes away (a client
//!   hanging up on `/readyz`) cannot cancel it halfway.
//! - After the startup proof, every refresh also checks that each image reference still names
//!   the id that was proven, with the software identity that was proven (`Describe` states it
//!   and rules are checked against it, so a run must never state another). A moved tag makes
//!   the provider not ready and refuses runs with reason `environment` until a restart proves
//!   the new image; the tier is kept. Any other failure drops the current tier to `none` until
//!   a refresh succeeds.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use plimsoll::tier::IsolationTier;
use tokio::sync::OnceCell;

use super::DockerError;
use super::engine::Engine;
use super::preflight::{self, Verified};
use super::settings::Settings;

/// How long a success is reused.
pub const CACHE: Duration = Duration::from_secs(5);
/// How long a caller waits for another caller's refresh.
const CONTENDED_WAIT: Duration = Duration::from_secs(2);
/// How long one refresh may take.
const PROBE_BOUND: Duration = Duration::from_secs(10);

const STATE_UNKNOWN: u8 = 0;
const STATE_READY: u8 = 1;
const STATE_MOVED: u8 = 2;
const STATE_FAILED: u8 = 3;

#[derive(Clone)]
struct Cached {
    at: Instant,
    result: Result<Arc<Verified>, String>,
}

/// The proven image ids (and their software identities) a later refresh must still find.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvenIds {
    /// Snippet image id.
    pub snippet: String,
    /// Project image id.
    pub project: String,
    /// The snippet image's software identity, or "".
    pub snippet_software: String,
    /// The project image's software identity, or "".
    pub project_software: String,
    /// The module image's id, when one is configured.
    pub module: Option<String>,
    /// The module image's software identity, or "".
    pub module_software: String,
}

impl ProvenIds {
    /// What the startup proof proved of `verified`.
    pub fn of(verified: &Verified) -> ProvenIds {
        ProvenIds {
            snippet: verified.snippet.id.clone(),
            project: verified.project.id.clone(),
            snippet_software: verified.snippet.software_identity(),
            project_software: verified.project.software_identity(),
            module: verified.module.as_ref().map(|m| m.id.clone()),
            module_software: verified
                .module
                .as_ref()
                .map(|m| m.software_identity())
                .unwrap_or_default(),
        }
    }
}

/// Preflight's cache, the proven state and the resulting tier.
pub struct Readiness {
    settings: Arc<Settings>,
    engine: OnceCell<Engine>,
    cache: Mutex<Option<Cached>>,
    refresh: tokio::sync::Mutex<()>,
    proven: OnceLock<(ProvenIds, IsolationTier)>,
    state: AtomicU8,
}

impl Readiness {
    /// A cache with nothing verified yet.
    pub fn new(settings: Arc<Settings>) -> Readiness {
        Readiness {
            settings,
            engine: OnceCell::new(),
            cache: Mutex::new(None),
            refresh: tokio::sync::Mutex::new(()),
            proven: OnceLock::new(),
            state: AtomicU8::new(STATE_UNKNOWN),
        }
    }

    fn cached(&self) -> Option<Cached> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The verified state, from the cache when a success is under 5 s old.
    pub async fn check(self: &Arc<Self>) -> Result<Arc<Verified>, DockerError> {
        let asked = Instant::now();
        if let Some(c) = self.cached()
            && c.at.elapsed() < CACHE
            && let Ok(v) = &c.result
        {
            return Ok(Arc::clone(v));
        }
        let guard = match self.refresh.try_lock() {
            Ok(guard) => guard,
            Err(_) => {
                let Ok(guard) = tokio::time::timeout(CONTENDED_WAIT, self.refresh.lock()).await
                else {
                    return Err(DockerError::PreflightBusy);
                };
                // The holder published while we waited: take its answer.
                if let Some(c) = self.cached()
                    && c.at >= asked
                {
                    return c.result.map_err(DockerError::Preflight);
                }
                guard
            }
        };
        let this = Arc::clone(self);
        let probe = tokio::spawn(async move {
            let result = match tokio::time::timeout(PROBE_BOUND, this.probe()).await {
                Ok(result) => result,
                Err(_) => Err(DockerError::Timeout {
                    call: "preflight",
                    budget: PROBE_BOUND,
                }),
            };
            this.publish(result)
        });
        let result = match probe.await {
            Ok(result) => result,
            Err(join) => Err(DockerError::Preflight(format!(
                "preflight task failed: {join}"
            ))),
        };
        drop(guard);
        result
    }

    async fn probe(&self) -> Result<Verified, DockerError> {
        let engine = self
            .engine
            .get_or_try_init(|| Engine::connect(&self.settings.socket))
            .await?;
        let verified = preflight::run(&self.settings, engine).await?;
        // 13. The proof check, once there is a proof.
        if let Some((ids, _)) = self.proven.get() {
            let now = ProvenIds::of(&verified);
            let module = match (&verified.module, &ids.module, &now.module) {
                (Some(image), Some(proven), Some(found)) => vec![
                    ("module", &image.reference, proven, found),
                    (
                        "module",
                        &image.reference,
                        &ids.module_software,
                        &now.module_software,
                    ),
                ],
                _ => Vec::new(),
            };
            let checks = [
                (
                    "snippet",
                    &verified.snippet.reference,
                    &ids.snippet,
                    &now.snippet,
                ),
                (
                    "project",
                    &verified.project.reference,
                    &ids.project,
                    &now.project,
                ),
                (
                    "snippet",
                    &verified.snippet.reference,
                    &ids.snippet_software,
                    &now.snippet_software,
                ),
                (
                    "project",
                    &verified.project.reference,
                    &ids.project_software,
                    &now.project_software,
                ),
            ];
            for (what, reference, proven, found) in checks.into_iter().chain(module) {
                if proven != found {
                    return Err(DockerError::ImageMoved {
                        what,
                        reference: reference.clone(),
                        proven: shown(proven),
                        now: shown(found),
                    });
                }
            }
        }
        Ok(verified)
    }

    fn publish(&self, result: Result<Verified, DockerError>) -> Result<Arc<Verified>, DockerError> {
        let state = match &result {
            Ok(_) => STATE_READY,
            Err(DockerError::ImageMoved { .. }) => STATE_MOVED,
            Err(_) => STATE_FAILED,
        };
        self.state.store(state, Ordering::SeqCst);
        let result = result.map(Arc::new);
        let cached = Cached {
            at: Instant::now(),
            result: result.as_ref().map(Arc::clone).map_err(ToString::to_string),
        };
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = Some(cached);
        result
    }

    /// The last verified state without a new preflight, while the last preflight succeeded
    /// (a warm pool claim reads it, providers.md §9.8; the background loop keeps it fresh).
    pub fn current(&self) -> Option<Arc<Verified>> {
        if self.state.load(Ordering::SeqCst) != STATE_READY {
            return None;
        }
        self.cached().and_then(|c| c.result.ok())
    }

    /// Records what the startup proof proved. Called once.
    pub fn set_proven(&self, ids: ProvenIds, tier: IsolationTier) {
        let _ = self.proven.set((ids, tier));
    }

    /// The ids the startup proof proved, once it has.
    pub fn proven_ids(&self) -> Option<&ProvenIds> {
        self.proven.get().map(|(ids, _)| ids)
    }

    /// The tier right now: the proven one while preflight holds (or only a tag moved), `none`
    /// before the proof or while docker, the runtime or an image cannot be verified.
    pub fn current_tier(&self) -> IsolationTier {
        let Some((_, tier)) = self.proven.get() else {
            return IsolationTier::None;
        };
        match self.state.load(Ordering::SeqCst) {
            STATE_READY | STATE_MOVED => *tier,
            _ => IsolationTier::None,
        }
    }

    /// The connected engine, once a preflight has connected.
    pub fn engine(&self) -> Option<&Engine> {
        self.engine.get()
    }
}

/// An id or identity for the log; an empty identity reads as such.
fn shown(value: &str) -> String {
    if value.is_empty() {
        "no software identity".to_owned()
    } else {
        value.to_owned()
    }
}
