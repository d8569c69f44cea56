//! One cell interpreter in an openshell session (providers.md §9.6 over grants.md §8.5): the
//! docker session's launcher, kernels, relay program and per-cell protocol, carried by the
//! gateway's `ExecSandboxInteractive` instead of `docker exec`.
//!
//! - launch: the launcher runs in one exec (its `setsid` takes the interpreter out of the
//!   exec's process group, so the interpreter outlives it) and reports the interpreter's
//!   identity; the relay program then runs in a second exec that stays open: its stdin frames
//!   are the host's lines and its stdout events the relay's frames. Cancelling that stream
//!   (dropping the [`Interpreter`]) makes the gateway kill the relay's process group.
//! - proof: the gateway's exec cannot choose a uid, so the identity check runs as the guest
//!   under the runner guard (non-dumpable), in a sandbox the startup proof showed to have Yama
//!   `ptrace_scope >= 1` (no session process can trace it). What a same-uid process can still
//!   do there (write into the relay's or the checker's descriptors under gVisor) shapes its
//!   own session's cell answers only: the nonce, the frame bounds and the deadline are checked
//!   here, on the host, as on docker.
//! - the work directory is the session's (`/tmp/work`, the only writable place the policy
//!   leaves), passed to the launcher and the relay.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use plimsoll::wire::ProjectFile;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::exec::{self, Command, Ending, start_frame};
use super::gateway::Gateway;
use super::proto::v1::ExecSandboxInput;
use super::proto::v1::exec_sandbox_event::Payload as Event;
use super::proto::v1::exec_sandbox_input::Payload as Input;
use super::runs::WORK;
use crate::provider::docker::output::Capped;
use crate::provider::docker::project::GUARD;
use crate::provider::docker::session_boundary as boundary;
use crate::provider::docker::session_cell::{
    CHECK_JS, END_JS, ENV_INTERP_DIR, ENV_WORK, LAUNCH_SCRIPT, RELAY_JS,
};
use crate::provider::docker::session_cell::{CellError, CellLanguage, CellOutcome, ProcessId};
use crate::provider::docker::session_cell::{Frame, FrameError, Lines, QUEUE};

/// The whole launch: the launcher polls for 20 s, plus the gateway's own time.
const LAUNCH_BUDGET: Duration = Duration::from_secs(40);
/// How long the ender may take.
const END_BUDGET: Duration = Duration::from_secs(10);
/// Output kept from the launcher, the checker or the ender (a report is under 100 KiB).
const REPORT_CAP: usize = 256 * 1024;
/// How long the relay's exec may live (the session's lifetime ends it first).
const RELAY_LIFETIME: Duration = Duration::from_secs(13 * 3600);

/// One live interpreter and the exec stream of its relay, in one session sandbox. Dropping it
/// cancels the relay's stream; the interpreter is left to the sweep (or ended by
/// [`Interpreter::close`]).
pub struct Interpreter {
    gateway: Gateway,
    sandbox: String,
    language: CellLanguage,
    interpreter: ProcessId,
    relay: Option<ProcessId>,
    stdin: mpsc::Sender<ExecSandboxInput>,
    frames: mpsc::Receiver<Result<Frame, FrameError>>,
    reader: JoinHandle<()>,
    alive: Arc<AtomicBool>,
}

/// What the prepare step came to.
enum Prepared {
    Ready,
    NoInterpreter,
}

/// The next thing from the relay.
enum Next {
    Frame(Frame),
    Broken(String),
    Deadline,
}

/// The interpreter's argv, kernel directory last (as on docker).
fn interpreter_argv(language: CellLanguage) -> Vec<String> {
    language.interpreter_argv()
}

/// The relay's argv after the guard's `exec`, with the session's work directory.
fn relay_argv(language: CellLanguage) -> Vec<String> {
    ["node", "-e", RELAY_JS, &language.dir(), WORK]
        .iter()
        .map(|a| (*a).to_owned())
        .collect()
}

/// The launcher's argv: the launch script, then the interpreter under the runner guard
/// (`env` execs it, so the PID and command line are the interpreter's; the kernel takes the
/// variable out of its own environment).
fn launcher_argv(language: CellLanguage) -> Vec<String> {
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        LAUNCH_SCRIPT.to_owned(),
        "sh".to_owned(),
        "env".to_owned(),
        format!("LD_PRELOAD={GUARD}"),
    ];
    argv.extend(interpreter_argv(language));
    argv
}

