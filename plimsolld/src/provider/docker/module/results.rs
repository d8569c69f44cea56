//! The results file a module run brings back, decoded into the wire's `ModuleResult` rows.
//!
//! The file is written by `sim-worker` inside the sandbox, so it is untrusted: the decoder
//! (`sim_format::results::decode`) accepts only one whole file that answers this request
//! (its row and parameter counts, statuses within the grid or known codes, no byte missing or
//! left over). Anything else is refused whole, never read as fewer results. Every NaN among
//! the outputs becomes the canonical quiet NaN here (wire.md §6.7); `-0.0` stays.

use plimsoll::record::canonical_nan;
use plimsoll::wire::ModuleRowResult;
use sim_format::grid;
use sim_format::results::{self, Expect, ResultsError};

/// What the request said the file must answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Asked {
    /// Rows sent.
    pub rows: usize,
    /// Values per row.
    pub params: usize,
    /// The grid's end time.
    pub end_time: f64,
    /// The grid's step.
    pub step: f64,
}

/// A decoded results file in wire form.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The model's outputs per step.
    pub width: i32,
    /// One per request row, in order.
    pub runs: Vec<ModuleRowResult>,
}

/// Decodes `bytes` as the answer to `asked`.
pub fn decode(bytes: &[u8], asked: Asked) -> Result<Decoded, ResultsError> {
    let expect = Expect {
        rows: u32::try_from(asked.rows).unwrap_or(u32::MAX),
        params: u32::try_from(asked.params).unwrap_or(u32::MAX),
        max_steps: grid::step_count(asked.end_time, asked.step),
    };
    let file = results::decode(bytes, expect)?;
    let runs = file
        .rows
        .into_iter()
        .map(|row| ModuleRowResult {
            status: row.status,
            outputs: row.outputs.into_iter().map(canonical_nan).collect(),
            ..Default::default()
        })
        .collect();
    Ok(Decoded {
        // At most 64: the decoder refuses any other width.
        width: i32::try_from(file.width).unwrap_or(i32::MAX),
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use plimsoll::record::CANONICAL_NAN_BITS;
    use sim_format::results::Writer;
    use sim_format::status;

    const ASKED: Asked = Asked {
        rows: 2,
        params: 3,
        end_time: 1.0,
        step: 0.5,
    };

    #[test]
    fn every_nan_is_canonical_and_negative_zero_stays() {
        let payload_nan = f64::from_bits(0xfff0_0000_dead_beef);
        let mut file = Writer::new(2, 2, 3);
        file.row(2, &[payload_nan, -0.0, f64::NAN, f64::NEG_INFINITY]);
        file.row(status::TRAP, &[]);
        let decoded = decode(&file.finish(), ASKED).unwrap();
        assert_eq!(decoded.width, 2);
        let bits: Vec<u64> = decoded.runs[0]
            .outputs
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(
            bits,
            [
                CANONICAL_NAN_BITS,
                (-0.0f64).to_bits(),
                CANONICAL_NAN_BITS,
                f64::NEG_INFINITY.to_bits()
            ]
        );
        assert_eq!(decoded.runs[1].status, status::TRAP);
        assert!(decoded.runs[1].outputs.is_empty());
    }

    /// A truncated artifact is refused whole (providers.md §8: never a truncated result).
    #[test]
    fn a_file_for_another_request_or_cut_short_is_refused() {
        let mut file = Writer::new(2, 1, 3);
        file.row(2, &[1.0, 2.0]);
        file.row(1, &[3.0]);
        let bytes = file.finish();
        assert!(decode(&bytes, ASKED).is_ok());
        assert!(decode(&bytes[..bytes.len() - 1], ASKED).is_err());
        assert!(decode(&bytes, Asked { rows: 3, ..ASKED }).is_err());
        assert!(decode(&bytes, Asked { params: 2, ..ASKED }).is_err());
        // Three steps where the grid has two.
        assert!(
            decode(
                &bytes,
                Asked {
                    end_time: 0.5,
                    ..ASKED
                }
            )
            .is_err()
        );
    }
}
