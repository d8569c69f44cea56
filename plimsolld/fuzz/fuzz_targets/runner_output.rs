//! The project runner's stdout, which every process in the container can write to: a frame
//! authenticated with the run's key between arbitrary bytes, scanned, and its body decoded
//! and turned into wire form. Nothing may panic.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use plimsolld::provider::docker::fuzzing;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    key: [u8; 32],
    before: &'a [u8],
    body: &'a [u8],
    after: &'a [u8],
    asked: Vec<String>,
}

fuzz_target!(|input: Input<'_>| {
    fuzzing::runner_output(input.key, input.before, input.body, input.after, &input.asked);
});
