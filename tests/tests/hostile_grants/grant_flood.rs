//! Issue 12, part 1: one caller floods `Run` with requests that name a grant profile it
//! cannot use (an unknown one), or one it may use with a floor above the tier, while
//! another caller makes one granted run per second.
//!
//! What must hold: nothing a refused request causes reaches the broker; every refused
//! request costs its caller a rate token, so the flooder is soon refused by the rate limit
//! alone; the other caller's runs go through; `/readyz` stays 200; and no run socket is
//! left behind.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plimsoll_tests::Daemon;
use plimsoll_tests::connect::ConnectError;
use plimsoll_tests::http1::Connection;

use crate::{
    Fixture, borrowed, broker_said, eventually, guest_sockets, readyz, run_request, stdout,
};

/// How long the flood lasts.
const FLOOD: Duration = Duration::from_secs(15);
/// Connections the flooder keeps busy.
const FLOOD_CONNECTIONS: usize = 100;
/// The rate limit every caller gets: two runs a second, a bucket of 20.
const RATE_PER_MIN: u64 = 120;
const RATE_BURST: u64 = 20;
/// The granted run the other caller makes once a second.
const GRANTED: &str = "console.log((await host.get('/items/7')).id)";

/// What the flooder's requests were answered with.
#[derive(Default)]
struct Answers {
    rate_limited: AtomicU64,
    permission: AtomicU64,
    isolation: AtomicU64,
    other: AtomicU64,
    broken: AtomicU64,
}

