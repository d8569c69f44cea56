//! Grants inside docker sessions (grants.md §1.5, §2.2 step 5, §3 docker row; providers.md
//! §9.3 "Grants"; wire.md §6.6), through the real daemon and its supervised broker: one
//! socket mounted at `/run/host-api.sock` for the session's whole life, answering 503
//! `host api grant has ended` except while a call has lent a grant; only profiles with
//! `allow_in_sessions` may be lent; route caps count across the session's calls.
//!
//! The runtime comes from `PLIMSOLL_TEST_DOCKER_RUNTIME` (`runc`, the default, or `runsc`);
//! missing docker or images FAIL unless `PLIMSOLL_TEST_DOCKER_SKIP=1`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use plimsoll_tests::Daemon;
use plimsoll_tests::connect::{self, ConnectError};
use plimsoll_tests::docker::{docker_ready, runsc, tier};
use plimsoll_tests::http1::{Connection, Request, Response};
use plimsoll_tests::test_api::Reply;
use serde_json::{Value, json};

use super::docker::LOOK_AROUND;
use crate::{AUDIENCE, Fixture, SECRET, assert_permission, bearers, borrowed, verify_jwt};

/// A docker daemon's proof (snippet, project and session paths) takes a while.
const START: Duration = Duration::from_secs(120);
/// Bound on one answer (the calls' own deadline is [`CALL_TIMEOUT_MS`]).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(90);
const CALL_TIMEOUT_MS: u32 = 30_000;
/// Bound on the whole scenario.
const SCENARIO: Duration = Duration::from_secs(300);

/// The raw probe of the session's socket, past any client: status, body, the variable and
/// whether a client is there, as one line.
const RAW_PROBE: &str = r#"
const fs = require('fs');
const exists = fs.existsSync('/run/host-api.sock');
const req = require('http').request({ socketPath: '/run/host-api.sock', path: '/items/7' }, (res) => {
  let body = '';
  res.setEncoding('utf8');
  res.on('data', (c) => { body += c; });
  res.on('end', () => console.log(JSON.stringify({ status: res.statusCode, body,
    socket: String(process.env.HOST_API_SOCKET), host: typeof host, exists })));
});
req.on('error', (e) => console.log(JSON.stringify({ error: String(e), exists })));
req.end();
"#;

/// The grants file: `sess` may be lent in sessions and caps `GET /items/*` at 2 calls;
/// `inv` is the same API without `allow_in_sessions`.
pub(super) fn session_profiles(f: &Fixture) -> Value {
    let jwt = json!({ "type": "jwt", "secret_env": "INV_SECRET", "audience": AUDIENCE });
    json!({ "profiles": {
        "sess": {
            "base_url": f.api.base_url(),
            "allow": ["GET /items/*"],
            "allowed_callers": ["alice"],
            "scopes": ["inventory:read"],
            "token": jwt,
            "allow_in_sessions": true,
            "route_max_calls": { "GET /items/*": 2 },
        },
        "inv": {
            "base_url": f.api.base_url(),
            "allow": ["GET /items/*"],
            "allowed_callers": ["alice"],
            "scopes": ["inventory:read"],
            "token": jwt,
        },
    }})
}

/// A broker fixture whose grants file holds [`session_profiles`], and a session daemon on it.
pub(super) fn granted_sessions() -> (Fixture, Daemon) {
    let f = Fixture::start();
    f.write_grants(&session_profiles(&f));
    let d = session_daemon(&f);
    (f, d)
}

/// A dropped `Daemon` is stopped with SIGTERM, so its drain removes the session's container
/// even when an assertion fails.
fn session_daemon(f: &Fixture) -> Daemon {
    let mut extra = vec![
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_MAX_SESSIONS", "4"),
        ("SANDBOX_MAX_CONCURRENT", "8"),
    ];
    if runsc() {
        extra.push(("SANDBOX_DOCKER_RUNTIME", "runsc"));
    }
    let env = f.env(&extra);
    Daemon::start_within(&borrowed(&env), START)
}

fn send(addr: SocketAddr, req: &Request) -> Response {
    let mut conn = Connection::open(addr);
    conn.set_read_timeout(ANSWER_TIMEOUT);
    conn.send(&req.to_bytes(addr)).expect("send");
    conn.read_response(false).expect("answer")
}

pub(super) fn call(d: &Daemon, token: &str, procedure: &str, body: &Value) -> Response {
    send(d.addr, &connect::call_as(token, procedure, body))
}

