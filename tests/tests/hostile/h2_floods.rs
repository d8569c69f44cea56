//! HTTP/2 control-frame floods and rapid reset (issue 12, part 2): each ends the
//! offending connection after a bounded number of frames, and the daemon keeps serving.
//!
//! The budgets are the daemon's (plimsolld/src/server/frame_meter.rs): SETTINGS 16 at
//! once then 1/s, PING 50 then 10/s, RST_STREAM 100 then 10/s, per connection.

use std::time::{Duration, Instant};

use plimsoll_tests::h2_frames::{self, Frame, code, flag, kind};

use super::*;

const SETTINGS_BURST: usize = 16;
const PING_BURST: usize = 50;
const RESET_BURST: usize = 100;
/// Frames each flood sends at most: far past every budget.
const FLOOD: usize = 5000;

/// Sends `frame` up to [`FLOOD`] times, `batch` frames per write (pausing `pause`
/// between writes), until the daemon stops reading, then reads what came back until
/// the connection closes. Panics if it never closes.
fn flood_paced(
    target: &Target,
    what: &str,
    frame: &[u8],
    batch: usize,
    pause: Duration,
) -> Vec<Frame> {
    let mut h2 = target.handshaken();
    let bytes = frame.repeat(batch);
    let started = Instant::now();
    for _ in 0..FLOOD / batch {
        if !h2.try_send(&bytes) {
            break;
        }
        std::thread::sleep(pause);
    }
    h2.until_closed(Duration::from_secs(10)).unwrap_or_else(|| {
        panic!(
            "{:?}: a {what} flood of {FLOOD} frames did not end the connection ({:?})",
            target.transport,
            started.elapsed()
        )
    })
}

/// [`flood_paced`] as fast as the socket takes it.
fn flood(target: &Target, what: &str, frame: &[u8]) -> Vec<Frame> {
    flood_paced(target, what, frame, 50, Duration::ZERO)
}

fn count(frames: &[Frame], kind: u8, flags: u8) -> usize {
    frames
        .iter()
        .filter(|f| f.kind == kind && f.flags & flag::ACK == flags)
        .count()
}

/// A peer that sends SETTINGS frames in a loop is cut off once it overdraws its budget:
/// the daemon acknowledged at most the burst (plus what a second refilled).
#[test]
fn a_settings_flood_ends_the_connection() {
    for transport in Transport::ALL {
        let target = Target::start(transport, &[]);
        let frames = flood(&target, "SETTINGS", &h2_frames::settings(&[]));
        let acks = count(&frames, kind::SETTINGS, flag::ACK);
        assert!(
            acks <= SETTINGS_BURST + 2,
            "{transport:?}: {acks} SETTINGS acknowledged"
        );
        assert_eq!(target.logged("HTTP/2 SETTINGS flood"), 1, "{transport:?}");
        target.assert_serving();
    }
}

/// A peer that sends PINGs in a loop is cut off the same way.
#[test]
fn a_ping_flood_ends_the_connection() {
    for transport in Transport::ALL {
        let target = Target::start(transport, &[]);
        let frames = flood(&target, "PING", &h2_frames::ping(*b"flooding", false));
        let acks = count(&frames, kind::PING, flag::ACK);
        assert!(
            acks <= PING_BURST + 10,
            "{transport:?}: {acks} PINGs answered"
        );
        assert_eq!(target.logged("HTTP/2 PING flood"), 1, "{transport:?}");
        target.assert_serving();
    }
}

