//! Admission end to end (providers.md §10, wire.md §6.1 step 8 and §8.3, issue 6): a real
//! `plimsolld` with `SANDBOX_PROVIDER=wasm`, whose busy loop `for (;;) {}` holds a slot
//! until its deadline, driven over loopback. One daemon per test.
//!
//! Slot counts are observed through `/metrics` (`plimsoll_inflight`), polled with a
//! deadline; no test sleeps to make its point. Refusal times are measured against the
//! slow runs they were refused beside.
// A test fails by panicking, with the evidence in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use plimsoll_tests::connect::{self, Reason};
use plimsoll_tests::http1::{Connection, Request, Response};
use plimsoll_tests::wasm::{warm_cache, wasm_daemon, wasm_daemon_with_token};
use plimsoll_tests::{ClientsFile, Daemon, fresh_token};
use serde_json::{Value, json};

/// How long a capacity refusal may take, at most, while every slot is busy. The issue
/// asks for a few milliseconds in the daemon; this bound leaves room for a loaded test
/// machine and a debug build, and is still a small fraction of a slow run.
const REFUSAL_BOUND: Duration = Duration::from_millis(500);

/// How long a slot count may take to reach what a test waits for.
const SETTLE: Duration = Duration::from_secs(40);

const BUSY_LOOP: &str = "for (;;) {}";

/// A wasm daemon with one shared token, no rate limit and no per-caller cap, so only the
/// global cap (and the memory budget) decide; `env` goes on top.
fn capped_daemon(env: &[(&str, &str)]) -> (Daemon, String) {
    let mut full = vec![("SANDBOX_PER_KEY_CONCURRENT", "0")];
    full.extend_from_slice(env);
    wasm_daemon_with_token(&full)
}

fn run_body(code: &str, timeout_ms: u32) -> Value {
    json!({ "protocol": connect::PROTOCOL, "timeoutMs": timeout_ms, "javascript": { "code": code } })
}

fn run_request(token: &str, code: &str, timeout_ms: u32) -> Request {
    connect::call_as(token, "Run", &run_body(code, timeout_ms))
}

// === the metrics listener ===

fn metrics_text(d: &Daemon) -> String {
    let resp = Request::get("/metrics").send(d.metrics_addr.expect("metrics listener on"));
    assert_eq!(resp.status, 200, "{resp}");
    resp.text()
}

/// The value of the sample whose name and labels are exactly `series`.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no sample {series}:\n{text}"))
}

fn inflight(d: &Daemon) -> f64 {
    sample(&metrics_text(d), "plimsoll_inflight")
}

fn shed(d: &Daemon, reason: &str) -> f64 {
    sample(
        &metrics_text(d),
        &format!("plimsoll_shed_total{{reason=\"{reason}\"}}"),
    )
}