fn command(argv: Vec<String>, env: BTreeMap<String, String>, deadline: Instant) -> Command {
    Command {
        argv,
        env,
        stdin: Vec::new(),
        timeout: deadline.saturating_duration_since(Instant::now()),
        stdout_cap: REPORT_CAP,
        stderr_cap: REPORT_CAP,
    }
}

/// Runs a short program to its end and answers its stdout when it exited 0.
async fn report(gateway: &Gateway, sandbox: &str, command: Command) -> Result<Vec<u8>, String> {
    let ran = exec::run(gateway, sandbox, command)
        .await
        .map_err(|e| e.to_string())?;
    match ran.ending {
        Ending::Exited(0) if !ran.stdout.truncated() => Ok(ran.stdout.bytes().to_vec()),
        Ending::Exited(3) => Err("the interpreter exited before it was ready".to_owned()),
        Ending::Exited(4) => Err("the interpreter was not ready within 20 s".to_owned()),
        Ending::Exited(code) => Err(format!("exited {code}")),
        Ending::TimedOut => Err("did not finish within the launch budget".to_owned()),
        Ending::Lost => Err("its exec stream ended without an exit".to_owned()),
    }
}

/// Reads the relay's stream into a queue of frames until it ends or breaks the protocol; the
/// last item is then the error, and `alive` turns false. Aborting it cancels the stream.
fn spawn_reader(
    mut events: tonic::Streaming<super::proto::v1::ExecSandboxEvent>,
    alive: Arc<AtomicBool>,
) -> (mpsc::Receiver<Result<Frame, FrameError>>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let task = tokio::spawn(async move {
        let mut lines = Lines::default();
        let mut stderr = Capped::new(4096);
        let error = 'read: loop {
            let bytes = match events.message().await {
                Ok(Some(event)) => match event.payload {
                    Some(Event::Stdout(o)) => o.data,
                    Some(Event::Stderr(e)) => {
                        stderr.push(&e.data);
                        continue;
                    }
                    Some(Event::Exit(_)) => break FrameError::Ended,
                    None => continue,
                },
                Ok(None) | Err(_) => break FrameError::Ended,
            };
            let complete = match lines.push(&bytes) {
                Ok(complete) => complete,
                Err(e) => break e,
            };
            for line in complete {
                match Frame::parse(&line) {
                    Ok(frame) => {
                        if tx.send(Ok(frame)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => break 'read e,
                }
            }
        };
        alive.store(false, Ordering::SeqCst);
        if !stderr.bytes().is_empty() {
            let text = String::from_utf8_lossy(stderr.bytes()).into_owned();
            tracing::debug!(relay_stderr = %text, error = %error, "openshell cell relay ended");
        }
        let _ = tx.send(Err(error)).await;
    });
    (rx, task)
}

// === impl Interpreter ===

impl Interpreter {
    /// Starts this language's interpreter and relay in `sandbox` and proves both, within
    /// [`LAUNCH_BUDGET`]. A live interpreter of the same language must be ended first.
    pub async fn launch(
        gateway: &Gateway,
        sandbox: &str,
        language: CellLanguage,
    ) -> Result<Interpreter, CellError> {
        let deadline = Instant::now() + LAUNCH_BUDGET;
        let failed = |why: String| CellError::Launch {
            language: language.name(),
            reason: why,
        };
        let env = BTreeMap::from([
            (ENV_INTERP_DIR.to_owned(), language.dir()),
            (ENV_WORK.to_owned(), WORK.to_owned()),
        ]);
        // The work directory may not exist yet in a fresh session.
        let mut argv = vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            "mkdir -p \"$PLIMSOLL_WORK\" && exec \"$@\"".to_owned(),
            "sh".to_owned(),
        ];
        argv.extend(launcher_argv(language));
        let out = report(gateway, sandbox, command(argv, env, deadline))
            .await
            .map_err(|e| failed(format!("the launcher: {e}")))?;
        let text = String::from_utf8_lossy(&out);
        let interpreter =
            ProcessId::verify(text.trim_end_matches('\n'), &interpreter_argv(language))
                .map_err(|e| failed(e.to_string()))?;

        // The relay, held over an exec stream that stays open.
        let (stdin, rx) = mpsc::channel(4);
        let relay_exec = boundary::guarded_node(RELAY_JS, relay_argv(language)[3..].iter());
        let start = start_frame(sandbox, relay_exec, BTreeMap::new(), RELAY_LIFETIME);
        stdin
            .send(start)
            .await
            .map_err(|_| failed("the relay's stream closed at once".to_owned()))?;
        let opened = tokio::time::timeout_at(deadline, gateway.exec(ReceiverStream::new(rx))).await;
        let events = match opened {
            Ok(Ok(events)) => events,
            Ok(Err(e)) => {
                end(gateway, sandbox, std::slice::from_ref(&interpreter)).await;
                return Err(failed(e.to_string()));
            }
            Err(_) => {
                end(gateway, sandbox, std::slice::from_ref(&interpreter)).await;
                return Err(failed("the relay's exec did not open in time".to_owned()));
            }
        };
        let alive = Arc::new(AtomicBool::new(true));
        let (frames, reader) = spawn_reader(events, Arc::clone(&alive));
        let mut pending = Interpreter {
            gateway: gateway.clone(),
            sandbox: sandbox.to_owned(),
            language,
            interpreter: interpreter.clone(),
            relay: None,
            stdin,
            frames,
            reader,
            alive,
        };
        let relay = match tokio::time::timeout_at(deadline, pending.frames.recv()).await {
            Ok(Some(Ok(Frame::Ready(text)))) => {
                ProcessId::verify(&text, &relay_argv(language)).map_err(|e| failed(e.to_string()))
            }
            Ok(Some(Ok(other))) => Err(failed(format!("the relay began with {other:?}"))),
            Ok(Some(Err(e))) => Err(failed(e.to_string())),
            Ok(None) => Err(failed("the relay's reader stopped".to_owned())),
            Err(_) => Err(failed(
                "the relay did not report within the launch budget".to_owned(),
            )),
        };
        let relay = match relay {
            Ok(relay) => relay,
            Err(e) => {
                pending.end().await;
                return Err(e);
            }
        };
        pending.relay = Some(relay.clone());

        // The identity check, non-dumpable under the runner guard.
        let ids = [interpreter.to_string(), relay.to_string()];
        let check = boundary::guarded_node(CHECK_JS, ids.iter());
        let verdict = report(gateway, sandbox, command(check, BTreeMap::new(), deadline)).await;
        let why = match verdict {
            Ok(out) if out == b"{\"ok\":true}\n" => None,
            Ok(out) => Some(format!(
                "the identity check refused: {}",
                String::from_utf8_lossy(&out).trim()
            )),
            Err(e) => Some(format!("the identity check: {e}")),
        };
        if let Some(why) = why {
            pending.end().await;
            return Err(failed(why));
        }
        Ok(pending)
    }

    /// Runs one cell: writes `files` under the work directory, then runs `code`, keeping
    /// `out_cap` and `err_cap` bytes of its output, until `deadline`. If the interpreter no
    /// longer listens it is relaunched once (the outcome then says `interpreter_started`).
    pub async fn run(
        &mut self,
        files: &[ProjectFile],
        code: &str,
        out_cap: usize,
        err_cap: usize,
        deadline: Instant,
    ) -> Result<CellOutcome, CellError> {
        let language = self.language.name();
        if !self.is_alive() {
            return Err(CellError::Unreachable {
                language,
                reason: "the interpreter ended; launch a fresh one".to_owned(),
            });
        }
        let mut started = false;
        let nonce = loop {
            let nonce = hex::encode(rand::random::<[u8; 16]>());
            match self.prepare(files, &nonce, deadline).await? {
                Prepared::Ready => break nonce,
                Prepared::NoInterpreter if !started => {
                    self.relaunch(deadline).await?;
                    started = true;
                }
                Prepared::NoInterpreter => {
                    self.drop_interpreter();
                    return Err(CellError::Launch {
                        language,
                        reason: "a freshly launched interpreter did not listen".to_owned(),
                    });
                }
            }
        };
        let mut outcome = self
            .execute(&nonce, code, out_cap, err_cap, deadline)
            .await?;
        outcome.interpreter_started = started;
        Ok(outcome)
    }

    /// The identities the sweep must keep: the interpreter's and the relay's.
    pub fn keep_ids(&self) -> Vec<String> {
        std::iter::once(&self.interpreter)
            .chain(self.relay.as_ref())
            .map(ToString::to_string)
            .collect()
    }

    /// Whether the relay still answers and no cell dropped the interpreter.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// The language this interpreter runs.
    pub fn language(&self) -> CellLanguage {
        self.language
    }

    /// Ends the relay and the interpreter (each only if it is still the process launched).
    /// Best effort: the session's sweep is what proves they are gone.
    pub async fn close(mut self) {
        self.end().await;
    }

    async fn end(&mut self) {
        self.drop_interpreter();
        // Cancelling the relay's stream makes the gateway kill its process group.
        self.reader.abort();
        let ids: Vec<ProcessId> = std::iter::once(self.interpreter.clone())
            .chain(self.relay.clone())
            .collect();
        end(&self.gateway, &self.sandbox, &ids).await;
    }

    fn drop_interpreter(&self) {
        self.alive.store(false, Ordering::SeqCst);
    }

    async fn relaunch(&mut self, deadline: Instant) -> Result<(), CellError> {
        self.end().await;
        let fresh = Interpreter::launch(&self.gateway, &self.sandbox, self.language);
        match tokio::time::timeout_at(deadline, fresh).await {
            Ok(fresh) => {
                *self = fresh?;
                Ok(())
            }
            Err(_) => Err(CellError::Unsent {
                language: self.language.name(),
            }),
        }
    }

    async fn send(&mut self, line: &serde_json::Value, deadline: Instant) -> Result<(), String> {
        let mut bytes = line.to_string().into_bytes();
        bytes.push(b'\n');
        let frame = ExecSandboxInput {
            payload: Some(Input::Stdin(bytes)),
        };
        match tokio::time::timeout_at(deadline, self.stdin.send(frame)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err("the relay's stream is closed".to_owned()),
            Err(_) => Err("the deadline passed while writing to the relay".to_owned()),
        }
    }

    async fn next(&mut self, deadline: Instant) -> Next {
        match tokio::time::timeout_at(deadline, self.frames.recv()).await {
            Ok(Some(Ok(frame))) => Next::Frame(frame),
            Ok(Some(Err(e))) => Next::Broken(e.to_string()),
            Ok(None) => Next::Broken("the relay's reader stopped".to_owned()),
            Err(_) => Next::Deadline,
        }
    }

    async fn prepare(
        &mut self,
        files: &[ProjectFile],
        nonce: &str,
        deadline: Instant,
    ) -> Result<Prepared, CellError> {
        let language = self.language.name();
        // Checked before the first byte goes out, so a passed deadline never sends code.
        if Instant::now() >= deadline {
            self.drop_interpreter();
            return Err(CellError::Unsent { language });
        }
        let unreachable = |reason: String| CellError::Unreachable { language, reason };
        let files: Vec<serde_json::Value> = files
            .iter()
            .map(|f| json!({ "path": f.path, "content": f.content }))
            .collect();
        let sent = self
            .send(&json!({ "nonce": nonce, "files": files }), deadline)
            .await;
        if let Err(reason) = sent {
            self.drop_interpreter();
            return Err(if Instant::now() >= deadline {
                CellError::Unsent { language }
            } else {
                unreachable(reason)
            });
        }
        let frame = match self.next(deadline).await {
            Next::Frame(frame) => frame,
            Next::Broken(reason) => {
                self.drop_interpreter();
                return Err(unreachable(reason));
            }
            Next::Deadline => {
                self.drop_interpreter();
                return Err(CellError::Unsent { language });
            }
        };
        match frame {
            Frame::Prepared { n } if n == nonce => Ok(Prepared::Ready),
            Frame::Done {
                n,
                code: 3,
                file: Some(index),
                errno,
                ..
            } if n == nonce => Err(CellError::FileRefused {
                index: usize::try_from(index).unwrap_or(usize::MAX),
                errno: errno.unwrap_or_else(|| "EIO".to_owned()),
            }),
            Frame::Done { n, code: 75, .. } if n == nonce => Ok(Prepared::NoInterpreter),
            other => {
                self.drop_interpreter();
                Err(unreachable(format!(
                    "the relay answered the prepare step with {}",
                    describe(&other, nonce)
                )))
            }
        }
    }

    async fn execute(
        &mut self,
        nonce: &str,
        code: &str,
        out_cap: usize,
        err_cap: usize,
        deadline: Instant,
    ) -> Result<CellOutcome, CellError> {
        let language = self.language.name();
        let run = json!({ "nonce": nonce, "code": code, "outCap": out_cap, "errCap": err_cap });
        if let Err(reason) = self.send(&run, deadline).await {
            // The line may have reached the relay: from here on it may have run.
            self.drop_interpreter();
            return Err(CellError::Lost { language, reason });
        }
        let mut stdout = Capped::new(out_cap);
        let mut stderr = Capped::new(err_cap);
        let lost = |reason: String| CellError::Lost { language, reason };
        loop {
            let frame = match self.next(deadline).await {
                Next::Frame(frame) => frame,
                Next::Broken(reason) => {
                    self.drop_interpreter();
                    return Err(lost(reason));
                }
                Next::Deadline => {
                    // The deadline ends the interpreter: the session ends it before answering.
                    self.drop_interpreter();
                    return Ok(outcome(stdout, stderr, 124, (false, false), true, true));
                }
            };
            if frame.nonce() != Some(nonce) {
                self.drop_interpreter();
                return Err(lost(format!(
                    "the relay sent {} during the cell",
                    describe(&frame, nonce)
                )));
            }
            match frame {
                Frame::Stdout { bytes, .. } => stdout.push(&bytes),
                Frame::Stderr { bytes, .. } => stderr.push(&bytes),
                Frame::Done {
                    code: code @ (0 | 1 | 76),
                    stdout_truncated: ot,
                    stderr_truncated: et,
                    ..
                } => {
                    let ended = code == 76;
                    if ended {
                        self.drop_interpreter();
                    }
                    let exit = if code == 0 { 0 } else { 1 };
                    return Ok(outcome(stdout, stderr, exit, (ot, et), false, ended));
                }
                other => {
                    self.drop_interpreter();
                    return Err(lost(format!(
                        "the relay sent {} during the cell",
                        describe(&other, nonce)
                    )));
                }
            }
        }
    }
}

