//! A Docker Cloud sandbox endpoint's multipart/mixed answer to a REST download, which
//! carries a file the code in the sandbox wrote, under any boundary. Nothing may panic; no
//! part read holds a delimiter.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use plimsolld::provider::dockercloud::fuzzing;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    boundary: &'a str,
    body: &'a [u8],
}

fuzz_target!(|input: Input<'_>| {
    fuzzing::multipart(input.body, input.boundary);
});