/// Polls `plimsoll_inflight` until it is `n`; panics after [`SETTLE`].
fn wait_inflight(d: &Daemon, n: u32) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let now = inflight(d);
        if now == f64::from(n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "plimsoll_inflight stayed at {now}, not {n}, for {SETTLE:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

// === answers ===

/// One answer, timed from just before its request was sent.
struct Timed {
    req: Request,
    resp: Response,
    took: Duration,
}

fn timed(addr: SocketAddr, req: Request) -> Timed {
    let started = Instant::now();
    let resp = req.send(addr);
    Timed {
        took: started.elapsed(),
        req,
        resp,
    }
}

/// Starts `count` slow runs at once (released together by a barrier), each a busy loop
/// with `timeout_ms`.
fn slow_runs(
    addr: SocketAddr,
    token: &str,
    count: usize,
    timeout_ms: u32,
) -> Vec<JoinHandle<Timed>> {
    let barrier = Arc::new(Barrier::new(count));
    (0..count)
        .map(|_| {
            let barrier = barrier.clone();
            let req = run_request(token, BUSY_LOOP, timeout_ms);
            std::thread::spawn(move || {
                barrier.wait();
                timed(addr, req)
            })
        })
        .collect()
}

/// Asserts `resp` is a busy loop that ran to its deadline: 200, exit 124, timed out.
fn assert_timed_out(resp: &Response, req: &Request) {
    assert_eq!(resp.status, 200, "{resp}");
    connect::assert_bound(resp, req);
    let js = &resp.json()["javascript"];
    assert_eq!(js["exitCode"], 124, "{resp}");
    assert_eq!(js["timedOut"], true, "{resp}");
}

/// [`assert_timed_out`] on a joined slow run.
fn assert_slow_timed_out(run: JoinHandle<Timed>) -> Timed {
    let t = run.join().expect("slow run thread");
    assert_timed_out(&t.resp, &t.req);
    t
}

/// Asserts `t` is a capacity refusal (resource_exhausted + NotDispatched{capacity})
/// whose message contains `limit`.
fn assert_capacity(resp: &Response, req: &Request, limit: &str) {
    let err = connect::assert_refused(resp, req, "resource_exhausted", Reason::Capacity);
    assert!(
        err.message.contains(limit),
        "the refusal must name the limit ({limit:?}): {}",
        err.message
    );
}

fn is_capacity(resp: &Response) -> bool {
    resp.status == 429
        && connect::ConnectError::of(resp).not_dispatched() == Some(Reason::Capacity.detail_bytes())
}

/// A quick snippet printing `n`, which must print it.
fn assert_quick_ran(resp: &Response, req: &Request, n: u64) {
    assert_eq!(resp.status, 200, "{resp}");
    connect::assert_bound(resp, req);
    let js = &resp.json()["javascript"];
    assert_eq!(js["stdout"], base64_line(n), "{resp}");
    assert!(js.get("exitCode").is_none_or(|c| c == 0), "{resp}");
}

fn quick(token: &str, n: u64) -> Request {
    run_request(token, &format!("console.log({n})"), 5_000)
}

/// `"<n>\n"` as Connect JSON writes bytes (standard base64).
fn base64_line(n: u64) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("{n}\n"))
}

// === the global cap ===

#[test]
fn twelve_at_once_with_a_cap_of_eight_run_eight_and_refuse_four_at_once() {
    let (d, token) = capped_daemon(&[("SANDBOX_MAX_CONCURRENT", "8")]);
    assert_eq!(d.listening["max_concurrent"], 8);
    let answers: Vec<Timed> = slow_runs(d.addr, &token, 12, 3_000)
        .into_iter()
        .map(|h| h.join().expect("run thread"))
        .collect();
    let (ran, refused): (Vec<&Timed>, Vec<&Timed>) =
        answers.iter().partition(|t| t.resp.status == 200);
    assert_eq!(
        (ran.len(), refused.len()),
        (8, 4),
        "exactly the cap runs; statuses: {:?}",
        answers.iter().map(|t| t.resp.status).collect::<Vec<_>>()
    );
    for t in &ran {
        assert_timed_out(&t.resp, &t.req);
        assert!(t.took >= Duration::from_millis(3_000), "ran {:?}", t.took);
    }
    let fastest_run = ran.iter().map(|t| t.took).min().expect("eight runs");
    eprintln!(
        "refusals answered in {:?}; runs in {fastest_run:?} or more",
        refused.iter().map(|t| t.took).collect::<Vec<_>>()
    );
    for t in &refused {
        assert_capacity(&t.resp, &t.req, "at capacity");
        assert!(
            t.took < REFUSAL_BOUND,
            "a refusal took {:?} (bound {REFUSAL_BOUND:?})",
            t.took
        );
        assert!(
            t.took * 6 < fastest_run,
            "refused after {:?}, not at once beside runs of {fastest_run:?}",
            t.took
        );
    }
    let text = metrics_text(&d);
    assert_eq!(sample(&text, "plimsoll_inflight"), 0.0, "{text}");
    assert_eq!(sample(&text, "plimsoll_runs_total"), 8.0, "{text}");
    assert_eq!(
        sample(&text, "plimsoll_shed_total{reason=\"at_capacity\"}"),
        4.0,
        "{text}"
    );
}

// === the memory budget ===

