//! A daemon on the OpenShell gateway simulator (`tests/simulators/openshell`): the simulator
//! with its own test CA, its sandboxes under the runtime [`crate::docker::runtime`] names,
//! and `plimsolld` with `SANDBOX_PROVIDER=openshell` and the five settings pointing at it
//! (the image: [`crate::docker::project_image`], which carries the runner and the relay).

use std::time::Duration;

use openshell_simulator::Faults;
use openshell_simulator::launch::{LaunchOptions, Simulator};
use serde_json::Value;

use crate::docker::{project_image, runtime};
use crate::{Daemon, sim};

/// The startup proof makes sandboxes and runs its checks in them: longer than docker's.
pub const START_TIMEOUT: Duration = Duration::from_secs(180);

/// A simulator with its certificates, and a runtime for its admin calls.
pub struct Gateway {
    /// The simulator.
    pub sim: Simulator,
    rt: tokio::runtime::Runtime,
    _certs: tempfile::TempDir,
}

impl Gateway {
    pub fn start() -> Gateway {
        let certs = tempfile::tempdir().expect("cert dir");
        let sim = Simulator::start(LaunchOptions::new(certs.path()).runtime(runtime()))
            .expect("the openshell simulator starts (cargo build --workspace first)");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        Gateway {
            sim,
            rt,
            _certs: certs,
        }
    }

    pub fn faults(&self, faults: Faults) {
        self.rt
            .block_on(self.sim.set_faults(&faults))
            .expect("set faults");
    }

    pub fn state(&self) -> Value {
        self.rt.block_on(self.sim.state()).expect("simulator state")
    }

    pub fn count(&self, what: &str) -> u64 {
        self.state()[what].as_u64().unwrap_or(0)
    }

    /// `n` round trips of the gateway's own exec of `true` in `sandbox`, after 3 warm-up
    /// ones: a benchmark's baseline.
    pub fn exec_round_trips(&self, sandbox: &str, n: usize) -> Vec<Duration> {
        use openshell_simulator::client;
        self.rt.block_on(async {
            let ready = &self.sim.ready;
            let mut c = client::connect(&ready.grpc_url, &ready.pki)
                .await
                .expect("a client of the simulator");
            let mut times = Vec::with_capacity(n);
            for i in 0..n + 3 {
                let (exit, took) = client::exec_round_trip(&mut c, sandbox, &["true"])
                    .await
                    .expect("exec");
                assert_eq!(exit, 0);
                if i >= 3 {
                    times.push(took);
                }
            }
            times
        })
    }

    pub fn sandboxes(&self) -> Vec<Value> {
        self.state()["sandboxes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The daemon environment for this gateway, plus `extra`.
    pub fn env(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let pki = &self.sim.ready.pki;
        let own = [
            (
                "SANDBOX_OPENSHELL_GATEWAY_URL",
                self.sim.ready.grpc_url.as_str(),
            ),
            ("SANDBOX_OPENSHELL_CA_FILE", path(&pki.ca_file)),
            ("SANDBOX_OPENSHELL_CERT_FILE", path(&pki.cert_file)),
            ("SANDBOX_OPENSHELL_KEY_FILE", path(&pki.key_file)),
            ("SANDBOX_OPENSHELL_IMAGE", project_image()),
        ];
        sim::env("openshell", &own, extra)
    }

    pub fn daemon(&self, extra: &[(&str, &str)]) -> Daemon {
        sim::daemon(&self.env(extra), START_TIMEOUT)
    }

    /// A daemon with sessions on (`extra` names `SANDBOX_MAX_SESSIONS`), where the
    /// sandboxes' kernel has Yama's ptrace restriction; elsewhere (runc on a host without
    /// Yama) asserts that the daemon refuses to start, naming that check, and answers `None`:
    /// sessions on openshell fail closed there (grants.md §8.6).
    pub fn session_daemon(&self, extra: &[(&str, &str)]) -> Option<Daemon> {
        if sandboxes_have_yama() {
            return Some(self.daemon(extra));
        }
        let refused = self.refused(extra);
        assert!(
            refused.contains("Yama ptrace_scope"),
            "sessions on a kernel without Yama: {refused}"
        );
        None
    }

    pub fn refused(&self, extra: &[(&str, &str)]) -> String {
        sim::refused(&self.env(extra))
    }

    /// Waits (at most `bound`) until the gateway holds no sandbox at all.
    pub fn wait_empty(&self, bound: Duration) {
        sim::wait_for(
            bound,
            "no sandbox left",
            || self.sandboxes(),
            |left| left.is_empty(),
        );
    }
}

/// Whether the simulator's sandboxes see Yama's `ptrace_scope` at 1 or more: gVisor's own
/// kernel does; under runc they see the host's.
pub fn sandboxes_have_yama() -> bool {
    runtime() == "runsc"
        || std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .is_some_and(|scope| scope >= 1)
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().expect("utf-8 path")
}
