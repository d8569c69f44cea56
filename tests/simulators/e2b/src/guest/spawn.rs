//! `guest spawn` and `guest signal`: envd's process start and signal, inside the VM.
//!
//! `spawn [--timeout-ms N] [--stdin] [--uid N --gid N] --cwd DIR [--env NAME=value]... -- CMD
//! [ARG]...` runs `/bin/sh -c 'exec "$@"' -- CMD ARG...` as the uid and gid given (else as the
//! exec's user) with
//! exactly the given environment, like envd's `/bin/sh` wrapper. It writes a pid frame, then
//! output frames of at most 32 KiB as the pipes deliver them (envd's chunk size), then, once
//! both pipes are closed (envd waits for them too), the end frame with the wait status.
//!
//! With `--timeout-ms` it sends SIGKILL to the started process only, as envd's
//! `exec.CommandContext` does when `Connect-Timeout-Ms` runs out, stops reading and reaps it;
//! children it started keep running (their output goes nowhere).

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::{End, Failure, flag, flags, number};
use crate::frames::{Tag, encode};

/// envd reads both pipes 32 KiB at a time and sends each read as one data event.
const CHUNK: usize = 32 * 1024;

pub(super) async fn run(args: &[String]) -> Result<ExitCode, String> {
    let split = args
        .iter()
        .position(|a| a == "--")
        .ok_or("no -- before the command")?;
    let (options, command) = (&args[..split], &args[split + 1..]);
    let Some((program, program_args)) = command.split_first() else {
        return Err("no command".to_owned());
    };
    let cwd = flag(options, "--cwd").ok_or("--cwd is missing")?;
    let timeout = match flag(options, "--timeout-ms") {
        Some(_) => Some(Duration::from_millis(number(options, "--timeout-ms")?)),
        None => None,
    };
    let stdin = options.iter().any(|a| a == "--stdin");
    let mut out = tokio::io::stdout();

    // envd checks the working directory before it starts anything.
    if let Err(e) = std::fs::metadata(cwd)
        && e.kind() == std::io::ErrorKind::NotFound
    {
        let failure = Failure {
            status: 0,
            code: "invalid_argument".to_owned(),
            message: format!("cwd '{cwd}' does not exist"),
        };
        write_json(&mut out, Tag::Failed, &failure).await?;
        return Ok(ExitCode::SUCCESS);
    }

    let mut sh = Command::new("/bin/sh");
    sh.arg("-c")
        .arg("exec \"$@\"")
        .arg("--")
        .arg(program)
        .args(program_args)
        .env_clear()
        .current_dir(cwd)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Started as root like envd, the process runs as the user asked (no supplementary
    // groups, and no capability survives the change of uid).
    if flag(options, "--uid").is_some() {
        sh.uid(number(options, "--uid")?)
            .gid(number(options, "--gid")?);
    }
    for pair in flags(options, "--env") {
        if let Some((name, value)) = pair.split_once('=') {
            sh.env(name, value);
        }
    }
    let mut child = match sh.spawn() {
        Ok(child) => child,
        Err(e) => {
            let failure = Failure {
                status: 0,
                code: "invalid_argument".to_owned(),
                message: format!("error starting process '{}': {e}", command.join(" ")),
            };
            write_json(&mut out, Tag::Failed, &failure).await?;
            return Ok(ExitCode::SUCCESS);
        }
    };
    let pid = child.id().ok_or("the child has no pid")?;
    write_frame(&mut out, Tag::Pid, &pid.to_be_bytes()).await?;

    if let Some(mut child_stdin) = child.stdin.take() {
        // The simulator's SendInput and CloseStdin arrive as this exec's stdin and its end.
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut child_stdin).await;
            let _ = child_stdin.shutdown().await;
        });
    }
    let mut stdout = child.stdout.take().ok_or("no stdout pipe")?;
    let mut stderr = child.stderr.take().ok_or("no stderr pipe")?;
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut killed = false;
    let (mut out_open, mut err_open) = (true, true);
    let mut out_buf = vec![0u8; CHUNK];
    let mut err_buf = vec![0u8; CHUNK];
    while out_open || err_open {
        tokio::select! {
            read = read_some(&mut stdout, &mut out_buf), if out_open => match read {
                Some(n) => write_frame(&mut out, Tag::Stdout, &out_buf[..n]).await?,
                None => out_open = false,
            },
            read = read_some(&mut stderr, &mut err_buf), if err_open => match read {
                Some(n) => write_frame(&mut out, Tag::Stderr, &err_buf[..n]).await?,
                None => err_open = false,
            },
            () = sleep_until(deadline), if !killed => {
                // envd's output context ends with the process's: it stops reading and reaps
                // the killed process at once, whoever still holds the pipes.
                kill_started(pid);
                killed = true;
                break;
            }
        }
    }
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.map_err(|e| format!("wait: {e}"))?,
            () = sleep_until(deadline), if !killed => {
                kill_started(pid);
                killed = true;
            }
        }
    };
    write_json(&mut out, Tag::End, &end_of(status)).await?;
    Ok(ExitCode::SUCCESS)
}

