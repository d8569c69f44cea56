//! A `pid:starttime:cmdlinehex` report from inside a session container. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plimsolld::provider::docker::fuzzing;

fuzz_target!(|text: &str| {
    fuzzing::process_identity(text);
});
