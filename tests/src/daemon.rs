//! Starting, watching and stopping the built binaries.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

/// How long a daemon may take to log `plimsolld listening`.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a dropped daemon may take to drain after SIGTERM before it is killed.
const DROP_GRACE: Duration = Duration::from_secs(20);
/// How long a process may take to exit after SIGTERM, or a refused start to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// The line `plimsolld` logs once it serves (config.md §8).
const LISTENING: &str = "plimsolld listening";

/// The workspace root: the parent of this crate's directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits inside the workspace")
        .to_path_buf()
}

/// The path of a built workspace binary, `<target>/debug/<name>`.
///
/// `<target>` is `$CARGO_TARGET_DIR` when set (relative to the workspace root when
/// relative), else the workspace's `target/`. `$PLIMSOLLD`, when set, names the `plimsolld`
/// to run instead (as in the Python interop harness; the benchmarks use it for a release
/// build). Panics when the file does not exist: the harness builds nothing, so the test
/// command must build the workspace first.
pub fn binary(name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os("PLIMSOLLD").filter(|_| name == "plimsolld") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "PLIMSOLLD={} is not a file", path.display());
        return path;
    }
    let root = workspace_root();
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    };
    let path = target.join("debug").join(name);
    assert!(
        path.is_file(),
        "{} does not exist: the end-to-end tests run the built binary and build nothing. \
         Run `cargo build --workspace --all-targets` first (scripts/test does).",
        path.display()
    );
    warn_if_stale(&path, &root);
    path
}

/// Warns once when a source file of the daemon is newer than the binary under test.
fn warn_if_stale(bin: &Path, root: &Path) {
    static WARNED: Once = Once::new();
    let Ok(built) = bin.metadata().and_then(|m| m.modified()) else {
        return;
    };
    let newest = ["plimsolld/src", "plimsoll/src", "proto"]
        .iter()
        .filter_map(|dir| newest_file(&root.join(dir)))
        .max();
    if newest.is_some_and(|t| t > built) {
        WARNED.call_once(|| {
            eprintln!(
                "warning: {} is older than the daemon's sources; run `cargo build --workspace` \
                 to test the current code",
                bin.display()
            );
        });
    }
}

fn newest_file(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let time = if path.is_dir() {
            newest_file(&path)
        } else {
            entry.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(time);
    }
    newest
}

/// A command with exactly the given environment: `PATH` and nothing else is inherited,
/// so a developer's own `PLIMSOLL_TOKEN` cannot change what a test sees.
fn command(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(args).env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

// === impl Daemon ===

/// A running `plimsolld`, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Daemon {
    child: Child,
    /// The RPC listener's bound address, from the listening line.
    pub addr: SocketAddr,
    /// The metrics listener's bound address; `None` when the line says `off`.
    pub metrics_addr: Option<SocketAddr>,
    /// The listening line, parsed.
    pub listening: Value,
    log: Arc<Mutex<Vec<String>>>,
    reader: Option<JoinHandle<()>>,
    exited: Option<ExitStatus>,
}

impl Daemon {
    /// Starts `plimsolld` in open dev mode with the default (disabled) provider.
    pub fn open() -> Daemon {
        Daemon::start(&[])
    }

    /// Starts `plimsolld` with a shared `PLIMSOLL_TOKEN`.
    pub fn with_token(token: &str) -> Daemon {
        Daemon::start(&[("PLIMSOLL_TOKEN", token)])
    }

    /// Starts `plimsolld` with `env` on top of `PLIMSOLL_ADDR=127.0.0.1:0` and
    /// `PLIMSOLL_METRICS_ADDR=127.0.0.1:0` (both overridable), and waits for its
    /// listening line. Panics with the captured log if it does not come within 30 s.
    pub fn start(env: &[(&str, &str)]) -> Daemon {
        Daemon::start_within(env, START_TIMEOUT)
    }

