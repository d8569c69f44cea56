//! The `wasm` provider: JavaScript snippets in QuickJS compiled to WebAssembly, run by
//! wasmtime inside plimsolld (providers.md §3). Tier `process`.
//!
//! The guest (`wasm-guest/`, built by `build.rs`) is embedded in the binary and named by
//! the SHA-256 of its bytes: `quickjs-wasm:sha256:<hex>`, which `Describe` states and every
//! record carries as both the environment identity (the outer artifact) and the software
//! identity (the executable a caller's software rule names): here the module is both, and
//! its digest is a content address no other build can state. At startup, [`Provider::preflight`]
//! compiles it once (or loads the cached artifact, see [`cache`]) into an engine with
//! epoch interruption, and [`Provider::prove`] runs `console.log(6*7)` through exactly the
//! run path. Each snippet then gets a fresh store and instance on a blocking thread, so a
//! long guest never holds up the async reactor and concurrent runs use every core.
//!
//! What a run gets and what bounds it:
//! - memory: the guest's linear memory is capped by wasmtime ([`limits::MemoryCap`]) at
//!   256 MiB, or `SANDBOX_MEMORY_MB` (clamped to 4 GiB); growth past it fails inside the
//!   guest, which reports it as an error;
//! - time: the request's timeout (default 5 s, at most 30 s), checked on every epoch tick
//!   (10 ms); a run at its deadline ends with exit 124 and `timed_out`, never before it;
//! - output: 64 KiB kept per stream, the rest dropped with `*_truncated` set;
//! - no files, environment, arguments, sockets or clocks beyond WASI's defaults; a trap
//!   (a stack overflow, an abort) ends as exit 134.
//!
//! A granted snippet (grants.md §3, wasm row) gets the host client library as a prelude
//! (sent before the code, after one NUL byte, which a snippet never holds) and a
//! `coderunner.host_call` that relays to the run's broker socket ([`host_call`]); any
//! other run's `host_call` answers an error status and contacts nothing.
//!
//! Projects, modules and sessions are not supported: the service refuses them before
//! dispatch.

pub mod cache;
mod config;
pub mod engine;
pub mod host_call;
pub mod limits;
pub mod output;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use plimsoll::tier::IsolationTier;
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use super::{
    Description, Environment, Hold, Provider, ProviderError, Resources, SnippetOutcome, SnippetRun,
    TierEvidence,
};
use crate::config::Config;
pub use config::WasmConfig;
use engine::Prepared;

/// The provider id `Describe` and records name.
pub const ID: &str = "wasm";
/// The guest module: QuickJS for `wasm32-wasip1`, built by `build.rs`.
pub static GUEST: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/wasm-guest.wasm"));
/// The provider's ceiling on a run's timeout.
pub const MAX_TIMEOUT_MS: u32 = 30_000;
/// The timeout a snippet gets when the request states none (providers.md §3.3).
pub const DEFAULT_TIMEOUT_MS: u32 = 5_000;
/// The startup proof's snippet and what it must print.
const PROOF_CODE: &str = "console.log(6*7)";
const PROOF_STDOUT: &[u8] = b"42\n";
/// The startup proof's deadline: generous, since a debug build's first run is slow.
const PROOF_TIMEOUT: Duration = Duration::from_secs(20);

/// Why the wasm provider could not prepare or run.
#[derive(Debug, thiserror::Error)]
pub enum WasmError {
    /// The wasmtime engine could not be configured.
    #[error("cannot create the wasmtime engine: {0}")]
    Engine(String),
    /// The guest module did not compile.
    #[error("cannot compile the wasm guest: {0}")]
    Compile(String),
    /// The guest's imports could not be linked to WASI.
    #[error("cannot link the wasm guest to WASI: {0}")]
    Link(String),
    /// The epoch ticker thread could not start.
    #[error("cannot start the wasm epoch ticker: {0}")]
    Ticker(#[source] std::io::Error),
    /// The engine failed a run for a reason that is not the guest's doing.
    #[error("the wasm engine failed the run: {0}")]
    Run(String),
    /// The thread running the guest panicked.
    #[error("the wasm run thread failed: {0}")]
    RunThread(String),
    /// A run arrived before preflight prepared the engine.
    #[error("the wasm provider is not prepared (preflight has not run)")]
    NotPrepared,
    /// A granted run's grant came without a socket (the wasm host functions call one).
    #[error("the grant broker gave the wasm run no socket; nothing ran")]
    GrantNotASocket,
    /// The startup snippet did not print what it must.
    #[error(
        "the startup snippet {PROOF_CODE:?} gave exit {exit_code} (timed out: {timed_out}), \
         stdout {stdout:?}, stderr {stderr:?}; expected exit 0 and stdout \"42\\n\""
    )]
    ProofOutput {
        /// The exit code it gave.
        exit_code: i32,
        /// Whether it timed out.
        timed_out: bool,
        /// Its stdout, lossily decoded.
        stdout: String,
        /// Its stderr, lossily decoded.
        stderr: String,
    },
}

impl From<WasmError> for ProviderError {
    fn from(e: WasmError) -> ProviderError {
        ProviderError::infrastructure(e)
    }
}

