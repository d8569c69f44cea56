//! The docker provider end to end (providers.md §4–§6, issue 4): a real `plimsolld` with
//! `SANDBOX_PROVIDER=docker` on this machine's Docker Engine, driven over loopback.
//!
//! The runtime comes from `PLIMSOLL_TEST_DOCKER_RUNTIME` (`runc`, the default, or `runsc`);
//! `scripts/test-docker` runs this file once per runtime. Docker and the images
//! (`scripts/setup-docker`, `images/build`) are required: when they are missing every test
//! FAILS, unless the developer sets `PLIMSOLL_TEST_DOCKER_SKIP=1`, which turns each test into
//! a logged no-op.
//!
//! Most tests share one daemon (started by the first test that needs it, stopped with the
//! last holder); tests that judge startup start their own. The hostile-guest checks each
//! assert a typed result (never an infrastructure error) and what the guest could not do.
// A test fails by panicking, with the evidence in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use plimsoll_tests::Daemon;
use plimsoll_tests::connect;
use plimsoll_tests::docker::{
    docker, docker_ready, project_image, runsc, runtime, snippet_image, tier,
};
use plimsoll_tests::http1::{Connection, Request, Response};
use serde_json::{Value, json};

const OUTPUT_CAP: usize = 64 * 1024;
/// The shared daemon's process limit: small, so fork bombs end fast.
const PIDS: u32 = 64;
const ANSWER_TIMEOUT: Duration = Duration::from_secs(90);

// === environment ===

fn image_id(reference: &str) -> String {
    let (ok, id) = docker(&["image", "inspect", "--format", "{{.Id}}", reference]);
    assert!(ok, "docker image inspect {reference}: {id}");
    id
}

macro_rules! require_docker {
    () => {
        if !docker_ready() {
            return;
        }
    };
}

/// The daemon environment for this runtime, plus `extra`.
fn env_with<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("SANDBOX_PROVIDER", "docker"),
        ("PLIMSOLL_INSECURE", "1"),
        ("PLIMSOLL_METRICS_ADDR", "off"),
        ("SANDBOX_RATE_PER_MIN", "0"),
        ("SANDBOX_PER_KEY_CONCURRENT", "0"),
        ("SANDBOX_MAX_CONCURRENT", "16"),
    ];
    if runsc() {
        env.push(("SANDBOX_DOCKER_RUNTIME", "runsc"));
    }
    for (k, v) in extra {
        env.retain(|(name, _)| name != k);
        env.push((k, v));
    }
    env
}

/// The daemon most tests share. The last holder stops it with SIGTERM, so its drain removes
/// every container before the process ends.
struct Shared(Daemon);

impl std::ops::Deref for Shared {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.0
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = self.0.sigterm();
    }
}

/// The shared daemon, started by the first test that needs it.
fn shared() -> Arc<Shared> {
    static SHARED: Mutex<Weak<Shared>> = Mutex::new(Weak::new());
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = slot.upgrade() {
        return d;
    }
    let pids = PIDS.to_string();
    let d = Arc::new(Shared(Daemon::start(&env_with(&[("SANDBOX_PIDS", &pids)]))));
    *slot = Arc::downgrade(&d);
    d
}

/// This daemon's instance id, from its `docker provider proven` line.
fn instance(d: &Daemon) -> String {
    d.log_records()
        .iter()
        .find(|r| r["msg"] == "docker provider proven")
        .and_then(|r| r["instance"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no proven line in:\n{}", d.logs().join("\n")))
}

/// Stops a test's own daemon the way an operator would (its drain removes its containers).
fn stop(mut d: Daemon) {
    assert!(d.sigterm().success(), "{}", d.logs().join("\n"));
}

fn containers_of(instance: &str) -> Vec<String> {
    let filter = format!("label=io.plimsoll.instance={instance}");
    let (ok, out) = docker(&["ps", "-a", "-q", "--filter", &filter]);
    assert!(ok, "{out}");
    out.lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect()
}

// === calls ===

fn send(addr: SocketAddr, req: &Request) -> Response {
    let mut conn = Connection::open(addr);
    conn.set_read_timeout(ANSWER_TIMEOUT);
    conn.send(&req.to_bytes(addr)).expect("send");
    conn.read_response(false).expect("answer")
}

/// A snippet's answer.
#[derive(Debug)]
struct Ran {
    resp: Value,
    stdout: String,
    stderr: String,
    exit_code: i64,
    timed_out: bool,
}

impl Ran {
    fn result(&self) -> &Value {
        &self.resp["javascript"]
    }

    /// The guest's stdout as JSON (the hostile snippets report that way).
    fn report(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not a JSON report ({e}): {self:?}"))
    }
}

fn field(v: &Value, name: &str) -> String {
    v[name]
        .as_str()
        .map(|b| String::from_utf8_lossy(&connect::decode_base64(b).expect("base64")).into_owned())
        .unwrap_or_default()
}

/// Runs `code` and expects an answered run (any exit code).
fn run(d: &Daemon, code: &str, timeout_ms: u32) -> Ran {
    let body = json!({ "protocol": connect::PROTOCOL, "timeoutMs": timeout_ms, "javascript": { "code": code } });
    let resp = send(d.addr, &connect::call("Run", &body));
    assert_eq!(resp.status, 200, "{code}: {resp}");
    let v = resp.json();
    let js = &v["javascript"];
    Ran {
        stdout: field(js, "stdout"),
        stderr: field(js, "stderr"),
        exit_code: js["exitCode"].as_i64().unwrap_or(0),
        timed_out: js["timedOut"].as_bool().unwrap_or(false),
        resp: v,
    }
}

/// Runs a snippet that prints one JSON report and must exit 0.
fn report(d: &Daemon, code: &str, timeout_ms: u32) -> Value {
    let ran = run(d, code, timeout_ms);
    assert_eq!((ran.exit_code, ran.timed_out), (0, false), "{ran:?}");
    ran.report()
}

#[path = "docker/bench.rs"]
mod bench;
#[path = "docker/hostile.rs"]
mod hostile;
#[path = "docker/lifecycle.rs"]
mod lifecycle;
#[path = "support/lost_session.rs"]
mod lost_session;
#[path = "docker/module.rs"]
mod module;
#[path = "docker/project.rs"]
mod project;
#[path = "docker/record.rs"]
mod record;
#[path = "docker/session.rs"]
mod session;
#[path = "docker/session_calls_bench.rs"]
mod session_calls_bench;
#[path = "docker/session_hostile.rs"]
mod session_hostile;
#[path = "docker/session_pool.rs"]
mod session_pool;
#[path = "docker/session_project.rs"]
mod session_project;
#[path = "docker/session_spare.rs"]
mod session_spare;
#[path = "docker/software.rs"]
mod software;
#[path = "docker/toolchain.rs"]
mod toolchain;
