//! A session whose sandbox dies while a call runs, the same on every provider with sessions
//! (docker, e2b, openshell): a snippet and a python cell, each in a session of its own, are
//! cut off by a kill of the sandbox's local container from outside (as a host failure would
//! end it). The call answers the session's end then, not at its deadline: under gVisor docker
//! does not always end the streams into a container that died, so noticing is the daemon's
//! own doing (included by path).

use std::time::{Duration, Instant};

use plimsoll_tests::Daemon;
use plimsoll_tests::connect::{self, ConnectError};
use plimsoll_tests::docker::docker;
use plimsoll_tests::sim::send;
use serde_json::{Value, json};

/// How soon after the kill the call must be answered (its own deadline is 30 s).
const NOTICED_WITHIN: Duration = Duration::from_secs(10);

/// Asserts the ending for a snippet and for a cell: the call answers `failed_precondition`
/// with `SessionEnded` `reason` (a `SessionEnd` number), unmarked since its code ran, within
/// [`NOTICED_WITHIN`] of the kill; the close still answers. `work` is the directory calls
/// run in; `container_of` names the local container behind a run's `instance`. Answers the
/// killed containers.
pub fn a_session_sandbox_lost_mid_call(
    d: &Daemon,
    work: &str,
    reason: u8,
    container_of: impl Fn(&str) -> String,
) -> Vec<String> {
    let began = format!("{work}/began");
    let snippet =
        format!("require('fs').writeFileSync('{began}', ''); setTimeout(() => {{}}, 60000)");
    let python = format!("import time; open('{began}', 'w').close(); time.sleep(60)");
    let calls = [
        ("snippet", json!({ "javascript": { "code": snippet } })),
        (
            "cell",
            json!({ "cell": { "language": "python", "code": python } }),
        ),
    ];
    let mut killed = Vec::new();
    for (kind, payload) in calls {
        let id = open(d);
        let first = session_run(
            d,
            &id,
            json!({ "javascript": { "code": "console.log(1)" } }),
        );
        assert_eq!(first.status, 200, "{kind}: the first call: {first}");
        let instance = first.json()["run"]["instance"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let container = container_of(&instance);
        let mut body = payload;
        body["timeoutMs"] = json!(30_000);
        let (resp, after_kill) = std::thread::scope(|s| {
            let call = s.spawn(|| session_run(d, &id, body));
            let until = Instant::now() + Duration::from_secs(45);
            while !docker(&["exec", &container, "test", "-e", &began]).0 {
                assert!(
                    Instant::now() < until && !call.is_finished(),
                    "{kind}: the call's code never began"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
            let (ok, out) = docker(&["kill", &container]);
            assert!(ok, "docker kill {container}: {out}");
            let at = Instant::now();
            (call.join().expect("the call's thread"), at.elapsed())
        });
        assert!(
            after_kill < NOTICED_WITHIN,
            "{kind}: the call outlived its sandbox by {after_kill:?}"
        );
        let err = ConnectError::of(&resp);
        assert_eq!(err.code, "failed_precondition", "{kind}: {resp}");
        assert_eq!(err.not_dispatched(), None, "{kind}: its code ran: unmarked");
        assert_eq!(err.session_ended(), Some(reason), "{kind}: {resp}");
        let body = json!({ "protocol": connect::PROTOCOL, "sessionId": id });
        let closed = send(d.addr, &connect::call("CloseSession", &body));
        assert_eq!(closed.status, 200, "{kind}: close: {closed}");
        killed.push(container);
    }
    killed
}

fn open(d: &Daemon) -> String {
    let body = json!({ "protocol": connect::PROTOCOL });
    let resp = send(d.addr, &connect::call("OpenSession", &body));
    assert_eq!(resp.status, 200, "open: {resp}");
    resp.json()["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_owned()
}

fn session_run(d: &Daemon, id: &str, payload: Value) -> plimsoll_tests::http1::Response {
    let mut body = json!({ "protocol": connect::PROTOCOL, "sessionId": id });
    if let (Some(b), Some(p)) = (body.as_object_mut(), payload.as_object()) {
        b.extend(p.clone());
    }
    send(d.addr, &connect::call("SessionRun", &body))
}
