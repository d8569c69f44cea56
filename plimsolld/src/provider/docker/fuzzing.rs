//! Entry points for the cargo-fuzz targets in `plimsolld/fuzz` (feature `fuzzing`): every
//! parser of bytes a container writes back, which the guest controls. Each function must
//! return without panicking, whatever it is given.

use crate::provider::guest::cell::frames::{Frame, Lines};
use crate::provider::guest::cell::identity::ProcessId;
use crate::provider::guest::runner::{self, Report, ReportKey};

/// The runner's stdout around a valid frame: `before`, a frame of `body` authenticated with
/// `key`, then `after`, scanned as the daemon scans it; a verified body is decoded and turned
/// into wire form against the `asked` artifacts. Also scans `before` alone, unauthenticated.
pub fn runner_output(key: [u8; 32], before: &[u8], body: &[u8], after: &[u8], asked: &[String]) {
    let key = ReportKey::from_bytes(key);
    let _ = runner::scan(before, &key);
    let mut stdout = before.to_vec();
    stdout.extend_from_slice(&key.frame(body));
    stdout.extend_from_slice(after);
    let found = runner::scan(&stdout, &key);
    if let Some(verified) = found.report
        && let Ok(Report::Ran(ran)) = runner::decode(verified)
    {
        let _ = ran.into_wire(asked);
    }
}

/// A relay's output stream, cut into `chunks` as reads would cut it: split into lines, each
/// line parsed as a frame.
pub fn relay_stream(chunks: &[&[u8]]) {
    let mut lines = Lines::default();
    for chunk in chunks {
        match lines.push(chunk) {
            Ok(complete) => {
                for line in complete {
                    if let Ok(frame) = Frame::parse(&line) {
                        let _ = frame.nonce();
                    }
                }
            }
            Err(_) => return,
        }
    }
}

/// A launcher's or lister's `pid:starttime:cmdlinehex` report.
pub fn process_identity(text: &str) {
    let _ = ProcessId::parse(text);
}

/// A module run's results file, written by the worker in the sandbox: decoded against a
/// request of `rows` rows of `params` values on the grid `end_time`/`step`. A file that
/// decodes must answer exactly that request, with every NaN canonical.
pub fn module_results(bytes: &[u8], rows: u16, params: u8, end_time: f64, step: f64) {
    use super::module::results::{Asked, decode};
    let asked = Asked {
        rows: usize::from(rows),
        params: usize::from(params),
        end_time,
        step,
    };
    if let Ok(decoded) = decode(bytes, asked) {
        assert_eq!(decoded.runs.len(), asked.rows);
        for run in &decoded.runs {
            let steps = usize::try_from(run.status).unwrap_or(0);
            assert_eq!(run.outputs.len(), steps * decoded.width as usize);
            assert!(
                run.outputs
                    .iter()
                    .all(|v| !v.is_nan() || v.to_bits() == plimsoll::record::CANONICAL_NAN_BITS)
            );
        }
    }
}
