//! The wasm provider end to end (providers.md §3, issue 3): a real `plimsolld` with
//! `SANDBOX_PROVIDER=wasm`, driven over loopback with Connect JSON, one daemon per test.
//!
//! Every hostile snippet must end as a typed result (never an error), and the daemon must
//! keep serving after it: `/healthz` answers ok and a plain snippet still runs.
// A test fails by panicking, with the evidence in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use base64::Engine as _;
use plimsoll_tests::connect::{self, Reason};
use plimsoll_tests::http1::{Request, Response};
use plimsoll_tests::{Daemon, wasm};
use serde_json::{Value, json};

const OUTPUT_CAP: usize = 64 * 1024;
const IDENTITY_PREFIX: &str = "quickjs-wasm:sha256:";

/// A wasm daemon with a token, no metrics listener and no rate limit, and its token.
fn wasm_daemon(extra: &[(&str, &str)]) -> (Daemon, String) {
    let mut env = vec![("PLIMSOLL_METRICS_ADDR", "off")];
    env.extend_from_slice(extra);
    wasm::wasm_daemon_with_token(&env)
}

/// What a JavaScript result says, decoded from Connect JSON (defaults are omitted there).
#[derive(Debug)]
struct Ran {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit_code: i64,
    timed_out: bool,
    stdout_truncated: bool,
    stderr_truncated: bool,
    answer: Value,
}

fn run_request(token: &str, code: &str, timeout_ms: u32) -> Request {
    let body = json!({ "protocol": connect::PROTOCOL, "timeoutMs": timeout_ms, "javascript": { "code": code } });
    connect::call_as(token, "Run", &body)
}

fn run(addr: SocketAddr, token: &str, code: &str, timeout_ms: u32) -> Ran {
    let req = run_request(token, code, timeout_ms);
    let resp = req.send(addr);
    assert_eq!(
        resp.status, 200,
        "a snippet's own failure is a result, never an error:\n{resp}"
    );
    connect::assert_bound(&resp, &req);
    decode(&resp)
}

fn decode(resp: &Response) -> Ran {
    let answer = resp.json();
    let js = answer
        .get("javascript")
        .cloned()
        .unwrap_or_else(|| panic!("no javascript result:\n{resp}"));
    let bytes = |name: &str| {
        js.get(name)
            .and_then(Value::as_str)
            .map(|b| {
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .expect("base64")
            })
            .unwrap_or_default()
    };
    let flag = |name: &str| js.get(name).and_then(Value::as_bool).unwrap_or(false);
    Ran {
        stdout: bytes("stdout"),
        stderr: bytes("stderr"),
        exit_code: js.get("exitCode").and_then(Value::as_i64).unwrap_or(0),
        timed_out: flag("timedOut"),
        stdout_truncated: flag("stdoutTruncated"),
        stderr_truncated: flag("stderrTruncated"),
        answer,
    }
}

/// `/healthz` is ok and a plain snippet still runs.
fn assert_still_serving(addr: SocketAddr, token: &str) {
    let health = Request::get("/healthz").send(addr);
    assert_eq!(
        (health.status, health.body.as_slice()),
        (200, b"ok\n".as_slice()),
        "{health}"
    );
    let after = run(addr, token, "console.log('still here')", 5_000);
    assert_eq!(
        (after.exit_code, after.stdout.as_slice()),
        (0, b"still here\n".as_slice())
    );
}

#[test]
fn describe_states_wasm_at_process_with_the_guest_identity() {
    let (d, token) = wasm_daemon(&[]);
    let resp = connect::call_as(&token, "Describe", &json!({})).send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
    let info = resp.json();
    assert_eq!(info["sandbox"], "wasm");
    assert_eq!(info["isolation"], "process");
    let env = &info["javascriptEnvironment"];
    let identity = env["identity"].as_str().expect("identity");
    let hex = identity
        .strip_prefix(IDENTITY_PREFIX)
        .expect("quickjs-wasm:sha256: prefix");
    assert!(
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{identity}"
    );
    assert_eq!(env["maxTimeoutMs"], 30_000);
    for flag in [
        "supportsProject",
        "supportsModule",
        "supportsSessions",
        "supportsProjectGrants",
    ] {
        assert!(
            !info[flag].as_bool().unwrap_or(false),
            "{flag} must be false: {info}"
        );
    }
    // wire.md §9: snippets have a credential-safe grant path (`host_call`).
    assert_eq!(info["supportsJavascriptGrants"], true, "{info}");
}

#[test]
fn six_times_seven_prints_42_with_a_record_naming_the_guest() {
    let (d, token) = wasm_daemon(&[]);
    let ran = run(d.addr, &token, "console.log(6*7)", 5_000);
    assert_eq!(ran.stdout, b"42\n");
    assert_eq!(ran.exit_code, 0);
    assert!(!ran.timed_out && !ran.stdout_truncated && !ran.stderr_truncated);
    let environment = ran.answer["environment"].as_str().expect("environment");
    assert!(environment.starts_with(IDENTITY_PREFIX), "{environment}");
    let record = &ran.answer["record"];
    assert_eq!(record["provider"], "wasm");
    assert_eq!(record["isolation"], "process");
    assert_eq!(record["environment"], environment);
    assert_eq!(record["version"], 4);
}

#[test]
fn a_failing_snippet_returns_its_exit_code_as_a_result() {
    let (d, token) = wasm_daemon(&[]);
    let ran = run(d.addr, &token, "throw 'boom'", 5_000);
    assert_ne!(ran.exit_code, 0);
    assert_eq!(ran.stderr, b"boom\n");
    assert!(!ran.timed_out);
}

