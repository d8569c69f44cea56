//! Attacks on the grant path from outside the sandbox (issue 12, parts 1 and 5), through the
//! real `plimsolld` and the `broker` child it supervises:
//!
//! - `grant_flood.rs`: one caller floods `Run` with grants it cannot use while another
//!   caller's granted runs, `/readyz` and the broker must keep working (wasm provider);
//! - `socket_access.rs`: another host uid looks for live run and session sockets and tries
//!   to use them, while the guest keeps its access (wasm, and docker under the runtime in
//!   `PLIMSOLL_TEST_DOCKER_RUNTIME`, `runc` by default or `runsc`).
//!
//! Build first: `cargo build --workspace --all-targets` (the tests run the built binaries).
// A test fails by panicking, with the evidence in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod grant_flood;
mod socket_access;

use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use plimsoll_tests::connect;
use plimsoll_tests::http1::{Request, Response};
use plimsoll_tests::test_api::{Reply, TestApi};
use plimsoll_tests::{ClientsFile, Daemon, fresh_token, wasm};
use serde_json::json;

/// The JWT secret, in the daemon's (and so the supervised broker's) environment.
const SECRET: &str = "hostile-grants-secret-0123456789abcdef01234567";

// === fixture ===

/// A test API, a grants file and a clients file with two callers that the profiles admit:
/// `alice` and `mallory`; and the daemon's own temp directory (`TMPDIR`, so its broker's
/// socket directories, in whatever layout, are this test's alone to look at).
struct Fixture {
    api: TestApi,
    dir: tempfile::TempDir,
    tmp: tempfile::TempDir,
    clients: ClientsFile,
    alice: String,
    mallory: String,
}

impl Fixture {
    fn start() -> Fixture {
        let api = TestApi::start();
        api.respond("GET", "/items/7", Reply::json(200, r#"{"id":7}"#));
        let alice = fresh_token();
        let mallory = fresh_token();
        let clients = ClientsFile::new(&[
            ("alice", &alice, &["code:run"]),
            ("mallory", &mallory, &["code:run"]),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let jwt = json!({ "type": "jwt", "secret_env": "HOSTILE_SECRET", "audience": "inv" });
        let grants = json!({ "profiles": {
            "inv": {
                "base_url": api.base_url(),
                "allow": ["GET /items/*"],
                "allowed_callers": ["alice", "mallory"],
                "token": jwt,
                "allow_in_sessions": true,
            },
        }});
        std::fs::write(dir.path().join("grants.json"), grants.to_string()).unwrap();
        // Like /tmp, anyone may list it and pass through (a runc guest's uid must reach the
        // sockets below it).
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Fixture {
            api,
            dir,
            tmp,
            clients,
            alice,
            mallory,
        }
    }

    /// Compiles the wasm guest once per test binary, then copies the compiled artifact
    /// into this fixture's `TMPDIR`, where the daemon's cache looks (a daemon that compiled
    /// it would not start within the harness's wait).
    fn seed_wasm_cache(&self) {
        wasm::warm_cache();
        let name = format!("plimsoll-wasm-{}", rustix::process::getuid().as_raw());
        let (from, to) = (
            std::env::temp_dir().join(&name),
            self.tmp.path().join(&name),
        );
        std::fs::create_dir(&to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o700)).unwrap();
        for entry in std::fs::read_dir(&from).unwrap().flatten() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }

    /// The daemon environment, `extra` on top (a later name replaces an earlier one).
    fn env(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = [
            ("PLIMSOLL_CLIENTS_FILE", self.clients.path_str()),
            (
                "PLIMSOLL_GRANTS_FILE",
                path_str(&self.dir.path().join("grants.json")),
            ),
            ("PLIMSOLL_BROKER_CA_FILE", path_str(self.api.ca_file())),
            ("PLIMSOLL_METRICS_ADDR", "off".to_owned()),
            ("SANDBOX_RATE_PER_MIN", "0".to_owned()),
            ("SANDBOX_PER_KEY_CONCURRENT", "0".to_owned()),
            ("HOSTILE_SECRET", SECRET.to_owned()),
            ("TMPDIR", path_str(self.tmp.path())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        for (k, v) in extra {
            env.retain(|(name, _)| name != k);
            env.push(((*k).to_owned(), (*v).to_owned()));
        }
        env
    }
}

fn path_str(p: &Path) -> String {
    p.to_str().expect("temporary paths are UTF-8").to_owned()
}

/// `(&str, &str)` pairs for [`Daemon::start`].
fn borrowed(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

// === calls ===

/// A `Run` request for `code` under `profile`, with `floor` as its minimum isolation ("" =
/// none).
fn run_request(token: &str, code: &str, profile: &str, floor: &str, timeout_ms: u32) -> Request {
    let mut body = json!({
        "protocol": connect::PROTOCOL,
        "timeoutMs": timeout_ms,
        "javascript": { "code": code, "grantProfile": profile },
    });
    if !floor.is_empty() {
        body["minimumIsolation"] = json!(floor);
    }
    connect::call_as(token, "Run", &body)
}

/// A snippet's stdout, if the answer is a result.
fn stdout(resp: &Response) -> Option<String> {
    if resp.status != 200 {
        return None;
    }
    let out = resp.json()["javascript"]["stdout"].as_str()?.to_owned();
    let bytes = base64::engine::general_purpose::STANDARD.decode(out).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

fn readyz(addr: SocketAddr) -> u16 {
    Request::get("/readyz").send(addr).status
}

/// Polls `check` every 50 ms until it holds, for at most `within`.
fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// === the broker's sockets ===

/// Every run and session socket the daemon's broker has in `tmp` (its `TMPDIR`), found as
/// root: the sockets in every `crsbx-*` directory, the broker's own liveness socket
/// (`broker.sock`) aside. Whatever the layout (one directory per broker, or, before issue
/// 12, one per socket).
fn guest_sockets(tmp: &Path) -> Vec<PathBuf> {
    let mut sockets = Vec::new();
    for dir in std::fs::read_dir(tmp).unwrap().flatten() {
        let is_broker_dir = dir.file_name().to_string_lossy().starts_with("crsbx-")
            && dir.file_type().is_ok_and(|t| t.is_dir());
        if !is_broker_dir {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(dir.path()) else {
            continue;
        };
        sockets.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
                .map(|e| e.path())
                .filter(|p| p.file_name().is_some_and(|n| n != "broker.sock")),
        );
    }
    sockets
}

/// The broker's log lines that say `message` for `field` = `value`.
fn broker_said(d: &Daemon, message: &str, field: &str, value: &str) -> usize {
    d.log_records()
        .iter()
        .filter(|r| r["message"] == message && r[field] == value)
        .count()
}
