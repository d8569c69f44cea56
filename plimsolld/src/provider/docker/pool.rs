//! The next snippet's container, made ahead of demand.
//!
//! One container is created and attached in advance, never started. A snippet claims it and
//! starts it; the claim at once begins making the next one, while the claimed run goes on. A
//! member is only ever started by the run that claimed it, so it has run nothing before, and
//! it is never reused: after its run it is removed like any other container.
//!
//! A member is served only when it was made from the image id and seccomp profile that
//! preflight verified for this run, and is younger than [`MAX_AGE`]; otherwise it is dropped
//! (and so removed) and the run makes its own container. Members are held, so the orphan sweep
//! leaves them alone; their expiry label covers their wait plus a run.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::container::Prepared;

/// The oldest a member may be when claimed.
pub const MAX_AGE: Duration = Duration::from_secs(5 * 60);

/// At most one waiting member.
#[derive(Default)]
pub struct Pool {
    slot: Mutex<Option<Prepared>>,
    filling: AtomicBool,
    closed: AtomicBool,
}

impl Pool {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Prepared>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The waiting member, if it matches what preflight verified for this run.
    pub fn claim(&self, image_id: &str, seccomp: Option<&str>) -> Option<Prepared> {
        let member = self.slot().take()?;
        let fits = member.image_id == image_id
            && member.seccomp.as_deref() == seccomp
            && member.created.elapsed() < MAX_AGE;
        // A member that does not fit is dropped here, which removes its container.
        fits.then_some(member)
    }

    /// Whether the caller should make a member now: the pool is open, empty, and nobody else
    /// is making one. A `true` must be followed by [`Pool::put`] or [`Pool::fill_failed`].
    pub fn begin_fill(&self) -> bool {
        if self.closed.load(Ordering::SeqCst) || self.slot().is_some() {
            return false;
        }
        !self.filling.swap(true, Ordering::SeqCst)
    }

    /// Offers a freshly made member; a closed pool drops it (and so removes it).
    pub fn put(&self, member: Prepared) {
        if !self.closed.load(Ordering::SeqCst) {
            let mut slot = self.slot();
            if slot.is_none() {
                *slot = Some(member);
            }
        }
        self.filling.store(false, Ordering::SeqCst);
    }

    /// Making a member failed; the next claim tries again.
    pub fn fill_failed(&self) {
        self.filling.store(false, Ordering::SeqCst);
    }

    /// Drops a member older than [`MAX_AGE`].
    pub fn expire_stale(&self) {
        let mut slot = self.slot();
        if slot
            .as_ref()
            .is_some_and(|m| m.created.elapsed() >= MAX_AGE)
        {
            *slot = None;
        }
    }

    /// Closes the pool for good and drops its member.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.slot().take();
    }
}
