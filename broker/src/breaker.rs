//! The per-run circuit breaker (`spec/grants.md` §2.2 step 6).
//!
//! An upstream 429 or 503 opens it for the response's `Retry-After`, clamped to 1–30 s
//! (1 s when missing or unreadable). While open, calls are shed. After a 503, and only a
//! 503, a profile with a `health_check` may close it early: one caller per second is elected
//! to probe, and a 2xx closes the breaker.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// Shortest open window.
pub const MIN_OPEN: Duration = Duration::from_secs(1);
/// Longest open window.
pub const MAX_OPEN: Duration = Duration::from_secs(30);
/// How often one caller may probe the health check.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The breaker's state.
#[derive(Debug, Default)]
pub struct Breaker {
    open_until: Option<Instant>,
    /// Opened by a 503 (probe-able), not a 429.
    after_503: bool,
    next_probe: Option<Instant>,
}

/// What a call should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Closed: go ahead.
    Pass,
    /// Open: shed the call.
    Shed,
    /// Open after a 503 and this caller is elected to probe the health check first.
    Probe,
}

// === impl Breaker ===

impl Breaker {
    /// Decides for a call at `now`. `can_probe` is whether the profile has a health check.
    pub fn gate(&mut self, now: Instant, can_probe: bool) -> Gate {
        match self.open_until {
            Some(until) if now < until => {
                if can_probe && self.after_503 && self.next_probe.is_none_or(|t| now >= t) {
                    self.next_probe = Some(now + PROBE_EVERY);
                    Gate::Probe
                } else {
                    Gate::Shed
                }
            }
            _ => {
                self.open_until = None;
                Gate::Pass
            }
        }
    }

    /// Feeds an upstream status and its `Retry-After` header.
    pub fn observe(&mut self, now: Instant, status: u16, retry_after: Option<&str>) {
        if status == 429 || status == 503 {
            let window = retry_after
                .and_then(|v| parse_retry_after(v, SystemTime::now()))
                .unwrap_or(MIN_OPEN)
                .clamp(MIN_OPEN, MAX_OPEN);
            self.open_until = Some(now + window);
            self.after_503 = status == 503;
            self.next_probe = None;
        }
    }

    /// A probe answered 2xx.
    pub fn close(&mut self) {
        self.open_until = None;
    }
}

/// `Retry-After` as delay-seconds or an HTTP-date.
fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_for_retry_after_clamped() {
        let mut b = Breaker::default();
        let now = Instant::now();
        b.observe(now, 429, Some("100"));
        assert_eq!(b.gate(now + Duration::from_secs(29), true), Gate::Shed);
        assert_eq!(b.gate(now + MAX_OPEN, true), Gate::Pass);
        b.observe(now, 503, Some("0"));
        assert_eq!(b.gate(now + Duration::from_millis(999), false), Gate::Shed);
        assert_eq!(b.gate(now + MIN_OPEN, false), Gate::Pass);
        b.observe(now, 503, None);
        assert_eq!(b.gate(now, false), Gate::Shed);
        b.observe(now, 200, None);
        assert_eq!(b.gate(now + MIN_OPEN, false), Gate::Pass);
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_503_window_is_probed_once_per_second() {
        let mut b = Breaker::default();
        let now = Instant::now();
        b.observe(now, 429, Some("10"));
        assert_eq!(b.gate(now, true), Gate::Shed);
        b.observe(now, 503, Some("10"));
        assert_eq!(b.gate(now, true), Gate::Probe);
        assert_eq!(b.gate(now + Duration::from_millis(500), true), Gate::Shed);
        assert_eq!(b.gate(now + PROBE_EVERY, true), Gate::Probe);
        b.close();
        assert_eq!(b.gate(now + PROBE_EVERY, true), Gate::Pass);
    }

    #[test]
    fn retry_after_reads_both_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(12));
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(12))
        );
        assert_eq!(parse_retry_after("soon", now), None);
    }
}
