//! A cell relay's output, which code in the session can shape: cut into reads, split into
//! lines and parsed as frames. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plimsolld::provider::docker::fuzzing;

fuzz_target!(|chunks: Vec<&[u8]>| {
    fuzzing::relay_stream(&chunks);
});
