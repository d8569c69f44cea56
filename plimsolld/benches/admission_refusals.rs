//! Admission's refusal path, end to end and in process (issue 6): how fast a saturated
//! plimsolld says "at capacity", against a `/healthz` baseline measured in the same run
//! on the same kind of connection.
//!
//! ```text
//! scripts/bench-admission                                   # K = 20000
//! BENCH_REFUSALS=50000 cargo bench -p plimsolld --bench admission_refusals
//! ```
//!
//! The daemon is `target/release/plimsolld` with the wasm provider, a clients file of
//! `BENCH_CALLERS` callers (default 2) plus one holder, `SANDBOX_MAX_CONCURRENT=BENCH_CAP`
//! (default 1), no per-caller cap and no rate limit, on ephemeral loopback ports. The
//! holder fills every slot with busy loops (`for (;;) {}`, 30 s); the bench waits until
//! `plimsoll_inflight` equals the cap, and refills the slots before each phase. Each
//! busy loop burns a core, which is why the cap defaults to 1 on a 2-core machine.
//!
//! Every request goes over prior-knowledge HTTP/2 (h2c) through hyper's client on
//! keep-alive connections, as Connect JSON (`application/json`, like the Python client).
//! Every refusal is checked (429, `resource_exhausted`) and every `/healthz` answer
//! (200, `ok`) before it counts. Phases, K requests each:
//!
//! 1. latency: one connection, one request at a time, `/healthz` and a refused `Run`
//!    alternating, so both see the same machine;
//! 2. throughput: `BENCH_CALLERS` connections (one caller each) in parallel, first
//!    `/healthz`, then refused runs;
//! 3. the decision alone: `Admission::admit` called in this process on a saturated
//!    controller, the same code the daemon runs, timed call by call. The daemon's hot
//!    path carries no timer of its own, so this is its in-daemon decision time; the
//!    whole in-daemon handling of a refusal is bounded above by the loopback latency.
//!
//! Each caller holds its own decode slot (the decode gate allows `2 × cap` at once, half
//! per caller), so with one request in flight per caller no refusal comes from the gate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use plimsolld::admission::Admission;
use plimsolld::config::admission::Limits;
use plimsolld::metrics::Metrics;
use sha2::{Digest, Sha256};

mod support;
use support::{Phase, percentile, spawn_wasm_daemon};

const WARM_UP: usize = 2_000;
const HOLD_MS: u32 = 30_000;
const DECISIONS: usize = 1_000_000;
const REFUSED_BODY: &str = r#"{"protocol":4,"javascript":{"code":"console.log(1)"}}"#;

type Sender = SendRequest<Full<Bytes>>;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

fn main() {
    let k = env_number("BENCH_REFUSALS", 20_000);
    let cap = env_number("BENCH_CAP", 1);
    let callers = env_number("BENCH_CALLERS", 2).min(2 * cap.max(1)).max(1);
    let daemon = Daemon::start(cap, callers);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    println!("admission refusal benchmark: K = {k} per phase, cap {cap}, {callers} callers");
    println!(
        "daemon: {} at {}",
        env!("CARGO_BIN_EXE_plimsolld"),
        daemon.addr
    );
    println!(
        "machine: {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let (latency, throughput) = rt.block_on(async {
        let first = connect(daemon.addr).await;
        daemon.saturate(cap).await;
        for _ in 0..WARM_UP / 2 {
            healthz(&first).await;
            refusal(&first, &daemon.tokens[0]).await;
        }
        daemon.saturate(cap).await;
        let latency = latency_phase(&first, &daemon.tokens[0], k).await;
        let mut conns = vec![first];
        for _ in 1..callers {
            conns.push(connect(daemon.addr).await);
        }
        let health = parallel(&conns, &daemon.tokens, k, false).await;
        daemon.saturate(cap).await;
        let refused = parallel(&conns, &daemon.tokens, k, true).await;
        (latency, (health, refused))
    });
    let shed = daemon.sample("plimsoll_shed_total{reason=\"at_capacity\"}");
    drop(daemon);
    let (global, rate) = decisions();

    println!();
    println!(
        "{:<44} {:>9} {:>9} {:>9} {:>11}",
        "phase (loopback h2c, keep-alive)", "p50 ms", "p95 ms", "p99 ms", "answers/s"
    );
    report("/healthz, 1 connection, sequential", &latency.0);
    report("refused Run, 1 connection, sequential", &latency.1);
    report(
        &format!("/healthz, {callers} connections in parallel"),
        &throughput.0,
    );
    report(
        &format!("refused Run, {callers} connections in parallel"),
        &throughput.1,
    );
    println!();
    println!(
        "{:<44} {:>9} {:>9} {:>9} {:>11}",
        "in process: Admission::admit", "p50 µs", "p95 µs", "p99 µs", "mean µs"
    );
    decision_report("refused at the global cap", &global);
    decision_report("refused by an empty token bucket", &rate);
    println!();
    let p50 = |s: &[Duration]| percentile(s, 50.0);
    println!(
        "refusal / healthz, p50 latency: {:.2}x (+{:.3} ms); throughput: {:.2}x",
        p50(&latency.1.latencies) / p50(&latency.0.latencies),
        p50(&latency.1.latencies) - p50(&latency.0.latencies),
        throughput.1.per_second() / throughput.0.per_second(),
    );
    println!("daemon's plimsoll_shed_total{{reason=\"at_capacity\"}}: {shed}");
}

