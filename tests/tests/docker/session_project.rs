//! Project calls in a session (issue 15 item 2): each step is one `sh -c "<command>"` the
//! session's agent starts in `/work` with the guest's rights, as the one-shot runner's
//! two-shell step behaved; the agent's proof that a step cannot reach it is made once at open
//! and holds for every later call.

use super::session::{cell, close_as, open, session_run_as, sessions};
use super::*;

/// One project call that must be answered and completed; answers its report.
fn project(d: &Daemon, id: &str, steps: &[&str]) -> Value {
    let resp = session_run_as(d, None, id, json!({ "project": { "steps": steps } }));
    assert_eq!(resp.status, 200, "{resp}");
    resp.json()["run"]["project"].clone()
}

/// A snippet call that must be answered.
fn snippet(d: &Daemon, id: &str, code: &str) {
    let resp = session_run_as(d, None, id, json!({ "javascript": { "code": code } }));
    assert_eq!(resp.status, 200, "{code}: {resp}");
}

/// What a step sees of itself: `$0`, the argument count, its directory (by `pwd` and by
/// `$PWD`), `$OLDPWD` and `$SHLVL` as the runner's `cd /work; exec sh -c` step left them, and
/// whether its parent is the agent itself (no shell in between).
const SELF: &str = r#"echo "$0|$#|$(pwd)|$PWD|$OLDPWD|$SHLVL"; read -r _ _ _ ppid _ </proc/$$/stat; if [ "$ppid" = "$PLIMSOLL_RUNNER_PID" ]; then echo "started by the agent"; else echo "parent $ppid"; fi"#;

#[test]
fn a_step_is_one_shell_in_work_with_the_runners_step_environment() {
    require_docker!();
    let d = sessions();
    let (id, _) = open(&d, json!({}));
    let report = project(
        &d,
        &id,
        &[SELF, "cd /tmp && pwd", "pwd; exit 3", "echo never"],
    );
    assert_eq!(report["outcome"], "PROJECT_OUTCOME_COMPLETED", "{report}");
    let steps = report["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 3, "a failed step ends the call: {report}");
    assert_eq!(
        field(&steps[0], "stdout"),
        "sh|0|/work|/work|/|2\nstarted by the agent\n",
        "{report}"
    );
    // Each step starts afresh in /work.
    assert_eq!(field(&steps[1], "stdout"), "/tmp\n", "{report}");
    assert_eq!(field(&steps[2], "stdout"), "/work\n", "{report}");
    assert_eq!(steps[2]["exitCode"], 3, "{report}");
    assert_eq!(close_as(&d, None, &id).status, 200);
}

/// A `/work` the guest closed to itself: the step cannot enter it, ends 127 and says why as the
/// shell's `cd` did; nothing of the command runs.
#[test]
fn a_step_that_cannot_enter_work_ends_127_as_the_shell_did() {
    require_docker!();
    let d = sessions();
    let (id, _) = open(&d, json!({}));
    let report = project(&d, &id, &["chmod 000 /work", "echo ran"]);
    let steps = report["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 2, "{report}");
    assert_eq!(steps[1]["exitCode"], 127, "{report}");
    assert_eq!(field(&steps[1], "stdout"), "", "{report}");
    assert_eq!(
        field(&steps[1], "stderr"),
        "sh: cd: line 0: can't cd to /work: Permission denied\n",
        "{report}"
    );
    assert_eq!(close_as(&d, None, &id).status, 200);
}

/// What a step can do to the agent: its uid beside the agent's, whether the agent is
/// dumpable (the owner of its `mem`: root while it is not), its own capability sets, and
/// every `/proc` entry of the agent it managed to open.
const REACH: &str = r#"p=$PLIMSOLL_RUNNER_PID; echo "uid $(id -u)"; while read -r k v rest; do case "$k" in Uid:) echo "agent $v";; esac; done </proc/$p/status; echo "mem owner $(stat -c %u /proc/$p/mem)"; while read -r k v; do case "$k" in CapEff:|CapPrm:) echo "$k $v";; esac; done </proc/self/status; for f in fd/0 fd/1 fd/2 mem; do if true <"/proc/$p/$f" 2>/dev/null; then echo "opened $f"; fi; done; if true >>"/proc/$p/fd/1" 2>/dev/null; then echo "wrote fd/1"; fi"#;

fn assert_out_of_reach(report: &Value, when: &str) {
    assert_eq!(
        report["outcome"], "PROJECT_OUTCOME_COMPLETED",
        "{when}: {report}"
    );
    let seen = field(&report["steps"][0], "stdout");
    let value = |name: &str| {
        seen.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{when}: {name} in {seen}"))
            .to_owned()
    };
    assert_ne!(value("uid "), value("agent "), "{when}: {seen}");
    assert_eq!(
        value("mem owner "),
        "0",
        "{when}: the agent is dumpable: {seen}"
    );
    assert_eq!(value("CapEff: "), "0000000000000000", "{when}: {seen}");
    assert_eq!(value("CapPrm: "), "0000000000000000", "{when}: {seen}");
    assert!(
        !seen.contains("opened") && !seen.contains("wrote"),
        "{when}: a step reached the agent: {seen}"
    );
}

/// The agent proves once, at open, that a step cannot reach it; every call after relies on
/// that while the agent's credentials and dumpability stay as they were. They do: after
/// sweeps that killed a guest process (the agent's effective-uid switch), cells, a hold and
/// its release, a step still finds the agent non-dumpable, under another uid, with nothing
/// of it to open and no capability of its own.
#[test]
fn steps_stay_out_of_the_agents_reach_for_the_session_s_life() {
    require_docker!();
    let d = sessions();
    let (id, _) = open(&d, json!({ "languages": ["python"] }));
    assert_out_of_reach(&project(&d, &id, &[REACH]), "first call");
    let warm = cell(&d, &id, "python", "n = 1; n");
    assert_eq!(field(&warm, "stdout"), "1\n", "{warm}");
    for round in 0..2 {
        // Left running: the sweep after this call kills it as the guest.
        snippet(
            &d,
            &id,
            "require('child_process').spawn('sleep', ['600'], { detached: true, stdio: 'ignore' }).unref()",
        );
        let report = project(&d, &id, &[REACH, "sleep 600 & echo started"]);
        assert_out_of_reach(&report, &format!("round {round}"));
        let kept = cell(&d, &id, "python", "n += 1; n");
        assert_eq!(kept["interpreterStarted"].as_bool(), None, "{kept}");
        assert_eq!(field(&kept, "stdout"), format!("{}\n", round + 2), "{kept}");
    }
    assert_eq!(close_as(&d, None, &id).status, 200);
}
