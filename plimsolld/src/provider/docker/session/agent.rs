//! The session agent (providers.md §9.4): one kept process per session container that runs
//! the sweep in-container, so a call's boundary costs no `docker exec` and no interpreter start.
//!
//! It is `plimsoll-relay agent <guest uid>` (the relay crate's `agent` module), started once,
//! right after the baseline, by one `docker exec` as root whose stdin and stdout the daemon
//! holds for the session's life. Its first act moves it to uid+1 (keeping only
//! `CAP_SETUID`/`CAP_SETGID`) and makes it non-dumpable, before it reads anything: no guest
//! process can signal it, trace it, or open its `/proc` entries and so its pipes. Only the
//! daemon writes its stdin and only the agent writes its stdout, so an answer needs no key; a
//! stream that ends, a line that does not parse or an answer that is late ends the session,
//! never a retry.

use std::time::Duration;

use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tokio::time::Instant;

use super::super::engine::Engine;
use super::super::exec::{self, Attached};
use super::container::list_by_id;
use crate::provider::guest::cell::RELAY_BINARY;
use base64::Engine as _;

/// The relay binary's mode that is the agent (the project image carries the binary).
const AGENT_MODE: &str = "agent";
/// The user the agent's exec starts as; the agent moves itself to uid+1 before it reads.
const ROOT: &str = "0:0";
/// Agent stderr kept for the log.
const STDERR_CAP: usize = 4096;
/// The longest answer line: a project call's runner output, base64, with its frame.
const MAX_LINE: usize = crate::provider::guest::runner::STDOUT_CAP / 3 * 4 + 64 * 1024;
/// Where the agent runs: not `/work`, which a guest may close to others.
const AGENT_DIR: &str = "/";
/// How long the agent may take to start and say it is ready.
const START_BUDGET: Duration = Duration::from_secs(30);

/// When the agent starts the next snippet's node ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SpareStart {
    /// Under runc: two kept ahead, topped up as each snippet's node takes its code (beside
    /// the call: from the run-only copy of node, non-dumpable from its exec, which the agent
    /// checks of each), and one right after a clean sweep when none waits.
    Early,
    /// Once no request has come for 50 ms after a clean sweep, every other guest process
    /// held stopped until its guard has run.
    Idle,
}

impl SpareStart {
    fn as_str(self) -> &'static str {
        match self {
            SpareStart::Early => "early",
            SpareStart::Idle => "idle",
        }
    }
}

/// Why the agent failed; every one ends the session (or fails its open).
#[derive(Debug, thiserror::Error)]
pub(super) enum AgentError {
    #[error("the agent could not be started: {0}")]
    Start(#[from] exec::ExecError),
    #[error("the agent's stream ended")]
    Ended,
    #[error("the agent did not answer in time")]
    Late,
    #[error("the agent's stream broke its framing: {0}")]
    Framing(String),
    #[error("the agent's request could not be written: {0}")]
    Write(std::io::Error),
    #[error("the agent answered a frame that is not the one asked for")]
    Unexpected,
    #[error("the agent could not prove the processes stopped")]
    NotHeld,
    #[error("the agent runs as uid {0}, which is not the keeper uid {1}")]
    Uid(u32, u32),
}

/// The first frame.
#[derive(Deserialize)]
struct Ready {
    op: String,
    id: String,
    uid: u32,
}

/// A project call's answer.
#[derive(Deserialize)]
struct Projected {
    op: String,
    /// Whether the named processes were held stopped; when not, nothing ran.
    held: bool,
    /// Whether each was still stopped when the call had run (then resumed).
    #[serde(default)]
    still: bool,
    /// Base64 of what the runner would have printed.
    #[serde(default)]
    stdout: String,
}

/// What a project call came to.
pub(super) enum Projection {
    /// The processes to hold could not be proven stopped: nothing ran.
    NotHeld,
    /// The call ran between the hold and the release.
    Ran {
        /// What the runner would have printed.
        stdout: Vec<u8>,
        /// Whether every held process was still stopped at the release (a step may wake one).
        still_held: bool,
    },
}

/// The answer to the proof made at the start.
#[derive(Deserialize)]
struct Proved {
    op: String,
    ok: bool,
}

/// A snippet call's answer.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Snipped {
    op: String,
    /// Base64.
    stdout: String,
    /// Base64.
    stderr: String,
    pub exit: i32,
    pub timed_out: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// A snippet's output, decoded.
pub(super) struct SnippetOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub answer: Snipped,
}

/// A hold's answer.
#[derive(Deserialize)]
struct Held {
    op: String,
    ok: bool,
    #[serde(default)]
    held: bool,
}

/// A drop's answer.
#[derive(Deserialize)]
struct Dropped {
    op: String,
}

/// A sweep's answer.
#[derive(Deserialize)]
struct Swept {
    op: String,
    exit: i32,
}

/// A frame the agent answers with, named by its `op`.
trait Answer: serde::de::DeserializeOwned {
    /// The `op` this frame must carry.
    const OP: &'static str;
    fn op(&self) -> &str;
}

