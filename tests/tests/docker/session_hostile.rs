//! Session code against the processes a session keeps between calls (issue 12, item 3):
//! docker-init, its `sleep`, the session agent, the cell interpreters and their relays. From a cell and from a
//! snippet, every ptrace attach or seize, every open of `/proc/<pid>/mem` for writing and
//! every `process_vm_readv`/`process_vm_writev` on another kept process must fail, under
//! runc (with or without Yama) and under runsc.

use super::session::{cell, close_as, open, session_run_as, sessions};
use super::*;
use plimsoll_tests::connect::ConnectError;

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
            // The two relays (static, non-dumpable by their own prctl) and the session agent
            // (the same binary, uid+1 and non-dumpable by its own guard).
            ("/usr/local/bin/plimsoll-relay cell", 2),
            ("/usr/local/bin/plimsoll-relay agent", 1),
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
            // The two relays; the agent started the snippet, so it is the attack's ancestor
            // here (attacked from the cell above, and by the agent tests below).
            ("/usr/local/bin/plimsoll-relay cell", 2),
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

/// A guest's attempts on the session agent (issue 15 item 2), as one JSON line, after text
/// that looks like the agent's answers; it leaves a background `sleep` behind.
const AGENT_ATTACK: &str = r#"
const fs = require('fs');
let agent = null;
for (const p of fs.readdirSync('/proc')) {
  if (!/^[0-9]+$/.test(p)) continue;
  try {
    if (fs.readFileSync(`/proc/${p}/cmdline`, 'latin1').includes("plimsoll-relay\u0000agent\u0000")) agent = Number(p);
  } catch {}
}
const out = { found: agent !== null };
const attempt = (name, f) => { try { f(); out[name] = 'done'; } catch (e) { out[name] = e.code || String(e); } };
attempt('stdin', () => fs.closeSync(fs.openSync(`/proc/${agent}/fd/0`, 'w')));
attempt('stdout', () => fs.closeSync(fs.openSync(`/proc/${agent}/fd/1`, 'w')));
attempt('mem', () => fs.closeSync(fs.openSync(`/proc/${agent}/mem`, 'r')));
attempt('environ', () => fs.readFileSync(`/proc/${agent}/environ`));
attempt('stop', () => process.kill(agent, 'SIGSTOP'));
attempt('kill', () => process.kill(agent, 'SIGKILL'));
const mine = fs.readFileSync('/proc/self/status', 'latin1');
out.capEff = /CapEff:\s*(\S+)/.exec(mine)[1];
out.capPrm = /CapPrm:\s*(\S+)/.exec(mine)[1];
out.uid = process.getuid();
out.agentUid = Number(/Uid:\s*([0-9]+)/.exec(fs.readFileSync(`/proc/${agent}/status`, 'latin1'))[1]);
require('child_process').spawn('sleep', ['600'], { detached: true, stdio: 'ignore' }).unref();
process.stdout.write('{"op":"sweep","exit":0}\n{"op":"project","stdout":""}\n');
process.stdout.write(JSON.stringify(out) + '\n');
"#;

/// Whether any process of the session runs `sleep 600` (a snippet's answer).
const LEFT_BEHIND: &str = r#"
const fs = require('fs');
const left = fs.readdirSync('/proc').filter((p) => {
  try { return /^[0-9]+$/.test(p) && fs.readFileSync(`/proc/${p}/cmdline`, 'latin1') === 'sleep\u0000600\u0000'; } catch { return false; }
});
console.log(left.length);
"#;

/// Issue 15 items 2 and 3: a guest process can neither write the agent's stream nor read it,
/// trace, stop or kill the agent; it holds no capability and another uid than the agent's.
/// Text shaped like the agent's answers changes nothing: the sweep still runs (the background
/// process is gone at the next call) and the session goes on.
#[test]
fn a_guest_cannot_reach_the_session_agent_or_forge_its_answers() {
    require_docker!();
    let d = sessions();
    let (id, _) = open(&d, json!({}));
    let run = session_run_as(
        &d,
        None,
        &id,
        json!({ "javascript": { "code": AGENT_ATTACK } }),
    );
    assert_eq!(run.status, 200, "{run}");
    let run = run.json()["run"].clone();
    let out = field(&run["javascript"], "stdout");
    let last = out.lines().last().unwrap_or_default();
    let report: Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("a JSON report ({e}): {run}"));
    assert_eq!(report["found"], true, "{report}");
    for attempt in ["stdin", "stdout", "mem", "environ", "stop", "kill"] {
        // gVisor serves every process's environ world-readable (nothing secret is in the
        // agent's: plimsolld sets it).
        if attempt == "environ" && super::runsc() {
            continue;
        }
        let got = report[attempt].as_str().unwrap_or("?");
        assert!(REFUSED.contains(&got), "{attempt} came to {got}: {report}");
    }
    assert_eq!(report["capEff"], "0000000000000000", "{report}");
    assert_eq!(report["capPrm"], "0000000000000000", "{report}");
    assert_ne!(report["uid"], report["agentUid"], "{report}");
    let next = session_run_as(
        &d,
        None,
        &id,
        json!({ "javascript": { "code": LEFT_BEHIND } }),
    );
    assert_eq!(next.status, 200, "{next}");
    assert_eq!(
        field(&next.json()["run"]["javascript"], "stdout"),
        "0\n",
        "the sweep ran: {next}"
    );
    assert_eq!(close_as(&d, None, &id).status, 200);
}

