//! Sessions on e2b (issue 14; providers.md §9, grants.md §6.7): one VM per session, files kept
//! across calls, `user`'s processes killed as root between calls, idle suspend = E2B's pause
//! and the next call's resume, typed ends when the VM changes under the session.

use std::time::Duration;

use plimsoll_tests::Daemon;
use plimsoll_tests::connect::{self, ConnectError};
use plimsoll_tests::e2b::{E2bSim, e2b_ready};
use serde_json::{Value, json};

use super::lost_session;
use super::{field, send};

/// `SessionEnd` numbers (wire.md §5.4).
const SANDBOX_CHANGED: u8 = 6;

fn session_daemon(e2b: &E2bSim, extra: &[(&str, &str)]) -> Daemon {
    let mut env = vec![
        ("SANDBOX_MAX_SESSIONS", "4"),
        ("SANDBOX_SESSION_IDLE", "2s"),
    ];
    env.extend_from_slice(extra);
    e2b.daemon(&env)
}

pub fn open(d: &Daemon) -> String {
    let resp = send(
        d.addr,
        &connect::call("OpenSession", &json!({ "protocol": connect::PROTOCOL })),
    );
    assert_eq!(resp.status, 200, "open: {resp}");
    let v = resp.json();
    assert_eq!(v["isolation"], "vm", "{v}");
    v["sessionId"].as_str().expect("sessionId").to_owned()
}

fn session_run(d: &Daemon, id: &str, payload: (&str, Value)) -> plimsoll_tests::http1::Response {
    let mut body = json!({ "protocol": connect::PROTOCOL, "sessionId": id });
    body[payload.0] = payload.1;
    send(d.addr, &connect::call("SessionRun", &body))
}

