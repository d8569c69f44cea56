//! An OpenShell relay's stdout, which the guest can write to: cut into reads, split into
//! lines and read as words. Nothing may panic; the words are those of the whole stream.
#![no_main]

mod chunks;

use libfuzzer_sys::fuzz_target;
use plimsolld::provider::openshell::fuzzing;

fuzz_target!(|input: chunks::Chunked<'_>| {
    fuzzing::relay_words(&input.chunks());
});