/// `signal --pid P --signal N`: exit 0 when sent, 3 when there is no such process.
pub(super) fn signal(args: &[String]) -> Result<ExitCode, String> {
    let pid: i32 = number(args, "--pid")?;
    let number: i32 = number(args, "--signal")?;
    let signal = Signal::try_from(number).map_err(|e| format!("signal {number}: {e}"))?;
    match kill(Pid::from_raw(pid), signal) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(nix::errno::Errno::ESRCH) => Ok(ExitCode::from(3)),
        Err(e) => Err(format!("kill {pid}: {e}")),
    }
}

/// envd's end event for a wait status (Go's `ProcessState.String()` and `ExitCode()`).
pub fn end_of(status: ExitStatus) -> End {
    if let Some(code) = status.code() {
        let text = format!("exit status {code}");
        End {
            exit_code: code,
            exited: true,
            error: (code != 0).then(|| text.clone()),
            status: text,
        }
    } else {
        let signal = status.signal().unwrap_or(0);
        let mut text = format!("signal: {}", signal_name(signal));
        if status.core_dumped() {
            text.push_str(" (core dumped)");
        }
        End {
            exit_code: -1,
            exited: false,
            error: Some(text.clone()),
            status: text,
        }
    }
}

/// Go's names for the signals a process commonly dies of.
fn signal_name(signal: i32) -> String {
    let name = match signal {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        4 => "illegal instruction",
        5 => "trace/breakpoint trap",
        6 => "aborted",
        7 => "bus error",
        8 => "floating point exception",
        9 => "killed",
        10 => "user defined signal 1",
        11 => "segmentation fault",
        12 => "user defined signal 2",
        13 => "broken pipe",
        14 => "alarm clock",
        15 => "terminated",
        other => return format!("signal {other}"),
    };
    name.to_owned()
}

fn kill_started(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One read; `None` at the end of the pipe or on an error.
async fn read_some(pipe: &mut (impl AsyncRead + Unpin), buf: &mut [u8]) -> Option<usize> {
    match pipe.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

async fn write_frame(out: &mut tokio::io::Stdout, tag: Tag, payload: &[u8]) -> Result<(), String> {
    out.write_all(&encode(tag, payload))
        .await
        .map_err(|e| format!("stdout: {e}"))?;
    out.flush().await.map_err(|e| format!("stdout: {e}"))
}

async fn write_json(
    out: &mut tokio::io::Stdout,
    tag: Tag,
    value: &impl serde::Serialize,
) -> Result<(), String> {
    let json = serde_json::to_vec(value).map_err(|e| e.to_string())?;
    write_frame(out, tag, &json).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_events_read_like_envds() {
        let ok = end_of(ExitStatus::from_raw(0));
        assert_eq!(
            (ok.exit_code, ok.exited, ok.status.as_str(), ok.error),
            (0, true, "exit status 0", None)
        );
        let three = end_of(ExitStatus::from_raw(3 << 8));
        assert_eq!(three.exit_code, 3);
        assert_eq!(three.error.as_deref(), Some("exit status 3"));
        let killed = end_of(ExitStatus::from_raw(9));
        assert_eq!(
            (killed.exit_code, killed.exited, killed.status.as_str()),
            (-1, false, "signal: killed")
        );
        assert_eq!(killed.error.as_deref(), Some("signal: killed"));
    }
}
