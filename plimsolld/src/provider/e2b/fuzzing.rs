//! Entry points for the cargo-fuzz targets in `plimsolld/fuzz` (feature `fuzzing`): the
//! parsers of envd's process streams, which carry whatever the code in the VM writes. Each
//! function must return without panicking, whatever it is given.

use std::time::Duration;

use super::envd::{Ending, Envelopes, Finished, HeldStream};
use crate::provider::guest::output::Capped;

/// Each stream's cap: small, so that output past it is exercised too.
const CAP: usize = 64;

/// A run's ending (or the error that broke its stream), then each stream's kept bytes and
/// whether it was truncated.
type Followed = (Result<Ending, String>, Vec<u8>, bool, Vec<u8>, bool);

/// A run's process stream read in `chunks`, as a run follows it.
fn follow(chunks: &[&[u8]]) -> Followed {
    let mut out = Finished {
        stdout: Capped::new(CAP),
        stderr: Capped::new(CAP),
        ending: Ending::Lost,
        duration: Duration::ZERO,
    };
    let mut envelopes = Envelopes::default();
    let mut outcome = None;
    for chunk in chunks {
        match envelopes.feed(chunk, &mut out) {
            Ok(None) => {}
            Ok(Some(ending)) => {
                outcome = Some(Ok(ending));
                break;
            }
            Err(e) => {
                outcome = Some(Err(e.to_string()));
                break;
            }
        }
    }
    // No ending in any chunk: the connection dropped after the last.
    let outcome = outcome.unwrap_or_else(|| Ok(envelopes.dropped()));
    (
        outcome,
        out.stdout.bytes().to_vec(),
        out.stdout.truncated(),
        out.stderr.bytes().to_vec(),
        out.stderr.truncated(),
    )
}

/// envd's answer to a run's `Start`, cut into `chunks` as reads would cut it and followed as
/// a run follows it. Where the cuts fall changes nothing: the ending (or error) and both
/// streams are those of the whole answer read at once (below envd's 32 MiB stream bound,
/// far above any input here).
pub fn envd_stream(chunks: &[&[u8]]) {
    let cut = follow(chunks);
    let whole = chunks.concat();
    assert_eq!(cut, follow(&[whole.as_slice()]));
}

/// A held process's stdout as taken, its stderr as kept (and whether truncated), whether
/// its stream ended, and the error that broke it.
type Held = (Vec<u8>, Vec<u8>, bool, bool, Option<String>);

/// A held process's stream read in `chunks`, as its held stdout reads it (no more reads
/// once it ended).
fn held(chunks: &[&[u8]]) -> Held {
    let mut stream = HeldStream::new(CAP);
    let mut broke = None;
    for chunk in chunks {
        if stream.ended {
            break;
        }
        stream.buf.extend_from_slice(chunk);
        if let Err(e) = stream.parse() {
            broke = Some(e.to_string());
            stream.ended = true;
        }
    }
    (
        stream.pending.concat(),
        stream.stderr.bytes().to_vec(),
        stream.stderr.truncated(),
        stream.ended,
        broke,
    )
}

/// A held process's (a cell relay's) stream from envd, cut into `chunks` as reads would cut
/// it and parsed as the held stdout parses it. Where the cuts fall changes nothing: stdout,
/// stderr, the end and any error are those of the whole stream read at once.
pub fn envd_held(chunks: &[&[u8]]) {
    let cut = held(chunks);
    let whole = chunks.concat();
    assert_eq!(cut, held(&[whole.as_slice()]));
}
