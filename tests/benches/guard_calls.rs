//! A granted call through the guard beside the same call through a run's Unix socket, in one
//! run (issue 14's benchmark), and the guard's throughput at saturation.
//!
//! ```text
//! scripts/bench-guard                                   # K = 4000, C = 64
//! BENCH_CALLS=10000 BENCH_CONCURRENCY=128 scripts/bench-guard
//! ```
//!
//! The release `broker` (with a guard socket) and `guard` (cleartext on an ephemeral loopback
//! port) run as processes; the upstream is the tests' HTTPS [`TestApi`] on loopback, answering
//! `GET /items/abc` at once, so what is measured is the path in front of it. Two runs of one
//! JWT profile are opened through the control socket, one with socket delivery and one with
//! guard delivery, each with a budget of 100,000 calls. Every answer is checked before it
//! counts. Phases:
//!
//! 1. latency: one keep-alive HTTP/1.1 connection to each, one call at a time, socket and
//!    guard alternating, K calls each, so both see the same machine; p50, p95 and the ratio
//!    guard/socket;
//! 2. saturation: C clients at once on their own keep-alive connections, spread over four
//!    guard-delivered runs (so a run has C/4 clients against its 16 places and 2 turns), K
//!    calls each run's worth; throughput of answered calls, and every status counted. Only
//!    200 and the specified refusals (429, 503 with `Retry-After`) are allowed; anything
//!    else fails the bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use broker::control::client::Client;
use broker::control::protocol::{Delivery, OpenRun, Reach};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use plimsoll_tests::test_api::{Reply, TestApi};
use serde_json::json;

const SECRET: &str = "bench-secret-0123456789abcdef0123456789abcdef";
const ENVELOPE: &str = r#"{"method":"GET","path":"/items/abc"}"#;
const ANSWER: &str = r#"{"id":"abc"}"#;
const GUARD_PATH: &str = "/v1/e2b/guard";
const RUNS: usize = 4;

type Sender = SendRequest<Full<Bytes>>;

fn main() {
    let calls = env_usize("BENCH_CALLS", 4_000);
    let concurrency = env_usize("BENCH_CONCURRENCY", 64);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(bench(calls, concurrency));
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v:?} is not a count"))
        })
        .unwrap_or(default)
        .max(1)
}

