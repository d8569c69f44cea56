//! `ExecSandbox` and `ExecSandboxInteractive`: one command in a READY sandbox, its output
//! streamed back in order and then one exit event.
//!
//! Inside the sandbox the command runs the way the gateway runs it: the argv shell-quoted
//! into one command line (after `KEY=value` pairs and `cd workdir &&`), handed to a shell
//! (`-lc`, or `-c` with `no_login_shell`). Each exec is its own process group (docker exec
//! makes it a session leader); a wrapper reports that group's id first, so that when the
//! caller cancels the stream the whole group is killed, as OpenShell's supervisor does
//! when the exec channel closes. `execution_timeout` behaves as the gateway's does: exit
//! 124 is reported and the command is left running. A stream that ends because the sandbox
//! went away ends with UNAVAILABLE and no exit event.

use std::sync::Arc;
use std::time::Duration;

use bollard::container::LogOutput;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::{State, workspace};
use crate::docker::{Attached, Output};
use crate::proto::v1::exec_sandbox_event::Payload as Event;
use crate::proto::v1::exec_sandbox_input::Payload as Input;
use crate::proto::v1::*;
use crate::validate;

/// Reports the shell's pid (= its process group) on the first line, then becomes the
/// command's shell: `$1` is `-lc` or `-c`, `$2` the command line.
const WRAPPER: &str = "echo \"$$\"; exec /bin/sh \"$1\" \"$2\"";

/// How long the wrapper may take to report its group.
const GROUP_REPORT: Duration = Duration::from_secs(15);

pub type EventStream = ReceiverStream<Result<ExecSandboxEvent, Status>>;
type Sender = mpsc::Sender<Result<ExecSandboxEvent, Status>>;

fn relay_closed() -> Status {
    Status::unavailable("exec relay closed before the command reported an exit status")
}

/// A shell word for `value`, quoted only when it needs to be.
fn shell_word(value: &str) -> Result<String, String> {
    if value.contains('\0') {
        return Err("value contains null bytes".into());
    }
    if value.is_empty() {
        return Ok("''".into());
    }
    if value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'/' | b'-' | b'_'))
    {
        return Ok(value.into());
    }
    Ok(format!("'{}'", value.replace('\'', "'\"'\"'")))
}

/// The command line the gateway builds from a request.
pub fn command_line(req: &ExecSandboxRequest) -> Result<String, String> {
    let mut words = Vec::new();
    for (key, value) in &req.environment {
        words.push(format!("{key}={}", shell_word(value)?));
    }
    for arg in &req.command {
        words.push(shell_word(arg)?);
    }
    let command = words.join(" ");
    let line = if req.workdir.is_empty() {
        command
    } else {
        format!("cd {} && {command}", shell_word(&req.workdir)?)
    };
    if line.len() > validate::MAX_COMMAND_LEN {
        return Err(format!(
            "assembled command string exceeds {} byte limit",
            validate::MAX_COMMAND_LEN
        ));
    }
    Ok(line)
}

fn check(req: &ExecSandboxRequest) -> Result<(), Status> {
    let invalid = |m: String| Status::invalid_argument(m);
    if req.sandbox.is_empty() {
        return Err(invalid("sandbox is required".into()));
    }
    if req.command.is_empty() {
        return Err(invalid("command is required".into()));
    }
    if req.command.len() > validate::MAX_EXEC_ARGS {
        return Err(invalid(format!(
            "command exceeds {} argument limit",
            validate::MAX_EXEC_ARGS
        )));
    }
    if req
        .command
        .iter()
        .any(|a| a.len() > validate::MAX_EXEC_ARG_LEN)
    {
        return Err(invalid(format!(
            "a command argument exceeds {} byte limit",
            validate::MAX_EXEC_ARG_LEN
        )));
    }
    if req.workdir.len() > 4096 {
        return Err(invalid("workdir exceeds 4096 byte limit".into()));
    }
    if !req.environment.keys().all(|k| validate::env_key(k)) {
        return Err(invalid(
            "environment keys must match ^[A-Za-z_][A-Za-z0-9_]*$".into(),
        ));
    }
    Ok(())
}

/// A process group running in a sandbox, attached.
pub struct Group {
    pub container: String,
    pub pgid: u32,
    pub exec_id: String,
    pub input: crate::docker::Input,
    pub output: Output,
    /// Output that arrived with the group report.
    pub early: Vec<LogOutput>,
}

