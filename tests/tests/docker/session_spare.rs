//! The node a session's agent starts ahead for the next snippet (issue 15 item 2): the next
//! ungranted snippet runs on it, it is a fresh process that carries nothing of earlier calls,
//! no guest process can write what it will run or read its memory, and one that was tampered
//! with is never used. Under runc two are kept ahead, started beside the call from a copy of
//! node the guest cannot read (so never dumpable, even while the call's code runs); under
//! runsc one starts once the session is idle after the sweep. After a pause a project call's
//! step finds the oldest.

use super::session::{cell, close_as, open, session_run_as, sessions};
use super::*;

/// A project step's program: waits (up to 4 s) for a `node -` of the guest and takes the
/// oldest, the next snippet's node; prints its pid and, with an argument, what each attempt
/// on it came to.
const FIND_AND_ATTACK: &str = r#"
const fs = require('fs'), cp = require('child_process');
const node = (p) => { try { return fs.readFileSync(`/proc/${p}/cmdline`, 'latin1') === 'node\u0000-\u0000'; } catch { return false; } };
const waiting = () => fs.readdirSync('/proc').filter((p) => /^[0-9]+$/.test(p) && node(p)).map(Number);
let spare = 0;
for (let i = 0; i < 200 && !spare; i++) {
  // The oldest (lowest pid: nothing here runs long enough for pids to wrap) serves next.
  const all = waiting();
  spare = all.length ? Math.min(...all) : 0;
  if (!spare) cp.execSync('sleep 0.02');
}
const r = { spare };
const attempt = (name, f) => { try { f(); r[name] = 'done'; } catch (e) { r[name] = e.code || String(e); } };
if (spare) {
  attempt('stdin', () => fs.writeFileSync(`/proc/${spare}/fd/0`, 'console.log("INJECTED-STDIN")\n'));
  attempt('mem', () => fs.closeSync(fs.openSync(`/proc/${spare}/mem`, 'r+')));
}
if (spare && process.argv[2] === 'attack') {
  attempt('stdout', () => fs.writeFileSync(`/proc/${spare}/fd/1`, 'INJECTED-STDOUT\n'));
  attempt('nice', () => require('os').setPriority(spare, 19));
  attempt('stop', () => process.kill(spare, 'SIGSTOP'));
}
console.log(JSON.stringify(r));
"#;

/// What the next snippet says of itself: its pid, a global of the earlier call, the guard's
/// preload in its environment, and whether a process it starts can open its memory.
const WHO_AM_I: &str = r#"
const r = require('child_process').spawnSync('sh', ['-c', `true < /proc/${process.pid}/mem`]);
console.log(JSON.stringify({ pid: process.pid, leak: typeof globalThis.leak, preload: process.env.LD_PRELOAD || null, memOpened: r.status === 0 }));
"#;

fn snippet_json(d: &Daemon, id: &str, code: &str) -> Value {
    let resp = session_run_as(d, None, id, json!({ "javascript": { "code": code } }));
    assert_eq!(resp.status, 200, "{resp}");
    let run = &resp.json()["run"]["javascript"];
    assert_eq!(run["exitCode"].as_i64().unwrap_or(0), 0, "{run}");
    let out = field(run, "stdout");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("one JSON line ({e}): {run}"))
}

/// A snippet, a pause, then a project step that finds the next snippet's node (and with
/// `attack`, tampers with it): the step's report. Neither what node will run (a socket) nor
/// its memory (non-dumpable) can be reached, with or without Yama.
fn snippet_then_find(d: &Daemon, id: &str, attack: bool) -> Value {
    let first = snippet_json(d, id, "globalThis.leak = 'A'; console.log('{}')");
    assert_eq!(first, json!({}));
    std::thread::sleep(Duration::from_millis(400));
    let step = if attack {
        "node .spare/find.js attack"
    } else {
        "node .spare/find.js"
    };
    let project = session_run_as(
        d,
        None,
        id,
        json!({ "project": {
            "files": [{ "path": ".spare/find.js", "content": FIND_AND_ATTACK }],
            "steps": [step],
        }}),
    );
    assert_eq!(project.status, 200, "{project}");
    let report = &project.json()["run"]["project"];
    let out = field(&report["steps"][0], "stdout");
    let seen: Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("one JSON line ({e}): {report}"));
    assert_ne!(
        seen["spare"].as_u64().unwrap_or(0),
        0,
        "a node waits: {seen}"
    );
    for attempt in ["stdin", "mem"] {
        let got = seen[attempt].as_str().unwrap_or("?");
        assert!(
            ["ENXIO", "EACCES", "EPERM"].contains(&got),
            "{attempt} came to {got}: {seen}"
        );
    }
    seen
}

