//! The metrics listener (wire.md §4, config.md §7).

use plimsoll_tests::Daemon;
use plimsoll_tests::http1::{Request, Response};

const SHED_REASONS: [&str; 5] = [
    "at_capacity",
    "per_key",
    "rate",
    "paid_caller",
    "paid_daemon",
];

fn scrape(d: &Daemon) -> Response {
    let resp = Request::get("/metrics").send(d.metrics_addr.expect("metrics listener on"));
    assert_eq!(resp.status, 200, "{resp}");
    resp
}

/// The value of the sample line whose name and labels are exactly `series`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[test]
fn metrics_are_prometheus_text() {
    let d = Daemon::open();
    let resp = scrape(&d);
    assert_eq!(
        resp.header("Content-Type"),
        Some("text/plain; version=0.0.4"),
        "{resp}"
    );
}

#[test]
fn metrics_list_the_core_families_with_their_types() {
    let d = Daemon::open();
    let text = scrape(&d).text();
    for (name, kind) in [
        ("plimsoll_runs_total", "counter"),
        ("plimsoll_runs_failed_total", "counter"),
        ("plimsoll_inflight", "gauge"),
        ("plimsoll_shed_total", "counter"),
    ] {
        assert!(
            text.lines().any(|l| l == format!("# TYPE {name} {kind}")),
            "no `# TYPE {name} {kind}` in:\n{text}"
        );
    }
    for name in [
        "plimsoll_runs_total",
        "plimsoll_runs_failed_total",
        "plimsoll_inflight",
    ] {
        assert_eq!(
            sample(&text, name),
            Some(0.0),
            "{name} on a fresh daemon:\n{text}"
        );
    }
}

#[test]
fn shed_total_prints_all_five_reasons() {
    let d = Daemon::open();
    let text = scrape(&d).text();
    for reason in SHED_REASONS {
        let series = format!("plimsoll_shed_total{{reason=\"{reason}\"}}");
        assert_eq!(sample(&text, &series), Some(0.0), "{series}:\n{text}");
    }
}

#[test]
fn host_call_and_advice_families_are_omitted_without_series() {
    let d = Daemon::open();
    let text = scrape(&d).text();
    for family in [
        "plimsoll_host_calls_total",
        "plimsoll_host_call_latency_seconds",
        "plimsoll_advice_findings_total",
        "plimsoll_advice_extra_calls_total",
        "plimsoll_advice_added_latency_seconds_total",
        "plimsoll_advice_bytes_moved_total",
    ] {
        assert!(
            !text.contains(family),
            "{family} has no series yet:\n{text}"
        );
    }
}

#[test]
fn metrics_listener_serves_only_get_metrics() {
    let d = Daemon::open();
    let metrics = d.metrics_addr.expect("metrics listener on");
    for path in ["/", "/metrics/x", "/healthz"] {
        assert_eq!(Request::get(path).send(metrics).status, 404, "{path}");
    }
    let resp = Request::post("/metrics").send(metrics);
    assert!((400..500).contains(&resp.status), "POST /metrics: {resp}");
}

#[test]
fn metrics_listener_can_be_turned_off() {
    let d = Daemon::start(&[("PLIMSOLL_METRICS_ADDR", "off")]);
    assert_eq!(d.listening["metrics_addr"], "off", "{}", d.listening);
    assert!(d.metrics_addr.is_none());
}

#[test]
fn metrics_listener_binds_where_it_is_told() {
    let d = Daemon::open();
    let metrics = d
        .metrics_addr
        .expect("the listening line names the bound metrics address");
    assert!(metrics.ip().is_loopback());
    assert_ne!(metrics.port(), 0);
    assert_ne!(metrics, d.addr);
}