/// The attack of issue 12, part 1, through the real daemon and broker (wasm provider,
/// loopback only, 15 s of flooding at 100 connections).
///
/// This is a regression test: it fails on main before the fix and passes after. Against
/// main's binaries (6b3c389) the flooder got 0 rate refusals and 27,038 permission
/// refusals, each of which made the broker open a grant, and 1 of the other caller's 15
/// granted runs succeeded ("the grant broker is not answering").
#[test]
fn a_flood_of_refused_grant_requests_does_not_reach_the_broker_or_starve_another_caller() {
    let f = Fixture::start();
    f.seed_wasm_cache();
    let rate = RATE_PER_MIN.to_string();
    let burst = RATE_BURST.to_string();
    let env = f.env(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("SANDBOX_RATE_PER_MIN", rate.as_str()),
        ("SANDBOX_RATE_BURST", burst.as_str()),
    ]);
    let d = Daemon::start(&borrowed(&env));
    let addr = d.addr;
    // The granted path works before the flood.
    let first = run_request(&f.alice, GRANTED, "inv", "", 10_000).send(addr);
    assert_eq!(stdout(&first).as_deref(), Some("7\n"), "{first}");

    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Answers::default());
    let flood_started = Instant::now();
    let flooders: Vec<_> = (0..FLOOD_CONNECTIONS)
        .map(|i| {
            let (stop, answers, token) = (stop.clone(), answers.clone(), f.mallory.clone());
            std::thread::spawn(move || flood(addr, &token, i, &stop, &answers))
        })
        .collect();
    let probes = Arc::new(Mutex::new(Vec::new()));
    let prober = {
        let (stop, probes) = (stop.clone(), probes.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let status = readyz(addr);
                probes.lock().unwrap().push(status);
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    // The other caller: one granted run a second while the flood lasts.
    let mut outcomes = Vec::new();
    let mut next = Instant::now();
    while flood_started.elapsed() < FLOOD {
        let resp = run_request(&f.alice, GRANTED, "inv", "", 10_000).send(addr);
        outcomes.push(match stdout(&resp) {
            Some(out) if out == "7\n" => Ok(()),
            _ => Err(resp.to_string()),
        });
        next += Duration::from_secs(1);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    stop.store(true, Ordering::Relaxed);
    for t in flooders {
        t.join().expect("a flood thread");
    }
    let flood_lasted = flood_started.elapsed();
    prober.join().expect("the readiness prober");

    let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let (rate_limited, permission, isolation, other, broken) = (
        count(&answers.rate_limited),
        count(&answers.permission),
        count(&answers.isolation),
        count(&answers.other),
        count(&answers.broken),
    );
    let summary = format!(
        "flooder: {rate_limited} rate-limited, {permission} permission, {isolation} isolation, \
         {other} other, {broken} broken connections in {flood_lasted:?}"
    );
    eprintln!("{summary}");
    // The other caller's runs went through.
    let ok = outcomes.iter().filter(|o| o.is_ok()).count();
    let failures: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(
        ok * 10 >= outcomes.len() * 9 && outcomes.len() >= 10,
        "{ok} of {} granted runs succeeded during the flood ({summary}); failures: {failures:#?}",
        outcomes.len()
    );
    // /readyz stayed 200.
    let probes = probes.lock().unwrap().clone();
    assert!(
        probes.len() >= 10,
        "readiness probed {} times",
        probes.len()
    );
    assert!(
        probes.iter().all(|&s| s == 200),
        "/readyz answered {probes:?} during the flood"
    );
    // The flooder was rate-limited: at most its bucket and the refill were refused any other
    // way (each of those cost a token), and everything else was the rate refusal.
    let tokens = RATE_BURST + RATE_PER_MIN * (flood_lasted.as_millis() as u64 + 1_000) / 60_000;
    assert_eq!(other, 0, "{summary}");
    assert!(
        permission + isolation <= tokens,
        "the flooder got {} refusals that were not the rate limit, more than the {tokens} \
         tokens it had ({summary})",
        permission + isolation
    );
    assert!(
        permission > 0 && isolation > 0,
        "both kinds were refused: {summary}"
    );
    assert!(rate_limited > 1_000, "{summary}");
    // Nothing of the flood reached the broker: it opened no grant for the flooder, and one for
    // each of the other caller's runs.
    assert_eq!(
        broker_said(&d, "grant run opened", "caller", "mallory"),
        0,
        "a refused request reached the broker ({summary})"
    );
    let opened = broker_said(&d, "grant run opened", "caller", "alice");
    assert_eq!(opened, ok + 1, "one grant per granted run");
    // No run socket outlives its run.
    eventually("every grant closed", Duration::from_secs(10), || {
        broker_said(&d, "grant run closed", "caller", "alice") == opened
    });
    let left = guest_sockets(f.tmp.path());
    assert!(left.is_empty(), "run sockets left behind: {left:?}");
    assert_eq!(readyz(addr), 200);
}

/// One flood connection: requests naming an unknown profile, and requests naming an
/// allowed one with a floor above the wasm tier, alternately, on a kept-alive connection
/// (a new one whenever the daemon closes it), until `stop`.
fn flood(addr: SocketAddr, token: &str, n: usize, stop: &AtomicBool, answers: &Answers) {
    let unknown = run_request(token, "1", "nope", "", 1_000).to_bytes(addr);
    let floored = run_request(token, "1", "inv", "vm", 1_000).to_bytes(addr);
    let mut i = n;
    while !stop.load(Ordering::Relaxed) {
        let mut conn = Connection::open(addr);
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            let req = if i.is_multiple_of(2) {
                &unknown
            } else {
                &floored
            };
            let resp = match conn.send(req).and_then(|()| conn.read_response(false)) {
                Ok(resp) => resp,
                Err(_) => {
                    answers.broken.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            };
            let err = ConnectError::of(&resp);
            let counter = match err.code.as_str() {
                "resource_exhausted" if err.message.contains("rate limit") => &answers.rate_limited,
                "permission_denied" => &answers.permission,
                "failed_precondition" => &answers.isolation,
                _ => {
                    eprintln!("unexpected answer to the flooder: {resp}");
                    &answers.other
                }
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if resp.closes() {
                break;
            }
        }
    }
}