#[test]
fn the_next_snippet_runs_on_the_node_started_ahead_fresh_and_sealed() {
    require_docker!();
    let d = sessions();
    // A kept interpreter is held stopped while each spare starts, then goes on.
    let (id, _) = open(&d, json!({ "languages": ["python"] }));
    let kept = cell(&d, &id, "python", "kept = 6 * 7\nprint(kept)");
    assert_eq!(field(&kept, "stdout"), "42\n", "{kept}");
    for _ in 0..2 {
        let seen = snippet_then_find(&d, &id, false);
        let next = snippet_json(&d, &id, WHO_AM_I);
        assert_eq!(next["pid"], seen["spare"], "{seen} then {next}");
        assert_eq!(next["leak"], "undefined", "{next}");
        assert_eq!(next["preload"], Value::Null, "{next}");
        assert_eq!(next["memOpened"], false, "{next}");
    }
    let kept = cell(&d, &id, "python", "print(kept)");
    assert_eq!(field(&kept, "stdout"), "42\n", "{kept}");
    assert_eq!(kept["interpreterStarted"].as_bool(), None, "{kept}");
    assert_eq!(close_as(&d, None, &id).status, 200);
}

#[test]
fn a_snippet_cannot_shape_what_the_next_one_runs_or_prints() {
    require_docker!();
    let d = sessions();
    let (id, _) = open(&d, json!({}));
    let seen = snippet_then_find(&d, &id, true);
    // Its output pipe (where /proc lets a guest open it), its priority and its run state may
    // have been touched: such a node is not used, and the next snippet prints exactly its own.
    let resp = session_run_as(
        &d,
        None,
        &id,
        json!({ "javascript": { "code": "console.log('second ' + process.pid)" } }),
    );
    assert_eq!(resp.status, 200, "{resp}");
    let run = &resp.json()["run"]["javascript"];
    let out = field(run, "stdout");
    assert_eq!(run["exitCode"].as_i64().unwrap_or(0), 0, "{run}");
    assert_ne!(run["timedOut"], true, "{run}");
    assert!(!out.contains("INJECTED"), "{run}");
    let pid = out
        .strip_prefix("second ")
        .and_then(|p| p.trim_end().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("exactly its own line: {run}"));
    // A stopped node is resumed and may serve; one whose output or priority was changed
    // never does.
    if seen["stdout"] == "done" || seen["nice"] == "done" {
        assert_ne!(
            Some(pid),
            seen["spare"].as_u64(),
            "the touched node was used: {run}"
        );
    }
    assert_eq!(field(run, "stderr"), "", "{run}");
    assert_eq!(close_as(&d, None, &id).status, 200);
}

/// Code near the largest a call may carry (256 KiB) is more than a socket buffer takes at
/// once: the rest is written while node reads, on a fresh node and on one started ahead.
#[test]
fn a_snippet_larger_than_the_sockets_buffer_runs_whole() {
    require_docker!();
    let d = sessions();
    let (id, _) = open(&d, json!({}));
    let filler = "x".repeat(250 * 1024);
    let code =
        format!("const s = '{filler}';\nconsole.log(JSON.stringify({{ length: s.length }}))");
    for _ in 0..3 {
        let ran = snippet_json(&d, &id, &code);
        assert_eq!(ran["length"].as_u64(), Some(250 * 1024), "{ran}");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(close_as(&d, None, &id).status, 200);
}

/// What a snippet's own code sees of the nodes started while it runs: for up to 2 s, every
/// other `node -` of the guest, the owner of its `/proc` entries at first sight, and whether
/// its memory or environment opens.
const WATCH_BESIDE: &str = r#"
const fs = require('fs'), cp = require('child_process');
const node = (p) => { try { return fs.readFileSync(`/proc/${p}/cmdline`, 'latin1') === 'node\u0000-\u0000'; } catch { return false; } };
const seen = {};
const until = Date.now() + 2000;
while (Date.now() < until && Object.keys(seen).length < 2) {
  for (const p of fs.readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(p) || Number(p) === process.pid || seen[p] || !node(p)) continue;
    const r = { owner: (() => { try { return fs.statSync(`/proc/${p}/status`).uid; } catch (e) { return e.code; } })() };
    const attempt = (name, f) => { try { f(); r[name] = 'done'; } catch (e) { r[name] = e.code || String(e); } };
    attempt('mem', () => fs.closeSync(fs.openSync(`/proc/${p}/mem`, 'r')));
    attempt('environ', () => fs.readFileSync(`/proc/${p}/environ`));
    seen[p] = r;
  }
  cp.execSync('sleep 0.01');
}
console.log(JSON.stringify(Object.values(seen)));
"#;

