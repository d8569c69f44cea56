//! Snippet calls (providers.md §9.3): `node -` as the guest uid and gid, with the code on its
//! stdin, the base environment plus the request's. Each stream keeps `cap` bytes and drops
//! the rest; at the deadline the snippet's whole process group is killed and the exit is 124.
//! The snippet changes into /work itself, as the guest (a guest may have made /work 0700).
//!
//! A snippet's node starts under the runner guard (non-dumpable, the preload gone from its
//! environment before node reads it), and its stdin is one end of a socket pair rather than
//! a pipe: /proc/<pid>/fd/0 of a socket cannot be opened, under runc or gVisor, so nothing
//! but the agent can write to what node will run.
//!
//! Spares: when plimsolld asks for them (an ungranted snippet), the agent starts the next
//! snippets' nodes with the same environment, so the next snippet finds node already started
//! and only sends its code. No guest process may ever see one dumpable, which two ways give:
//! - `early` (runc): [`EARLY_DEPTH`] kept ahead, topped up beside the call as soon as this
//!   snippet's node is chosen, from [`SEALED_NODE`], a copy of node the guest may run but not
//!   read: the kernel makes a process non-dumpable at the exec of a file its uid cannot read,
//!   so it is never dumpable, and each one is checked to be (its `/proc` entries root's) the
//!   moment its exec returns, or ended, and no node is started beside a call again.
//!   gVisor does not do this, which is why plimsolld asks for it under runc only.
//! - After a clean sweep, when none waits (right away for `early`, after 50 ms without a
//!   request for `idle`; [`super::Agent`]): no code of a call is alive then, and every other
//!   guest process (kept interpreters) is held stopped until the spare's guard has run
//!   ([`super::quiet`]).
//!
//! A spare runs nothing until the agent closes its stdin. It is used by a later snippet with
//! the same environment, and only if nothing observable was done to it while it waited
//! ([`Spare::untouched`]); otherwise that snippet ends it and starts its own node. Ungranted
//! project calls and cells in between leave spares waiting; plimsolld ends them before any
//! grant is lent (`drop`), and a sweep that cannot prove the boundary ends them.

use std::fs::File;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;
use serde_json::Value;

use super::child::{self, Cap, Ran, Watch};
use super::env::{self, Env};
use super::{procs, quiet};

/// The project image's runner guard (images/project/guard).
const GUARD: &str = "/usr/local/lib/plimsoll-runner-guard.so";
/// The project image's copy of node that the guest may run but not read (images/build).
const SEALED_NODE: &str = "/usr/local/libexec/plimsoll/node";
/// How many nodes `early` keeps ahead: each has two calls' time to start, which on a 2-core
/// machine is what lets back-to-back snippets stop waiting for one.
pub const EARLY_DEPTH: usize = 2;
/// How long a spare may take to be sealed (its guard run) before it is given up.
const SEAL_WAIT: Duration = Duration::from_secs(2);
const EXIT_TIMED_OUT: i32 = 124;
const EXIT_NOT_STARTED: i32 = 127;
/// The most a stream keeps, whatever the request asks. Deliberate (the JS had no bound): two
/// streams of this, base64, fit the longest answer line plimsolld reads (agent.rs MAX_LINE,
/// about 22 MiB); plimsolld asks for 64 KiB.
pub const SNIPPET_CAP_MAX: usize = 8 << 20;

/// `Math.max(0, Number(v) || 0)` as whole units.
fn whole(value: Option<&Value>) -> f64 {
    let n = env::js_number(value);
    if n.is_nan() || n <= 0.0 {
        0.0
    } else {
        n.floor()
    }
}

/// A snippet's environment: the base plus the request's `NAME=value` pairs (a name must not
/// be empty), as the strings the child gets.
pub fn environment(guest: u32, pairs: &[String]) -> Vec<(String, String)> {
    let mut env = Env::base(guest);
    for pair in pairs {
        if let Some((name, value)) = pair.split_once('=')
            && !name.is_empty()
        {
            env.set(name, Value::from(value));
        }
    }
    env.strings()
}

/// A started snippet node waiting for its code: the child and the agent's end of its stdin.
struct Started {
    child: Child,
    stdin: File,
}

