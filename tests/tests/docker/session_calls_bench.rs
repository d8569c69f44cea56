//! The session call path's benchmark (issue 15 item 2): calls back to back through the
//! session's agent, beside `docker exec <container> true` on a container of the same image
//! and runtime, interleaved in one run. Not a timed test: it prints p50/p95 and the ratios.

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

/// Snippet, `Workspace.exec`-shaped project call and warm python cell, each back to back,
/// against `docker exec true`. `PLIMSOLL_BENCH_N` sets the calls per kind (default 30).
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
    let (mut exec_ms, mut snippet_ms, mut project_ms, mut cell_ms) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..=n {
        let e = timed(|| {
            let (ok, out) = docker(&["exec", &baseline, "true"]);
            assert!(ok, "{out}");
        });
        let s = timed(|| {
            let resp = session_run_as(&d, None, &id, json!({ "javascript": { "code": "1" } }));
            assert_eq!(resp.status, 200, "{resp}");
        });
        let p = timed(|| {
            let resp = session_run_as(&d, None, &id, workspace_exec_shaped());
            assert_eq!(resp.status, 200, "{resp}");
            let report = &resp.json()["run"]["project"];
            assert_eq!(field(&report["steps"][0], "stdout"), "hi\n", "{report}");
        });
        let c = timed(|| {
            let ran = cell(&d, &id, "python", "6 * 7");
            assert_eq!(field(&ran, "stdout"), "42\n", "{ran}");
        });
        // The first round warms caches and is not counted.
        if i > 0 {
            exec_ms.push(e);
            snippet_ms.push(s);
            project_ms.push(p);
            cell_ms.push(c);
        }
    }
    assert_eq!(close_as(&d, None, &id).status, 200);
    let (ok, out) = docker(&["rm", "-f", &baseline]);
    assert!(ok, "{out}");
    stop(d);
    for v in [&mut exec_ms, &mut snippet_ms, &mut project_ms, &mut cell_ms] {
        v.sort_by(f64::total_cmp);
    }
    let stats = |v: &[f64]| (sorted_percentile(v, 50.0), sorted_percentile(v, 95.0));
    let (e50, e95) = stats(&exec_ms);
    println!(
        "bench session calls {} n={n}: docker exec true p50 {e50:.1} ms p95 {e95:.1} ms",
        super::runtime()
    );
    for (what, v) in [
        ("session snippet call", &snippet_ms),
        ("Workspace.exec-shaped project call", &project_ms),
        ("warm python cell", &cell_ms),
    ] {
        let (p50, p95) = stats(v);
        println!(
            "bench session calls {}: {what} p50 {p50:.1} ms p95 {p95:.1} ms | /exec p50 {:.2} p95 {:.2}",
            super::runtime(),
            p50 / e50,
            p95 / e95,
        );
    }
}
