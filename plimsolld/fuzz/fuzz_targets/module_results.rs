//! A module run's results file, which the worker in the sandbox writes: decoded against a
//! request, strictly. Nothing may panic; a file that decodes answers exactly that request.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use plimsolld::provider::docker::fuzzing;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    rows: u16,
    params: u8,
    end_time: f64,
    step: f64,
    file: &'a [u8],
}

fuzz_target!(|input: Input<'_>| {
    fuzzing::module_results(
        input.file,
        input.rows,
        input.params,
        input.end_time,
        input.step,
    );
});
