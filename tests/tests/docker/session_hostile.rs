//! Session code against the processes a session keeps between calls (issue 12, item 3):
//! docker-init, its `sleep`, the cell interpreters and their relays. From a cell and from a
//! snippet, every ptrace attach or seize, every open of `/proc/<pid>/mem` for writing and
//! every `process_vm_readv`/`process_vm_writev` on another kept process must fail, under
//! runc (with or without Yama) and under runsc.

use super::session::{cell, close_as, open, session_run_as, sessions};
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

/// A watcher thread, planted by a cell, that tries to open the standard input of every process
/// whose command line names the project runner, the pipe that carries the report key.
const RUNNER_WATCH: &str = r#"
import os, threading, time
seen, loops = set(), [0]
def watch():
    while True:
        for p in os.listdir('/proc'):
            if not p.isdigit() or int(p) == os.getpid():
                continue
            try:
                with open(f'/proc/{p}/cmdline', 'rb') as f:
                    cmd = f.read()
            except OSError:
                continue
            if b'runner.mjs' in cmd:
                try:
                    os.close(os.open(f'/proc/{p}/fd/0', os.O_RDONLY | os.O_NONBLOCK))
                    seen.add('opened')
                except OSError:
                    seen.add('refused')
        loops[0] += 1
        time.sleep(0.005)
threading.Thread(target=watch, daemon=True).start()
"#;

/// Issue 15 item 5: interpreters survive a project call, but none runs while its runner reads
/// the report key. A cell's watcher thread, shown first to open the stdin of a decoy process
/// named like the runner, never even sees the real runner (nor its start script) during a
/// project call: the interpreter is held stopped from before the runner's exec to the call's
/// end, then resumed with its state (the watcher goes on looping).
#[test]
fn a_kept_interpreter_never_runs_beside_a_project_runner() {
    require_docker!();
    let d = sessions();
    let (id, _) = open(&d, json!({ "languages": ["python"] }));
    let planted = cell(&d, &id, "python", RUNNER_WATCH);
    assert_eq!(planted["exitCode"].as_i64().unwrap_or(0), 0, "{planted}");
    let decoy = cell(
        &d,
        &id,
        "python",
        "import subprocess\nsubprocess.run(['sh', '-c', 'sleep 1; true', 'runner.mjs'])\nsorted(seen)",
    );
    assert_eq!(
        field(&decoy, "stdout"),
        "['opened']\n",
        "the watcher works: {decoy}"
    );
    let before = cell(&d, &id, "python", "seen.clear(); loops[0]");
    let before: u64 = field(&before, "stdout").trim().parse().expect("a count");
    let project = session_run_as(
        &d,
        None,
        &id,
        json!({ "project": { "steps": ["sleep 1", "echo done"] } }),
    );
    assert_eq!(project.status, 200, "{project}");
    let report = &project.json()["run"]["project"];
    assert_eq!(report["outcome"], "PROJECT_OUTCOME_COMPLETED", "{report}");
    assert_eq!(field(&report["steps"][1], "stdout"), "done\n", "{report}");
    // Resumed with its state: the watcher loops again, and never saw a runner.
    let check = format!("import time; time.sleep(0.2); (sorted(seen), loops[0] > {before})");
    let after = cell(&d, &id, "python", &check);
    assert_eq!(after["interpreterStarted"].as_bool(), None, "{after}");
    assert_eq!(field(&after, "stdout"), "([], True)\n", "{after}");
    assert_eq!(close_as(&d, None, &id).status, 200);
}
