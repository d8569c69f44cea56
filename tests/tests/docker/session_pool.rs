//! The warm session pool (`SANDBOX_SESSION_POOL`, providers.md §9.8) through a real daemon:
//! the startup proof served by a member, opens served without creating a container, the
//! language hint choosing the member warm for python, a member never handed out twice,
//! Describe and `/metrics` showing the pool, and SIGTERM removing every member. Members that
//! fail and docker that fails are in [`faults`].

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use plimsoll_tests::Daemon;
use plimsoll_tests::http1::Request;
use serde_json::{Value, json};

use super::session::{close_as, open};
use super::{docker, docker_ready, env_with, instance, send, stop};
use plimsoll_tests::connect;

#[path = "session_pool/docker_proxy.rs"]
mod docker_proxy;
#[path = "session_pool/faults.rs"]
mod faults;
#[path = "session_pool/member_memory.rs"]
mod member_memory;

/// How long a pool may take to fill (members are made one at a time; runsc is slower).
const FILL_WITHIN: Duration = Duration::from_secs(180);

/// A daemon with sessions on and a pool of `size`, its metrics listener on loopback.
fn pooled(size: &str, max_sessions: &str) -> Daemon {
    pooled_with(size, max_sessions, &[])
}

/// [`pooled`], with `extra` settings.
fn pooled_with(size: &str, max_sessions: &str, extra: &[(&str, &str)]) -> Daemon {
    let mut env = vec![
        ("SANDBOX_MAX_SESSIONS", max_sessions),
        ("SANDBOX_SESSION_POOL", size),
        ("PLIMSOLL_METRICS_ADDR", "127.0.0.1:0"),
    ];
    env.extend_from_slice(extra);
    Daemon::start_within(&env_with(&env), Duration::from_secs(240))
}

