//! The model ABI, version 1 (docs/modules.md): what `sim-worker` calls in a model, and a
//! [`Model`] trait plus [`export_model!`] so a model written in Rust only states its physics.
//!
//! A model is a WebAssembly module that imports nothing and exports:
//!
//! | export | type | meaning |
//! |---|---|---|
//! | `memory` | memory | its linear memory (at most 16 MiB) |
//! | `plimsoll_abi` | `() -> i32` | the ABI version: 1 |
//! | `plimsoll_params` | `() -> i32` | parameters per row, 1 to 64 |
//! | `plimsoll_outputs` | `() -> i32` | outputs per step, 1 to 64 |
//! | `plimsoll_params_ptr` | `() -> i32` | where the worker writes a row's parameters (f64, little-endian) |
//! | `plimsoll_outputs_ptr` | `() -> i32` | where the worker reads a step's outputs |
//! | `plimsoll_init` | `() -> i32` | starts a row from the parameters: 0, or the model's code (-1 to -999) |
//! | `plimsoll_step` | `(t: f64, h: f64) -> i32` | advances from `t` by `h` and writes the outputs at `t + h`: 0 to go on, 1 when finished (these outputs are the last), or the model's code |
//!
//! Every row is a fresh instance: `init` once, then `step` for each step of the grid.
//!
//! ```ignore
//! struct Decay { k: f64, x: f64 }
//!
//! impl model_abi::Model for Decay {
//!     const PARAMS: usize = 2; // k, x0
//!     const OUTPUTS: usize = 1; // x
//!     fn init(p: &[f64]) -> Result<Self, i32> {
//!         if p[0] <= 0.0 { return Err(-1) }
//!         Ok(Decay { k: p[0], x: p[1] })
//!     }
//!     fn step(&mut self, _t: f64, h: f64, out: &mut [f64]) -> Result<model_abi::Step, i32> {
//!         self.x *= (-self.k * h).exp();
//!         out[0] = self.x;
//!         Ok(model_abi::Step::Continue)
//!     }
//! }
//!
//! model_abi::export_model!(Decay);
//! ```

use core::cell::UnsafeCell;

/// The ABI version this crate writes.
pub const ABI_VERSION: i32 = 1;
/// The most parameters or outputs a model may have.
pub const MAX_WIDTH: usize = 64;

/// What a step asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Go on with the next step.
    Continue,
    /// The model has finished: this step's outputs are its last (the row's status is the
    /// number of steps taken so far).
    Finished,
}

/// A model: its shape and its physics. Errors are the model's own codes, -1 to -999, which
/// the row's status carries; document them with the model.
pub trait Model: Sized {
    /// Parameters per row (1 to 64).
    const PARAMS: usize;
    /// Outputs per step (1 to 64).
    const OUTPUTS: usize;
    /// A row's starting state from its parameters (`PARAMS` values).
    fn init(params: &[f64]) -> Result<Self, i32>;
    /// Advances from `t` by `h` and writes the outputs at `t + h` (`OUTPUTS` values).
    fn step(&mut self, t: f64, h: f64, outputs: &mut [f64]) -> Result<Step, i32>;
}

/// A place in linear memory the worker reads or writes between calls.
pub struct Slot<T>(UnsafeCell<T>);

// SAFETY: a model instance is single-threaded (wasm32 without threads, no shared memory), and
// the worker calls one export at a time, so no two borrows of a slot ever overlap.
unsafe impl<T> Sync for Slot<T> {}

impl<T> Slot<T> {
    /// A slot holding `value`.
    pub const fn new(value: T) -> Slot<T> {
        Slot(UnsafeCell::new(value))
    }

    /// Its address in linear memory, as the ABI passes addresses.
    pub fn address(&self) -> i32 {
        self.0.get() as usize as i32
    }

    /// Runs `f` on the slot's value.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // SAFETY: see the `Sync` impl: exports run one at a time on one thread, and no
        // export calls another, so this is the only borrow while `f` runs.
        f(unsafe { &mut *self.0.get() })
    }
}

/// A row's parameters or a step's outputs.
pub type Values = Slot<[f64; MAX_WIDTH]>;

/// `plimsoll_init` for model `M`.
pub fn init<M: Model>(state: &Slot<Option<M>>, params: &Values) -> i32 {
    let started = params.with(|p| M::init(&p[..M::PARAMS]));
    match started {
        Ok(model) => {
            state.with(|s| *s = Some(model));
            0
        }
        Err(code) => model_code(code),
    }
}

/// `plimsoll_step` for model `M`.
pub fn step<M: Model>(state: &Slot<Option<M>>, outputs: &Values, t: f64, h: f64) -> i32 {
    state.with(|s| match s {
        Some(model) => match outputs.with(|o| model.step(t, h, &mut o[..M::OUTPUTS])) {
            Ok(Step::Continue) => 0,
            Ok(Step::Finished) => 1,
            Err(code) => model_code(code),
        },
        // The worker always calls init first; a step without a state is the ABI broken.
        None => panic!("plimsoll_step before plimsoll_init"),
    })
}

/// A model's code, kept in its range (anything else would read as an ABI violation).
fn model_code(code: i32) -> i32 {
    code.clamp(-999, -1)
}

/// Writes the ABI's exports for a [`Model`] type. Use once per model crate (a `cdylib`).
#[macro_export]
macro_rules! export_model {
    ($model:ty) => {
        const _: () = {
            assert!(
                <$model as $crate::Model>::PARAMS >= 1
                    && <$model as $crate::Model>::PARAMS <= $crate::MAX_WIDTH
            );
            assert!(
                <$model as $crate::Model>::OUTPUTS >= 1
                    && <$model as $crate::Model>::OUTPUTS <= $crate::MAX_WIDTH
            );
        };
        static PLIMSOLL_PARAMS: $crate::Values = $crate::Slot::new([0.0; $crate::MAX_WIDTH]);
        static PLIMSOLL_OUTPUTS: $crate::Values = $crate::Slot::new([0.0; $crate::MAX_WIDTH]);
        static PLIMSOLL_STATE: $crate::Slot<Option<$model>> = $crate::Slot::new(None);

        #[unsafe(no_mangle)]
        pub extern "C" fn plimsoll_abi() -> i32 {
            $crate::ABI_VERSION
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn plimsoll_params() -> i32 {
            <$model as $crate::Model>::PARAMS as i32
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn plimsoll_outputs() -> i32 {
            <$model as $crate::Model>::OUTPUTS as i32
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn plimsoll_params_ptr() -> i32 {
            PLIMSOLL_PARAMS.address()
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn plimsoll_outputs_ptr() -> i32 {
            PLIMSOLL_OUTPUTS.address()
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn plimsoll_init() -> i32 {
            $crate::init::<$model>(&PLIMSOLL_STATE, &PLIMSOLL_PARAMS)
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn plimsoll_step(t: f64, h: f64) -> i32 {
            $crate::step::<$model>(&PLIMSOLL_STATE, &PLIMSOLL_OUTPUTS, t, h)
        }
    };
}
