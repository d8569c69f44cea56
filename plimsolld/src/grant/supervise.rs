//! The development grant path: plimsolld starts the `broker` binary that sits next to its
//! own executable and keeps it running.
//!
//! This is weaker than an operator-run broker, and documented as such: the child inherits
//! plimsolld's whole environment, so the secrets its profiles name pass through the
//! daemon's environment (where an engine escape from the in-process wasm tier would find
//! them). Production runs the broker on its own, under its own uid, and points plimsolld at
//! it with `PLIMSOLL_BROKER_SOCKET`.
//!
//! The control socket lives in a fresh directory of mode 0700, so only plimsolld's uid can
//! reach it. A child that dies is restarted with backoff (1 s doubling to 30 s, reset once
//! a child has lived a minute); meanwhile the grant handle refuses granted runs.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use super::{GrantError, Live};

/// The broker binary's file name, next to plimsolld's.
const BINARY: &str = "broker";
/// The private directories' name prefix, under the temp directory.
const DIR_PREFIX: &str = "plimsoll-broker-";
/// The file in a private directory that holds the owning plimsolld's pid.
const OWNER_FILE: &str = "plimsolld.pid";
/// A private directory older than this whose socket answers nobody is a dead daemon's.
const STALE_AFTER: Duration = Duration::from_secs(60);
/// The first pause before a restart.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest pause before a restart.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a stopped child has to exit after SIGTERM.
const END_GRACE: Duration = Duration::from_secs(3);
/// A child that lived this long resets the backoff.
const HEALTHY_LIFE: Duration = Duration::from_secs(60);

