//! The development grant path: plimsolld starts the `broker` binary that sits next to its
//! own executable and keeps it running, and, when `PLIMSOLL_GUARD_ADDR` is set, the `guard`
//! binary beside it.
//!
//! This is weaker than an operator-run broker, and documented as such: the child inherits
//! plimsolld's whole environment, so the secrets its profiles name pass through the
//! daemon's environment (where an engine escape from the in-process wasm tier would find
//! them). Production runs the broker on its own, under its own uid, and points plimsolld at
//! it with `PLIMSOLL_BROKER_SOCKET`; it runs the guard on its own too, under a third uid, so
//! the one process that faces the network shares nothing with the daemon.
//!
//! The control socket (and the broker's guard socket) live in a fresh directory of mode 0700,
//! so only plimsolld's uid can reach them. A child that dies is restarted with backoff (1 s
//! doubling to 30 s, reset once a child has lived a minute); meanwhile the grant handle
//! refuses granted runs (a dead broker) or the guard's port refuses connections (a dead
//! guard, restarted on the port it had, and finding every token where it was: they live in
//! the broker).

use std::ffi::OsString;
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
/// The guard binary's file name, next to plimsolld's.
const GUARD_BINARY: &str = "guard";
/// The broker's control socket in the private directory.
const CONTROL_SOCKET: &str = "control.sock";
/// The broker's guard socket in the private directory.
const GUARD_SOCKET: &str = "guard.sock";
/// The file the guard child writes its bound address to.
const GUARD_ADDR_FILE: &str = "guard.addr";
/// How long the guard child may take to listen.
const GUARD_START_WAIT: Duration = Duration::from_secs(20);
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

/// What plimsolld tells a guard it supervises: the settings of config.md it shares with the
/// guard binary. The rest (TLS, hardened mode, the log format) the child inherits, and
/// nothing else of plimsolld's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardChild {
    /// `PLIMSOLL_GUARD_ADDR`.
    pub addr: String,
    /// The daemon's run cap after the memory clamp: the guard decodes twice as many bodies.
    pub max_concurrent: u32,
}

/// How a child is started, at first and at each restart.
struct Launch {
    binary: PathBuf,
    /// The binary's name, for log lines.
    name: &'static str,
    /// Variables set on top of what the child inherits, computed at each start.
    env: Box<dyn Fn() -> Vec<(&'static str, OsString)> + Send + Sync>,
    /// The only variables the child inherits; `None`: all of them (the broker reads each
    /// profile's variables, named in the grants file).
    inherit: Option<&'static [(&'static str, &'static str)]>,
    /// Files a dead child may have left that the next one must not find (its sockets).
    stale: Vec<PathBuf>,
}

/// A supervised child. Dropping it stops the child.
pub(super) struct Supervisor {
    /// The private directory, for the broker's supervisor (which removes it).
    dir: Option<PathBuf>,
    socket: PathBuf,
    /// The guard child's bound address, once it listened.
    bound: Arc<Mutex<Option<String>>>,
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
    /// Makes the private directory and starts the first broker child, telling it the uid
    /// docker guests run as (`guest_uid`; the broker's default when `None`); with `guard`,
    /// the broker also serves its guard socket there.
    pub(super) fn start_broker(
        guest_uid: Option<u32>,
        guard: bool,
    ) -> Result<Supervisor, GrantError> {
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
        let socket = dir.join(CONTROL_SOCKET);
        let guard_socket = dir.join(GUARD_SOCKET);
        let (control, guarded) = (socket.clone(), guard_socket.clone());
        let launch = Launch {
            binary,
            name: BINARY,
            env: Box::new(move || {
                let mut env = vec![(broker::env::BROKER_SOCKET, control.clone().into())];
                if guard {
                    env.push((broker::env::BROKER_GUARD_SOCKET, guarded.clone().into()));
                }
                // The one peer besides root and its own uid its guest sockets answer.
                if let Some(uid) = guest_uid {
                    env.push((broker::env::BROKER_GUEST_UID, uid.to_string().into()));
                }
                env
            }),
            inherit: None,
            stale: vec![socket.clone(), guard_socket],
        };
        Supervisor::launch(launch, Some(dir), socket, Arc::default())
    }

