//! Host-API grants through the real daemon (spec/grants.md §1.5, §2, §3, §4; wire.md §6.6;
//! issue 7): a real `plimsolld` that supervises the real `broker` (its binary next to the
//! daemon's), a grants file in a temp dir, and [`TestApi`], an HTTPS API with a runtime
//! test CA (`PLIMSOLL_BROKER_CA_FILE`) that records every request.
//!
//! This file drives the wasm provider; `grants/docker.rs` repeats the guest-facing claims
//! on docker (runtime from `PLIMSOLL_TEST_DOCKER_RUNTIME`, as `tests/docker.rs`).
//!
//! Build first: `cargo build -p plimsolld -p broker` (scripts/test builds the workspace).
// A test fails by panicking, with the evidence in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod grants {
    pub mod docker;
    pub mod dockercloud;
    pub mod e2b;
    pub mod openshell;
    pub mod sessions;
    pub mod sessions_spare;
    pub mod sessions_woken;
}

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use plimsoll_tests::connect::{self, ConnectError, Reason};
use plimsoll_tests::http1::{Request, Response};
use plimsoll_tests::test_api::{Recorded, Reply, TestApi};
use plimsoll_tests::{ClientsFile, Daemon, Finished, fresh_token, wasm};
use serde_json::{Value, json};

/// The JWT secrets, in the daemon's (and so the supervised broker's) environment.
const SECRET: &str = "grants-test-secret-0123456789abcdef0123456789";
const SECRET_2: &str = "grants-test-secret-two-9876543210fedcba987654";
const AUDIENCE: &str = "inventory";
/// Bound on any wait for the daemon or the broker to change state.
const WAIT: Duration = Duration::from_secs(20);

// === fixture ===

/// A test API, a grants file and a clients file with two callers: `alice`, whom the
/// profiles allow, and `mallory`, whom they do not.
pub struct Fixture {
    pub api: TestApi,
    dir: tempfile::TempDir,
    clients: ClientsFile,
    pub alice: String,
    pub mallory: String,
}

