//! The daemon's counters and their Prometheus text form (config.md §7).
//!
//! The text is written by hand because the contract is the classic
//! `text/plain; version=0.0.4` exposition with exact family names, and all
//! five shed reasons are always printed, even at zero.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Why admission shed a request (the `reason` label of `plimsoll_shed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// The global run cap.
    AtCapacity,
    /// The per-caller cap.
    PerKey,
    /// The caller's token bucket.
    Rate,
    /// The caller's paid allowance.
    PaidCaller,
    /// The daemon's paid allowance.
    PaidDaemon,
}

impl ShedReason {
    const ALL: [ShedReason; 5] = [
        ShedReason::AtCapacity,
        ShedReason::PerKey,
        ShedReason::Rate,
        ShedReason::PaidCaller,
        ShedReason::PaidDaemon,
    ];

    fn label(self) -> &'static str {
        match self {
            ShedReason::AtCapacity => "at_capacity",
            ShedReason::PerKey => "per_key",
            ShedReason::Rate => "rate",
            ShedReason::PaidCaller => "paid_caller",
            ShedReason::PaidDaemon => "paid_daemon",
        }
    }
}

/// The counters, shared by the handlers and the metrics listener.
#[derive(Debug, Default)]
pub struct Metrics {
    runs: AtomicU64,
    runs_failed: AtomicU64,
    inflight: AtomicI64,
    shed: [AtomicU64; 5],
}

impl Metrics {
    /// A run was handed to the provider.
    pub fn run_dispatched(&self) {
        self.runs.fetch_add(1, Ordering::Relaxed);
    }

    /// A run failed for an infrastructure reason (never a guest's own failure).
    pub fn run_failed(&self) {
        self.runs_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `delta` to the held limiter slots.
    pub fn inflight_add(&self, delta: i64) {
        self.inflight.fetch_add(delta, Ordering::Relaxed);
    }

    /// Admission shed a request.
    pub fn shed(&self, reason: ShedReason) {
        let i = ShedReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.shed[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
            );
        };
        counter(
            &mut out,
            "plimsoll_runs_total",
            "Runs dispatched to the provider.",
            self.runs.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "plimsoll_runs_failed_total",
            "Runs that failed for an infrastructure reason.",
            self.runs_failed.load(Ordering::Relaxed),
        );
        let _ = write!(
            out,
            "# HELP plimsoll_inflight Limiter slots held.\n# TYPE plimsoll_inflight gauge\nplimsoll_inflight {}\n",
            self.inflight.load(Ordering::Relaxed)
        );
        out.push_str("# HELP plimsoll_shed_total Requests shed by admission, by reason.\n# TYPE plimsoll_shed_total counter\n");
        for (reason, n) in ShedReason::ALL.iter().zip(&self.shed) {
            let _ = writeln!(
                out,
                "plimsoll_shed_total{{reason=\"{}\"}} {}",
                reason.label(),
                n.load(Ordering::Relaxed)
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_five_shed_reasons_are_always_printed() {
        let text = Metrics::default().render();
        for r in [
            "at_capacity",
            "per_key",
            "rate",
            "paid_caller",
            "paid_daemon",
        ] {
            assert!(
                text.contains(&format!("plimsoll_shed_total{{reason=\"{r}\"}} 0")),
                "{r}"
            );
        }
    }

    #[test]
    fn counters_count() {
        let m = Metrics::default();
        m.run_dispatched();
        m.run_dispatched();
        m.run_failed();
        m.shed(ShedReason::Rate);
        let text = m.render();
        assert!(text.contains("plimsoll_runs_total 2\n"));
        assert!(text.contains("plimsoll_runs_failed_total 1\n"));
        assert!(text.contains("plimsoll_shed_total{reason=\"rate\"} 1\n"));
    }
}
