//! A simulator of E2B (the hosted microVM service) for plimsoll's tests: E2B's control plane
//! and envd, faithful to E2B's real API as E2B's own SDK (`e2b` 2.63.0) uses it, with every
//! "VM" a local container so that runs, timeouts and egress are real.
//!
//! # Starting one
//!
//! As a child process (what the test suites do), with the binary cargo built:
//!
//! ```no_run
//! use e2b_simulator::process::{SimulatorProcess, binary};
//! let sim = SimulatorProcess::spawn(&binary(), &["--runtime", "runc"]).unwrap();
//! println!("E2B_API_URL={} E2B_SANDBOX_URL={} E2B_API_KEY={}", sim.api_url, sim.envd_url, sim.api_key);
//! ```
//!
//! Or in-process, with [`Simulator::start`] and a [`Config`] whose `agent` is the
//! `e2b-simulator` binary (it is mounted into every VM as the guest agent).
//!
//! # The pieces
//!
//! - [`api`]: the control plane (`E2B_API_URL`): create, list, get, kill, pause, connect,
//!   timeout, network, with `X-API-Key`.
//! - [`envd`]: envd behind E2B's proxy (`E2B_SANDBOX_URL`, or host `49983-<id>.<domain>`):
//!   `process.Process/Start` as a Connect stream, `/files`, `/health`.
//! - [`vm`] and [`guest`]: one locked-down container per VM; the simulator's binary runs in
//!   it as envd's in-guest half.
//! - [`egress`]: the VM's only way out, enforcing the network config, with the simulator's
//!   own CA and the per-host header rules (how a guard token reaches the guard without the
//!   guest seeing it).
//! - [`faults`]: failures on demand; [`admin`]: the listener tests use to flip them.
//!
//! See `docs/e2b-simulator.md` for what is simulated and how faithfully.
#![forbid(unsafe_code)]

pub mod admin;
pub mod api;
mod app;
pub mod config;
pub mod egress;
pub mod envd;
pub mod faults;
pub mod frames;
pub mod guest;
pub mod http;
pub mod lifecycle;
pub mod network;
pub mod process;
pub mod sandbox;
pub mod served;
pub mod simulator;
pub mod token;
pub mod vm;

pub use config::{Config, Runtime, Template, Upstream};
pub use faults::Faults;
pub use simulator::{Simulator, StartError};
