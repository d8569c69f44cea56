//! Connection slots under attack (issue 12, part 2): idle connections without a
//! credential cannot hold the listener's slots against `/readyz` and real callers, and
//! past the cap a newcomer is closed at once rather than left in the kernel's backlog.
//!
//! The cap is half the daemon's open-file limit (config.md §5); these tests start the
//! daemon with a small limit so that a few hundred connections fill it.

use std::time::{Duration, Instant};

use base64::Engine as _;
use plimsoll_tests::h2_frames::{self, H2, flag, kind};
use plimsoll_tests::{Daemon, fresh_token, wasm};
use serde_json::Value;

use super::*;

/// The open-file limit given to the daemon: connection cap 64.
const OPEN_FILES: u32 = 128;
const CAP: usize = OPEN_FILES as usize / 2;

fn start_capped(transport: Transport, env: &[(&str, &str)], open_files: u32) -> Target {
    Target::start_with(transport, env, |env| {
        Daemon::start_with_open_files(env, open_files, wasm::FIRST_START_TIMEOUT)
    })
}

/// Three times the cap of idle, unauthenticated h2 connections (preface and SETTINGS,
/// then nothing) are open; a load balancer's `/readyz` and an authenticated wasm run
/// still answer promptly on new connections, because the quietest anonymous connection
/// gives its slot to each newcomer. Before this fix the accept loop stopped at the cap
/// and the newcomers waited in the kernel's backlog (the report's `/readyz` got no
/// answer in 10 s); this test FAILS on main.
#[test]
fn idle_anonymous_connections_give_way_to_readyz_and_an_authenticated_run() {
    wasm::warm_cache();
    std::thread::scope(|s| {
        for transport in Transport::ALL {
            s.spawn(move || {
                let token = fresh_token();
                let target = start_capped(
                    transport,
                    &[
                        ("SANDBOX_PROVIDER", "wasm"),
                        ("PLIMSOLL_TOKEN", &token),
                        ("SANDBOX_RATE_PER_MIN", "0"),
                        ("PLIMSOLL_METRICS_ADDR", "off"),
                    ],
                    OPEN_FILES,
                );
                assert_eq!(
                    target.daemon.listening["max_connections"],
                    serde_json::json!(CAP),
                    "{transport:?}"
                );
                // As in the report: the preface and SETTINGS, then nothing. A moment for
                // the daemon to take them all in.
                let mut idle: Vec<H2> = (0..3 * CAP).map(|_| target.connect()).collect();
                std::thread::sleep(Duration::from_secs(1));

                let asked = Instant::now();
                let mut probe = target.handshaken();
                assert_eq!(
                    exchange(&mut probe, 1, "GET", "/readyz", &[], None),
                    Some(200)
                );
                let readyz = asked.elapsed();

                let asked = Instant::now();
                let mut caller = target.handshaken();
                let fields = connect_call(Some(&token));
                let block = h2_frames::request("POST", &procedure("Run"), &borrowed(&fields));
                caller.send(&h2_frames::headers(1, &block, false));
                caller.send(&h2_frames::frame(
                    kind::DATA,
                    flag::END_STREAM,
                    1,
                    &run_body("console.log(6*7)"),
                ));
                let (status, body) = answer(&mut caller, 1);
                let run = asked.elapsed();
                assert_eq!(
                    status,
                    Some(200),
                    "{transport:?}: {}",
                    String::from_utf8_lossy(&body)
                );
                let v: Value = serde_json::from_slice(&body).expect("a JSON answer");
                let stdout = base64::engine::general_purpose::STANDARD
                    .decode(v["javascript"]["stdout"].as_str().unwrap_or_default())
                    .expect("base64 stdout");
                assert_eq!(stdout, b"42\n", "{transport:?}: {v}");

                assert!(
                    readyz < Duration::from_secs(5),
                    "{transport:?}: /readyz took {readyz:?}"
                );
                assert!(
                    run < Duration::from_secs(15),
                    "{transport:?}: the run took {run:?}"
                );

                // The idle connections that gave way were told GOAWAY and closed; the
                // listener never held more than its cap.
                std::thread::sleep(CLOSE_GRACE + Duration::from_millis(500));
                let closed = idle
                    .iter_mut()
                    .map(|h2| h2.until_closed(Duration::from_millis(20)).is_some())
                    .filter(|closed| *closed)
                    .count();
                assert!(
                    closed >= 2 * CAP,
                    "{transport:?}: only {closed} of {} idle connections gave way",
                    3 * CAP
                );
                assert!(
                    target.logged("the listener is full") >= 1,
                    "{transport:?}: no word in the log"
                );
            });
        }
    });
}

