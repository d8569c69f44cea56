//! One fresh container, start to finish (providers.md §5.6), in two steps:
//! [`prepare`] creates it locked down and attaches to it before the start, so no byte is lost;
//! [`Prepared::run`] starts it, feeds stdin, keeps the output under its caps until the
//! streams end or the deadline passes, reads the exit code, and removes the container. The
//! pool (`pool.rs`) holds a prepared snippet container between the two steps.
//!
//! The classification follows the start marker: no marker means docker never started the
//! command, which is an infrastructure error whatever the exit code says; with the marker, a
//! passed deadline is exit 124 `timed_out`, and any other exit (an OOM kill's 137 included) is
//! the guest's result. The deadline is read before cleanup, so a slow removal never looks like
//! a timeout. Snippets use this today; projects and the startup proof use the same calls with
//! another [`Shape`](super::lockdown::Shape).

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::container::{AttachContainerResults, LogOutput};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

use super::DockerError;
use super::engine::Engine;
use super::lockdown::{self, Identity, Shape};
use super::preflight::VerifiedImage;
use super::removal;
use super::settings::Settings;
use crate::provider::Hold;
use crate::provider::guest::output::{Kept, Output};

/// The exit code of a run the deadline ended.
pub const EXIT_TIMED_OUT: i32 = 124;
/// How long the exit code may take to arrive once the output streams have ended.
const WAIT_AFTER_STREAMS: Duration = Duration::from_secs(10);

/// What the provider shares with every run.
pub struct Context<'a> {
    /// The Engine.
    pub engine: &'a Engine,
    /// The enforced settings.
    pub settings: &'a Settings,
    /// The seccomp profile text to send, when one applies.
    pub seccomp: Option<&'a str>,
    /// This daemon's instance id (the containers' label).
    pub instance: &'a str,
    /// The containers this process holds.
    pub held: &'a Arc<Held>,
}

/// One run's inputs.
pub struct Request<'a> {
    /// The image, as preflight verified it.
    pub image: &'a VerifiedImage,
    /// The command.
    pub argv: Vec<String>,
    /// Run variables after the image's own ENV (`NAME=value`).
    pub run_env: Vec<String>,
    /// Whether the command gets the image's own ENV (the project runner does not: it hands
    /// the image's ENV to the steps itself).
    pub image_env: bool,
    /// What the command reads on stdin (the snippet's code).
    pub stdin: Vec<u8>,
    /// The guest's time, from the start of the container.
    pub timeout: Duration,
    /// Whether to mount `/work`.
    pub work: bool,
    /// A host socket to mount at `/run/host-api.sock`.
    pub socket: Option<&'a Path>,
    /// Who the container's first process is.
    pub identity: Identity,
    /// `run` or `smoke`.
    pub role: &'static str,
    /// How much of stdout to keep (stderr keeps [`OUTPUT_CAP`](super::settings::OUTPUT_CAP)).
    pub stdout_cap: usize,
    /// Told the container id once the container has started.
    pub started: Option<tokio::sync::oneshot::Sender<String>>,
}

/// A run that docker started (the marker was seen).
#[derive(Debug, Clone)]
pub struct Finished {
    /// The guest's stdout, capped, and whether it was cut.
    pub stdout: Kept,
    /// The guest's stderr after the marker, capped, and whether it was cut.
    pub stderr: Kept,
    /// The guest's exit code; [`EXIT_TIMED_OUT`] when the deadline ended it.
    pub exit_code: i32,
    /// Whether the deadline ended it.
    pub timed_out: bool,
    /// The container id (64 hex).
    pub container_id: String,
    /// From the start call's answer to the end of the output.
    pub duration: Duration,
}

/// A random 16-hex suffix.
pub fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 8]>())
}

/// Now, in unix seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs `req` in a fresh container and removes it afterwards (in the background: the answer
/// does not wait for the removal, the drain does).
pub async fn run(ctx: &Context<'_>, req: Request<'_>) -> Result<Finished, DockerError> {
    run_holding(ctx, req, Hold::default()).await
}

