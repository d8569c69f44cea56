//! Starting a simulator binary from a test. The simulator runs as a child process with
//! `--exit-on-stdin-eof` and prints one JSON line when it is ready; dropping the
//! [`Process`] closes its stdin and waits for it to remove its containers (and a test
//! process that dies closes the pipe too).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a simulator may take to print its ready line.
const READY: Duration = Duration::from_secs(60);
/// How long a stopping simulator may take to remove its containers before it is killed.
const STOP: Duration = Duration::from_secs(60);
/// How long an admin call may take.
const ADMIN: Duration = Duration::from_secs(30);

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

/// `<target>/debug/<name>`, where `<target>` is `$CARGO_TARGET_DIR` or the workspace's
/// `target/`, found from a simulator crate's manifest directory (three levels below the
/// workspace). It must have been built (`cargo build --workspace`).
pub fn built_binary(manifest_dir: &str, name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(manifest_dir).join("../../../target"));
    target.join("debug").join(name)
}

/// A running simulator process; dropping it stops it.
pub struct Process {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Process {
    /// Starts `binary` with `--runtime <runtime> --exit-on-stdin-eof` after `args`, and
    /// waits (at most 60 s) for its ready line, parsed as `R`.
    pub fn start<R: DeserializeOwned>(
        binary: &Path,
        runtime: &str,
        args: &[std::ffi::OsString],
    ) -> Result<(Process, R), LaunchError> {
        let mut child = Command::new(binary)
            .args(args)
            .args(["--runtime", runtime, "--exit-on-stdin-eof"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| LaunchError::Spawn {
                path: binary.to_path_buf(),
                source,
            })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        // From here on a failure drops the process, which stops the child.
        let process = Process { child, stdin };
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
        let line = match rx.recv_timeout(READY) {
            Ok(Ok(line)) if !line.trim().is_empty() => line,
            other => return Err(LaunchError::NotReady(format!("{other:?}"))),
        };
        let ready = serde_json::from_str(&line)
            .map_err(|e| LaunchError::NotReady(format!("{e}: {line}")))?;
        Ok((process, ready))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // End of stdin asks it to stop and clean up; give it time to remove containers.
        drop(self.stdin.take());
        let deadline = Instant::now() + STOP;
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

/// One call to a simulator's plain-HTTP admin endpoint (`admin_url` is `http://host:port`);
/// answers the JSON body of a 200.
pub async fn admin(
    admin_url: &str,
    method: &str,
    path: &str,
    body: &str,
) -> Result<serde_json::Value, LaunchError> {
    let what = format!("{method} {path}");
    let fail = |why: String| LaunchError::Admin {
        what: what.clone(),
        why,
    };
    let addr = admin_url.trim_start_matches("http://");
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
    tokio::time::timeout(ADMIN, stream.read_to_end(&mut answer))
        .await
        .map_err(|_| fail(format!("no answer within {ADMIN:?}")))?
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