/// A SessionRun with `payload` (`{"javascript": …}` or `{"project": …}`).
pub(super) fn session_run(d: &Daemon, token: &str, id: &str, payload: Value) -> Response {
    let mut body = json!({
        "protocol": connect::PROTOCOL,
        "sessionId": id,
        "timeoutMs": CALL_TIMEOUT_MS,
    });
    if let (Some(b), Some(p)) = (body.as_object_mut(), payload.as_object()) {
        b.extend(p.clone());
    }
    call(d, token, "SessionRun", &body)
}

/// Opens a session offering python as `token`; answers its id.
pub(super) fn open_python(token: &str, d: &Daemon) -> String {
    let resp = call(
        d,
        token,
        "OpenSession",
        &json!({ "protocol": connect::PROTOCOL, "languages": ["python"] }),
    );
    assert_eq!(resp.status, 200, "open: {resp}");
    resp.json()["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_owned()
}

/// Closes session `id` as `token`; answers the close's summary.
pub(super) fn close(token: &str, d: &Daemon, id: &str) -> Value {
    let resp = call(
        d,
        token,
        "CloseSession",
        &json!({ "protocol": connect::PROTOCOL, "sessionId": id }),
    );
    assert_eq!(resp.status, 200, "close: {resp}");
    resp.json()
}

/// A snippet payload, lending `profile` ("" = none).
fn snippet(code: &str, profile: &str) -> Value {
    let mut js = json!({ "code": code });
    if !profile.is_empty() {
        js["grantProfile"] = json!(profile);
    }
    json!({ "javascript": js })
}

pub(super) fn field(v: &Value, name: &str) -> String {
    v[name]
        .as_str()
        .map(|b| String::from_utf8_lossy(&connect::decode_base64(b).expect("base64")).into_owned())
        .unwrap_or_default()
}

/// A snippet call that must be answered with exit 0; answers `(stdout, stderr)`.
pub(super) fn snippet_ran(
    d: &Daemon,
    token: &str,
    id: &str,
    code: &str,
    profile: &str,
) -> (String, String) {
    let resp = session_run(d, token, id, snippet(code, profile));
    assert_eq!(resp.status, 200, "{code}: {resp}");
    let run = resp.json()["run"].clone();
    let js = &run["javascript"];
    let (out, err) = (field(js, "stdout"), field(js, "stderr"));
    assert_eq!(
        js["exitCode"].as_i64().unwrap_or(0),
        0,
        "stdout: {out}\nstderr: {err}\n{run}"
    );
    assert_ne!(js["timedOut"], true, "{run}");
    (out, err)
}

/// The single JSON line a probe printed.
pub(super) fn one_json_line(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("one JSON line ({e}): {out:?}"))
}

/// What the raw probe must see while no grant is lent: the socket mounted, 503 with the
/// broker's text, no variable and no client.
fn assert_grant_ended(seen: &Value) {
    assert_eq!(
        *seen,
        json!({
            "status": 503,
            "body": "host api grant has ended\n",
            "socket": "undefined",
            "host": "undefined",
            "exists": true,
        }),
        "an ungranted call sees the session's socket closed"
    );
}

/// The (method, target) of every request the API recorded.
pub(super) fn targets(f: &Fixture) -> Vec<(String, String)> {
    f.api
        .requests()
        .iter()
        .map(|r| (r.method.clone(), r.target.clone()))
        .collect()
}

pub(super) fn get(path: &str) -> (String, String) {
    ("GET".to_owned(), path.to_owned())
}

