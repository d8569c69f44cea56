//! The results file: the only thing a module run brings back.
//!
//! Little-endian throughout:
//!
//! ```text
//! offset  size  field
//!      0     4  magic "PLSM"
//!      4     4  u32 version (1)
//!      8     4  u32 rows     (as many as the table had, in its order)
//!     12     4  u32 width    (the model's outputs per step, 1 to 64)
//!     16     4  u32 params   (the model's parameters per row, 1 to 64)
//!     20        per row: i32 status, then status × width f64 outputs when status > 0,
//!               step-major (step 0's outputs, then step 1's, …)
//! ```
//!
//! A row's status is the number of steps it completed, or a negative code
//! ([`status`](crate::status)); a failed row carries no outputs. The file is written whole or
//! not at all: [`decode`] refuses anything shorter, longer or otherwise off, so a cut file is
//! never read as fewer results.

/// The file's first four bytes.
pub const MAGIC: [u8; 4] = *b"PLSM";
/// The version this crate writes and reads.
pub const VERSION: u32 = 1;
/// The header's size in bytes.
pub const HEADER_BYTES: u64 = 20;

/// The largest results file `rows` rows of a model with `width` outputs per step can make in
/// `steps` steps each (saturating). The worker refuses a run whose bound passes
/// [`MAX_RESULT_BYTES`](crate::MAX_RESULT_BYTES) before any row runs.
pub fn bound(rows: u64, width: u64, steps: u64) -> u64 {
    let per_row = width
        .saturating_mul(steps)
        .saturating_mul(8)
        .saturating_add(4);
    HEADER_BYTES.saturating_add(rows.saturating_mul(per_row))
}

// === impl Writer ===

/// Builds a results file in memory, row by row.
#[derive(Debug)]
pub struct Writer {
    bytes: Vec<u8>,
    width: usize,
}

impl Writer {
    /// A file for `rows` rows of a model with `width` outputs and `params` parameters.
    pub fn new(rows: u32, width: u32, params: u32) -> Writer {
        let mut bytes = Vec::with_capacity(HEADER_BYTES as usize);
        bytes.extend_from_slice(&MAGIC);
        for field in [VERSION, rows, width, params] {
            bytes.extend_from_slice(&field.to_le_bytes());
        }
        Writer {
            bytes,
            width: width as usize,
        }
    }

    /// Appends one row: `status` and, when it is positive, its `outputs` (which must then
    /// hold `status × width` values; a failed row's outputs are not written).
    pub fn row(&mut self, status: i32, outputs: &[f64]) {
        self.bytes.extend_from_slice(&status.to_le_bytes());
        if status > 0 {
            debug_assert_eq!(outputs.len(), status as usize * self.width);
            for value in outputs {
                self.bytes.extend_from_slice(&value.to_le_bytes());
            }
        }
    }

    /// The file's bytes.
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

// === impl decode ===

/// What the reader knows independently of the file: the request it sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    /// The rows the table had.
    pub rows: u32,
    /// The values each row had.
    pub params: u32,
    /// The steps a row can take at most ([`grid::step_count`](crate::grid::step_count)).
    pub max_steps: u64,
}

/// One row's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Steps completed, or a negative code.
    pub status: i32,
    /// `status × width` values, step-major; empty for a failed row.
    pub outputs: Vec<f64>,
}

/// A whole, checked results file.
#[derive(Debug, Clone, PartialEq)]
pub struct Results {
    /// The model's outputs per step.
    pub width: u32,
    /// One entry per table row, in its order.
    pub rows: Vec<Row>,
}

/// Why a results file was refused. Any of these means the worker's answer cannot be trusted
/// as a whole, so none of it is used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResultsError {
    /// Larger than a run may produce.
    #[error("the results file is {0} bytes, over the limit")]
    TooLarge(usize),
    /// Shorter than its header.
    #[error("the results file is {0} bytes, shorter than its header")]
    NoHeader(usize),
    /// Not a results file of this version.
    #[error("the results file has no PLSM version 1 header")]
    NotResults,
    /// The header's counts are not the request's.
    #[error("the results file is for {rows} rows of {params} parameters, not the request's")]
    OtherRequest { rows: u32, params: u32 },
    /// The output width is outside 1 to 64.
    #[error("the results file states {0} outputs per step")]
    Width(u32),
    /// A status is neither a step count within the grid nor a known code.
    #[error("row {row} has status {status}, which no worker writes")]
    Status { row: u32, status: i32 },
    /// The file ends inside a row.
    #[error("the results file ends inside row {0}")]
    Truncated(u32),
    /// Bytes follow the last row.
    #[error("the results file has {0} bytes after its last row")]
    Trailing(usize),
}

