//! Grants on openshell through the relay (grants.md §8.7, issue 17): the daemon starts
//! `plimsoll-relay` in the sandbox and dials into it through the gateway's `ForwardTcp`; the
//! guest keeps `HOST_API_SOCKET` and the same client as on docker, the sandbox keeps its
//! no-network policy, and every SSH-session token is revoked when the run ends. Against the
//! gateway simulator, its sandboxes under `PLIMSOLL_TEST_DOCKER_RUNTIME`.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::grants::docker::LOOK_AROUND;
use crate::{
    Fixture, SECRET, assert_permission, bearers, borrowed, ran, refused, run, run_request,
    verify_jwt,
};
use plimsoll_tests::docker::docker_ready;
use plimsoll_tests::http1::Request;
use plimsoll_tests::openshell::{Gateway, START_TIMEOUT};
use plimsoll_tests::{Daemon, connect};

fn openshell_daemon(f: &Fixture, gw: &Gateway) -> Daemon {
    openshell_daemon_with(f, gw, &[])
}

fn openshell_daemon_with(f: &Fixture, gw: &Gateway, extra: &[(&str, &str)]) -> Daemon {
    let mut env = f.env(&[]);
    for (k, v) in gw.env(extra) {
        env.retain(|(name, _)| *name != k);
        env.push((k, v));
    }
    Daemon::start_within(&borrowed(&env), START_TIMEOUT)
}

/// No SSH-session token and no forward outlives a run.
fn assert_nothing_live(gw: &Gateway) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let state = gw.state();
        if state["live_tokens"] == 0 && state["live_forwards"] == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "tokens or forwards outlived the run: {state}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn openshell_snippets_reach_only_their_grant_through_the_relay() {
    if !docker_ready() {
        return;
    }
    let f = Fixture::start();
    let gw = Gateway::start();
    let d = openshell_daemon(&f, &gw);
    assert_eq!(d.listening["isolation"], "container", "{}", d.listening);
    let v = connect::call_as(&f.alice, "Describe", &serde_json::json!({}))
        .send(d.addr)
        .json();
    assert_eq!(v["supportsJavascriptGrants"], true, "{v}");

    // Granted: the client works through the relay, and nothing leaks into the guest.
    let code = format!(
        "(async () => {{\n{LOOK_AROUND}\n\
         const item = await host.get('/items/7');\n\
         console.log(JSON.stringify({{ item, socket: process.env.HOST_API_SOCKET, hits }}));\n\
         }})().catch((e) => {{ console.error(String(e)); process.exit(3); }});"
    );
    let out = run(d.addr, &f.alice, &code, "inv");
    assert_eq!(out.exit_code, 0, "{out:?}");
    let seen: Value = serde_json::from_str(out.stdout.trim()).expect("one JSON line");
    assert_eq!(seen["item"]["id"], 7, "{seen}");
    assert!(
        seen["socket"]
            .as_str()
            .unwrap_or_default()
            .starts_with("/tmp/.plimsoll-host-"),
        "{seen}"
    );
    assert_eq!(seen["hits"], serde_json::json!(["/tmp/decoy"]), "{seen}");
    let tokens = bearers(&f.api.requests());
    assert_eq!(tokens.len(), 1, "{:?}", f.api.requests());
    assert_eq!(verify_jwt(&tokens[0], SECRET)["sub"], "alice");
    for secret in [tokens[0].as_str(), SECRET] {
        assert!(!out.stdout.contains(secret) && !out.stderr.contains(secret));
    }
    assert!(
        gw.count("ssh_sessions_created") > 0,
        "the relay was dialled through a token"
    );
    assert_nothing_live(&gw);

    // A route outside the profile, sent raw past the client's check: refused by the broker.
    f.api.clear_requests();
    let raw = "require('http').get({ socketPath: process.env.HOST_API_SOCKET, path: '/admin' },\n\
               (res) => console.log(res.statusCode)).on('error', (e) => console.log(String(e)));";
    let out = run(d.addr, &f.alice, raw, "inv");
    assert_eq!(out.stdout, "403\n", "{out:?}");
    assert!(f.api.requests().is_empty(), "{:?}", f.api.requests());
    assert_nothing_live(&gw);

    // Without a grant: no variable, no client, and no relay started.
    let bare = "console.log(process.env.HOST_API_SOCKET, typeof host)";
    let tokens_before = gw.count("ssh_sessions_created");
    let out = run(d.addr, &f.alice, bare, "");
    assert_eq!(out.stdout, "undefined undefined\n", "{out:?}");
    assert_eq!(gw.count("ssh_sessions_created"), tokens_before);

    // A slow API does not keep the run past its deadline.
    let started = Instant::now();
    let slow = "(async () => { await host.get('/slow'); })();";
    let out = ran(&run_request(&f.alice, slow, "inv", 2_000).send(d.addr));
    assert!(out.timed_out, "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_nothing_live(&gw);

    // Hostile: hundreds of down connections held open cannot exhaust the daemon; a fresh
    // run afterwards still reaches its grant.
    let flood = "const net = require('net'); const held = [];\n\
                 for (let i = 0; i < 300; i++) { const s = net.connect(process.env.HOST_API_SOCKET); s.on('error', () => {}); held.push(s); }\n\
                 setTimeout(() => { console.log('held', held.length); process.exit(0); }, 3000);";
    let out = ran(&run_request(&f.alice, flood, "inv", 10_000).send(d.addr));
    assert_eq!(out.stdout, "held 300\n", "{out:?}");
    assert_nothing_live(&gw);
    f.api.clear_requests();
    let out = run(
        d.addr,
        &f.alice,
        "host.get('/items/7').then((v) => console.log(v.id))",
        "inv",
    );
    assert_eq!(out.stdout, "7\n", "{out:?}");

    // A foreign caller is refused as on every provider.
    assert_permission(&refused(d.addr, &f.mallory, "1", "inv"));
}

