//! `probe-spin`: a limit probe. Its first step never returns, so a run of it shows the
//! worker's deadline (wasmtime's epoch interruption) at work: the row ends with status
//! -1002 at the run's deadline.
//!
//! | | |
//! |---|---|
//! | parameters | one, unused |
//! | outputs | one, never written |

use model_abi::{Model, Step};

pub struct Spin(u64);

impl Model for Spin {
    const PARAMS: usize = 1;
    const OUTPUTS: usize = 1;

    fn init(_: &[f64]) -> Result<Self, i32> {
        Ok(Spin(0))
    }

    fn step(&mut self, _t: f64, _h: f64, out: &mut [f64]) -> Result<Step, i32> {
        loop {
            // Work the optimiser cannot remove, so the loop stays a loop.
            self.0 = core::hint::black_box(self.0.wrapping_add(1));
            if self.0 == u64::MAX {
                out[0] = 0.0;
                return Ok(Step::Continue);
            }
        }
    }
}

model_abi::export_model!(Spin);
