//! What any TCP peer sends the listener before it is authenticated, after the HTTP/2
//! preface or not, cut into reads anywhere (inside the preface and frame headers too) and
//! fed to one connection's frame meter. Nothing may panic; the meter never cuts a peer off
//! within its budgets, nor lets more through than they allow.
#![no_main]

mod chunks;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use plimsolld::server::fuzzing;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    preface: bool,
    lengths: Vec<u8>,
    stream: &'a [u8],
}

fuzz_target!(|input: Input<'_>| {
    let mut bytes = Vec::new();
    if input.preface {
        bytes.extend_from_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    }
    bytes.extend_from_slice(input.stream);
    let chunked = chunks::Chunked {
        lengths: input.lengths,
        stream: &bytes,
    };
    fuzzing::frame_meter(&chunked.chunks());
});
