//! Grants on e2b through the guard (grants.md §5, §6, issue 14): the daemon supervises the
//! broker and the guard; a granted VM is created with `allowOut` of the guard's host only and
//! the rule by which E2B's egress proxy adds the run's guard token, so the guest holds no
//! token. Against the E2B simulator, whose egress proxy terminates TLS with its own CA, adds
//! the header and forwards to the guard on loopback; VMs under `PLIMSOLL_TEST_DOCKER_RUNTIME`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};

use crate::{Fixture, SECRET, bearers, borrowed, ran, run_request, verify_jwt};
use plimsoll_tests::e2b::{E2bSim, START_TIMEOUT, e2b_ready};
use plimsoll_tests::{Daemon, connect};

/// The guard's public name, as VMs reach it (the simulator maps it to the guard's port).
const GUARD_HOST: &str = "guard.plimsoll.test";

fn e2b_daemon(f: &Fixture, sim: &E2bSim) -> Daemon {
    let mut env = f.env(&[]);
    for (k, v) in sim.env(&[
        ("E2B_GUARD_URL", &format!("https://{GUARD_HOST}")),
        ("PLIMSOLL_GUARD_ADDR", "127.0.0.1:0"),
        // The simulator's VMs reach the proxy on loopback.
        ("E2B_GUARD_ADDRESS", "127.0.0.1"),
    ]) {
        env.retain(|(name, _)| *name != k);
        env.push((k, v));
    }
    Daemon::start_within(&borrowed(&env), START_TIMEOUT)
}

/// One POST of `envelope` to the guard with `token` in `X-Plimsoll-Guard`: the status.
fn post_to_guard(addr: &str, token: &str, envelope: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).expect("connect to the guard");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "POST /v1/e2b/guard HTTP/1.1\r\nHost: {GUARD_HOST}\r\nX-Plimsoll-Guard: {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{envelope}",
        envelope.len()
    )
    .expect("write");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The guard token in a VM's read-back (E2B shows the rule's header values there). Every
/// VM plimsoll makes opens no nameserver: left out, `dnsServers` is E2B's `8.8.8.8`, open
/// on every port beside an allowed domain.
fn token_of(sim: &E2bSim, id: &str) -> Option<String> {
    let (status, detail) = sim.api("GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(status, 200, "{detail}");
    assert_eq!(
        detail["network"]["dnsServers"],
        json!([]),
        "no nameserver: {detail}"
    );
    detail["network"]["rules"][GUARD_HOST][0]["transform"]["headers"]["X-Plimsoll-Guard"]
        .as_str()
        .map(str::to_owned)
}

/// The environment of the guard child `daemon` supervises (its child named `guard`).
fn guard_environ(daemon: u32) -> String {
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let proc = entry.path();
        let status = std::fs::read_to_string(proc.join("status")).unwrap_or_default();
        let child = status.lines().any(|l| l == format!("PPid:\t{daemon}"));
        let name = std::fs::read_to_string(proc.join("comm")).unwrap_or_default();
        if child && name.trim() == "guard" {
            let raw = std::fs::read(proc.join("environ")).expect("the guard's environ");
            return String::from_utf8_lossy(&raw).replace('\0', "\n");
        }
    }
    panic!("no guard child of {daemon}");
}