/// Reads a results file, refusing anything that is not exactly one whole answer to `expect`.
pub fn decode(bytes: &[u8], expect: Expect) -> Result<Results, ResultsError> {
    if bytes.len() as u64 > crate::MAX_RESULT_BYTES {
        return Err(ResultsError::TooLarge(bytes.len()));
    }
    let mut reader = Reader { bytes, at: 0 };
    let (Some(magic), Some(version), Some(rows), Some(width), Some(params)) = (
        reader.take(4),
        reader.u32(),
        reader.u32(),
        reader.u32(),
        reader.u32(),
    ) else {
        return Err(ResultsError::NoHeader(bytes.len()));
    };
    if magic != MAGIC || version != VERSION {
        return Err(ResultsError::NotResults);
    }
    if rows != expect.rows || params != expect.params {
        return Err(ResultsError::OtherRequest { rows, params });
    }
    if width == 0 || width as usize > crate::MAX_WIDTH {
        return Err(ResultsError::Width(width));
    }
    let mut out = Vec::with_capacity(rows as usize);
    for row in 0..rows {
        let status = reader.i32().ok_or(ResultsError::Truncated(row))?;
        let steps = match u64::try_from(status) {
            Ok(steps) if steps <= expect.max_steps => steps,
            Err(_) if crate::status::is_failure(status) => 0,
            _ => return Err(ResultsError::Status { row, status }),
        };
        // Bounded by the file's length check above: at most 1 Mi values in all.
        let count = steps as usize * width as usize;
        let raw = reader
            .take(count.saturating_mul(8))
            .ok_or(ResultsError::Truncated(row))?;
        let outputs = raw
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        out.push(Row { status, outputs });
    }
    match bytes.len() - reader.at {
        0 => Ok(Results { width, rows: out }),
        extra => Err(ResultsError::Trailing(extra)),
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i32(&mut self) -> Option<i32> {
        self.take(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status;

    const EXPECT: Expect = Expect {
        rows: 3,
        params: 2,
        max_steps: 4,
    };

    fn sample() -> Vec<u8> {
        let mut w = Writer::new(3, 2, 2);
        w.row(2, &[1.0, -0.0, f64::NAN, f64::INFINITY]);
        w.row(status::DEADLINE, &[]);
        w.row(-7, &[]);
        w.finish()
    }

    #[test]
    fn a_whole_file_decodes_bit_for_bit() {
        let results = decode(&sample(), EXPECT).unwrap();
        assert_eq!(results.width, 2);
        let statuses: Vec<i32> = results.rows.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [2, status::DEADLINE, -7]);
        let bits: Vec<u64> = results.rows[0]
            .outputs
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(
            bits,
            [
                1.0f64.to_bits(),
                (-0.0f64).to_bits(),
                f64::NAN.to_bits(),
                f64::INFINITY.to_bits()
            ]
        );
        assert!(results.rows[1].outputs.is_empty());
    }

    #[test]
    fn every_cut_of_a_file_is_refused() {
        let whole = sample();
        for len in 0..whole.len() {
            assert!(decode(&whole[..len], EXPECT).is_err(), "cut at {len}");
        }
        let mut longer = whole.clone();
        longer.push(0);
        assert_eq!(decode(&longer, EXPECT), Err(ResultsError::Trailing(1)));
    }

    #[test]
    fn a_header_for_another_request_or_an_unknown_status_is_refused() {
        let other = Expect { rows: 2, ..EXPECT };
        assert!(matches!(
            decode(&sample(), other),
            Err(ResultsError::OtherRequest { .. })
        ));
        let fewer_steps = Expect {
            max_steps: 1,
            ..EXPECT
        };
        assert_eq!(
            decode(&sample(), fewer_steps),
            Err(ResultsError::Status { row: 0, status: 2 })
        );
        let mut w = Writer::new(1, 1, 2);
        w.row(status::MIN - 1, &[]);
        let expect = Expect { rows: 1, ..EXPECT };
        assert!(matches!(
            decode(&w.finish(), expect),
            Err(ResultsError::Status { .. })
        ));
        let mut bad = sample();
        bad[0] = b'X';
        assert_eq!(decode(&bad, EXPECT), Err(ResultsError::NotResults));
        let mut wide = Writer::new(1, 65, 2);
        wide.row(0, &[]);
        assert_eq!(decode(&wide.finish(), expect), Err(ResultsError::Width(65)));
    }

    #[test]
    fn the_bound_matches_the_largest_file() {
        let mut w = Writer::new(2, 3, 1);
        w.row(5, &[0.5; 15]);
        w.row(5, &[0.5; 15]);
        assert_eq!(w.finish().len() as u64, bound(2, 3, 5));
        assert_eq!(bound(u64::MAX, 64, u64::MAX), u64::MAX);
    }
}