#[test]
fn a_session_lends_a_grant_per_call_keeps_route_caps_and_refuses_profiles_not_for_sessions() {
    if !docker_ready() {
        return;
    }
    let started = Instant::now();
    let (f, d) = granted_sessions();
    f.api
        .respond("GET", "/items/8", Reply::json(200, r#"{"id":8}"#));
    f.api
        .respond("GET", "/items/9", Reply::json(200, r#"{"id":9}"#));

    // 1. Open a session as alice.
    let resp = call(
        &d,
        &f.alice,
        "OpenSession",
        &json!({ "protocol": connect::PROTOCOL }),
    );
    assert_eq!(resp.status, 200, "open: {resp}");
    let opened = resp.json();
    let id = opened["sessionId"].as_str().expect("sessionId").to_owned();
    assert_eq!(opened["sandbox"], "docker", "{opened}");
    assert_eq!(opened["isolation"], tier(), "{opened}");

    // 2. No grant lent: the mounted socket answers 503, and there is no variable or client.
    let (out, _) = snippet_ran(&d, &f.alice, &id, RAW_PROBE, "");
    assert_grant_ended(&one_json_line(&out));
    assert!(f.api.requests().is_empty(), "{:?}", targets(&f));

    // 3. Lending `sess`: the client works, the API gets alice's JWT, nothing leaks.
    let code = format!(
        "(async () => {{\n{LOOK_AROUND}\n\
         const item = await host.get('/items/7');\n\
         console.log(JSON.stringify({{ item, socket: process.env.HOST_API_SOCKET, hits }}));\n\
         }})().catch((e) => {{ console.error(String(e)); process.exit(3); }});"
    );
    let (out, err) = snippet_ran(&d, &f.alice, &id, &code, "sess");
    let seen = one_json_line(&out);
    assert_eq!(seen["item"], json!({ "id": 7 }), "{seen}");
    assert_eq!(seen["socket"], "/run/host-api.sock", "{seen}");
    assert_eq!(seen["hits"], json!(["/tmp/decoy"]), "{seen}");
    assert_eq!(targets(&f), [get("/items/7")]);
    let tokens = bearers(&f.api.requests());
    assert_eq!(tokens.len(), 1, "{:?}", f.api.requests());
    let claims = verify_jwt(&tokens[0], SECRET);
    assert_eq!(claims["sub"], "alice", "{claims}");
    assert_eq!(claims["scope"], "inventory:read", "{claims}");
    for secret in [tokens[0].as_str(), SECRET] {
        assert!(
            !out.contains(secret) && !err.contains(secret),
            "{out}\n{err}"
        );
    }

    // 4. A profile without `allow_in_sessions`: refused before anything runs; the session
    // goes on (the next calls use it).
    let marker = "require('fs').writeFileSync('/work/refused-call-ran', 'ran')";
    let resp = session_run(&d, &f.alice, &id, snippet(marker, "inv"));
    assert_ne!(resp.status, 200, "expected a refusal:\n{resp}");
    let refusal = ConnectError::of(&resp);
    assert_permission(&refusal);
    assert!(
        refusal.message.contains("not allowed in sessions"),
        "{refusal:?}"
    );
    assert_eq!(targets(&f), [get("/items/7")]);

    // 5. A project call lending `sess`: every node a step starts has the client and the
    // variable; this is the capped route's second call. The client those nodes import is
    // not the guest's to change (nor its directory): a process from an earlier call could
    // otherwise plant code in a granted step.
    let steps = [
        "node -e \"host.get('/items/8').then(r=>console.log(JSON.stringify(r)))\"",
        "echo \"$HOST_API_SOCKET\"",
        "test -e /work/refused-call-ran && echo ran || echo 'nothing ran'",
        "f=${NODE_OPTIONS#--import=file://}; test -f \"$f\" && echo imported; \
         { echo // >> \"$f\"; } 2>/dev/null && echo writable || echo fixed; \
         touch \"${f%/*}/planted\" 2>/dev/null && echo open || echo closed",
    ];
    let resp = session_run(
        &d,
        &f.alice,
        &id,
        json!({ "project": { "steps": steps, "grantProfile": "sess" } }),
    );
    assert_eq!(resp.status, 200, "project: {resp}");
    let run = resp.json()["run"].clone();
    let project = &run["project"];
    assert_eq!(project["outcome"], "PROJECT_OUTCOME_COMPLETED", "{run}");
    let outs: Vec<String> = (0..steps.len())
        .map(|i| field(&project["steps"][i], "stdout"))
        .collect();
    assert_eq!(
        outs,
        [
            "{\"id\":8}\n",
            "/run/host-api.sock\n",
            "nothing ran\n",
            "imported\nfixed\nclosed\n"
        ],
        "{run}"
    );
    assert_eq!(targets(&f), [get("/items/7"), get("/items/8")]);
    let tokens = bearers(&f.api.requests());
    assert_eq!(tokens.len(), 2, "{:?}", f.api.requests());
    assert_eq!(verify_jwt(&tokens[1], SECRET)["sub"], "alice");
    assert_ne!(tokens[0], tokens[1], "minted per granted session call");
    for text in &outs {
        assert!(
            !text.contains(&tokens[1]) && !text.contains(SECRET),
            "{text}"
        );
    }

    // 6. A third call on the capped route, in a new granted call: the session-long count
    // refuses it, and the API never sees it.
    let third = "host.get('/items/9').then((r) => console.log('reached', JSON.stringify(r)),\n\
                 (e) => console.log(JSON.stringify(e.message)));";
    let (out, _) = snippet_ran(&d, &f.alice, &id, third, "sess");
    assert_eq!(
        out, "\"host api 429: host api route call limit reached\\n\"\n",
        "the route cap holds across the session's calls"
    );
    assert_eq!(targets(&f), [get("/items/7"), get("/items/8")]);

    // 7. The grant went back when the call's code ended: 503 again on the raw socket.
    let (out, _) = snippet_ran(&d, &f.alice, &id, RAW_PROBE, "");
    assert_grant_ended(&one_json_line(&out));
    assert_eq!(targets(&f), [get("/items/7"), get("/items/8")]);

    // 8. Close the session.
    let summary = close(&f.alice, &d, &id);
    assert_eq!(summary["ended"], "SESSION_END_CLOSED", "{summary}");
    assert_eq!(targets(&f), [get("/items/7"), get("/items/8")]);

    // The daemon's log never held the credential.
    let logs = d.logs().join("\n");
    for token in bearers(&f.api.requests()) {
        assert!(!logs.contains(&token));
    }
    assert!(!logs.contains(SECRET));
    // Its audit lines name the profile of each granted call and the broker's count for it:
    // one call each for the snippet and the project, and the capped call counted as denied.
    let granted: Vec<(u64, u64)> = d
        .log_records()
        .iter()
        .filter(|r| r["op"] == "session_run" && r["grant_profile"] == "sess")
        .map(|r| {
            let n = |k: &str| r[k].as_u64().unwrap_or(0);
            (n("host_calls"), n("host_calls_denied"))
        })
        .collect();
    assert_eq!(granted, [(1, 0), (1, 0), (1, 1)], "{logs}");
    assert!(
        started.elapsed() < SCENARIO,
        "the scenario took {:?}",
        started.elapsed()
    );
}

/// The planted thread (issue 12, item 4), started by a Python cell with no grant: it asks the
/// session's socket for `/items/7` every 50 ms and keeps each status it got in `seen`.
pub(super) const PLANT: &str = r#"
import socket, threading, time
seen = []
def _poll():
    while True:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(2)
            s.connect('/run/host-api.sock')
            s.sendall(b'GET /items/7 HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n')
            head = s.recv(64).split(b' ')
            seen.append(int(head[1]) if len(head) > 1 else -1)
            s.close()
        except Exception:
            seen.append(-2)
        time.sleep(0.05)
threading.Thread(target=_poll, daemon=True).start()
"#;

/// Fails on main before the fix (the thread got 200 answers with alice's JWT during the
/// granted call, which the broker charged to that call); passes after: under runc the
/// interpreter is held stopped while the grant is lent (under runsc it is ended first), the thread makes no request in that window, and
/// the broker's audit line for the call says it shared the sandbox with one process kept
/// from earlier calls.
#[test]
fn a_thread_planted_by_an_earlier_cell_never_uses_a_later_calls_grant() {
    if !docker_ready() {
        return;
    }
    let (f, d) = granted_sessions();
    let id = open_python(&f.alice, &d);
    let cell = |code: &str| {
        let resp = session_run(
            &d,
            &f.alice,
            &id,
            json!({ "cell": { "language": "python", "code": code } }),
        );
        assert_eq!(resp.status, 200, "{code}: {resp}");
        let cell = resp.json()["run"]["cell"].clone();
        assert_eq!(cell["exitCode"].as_i64().unwrap_or(0), 0, "{cell}");
        field(&cell, "stdout")
    };

    // 1. The plant, and proof that it polls (503: nothing is lent).
    cell(PLANT);
    std::thread::sleep(Duration::from_millis(500));
    let before: Vec<i64> = serde_json::from_str(cell("print(seen)").trim()).unwrap();
    assert!(!before.is_empty(), "the thread polls");
    assert!(before.iter().all(|&s| s == 503), "{before:?}");
    let count_before = cell("print(len(seen))").trim().parse::<usize>().unwrap();

    // 2. A granted snippet that makes no request of its own and lasts 1.5 s.
    let (out, _) = snippet_ran(
        &d,
        &f.alice,
        &id,
        "setTimeout(() => console.log('done'), 1500);",
        "sess",
    );
    assert_eq!(out, "done\n");

    if runsc() {
        // Under gVisor the interpreter (and its thread) ended before the grant was lent.
        assert_interpreters_ended(&d, &f, &id, "sess", 0);
        return;
    }

    // 3. The thread is back, and saw nothing but 503 (or nothing at all) meanwhile.
    std::thread::sleep(Duration::from_millis(300));
    let after: Vec<i64> = serde_json::from_str(cell("print(seen)").trim()).unwrap();
    assert!(after.len() > count_before, "the thread goes on afterwards");
    assert!(
        after.iter().all(|&s| s == 503),
        "the planted thread got an answer during the granted call: {after:?}"
    );
    assert!(f.api.requests().is_empty(), "{:?}", targets(&f));

    // 4. The broker's audit line for that call marks the shared sandbox and charges it
    // nothing.
    let closed = closed_lines(&d, "sess");
    assert_eq!(closed[0]["host_calls"], 0, "{}", closed[0]);
    assert_eq!(closed[0]["kept_from_earlier_calls"], 1, "{}", closed[0]);
    close(&f.alice, &d, &id);
}

/// The broker's `grant run closed` lines for calls lent `profile`, asserting there is one.
/// The broker writes it as the grant closes, before the answer, but its log reaches the
/// daemon's captured output a moment later: it is waited for (up to 10 s).
pub(super) fn closed_lines(d: &Daemon, profile: &str) -> Vec<Value> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let closed: Vec<Value> = d
            .log_records()
            .into_iter()
            .filter(|r| r["message"] == "grant run closed" && r["grant_profile"] == profile)
            .collect();
        if !closed.is_empty() || Instant::now() >= until {
            assert_eq!(closed.len(), 1, "{closed:?}");
            return closed;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Under runsc, after a granted call of session `id` lent `profile`: its audit line kept
/// nothing from earlier calls and counts `host_calls`, and the next cell starts a fresh
/// interpreter (the one from before the call ended before the grant was lent).
fn assert_interpreters_ended(d: &Daemon, f: &Fixture, id: &str, profile: &str, host_calls: u64) {
    let closed = closed_lines(d, profile);
    assert_eq!(
        closed[0]["kept_from_earlier_calls"].as_u64().unwrap_or(0),
        0,
        "{}",
        closed[0]
    );
    assert_eq!(closed[0]["host_calls"], host_calls, "{}", closed[0]);
    let resp = session_run(
        d,
        &f.alice,
        id,
        json!({ "cell": { "language": "python",
                          "code": "print(globals().get('seen') is None)" } }),
    );
    assert_eq!(resp.status, 200, "{resp}");
    let cell = resp.json()["run"]["cell"].clone();
    assert_eq!(cell["interpreterStarted"], true, "{cell}");
    assert_eq!(field(&cell, "stdout"), "True\n", "{cell}");
}

/// The daemon's supervised broker, found among its children by name.
fn broker_pid(d: &Daemon) -> u32 {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", d.pid())).expect("daemon tasks");
    let children: Vec<u32> = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<_>>()
        })
        .collect();
    children
        .into_iter()
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "broker")
        })
        .expect("the daemon's broker child")
}

