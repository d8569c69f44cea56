//! Starting the simulator from a test, and flipping its faults.
//!
//! ```no_run
//! # async fn example() {
//! use openshell_simulator::launch::{LaunchOptions, Simulator};
//! use openshell_simulator::Faults;
//!
//! let dir = std::env::temp_dir().join("my-test-certs");
//! let sim = Simulator::start(LaunchOptions::new(&dir).runtime("runc")).unwrap();
//! // sim.ready.grpc_url, sim.ready.pki.ca_file / cert_file / key_file
//! sim.set_faults(&Faults { second_compute_driver: true, ..Faults::default() }).await.unwrap();
//! # }
//! ```
//!
//! Dropping the [`Simulator`] stops it and lets it remove its containers
//! ([`sim_support::launch::Process`]).

use std::path::{Path, PathBuf};

use sim_support::launch::{Process, admin, built_binary};

pub use sim_support::launch::LaunchError;

use crate::faults::Faults;
use crate::server::Ready;

/// How a test starts the simulator.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    pub binary: PathBuf,
    pub cert_dir: PathBuf,
    pub runtime: String,
    pub extra_args: Vec<String>,
}

impl LaunchOptions {
    /// The built binary (see [`binary`]), certificates under `cert_dir`, runtime `auto`.
    pub fn new(cert_dir: &Path) -> LaunchOptions {
        LaunchOptions {
            binary: binary(),
            cert_dir: cert_dir.to_path_buf(),
            runtime: "auto".into(),
            extra_args: Vec::new(),
        }
    }

    pub fn runtime(mut self, runtime: &str) -> LaunchOptions {
        runtime.clone_into(&mut self.runtime);
        self
    }

    /// More flags (see `openshell-simulator --help`).
    pub fn arg(mut self, arg: &str) -> LaunchOptions {
        self.extra_args.push(arg.to_owned());
        self
    }
}

/// The built `openshell-simulator` (see [`built_binary`]).
pub fn binary() -> PathBuf {
    built_binary(env!("CARGO_MANIFEST_DIR"), "openshell-simulator")
}

/// A running simulator; dropping it stops it (and removes its containers).
pub struct Simulator {
    _process: Process,
    pub ready: Ready,
}

impl Simulator {
    /// Starts the simulator and waits (at most 60 s) for its ready line.
    pub fn start(options: LaunchOptions) -> Result<Simulator, LaunchError> {
        let mut args = vec![
            "--cert-dir".into(),
            options.cert_dir.clone().into_os_string(),
        ];
        args.extend(options.extra_args.iter().map(Into::into));
        let (process, ready) = Process::start(&options.binary, &options.runtime, &args)?;
        Ok(Simulator {
            _process: process,
            ready,
        })
    }

    async fn admin(
        &self,
        method: &str,
        path: &str,
        body: &str,
    ) -> Result<serde_json::Value, LaunchError> {
        admin(&self.ready.admin_url, method, path, body).await
    }

    /// Replaces the fault set.
    pub async fn set_faults(&self, faults: &Faults) -> Result<(), LaunchError> {
        let body = serde_json::to_string(faults).unwrap_or_default();
        self.admin("PUT", "/faults", &body).await.map(drop)
    }

    /// Every sandbox, the live forwards and the token count (see [`crate::admin`]).
    pub async fn state(&self) -> Result<serde_json::Value, LaunchError> {
        self.admin("GET", "/state", "").await
    }

    /// Kills a sandbox's container now.
    pub async fn kill_sandbox(&self, name: &str) -> Result<(), LaunchError> {
        self.admin("POST", &format!("/sandboxes/{name}/kill"), "")
            .await
            .map(drop)
    }
}
