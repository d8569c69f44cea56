//! Starting the simulator from a test, and flipping its faults.
//!
//! ```no_run
//! # async fn example() {
//! use dockercloud_simulator::launch::{LaunchOptions, Simulator};
//! use dockercloud_simulator::Faults;
//!
//! let sim = Simulator::start(LaunchOptions::new().runtime("runc")).unwrap();
//! // sim.ready.auth_url, api_url, policy_url, rest_url, username, token
//! sim.set_faults(&Faults { quota_reached: true, ..Faults::default() }).await.unwrap();
//! # }
//! ```
//!
//! Dropping the [`Simulator`] stops it and lets it remove its containers
//! ([`sim_support::launch::Process`]).

use std::path::PathBuf;

use sim_support::launch::{Process, admin, built_binary};

pub use sim_support::launch::LaunchError;

use crate::faults::Faults;
use crate::server::Ready;

/// How a test starts the simulator.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    pub binary: PathBuf,
    pub runtime: String,
    pub extra_args: Vec<String>,
}

impl Default for LaunchOptions {
    fn default() -> LaunchOptions {
        LaunchOptions::new()
    }
}

impl LaunchOptions {
    /// The built binary (see [`binary`]), runtime `auto`.
    pub fn new() -> LaunchOptions {
        LaunchOptions {
            binary: binary(),
            runtime: "auto".into(),
            extra_args: Vec::new(),
        }
    }

    pub fn runtime(mut self, runtime: &str) -> LaunchOptions {
        runtime.clone_into(&mut self.runtime);
        self
    }

    /// More flags (see `dockercloud-simulator --help`).
    pub fn arg(mut self, arg: &str) -> LaunchOptions {
        self.extra_args.push(arg.to_owned());
        self
    }

    /// Lets a policy PUT open `<host>:443` from the sandboxes, forwarded to `target`.
    pub fn guard(self, host: &str, target: std::net::SocketAddr) -> LaunchOptions {
        self.arg("--guard-host")
            .arg(host)
            .arg("--guard-target")
            .arg(&target.to_string())
    }
}

/// The built `dockercloud-simulator` (see [`built_binary`]).
pub fn binary() -> PathBuf {
    built_binary(env!("CARGO_MANIFEST_DIR"), "dockercloud-simulator")
}

/// A running simulator; dropping it stops it (and removes its containers).
pub struct Simulator {
    _process: Process,
    pub ready: Ready,
}

impl Simulator {
    /// Starts the simulator and waits (at most 60 s) for its ready line.
    pub fn start(options: LaunchOptions) -> Result<Simulator, LaunchError> {
        let args: Vec<_> = options.extra_args.iter().map(Into::into).collect();
        let (process, ready) = Process::start(&options.binary, &options.runtime, &args)?;
        Ok(Simulator {
            _process: process,
            ready,
        })
    }

    /// Replaces the fault set.
    pub async fn set_faults(&self, faults: &Faults) -> Result<(), LaunchError> {
        let body = serde_json::to_string(faults).unwrap_or_default();
        admin(&self.ready.admin_url, "PUT", "/faults", &body)
            .await
            .map(drop)
    }

    /// Every sandbox (id, name, status, container, policy, forwarder) and counts.
    pub async fn state(&self) -> Result<serde_json::Value, LaunchError> {
        admin(&self.ready.admin_url, "GET", "/state", "").await
    }
}