/// Runs [`WATCH_BESIDE`] as a snippet: what its code saw of each node started beside it.
fn nodes_seen_beside(d: &Daemon, id: &str) -> Vec<Value> {
    match snippet_json(d, id, WATCH_BESIDE) {
        Value::Array(nodes) => nodes,
        other => panic!("a list of the nodes seen: {other}"),
    }
}

/// Under runc the next snippets' nodes start while this snippet's code runs, and that code
/// finds each already sealed: root's `/proc` entries, memory and environment closed, from
/// the first moment it can see them. Under runsc none starts beside running code.
#[test]
fn nodes_started_beside_a_running_snippet_are_sealed_from_their_start() {
    require_docker!();
    let d = sessions();
    let (id, _) = open(&d, json!({}));
    let seen = nodes_seen_beside(&d, &id);
    if runtime() == "runsc" {
        assert!(
            seen.is_empty(),
            "no node starts beside code under runsc: {seen:?}"
        );
    } else {
        assert_eq!(seen.len(), 2, "two nodes started beside the call: {seen:?}");
        for node in &seen {
            assert_eq!(node["owner"], 0, "{seen:?}");
            for attempt in ["mem", "environ"] {
                let got = node[attempt].as_str().unwrap_or("?");
                assert!(["EACCES", "EPERM"].contains(&got), "{attempt}: {seen:?}");
            }
        }
    }
    assert_eq!(close_as(&d, None, &id).status, 200);
}

/// A node that cannot start at all (the guest closed /work to itself, so node's change into it
/// fails) does not end the nodes kept ahead for later calls, as a node that started unsealed
/// would: once /work is open again, the next snippet's own code sees two more start beside it
/// (runc). Under runsc none starts beside code, before or after.
#[test]
fn a_node_that_cannot_start_does_not_end_the_nodes_kept_ahead() {
    require_docker!();
    let d = sessions();
    let (id, _) = open(&d, json!({}));
    assert_eq!(snippet_json(&d, &id, "console.log('{}')"), json!({}));
    let closed = cell(
        &d,
        &id,
        "python",
        "import os; os.chmod('/work', 0); oct(os.stat('/work').st_mode & 0o777)",
    );
    assert_eq!(field(&closed, "stdout"), "'0o0'\n", "{closed}");
    // Under runc this runs on a node started ahead while /work was open; the top-up beside it
    // cannot start (under runsc the node started after the last sweep serves it, or, if none
    // waited, its own start fails: either answer is fine here, the session must go on).
    let beside = session_run_as(
        &d,
        None,
        &id,
        json!({ "javascript": { "code": "console.log('{}')" } }),
    );
    assert_eq!(beside.status, 200, "{beside}");
    if runtime() != "runsc" {
        assert_eq!(
            field(&beside.json()["run"]["javascript"], "stdout"),
            "{}\n",
            "{beside}"
        );
    }
    let opened = cell(&d, &id, "python", "os.chmod('/work', 0o755)");
    assert_eq!(opened["exitCode"].as_i64().unwrap_or(0), 0, "{opened}");
    let seen = nodes_seen_beside(&d, &id);
    let expected = if runtime() == "runsc" { 0 } else { 2 };
    assert_eq!(
        seen.len(),
        expected,
        "nodes started beside the call: {seen:?}"
    );
    for node in &seen {
        assert_eq!(node["owner"], 0, "{seen:?}");
    }
    assert_eq!(close_as(&d, None, &id).status, 200);
}
