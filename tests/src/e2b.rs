//! A daemon on the E2B simulator (`tests/simulators/e2b`, checked by E2B's own SDK): the
//! simulator's binary with its VMs under the runtime [`crate::docker::runtime`] names, and
//! `plimsolld` with `SANDBOX_PROVIDER=e2b` pointed at it through `E2B_API_URL` and
//! `E2B_SANDBOX_URL`, as E2B's SDK is pointed at a test double.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use e2b_simulator::process::{SimulatorProcess, binary};
use serde_json::Value;

use crate::docker::runtime;
use crate::{Daemon, sim};

/// The startup proof makes a VM and runs its probe in it.
pub const START_TIMEOUT: Duration = Duration::from_secs(180);
/// The template image the simulator's VMs run (scripts/setup-e2b-simulator builds it).
pub const TEMPLATE_IMAGE: &str = "plimsoll-sim/e2b-base:latest";

/// Whether docker and the template image are there; panics with the fix otherwise, unless
/// `PLIMSOLL_TEST_DOCKER_SKIP=1` (then the test is skipped).
pub fn e2b_ready() -> bool {
    crate::docker::docker_ready()
        && crate::docker::image_ready(TEMPLATE_IMAGE, "scripts/setup-e2b-simulator")
}

/// A running simulator.
pub struct E2bSim {
    /// The child process and its addresses.
    pub sim: SimulatorProcess,
}

impl E2bSim {
    pub fn start() -> E2bSim {
        let sim = SimulatorProcess::spawn(&binary(), &["--runtime", runtime()])
            .expect("the e2b simulator starts (cargo build --workspace first)");
        assert_eq!(sim.runtime, runtime());
        E2bSim { sim }
    }

    /// The daemon environment for this simulator, plus `extra` (which replaces).
    pub fn env(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let own = [
            ("E2B_API_KEY", self.sim.api_key.as_str()),
            ("E2B_API_URL", &self.sim.api_url),
            ("E2B_SANDBOX_URL", &self.sim.envd_url),
            ("E2B_TEMPLATE", "base"),
        ];
        sim::env("e2b", &own, extra)
    }

    pub fn daemon(&self, extra: &[(&str, &str)]) -> Daemon {
        sim::daemon(&self.env(extra), START_TIMEOUT)
    }

    /// Starts a daemon that must refuse to start; its stderr.
    pub fn refused(&self, extra: &[(&str, &str)]) -> String {
        sim::refused(&self.env(extra))
    }

