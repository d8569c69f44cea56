//! The `Provider` trait: the only way the daemon reaches a sandbox.
//!
//! One provider serves a daemon, chosen by the operator at startup
//! (`SANDBOX_PROVIDER`). Nothing ever falls through to another provider: a
//! provider that cannot run a payload refuses it.
//!
//! A provider's life, in the order the daemon calls it:
//! 1. [`Provider::preflight`] — cheap checks of its configuration and the
//!    evidence for its tier (no sandbox is started);
//! 2. [`Provider::prove`] — the startup proof: a real run through exactly the
//!    run path; the daemon refuses to start if it fails;
//! 3. [`Provider::describe`], [`Provider::current_tier`], [`Provider::ready`]
//!    and the `run_*` methods while serving, and [`Provider::sweep_orphans`] from the
//!    daemon's background loop;
//! 4. [`Provider::drain`] on shutdown.
//!
//! Before a provider exists, its settings ([`config::ProviderConfig`]) say what it is: how its
//! variables are read, which tier it could reach, its hardened-mode rules and how it is built.

pub mod config;
pub mod disabled;
#[cfg(feature = "docker")]
pub mod docker;
#[cfg(feature = "dockercloud")]
pub mod dockercloud;
#[cfg(feature = "e2b")]
pub mod e2b;
#[cfg(feature = "docker")]
pub mod guest;
#[cfg(feature = "openshell")]
pub mod openshell;
#[cfg(any(feature = "e2b", feature = "dockercloud"))]
pub mod remote;
pub mod session;
#[cfg(any(feature = "e2b", feature = "openshell", feature = "dockercloud"))]
pub mod tracked;
#[cfg(feature = "wasm")]
pub mod wasm;

use std::sync::Arc;
use std::time::Duration;

use crate::admission::Permit;
use crate::admission::paid::{Paid, PaidDay};
use crate::grant::Delivery;
use async_trait::async_trait;
use plimsoll::payload::PayloadKind;
use plimsoll::refusal::Refusal;
use plimsoll::tier::IsolationTier;
use plimsoll::wire::{ModuleResult, ModuleRow, ProjectFile, ProjectResult};

/// The evidence behind a tier: what was checked to paint it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierEvidence {
    /// The tier the evidence supports.
    pub tier: IsolationTier,
    /// One sentence on what was checked, for the log.
    pub detail: String,
}

/// What one payload kind runs on, as `Describe` states it, and the timeouts it allows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    /// The content-addressed outer artifact (never a tag), or "".
    pub identity: String,
    /// The timeout a run of this kind gets when the request states none, in ms.
    pub default_timeout_ms: u32,
    /// The provider's ceiling on a run's timeout, in ms; 0 = unsupported.
    pub max_timeout_ms: u32,
    /// The selected executable manifest and platform, or "".
    pub software_identity: String,
    /// The languages proven at startup.
    pub languages: Vec<String>,
}

impl Environment {
    /// The timeout a run of this kind gets for the request's `timeout_ms`: the default for
    /// zero or a negative value, otherwise the request clamped to the ceiling and to the
    /// daemon's hard ceiling (wire.md §6).
    pub fn timeout(&self, requested_ms: i32) -> Duration {
        let ms = plimsoll::validate::effective_timeout_ms(
            requested_ms,
            self.default_timeout_ms,
            self.max_timeout_ms,
        );
        Duration::from_millis(u64::from(ms))
    }
}

pub use crate::config::Resources;
pub use session::{
    CellCall, CellOutcome, OpenedSession, PoolStatus, SessionFault, SessionOpen, SessionSandbox,
};

/// Everything `Describe` says about the provider except its current tier and
/// the daemon's session settings, which the daemon adds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Description {
    /// Provider id: `disabled`, `wasm`, `docker`, `e2b`, `dockercloud`, `openshell`.
    pub sandbox: &'static str,
    /// Whether projects can run (structurally).
    pub supports_project: bool,
    /// Whether modules can run (structurally).
    pub supports_module: bool,
    /// Whether a credential-safe grant path exists for snippets.
    pub supports_javascript_grants: bool,
    /// Whether a credential-safe grant path exists for projects.
    pub supports_project_grants: bool,
    /// Whether the provider can keep sessions.
    pub supports_sessions: bool,
    /// Where snippets run.
    pub javascript: Environment,
    /// Where projects run.
    pub project: Environment,
    /// Where modules run.
    pub module: Environment,
    /// Where session calls run.
    pub session: Environment,
    /// The operator's envelope.
    pub resources: Resources,
    /// The verified sandbox-policy digest, or "".
    pub policy: String,
}