/// Starts `node -` as the guest in /work (entered with the guest's rights: std sets the ids
/// before it changes directory; a /work it cannot enter fails the start, exit 127), under the
/// runner guard, stdin a socket, stdout and stderr pipes; from [`SEALED_NODE`] when `sealed`
/// (named `node` all the same).
fn start(guest: u32, env: &[(String, String)], sealed: bool) -> io::Result<Started> {
    // Both ends close on exec; the child's is duplicated onto its fd 0.
    let (ours, theirs) = UnixStream::pair()?;
    // The child reads only: its end cannot write back to the agent.
    theirs.shutdown(Shutdown::Write)?;
    let mut cmd = Command::new(if sealed { SEALED_NODE } else { "node" });
    cmd.arg0("node")
        .arg("-")
        .env_clear()
        .envs(env.iter().map(|(n, v)| (n, v)))
        .env("LD_PRELOAD", GUARD)
        .current_dir(env::WORK)
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .uid(guest)
        .gid(guest)
        .process_group(0);
    let child = cmd.spawn()?;
    Ok(Started {
        child,
        stdin: File::from(OwnedFd::from(ours)),
    })
}

/// The next snippet's node, started ahead.
pub struct Spare {
    started: Started,
    env: Vec<(String, String)>,
}

impl Spare {
    /// A spare for a snippet with this environment, started while every guest process is
    /// held stopped and given up unless its guard has run within [`SEAL_WAIT`]; none when
    /// that cannot be done.
    pub fn start(guest: u32, env: Vec<(String, String)>) -> Option<Spare> {
        let held = quiet::hold_all(guest)?;
        let started = start(guest, &env, false).ok()?;
        let mut spare = Spare { started, env };
        let sealed = spare.sealed();
        drop(held);
        if sealed {
            Some(spare)
        } else {
            spare.end(guest);
            None
        }
    }

    /// A spare started beside a running call, from [`SEALED_NODE`]; `Ok(None)` (and it is
    /// ended) unless it is non-dumpable the moment its exec has returned, `Err` when no node
    /// could start at all (then nothing was sealed or not).
    fn start_early(guest: u32, env: &[(String, String)]) -> io::Result<Option<Spare>> {
        // std's spawn returns once the exec has succeeded.
        let started = start(guest, env, true)?;
        let mut spare = Spare {
            started,
            env: env.to_vec(),
        };
        let pid = spare.started.child.id();
        let alive = matches!(spare.started.child.try_wait(), Ok(None));
        if alive && procs::owner_is_root(pid) {
            Ok(Some(spare))
        } else {
            spare.end(guest);
            Ok(None)
        }
    }

