//! The wasm provider's speed, end to end: `console.log(6*7)` through a real plimsolld
//! over loopback with the Rust Connect client, with 1 and then 2 concurrent callers, and
//! in the same run the same snippet as `node -e` processes, the baseline it is compared
//! with. Every answer is checked (`42\n`, exit 0) before it counts.
//!
//! ```text
//! scripts/bench-wasm                                     # installs node if missing
//! cargo bench -p plimsolld --bench wasm_snippets         # the same, node must exist
//! BENCH_RUNS=5000 cargo bench -p plimsolld --bench wasm_snippets
//! ```
//!
//! `BENCH_RUNS` (default 1000) is N: the number of snippets in each phase, the node phase
//! included. The daemon is `target/release/plimsolld`, started here with the wasm provider,
//! a fresh token, an ephemeral loopback port and no rate limit, and stopped at the end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Instant;

use connectrpc::client::{ClientConfig, HttpClient};

mod support;
use plimsoll::refusal::PROTOCOL;
use plimsoll::wire::{JavaScriptRun, RunRequest, SandboxServiceClient, run_response};
use support::{Phase, percentile, spawn_wasm_daemon};

const SNIPPET: &str = "console.log(6*7)";
const WARM_UP: usize = 100;

type Client = SandboxServiceClient<HttpClient>;

fn main() {
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1000);
    let (mut daemon, url, token) = start_daemon();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let client = Arc::new(client(&url, &token));
    println!("wasm provider benchmark: {runs} runs of `{SNIPPET}` per phase");
    println!("daemon: {} at {url}", env!("CARGO_BIN_EXE_plimsolld"));
    println!(
        "machine: {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    rt.block_on(async {
        for _ in 0..WARM_UP {
            run_once(&client).await;
        }
    });
    let one = rt.block_on(phase(&client, runs, 1));
    let two = rt.block_on(phase(&client, runs, 2));
    let _ = daemon.kill();
    let _ = daemon.wait();
    println!();
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>10}",
        "phase", "p50 ms", "p95 ms", "p99 ms", "runs/s"
    );
    report("plimsolld wasm, 1 caller", &one);
    report("plimsolld wasm, 2 callers", &two);
    match node_phase(runs) {
        Some(node) => {
            report("node -e (a process per snippet)", &node);
            println!();
            println!(
                "ratio, p50 latency: node / wasm = {:.1}x; throughput: wasm 1 caller / node = {:.1}x, \
                 wasm 2 callers / node = {:.1}x",
                percentile(&node.latencies, 50.0) / percentile(&one.latencies, 50.0),
                one.per_second() / node.per_second(),
                two.per_second() / node.per_second(),
            );
        }
        None => {
            println!("node -e: `node` is not installed (scripts/bench-wasm installs it); no ratio")
        }
    }
}

/// One phase's samples.
fn report(name: &str, phase: &Phase) {
    println!(
        "{name:<34} {:>9.3} {:>9.3} {:>9.3} {:>10.0}",
        percentile(&phase.latencies, 50.0),
        percentile(&phase.latencies, 95.0),
        percentile(&phase.latencies, 99.0),
        phase.per_second()
    );
}

/// `runs` snippets shared out between `callers` concurrent callers.
async fn phase(client: &Arc<Client>, runs: usize, callers: usize) -> Phase {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let client = client.clone();
        let share = runs / callers + usize::from(caller < runs % callers);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(share);
            for _ in 0..share {
                let t = Instant::now();
                run_once(&client).await;
                latencies.push(t.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::with_capacity(runs);
    for task in tasks {
        latencies.extend(task.await.expect("caller task"));
    }
    Phase {
        latencies,
        wall: started.elapsed(),
    }
}

async fn run_once(client: &Client) {
    let request = RunRequest {
        protocol: PROTOCOL,
        payload: Some(
            JavaScriptRun {
                code: SNIPPET.to_owned(),
                ..Default::default()
            }
            .into(),
        ),
        ..Default::default()
    };
    let answer = client.run(request).await.expect("run").into_owned();
    match &answer.result {
        Some(run_response::Result::Javascript(js)) if js.exit_code == 0 && js.stdout == b"42\n" => {
        }
        other => panic!("unexpected answer: {other:?}"),
    }
}

/// The same snippets as `node -e` processes, one after another.
fn node_phase(runs: usize) -> Option<Phase> {
    Command::new("node").arg("--version").output().ok()?;
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let out = Command::new("node")
            .args(["-e", SNIPPET])
            .output()
            .expect("node");
        latencies.push(t.elapsed());
        assert_eq!(
            out.stdout,
            b"42\n",
            "node printed {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Some(Phase {
        latencies,
        wall: started.elapsed(),
    })
}

fn client(url: &str, token: &str) -> Client {
    let config = ClientConfig::new(url.parse().expect("url")).with_default_header(
        http::header::AUTHORIZATION,
        http::HeaderValue::try_from(format!("Bearer {token}")).expect("header"),
    );
    SandboxServiceClient::new(HttpClient::plaintext(), config)
}

/// Starts the release daemon and waits (long enough for a first compile) for it to listen.
fn start_daemon() -> (Child, String, String) {
    let token: String = (0..48)
        .map(|_| char::from(b"0123456789abcdef"[rand::random_range(0..16)]))
        .collect();
    let (child, listening) = spawn_wasm_daemon(&[
        ("PLIMSOLL_TOKEN", token.clone()),
        ("PLIMSOLL_METRICS_ADDR", "off".to_owned()),
        ("SANDBOX_RATE_PER_MIN", "0".to_owned()),
    ]);
    let addr = listening["addr"].as_str().unwrap_or_default().to_owned();
    (child, format!("http://{addr}"), token)
}
