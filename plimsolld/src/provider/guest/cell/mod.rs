//! Notebook cells in a session (providers.md §9.6, wire.md §7.4), on any provider that
//! implements [`GuestExec`]: one live interpreter per language per session, whose state carries
//! from one cell to the next.
//!
//! An [`Interpreter`] is a kernel process (`node --expose-internals` or `python3 -I`) started
//! by the launcher script in its own session with its output on two FIFOs, plus a relay
//! program (the image's static `plimsoll-relay cell`, which makes itself non-dumpable; where
//! the image has none, a Node program under the runner guard: [`CellRelay`]) that the daemon
//! holds over a long-lived command
//! ([`GuestExec::start`]). Both are proven at launch (see [`launch`]): the daemon never trusts
//! a PID a session process could have made up. Per cell, the daemon and the relay speak one
//! JSON line at a time, every relay frame carrying the cell's random nonce:
//!
//! 1. prepare: the files are written under the work directory (links refused) and the relay connects to
//!    the kernel's control socket; nothing has run yet, so a failure here is a refusal;
//! 2. run: the code goes to the kernel, which brackets the cell's output with markers that
//!    carry the nonce; the relay forwards only what lies between them, capped, in pieces;
//! 3. done: 0 ran, 1 raised, 76 the interpreter went away.
//!
//! Once the code is sent nothing turns the call into a refusal: a deadline then answers exit
//! 124 with the interpreter ended, and a broken protocol is [`CellError::Lost`].
//!
//! What the relay's guard does not cover: gVisor still lets a process of the same uid open a
//! non-dumpable process's fd entries (never its memory), so under runsc a cell can write into
//! the relay's stdout or read its stdin. That lets session code shape its own session's cell
//! answers and nothing more: the nonce, the frame bounds and the deadline are checked here, on
//! the host, so it can never turn a cell into a refusal, hide a timeout or reach another call.
//!
//! The files here: [`launch`] (launcher, relay, identity check; with the scripts it embeds),
//! [`frames`] (the relay's frames as the host reads them), [`identity`]
//! (`pid:starttime:cmdlinehex`). A provider supplies a [`GuestExec`] and a [`Layout`];
//! [`super::cells`] keeps a session's interpreters.

pub mod frames;
pub mod identity;
mod launch;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use plimsoll::wire::ProjectFile;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use self::frames::{Frame, FrameError};
pub use self::identity::ProcessId;
pub use self::launch::{
    CHECK_JS, END_JS, KERNEL_JS, KERNEL_PY, LAUNCH_SCRIPT, RELAY_BINARY, RELAY_JS,
};
use super::output::Capped;
use super::{GuestExec, HeldInput};

/// A cell language the session image may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CellLanguage {
    /// Node, with the REPL's rewrites when `--expose-internals` works.
    JavaScript,
    /// CPython in isolated mode.
    Python,
}

/// How one provider lays cells out in its guest: what the launcher, the relay and the check
/// run as and where. The provider builds it per launch.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Where cells run and files land; the launcher makes it when it is missing.
    pub work: String,
    /// The guest user (in the provider's terms): the launcher, interpreter, relay and ender.
    pub user: String,
    /// Who runs the identity check.
    pub checker: Checker,
    /// What execs the interpreter's argv after the launch script, ending in an `exec` with the
    /// runner guard preloaded (docker: the start script with the image environment; elsewhere
    /// `env LD_PRELOAD=…`). The interpreter must keep the launcher's child PID.
    pub interpreter_prefix: Vec<String>,
    /// The runner guard library in the guest, preloaded into the relay (and a guarded check);
    /// `None` where the guest has none (e2b's template).
    pub guard: Option<String>,
    /// What the relay's parent must be for the check to accept it.
    pub relay_parent: RelayParent,
    /// Which relay program the guest runs.
    pub relay: CellRelay,
}

/// The relay program of a guest's cells. Both speak the same lines (the relay crate's
/// `cell` module describes them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CellRelay {
    /// The static binary at this path (the project image's [`RELAY_BINARY`]): about 1 MiB
    /// resident against Node's 10 or more. It makes itself non-dumpable as its first act
    /// (the runner guard's `LD_PRELOAD` would not reach a static binary), so it starts
    /// without the guard's prefix.
    Binary(String),
    /// `node -e <RELAY_JS>` under the layout's runner guard, where the guest's image has no
    /// relay binary (e2b's template, which plimsoll does not build).
    Node,
}

/// The relay's parent as the identity check requires it: proof that the provider's exec agent
/// started the relay, not a session process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayParent {
    /// PID 0: started from outside the guest's PID namespace (`docker exec`, the gateway).
    Outside,
    /// A live process of uid 0 (e2b's envd): no session process can start one.
    Root,
}

/// Who runs the identity check. It must be out of reach of every session process, or its
/// verdict proves nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checker {
    /// A user no session process has (docker: uid+1; e2b: root).
    User(String),
    /// The guest user under the runner guard (non-dumpable), where the provider cannot choose a
    /// user and the sandbox was proven to have Yama `ptrace_scope >= 1` (openshell).
    GuardedGuest,
}