/// Starts `line` under a shell in its own process group in `container`.
pub async fn spawn_group(
    state: &State,
    container: &str,
    line: &str,
    login: bool,
    tty: bool,
) -> Result<Group, Status> {
    let argv = [
        "/bin/sh",
        "-c",
        WRAPPER,
        "openshell-exec",
        if login { "-lc" } else { "-c" },
        line,
    ]
    .map(str::to_owned)
    .to_vec();
    let Attached {
        id,
        input,
        mut output,
    } = state
        .docker
        .exec(container, argv, Vec::new(), tty)
        .await
        .map_err(|e| Status::unavailable(format!("supervisor relay failed: {e}")))?;
    // The first stdout line is the group id; anything after it is the command's.
    let mut line_buf = Vec::new();
    let mut early = Vec::new();
    let report = async {
        while let Some(item) = output.next().await {
            match item {
                Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                    line_buf.extend_from_slice(&message);
                    if let Some(end) = line_buf.iter().position(|b| *b == b'\n') {
                        let rest = line_buf.split_off(end + 1);
                        if !rest.is_empty() {
                            early.push(LogOutput::StdOut {
                                message: rest.into(),
                            });
                        }
                        return true;
                    }
                }
                Ok(other) => early.push(other),
                Err(_) => return false,
            }
        }
        false
    };
    let reported = tokio::time::timeout(GROUP_REPORT, report)
        .await
        .unwrap_or(false);
    let pgid = std::str::from_utf8(&line_buf)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|_| reported)
        .ok_or_else(relay_closed)?;
    Ok(Group {
        container: container.to_owned(),
        pgid,
        exec_id: id,
        input,
        output,
        early,
    })
}

/// Kills a process group inside the sandbox (every process of the exec).
pub async fn kill_group(state: &State, container: &str, pgid: u32) {
    let argv = vec!["kill".into(), "-KILL".into(), format!("-{pgid}")];
    if let Err(e) = state.docker.run_quiet(container, argv).await {
        tracing::debug!(container, pgid, error = %e, "killing an exec's process group failed");
    }
}

/// Checks the request and starts its command.
async fn begin(state: &Arc<State>, req: &ExecSandboxRequest) -> Result<Group, Status> {
    check(req)?;
    workspace(&req.workspace_scope)?;
    let entry = state
        .entry(&req.sandbox)
        .ok_or_else(|| Status::not_found("sandbox not found"))?;
    if entry.phase() != SandboxPhase::Ready {
        return Err(Status::failed_precondition("sandbox is not ready"));
    }
    let container = entry
        .container
        .ok_or_else(|| Status::failed_precondition("sandbox is not ready"))?;
    let line = command_line(req)
        .map_err(|e| Status::invalid_argument(format!("command construction failed: {e}")))?;
    let group = spawn_group(state, &container, &line, !req.no_login_shell, req.tty).await?;
    state
        .execs_started
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Some(ms) = state.faults().die_after_exec_start_ms {
        let (state, name) = (state.clone(), req.sandbox.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            if let Err(e) = super::sandboxes::kill(&state, &name).await {
                tracing::warn!(sandbox = %name, error = %e, "the die-mid-run fault could not kill");
            }
        });
    }
    Ok(group)
}

fn timeout_of(req: &ExecSandboxRequest) -> Option<Duration> {
    let t = req.execution_timeout.as_ref()?;
    let d = Duration::new(u64::try_from(t.seconds).ok()?, u32::try_from(t.nanos).ok()?);
    (!d.is_zero()).then_some(d)
}

/// Where stdin comes from.
enum Stdin {
    Whole(Vec<u8>),
    Frames(Box<Streaming<ExecSandboxInput>>),
}

pub async fn unary(state: &Arc<State>, req: ExecSandboxRequest) -> Result<EventStream, Status> {
    let group = begin(state, &req).await?;
    let (tx, rx) = mpsc::channel(256);
    let stdin = Stdin::Whole(req.stdin.clone());
    tokio::spawn(run(
        state.clone(),
        req.sandbox.clone(),
        group,
        stdin,
        timeout_of(&req),
        tx,
    ));
    Ok(ReceiverStream::new(rx))
}

pub async fn interactive(
    state: &Arc<State>,
    mut frames: Streaming<ExecSandboxInput>,
) -> Result<EventStream, Status> {
    let first = frames
        .message()
        .await
        .map_err(|e| Status::internal(format!("failed to read first message: {e}")))?
        .ok_or_else(|| Status::invalid_argument("empty stream: expected start message"))?;
    let Some(Input::Start(req)) = first.payload else {
        return Err(Status::invalid_argument(
            "first message must be a start payload",
        ));
    };
    let group = begin(state, &req).await?;
    let (tx, rx) = mpsc::channel(256);
    let timeout = timeout_of(&req);
    tokio::spawn(run(
        state.clone(),
        req.sandbox,
        group,
        Stdin::Frames(Box::new(frames)),
        timeout,
        tx,
    ));
    Ok(ReceiverStream::new(rx))
}