/// Stops a process with SIGSTOP until dropped (SIGCONT), so a failing assertion never leaves
/// the broker stopped.
struct Stopped(u32);

impl Stopped {
    fn signal(pid: u32, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {pid}");
    }
    fn new(pid: u32) -> Stopped {
        Stopped::signal(pid, "-STOP");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        Stopped::signal(self.0, "-CONT");
    }
}

/// A granted call whose grant the broker cannot confirm it took back (it stops answering
/// while the call runs) still gets its answer, but the session ends as `boundary_failed`: its
/// sandbox goes, so nothing left in it can use a grant that may still answer.
#[test]
fn a_grant_the_broker_cannot_confirm_taken_back_ends_the_session() {
    if !docker_ready() {
        return;
    }
    let (f, d) = granted_sessions();
    let id = open_python(&f.alice, &d);
    snippet_ran(&d, &f.alice, &id, "console.log('warm')", "");
    let broker = broker_pid(&d);
    let answered = std::thread::scope(|s| {
        let call = s.spawn(|| {
            let code = "setTimeout(() => console.log('ran'), 3000)";
            session_run(&d, &f.alice, &id, snippet(code, "sess"))
        });
        // The grant is lent before the snippet's node starts; stop the broker while it runs.
        std::thread::sleep(Duration::from_millis(1500));
        let stopped = Stopped::new(broker);
        let answered = call.join().expect("call thread");
        drop(stopped);
        answered
    });
    assert_eq!(answered.status, 200, "the call ran: {answered}");
    let run = answered.json()["run"].clone();
    assert_eq!(field(&run["javascript"], "stdout"), "ran\n", "{run}");
    let closed = close(&f.alice, &d, &id);
    assert_eq!(
        closed["ended"], "SESSION_END_BOUNDARY_FAILED",
        "the session ended under the unconfirmed grant: {closed}"
    );
}
