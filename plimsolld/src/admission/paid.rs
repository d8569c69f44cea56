//! Paid allowances (config.md §3.1, providers.md §10.2): on a metered provider each run
//! or session reserves its paid seconds at admission (wire.md §6.1 step 8, after the
//! limiter), first against its caller's own day (`paid_seconds_per_day` in the clients
//! file) and then against the daemon's (`SANDBOX_PAID_SECONDS_PER_DAY`). A run reserves its
//! timeout plus the teardown bound (33 s), a session its whole lifetime plus the same; each is
//! charged the time its VM really lived (from the reservation to the end of the kill) once
//! the kill finished. What does not fit is refused `capacity` (shed `paid_caller` or
//! `paid_daemon`) and nothing is created. A caller without an allowance (none set, 0, the
//! shared token, open dev mode) draws on the daemon's day only. UTC days, in memory only: a
//! restart forgets (K daemons allow K times).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use plimsoll::refusal::Refusal;

use crate::metrics::ShedReason;

/// What a metered provider may still bill after a run's deadline: the kill's attempts
/// (grants.md §6.3).
pub const TEARDOWN_BOUND: Duration = Duration::from_secs(33);

/// One day's allowance and what is reserved or spent of it.
#[derive(Debug)]
pub struct PaidDay {
    /// The allowance; zero means none is kept.
    limit: Duration,
    /// (UTC day number, reserved or charged so far that day).
    used: Mutex<(u64, Duration)>,
}

/// One day's reservation; dropped once its VM is killed, it charges the time it was held.
#[derive(Debug)]
pub struct Charge {
    day: Arc<PaidDay>,
    day_number: u64,
    reserved: Duration,
    since: Instant,
    /// Charge the whole reservation (a lost create: the vendor may bill a VM nobody can name).
    forfeited: AtomicBool,
    /// Charge nothing (the other day refused the run: nothing was created).
    cancelled: bool,
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

    /// The allowance in seconds (0: none is kept).
    pub fn limit_secs(&self) -> u64 {
        self.limit.as_secs()
    }

    /// Today's account, rolled over when the UTC day changed.
    fn today(&self) -> (u64, std::sync::MutexGuard<'_, (u64, Duration)>) {
        // A panic while holding this lock leaves a valid pair; keep using it.
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let day = today();
        if used.0 != day {
            *used = (day, Duration::ZERO);
        }
        (day, used)
    }

    /// Reserves `reserved` when it fits: `None` when no account is kept, `Some(Err(()))`
    /// when today's allowance cannot cover it.
    fn reserve(
        self: &Arc<Self>,
        reserved: Duration,
        refusable: bool,
    ) -> Option<Result<Charge, ()>> {
        if self.limit.is_zero() {
            return None;
        }
        let (day, mut used) = self.today();
        if refusable && used.1 + reserved > self.limit {
            return Some(Err(()));
        }
        used.1 += reserved;
        Some(Ok(Charge {
            day: self.clone(),
            day_number: day,
            reserved,
            since: Instant::now(),
            forfeited: AtomicBool::new(false),
            cancelled: false,
        }))
    }

    /// Reserves `time` plus the teardown bound for the daemon's own VM (the startup session
    /// proof), never refused: it is made before the daemon serves.
    pub fn reserve_own(self: &Arc<Self>, time: Duration) -> Option<Charge> {
        self.reserve(time + TEARDOWN_BOUND, false)
            .and_then(Result::ok)
    }

    /// Charges `spent` outright, whether or not it fits: the startup proof's VM, made before
    /// the daemon serves, is the daemon's own cost and is never refused.
    pub fn charge_spent(&self, spent: Duration) {
        if self.limit.is_zero() {
            return;
        }
        self.today().1.1 += spent;
    }

    /// What is reserved or spent today.
    #[cfg(test)]
    fn used(&self) -> Duration {
        self.today().1.1
    }
}

impl Charge {
    /// Keeps the whole reservation charged when this is dropped.
    pub fn forfeit(&self) {
        self.forfeited.store(true, Ordering::Relaxed);
    }

    /// Gives the whole reservation back: nothing was created.
    fn cancel(mut self) {
        self.cancelled = true;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        // The reservation is replaced by the time really held (never more: the vendor's own
        // timeout and the kill bound end the VM within it).
        let spent = if self.cancelled {
            Duration::ZERO
        } else if self.forfeited.load(Ordering::Relaxed) {
            self.reserved
        } else {
            self.since.elapsed().min(self.reserved)
        };
        let (_, mut used) = self.day.today();
        if used.0 == self.day_number {
            used.1 = used.1.saturating_sub(self.reserved) + spent;
        }
    }
}

/// A run's or a session's reservation against both days; it travels with the VM and
/// settles both once the VM is gone.
#[derive(Debug)]
pub struct Paid {
    caller: Option<Charge>,
    daemon: Option<Charge>,
}

impl Paid {
    /// The daemon's own VM (the startup session proof): its day only, never refused.
    pub fn own(daemon: &Arc<PaidDay>, time: Duration) -> Paid {
        Paid {
            caller: None,
            daemon: daemon.reserve_own(time),
        }
    }

    /// Keeps both whole reservations charged (a create whose fate is unknown).
    pub fn forfeit(&self) {
        for charge in [&self.caller, &self.daemon].into_iter().flatten() {
            charge.forfeit();
        }
    }
}

