//! How long the simulator spent serving each sandbox's calls, for benchmarks: a client's time
//! minus this is the client's own time, a figure the simulator's noise (one create + exec
//! varies by 100 ms and more on a busy machine) does not blur. Counted: the create (from its
//! request's arrival to its answer), the detail read, and each process start from its
//! request's arrival to its end frame, the VM's own run of the command included. Not counted:
//! the kill, which a client answers before.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use crate::app::locked;

/// Sandboxes remembered; the oldest is forgotten past this (a long test makes thousands).
const KEPT: usize = 4096;

/// One sandbox's served time.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Served {
    /// Milliseconds, summed over its counted calls.
    pub ms: f64,
    /// How many calls were counted.
    pub calls: u32,
}

#[derive(Default)]
pub struct Ledger {
    inner: Mutex<(HashMap<String, Served>, VecDeque<String>)>,
}

impl Ledger {
    /// Adds `took` to sandbox `id`'s time.
    pub fn add(&self, id: &str, took: Duration) {
        let mut guard = locked(&self.inner);
        let (times, order) = &mut *guard;
        if !times.contains_key(id) {
            if order.len() >= KEPT
                && let Some(oldest) = order.pop_front()
            {
                times.remove(&oldest);
            }
            order.push_back(id.to_owned());
        }
        let entry = times.entry(id.to_owned()).or_default();
        entry.ms += took.as_secs_f64() * 1000.0;
        entry.calls += 1;
    }

    /// Sandbox `id`'s time, if any call of it was counted.
    pub fn get(&self, id: &str) -> Option<Served> {
        locked(&self.inner).0.get(id).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_add_up_per_sandbox_and_the_oldest_is_forgotten_past_the_bound() {
        let ledger = Ledger::default();
        ledger.add("a", Duration::from_millis(3));
        ledger.add("a", Duration::from_micros(1500));
        ledger.add("b", Duration::from_millis(1));
        let a = ledger.get("a").expect("a");
        assert_eq!(a.calls, 2);
        assert!((a.ms - 4.5).abs() < 1e-9, "{a:?}");
        assert!(ledger.get("c").is_none());
        for i in 0..KEPT {
            ledger.add(&format!("n{i}"), Duration::from_millis(1));
        }
        assert!(ledger.get("a").is_none(), "the oldest goes first");
        assert!(ledger.get("b").is_none());
        assert_eq!(
            ledger.get(&format!("n{}", KEPT - 1)).map(|s| s.calls),
            Some(1)
        );
    }
}