#[test]
fn openshell_projects_get_the_client_through_the_relay() {
    if !docker_ready() {
        return;
    }
    let f = Fixture::start();
    let gw = Gateway::start();
    let d = openshell_daemon(&f, &gw);
    let mut body = connect::project(
        &[(
            "main.js",
            "host.get('/items/7').then((v) => console.log(JSON.stringify(v)))",
        )],
        &["node main.js", "env | grep -c HOST_API_SOCKET"],
    );
    body["project"]["grantProfile"] = serde_json::json!("inv");
    body["timeoutMs"] = serde_json::json!(30_000);
    let resp = connect::call_as(&f.alice, "Run", &body).send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
    let v = resp.json();
    assert_eq!(v["project"]["outcome"], "PROJECT_OUTCOME_COMPLETED", "{v}");
    let stdout = |i: usize| {
        let b = v["project"]["steps"][i]["stdout"]
            .as_str()
            .unwrap_or_default();
        String::from_utf8_lossy(&connect::decode_base64(b).unwrap_or_default()).into_owned()
    };
    assert_eq!(stdout(0), "{\"id\":7}\n", "{v}");
    assert_eq!(stdout(1), "1\n", "{v}");
    let tokens = bearers(&f.api.requests());
    assert_eq!(tokens.len(), 1, "{:?}", f.api.requests());
    assert_eq!(verify_jwt(&tokens[0], SECRET)["sub"], "alice");
    assert_nothing_live(&gw);
}

/// What the guest writes where the daemon reads the relay (the relay's own stdout, which a
/// guest of the same sandbox user can open through `/proc`): a flood of `need` lines and
/// megabyte lines without an end. The daemon stays bounded: a handful of tokens, the run
/// answered, every token revoked, and the next run served.
const FORGE: &str = r#"
const fs = require('fs');
let relay = null;
for (const p of fs.readdirSync('/proc')) {
  if (!/^[0-9]+$/.test(p)) continue;
  try { if (fs.readFileSync(`/proc/${p}/cmdline`, 'latin1').includes('plimsoll-relay')) relay = p; } catch (_) {}
}
let wrote = 0;
if (relay) {
  try {
    const fd = fs.openSync(`/proc/${relay}/fd/1`, 'w');
    const needs = 'need\n'.repeat(20000);
    for (let i = 0; i < 10; i++) { fs.writeSync(fd, needs); wrote += needs.length; }
    const long = 'x'.repeat(1 << 20);
    for (let i = 0; i < 4; i++) { fs.writeSync(fd, long); wrote += long.length; }
    fs.writeSync(fd, '\nready\nneed\n');
    fs.closeSync(fd);
  } catch (e) { console.error(String(e)); }
}
host.get('/items/7').then((v) => console.log(JSON.stringify({ relay: !!relay, wrote, id: v.id })),
  (e) => console.log(JSON.stringify({ relay: !!relay, wrote, error: String(e) })));
