//! What the suites of a daemon on a vendor's simulator (e2b, dockercloud, openshell) share:
//! the daemon's environment and start, polling the simulator's state, and the client's side
//! of a `Run` (send, read an output field). The record check needs the `plimsoll` crate,
//! which this harness never links: it is `tests/tests/support/verified.rs`.

use std::fmt::Debug;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Daemon;
use crate::connect::{self, ConnectError};
use crate::http1::{Connection, Request, Response};

/// How long a client waits for a run's answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// The environment of an open, unmetered daemon on `provider` with the simulator's own
/// variables `own`, plus `extra` (which replaces).
pub fn env(provider: &str, own: &[(&str, &str)], extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("SANDBOX_PROVIDER", provider),
        ("PLIMSOLL_INSECURE", "1"),
        ("PLIMSOLL_METRICS_ADDR", "off"),
        ("SANDBOX_RATE_PER_MIN", "0"),
        ("SANDBOX_PER_KEY_CONCURRENT", "0"),
        ("SANDBOX_MAX_CONCURRENT", "8"),
    ]
    .iter()
    .chain(own)
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    for (k, v) in extra {
        env.retain(|(name, _)| name != k);
        env.push(((*k).to_owned(), (*v).to_owned()));
    }
    env
}

fn refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Starts a daemon with `env`, its startup proof within `timeout`.
pub fn daemon(env: &[(String, String)], timeout: Duration) -> Daemon {
    Daemon::start_within(&refs(env), timeout)
}

/// Starts a daemon with `env` that must refuse to start; its stderr.
pub fn refused(env: &[(String, String)]) -> String {
    let out = Daemon::refuse(&refs(env));
    assert_ne!(out.code(), 0, "{}", out.stderr);
    out.stderr
}

/// Polls `state` until `done` holds for it, at most `bound`.
pub fn wait_for<T: Debug>(
    bound: Duration,
    what: &str,
    mut state: impl FnMut() -> T,
    mut done: impl FnMut(&T) -> bool,
) {
    let deadline = Instant::now() + bound;
    loop {
        let now = state();
        if done(&now) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {bound:?}: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One request to the daemon on a fresh connection; its answer.
pub fn send(addr: SocketAddr, req: &Request) -> Response {
    let mut conn = Connection::open(addr);
    conn.set_read_timeout(ANSWER_TIMEOUT);
    conn.send(&req.to_bytes(addr)).expect("send");
    conn.read_response(false).expect("answer")
}

/// A base64 output field of an answer, as text.
pub fn field(v: &Value, name: &str) -> String {
    v[name]
        .as_str()
        .map(|b| String::from_utf8_lossy(&connect::decode_base64(b).expect("base64")).into_owned())
        .unwrap_or_default()
}

/// A JavaScript snippet's `Run` body.
pub fn snippet(code: &str, timeout_ms: u32) -> Value {
    json!({ "protocol": connect::PROTOCOL, "timeoutMs": timeout_ms, "javascript": { "code": code } })
}

/// A run that must be refused before any code ran: its error.
pub fn refused_run(d: &Daemon, body: &Value) -> ConnectError {
    let resp = send(d.addr, &connect::call("Run", body));
    assert_ne!(resp.status, 200, "{body} must be refused: {resp}");
    ConnectError::of(&resp)
}

/// The instance stamp the daemon logged when `provider`'s proof passed.
pub fn proven_instance(d: &Daemon, provider: &str) -> String {
    let line = format!("{provider} provider proven");
    d.log_records()
        .iter()
        .find(|r| r["msg"] == line.as_str())
        .and_then(|r| r["instance"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no proven line in:\n{}", d.logs().join("\n")))
}
