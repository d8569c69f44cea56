//! One module run: every row of the table through the model, in order, into one results
//! file.
//!
//! Each row gets a fresh instance (no state carries from one row to the next) under the row
//! caps and the run's deadline. A row's status is the steps it completed, the model's own
//! negative code, or the worker's code for what stopped it; whatever happens to one row, the
//! others still get their entry.

use sim_format::grid::Grid;
use sim_format::results::Writer;
use sim_format::status;
use wasmtime::{Instance, Memory, Store, Trap, TypedFunc};

use crate::limits::{Deadline, OverLimit};
use crate::model::{Model, RowState};

/// What a step returns to go on.
const STEP_CONTINUE: i32 = 0;
/// What a step returns when the model has finished: this step's outputs are its last.
const STEP_FINISHED: i32 = 1;

/// Runs every row of `table` (row-major, `model.params` values a row) on `grid`, and returns
/// the results file's bytes. The caller has checked the table's width and the results budget.
pub fn rows(model: &Model, table: &[f64], grid: Grid, deadline: Deadline) -> Vec<u8> {
    let params = model.params as usize;
    let rows = table.len() / params;
    let mut file = Writer::new(rows as u32, model.outputs, model.params);
    let mut outputs = Vec::new();
    for row in table.chunks_exact(params) {
        outputs.clear();
        let status = one_row(model, row, grid, deadline, &mut outputs);
        file.row(status, &outputs);
    }
    file.finish()
}

/// One row: its status, with its outputs appended to `outputs` when it completed.
fn one_row(
    model: &Model,
    params: &[f64],
    grid: Grid,
    deadline: Deadline,
    outputs: &mut Vec<f64>,
) -> i32 {
    let mut store = model.store();
    if deadline.arm(&mut store).is_err() {
        return status::DEADLINE;
    }
    match stepped(model, &mut store, params, grid, outputs) {
        Ok(status) => status,
        Err(Stop::Code(code)) => code,
        Err(Stop::Trap(error)) => trap_status(&error),
    }
}

/// Why a row stopped before completing.
enum Stop {
    /// A status to report as is.
    Code(i32),
    /// wasmtime stopped the model.
    Trap(wasmtime::Error),
}

impl From<wasmtime::Error> for Stop {
    fn from(error: wasmtime::Error) -> Stop {
        Stop::Trap(error)
    }
}

/// The row's exports, found once per instance.
struct Exports {
    memory: Memory,
    init: TypedFunc<(), i32>,
    step: TypedFunc<(f64, f64), i32>,
    outputs_at: usize,
}

fn exports(instance: &Instance, store: &mut Store<RowState>) -> Result<Exports, Stop> {
    let memory = instance
        .get_memory(&mut *store, "memory")
        .ok_or(Stop::Code(status::ABI_VIOLATION))?;
    let address = |store: &mut Store<RowState>, name: &str| -> Result<usize, Stop> {
        let f: TypedFunc<(), i32> = instance.get_typed_func(&mut *store, name)?;
        let at = f.call(&mut *store, ())?;
        // A wasm32 address is an unsigned 32-bit number.
        Ok(at as u32 as usize)
    };
    let outputs_at = address(store, "plimsoll_outputs_ptr")?;
    Ok(Exports {
        memory,
        init: instance.get_typed_func(&mut *store, "plimsoll_init")?,
        step: instance.get_typed_func(&mut *store, "plimsoll_step")?,
        outputs_at,
    })
}

fn stepped(
    model: &Model,
    store: &mut Store<RowState>,
    params: &[f64],
    grid: Grid,
    outputs: &mut Vec<f64>,
) -> Result<i32, Stop> {
    let instance = model.pre().instantiate(&mut *store)?;
    let params_at = {
        let f: TypedFunc<(), i32> = instance.get_typed_func(&mut *store, "plimsoll_params_ptr")?;
        f.call(&mut *store, ())? as u32 as usize
    };
    let exports = exports(&instance, store)?;
    let bytes: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
    exports
        .memory
        .write(&mut *store, params_at, &bytes)
        .map_err(|_| Stop::Code(status::ABI_VIOLATION))?;
    model_code(exports.init.call(&mut *store, ())?, false)?;
    let width = model.outputs as usize;
    let mut raw = vec![0u8; width * 8];
    for k in 0..grid.steps() {
        let (t, h) = grid.interval(k);
        let returned = exports.step.call(&mut *store, (t, h))?;
        let finished = model_code(returned, true)?;
        exports
            .memory
            .read(&*store, exports.outputs_at, &mut raw)
            .map_err(|_| Stop::Code(status::ABI_VIOLATION))?;
        outputs.extend(
            raw.chunks_exact(8)
                .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])),
        );
        if finished {
            return Ok(k as i32 + 1);
        }
    }
    // At most 1 000 000 steps (the wire's MaxModuleSteps), so the count fits an i32.
    Ok(grid.steps() as i32)
}

/// A model's return code: `Ok(true)` when a step says the model finished, `Ok(false)` to go
/// on, a model error code as the row's status, anything else an ABI violation.
fn model_code(code: i32, from_step: bool) -> Result<bool, Stop> {
    match code {
        STEP_CONTINUE => Ok(false),
        STEP_FINISHED if from_step => Ok(true),
        c if (status::MODEL_MIN..0).contains(&c) => Err(Stop::Code(c)),
        _ => Err(Stop::Code(status::ABI_VIOLATION)),
    }
}

/// The status for what stopped a model.
fn trap_status(error: &wasmtime::Error) -> i32 {
    if error.downcast_ref::<OverLimit>().is_some() {
        return status::MEMORY;
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => status::DEADLINE,
        _ => status::TRAP,
    }
}
