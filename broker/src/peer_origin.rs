//! Where a connection to a session socket comes from, as far as the kernel tells (issue 12,
//! part 4).
//!
//! While a session call holds a grant, the processes earlier calls left running (the cell
//! interpreters) are held stopped by plimsolld. A hold is not a wall: the granted call's
//! own code runs as the same uid and may send them `SIGCONT`, and an interpreter may have
//! armed a kernel timer that does. So a session socket also judges each request by who
//! sent it, and refuses one that did not come from the call:
//!
//! 1. A connection accepted before the grant was lent cannot be the call's: its code starts
//!    after the lend (plimsolld holds, lends, then runs the call). This holds under every
//!    runtime.
//! 2. Under runc the peer is the guest process itself (`SO_PEERCRED` names the guest uid and
//!    a host pid). A docker exec (the call, like every exec) starts from a parent outside
//!    the container's pid namespace; the interpreters, started by an exec that exited, were
//!    re-parented to the container's init. So a guest peer whose ancestry reaches the
//!    container's init (innermost pid 1 in `/proc/<pid>/status` `NSpid`) before it leaves
//!    the container is not the call's; nor is a peer whose process is gone or was replaced
//!    (its start time changed: a connection handed on by a process that ended), nor a guest
//!    peer whose process could not be read at accept at all (it ended before the accept, or
//!    `/proc` hides it). The check is made again at every request, since a connection
//!    outlives who opened it.
//! 3. Under runsc with `--host-uds=open` the peer is gVisor's gofer (root): there is no
//!    guest process to judge, and only rule 1 and plimsolld's hold apply.
//!
//! `/proc/<pid>/status` and `stat` are readable by any uid; nothing here needs privileges.

use std::path::{Path, PathBuf};

use tokio::net::UnixStream;
use tokio::time::Instant;

/// How many ancestors are walked before giving up (a container's tree is shallow; an
/// unreadable answer counts as "not the call's").
const MAX_DEPTH: usize = 64;

/// Where the kernel shows processes.
const PROC: &str = "/proc";

/// One accepted connection's peer.
#[derive(Debug, Clone)]
pub struct Peer {
    accepted: Instant,
    judged: Judged,
}

/// What is known of a peer's process at accept.
#[derive(Debug, Clone)]
enum Judged {
    /// Not a guest process (runsc's gofer, plimsolld): judged by its accept time alone.
    NotGuest,
    /// A guest process (runc), judged again at every request.
    Guest(Process),
    /// A guest peer whose process could not be read at accept (it ended before the accept,
    /// having handed its connection on, or `/proc` hides it): never the call's.
    Unidentified,
}

/// A guest peer process (runc): its host pid and start time at accept.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Process {
    pid: u32,
    start: u64,
}

/// Where a process's ancestry leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Out of its pid namespace without passing its init: started by a docker exec.
    Exec,
    /// Through its pid namespace's init: kept from earlier calls, or orphaned.
    Init,
    /// Gone, replaced, not in a nested pid namespace, or unreadable.
    Unknown,
}

// === impl Peer ===

impl Peer {
    /// The peer of `stream`, accepted now. Its process is judged only when it runs as
    /// `guest_uid` (runc); any other admitted peer (root: runsc's gofer; the broker's uid:
    /// plimsolld) is judged by its accept time alone.
    pub fn of(stream: &UnixStream, guest_uid: u32) -> Peer {
        let judged = match stream.peer_cred() {
            Ok(cred) if cred.uid() != guest_uid || guest_uid == 0 => Judged::NotGuest,
            Ok(cred) => cred
                .pid()
                .and_then(|pid| u32::try_from(pid).ok())
                .and_then(|pid| {
                    let start = start_time(Path::new(PROC), pid)?;
                    Some(Judged::Guest(Process { pid, start }))
                })
                .unwrap_or(Judged::Unidentified),
            Err(_) => Judged::Unidentified,
        };
        Peer {
            accepted: Instant::now(),
            judged,
        }
    }

    /// A peer judged by its accept time only.
    pub fn accepted_now() -> Peer {
        Peer {
            accepted: Instant::now(),
            judged: Judged::NotGuest,
        }
    }

    /// Whether this peer is known not to be the code of a call whose grant was lent at
    /// `lent_at` (rules 1 and 2 of the module doc).
    pub fn outside_call(&self, lent_at: Instant) -> bool {
        if self.accepted < lent_at {
            return true;
        }
        match &self.judged {
            Judged::NotGuest => false,
            Judged::Guest(process) => process.origin(Path::new(PROC)) != Origin::Exec,
            Judged::Unidentified => true,
        }
    }
}

// === impl Process ===

impl Process {
    /// Its origin now; a process that is gone or was replaced since the accept is
    /// [`Origin::Unknown`].
    fn origin(&self, proc: &Path) -> Origin {
        if start_time(proc, self.pid) != Some(self.start) {
            return Origin::Unknown;
        }
        origin(proc, self.pid)
    }
}