#[test]
fn e2b_runs_reach_only_their_grant_through_the_guard() {
    if !e2b_ready() {
        return;
    }
    let f = Fixture::start();
    let sim = E2bSim::start();
    let d = e2b_daemon(&f, &sim);
    assert_eq!(d.listening["isolation"], "vm", "{}", d.listening);
    let guard_addr = d.listening["guard_addr"]
        .as_str()
        .filter(|a| *a != "none")
        .unwrap_or_else(|| panic!("no guard address: {}", d.listening))
        .to_owned();
    sim.sim
        .map_host(GUARD_HOST, &format!("http://{guard_addr}"), None)
        .expect("map the guard");
    // The guard faces the network: it holds none of the daemon's keys or tokens.
    let environ = guard_environ(d.pid());
    for secret in ["E2B_API_KEY=", "PLIMSOLL_TOKEN=", "PLIMSOLL_CLIENTS_FILE="] {
        assert!(!environ.contains(secret), "the guard inherited {secret}");
    }
    assert!(environ.contains("PLIMSOLL_GUARD_ADDR="), "{environ}");
    let v = connect::call_as(&f.alice, "Describe", &json!({}))
        .send(d.addr)
        .json();
    assert_eq!(v["supportsJavascriptGrants"], true, "{v}");
    assert_eq!(v["supportsProjectGrants"], true, "{v}");

    // Granted: the client reaches the API through the guard (the VM resolves no name: the
    // client connects to E2B_GUARD_ADDRESS); a route outside the grant, sent raw past the
    // client's check, is refused; the guest's environment and files hold
    // no token and no secret. The run waits so the test can read the token E2B holds.
    let code = format!(
        "(async () => {{\n\
         const item = await host.get('/items/7');\n\
         const named = await require('dns').promises.lookup('{GUARD_HOST}').then(() => 'resolved', () => 'unresolved');\n\
         const lookup = (h, o, cb) => o && o.all ? cb(null, [{{ address: '127.0.0.1', family: 4 }}]) : cb(null, '127.0.0.1', 4);\n\
         const raw = await new Promise((ok, no) => {{ const r = require('https').request({{ host: '{GUARD_HOST}', lookup, path: '/v1/e2b/guard', method: 'POST', headers: {{ 'content-type': 'application/json' }} }}, (res) => {{ res.resume(); ok({{ status: res.statusCode }}); }}); r.on('error', no); r.end(JSON.stringify({{ method: 'GET', path: '/admin' }})); }});\n\
         const fs = require('fs');\n\
         const files = [];\n\
         const walk = (d) => {{ for (const e of fs.readdirSync(d, {{ withFileTypes: true }})) {{ const p = d + '/' + e.name; if (e.isDirectory()) walk(p); else if (e.isFile()) files.push(fs.readFileSync(p, 'latin1')); }} }};\n\
         for (const d of ['/tmp', '/home/user']) walk(d);\n\
         // The needles are built here, so this file's own text does not match them.\n\
         const seen = JSON.stringify(process.env) + files.join('\\n');\n\
         await new Promise((r) => setTimeout(r, 4000));\n\
         console.log(JSON.stringify({{ item, named, raw: raw.status, crg: seen.includes(['crg', '_'].join('')), bearer: seen.includes(['ey', 'J'].join('')) }}));\n\
         }})().catch((e) => {{ console.error(String(e)); process.exit(3); }});"
    );
    let addr = d.addr;
    let alice = f.alice.clone();
    let runner =
        std::thread::spawn(move || ran(&run_request(&alice, &code, "inv", 30_000).send(addr)));
    let mut captured = None;
    sim.wait_for(Duration::from_secs(60), "the granted VM made", |ids| {
        captured = ids.iter().find_map(|id| token_of(&sim, id));
        captured.is_some()
    });
    let out = runner.join().expect("the run's thread");
    assert_eq!(out.exit_code, 0, "{out:?}");
    let seen: Value = serde_json::from_str(out.stdout.trim()).expect("one JSON line");
    assert_eq!(seen["item"]["id"], 7, "{seen}");
    assert_eq!(seen["raw"], 403, "a route outside the grant: {seen}");
    assert_eq!(
        seen["named"], "unresolved",
        "no nameserver in a granted VM: {seen}"
    );
    assert_eq!(seen["crg"], false, "a guard token in the guest: {seen}");
    assert_eq!(seen["bearer"], false, "a JWT in the guest: {seen}");
    let requests = f.api.requests();
    let tokens = bearers(&requests);
    assert_eq!(
        tokens.len(),
        1,
        "only the granted route reached the API: {requests:?}"
    );
    assert_eq!(verify_jwt(&tokens[0], SECRET)["sub"], "alice");
    let token = captured.expect("the token E2B held");
    assert!(token.starts_with("crg_"), "a guard token: {token}");
    for secret in [tokens[0].as_str(), SECRET, token.as_str()] {
        assert!(!out.stdout.contains(secret) && !out.stderr.contains(secret));
    }
    // The token died with the run.
    assert_eq!(
        post_to_guard(&guard_addr, &token, r#"{"method":"GET","path":"/items/7"}"#),
        401
    );
    assert_eq!(bearers(&f.api.requests()).len(), 1);

    // A granted project: every node a step starts has the client.
    f.api.clear_requests();
    let body = json!({ "protocol": connect::PROTOCOL, "timeoutMs": 60_000,
        "project": { "files": [{ "path": "main.mjs", "content": "console.log((await host.get('/items/7')).id)" }],
                     "steps": ["node main.mjs"], "grantProfile": "inv" } });
    let v = connect::call_as(&f.alice, "Run", &body).send(d.addr).json();
    assert_eq!(v["project"]["outcome"], "PROJECT_OUTCOME_COMPLETED", "{v}");
    let stdout = v["project"]["steps"][0]["stdout"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(
        connect::decode_base64(stdout).expect("base64"),
        b"7\n",
        "{v}"
    );
    let tokens = bearers(&f.api.requests());
    assert_eq!(tokens.len(), 1, "{:?}", f.api.requests());
    assert_eq!(verify_jwt(&tokens[0], SECRET)["sub"], "alice");

    // Without a grant the VM has no way out at all.
    let bare = "fetch('https://guard.plimsoll.test/v1/e2b/guard', { method: 'POST' }).then(r => console.log(r.status), () => console.log('blocked'))";
    let out = ran(&run_request(&f.alice, bare, "", 20_000).send(d.addr));
    assert_eq!(out.stdout, "blocked\n", "{out:?}");
    sim.wait_empty(Duration::from_secs(60));
}

/// The session's VM's network as its read-back shows it: `(allowOut, guard token)`.
fn network_of(sim: &E2bSim, session_instance: &str) -> (Value, Option<String>) {
    let id = session_instance
        .strip_prefix("e2b-sandbox:")
        .expect("an e2b-sandbox instance");
    let (status, detail) = sim.api("GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(status, 200, "{detail}");
    (detail["network"]["allowOut"].clone(), token_of(sim, id))
}

/// One session call as alice: the answer's `run`, or the refusal.
fn session_call(
    d: &Daemon,
    token: &str,
    id: &str,
    code: &str,
    profile: &str,
) -> Result<Value, connect::ConnectError> {
    let mut js = json!({ "code": code });
    if !profile.is_empty() {
        js["grantProfile"] = json!(profile);
    }
    let body = json!({ "protocol": connect::PROTOCOL, "sessionId": id, "timeoutMs": 30_000, "javascript": js });
    let resp = connect::call_as(token, "SessionRun", &body).send(d.addr);
    if resp.status != 200 {
        return Err(connect::ConnectError::of(&resp));
    }
    Ok(resp.json()["run"].clone())
}

fn stdout_of(run: &Value) -> String {
    let b64 = run["javascript"]["stdout"].as_str().unwrap_or_default();
    String::from_utf8_lossy(&connect::decode_base64(b64).expect("base64")).into_owned()
}

/// `E2B_SESSION_GRANTS` (grants.md §6.7): `session` makes the session's VM with the guard rule
/// and one session-long token that serves only while a call has lent its grant (401 between
/// calls); `call` keeps the VM deny-all between calls and puts the rule on
/// (`PUT /sandboxes/{id}/network`) only for a granted call; unset refuses a granted session
/// call `unsupported` with nothing run and nothing reaching the API.
#[test]
fn e2b_session_grants_follow_e2b_session_grants() {
    if !e2b_ready() {
        return;
    }
    let f = Fixture::start();
    f.write_grants(&super::sessions::session_profiles(&f));
    let sim = E2bSim::start();
    let granted = "(async () => { console.log((await host.get('/items/7')).id); })().catch((e) => { console.error(String(e)); process.exit(3); });";
    // Past the client and the CA check: only the guard's answer (or no way out) counts. The
    // VM has no nameserver, so the guard's name goes to an address given here, as the
    // client library does.
    let raw = format!(
        "const lookup = (h, o, cb) => o && o.all ? cb(null, [{{ address: '127.0.0.1', family: 4 }}]) : cb(null, '127.0.0.1', 4);\n\
         const r = require('https').request({{ host: '{GUARD_HOST}', lookup, path: '/v1/e2b/guard', method: 'POST', rejectUnauthorized: false, headers: {{ 'content-type': 'application/json' }} }}, (res) => {{ console.log(res.statusCode); res.resume(); }});\n\
         r.on('error', () => console.log('blocked'));\n\
         r.end(JSON.stringify({{ method: 'GET', path: '/items/7' }}));"
    );
    for mode in ["session", "call", ""] {
        let mut env = f.env(&[]);
        for (k, v) in sim.env(&[
            ("E2B_GUARD_URL", &format!("https://{GUARD_HOST}")),
            ("PLIMSOLL_GUARD_ADDR", "127.0.0.1:0"),
            // The simulator's VMs reach the proxy on loopback.
            ("E2B_GUARD_ADDRESS", "127.0.0.1"),
            ("E2B_SESSION_GRANTS", mode),
            ("SANDBOX_MAX_SESSIONS", "2"),
            ("SANDBOX_SESSION_IDLE", "10m"),
        ]) {
            env.retain(|(name, _)| *name != k);
            env.push((k, v));
        }
        let d = Daemon::start_within(&borrowed(&env), START_TIMEOUT);
        let guard_addr = d.listening["guard_addr"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        sim.sim
            .map_host(GUARD_HOST, &format!("http://{guard_addr}"), None)
            .expect("map the guard");
        f.api.clear_requests();
        let resp = connect::call_as(
            &f.alice,
            "OpenSession",
            &json!({ "protocol": connect::PROTOCOL }),
        )
        .send(d.addr);
        assert_eq!(resp.status, 200, "{mode}: open: {resp}");
        let id = resp.json()["sessionId"]
            .as_str()
            .expect("sessionId")
            .to_owned();
        let first = session_call(&d, &f.alice, &id, "console.log('hi')", "").expect("a plain call");
        let instance = first["instance"].as_str().unwrap_or_default().to_owned();
        let (allow, opened_token) = network_of(&sim, &instance);
        match mode {
            "session" => {
                assert_eq!(allow, json!([GUARD_HOST]), "{mode}");
                let token = opened_token.expect("the session's token in the rule");
                // Between calls the token is dead at the guard, and the guest sees 401.
                let envelope = r#"{"method":"GET","path":"/items/7"}"#;
                assert_eq!(post_to_guard(&guard_addr, &token, envelope), 401, "{mode}");
                let out = stdout_of(&session_call(&d, &f.alice, &id, &raw, "").expect("raw"));
                assert_eq!(out, "401\n", "{mode}: an ungranted call reaches no grant");
                for _ in 0..2 {
                    let run = session_call(&d, &f.alice, &id, granted, "sess").expect("granted");
                    assert_eq!(stdout_of(&run), "7\n", "{mode}: {run}");
                    assert_eq!(
                        network_of(&sim, &instance).1.as_deref(),
                        Some(token.as_str())
                    );
                }
                assert_eq!(post_to_guard(&guard_addr, &token, envelope), 401, "{mode}");
                let tokens = bearers(&f.api.requests());
                assert_eq!(tokens.len(), 2, "{mode}: {:?}", f.api.requests());
                assert_eq!(verify_jwt(&tokens[0], SECRET)["sub"], "alice");
            }
            "call" => {
                assert!(
                    allow.is_null() || allow == json!([]),
                    "{mode}: deny-all between calls: {allow}"
                );
                assert!(opened_token.is_none(), "{mode}");
                for _ in 0..2 {
                    let run = session_call(&d, &f.alice, &id, granted, "sess").expect("granted");
                    assert_eq!(stdout_of(&run), "7\n", "{mode}: {run}");
                    // The rule is off again once the call is answered.
                    let (allow, token) = network_of(&sim, &instance);
                    assert!(allow.is_null() || allow == json!([]), "{mode}: {allow}");
                    assert!(token.is_none(), "{mode}");
                }
                let out = stdout_of(&session_call(&d, &f.alice, &id, &raw, "").expect("raw"));
                assert_eq!(out, "blocked\n", "{mode}: no way out between granted calls");
                let tokens = bearers(&f.api.requests());
                assert_eq!(tokens.len(), 2, "{mode}: {:?}", f.api.requests());
                assert_eq!(verify_jwt(&tokens[0], SECRET)["sub"], "alice");
            }
            _ => {
                assert!(opened_token.is_none(), "unset: no rule");
                let err = session_call(&d, &f.alice, &id, granted, "sess").expect_err("refused");
                assert_eq!(err.code, "unimplemented", "unset: {err:?}");
                assert!(
                    bearers(&f.api.requests()).is_empty(),
                    "nothing reached the API"
                );
                // The session goes on.
                let run = session_call(&d, &f.alice, &id, "console.log('on')", "").expect("on");
                assert_eq!(stdout_of(&run), "on\n");
            }
        }
        drop(d);
        sim.wait_empty(Duration::from_secs(60));
    }
}

/// `E2B_SESSION_GRANTS=call` (grants.md §5.4, §6.7): each granted call gets a guard token of
/// its own, minted by the broker for that call and named only in the VM's rule while the call
/// runs. The token read from the rule during call N reaches the run during call N (the
/// broker's route check answers), is 401 once call N is answered and during call N+1, and
/// call N+1's token differs; none reaches the daemon's log.
#[test]
fn e2b_call_mode_gives_each_granted_call_a_fresh_guard_token() {
    if !e2b_ready() {
        return;
    }
    let f = Fixture::start();
    f.write_grants(&super::sessions::session_profiles(&f));
    let sim = E2bSim::start();
    let mut env = f.env(&[]);
    for (k, v) in sim.env(&[
        ("E2B_GUARD_URL", &format!("https://{GUARD_HOST}")),
        ("PLIMSOLL_GUARD_ADDR", "127.0.0.1:0"),
        // The simulator's VMs reach the proxy on loopback.
        ("E2B_GUARD_ADDRESS", "127.0.0.1"),
        ("E2B_SESSION_GRANTS", "call"),
        ("SANDBOX_MAX_SESSIONS", "2"),
        ("SANDBOX_SESSION_IDLE", "10m"),
    ]) {
        env.retain(|(name, _)| *name != k);
        env.push((k, v));
    }
    let d = Daemon::start_within(&borrowed(&env), START_TIMEOUT);
    let guard_addr = d.listening["guard_addr"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    sim.sim
        .map_host(GUARD_HOST, &format!("http://{guard_addr}"), None)
        .expect("map the guard");
    let resp = connect::call_as(
        &f.alice,
        "OpenSession",
        &json!({ "protocol": connect::PROTOCOL }),
    )
    .send(d.addr);
    assert_eq!(resp.status, 200, "open: {resp}");
    let id = resp.json()["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_owned();
    let first = session_call(&d, &f.alice, &id, "console.log('hi')", "").expect("a plain call");
    let instance = first["instance"].as_str().unwrap_or_default().to_owned();
    assert!(
        network_of(&sim, &instance).1.is_none(),
        "no token between calls"
    );
    // A granted call that lasts a while, so the test can read the rule's token and try it
    // at the guard meanwhile.
    let slow = "(async () => { await new Promise((r) => setTimeout(r, 2000)); console.log((await host.get('/items/7')).id); })().catch((e) => { console.error(String(e)); process.exit(3); });";
    // The test's own probe names a route outside the grant: a live token reaches the run
    // and the broker's route check (403), a dead one stops at the token (401), and the
    // session's route cap (two calls of `GET /items/*` for its whole life) is left to the
    // guest's calls.
    let envelope = r#"{"method":"GET","path":"/not-allowed"}"#;
    let mut seen: Vec<String> = Vec::new();
    for n in 0..2 {
        let (addr, alice, session) = (d.addr, f.alice.clone(), id.clone());
        let call = std::thread::spawn(move || {
            let body = json!({ "protocol": connect::PROTOCOL, "sessionId": session, "timeoutMs": 30_000, "javascript": { "code": slow, "grantProfile": "sess" } });
            connect::call_as(&alice, "SessionRun", &body).send(addr)
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let token = loop {
            if let (_, Some(token)) = network_of(&sim, &instance) {
                break token;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "call {n}: no guard rule while it ran"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(!seen.contains(&token), "call {n} reused an earlier token");
        // Live during its own call; every earlier call's token is dead.
        assert_eq!(
            post_to_guard(&guard_addr, &token, envelope),
            403,
            "call {n}"
        );
        for old in &seen {
            assert_eq!(post_to_guard(&guard_addr, old, envelope), 401, "call {n}");
        }
        let resp = call.join().expect("the call's thread");
        assert_eq!(resp.status, 200, "call {n}: {resp}");
        assert_eq!(stdout_of(&resp.json()["run"]), "7\n", "call {n}");
        // Dead once the call is answered.
        assert_eq!(
            post_to_guard(&guard_addr, &token, envelope),
            401,
            "call {n}"
        );
        assert!(
            network_of(&sim, &instance).1.is_none(),
            "call {n}: rule off"
        );
        seen.push(token);
    }
    let logs = d.logs().join("\n");
    for token in &seen {
        assert!(!logs.contains(token.as_str()), "a call's token was logged");
    }

    // E2B takes the call's rule but loses `dnsServers` (its default nameserver then opens
    // beside the guard's name): the read-back after the put refuses the call, nothing ran,
    // and the rule comes off again.
    sim.sim
        .set_faults(&json!({ "networkUpdateDropsDnsServers": true }))
        .expect("faults");
    let refused = session_call(&d, &f.alice, &id, "console.log('ran')", "sess")
        .expect_err("a rule that opens a nameserver");
    assert_eq!(refused.code, "failed_precondition", "{refused:?}");
    assert!(refused.message.contains("did not read back"), "{refused:?}");
    sim.sim.set_faults(&json!({})).expect("faults");
    let after =
        session_call(&d, &f.alice, &id, "console.log('on')", "").expect("the session goes on");
    assert_eq!(stdout_of(&after), "on\n");
    // Read directly: the take-off went through while E2B was still losing `dnsServers`,
    // which opens nothing without a domain in `allowOut`.
    let vm = instance
        .strip_prefix("e2b-sandbox:")
        .expect("an e2b-sandbox instance");
    let (status, detail) = sim.api("GET", &format!("/sandboxes/{vm}"), None);
    assert_eq!(status, 200, "{detail}");
    let network = &detail["network"];
    assert!(
        network["allowOut"].is_null() || network["allowOut"] == json!([]),
        "rule off: {network}"
    );
    assert!(network["rules"].is_null(), "rule off: {network}");
}