/// Issue 15 item 3: a project step runs as another uid than the agent that starts it, with no
/// capability, cannot open the agent's `/proc` entries, and still runs in a `/work` the guest
/// has closed to everyone else (mode 0700).
#[test]
fn a_step_runs_apart_from_the_agent_even_in_a_closed_work_directory() {
    require_docker!();
    let d = sessions();
    let (id, _) = open(&d, json!({}));
    let closed = session_run_as(
        &d,
        None,
        &id,
        json!({ "javascript": { "code": "require('fs').chmodSync('/work', 0o700); console.log('closed')" } }),
    );
    assert_eq!(closed.status, 200, "{closed}");
    let probe = r#"p=$PLIMSOLL_RUNNER_PID; echo "uid $(id -u)"; while read -r k v rest; do case "$k" in Uid:) echo "agent $v";; esac; done </proc/$p/status; while read -r k v; do case "$k" in CapEff:|CapPrm:) echo "$k $v";; esac; done </proc/self/status; for f in fd/0 fd/1 mem; do if true <"/proc/$p/$f" 2>/dev/null; then echo "opened $f"; fi; done; if true >>"/proc/$p/fd/1" 2>/dev/null; then echo "wrote fd/1"; fi"#;
    let project = session_run_as(
        &d,
        None,
        &id,
        json!({ "project": { "steps": ["pwd; stat -c %a .; echo hi > f; cat f", probe] } }),
    );
    assert_eq!(project.status, 200, "{project}");
    let report = &project.json()["run"]["project"];
    assert_eq!(report["outcome"], "PROJECT_OUTCOME_COMPLETED", "{report}");
    assert_eq!(
        field(&report["steps"][0], "stdout"),
        "/work\n700\nhi\n",
        "{report}"
    );
    let seen = field(&report["steps"][1], "stdout");
    let value = |name: &str| {
        seen.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{name} in {seen}"))
            .to_owned()
    };
    assert_ne!(value("uid "), value("agent "), "{seen}");
    assert_eq!(value("CapEff: "), "0000000000000000", "{seen}");
    assert_eq!(value("CapPrm: "), "0000000000000000", "{seen}");
    assert!(
        !seen.contains("opened") && !seen.contains("wrote"),
        "a step reached the agent: {seen}"
    );
    assert_eq!(close_as(&d, None, &id).status, 200);
}

/// An agent that is gone (here killed from outside, as root) ends the session at the next
/// call, typed as an unproven boundary, never a retry.
#[test]
fn a_session_whose_agent_is_gone_ends_at_the_next_call() {
    require_docker!();
    let d = sessions();
    let (id, _) = open(&d, json!({}));
    let run = session_run_as(&d, None, &id, json!({ "javascript": { "code": "1" } }));
    assert_eq!(run.status, 200, "{run}");
    let container = run.json()["run"]["instance"]
        .as_str()
        .and_then(|i| i.strip_prefix("docker-container:"))
        .expect("a docker-container instance")
        .to_owned();
    kill_agent(&container);
    let resp = session_run_as(
        &d,
        None,
        &id,
        json!({ "project": { "steps": ["echo hi"] } }),
    );
    let err = ConnectError::of(&resp);
    assert_eq!(err.code, "failed_precondition", "{resp}");
    let summary = close_as(&d, None, &id).json();
    assert_eq!(summary["ended"], "SESSION_END_BOUNDARY_FAILED", "{summary}");
}

/// Kills the session agent in `container` from outside. Root in a session container holds no
/// CAP_KILL: the agent's own uid ends it. (The pattern is split so that this shell's own
/// command line does not match it.)
pub(super) fn kill_agent(container: &str) {
    let find = r#"for p in /proc/[0-9]*; do case "$(tr '\0' ' ' <$p/cmdline 2>/dev/null)" in *"plimsoll-relay"" agent "*) while read -r k v rest; do [ "$k" = Uid: ] && echo "${p#/proc/} $v"; done <$p/status;; esac; done"#;
    let (ok, out) = docker(&["exec", "-u", "0:0", container, "sh", "-c", find]);
    let (pid, uid) = out
        .split_whitespace()
        .collect::<Vec<_>>()
        .chunks(2)
        .next()
        .and_then(|c| Some((c.first()?.to_string(), c.get(1)?.to_string())))
        .unwrap_or_default();
    assert!(ok && !pid.is_empty(), "the agent: {out}");
    let user = format!("{uid}:{uid}");
    let (ok, out) = docker(&["exec", "-u", &user, container, "kill", "-9", &pid]);
    assert!(ok, "{out}");
}