    /// Starts `plimsolld` as [`Daemon::start`] does, waiting at most `timeout` for its
    /// listening line (a first wasm start compiles the guest and needs longer).
    pub fn start_within(env: &[(&str, &str)], timeout: Duration) -> Daemon {
        match Daemon::launch_within(env, timeout) {
            Ok(d) => d,
            Err(out) => panic!(
                "plimsolld exited ({}) before listening; its log:\n{}",
                out.status, out.stderr
            ),
        }
    }

    /// Starts `plimsolld` with a configuration it must refuse, and returns how it ended.
    /// Panics (with the log) if it serves instead: it is killed at its listening line.
    pub fn refuse(env: &[(&str, &str)]) -> Finished {
        match Daemon::launch(env) {
            Ok(d) => panic!(
                "plimsolld started serving with {env:?}, which it must refuse; its log:\n{}",
                d.logs().join("\n")
            ),
            Err(out) => out,
        }
    }

    /// Starts `plimsolld` as [`Daemon::start`] does: `Ok` once it listens, `Err` with
    /// its exit status and log when it exits first.
    pub fn launch(env: &[(&str, &str)]) -> Result<Daemon, Finished> {
        Daemon::launch_within(env, START_TIMEOUT)
    }

    /// Starts `plimsolld` as [`Daemon::start`] does, with its open-file limit (soft and
    /// hard) lowered to `limit` first, so its connection cap (half the limit) is small.
    pub fn start_with_open_files(env: &[(&str, &str)], limit: u32, timeout: Duration) -> Daemon {
        match Daemon::launch_with(env, Some(limit), timeout) {
            Ok(d) => d,
            Err(out) => panic!(
                "plimsolld exited ({}) before listening; its log:\n{}",
                out.status, out.stderr
            ),
        }
    }

    fn launch_within(env: &[(&str, &str)], timeout: Duration) -> Result<Daemon, Finished> {
        Daemon::launch_with(env, None, timeout)
    }

    fn launch_with(
        env: &[(&str, &str)],
        open_files: Option<u32>,
        timeout: Duration,
    ) -> Result<Daemon, Finished> {
        let mut full: Vec<(&str, &str)> = vec![
            ("PLIMSOLL_ADDR", "127.0.0.1:0"),
            ("PLIMSOLL_METRICS_ADDR", "127.0.0.1:0"),
        ];
        // A docker daemon runs the images under test unless the test names its own.
        if env.contains(&("SANDBOX_PROVIDER", "docker")) {
            full.push(("SANDBOX_DOCKER_IMAGE", crate::docker::snippet_image()));
            full.push((
                "SANDBOX_DOCKER_PROJECT_IMAGE",
                crate::docker::project_image(),
            ));
        }
        for (k, v) in env {
            full.retain(|(name, _)| name != k);
            full.push((k, v));
        }
        let bin = binary("plimsolld");
        let mut cmd = match open_files {
            None => command(&bin, &[], &full),
            // The shell lowers both limits and execs the daemon in its place (same pid).
            Some(limit) => {
                let script = format!("ulimit -n {limit} && exec \"$0\"");
                let bin = bin.display().to_string();
                command(Path::new("/bin/sh"), &["-c", &script, &bin], &full)
            }
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn plimsolld");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let reader = {
            let log = Arc::clone(&log);
            std::thread::spawn(move || read_log(stderr, &log, &tx))
        };
        let mut daemon = Daemon {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_addr: None,
            listening: Value::Null,
            log,
            reader: Some(reader),
            exited: None,
        };
        match rx.recv_timeout(timeout) {
            Ok(Some(line)) => {
                daemon.listening = line;
                daemon.addr = socket_addr(&daemon.listening, "addr")
                    .unwrap_or_else(|| panic!("listening line without addr: {}", daemon.listening));
                daemon.metrics_addr = socket_addr(&daemon.listening, "metrics_addr");
                Ok(daemon)
            }
            Ok(None) => {
                let status = daemon.wait_exit();
                Err(Finished {
                    status,
                    stdout: String::new(),
                    stderr: daemon.logs().join("\n"),
                })
            }
            Err(_) => panic!(
                "plimsolld neither listened nor exited within {timeout:?}; its log:\n{}",
                daemon.logs().join("\n")
            ),
        }
    }

