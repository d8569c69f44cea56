//! plimsolld's own cost on an e2b snippet (issue 14): the same snippet through the daemon
//! and straight against the simulator, interleaved in one run.

use super::*;

/// The `p` quantile of `times`, in milliseconds.
fn quantile(times: &mut [Duration], p: f64) -> f64 {
    times.sort();
    let i = ((times.len() as f64 - 1.0) * p).round() as usize;
    times[i].as_secs_f64() * 1000.0
}

/// The benchmark (not a timed test; run with `--ignored --nocapture`, see scripts/bench-e2b):
/// rounds of (1) a snippet `Run` through plimsolld, timed at the client, and (2) the same
/// work as a plain client of the simulator: a secure create of the same template with the
/// same deny-all network, envd's process start of the same code read to its end frame, then
/// the kill. The daemon answers before its VM's kill (which runs after the answer), so the
/// baseline is create + exec, and the kill is printed beside it. Every round starts with no
/// VM left; warm-up rounds are not counted. `PLIMSOLL_BENCH_N` sets the rounds (default 30).
#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn bench_snippet_through_the_daemon_against_the_simulator() {
    require_e2b!();
    let n = plimsoll_tests::bench_n(30);
    let code = "console.log(6 * 7)";
    let e2b = E2bSim::start();
    let d = e2b.daemon(&[]);
    let bound = Duration::from_secs(60);
    let mut through_daemon = Vec::new();
    let mut direct = Vec::new();
    let mut kills = Vec::new();
    for round in 0..n + 3 {
        let began = Instant::now();
        let v = answered(&d, &snippet(code, 20_000));
        let daemon = began.elapsed();
        assert_eq!(field(&v["javascript"], "stdout"), "42\n", "{v}");
        e2b.wait_empty(bound);

        let began = Instant::now();
        let vm = e2b.create_direct();
        let (exit, stdout) = e2b.envd_start(&vm, "node", &["-e", code]);
        let made_and_ran = began.elapsed();
        e2b.kill_direct(&vm);
        let kill = began.elapsed() - made_and_ran;
        assert_eq!((exit, stdout.as_str()), (0, "42\n"));
        e2b.wait_empty(bound);
        // The first rounds warm the daemon's and the simulator's paths.
        if round >= 3 {
            through_daemon.push(daemon);
            direct.push(made_and_ran);
            kills.push(kill);
        }
    }
    let (d50, d95) = (
        quantile(&mut through_daemon, 0.5),
        quantile(&mut through_daemon, 0.95),
    );
    let (s50, s95) = (quantile(&mut direct, 0.5), quantile(&mut direct, 0.95));
    let (k50, k95) = (quantile(&mut kills, 0.5), quantile(&mut kills, 0.95));
    println!(
        "e2b snippet `{code}`, {n} interleaved rounds, runtime {}:",
        plimsoll_tests::docker::runtime()
    );
    println!("  simulator create + exec   p50 {s50:8.2} ms  p95 {s95:8.2} ms");
    println!("  (its kill, after)         p50 {k50:8.2} ms  p95 {k95:8.2} ms");
    println!("  Run through plimsolld     p50 {d50:8.2} ms  p95 {d95:8.2} ms");
    println!(
        "  plimsolld's own cost: p50 difference {:.2} ms (target <= 10), p50 ratio {:.3}",
        d50 - s50,
        d50 / s50
    );
}
