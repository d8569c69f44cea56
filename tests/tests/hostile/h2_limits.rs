//! Per-connection HTTP/2 limits (issue 12, part 2): concurrent streams and the header
//! list size, as the daemon advertises them in its SETTINGS and as it enforces them.

use std::time::Duration;

use plimsoll_tests::h2_frames::{self, H2, code, flag, kind, setting};

use super::*;

/// SETTINGS_MAX_CONCURRENT_STREAMS the daemon advertises.
const MAX_STREAMS: u32 = 100;
/// SETTINGS_MAX_HEADER_LIST_SIZE the daemon advertises (config.md §5: 32 KiB).
const MAX_HEADER_LIST: u32 = 32 * 1024;
/// The largest frame payload a peer may send before changing SETTINGS_MAX_FRAME_SIZE.
const MAX_FRAME: usize = 16 * 1024;

/// The value of `id` in the daemon's SETTINGS.
fn advertised(h2: &mut H2, id: u16) -> Option<u32> {
    h2.handshake()
        .settings()
        .into_iter()
        .find(|(i, _)| *i == id)
        .map(|(_, v)| v)
}

/// With [`MAX_STREAMS`] requests in flight on one connection, the next stream is
/// refused (RST_STREAM) while the others carry on, and
/// a stream opened after one of them ends is served.
#[test]
fn streams_past_the_advertised_maximum_are_refused() {
    for transport in Transport::ALL {
        // Open dev mode; a decode gate wide enough for every held body.
        let target = Target::start(transport, &[("SANDBOX_MAX_CONCURRENT", "128")]);
        let mut h2 = target.connect();
        assert_eq!(
            advertised(&mut h2, setting::MAX_CONCURRENT_STREAMS),
            Some(MAX_STREAMS),
            "{transport:?}"
        );
        let fields = connect_call(None);
        let block = h2_frames::request("POST", &procedure("Run"), &borrowed(&fields));
        // Requests whose bodies have not come yet stay in flight.
        let held: Vec<u32> = (0..MAX_STREAMS).map(|i| 1 + 2 * i).collect();
        for id in &held {
            h2.send(&h2_frames::headers(*id, &block, false));
        }
        let extra = 1 + 2 * MAX_STREAMS;
        h2.send(&h2_frames::headers(
            extra,
            &h2_frames::request("GET", "/healthz", &[]),
            true,
        ));
        let refused = h2
            .wait_for(Duration::from_secs(10), |f| f.stream == extra)
            .unwrap_or_else(|| panic!("{transport:?}: the stream past the maximum got nothing"));
        assert_eq!(refused.kind, kind::RST_STREAM, "{transport:?}: {refused:?}");
        assert!(
            matches!(
                refused.error_code(),
                Some(code::REFUSED_STREAM | code::PROTOCOL_ERROR)
            ),
            "{transport:?}: {refused:?}"
        );
        // One held request ends; a new stream is then served on the same connection
        // (the daemon releases the ended stream a moment after its last frame left).
        h2.send(&h2_frames::frame(
            kind::DATA,
            flag::END_STREAM,
            held[0],
            &run_body("1"),
        ));
        assert!(answer(&mut h2, held[0]).0.is_some(), "{transport:?}");
        let served_by = std::time::Instant::now() + Duration::from_secs(1);
        let mut next = extra + 2;
        loop {
            match exchange(&mut h2, next, "GET", "/healthz", &[], None) {
                Some(status) => {
                    assert_eq!(status, 200, "{transport:?}");
                    break;
                }
                None if std::time::Instant::now() < served_by => {
                    std::thread::sleep(Duration::from_millis(50));
                    next += 2;
                }
                None => panic!("{transport:?}: no stream served after one ended"),
            }
        }
    }
}

/// A header block of `value_len` bytes in one field, cut into HEADERS and
/// CONTINUATION frames of at most [`MAX_FRAME`] bytes.
fn oversized_request(stream: u32, path: &str, value_len: usize) -> Vec<u8> {
    let padding = "p".repeat(value_len);
    let block = h2_frames::request("GET", path, &[("x-padding", &padding)]);
    let chunks: Vec<&[u8]> = block.chunks(MAX_FRAME).collect();
    let mut out = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let (kind, mut flags) = if i == 0 {
            (kind::HEADERS, flag::END_STREAM)
        } else {
            (kind::CONTINUATION, 0)
        };
        if last {
            flags |= flag::END_HEADERS;
        }
        out.extend(h2_frames::frame(kind, flags, stream, chunk));
    }
    out
}

/// A header block over the advertised 32 KiB is answered 431 before any layer of the
/// daemon sees it, and the connection stays usable; one several times over ends the
/// connection. Neither request reaches the pipeline (no audit line names its path).
#[test]
fn a_header_block_over_32_kib_never_reaches_the_pipeline() {
    for transport in Transport::ALL {
        let target = Target::start(transport, &[]);
        let mut h2 = target.connect();
        assert_eq!(
            advertised(&mut h2, setting::MAX_HEADER_LIST_SIZE),
            Some(MAX_HEADER_LIST),
            "{transport:?}"
        );

        h2.send(&oversized_request(1, "/oversized", 40 * 1024));
        assert_eq!(answer_status(&mut h2, 1), Some(431), "{transport:?}");
        assert_eq!(
            exchange(&mut h2, 3, "GET", "/healthz", &[], None),
            Some(200),
            "{transport:?}"
        );

        h2.send(&oversized_request(5, "/way-oversized", 200 * 1024));
        let frames = h2.until_closed(Duration::from_secs(10)).unwrap_or_else(|| {
            panic!("{transport:?}: a 200 KiB header block did not end the connection")
        });
        assert!(
            frames.iter().any(|f| f.kind == kind::GOAWAY),
            "{transport:?}: closed without GOAWAY: {frames:?}"
        );
        target.assert_serving();
        // Both /healthz answers are logged after anything the oversized requests logged.
        assert_eq!(target.logged_at_least("/healthz", 2), 2, "{transport:?}");
        assert_eq!(
            target.log_count("oversized"),
            0,
            "{transport:?}: a request reached the pipeline"
        );
    }
}