impl Description {
    /// Where a payload of `kind` runs (a cell runs in a session).
    pub fn environment(&self, kind: PayloadKind) -> &Environment {
        match kind {
            PayloadKind::Javascript => &self.javascript,
            PayloadKind::Project => &self.project,
            PayloadKind::Module => &self.module,
            PayloadKind::Cell => &self.session,
        }
    }

    /// Whether a payload of `kind` may name a grant here: a credential-safe path exists for
    /// it (never for modules and cells).
    pub fn supports_grants(&self, kind: PayloadKind) -> bool {
        match kind {
            PayloadKind::Javascript => self.supports_javascript_grants,
            PayloadKind::Project => self.supports_project_grants,
            PayloadKind::Module | PayloadKind::Cell => false,
        }
    }
}

/// A run's admission slot, handed to the provider with the run.
///
/// The provider drops it only once the run's sandbox is gone — after the
/// answer, when removal happens later — so admission never counts a sandbox
/// that still exists as free (providers.md §10.1). Dropping it early
/// over-admits; holding it forever leaks a slot.
#[derive(Default)]
pub struct Hold {
    slot: Option<Box<dyn Send + Sync + 'static>>,
    /// The run's paid reservation (metered providers), also inside the slot's permit.
    paid: Option<Arc<Paid>>,
}

impl Hold {
    /// Holds `slot` until this value is dropped.
    pub fn new(slot: impl Send + Sync + 'static) -> Hold {
        Hold {
            slot: Some(Box::new(slot)),
            paid: None,
        }
    }

    /// Holds an admitted run's permit, its paid reservation with it.
    pub fn admitted(permit: Permit) -> Hold {
        Hold {
            paid: permit.paid(),
            ..Hold::new(permit)
        }
    }

    /// Holds only a paid reservation (a session's VM: its slot is the session table's).
    pub fn paid_only(paid: Arc<Paid>) -> Hold {
        Hold {
            slot: Some(Box::new(paid.clone())),
            paid: Some(paid),
        }
    }

    /// Whether a slot is held.
    pub fn is_held(&self) -> bool {
        self.slot.is_some()
    }

    /// The paid reservation, for the provider to forfeit when a create's fate is unknown
    /// (the vendor may bill a VM nobody can name).
    pub fn paid(&self) -> Option<Arc<Paid>> {
        self.paid.clone()
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.slot.is_some() {
            "Hold(slot)"
        } else {
            "Hold(none)"
        })
    }
}

/// One JavaScript snippet to run.
#[derive(Debug)]
pub struct SnippetRun {
    /// The code, already validated (non-empty, no NUL, ≤ 256 KiB).
    pub code: String,
    /// The effective timeout (defaulted and clamped).
    pub timeout: Duration,
    /// The admission slot: keep it until the sandbox is gone.
    pub hold: Hold,
    /// The run's open grant, when it named a profile: the socket the guest may call and
    /// what its client library needs. The daemon closes it once the provider returns.
    pub grant: Option<std::sync::Arc<crate::grant::GuestGrant>>,
}

/// What a snippet run produced. A non-zero exit is a result, never an error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnippetOutcome {
    /// Standard output as the guest wrote it (up to the cap).
    pub stdout: Vec<u8>,
    /// Standard error as the guest wrote it (up to the cap).
    pub stderr: Vec<u8>,
    /// The guest's exit code; 124 when the deadline ended it.
    pub exit_code: i32,
    /// Whether the deadline ended it.
    pub timed_out: bool,
    /// Whether stdout was cut at the cap.
    pub stdout_truncated: bool,
    /// Whether stderr was cut at the cap.
    pub stderr_truncated: bool,
    /// The provider's own measure of the run.
    pub duration: Duration,
    /// The outer artifact actually selected (the record's `environment`).
    pub environment: String,
    /// The selected executable manifest, or "".
    pub software_identity: String,
    /// The sandbox instance that ran it, as a typed reference, or "".
    pub instance: String,
}

