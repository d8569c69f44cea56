//! Admission after validation (wire.md §6.1 step 8): the rate limit sheds at once and is
//! counted; refused and Describe requests spend nothing.

use plimsoll_tests::Daemon;
use plimsoll_tests::connect::{self, Reason, assert_disabled, assert_invalid, assert_refused};
use plimsoll_tests::http1::Request;
use serde_json::json;

use crate::metrics::sample;

/// A daemon whose per-caller bucket holds one run and refills once a minute.
fn one_run_per_minute() -> Daemon {
    Daemon::start(&[("SANDBOX_RATE_PER_MIN", "1"), ("SANDBOX_RATE_BURST", "1")])
}

#[test]
fn rate_limit_sheds_with_capacity_and_is_counted() {
    let d = one_run_per_minute();
    let req = connect::call("Run", &connect::javascript("1"));
    assert_disabled(&req.send(d.addr), &req);
    let req = connect::call("Run", &connect::javascript("1"));
    assert_refused(
        &req.send(d.addr),
        &req,
        "resource_exhausted",
        Reason::Capacity,
    );
    let text = Request::get("/metrics")
        .send(d.metrics_addr.expect("metrics on"))
        .text();
    assert_eq!(
        sample(&text, "plimsoll_shed_total{reason=\"rate\"}"),
        Some(1.0),
        "{text}"
    );
}

#[test]
fn refused_requests_spend_no_rate_token() {
    let d = one_run_per_minute();
    for body in [
        connect::javascript(""),
        connect::javascript_with_floor("1", "none"),
        json!({ "javascript": { "code": "1" } }),
    ] {
        connect::call("Run", &body).send(d.addr);
    }
    let req = connect::call("Run", &connect::javascript_with_floor("1", "kernel"));
    assert_refused(
        &req.send(d.addr),
        &req,
        "failed_precondition",
        Reason::Isolation,
    );
    let req = connect::call("Run", &connect::javascript("1"));
    assert_disabled(&req.send(d.addr), &req);
}

#[test]
fn validation_still_answers_after_the_bucket_is_empty() {
    let d = one_run_per_minute();
    connect::call("Run", &connect::javascript("1")).send(d.addr);
    let req = connect::call("Run", &connect::javascript(""));
    assert_invalid(&req.send(d.addr), &req);
}

#[test]
fn describe_takes_no_limiter_slot() {
    let d = one_run_per_minute();
    connect::call("Run", &connect::javascript("1")).send(d.addr);
    for _ in 0..5 {
        let resp = connect::call("Describe", &json!({})).send(d.addr);
        assert_eq!(resp.status, 200, "{resp}");
    }
}

#[test]
fn rate_zero_disables_rate_limiting() {
    let d = Daemon::start(&[("SANDBOX_RATE_PER_MIN", "0")]);
    for _ in 0..40 {
        let req = connect::call("Run", &connect::javascript("1"));
        assert_disabled(&req.send(d.addr), &req);
    }
}