/// The daemon's day and one day per caller with an allowance.
#[derive(Debug)]
pub struct PaidBook {
    daemon: Arc<PaidDay>,
    /// Only callers of the clients file have an allowance, so this is bounded by it.
    callers: Mutex<HashMap<String, Arc<PaidDay>>>,
}

impl PaidBook {
    /// A book over the metered provider's daemon-wide day.
    pub fn new(daemon: Arc<PaidDay>) -> PaidBook {
        PaidBook {
            daemon,
            callers: Mutex::new(HashMap::new()),
        }
    }

    fn caller_day(&self, caller: &str, allowance: u64) -> Arc<PaidDay> {
        let mut callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
        callers
            .entry(caller.to_owned())
            .or_insert_with(|| Arc::new(PaidDay::new(allowance)))
            .clone()
    }

    /// Reserves `time` plus the teardown bound for `caller` (with its own daily `allowance`,
    /// if any): the caller's day first, then the daemon's; a refusal by either rolls the
    /// other back.
    pub fn reserve(
        &self,
        caller: &str,
        allowance: Option<u64>,
        time: Duration,
    ) -> Result<Paid, (ShedReason, Refusal)> {
        let reserved = time + TEARDOWN_BOUND;
        let day = allowance
            .filter(|n| *n > 0)
            .map(|n| self.caller_day(caller, n));
        let caller_charge = match day.as_ref().and_then(|d| d.reserve(reserved, true)) {
            Some(Err(())) => {
                return Err((
                    ShedReason::PaidCaller,
                    Refusal::AtCapacity(format!(
                        "this caller's paid VM seconds for the day (paid_seconds_per_day={}) cannot cover the {} s this needs; nothing ran",
                        allowance.unwrap_or_default(),
                        reserved.as_secs()
                    )),
                ));
            }
            Some(Ok(charge)) => Some(charge),
            None => None,
        };
        let daemon_charge = match self.daemon.reserve(reserved, true) {
            Some(Err(())) => {
                if let Some(charge) = caller_charge {
                    charge.cancel();
                }
                return Err((
                    ShedReason::PaidDaemon,
                    Refusal::AtCapacity(format!(
                        "the day's paid VM seconds (SANDBOX_PAID_SECONDS_PER_DAY={}) cannot cover the {} s this needs; nothing ran",
                        self.daemon.limit_secs(),
                        reserved.as_secs()
                    )),
                ));
            }
            Some(Ok(charge)) => Some(charge),
            None => None,
        };
        Ok(Paid {
            caller: caller_charge,
            daemon: daemon_charge,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn shed(r: Result<Paid, (ShedReason, Refusal)>) -> ShedReason {
        match r {
            Err((reason, Refusal::AtCapacity(_))) => reason,
            other => panic!("expected a capacity refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_run_reserves_its_bound_and_is_charged_what_it_held() {
        let day = Arc::new(PaidDay::new(100));
        let book = PaidBook::new(day.clone());
        let first = book.reserve("a", None, secs(30));
        assert!(first.is_ok());
        assert_eq!(day.used(), secs(63));
        // 63 + 63 is over 100: refused while the first is held.
        assert_eq!(
            shed(book.reserve("b", None, secs(30))),
            ShedReason::PaidDaemon
        );
        drop(first);
        assert!(day.used() < secs(1));
        if let Ok(lost) = book.reserve("a", None, secs(30)) {
            lost.forfeit();
        }
        assert!(day.used() >= secs(63));
        // The proof's VM is charged even past the allowance, and then refuses runs.
        day.charge_spent(secs(40));
        assert!(day.used() >= secs(103));
        assert_eq!(
            shed(book.reserve("a", None, secs(1))),
            ShedReason::PaidDaemon
        );
        // The daemon's own session is never refused, and settles what it held.
        let own = Paid::own(&day, secs(180));
        assert!(day.used() >= secs(316));
        drop(own);
        assert!(day.used() < secs(104));
        let none = PaidBook::new(Arc::new(PaidDay::new(0)));
        assert!(none.reserve("a", None, secs(3600)).is_ok());
    }

    #[test]
    fn a_caller_is_held_to_its_own_day_before_the_daemons() {
        let day = Arc::new(PaidDay::new(1000));
        let book = PaidBook::new(day.clone());
        let held = book.reserve("a", Some(100), secs(30));
        assert!(held.is_ok());
        // The caller's own day refuses first and the daemon's is left untouched.
        assert_eq!(
            shed(book.reserve("a", Some(100), secs(30))),
            ShedReason::PaidCaller
        );
        assert_eq!(day.used(), secs(63));
        // Another caller, or one without an allowance, still runs.
        let other = book.reserve("b", Some(100), secs(30));
        assert!(other.is_ok());
        assert!(book.reserve("c", None, secs(30)).is_ok());
        assert!(book.reserve("d", Some(0), secs(30)).is_ok());
        drop(held);
        assert!(book.reserve("a", Some(100), secs(30)).is_ok());
    }

    #[test]
    fn a_daemon_refusal_gives_the_callers_reservation_back() {
        let day = Arc::new(PaidDay::new(100));
        let book = PaidBook::new(day);
        let held = book.reserve("a", None, secs(30));
        assert!(held.is_ok());
        assert_eq!(
            shed(book.reserve("b", Some(70), secs(30))),
            ShedReason::PaidDaemon
        );
        drop(held);
        // Nothing of the refused run stayed on b's day: 63 still fits in 70.
        assert!(book.reserve("b", Some(70), secs(30)).is_ok());
    }
}