"#;

#[test]
fn openshell_a_guest_forging_relay_lines_cannot_exhaust_the_daemon() {
    if !docker_ready() {
        return;
    }
    let f = Fixture::start();
    let gw = Gateway::start();
    let d = openshell_daemon(&f, &gw);
    let tokens_before = gw.count("ssh_sessions_created");
    let out = ran(&run_request(&f.alice, FORGE, "inv", 20_000).send(d.addr));
    let seen: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("one JSON line ({e}): {out:?}"));
    assert_eq!(seen["relay"], true, "the guest found the relay: {out:?}");
    assert!(
        seen["wrote"].as_u64().unwrap_or(0) > 1_000_000,
        "the guest wrote its flood: {out:?}"
    );
    assert_eq!(seen["id"], 7, "its own grant still worked: {out:?}");
    let made = gw.count("ssh_sessions_created") - tokens_before;
    assert!(made <= 12, "a need flood made {made} tokens");
    assert_nothing_live(&gw);
    let out = run(
        d.addr,
        &f.alice,
        "host.get('/items/7').then((v) => console.log(v.id))",
        "inv",
    );
    assert_eq!(out.stdout, "7\n", "{out:?}");
    assert_eq!(Request::get("/readyz").send(d.addr).status, 200);
}

/// Sequential granted calls timed inside the guest (`performance.now()` around each
/// `host.get`), after 5 warm-up calls; prints `p50 p95` in milliseconds.
fn granted_call_latencies(d: &Daemon, f: &Fixture, calls: usize) -> (f64, f64) {
    let code = format!(
        "(async () => {{ const t = [];\n\
         for (let i = 0; i < 5; i++) await host.get('/items/7');\n\
         for (let i = 0; i < {calls}; i++) {{ const s = performance.now(); await host.get('/items/7'); t.push(performance.now() - s); }}\n\
         t.sort((a, b) => a - b);\n\
         const q = (p) => t[Math.min(t.length - 1, Math.floor(p * t.length))];\n\
         console.log(JSON.stringify([q(0.5), q(0.95)])); }})();"
    );
    let out = ran(&run_request(&f.alice, &code, "inv", 30_000).send(d.addr));
    let v: Vec<f64> = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("two numbers ({e}): {out:?}"));
    (v[0], v[1])
}

/// The benchmark (not a timed test; run with `--ignored --nocapture`): a granted call
/// through the relay on openshell beside the same call through the run's Unix socket on
/// docker, both measured in the same run on the same API; prints p50, p95 and the ratios
/// (the target: p50 ratio at most 2).
#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn bench_granted_call_through_the_relay_against_docker() {
    if !docker_ready() {
        return;
    }
    let calls = plimsoll_tests::bench_n(200);
    let f = Fixture::start();
    let gw = Gateway::start();
    let (os_p50, os_p95) = {
        let d = openshell_daemon(&f, &gw);
        granted_call_latencies(&d, &f, calls)
    };
    let (dk_p50, dk_p95) = {
        let d = crate::grants::docker::docker_daemon(&f);
        granted_call_latencies(&d, &f, calls)
    };
    println!(
        "granted call, {calls} sequential after 5 warm-up, runtime {}:\n  \
         openshell relay  p50 {os_p50:.2} ms  p95 {os_p95:.2} ms\n  \
         docker socket    p50 {dk_p50:.2} ms  p95 {dk_p95:.2} ms\n  \
         ratio            p50 {:.2}  p95 {:.2}",
        plimsoll_tests::docker::runtime(),
        os_p50 / dk_p50,
        os_p95 / dk_p95,
    );
}