#[test]
fn a_memory_budget_of_four_runs_admits_four_and_refuses_the_fifth() {
    let (d, token) = capped_daemon(&[
        ("SANDBOX_MAX_CONCURRENT", "8"),
        ("SANDBOX_TOTAL_MEMORY_MB", "1024"),
    ]);
    assert_eq!(d.listening["max_concurrent"], 4, "{}", d.listening);
    let runs = slow_runs(d.addr, &token, 4, 2_000);
    wait_inflight(&d, 4);
    let fifth = timed(d.addr, run_request(&token, BUSY_LOOP, 2_000));
    assert_capacity(&fifth.resp, &fifth.req, "at capacity");
    assert!(fifth.took < REFUSAL_BOUND, "refused after {:?}", fifth.took);
    for h in runs {
        assert_slow_timed_out(h);
    }
    wait_inflight(&d, 0);
}

#[test]
fn the_memory_clamp_lowers_the_cap_and_the_per_caller_default_follows() {
    let d = wasm_daemon(&[
        ("PLIMSOLL_TOKEN", &fresh_token()),
        ("SANDBOX_MAX_CONCURRENT", "8"),
        ("SANDBOX_TOTAL_MEMORY_MB", "1024"),
        ("SANDBOX_MEMORY_MB", "256"),
    ]);
    assert_eq!(d.listening["max_concurrent"], 4, "{}", d.listening);
    assert_eq!(d.listening["per_key_concurrent"], 2, "{}", d.listening);
}

