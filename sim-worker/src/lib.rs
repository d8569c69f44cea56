//! `sim-worker`: the module image's worker. It runs one precompiled WebAssembly model once per
//! row of a parameter table and writes one results file (docs/modules.md; providers.md §8).
//!
//! plimsolld runs it as the single step of a project-runner plan in the module image:
//!
//! ```text
//! sim-worker --table <model> params.txt results.bin <end_time> <step> <max result bytes> <deadline ms>
//! sim-worker --list
//! ```
//!
//! The pieces, in the order a run uses them:
//! - [`engine`]: the one wasmtime configuration, shared with `sim-precompile`;
//! - [`model`]: loading `/models/<id>/model.cwasm` and checking it against the model ABI;
//! - [`limits`]: the per-instance memory and table caps, and the run's deadline;
//! - [`run`]: every row through a fresh instance, into a results file;
//! - [`cli`]: the command line and its exit codes ([`sim_format::exit`]).
//!
//! The worker is built without a compiler: models are compiled ahead of time, on the host
//! that builds the image, by `sim-precompile` (feature `compile`) with the same wasmtime and
//! the same [`engine::config`], and only deserialized here (see [`model`] for why that is
//! sound in the image).
//!
//! What it does not do: run anything but a model (a model imports nothing, so it can reach
//! nothing outside its own memory), run rows in parallel, or keep any state between rows.

pub mod cli;
pub mod engine;
pub mod limits;
pub mod model;
#[cfg(feature = "compile")]
pub mod precompile;
pub mod run;