    /// The simulator's VMs (`[{sandboxID, container, state, processes}]`).
    pub fn sandboxes(&self) -> Vec<Value> {
        self.sim
            .sandboxes()
            .expect("simulator sandboxes")
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The ids of the simulator's VMs.
    pub fn ids(&self) -> Vec<String> {
        self.sandboxes()
            .iter()
            .filter_map(|s| s["sandboxID"].as_str().map(str::to_owned))
            .collect()
    }

    /// Waits (at most `bound`) until the simulator holds no VM.
    pub fn wait_empty(&self, bound: Duration) {
        self.wait_for(bound, "no VM left", |ids| ids.is_empty());
    }

    /// Waits (at most `bound`) until `done` holds for the VM ids.
    pub fn wait_for(&self, bound: Duration, what: &str, mut done: impl FnMut(&[String]) -> bool) {
        sim::wait_for(bound, what, || self.ids(), |ids| done(ids));
    }

    /// One call to E2B's control plane as a client (not the daemon) makes it: the status
    /// and the JSON answer.
    pub fn api(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let addr = self.sim.api_url.trim_start_matches("http://");
        let mut stream = TcpStream::connect(addr).expect("connect to the simulator's API");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let body = body.map(Value::to_string).unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nX-API-Key: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.sim.api_key,
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

    /// Creates a VM stamped with `metadata`, as another client (or a crashed daemon) would
    /// have; its id.
    pub fn create_stamped(&self, metadata: &Value) -> String {
        let (status, answer) = self.api(
            "POST",
            "/v2/sandboxes",
            Some(&serde_json::json!({"templateID": "base", "timeout": 600, "metadata": metadata})),
        );
        assert_eq!(status, 201, "{answer}");
        answer["sandboxID"].as_str().expect("sandboxID").to_owned()
    }
}

/// A VM made straight through the simulator's API, as a plain client would: its id and
/// its two envd tokens.
pub struct DirectVm {
    pub id: String,
    access: String,
    traffic: String,
}

impl E2bSim {
    /// Creates a secure VM of template `base` with the daemon's deny-all network.
    pub fn create_direct(&self) -> DirectVm {
        let (status, answer) = self.api(
            "POST",
            "/v2/sandboxes",
            Some(&serde_json::json!({
                "templateID": "base",
                "timeout": 60,
                "autoPause": false,
                "metadata": {"sdk": "bench"},
                "network": {"allowPublicTraffic": false, "denyOut": ["0.0.0.0/0"]},
            })),
        );
        assert_eq!(status, 201, "{answer}");
        let text = |name: &str| answer[name].as_str().expect(name).to_owned();
        DirectVm {
            id: text("sandboxID"),
            access: text("envdAccessToken"),
            traffic: text("trafficAccessToken"),
        }
    }

    /// Starts `cmd args` with `envs` in `vm` through envd's `process.Process/Start` (Connect
    /// JSON server stream) and reads it to its end frame; the exit code and stdout.
    pub fn envd_start(
        &self,
        vm: &DirectVm,
        cmd: &str,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> (i64, String) {
        use base64::Engine as _;
        let envs: serde_json::Map<String, Value> = envs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
            .collect();
        let message = serde_json::json!({
            "process": {"cmd": cmd, "args": args, "envs": envs},
            "stdin": false,
        })
        .to_string();
        let mut body = vec![0u8];
        body.extend_from_slice(&u32::try_from(message.len()).expect("len").to_be_bytes());
        body.extend_from_slice(message.as_bytes());
        let addr: std::net::SocketAddr = self
            .sim
            .envd_url
            .trim_start_matches("http://")
            .parse()
            .expect("envd address");
        let basic = base64::engine::general_purpose::STANDARD.encode("user:");
        let req = crate::http1::Request::post("/process.Process/Start")
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("Connect-Timeout-Ms", "60000")
            .header("X-Access-Token", &vm.access)
            .header("E2b-Traffic-Access-Token", &vm.traffic)
            .header("E2b-Sandbox-Id", &vm.id)
            .header("E2b-Sandbox-Port", "49983")
            .header("Authorization", &format!("Basic {basic}"))
            .body(body);
        let mut conn = crate::http1::Connection::open(addr);
        conn.set_read_timeout(Duration::from_secs(60));
        conn.send(&req.to_bytes(addr)).expect("send");
        let resp = conn.read_response(false).expect("envd answer");
        assert_eq!(resp.status, 200, "{resp}");
        let (mut exit, mut stdout, mut ended) = (None, String::new(), false);
        let mut rest = resp.body.as_slice();
        while rest.len() >= 5 {
            let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            let (flags, frame) = (rest[0], &rest[5..5 + len]);
            rest = &rest[5 + len..];
            if flags & 0x02 != 0 {
                ended = true;
                break;
            }
            let event: Value = serde_json::from_slice(frame).expect("event frame");
            let event = &event["event"];
            if let Some(out) = event["data"]["stdout"].as_str() {
                let bytes = crate::connect::decode_base64(out).expect("base64 stdout");
                stdout.push_str(&String::from_utf8_lossy(&bytes));
            }
            if event["end"].is_object() {
                exit = Some(event["end"]["exitCode"].as_i64().unwrap_or(0));
            }
        }
        assert!(ended, "no end frame: {resp}");
        (exit.expect("an end event"), stdout)
    }

    /// Kills `vm` through the API.
    pub fn kill_direct(&self, vm: &DirectVm) {
        let (status, answer) = self.api("DELETE", &format!("/sandboxes/{}", vm.id), None);
        assert_eq!(status, 204, "{answer}");
    }
}
