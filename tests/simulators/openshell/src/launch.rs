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
//! The simulator runs as a child process with `--exit-on-stdin-eof`: dropping the
//! [`Simulator`] closes its stdin and waits for it to remove its containers (and a test
//! process that dies closes the pipe too).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

/// `<target>/debug/openshell-simulator`, where `<target>` is `$CARGO_TARGET_DIR` or the
/// workspace's `target/`. It must have been built (`cargo build --workspace`).
pub fn binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../target"));
    target.join("debug").join("openshell-simulator")
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("starting {path}: {source}")]
    Spawn {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the simulator exited before it was ready: {0}")]
    NotReady(String),
    #[error("admin call {what}: {why}")]
    Admin { what: String, why: String },
}

/// A running simulator; dropping it stops it (and removes its containers).
pub struct Simulator {
    child: Child,
    stdin: Option<ChildStdin>,
    pub ready: Ready,
}

impl Simulator {
    /// Starts the simulator and waits (at most 60 s) for its ready line.
    pub fn start(options: LaunchOptions) -> Result<Simulator, LaunchError> {
        let mut child = Command::new(&options.binary)
            .arg("--cert-dir")
            .arg(&options.cert_dir)
            .args(["--runtime", &options.runtime, "--exit-on-stdin-eof"])
            .args(&options.extra_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| LaunchError::Spawn {
                path: options.binary.clone(),
                source,
            })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let Some(stdout) = stdout else { return };
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = tx.send(reader.read_line(&mut line).map(|_| line));
            // Keep draining so the child never blocks on a full pipe.
            let mut sink = Vec::new();
            let _ = reader.read_to_end(&mut sink);
        });
        let mut sim = Simulator {
            child,
            stdin,
            ready: Ready {
                grpc_url: String::new(),
                grpc_addr: String::new(),
                admin_url: String::new(),
                pki: crate::pki::PkiFiles {
                    ca_file: PathBuf::new(),
                    cert_file: PathBuf::new(),
                    key_file: PathBuf::new(),
                    server_cert_file: PathBuf::new(),
                    server_key_file: PathBuf::new(),
                },
                runtime: String::new(),
                instance: String::new(),
            },
        };
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(line)) if !line.trim().is_empty() => line,
            other => return Err(LaunchError::NotReady(format!("{other:?}"))),
        };
        sim.ready = serde_json::from_str(&line)
            .map_err(|e| LaunchError::NotReady(format!("{e}: {line}")))?;
        Ok(sim)
    }

    async fn admin(
        &self,
        method: &str,
        path: &str,
        body: &str,
    ) -> Result<serde_json::Value, LaunchError> {
        let what = format!("{method} {path}");
        let fail = |why: String| LaunchError::Admin {
            what: what.clone(),
            why,
        };
        let addr = self.ready.admin_url.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| fail(e.to_string()))?;
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
            .await
            .map_err(|_| fail("no answer within 30 s".into()))?
            .map_err(|e| fail(e.to_string()))?;
        let text = String::from_utf8_lossy(&answer);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| fail(format!("bad answer: {text}")))?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(fail(format!("{head}: {body}")));
        }
        serde_json::from_str(body).map_err(|e| fail(format!("{e}: {body}")))
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

impl Drop for Simulator {
    fn drop(&mut self) {
        // End of stdin asks it to stop and clean up; give it time to remove containers.
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
