//! Answer binding (wire.md §3): the request-id echo and the not-dispatched mark.

use plimsoll_tests::connect::{
    self, NOT_DISPATCHED, REQUEST_ID, Reason, assert_bound, assert_disabled, assert_no_mark_header,
    assert_refused,
};
use plimsoll_tests::http1::Request;
use plimsoll_tests::{ClientsFile, Daemon, fresh_token};
use serde_json::json;

#[test]
fn success_echoes_the_request_id_once() {
    let d = Daemon::open();
    let req = connect::call("Describe", &json!({}));
    let resp = req.send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
    assert_bound(&resp, &req);
}

#[test]
fn success_carries_no_not_dispatched_mark() {
    let d = Daemon::open();
    let resp = connect::call("Describe", &json!({})).send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
    assert!(resp.all(NOT_DISPATCHED).is_empty(), "{resp}");
}

#[test]
fn connect_error_echoes_the_request_id() {
    let d = Daemon::open();
    let req = connect::call("Run", &connect::javascript("1"));
    assert_disabled(&req.send(d.addr), &req);
}

#[test]
fn unauthenticated_refusal_echoes_the_request_id() {
    let d = Daemon::with_token(&fresh_token());
    let req = connect::call("Describe", &json!({}));
    let resp = req.send(d.addr);
    assert_eq!(resp.status, 401, "{resp}");
    assert_bound(&resp, &req);
}

#[test]
fn permission_refusal_echoes_the_request_id() {
    let token = fresh_token();
    let file = ClientsFile::new(&[("scopeless", &token, &[])]);
    let d = Daemon::start(&[("PLIMSOLL_CLIENTS_FILE", &file.path_str())]);
    let req = connect::call_as(&token, "Describe", &json!({}));
    let resp = req.send(d.addr);
    assert_eq!(resp.status, 403, "{resp}");
    assert_bound(&resp, &req);
}

#[test]
fn not_found_echoes_the_request_id_and_is_marked_unsupported() {
    let d = Daemon::open();
    for method in ["GET", "POST"] {
        let req = Request::new(method, "/no/such/path").header(REQUEST_ID, &connect::request_id());
        let resp = req.send(d.addr);
        assert_eq!(resp.status, 404, "{resp}");
        assert_bound(&resp, &req);
        assert_eq!(resp.all(NOT_DISPATCHED), vec!["unsupported"], "{resp}");
    }
}

#[test]
fn probes_echo_the_request_id() {
    let d = Daemon::open();
    for path in ["/healthz", "/readyz"] {
        let req = Request::get(path).header(REQUEST_ID, &connect::request_id());
        let resp = req.send(d.addr);
        assert!(resp.status == 200 || resp.status == 503, "{path}: {resp}");
        assert_bound(&resp, &req);
    }
}

#[test]
fn a_request_id_sent_twice_is_not_echoed_and_not_refused() {
    let d = Daemon::open();
    let id = connect::request_id();
    let resp = connect::call("Describe", &json!({}))
        .without(REQUEST_ID)
        .header(REQUEST_ID, &id)
        .header(REQUEST_ID, &id)
        .send(d.addr);
    assert_eq!(
        resp.status, 200,
        "a bad id is never a reason to refuse:\n{resp}"
    );
    assert!(
        resp.all(REQUEST_ID).is_empty(),
        "a duplicated id is not echoed:\n{resp}"
    );
}

#[test]
fn malformed_request_ids_are_not_echoed_and_not_refused() {
    let d = Daemon::open();
    let good = connect::request_id();
    let bad = [
        good.to_ascii_uppercase(),
        good[..31].to_string(),
        format!("{good}0"),
        format!("{}g", &good[..31]),
        format!("{}-", &good[..31]),
        "x".to_string(),
    ];
    for id in &bad {
        let resp = connect::call("Describe", &json!({}))
            .without(REQUEST_ID)
            .header(REQUEST_ID, id)
            .send(d.addr);
        assert_eq!(resp.status, 200, "id {id:?} must not be refused:\n{resp}");
        assert!(
            resp.all(REQUEST_ID).is_empty(),
            "id {id:?} must not be echoed:\n{resp}"
        );
    }
}

#[test]
fn malformed_request_id_is_not_echoed_on_an_error_either() {
    let d = Daemon::open();
    let resp = connect::call("Run", &connect::javascript("1"))
        .without(REQUEST_ID)
        .header(REQUEST_ID, "0123456789ABCDEF0123456789ABCDEF")
        .send(d.addr);
    assert_eq!(resp.status, 400, "{resp}");
    assert!(resp.all(REQUEST_ID).is_empty(), "{resp}");
}

#[test]
fn bad_content_type_is_marked_request_by_header() {
    let d = Daemon::open();
    let req = connect::call("Describe", &json!({}))
        .without("Content-Type")
        .header("Content-Type", "text/plain");
    let resp = req.send(d.addr);
    assert!(
        (400..500).contains(&resp.status),
        "a client error, never 5xx:\n{resp}"
    );
    assert_bound(&resp, &req);
    assert_eq!(resp.all(NOT_DISPATCHED), vec!["request"], "{resp}");
}

#[test]
fn malformed_json_is_marked_request_by_header() {
    let d = Daemon::open();
    let req = connect::call("Run", &json!({})).body("{\"protocol\": 4, \"javascript\": ");
    let resp = req.send(d.addr);
    assert_eq!(resp.status, 400, "{resp}");
    assert_eq!(
        connect::ConnectError::of(&resp).code,
        "invalid_argument",
        "{resp}"
    );
    assert_bound(&resp, &req);
    assert_eq!(resp.all(NOT_DISPATCHED), vec!["request"], "{resp}");
}

#[test]
fn handler_refusal_carries_the_detail_not_the_header() {
    let d = Daemon::open();
    let req = connect::call("Run", &connect::javascript_with_floor("1", "process"));
    let resp = req.send(d.addr);
    let err = assert_refused(&resp, &req, "failed_precondition", Reason::Isolation);
    assert_eq!(err.not_dispatched(), Some(vec![0x08, 0x05]));
    assert_no_mark_header(&resp);
}

#[test]
fn not_dispatched_detail_is_typed_by_its_full_name() {
    let d = Daemon::open();
    let resp = connect::call("Run", &connect::javascript("1")).send(d.addr);
    let body = resp.json();
    let types: Vec<&str> = body["details"]
        .as_array()
        .map(|ds| ds.iter().filter_map(|d| d["type"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        types
            .iter()
            .any(|t| t.rsplit('/').next() == Some("plimsoll.v1.NotDispatched")),
        "details: {types:?}"
    );
}