    /// Starts the guard child beside this broker child, on the broker's guard socket, and
    /// waits until it listens. A restarted guard binds the address the first one bound.
    pub(super) async fn start_guard(
        &self,
        settings: &GuardChild,
    ) -> Result<Supervisor, GrantError> {
        let dir = self.dir.clone().unwrap_or_else(std::env::temp_dir);
        let binary = std::env::current_exe()
            .map_err(GrantError::BrokerBinary)?
            .with_file_name(GUARD_BINARY);
        let addr_file = dir.join(GUARD_ADDR_FILE);
        let bound: Arc<Mutex<Option<String>>> = Arc::default();
        let (first, known, file) = (settings.addr.clone(), bound.clone(), addr_file.clone());
        let (socket, max) = (dir.join(GUARD_SOCKET), settings.max_concurrent);
        let launch = Launch {
            binary,
            name: GUARD_BINARY,
            env: Box::new(move || {
                let addr = lock(&known).clone().unwrap_or_else(|| first.clone());
                vec![
                    (guard::env::GUARD_ADDR, addr.into()),
                    (guard::env::GUARD_ADDR_FILE, file.clone().into()),
                    (guard::env::BROKER_GUARD_SOCKET, socket.clone().into()),
                    (guard::env::MAX_CONCURRENT, max.to_string().into()),
                ]
            }),
            // The guard faces the network: it gets what it reads and nothing else (never
            // the daemon's vendor keys or caller tokens).
            inherit: Some(guard::env::VARIABLES),
            stale: vec![addr_file.clone()],
        };
        let child = Supervisor::launch(launch, None, dir.join(GUARD_SOCKET), bound)?;
        let started = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&addr_file)
                && let Some(addr) = text.strip_suffix('\n')
            {
                *lock(&child.bound) = Some(addr.to_owned());
                return Ok(child);
            }
            if let Some(status) = child.exited() {
                child.stop();
                return Err(GrantError::Guard(format!(
                    "it exited ({status}); see its log line above"
                )));
            }
            if started.elapsed() >= GUARD_START_WAIT {
                child.stop();
                return Err(GrantError::Guard(format!(
                    "it did not listen within {GUARD_START_WAIT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn launch(
        launch: Launch,
        dir: Option<PathBuf>,
        socket: PathBuf,
        bound: Arc<Mutex<Option<String>>>,
    ) -> Result<Supervisor, GrantError> {
        let first = spawn(&launch).map_err(|source| GrantError::Spawn {
            binary: launch.binary.clone(),
            source,
        })?;
        let shared = Arc::new(Shared {
            stop: tokio::sync::Notify::new(),
            exited: Mutex::new(None),
            stopping: AtomicBool::new(false),
            live: Mutex::new(Weak::new()),
        });
        let task = tokio::spawn(keep(first, launch, shared.clone()));
        Ok(Supervisor {
            dir,
            socket,
            bound,
            shared,
            task: Mutex::new(Some(task)),
        })
    }

    /// The guard child's bound address, once it listened.
    pub(super) fn guard_addr(&self) -> Option<String> {
        lock(&self.bound).clone()
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
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
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
            && std::os::unix::net::UnixStream::connect(path.join(CONTROL_SOCKET)).is_err()
        {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

fn spawn(launch: &Launch) -> std::io::Result<Child> {
    // Stale from a dead child: the new one must be able to bind.
    for path in &launch.stale {
        let _ = std::fs::remove_file(path);
    }
    let mut command = Command::new(&launch.binary);
    if let Some(names) = launch.inherit {
        command.env_clear();
        for (name, _) in names {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
    }
    command
        .envs((launch.env)())
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
async fn keep(mut child: Child, launch: Launch, shared: Arc<Shared>) {
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
            child = launch.name,
            status = %status,
            restart_in_ms = backoff.as_millis() as u64,
            "supervised child exited; restarting it"
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
            match spawn(&launch) {
                Ok(c) => break c,
                Err(e) => {
                    tracing::error!(binary = %launch.binary.display(), error = %e, "cannot restart a supervised child")
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
/// sockets (and the guard finishes its requests in flight), SIGKILL if it has not exited
/// within [`END_GRACE`]. Only the supervising task
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
