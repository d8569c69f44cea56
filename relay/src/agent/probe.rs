//! Whether a step could reach the agent (agent_project.js's `probe`, kept as it was).
//!
//! The kernel decides that from the agent's credentials (real, effective, saved and
//! filesystem ids, its groups), its dumpability (which decides who owns its /proc entries:
//! root while it is not dumpable) and what a child of it can hold after exec (inheritable,
//! ambient and bounding sets, no_new_privs); a step-like child is started the same way every
//! time. [`agent_state`] reads exactly those, in-process: the lines of /proc/self/status and
//! the owner and mode of its own /proc/<pid>/mem, which follow its dumpability under Linux and
//! gVisor. Nothing in the agent changes them but the effective-id switches, which restore the
//! ids and whose uid change resets dumpability to the host's fs.suid_dumpable; so the state
//! read after one such switch ([`super::procs::settle`]) is the state the agent keeps.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::child::{self, Cap, Watch};
use super::env::Env;

/// What a step may not open or hold, and how the probe says it could.
pub const PROBED: [&str; 4] = ["fd/0", "fd/1", "mem", "environ"];
const PROBE_SCRIPT: &str = concat!(
    r#"p=$1; shift; for f in "$@"; do if true <"/proc/$p/$f"; then echo "read $f"; fi; done; "#,
    r#"if true >>"/proc/$p/fd/1"; then echo "write fd/1"; fi; "#,
    r#"n=0; while read -r k v; do case "$k" in CapEff:|CapPrm:) n=$((n + 1)); "#,
    r#"case "$v" in *[!0]*) echo "holds capabilities";; esac;; esac; done </proc/self/status; "#,
    r#"[ "$n" = 2 ] || echo "capabilities not shown"; exit 0"#,
);
/// The /proc/self/status lines the verdict depends on.
const STATE_FIELDS: [&str; 9] = [
    "Uid:",
    "Gid:",
    "Groups:",
    "CapInh:",
    "CapPrm:",
    "CapEff:",
    "CapBnd:",
    "CapAmb:",
    "NoNewPrivs:",
];
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// The probe prints a few short lines; more is not read.
const PROBE_OUTPUT_CAP: usize = 64 * 1024;

/// The agent's state as the probe's verdict depends on it.
pub fn agent_state() -> std::io::Result<String> {
    let status = std::fs::read("/proc/self/status")?;
    let status = String::from_utf8_lossy(&status);
    let lines: Vec<&str> = status
        .split('\n')
        .filter(|line| STATE_FIELDS.iter().any(|f| line.starts_with(f)))
        .collect();
    let mem = std::fs::metadata(format!("/proc/{}/mem", std::process::id()))?;
    Ok(format!(
        "{}\nmem {}:{}:{:o}",
        lines.join("\n"),
        mem.uid(),
        mem.gid(),
        mem.mode()
    ))
}

/// The last probe's verdict and the state it was made in.
pub struct Proof {
    state: String,
    found: Vec<String>,
}

/// Starts a step-like child (the guest's ids, no capability asked for, the base environment)
/// that tries to open each of [`PROBED`] of the agent's /proc entries, to append to its
/// stdout, and reads its own capability sets; records what it managed, or None when it did
/// not run or the agent's state changed meanwhile. Runs only while no guest code can run
/// beside it (see the callers).
pub fn probe(guest: u32) -> Option<Proof> {
    let state = agent_state().ok()?;
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(PROBE_SCRIPT)
        .arg("sh")
        .arg(std::process::id().to_string())
        .args(PROBED)
        .env_clear()
        .envs(Env::base(guest).strings())
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .uid(guest)
        .gid(guest);
    let watch = Watch {
        guest,
        deadline: Instant::now() + PROBE_TIMEOUT,
        cap: Cap::Each(PROBE_OUTPUT_CAP),
        group: false,
        kill_on_exit: false,
        grace: child::PIPE_GRACE,
    };
    let ran = child::run(&mut command, None, &watch).ok()?;
    if ran.timed_out || ran.exit != 0 || agent_state().ok()? != state {
        return None;
    }
    let found = String::from_utf8_lossy(&ran.stdout)
        .split('\n')
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    Some(Proof { state, found })
}

/// Why a step started now could reach the agent (None: it could not): it could open none of
/// `checks` (which must include mem) and would hold no capability. The verdict is made again
/// whenever the agent's state is not the one it was made in.
pub fn inspectable(guest: u32, proven: &mut Option<Proof>, checks: &[String]) -> Option<String> {
    let current = agent_state().ok();
    if proven
        .as_ref()
        .is_none_or(|p| Some(&p.state) != current.as_ref())
    {
        *proven = probe(guest);
    }
    verdict(proven.as_ref(), checks)
}

fn verdict(proven: Option<&Proof>, checks: &[String]) -> Option<String> {
    let reads: Vec<&str> = checks
        .iter()
        .map(String::as_str)
        .filter(|c| PROBED.contains(c))
        .collect();
    let counts = |line: &str| {
        line == "holds capabilities"
            || line == "capabilities not shown"
            || (line == "write fd/1" && reads.contains(&"fd/1"))
            || line
                .strip_prefix("read ")
                .is_some_and(|f| reads.contains(&f))
    };
    let opened = proven.map_or_else(String::new, |p| {
        p.found
            .iter()
            .filter(|l| counts(l))
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    });
    if proven.is_none() || !opened.is_empty() || !reads.contains(&"mem") {
        return Some(if opened.is_empty() {
            "probe failed".to_owned()
        } else {
            opened
        });
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn proof(found: &[&str]) -> Proof {
        Proof {
            state: String::new(),
            found: found.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn all() -> Vec<String> {
        PROBED.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_verdict_counts_only_what_was_asked() {
        assert_eq!(verdict(Some(&proof(&[])), &all()), None);
        assert_eq!(verdict(None, &all()).unwrap(), "probe failed");
        let p = proof(&["read environ", "write fd/1", "holds capabilities"]);
        assert_eq!(
            verdict(Some(&p), &all()).unwrap(),
            "read environ, write fd/1, holds capabilities"
        );
        let mem_only = vec!["mem".to_owned()];
        assert_eq!(verdict(Some(&p), &mem_only).unwrap(), "holds capabilities");
        assert_eq!(verdict(Some(&proof(&["read environ"])), &mem_only), None);
        // mem must be among the checks.
        assert_eq!(
            verdict(Some(&proof(&[])), &["fd/0".to_owned()]).unwrap(),
            "probe failed"
        );
    }

    #[test]
    fn the_state_names_the_credentials_and_mem() {
        let state = agent_state().unwrap();
        assert!(state.starts_with("Uid:"), "{state}");
        assert!(state.contains("\nCapEff:"));
        assert!(state.lines().last().unwrap().starts_with("mem "));
    }
}
