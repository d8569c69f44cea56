//! The session boundary's guest-side programs and the baseline rule (providers.md §9.1
//! baseline, §9.4 sweep), shared by every provider whose sessions run them through an exec:
//! docker (the lister at open; the sweep where its in-container agent cannot hold the kept
//! interpreters) and openshell (both, through the gateway's exec).
//!
//! A session sandbox starts as exactly an init (PID 1) and one `sleep` child of it; the lister
//! proves that and their identities (`pid:starttime:cmdlinehex`) become the keep set. The sweep
//! kills everything outside the keep set and measures the disk; only its exit code is trusted.

use serde::Deserialize;

use super::outcome::GUARD;

/// The long sleep a session sandbox keeps as PID 1's only child.
pub const SLEEP_ARGV: [&str; 2] = ["sleep", "2147483647"];

/// The lister, run with `node -e`.
pub const LISTER: &str = include_str!("lister.js");
/// The sweep, run with `node -e` under the guard.
pub const SWEEP: &str = include_str!("sweep.js");
/// The sweep's bound on entries walked.
pub const MAX_ENTRIES: &str = "200000";

/// One process as the lister saw it.
#[derive(Debug, Deserialize)]
pub struct Listed {
    pid: u64,
    ppid: u64,
    id: String,
}

/// The baseline: exactly PID 1 and one child of PID 1 whose command line is [`SLEEP_ARGV`];
/// answers their identities.
pub fn check_baseline(listed: &[Listed]) -> Result<Vec<String>, String> {
    let sleep_hex = hex::encode(SLEEP_ARGV.join("\0"));
    let init = listed.iter().find(|p| p.pid == 1);
    let sleep = listed
        .iter()
        .find(|p| p.ppid == 1 && p.id.rsplit(':').next() == Some(sleep_hex.as_str()));
    match (listed.len(), init, sleep) {
        (2, Some(init), Some(sleep)) => Ok(vec![init.id.clone(), sleep.id.clone()]),
        _ => Err(format!(
            "the session container holds {} processes, not exactly docker-init and sleep",
            listed.len()
        )),
    }
}

/// `node -e <script> <args…>` with the runner guard preloaded (non-dumpable from its start).
pub fn guarded_node<'a>(script: &str, args: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut command = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        format!("export LD_PRELOAD={GUARD}; exec \"$@\""),
        "sh".to_owned(),
        "node".to_owned(),
        "-e".to_owned(),
        script.to_owned(),
    ];
    command.extend(args.cloned());
    command
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn listed(pid: u64, ppid: u64, cmd: &str) -> Listed {
        Listed {
            pid,
            ppid,
            id: format!("{pid}:100:{}", hex::encode(cmd)),
        }
    }

    #[test]
    fn the_baseline_is_exactly_init_and_sleep() {
        let ok = [
            listed(1, 0, "/sbin/docker-init\0--\0/usr/bin/env"),
            listed(7, 1, "sleep\x002147483647"),
        ];
        let ids = check_baseline(&ok).unwrap();
        assert_eq!(ids.len(), 2);
        assert!(ids[0].starts_with("1:100:"));
        let extra = [
            listed(1, 0, "init"),
            listed(7, 1, "sleep\x002147483647"),
            listed(9, 0, "node"),
        ];
        assert!(check_baseline(&extra).is_err());
        let wrong = [listed(1, 0, "init"), listed(7, 1, "sleep\x001")];
        assert!(check_baseline(&wrong).is_err());
    }
}
