//! Admission: the daemon protects itself and stays fair between callers.
//!
//! **Rate tokens are charged per request, not per run** (issue 12, part 1). Every `Run`,
//! `SessionRun` and `OpenSession` takes one token from its caller's bucket as soon as the
//! caller is authenticated, before anything else about the request is looked at
//! ([`Admission::take_token`]), and keeps it whether it then runs or is refused; with the
//! bucket empty it is refused at once. A `CloseSession` that is refused takes one too, if
//! one is left ([`Admission::spend_token`]), but is never refused for want of one: closing
//! frees what the caller holds. `Describe` costs nothing. So a caller cannot make the
//! daemon do work, even work that ends in a refusal, faster than its rate.
//!
//! A run then needs, at wire.md §6.1 step 8, a global slot and a per-caller slot
//! ([`Admission::admit`]). Whatever is full refuses at once with [`Refusal::AtCapacity`]
//! (marked not dispatched, reason `capacity`) and a message naming the limit; any partial
//! reservation is rolled back. Nothing is ever queued.
//!
//! On a metered provider, admission then reserves the run's paid seconds ([`paid`]): the
//! caller's own day first, then the daemon's; a run that does not fit is refused the same
//! way (shed `paid_caller` or `paid_daemon`) and its slots are given back.
//!
//! An admitted run holds a [`Permit`]. Dropping it frees the slots and settles the paid
//! reservation, so no path can leak one; the run keeps it until its sandbox is gone.

mod bucket;
pub mod paid;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use plimsoll::refusal::Refusal;

use crate::config::admission::Limits;
use crate::metrics::{Metrics, ShedReason};
use bucket::Buckets;
use paid::{Paid, PaidBook, PaidDay};

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
    /// The paid allowances, kept only on a metered provider.
    paid: Option<PaidBook>,
}

impl Admission {
    /// A controller enforcing `limits`, counting into `metrics`.
    pub fn new(limits: Limits, metrics: Arc<Metrics>) -> Arc<Admission> {
        Admission::metered(limits, metrics, None)
    }

