//! Per-caller token buckets: refilled continuously at `rate / 60` tokens a
//! second up to `burst`; a new bucket starts full; each run costs one token.
//!
//! Idle buckets are evicted after two minutes (checked at most once a
//! minute), and only when refilling would have made them full anyway, so
//! forgetting a caller never earns it extra tokens.

use std::collections::HashMap;
use std::time::{Duration, Instant};

const IDLE_EVICT: Duration = Duration::from_secs(120);
const SWEEP_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Every caller's bucket.
#[derive(Debug)]
pub struct Buckets {
    per_sec: f64,
    burst: f64,
    buckets: HashMap<String, Bucket>,
    swept: Instant,
}

impl Buckets {
    /// Buckets refilled at `rate_per_min` up to `burst` (both > 0).
    pub fn new(rate_per_min: u32, burst: u32, now: Instant) -> Buckets {
        Buckets {
            per_sec: f64::from(rate_per_min) / 60.0,
            burst: f64::from(burst.max(1)),
            buckets: HashMap::new(),
            swept: now,
        }
    }

    fn refilled(&self, b: Bucket, now: Instant) -> f64 {
        let earned = now.saturating_duration_since(b.at).as_secs_f64() * self.per_sec;
        (b.tokens + earned).min(self.burst)
    }

    /// Takes one token for `caller`; false when the bucket is empty.
    pub fn take(&mut self, caller: &str, now: Instant) -> bool {
        self.sweep(now);
        let current = match self.buckets.get(caller) {
            Some(b) => self.refilled(*b, now),
            None => self.burst,
        };
        if current < 1.0 {
            self.buckets.insert(
                caller.to_owned(),
                Bucket {
                    tokens: current,
                    at: now,
                },
            );
            return false;
        }
        self.buckets.insert(
            caller.to_owned(),
            Bucket {
                tokens: current - 1.0,
                at: now,
            },
        );
        true
    }

    fn sweep(&mut self, now: Instant) {
        if now.saturating_duration_since(self.swept) < SWEEP_EVERY {
            return;
        }
        self.swept = now;
        let (per_sec, burst) = (self.per_sec, self.burst);
        self.buckets.retain(|_, b| {
            let idle = now.saturating_duration_since(b.at);
            let full = b.tokens + idle.as_secs_f64() * per_sec >= burst;
            !(idle >= IDLE_EVICT && full)
        });
    }

    /// How many callers have a bucket.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_bucket_starts_full_and_empties() {
        let t0 = Instant::now();
        let mut b = Buckets::new(60, 3, t0);
        assert!(b.take("a", t0));
        assert!(b.take("a", t0));
        assert!(b.take("a", t0));
        assert!(!b.take("a", t0), "burst of 3 spent");
        assert!(b.take("b", t0), "another caller has its own bucket");
    }

    #[test]
    fn tokens_refill_continuously_up_to_the_burst() {
        let t0 = Instant::now();
        let mut b = Buckets::new(60, 2, t0);
        assert!(b.take("a", t0));
        assert!(b.take("a", t0));
        assert!(!b.take("a", t0 + Duration::from_millis(500)));
        assert!(
            b.take("a", t0 + Duration::from_millis(1600)),
            "one token a second"
        );
        // Ten idle minutes earn no more than the burst.
        let later = t0 + Duration::from_secs(600);
        assert!(b.take("a", later));
        assert!(b.take("a", later));
        assert!(!b.take("a", later));
    }

    #[test]
    fn eviction_never_earns_extra_tokens() {
        let t0 = Instant::now();
        let mut b = Buckets::new(1, 5, t0);
        for _ in 0..5 {
            assert!(b.take("a", t0));
        }
        // Three minutes later only 3 tokens were earned: the bucket is not full,
        // so the sweep keeps it.
        let t1 = t0 + Duration::from_secs(180);
        assert!(b.take("z", t1));
        assert_eq!(b.len(), 2, "a partly-refilled bucket is kept");
        let mut taken = 0;
        while b.take("a", t1) {
            taken += 1;
        }
        assert_eq!(taken, 3);
    }

    #[test]
    fn full_idle_buckets_are_evicted() {
        let t0 = Instant::now();
        let mut b = Buckets::new(60, 1, t0);
        assert!(b.take("a", t0));
        assert!(b.take("z", t0 + Duration::from_secs(200)));
        assert_eq!(b.len(), 1, "a refilled long ago and was forgotten");
    }
}
