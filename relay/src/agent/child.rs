//! Running one child (a step, a snippet, the probe) to its end on the agent's one thread:
//! its pipes are read with poll(2), its stdin written without blocking, its exit checked on
//! a short tick, and its deadline kept. Kills go out as the guest ([`procs::signal_as_guest`]).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;

use super::procs;

/// How long the pipes may stay open after the child exited (a background process holding
/// them), as the JS's `PIPE_GRACE_MS`.
pub const PIPE_GRACE: Duration = Duration::from_millis(1000);
/// How often the child's exit is checked while its pipes are open.
const EXIT_TICK: Duration = Duration::from_millis(10);
/// How often once they are closed (its exit follows at once).
const CLOSED_TICK: Duration = Duration::from_millis(1);
const READ_SIZE: usize = 64 * 1024;

/// How much of the output is kept.
#[derive(Debug, Clone, Copy)]
pub enum Cap {
    /// One budget for both streams; the first byte past it kills the child's group.
    SharedKill(usize),
    /// A budget per stream; bytes past it are dropped.
    Each(usize),
}

/// How a child is watched.
pub struct Watch {
    pub guest: u32,
    pub deadline: Instant,
    pub cap: Cap,
    /// Whether the child leads its own process group (kills go to the group).
    pub group: bool,
    /// Whether the group is killed as soon as the child exits (a step's leftovers).
    pub kill_on_exit: bool,
    pub grace: Duration,
}

/// What a child came to.
#[derive(Debug, Default)]
pub struct Ran {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The exit code, or 128 + the signal that ended it.
    pub exit: i32,
    pub timed_out: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// The exit code as the JS computed it: the code, or 128 + the signal (9 when unknown).
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(9))
}

/// A pipe end as a plain file.
fn file(fd: impl Into<OwnedFd>) -> File {
    File::from(fd.into())
}

/// Spawns `command` (its stdio already set) and watches it to its end; an error means it did
/// not start. `input` is written to its stdin, which is then closed.
pub fn run(command: &mut Command, input: Option<&[u8]>, watch: &Watch) -> io::Result<Ran> {
    let mut child = command.spawn()?;
    let stdin = child.stdin.take().map(file);
    watch_child(child, stdin, input.unwrap_or_default(), watch)
}

