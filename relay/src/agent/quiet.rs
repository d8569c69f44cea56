//! Every guest process held stopped for a moment: while the next snippet's node starts
//! ([`super::snippet::Spare`]). Between its `exec` and the runner guard's constructor a new
//! node is dumpable, and on a host without Yama a process of the same uid could open its
//! memory then. The spare is only started right after a clean sweep, when the only guest
//! processes left are the kept interpreters (and whatever they started since); this stops
//! them all for that moment, so no guest process runs while the spare is exposed.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::hold::all_stopped as stopped;
use super::procs;

const MAX_ROUNDS: usize = 50;
const ROUND_WAIT: Duration = Duration::from_millis(1);
const STOP_WAIT: Duration = Duration::from_secs(2);

/// The processes this hold stopped (not those already stopped before it).
pub struct Held {
    guest: u32,
    pids: Vec<i32>,
}

/// The real uid on a `/proc/<pid>/status` line `Uid:`.
fn real_uid(pid: &str) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Stops every process of the guest uid and proves every thread of each stopped, in rounds
/// until a round finds nothing new (a process could start another before it stopped). None
/// when that cannot be proven (everything it stopped is resumed).
pub fn hold_all(guest: u32) -> Option<Held> {
    let mut held = Held {
        guest,
        pids: Vec::new(),
    };
    let mut seen: HashSet<i32> = HashSet::new();
    for _ in 0..MAX_ROUNDS {
        let mut new = 0usize;
        let entries = std::fs::read_dir("/proc").ok()?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Ok(pid) = name.parse::<i32>() else {
                continue;
            };
            if seen.contains(&pid) || real_uid(name) != Some(guest) {
                continue;
            }
            seen.insert(pid);
            // One stopped before the hold is left as it is (and not resumed after).
            if stopped(name) {
                continue;
            }
            new += 1;
            match procs::signal_as_guest(guest, pid, Signal::SIGSTOP) {
                Ok(()) => held.pids.push(pid),
                Err(e) if procs::gone(&e) => {}
                Err(_) => {
                    held.resume();
                    return None;
                }
            }
        }
        let until = Instant::now() + STOP_WAIT;
        while !held.pids.iter().all(|p| stopped(&p.to_string())) {
            if Instant::now() >= until {
                held.resume();
                return None;
            }
            std::thread::sleep(ROUND_WAIT);
        }
        if new == 0 {
            return Some(held);
        }
    }
    held.resume();
    None
}

impl Held {
    /// SIGCONT to each process the hold stopped.
    pub fn resume(&mut self) {
        for pid in self.pids.drain(..) {
            // Gone already: nothing to resume.
            let _ = procs::signal_as_guest(self.guest, pid, Signal::SIGCONT);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.resume();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_uid_is_read_from_status() {
        let me = nix::unistd::Uid::current().as_raw();
        assert_eq!(real_uid(&std::process::id().to_string()), Some(me));
        assert_eq!(real_uid("999999999"), None);
        assert!(!stopped(&std::process::id().to_string()));
    }
}
