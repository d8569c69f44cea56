//! The session call path's benchmark (issue 15 item 2): calls back to back through the
//! session's agent, beside `docker exec <container> true` on a container of the same image
//! and runtime, interleaved in one run. Not a timed test: it prints p50/p95 and the ratios.
//!
//! Three phases. Back to back: per kind, blocks of [`BLOCK`] `docker exec` calls then
//! `BLOCK + 1` session calls of that kind, each sent as soon as the previous one answered; the
//! first of each block follows the exec calls' pause and is not counted. Mixed rounds: a
//! snippet, a project call and a cell in turn, as an agent alternating them would send them
//! (here work a call leaves running in the background, such as the next snippet's node
//! starting, lands on the next call of another kind). 1 s apart: snippets as an agent that
//! thinks between its calls sends them.

use std::time::Instant;

use serde_json::{Value, json};

use super::session::{cell, close_as, open, session_run_as};
use super::session_pool::{baseline_container, sorted_percentile};
use super::{Daemon, docker, docker_ready, env_with, field, stop};

/// A project call shaped like the published client's `Workspace.exec("echo hi")`: the command
/// in a state file, one step that restores and saves the shell's directory, two artifacts.
fn workspace_exec_shaped() -> Value {
    json!({ "project": {
        "files": [{ "path": ".bench/cmd", "content": "echo hi\n" }],
        "steps": ["s=/work/.bench; pwd > $s/root; [ -f $s/cwd ] && cd \"$(cat $s/cwd)\"; . $s/cmd; rc=$?; pwd > $s/cwd; exit $rc"],
        "artifacts": [".bench/root", ".bench/cwd"],
    }})
}

fn timed(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1000.0
}

/// One `docker exec <baseline> true`, timed.
fn exec_true(baseline: &str) -> f64 {
    timed(|| {
        let (ok, out) = docker(&["exec", baseline, "true"]);
        assert!(ok, "{out}");
    })
}

/// Session calls per block of the back-to-back phase (and `docker exec` calls beside them).
const BLOCK: usize = 5;

/// Times `n` back-to-back calls of one kind, in blocks, and as many `docker exec <baseline>
/// true` beside them (pushed onto `exec_ms`). One warm-up block is not counted.
fn back_to_back(n: usize, baseline: &str, exec_ms: &mut Vec<f64>, call: &dyn Fn()) -> Vec<f64> {
    let mut ms = Vec::new();
    for block in 0..=n.div_ceil(BLOCK) {
        for _ in 0..BLOCK {
            let e = exec_true(baseline);
            if block > 0 {
                exec_ms.push(e);
            }
        }
        call();
        for _ in 0..BLOCK {
            let t = timed(call);
            if block > 0 {
                ms.push(t);
            }
        }
    }
    ms
}

/// Snippet, `Workspace.exec`-shaped project call and warm python cell, each back to back,
/// then in mixed rounds, against `docker exec true`. `PLIMSOLL_BENCH_N` sets the calls per
/// kind and phase (default 30).
#[test]
#[ignore = "benchmark: scripts/bench-session-calls"]
fn bench_session_calls_back_to_back() {
    require_docker!();
    let n = plimsoll_tests::bench_n(30);
    let d = Daemon::start(&env_with(&[("SANDBOX_MAX_SESSIONS", "2")]));
    let baseline = baseline_container();
    let (id, _) = open(&d, json!({ "languages": ["python"] }));
    let warm = cell(&d, &id, "python", "6 * 7");
    assert_eq!(field(&warm, "stdout"), "42\n", "{warm}");
    let snippet = || {
        let resp = session_run_as(&d, None, &id, json!({ "javascript": { "code": "1" } }));
        assert_eq!(resp.status, 200, "{resp}");
    };
    let project = || {
        let resp = session_run_as(&d, None, &id, workspace_exec_shaped());
        assert_eq!(resp.status, 200, "{resp}");
        let report = &resp.json()["run"]["project"];
        assert_eq!(field(&report["steps"][0], "stdout"), "hi\n", "{report}");
    };
    let python = || {
        let ran = cell(&d, &id, "python", "6 * 7");
        assert_eq!(field(&ran, "stdout"), "42\n", "{ran}");
    };
    let kinds: [(&str, &dyn Fn()); 3] = [
        ("session snippet call", &snippet),
        ("Workspace.exec-shaped project call", &project),
        ("warm python cell", &python),
    ];
    let mut exec_ms = Vec::new();
    let mut phases: Vec<(&str, &str, Vec<f64>)> = Vec::new();
    for (what, call) in kinds {
        let ms = back_to_back(n, &baseline, &mut exec_ms, call);
        phases.push(("back to back", what, ms));
    }
    let mut mixed = [Vec::new(), Vec::new(), Vec::new()];
    for i in 0..=n {
        let e = exec_true(&baseline);
        let times = kinds.map(|(_, call)| timed(call));
        // The first round warms caches and is not counted.
        if i > 0 {
            exec_ms.push(e);
            for (v, t) in mixed.iter_mut().zip(times) {
                v.push(t);
            }
        }
    }
    for ((what, _), ms) in kinds.iter().zip(mixed) {
        phases.push(("mixed rounds", what, ms));
    }
    // As an agent that thinks between calls sends them: each snippet a second after the
    // previous answer (a third as many, at least 10).
    let mut paused = Vec::new();
    for i in 0..=(n / 3).max(10) {
        std::thread::sleep(std::time::Duration::from_secs(1));
        let t = timed(snippet);
        if i > 0 {
            paused.push(t);
        }
    }
    phases.push(("1 s apart", "session snippet call", paused));
    assert_eq!(close_as(&d, None, &id).status, 200);
    let (ok, out) = docker(&["rm", "-f", &baseline]);
    assert!(ok, "{out}");
    stop(d);
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (sorted_percentile(v, 50.0), sorted_percentile(v, 95.0))
    };
    let (e50, e95) = stats(&mut exec_ms);
    println!(
        "bench session calls {} n={n}: docker exec true p50 {e50:.1} ms p95 {e95:.1} ms",
        super::runtime()
    );
    for (phase, what, mut v) in phases {
        let (p50, p95) = stats(&mut v);
        println!(
            "bench session calls {}: {phase}, {what} p50 {p50:.1} ms p95 {p95:.1} ms | /exec p50 {:.2} p95 {:.2}",
            super::runtime(),
            p50 / e50,
            p95 / e95,
        );
    }
}
