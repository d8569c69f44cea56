//! What the benchmarks share: starting the release daemon and reading figures.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One phase's samples.
pub struct Phase {
    pub latencies: Vec<Duration>,
    pub wall: Duration,
}

impl Phase {
    /// Answers per second over the phase's wall time.
    pub fn per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64()
    }
}

/// The `p`th percentile in ms (nearest rank).
pub fn percentile(samples: &[Duration], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

/// Starts the built `plimsolld` with the wasm provider and only `env` (plus `PATH`), and
/// returns it with its `plimsolld listening` log record. The first start on a machine
/// compiles the guest, so it may take minutes.
pub fn spawn_wasm_daemon(env: &[(&str, String)]) -> (Child, serde_json::Value) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_plimsolld"));
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("SANDBOX_PROVIDER", "wasm")
        .env("PLIMSOLL_ADDR", "127.0.0.1:0")
        .env("PLIMSOLL_LOG_FORMAT", "json");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn plimsolld");
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        // Keep draining after the listening line: the daemon writes an audit line
        // per request and must never block on its log.
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if sent {
                continue;
            }
            let Ok(record) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if record["msg"] == "plimsolld listening" {
                let _ = tx.send(record);
                sent = true;
            } else if record["level"] == "ERROR" {
                eprintln!("plimsolld: {line}");
            }
        }
    });
    let listening = rx
        .recv_timeout(Duration::from_secs(300))
        .expect("plimsolld did not listen within 300 s");
    (child, listening)
}