/// Open dev mode (the disabled provider), a tiny cap, and a decode gate of exactly one
/// body per slot for the one (anonymous) caller.
const BUSY_OPEN_FILES: u32 = 64;
const BUSY_CAP: usize = BUSY_OPEN_FILES as usize / 2;

/// Starts a `Run` on stream 1 whose body never comes: the request holds its connection
/// busy (for up to the 30 s body deadline) and, with auth off, authenticated.
fn hold_busy(target: &Target) -> H2 {
    let mut h2 = target.handshaken();
    let fields = connect_call(None);
    let block = h2_frames::request("POST", &procedure("Run"), &borrowed(&fields));
    h2.send(&h2_frames::headers(1, &block, false));
    h2
}

/// Reads what a held connection has received so far, answering the daemon's pings:
/// `false` once its held request was answered or reset, or the connection ended.
fn tend_held(h2: &mut H2) -> bool {
    loop {
        match h2.next(Duration::from_millis(1)) {
            h2_frames::Event::TimedOut => return true,
            h2_frames::Event::Closed => return false,
            h2_frames::Event::Frame(f) => match f.kind {
                kind::PING if f.flags & flag::ACK == 0 => {
                    let payload: [u8; 8] = f.payload.clone().try_into().expect("8 bytes");
                    if !h2.try_send(&h2_frames::ping(payload, true)) {
                        return false;
                    }
                }
                kind::GOAWAY | kind::RST_STREAM | kind::HEADERS => return false,
                _ => {}
            },
        }
    }
}