async fn bench(calls: usize, concurrency: usize) {
    let api = TestApi::start();
    api.respond("GET", "/items/abc", Reply::json(200, ANSWER));
    let processes = Processes::start(&api);
    let client = Client::new(&processes.control);
    let socket = match open(&client, Delivery::Socket).await {
        Reach::Socket(path) => path,
        other => panic!("a socket run got {other:?}"),
    };
    let token = guard_token(open(&client, Delivery::Guard).await);
    println!(
        "guard bench: broker and guard from target/release, upstream HTTPS on loopback, \
         K = {calls}, C = {concurrency}"
    );

    // 1. Latency, alternating.
    let mut over_socket = socket_sender(&socket).await;
    let mut over_guard = tcp_sender(processes.guard_addr).await;
    for _ in 0..200 {
        socket_call(&mut over_socket).await;
        guard_call(&mut over_guard, &token).await.expect_ok();
    }
    let (mut socket_times, mut guard_times) = (Vec::new(), Vec::new());
    for _ in 0..calls {
        let started = Instant::now();
        socket_call(&mut over_socket).await;
        socket_times.push(started.elapsed());
        let started = Instant::now();
        guard_call(&mut over_guard, &token).await.expect_ok();
        guard_times.push(started.elapsed());
    }
    let (socket_p50, guard_p50) = (
        percentile(&socket_times, 50.0),
        percentile(&guard_times, 50.0),
    );
    println!(
        "latency   socket  p50 {socket_p50:.3} ms  p95 {:.3} ms",
        percentile(&socket_times, 95.0)
    );
    println!(
        "latency   guard   p50 {guard_p50:.3} ms  p95 {:.3} ms",
        percentile(&guard_times, 95.0)
    );
    println!(
        "ratio     guard/socket p50 {:.2} (target <= 1.5)",
        guard_p50 / socket_p50
    );

    // 2. Saturation: C clients over RUNS guard-delivered runs.
    let mut tokens = Vec::new();
    for _ in 0..RUNS {
        tokens.push(guard_token(open(&client, Delivery::Guard).await));
    }
    let counts: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let per_client = (calls * RUNS).div_ceil(concurrency);
    let started = Instant::now();
    let clients: Vec<_> = (0..concurrency)
        .map(|i| {
            let token = tokens[i % RUNS].clone();
            let counts = counts.clone();
            let addr = processes.guard_addr;
            tokio::spawn(async move {
                let mut sender: Option<Sender> = None;
                for _ in 0..per_client {
                    let mut live = match sender.take() {
                        Some(s) if !s.is_closed() => s,
                        _ => tcp_sender(addr).await,
                    };
                    let outcome = match guard_call(&mut live, &token).await {
                        Outcome::Answer(200, _, body) if body == ANSWER => "200".to_owned(),
                        Outcome::Answer(429, _, _) => "429 refused".to_owned(),
                        Outcome::Answer(503, true, _) => "503 refused, Retry-After".to_owned(),
                        Outcome::Answer(status, _, body) => format!("ERROR {status} {body}"),
                        Outcome::Transport(e) => format!("ERROR transport {e}"),
                    };
                    *counts.lock().unwrap().entry(outcome).or_default() += 1;
                    sender = Some(live);
                }
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }
    let wall = started.elapsed();
    let counts = counts.lock().unwrap().clone();
    let total: u64 = counts.values().sum();
    let served = counts.get("200").copied().unwrap_or(0);
    println!(
        "saturation {concurrency} clients over {RUNS} runs: {total} answers in {:.2} s, \
         {:.0} answers/s, {:.0} calls served/s",
        wall.as_secs_f64(),
        total as f64 / wall.as_secs_f64(),
        served as f64 / wall.as_secs_f64()
    );
    for (outcome, n) in &counts {
        println!("  {outcome}: {n}");
    }
    let errors: u64 = counts
        .iter()
        .filter(|(k, _)| k.starts_with("ERROR"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        errors, 0,
        "answers other than 200 and the specified refusals"
    );
}

// === the processes ===

struct Processes {
    broker: Child,
    guard: Child,
    control: PathBuf,
    guard_addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Processes {
    fn start(api: &TestApi) -> Processes {
        let dir = tempfile::tempdir().unwrap();
        let grants = json!({"profiles": {"inv": {
            "base_url": api.base_url(),
            "allow": ["GET /items/*"],
            "allowed_callers": ["bench"],
            "max_calls": 100_000,
            "token": {"type": "jwt", "secret_env": "BENCH_SECRET", "audience": "inventory"},
        }}});
        std::fs::write(dir.path().join("grants.json"), grants.to_string()).unwrap();
        let control = dir.path().join("ctl").join("broker.sock");
        let guard_socket = dir.path().join("guard").join("guard.sock");
        let broker = Command::new(release("broker"))
            .env_clear()
            .env("PLIMSOLL_GRANTS_FILE", dir.path().join("grants.json"))
            .env("PLIMSOLL_BROKER_SOCKET", &control)
            .env("PLIMSOLL_BROKER_GUARD_SOCKET", &guard_socket)
            .env("PLIMSOLL_BROKER_CA_FILE", api.ca_file())
            .env("BENCH_SECRET", SECRET)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_for(|| guard_socket.exists(), "the broker's guard socket");
        let addr_file = dir.path().join("guard.addr");
        let mut guard = Command::new(release("guard"))
            .env_clear()
            .env("PLIMSOLL_GUARD_ADDR", "127.0.0.1:0")
            .env("PLIMSOLL_GUARD_ADDR_FILE", &addr_file)
            .env("PLIMSOLL_BROKER_GUARD_SOCKET", &guard_socket)
            .env("SANDBOX_MAX_CONCURRENT", "8")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = guard.stderr.take().unwrap();
        // Drained so a chatty guard never blocks on a full pipe.
        std::thread::spawn(move || for _ in BufReader::new(stderr).lines() {});
        wait_for(|| addr_file.exists(), "the guard's address file");
        let text = std::fs::read_to_string(&addr_file).unwrap();
        Processes {
            broker,
            guard,
            control,
            guard_addr: text.trim().parse().unwrap(),
            _dir: dir,
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        plimsoll_tests::stop(&mut self.guard, Duration::from_secs(5));
        plimsoll_tests::stop(&mut self.broker, Duration::from_secs(5));
    }
}

fn release(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/release")
        .join(name);
    assert!(
        path.is_file(),
        "{} is missing: scripts/bench-guard builds it",
        path.display()
    );
    path
}

fn wait_for(ready: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(Instant::now() < deadline, "{what} did not appear");
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn open(client: &Client, delivery: Delivery) -> Reach {
    let request = OpenRun {
        run: hex::encode(rand_bytes()),
        principal: "bench".into(),
        profile: "inv".into(),
        deadline_unix_ms: now_ms() + 30 * 60 * 1000,
        session: false,
        delivery,
        slot: None,
        kept_from_earlier_calls: 0,
        call_token: false,
    };
    client.open(&request).await.unwrap().unwrap().reach
}

fn guard_token(reach: Reach) -> String {
    match reach {
        Reach::GuardToken(token) => token,
        other => panic!("a guard run got {other:?}"),
    }
}

/// 16 bytes that differ between calls, for run ids.
fn rand_bytes() -> [u8; 16] {
    use sha2::{Digest, Sha256};
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let digest = Sha256::digest(format!("{}-{n}", now_ms()));
    digest[..16].try_into().unwrap()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

// === the callers ===

async fn socket_sender(socket: &Path) -> Sender {
    let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    handshake(TokioIo::new(stream)).await
}

async fn tcp_sender(addr: std::net::SocketAddr) -> Sender {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    handshake(TokioIo::new(stream)).await
}

async fn handshake<T>(io: T) -> Sender
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(io).await.unwrap();
    tokio::spawn(connection);
    sender
}

enum Outcome {
    /// Status, whether `Retry-After` was set, body.
    Answer(u16, bool, String),
    Transport(String),
}

impl Outcome {
    fn expect_ok(self) {
        match self {
            Outcome::Answer(200, _, body) if body == ANSWER => {}
            Outcome::Answer(status, _, body) => panic!("guard answered {status}: {body}"),
            Outcome::Transport(e) => panic!("guard call failed: {e}"),
        }
    }
}

async fn socket_call(sender: &mut Sender) {
    let request = http::Request::get("/items/abc")
        .header(http::header::HOST, "host-api")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let answer = sender.send_request(request).await.unwrap();
    assert_eq!(answer.status(), 200);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], ANSWER.as_bytes());
}

async fn guard_call(sender: &mut Sender, token: &str) -> Outcome {
    if sender.ready().await.is_err() {
        return Outcome::Transport("connection closed".into());
    }
    let request = http::Request::post(GUARD_PATH)
        .header(http::header::HOST, "guard")
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("x-plimsoll-guard", token)
        .body(Full::new(Bytes::from_static(ENVELOPE.as_bytes())))
        .unwrap();
    let answer = match sender.send_request(request).await {
        Ok(answer) => answer,
        Err(e) => return Outcome::Transport(e.to_string()),
    };
    let status = answer.status().as_u16();
    let retry = answer.headers().contains_key(http::header::RETRY_AFTER);
    match answer.into_body().collect().await {
        Ok(body) => Outcome::Answer(
            status,
            retry,
            String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        ),
        Err(e) => Outcome::Transport(e.to_string()),
    }
}

fn percentile(samples: &[Duration], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}
