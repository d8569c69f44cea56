//! How snippets and projects end in a sandbox made for each run, the same on every provider of
//! one (e2b, dockercloud, openshell): an exit, a deadline, an output flood, a project's steps,
//! files and artifacts, a failing step, a project past its budget and a sandbox lost while a step
//! runs (included by path, beside `verified.rs`).

use std::time::{Duration, Instant};

use plimsoll_tests::Daemon;
use plimsoll_tests::connect;
use plimsoll_tests::sim::{field, snippet};
use serde_json::json;

use super::verified::answered_at;

/// Asserts every ending at tier `isolation`; each step runs in `project_dir`.
pub fn snippet_and_project_endings(d: &Daemon, isolation: &str, project_dir: &str) {
    let answered = |body: &serde_json::Value| answered_at(d, body, isolation);

    // A non-zero exit is a result.
    let v = answered(&snippet("process.exit(3)", 20_000));
    assert_eq!(v["javascript"]["exitCode"], 3, "{v}");

    // The deadline ends the code and the answer says so.
    let started = Instant::now();
    let v = answered(&snippet("for(;;){}", 2_000));
    assert_eq!(v["javascript"]["timedOut"], true, "{v}");
    assert_eq!(v["javascript"]["exitCode"], 124, "{v}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the deadline was not enforced: {:?}",
        started.elapsed()
    );

    // An output flood is cut at the cap and flagged, on each stream. One stream a snippet: a
    // provider may cap a stream by closing it (dockercloud's wrapper, `head -c`), and the code
    // may then die of the broken pipe before it writes to the other one.
    for (stream, flood) in [
        ("stdout", "process.stdout.write('x'.repeat(1 << 20))"),
        ("stderr", "process.stderr.write('e'.repeat(200000))"),
    ] {
        let v = answered(&snippet(flood, 20_000));
        let js = &v["javascript"];
        assert_eq!(js[format!("{stream}Truncated")], true, "{stream}: {v}");
        assert_eq!(field(js, stream).len(), 64 * 1024, "{stream}");
    }

    // A project: nested files (an upload may make no parents), steps in the project
    // directory, an artifact (an absent one is left out).
    let mut body = connect::project(
        &[
            ("main.js", "console.log(require('./lib/deep/answer.js'))"),
            ("lib/deep/answer.js", "module.exports = 42"),
        ],
        &[
            "node main.js > out.txt",
            "cat out.txt && pwd",
            "python3 -c 'print(7*6)'",
        ],
    );
    body["project"]["artifacts"] = json!(["out.txt", "absent.txt"]);
    body["timeoutMs"] = json!(60_000);
    let v = answered(&body);
    assert_eq!(v["project"]["outcome"], "PROJECT_OUTCOME_COMPLETED", "{v}");
    let steps = v["project"]["steps"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(steps.len(), 3, "{v}");
    assert_eq!(
        field(&steps[1], "stdout"),
        format!("42\n{project_dir}\n"),
        "{v}"
    );
    assert_eq!(field(&steps[2], "stdout"), "42\n", "{v}");
    let artifacts = v["project"]["artifacts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(artifacts.len(), 1, "an absent artifact is left out: {v}");
    assert_eq!(artifacts[0]["path"], "out.txt", "{v}");
    assert_eq!(field(&artifacts[0], "content"), "42\n");

    // A failing step stops the project, which still completed; so does a step killed by a
    // signal in a sandbox that lives on, with its own exit.
    for (first, exit) in [("exit 7", 7), ("sh -c 'kill -9 $$'", 137)] {
        let v = answered(&connect::project(&[], &[first, "echo never"]));
        assert_eq!(v["project"]["outcome"], "PROJECT_OUTCOME_COMPLETED", "{v}");
        let steps = v["project"]["steps"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(steps.len(), 1, "the second step must not run: {v}");
        assert_eq!(steps[0]["exitCode"], exit, "{v}");
    }

    // A step past the budget times the project out.
    let mut body = connect::project(&[], &["sleep 30", "echo never"]);
    // Enough for staging under load, so that the step itself is what the budget ends.
    body["timeoutMs"] = json!(8_000);
    let v = answered(&body);
    assert_eq!(v["project"]["outcome"], "PROJECT_OUTCOME_TIMED_OUT", "{v}");
    assert_eq!(v["project"]["steps"][0]["timedOut"], true, "{v}");
}

/// A sandbox that dies while a step runs: the project's answer is `runner_failed` (code ran,
/// its effects unknown), naming the step, with a record that verifies. `containers()` lists
/// the local containers behind the provider's sandboxes; the one whose project directory
/// shows the step began is killed from outside, as a host failure would end it.
pub fn a_sandbox_lost_mid_step(
    d: &Daemon,
    isolation: &str,
    project_dir: &str,
    containers: impl Fn() -> Vec<String>,
) {
    use plimsoll_tests::docker::docker;

    let mut body = connect::project(&[], &["echo began > began && sleep 60", "echo never"]);
    body["timeoutMs"] = json!(90_000);
    let began = format!("{project_dir}/began");
    let v = std::thread::scope(|s| {
        let run = s.spawn(|| answered_at(d, &body, isolation));
        let deadline = Instant::now() + Duration::from_secs(45);
        let victim = loop {
            let found = containers()
                .into_iter()
                .find(|c| docker(&["exec", c, "test", "-e", &began]).0);
            if let Some(c) = found {
                break c;
            }
            assert!(
                Instant::now() < deadline && !run.is_finished(),
                "no sandbox showed the step began"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        let (killed, why) = docker(&["kill", &victim]);
        assert!(killed, "docker kill {victim}: {why}");
        run.join().expect("the run's thread")
    });
    let project = &v["project"];
    assert_eq!(project["outcome"], "PROJECT_OUTCOME_RUNNER_FAILED", "{v}");
    let detail = project["outcomeDetail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("after step 1 began") && detail.contains("effects are unknown"),
        "{v}"
    );
}
