//! Admission: the rate limit sheds at once and is counted; every request pays its token
//! first, refused or not (issue 12, part 1), and Describe spends nothing.

use plimsoll_tests::Daemon;
use plimsoll_tests::connect::{self, Reason, assert_disabled, assert_refused};
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

/// Every request refused after authentication pays its rate token (issue 12, part 1; the
/// README's rate rule), so a caller cannot make the daemon refuse faster than its rate. On
/// main before the fix refused requests spent nothing and this failed.
#[test]
fn refused_requests_pay_their_rate_token() {
    for body in [
        connect::javascript(""),
        connect::javascript_with_floor("1", "kernel"),
        json!({ "javascript": { "code": "1" } }),
    ] {
        let d = one_run_per_minute();
        let req = connect::call("Run", &body);
        let resp = req.send(d.addr);
        assert_ne!(resp.status, 200, "{resp}");
        assert!(
            !connect::ConnectError::of(&resp)
                .message
                .contains("rate limit"),
            "{resp}"
        );
        let req = connect::call("Run", &connect::javascript("1"));
        assert_refused(
            &req.send(d.addr),
            &req,
            "resource_exhausted",
            Reason::Capacity,
        );
    }
}

/// The token is the first thing a request pays, before validation: with the bucket empty
/// even a malformed request gets the rate refusal, at once (issue 12, part 1; a deliberate
/// difference from wire.md §6.1, where the token is taken at step 8).
#[test]
fn an_empty_bucket_refuses_before_validation() {
    let d = one_run_per_minute();
    connect::call("Run", &connect::javascript("1")).send(d.addr);
    let req = connect::call("Run", &connect::javascript(""));
    assert_refused(
        &req.send(d.addr),
        &req,
        "resource_exhausted",
        Reason::Capacity,
    );
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
