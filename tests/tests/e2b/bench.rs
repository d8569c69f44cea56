//! plimsolld's own cost on an e2b snippet (issue 14): the same snippet through the daemon
//! and straight against the simulator, interleaved in one run.

use plimsoll::record;
use plimsoll::wire::{RunRequest, RunResponse};

use super::*;

/// The `p` quantile of `times`, in milliseconds.
fn quantile(times: &mut [f64], p: f64) -> f64 {
    times.sort_by(f64::total_cmp);
    let i = ((times.len() as f64 - 1.0) * p).round() as usize;
    times[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Waits (at most `bound`) until the simulator lists no VM and docker holds no container
/// of sandbox `id`: the simulator takes a killed VM off its list before its container is
/// removed, and a removal still running would load the next measured round.
fn wait_gone(e2b: &E2bSim, id: &str, bound: Duration) {
    e2b.wait_empty(bound);
    let label = format!("label=io.plimsoll.simulator.sandbox={id}");
    sim::wait_for(
        bound,
        "the VM's container removed",
        || plimsoll_tests::docker::docker(&["ps", "-aq", "--filter", &label]),
        |(ok, out)| *ok && out.is_empty(),
    );
}

/// Time outside the simulator: `took` less what the simulator spent serving sandbox `id`.
fn outside(e2b: &E2bSim, id: &str, took: f64) -> f64 {
    took - e2b.sim.served_ms(id).expect("the simulator's served time")
}

/// One snippet `Run` through the daemon, timed at the client until its answer arrived; the
/// client's check of the answer's record comes after the clock (it is the client's work,
/// not plimsolld's) and is timed on its own. Waits until the run's VM is gone. The time,
/// the check's, and the time outside the simulator's serving.
fn through_daemon(e2b: &E2bSim, d: &Daemon, code: &str, bound: Duration) -> (f64, f64, f64) {
    let body = snippet(code, 20_000);
    let began = Instant::now();
    let resp = send(d.addr, &connect::call("Run", &body));
    let took = ms(began.elapsed());
    let checked = Instant::now();
    assert_eq!(resp.status, 200, "{resp}");
    let v = resp.json();
    let req: RunRequest = serde_json::from_value(body).expect("request as wire");
    let answer: RunResponse = serde_json::from_value(v.clone()).expect("answer as wire");
    record::check_single(&record::request_digest(&req), None, &answer)
        .unwrap_or_else(|e| panic!("record does not verify ({e}): {v}"));
    let check = ms(checked.elapsed());
    assert_eq!(v["isolation"], "vm", "{v}");
    assert_eq!(field(&v["javascript"], "stdout"), "42\n", "{v}");
    let instance = v["instance"].as_str().unwrap_or_default();
    let id = instance.strip_prefix("e2b-sandbox:").unwrap_or(instance);
    assert!(!id.is_empty(), "{v}");
    wait_gone(e2b, id, bound);
    (took, check, outside(e2b, id, took))
}

/// The process plimsolld starts for a one-shot snippet (grants.md §6.5: the code written to
/// `/tmp/plimsoll-snippet.cjs`, then run with `node`), as plimsolld's e2b runs build it: the
/// code travels in the start's environment and a shell line writes the file and replaces
/// itself with node. A change there must be made here too, or the baseline stops being the
/// same work.
const SNIPPET_LINE: &str = "printf '%s' \"$PLIMSOLL_SNIPPET\" > /tmp/plimsoll-snippet.cjs && unset PLIMSOLL_SNIPPET && exec node /tmp/plimsoll-snippet.cjs";

/// How a plain client of the simulator runs the snippet.
#[derive(Clone, Copy)]
enum Baseline {
    /// The same process start plimsolld sends (command, arguments, environment).
    SameProcess,
    /// `node -e <code>`: the least a VM can be asked to do for this code, which the spec
    /// rules out for plimsoll (argument limits; the code must be a file).
    NodeEval,
}

/// The same work as a plain client of the simulator: create + exec, and the kill after. The
/// create + exec, the kill, and the create + exec's time outside the simulator's serving.
fn direct(e2b: &E2bSim, code: &str, how: Baseline, bound: Duration) -> (f64, f64, f64) {
    let began = Instant::now();
    let vm = e2b.create_direct();
    let (exit, stdout) = match how {
        Baseline::SameProcess => e2b.envd_start(
            &vm,
            "sh",
            &["-c", SNIPPET_LINE],
            &[("PLIMSOLL_SNIPPET", code)],
        ),
        Baseline::NodeEval => e2b.envd_start(&vm, "node", &["-e", code], &[]),
    };
    let made_and_ran = began.elapsed();
    e2b.kill_direct(&vm);
    let kill = began.elapsed() - made_and_ran;
    assert_eq!((exit, stdout.as_str()), (0, "42\n"));
    wait_gone(e2b, &vm.id, bound);
    let made_and_ran = ms(made_and_ran);
    (made_and_ran, ms(kill), outside(e2b, &vm.id, made_and_ran))
}

/// One round's three measurements.
struct Round {
    daemon: f64,
    check: f64,
    same: f64,
    kill: f64,
    eval: f64,
    /// Time outside the simulator's serving: through plimsolld, and the same-process client.
    daemon_outside: f64,
    same_outside: f64,
}

/// The benchmark (not a timed test; run with `--ignored --nocapture`, see scripts/bench-e2b,
/// which runs a release `plimsolld` through `PLIMSOLLD`): rounds of (1) a snippet `Run`
/// through plimsolld, timed at the client, (2) the same work as a plain client of the
/// simulator: a secure create of the same template with the same deny-all network, envd's
/// start of the same process (command, arguments, environment) read to its end frame, then
/// the kill, and (3) the same with `node -e <code>` as the process. plimsolld's own cost is
/// (1) minus (2): everything it does beyond the VM work any client running this snippet as
/// the spec requires pays; (1) minus (3) adds the cost of that process over the least one.
/// The daemon answers before its VM's kill (which runs after the answer), so the baselines
/// are create + exec, and the kill is printed beside them. Every measurement starts with no
/// VM and no VM's container left (a removal still running would slow whichever came next),
/// and the three take turns going first, so drift and order weigh on all alike. Warm-up
/// rounds are not counted. `PLIMSOLL_BENCH_N` sets the rounds (default 100). Besides the
/// difference of the p50s, a paired figure is printed: the median over groups of three
/// consecutive rounds (one of each order) of the mean per-round difference. And a figure the
/// simulator's noise does not blur: each measurement's time less what the simulator spent
/// serving that VM (its create, read-backs, and the process start to its end frame, from the
/// simulator's admin `GET /served/{id}`), through plimsolld against the same-process client.
#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn bench_snippet_through_the_daemon_against_the_simulator() {
    require_e2b!();
    let n = plimsoll_tests::bench_n(100).div_ceil(3) * 3;
    let code = "console.log(6 * 7)";
    let e2b = E2bSim::start();
    let d = e2b.daemon(&[]);
    let bound = Duration::from_secs(60);
    let mut rounds = Vec::new();
    for round in 0..n + 3 {
        let (mut daemon, mut same, mut eval) = (None, None, None);
        for turn in 0..3 {
            match (round + turn) % 3 {
                0 => daemon = Some(through_daemon(&e2b, &d, code, bound)),
                1 => same = Some(direct(&e2b, code, Baseline::SameProcess, bound)),
                _ => eval = Some(direct(&e2b, code, Baseline::NodeEval, bound)),
            }
        }
        // The first rounds warm the daemon's and the simulator's paths.
        if let (
            true,
            Some((daemon, check, daemon_outside)),
            Some((same, kill, same_outside)),
            Some((eval, _, _)),
        ) = (round >= 3, daemon, same, eval)
        {
            rounds.push(Round {
                daemon,
                check,
                same,
                kill,
                eval,
                daemon_outside,
                same_outside,
            });
        }
    }
    let series = |f: fn(&Round) -> f64| rounds.iter().map(f).collect::<Vec<f64>>();
    let p50_95 = |mut v: Vec<f64>| (quantile(&mut v, 0.5), quantile(&mut v, 0.95));
    let (d50, d95) = p50_95(series(|r| r.daemon));
    let (s50, s95) = p50_95(series(|r| r.same));
    let (e50, e95) = p50_95(series(|r| r.eval));
    let (k50, k95) = p50_95(series(|r| r.kill));
    let (c50, _) = p50_95(series(|r| r.check));
    let (do50, do95) = p50_95(series(|r| r.daemon_outside));
    let (so50, so95) = p50_95(series(|r| r.same_outside));
    // Groups of three rounds hold each order once.
    let paired = |f: fn(&Round) -> f64| {
        let mut means: Vec<f64> = rounds
            .chunks_exact(3)
            .map(|g| g.iter().map(|r| r.daemon - f(r)).sum::<f64>() / 3.0)
            .collect();
        (
            quantile(&mut means, 0.25),
            quantile(&mut means, 0.5),
            quantile(&mut means, 0.75),
        )
    };
    let (sp25, sp50, sp75) = paired(|r| r.same);
    let (ep25, ep50, ep75) = paired(|r| r.eval);
    println!(
        "e2b snippet `{code}`, {n} rounds of three, runtime {}:",
        plimsoll_tests::docker::runtime()
    );
    println!(
        "  simulator create + exec of plimsolld's process  p50 {s50:8.2} ms  p95 {s95:8.2} ms"
    );
    println!(
        "  (its kill, after)                               p50 {k50:8.2} ms  p95 {k95:8.2} ms"
    );
    println!(
        "  simulator create + exec of `node -e`            p50 {e50:8.2} ms  p95 {e95:8.2} ms"
    );
    println!(
        "  Run through plimsolld                           p50 {d50:8.2} ms  p95 {d95:8.2} ms"
    );
    println!("  (the client's record check, after the clock: p50 {c50:.2} ms)");
    println!(
        "  plimsolld's own cost: p50 difference {:.2} ms (target <= 10), p50 ratio {:.3}; paired median {sp50:.2} ms, quartiles {sp25:.2} / {sp75:.2} ms",
        d50 - s50,
        d50 / s50
    );
    println!(
        "  with its process's cost over `node -e`: p50 difference {:.2} ms; paired median {ep50:.2} ms, quartiles {ep25:.2} / {ep75:.2} ms",
        d50 - e50
    );
    println!(
        "  time outside the simulator's serving (client time less the simulator's create, read and start-to-end-frame time for that VM):"
    );
    println!(
        "    through plimsolld                             p50 {do50:8.2} ms  p95 {do95:8.2} ms"
    );
    println!(
        "    plain client, same process                    p50 {so50:8.2} ms  p95 {so95:8.2} ms"
    );
    println!(
        "    plimsolld's own cost by this measure: p50 difference {:.2} ms",
        do50 - so50
    );
}