/// Acknowledgements of pings the daemon never sent cost it a warning in its log each
/// (the h2 crate logs them): they count against the PING budget, so a flood of them
/// writes at most the budget's worth of lines before the connection is cut off. Sent
/// one per write, so that h2 reads each before the budget runs out.
#[test]
fn a_flood_of_unsolicited_ping_acks_cannot_flood_the_log() {
    for transport in Transport::ALL {
        let target = Target::start(transport, &[]);
        let ack = h2_frames::ping(*b"unasked!", true);
        flood_paced(&target, "PING ACK", &ack, 1, Duration::from_millis(2));
        // The warnings come before the line that says the connection was cut off.
        assert_eq!(target.logged("HTTP/2 PING flood"), 1, "{transport:?}");
        let lines = target.log_count("PING ack that we never sent");
        assert!(
            lines > 0,
            "{transport:?}: h2 no longer logs unsolicited acks; revisit this test"
        );
        assert!(lines <= PING_BURST + 10, "{transport:?}: {lines} log lines");
        target.assert_serving();
    }
}

/// Rapid reset as it is usually run: requests opened and cancelled back to back,
/// without waiting for anything. The connection is ended (by h2's limit on streams
/// cancelled before they were accepted, or by the daemon's RST_STREAM budget) long
/// before the flood is through, and the daemon keeps serving.
#[test]
fn rapid_reset_ends_the_connection() {
    for transport in Transport::ALL {
        let target = Target::start(transport, &[]);
        let mut h2 = target.handshaken();
        let fields = connect_call(None);
        let block = h2_frames::request("POST", &procedure("Run"), &borrowed(&fields));
        let mut sent = 0;
        let mut stream = 1u32;
        'flood: while sent < FLOOD {
            let mut batch = Vec::new();
            for _ in 0..50 {
                batch.extend(h2_frames::headers(stream, &block, false));
                batch.extend(h2_frames::rst_stream(stream, code::CANCEL));
                stream += 2;
            }
            if !h2.try_send(&batch) {
                break 'flood;
            }
            sent += 50;
        }
        let frames = h2.until_closed(Duration::from_secs(10)).unwrap_or_else(|| {
            panic!(
                "{transport:?}: {FLOOD} opened-and-cancelled requests did not end the connection"
            )
        });
        let goaway = frames.iter().find(|f| f.kind == kind::GOAWAY);
        assert!(
            goaway.is_none_or(|g| g.error_code() == Some(code::ENHANCE_YOUR_CALM)),
            "{transport:?}: {goaway:?}"
        );
        target.assert_serving();
    }
}

/// Rapid reset that waits until each request has been accepted and answered before
/// cancelling it (the client never ends its side of the stream), which h2's own limit
/// does not count: the daemon's RST_STREAM budget ends the connection after about its
/// burst.
#[test]
fn resetting_accepted_requests_in_a_loop_ends_the_connection() {
    for transport in Transport::ALL {
        let target = Target::start(transport, &[]);
        let mut h2 = target.handshaken();
        let block = h2_frames::request("GET", "/healthz", &[]);
        let started = Instant::now();
        let mut cancelled = 0;
        for stream in (1u32..).step_by(2).take(4 * RESET_BURST) {
            if !h2.try_send(&h2_frames::headers(stream, &block, false))
                || h2
                    .wait_for(Duration::from_secs(5), |f| {
                        f.stream == stream && f.kind == kind::HEADERS
                    })
                    .is_none()
                || !h2.try_send(&h2_frames::rst_stream(stream, code::CANCEL))
            {
                break;
            }
            cancelled += 1;
        }
        assert!(
            h2.until_closed(Duration::from_secs(10)).is_some(),
            "{transport:?}: {cancelled} accepted-then-cancelled requests did not end the connection"
        );
        // The burst, plus what the refill added while the loop ran.
        let allowed = RESET_BURST + 10 * started.elapsed().as_secs() as usize + 10;
        assert!(
            cancelled <= allowed,
            "{transport:?}: {cancelled} resets went through (budget {allowed})"
        );
        assert!(
            cancelled >= RESET_BURST - 1,
            "{transport:?}: cut off after only {cancelled}"
        );
        assert_eq!(target.logged("HTTP/2 RST_STREAM flood"), 1, "{transport:?}");
        target.assert_serving();
    }
}