/// The wasm provider.
pub struct Wasm {
    identity: String,
    module_sha256: String,
    memory_pages: u64,
    resources: Resources,
    prepared: OnceCell<Arc<Prepared>>,
}

// === impl Wasm ===

impl Wasm {
    /// The provider for this configuration; nothing is compiled until preflight.
    pub fn new(config: &Config) -> Wasm {
        let module_sha256 = hex::encode(Sha256::digest(GUEST));
        Wasm {
            identity: format!("quickjs-wasm:sha256:{module_sha256}"),
            module_sha256,
            memory_pages: limits::memory_pages(config.resources.memory_mb),
            resources: config.resources,
            prepared: OnceCell::new(),
        }
    }

    /// The environment and software identity: `quickjs-wasm:sha256:<hex of the guest module>`.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    async fn prepare(&self) -> Result<&Arc<Prepared>, WasmError> {
        self.prepared
            .get_or_try_init(|| async {
                let sha = self.module_sha256.clone();
                let pages = self.memory_pages;
                let prepared =
                    tokio::task::spawn_blocking(move || Prepared::new(GUEST, &sha, pages))
                        .await
                        .map_err(|e| WasmError::RunThread(e.to_string()))??;
                tracing::info!(
                    guest = %self.identity,
                    source = prepared.source.as_str(),
                    memory_mib = pages / 16,
                    "wasm guest compiled and linked"
                );
                Ok(Arc::new(prepared))
            })
            .await
    }

    fn evidence(&self) -> TierEvidence {
        TierEvidence {
            tier: IsolationTier::Process,
            detail: format!(
                "QuickJS ({}) ran in a fresh wasmtime instance inside plimsolld, \
                 linear memory capped at {} MiB, no preopened directories",
                self.identity,
                self.memory_pages / 16
            ),
        }
    }
}

#[async_trait]
impl Provider for Wasm {
    async fn preflight(&self) -> Result<TierEvidence, ProviderError> {
        self.prepare().await?;
        Ok(self.evidence())
    }

    async fn prove(&self) -> Result<TierEvidence, ProviderError> {
        let out = self
            .run_snippet(SnippetRun {
                code: PROOF_CODE.to_owned(),
                timeout: PROOF_TIMEOUT,
                hold: Hold::default(),
                grant: None,
            })
            .await?;
        if out.exit_code != 0 || out.timed_out || out.stdout != PROOF_STDOUT {
            return Err(WasmError::ProofOutput {
                exit_code: out.exit_code,
                timed_out: out.timed_out,
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }
            .into());
        }
        Ok(self.evidence())
    }

    async fn ready(&self) -> Result<(), String> {
        match self.prepared.get() {
            Some(_) => Ok(()),
            None => Err(WasmError::NotPrepared.to_string()),
        }
    }

    fn current_tier(&self) -> IsolationTier {
        if self.prepared.initialized() {
            IsolationTier::Process
        } else {
            IsolationTier::None
        }
    }

    fn describe(&self) -> Description {
        Description {
            sandbox: ID,
            // `host_call` relays to the run's broker socket; snippets only (grants.md §3).
            supports_javascript_grants: true,
            javascript: Environment {
                identity: self.identity.clone(),
                default_timeout_ms: DEFAULT_TIMEOUT_MS,
                max_timeout_ms: MAX_TIMEOUT_MS,
                software_identity: self.identity.clone(),
                languages: vec!["javascript".to_owned()],
            },
            resources: self.resources,
            ..Description::default()
        }
    }

    async fn run_snippet(&self, run: SnippetRun) -> Result<SnippetOutcome, ProviderError> {
        let prepared = self.prepared.get().ok_or(WasmError::NotPrepared)?.clone();
        let (code, relay) = match &run.grant {
            Some(grant) => {
                let mut input = crate::grant::host_client::quickjs(grant).into_bytes();
                input.push(0);
                input.extend_from_slice(run.code.as_bytes());
                let relay = host_call::Relay {
                    // The wasm provider asks for socket delivery; a grant without one is a
                    // broker fault and the run is refused before anything runs.
                    socket: grant.socket().ok_or(WasmError::GrantNotASocket)?.to_owned(),
                    // The engine sets its own deadline here when the run starts.
                    deadline: std::time::Instant::now() + run.timeout,
                    runtime: tokio::runtime::Handle::current(),
                };
                (input, Some(relay))
            }
            None => (run.code.into_bytes(), None),
        };
        let timeout = run.timeout;
        let exit = tokio::task::spawn_blocking(move || prepared.run(code, timeout, relay))
            .await
            .map_err(|e| WasmError::RunThread(e.to_string()))??;
        if exit.memory_cap_hit {
            tracing::debug!(
                exit_code = exit.exit_code,
                "wasm run reached its memory cap"
            );
        }
        Ok(SnippetOutcome {
            stdout: exit.stdout.bytes,
            stderr: exit.stderr.bytes,
            exit_code: exit.exit_code,
            timed_out: exit.timed_out,
            stdout_truncated: exit.stdout.truncated,
            stderr_truncated: exit.stderr.truncated,
            duration: exit.duration,
            environment: self.identity.clone(),
            software_identity: self.identity.clone(),
            instance: String::new(),
        })
    }
}

#[cfg(test)]
mod tests;