/// Watches a started child to its end: `input` is written to `stdin` (the child's standard
/// input, whatever kind of file it is), which is then closed.
pub fn watch_child(
    mut child: Child,
    stdin: Option<File>,
    input: &[u8],
    watch: &Watch,
) -> io::Result<Ran> {
    let mut out = child.stdout.take().map(file);
    let mut err = child.stderr.take().map(file);
    let mut stdin = stdin;
    if let Some(pipe) = &stdin {
        // A child that does not read must not block the agent.
        let _ = fcntl(pipe, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
    }
    let mut written = 0usize;
    if input.is_empty() {
        stdin = None;
    }
    let mut ran = Ran::default();
    let mut kept = [0usize; 2];
    let mut exit: Option<i32> = None;
    let mut grace_end: Option<Instant> = None;
    let mut buf = vec![0u8; READ_SIZE];
    loop {
        let now = Instant::now();
        let open = usize::from(out.is_some()) + usize::from(err.is_some());
        if exit.is_none()
            && let Some(status) = reap(&mut child)
        {
            exit = Some(status);
            if watch.kill_on_exit {
                kill(&child, watch);
            }
            grace_end = Some(now + watch.grace);
        }
        if exit.is_some() && (open == 0 || grace_end.is_some_and(|g| now >= g)) {
            break;
        }
        if !ran.timed_out && now >= watch.deadline {
            ran.timed_out = true;
            kill(&child, watch);
        }
        let mut wait = if exit.is_some() {
            Duration::MAX
        } else if open == 0 {
            CLOSED_TICK
        } else {
            EXIT_TICK
        };
        if !ran.timed_out {
            wait = wait.min(watch.deadline.saturating_duration_since(now));
        }
        if let Some(g) = grace_end {
            wait = wait.min(g.saturating_duration_since(now));
        }
        let (out_ready, err_ready, in_ready) = wait_for(&out, &err, &stdin, wait)?;
        for (ready, pipe, which) in [(out_ready, &mut out, 0usize), (err_ready, &mut err, 1)] {
            if !ready {
                continue;
            }
            let Some(reader) = pipe.as_mut() else {
                continue;
            };
            match reader.read(&mut buf) {
                Ok(0) => *pipe = None,
                Ok(n) => keep(
                    &mut ran,
                    &mut kept,
                    which,
                    buf.get(..n).unwrap_or_default(),
                    &child,
                    watch,
                ),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => *pipe = None,
            }
        }
        if in_ready && let Some(writer) = stdin.as_mut() {
            match writer.write(input.get(written..).unwrap_or_default()) {
                Ok(n) => written += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                // The child closed its stdin: the rest is dropped, as node's pipe did.
                Err(_) => written = input.len(),
            }
            if written >= input.len() {
                stdin = None;
            }
        }
    }
    ran.exit = exit.unwrap_or(128 + 9);
    Ok(ran)
}

/// The child's exit, when it has exited (reaping it).
fn reap(child: &mut Child) -> Option<i32> {
    match child.try_wait() {
        Ok(Some(status)) => Some(exit_code(status)),
        Ok(None) => None,
        // Not waitable (never expected): it is treated as killed.
        Err(_) => Some(128 + 9),
    }
}

/// SIGKILL to the child's group (or the child), as the guest.
fn kill(child: &Child, watch: &Watch) {
    let Ok(pid) = i32::try_from(child.id()) else {
        return;
    };
    let target = if watch.group { -pid } else { pid };
    // Already gone: nothing to kill.
    let _ = procs::signal_as_guest(watch.guest, target, Signal::SIGKILL);
}

/// Keeps what the cap allows of one chunk of stream `which` (0 stdout, 1 stderr).
fn keep(
    ran: &mut Ran,
    kept: &mut [usize; 2],
    which: usize,
    chunk: &[u8],
    child: &Child,
    watch: &Watch,
) {
    let (slot, cap) = match watch.cap {
        Cap::SharedKill(cap) => (0, cap),
        Cap::Each(cap) => (which, cap),
    };
    let room = cap.saturating_sub(kept[slot]);
    let take = chunk.len().min(room);
    let into = if which == 0 {
        &mut ran.stdout
    } else {
        &mut ran.stderr
    };
    into.extend_from_slice(chunk.get(..take).unwrap_or_default());
    kept[slot] += take;
    if chunk.len() <= room {
        return;
    }
    match watch.cap {
        Cap::SharedKill(_) => {
            if !ran.stdout_truncated {
                ran.stdout_truncated = true;
                ran.stderr_truncated = true;
                kill(child, watch);
            }
        }
        Cap::Each(_) if which == 0 => ran.stdout_truncated = true,
        Cap::Each(_) => ran.stderr_truncated = true,
    }
}

/// Waits up to `wait` for any pipe to be ready: (stdout, stderr, stdin).
fn wait_for(
    out: &Option<File>,
    err: &Option<File>,
    stdin: &Option<File>,
    wait: Duration,
) -> io::Result<(bool, bool, bool)> {
    let read = PollFlags::POLLIN;
    let mut fds = Vec::with_capacity(3);
    let mut slots = [None; 3];
    for (at, (pipe, flags)) in [(out, read), (err, read), (stdin, PollFlags::POLLOUT)]
        .into_iter()
        .enumerate()
    {
        if let Some(pipe) = pipe {
            slots[at] = Some(fds.len());
            fds.push(PollFd::new(pipe.as_fd(), flags));
        }
    }
    let ms = u16::try_from(wait.as_millis().max(u128::from(!wait.is_zero()))).unwrap_or(u16::MAX);
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(_) | Err(Errno::EINTR) => {}
        Err(e) => return Err(e.into()),
    }
    let ready = |slot: Option<usize>| {
        slot.and_then(|i| fds.get(i))
            .and_then(PollFd::revents)
            .is_some_and(|r| !r.is_empty())
    };
    Ok((ready(slots[0]), ready(slots[1]), ready(slots[2])))
}

/// The instant `ms` milliseconds from `from` (none or negative: `from`; far ones capped at
/// a year, which no call lives to).
pub fn after(from: Instant, ms: f64) -> Instant {
    const YEAR_MS: f64 = 365.0 * 24.0 * 3600.0 * 1000.0;
    let ms = if ms.is_finite() && ms > 0.0 {
        ms.min(YEAR_MS)
    } else {
        0.0
    };
    // Finite, non-negative and at most a year: the cast is exact to the millisecond.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let d = Duration::from_millis(ms as u64);
    from.checked_add(d).unwrap_or(from)
}
