//! Paid allowances on e2b (config.md §3.1, providers.md §10.2, wire.md §6.1 step 8): each
//! caller's own `paid_seconds_per_day` from the clients file and the daemon's
//! `SANDBOX_PAID_SECONDS_PER_DAY`, reserved at admission (a run's timeout, a session's
//! lifetime, each plus the 33 s teardown bound). A caller over its own day is refused
//! `resource_exhausted` + `capacity` with no VM made while another caller still runs, and
//! `/metrics` counts `paid_caller`; the daemon's day spent refuses everyone (`paid_daemon`).

use std::time::{Duration, Instant};

use plimsoll_tests::Daemon;
use plimsoll_tests::connect::{self, ConnectError, Reason};
use plimsoll_tests::e2b::{E2bSim, e2b_ready};
use plimsoll_tests::http1::{Request, Response};
use plimsoll_tests::{ClientsFile, fresh_token};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{field, send, snippet};

/// A clients file of `(id, token, paid_seconds_per_day)`.
fn clients(entries: &[(&str, &str, Option<u64>)]) -> ClientsFile {
    let clients: Vec<Value> = entries
        .iter()
        .map(|(id, token, paid)| {
            let mut c = json!({
                "id": id,
                "token_sha256": hex::encode(Sha256::digest(token.as_bytes())),
                "scopes": ["code:run"],
            });
            if let Some(n) = paid {
                c["paid_seconds_per_day"] = json!(n);
            }
            c
        })
        .collect();
    ClientsFile::raw(&json!({ "clients": clients }).to_string())
}

fn daemon(e2b: &E2bSim, file: &ClientsFile, extra: &[(&str, &str)]) -> Daemon {
    let path = file.path_str();
    let mut env = vec![
        ("PLIMSOLL_CLIENTS_FILE", path.as_str()),
        ("PLIMSOLL_METRICS_ADDR", "127.0.0.1:0"),
    ];
    env.extend_from_slice(extra);
    e2b.daemon(&env)
}

fn run_as(d: &Daemon, token: &str, body: &Value) -> Response {
    send(d.addr, &connect::call_as(token, "Run", body))
}

/// A run that must be answered; its stdout.
fn ran(d: &Daemon, token: &str, body: &Value) -> String {
    let resp = run_as(d, token, body);
    assert_eq!(resp.status, 200, "{body}: {resp}");
    let v = resp.json();
    assert_eq!(v["isolation"], "vm", "{v}");
    field(&v["javascript"], "stdout")
}

/// `resp` is the paid refusal: `resource_exhausted`, not dispatched for `capacity`, the
/// message naming `names`, and no VM made beside `before`.
fn refused_paid(e2b: &E2bSim, resp: &Response, names: &str, before: &[String]) {
    assert_ne!(resp.status, 200, "must be refused: {resp}");
    let err = ConnectError::of(resp);
    assert_eq!(err.code, "resource_exhausted", "{err:?}");
    assert_eq!(
        err.not_dispatched(),
        Some(Reason::Capacity.detail_bytes()),
        "{err:?}"
    );
    assert!(err.message.contains(names), "{err:?}");
    assert!(err.message.contains("nothing ran"), "{err:?}");
    assert_eq!(e2b.ids(), before, "a refused call made a VM");
}

fn shed(d: &Daemon, reason: &str) -> u64 {
    let addr = d.metrics_addr.expect("metrics listener on");
    let resp = Request::get("/metrics").send(addr);
    assert_eq!(resp.status, 200, "{resp}");
    let series = format!("plimsoll_shed_total{{reason=\"{reason}\"}} ");
    let text = resp.text();
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series}in:\n{text}"))
}

fn open_session(d: &Daemon, token: &str, lifetime_ms: u32) -> Response {
    let body = json!({ "protocol": connect::PROTOCOL, "lifetimeMs": lifetime_ms });
    send(d.addr, &connect::call_as(token, "OpenSession", &body))
}

