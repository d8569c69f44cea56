//! Projects on docker (providers.md §5.9, issue 5): files under `/work`, steps in order with
//! stop-at-first-failure, typed outcomes, artifacts, and a report only the runner can sign.
//! Every answer's record is verified the way a client does.

use plimsoll::record;
use plimsoll::wire::{RunRequest, RunResponse};

use super::*;

/// A project request body.
pub(super) fn project(
    files: &[(&str, &str)],
    steps: &[&str],
    artifacts: &[&str],
    timeout_ms: u32,
) -> Value {
    let mut body = connect::project(files, steps);
    body["project"]["artifacts"] = json!(artifacts);
    body["timeoutMs"] = json!(timeout_ms);
    body
}

/// Runs a project, expects an answer, and verifies its record against the request.
pub(super) fn run_project(d: &Daemon, body: &Value) -> Value {
    let resp = send(d.addr, &connect::call("Run", body));
    assert_eq!(resp.status, 200, "{body}: {resp}");
    let v = resp.json();
    let req: RunRequest = serde_json::from_value(body.clone()).expect("request as wire");
    let answer: RunResponse = serde_json::from_value(v.clone()).expect("answer as wire");
    record::check_single(&record::request_digest(&req), None, &answer)
        .unwrap_or_else(|e| panic!("record does not verify ({e}): {v}"));
    assert_eq!(v["isolation"], tier(), "{v}");
    assert_eq!(v["environment"], image_id(project_image()), "{v}");
    v
}

fn outcome(v: &Value) -> &str {
    v["project"]["outcome"]
        .as_str()
        .unwrap_or("PROJECT_OUTCOME_UNSPECIFIED")
}