/// The supervised child. Dropping it stops the child.
pub(super) struct Supervisor {
    dir: PathBuf,
    socket: PathBuf,
    shared: Arc<Shared>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// What the supervising task and the handle share.
struct Shared {
    /// Wakes the supervising task to end the child: only that task signals or reaps it, so
    /// a signal can never reach a pid the kernel already gave to another process.
    stop: tokio::sync::Notify,
    exited: Mutex<Option<String>>,
    stopping: AtomicBool,
    live: Mutex<Weak<Live>>,
}

// === impl Supervisor ===

impl Supervisor {
    /// Makes the private directory and starts the first child.
    pub(super) fn start() -> Result<Supervisor, GrantError> {
        let binary = std::env::current_exe()
            .map_err(GrantError::BrokerBinary)?
            .with_file_name(BINARY);
        let tmp = std::env::temp_dir();
        sweep_stale(&tmp);
        let dir = tmp.join(format!(
            "{DIR_PREFIX}{}",
            hex::encode(rand::random::<[u8; 8]>())
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|source| GrantError::PrivateDir {
                path: dir.clone(),
                source,
            })?;
        // Names the owner, so another daemon's sweep leaves a live daemon's directory alone.
        let _ = std::fs::write(dir.join(OWNER_FILE), std::process::id().to_string());
        let socket = dir.join("control.sock");
        let first = spawn(&binary, &socket).map_err(|source| GrantError::Spawn {
            binary: binary.clone(),
            source,
        })?;
        let shared = Arc::new(Shared {
            stop: tokio::sync::Notify::new(),
            exited: Mutex::new(None),
            stopping: AtomicBool::new(false),
            live: Mutex::new(Weak::new()),
        });
        let task = tokio::spawn(keep(first, binary, socket.clone(), shared.clone()));
        Ok(Supervisor {
            dir,
            socket,
            shared,
            task: Mutex::new(Some(task)),
        })
    }

    /// Where the child listens.
    pub(super) fn control_socket(&self) -> PathBuf {
        self.socket.clone()
    }

    /// How the child last exited, if it has.
    pub(super) fn exited(&self) -> Option<String> {
        lock(&self.shared.exited).clone()
    }

    /// Tells `live` at once when the child dies, not a health check later.
    pub(super) fn on_exit(&self, live: Weak<Live>) {
        *lock(&self.shared.live) = live;
    }

    /// [`stop`](Self::stop), then waits until the child has exited (bounded by the grace).
    pub(super) async fn stop_and_wait(&self) {
        self.stop();
        let task = lock(&self.task).take();
        if let Some(task) = task {
            let _ = tokio::time::timeout(END_GRACE + Duration::from_secs(1), task).await;
        }
    }

    /// Stops the child (SIGTERM, then SIGKILL after a grace) and restarts no more.
    pub(super) fn stop(&self) {
        if self.shared.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // A stored permit: the task sees it even if it is not waiting at this moment.
        self.shared.stop.notify_one();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A poisoned lock only means another thread panicked mid-update of a plain value; the
/// value is still the best we have.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes the private directories of daemons that are gone (killed before they could
/// clean up): ours by uid, older than [`STALE_AFTER`], whose owning process no longer
/// exists and whose control socket nobody answers on.
fn sweep_stale(tmp: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let uid = nix::unistd::getuid().as_raw();
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if !meta.is_dir() || meta.uid() != uid || !old {
            continue;
        }
        let owner_alive = std::fs::read_to_string(path.join(OWNER_FILE))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
            .is_some_and(|pid| kill(Pid::from_raw(pid), None).is_ok());
        if !owner_alive
            && std::os::unix::net::UnixStream::connect(path.join("control.sock")).is_err()
        {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

fn spawn(binary: &Path, socket: &Path) -> std::io::Result<Child> {
    // Stale from a dead child: the new one must be able to bind.
    let _ = std::fs::remove_file(socket);
    let mut command = Command::new(binary);
    command
        .env(broker::env::BROKER_SOCKET, socket)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    die_with_parent(&mut command);
    command.spawn()
}

/// Makes the child get SIGTERM when plimsolld dies: a plimsolld killed outright (SIGKILL,
/// a crash) would otherwise leave a broker holding the secrets with nobody to stop it.
///
/// The kernel sends the signal when the *thread* that forked the child ends. The children
/// are spawned from the daemon's main thread (the first) and from runtime worker threads
/// (restarts), which all live as long as the process.
#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe work is allowed. It makes two plain system calls (`prctl(2)`,
    // `getppid(2)`) and builds errors from raw errno values, which neither allocates nor
    // takes a lock.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)?;
            // plimsolld died before the request took effect: do not outlive it.
            if nix::unistd::getppid() != parent {
                return Err(nix::errno::Errno::ESRCH.into());
            }
            Ok(())
        });
    }
}

/// Waits on the child and restarts it with backoff until [`Supervisor::stop`].
async fn keep(mut child: Child, binary: PathBuf, socket: PathBuf, shared: Arc<Shared>) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let born = Instant::now();
        let status = tokio::select! {
            waited = child.wait() => match waited {
                Ok(s) => s.to_string(),
                Err(e) => format!("wait failed: {e}"),
            },
            () = shared.stop.notified() => {
                end(&mut child).await;
                return;
            }
        };
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        *lock(&shared.exited) = Some(status.clone());
        if let Some(live) = lock(&shared.live).upgrade() {
            live.mark_down(&format!("the broker child exited ({status})"));
        }
        if born.elapsed() >= HEALTHY_LIFE {
            backoff = FIRST_BACKOFF;
        }
        tracing::warn!(
            status = %status,
            restart_in_ms = backoff.as_millis() as u64,
            "broker child exited; restarting it"
        );
        child = loop {
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = shared.stop.notified() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            if shared.stopping.load(Ordering::SeqCst) {
                return;
            }
            match spawn(&binary, &socket) {
                Ok(c) => break c,
                Err(e) => {
                    tracing::error!(binary = %binary.display(), error = %e, "cannot restart the broker child")
                }
            }
        };
        // A stop that raced the restart must not leave the new child running.
        if shared.stopping.load(Ordering::SeqCst) {
            end(&mut child).await;
            return;
        }
    }
}

/// Ends the child: SIGTERM first, so the broker revokes its open runs and removes their
/// sockets, SIGKILL if it has not exited within [`END_GRACE`]. Only the supervising task
/// calls this, before it has reaped the child, so the pid is still the child's own.
async fn end(child: &mut Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    if tokio::time::timeout(END_GRACE, child.wait()).await.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}
