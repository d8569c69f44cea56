//! A Docker Cloud sandbox endpoint's answer to a Connect file stream call, which carries
//! files the code in the sandbox wrote: its envelopes read to the end-of-stream envelope.
//! Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plimsolld::provider::dockercloud::fuzzing;

fuzz_target!(|body: &[u8]| {
    fuzzing::connect_stream(body);
});
