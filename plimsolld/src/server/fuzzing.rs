//! Entry points for the cargo-fuzz targets in `plimsolld/fuzz` (feature `fuzzing`): the
//! listener's parsers of bytes any TCP peer sends, before it is authenticated. Each function
//! must return without panicking, whatever it is given.

use tokio::time::Instant;

use super::frame_meter::{Budget, Meter, PING_BUDGET, RESET_BUDGET, SETTINGS_BUDGET};

/// The HTTP/2 connection preface (RFC 9113 §3.4), spelled here apart from the meter's.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How many frame headers of each metered kind `stream` holds, read whole and plainly:
/// nothing unless it opens with the preface, then 9-byte headers each followed by the
/// payload length its first three bytes give. A header cut short is not counted.
fn metered_frames(stream: &[u8]) -> [(&'static str, Budget, u64); 3] {
    let mut counts = [
        ("SETTINGS", SETTINGS_BUDGET, 0),
        ("PING", PING_BUDGET, 0),
        ("RST_STREAM", RESET_BUDGET, 0),
    ];
    let Some(frames) = stream.strip_prefix(PREFACE) else {
        return counts;
    };
    let mut at = 0;
    while let Some(head) = frames.get(at..at + 9) {
        let metered = match head[3] {
            0x4 => Some(0),
            0x6 => Some(1),
            0x3 => Some(2),
            _ => None,
        };
        if let Some(i) = metered {
            counts[i].2 += 1;
        }
        let payload = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        at += 9 + payload;
    }
    counts
}

/// A peer's bytes, cut into `chunks` as reads would cut them, through one connection's
/// frame meter, and checked against a plain count of the frames in what was fed: a peer is
/// never cut off before it sent more frames of one kind than that kind's burst, and never
/// let through with more than its burst plus what the elapsed time refilled.
pub fn frame_meter(chunks: &[&[u8]]) {
    let start = Instant::now();
    let mut meter = Meter::new(start);
    let mut fed = Vec::new();
    for chunk in chunks {
        fed.extend_from_slice(chunk);
        if let Err(flood) = meter.feed(chunk) {
            let counts = metered_frames(&fed);
            let overdrawn = counts.iter().find(|(name, _, _)| *name == flood.0);
            assert!(
                overdrawn.is_some_and(|(_, budget, count)| *count > u64::from(budget.burst)),
                "cut off for {} within its burst: {counts:?}",
                flood.0
            );
            return;
        }
    }
    // Every refill happened between `start` and now; one frame more for rounding.
    let elapsed = start.elapsed().as_secs_f64();
    for (name, budget, count) in metered_frames(&fed) {
        let allowed = f64::from(budget.burst) + f64::from(budget.per_second) * elapsed + 1.0;
        assert!(
            count as f64 <= allowed,
            "{count} {name} frames let through, at most {allowed} allowed"
        );
    }
}