/// [`run`], keeping `hold` (the run's admission slot) until the container is removed.
pub async fn run_holding(
    ctx: &Context<'_>,
    req: Request<'_>,
    hold: Hold,
) -> Result<Finished, DockerError> {
    let shape = Prepare {
        image: req.image,
        argv: &req.argv,
        run_env: &req.run_env,
        image_env: req.image_env,
        work: req.work,
        socket: req.socket,
        identity: req.identity,
        role: req.role,
        // The ceiling of the deadline, with the start budget in front of it.
        lifetime: req.timeout + Duration::from_secs(1) + super::engine::START,
    };
    let mut prepared = prepare(ctx, &shape).await?;
    prepared.keep_until_removed(hold);
    prepared
        .run(
            ctx.engine,
            req.stdin,
            req.timeout,
            req.stdout_cap,
            req.started,
        )
        .await
}

/// What a container is created for; the run's input and deadline come later.
pub struct Prepare<'a> {
    /// The image, as preflight verified it.
    pub image: &'a VerifiedImage,
    /// The command.
    pub argv: &'a [String],
    /// Run variables after the image's own ENV.
    pub run_env: &'a [String],
    /// Whether the command gets the image's own ENV.
    pub image_env: bool,
    /// Whether to mount `/work`.
    pub work: bool,
    /// A host socket to mount at `/run/host-api.sock`.
    pub socket: Option<&'a Path>,
    /// Who the container's first process is.
    pub identity: Identity,
    /// `run` or `smoke`.
    pub role: &'static str,
    /// How long from now the container may exist, its run included (its expiry label).
    pub lifetime: Duration,
}

/// A container created and attached, never started: it runs exactly once, or is removed.
pub struct Prepared {
    id: String,
    marker: String,
    output: std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
    >,
    input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    /// The image id it was created from.
    pub image_id: String,
    /// The seccomp profile it was created with.
    pub seccomp: Option<String>,
    /// When it was created.
    pub created: Instant,
    // Dropping the lease removes the container.
    lease: Lease,
}

/// Creates and attaches a container for `shape`.
pub async fn prepare(ctx: &Context<'_>, shape: &Prepare<'_>) -> Result<Prepared, DockerError> {
    let name = format!("crsbx-{}", random_hex());
    let marker = format!("plimsoll-started:{}", random_hex());
    let mut env = if shape.image_env {
        shape.image.env.clone()
    } else {
        Vec::new()
    };
    env.extend(shape.run_env.iter().cloned());
    let body = lockdown::create_body(
        ctx.settings,
        &Shape {
            image_id: &shape.image.id,
            marker: &marker,
            env: &env,
            argv: shape.argv,
            work: shape.work,
            socket: shape.socket,
            identity: shape.identity,
            expires: unix_now() + shape.lifetime.as_secs() + 1,
            instance: ctx.instance,
            role: shape.role,
            seccomp: ctx.seccomp,
        },
    );
    // From here on the container is ours to remove, whatever happens to this future.
    let lease = Lease::new(ctx.engine.clone(), Arc::clone(ctx.held), name);
    let id = ctx.engine.create(&lease.name, body).await?;
    // Attached before the start, so no byte of output is lost.
    let AttachContainerResults { output, input } = ctx.engine.attach(&id).await?;
    Ok(Prepared {
        id,
        marker,
        output,
        input,
        image_id: shape.image.id.clone(),
        seccomp: ctx.seccomp.map(str::to_owned),
        created: Instant::now(),
        lease,
    })
}

impl Prepared {
    /// Keeps `hold` until this container has been removed, not merely until
    /// its run returns.
    pub fn keep_until_removed(&mut self, hold: Hold) {
        self.lease.keep = hold;
    }