    /// Waits until the child is node (its command line) and non-dumpable (its /proc entries
    /// owned by root, as the kernel and gVisor show a process that is not dumpable): the
    /// guard's constructor has run. Before its `exec` the child is the agent's non-dumpable
    /// fork, so both are needed.
    fn sealed(&mut self) -> bool {
        let pid = self.started.child.id().to_string();
        let until = Instant::now() + SEAL_WAIT;
        loop {
            if !matches!(self.started.child.try_wait(), Ok(None)) {
                return false;
            }
            let node = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.as_slice() == b"node\0-\0");
            let root = procs::owner_is_root(self.started.child.id());
            if node && root {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The child's pid, which the sweep spares (it cannot be reused while unreaped).
    pub fn pid(&self) -> u32 {
        self.started.child.id()
    }

    /// Kills its group as the guest and reaps it.
    pub fn end(mut self, guest: u32) {
        if let Ok(pid) = i32::try_from(self.started.child.id()) {
            // Already gone: nothing to kill.
            let _ = procs::signal_as_guest(guest, -pid, Signal::SIGKILL);
        }
        let _ = self.started.child.wait();
    }

    /// Whether the spare can serve a snippet with `env`: it is alive, it printed nothing,
    /// and its limits, scheduling and CPUs are still the ones it inherited from the agent.
    /// A process of the guest that ran while it waited could have stopped it (it is sent
    /// SIGCONT) or changed those; anything else of it (its memory, its stdin) the guest
    /// cannot reach. A spare that fails is ended and the snippet starts its own node.
    fn untouched(&mut self, guest: u32, env: &[(String, String)]) -> bool {
        if self.env != env || !matches!(self.started.child.try_wait(), Ok(None)) {
            return false;
        }
        let printed = [
            self.started.child.stdout.as_ref().map(AsFd::as_fd),
            self.started.child.stderr.as_ref().map(AsFd::as_fd),
        ];
        let mut fds: Vec<PollFd> = printed
            .into_iter()
            .flatten()
            .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
            .collect();
        if fds.len() != 2 {
            return false;
        }
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => {}
            _ => return false,
        }
        let Ok(pid) = i32::try_from(self.started.child.id()) else {
            return false;
        };
        if procs::signal_as_guest(guest, pid, Signal::SIGCONT).is_err() {
            return false;
        }
        same_as_agent(&pid.to_string())
    }

    fn into_started(self) -> Started {
        self.started
    }
}

/// Whether `pid`'s resource limits, OOM score adjustment, nice value, scheduling policy and
/// allowed CPUs equal the agent's own (what every child of the agent starts with), as far as
/// `/proc` shows them.
fn same_as_agent(pid: &str) -> bool {
    let read = |who: &str, what: &str| std::fs::read(format!("/proc/{who}/{what}")).ok();
    let sched = |who: &str| {
        procs::stat_fields(who).ok().map(|f| {
            // stat(5) fields 19 (nice) and 41 (policy); the state is field 3, index 0 here.
            (f.get(16).cloned(), f.get(38).cloned())
        })
    };
    let cpus = |who: &str| {
        read(who, "status").map(|s| {
            String::from_utf8_lossy(&s)
                .lines()
                .find(|l| l.starts_with("Cpus_allowed_list:"))
                .map(str::to_owned)
        })
    };
    // gVisor has no `limits` file and no `Cpus_allowed_list` line: absent on both sides
    // compares equal there (what it cannot show is not compared).
    read(pid, "limits") == read("self", "limits")
        && read(pid, "oom_score_adj") == read("self", "oom_score_adj")
        && sched(pid).is_some()
        && sched(pid) == sched("self")
        && cpus(pid) == cpus("self")
}

/// Runs one snippet with the environment `env` ([`environment`]), on the oldest of `spares`
/// when it can serve it (else that one is ended, and so is every spare for another
/// environment). With `early` still true, spares are topped up to [`EARLY_DEPTH`] beside
/// the call; one that starts but not sealed sets it false.
pub fn snippet(
    guest: u32,
    code: &[u8],
    env: &[(String, String)],
    timeout_ms: Option<&Value>,
    cap: Option<&Value>,
    spares: &mut Vec<Spare>,
    early: Option<&mut bool>,
) -> Ran {
    let began = Instant::now();
    // Bounded above by SNIPPET_CAP_MAX: the cast is exact.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let cap = whole(cap).min(SNIPPET_CAP_MAX as f64) as usize;
    let ready = if spares.is_empty() {
        None
    } else {
        let mut s = spares.remove(0);
        if s.untouched(guest, env) {
            Some(s.into_started())
        } else {
            s.end(guest);
            None
        }
    };
    for other in std::mem::take(spares) {
        if other.env == env {
            spares.push(other);
        } else {
            other.end(guest);
        }
    }
    // Where sealed copies are proven to start non-dumpable (runc, `early` still true), the
    // call's own node starts from one too: no window before its guard in which another
    // guest process could open its memory.
    let sealed = early.as_deref().copied().unwrap_or(false);
    let started = match ready {
        Some(started) => Ok(started),
        None => start(guest, env, sealed),
    };
    // Only a node that started and was not sealed ends early starts for the session; one that
    // could not start (the guest may have closed /work to itself) is tried again next call.
    if let (Some(early), Ok(_)) = (early, &started) {
        while *early && spares.len() < EARLY_DEPTH {
            match Spare::start_early(guest, env) {
                Ok(Some(s)) => spares.push(s),
                Ok(None) => *early = false,
                Err(_) => break,
            }
        }
    }
    let Ok(started) = started else {
        return Ran {
            exit: EXIT_NOT_STARTED,
            ..Ran::default()
        };
    };
    let watch = Watch {
        guest,
        deadline: child::after(began, whole(timeout_ms)),
        cap: Cap::Each(cap),
        group: true,
        kill_on_exit: false,
        grace: child::PIPE_GRACE,
    };
    // The code is written while node reads; the agent's end then closes, node's end of input.
    match child::watch_child(started.child, Some(started.stdin), code, &watch) {
        Ok(mut ran) => {
            if ran.timed_out {
                ran.exit = EXIT_TIMED_OUT;
            }
            ran
        }
        Err(_) => Ran {
            exit: EXIT_NOT_STARTED,
            ..Ran::default()
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_snippets_environment_is_the_base_plus_its_pairs() {
        let env = environment(
            1,
            &[
                "A=1".to_owned(),
                "=skipped".to_owned(),
                "no-equals".to_owned(),
                "PATH=/x".to_owned(),
                "A=2=3".to_owned(),
            ],
        );
        let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["PATH", "HOME", "HOSTNAME", "A"]);
        assert_eq!(env[0].1, "/x");
        assert_eq!(env[3].1, "2=3");
    }

    #[test]
    fn a_process_compares_equal_to_itself_and_a_missing_one_does_not() {
        assert!(same_as_agent(&std::process::id().to_string()));
        assert!(!same_as_agent("0"));
    }
}
