//! A kept interpreter woken during a later granted call (issue 12, item 4's residues): by the
//! call's own code, by a timer it armed itself, or on a connection it opened before the call.
//! Under runc the broker refuses it as from outside the call; under runsc the session ends its
//! interpreters before a grant is lent, so there is nothing left to wake. Same daemon, grants
//! and runtime selection as [`super::sessions`].

use std::time::Duration;

use plimsoll_tests::Daemon;
use plimsoll_tests::docker::{docker_ready, runsc};
use plimsoll_tests::test_api::Reply;
use serde_json::{Value, json};

use super::sessions::{
    PLANT, close, closed_lines, field, get, granted_sessions, open_python, session_run,
    snippet_ran, targets,
};
use crate::Fixture;

/// A planted thread like [`PLANT`] that opens ONE keep-alive connection to the session's
/// socket before any grant is lent and asks `/items/7` on it every 50 ms, keeping
/// `[status, body]` of each answer in `seen`; it never opens another connection. The cell
/// prints the interpreter's pid.
const PLANT_KEEP_ALIVE: &str = r#"
import os, socket, threading, time
seen = []
def _poll():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect('/run/host-api.sock')
    f = s.makefile('rb')
    try:
        while True:
            s.sendall(b'GET /items/7 HTTP/1.1\r\nHost: api\r\n\r\n')
            status = int(f.readline().split(b' ')[1])
            length = 0
            while True:
                line = f.readline().strip()
                if not line:
                    break
                name, _, value = line.partition(b':')
                if name.strip().lower() == b'content-length':
                    length = int(value)
            seen.append([status, f.read(length).decode()])
            time.sleep(0.05)
    except Exception as e:
        seen.append([-3, repr(e)])
threading.Thread(target=_poll, daemon=True).start()
print(os.getpid())
"#;

/// A cell that arms a POSIX timer sending the interpreter `SIGCONT` every 200 ms (issue 12,
/// item 4's residue: a held interpreter wakes itself during a later granted call).
const ARM_SIGCONT_TIMER: &str = r#"
import ctypes, ctypes.util, signal
try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.timer_create
except AttributeError:
    libc = ctypes.CDLL(ctypes.util.find_library('rt'), use_errno=True)
class sigevent(ctypes.Structure):
    _fields_ = [('value', ctypes.c_void_p), ('signo', ctypes.c_int), ('notify', ctypes.c_int),
                ('pad', ctypes.c_int * 12)]
class timespec(ctypes.Structure):
    _fields_ = [('s', ctypes.c_long), ('ns', ctypes.c_long)]
class itimerspec(ctypes.Structure):
    _fields_ = [('interval', timespec), ('value', timespec)]
# With SIGCONT at its default (ignored) disposition the kernel parks the timer instead of
# sending it; a handler makes the signal count.
signal.signal(signal.SIGCONT, lambda *_: None)
timer = ctypes.c_void_p()
event = sigevent(signo=signal.SIGCONT, notify=0)  # SIGEV_SIGNAL
assert libc.timer_create(1, ctypes.byref(event), ctypes.byref(timer)) == 0, ctypes.get_errno()
every = timespec(0, 200_000_000)
assert libc.timer_settime(timer, 0, ctypes.byref(itimerspec(every, every)), None) == 0
print('armed')
"#;

/// What one woken-interpreter scenario left behind.
struct Woken {
    /// `[status, body]` of every answer the planted thread got.
    seen: Vec<Value>,
    /// The granted snippet's stdout.
    out: String,
    /// The broker's `grant run closed` line for the granted call.
    closed: Value,
    /// Whether plimsolld found the interpreter running again at the release.
    running_at_release: bool,
    /// Whether the first cell after the call started a fresh interpreter.
    fresh_after: bool,
}

