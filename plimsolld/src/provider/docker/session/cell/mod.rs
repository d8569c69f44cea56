//! Notebook cells in a docker session (providers.md §9.6, wire.md §7.4): one live interpreter
//! per language per session, whose state carries from one cell to the next.
//!
//! An [`Interpreter`] is a kernel process (`node --expose-internals` or `python3 -I`) started
//! by the launcher script in its own session with its output on two FIFOs, plus a relay
//! program (Node, under the runner guard) that the daemon holds over an attached `docker
//! exec`. Both are proven at launch (see [`launch`]): the daemon never trusts a PID a session
//! process could have made up. Per cell, the daemon and the relay speak one JSON line at a
//! time, every relay frame carrying the cell's random nonce:
//!
//! 1. prepare: the files are written under `/work` (links refused) and the relay connects to
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
//! (`pid:starttime:cmdlinehex`).

pub(in crate::provider::docker) mod frames;
pub(in crate::provider::docker) mod identity;
mod launch;
#[cfg(test)]
mod tests;

/// What cells on openshell share with these: the scripts, the relay's frames, the identities.
#[cfg(feature = "openshell")]
pub(crate) mod shared {
    pub(crate) use super::frames::{Frame, FrameError, Lines, QUEUE};
    pub(crate) use super::launch::{
        CHECK_JS, END_JS, ENV_INTERP_DIR, ENV_WORK, LAUNCH_SCRIPT, RELAY_JS,
    };
    pub(crate) use super::{CellError, CellLanguage, CellOutcome, ProcessId};
}

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use plimsoll::wire::ProjectFile;
use serde_json::json;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use self::frames::{Frame, FrameError};
pub use self::identity::ProcessId;
use crate::provider::docker::engine::Engine;
use crate::provider::docker::output::Capped;

/// A cell language the session image may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CellLanguage {
    /// Node, with the REPL's rewrites when `--expose-internals` works.
    JavaScript,
    /// CPython in isolated mode.
    Python,
}

/// Who the guest processes run as, and the environment the image asked for.
#[derive(Debug, Clone)]
pub struct Guest {
    /// The guest uid (also the gid); uid+1 is the checker identity.
    pub uid: u32,
    /// The verified image `Config.Env`, as `NAME=value` entries (providers.md §5.5).
    pub image_env: Vec<String>,
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

/// One live interpreter and its relay, for one language in one session container.
///
/// Not `Clone`: a session holds at most one per language. Dropping it stops reading the relay
/// and closes the relay's stdin, which ends the relay; the interpreter is left to the sweep
/// (or ended by [`Interpreter::close`]).
pub struct Interpreter {
    engine: Engine,
    container: String,
    language: CellLanguage,
    guest: Guest,
    interpreter: ProcessId,
    relay: Option<ProcessId>,
    /// The relay's stdin. Only ever used through `&mut self` (`get_mut`, no locking); the
    /// mutex makes the interpreter `Sync`, so a session can hold `&Interpreter` across awaits.
    stdin: tokio::sync::Mutex<Pin<Box<dyn AsyncWrite + Send>>>,
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

// === impl Guest ===

impl Guest {
    /// `uid:gid` of the guest.
    pub fn user(&self) -> String {
        format!("{0}:{0}", self.uid)
    }

    /// `uid:gid` of the checker (uid+1).
    pub fn checker_user(&self) -> String {
        let checker = self.uid.saturating_add(1);
        format!("{checker}:{checker}")
    }
}

// === impl Interpreter ===

impl Interpreter {
    /// Starts this language's interpreter and relay in `container_id` and proves both (within
    /// about 40 s; wrap it in a timeout to bound it further). A live interpreter of the same
    /// language must be ended first: the proof requires it to be the only one.
    pub async fn launch(
        engine: &Engine,
        container_id: &str,
        language: CellLanguage,
        guest: &Guest,
    ) -> Result<Interpreter, CellError> {
        launch::launch(engine, container_id, language, guest).await
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
        let _ = self.stdin.get_mut().shutdown().await;
        let ids: Vec<ProcessId> = std::iter::once(self.interpreter.clone())
            .chain(self.relay.clone())
            .collect();
        launch::end(&self.engine, &self.container, &self.guest.user(), &ids).await;
    }

    fn drop_interpreter(&self) {
        self.alive.store(false, Ordering::SeqCst);
    }

    async fn relaunch(&mut self, deadline: Instant) -> Result<(), CellError> {
        self.end().await;
        let fresh = Interpreter::launch(&self.engine, &self.container, self.language, &self.guest);
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
        let stdin = self.stdin.get_mut();
        let write = async {
            stdin.write_all(&bytes).await?;
            stdin.flush().await
        };
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
