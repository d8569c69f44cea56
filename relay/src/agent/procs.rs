//! What the agent reads of other processes (`/proc`) and how it signals them: identities
//! `pid:starttime:cmdlinehex`, thread states, and the switch to the guest's effective ids.
//!
//! The agent is single-threaded, so an effective-id switch holds for the whole process and
//! nothing else runs until it is undone.

use std::fmt::Write as _;
use std::io;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Gid, Pid, Uid, getegid, geteuid, setegid, seteuid};

/// `PF_KTHREAD` in a stat line's flags.
const KERNEL_THREAD: u64 = 0x20_0000;

/// The fields of `/proc/<pid>/stat` after the command name (the state is the first).
pub fn stat_fields(pid: &str) -> io::Result<Vec<String>> {
    let stat = std::fs::read(format!("/proc/{pid}/stat"))?;
    Ok(fields_of(&stat))
}

/// The fields after the last `)`, which may follow a command name with spaces and parens.
fn fields_of(stat: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(stat);
    let rest = match text.rfind(')') {
        Some(at) => text.get(at + 2..).unwrap_or(""),
        None => "",
    };
    rest.split(' ').map(str::to_owned).collect()
}

/// Whether a stat line's flags name a kernel thread.
pub fn is_kernel_thread(fields: &[String]) -> bool {
    fields
        .get(6)
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|flags| flags & KERNEL_THREAD != 0)
}

/// `pid:starttime:cmdlinehex` of `pid`, from its stat fields and its command line.
pub fn identity(pid: &str, fields: &[String]) -> io::Result<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    let start = fields.get(19).map_or("undefined", String::as_str);
    Ok(format!("{pid}:{start}:{}", cmdline_hex(&cmdline)))
}

/// The NUL-separated arguments without the final NUL, in lowercase hex.
pub fn cmdline_hex(cmdline: &[u8]) -> String {
    let args = cmdline.strip_suffix(b"\0").unwrap_or(cmdline);
    let mut hex = String::with_capacity(args.len() * 2);
    for b in args {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// Whether `pid`'s `/proc` entries are root's: how the kernel and gVisor show a process that
/// is not dumpable (the guest's own would be the guest's).
pub fn owner_is_root(pid: u32) -> bool {
    std::fs::metadata(format!("/proc/{pid}/status"))
        .is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
}

/// Whether an error says the process is gone.
pub fn gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error().map(Errno::from_raw),
        Some(Errno::ENOENT | Errno::ESRCH)
    )
}

/// A named process, parsed from `pid:starttime:cmdlinehex` (guest/same.js's pattern).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcId {
    pid: String,
    start: String,
    hex: String,
}

impl ProcId {
    /// `^([0-9]+):(-?[0-9]+):([0-9a-f]+)$`, or None.
    pub fn parse(text: &str) -> Option<ProcId> {
        let mut parts = text.splitn(3, ':');
        let (pid, start, hex) = (parts.next()?, parts.next()?, parts.next()?);
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let hex_ok = !hex.is_empty() && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !digits(pid) || !digits(start.strip_prefix('-').unwrap_or(start)) || !hex_ok {
            return None;
        }
        Some(ProcId {
            pid: pid.to_owned(),
            start: start.to_owned(),
            hex: hex.to_owned(),
        })
    }

    /// Whether the process is still alive as that same process (same start time and
    /// command line, not a zombie), so a recycled pid is never hit.
    pub fn same(&self) -> bool {
        let Ok(fields) = stat_fields(&self.pid) else {
            return false;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", self.pid)) else {
            return false;
        };
        let state = fields.first().map_or("", String::as_str);
        state != "Z"
            && state != "X"
            && fields.get(19) == Some(&self.start)
            && cmdline_hex(&cmdline) == self.hex
    }