/// Where `pid`'s ancestry leads, read from `proc` (see [`Origin`]).
pub fn origin(proc: &Path, pid: u32) -> Origin {
    // The broker's own depth: a process no deeper is outside every container.
    let Some(own) = status(&proc.join("self")).map(|s| s.depth) else {
        return Origin::Unknown;
    };
    let mut pid = pid;
    for step in 0..MAX_DEPTH {
        let Some(s) = status(&proc.join(pid.to_string())) else {
            return Origin::Unknown;
        };
        if s.depth <= own {
            // The peer itself outside any container is not a guest; an ancestor there is
            // the exec's parent.
            return if step == 0 {
                Origin::Unknown
            } else {
                Origin::Exec
            };
        }
        if s.innermost == 1 {
            return Origin::Init;
        }
        if s.ppid == 0 {
            return Origin::Unknown;
        }
        pid = s.ppid;
    }
    Origin::Unknown
}

/// What `origin` needs of `/proc/<pid>/status`.
struct Status {
    ppid: u32,
    /// How many pid namespaces (from the one `proc` shows) the process is in.
    depth: usize,
    /// Its pid in the innermost one.
    innermost: u32,
}

fn status(dir: &Path) -> Option<Status> {
    let text = std::fs::read_to_string(dir.join("status")).ok()?;
    let mut ppid = None;
    let mut nspid = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("PPid:") {
            ppid = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("NSpid:") {
            let pids: Option<Vec<u32>> = v.split_whitespace().map(|p| p.parse().ok()).collect();
            nspid = pids;
        }
    }
    let nspid = nspid?;
    Some(Status {
        ppid: ppid?,
        depth: nspid.len(),
        innermost: *nspid.last()?,
    })
}

/// Field 22 of `/proc/<pid>/stat` (clock ticks since boot): with the pid, a process's
/// identity.
fn start_time(proc: &Path, pid: u32) -> Option<u64> {
    let path: PathBuf = proc.join(pid.to_string()).join("stat");
    let text = std::fs::read_to_string(path).ok()?;
    let rest = text.get(text.rfind(')')? + 2..)?;
    rest.split(' ').nth(19)?.parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A `/proc`-shaped tree: `(dir, ppid, nspid)`.
    fn tree(entries: &[(&str, u32, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for (dir, ppid, nspid) in entries {
            let d = root.path().join(dir);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("status"),
                format!("Name:\tx\nPPid:\t{ppid}\nNSpid:\t{nspid}\n"),
            )
            .unwrap();
            let stat = format!("1 (a) b) S {ppid} 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 777 0\n");
            std::fs::write(d.join("stat"), stat).unwrap();
        }
        root
    }

    #[test]
    fn an_exec_is_told_from_a_process_under_the_containers_init() {
        // Host: the broker (self, depth 1), the shim (500). Container: init 600 (ns 1), an
        // interpreter 610 under it with a child 611; an exec 700 (parent: the shim) with a
        // child 701.
        let proc = tree(&[
            ("self", 1, "42"),
            ("500", 1, "500"),
            ("600", 500, "600\t1"),
            ("610", 600, "610\t7"),
            ("611", 610, "611\t8"),
            ("700", 500, "700\t20"),
            ("701", 700, "701\t21"),
        ]);
        let p = proc.path();
        assert_eq!(origin(p, 700), Origin::Exec);
        assert_eq!(origin(p, 701), Origin::Exec);
        assert_eq!(origin(p, 610), Origin::Init);
        assert_eq!(origin(p, 611), Origin::Init);
        assert_eq!(origin(p, 600), Origin::Init);
        // Not in a container, or gone: unknown.
        assert_eq!(origin(p, 500), Origin::Unknown);
        assert_eq!(origin(p, 999), Origin::Unknown);
        assert_eq!(start_time(p, 701), Some(777));
        let same = Process {
            pid: 701,
            start: 777,
        };
        assert_eq!(same.origin(p), Origin::Exec);
        let replaced = Process {
            pid: 701,
            start: 778,
        };
        assert_eq!(replaced.origin(p), Origin::Unknown);
    }

    #[test]
    fn a_guest_peer_whose_process_could_not_be_read_is_never_the_calls() {
        let peer = Peer {
            accepted: Instant::now(),
            judged: Judged::Unidentified,
        };
        assert!(peer.outside_call(peer.accepted));
        let gofer = Peer::accepted_now();
        assert!(
            !gofer.outside_call(gofer.accepted),
            "judged by its accept time"
        );
    }

    #[test]
    fn a_connection_from_before_the_lend_is_outside_the_call() {
        let before = Peer::accepted_now();
        let lent_at = Instant::now() + std::time::Duration::from_millis(1);
        assert!(before.outside_call(lent_at));
        assert!(!before.outside_call(before.accepted));
    }
}
