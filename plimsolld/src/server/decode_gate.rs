//! Layer 6: the decode gate (wire.md §1.3).
//!
//! At most `2 × SANDBOX_MAX_CONCURRENT` requests may be reading or decoding
//! their body at once, and one caller at most half of those. Over the limit
//! the request is shed at once (`resource_exhausted`, `NotDispatched{capacity}`),
//! never queued. The slot is a [`DecodePermit`] that frees itself on drop; the
//! handler drops it as soon as the message is decoded, so a long run holds none.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use plimsoll::refusal::Refusal;

use super::exchange::Exchange;
use super::{HttpRequest, Inner, ResponseFuture, Step, answer, pass, refuse};
use crate::auth::Principal;

/// The refusal's message, as wire.md words it.
pub const SHED_MESSAGE: &str = "RPC decode capacity exhausted, retry shortly";

#[derive(Default)]
struct Counts {
    total: usize,
    per_caller: HashMap<String, usize>,
}

/// The slots, shared by every connection.
pub struct Gate {
    slots: usize,
    per_caller: usize,
    counts: Mutex<Counts>,
}

impl Gate {
    /// A gate of `slots` slots (at least 1); one caller may hold half, at least 1.
    pub fn new(slots: usize) -> Gate {
        let slots = slots.max(1);
        Gate {
            slots,
            per_caller: (slots / 2).max(1),
            counts: Mutex::new(Counts::default()),
        }
    }

    /// Takes a slot for `caller`, or `None` when the gate or the caller is full.
    pub fn try_acquire(self: &Arc<Self>, caller: &str) -> Option<DecodePermit> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let mine = c.per_caller.get(caller).copied().unwrap_or(0);
        if c.total >= self.slots || mine >= self.per_caller {
            return None;
        }
        c.total += 1;
        c.per_caller.insert(caller.to_owned(), mine + 1);
        Some(DecodePermit {
            gate: self.clone(),
            caller: caller.to_owned(),
        })
    }

    fn release(&self, caller: &str) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_caller.get_mut(caller) {
            *n -= 1;
            if *n == 0 {
                c.per_caller.remove(caller);
            }
        }
    }
}

/// One held decode slot; dropping it gives the slot back.
pub struct DecodePermit {
    gate: Arc<Gate>,
    caller: String,
}

impl Drop for DecodePermit {
    fn drop(&mut self) {
        self.gate.release(&self.caller);
    }
}

/// The decode-gate step.
#[derive(Clone)]
pub struct DecodeGate {
    gate: Arc<Gate>,
}

impl DecodeGate {
    /// Admits bodies through `gate`.
    pub fn new(gate: Arc<Gate>) -> Self {
        DecodeGate { gate }
    }
}

impl Step for DecodeGate {
    fn handle<S: Inner>(&self, req: HttpRequest, next: S) -> ResponseFuture {
        let exchange = Exchange::of(req.extensions());
        let caller = req
            .extensions()
            .get::<Principal>()
            .map_or("anon", Principal::audit_key)
            .to_owned();
        match self.gate.try_acquire(&caller) {
            Some(permit) => {
                exchange.hold_slot(permit);
                pass(next, req)
            }
            None => answer(refuse(
                req.headers(),
                &exchange,
                Refusal::AtCapacity(SHED_MESSAGE.to_owned()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_caller_gets_at_most_half_the_slots() {
        let gate = Arc::new(Gate::new(4));
        let a1 = gate.try_acquire("a").expect("first");
        let _a2 = gate.try_acquire("a").expect("second");
        assert!(gate.try_acquire("a").is_none(), "a holds half already");
        let _b1 = gate.try_acquire("b").expect("b first");
        let _b2 = gate.try_acquire("b").expect("b second");
        assert!(gate.try_acquire("c").is_none(), "gate full");
        drop(a1);
        assert!(gate.try_acquire("c").is_some(), "a slot came back on drop");
    }

    #[test]
    fn a_gate_of_one_still_admits_one() {
        let gate = Arc::new(Gate::new(1));
        let p = gate.try_acquire("a");
        assert!(p.is_some());
        assert!(gate.try_acquire("b").is_none());
    }
}