    /// The same, keeping paid allowances over `daemon_day`, the metered provider's
    /// daemon-wide day (`None` on a provider that is not metered).
    pub fn metered(
        limits: Limits,
        metrics: Arc<Metrics>,
        daemon_day: Option<Arc<PaidDay>>,
    ) -> Arc<Admission> {
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
            paid: daemon_day.map(PaidBook::new),
        })
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        // The counts stay consistent under every update, so a poisoned lock is usable.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits one run for `caller` (whose request has taken its token already), or refuses
    /// it as at capacity.
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
        s.in_flight += 1;
        s.per_caller.insert(caller.to_owned(), mine + 1);
        drop(s);
        self.metrics.inflight_add(1);
        Ok(Permit {
            admission: self.clone(),
            caller: caller.to_owned(),
            paid: None,
        })
    }

    /// Admits one run of `time` for `caller`, whose own daily paid allowance is
    /// `allowance`: the slots ([`Admission::admit`]), then, on a metered provider, its paid
    /// seconds ([`Admission::reserve_paid`]), which the permit settles when dropped.
    pub fn admit_run(
        self: &Arc<Self>,
        caller: &str,
        allowance: Option<u64>,
        time: Duration,
    ) -> Result<Permit, Refusal> {
        let mut permit = self.admit(caller)?;
        // A refusal here drops the permit, which gives the slots back.
        permit.paid = self.reserve_paid(caller, allowance, time)?.map(Arc::new);
        Ok(permit)
    }

    /// Reserves the paid seconds of a run or session of `time` for `caller` (`None` when
    /// the provider is not metered), or refuses it as at capacity, counted as shed.
    pub fn reserve_paid(
        &self,
        caller: &str,
        allowance: Option<u64>,
        time: Duration,
    ) -> Result<Option<Paid>, Refusal> {
        let Some(book) = &self.paid else {
            return Ok(None);
        };
        book.reserve(caller, allowance, time)
            .map(Some)
            .map_err(|(reason, refusal)| {
                self.metrics.shed(reason);
                refusal
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

    /// Takes the token of one request of `caller`, or refuses the request at once when the
    /// caller's bucket is empty (a request that is then refused for another reason keeps
    /// having paid it).
    pub fn take_token(&self, caller: &str) -> Result<(), Refusal> {
        let mut s = self.slots();
        if let Some(b) = s.buckets.as_mut()
            && !b.take(caller, Instant::now())
        {
            drop(s);
            return Err(self.rate_refusal());
        }
        Ok(())
    }

    /// Takes a token of `caller`'s if one is left, and never refuses: the charge of a
    /// refused request that may not be refused for want of a token (`CloseSession`).
    pub fn spend_token(&self, caller: &str) {
        if let Some(b) = self.slots().buckets.as_mut() {
            b.take(caller, Instant::now());
        }
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
    /// The run's paid reservation, settled after the slots are freed.
    paid: Option<Arc<Paid>>,
}

impl Permit {
    /// The run's paid reservation, for a provider to forfeit when a create's fate is unknown.
    pub fn paid(&self) -> Option<Arc<Paid>> {
        self.paid.clone()
    }
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
            paid_seconds_per_day: 0,
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
    fn a_request_pays_its_token_before_anything_and_an_empty_bucket_refuses() {
        let metrics = Arc::new(Metrics::default());
        let a = Admission::new(limits(8, 0, 2, 2), metrics.clone());
        a.take_token("a").unwrap();
        let _p = a.admit("a").unwrap();
        // A refused request paid too; the next finds the bucket empty.
        a.take_token("a").unwrap();
        let msg = reason(a.take_token("a").unwrap_err());
        assert!(msg.contains("rate limit: 2 runs/min"), "{msg}");
        assert_eq!(a.in_flight(), 1, "a rate refusal takes no slot");
        assert!(
            metrics
                .render()
                .contains("plimsoll_shed_total{reason=\"rate\"} 1")
        );
        // Another caller has a bucket of its own.
        assert!(a.take_token("b").is_ok());
    }

    #[test]
    fn spending_a_token_never_refuses_and_empties_the_bucket() {
        let a = Admission::new(limits(8, 0, 1, 1), Arc::new(Metrics::default()));
        a.spend_token("a");
        a.spend_token("a");
        assert!(a.take_token("a").is_err());
        // With the rate limit off there is nothing to take.
        let off = Admission::new(limits(8, 0, 0, 0), Arc::new(Metrics::default()));
        for _ in 0..100 {
            off.spend_token("a");
            assert!(off.take_token("a").is_ok());
        }
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

    #[test]
    fn a_run_over_a_paid_allowance_is_shed_and_gives_its_slot_back() {
        let metrics = Arc::new(Metrics::default());
        let day = Arc::new(PaidDay::new(200));
        let a = Admission::metered(limits(8, 0, 0, 0), metrics.clone(), Some(day));
        let minute = Duration::from_secs(60);
        let held = a.admit_run("a", Some(100), minute).unwrap();
        assert!(held.paid().is_some());
        let msg = reason(a.admit_run("a", Some(100), minute).unwrap_err());
        assert!(msg.contains("paid_seconds_per_day=100"), "{msg}");
        assert_eq!(a.in_flight(), 1, "the refused run's slot was given back");
        let _b = a.admit_run("b", None, minute).unwrap();
        let msg = reason(a.admit_run("c", None, minute).unwrap_err());
        assert!(msg.contains("SANDBOX_PAID_SECONDS_PER_DAY=200"), "{msg}");
        let text = metrics.render();
        assert!(
            text.contains("plimsoll_shed_total{reason=\"paid_caller\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("plimsoll_shed_total{reason=\"paid_daemon\"} 1"),
            "{text}"
        );
        // Not metered: nothing is reserved and nothing refused.
        let free = Admission::new(limits(8, 0, 0, 0), Arc::new(Metrics::default()));
        let p = free.admit_run("a", Some(1), minute).unwrap();
        assert!(p.paid().is_none());
    }
}
