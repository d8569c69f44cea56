//! The envd stream of a held process (a cell relay), whose output events carry what the
//! code in the VM writes: cut into reads and parsed as the held stdout parses it. Nothing
//! may panic; the cuts change nothing.
#![no_main]

mod chunks;

use libfuzzer_sys::fuzz_target;
use plimsolld::provider::e2b::fuzzing;

fuzz_target!(|input: chunks::Chunked<'_>| {
    fuzzing::envd_held(&input.chunks());
});
