//! The benchmark: not a timed test, run with `--ignored --nocapture`.

use super::*;

const START_SCRIPT: &str = include_str!("../../../images/start.sh");
const GUEST_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `docker run` with plimsoll's lockdown flags (providers.md §5.4) up to the image, the
/// entrypoint being `/usr/bin/env`; with `/work` for projects.
fn raw_flags(work: bool) -> Vec<String> {
    let mut flags: Vec<String> = [
        "run",
        "--rm",
        "-i",
        "--log-driver",
        "none",
        "--memory",
        "256m",
        "--memory-swap",
        "256m",
        "--cpus",
        "1",
        "--read-only",
        "--tmpfs",
        "/tmp:rw,noexec,nosuid,size=16m",
        "--tmpfs",
        "/dev/shm:rw,noexec,nosuid,size=16m",
        "--user",
        "61000:61000",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--ulimit",
        "core=0",
        "--ulimit",
        "nofile=4096:4096",
        "--ipc",
        "private",
        "--no-healthcheck",
        "--network",
        "none",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if runsc() {
        flags.extend(
            [
                "--runtime",
                "runsc",
                "--pids-limit",
                "4096",
                "--ulimit",
                "nproc=256:256",
            ]
            .map(str::to_owned),
        );
    } else {
        flags.extend(["--pids-limit", "256"].map(str::to_owned));
    }
    if work {
        flags.extend(
            [
                "--tmpfs",
                "/work:rw,noexec,nosuid,size=128m,mode=1777",
                "--workdir",
                "/work",
            ]
            .map(str::to_owned),
        );
    }
    flags.extend(["--entrypoint", "/usr/bin/env"].map(str::to_owned));
    flags
}

/// Runs `docker` with `args`, `stdin` on its stdin; returns its stdout.
fn raw_run(args: &[String], stdin: &[u8]) -> String {
    use std::io::Write as _;
    let mut child = Command::new("docker")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// N snippets through the daemon against N raw `docker run --rm -i` with the same flags,
/// interleaved in one run. `PLIMSOLL_BENCH_N` sets N (default 30).
#[test]
#[ignore = "benchmark: cargo test -p plimsoll-tests --test docker -- --ignored --nocapture bench"]
fn bench_daemon_against_raw_docker_run() {
    require_docker!();
    let n: usize = std::env::var("PLIMSOLL_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let d = Daemon::start(&env_with(&[]));
    let id = image_id(SNIPPET_IMAGE);
    let mut flags = raw_flags(false);
    flags.extend(
        [
            id.as_str(),
            "-i",
            GUEST_PATH,
            "/bin/sh",
            "-c",
            START_SCRIPT,
            "sh",
            "plimsoll-started:0000000000000000",
            "node",
            "-",
        ]
        .map(str::to_owned),
    );
    let code = "console.log(1)";
    let (daemon_ms, raw_ms) = interleaved(
        n,
        || assert_eq!(run(&d, code, 10_000).stdout, "1\n"),
        || assert_eq!(raw_run(&flags, code.as_bytes()), "1\n"),
    );
    stop(d);
    report(runtime(), n, &daemon_ms, &raw_ms);
}

/// Times `daemon` and `raw` alternately, one warm-up of each first (not counted); answers
/// both latency lists in ms, sorted.
fn interleaved(n: usize, mut daemon: impl FnMut(), mut raw: impl FnMut()) -> (Vec<f64>, Vec<f64>) {
    let timed = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64() * 1000.0
    };
    let (mut daemon_ms, mut raw_ms) = (Vec::new(), Vec::new());
    for i in 0..=n {
        let d = timed(&mut daemon);
        let r = timed(&mut raw);
        if i > 0 {
            daemon_ms.push(d);
            raw_ms.push(r);
        }
    }
    for v in [&mut daemon_ms, &mut raw_ms] {
        v.sort_by(f64::total_cmp);
    }
    (daemon_ms, raw_ms)
}

/// Prints p50/p95 of both and their ratios.
fn report(label: &str, n: usize, daemon_ms: &[f64], raw_ms: &[f64]) {
    let (dp50, dp95) = (percentile(daemon_ms, 50.0), percentile(daemon_ms, 95.0));
    let (rp50, rp95) = (percentile(raw_ms, 50.0), percentile(raw_ms, 95.0));
    println!(
        "bench docker {label} n={n}: daemon p50 {dp50:.1} ms p95 {dp95:.1} ms | docker run --rm p50 {rp50:.1} ms p95 {rp95:.1} ms | ratio p50 {:.2} p95 {:.2}",
        dp50 / rp50,
        dp95 / rp95,
    );
}

/// N projects through the daemon against N raw `docker run` of the same commands with the
/// same flags and `/work` (the files written by `sh`, no runner), interleaved: a 2-step
/// JavaScript project and a 1-step Python project. `PLIMSOLL_BENCH_N` sets N (default 20).
#[test]
#[ignore = "benchmark: cargo test -p plimsoll-tests --test docker -- --ignored --nocapture bench"]
fn bench_projects_against_raw_docker_run() {
    require_docker!();
    let n: usize = std::env::var("PLIMSOLL_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let d = Daemon::start(&env_with(&[]));
    let id = image_id(PROJECT_IMAGE);
    let cases = [
        (
            "js 2 steps",
            "main.js",
            "console.log(6*7)",
            vec!["node main.js > out.txt", "cat out.txt"],
        ),
        (
            "python 1 step",
            "main.py",
            "print(6*7)",
            vec!["python3 main.py"],
        ),
    ];
    for (name, file, content, steps) in cases {
        let body = json!({
            "protocol": connect::PROTOCOL,
            "timeoutMs": 30_000,
            "project": { "files": [{ "path": file, "content": content }], "steps": steps },
        });
        // The raw run writes the file from its stdin, then runs the same steps.
        let script = format!("cat > {file} && {}", steps.join(" && "));
        let mut flags = raw_flags(true);
        flags.extend(
            [
                id.as_str(),
                "-i",
                GUEST_PATH,
                "/bin/sh",
                "-c",
                START_SCRIPT,
                "sh",
                "plimsoll-started:0000000000000000",
                "sh",
                "-c",
                script.as_str(),
            ]
            .map(str::to_owned),
        );
        let (daemon_ms, raw_ms) = interleaved(
            n,
            || {
                let resp = send(d.addr, &connect::call("Run", &body));
                assert_eq!(resp.status, 200, "{resp}");
                let v = resp.json();
                assert_eq!(v["project"]["outcome"], "PROJECT_OUTCOME_COMPLETED", "{v}");
            },
            || assert_eq!(raw_run(&flags, content.as_bytes()), "42\n"),
        );
        report(
            &format!("{} project {name}", runtime()),
            n,
            &daemon_ms,
            &raw_ms,
        );
    }
    stop(d);
}
