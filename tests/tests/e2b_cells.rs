//! Cells on e2b sessions (issue 14 item 3; wire.md §7.4, providers.md §9.6): a real
//! `plimsolld` with `SANDBOX_PROVIDER=e2b` against the E2B simulator, every VM a local container
//! under `PLIMSOLL_TEST_DOCKER_RUNTIME` (`runc` or `runsc`). The interpreters run as `user` over
//! envd (a held process for the relay, `SendInput` for its stdin), keep their state between
//! calls (the sweep as root spares them), and end at a deadline, before a project call and
//! before the idle pause: the next cell then says `interpreterStarted`.
// A test fails by panicking, with the evidence in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use plimsoll_tests::Daemon;
use plimsoll_tests::connect;
use plimsoll_tests::e2b::{E2bSim, e2b_ready};
use plimsoll_tests::http1::{Connection, Request, Response};
use serde_json::{Value, json};

const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

fn send(addr: SocketAddr, req: &Request) -> Response {
    let mut conn = Connection::open(addr);
    conn.set_read_timeout(ANSWER_TIMEOUT);
    conn.send(&req.to_bytes(addr)).expect("send");
    conn.read_response(false).expect("answer")
}

fn field(v: &Value, name: &str) -> String {
    v[name]
        .as_str()
        .map(|b| String::from_utf8_lossy(&connect::decode_base64(b).expect("base64")).into_owned())
        .unwrap_or_default()
}

fn call(d: &Daemon, id: &str, payload: Value) -> Response {
    let mut body = json!({ "protocol": connect::PROTOCOL, "sessionId": id });
    for (k, v) in payload.as_object().expect("object") {
        body[k] = v.clone();
    }
    send(d.addr, &connect::call("SessionRun", &body))
}

/// A cell that must answer: its `cell` result. The deadline is generous: a first cell
/// starts its interpreter inside the simulated VM, slow on a loaded machine under gVisor, and
/// this test is about state, not the default deadline (the deadline case sets its own).
fn cell(d: &Daemon, id: &str, language: &str, code: &str) -> Value {
    let resp = call(
        d,
        id,
        json!({ "timeoutMs": 30000, "cell": { "language": language, "code": code } }),
    );
    assert_eq!(resp.status, 200, "{code}: {resp}\n{}", d.logs().join("\n"));
    let run = resp.json()["run"].clone();
    assert_eq!(run["isolation"], "vm", "{run}");
    run["cell"].clone()
}

#[track_caller]
fn printed(out: &Value, stdout: &str) {
    assert_eq!(
        (out["exitCode"].as_i64().unwrap_or(0), field(out, "stdout")),
        (0, stdout.to_owned()),
        "stderr {:?}: {out}",
        field(out, "stderr")
    );
}

/// The simulator's state of VM `vm` (`running`, `paused`).
fn state_of(e2b: &E2bSim, vm: &str) -> Option<String> {
    e2b.sandboxes()
        .iter()
        .find(|s| s["sandboxID"] == vm)
        .and_then(|s| s["state"].as_str().map(str::to_owned))
}

