//! Admission: the daemon protects itself and stays fair between callers.
//!
//! Every run needs, in this order, a global slot, a per-caller slot and a
//! token from the caller's bucket. Whatever is full refuses at once with
//! [`Refusal::AtCapacity`] (marked not dispatched, reason `capacity`) and a
//! message naming the limit; any partial reservation is rolled back. Nothing
//! is ever queued.
//!
//! An admitted run holds a [`Permit`]. Dropping it frees the slots, so no path
//! can leak one; the run keeps it until its sandbox is gone.

mod bucket;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use plimsoll::refusal::Refusal;

use crate::config::admission::Limits;
use crate::metrics::{Metrics, ShedReason};
use bucket::Buckets;

#[derive(Debug)]
struct Slots {
    in_flight: u32,
    per_caller: HashMap<String, u32>,
    buckets: Option<Buckets>,
}

/// The admission controller, shared by every handler.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    slots: Mutex<Slots>,
    metrics: Arc<Metrics>,
}

impl Admission {
    /// A controller enforcing `limits`, counting into `metrics`.
    pub fn new(limits: Limits, metrics: Arc<Metrics>) -> Arc<Admission> {
        let buckets = (limits.rate_per_min > 0)
            .then(|| Buckets::new(limits.rate_per_min, limits.rate_burst, Instant::now()));
        Arc::new(Admission {
            limits,
            slots: Mutex::new(Slots {
                in_flight: 0,
                per_caller: HashMap::new(),
                buckets,
            }),
            metrics,
        })
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        // The counts stay consistent under every update, so a poisoned lock is usable.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits one run for `caller`, or refuses it as at capacity.
    pub fn admit(self: &Arc<Self>, caller: &str) -> Result<Permit, Refusal> {
        let mut s = self.slots();
        // 1: the global slot.
        if s.in_flight >= self.limits.max_concurrent {
            drop(s);
            return Err(self.shed(
                ShedReason::AtCapacity,
                "sandbox is at capacity, retry shortly".to_owned(),
            ));
        }
        // 2: the caller's slot.
        let mine = s.per_caller.get(caller).copied().unwrap_or(0);
        let per_key = self.limits.per_key_concurrent;
        if per_key > 0 && mine >= per_key {
            drop(s);
            return Err(self.shed(
                ShedReason::PerKey,
                format!("per-caller concurrency limit reached ({mine} in flight), retry shortly"),
            ));
        }
        // 3: a token. Nothing was reserved yet, so a refusal here rolls back nothing.
        if let Some(b) = s.buckets.as_mut()
            && !b.take(caller, Instant::now())
        {
            drop(s);
            return Err(self.rate_refusal());
        }
        s.in_flight += 1;
        s.per_caller.insert(caller.to_owned(), mine + 1);
        drop(s);
        self.metrics.inflight_add(1);
        Ok(Permit {
            admission: self.clone(),
            caller: caller.to_owned(),
        })
    }

    /// The refusal of a caller out of rate tokens, counted as shed.
    fn rate_refusal(&self) -> Refusal {
        self.shed(
            ShedReason::Rate,
            format!(
                "rate limit: {} runs/min per caller, retry shortly",
                self.limits.rate_per_min
            ),
        )
    }

    /// Charges `caller` one rate token without a slot: a session call, whose session
    /// already holds its slot (providers.md §10.2).
    pub fn charge(&self, caller: &str) -> Result<(), Refusal> {
        let mut s = self.slots();
        if let Some(b) = s.buckets.as_mut()
            && !b.take(caller, Instant::now())
        {
            drop(s);
            return Err(self.rate_refusal());
        }
        Ok(())
    }

    fn shed(&self, reason: ShedReason, message: String) -> Refusal {
        self.metrics.shed(reason);
        Refusal::AtCapacity(message)
    }

    fn release(&self, caller: &str) {
        let mut s = self.slots();
        s.in_flight = s.in_flight.saturating_sub(1);
        if let Some(n) = s.per_caller.get_mut(caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.per_caller.remove(caller);
            }
        }
        drop(s);
        self.metrics.inflight_add(-1);
    }

    /// Runs in flight now.
    pub fn in_flight(&self) -> u32 {
        self.slots().in_flight
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }
}

/// One admitted run's slots; dropping it frees them.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    caller: String,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.admission.release(&self.caller);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: u32, per_key: u32, rate: u32, burst: u32) -> Limits {
        Limits {
            max_concurrent: max,
            per_key_concurrent: per_key,
            rate_per_min: rate,
            rate_burst: burst,
            total_memory_mb: 0,
            per_run_memory_mb: 256,
            clamped: false,
        }
    }

    fn reason(r: Refusal) -> String {
        match r {
            Refusal::AtCapacity(m) => m,
            other => panic!("expected AtCapacity, got {other:?}"),
        }
    }

    #[test]
    fn the_global_cap_sheds_at_once_and_frees_on_drop() {
        let metrics = Arc::new(Metrics::default());
        let a = Admission::new(limits(2, 0, 0, 0), metrics.clone());
        let p1 = a.admit("a").unwrap();
        let _p2 = a.admit("b").unwrap();
        let msg = reason(a.admit("c").unwrap_err());
        assert!(msg.contains("at capacity"), "{msg}");
        assert!(
            metrics
                .render()
                .contains("plimsoll_shed_total{reason=\"at_capacity\"} 1")
        );
        drop(p1);
        assert!(a.admit("c").is_ok());
    }

    #[test]
    fn one_caller_cannot_take_every_slot() {
        let a = Admission::new(limits(4, 2, 0, 0), Arc::new(Metrics::default()));
        let _a1 = a.admit("a").unwrap();
        let _a2 = a.admit("a").unwrap();
        let msg = reason(a.admit("a").unwrap_err());
        assert!(
            msg.contains("per-caller concurrency limit reached (2 in flight)"),
            "{msg}"
        );
        assert!(a.admit("b").is_ok(), "another caller still gets its share");
    }

    #[test]
    fn rate_refusal_takes_no_slot() {
        let a = Admission::new(limits(8, 0, 1, 1), Arc::new(Metrics::default()));
        let p = a.admit("a").unwrap();
        drop(p);
        let msg = reason(a.admit("a").unwrap_err());
        assert!(msg.contains("rate limit: 1 runs/min"), "{msg}");
        assert_eq!(a.in_flight(), 0);
    }

    #[test]
    fn in_flight_gauge_returns_to_zero() {
        let metrics = Arc::new(Metrics::default());
        let a = Admission::new(limits(3, 0, 0, 0), metrics.clone());
        let permits: Vec<_> = (0..10)
            .filter_map(|i| a.admit(&format!("c{i}")).ok())
            .collect();
        assert_eq!(permits.len(), 3);
        assert!(metrics.render().contains("plimsoll_inflight 3\n"));
        drop(permits);
        assert_eq!(a.in_flight(), 0);
        assert!(metrics.render().contains("plimsoll_inflight 0\n"));
    }
}
