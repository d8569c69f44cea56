//! A run's trace (`spec/grants.md` §2.4): one row per forwarded call, plus counts of the
//! calls that were denied, shed or dropped. Rows carry the route template, never the
//! path, query, body or credential.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::control::protocol::{CallLatency, RunSummary};

/// Rows kept per run, whatever the budget.
pub const MAX_ROWS: usize = 256;

/// One forwarded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRow {
    /// 1-based order among forwarded calls.
    pub sequence: u64,
    /// Upper-case method.
    pub method: String,
    /// The matched `allow` entry, `"METHOD /template"`.
    pub route: String,
    /// The upstream status (0 when the call never got one).
    pub status: u16,
    /// Whether the guest got the upstream's answer.
    pub delivered: bool,
    /// Request body bytes.
    pub request_bytes: u64,
    /// Response body bytes delivered.
    pub response_bytes: u64,
    /// Time spent upstream.
    pub latency: Duration,
}

/// Counts and rows for one run.
#[derive(Debug, Default)]
pub struct Trace {
    /// Every attempt that reached the call counter.
    pub calls: u64,
    /// Refused by the broker.
    pub denied: u64,
    /// Shed by the open breaker.
    pub shed: u64,
    /// Forwarded but not kept: the trace was full.
    pub dropped: u64,
    /// `"METHOD /template"` → calls that matched it.
    pub routes: BTreeMap<String, u64>,
    /// The kept rows.
    pub rows: Vec<TraceRow>,
    forwarded: u64,
}

// === impl Trace ===

impl Trace {
    /// Records a forwarded call's outcome, or counts it as dropped once full.
    pub fn record(&mut self, mut row: TraceRow) {
        self.forwarded += 1;
        row.sequence = self.forwarded;
        if self.rows.len() < MAX_ROWS {
            self.rows.push(row);
        } else {
            self.dropped += 1;
        }
    }

    /// The counts the control channel reports at close.
    pub fn summary(&self) -> RunSummary {
        RunSummary {
            calls: self.calls,
            denied: self.denied,
            shed: self.shed,
            dropped: self.dropped,
            routes: self.routes.clone(),
            latencies: self
                .rows
                .iter()
                .map(|r| CallLatency {
                    route: r.route.clone(),
                    micros: u64::try_from(r.latency.as_micros()).unwrap_or(u64::MAX),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_stop_at_the_cap_and_the_rest_count_as_dropped() {
        let mut trace = Trace::default();
        for _ in 0..MAX_ROWS + 3 {
            trace.record(TraceRow {
                sequence: 0,
                method: "GET".into(),
                route: "GET /x".into(),
                status: 200,
                delivered: true,
                request_bytes: 0,
                response_bytes: 2,
                latency: Duration::ZERO,
            });
        }
        assert_eq!(trace.rows.len(), MAX_ROWS);
        assert_eq!(trace.dropped, 3);
        assert_eq!(trace.rows[MAX_ROWS - 1].sequence, MAX_ROWS as u64);
    }
}