#[test]
fn a_run_allowance_larger_than_the_budget_refuses_to_start() {
    warm_cache();
    let out = Daemon::refuse(&[
        ("SANDBOX_PROVIDER", "wasm"),
        ("PLIMSOLL_TOKEN", &fresh_token()),
        ("SANDBOX_TOTAL_MEMORY_MB", "1024"),
        ("SANDBOX_MEMORY_MB", "2048"),
    ]);
    assert_eq!(out.code(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("SANDBOX_TOTAL_MEMORY_MB") && out.stderr.contains("2048"),
        "the refusal must name the budget and the allowance:\n{}",
        out.stderr
    );
}

// === per caller: the cap and the bucket ===

#[test]
fn a_hammering_caller_is_refused_per_caller_and_by_rate_while_another_gets_its_runs() {
    let hammer = fresh_token();
    let steady = fresh_token();
    let file = ClientsFile::new(&[
        ("hammer", &hammer, &["code:run"]),
        ("steady", &steady, &["code:run"]),
    ]);
    // Cap 8, two runs each in flight, a bucket of three runs refilled at 3 a minute
    // (one token every 20 s, so none comes back during the test).
    let d = wasm_daemon(&[
        ("PLIMSOLL_CLIENTS_FILE", &file.path_str()),
        ("SANDBOX_MAX_CONCURRENT", "8"),
        ("SANDBOX_PER_KEY_CONCURRENT", "2"),
        ("SANDBOX_RATE_PER_MIN", "3"),
        ("SANDBOX_RATE_BURST", "3"),
    ]);
    // The hammer takes its two slots with slow runs…
    let slow = slow_runs(d.addr, &hammer, 2, 2_000);
    wait_inflight(&d, 2);
    // …and everything more it sends at once is refused at once. Every request pays its
    // rate token before anything else (README, "Rate limits"; issue 12, part 1): the one
    // that gets the bucket's last token is refused per caller, the rest by the rate limit.
    let burst: Vec<Timed> = (0..10)
        .map(|i| {
            let req = quick(&hammer, i);
            std::thread::spawn({
                let addr = d.addr;
                move || timed(addr, req)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("burst thread"))
        .collect();
    let per_caller = "per-caller concurrency limit reached (2 in flight)";
    let rate = "rate limit: 3 runs/min per caller";
    for t in &burst {
        let err = connect::assert_refused(&t.resp, &t.req, "resource_exhausted", Reason::Capacity);
        assert!(
            err.message.contains(per_caller) || err.message.contains(rate),
            "{}",
            err.message
        );
        assert!(t.took < REFUSAL_BOUND, "refused after {:?}", t.took);
    }
    let refused_per_caller = burst
        .iter()
        .filter(|t| {
            connect::ConnectError::of(&t.resp)
                .message
                .contains(per_caller)
        })
        .count();
    assert_eq!(refused_per_caller, 1, "one token was left for the burst");
    // Meanwhile the other caller's runs go through.
    let req = quick(&steady, 1);
    assert_quick_ran(&req.send(d.addr), &req, 1);
    for h in slow {
        assert_slow_timed_out(h);
    }
    wait_inflight(&d, 0);
    // The refused requests paid: the hammer's bucket is empty, while the other caller
    // still has two.
    for i in 0..5 {
        let req = quick(&hammer, i);
        assert_capacity(&req.send(d.addr), &req, rate);
    }
    for n in [3, 4] {
        let req = quick(&steady, n);
        assert_quick_ran(&req.send(d.addr), &req, n);
    }
    let req = quick(&steady, 5);
    assert_capacity(&req.send(d.addr), &req, "rate limit");
    assert_eq!(shed(&d, "per_key"), 1.0);
    assert_eq!(shed(&d, "rate"), 9.0 + 5.0 + 1.0);
    assert_eq!(shed(&d, "at_capacity"), 0.0);
}

// === what is checked before a slot ===

#[test]
fn with_every_slot_busy_validation_floors_and_describe_still_answer_as_themselves() {
    let (d, token) = capped_daemon(&[("SANDBOX_MAX_CONCURRENT", "1")]);
    let slow = slow_runs(d.addr, &token, 1, 3_000);
    wait_inflight(&d, 1);
    let started = Instant::now();

    let req = run_request(&token, "", 1_000);
    connect::assert_invalid(&req.send(d.addr), &req);

    let body = json!({ "javascript": { "code": "1" } });
    let req = connect::call_as(&token, "Run", &body);
    connect::assert_refused(
        &req.send(d.addr),
        &req,
        "invalid_argument",
        Reason::Protocol,
    );

    let body = connect::javascript_with_floor("console.log('never')", "container");
    let req = connect::call_as(&token, "Run", &body);
    connect::assert_refused(
        &req.send(d.addr),
        &req,
        "failed_precondition",
        Reason::Isolation,
    );

    let resp = connect::call_as(&token, "Describe", &json!({})).send(d.addr);
    assert_eq!(resp.status, 200, "{resp}");
    assert_eq!(resp.json()["sandbox"], "wasm");

    // A valid run, by contrast, meets the full cap.
    let req = quick(&token, 7);
    assert_capacity(&req.send(d.addr), &req, "at capacity");
    assert!(
        started.elapsed() < Duration::from_millis(2_500),
        "the checks ran while the slot was held"
    );
    assert_eq!(inflight(&d), 1.0, "none of these took or freed a slot");
    assert_eq!(shed(&d, "at_capacity"), 1.0, "only the valid run was shed");
    for h in slow {
        assert_slow_timed_out(h);
    }
    let req = quick(&token, 8);
    assert_quick_ran(&req.send(d.addr), &req, 8);
}

// === when a slot comes back ===

#[test]
fn a_caller_that_hangs_up_mid_run_keeps_its_slot_until_the_sandbox_is_gone() {
    let (d, token) = capped_daemon(&[("SANDBOX_MAX_CONCURRENT", "1")]);
    let run_ms = 2_000;
    let req = run_request(&token, BUSY_LOOP, run_ms);
    let sent = Instant::now();
    let mut conn = Connection::open(d.addr);
    conn.send(&req.to_bytes(d.addr)).expect("send the slow run");
    wait_inflight(&d, 1);
    drop(conn);

    // Right after the hang-up, the slot is still the abandoned run's.
    let next = quick(&token, 1);
    assert_capacity(&next.send(d.addr), &next, "at capacity");

    // Until the deadline every run is refused; the first admitted one answers only
    // after the abandoned run's deadline has passed.
    let deadline = Instant::now() + SETTLE;
    let mut refusals = 1;
    let admitted_at = loop {
        assert!(Instant::now() < deadline, "no run was admitted again");
        let req = quick(&token, 2);
        let resp = req.send(d.addr);
        if resp.status == 200 {
            assert_quick_ran(&resp, &req, 2);
            break sent.elapsed();
        }
        assert_capacity(&resp, &req, "at capacity");
        refusals += 1;
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        admitted_at >= Duration::from_millis(u64::from(run_ms)),
        "a run was admitted {admitted_at:?} after the hang-up's run started, before its \
         {run_ms} ms deadline"
    );
    assert!(refusals > 1, "refused only once before the slot came back");
    assert_eq!(inflight(&d), 0.0);
    let text = metrics_text(&d);
    assert_eq!(sample(&text, "plimsoll_runs_total"), 2.0, "{text}");
}

// === mixed load ===

/// What each request of the mixed load is, by its index.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Quick,
    Invalid,
    NoProtocol,
    Floor,
    Timeout,
    HangUp,
    Describe,
    BadToken,
}

impl Kind {
    fn of(i: u64) -> Kind {
        match i % 20 {
            0..=9 => Kind::Quick,
            10 | 11 => Kind::Invalid,
            12 => Kind::NoProtocol,
            13 => Kind::Floor,
            14 | 15 => Kind::Timeout,
            16 | 17 => Kind::HangUp,
            18 => Kind::Describe,
            _ => Kind::BadToken,
        }
    }
}

/// How the mixed requests ended, counted.
#[derive(Default, Debug)]
struct Tally {
    ran: u64,
    timed_out: u64,
    capacity: u64,
    /// Shed by the decode gate (wire.md §1.3), before admission: a hung-up request the
    /// daemon was still reading can briefly hold its caller's decode slot.
    decode_shed: u64,
    refused_otherwise: u64,
    hung_up: u64,
    described: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.ran += o.ran;
        self.timed_out += o.timed_out;
        self.capacity += o.capacity;
        self.decode_shed += o.decode_shed;
        self.refused_otherwise += o.refused_otherwise;
        self.hung_up += o.hung_up;
        self.described += o.described;
    }

    fn total(&self) -> u64 {
        self.ran
            + self.timed_out
            + self.capacity
            + self.decode_shed
            + self.refused_otherwise
            + self.hung_up
            + self.described
    }
}

/// Sends request `i` of the mixed load as `token` and checks its answer.
fn mixed_one(addr: SocketAddr, token: &str, i: u64, tally: &mut Tally) {
    let req = match Kind::of(i) {
        Kind::Quick => quick(token, i),
        Kind::Invalid => run_request(token, "", 1_000),
        Kind::NoProtocol => {
            connect::call_as(token, "Run", &json!({ "javascript": { "code": "1" } }))
        }
        Kind::Floor => {
            connect::call_as(token, "Run", &connect::javascript_with_floor("1", "kernel"))
        }
        Kind::Timeout => run_request(token, BUSY_LOOP, 50),
        Kind::HangUp => run_request(token, BUSY_LOOP, 150),
        Kind::Describe => connect::call_as(token, "Describe", &json!({})),
        Kind::BadToken => quick(&"0".repeat(64), i),
    };
    if matches!(Kind::of(i), Kind::HangUp) {
        let mut conn = Connection::open(addr);
        conn.send(&req.to_bytes(addr)).expect("send");
        // A refusal comes back within this; a run that was admitted does not.
        conn.set_read_timeout(Duration::from_millis(30));
        match conn.read_response(false) {
            Ok(resp) => {
                assert!(is_capacity(&resp), "request {i} (hang-up): {resp}");
                count_shed(&resp, &req, i, tally);
            }
            Err(_) => tally.hung_up += 1,
        }
        return;
    }
    let resp = req.send(addr);
    if is_capacity(&resp) {
        count_shed(&resp, &req, i, tally);
        return;
    }
    match Kind::of(i) {
        Kind::Quick => {
            assert_quick_ran(&resp, &req, i);
            tally.ran += 1;
        }
        Kind::Timeout => {
            assert_timed_out(&resp, &req);
            tally.timed_out += 1;
        }
        Kind::Invalid => {
            connect::assert_invalid(&resp, &req);
            tally.refused_otherwise += 1;
        }
        Kind::NoProtocol => {
            connect::assert_refused(&resp, &req, "invalid_argument", Reason::Protocol);
            tally.refused_otherwise += 1;
        }
        Kind::Floor => {
            connect::assert_refused(&resp, &req, "failed_precondition", Reason::Isolation);
            tally.refused_otherwise += 1;
        }
        Kind::BadToken => {
            assert_eq!(resp.status, 401, "{resp}");
            tally.refused_otherwise += 1;
        }
        Kind::Describe => {
            assert_eq!(resp.status, 200, "{resp}");
            tally.described += 1;
        }
        Kind::HangUp => unreachable!("answered above"),
    }
}

/// Counts a capacity refusal of request `i`: by the decode gate (any procedure) or by
/// admission (only runs that passed validation and the floor).
fn count_shed(resp: &Response, req: &Request, i: u64, tally: &mut Tally) {
    let err = connect::assert_refused(resp, req, "resource_exhausted", Reason::Capacity);
    if err.message.contains("decode capacity") {
        tally.decode_shed += 1;
        return;
    }
    assert!(
        matches!(Kind::of(i), Kind::Quick | Kind::Timeout | Kind::HangUp),
        "request {i} ({:?}) was shed by admission: {}",
        Kind::of(i),
        err.message
    );
    tally.capacity += 1;
}

#[test]
fn after_ten_thousand_mixed_requests_every_slot_is_free_again() {
    const REQUESTS: u64 = 10_000;
    const THREADS: u64 = 8;
    const CAP: u32 = 4;
    const TIME_BOUND: Duration = Duration::from_secs(150);
    let a = fresh_token();
    let b = fresh_token();
    let file = ClientsFile::new(&[("a", &a, &["code:run"]), ("b", &b, &["code:run"])]);
    let d = wasm_daemon(&[
        ("PLIMSOLL_CLIENTS_FILE", &file.path_str()),
        ("SANDBOX_MAX_CONCURRENT", &CAP.to_string()),
        ("SANDBOX_PER_KEY_CONCURRENT", "3"),
        ("SANDBOX_RATE_PER_MIN", "0"),
    ]);
    let started = Instant::now();
    let workers: Vec<JoinHandle<Tally>> = (0..THREADS)
        .map(|t| {
            let token = if t % 2 == 0 { a.clone() } else { b.clone() };
            let addr = d.addr;
            std::thread::spawn(move || {
                let mut tally = Tally::default();
                let mut i = t;
                while i < REQUESTS {
                    assert!(
                        started.elapsed() < TIME_BOUND,
                        "the mixed load outlasted {TIME_BOUND:?} at request {i}"
                    );
                    mixed_one(addr, &token, i, &mut tally);
                    i += THREADS;
                }
                tally
            })
        })
        .collect();
    let mut tally = Tally::default();
    for w in workers {
        tally.add(&w.join().expect("load thread"));
    }
    eprintln!("mixed load: {tally:?} in {:?}", started.elapsed());
    assert_eq!(tally.total(), REQUESTS);
    assert!(
        tally.ran > 0 && tally.timed_out > 0 && tally.capacity > 0 && tally.hung_up > 0,
        "every kind of outcome happened: {tally:?}"
    );

    // Every slot comes back: the gauge settles at zero once the last abandoned run ends…
    wait_inflight(&d, 0);
    // …and every run request that reached admission was either run or shed, once. A
    // hang-up may have been run, shed, or dropped before admission (its caller was gone
    // first), so it widens the range; every answered one is counted exactly.
    let text = metrics_text(&d);
    let shed_total: f64 = ["at_capacity", "per_key", "rate"]
        .iter()
        .map(|r| sample(&text, &format!("plimsoll_shed_total{{reason=\"{r}\"}}")))
        .sum();
    let runs_total = sample(&text, "plimsoll_runs_total");
    let answered = (tally.ran + tally.timed_out + tally.capacity) as f64;
    let counted = runs_total + shed_total;
    assert!(
        answered <= counted && counted <= answered + tally.hung_up as f64,
        "runs {runs_total} + shed {shed_total} against {tally:?}\n{text}"
    );
    assert!(runs_total >= (tally.ran + tally.timed_out) as f64, "{text}");
    // …and exactly the cap is admitted again, no more.
    let runs = {
        let (a, b) = (a.clone(), b.clone());
        let addr = d.addr;
        let barrier = Arc::new(Barrier::new(CAP as usize));
        (0..CAP)
            .map(|k| {
                let token = if k % 2 == 0 { a.clone() } else { b.clone() };
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    timed(addr, run_request(&token, BUSY_LOOP, 1_500))
                })
            })
            .collect::<Vec<_>>()
    };
    wait_inflight(&d, CAP);
    let extra = quick(&b, 1);
    assert_capacity(&extra.send(d.addr), &extra, "at capacity");
    for h in runs {
        assert_slow_timed_out(h);
    }
    wait_inflight(&d, 0);
}