    /// Starts the container with `stdin` as its input and keeps its output (stdout up to
    /// `stdout_cap`) until the streams end or `timeout` passes; the container is removed when
    /// this returns.
    pub async fn run(
        self,
        engine: &Engine,
        stdin: Vec<u8>,
        timeout: Duration,
        stdout_cap: usize,
        started_tell: Option<tokio::sync::oneshot::Sender<String>>,
    ) -> Result<Finished, DockerError> {
        let Prepared {
            id,
            marker,
            mut output,
            mut input,
            lease: _lease,
            ..
        } = self;
        engine.start(&id).await?;
        let started = Instant::now();
        if let Some(tell) = started_tell {
            let _ = tell.send(id.clone());
        }
        let deadline = tokio::time::Instant::from_std(started + timeout);

        // stdin in its own task: a guest that writes before it reads must not deadlock us.
        let writer = tokio::spawn(async move {
            let _ = input.write_all(&stdin).await;
            // Half-close: with stdin_once, docker then closes the container's stdin.
            let _ = input.shutdown().await;
        });
        let mut out = Output::new(&marker, stdout_cap);
        let mut timed_out = false;
        loop {
            tokio::select! {
                item = output.next() => match item {
                    Some(Ok(LogOutput::StdOut { message })) => out.stdout.push(&message),
                    Some(Ok(LogOutput::StdErr { message })) => out.stderr.push(&message),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::debug!(container = %id, error = %e, "attach stream ended with an error");
                        break;
                    }
                    None => break,
                },
                () = tokio::time::sleep_until(deadline) => {
                    timed_out = true;
                    break;
                }
            }
        }
        let duration = started.elapsed();
        writer.abort();
        drop(output);

        let exit_code = if timed_out {
            EXIT_TIMED_OUT
        } else {
            match engine.wait(&id, WAIT_AFTER_STREAMS).await {
                Ok(code) => i32::try_from(code).unwrap_or(i32::MAX),
                Err(e) if out.marker_seen() => return Err(e),
                Err(_) => -1,
            }
        };
        let not_started = || DockerError::NotStarted {
            container: id.clone(),
            exit_code,
            timed_out,
        };
        if !out.marker_seen() {
            return Err(not_started());
        }
        if exit_code == 137 {
            log_oom(engine, &id).await;
        }
        let (stdout, stderr) = out.guest_streams().ok_or_else(not_started)?;
        Ok(Finished {
            stdout,
            stderr,
            exit_code,
            timed_out,
            container_id: id,
            duration,
        })
    }
}

async fn log_oom(engine: &Engine, id: &str) {
    if let Ok(inspected) = engine.inspect_container(id).await {
        let oom = inspected.state.and_then(|s| s.oom_killed).unwrap_or(false);
        tracing::info!(
            container = id,
            oom_killed = oom,
            "guest exited with 137 (SIGKILL)"
        );
    }
}

// === impl Lease ===

/// A container this process must remove: dropping the lease starts the removal, so a run
/// whose caller went away mid-run still cleans up.
struct Lease {
    engine: Engine,
    held: Arc<Held>,
    name: String,
    /// Dropped once the container is removed (the run's admission slot).
    keep: Hold,
}

impl Lease {
    fn new(engine: Engine, held: Arc<Held>, name: String) -> Lease {
        held.hold(&name);
        Lease {
            engine,
            held,
            name,
            keep: Hold::default(),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let engine = self.engine.clone();
        let held = Arc::clone(&self.held);
        let name = std::mem::take(&mut self.name);
        let keep = std::mem::take(&mut self.keep);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime means the process is ending; the expiry label is the backstop.
            held.release(&name);
            return;
        };
        runtime.spawn(async move {
            let _ = removal::force_remove(&engine, &name).await;
            held.release(&name);
            drop(keep);
        });
    }
}

// === impl Held ===

/// The containers this process holds (runs in flight and removals under way): the orphan
/// sweep never touches them, and the drain waits for them.
#[derive(Debug, Default)]
pub struct Held {
    names: Mutex<HashSet<String>>,
    changed: Notify,
}

impl Held {
    fn hold(&self, name: &str) {
        self.lock().insert(name.to_owned());
    }

    fn release(&self, name: &str) {
        self.lock().remove(name);
        self.changed.notify_waiters();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // A panic while holding this lock leaves a valid set; keep using it.
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `name` is held.
    pub fn contains(&self, name: &str) -> bool {
        self.lock().contains(name)
    }

    /// How many containers are held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Waits until nothing is held or `budget` passes; returns how many are still held.
    pub async fn settle(&self, budget: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let notified = self.changed.notified();
            let left = self.len();
            if left == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.len();
            }
        }
    }
}