/// When every slot holds an authenticated connection with a request in flight, nothing
/// can give way: a newcomer is accepted and closed at once, without a byte, rather than
/// queued. As soon as one request ends, its connection gives way to the next newcomer.
#[test]
fn when_every_slot_is_busy_a_newcomer_is_closed_at_once() {
    for transport in Transport::ALL {
        let max_concurrent = BUSY_CAP.to_string();
        let target = start_capped(
            transport,
            &[("SANDBOX_MAX_CONCURRENT", &max_concurrent)],
            BUSY_OPEN_FILES,
        );
        assert_eq!(
            target.daemon.listening["max_connections"],
            serde_json::json!(BUSY_CAP)
        );
        let mut busy: Vec<H2> = (0..BUSY_CAP).map(|_| hold_busy(&target)).collect();
        // The decode gate lets one caller read `SANDBOX_MAX_CONCURRENT` bodies at once, so
        // once one more request is refused for decode capacity, every held request has
        // passed authentication and is waiting for its body.
        let fields = connect_call(None);
        let saturated_by = Instant::now() + Duration::from_secs(20);
        let block = h2_frames::request("POST", &procedure("Run"), &borrowed(&fields));
        for probe in (3u32..).step_by(2) {
            busy[0].send(&h2_frames::headers(probe, &block, false));
            busy[0].send(&h2_frames::frame(
                kind::DATA,
                flag::END_STREAM,
                probe,
                &run_body("1"),
            ));
            let (status, body) = answer(&mut busy[0], probe);
            let body = String::from_utf8_lossy(&body);
            if status == Some(429) && body.contains("decode capacity") {
                break;
            }
            // A slot is still free: some held request has not reached the gate yet,
            // or lost its connection on a loaded machine (the held connections are not
            // read, so the daemon's keep-alive pings go unanswered). Answer their pings
            // and hold again in place of any that ended, so the gate fills.
            let ended: Vec<usize> = (1..busy.len())
                .filter(|&i| !tend_held(&mut busy[i]))
                .collect();
            if !ended.is_empty() {
                // An ended connection keeps its slot while the daemon lingers on it.
                std::thread::sleep(LINGER + Duration::from_millis(200));
                for &i in &ended {
                    busy[i] = hold_busy(&target);
                }
            }
            let replaced = ended.len();
            assert!(
                Instant::now() < saturated_by,
                "{transport:?}: the held requests never all reached the decode gate \
                 ({status:?} {body}; {replaced} held connections had just ended)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }

        // The daemon writes the listener's pressure at most once every 30 s: a line already
        // written (a held connection that took an idle slot, say) holds this refusal back
        // for the next one.
        let pressure_before = target.log_count("the listener is full");
        let refused_at = Instant::now();
        let refused = match transport {
            // Over TLS the refusal ends the handshake.
            Transport::Tls => target.try_connect().is_none(),
            Transport::H2c => {
                let mut newcomer = target.connect();
                let frames = newcomer.until_closed(Duration::from_secs(2));
                assert!(
                    frames.as_ref().is_some_and(Vec::is_empty),
                    "{transport:?}: a newcomer past the cap was served or kept waiting: {frames:?}"
                );
                true
            }
        };
        assert!(refused, "{transport:?}: a newcomer past the cap was served");
        if pressure_before == 0 {
            assert_eq!(
                target.logged("\"refused\":1"),
                1,
                "{transport:?}: the refusal is in the log"
            );
        }
        assert!(
            refused_at.elapsed() < SLACK,
            "{transport:?}: refused only after {:?}",
            refused_at.elapsed()
        );

        // One request ends (the disabled provider refuses it): that connection is now
        // idle and gives its slot to the next newcomer.
        let first = &mut busy[0];
        first.send(&h2_frames::frame(
            kind::DATA,
            flag::END_STREAM,
            1,
            &run_body("1"),
        ));
        assert!(
            answer(first, 1).0.is_some(),
            "{transport:?}: the held request was answered"
        );
        // The daemon counts the request ended once hyper drops the answer, a moment
        // after its last frame left: a newcomer is served soon (the slack is for a loaded
        // machine; a queued newcomer would wait for the 30 s body deadline).
        let admitted_by = Instant::now() + SLACK;
        let mut next = loop {
            let mut h2 = target.try_connect();
            let served = h2.as_mut().is_some_and(|h2| {
                h2.wait_for(Duration::from_secs(2), |f| f.kind == kind::SETTINGS)
                    .is_some()
            });
            match h2 {
                Some(h2) if served => break h2,
                _ if Instant::now() < admitted_by => std::thread::sleep(Duration::from_millis(50)),
                _ => panic!("{transport:?}: no newcomer served after a request ended"),
            }
        };
        next.send(&h2_frames::frame(kind::SETTINGS, flag::ACK, 0, &[]));
        let frames = busy[0]
            .until_closed(CLOSE_GRACE + SLACK)
            .expect("the idle connection gave way");
        assert!(
            frames.iter().any(|f| f.kind == kind::GOAWAY),
            "{transport:?}: {frames:?}"
        );
        // The other held requests were never disturbed.
        for h2 in &mut busy[1..] {
            h2.send(&h2_frames::ping(*b"stillok!", false));
            assert!(
                h2.wait_for(Duration::from_secs(5), |f| f.kind == kind::PING)
                    .is_some()
            );
        }
        drop(busy);
        target.assert_serving();
    }
}
