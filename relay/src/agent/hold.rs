//! The hold on kept interpreters (providers.md §9.3 "Grants"): `hold` requests, and around a
//! project call. stop: SIGSTOP to each named process that is still that process, then up to
//! 2 s until every thread of each is stopped. cont: whether each was still stopped, then
//! SIGCONT to each.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::procs::{self, ProcId};

const HOLD_WAIT: Duration = Duration::from_secs(2);
const HOLD_POLL: Duration = Duration::from_millis(1);

/// The processes named by `ids` that are still those processes.
pub fn targets(ids: &[String]) -> Vec<ProcId> {
    ids.iter()
        .filter_map(|id| ProcId::parse(id))
        .filter(ProcId::same)
        .collect()
}

/// Whether a process named by `ids` still runs but renamed itself: it would escape a hold
/// that looks for its old command line, so the hold is refused instead.
pub fn any_renamed(ids: &[String]) -> bool {
    ids.iter()
        .filter_map(|id| ProcId::parse(id))
        .any(|id| id.renamed())
}

/// Whether every thread of `pid` is stopped, traced, a zombie or dead (or it is gone).
pub fn all_stopped(pid: &str) -> bool {
    // A task list that cannot be read counts as stopped, as in the JS (the process is gone).
    procs::thread_states(pid).map_or(true, |states| {
        states
            .iter()
            .all(|s| matches!(s.as_str(), "T" | "t" | "Z" | "X"))
    })
}

/// SIGSTOP to each target, then up to 2 s until every thread of each is stopped: whether
/// that was proven.
pub fn stop_all(guest: u32, targets: &[ProcId]) -> bool {
    for target in targets {
        let Ok(pid) = target.pid().parse::<i32>() else {
            return false;
        };
        if procs::signal_as_guest(guest, pid, Signal::SIGSTOP).is_err() {
            return false;
        }
    }
    let until = Instant::now() + HOLD_WAIT;
    loop {
        if targets.iter().all(|t| all_stopped(t.pid())) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(HOLD_POLL);
    }
}

/// Whether every target was still stopped; then SIGCONT to each.
pub fn cont_all(guest: u32, targets: &[ProcId]) -> bool {
    let held = targets.iter().all(|t| all_stopped(t.pid()));
    for target in targets {
        if let Ok(pid) = target.pid().parse::<i32>() {
            // Gone already: nothing to resume.
            let _ = procs::signal_as_guest(guest, pid, Signal::SIGCONT);
        }
    }
    held
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_live_named_processes_are_targets() {
        let pid = std::process::id().to_string();
        let fields = procs::stat_fields(&pid).unwrap();
        let me = procs::identity(&pid, &fields).unwrap();
        let stale = format!("{pid}:1:00");
        let got = targets(&[me.clone(), stale.clone(), "junk".to_owned()]);
        assert_eq!(got, vec![ProcId::parse(&me).unwrap()]);
        assert!(!any_renamed(&[me.clone(), stale]), "gone or unchanged");
        // This very process under another command line: renamed.
        let (start, _) = me.rsplit_once(':').unwrap();
        assert!(any_renamed(&[format!("{start}:6f746865720a")]));
        // A running process is not stopped; a gone one counts as stopped.
        assert!(!all_stopped(&pid));
        assert!(all_stopped("999999999"));
        assert!(cont_all(0, &[]));
    }
}
