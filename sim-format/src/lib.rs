//! The files a module run passes between plimsolld and `sim-worker` (docs/modules.md), defined
//! once for both sides.
//!
//! A module run (wire.md §6.5, providers.md §8) steps one compiled model from 0 to `end_time`
//! once per parameter row. plimsolld writes the rows as a text [`table`], runs
//! `sim-worker --table …` in the module image through the project runner, and reads one binary
//! [`results`] file back. Both sides agree on:
//!
//! - [`grid`]: which times a model is stepped to, and so how many steps a row can take;
//! - [`table`]: the parameter table, one row a line, shortest round-trip decimals;
//! - [`results`]: the results file (`PLSM`), its size bound and its strict decoder;
//! - [`exit`] and [`status`]: what the worker's exit code and each row's status mean.
//!
//! ```
//! use sim_format::{grid, results, table};
//!
//! // Two rows of two parameters, stepped to 1.0 in steps of 0.25.
//! let text = table::write([[1.0, 0.5].as_slice(), [2.0, -0.0].as_slice()]);
//! assert_eq!(text, "1e0 5e-1\n2e0 -0e0\n");
//! assert_eq!(table::parse(&text, 2).unwrap(), [1.0, 0.5, 2.0, -0.0]);
//!
//! let steps = grid::step_count(1.0, 0.25);
//! assert_eq!(steps, 4);
//! // The worker refuses a run whose results could pass the budget (exit 4).
//! assert_eq!(results::bound(2, 3, steps), 20 + 2 * (4 + 8 * 3 * 4));
//!
//! let mut file = results::Writer::new(2, 3, 2);
//! file.row(4, &[0.0; 12]);
//! file.row(sim_format::status::TRAP, &[]);
//! let expect = results::Expect { rows: 2, params: 2, max_steps: steps };
//! let decoded = results::decode(&file.finish(), expect).unwrap();
//! assert_eq!(decoded.width, 3);
//! assert_eq!(decoded.rows[1].status, sim_format::status::TRAP);
//! ```
#![forbid(unsafe_code)]

pub mod grid;
pub mod results;
pub mod table;

/// The most values a parameter row, and a model's outputs per step, may hold.
pub const MAX_WIDTH: usize = 64;
/// The most rows one run may hold (wire.md §6.4 MaxModuleRows).
pub const MAX_ROWS: usize = 100_000;
/// The largest results file a run may produce (wire.md §6.4 MaxModuleResultBytes).
pub const MAX_RESULT_BYTES: u64 = 8 << 20;

/// The worker's exit codes, and what plimsolld makes of them (providers.md §8).
pub mod exit {
    /// The results file is complete: plimsolld decodes it.
    pub const OK: i32 = 0;
    /// The model could not be loaded (unknown id, not a model of this worker): `setup_failed`.
    pub const LOAD_FAILED: i32 = 1;
    /// The worker's own arguments were wrong: `setup_failed`.
    pub const USAGE: i32 = 2;
    /// The parameter table does not parse, or its width is not the model's: `setup_failed`.
    pub const MALFORMED_TABLE: i32 = 3;
    /// The results could pass the budget: refused as an invalid request; no row ran.
    pub const OVER_BUDGET: i32 = 4;
    /// The results file could not be written: like any other code, `protocol_error`.
    pub const NOT_WRITTEN: i32 = 5;
}

/// A row's status: the steps it completed (`0..`), or a negative code.
///
/// Codes `-1` to `-999` are the model's own (its `init` or `step` returned them; each model
/// documents its codes). Codes from `-1000` down are the worker's.
pub mod status {
    /// The most negative code a model may return.
    pub const MODEL_MIN: i32 = -999;
    /// The model broke the ABI: a status outside its range, outputs outside its memory.
    pub const ABI_VIOLATION: i32 = -1000;
    /// The model trapped: `unreachable` (a Rust panic), a bad memory access, a stack
    /// overflow, an integer division by zero.
    pub const TRAP: i32 = -1001;
    /// The run's deadline passed before this row finished; rows after it do not start.
    pub const DEADLINE: i32 = -1002;
    /// The model asked for more memory (or table space) than its limit.
    pub const MEMORY: i32 = -1003;
    /// The most negative status a results file may hold.
    pub const MIN: i32 = MEMORY;

    /// Whether `code` is a status a results file may carry for a row that did not complete.
    pub fn is_failure(code: i32) -> bool {
        (MIN..0).contains(&code)
    }
}