/// Every container (running or not) carrying all of `labels`, by full id.
fn labelled(labels: &[String]) -> BTreeSet<String> {
    let mut args = vec!["ps", "-a", "-q", "--no-trunc"];
    for label in labels {
        args.push("--filter");
        args.push(label);
    }
    let (ok, out) = docker(&args);
    assert!(ok, "{out}");
    out.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// This daemon's session containers (members and sessions).
fn session_containers(d: &Daemon) -> BTreeSet<String> {
    labelled(&[format!(
        "label=io.plimsoll.instance=session-{}",
        instance(d)
    )])
}

/// This daemon's containers made as pool members warm for exactly `languages`.
fn members_warm_for(d: &Daemon, languages: &str) -> BTreeSet<String> {
    labelled(&[
        format!("label=io.plimsoll.instance=session-{}", instance(d)),
        format!("label=io.plimsoll.pool={languages}"),
    ])
}

fn describe_pool(d: &Daemon) -> Value {
    let v = send(d.addr, &connect::call("Describe", &json!({}))).json();
    v["sessionPool"].clone()
}

/// Members ready now, per warm set (`"javascript,python"` → count).
fn warm(d: &Daemon) -> Vec<(String, u64)> {
    describe_pool(d)["warm"]
        .as_array()
        .map(|sets| {
            sets.iter()
                .map(|s| {
                    let names: Vec<&str> = s["languages"]
                        .as_array()
                        .map(|l| l.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    (names.join(","), s["members"].as_u64().unwrap_or(0))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn counter(pool: &Value, name: &str) -> u64 {
    // uint64 is a JSON string in the Connect JSON form.
    match &pool[name] {
        Value::String(s) => s.parse().unwrap_or(0),
        v => v.as_u64().unwrap_or(0),
    }
}

fn wait_warm(d: &Daemon, what: &str, mut done: impl FnMut(&[(String, u64)]) -> bool) {
    let until = Instant::now() + FILL_WITHIN;
    loop {
        let now = warm(d);
        if done(&now) {
            return;
        }
        assert!(
            Instant::now() < until,
            "the pool never got {what} within {FILL_WITHIN:?}: {now:?}\n{}",
            d.logs().join("\n")
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn total(sets: &[(String, u64)]) -> u64 {
    sets.iter().map(|(_, n)| n).sum()
}

/// A cell call that must be answered; answers the whole `run`. Its deadline is generous: a
/// session opened beside a refilling pool starts its interpreter under that load (under
/// runsc on two cores it once took longer than the default), and no test here measures time.
fn cell_run(d: &Daemon, id: &str, language: &str, code: &str) -> Value {
    let body = json!({
        "protocol": connect::PROTOCOL,
        "sessionId": id,
        "timeoutMs": 30000,
        "cell": { "language": language, "code": code },
    });
    let resp = send(d.addr, &connect::call("SessionRun", &body));
    assert_eq!(resp.status, 200, "{code}: {resp}");
    resp.json()["run"].clone()
}

/// Runs each cell in turn: each must print exactly its `stdout` and nothing on stderr.
fn cells_print(d: &Daemon, id: &str, language: &str, cells: &[(&str, &str)]) {
    for (code, stdout) in cells {
        let run = cell_run(d, id, language, code);
        assert_eq!(
            super::field(&run["cell"], "stdout"),
            *stdout,
            "{code}: {run}"
        );
        assert_eq!(super::field(&run["cell"], "stderr"), "", "{code}: {run}");
    }
}

fn container_of(run: &Value) -> String {
    run["instance"]
        .as_str()
        .and_then(|i| i.strip_prefix("docker-container:"))
        .unwrap_or_else(|| panic!("a docker-container instance in {run}"))
        .to_owned()
}

fn gone(id: &str) -> bool {
    let (ok, _) = docker(&["inspect", "--type", "container", id]);
    !ok
}

#[test]
fn pooled_opens_create_no_container_and_sigterm_removes_every_member() {
    require_docker!();
    let d = pooled("2", "4");
    // The startup session proof ran, through a pool member.
    let msgs: Vec<String> = d
        .log_records()
        .iter()
        .filter_map(|r| r["msg"].as_str().map(str::to_owned))
        .collect();
    let served = msgs
        .iter()
        .position(|m| m == "session served by a warm pool member");
    let proven = msgs.iter().position(|m| m == "session path proven");
    assert!(
        matches!((served, proven), (Some(s), Some(p)) if s < p),
        "the proof's session came from the pool: {msgs:?}"
    );
    wait_warm(&d, "two members", |w| total(w) == 2);
    let before = session_containers(&d);
    assert_eq!(before.len(), 2, "only the two members exist: {before:?}");
    let pool = describe_pool(&d);
    assert_eq!(pool["size"], 2, "{pool}");
    let (claims, misses) = (counter(&pool, "claims"), counter(&pool, "misses"));

    // Two opens, each served by a member that existed before it: no container was made.
    let (a, _) = open(&d, json!({ "languages": ["python"] }));
    let (b, _) = open(&d, json!({}));
    let first = cell_run(&d, &a, "python", "6 * 7");
    assert_eq!(super::field(&first["cell"], "stdout"), "42\n", "{first}");
    assert_eq!(first["cell"]["interpreterStarted"], true, "{first}");
    let second = cell_run(&d, &b, "javascript", "6 * 7");
    let (ca, cb) = (container_of(&first), container_of(&second));
    assert!(
        before.contains(&ca) && before.contains(&cb),
        "{before:?} {ca} {cb}"
    );
    assert_ne!(ca, cb, "one member per session");
    let pool = describe_pool(&d);
    assert_eq!(counter(&pool, "claims"), claims + 2, "{pool}");
    assert_eq!(counter(&pool, "misses"), misses, "{pool}");

    // /metrics states the pool too.
    let text = Request::get("/metrics")
        .send(d.metrics_addr.expect("metrics listener on"))
        .text();
    assert!(text.contains("plimsoll_session_pool_size 2\n"), "{text}");
    assert!(
        text.contains(&format!(
            "plimsoll_session_pool_claims_total {}\n",
            claims + 2
        )),
        "{text}"
    );
    assert!(
        text.contains("plimsoll_session_pool_misses_total "),
        "{text}"
    );

    // Closing removes the session's container: a used member never returns.
    for id in [&a, &b] {
        assert_eq!(close_as(&d, None, id).status, 200);
    }
    assert!(
        gone(&ca) && gone(&cb),
        "closed sessions' containers are removed"
    );
    wait_warm(&d, "its two members back", |w| total(w) == 2);
    let members = session_containers(&d);
    assert!(members.is_disjoint(&BTreeSet::from([ca, cb])));
    let label = format!("label=io.plimsoll.instance=session-{}", instance(&d));
    stop(d);
    let left = labelled(&[label]);
    assert!(left.is_empty(), "SIGTERM removed every member: {left:?}");
}

#[test]
fn the_hint_picks_the_member_warm_for_python() {
    require_docker!();
    // From 5 members the pool warms the language sets opens ask for.
    let d = pooled("5", "6");
    wait_warm(&d, "five members", |w| total(w) == 5);
    // A python open takes an every-language member; the refill then warms python alone.
    let (first, _) = open(&d, json!({ "languages": ["python"] }));
    assert_eq!(close_as(&d, None, &first).status, 200);
    wait_warm(&d, "a python-only member", |w| {
        w.iter().any(|(set, n)| set == "python" && *n == 1)
    });
    let python = members_warm_for(&d, "python");
    assert_eq!(python.len(), 1, "{python:?}");
    // Every-language members are older: without the hint the oldest would be chosen.
    let (id, _) = open(&d, json!({ "languages": ["python"] }));
    let run = cell_run(&d, &id, "python", "import sys; sys.version_info[0]");
    assert_eq!(super::field(&run["cell"], "stdout"), "3\n", "{run}");
    assert!(
        python.contains(&container_of(&run)),
        "the python-only member served the python open: {run}"
    );
    assert_eq!(close_as(&d, None, &id).status, 200);
    stop(d);
}

/// A pooled python kernel idles without asyncio (about 5 MiB less per member) and loads it on
/// demand, with the same behaviour as if it had been there from the start: a cell's
/// `asyncio.get_event_loop()` answers the kernel's one loop without a deprecation warning, and
/// top-level await runs on that loop in every later cell.
#[test]
fn a_pooled_python_kernel_loads_asyncio_on_demand_with_its_one_loop() {
    require_docker!();
    let d = pooled("1", "2");
    wait_warm(&d, "one member", |w| total(w) == 1);
    let (id, _) = open(&d, json!({ "languages": ["python"] }));
    let cells = [
        ("import sys; 'asyncio' in sys.modules", "False\n"),
        (
            "import asyncio, warnings\nwarnings.simplefilter('error')\nloop = asyncio.get_event_loop()\nloop.is_running()",
            "False\n",
        ),
        (
            "async def current():\n    return asyncio.get_running_loop()\n(await current()) is loop",
            "True\n",
        ),
        (
            "await asyncio.sleep(0)\nasyncio.get_event_loop() is loop",
            "True\n",
        ),
    ];
    cells_print(&d, &id, "python", &cells);
    // A first top-level await, with no import of asyncio by the cell, in a fresh session.
    assert_eq!(close_as(&d, None, &id).status, 200);
    wait_warm(&d, "one member", |w| total(w) == 1);
    let (id, _) = open(&d, json!({ "languages": ["python"] }));
    let run = cell_run(
        &d,
        &id,
        "python",
        "await __import__('asyncio').sleep(0, 42)",
    );
    assert_eq!(super::field(&run["cell"], "stdout"), "42\n", "{run}");
    assert_eq!(close_as(&d, None, &id).status, 200);
    stop(d);
}

/// An idle pooled kernel holds no more than it must (python: neither json, ast, socket nor
/// traceback; JavaScript: its parser comes with the first cell that may need it), and what it
/// loads later for itself comes from the standard library even when the guest's work
/// directory holds files of the same names.
#[test]
fn pooled_kernels_load_their_helpers_late_and_from_their_own_library() {
    require_docker!();
    let d = pooled("1", "2");
    wait_warm(&d, "one member", |w| total(w) == 1);
    let (id, _) = open(&d, json!({}));
    // Files in /work named like modules the python kernel has not loaded yet.
    let shadow = "const fs = require('fs');\n\
        for (const m of ['json', 'traceback', 're']) fs.writeFileSync(`${m}.py`, 'raise SystemExit(\"shadowed\")\\n');";
    let planted =
        super::session::session_run_as(&d, None, &id, json!({ "javascript": { "code": shadow } }));
    assert_eq!(planted.status, 200, "{planted}");
    let python = [
        (
            "import sys\nsorted(m for m in ('ast', 'socket', 'json', 'traceback', 're') if m in sys.modules)",
            "[]\n",
        ),
        ("{'a': [1, 2.5, None, 'b']}", "{'a': [1, 2.5, None, 'b']}\n"),
    ];
    cells_print(&d, &id, "python", &python);
    let raised = cell_run(&d, &id, "python", "def f():\n    return 1 / 0\nf()");
    let stderr = super::field(&raised["cell"], "stderr");
    assert!(
        stderr.starts_with("Traceback (most recent call last):")
            && stderr.contains("line 2, in f")
            && stderr.ends_with("ZeroDivisionError: division by zero\n"),
        "{raised}"
    );
    // JavaScript: a first cell with nothing to rewrite, then declarations that later cells see
    // and may declare again, and a top-level await.
    let javascript = [
        ("typeof seen", "'undefined'\n"),
        ("const seen = 6 * 7", ""),
        ("class Box {}\nlet seen = new Box() instanceof Box", ""),
        ("seen", "true\n"),
        (
            "await new Promise((r) => setTimeout(() => r(seen), 10))",
            "true\n",
        ),
    ];
    cells_print(&d, &id, "javascript", &javascript);
    assert_eq!(close_as(&d, None, &id).status, 200);
    stop(d);
}

#[test]
fn concurrent_opens_never_share_a_member() {
    require_docker!();
    let d = pooled("2", "6");
    wait_warm(&d, "two members", |w| total(w) == 2);
    let members = session_containers(&d);
    let ids: Vec<String> = std::thread::scope(|s| {
        let opens: Vec<_> = (0..4).map(|_| s.spawn(|| open(&d, json!({})).0)).collect();
        opens.into_iter().map(|h| h.join().expect("open")).collect()
    });
    let containers: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = ids
            .iter()
            .map(|id| {
                let d = &d;
                s.spawn(move || container_of(&cell_run(d, id, "javascript", "1")))
            })
            .collect();
        runs.into_iter().map(|h| h.join().expect("cell")).collect()
    });
    let distinct: BTreeSet<&String> = containers.iter().collect();
    assert_eq!(
        distinct.len(),
        4,
        "each session its own container: {containers:?}"
    );
    let served = containers.iter().filter(|c| members.contains(*c)).count();
    assert!(
        served <= 2,
        "each member served at most one open: {containers:?}"
    );
    for id in &ids {
        assert_eq!(close_as(&d, None, id).status, 200);
    }
    stop(d);
}

// === the benchmark ===

/// A container of the project image under the test's runtime, idle for 15 minutes: what a
/// benchmark's `docker exec <container> true` baseline runs in. Answers its id.
pub(super) fn baseline_container() -> String {
    let mut run_args = vec!["run", "-d", "--rm", "--network", "none"];
    if plimsoll_tests::docker::runsc() {
        run_args.extend(["--runtime", "runsc"]);
    }
    let image = plimsoll_tests::docker::project_image();
    run_args.extend(["--entrypoint", "/usr/bin/env", image, "sleep", "900"]);
    let (ok, id) = docker(&run_args);
    assert!(ok, "{id}");
    id.trim().to_owned()
}

pub(super) fn sorted_percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// One open plus its first python cell (`6 * 7`), timed; the session is closed untimed.
fn open_and_first_cell(d: &Daemon) -> f64 {
    let t = Instant::now();
    let (id, _) = open(d, json!({ "languages": ["python"] }));
    let run = cell_run(d, &id, "python", "6 * 7");
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(super::field(&run["cell"], "stdout"), "42\n", "{run}");
    assert_eq!(close_as(d, None, &id).status, 200);
    ms
}

/// Pooled against unpooled open + first python cell, beside `docker exec <container> true`
/// on a container of the same image and runtime, interleaved in one run. Each open waits
/// for a full pool (members are made between opens, as an idle pool would have them).
/// `PLIMSOLL_BENCH_N` sets N (default 15).
#[test]
#[ignore = "benchmark: cargo test --workspace --test docker -- --ignored --nocapture --test-threads=1 bench_session_pool"]
fn bench_session_pool_open_and_first_python_cell() {
    require_docker!();
    let n = plimsoll_tests::bench_n(15);
    let pooled_d = pooled("2", "4");
    let plain = Daemon::start(&env_with(&[("SANDBOX_MAX_SESSIONS", "4")]));
    let baseline = baseline_container();
    let exec = || {
        let t = Instant::now();
        let (ok, out) = docker(&["exec", &baseline, "true"]);
        assert!(ok, "{out}");
        t.elapsed().as_secs_f64() * 1000.0
    };
    let (mut pooled_ms, mut plain_ms, mut exec_ms) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..=n {
        // Each measurement starts once the pool is full, so no member is being made beside it.
        wait_warm(&pooled_d, "two members", |w| total(w) == 2);
        let p = open_and_first_cell(&pooled_d);
        wait_warm(&pooled_d, "two members", |w| total(w) == 2);
        let u = open_and_first_cell(&plain);
        let e = exec();
        // The first round warms caches and is not counted.
        if i > 0 {
            pooled_ms.push(p);
            plain_ms.push(u);
            exec_ms.push(e);
        }
    }
    let (ok, out) = docker(&["rm", "-f", &baseline]);
    assert!(ok, "{out}");
    wait_warm(&pooled_d, "two members", |w| total(w) == 2);
    let members: Vec<member_memory::Member> = members_warm_for(&pooled_d, "javascript,python")
        .iter()
        .map(|id| member_memory::measure(id))
        .collect();
    let running = running_containers();
    let pool = describe_pool(&pooled_d);
    stop(pooled_d);
    stop(plain);
    for v in [&mut pooled_ms, &mut plain_ms, &mut exec_ms] {
        v.sort_by(f64::total_cmp);
    }
    let stats = |v: &[f64]| (sorted_percentile(v, 50.0), sorted_percentile(v, 95.0));
    let ((p50, p95), (u50, u95), (e50, e95)) =
        (stats(&pooled_ms), stats(&plain_ms), stats(&exec_ms));
    println!(
        "bench session pool {} n={n}: pooled open+first python cell p50 {p50:.1} ms p95 {p95:.1} ms | unpooled p50 {u50:.1} ms p95 {u95:.1} ms | docker exec true p50 {e50:.1} ms p95 {e95:.1} ms | pooled/exec p50 {:.2} p95 {:.2} | unpooled/exec p50 {:.2} p95 {:.2} | pooled/unpooled p50 {:.2} | claims {} misses {}",
        super::runtime(),
        p50 / e50,
        p95 / e95,
        u50 / e50,
        u95 / e95,
        p50 / u50,
        counter(&pool, "claims"),
        counter(&pool, "misses"),
    );
    print_members("javascript,python", &members, running);
}

/// How many containers run on the host: another one's processes share node's and python's
/// text with the members and so lower their PSS, which makes figures taken beside it
/// incomparable.
fn running_containers() -> usize {
    let (ok, out) = docker(&["ps", "-q"]);
    assert!(ok, "{out}");
    out.lines().filter(|l| !l.trim().is_empty()).count()
}

/// Each idle member's PSS and private memory, then the first one's breakdown by process;
/// `warm` names what the members have warm, `running` how many containers ran on the host
/// when they were measured.
fn print_members(warm: &str, members: &[member_memory::Member], running: usize) {
    let charged: Vec<f64> = members
        .iter()
        .map(member_memory::Member::charged_mib)
        .collect();
    let pss: Vec<f64> = members.iter().map(member_memory::Member::pss_mib).collect();
    let private: Vec<f64> = members
        .iter()
        .map(member_memory::Member::private_mib)
        .collect();
    println!(
        "bench session pool {} idle member warm for {warm} (MiB; its processes, its shim, under runsc its sandbox, gofer and stubs): charged {charged:.1?} PSS {pss:.1?} private {private:.1?}",
        super::runtime(),
    );
    println!("  containers running on the host when measured: {running} (the pool's own included)");
    if let Some(first) = members.first() {
        print!("{}", member_memory::breakdown(first));
    }
}

/// An idle full pool of two, measured: what one member costs (no timing; see the benchmark
/// above for the same figures after a timed run).
#[test]
#[ignore = "benchmark: cargo test --workspace --test docker -- --ignored --nocapture bench_session_pool_idle_member"]
fn bench_session_pool_idle_member() {
    require_docker!();
    let d = pooled("2", "4");
    wait_warm(&d, "two members", |w| total(w) == 2);
    // Let the members' start-up garbage settle as an idle pool's would.
    std::thread::sleep(Duration::from_secs(5));
    let members: Vec<member_memory::Member> = members_warm_for(&d, "javascript,python")
        .iter()
        .map(|id| member_memory::measure(id))
        .collect();
    let running = running_containers();
    stop(d);
    assert_eq!(members.len(), 2, "{members:?}");
    print_members("javascript,python", &members, running);
}

/// A hinted pool (five members, the size from which members warm what opens ask for) after
/// one python open: the python-only member its refill made, measured beside an
/// every-language member of the same pool (so node's and python's text is shared the same
/// way for both).
#[test]
#[ignore = "benchmark: cargo test --workspace --test docker -- --ignored --nocapture bench_session_pool_idle_python_member"]
fn bench_session_pool_idle_python_member() {
    require_docker!();
    let d = pooled("5", "6");
    wait_warm(&d, "five members", |w| total(w) == 5);
    let (first, _) = open(&d, json!({ "languages": ["python"] }));
    assert_eq!(close_as(&d, None, &first).status, 200);
    wait_warm(&d, "a python-only member and five in all", |w| {
        total(w) == 5 && w.iter().any(|(set, n)| set == "python" && *n == 1)
    });
    std::thread::sleep(Duration::from_secs(5));
    let python: Vec<member_memory::Member> = members_warm_for(&d, "python")
        .iter()
        .map(|id| member_memory::measure(id))
        .collect();
    let every: Vec<member_memory::Member> = members_warm_for(&d, "javascript,python")
        .iter()
        .take(1)
        .map(|id| member_memory::measure(id))
        .collect();
    let running = running_containers();
    stop(d);
    assert_eq!((python.len(), every.len()), (1, 1), "{python:?} {every:?}");
    print_members("python", &python, running);
    print_members("javascript,python", &every, running);
}
