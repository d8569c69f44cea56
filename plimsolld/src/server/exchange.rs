//! What the layers of one request share: whether the procedure was reached,
//! the decode slot it holds, and what the audit line will say.
//!
//! The binding layer puts an [`Exchange`] in the request's extensions; the
//! Connect service carries extensions through to the handler, so a handler
//! and the outer layers see the same cell.

use std::sync::{Arc, Mutex, MutexGuard};

use http::Extensions;

use super::decode_gate::DecodePermit;

#[derive(Default)]
struct Entry {
    reached: bool,
    slot: Option<DecodePermit>,
    caller: Option<String>,
    code: Option<&'static str>,
    reason: Option<&'static str>,
}

/// The shared cell of one request.
#[derive(Clone, Default)]
pub struct Exchange(Arc<Mutex<Entry>>);

impl Exchange {
    /// The exchange stored in a request's extensions, or a detached one (a
    /// request that bypassed the binding layer still works, unaudited).
    pub fn of(ext: &Extensions) -> Exchange {
        ext.get::<Exchange>().cloned().unwrap_or_default()
    }

    fn entry(&self) -> MutexGuard<'_, Entry> {
        // A poisoned lock only means another thread panicked mid-update; the
        // flags stay meaningful, so keep going.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handler was reached: the decode slot goes back at once, and
    /// failures from here on are no longer marked not dispatched by the
    /// transport.
    pub fn mark_reached(&self) {
        let slot = {
            let mut e = self.entry();
            e.reached = true;
            e.slot.take()
        };
        drop(slot);
    }

    /// Whether the handler was reached.
    pub fn reached(&self) -> bool {
        self.entry().reached
    }

    /// Holds the decode slot until the handler is reached or the answer is written.
    pub fn hold_slot(&self, slot: DecodePermit) {
        self.entry().slot = Some(slot);
    }

    /// Gives the decode slot back, if still held.
    pub fn release_slot(&self) {
        let slot = self.entry().slot.take();
        drop(slot);
    }

    /// Records who is calling, for the audit line.
    pub fn set_caller(&self, caller: &str) {
        self.entry().caller = Some(caller.to_owned());
    }

    /// Records the Connect code and not-dispatched reason of the answer.
    pub fn set_outcome(&self, code: &'static str, reason: Option<&'static str>) {
        let mut e = self.entry();
        e.code = Some(code);
        e.reason = reason;
    }

    /// (caller, code, reason) for the audit line.
    pub fn audit(&self) -> (Option<String>, Option<&'static str>, Option<&'static str>) {
        let e = self.entry();
        (e.caller.clone(), e.code, e.reason)
    }
}
