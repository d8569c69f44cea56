//! `/healthz` and `/readyz` (wire.md §4, config.md §6).

use plimsoll_tests::connect::{self, NOT_DISPATCHED, REQUEST_ID};
use plimsoll_tests::http1::Request;
use plimsoll_tests::{Daemon, fresh_token};

#[test]
fn healthz_answers_ok_to_any_method() {
    let d = Daemon::open();
    for method in ["GET", "POST", "PUT", "DELETE"] {
        let resp = Request::new(method, "/healthz").send(d.addr);
        assert_eq!(resp.status, 200, "{method}: {resp}");
        assert_eq!(resp.body, b"ok\n", "{method}: {resp}");
    }
}

#[test]
fn readyz_answers_one_of_its_two_fixed_bodies() {
    let d = Daemon::open();
    for method in ["GET", "POST"] {
        let resp = Request::new(method, "/readyz").send(d.addr);
        match resp.status {
            200 => assert_eq!(resp.body, b"ready\n", "{resp}"),
            503 => assert_eq!(resp.body, b"not ready\n", "{resp}"),
            _ => panic!("{method}: /readyz answers 200 or 503:\n{resp}"),
        }
    }
}

#[test]
fn probes_need_no_token() {
    let d = Daemon::with_token(&fresh_token());
    let resp = Request::get("/healthz").send(d.addr);
    assert_eq!(
        (resp.status, resp.body.as_slice()),
        (200, &b"ok\n"[..]),
        "{resp}"
    );
    let resp = Request::get("/readyz").send(d.addr);
    assert!(resp.status == 200 || resp.status == 503, "{resp}");
}

#[test]
fn probes_carry_no_not_dispatched_mark() {
    let d = Daemon::open();
    let resp = Request::get("/healthz").send(d.addr);
    assert!(resp.all(NOT_DISPATCHED).is_empty(), "{resp}");
}

#[test]
fn metrics_is_not_served_on_the_rpc_listener() {
    let d = Daemon::open();
    let req = Request::get("/metrics").header(REQUEST_ID, &connect::request_id());
    let resp = req.send(d.addr);
    assert_eq!(resp.status, 404, "{resp}");
    connect::assert_bound(&resp, &req);
}

#[test]
fn probes_are_not_served_on_the_metrics_listener() {
    let d = Daemon::open();
    let metrics = d.metrics_addr.expect("metrics listener on by default");
    for path in [
        "/healthz",
        "/readyz",
        "/plimsoll.v1.SandboxService/Describe",
    ] {
        let resp = Request::get(path).send(metrics);
        assert_eq!(resp.status, 404, "{path}: {resp}");
    }
}
