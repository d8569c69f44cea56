//! `probe-grow`: a limit probe. Its first step allocates without bound, so a run of it shows
//! the worker's memory cap (wasmtime's resource limiter) at work: the row ends with status
//! -1003 when the model's memory would pass 16 MiB.
//!
//! | | |
//! |---|---|
//! | parameters | one, unused |
//! | outputs | one: megabytes held, never reached |

use model_abi::{Model, Step};

pub struct Grow(Vec<Vec<u8>>);

impl Model for Grow {
    const PARAMS: usize = 1;
    const OUTPUTS: usize = 1;

    fn init(_: &[f64]) -> Result<Self, i32> {
        Ok(Grow(Vec::new()))
    }

    fn step(&mut self, _t: f64, _h: f64, out: &mut [f64]) -> Result<Step, i32> {
        loop {
            // Touched and kept, so no allocation can be optimised away.
            let chunk = core::hint::black_box(vec![1u8; 1 << 20]);
            self.0.push(chunk);
            out[0] = self.0.len() as f64;
        }
    }
}

model_abi::export_model!(Grow);