impl Fixture {
    pub fn start() -> Fixture {
        let api = TestApi::start();
        api.respond("GET", "/items/7", Reply::json(200, r#"{"id":7}"#));
        api.respond("POST", "/items", Reply::json(201, r#"{"created":true}"#));
        api.respond("GET", "/widgets/1", Reply::json(200, r#"{"widget":1}"#));
        api.respond("GET", "/admin", Reply::json(200, r#"{"admin":true}"#));
        api.respond(
            "GET",
            "/slow",
            Reply::json(200, r#"{"late":true}"#).with_delay(Duration::from_secs(30)),
        );
        let alice = fresh_token();
        let mallory = fresh_token();
        let clients = ClientsFile::new(&[
            ("alice", &alice, &["code:run"]),
            ("mallory", &mallory, &["code:run"]),
        ]);
        let fixture = Fixture {
            api,
            dir: tempfile::tempdir().unwrap(),
            clients,
            alice,
            mallory,
        };
        fixture.write_grants(
            &fixture.profiles(&["GET /items/*", "POST /items", "GET /slow"], "INV_SECRET"),
        );
        fixture
    }

    /// The grants file: `inv` with `allow` and its JWT secret in `secret_env`, and `tiny`,
    /// a two-call budget.
    pub fn profiles(&self, allow: &[&str], secret_env: &str) -> Value {
        let jwt = json!({ "type": "jwt", "secret_env": secret_env, "audience": AUDIENCE });
        json!({ "profiles": {
            "inv": {
                "base_url": self.api.base_url(),
                "allow": allow,
                "allowed_callers": ["alice"],
                "scopes": ["inventory:read"],
                "token": jwt,
            },
            "tiny": {
                "base_url": self.api.base_url(),
                "allow": ["GET /items/*"],
                "allowed_callers": ["alice"],
                "max_calls": 2,
                "token": jwt,
            },
        }})
    }

    /// Replaces the grants file atomically (a rename), as an operator's deploy would.
    pub fn write_grants(&self, grants: &Value) {
        self.write_grants_text(&grants.to_string());
    }

    pub fn write_grants_text(&self, text: &str) {
        let tmp = self.dir.path().join("grants.json.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.grants_path()).unwrap();
    }

    fn grants_path(&self) -> PathBuf {
        self.dir.path().join("grants.json")
    }

    /// The daemon environment for `provider`, plus `extra`.
    pub fn env(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = [
            ("PLIMSOLL_CLIENTS_FILE", self.clients.path_str()),
            ("PLIMSOLL_GRANTS_FILE", path_str(&self.grants_path())),
            ("PLIMSOLL_BROKER_CA_FILE", path_str(self.api.ca_file())),
            ("PLIMSOLL_METRICS_ADDR", "off".to_owned()),
            ("SANDBOX_RATE_PER_MIN", "0".to_owned()),
            ("SANDBOX_PER_KEY_CONCURRENT", "0".to_owned()),
            ("INV_SECRET", SECRET.to_owned()),
            ("INV_SECRET_2", SECRET_2.to_owned()),
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

    /// A wasm daemon over this fixture.
    fn wasm(&self) -> Daemon {
        wasm::warm_cache();
        let env = self.env(&[("SANDBOX_PROVIDER", "wasm")]);
        Daemon::start(&borrowed(&env))
    }
}

fn path_str(p: &Path) -> String {
    p.to_str().expect("temporary paths are UTF-8").to_owned()
}

/// `(&str, &str)` pairs for [`Daemon::start`].
pub fn borrowed(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

// === calls ===

/// A Run request for `code` under `profile` ("" = none).
pub fn run_request(token: &str, code: &str, profile: &str, timeout_ms: u32) -> Request {
    let mut js = json!({ "code": code });
    if !profile.is_empty() {
        js["grantProfile"] = json!(profile);
    }
    let body = json!({ "protocol": connect::PROTOCOL, "timeoutMs": timeout_ms, "javascript": js });
    connect::call_as(token, "Run", &body)
}

/// What a snippet printed, and whether it timed out.
#[derive(Debug)]
pub struct Ran {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i64,
    pub timed_out: bool,
}

/// Runs `code`, which must be answered with a result.
pub fn run(addr: SocketAddr, token: &str, code: &str, profile: &str) -> Ran {
    let resp = run_request(token, code, profile, 10_000).send(addr);
    ran(&resp)
}

pub fn ran(resp: &Response) -> Ran {
    assert_eq!(resp.status, 200, "expected a result:\n{resp}");
    let js = resp.json()["javascript"].clone();
    let text = |name: &str| {
        js.get(name)
            .and_then(Value::as_str)
            .map(|b| {
                let bytes = base64::engine::general_purpose::STANDARD.decode(b).unwrap();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default()
    };
    Ran {
        stdout: text("stdout"),
        stderr: text("stderr"),
        exit_code: js.get("exitCode").and_then(Value::as_i64).unwrap_or(0),
        timed_out: js.get("timedOut").and_then(Value::as_bool).unwrap_or(false),
    }
}

/// Runs `code` and expects a not-dispatched refusal; returns it.
pub fn refused(addr: SocketAddr, token: &str, code: &str, profile: &str) -> ConnectError {
    let resp = run_request(token, code, profile, 10_000).send(addr);
    assert_ne!(resp.status, 200, "expected a refusal:\n{resp}");
    ConnectError::of(&resp)
}

pub fn assert_permission(err: &ConnectError) {
    assert_eq!(err.code, "permission_denied", "{err:?}");
    assert_eq!(
        err.not_dispatched(),
        Some(Reason::Permission.detail_bytes()),
        "{err:?}"
    );
}

/// The bearer tokens the API received.
pub fn bearers(requests: &[Recorded]) -> Vec<String> {
    requests
        .iter()
        .filter_map(|r| r.header("authorization"))
        .filter_map(|a| a.strip_prefix("Bearer ").map(str::to_owned))
        .collect()
}

/// Checks `token` as the API would: HS256 with `secret`, audience [`AUDIENCE`]; returns
/// its claims.
pub fn verify_jwt(token: &str, secret: &str) -> Value {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.set_audience(&[AUDIENCE]);
    jsonwebtoken::decode::<Value>(
        token,
        &DecodingKey::from_secret(secret.as_bytes()),
        &validation,
    )
    .unwrap_or_else(|e| panic!("the API got a JWT that does not verify ({e}): {token}"))
    .claims
}

fn readyz(addr: SocketAddr) -> u16 {
    Request::get("/readyz").send(addr).status
}

/// Polls `check` every 50 ms until it holds, for at most `within`.
pub fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// === wasm ===

#[test]
fn an_allowed_route_reaches_the_api_with_a_jwt_naming_the_caller() {
    let f = Fixture::start();
    wasm::warm_cache();
    let env = f.env(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_METRICS_ADDR", "127.0.0.1:0"),
    ]);
    let d = Daemon::start(&borrowed(&env));
    let out = run(
        d.addr,
        &f.alice,
        "console.log(JSON.stringify(await host.get('/items/7')));\n\
         console.log(JSON.stringify(await host.post('/items', {name: 'x'})));",
        "inv",
    );
    assert_eq!(out.stdout, "{\"id\":7}\n{\"created\":true}\n", "{out:?}");
    let seen = f.api.requests();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        (seen[0].method.as_str(), seen[0].target.as_str()),
        ("GET", "/items/7")
    );
    assert_eq!(
        (seen[1].method.as_str(), seen[1].target.as_str()),
        ("POST", "/items")
    );
    assert_eq!(seen[1].body, br#"{"name":"x"}"#);
    let tokens = bearers(&seen);
    assert_eq!(
        tokens.len(),
        2,
        "every call carries the credential: {seen:?}"
    );
    assert_eq!(tokens[0], tokens[1], "minted once per run");
    let claims = verify_jwt(&tokens[0], SECRET);
    assert_eq!(claims["sub"], "alice", "{claims}");
    assert_eq!(claims["scope"], "inventory:read", "{claims}");
    // The audit line counts the calls.
    eventually("the audit line", WAIT, || {
        d.log_records()
            .iter()
            .any(|r| r["msg"] == "code run" && r["grant_profile"] == "inv" && r["host_calls"] == 2)
    });
    // And /metrics counts them by profile, method and route template (never the raw path).
    let metrics = Request::get("/metrics")
        .send(d.metrics_addr.expect("metrics listener on"))
        .text();
    for line in [
        r#"plimsoll_host_calls_total{profile="inv",method="GET",route="/items/*"} 1"#,
        r#"plimsoll_host_calls_total{profile="inv",method="POST",route="/items"} 1"#,
        r#"plimsoll_host_call_latency_seconds_count{profile="inv",method="GET",route="/items/*"} 1"#,
        r#"plimsoll_host_call_latency_seconds_bucket{profile="inv",method="POST",route="/items",le="+Inf"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    assert!(!metrics.contains("/items/7"), "{metrics}");
}

#[test]
fn a_route_outside_the_profile_is_refused_by_the_broker_and_the_api_sees_nothing() {
    let f = Fixture::start();
    let d = f.wasm();
    // The client's own check refuses first; the raw host function goes past it, and the
    // broker refuses.
    let out = run(
        d.addr,
        &f.alice,
        "try { await host.get('/admin'); } catch (e) { console.log(e.message); }\n\
         const r = __coderunner_host_call(JSON.stringify({method: 'GET', path: '/admin'}));\n\
         console.log(r.status, r.body.trim());\n\
         const q = __coderunner_host_call(JSON.stringify({method: 'GET', path: '/items/7?x=1'}));\n\
         console.log(q.status);",
        "inv",
    );
    assert_eq!(
        out.stdout,
        "host api call not permitted by sandbox capability: GET /admin\n\
         403 forbidden by sandbox capability allowlist\n403\n",
        "{out:?}"
    );
    assert!(f.api.requests().is_empty(), "{:?}", f.api.requests());
}

#[test]
fn the_credential_never_reaches_the_guest() {
    let f = Fixture::start();
    let d = f.wasm();
    // Everything the guest can see: its globals, the client object, the host function's
    // answers, and its own output.
    let out = run(
        d.addr,
        &f.alice,
        "const seen = [];\n\
         seen.push(JSON.stringify(await host.get('/items/7')));\n\
         for (const k of Object.getOwnPropertyNames(globalThis)) {\n\
           try { seen.push(k + '=' + String(globalThis[k])); } catch (_) {}\n\
         }\n\
         seen.push(String(host.get), String(host.call));\n\
         console.log(seen.join('\\n'));\n\
         console.error(seen.join('\\n'));",
        "inv",
    );
    assert!(out.stdout.contains("{\"id\":7}"), "{out:?}");
    let tokens = bearers(&f.api.requests());
    assert_eq!(tokens.len(), 1);
    for secret in [tokens[0].as_str(), SECRET] {
        assert!(!out.stdout.contains(secret) && !out.stderr.contains(secret));
    }
    // The same for the daemon's answer and its log.
    let logs = d.logs().join("\n");
    assert!(!logs.contains(&tokens[0]) && !logs.contains(SECRET));
}

#[test]
fn a_run_without_a_grant_has_no_client_and_its_host_call_fails() {
    let f = Fixture::start();
    let d = f.wasm();
    let out = run(
        d.addr,
        &f.alice,
        "console.log(typeof host);\n\
         const r = __coderunner_host_call(JSON.stringify({method: 'GET', path: '/items/7'}));\n\
         console.log(r.status);\n\
         await host.get('/items/7');",
        "",
    );
    assert_eq!(out.stdout, "undefined\n403\n", "{out:?}");
    assert_eq!(out.exit_code, 1, "host.get fails inside the guest: {out:?}");
    assert!(out.stderr.contains("ReferenceError"), "{out:?}");
    assert!(f.api.requests().is_empty());
}

#[test]
fn an_exhausted_budget_is_refused() {
    let f = Fixture::start();
    let d = f.wasm();
    let out = run(
        d.addr,
        &f.alice,
        "for (let i = 0; i < 3; i++) {\n\
           try { await host.get('/items/7'); console.log('ok'); }\n\
           catch (e) { console.log(e.message.split(':')[0]); }\n\
         }",
        "tiny",
    );
    assert_eq!(out.stdout, "ok\nok\nhost api 429\n", "{out:?}");
    assert_eq!(f.api.requests().len(), 2);
}

#[test]
fn a_grant_sent_in_full_is_refused_before_anything_runs() {
    let f = Fixture::start();
    let d = f.wasm();
    let raw = json!({
        "base_url": f.api.base_url(),
        "allow": ["GET /items/*"],
        "token": {"type": "static", "env": "INV_SECRET"}
    });
    for body in [
        json!({"protocol": connect::PROTOCOL, "javascript": {
            "code": "await host.get('/items/7')", "grant": raw }}),
        json!({"protocol": connect::PROTOCOL, "grant": raw,
            "javascript": {"code": "console.log(1)"}}),
        json!({"protocol": connect::PROTOCOL, "project": {
            "steps": ["true"], "grants": [raw] }}),
    ] {
        let resp = connect::call_as(&f.alice, "Run", &body).send(d.addr);
        let err = ConnectError::of(&resp);
        assert_eq!(err.code, "invalid_argument", "{resp}");
        assert!(err.message.contains("grant_profile"), "{err:?}");
        assert_eq!(
            err.not_dispatched(),
            Some(Reason::Request.detail_bytes()),
            "{err:?}"
        );
    }
    assert!(f.api.requests().is_empty(), "{:?}", f.api.requests());
    // Naming the profile is the way, and it works.
    let out = run(
        d.addr,
        &f.alice,
        "console.log(JSON.stringify(await host.get('/items/7')))",
        "inv",
    );
    assert_eq!(out.stdout, "{\"id\":7}\n", "{out:?}");
}

#[test]
fn a_slow_api_does_not_keep_the_run_past_its_deadline() {
    let f = Fixture::start();
    let d = f.wasm();
    let started = Instant::now();
    let resp = run_request(&f.alice, "await host.get('/slow');", "inv", 1_500).send(d.addr);
    let out = ran(&resp);
    assert!(out.timed_out, "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the run took {:?}",
        started.elapsed()
    );
    // The daemon still serves granted runs.
    let again = run(
        d.addr,
        &f.alice,
        "console.log((await host.get('/items/7')).id)",
        "inv",
    );
    assert_eq!(again.stdout, "7\n");
}

#[test]
fn an_unknown_profile_and_a_foreign_caller_get_the_identical_refusal() {
    let f = Fixture::start();
    let d = f.wasm();
    let unknown = refused(d.addr, &f.alice, "1", "nope");
    let foreign = refused(d.addr, &f.mallory, "1", "nope");
    let forbidden = refused(d.addr, &f.mallory, "1", "inv");
    for err in [&unknown, &foreign, &forbidden] {
        assert_permission(err);
    }
    assert_eq!(
        forbidden.message,
        "grant_profile \"inv\" is not available to this caller"
    );
    assert_eq!(unknown.message, foreign.message);
    assert_eq!(
        unknown.message.replace("nope", "inv"),
        forbidden.message,
        "the texts differ only by the name asked for"
    );
    let long = "p".repeat(129);
    let err = refused(d.addr, &f.alice, "1", &long);
    assert_eq!(err.code, "invalid_argument", "{err:?}");
    assert!(f.api.requests().is_empty());
}

/// The broker child of the daemon with pid `daemon`, found through /proc.
pub fn broker_child(daemon: u32) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may hold spaces, so split after the last ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(daemon) && head.contains("(broker") {
            return Some(pid);
        }
    }
    None
}

#[test]
fn a_killed_broker_is_noticed_and_the_supervised_restart_recovers() {
    let f = Fixture::start();
    let d = f.wasm();
    assert_eq!(readyz(d.addr), 200);
    let before = broker_child(d.pid()).expect("the supervised broker child");
    let pid = rustix::process::Pid::from_raw(before).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    // Until it is back: granted runs refused (permission), not ready; plain runs still run.
    // A run that finds the channel broken first is refused on its own; only the health
    // check (or the child's exit) says the broker is down (issue 12, part 1). Polled first:
    // the restart comes after a 1 s backoff, and a loaded machine must not miss the window.
    eventually("/readyz not ready", Duration::from_secs(10), || {
        readyz(d.addr) == 503
    });
    let err = refused(d.addr, &f.alice, "1", "inv");
    assert_permission(&err);
    assert!(err.message.contains("not answering"), "{err:?}");
    assert_eq!(run(d.addr, &f.alice, "console.log(1)", "").stdout, "1\n");
    // The supervisor restarts it with backoff; then everything works again.
    eventually("/readyz ready again", WAIT, || readyz(d.addr) == 200);
    let after = broker_child(d.pid()).expect("a restarted broker child");
    assert_ne!(before, after);
    let out = run(
        d.addr,
        &f.alice,
        "console.log((await host.get('/items/7')).id)",
        "inv",
    );
    assert_eq!(out.stdout, "7\n", "{out:?}");
}

#[test]
fn a_rotated_grants_file_reaches_new_runs_and_no_run_fails_because_of_the_swap() {
    let f = Fixture::start();
    let d = f.wasm();
    let probe = "const a = (await host.get('/items/7')).id;\n\
                 let b = 'none';\n\
                 try { b = (await host.get('/widgets/1')).widget; } catch (e) { b = 'refused'; }\n\
                 console.log(a, b);";
    let first = run(d.addr, &f.alice, probe, "inv");
    assert_eq!(first.stdout, "7 refused\n", "{first:?}");
    // Runs go on while the file changes: a new route and a new secret.
    let rotated = f.profiles(&["GET /items/*", "GET /widgets/*"], "INV_SECRET_2");
    let mut swapped = false;
    let deadline = Instant::now() + WAIT;
    let mut after_swap = 0;
    while after_swap < 3 {
        assert!(
            Instant::now() < deadline,
            "the rotated profile never reached a run"
        );
        let out = run(d.addr, &f.alice, probe, "inv");
        assert_eq!(
            out.exit_code, 0,
            "no run fails because of the swap: {out:?}"
        );
        assert!(
            out.stdout == "7 refused\n" || out.stdout == "7 1\n",
            "{out:?}"
        );
        if out.stdout == "7 1\n" {
            after_swap += 1;
        }
        if !swapped {
            f.write_grants(&rotated);
            swapped = true;
        }
    }
    let last = bearers(&f.api.requests()).pop().unwrap();
    assert_eq!(
        verify_jwt(&last, SECRET_2)["sub"],
        "alice",
        "minted with the new secret"
    );
    // An invalid file changes nothing: the rotated registry stays. The broker says it
    // tried (its log shares the daemon's stderr) before the run checks what it kept.
    let failed_reloads = || {
        d.logs()
            .iter()
            .filter(|l| l.contains("grants reload failed"))
            .count()
    };
    let before = failed_reloads();
    f.write_grants_text(r#"{"profiles": {"inv": {"unknown_field": 1}}}"#);
    eventually("the broker's failed reload", WAIT, || {
        failed_reloads() > before
    });
    let out = run(d.addr, &f.alice, probe, "inv");
    assert_eq!(out.stdout, "7 1\n", "{out:?}");
    let last = bearers(&f.api.requests()).pop().unwrap();
    verify_jwt(&last, SECRET_2);
}

#[test]
fn a_daemon_with_profiles_on_the_disabled_provider_refuses_to_start() {
    let f = Fixture::start();
    let env = f.env(&[("PLIMSOLL_INSECURE", "1")]);
    let out: Finished = Daemon::refuse(&borrowed(&env));
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("supports no credential-safe grant path"),
        "{}",
        out.stderr
    );
}

#[test]
fn an_operator_run_broker_holds_the_secrets_and_the_daemon_never_sees_them() {
    let f = Fixture::start();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("broker.sock");
    // The broker's own environment holds the secret; the daemon's does not.
    let mut broker = std::process::Command::new(plimsoll_tests::binary("broker"))
        .env_clear()
        .env("PLIMSOLL_GRANTS_FILE", f.grants_path())
        .env("PLIMSOLL_BROKER_SOCKET", &socket)
        .env("PLIMSOLL_BROKER_CA_FILE", f.api.ca_file())
        .env("INV_SECRET", SECRET)
        .env("INV_SECRET_2", SECRET_2)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually("the broker's control socket", WAIT, || socket.exists());
    wasm::warm_cache();
    let socket_text = path_str(&socket);
    let mut env = f.env(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_BROKER_SOCKET", socket_text.as_str()),
    ]);
    env.retain(|(k, _)| !k.starts_with("INV_SECRET") && k != "PLIMSOLL_GRANTS_FILE");
    let d = Daemon::start(&borrowed(&env));
    let out = run(
        d.addr,
        &f.alice,
        "console.log((await host.get('/items/7')).id)",
        "inv",
    );
    assert_eq!(out.stdout, "7\n", "{out:?}");
    let environ = std::fs::read(format!("/proc/{}/environ", d.pid())).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(!environ.contains(SECRET) && environ.contains("PLIMSOLL_BROKER_SOCKET="));
    assert!(
        broker_child(d.pid()).is_none(),
        "no child broker on this path"
    );
    // An operator's broker that goes away is noticed the same way.
    let _ = broker.kill();
    let _ = broker.wait();
    let err = refused(d.addr, &f.alice, "1", "inv");
    assert_permission(&err);
    eventually("/readyz not ready", Duration::from_secs(3), || {
        readyz(d.addr) == 503
    });
}

/// A run the floor refuses never reaches the broker: the floor (step 6), the software rule
/// and admission are judged before the broker opens a grant (issue 12, part 1). On main
/// before the fix, step 5 opened the grant first and closed it after the refusal.
#[test]
fn a_run_refused_by_the_floor_never_reaches_the_broker() {
    let f = Fixture::start();
    let d = f.wasm();
    let body = json!({
        "protocol": connect::PROTOCOL,
        "minimumIsolation": "vm",
        "javascript": { "code": "1", "grantProfile": "inv" },
    });
    let resp = connect::call_as(&f.alice, "Run", &body).send(d.addr);
    let err = ConnectError::of(&resp);
    assert_eq!(err.code, "failed_precondition", "{resp}");
    assert_eq!(err.not_dispatched(), Some(Reason::Isolation.detail_bytes()));
    // A granted run afterwards: once its open is logged, an earlier one would be too.
    let after = run(
        d.addr,
        &f.alice,
        "console.log((await host.get('/items/7')).id)",
        "inv",
    );
    assert_eq!(after.stdout, "7\n");
    let broker_says = |what: &str| {
        d.log_records()
            .iter()
            .filter(|r| r["message"] == what && r["grant_profile"] == "inv")
            .count()
    };
    eventually("the granted run's close", Duration::from_secs(3), || {
        broker_says("grant run closed") == 1
    });
    assert_eq!(
        broker_says("grant run opened"),
        1,
        "only the granted run opened one"
    );
}
