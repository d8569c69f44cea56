//! envd's answer to a run's `Start`, whose output events carry what the code in the VM
//! writes: cut into reads and followed to its ending. Nothing may panic; the cuts change
//! nothing.
#![no_main]

mod chunks;

use libfuzzer_sys::fuzz_target;
use plimsolld::provider::e2b::fuzzing;

fuzz_target!(|input: chunks::Chunked<'_>| {
    fuzzing::envd_stream(&input.chunks());
});
