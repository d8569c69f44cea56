//! The protocol number (wire.md §5.1; this daemon serves 4) and the session procedures'
//! refusals when sessions are off.

use plimsoll_tests::Daemon;
use plimsoll_tests::connect::{self, PROTOCOL, Reason, assert_no_mark_header, assert_refused};
use serde_json::{Value, json};

const RUN_PROCEDURES: [&str; 4] = ["Run", "OpenSession", "SessionRun", "CloseSession"];

fn with_protocol(mut body: Value, protocol: Option<u64>) -> Value {
    match protocol {
        Some(p) => body["protocol"] = json!(p),
        None => {
            body.as_object_mut().map(|o| o.remove("protocol"));
        }
    }
    body
}

#[test]
fn describe_states_protocol_4() {
    let d = Daemon::open();
    let resp = connect::call("Describe", &json!({})).send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
    assert_eq!(resp.json()["protocol"], json!(PROTOCOL), "{resp}");
}

#[test]
fn missing_protocol_is_invalid_argument_marked_protocol() {
    let d = Daemon::open();
    for procedure in RUN_PROCEDURES {
        let req = connect::call(procedure, &with_protocol(connect::javascript("1"), None));
        let resp = req.send(d.addr);
        let err = assert_refused(&resp, &req, "invalid_argument", Reason::Protocol);
        assert_eq!(
            err.message, "protocol must be stated; this daemon serves protocol 4",
            "{procedure}"
        );
        assert_no_mark_header(&resp);
    }
}

#[test]
fn protocol_zero_counts_as_missing() {
    let d = Daemon::open();
    let req = connect::call("Run", &with_protocol(connect::javascript("1"), Some(0)));
    let err = assert_refused(
        &req.send(d.addr),
        &req,
        "invalid_argument",
        Reason::Protocol,
    );
    assert_eq!(
        err.message,
        "protocol must be stated; this daemon serves protocol 4"
    );
}

#[test]
fn other_protocols_are_unimplemented_marked_protocol() {
    let d = Daemon::open();
    for n in [1u64, 2, 3, 5, 4_294_967_295] {
        for procedure in RUN_PROCEDURES {
            let req = connect::call(procedure, &with_protocol(connect::javascript("1"), Some(n)));
            let resp = req.send(d.addr);
            let err = assert_refused(&resp, &req, "unimplemented", Reason::Protocol);
            assert_eq!(
                err.message,
                format!("this daemon serves protocol 4 and the request states {n}; nothing ran"),
                "{procedure}"
            );
        }
    }
}

#[test]
fn protocol_is_checked_before_the_payload() {
    let d = Daemon::open();
    let broken = [
        json!({}),
        json!({ "javascript": { "code": "" } }),
        json!({ "cell": { "language": "python", "code": "1" } }),
        json!({ "project": { "files": [{ "path": "../x", "content": "" }], "steps": [] } }),
    ];
    for body in &broken {
        let req = connect::call("Run", body);
        assert_refused(
            &req.send(d.addr),
            &req,
            "invalid_argument",
            Reason::Protocol,
        );
        let req = connect::call("Run", &with_protocol(body.clone(), Some(3)));
        assert_refused(&req.send(d.addr), &req, "unimplemented", Reason::Protocol);
    }
}

#[test]
fn protocol_is_checked_before_the_floor() {
    let d = Daemon::open();
    for floor in ["none", "bogus", "vm"] {
        let body = with_protocol(connect::javascript_with_floor("1", floor), None);
        let req = connect::call("Run", &body);
        assert_refused(
            &req.send(d.addr),
            &req,
            "invalid_argument",
            Reason::Protocol,
        );
    }
}

#[test]
fn open_session_is_unsupported_when_sessions_are_off() {
    let d = Daemon::open();
    let req = connect::call("OpenSession", &json!({ "protocol": PROTOCOL }));
    let resp = req.send(d.addr);
    assert_refused(&resp, &req, "unimplemented", Reason::Unsupported);
    assert_no_mark_header(&resp);
}

#[test]
fn describe_ignores_the_protocol_field_it_does_not_have() {
    let d = Daemon::open();
    let resp = connect::call("Describe", &json!({})).send(d.addr);
    assert_eq!(
        resp.status, 200,
        "Describe has no protocol field to be refused on:\n{resp}"
    );
}