// === phases ===

/// `/healthz` and a refused run alternating on one connection, `k` of each.
async fn latency_phase(conn: &Sender, token: &str, k: usize) -> (Phase, Phase) {
    let mut health = Vec::with_capacity(k);
    let mut refused = Vec::with_capacity(k);
    let (mut health_wall, mut refused_wall) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..k {
        let t = Instant::now();
        healthz(conn).await;
        let took = t.elapsed();
        health.push(took);
        health_wall += took;
        let t = Instant::now();
        refusal(conn, token).await;
        let took = t.elapsed();
        refused.push(took);
        refused_wall += took;
    }
    (
        Phase {
            latencies: health,
            wall: health_wall,
        },
        Phase {
            latencies: refused,
            wall: refused_wall,
        },
    )
}

/// `k` requests shared out over `conns`, each connection one request at a time.
async fn parallel(conns: &[Sender], tokens: &[String], k: usize, refused: bool) -> Phase {
    let started = Instant::now();
    let n = conns.len();
    let mut tasks = Vec::with_capacity(n);
    for (i, conn) in conns.iter().enumerate() {
        let conn = conn.clone();
        let token = tokens[i].clone();
        let share = k / n + usize::from(i < k % n);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(share);
            for _ in 0..share {
                let t = Instant::now();
                if refused {
                    refusal(&conn, &token).await;
                } else {
                    healthz(&conn).await;
                }
                latencies.push(t.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::with_capacity(k);
    for t in tasks {
        latencies.extend(t.await.expect("caller task"));
    }
    Phase {
        latencies,
        wall: started.elapsed(),
    }
}

/// `Admission::admit` refused `DECISIONS` times on a saturated controller: first at the
/// global cap, then by an empty token bucket. Returns each call's time.
fn decisions() -> (Vec<Duration>, Vec<Duration>) {
    let limits = Limits {
        max_concurrent: 1,
        per_key_concurrent: 0,
        rate_per_min: 0,
        rate_burst: 0,
        total_memory_mb: 0,
        per_run_memory_mb: 256,
        clamped: false,
        paid_seconds_per_day: 0,
    };
    let full = Admission::new(limits, Arc::new(Metrics::default()));
    let _held = full.admit("holder").expect("the first run is admitted");
    let global = time_refusals(&full);
    let bucket = Admission::new(
        Limits {
            max_concurrent: 8,
            rate_per_min: 1,
            rate_burst: 1,
            ..limits
        },
        Arc::new(Metrics::default()),
    );
    drop(bucket.admit("caller").expect("the bucket starts full"));
    let rate = time_refusals(&bucket);
    (global, rate)
}

fn time_refusals(admission: &Arc<Admission>) -> Vec<Duration> {
    let mut out = Vec::with_capacity(DECISIONS);
    for _ in 0..DECISIONS {
        let t = Instant::now();
        let refused = black_box(admission.admit(black_box("caller")));
        let took = t.elapsed();
        assert!(refused.is_err(), "a saturated controller admitted a run");
        drop(refused);
        out.push(took);
    }
    out
}

// === requests ===

async fn connect(addr: SocketAddr) -> Sender {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to plimsolld");
    stream.set_nodelay(true).expect("TCP_NODELAY");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2c handshake");
    tokio::spawn(conn);
    sender
}

fn request_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{:032x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

async fn exchange(conn: &Sender, req: http::Request<Full<Bytes>>) -> (u16, Bytes) {
    let mut conn = conn.clone();
    conn.ready().await.expect("connection ready");
    let resp = conn.send_request(req).await.expect("answered");
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("body read")
        .to_bytes();
    (status, body)
}

async fn healthz(conn: &Sender) {
    let req = http::Request::get("http://plimsolld/healthz")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let (status, body) = exchange(conn, req).await;
    assert_eq!((status, body.as_ref()), (200, b"ok\n".as_ref()));
}

/// A `Run` the saturated daemon must refuse as at capacity.
async fn refusal(conn: &Sender, token: &str) {
    let (status, body) = exchange(conn, run_request(token, REFUSED_BODY)).await;
    assert!(
        status == 429 && contains(&body, br#""code":"resource_exhausted""#),
        "expected a capacity refusal, got {status}: {}",
        String::from_utf8_lossy(&body)
    );
}

fn run_request(token: &str, body: &str) -> http::Request<Full<Bytes>> {
    http::Request::post("http://plimsolld/plimsoll.v1.SandboxService/Run")
        .header("content-type", "application/json")
        .header("connect-protocol-version", "1")
        .header("authorization", format!("Bearer {token}"))
        .header("plimsoll-request-id", request_id())
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request")
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

// === figures ===

fn report(name: &str, phase: &Phase) {
    println!(
        "{name:<44} {:>9.3} {:>9.3} {:>9.3} {:>11.0}",
        percentile(&phase.latencies, 50.0),
        percentile(&phase.latencies, 95.0),
        percentile(&phase.latencies, 99.0),
        phase.per_second()
    );
}

fn decision_report(name: &str, samples: &[Duration]) {
    let mean = samples.iter().sum::<Duration>().as_secs_f64() / samples.len() as f64;
    println!(
        "{name:<44} {:>9.3} {:>9.3} {:>9.3} {:>11.3}",
        percentile(samples, 50.0) * 1000.0,
        percentile(samples, 95.0) * 1000.0,
        percentile(samples, 99.0) * 1000.0,
        mean * 1e6
    );
}

// === impl Daemon ===

/// The release daemon under test, killed when dropped.
struct Daemon {
    child: Child,
    addr: SocketAddr,
    metrics_addr: SocketAddr,
    /// One token per measuring caller; the holder's is `holder`.
    tokens: Vec<String>,
    holder: String,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(cap: usize, callers: usize) -> Daemon {
        let token = || hex::encode(rand::random::<[u8; 32]>());
        let tokens: Vec<String> = (0..callers).map(|_| token()).collect();
        let holder = token();
        let entry = |id: &str, t: &str| {
            serde_json::json!({
                "id": id,
                "token_sha256": hex::encode(Sha256::digest(t.as_bytes())),
                "scopes": ["code:run"],
            })
        };
        let mut clients = vec![entry("holder", &holder)];
        clients.extend(
            tokens
                .iter()
                .enumerate()
                .map(|(i, t)| entry(&format!("caller{i}"), t)),
        );
        let dir = tempfile::tempdir().expect("temporary directory");
        let file = dir.path().join("clients.json");
        std::fs::write(&file, serde_json::json!({ "clients": clients }).to_string())
            .expect("write the clients file");
        let (child, listening) = spawn_wasm_daemon(&[
            ("PLIMSOLL_CLIENTS_FILE", file.display().to_string()),
            ("PLIMSOLL_METRICS_ADDR", "127.0.0.1:0".to_owned()),
            ("SANDBOX_MAX_CONCURRENT", cap.to_string()),
            ("SANDBOX_PER_KEY_CONCURRENT", "0".to_owned()),
            ("SANDBOX_RATE_PER_MIN", "0".to_owned()),
        ]);
        let addr = |k: &str| listening[k].as_str().unwrap_or_default().to_owned();
        let (addr, metrics_addr) = (addr("addr"), addr("metrics_addr"));
        Daemon {
            child,
            addr: addr.parse().expect("addr"),
            metrics_addr: metrics_addr.parse().expect("metrics_addr"),
            tokens,
            holder,
            _dir: dir,
        }
    }

    /// The value of one sample line of `/metrics`.
    fn sample(&self, series: &str) -> f64 {
        let mut s = TcpStream::connect(self.metrics_addr).expect("connect to metrics");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
            .expect("write");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read metrics");
        text.lines()
            .find_map(|l| {
                l.strip_prefix(series)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
    }

    /// Fills every free slot with a busy loop and waits until all `cap` are held.
    async fn saturate(&self, cap: usize) {
        let held = self.sample("plimsoll_inflight") as usize;
        for _ in held..cap {
            let conn = connect(self.addr).await;
            let body = format!(
                r#"{{"protocol":4,"timeoutMs":{HOLD_MS},"javascript":{{"code":"for (;;) {{}}"}}}}"#
            );
            let req = run_request(&self.holder, &body);
            // The answer comes after the bench ends, or never: the daemon is killed.
            tokio::spawn(async move {
                let mut conn = conn;
                if conn.ready().await.is_ok() {
                    let _ = conn.send_request(req).await;
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.sample("plimsoll_inflight") as usize != cap {
            assert!(Instant::now() < deadline, "the slots never filled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