impl SnippetOutcome {
    /// The guest's part of the outcome as the wire's result, taken out of `self` (the
    /// evidence fields stay for the response around it).
    pub fn take_result(&mut self) -> plimsoll::wire::JavaScriptResult {
        plimsoll::wire::JavaScriptResult {
            stdout: std::mem::take(&mut self.stdout),
            stderr: std::mem::take(&mut self.stderr),
            exit_code: self.exit_code,
            timed_out: self.timed_out,
            stdout_truncated: self.stdout_truncated,
            stderr_truncated: self.stderr_truncated,
            ..Default::default()
        }
    }
}

/// One project to run: files written under the work directory, then the steps in order,
/// then the artifacts read back (wire.md §6.5, providers.md §5.9).
#[derive(Debug)]
pub struct ProjectPlan {
    /// The files, already validated (clean relative paths, UTF-8, within the limits).
    pub files: Vec<ProjectFile>,
    /// The shell commands, 1–20, each ≤ 16 KiB.
    pub steps: Vec<String>,
    /// The artifact paths to bring back, ≤ 100.
    pub artifacts: Vec<String>,
    /// The effective timeout of the whole plan (defaulted and clamped).
    pub timeout: Duration,
    /// The admission slot: keep it until the sandbox is gone.
    pub hold: Hold,
    /// The run's open grant, when it named a profile (only reaches a provider whose
    /// `Describe` states `supports_project_grants`): mount `socket` and preload
    /// [`crate::grant::host_client::node`] as the plan's `hostSDK`.
    pub grant: Option<std::sync::Arc<crate::grant::GuestGrant>>,
}

/// What a project run produced: a typed outcome, never an error, once the sandbox started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProjectReport {
    /// The result as it goes on the wire (outcome, detail, steps, artifacts).
    pub result: ProjectResult,
    /// The outer artifact actually selected (the record's `environment`).
    pub environment: String,
    /// The selected executable manifest, or "".
    pub software_identity: String,
    /// The sandbox instance that ran it, as a typed reference, or "".
    pub instance: String,
}

/// The cause of an infrastructure failure, kept typed (a `DockerError`, a `WasmError`, …) so
/// the log can name it and a caller can inspect it.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// One module run: a model from the provider's module environment, stepped from 0 to
/// `end_time` once per parameter row (wire.md §6.5, providers.md §8).
#[derive(Debug)]
pub struct ModulePlan {
    /// The model id, already validated (`[A-Za-z0-9][A-Za-z0-9._-]{0,63}`).
    pub model: String,
    /// The parameter rows, already validated: 1–100 000 rows of one width (1–64), every value
    /// finite, and the wire's worst-case result size within 8 MiB.
    pub rows: Vec<ModuleRow>,
    /// Where each row's run ends (finite, above 0).
    pub end_time: f64,
    /// The communication step (finite, above 0, `end_time / step` ≤ 1 000 000).
    pub step: f64,
    /// The effective timeout of the whole run (defaulted and clamped).
    pub timeout: Duration,
    /// The admission slot: keep it until the sandbox is gone.
    pub hold: Hold,
}

/// What a module run produced: a typed outcome, never an error, once the sandbox started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModuleReport {
    /// The result as it goes on the wire (runs, width, outcome, detail, output).
    pub result: ModuleResult,
    /// The provider's own measure of the run.
    pub duration: Duration,
    /// The outer artifact actually selected (the record's `environment`).
    pub environment: String,
    /// The selected executable manifest, or "".
    pub software_identity: String,
    /// The sandbox instance that ran it, as a typed reference, or "".
    pub instance: String,
}

/// Why a provider could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The request was refused before anything ran (it carries a
    /// `NotDispatched` reason on the wire).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// Something failed after the run may have started: the caller gets an
    /// unmarked `internal` error and the detail goes only to the log.
    #[error(transparent)]
    Infrastructure(Cause),
}

impl ProviderError {
    /// An infrastructure failure caused by `cause` (a typed error, or a sentence).
    pub fn infrastructure(cause: impl Into<Cause>) -> ProviderError {
        ProviderError::Infrastructure(cause.into())
    }
}

