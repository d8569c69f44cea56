//! The daemon's counters and their Prometheus text form (config.md §7).
//!
//! The text is written by hand because the contract is the classic
//! `text/plain; version=0.0.4` exposition with exact family names, and all
//! five shed reasons are always printed, even at zero.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use broker::control::protocol::RunSummary;

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
    host_calls: Mutex<BTreeMap<Series, u64>>,
    /// Their time upstream, by the same labels.
    host_latency: Mutex<BTreeMap<Series, Histogram>>,
}

/// The labels of a host-call series: profile, method, route template.
type Series = (String, String, String);

/// The buckets of `plimsoll_host_call_latency_seconds` (config.md §7), in seconds; `+Inf`
/// is the count.
const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// One latency histogram: cumulative bucket counts, the count and the sum.
#[derive(Debug, Default)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (bucket, bound) in self.buckets.iter_mut().zip(LATENCY_BUCKETS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }
}

/// `"METHOD /template"` as the (profile, method, route) labels.
fn series(profile: &str, route: &str) -> Series {
    let (method, template) = route.split_once(' ').unwrap_or(("", route));
    (profile.to_owned(), method.to_owned(), template.to_owned())
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

    /// A granted run's brokered calls, as the broker's run summary states them: counts and
    /// latencies by `"METHOD /template"` (a grant route, never a raw path).
    pub fn host_calls(&self, profile: &str, summary: &RunSummary) {
        let mut calls = self.host_calls.lock().unwrap_or_else(|e| e.into_inner());
        for (route, n) in &summary.routes {
            *calls.entry(series(profile, route)).or_default() += n;
        }
        drop(calls);
        let mut latency = self.host_latency.lock().unwrap_or_else(|e| e.into_inner());
        for call in &summary.latencies {
            latency
                .entry(series(profile, &call.route))
                .or_default()
                .observe(call.micros as f64 / 1e6);
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
        for (labels, n) in calls.iter() {
            let _ = writeln!(
                out,
                "plimsoll_host_calls_total{{{}}} {n}",
                labels_of(labels)
            );
        }
        drop(calls);
        let latency = self.host_latency.lock().unwrap_or_else(|e| e.into_inner());
        if !latency.is_empty() {
            out.push_str("# HELP plimsoll_host_call_latency_seconds Time brokered host-API calls spent upstream.\n# TYPE plimsoll_host_call_latency_seconds histogram\n");
        }
        for (labels, h) in latency.iter() {
            let labels = labels_of(labels);
            for (bound, n) in LATENCY_BUCKETS.iter().zip(h.buckets) {
                let _ = writeln!(
                    out,
                    "plimsoll_host_call_latency_seconds_bucket{{{labels},le=\"{bound}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "plimsoll_host_call_latency_seconds_bucket{{{labels},le=\"+Inf\"}} {}\n\
                 plimsoll_host_call_latency_seconds_sum{{{labels}}} {}\n\
                 plimsoll_host_call_latency_seconds_count{{{labels}}} {}",
                h.count, h.sum, h.count
            );
        }
        out
    }
}

/// The warm session pool's families (providers.md §9.8): its size, the members ready per warm
/// language set, and the opens it served or missed.
pub fn render_pool(pool: &crate::provider::PoolStatus) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "# HELP plimsoll_session_pool_size Configured warm session pool size.\n# TYPE plimsoll_session_pool_size gauge\nplimsoll_session_pool_size {}\n",
        pool.size
    );
    out.push_str("# HELP plimsoll_session_pool_warm Warm pool members ready to be claimed, by warm language set.\n# TYPE plimsoll_session_pool_warm gauge\n");
    for (languages, members) in &pool.warm {
        let _ = writeln!(
            out,
            "plimsoll_session_pool_warm{{languages=\"{}\"}} {members}",
            label(&languages.join(","))
        );
    }
    let _ = write!(
        out,
        "# HELP plimsoll_session_pool_claims_total Session opens a warm pool member served.\n# TYPE plimsoll_session_pool_claims_total counter\nplimsoll_session_pool_claims_total {}\n\
         # HELP plimsoll_session_pool_misses_total Session opens that made their own sandbox while the pool was on.\n# TYPE plimsoll_session_pool_misses_total counter\nplimsoll_session_pool_misses_total {}\n",
        pool.claims, pool.misses
    );
    out
}

/// `profile="…",method="…",route="…"`, escaped.
fn labels_of((profile, method, route): &Series) -> String {
    format!(
        "profile=\"{}\",method=\"{}\",route=\"{}\"",
        label(profile),
        label(method),
        label(route)
    )
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
    #[test]
    fn the_pool_families_show_size_warm_sets_claims_and_misses() {
        let text = super::render_pool(&crate::provider::PoolStatus {
            size: 3,
            warm: vec![(vec!["javascript".into(), "python".into()], 2)],
            claims: 5,
            misses: 1,
        });
        assert!(text.contains("plimsoll_session_pool_size 3\n"), "{text}");
        assert!(
            text.contains("plimsoll_session_pool_warm{languages=\"javascript,python\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("plimsoll_session_pool_claims_total 5\n"),
            "{text}"
        );
        assert!(
            text.contains("plimsoll_session_pool_misses_total 1\n"),
            "{text}"
        );
    }

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
        use broker::control::protocol::CallLatency;
        let m = Metrics::default();
        let text = m.render();
        assert!(!text.contains("plimsoll_host_call"), "{text}");
        let summary = RunSummary {
            routes: [
                ("GET /items/*".to_owned(), 2),
                ("POST /items".to_owned(), 1),
            ]
            .into(),
            latencies: vec![
                CallLatency {
                    route: "GET /items/*".to_owned(),
                    micros: 3_000,
                },
                CallLatency {
                    route: "GET /items/*".to_owned(),
                    micros: 700_000,
                },
            ],
            ..RunSummary::default()
        };
        m.host_calls("inv", &summary);
        m.host_calls("inv", &summary);
        m.host_calls(
            "a\"b",
            &RunSummary {
                routes: [("GET /x".to_owned(), 1)].into(),
                ..RunSummary::default()
            },
        );
        let text = m.render();
        let labels = "profile=\"inv\",method=\"GET\",route=\"/items/*\"";
        for line in [
            format!("plimsoll_host_calls_total{{{labels}}} 4"),
            "plimsoll_host_calls_total{profile=\"inv\",method=\"POST\",route=\"/items\"} 2"
                .to_owned(),
            format!("plimsoll_host_call_latency_seconds_bucket{{{labels},le=\"0.001\"}} 0"),
            format!("plimsoll_host_call_latency_seconds_bucket{{{labels},le=\"0.005\"}} 2"),
            format!("plimsoll_host_call_latency_seconds_bucket{{{labels},le=\"0.5\"}} 2"),
            format!("plimsoll_host_call_latency_seconds_bucket{{{labels},le=\"1\"}} 4"),
            format!("plimsoll_host_call_latency_seconds_bucket{{{labels},le=\"+Inf\"}} 4"),
            format!("plimsoll_host_call_latency_seconds_count{{{labels}}} 4"),
            "# TYPE plimsoll_host_call_latency_seconds histogram".to_owned(),
        ] {
            assert!(text.contains(&line), "{line} in:\n{text}");
        }
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