macro_rules! answers {
    ($($frame:ty => $op:literal),* $(,)?) => {
        $(impl Answer for $frame {
            const OP: &'static str = $op;
            fn op(&self) -> &str {
                &self.op
            }
        })*
    };
}

answers!(
    Ready => "ready",
    Proved => "prove",
    Swept => "sweep",
    Projected => "project",
    Snipped => "snippet",
    Held => "hold",
    Dropped => "drop",
);

/// The held agent of one session container.
pub(super) struct Agent {
    attached: Attached,
    /// Answer bytes read past the last complete line.
    partial: Vec<u8>,
    /// The agent's identity (`pid:starttime:cmdlinehex`), part of the keep set.
    id: String,
    /// Turns true once the container has stopped. docker does not always end an exec's
    /// stream when a gVisor container dies, and a call would then wait for its deadline.
    stopped: watch::Receiver<bool>,
    watcher: tokio::task::JoinHandle<()>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

/// Tells `stopped` once docker says `container` no longer runs, or lists it no more. A wait
/// that fails otherwise (docker busy or restarting) is made again: only docker's word ends a
/// session here. The container's removal at the session's end ends the wait.
async fn watch_stop(engine: Engine, container: String, stopped: watch::Sender<bool>) {
    const WAIT: Duration = Duration::from_secs(24 * 3600);
    loop {
        if engine.wait(&container, WAIT).await.is_ok() {
            break;
        }
        if list_by_id(&engine, &container)
            .await
            .is_ok_and(|found| found.is_empty())
        {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let _ = stopped.send(true);
}

/// Resolves once the container has stopped; never, if nobody watches any more.
pub(super) async fn container_stopped(stopped: &mut watch::Receiver<bool>) {
    if stopped.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl Agent {
    /// Starts the agent in `container` for the guest `uid` (gid the same) and waits for its
    /// ready frame; it must run as uid+1.
    pub(super) async fn start(
        engine: &Engine,
        container: &str,
        uid: u32,
    ) -> Result<Agent, AgentError> {
        // No variable of its own: the binary is static (a preload would be ignored) and reads
        // only its argument; its children get environments it builds.
        let command = [
            RELAY_BINARY.to_owned(),
            AGENT_MODE.to_owned(),
            uid.to_string(),
        ];
        let argv = exec::env_argv(&[], &command);
        let attached =
            exec::attach(engine, container, &argv, ROOT, Some(AGENT_DIR), STDERR_CAP).await?;
        let (tell, stopped) = watch::channel(false);
        let watcher = tokio::spawn(watch_stop(engine.clone(), container.to_owned(), tell));
        let mut agent = Agent {
            attached,
            partial: Vec::new(),
            id: String::new(),
            stopped,
            watcher,
        };
        let ready: Ready = agent.answer(Instant::now() + START_BUDGET).await?;
        let keeper = uid.saturating_add(1);
        if ready.uid != keeper {
            return Err(AgentError::Uid(ready.uid, keeper));
        }
        agent.id = ready.id;
        agent.prove(Instant::now() + START_BUDGET).await?;
        Ok(agent)
    }

    /// The proof, made once before any guest code runs, that a step started as the guest
    /// cannot open the agent's `/proc` entries nor hold a capability (the relay's
    /// `agent::probe`); project calls reuse its verdict while the agent's credentials and
    /// dumpability are those it was made in, and make it again otherwise. A probe that could
    /// not run is made again by the first project call, which reports it if it fails again.
    async fn prove(&mut self, deadline: Instant) -> Result<(), AgentError> {
        self.send(&serde_json::json!({ "op": "prove" }), deadline)
            .await?;
        let proved: Proved = self.answer(deadline).await?;
        if !proved.ok {
            tracing::warn!(
                "the session agent's first probe did not run; project calls probe again"
            );
        }
        Ok(())
    }

    /// The agent's identity.
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// Turns true once the container has stopped, for a call that reads another stream (a
    /// cell reads its interpreter's relay); see [`container_stopped`].
    pub(super) fn stop_signal(&self) -> watch::Receiver<bool> {
        self.stopped.clone()
    }

    /// One sweep (the relay's `agent::sweep`): answers its exit code, sweep.js's.
    pub(super) async fn sweep(
        &mut self,
        disk_bytes: u64,
        mounts: &[&str],
        keep: &[String],
        deadline: Instant,
    ) -> Result<i32, AgentError> {
        let request = serde_json::json!({
            "op": "sweep",
            "disk": disk_bytes.to_string(),
            "mounts": mounts,
            "keep": keep,
        });
        self.send(&request, deadline).await?;
        let swept: Swept = self.answer(deadline).await?;
        Ok(swept.exit)
    }

    /// One project call: `input` is what the runner reads on stdin (key line, then plan). The
    /// agent holds the processes `hold` names stopped around it (all threads, proven within
    /// 2 s) and resumes them after, in this one exchange; when the hold cannot be proven
    /// nothing runs ([`Projection::NotHeld`]).
    pub(super) async fn project(
        &mut self,
        input: &[u8],
        hold: &[String],
        deadline: Instant,
    ) -> Result<Projection, AgentError> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let request = serde_json::json!({
            "op": "project",
            "input": b64.encode(input),
            "hold": hold,
        });
        self.send(&request, deadline).await?;
        let projected: Projected = self.answer(deadline).await?;
        if !projected.held {
            return Ok(Projection::NotHeld);
        }
        let stdout = b64
            .decode(projected.stdout)
            .map_err(|e| AgentError::Framing(e.to_string()))?;
        Ok(Projection::Ran {
            stdout,
            still_held: projected.still,
        })
    }

    /// One snippet: `node -` as the guest with `code` on its stdin, the start script's
    /// environment plus `env`, killed at `timeout`, each stream kept up to `cap` bytes. With
    /// `spare`, the agent starts the next snippet's node ahead, with this environment (the
    /// relay crate's `agent::snippet::Spare`).
    pub(super) async fn snippet(
        &mut self,
        code: &[u8],
        env: &[String],
        timeout: Duration,
        cap: usize,
        spare: Option<SpareStart>,
        deadline: Instant,
    ) -> Result<SnippetOutput, AgentError> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let request = serde_json::json!({
            "op": "snippet",
            "code": b64.encode(code),
            "env": env,
            "timeoutMs": u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            "cap": cap,
            "spare": spare.map(SpareStart::as_str),
        });
        self.send(&request, deadline).await?;
        let answer: Snipped = self.answer(deadline).await?;
        let decode = |text: &str| {
            b64.decode(text)
                .map_err(|e| AgentError::Framing(e.to_string()))
        };
        Ok(SnippetOutput {
            stdout: decode(&answer.stdout)?,
            stderr: decode(&answer.stderr)?,
            answer,
        })
    }

    /// Ends the next snippet's node, if one waits, and the wish for one: before a grant is
    /// lent, so no process but the call's can be there to use it.
    pub(super) async fn drop_spare(&mut self, deadline: Instant) -> Result<(), AgentError> {
        self.send(&serde_json::json!({ "op": "drop" }), deadline)
            .await?;
        let _: Dropped = self.answer(deadline).await?;
        Ok(())
    }

    /// Stops every process in `ids` (all threads, proven within 2 s), or (`stop` false)
    /// resumes them and answers whether each was still stopped just before.
    pub(super) async fn hold(
        &mut self,
        stop: bool,
        ids: &[String],
        deadline: Instant,
    ) -> Result<bool, AgentError> {
        let request = serde_json::json!({
            "op": "hold",
            "mode": if stop { "stop" } else { "cont" },
            "ids": ids,
        });
        self.send(&request, deadline).await?;
        let held: Held = self.answer(deadline).await?;
        if !held.ok {
            return Err(AgentError::NotHeld);
        }
        Ok(stop || held.held)
    }

    /// The next frame, which must be a `T`: a line that does not parse, or another frame,
    /// ends the exchange.
    async fn answer<T: Answer>(&mut self, deadline: Instant) -> Result<T, AgentError> {
        let line = self.next_line(deadline).await?;
        let frame: T =
            serde_json::from_slice(&line).map_err(|e| AgentError::Framing(e.to_string()))?;
        if frame.op() != T::OP {
            return Err(AgentError::Unexpected);
        }
        Ok(frame)
    }

    async fn send(
        &mut self,
        request: &serde_json::Value,
        deadline: Instant,
    ) -> Result<(), AgentError> {
        let mut line = request.to_string().into_bytes();
        line.push(b'\n');
        let write = async {
            self.attached.stdin.write_all(&line).await?;
            self.attached.stdin.flush().await
        };
        match tokio::time::timeout_at(deadline, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(AgentError::Write(e)),
            Err(_) => Err(AgentError::Late),
        }
    }

    /// The next complete line; bytes past it are a framing error (the agent answers exactly
    /// once per request, and only after it was asked).
    async fn next_line(&mut self, deadline: Instant) -> Result<Vec<u8>, AgentError> {
        loop {
            let next = async {
                tokio::select! {
                    // An answer already sent counts even if the container then stopped.
                    biased;
                    bytes = self.attached.stdout.next() => bytes,
                    () = container_stopped(&mut self.stopped) => None,
                }
            };
            let bytes = match tokio::time::timeout_at(deadline, next).await {
                Ok(Some(bytes)) => bytes,
                Ok(None) => {
                    let stderr = String::from_utf8_lossy(self.attached.stdout.stderr());
                    if !stderr.is_empty() {
                        tracing::debug!(agent_stderr = %stderr, "session agent ended");
                    }
                    return Err(AgentError::Ended);
                }
                Err(_) => return Err(AgentError::Late),
            };
            self.partial.extend_from_slice(&bytes);
            if let Some(at) = self.partial.iter().position(|b| *b == b'\n') {
                if at + 1 != self.partial.len() {
                    return Err(AgentError::Framing("more than one answer".to_owned()));
                }
                let mut line = std::mem::take(&mut self.partial);
                line.truncate(at);
                return Ok(line);
            }
            if self.partial.len() > MAX_LINE {
                return Err(AgentError::Framing(
                    "an answer longer than allowed".to_owned(),
                ));
            }
        }
    }
}