#[test]
fn floor_container_is_refused_before_dispatch() {
    let (d, token) = wasm_daemon(&[]);
    let body = connect::javascript_with_floor("console.log('never')", "container");
    let req = connect::call_as(&token, "Run", &body);
    let resp = req.send(d.addr);
    connect::assert_refused(&resp, &req, "failed_precondition", Reason::Isolation);
}

#[test]
fn infinite_loop_ends_at_the_deadline_with_124_and_timed_out() {
    let (d, token) = wasm_daemon(&[]);
    let started = Instant::now();
    let ran = run(d.addr, &token, "for (;;) {}", 1_000);
    let took = started.elapsed();
    assert_eq!((ran.exit_code, ran.timed_out), (124, true));
    assert!(
        took >= Duration::from_millis(1_000),
        "ended after {took:?}, before its deadline"
    );
    assert!(took < Duration::from_secs(6), "took {took:?}");
    assert_still_serving(d.addr, &token);
}

#[test]
fn memory_bomb_fails_inside_the_guest_and_the_next_run_is_unaffected() {
    let (d, token) = wasm_daemon(&[("SANDBOX_MEMORY_MB", "64")]);
    let ran = run(
        d.addr,
        &token,
        "const k = []; for (;;) k.push(new Array(1 << 20).fill(7));",
        10_000,
    );
    assert_ne!(ran.exit_code, 0);
    assert!(!ran.timed_out);
    assert!(
        String::from_utf8_lossy(&ran.stderr).contains("out of memory"),
        "{ran:?}"
    );
    assert_still_serving(d.addr, &token);
}

#[test]
fn ten_megabytes_of_output_are_cut_at_64_kib_with_the_flag() {
    let (d, token) = wasm_daemon(&[]);
    let code = "const l = 'z'.repeat(1023); for (let i = 0; i < 10240; i++) console.log(l)";
    let ran = run(d.addr, &token, code, 10_000);
    assert_eq!(ran.exit_code, 0);
    assert_eq!(ran.stdout.len(), OUTPUT_CAP);
    assert!(ran.stdout_truncated);
    assert!(
        ran.stdout.iter().all(|b| *b == b'z' || *b == b'\n'),
        "no marker in the output"
    );
    assert!(!ran.stderr_truncated);
    assert_still_serving(d.addr, &token);
}

#[test]
fn deep_recursion_ends_as_a_trap() {
    let (d, token) = wasm_daemon(&[]);
    let ran = run(
        d.addr,
        &token,
        "function f(n) { return f(n + 1) + 1 } f(0)",
        5_000,
    );
    assert_ne!(ran.exit_code, 0);
    assert!(!ran.timed_out);
    assert!(!ran.stderr.is_empty());
    assert_still_serving(d.addr, &token);
}

#[test]
fn huge_string_and_giant_json_end_as_typed_results() {
    let (d, token) = wasm_daemon(&[]);
    let ran = run(d.addr, &token, "let s = 'x'; for (;;) s += s;", 10_000);
    assert_ne!(ran.exit_code, 0);
    assert!(!ran.timed_out && !ran.stderr.is_empty(), "{ran:?}");
    let code =
        "const s = '[' + '{\"k\":[1,2,3]},'.repeat(3e6) + '0]'; console.log(JSON.parse(s).length)";
    let ran = run(d.addr, &token, code, 10_000);
    assert!(!ran.timed_out, "{ran:?}");
    if ran.exit_code == 0 {
        assert_eq!(ran.stdout, b"3000001\n");
    } else {
        assert!(
            String::from_utf8_lossy(&ran.stderr).contains("memory"),
            "{ran:?}"
        );
    }
    assert_still_serving(d.addr, &token);
}

#[test]
fn files_cannot_be_read_through_wasi() {
    let (d, token) = wasm_daemon(&[]);
    let probe =
        "console.log([typeof require, typeof process, typeof std, typeof os, typeof fetch].join())";
    let ran = run(d.addr, &token, probe, 5_000);
    assert_eq!(
        ran.stdout,
        b"undefined,undefined,undefined,undefined,undefined\n"
    );
    for code in [
        "await import('/etc/passwd')",
        "await import('file:///etc/hostname')",
    ] {
        let ran = run(d.addr, &token, code, 5_000);
        assert_ne!(ran.exit_code, 0, "{code}: {ran:?}");
        assert!(
            !String::from_utf8_lossy(&ran.stdout).contains("root:"),
            "{code}"
        );
    }
    assert_still_serving(d.addr, &token);
}

#[test]
fn a_long_run_does_not_hold_up_a_quick_one() {
    let (d, token) = wasm_daemon(&[]);
    let addr = d.addr;
    let slow = {
        let token = token.clone();
        std::thread::spawn(move || run(addr, &token, "for (;;) {}", 3_000))
    };
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let quick = run(addr, &token, "console.log('quick')", 5_000);
    assert_eq!(quick.stdout, b"quick\n");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the quick run waited {:?}",
        started.elapsed()
    );
    assert!(!slow.is_finished(), "the quick run returned first");
    assert!(slow.join().expect("slow run").timed_out);
}

#[test]
fn sigterm_stops_a_wasm_daemon_cleanly() {
    let (mut d, token) = wasm_daemon(&[]);
    assert_eq!(run(d.addr, &token, "console.log(1)", 5_000).stdout, b"1\n");
    assert!(d.sigterm().success());
}
