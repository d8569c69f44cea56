//! The agent's first act, before it reads anything: what the runner guard
//! (images/project/guard/guard.c) did for the Node agent through `LD_PRELOAD`, which a static
//! binary ignores. Started as root, it moves to uid+1:gid+1 of the guest identity keeping only
//! `CAP_SETUID` and `CAP_SETGID`, so no guest process (nor a step, which runs as the guest uid)
//! can signal it, trace it or open its `/proc` entries; then it makes itself non-dumpable.
//! Started as another uid it keeps that uid and relies on non-dumpability alone (as the guard).
//! Every step is verified; any failure is an error, and `main` exits 125 before anything else.
#![allow(unsafe_code)]

use nix::errno::Errno;
use nix::sys::prctl;
use nix::unistd::{Gid, Uid, getresgid, getresuid, setgroups, setresgid, setresuid};

/// The guest uid and gid bound of providers.md §5.2 (uid+1 must also fit).
pub const MAX_GUEST_ID: u32 = 65532;

/// linux/capability.h's numbers (libc does not carry them).
const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;
/// The one capability word that holds `CAP_SETUID` and `CAP_SETGID`.
const SETID_CAPS: u32 = (1 << CAP_SETUID) | (1 << CAP_SETGID);
/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAP_VERSION_3: u32 = 0x2008_0522;

/// Which step of the guard failed.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("the guest id {0} is out of range")]
    GuestId(u32),
    #[error("{step}: {errno}")]
    Call { step: &'static str, errno: Errno },
    #[error("the capability sets are not exactly CAP_SETUID and CAP_SETGID")]
    Capabilities,
    #[error("the ids are not uid+1:gid+1 of the guest")]
    Ids,
    #[error("the process is still dumpable")]
    Dumpable,
}

/// Guards the process for the guest `uid` (gid the same, as the agent's guest).
pub fn guard(guest: u32) -> Result<(), GuardError> {
    if Uid::current().is_root() || Uid::effective().is_root() {
        become_keeper(guest)?;
    }
    call("PR_SET_DUMPABLE", prctl::set_dumpable(false))?;
    if call("PR_GET_DUMPABLE", prctl::get_dumpable())? {
        return Err(GuardError::Dumpable);
    }
    Ok(())
}

fn call<T>(step: &'static str, done: nix::Result<T>) -> Result<T, GuardError> {
    done.map_err(|errno| GuardError::Call { step, errno })
}

/// Root to uid+1:gid+1 of `guest`, with exactly the two set-id capabilities left.
fn become_keeper(guest: u32) -> Result<(), GuardError> {
    if guest == 0 || guest > MAX_GUEST_ID {
        return Err(GuardError::GuestId(guest));
    }
    let uid = Uid::from_raw(guest + 1);
    let gid = Gid::from_raw(guest + 1);
    // Keep the permitted set across the uid change, then trim it to the two needed.
    call("PR_SET_KEEPCAPS", prctl::set_keepcaps(true))?;
    call("setgroups", setgroups(&[]))?;
    call("setresgid", setresgid(gid, gid, gid))?;
    call("setresuid", setresuid(uid, uid, uid))?;
    set_caps()?;
    call("PR_SET_KEEPCAPS off", prctl::set_keepcaps(false))?;
    clear_ambient()?;
    if !holds_exactly_setid_caps()? {
        return Err(GuardError::Capabilities);
    }
    let uids = call("getresuid", getresuid())?;
    let gids = call("getresgid", getresgid())?;
    let ids_match = [uids.real, uids.effective, uids.saved] == [uid; 3]
        && [gids.real, gids.effective, gids.saved] == [gid; 3];
    if !ids_match {
        return Err(GuardError::Ids);
    }
    Ok(())
}

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`: one 32-bit word of each set.
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn header() -> CapHeader {
    CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    }
}

fn empty_sets() -> [CapData; 2] {
    [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2]
}

/// Effective and permitted exactly `CAP_SETUID|CAP_SETGID`, nothing inheritable.
fn set_caps() -> Result<(), GuardError> {
    let mut header = header();
    let mut data = empty_sets();
    data[0].effective = SETID_CAPS;
    data[0].permitted = SETID_CAPS;
    // SAFETY: capset reads one version-3 header and two data words, both live locals laid out
    // as linux/capability.h's structs (repr(C)); it keeps no pointer past the call.
    let done = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_mut_ptr()) };
    if done != 0 {
        return Err(GuardError::Call {
            step: "capset",
            errno: Errno::last(),
        });
    }
    Ok(())
}

/// The ambient set is a subset of permitted and inheritable, so the empty inheritable set
/// already emptied it; this is a second belt. gVisor has no ambient set and answers EINVAL,
/// which is the same outcome.
fn clear_ambient() -> Result<(), GuardError> {
    // SAFETY: prctl with integer arguments only; no memory is passed.
    let done = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if done != 0 && Errno::last() != Errno::EINVAL {
        return Err(GuardError::Call {
            step: "PR_CAP_AMBIENT_CLEAR_ALL",
            errno: Errno::last(),
        });
    }
    Ok(())
}

/// Whether effective and permitted are exactly the two set-id capabilities and inheritable
/// is empty.
fn holds_exactly_setid_caps() -> Result<bool, GuardError> {
    let mut header = header();
    let mut data = empty_sets();
    // SAFETY: capget writes at most two version-3 data words into `data`, a live local of
    // that size; the header is a live local too.
    let done = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if done != 0 {
        return Err(GuardError::Call {
            step: "capget",
            errno: Errno::last(),
        });
    }
    Ok(exactly_setid(&data))
}

fn exactly_setid(data: &[CapData; 2]) -> bool {
    data[0].effective == SETID_CAPS
        && data[0].permitted == SETID_CAPS
        && data[0].inheritable == 0
        && data[1].effective == 0
        && data[1].permitted == 0
        && data[1].inheritable == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_two_setid_capabilities_pass() {
        let mut data = empty_sets();
        assert!(!exactly_setid(&data));
        data[0].effective = SETID_CAPS;
        data[0].permitted = SETID_CAPS;
        assert!(exactly_setid(&data));
        data[0].inheritable = SETID_CAPS;
        assert!(!exactly_setid(&data));
        data[0].inheritable = 0;
        data[1].permitted = 1;
        assert!(!exactly_setid(&data));
        data[1].permitted = 0;
        data[0].effective |= 1 << 5; // CAP_KILL
        assert!(!exactly_setid(&data));
    }

    #[test]
    fn a_guest_id_out_of_range_is_refused_before_any_change() {
        // Only reachable as root; the range check comes first either way.
        assert!(matches!(become_keeper(0), Err(GuardError::GuestId(0))));
        assert!(matches!(
            become_keeper(MAX_GUEST_ID + 1),
            Err(GuardError::GuestId(_))
        ));
    }

    #[test]
    fn an_unprivileged_process_reads_its_capabilities() {
        // Unprivileged test runs hold none; as root they hold more than the two. Either way
        // the read itself works and the verdict is "not exactly the two".
        assert!(!holds_exactly_setid_caps().unwrap_or(true));
    }
}
