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

/// `docker run` with the flags and `/work`, running `script` with `sh -c` in image `id`
/// behind the start script, as a project step runs.
fn raw_shell(id: &str, script: &str) -> Vec<String> {
    let mut flags = raw_flags(true);
    flags.extend(
        [
            id,
            "-i",
            GUEST_PATH,
            "/bin/sh",
            "-c",
            START_SCRIPT,
            "sh",
            "plimsoll-started:0000000000000000",
            "sh",
            "-c",
            script,
        ]
        .map(str::to_owned),
    );
    flags
}

/// Runs `docker` with `args`, `stdin` on its stdin; returns its stdout as text.
fn raw_run(args: &[String], stdin: &[u8]) -> String {
    String::from_utf8_lossy(&raw_bytes(args, stdin)).into_owned()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// N snippets through the daemon against N raw `docker run --rm -i` with the same flags,
/// interleaved in one run. `PLIMSOLL_BENCH_N` sets N (default 30).
#[test]
#[ignore = "benchmark: cargo test --workspace --test docker -- --ignored --nocapture bench"]
fn bench_daemon_against_raw_docker_run() {
    require_docker!();
    let n = plimsoll_tests::bench_n(30);
    let d = Daemon::start(&env_with(&[]));
    let id = image_id(snippet_image());
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
#[ignore = "benchmark: cargo test --workspace --test docker -- --ignored --nocapture bench"]
fn bench_projects_against_raw_docker_run() {
    require_docker!();
    let n = plimsoll_tests::bench_n(20);
    let d = Daemon::start(&env_with(&[]));
    let id = image_id(project_image());
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
        let flags = raw_shell(&id, &script);
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

/// A 1,000-row table of the damped oscillator (10 time units in steps of 0.1: 100 steps of 2
/// outputs a row) through the daemon, against `sim-worker` run directly in a `docker run`
/// with the same flags, the same module image and the same table (written by `sh` from
/// stdin, the results file read back on stdout), interleaved. Prints p50/p95 of both, the
/// ratio, and rows per second at p50. `PLIMSOLL_BENCH_N` sets the repetitions (default 20).
#[test]
#[ignore = "benchmark: cargo test --workspace --test docker -- --ignored --nocapture bench_module"]
fn bench_module_oscillator_against_the_worker_in_a_container() {
    require_docker!();
    if !plimsoll_tests::docker::module_image_ready() {
        return;
    }
    const ROWS: usize = 1000;
    let n = plimsoll_tests::bench_n(20);
    let module_image = plimsoll_tests::docker::module_image();
    let d = Daemon::start(&env_with(&[("SANDBOX_DOCKER_MODULE_IMAGE", module_image)]));
    let table: Vec<[f64; 4]> = (0..ROWS)
        .map(|i| {
            let f = i as f64 / ROWS as f64;
            [0.5 + 2.0 * f, 0.05 + 0.5 * f, 1.0 - f, f]
        })
        .collect();
    let body = json!({
        "protocol": connect::PROTOCOL,
        "timeoutMs": 60_000,
        "module": {
            "model": "damped-oscillator",
            "rows": table.iter().map(|r| json!({ "values": r })).collect::<Vec<_>>(),
            "endTime": 10.0,
            "step": 0.1,
        },
    });
    // The table as the daemon writes it (shortest round-trip decimals, one row a line).
    let text: String = table
        .iter()
        .map(|r| format!("{:e} {:e} {:e} {:e}\n", r[0], r[1], r[2], r[3]))
        .collect();
    let id = image_id(module_image);
    let script = "cat > params.txt && sim-worker --table damped-oscillator params.txt results.bin 1e1 1e-1 8388608 58000 && cat results.bin";
    let flags = raw_shell(&id, script);
    // Header, then per row a status and 100 steps × 2 outputs.
    let file_bytes = 20 + ROWS * (4 + 100 * 2 * 8);
    // The answers are checked after the timing: parsing 4 MB of JSON in this (debug) test
    // binary is the caller's cost, not the daemon's; the raw side only counts its bytes too.
    let answers = std::cell::RefCell::new(Vec::new());
    let (daemon_ms, raw_ms) = interleaved(
        n,
        || {
            answers
                .borrow_mut()
                .push(send(d.addr, &connect::call("Run", &body)))
        },
        || assert_eq!(raw_bytes(&flags, text.as_bytes()).len(), file_bytes),
    );
    stop(d);
    for resp in answers.into_inner() {
        assert_eq!(resp.status, 200, "{resp}");
        let v = resp.json();
        let m = &v["module"];
        assert_eq!(m["outcome"], "PROJECT_OUTCOME_COMPLETED", "{m}");
        let runs = m["runs"].as_array().expect("runs");
        assert_eq!(runs.len(), ROWS);
        assert!(runs.iter().all(|r| r["status"] == 100));
    }
    report(
        &format!("{} module oscillator {ROWS} rows", runtime()),
        n,
        &daemon_ms,
        &raw_ms,
    );
    let rows_per_s = |sorted: &[f64]| ROWS as f64 / (percentile(sorted, 50.0) / 1000.0);
    println!(
        "bench docker {} module rows/s at p50: daemon {:.0} | sim-worker in docker run {:.0}",
        runtime(),
        rows_per_s(&daemon_ms),
        rows_per_s(&raw_ms)
    );
}

/// Runs `docker` with `args`, `stdin` on its stdin; returns its stdout.
fn raw_bytes(args: &[String], stdin: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut child = Command::new("docker")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_vec();
    // The table may not fit the pipe: write it beside reading the answer.
    let writer = std::thread::spawn(move || input.write_all(&stdin));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    out.stdout
}