impl Drop for Interpreter {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// A cell's outcome from its capped output; `cut`: what the relay itself cut.
fn outcome(
    stdout: Capped,
    stderr: Capped,
    exit_code: i32,
    cut: (bool, bool),
    timed_out: bool,
    ended: bool,
) -> CellOutcome {
    let (stdout, stdout_truncated) = stdout.into_parts();
    let (stderr, stderr_truncated) = stderr.into_parts();
    CellOutcome {
        exit_code,
        stdout,
        stderr,
        stdout_truncated: stdout_truncated || cut.0,
        stderr_truncated: stderr_truncated || cut.1,
        timed_out,
        interpreter_started: false,
        interpreter_ended: ended,
    }
}

/// SIGKILLs each process in `ids` that is still the same process.
async fn end(gateway: &Gateway, sandbox: &str, ids: &[ProcessId]) {
    if ids.is_empty() {
        return;
    }
    let mut argv = vec!["node".to_owned(), "-e".to_owned(), END_JS.to_owned()];
    argv.extend(ids.iter().map(ToString::to_string));
    let deadline = Instant::now() + END_BUDGET;
    if let Err(e) = report(gateway, sandbox, command(argv, BTreeMap::new(), deadline)).await {
        tracing::debug!(%sandbox, error = %e, "could not end cell processes; the sweep will");
    }
}

/// A frame, named for a log line (never its payload).
fn describe(frame: &Frame, nonce: &str) -> String {
    let kind = match frame {
        Frame::Ready(_) => "a ready line".to_owned(),
        Frame::Prepared { .. } => "a prepared frame".to_owned(),
        Frame::Stdout { .. } | Frame::Stderr { .. } => "output".to_owned(),
        Frame::Done { code, .. } => format!("done {code}"),
    };
    match frame.nonce() {
        Some(n) if n != nonce => format!("{kind} for another cell"),
        _ => kind,
    }
}