/// A snippet in the session: its stdout and the run's instance.
fn js(d: &Daemon, id: &str, code: &str) -> (String, String) {
    let resp = session_run(d, id, ("javascript", json!({ "code": code })));
    assert_eq!(resp.status, 200, "{code}: {resp}");
    let v = resp.json()["run"].clone();
    assert_eq!(v["isolation"], "vm", "{v}");
    assert_eq!(v["javascript"]["exitCode"].as_i64().unwrap_or(0), 0, "{v}");
    (
        field(&v["javascript"], "stdout"),
        v["instance"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The simulator's state of VM `id` (`running`, `paused`), or `None` once it is gone.
fn state_of(e2b: &E2bSim, id: &str) -> Option<String> {
    e2b.sandboxes()
        .iter()
        .find(|s| s["sandboxID"] == id)
        .and_then(|s| s["state"].as_str().map(str::to_owned))
}

fn wait_state(e2b: &E2bSim, id: &str, want: Option<&str>) {
    e2b.wait_for(
        Duration::from_secs(60),
        &format!("VM {id} {want:?}"),
        |_| state_of(e2b, id).as_deref() == want,
    );
}

/// Files persist, a process a call leaves is killed between calls by root, the code runs as
/// a `user` that cannot become root, the idle VM is paused and the next call resumes it, a
/// cell runs (tests/tests/e2b_cells.rs has the rest) and `Describe` lists the cell languages;
/// the close kills it.
#[test]
fn an_e2b_session_keeps_files_kills_leftovers_and_pauses_when_idle() {
    require_e2b!();
    let e2b = E2bSim::start();
    let d = session_daemon(&e2b, &[]);
    // The startup session proof's VM is gone before the daemon serves.
    assert!(e2b.ids().is_empty(), "{:?}", e2b.sandboxes());
    let v = send(d.addr, &connect::call("Describe", &json!({}))).json();
    assert_eq!(v["supportsSessions"], true, "{v}");
    assert_eq!(
        v["sessionEnvironment"]["languages"],
        json!(["javascript", "python"]),
        "the cell languages: {v}"
    );

    let id = open(&d);
    let (out, instance) = js(
        &d,
        &id,
        "const fs = require('fs'); fs.writeFileSync('/home/user/kept.txt', 'kept');\n\
         const c = require('child_process').spawn('sleep', ['300'], { detached: true, stdio: 'ignore' }); c.unref();\n\
         console.log(require('os').userInfo().username + ' ' + c.pid);",
    );
    let (user, pid) = out.trim().split_once(' ').expect("user and pid");
    assert_eq!(user, "user", "{out}");
    let vm = instance
        .strip_prefix("e2b-sandbox:")
        .expect("typed instance")
        .to_owned();
    assert_eq!(e2b.ids(), vec![vm.clone()]);

    let probe = format!(
        "const fs = require('fs'); const cp = require('child_process');\n\
         let sudo = 'denied'; try {{ cp.execSync('sudo -n true', {{ stdio: 'ignore' }}); sudo = 'root'; }} catch {{}}\n\
         console.log([fs.readFileSync('/home/user/kept.txt', 'utf8'), fs.existsSync('/proc/{pid}'), process.getuid() !== 0, sudo].join(' '));"
    );
    let (out, again) = js(&d, &id, &probe);
    assert_eq!(
        out, "kept false true denied\n",
        "files kept, leftover killed"
    );
    assert_eq!(again, instance, "the same VM");

    // Idle: paused by E2B's pause; the next call resumes it and the files are still there.
    wait_state(&e2b, &vm, Some("paused"));
    let (out, _) = js(
        &d,
        &id,
        "console.log(require('fs').readFileSync('/home/user/kept.txt', 'utf8'))",
    );
    assert_eq!(out, "kept\n");
    assert_eq!(state_of(&e2b, &vm).as_deref(), Some("running"));

    // A project in the session sees the snippet's files' home and keeps its own.
    let resp = session_run(
        &d,
        &id,
        (
            "project",
            json!({ "files": [{ "path": "a.txt", "content": "A" }],
                    "steps": ["cat a.txt ../kept.txt"] }),
        ),
    );
    assert_eq!(resp.status, 200, "{resp}");
    let v = resp.json()["run"].clone();
    assert_eq!(v["project"]["outcome"], "PROJECT_OUTCOME_COMPLETED", "{v}");
    assert_eq!(field(&v["project"]["steps"][0], "stdout"), "Akept", "{v}");

    // A cell runs in the session, and the session goes on.
    let resp = session_run(
        &d,
        &id,
        ("cell", json!({ "language": "python", "code": "print(1)" })),
    );
    assert_eq!(resp.status, 200, "{resp}");
    assert_eq!(
        field(&resp.json()["run"]["cell"], "stdout"),
        "1\n",
        "{resp}"
    );
    let (out, _) = js(&d, &id, "console.log('after')");
    assert_eq!(out, "after\n");

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

/// A VM killed or paused by someone else ends the session as `sandbox_changed` at the next
/// call's read-back, before any code runs.
#[test]
fn an_e2b_session_whose_vm_changed_ends_as_sandbox_changed() {
    require_e2b!();
    let e2b = E2bSim::start();
    let d = session_daemon(&e2b, &[("SANDBOX_SESSION_IDLE", "10m")]);
    for (method, path) in [("DELETE", ""), ("POST", "/pause")] {
        let id = open(&d);
        let (_, instance) = js(&d, &id, "console.log(1)");
        let vm = instance.strip_prefix("e2b-sandbox:").expect("instance");
        let (status, answer) = e2b.api(method, &format!("/sandboxes/{vm}{path}"), None);
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {answer}\n{}",
            d.logs().join("\n")
        );
        let resp = session_run(&d, &id, ("javascript", json!({ "code": "console.log(2)" })));
        assert_ne!(resp.status, 200, "{method} {path}: {resp}");
        let err = ConnectError::of(&resp);
        assert_eq!(
            err.session_ended(),
            Some(SANDBOX_CHANGED),
            "{method}: {err:?}\n{}",
            d.logs().join("\n")
        );
    }
    e2b.wait_empty(Duration::from_secs(60));
}

/// A VM that dies while a snippet or a cell runs ends the session then, as `sandbox_changed`
/// (E2B no longer lists it), not at the call's deadline (`lost_session`).
#[test]
fn an_e2b_session_whose_vm_dies_during_a_call_ends_then() {
    require_e2b!();
    let e2b = E2bSim::start();
    let d = session_daemon(&e2b, &[("SANDBOX_SESSION_IDLE", "10m")]);
    lost_session::a_session_sandbox_lost_mid_call(&d, "/home/user", SANDBOX_CHANGED, |instance| {
        let vm = instance.strip_prefix("e2b-sandbox:").expect("instance");
        e2b.sandboxes()
            .iter()
            .find(|s| s["sandboxID"] == vm)
            .and_then(|s| s["container"].as_str().map(str::to_owned))
            .expect("the VM's container")
    });
    e2b.wait_empty(Duration::from_secs(60));
}