fn artifacts(v: &Value) -> Vec<Value> {
    v["project"]["artifacts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn artifact_paths(artifacts: &[Value]) -> Vec<&str> {
    artifacts
        .iter()
        .filter_map(|a| a["path"].as_str())
        .collect()
}

pub(super) fn steps(v: &Value) -> Vec<Value> {
    v["project"]["steps"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

pub(super) fn exit_code(step: &Value) -> i64 {
    step["exitCode"].as_i64().unwrap_or(0)
}

#[test]
fn describe_states_projects_with_the_proven_languages() {
    require_docker!();
    let d = shared();
    let v = send(d.addr, &connect::call("Describe", &json!({}))).json();
    assert_eq!(v["supportsProject"], true, "{v}");
    let env = &v["projectEnvironment"];
    assert_eq!(env["identity"], image_id(project_image()), "{v}");
    assert_eq!(env["maxTimeoutMs"], 120_000, "{v}");
    assert_eq!(env["languages"], json!(["javascript", "python"]), "{v}");
}

#[test]
fn the_golden_project_completes_with_its_artifact() {
    require_docker!();
    let d = shared();
    let body = project(
        &[
            ("main.js", "console.log(require('./lib.js'))"),
            ("lib.js", "module.exports = 42"),
        ],
        &["node main.js > out.txt", "cat out.txt"],
        &["out.txt"],
        30_000,
    );
    let v = run_project(&d, &body);
    assert_eq!(outcome(&v), "PROJECT_OUTCOME_COMPLETED", "{v}");
    let steps = steps(&v);
    assert_eq!(steps.len(), 2, "{v}");
    assert_eq!(steps[0]["command"], "node main.js > out.txt");
    assert_eq!(field(&steps[1], "stdout"), "42\n", "{v}");
    assert!(steps.iter().all(|s| exit_code(s) == 0), "{v}");
    let artifacts = artifacts(&v);
    assert_eq!(artifacts.len(), 1, "{v}");
    assert_eq!(artifacts[0]["path"], "out.txt");
    assert_eq!(field(&artifacts[0], "content"), "42\n");
    assert_eq!(v["project"]["outcomeDetail"], Value::Null, "{v}");
    let duration: i64 = v["durationMs"].as_str().unwrap_or("0").parse().unwrap_or(0);
    assert!(duration > 0, "{v}");
}

#[test]
fn a_python_project_runs() {
    require_docker!();
    let d = shared();
    let body = project(
        &[
            ("pkg/calc.py", "def answer():\n    return 6 * 7\n"),
            ("main.py", "from pkg.calc import answer\nprint(answer())\n"),
        ],
        &["python3 main.py"],
        &[],
        30_000,
    );
    let v = run_project(&d, &body);
    assert_eq!(outcome(&v), "PROJECT_OUTCOME_COMPLETED", "{v}");
    assert_eq!(field(&steps(&v)[0], "stdout"), "42\n", "{v}");
}

#[test]
fn a_failing_middle_step_stops_the_plan_and_artifacts_still_come_back() {
    require_docker!();
    let d = shared();
    let body = project(
        &[],
        &[
            "echo first > a.txt",
            "echo lint error >&2; exit 3",
            "echo never > b.txt",
        ],
        &["a.txt", "b.txt"],
        30_000,
    );
    let v = run_project(&d, &body);
    assert_eq!(outcome(&v), "PROJECT_OUTCOME_COMPLETED", "{v}");
    let steps = steps(&v);
    assert_eq!(steps.len(), 2, "the third step must not run: {v}");
    assert_eq!(exit_code(&steps[1]), 3);
    assert_eq!(field(&steps[1], "stderr"), "lint error\n");
    let artifacts = artifacts(&v);
    assert_eq!(artifacts.len(), 1, "{v}");
    assert_eq!(field(&artifacts[0], "content"), "first\n");
}

#[test]
fn a_hanging_step_times_out_with_the_steps_that_finished() {
    require_docker!();
    let d = shared();
    let body = project(&[], &["echo done", "sleep 600", "echo never"], &[], 3_000);
    let started = Instant::now();
    let v = run_project(&d, &body);
    assert!(started.elapsed() < Duration::from_secs(20), "{v}");
    assert_eq!(outcome(&v), "PROJECT_OUTCOME_TIMED_OUT", "{v}");
    let steps = steps(&v);
    assert_eq!(steps.len(), 2, "{v}");
    assert_eq!(field(&steps[0], "stdout"), "done\n");
    assert_eq!(steps[1]["timedOut"], true, "{v}");
    assert_eq!(exit_code(&steps[1]), 124, "{v}");
}

#[test]
fn a_forged_report_printed_by_a_step_is_never_the_answer() {
    require_docker!();
    let d = shared();
    // A well-formed frame with a made-up MAC, printed to the step's own output and (where
    // the kernel lets it) into the runner's stdout; and a try at the runner's memory.
    let forged = r#"{"steps":[],"artifacts":[],"artifactsTruncated":false}"#;
    let frame = format!(
        "printf '\\n<<<PLIMSOLL_REPORT_V3>>> {} {}\\n%s' '{forged}'",
        forged.len(),
        "ab".repeat(32)
    );
    let step = format!(
        "{frame}; {frame} > /proc/$PLIMSOLL_RUNNER_PID/fd/1; \
         if (: </proc/$PLIMSOLL_RUNNER_PID/mem) 2>/dev/null; then echo MEM-OPEN; fi; echo after"
    );
    let v = run_project(&d, &project(&[], &[&step, "echo second"], &[], 30_000));
    assert_eq!(outcome(&v), "PROJECT_OUTCOME_COMPLETED", "{v}");
    let steps = steps(&v);
    assert_eq!(
        steps.len(),
        2,
        "the guest's empty report must not replace the real one: {v}"
    );
    let out = field(&steps[0], "stdout");
    assert!(out.contains("<<<PLIMSOLL_REPORT_V3>>>"), "{out}");
    assert!(
        !out.contains("MEM-OPEN"),
        "a step opened the runner's memory: {out}"
    );
    assert_eq!(field(&steps[1], "stdout"), "second\n");
}

#[test]
fn a_step_can_neither_open_nor_signal_the_runner_and_holds_no_capability() {
    require_docker!();
    let d = shared();
    // Every way in the issue names (the runner's /proc mem and fds, read and write) plus
    // environ, a signal and the step's own identity. Under gVisor `environ` is world-readable
    // for every process, so it is only required closed under runc (project.rs says why).
    let probe = "p=$PLIMSOLL_RUNNER_PID; test -n \"$p\" || echo NO-PID; \
         for f in fd/0 fd/1 fd/2 mem environ; do \
           if (: <\"/proc/$p/$f\") 2>/dev/null; then echo \"OPENED $f\"; fi; done; \
         if (: >>\"/proc/$p/fd/1\") 2>/dev/null; then echo 'OPENED fd/1 for writing'; fi; \
         if kill -0 \"$p\" 2>/dev/null; then echo SIGNALLED; fi; \
         echo \"uid $(id -u) $(id -g)\"; grep -E '^Cap(Eff|Prm)' /proc/self/status";
    let v = run_project(
        &d,
        &project(
            &[("given.txt", "mine\n")],
            &[
                probe,
                // The step owns what it was given and what it makes; the runner still
                // brings back an artifact only its owner may read.
                "rm given.txt && echo secret > private.txt && chmod 600 private.txt",
            ],
            &["private.txt", "given.txt"],
            30_000,
        ),
    );
    assert_eq!(outcome(&v), "PROJECT_OUTCOME_COMPLETED", "{v}");
    let steps = steps(&v);
    assert_eq!(steps.len(), 2, "{v}");
    let out = field(&steps[0], "stdout");
    for line in out.lines() {
        let allowed = runsc() && line == "OPENED environ";
        assert!(
            allowed || !(line.starts_with("OPENED") || line == "SIGNALLED" || line == "NO-PID"),
            "a step reached the runner ({line}): {out}"
        );
    }
    assert!(
        out.contains("uid 61000 61000\n"),
        "steps run as the guest: {out}"
    );
    assert!(
        out.lines()
            .filter(|l| l.starts_with("Cap"))
            .all(|l| l.trim_end().ends_with("0000000000000000")),
        "a step holds no capability: {out}"
    );
    assert_eq!(exit_code(&steps[1]), 0, "{v}");
    let artifacts = artifacts(&v);
    assert_eq!(
        artifacts.len(),
        1,
        "the removed file is gone, the private one is read: {v}"
    );
    assert_eq!(artifacts[0]["path"], "private.txt", "{v}");
    assert_eq!(field(&artifacts[0], "content"), "secret\n", "{v}");
}

#[test]
fn a_symlink_artifact_pointing_outside_work_is_not_followed() {
    require_docker!();
    let d = shared();
    let body = project(
        &[("real.txt", "inside\n")],
        &["ln -s /etc/passwd passwd && mkdir -p d && ln -s /etc sub && ln -s real.txt alias"],
        &["passwd", "sub/passwd", "alias", "real.txt"],
        30_000,
    );
    let v = run_project(&d, &body);
    assert_eq!(outcome(&v), "PROJECT_OUTCOME_COMPLETED", "{v}");
    let artifacts = artifacts(&v);
    let paths = artifact_paths(&artifacts);
    assert_eq!(paths, ["real.txt"], "{v}");
    assert_eq!(field(&artifacts[0], "content"), "inside\n");
}

#[test]
fn a_path_escaping_work_is_refused_before_dispatch() {
    require_docker!();
    let d = shared();
    for body in [
        project(&[("../x", "no")], &["true"], &[], 10_000),
        project(&[], &["true"], &["../x"], 10_000),
        project(&[("/etc/x", "no")], &["true"], &[], 10_000),
    ] {
        let req = connect::call("Run", &body);
        let resp = send(d.addr, &req);
        connect::assert_invalid(&resp, &req);
    }
}

#[test]
fn artifacts_over_the_budget_are_dropped_with_the_flag() {
    require_docker!();
    let d = shared();
    let body = project(
        &[("small.txt", "small\n")],
        &["head -c 20000000 /dev/zero > big.bin"],
        &["small.txt", "big.bin"],
        60_000,
    );
    let v = run_project(&d, &body);
    assert_eq!(outcome(&v), "PROJECT_OUTCOME_COMPLETED", "{v}");
    assert_eq!(v["project"]["artifactsTruncated"], true, "{v}");
    let artifacts = artifacts(&v);
    let paths = artifact_paths(&artifacts);
    assert_eq!(paths, ["small.txt"], "{v}");
}

#[test]
fn step_output_is_capped_at_one_mib_shared_with_both_flags() {
    require_docker!();
    let d = shared();
    let body = project(
        &[],
        &["head -c 3000000 /dev/zero; echo never-here >&2"],
        &[],
        30_000,
    );
    let v = run_project(&d, &body);
    let steps = steps(&v);
    assert_eq!(steps.len(), 1, "{}\n{}", v["project"], d.logs().join("\n"));
    let step = &steps[0];
    let kept = connect::decode_base64(step["stdout"].as_str().unwrap_or("")).unwrap_or_default();
    assert_eq!(kept.len(), 1 << 20, "{}", outcome(&v));
    assert_eq!(step["stdoutTruncated"], true);
    assert_eq!(step["stderrTruncated"], true);
}

#[test]
fn artifacts_up_to_the_budget_come_back_whole() {
    require_docker!();
    let d = shared();
    let body = project(
        &[],
        &[
            "head -c 3000000 /dev/urandom > a.bin && head -c 3000000 /dev/urandom > b.bin && head -c 3000000 /dev/urandom > c.bin",
        ],
        &["a.bin", "b.bin", "c.bin"],
        60_000,
    );
    let v = run_project(&d, &body);
    assert_eq!(
        outcome(&v),
        "PROJECT_OUTCOME_COMPLETED",
        "{}",
        v["project"]["outcomeDetail"]
    );
    // 8 MiB holds two of the three; the third would pass the budget.
    assert_eq!(v["project"]["artifactsTruncated"], true);
    let artifacts = artifacts(&v);
    let sizes: Vec<usize> = artifacts
        .iter()
        .map(|a| {
            connect::decode_base64(a["content"].as_str().unwrap_or(""))
                .unwrap_or_default()
                .len()
        })
        .collect();
    assert_eq!(sizes, [3_000_000, 3_000_000]);
}

#[test]
fn a_file_that_cannot_be_written_is_setup_failed_and_no_step_runs() {
    require_docker!();
    let d = shared();
    // `a` is a file, so `a/b` has no directory to go in.
    let body = project(&[("a", "x"), ("a/b", "y")], &["echo ran"], &[], 30_000);
    let v = run_project(&d, &body);
    assert_eq!(outcome(&v), "PROJECT_OUTCOME_SETUP_FAILED", "{v}");
    assert!(steps(&v).is_empty(), "{v}");
    let detail = v["project"]["outcomeDetail"].as_str().unwrap_or_default();
    assert!(detail.contains("\"a/b\""), "{detail}");
}

/// The runner in the project image refuses to run a plan while it is still root: a runner
/// started as root whose guard library did not load (an image without it: the loader skips
/// a preload it cannot load) would otherwise run every step's setup as root.
#[test]
fn a_runner_left_root_without_its_guard_runs_nothing() {
    require_docker!();
    use std::io::Write as _;
    let mut child = Command::new("docker")
        .args([
            "run",
            "--rm",
            "-i",
            "--network",
            "none",
            "--runtime",
            runtime(),
            "--user",
            "0:0",
            "-e",
            "PLIMSOLL_GUEST_ID=61000:61000",
            "-e",
            "PLIMSOLL_WORK=/tmp",
            "--entrypoint",
            "node",
            project_image(),
            "/runner.mjs",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("docker run");
    let plan = json!({ "steps": ["echo step-ran"], "timeoutMs": 10000 });
    let input = format!("{}\n{plan}", "ab".repeat(32));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("plan");
    let out = child.wait_with_output().expect("runner");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("the runner runs as root: its guard library did not load"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !stdout.contains("\"steps\""),
        "the report has steps: {stdout}"
    );
}
