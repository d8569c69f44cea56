//! The sweep (providers.md §9.4): kill every process but the kept ones, the agent and its
//! ancestors until every other process is proven gone, then measure the disk. Exit codes are
//! sweep.js's: 0 clean, 10 over the disk budget, 11 a mount could not be measured, 1 the
//! boundary could not be proven within 50 rounds.

use std::collections::HashSet;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::procs;

const MAX_ROUNDS: usize = 50;
const ROUND_PAUSE: Duration = Duration::from_millis(20);

pub const EXIT_CLEAN: i32 = 0;
pub const EXIT_UNPROVEN: i32 = 1;
pub const EXIT_OVER_DISK: i32 = 10;
pub const EXIT_UNMEASURED: i32 = 11;

/// The agent and every ancestor it can walk to (none under `docker exec`: its parent is 0).
pub fn spared() -> HashSet<u32> {
    let mut spared = HashSet::new();
    let mut pid = std::process::id();
    while pid > 0 && spared.insert(pid) {
        let parent = procs::stat_fields(&pid.to_string())
            .ok()
            .and_then(|f| f.get(1).and_then(|p| p.parse::<u32>().ok()));
        match parent {
            Some(parent) => pid = parent,
            None => break,
        }
    }
    spared
}

/// One sweep's exit code; an error (`/proc` cannot be listed) ends the agent, as in the JS.
pub fn sweep(
    guest: u32,
    spared: &HashSet<u32>,
    keep: &HashSet<String>,
    disk: i128,
    mounts: &[String],
) -> std::io::Result<i32> {
    if !boundary(guest, spared, keep)? {
        return Ok(EXIT_UNPROVEN);
    }
    Ok(measure(disk, mounts))
}

/// A signalled process is gone only when every thread is a zombie or dead.
fn all_threads_dead(pid: &str) -> std::io::Result<bool> {
    match procs::thread_states(pid) {
        Ok(states) => Ok(states.iter().all(|s| s == "Z" || s == "X")),
        Err(e) if procs::gone(&e) => Ok(true),
        Err(e) => Err(e),
    }
}

/// Whether every process but the spared and kept ones was proven gone within the rounds.
fn boundary(guest: u32, spared: &HashSet<u32>, keep: &HashSet<String>) -> std::io::Result<bool> {
    let mut signalled = HashSet::new();
    for _ in 0..MAX_ROUNDS {
        let mut left = 0usize;
        for entry in std::fs::read_dir("/proc")? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Ok(pid) = name.parse::<u32>() else {
                continue;
            };
            if !name.bytes().all(|b| b.is_ascii_digit()) || spared.contains(&pid) {
                continue;
            }
            match one(guest, name, keep, &mut signalled) {
                Ok(false) => {}
                Ok(true) => left += 1,
                Err(e) if procs::gone(&e) => {}
                Err(_) => left += 1,
            }
        }
        if left == 0 {
            return Ok(true);
        }
        std::thread::sleep(ROUND_PAUSE);
    }
    Ok(false)
}

/// One process of a round: whether it is left (signalled now or not provably gone).
fn one(
    guest: u32,
    pid: &str,
    keep: &HashSet<String>,
    signalled: &mut HashSet<String>,
) -> std::io::Result<bool> {
    let fields = procs::stat_fields(pid)?;
    if procs::is_kernel_thread(&fields) || keep.contains(&procs::identity(pid, &fields)?) {
        return Ok(false);
    }
    if signalled.contains(pid) && all_threads_dead(pid)? {
        return Ok(false);
    }
    let number = pid.parse::<i32>().map_err(std::io::Error::other)?;
    match procs::signal_as_guest(guest, number, Signal::SIGKILL) {
        Ok(()) => {}
        Err(e) if procs::gone(&e) => {}
        Err(e) => return Err(e),
    }
    signalled.insert(pid.to_owned());
    Ok(true)
}

/// 0, or 10 when the mounts' used bytes exceed `budget`, or 11 when one cannot be measured;
/// no budget (0 or less) measures nothing.
fn measure(budget: i128, mounts: &[String]) -> i32 {
    if budget <= 0 {
        return EXIT_CLEAN;
    }
    let mut used: i128 = 0;
    for mount in mounts {
        match nix::sys::statfs::statfs(mount.as_str()) {
            Ok(s) => {
                let blocks = i128::from(s.blocks()) - i128::from(s.blocks_free());
                used += blocks * i128::from(s.block_size());
            }
            Err(_) => return EXIT_UNMEASURED,
        }
    }
    if used > budget {
        EXIT_OVER_DISK
    } else {
        EXIT_CLEAN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_is_measured_only_with_a_budget() {
        let root = ["/".to_owned()];
        assert_eq!(measure(0, &["/no/such".to_owned()]), EXIT_CLEAN);
        assert_eq!(measure(1, &["/no/such".to_owned()]), EXIT_UNMEASURED);
        assert_eq!(measure(1, &root), EXIT_OVER_DISK);
        assert_eq!(measure(i128::from(u64::MAX) * 4096, &root), EXIT_CLEAN);
    }

    #[test]
    fn the_agent_spares_itself() {
        assert!(spared().contains(&std::process::id()));
    }
}
