//! The daemon's counters and their Prometheus text form (config.md §7).
//!
//! The text is written by hand because the contract is the classic
//! `text/plain; version=0.0.4` exposition with exact family names, and all
//! five shed reasons are always printed, even at zero.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
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
    /// Brokered calls by (profile, method, route template), from each run's summary.
    host_calls: Mutex<BTreeMap<(String, String, String), u64>>,
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

    /// A granted run's brokered calls: `routes` maps `"METHOD /template"` (a grant route,
    /// never a raw path) to its count, as the broker's run summary states them.
    pub fn host_calls<'a>(
        &self,
        profile: &str,
        routes: impl IntoIterator<Item = (&'a String, &'a u64)>,
    ) {
        let mut calls = self.host_calls.lock().unwrap_or_else(|e| e.into_inner());
        for (route, n) in routes {
            let (method, template) = route.split_once(' ').unwrap_or(("", route.as_str()));
            *calls
                .entry((profile.to_owned(), method.to_owned(), template.to_owned()))
                .or_default() += n;
        }
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
        // The family appears with its first series (config.md §7 omits empty ones).
        let calls = self.host_calls.lock().unwrap_or_else(|e| e.into_inner());
        if !calls.is_empty() {
            out.push_str("# HELP plimsoll_host_calls_total Brokered host-API calls, by grant profile, method and route template.\n# TYPE plimsoll_host_calls_total counter\n");
        }
        for ((profile, method, route), n) in calls.iter() {
            let _ = writeln!(
                out,
                "plimsoll_host_calls_total{{profile=\"{}\",method=\"{}\",route=\"{}\"}} {n}",
                label(profile),
                label(method),
                label(route)
            );
        }
        out
    }
}

/// A label value as the text format writes it: `\`, `"` and newline escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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
    fn host_calls_are_counted_by_profile_method_and_route_with_labels_escaped() {
        let m = Metrics::default();
        assert!(!m.render().contains("plimsoll_host_calls_total"));
        let routes: BTreeMap<String, u64> = [
            ("GET /items/*".to_owned(), 2),
            ("POST /items".to_owned(), 1),
        ]
        .into();
        m.host_calls("inv", &routes);
        m.host_calls("inv", &routes);
        m.host_calls("a\"b", &BTreeMap::from([("GET /x".to_owned(), 1)]));
        let text = m.render();
        assert!(
            text.contains(
                "plimsoll_host_calls_total{profile=\"inv\",method=\"GET\",route=\"/items/*\"} 4"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "plimsoll_host_calls_total{profile=\"inv\",method=\"POST\",route=\"/items\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains("profile=\"a\\\"b\""), "{text}");
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