/// Caller `a` has 100 paid seconds a day, caller `b` none of its own (only the daemon's
/// day, unset here, applies). A session reserves its whole lifetime at open: `a`'s of 120 s
/// (153 s with the teardown bound) is refused and one of 40 s (73 s) is opened; beside it
/// `a`'s 5 s run (38 s) is refused with no VM made, while `b`'s 30 s run runs. Once the
/// session is closed, and charged only what it held, `a`'s 30 s run (63 s) fits. Runs with
/// sessions on, so the daemon's own startup session proof is shown to charge no caller.
#[test]
fn a_caller_over_its_own_paid_allowance_is_refused_while_another_runs() {
    if !e2b_ready() {
        return;
    }
    let (a, b) = (fresh_token(), fresh_token());
    let file = clients(&[("a", &a, Some(100)), ("b", &b, None)]);
    let e2b = E2bSim::start();
    let d = daemon(
        &e2b,
        &file,
        &[
            ("SANDBOX_MAX_SESSIONS", "2"),
            ("SANDBOX_SESSION_IDLE", "2s"),
        ],
    );
    e2b.wait_empty(Duration::from_secs(60));

    refused_paid(
        &e2b,
        &open_session(&d, &a, 120_000),
        "paid_seconds_per_day=100",
        &[],
    );
    assert_eq!(shed(&d, "paid_caller"), 1);
    let resp = open_session(&d, &a, 40_000);
    assert_eq!(resp.status, 200, "{resp}");
    let id = resp.json()["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_owned();
    let session_vm = e2b.ids();
    assert_eq!(session_vm.len(), 1, "{session_vm:?}");

    // Beside the session's 73 s, a's 5 s run (38 s) does not fit in 100.
    let resp = run_as(&d, &a, &snippet("console.log('must not run')", 5_000));
    refused_paid(&e2b, &resp, "paid_seconds_per_day=100", &session_vm);
    assert_eq!(shed(&d, "paid_caller"), 2);
    // Another caller is not held to a's day.
    let long = snippet("console.log('b ran')", 30_000);
    assert_eq!(ran(&d, &b, &long), "b ran\n");

    let close = json!({ "protocol": connect::PROTOCOL, "sessionId": id });
    let resp = send(d.addr, &connect::call_as(&a, "CloseSession", &close));
    assert_eq!(resp.status, 200, "{resp}");
    // Closed and killed, the session is charged what it held: a's longest run fits (the
    // charge settles when the kill is answered, a moment after the VM is listed as gone).
    e2b.wait_empty(Duration::from_secs(60));
    let body = snippet("console.log('fits')", 30_000);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp = run_as(&d, &a, &body);
        if resp.status == 200 {
            assert_eq!(field(&resp.json()["javascript"], "stdout"), "fits\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still refused after the close: {resp}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(shed(&d, "paid_daemon"), 0);
}

/// The daemon's day is shared: with 100 s a day, while `a`'s 30 s run (63 s) holds its VM,
/// `b`'s 5 s run (38 s) is refused `paid_daemon` although `b`'s own day is far from spent;
/// once `a`'s VM is killed and charged what it held, `b` runs.
#[test]
fn the_daemons_paid_allowance_refuses_every_caller() {
    if !e2b_ready() {
        return;
    }
    let (a, b) = (fresh_token(), fresh_token());
    let file = clients(&[("a", &a, Some(1000)), ("b", &b, Some(1000))]);
    let e2b = E2bSim::start();
    let d = daemon(&e2b, &file, &[("SANDBOX_PAID_SECONDS_PER_DAY", "100")]);
    e2b.wait_empty(Duration::from_secs(60));

    let (addr, a_token) = (d.addr, a.clone());
    let holder = std::thread::spawn(move || {
        let body = snippet("setTimeout(() => console.log('held'), 6000)", 30_000);
        send(addr, &connect::call_as(&a_token, "Run", &body))
    });
    e2b.wait_for(Duration::from_secs(60), "a's VM is made", |ids| {
        ids.len() == 1
    });
    let held_vm = e2b.ids();
    let resp = run_as(&d, &b, &snippet("console.log('must not run')", 5_000));
    refused_paid(&e2b, &resp, "SANDBOX_PAID_SECONDS_PER_DAY=100", &held_vm);
    assert_eq!(shed(&d, "paid_daemon"), 1);
    assert_eq!(shed(&d, "paid_caller"), 0);
    let held = holder.join().expect("a's run");
    assert_eq!(held.status, 200, "{held}");
    assert_eq!(field(&held.json()["javascript"], "stdout"), "held\n");
    e2b.wait_empty(Duration::from_secs(60));
    let body = snippet("console.log('b ran')", 5_000);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp = run_as(&d, &b, &body);
        if resp.status == 200 {
            assert_eq!(field(&resp.json()["javascript"], "stdout"), "b ran\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still refused after a's VM was killed: {resp}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
