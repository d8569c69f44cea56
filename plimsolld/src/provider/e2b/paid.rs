//! The day's paid VM seconds (`SANDBOX_PAID_SECONDS_PER_DAY`, providers.md §10): each run
//! reserves its timeout plus the teardown bound (33 s) before the create is sent, and is
//! charged the time its VM really lived (from the reservation to the end of the kill) once the
//! kill finished. A run that does not fit is refused `capacity` and nothing is created. UTC
//! days, in memory only: a restart forgets (K daemons allow K times).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use plimsoll::refusal::Refusal;

/// What E2B may still bill after a run's deadline: the kill's attempts (grants.md §6.3).
pub const TEARDOWN_BOUND: Duration = Duration::from_secs(33);

/// The day's allowance and what is reserved or spent of it.
#[derive(Debug)]
pub struct PaidDay {
    /// The allowance; zero means none is kept.
    limit: Duration,
    /// (UTC day number, reserved or charged so far that day).
    used: Mutex<(u64, Duration)>,
}

/// A run's reservation; dropped once its VM is killed, it charges the time it was held.
#[derive(Debug)]
pub struct Charge {
    day: Arc<PaidDay>,
    day_number: u64,
    reserved: Duration,
    since: Instant,
    /// Charge the whole reservation (a lost create: E2B may bill a VM nobody can name).
    forfeited: AtomicBool,
}

fn today() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        / 86_400
}

impl PaidDay {
    /// `seconds` a day; 0 keeps no account.
    pub fn new(seconds: u64) -> PaidDay {
        PaidDay {
            limit: Duration::from_secs(seconds),
            used: Mutex::new((today(), Duration::ZERO)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Duration)> {
        // A panic while holding this lock leaves a valid pair; keep using it.
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves a run of `timeout`, or refuses it with reason `capacity`.
    pub fn reserve(self: &Arc<Self>, timeout: Duration) -> Result<Option<Charge>, Refusal> {
        if self.limit.is_zero() {
            return Ok(None);
        }
        let reserved = timeout + TEARDOWN_BOUND;
        let day = today();
        let mut used = self.lock();
        if used.0 != day {
            *used = (day, Duration::ZERO);
        }
        if used.1 + reserved > self.limit {
            return Err(Refusal::AtCapacity(format!(
                "the day's paid VM seconds (SANDBOX_PAID_SECONDS_PER_DAY={}) cannot cover this run's {} s; nothing ran",
                self.limit.as_secs(),
                reserved.as_secs()
            )));
        }
        used.1 += reserved;
        Ok(Some(Charge {
            day: self.clone(),
            day_number: day,
            reserved,
            since: Instant::now(),
            forfeited: AtomicBool::new(false),
        }))
    }

    /// Charges `spent` outright, whether or not it fits: the startup proof's VM, made before
    /// the daemon serves, is the daemon's own cost and is never refused.
    pub fn charge_spent(&self, spent: Duration) {
        if self.limit.is_zero() {
            return;
        }
        let day = today();
        let mut used = self.lock();
        if used.0 != day {
            *used = (day, Duration::ZERO);
        }
        used.1 += spent;
    }

    /// What is reserved or spent today.
    #[cfg(test)]
    fn used(&self) -> Duration {
        self.lock().1
    }
}

impl Charge {
    /// Keeps the whole reservation charged when this is dropped.
    pub fn forfeit(&self) {
        self.forfeited.store(true, Ordering::Relaxed);
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        // The reservation is replaced by the time really held (never more: E2B's own timeout
        // and the kill bound end the VM within it).
        let spent = if self.forfeited.load(Ordering::Relaxed) {
            self.reserved
        } else {
            self.since.elapsed().min(self.reserved)
        };
        let mut used = self.day.lock();
        if used.0 == self.day_number {
            used.1 = used.1.saturating_sub(self.reserved) + spent;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_reserves_its_bound_and_is_charged_what_it_held() {
        let day = Arc::new(PaidDay::new(100));
        let first = day.reserve(Duration::from_secs(30)).ok().flatten();
        assert!(first.is_some());
        assert_eq!(day.used(), Duration::from_secs(63));
        // 63 + 63 is over 100: refused while the first is held.
        assert!(day.reserve(Duration::from_secs(30)).is_err());
        drop(first);
        assert!(day.used() < Duration::from_secs(1));
        let lost = day.reserve(Duration::from_secs(30)).ok().flatten();
        if let Some(lost) = &lost {
            lost.forfeit();
        }
        drop(lost);
        assert!(day.used() >= Duration::from_secs(63));
        // The proof's VM is charged even past the allowance, and then refuses runs.
        day.charge_spent(Duration::from_secs(40));
        assert!(day.used() >= Duration::from_secs(103));
        assert!(day.reserve(Duration::from_secs(1)).is_err());
        let none = Arc::new(PaidDay::new(0));
        assert!(matches!(none.reserve(Duration::from_secs(3600)), Ok(None)));
    }
}