/// A session call on openshell lends its grant through a relay started for that call alone:
/// the client reaches the API with the caller's token, the call's SSH-session tokens are
/// revoked before the next call, an ungranted call sees no variable and no client, and a
/// profile without `allow_in_sessions` is refused before anything runs. A cell interpreter
/// kept from an earlier call is ended before the grant is lent (an ungranted call spares it).
#[test]
fn openshell_a_session_call_lends_its_grant_through_the_relay() {
    if !docker_ready() {
        return;
    }
    if !plimsoll_tests::openshell::sandboxes_have_yama() {
        // Sessions on openshell refuse to start without Yama (grants.md §8.6); the
        // openshell_session suite asserts that refusal. This one runs under runsc.
        eprintln!("sessions on openshell need Yama in the sandbox: not run under this runtime");
        return;
    }
    let f = Fixture::start();
    f.write_grants(&crate::grants::sessions::session_profiles(&f));
    let gw = Gateway::start();
    let d = openshell_daemon_with(&f, &gw, &[("SANDBOX_MAX_SESSIONS", "2")]);
    let call = |procedure: &str, body: Value| {
        let resp = connect::call_as(&f.alice, procedure, &body).send(d.addr);
        (resp.status, resp.json())
    };
    let (status, opened) = call(
        "OpenSession",
        serde_json::json!({ "protocol": connect::PROTOCOL }),
    );
    assert_eq!(status, 200, "{opened}");
    let id = opened["sessionId"].as_str().expect("sessionId").to_owned();
    let snippet = |code: &str, profile: &str| {
        let mut js = serde_json::json!({ "code": code });
        if !profile.is_empty() {
            js["grantProfile"] = serde_json::json!(profile);
        }
        connect::call_as(
            &f.alice,
            "SessionRun",
            &serde_json::json!({
                "protocol": connect::PROTOCOL,
                "sessionId": id,
                "timeoutMs": 30_000,
                "javascript": js,
            }),
        )
        .send(d.addr)
    };
    let stdout = |resp: &plimsoll_tests::http1::Response| {
        assert_eq!(resp.status, 200, "{resp}");
        let v = resp.json();
        let out = v["run"]["javascript"]["stdout"]
            .as_str()
            .and_then(connect::decode_base64)
            .unwrap_or_default();
        String::from_utf8_lossy(&out).into_owned()
    };

    let cell = |code: &str| {
        let resp = connect::call_as(
            &f.alice,
            "SessionRun",
            &serde_json::json!({
                "protocol": connect::PROTOCOL,
                "sessionId": id,
                "cell": { "language": "python", "code": code },
            }),
        )
        .send(d.addr);
        assert_eq!(resp.status, 200, "{resp}");
        let c = resp.json()["run"]["cell"].clone();
        let out = c["stdout"]
            .as_str()
            .and_then(connect::decode_base64)
            .unwrap_or_default();
        (
            String::from_utf8_lossy(&out).into_owned(),
            c["interpreterStarted"] == true,
        )
    };
    assert_eq!(cell("x = 1"), (String::new(), true));

    let granted = snippet(
        "host.get('/items/7').then((v) => console.log(v.id, process.env.HOST_API_SOCKET.startsWith('/tmp/')))",
        "sess",
    );
    assert_eq!(stdout(&granted), "7 true\n", "{granted}");
    let tokens = bearers(&f.api.requests());
    assert_eq!(tokens.len(), 1, "{:?}", f.api.requests());
    assert_eq!(verify_jwt(&tokens[0], SECRET)["sub"], "alice");
    assert!(
        gw.count("ssh_sessions_created") > 0,
        "dialled through a token"
    );
    assert_nothing_live(&gw);

    // The granted call ended the kept interpreter before its grant was lent.
    assert_eq!(
        cell("x = 'x' in dir(); print(x)"),
        ("False\n".to_owned(), true)
    );

    let bare = snippet("console.log(process.env.HOST_API_SOCKET, typeof host)", "");
    assert_eq!(stdout(&bare), "undefined undefined\n", "{bare}");
    // An ungranted call spares it.
    assert_eq!(cell("print(x)"), ("False\n".to_owned(), false));

    f.api.clear_requests();
    let not_for_sessions = snippet("host.get('/items/7')", "inv");
    assert_ne!(not_for_sessions.status, 200, "{not_for_sessions}");
    assert_permission(&connect::ConnectError::of(&not_for_sessions));
    assert!(f.api.requests().is_empty(), "{:?}", f.api.requests());

    let (status, closed) = call(
        "CloseSession",
        serde_json::json!({ "protocol": connect::PROTOCOL, "sessionId": id }),
    );
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["ended"], "SESSION_END_CLOSED", "{closed}");
    assert_nothing_live(&gw);
}