    /// Whether the process is alive with this pid and start time but another command line:
    /// the same process, renamed (`process.title`, `prctl`), which a hold must not pass over.
    pub fn renamed(&self) -> bool {
        let Ok(fields) = stat_fields(&self.pid) else {
            return false;
        };
        let state = fields.first().map_or("", String::as_str);
        state != "Z" && state != "X" && fields.get(19) == Some(&self.start) && !self.same()
    }

    pub fn pid(&self) -> &str {
        &self.pid
    }
}

/// The state letter of every thread of `pid`, or the error reading its task list.
/// Threads that vanish while read are left out.
pub fn thread_states(pid: &str) -> io::Result<Vec<String>> {
    let mut states = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let task = task?;
        let path = task.path().join("stat");
        match std::fs::read(&path) {
            Ok(stat) => states.push(fields_of(&stat).into_iter().next().unwrap_or_default()),
            Err(e) if gone(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(states)
}

/// Sends `signal` to `pid` (a negative pid: a process group) with the guest uid as the
/// effective uid, so the kernel's kill check (the sender's real or effective uid against the
/// target's) passes for guest processes only; the agent holds `CAP_SETUID`, not `CAP_KILL`.
/// The real and saved uids stay the agent's, and the effective uid is restored before
/// anything else runs.
pub fn signal_as_guest(guest: u32, pid: i32, signal: Signal) -> io::Result<()> {
    let own = Uid::current();
    seteuid(Uid::from_raw(guest)).map_err(io::Error::from)?;
    let sent = kill(Pid::from_raw(pid), signal).map_err(io::Error::from);
    seteuid(own).map_err(io::Error::from)?;
    sent
}

/// Runs `f` with the guest's effective uid and gid, then restores the agent's.
pub fn as_guest<T>(guest: u32, f: impl FnOnce() -> T) -> io::Result<T> {
    let (uid, gid) = (geteuid(), getegid());
    setegid(Gid::from_raw(guest)).map_err(io::Error::from)?;
    if let Err(e) = seteuid(Uid::from_raw(guest)) {
        setegid(gid).map_err(io::Error::from)?;
        return Err(e.into());
    }
    let out = f();
    seteuid(uid).map_err(io::Error::from)?;
    setegid(gid).map_err(io::Error::from)?;
    Ok(out)
}

/// One effective-uid switch and back, as every later request makes: the uid change resets
/// dumpability to the host's `fs.suid_dumpable`, so the state after it is the one kept.
pub fn settle(guest: u32) -> io::Result<()> {
    seteuid(Uid::from_raw(guest)).map_err(io::Error::from)?;
    seteuid(Uid::current()).map_err(io::Error::from)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn identities_parse_as_the_js_pattern_did() {
        let id = ProcId::parse("12:-3:6e6f6465").unwrap();
        assert_eq!(id.pid(), "12");
        for bad in [
            "",
            "12",
            "12:3",
            "12:3:",
            "a:3:00",
            "12:3:0G",
            "12:3:AB",
            "-1:3:00",
            "12:+3:00",
            "12:3:00:11",
            "12::00",
        ] {
            assert_eq!(ProcId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn stat_fields_start_after_the_command_name() {
        let f = fields_of(b"42 (a) b (c)) S 1 42 42 0 -1 4194560 1 0 0 0 1 2 0 0 20 0 1 0 98765 9");
        assert_eq!(f[0], "S");
        assert_eq!(f[19], "98765");
        assert!(!is_kernel_thread(&f));
        let k = fields_of(b"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0");
        assert!(is_kernel_thread(&k));
    }

    #[test]
    fn this_process_is_itself_and_alive() {
        let pid = std::process::id().to_string();
        let fields = stat_fields(&pid).unwrap();
        let id = identity(&pid, &fields).unwrap();
        assert!(ProcId::parse(&id).unwrap().same());
        let other = id.replacen(&format!("{pid}:"), &format!("{pid}:1"), 1);
        assert!(!ProcId::parse(&other).unwrap().same());
        assert!(!thread_states(&pid).unwrap().is_empty());
        assert_eq!(cmdline_hex(b"node\0-e\0"), "6e6f6465002d65");
    }
}