fn event(output: LogOutput) -> Option<ExecSandboxEvent> {
    let payload = match output {
        LogOutput::StdOut { message } | LogOutput::Console { message } => {
            Event::Stdout(ExecSandboxStdout {
                data: message.to_vec(),
            })
        }
        LogOutput::StdErr { message } => Event::Stderr(ExecSandboxStderr {
            data: message.to_vec(),
        }),
        LogOutput::StdIn { .. } => return None,
    };
    Some(ExecSandboxEvent {
        payload: Some(payload),
    })
}

/// Feeds stdin, streams output, and ends with the exit event; a cancelled stream kills
/// the process group.
async fn run(
    state: Arc<State>,
    sandbox: String,
    group: Group,
    stdin: Stdin,
    timeout: Option<Duration>,
    tx: Sender,
) {
    let Group {
        container,
        pgid,
        exec_id,
        mut input,
        mut output,
        early,
    } = group;
    let feeder = tokio::spawn(async move {
        match stdin {
            Stdin::Whole(bytes) => {
                let _ = input.write_all(&bytes).await;
            }
            Stdin::Frames(mut frames) => {
                while let Ok(Some(frame)) = frames.message().await {
                    if let Some(Input::Stdin(data)) = frame.payload
                        && input.write_all(&data).await.is_err()
                    {
                        break;
                    }
                }
            }
        }
        // End of stdin: the command reads EOF.
        let _ = input.shutdown().await;
    });
    let deadline = timeout.map(|t| Instant::now() + t);
    let expired = async {
        match deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expired);
    // The gateway's relay closes when its sandbox dies. docker's attach stream alone does not
    // say so promptly under gVisor (a killed container's exec stream can stay open), so the
    // sandbox's own state is looked at too.
    let mut watch = tokio::time::interval(Duration::from_millis(200));
    let mut cancelled = false;
    for item in early {
        if let Some(e) = event(item) {
            cancelled |= tx.send(Ok(e)).await.is_err();
        }
    }
    while !cancelled {
        tokio::select! {
            _ = tx.closed() => cancelled = true,
            _ = watch.tick() => {
                let gone = state
                    .entry(&sandbox)
                    .is_none_or(|e| e.dying || e.phase() != SandboxPhase::Ready);
                if gone {
                    break;
                }
            }
            _ = &mut expired => {
                // The gateway's own timeout: report 124 and leave the command running.
                let exit = ExecSandboxEvent { payload: Some(Event::Exit(ExecSandboxExit { exit_code: 124 })) };
                let _ = tx.send(Ok(exit)).await;
                feeder.abort();
                return;
            }
            item = output.next() => match item {
                Some(Ok(out)) => {
                    if let Some(e) = event(out) {
                        cancelled = tx.send(Ok(e)).await.is_err();
                    }
                }
                Some(Err(_)) | None => break,
            },
        }
    }
    if cancelled {
        tracing::debug!(%sandbox, pgid, "exec stream cancelled: killing its process group");
        feeder.abort();
        kill_group(&state, &container, pgid).await;
        return;
    }
    // Wait for stdin to be handed over (it ends by itself once the command is gone).
    let _ = tokio::time::timeout(Duration::from_secs(1), feeder).await;
    // A command whose sandbox died, stopped or went away reported nothing: the gateway's
    // relay closed first. (`dying` is set before a fault's kill, so it is seen here.)
    let code = state.docker.exec_exit(&exec_id).await.ok().flatten();
    let alive = state
        .entry(&sandbox)
        .is_some_and(|e| !e.dying && e.phase() == SandboxPhase::Ready)
        && state.docker.running(&container).await;
    let code = match code.filter(|_| alive) {
        Some(code) if state.docker.died_with_container(&container, code).await => None,
        code => code,
    };
    let last = match code {
        Some(code) => Ok(ExecSandboxEvent {
            payload: Some(Event::Exit(ExecSandboxExit {
                exit_code: i32::try_from(code).unwrap_or(i32::MAX),
            })),
        }),
        None => Err(relay_closed()),
    };
    let _ = tx.send(last).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_quote_like_the_gateway() {
        let req = ExecSandboxRequest {
            command: vec![
                "node".into(),
                "-e".into(),
                "console.log('hi')".into(),
                String::new(),
            ],
            environment: [
                ("B".to_owned(), "two words".to_owned()),
                ("A".to_owned(), "1".to_owned()),
            ]
            .into_iter()
            .collect(),
            workdir: "/tmp/work dir".into(),
            ..Default::default()
        };
        assert_eq!(
            command_line(&req).unwrap(),
            "cd '/tmp/work dir' && A=1 B='two words' node -e 'console.log('\"'\"'hi'\"'\"')' ''"
        );
        let nul = ExecSandboxRequest {
            command: vec!["a\0b".into()],
            ..Default::default()
        };
        assert!(command_line(&nul).is_err());
    }
}
