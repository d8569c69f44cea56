//! The next snippet's node and grants (issue 15 item 2): after an ungranted snippet the
//! session's agent keeps `node -` processes waiting for the next ones (two under runc, one
//! under runsc); plimsolld has them ended before any grant is lent, so no process but the
//! granted call's own is there to use the grant.

use std::time::Duration;

use plimsoll_tests::connect;
use plimsoll_tests::docker::{docker_ready, runtime};
use serde_json::json;

use super::sessions::{field, granted_sessions, one_json_line, session_run, snippet_ran};

/// A project step's program: how many `node -` processes of the guest it sees.
const COUNT_WAITING: &str = r#"
const fs = require('fs');
const waiting = fs.readdirSync('/proc').filter((p) => {
  try { return /^[0-9]+$/.test(p) && fs.readFileSync(`/proc/${p}/cmdline`, 'latin1') === 'node\u0000-\u0000'; } catch { return false; }
});
console.log(JSON.stringify({ waiting: waiting.length }));
"#;

/// A project call whose one step counts the waiting nodes, lending `profile` ("" = none).
fn count_waiting(
    d: &plimsoll_tests::Daemon,
    token: &str,
    id: &str,
    profile: &str,
) -> serde_json::Value {
    let mut project = json!({
        "files": [{ "path": "count.js", "content": COUNT_WAITING }],
        "steps": ["node count.js"],
    });
    if !profile.is_empty() {
        project["grantProfile"] = json!(profile);
    }
    let resp = session_run(d, token, id, json!({ "project": project }));
    assert_eq!(resp.status, 200, "{resp}");
    let report = resp.json()["run"]["project"].clone();
    assert_eq!(report["outcome"], "PROJECT_OUTCOME_COMPLETED", "{report}");
    one_json_line(&field(&report["steps"][0], "stdout"))
}

#[test]
fn a_granted_call_finds_no_node_started_ahead() {
    if !docker_ready() {
        return;
    }
    let (f, d) = granted_sessions();
    let resp = super::sessions::call(
        &d,
        &f.alice,
        "OpenSession",
        &json!({ "protocol": connect::PROTOCOL }),
    );
    assert_eq!(resp.status, 200, "open: {resp}");
    let id = resp.json()["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_owned();

    // An ungranted snippet, then a pause: nodes wait for the next snippets, and an
    // ungranted project call sees them.
    let ahead = if runtime() == "runsc" { 1 } else { 2 };
    snippet_ran(&d, &f.alice, &id, "console.log(1)", "");
    std::thread::sleep(Duration::from_millis(400));
    let seen = count_waiting(&d, &f.alice, &id, "");
    assert_eq!(seen, json!({ "waiting": ahead }), "nodes wait");

    // The granted call: it was ended before the grant was lent.
    let seen = count_waiting(&d, &f.alice, &id, "sess");
    assert_eq!(seen, json!({ "waiting": 0 }), "none waits beside a grant");

    // Ungranted snippets after it start waiting nodes again.
    snippet_ran(&d, &f.alice, &id, "console.log(2)", "");
    std::thread::sleep(Duration::from_millis(400));
    let seen = count_waiting(&d, &f.alice, &id, "");
    assert_eq!(seen, json!({ "waiting": ahead }), "nodes wait again");
    let closed = super::sessions::call(
        &d,
        &f.alice,
        "CloseSession",
        &json!({ "protocol": connect::PROTOCOL, "sessionId": id }),
    );
    assert_eq!(closed.status, 200, "{closed}");
}
