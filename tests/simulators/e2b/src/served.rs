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
        let mut guard = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
        let guard = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        guard.0.get(id).copied()
    }
}