/// What one cell did. Exit 0 ran, 1 raised (the error is on stderr), 124 hit the deadline.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CellOutcome {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub timed_out: bool,
    /// The call had to relaunch the interpreter (the old one no longer listened), so earlier
    /// definitions are gone.
    pub interpreter_started: bool,
    /// The interpreter died, was dropped or hit the deadline during this cell: launch a fresh
    /// one for the next.
    pub interpreter_ended: bool,
}

/// Why a cell did not answer. Only [`CellError::Lost`] may have run code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CellError {
    /// The deadline passed before the code was sent: nothing ran (`deadline_exceeded`, marked
    /// not dispatched). The interpreter is dropped.
    #[error("the {language} cell's deadline passed before its code was sent")]
    Unsent { language: &'static str },
    /// A file could not be written (`errno` as the relay named it): nothing ran (reason
    /// `request`). The interpreter is kept.
    #[error("file {index} of the cell could not be written ({errno})")]
    FileRefused { index: usize, errno: String },
    /// No interpreter could be started and proven (reason `environment`).
    #[error("the {language} interpreter could not be launched: {reason}")]
    Launch {
        language: &'static str,
        reason: String,
    },
    /// The interpreter could not be reached before the code was sent: nothing ran (reason
    /// `environment`). The interpreter is dropped.
    #[error("the {language} interpreter cannot be reached: {reason}")]
    Unreachable {
        language: &'static str,
        reason: String,
    },
    /// The protocol broke after the code was sent: it may have run and the result is unknown.
    /// The interpreter is dropped.
    #[error("the {language} interpreter was lost during the cell: {reason}")]
    Lost {
        language: &'static str,
        reason: String,
    },
}

/// One live interpreter and its relay, for one language in one session's guest.
///
/// Not `Clone`: a session holds at most one per language. Dropping it stops reading the relay
/// and lets go of the relay's command, which ends the relay; the interpreter is left to the
/// sweep (or ended by [`Interpreter::close`]).
pub struct Interpreter {
    exec: Arc<dyn GuestExec>,
    layout: Layout,
    language: CellLanguage,
    interpreter: ProcessId,
    relay: Option<ProcessId>,
    /// The relay's stdin. Only ever used through `&mut self` (`get_mut`, no locking); the
    /// mutex makes the interpreter `Sync`, so a session can hold `&Interpreter` across awaits.
    stdin: tokio::sync::Mutex<Box<dyn HeldInput>>,
    frames: mpsc::Receiver<Result<Frame, FrameError>>,
    reader: tokio::task::JoinHandle<()>,
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

// === impl Interpreter ===

impl Interpreter {
    /// Starts this language's interpreter and relay in the guest `exec` reaches and proves
    /// both (within about 40 s; wrap it in a timeout to bound it further). A live interpreter
    /// of the same language must be ended first: the proof requires it to be the only one.
    pub async fn launch(
        exec: Arc<dyn GuestExec>,
        layout: Layout,
        language: CellLanguage,
    ) -> Result<Interpreter, CellError> {
        launch::launch(exec, layout, language).await
    }

    /// Runs one cell: writes `files` under `/work`, then runs `code`, keeping `out_cap` and
    /// `err_cap` bytes of its output, until `deadline`. If the interpreter no longer listens
    /// it is relaunched once (the outcome then says `interpreter_started`).
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

    /// The interpreter's identity (the process cells run in).
    pub fn interpreter_id(&self) -> String {
        self.interpreter.to_string()
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
        self.stdin.get_mut().close().await;
        // Dropping the relay's output lets go of its command (openshell kills it then).
        self.reader.abort();
        let ids: Vec<ProcessId> = std::iter::once(self.interpreter.clone())
            .chain(self.relay.clone())
            .collect();
        launch::end(self.exec.as_ref(), &self.layout, &ids).await;
    }

    fn drop_interpreter(&self) {
        self.alive.store(false, Ordering::SeqCst);
    }

    async fn relaunch(&mut self, deadline: Instant) -> Result<(), CellError> {
        self.end().await;
        let fresh = Interpreter::launch(Arc::clone(&self.exec), self.layout.clone(), self.language);
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
        let write = self.stdin.get_mut().write(bytes);
        match tokio::time::timeout_at(deadline, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("writing to the relay: {e}")),
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
        // Checked before the first byte goes out: a write that completes at once would
        // otherwise win the race against an already-passed deadline, and the code would run.
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
            // Part of the line may have reached the relay: from here on it may have run.
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
                    self.drop_interpreter();
                    let (stdout, stdout_truncated) = stdout.into_parts();
                    let (stderr, stderr_truncated) = stderr.into_parts();
                    return Ok(CellOutcome {
                        exit_code: 124,
                        stdout,
                        stderr,
                        stdout_truncated,
                        stderr_truncated,
                        timed_out: true,
                        interpreter_started: false,
                        interpreter_ended: true,
                    });
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
                    let (stdout, stdout_truncated) = stdout.into_parts();
                    let (stderr, stderr_truncated) = stderr.into_parts();
                    return Ok(CellOutcome {
                        exit_code: if code == 0 { 0 } else { 1 },
                        stdout,
                        stderr,
                        stdout_truncated: stdout_truncated || ot,
                        stderr_truncated: stderr_truncated || et,
                        timed_out: false,
                        interpreter_started: false,
                        interpreter_ended: ended,
                    });
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