/// Describe lists both cell languages; cells keep their state across cells and across a
/// snippet (whose sweep as root spares the interpreters but not what the snippet left); they
/// run as `user`, raise typed and read the call's files; a deadline answers 124 and ends only
/// that interpreter; a project call and the idle pause end them all, and the next cell says
/// `interpreterStarted`; the close kills the VM.
#[test]
fn e2b_cells_keep_state_between_calls_and_start_fresh_after_a_deadline_a_project_or_a_pause() {
    if !e2b_ready() {
        return;
    }
    let e2b = E2bSim::start();
    let d = e2b.daemon(&[("SANDBOX_MAX_SESSIONS", "2")]);
    let v = send(d.addr, &connect::call("Describe", &json!({}))).json();
    for language in ["javascript", "python"] {
        assert!(
            v["sessionEnvironment"]["languages"]
                .as_array()
                .is_some_and(|l| l.iter().any(|x| x == language)),
            "Describe lists {language} cells: {v}"
        );
    }
    let resp = send(
        d.addr,
        &connect::call(
            "OpenSession",
            // Long enough that no gap between two calls on a loaded machine pauses the VM
            // before the part of the test that waits for the pause.
            &json!({ "protocol": connect::PROTOCOL, "idleTimeoutMs": 10000 }),
        ),
    );
    assert_eq!(resp.status, 200, "open: {resp}");
    let id = resp.json()["sessionId"].as_str().expect("id").to_owned();

    let first = cell(
        &d,
        &id,
        "python",
        "import os\nx = 20\nprint(os.getuid() != 0)",
    );
    printed(&first, "True\n");
    assert_eq!(first["interpreterStarted"], true, "{first}");
    let js = cell(&d, &id, "javascript", "let y = 5; y * 3");
    printed(&js, "15\n");
    assert_eq!(js["interpreterStarted"], true, "{js}");

    // A snippet between cells leaves a process behind: the sweep kills it, not the cells.
    let resp = call(
        &d,
        &id,
        json!({ "javascript": { "code": "const c = require('child_process').spawn('sleep', ['300'], { detached: true, stdio: 'ignore' }); c.unref(); console.log(c.pid)" } }),
    );
    assert_eq!(resp.status, 200, "{resp}");
    let left = field(&resp.json()["run"]["javascript"], "stdout");
    let second = cell(&d, &id, "python", "x * 2 + 2");
    printed(&second, "42\n");
    assert_eq!(second["interpreterStarted"].as_bool(), None, "{second}");
    let gone = cell(
        &d,
        &id,
        "javascript",
        &format!(
            "require('fs').existsSync('/proc/{}') + ' ' + (y + 1)",
            left.trim()
        ),
    );
    printed(&gone, "'false 6'\n");

    let raised = cell(&d, &id, "python", "1 / 0");
    assert_eq!(raised["exitCode"], 1, "{raised}");
    assert!(
        field(&raised, "stderr").contains("ZeroDivisionError"),
        "{raised}"
    );
    let resp = call(
        &d,
        &id,
        json!({ "cell": { "language": "python", "code": "print(open('in.txt').read())",
            "files": [{ "path": "in.txt", "content": "from the call" }] } }),
    );
    assert_eq!(resp.status, 200, "{resp}");
    printed(&resp.json()["run"]["cell"], "from the call\n");

    // The deadline ends the interpreter: the next cell starts a fresh one.
    let resp = call(
        &d,
        &id,
        json!({ "timeoutMs": 1500, "cell": { "language": "python", "code": "while True: pass" } }),
    );
    assert_eq!(resp.status, 200, "{resp}");
    let hung = &resp.json()["run"]["cell"];
    assert_eq!(
        (
            &hung["exitCode"],
            &hung["timedOut"],
            &hung["interpreterEnded"]
        ),
        (&json!(124), &json!(true), &json!(true)),
        "{hung}"
    );
    let fresh = cell(&d, &id, "python", "print('x' in dir())");
    printed(&fresh, "False\n");
    assert_eq!(fresh["interpreterStarted"], true, "{fresh}");
    let js = cell(&d, &id, "javascript", "y");
    printed(&js, "5\n");

    // A project call ends every interpreter.
    let project = call(&d, &id, json!({ "project": { "steps": ["true"] } }));
    assert_eq!(project.status, 200, "{project}");
    let fresh = cell(&d, &id, "javascript", "let z = 1; typeof y");
    printed(&fresh, "'undefined'\n");
    assert_eq!(fresh["interpreterStarted"], true, "{fresh}");

    // Idle: the VM is paused; the next cell resumes it in a fresh interpreter.
    let instance = resp_instance(&d, &id);
    e2b.wait_for(Duration::from_secs(60), "the idle pause", |_| {
        state_of(&e2b, &instance).as_deref() == Some("paused")
    });
    let resumed = cell(&d, &id, "javascript", "typeof z");
    printed(&resumed, "'undefined'\n");
    assert_eq!(resumed["interpreterStarted"], true, "{resumed}");
    assert_eq!(state_of(&e2b, &instance).as_deref(), Some("running"));

    let resp = send(
        d.addr,
        &connect::call(
            "CloseSession",
            &json!({ "protocol": connect::PROTOCOL, "sessionId": id }),
        ),
    );
    assert_eq!(resp.status, 200, "close: {resp}");
    e2b.wait_empty(Duration::from_secs(60));
}

/// The session's VM id, from a snippet's typed instance.
fn resp_instance(d: &Daemon, id: &str) -> String {
    let resp = call(d, id, json!({ "javascript": { "code": "1" } }));
    assert_eq!(resp.status, 200, "{resp}");
    resp.json()["run"]["instance"]
        .as_str()
        .and_then(|i| i.strip_prefix("e2b-sandbox:"))
        .expect("typed instance")
        .to_owned()
}
