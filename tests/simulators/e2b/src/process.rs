//! The simulator as a child process, for tests: start `e2b-simulator`, read its listening
//! line, talk to its admin listener, and stop it (every VM removed) when dropped.
//!
//! ```no_run
//! use e2b_simulator::process::SimulatorProcess;
//! let sim = SimulatorProcess::spawn(&e2b_simulator::process::binary(), &["--runtime", "runsc"]).unwrap();
//! // E2B_API_URL = sim.api_url, E2B_SANDBOX_URL = sim.envd_url, E2B_API_KEY = sim.api_key
//! sim.map_host("guard.plimsoll.test", "http://127.0.0.1:4000", None).unwrap();
//! sim.set_faults(&serde_json::json!({"egressAllowed": true})).unwrap();
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// How long the simulator may take to print its listening line.
const READY: Duration = Duration::from_secs(60);
/// How long it may take to stop and remove its VMs.
const STOP: Duration = Duration::from_secs(60);

/// A running `e2b-simulator` child. Dropping it closes its stdin (it runs with
/// `--watch-stdin`), so it stops and removes its VMs; a child that has not exited after
/// [`STOP`] is killed.
pub struct SimulatorProcess {
    /// `E2B_API_URL`.
    pub api_url: String,
    /// `E2B_SANDBOX_URL`.
    pub envd_url: String,
    pub admin_url: String,
    /// `E2B_API_KEY`.
    pub api_key: String,
    /// `E2B_DOMAIN`.
    pub domain: String,
    /// `runc` or `runsc`.
    pub runtime: String,
    /// The egress CA certificate, PEM (what every VM trusts).
    pub ca_pem: String,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
}

/// `<target>/debug/e2b-simulator` next to the running test binary.
pub fn binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // <target>/debug/deps/<test> → <target>/debug/e2b-simulator
    exe.parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("e2b-simulator"))
        .unwrap_or_else(|| PathBuf::from("e2b-simulator"))
}

impl SimulatorProcess {
    /// Starts `binary --watch-stdin <args>` and waits for its listening line.
    pub fn spawn(binary: &Path, args: &[&str]) -> std::io::Result<SimulatorProcess> {
        let mut child = Command::new(binary)
            .arg("--watch-stdin")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next();
            let _ = tx.send(first);
            // Keep draining, so the child never blocks on a full pipe.
            for _ in lines {}
        });
        let line = match rx.recv_timeout(READY) {
            Ok(Some(Ok(line))) => line,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::io::Error::other(format!(
                    "e2b-simulator did not print its listening line: {other:?}"
                )));
            }
        };
        let ready: Value = serde_json::from_str(&line)
            .map_err(|e| std::io::Error::other(format!("listening line {line:?}: {e}")))?;
        let field = |name: &str| ready[name].as_str().unwrap_or_default().to_owned();
        let ca_pem = std::fs::read_to_string(field("caCertPath"))?;
        Ok(SimulatorProcess {
            api_url: field("api"),
            envd_url: field("envd"),
            admin_url: field("admin"),
            api_key: field("apiKey"),
            domain: field("domain"),
            runtime: field("runtime"),
            ca_pem,
            child: Some(child),
            stdin,
        })
    }

    /// Replaces the fault switches (see [`crate::faults::Faults`] for the names).
    pub fn set_faults(&self, faults: &Value) -> std::io::Result<()> {
        self.admin("PUT", "/faults", Some(faults)).map(drop)
    }

    /// Maps `name` (a DNS name the guest uses, e.g. the guard's) to a loopback upstream
    /// (`http://127.0.0.1:P`, or `https://…` with the CA its certificate chains to). Map
    /// names before creating the sandboxes that use them.
    pub fn map_host(
        &self,
        name: &str,
        upstream: &str,
        ca_pem: Option<&str>,
    ) -> std::io::Result<()> {
        let body = serde_json::json!({"upstream": upstream, "caPem": ca_pem});
        self.admin("PUT", &format!("/hosts/{name}"), Some(&body))
            .map(drop)
    }

    /// The docker view of the sandboxes.
    pub fn sandboxes(&self) -> std::io::Result<Value> {
        self.admin("GET", "/sandboxes", None)
    }

    /// How long the simulator spent serving sandbox `id`'s create, detail reads and process
    /// starts (each to its end frame), in milliseconds.
    pub fn served_ms(&self, id: &str) -> std::io::Result<f64> {
        let served = self.admin("GET", &format!("/served/{id}"), None)?;
        served["ms"]
            .as_f64()
            .ok_or_else(|| std::io::Error::other(format!("served {id}: {served}")))
    }

    /// The VM of `id` dies under the API.
    pub fn crash(&self, id: &str) -> std::io::Result<()> {
        self.admin("POST", &format!("/sandboxes/{id}/crash"), None)
            .map(drop)
    }

    /// One admin call; the JSON answer (or `null`). A status of 300 or more is an error.
    pub fn admin(&self, method: &str, path: &str, body: Option<&Value>) -> std::io::Result<Value> {
        let addr = self.admin_url.trim_start_matches("http://");
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let body = body.map(Value::to_string).unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        let (head, payload) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if !(200..300).contains(&status) {
            return Err(std::io::Error::other(format!(
                "admin {method} {path}: {head} {payload}"
            )));
        }
        Ok(serde_json::from_str(payload).unwrap_or(Value::Null))
    }

    /// Stops the simulator and waits for it to remove its VMs.
    pub fn stop(&mut self) {
        drop(self.stdin.take());
        let Some(mut child) = self.child.take() else {
            return;
        };
        let deadline = std::time::Instant::now() + STOP;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for SimulatorProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
