//! Session code against the processes a session keeps between calls (issue 12, item 3):
//! docker-init, its `sleep`, the cell interpreters and their relays. From a cell and from a
//! snippet, every ptrace attach or seize, every open of `/proc/<pid>/mem` for writing and
//! every `process_vm_readv`/`process_vm_writev` on another kept process must fail, under
//! runc (with or without Yama) and under runsc.

use super::session::{cell, close_as, open, sessions};
use super::*;

/// The attack, in Python with ctypes: one JSON object, pid -> what each attempt came to.
const ATTACK: &str = include_str!("attacks/ptrace_kept.py");
/// What every attempt must come to.
const REFUSED: [&str; 2] = ["EPERM", "EACCES"];
/// gVisor does not implement `process_vm_readv`/`writev` at all.
const NOT_IMPLEMENTED: &str = "ENOSYS";

/// Checks one attack report: the kept processes named in `expected` (by a part of their
/// command line) are all there, and nothing could be traced, opened or read or written.
fn assert_all_refused(report: &Value, expected: &[(&str, usize)], from: &str) {
    let entries = report.as_object().expect("a JSON object");
    for (part, at_least) in expected {
        let n = entries
            .values()
            .filter(|e| e["cmd"].as_str().unwrap_or("").contains(part))
            .count();
        assert!(
            n >= *at_least,
            "{from}: expected {at_least} process(es) like {part:?}: {report}"
        );
    }
    for (pid, entry) in entries {
        for attempt in ["attach", "seize", "mem", "readv", "writev"] {
            let got = entry[attempt].as_str().unwrap_or("?");
            let vm = attempt.ends_with('v');
            assert!(
                REFUSED.contains(&got) || (vm && runsc() && got == NOT_IMPLEMENTED),
                "{from}: {attempt} on pid {pid} ({}) came to {got}: {report}",
                entry["cmd"]
            );
        }
    }
}

/// Fails on main before the fix (under runc on a host without Yama, such as this one, a cell
/// attached to the other interpreter, to `sleep` and to docker-init and opened their memory
/// read-write); passes after: the container's own processes run as uid+1, the interpreters
/// and relays are non-dumpable, and the session's seccomp profile withholds ptrace and
/// process_vm_* when Yama does not restrict it.
#[test]
fn session_code_cannot_trace_or_write_any_kept_process() {
    require_docker!();
    let d = sessions();
    let (id, _) = open(&d, json!({ "languages": ["python"] }));
    let js_cell = cell(&d, &id, "javascript", "1 + 1");
    assert_eq!(field(&js_cell, "stdout"), "2\n", "{js_cell}");
    let literal = serde_json::to_string(ATTACK).unwrap();

    // From a Python cell: the attack runs inside the interpreter itself.
    let ran = cell(
        &d,
        &id,
        "python",
        &format!("exec(compile({literal}, 'attack', 'exec'), {{}})"),
    );
    assert_eq!(ran["exitCode"].as_i64().unwrap_or(0), 0, "{ran}");
    let report: Value = serde_json::from_str(field(&ran, "stdout").trim())
        .unwrap_or_else(|e| panic!("a JSON report ({e}): {ran}"));
    assert_all_refused(
        &report,
        &[
            ("init", 1),
            ("sleep", 1),
            ("node --expose-internals", 1),
            ("node -e", 2),
        ],
        "a python cell",
    );

    // From a snippet: a python3 it starts attacks everything, the Python interpreter too.
    let code = format!(
        "const r = require('child_process').spawnSync('python3', ['-c', {literal}], {{ encoding: 'utf8' }});
process.stdout.write(r.stdout || ''); process.stderr.write(r.stderr || String(r.error || ''));"
    );
    let resp = send(
        d.addr,
        &connect::call(
            "SessionRun",
            &json!({ "protocol": connect::PROTOCOL, "sessionId": id, "javascript": { "code": code } }),
        ),
    );
    assert_eq!(resp.status, 200, "{resp}");
    let run = resp.json()["run"].clone();
    let out = field(&run["javascript"], "stdout");
    let report: Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("a JSON report ({e}): {run}"));
    assert_all_refused(
        &report,
        &[
            ("init", 1),
            ("sleep", 1),
            ("python3 -I", 1),
            ("node --expose-internals", 1),
            ("node -e", 2),
        ],
        "a snippet",
    );

    // Nothing was disturbed: both interpreters still hold their state and answer.
    let again = cell(&d, &id, "python", "print(6 * 7)");
    assert_eq!(field(&again, "stdout"), "42\n", "{again}");
    assert_eq!(again["interpreterStarted"].as_bool(), None, "{again}");
    let again = cell(&d, &id, "javascript", "2 + 2");
    assert_eq!(field(&again, "stdout"), "4\n", "{again}");
    assert_eq!(close_as(&d, None, &id).status, 200);
}