    /// The raw log lines written so far.
    pub fn logs(&self) -> Vec<String> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The log lines written so far that parse as JSON objects.
    pub fn log_records(&self) -> Vec<Value> {
        self.logs()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(Value::is_object)
            .collect()
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits (at most 30 s) for the exit; the log is complete after.
    pub fn sigterm(&mut self) -> ExitStatus {
        if let Some(status) = self.exited {
            return status;
        }
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("send SIGTERM");
        self.wait_exit()
    }

    /// Waits for the process to exit by itself (at most 30 s), then for its log to end.
    pub fn wait_exit(&mut self) -> ExitStatus {
        if let Some(status) = self.exited {
            return status;
        }
        let deadline = Instant::now() + EXIT_TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("poll plimsolld") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "plimsolld did not exit within {EXIT_TIMEOUT:?}; its log:\n{}",
                    self.logs().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.exited = Some(status);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        status
    }
}

impl Drop for Daemon {
    /// SIGTERM first, so the daemon drains as in production: its containers (a docker
    /// pool's included) are removed and a supervised broker is stopped, and no test leaves
    /// anything behind. SIGKILL only if it has not exited within [`DROP_GRACE`].
    fn drop(&mut self) {
        if self.exited.is_none() {
            stop(&mut self.child, DROP_GRACE);
        }
    }
}

/// Stops a child process: SIGTERM, then SIGKILL if it has not exited within `grace`. A child
/// already reaped is left alone (its pid may belong to another process by now).
pub fn stop(child: &mut Child, grace: Duration) {
    if !matches!(child.try_wait(), Ok(None)) {
        return;
    }
    let pid = rustix::process::Pid::from_child(child);
    if rustix::process::kill_process(pid, rustix::process::Signal::TERM).is_ok() {
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Collects stderr line by line and reports the listening line (or the end of the log).
fn read_log(stderr: impl Read, log: &Mutex<Vec<String>>, tx: &mpsc::Sender<Option<Value>>) {
    let mut reader = BufReader::new(stderr);
    let mut buf = Vec::new();
    let mut told = false;
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let line = String::from_utf8_lossy(&buf).trim_end().to_string();
        let listening = serde_json::from_str::<Value>(&line)
            .ok()
            .filter(|v| v.get("msg").and_then(Value::as_str) == Some(LISTENING));
        // The line joins the log before anyone is told, so the log a test reads
        // after start() always holds it.
        if let Ok(mut l) = log.lock() {
            l.push(line);
        }
        if !told && let Some(v) = listening {
            told = true;
            let _ = tx.send(Some(v));
        }
    }
    if !told {
        let _ = tx.send(None);
    }
}

fn socket_addr(line: &Value, key: &str) -> Option<SocketAddr> {
    line.get(key)?.as_str()?.parse().ok()
}

// === impl Finished ===

/// A process that ran to its exit.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// The stderr lines that parse as JSON log records.
    pub fn log_records(&self) -> Vec<Value> {
        self.stderr
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(Value::is_object)
            .collect()
    }

    /// The exit code, panicking when a signal ended the process.
    pub fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("killed by a signal: {self:?}"))
    }
}

/// Runs the workspace binary `name` with `args` and exactly `env` (plus `PATH`), with
/// `stdin` as its standard input, and waits at most 30 s for it to exit.
pub fn finish(name: &str, args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> Finished {
    let mut child = command(&binary(name), args, env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
    let mut input = child.stdin.take().expect("stdin is piped");
    let stdin = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let _ = input.write_all(&stdin);
    });
    let stdout = drain(child.stdout.take().expect("stdout is piped"));
    let stderr = drain(child.stderr.take().expect("stderr is piped"));
    let deadline = Instant::now() + EXIT_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{name} {args:?} with {env:?} did not exit within {EXIT_TIMEOUT:?}; its stderr:\n{}",
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = writer.join();
    Finished {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}