/// A sandbox provider. See the module docs for the order of calls.
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// Configuration checks and the evidence for the tier; starts nothing.
    async fn preflight(&self) -> Result<TierEvidence, ProviderError>;

    /// The startup proof: a real run through exactly the run path. The
    /// daemon serves only after it succeeds.
    async fn prove(&self) -> Result<TierEvidence, ProviderError>;

    /// The bounded, cheap readiness check behind `/readyz`; never starts a
    /// sandbox. The error is for the log only.
    async fn ready(&self) -> Result<(), String>;

    /// The tier right now; it may fall below what startup proved.
    fn current_tier(&self) -> IsolationTier;

    /// What `Describe` states about this provider.
    fn describe(&self) -> Description;

    /// How this provider's guests reach a grant (grants.md §3): a Unix socket by default
    /// (mounted, relayed or called from the host); a provider whose sandboxes can only
    /// reach the network (e2b, dockercloud) answers [`Delivery::Guard`].
    fn grant_delivery(&self) -> Delivery {
        Delivery::Socket
    }

    /// Whether each granted session call needs a guard token of its own (grants.md §6.7):
    /// a provider that puts the guard rule on per call (e2b's `E2B_SESSION_GRANTS=call`)
    /// names the call's token in it, so no token outlives its call.
    fn session_call_tokens(&self) -> bool {
        false
    }

    /// A metered provider's daemon-wide paid day (`SANDBOX_PAID_SECONDS_PER_DAY`), which
    /// admission reserves against and the provider charges its own startup VMs to; `None`
    /// for a provider that is not metered.
    fn paid_day(&self) -> Option<Arc<PaidDay>> {
        None
    }

    /// The refusal for a payload kind this provider cannot run.
    fn unsupported(&self, kind: PayloadKind) -> Refusal {
        Refusal::Unsupported(format!(
            "the {} provider cannot run a {} payload; nothing ran",
            self.describe().sandbox,
            kind.as_str()
        ))
    }

    /// Runs a JavaScript snippet in a fresh sandbox.
    async fn run_snippet(&self, run: SnippetRun) -> Result<SnippetOutcome, ProviderError>;

    /// Runs a project in a fresh sandbox. Once the sandbox started, every ending (a failing
    /// step, a timeout, a runner that did not report) is a [`ProjectReport`] with its
    /// outcome; an error means nothing is known about the run.
    ///
    /// By default a provider refuses projects ([`Provider::unsupported`]): nothing runs.
    async fn run_project(&self, plan: ProjectPlan) -> Result<ProjectReport, ProviderError> {
        let _ = plan;
        Err(ProviderError::Refused(
            self.unsupported(PayloadKind::Project),
        ))
    }

    /// Runs a module in a fresh sandbox. As for projects, every ending after the sandbox
    /// started is a [`ModuleReport`] with its outcome; a refusal ran nothing.
    ///
    /// By default a provider refuses modules ([`Provider::unsupported`]): nothing runs.
    async fn run_module(&self, plan: ModulePlan) -> Result<ModuleReport, ProviderError> {
        let _ = plan;
        Err(ProviderError::Refused(
            self.unsupported(PayloadKind::Module),
        ))
    }

    /// Opens a session sandbox (providers.md §9.1): created, verified and baselined before
    /// it is handed over. By default a provider keeps no sessions: nothing is started.
    async fn open_session(&self, open: SessionOpen) -> Result<OpenedSession, ProviderError> {
        let _ = open;
        Err(ProviderError::Refused(Refusal::Unsupported(format!(
            "sessions are off: the {} provider keeps no sessions; nothing ran",
            self.describe().sandbox
        ))))
    }

    /// Starts the warm session pool of `size` members (providers.md §9.8), each good for
    /// sessions of up to `max_lifetime`: the first member is made before this returns (an
    /// error fails the startup), a filler makes the rest. Only a provider whose settings
    /// keep a pool is ever asked (`keeps_session_pool`).
    async fn start_session_pool(
        &self,
        size: u32,
        max_lifetime: Duration,
    ) -> Result<(), ProviderError> {
        let _ = (size, max_lifetime);
        Err(ProviderError::Refused(Refusal::Unsupported(format!(
            "the {} provider keeps no warm session pool",
            self.describe().sandbox
        ))))
    }

    /// The warm session pool as it is now, when one runs.
    fn session_pool(&self) -> Option<PoolStatus> {
        None
    }

    /// Removes what crashes left (providers.md §5.13): sandboxes this provider started that
    /// no run holds any more, a dead daemon's sandboxes past their grace. The daemon calls
    /// it every minute from its background loop, after the startup proof; it must bound its
    /// own time and never touch a sandbox a run or session still holds. Nothing by default.
    async fn sweep_orphans(&self) {}

    /// Ends in-flight work within `budget` at shutdown.
    async fn drain(&self, budget: Duration) {
        let _ = budget;
    }
}
