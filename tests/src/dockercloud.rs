//! A daemon on the Docker Cloud simulator (`tests/simulators/dockercloud`, checked by
//! Docker's published SDK): the simulator's binary with its sandboxes under the runtime
//! [`crate::docker::runtime`] names, and `plimsolld` with `SANDBOX_PROVIDER=dockercloud`
//! pointed at its token exchange, Connect API and policy API (plain http on loopback).

use std::time::Duration;

use dockercloud_simulator::Faults;
use dockercloud_simulator::launch::{LaunchOptions, Simulator};
use serde_json::Value;

use crate::docker::runtime;
use crate::{Daemon, sim};

/// The startup proof makes a sandbox and runs its probe, a timeout and a flood in it.
pub const START_TIMEOUT: Duration = Duration::from_secs(180);
/// The image the simulator's sandboxes boot (tests/simulators/dockercloud/image/build).
pub const SANDBOX_IMAGE: &str = "plimsoll-sim/dockercloud-sandbox:latest";

/// Whether docker and the sandbox image are there; panics with the fix otherwise, unless
/// `PLIMSOLL_TEST_DOCKER_SKIP=1` (then the test is skipped).
pub fn dockercloud_ready() -> bool {
    crate::docker::docker_ready()
        && crate::docker::image_ready(SANDBOX_IMAGE, "tests/simulators/dockercloud/image/build")
}

/// A running simulator.
pub struct DockerCloudSim {
    pub sim: Simulator,
    rt: tokio::runtime::Runtime,
}

impl DockerCloudSim {
    pub fn start() -> DockerCloudSim {
        DockerCloudSim::start_with(LaunchOptions::new())
    }

    /// Starts the simulator with more options (e.g. a guard route).
    pub fn start_with(options: LaunchOptions) -> DockerCloudSim {
        let sim = Simulator::start(options.runtime(runtime()))
            .expect("the dockercloud simulator starts (cargo build --workspace first)");
        assert_eq!(sim.ready.runtime, runtime());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        DockerCloudSim { sim, rt }
    }

    /// The image reference pinned by its linux/amd64 manifest digest.
    pub fn pinned_image(&self) -> String {
        let image = &self.sim.ready.images[0];
        let repo = image
            .reference
            .rsplit_once(':')
            .map_or(image.reference.as_str(), |(r, _)| r);
        format!("{repo}@{}", image.digest)
    }

    /// The daemon environment for this simulator, plus `extra` (which replaces).
    pub fn env(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let r = &self.sim.ready;
        let own = [
            ("SANDBOX_MEMORY_MB", "1024"),
            ("DOCKER_SBX_USERNAME", r.username.as_str()),
            ("DOCKER_SBX_TOKEN", &r.token),
            ("SANDBOX_DOCKERCLOUD_AUTH_URL", &r.auth_url),
            ("SANDBOX_DOCKERCLOUD_API_URL", &r.api_url),
            ("SANDBOX_DOCKERCLOUD_POLICY_URL", &r.policy_url),
            ("SANDBOX_DOCKERCLOUD_IMAGE", &r.images[0].reference),
        ];
        sim::env("dockercloud", &own, extra)
    }

    pub fn daemon(&self, extra: &[(&str, &str)]) -> Daemon {
        sim::daemon(&self.env(extra), START_TIMEOUT)
    }

    /// Starts a daemon that must refuse to start; its stderr.
    pub fn refused(&self, extra: &[(&str, &str)]) -> String {
        sim::refused(&self.env(extra))
    }

    /// Replaces the simulator's faults.
    pub fn faults(&self, faults: &Faults) {
        self.rt
            .block_on(self.sim.set_faults(faults))
            .expect("set the simulator's faults");
    }

    /// The simulator's sandboxes (`[{id, name, status, container, policy_allow, …}]`).
    pub fn sandboxes(&self) -> Vec<Value> {
        let state = self
            .rt
            .block_on(self.sim.state())
            .expect("the simulator's state");
        state["sandboxes"].as_array().cloned().unwrap_or_default()
    }

    /// The simulator's whole admin state (sandboxes, operations, endpoint credentials).
    pub fn admin_state(&self) -> Value {
        self.rt
            .block_on(self.sim.state())
            .expect("the simulator's state")
    }

    /// The names of the simulator's sandboxes.
    pub fn names(&self) -> Vec<String> {
        self.sandboxes()
            .iter()
            .filter_map(|s| s["name"].as_str().map(str::to_owned))
            .collect()
    }

    /// Waits (at most `bound`) until the simulator holds no sandbox.
    pub fn wait_empty(&self, bound: Duration) {
        self.wait_for(bound, "no sandbox left", |names| names.is_empty());
    }

    /// Waits (at most `bound`) until `done` holds for the sandbox names.
    pub fn wait_for(&self, bound: Duration, what: &str, mut done: impl FnMut(&[String]) -> bool) {
        sim::wait_for(bound, what, || self.names(), |names| done(names));
    }
}

/// One HTTP/1.1 POST of `body` to `url` (`http://host:port/path`) with `headers`: the
/// status and the JSON answer.
fn post(url: &str, headers: &[(&str, &str)], body: &Value) -> (u16, Value) {
    use std::io::{Read, Write};
    let rest = url.trim_start_matches("http://");
    let (addr, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the simulator");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let body = body.to_string();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    let (head, payload) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, serde_json::from_str(payload).unwrap_or(Value::Null))
}

impl DockerCloudSim {
    /// One Connect call to the management API as another client (not the daemon) makes it.
    pub fn call(&self, procedure: &str, body: &Value) -> (u16, Value) {
        let r = &self.sim.ready;
        let (status, token) = post(
            &r.auth_url,
            &[],
            &serde_json::json!({ "identifier": r.username, "secret": r.token }),
        );
        assert_eq!(status, 200, "{token}");
        let bearer = format!("Bearer {}", token["access_token"].as_str().unwrap_or(""));
        post(
            &format!("{}{procedure}", r.api_url),
            &[
                ("Authorization", &bearer),
                ("Connect-Protocol-Version", "1"),
            ],
            body,
        )
    }

    /// Creates a sandbox named `name`, as another client (or a crashed daemon) would have.
    pub fn create_named(&self, name: &str) {
        let (status, answer) = self.call(
            "/docker.sbx.v1.SandboxService/CreateSandbox",
            &serde_json::json!({
                "name": name,
                "cloud": { "imageRef": self.sim.ready.images[0].reference, "timeout": "600s",
                           "startCmd": ["tail", "-f", "/dev/null"],
                           "platform": { "os": "linux", "architecture": "amd64" } },
                "resources": { "cpus": 1, "memoryMib": "1024" },
            }),
        );
        assert_eq!(status, 200, "{answer}");
    }
}