/// Opens a Python session as alice, runs each of `cells` (the last one's stdout, trimmed,
/// replaces `PID` in `granted`), then `granted` as a snippet lent `sess`, then reads what
/// the planted thread saw. The API answers `/items/8`; route caps allow 2 calls.
fn woken_interpreter(f: &Fixture, d: &Daemon, cells: &[&str], granted: &str) -> Woken {
    f.api
        .respond("GET", "/items/8", Reply::json(200, r#"{"id":8}"#));
    let granted = granted.replace("OWN", OWN);
    let id = open_python(&f.alice, d);
    let cell = |code: &str| {
        let resp = session_run(
            d,
            &f.alice,
            &id,
            json!({ "cell": { "language": "python", "code": code } }),
        );
        assert_eq!(resp.status, 200, "{code}: {resp}");
        let cell = resp.json()["run"]["cell"].clone();
        assert_eq!(cell["exitCode"].as_i64().unwrap_or(0), 0, "{cell}");
        field(&cell, "stdout")
    };
    let mut last = String::new();
    for code in cells {
        last = cell(code).trim().to_owned();
    }
    // The thread polls (503: nothing is lent) before the granted call.
    std::thread::sleep(Duration::from_millis(300));
    let polled: Vec<Value> =
        serde_json::from_str(cell("print(json.dumps(seen))").trim()).expect("seen is JSON");
    assert!(!polled.is_empty(), "the thread polls");
    let (out, _) = snippet_ran(d, &f.alice, &id, &granted.replace("PID", &last), "sess");
    std::thread::sleep(Duration::from_millis(300));
    // A fresh interpreter (the old one ended before the grant was lent) has no `seen`.
    let resp = session_run(
        d,
        &f.alice,
        &id,
        json!({ "cell": { "language": "python",
                          "code": "import json\nprint(json.dumps(globals().get('seen', [])))" } }),
    );
    assert_eq!(resp.status, 200, "{resp}");
    let after = resp.json()["run"]["cell"].clone();
    let fresh_after = after["interpreterStarted"] == true;
    let seen: Vec<Value> =
        serde_json::from_str(field(&after, "stdout").trim()).expect("seen is JSON");
    let closed = closed_lines(d, "sess");
    let records = d.log_records();
    // plimsolld's own lines carry `msg` (the broker's, `message`).
    let running_at_release = records.iter().any(|r| {
        r["msg"]
            .as_str()
            .is_some_and(|m| m.contains("was running again before its release"))
    });
    close(&f.alice, d, &id);
    Woken {
        seen,
        out,
        closed: closed[0].clone(),
        running_at_release,
        fresh_after,
    }
}

/// The granted snippet of the waking scenarios: sends `SIGCONT` to the held interpreter
/// (same uid: the kernel allows it), then makes one request of its own (`/items/8`) and
/// lasts 1.5 s more.
const WAKE_PID: &str = r"
try { process.kill(PID, 'SIGCONT'); console.log('woken'); } catch (e) { console.log(String(e)); }
OWN
";

/// A granted snippet that makes one request of its own and lasts 1.5 s more.
const OWN: &str = r"
require('http').get({ socketPath: '/run/host-api.sock', path: '/items/8' }, (res) => {
  res.resume();
  res.on('end', () => {
    console.log('own ' + res.statusCode);
    setTimeout(() => console.log('done'), 1500);
  });
}).on('error', (e) => console.log(String(e)));
";

/// The status of one answer the planted thread kept (a bare status, or `[status, body]`).
fn status_of(seen: &Value) -> i64 {
    seen.as_i64()
        .or_else(|| seen[0].as_i64())
        .unwrap_or_default()
}

/// Asserts that the woken interpreter's requests during the call were all refused as from
/// outside it (the audit line counts at least one), while the call's own request was
/// served: the API saw exactly that one.
fn assert_refused_as_outside(f: &Fixture, woken: &Woken) {
    assert!(
        woken.running_at_release,
        "the interpreter did wake: {:?} {}",
        woken.seen, woken.closed
    );
    assert!(
        woken
            .seen
            .iter()
            .all(|s| matches!(status_of(s), 503 | -2 | -3)),
        "the woken interpreter got an answer during the granted call: {:?}",
        woken.seen
    );
    assert!(woken.out.contains("own 200\n"), "{}", woken.out);
    assert_eq!(targets(f), vec![get("/items/8")]);
    let closed = &woken.closed;
    assert_eq!(closed["host_calls"], 1, "{closed}");
    assert_eq!(closed["kept_from_earlier_calls"], 1, "{closed}");
    assert!(
        closed["host_calls_from_outside_call"].as_u64().unwrap_or(0) >= 1,
        "{closed}"
    );
}

/// Under runsc the peer of a session socket is gVisor's gofer, not the guest process, so the
/// broker could not tell a woken interpreter's connection from the call's: the session ends
/// its interpreters before the grant is lent. What must hold: nothing was kept into the call
/// (the audit line says 0), the API saw only the call's own request, and the next cell
/// started a fresh interpreter, which says so.
fn assert_ended_under_runsc(f: &Fixture, woken: &Woken) {
    let closed = &woken.closed;
    // The audit line leaves the field out when nothing was kept.
    assert_eq!(
        closed["kept_from_earlier_calls"].as_u64().unwrap_or(0),
        0,
        "{closed}"
    );
    assert_eq!(closed["host_calls"], 1, "{closed}");
    assert!(woken.out.contains("own 200\n"), "{}", woken.out);
    assert_eq!(targets(f), vec![get("/items/8")]);
    assert!(
        woken.fresh_after,
        "the next cell starts a fresh interpreter"
    );
    assert!(woken.seen.is_empty(), "{:?}", woken.seen);
}

/// Residue (b) of issue 12 item 4, on a connection opened before the call. Fails before the
/// fix (the granted snippet's `SIGCONT` woke the interpreter, whose old keep-alive connection
/// then got 200 answers with alice's JWT, charged to the call); passes after: under runc a
/// connection accepted before the grant was lent is refused while the call shares the
/// sandbox with held processes, and the audit line counts the refusals; under runsc the
/// interpreter has ended before the lend, so there is nothing left to wake. Also
/// shows that uid separation does not stop the call's own code from waking an interpreter
/// (both run as the guest uid).
#[test]
fn a_connection_opened_before_a_granted_call_is_refused_during_it() {
    if !docker_ready() {
        return;
    }
    let refusal = json!([503, "host api grant is lent to another call\n"]);
    // The broker closes a keep-alive connection idle for 5 s, and the held thread is idle
    // from the hold until the granted snippet wakes it: on a loaded machine that can take
    // longer, the connection is gone before the wake, and nothing was tried. Try again
    // then (the thread's last entry is the closed connection, and no refusal was seen).
    for attempt in 1..=3 {
        let (f, d) = granted_sessions();
        let woken = woken_interpreter(&f, &d, &["import json", PLANT_KEEP_ALIVE], WAKE_PID);
        let closed_first = woken.seen.last().is_some_and(|s| status_of(s) == -3);
        if attempt < 3 && closed_first && !woken.seen.contains(&refusal) {
            eprintln!(
                "attempt {attempt}: the kept connection closed before the wake: {:?}",
                woken.seen
            );
            continue;
        }
        if runsc() {
            assert_ended_under_runsc(&f, &woken);
            return;
        }
        assert_eq!(
            woken.out, "woken\nown 200\ndone\n",
            "the call's code can SIGCONT it"
        );
        assert_refused_as_outside(&f, &woken);
        assert!(woken.seen.contains(&refusal), "{:?}", woken.seen);
        return;
    }
}

/// Residue (b) of issue 12 item 4, on fresh connections. Fails before the fix (the planted
/// thread, woken by the granted snippet's `SIGCONT`, got 200 answers on new connections);
/// passes after under runc: the broker reads each peer's ancestry and refuses a process
/// under the container's init (a kept interpreter), counting it on the audit line. Under
/// runsc the interpreter has ended before the grant was lent: nothing is left to wake.
#[test]
fn a_held_interpreter_woken_by_the_granted_call_gets_no_answer() {
    if !docker_ready() {
        return;
    }
    let (f, d) = granted_sessions();
    let plant = format!("{PLANT}\nimport os, json\nprint(os.getpid())");
    let woken = woken_interpreter(&f, &d, &[&plant], WAKE_PID);
    if runsc() {
        assert_ended_under_runsc(&f, &woken);
        return;
    }
    assert!(
        woken.out.starts_with("woken\n"),
        "the call's code can SIGCONT it: {}",
        woken.out
    );
    assert_refused_as_outside(&f, &woken);
}

/// Residue (a) of issue 12 item 4. Fails before the fix (a POSIX timer armed by the cell
/// sends the interpreter SIGCONT during the later granted call, and the planted thread got
/// 200 answers); passes after under runc: the woken thread's requests are refused as from
/// outside the call. Under runsc, the interpreter has ended before the grant was lent.
#[test]
fn a_held_interpreter_woken_by_its_own_timer_gets_no_answer() {
    if !docker_ready() {
        return;
    }
    let (f, d) = granted_sessions();
    let plant = format!("{PLANT}\nimport json");
    let woken = woken_interpreter(&f, &d, &[&plant, ARM_SIGCONT_TIMER], OWN);
    if runsc() {
        assert_ended_under_runsc(&f, &woken);
    } else {
        assert_refused_as_outside(&f, &woken);
    }
}

/// A Python cell whose thread, a second after the cell (so after the call's sweep), starts a
/// detached process that asks the session's socket for `/items/7` every 50 ms, then kills its
/// own relay and ends the interpreter: at the next call no interpreter is left to hold or end.
const ORPHAN_THEN_EXIT: &str = r#"
import os, subprocess, threading, time
POLL = """
import socket, time
while True:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect('/run/host-api.sock')
        s.sendall(b'GET /items/7 HTTP/1.1\\r\\nHost: api\\r\\nConnection: close\\r\\n\\r\\n')
        s.recv(64)
        s.close()
    except Exception:
        pass
    time.sleep(0.05)
"""
def _later():
    time.sleep(1.0)
    subprocess.Popen(['python3', '-c', POLL], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    # The interpreter's relay runs as the guest too: with it gone the interpreter counts as
    # dead, and then the interpreter goes.
    for pid in os.listdir('/proc'):
        try:
            if pid.isdigit() and b'plimsoll-relay\0cell' in open('/proc/%s/cmdline' % pid, 'rb').read():
                os.kill(int(pid), 9)
        except OSError:
            pass
    os._exit(0)
threading.Thread(target=_later, daemon=True).start()
print('planted')
"#;

/// A process an interpreter started after the last sweep, the interpreter itself gone by the
/// next call. Fails before the fix (with no interpreter left, nothing was held, swept or
/// quiesced before the lend, the broker checked no peer, and the orphan's requests were
/// answered with the call's grant); passes after: an interpreter that outlived the last sweep
/// means a sweep (runc) or the quiesce (runsc) before the grant is lent, and the API sees only
/// the call's own request.
#[test]
fn a_process_left_by_an_interpreter_gone_since_the_sweep_never_meets_the_grant() {
    if !docker_ready() {
        return;
    }
    let (f, d) = granted_sessions();
    f.api
        .respond("GET", "/items/8", Reply::json(200, r#"{"id":8}"#));
    let id = open_python(&f.alice, &d);
    let resp = session_run(
        &d,
        &f.alice,
        &id,
        json!({ "cell": { "language": "python", "code": ORPHAN_THEN_EXIT } }),
    );
    assert_eq!(resp.status, 200, "{resp}");
    assert_eq!(field(&resp.json()["run"]["cell"], "stdout"), "planted\n");
    // The orphan starts a second after the cell and the interpreter ends 0.3 s later.
    std::thread::sleep(Duration::from_millis(2500));
    let (out, _) = snippet_ran(&d, &f.alice, &id, OWN, "sess");
    assert!(out.contains("own 200\n"), "{out}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        targets(&f),
        vec![get("/items/8")],
        "only the call's own request reached the API"
    );
    let closed = closed_lines(&d, "sess");
    assert_eq!(closed[0]["host_calls"], 1, "{}", closed[0]);
    close(&f.alice, &d, &id);
}
