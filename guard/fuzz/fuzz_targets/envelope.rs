//! Arbitrary bytes as a guard request body (grants.md §5.5 step 7): decoding never panics, a
//! decoded envelope has a non-blank method and a non-empty path, its body is JSON text, and
//! it encodes to bytes that decode to the same envelope.
//!
//! Run with `cargo +nightly fuzz run envelope` from `guard/fuzz`.
#![no_main]

use guard::envelope::{Envelope, MAX_ENVELOPE_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(envelope) = Envelope::decode(data) else {
        return;
    };
    assert!(data.len() <= MAX_ENVELOPE_BYTES);
    assert!(!envelope.method.trim().is_empty(), "a blank method decoded");
    assert!(!envelope.path.is_empty(), "an empty path decoded");
    let again = Envelope::decode(&envelope.encode()).expect("an encoded envelope decodes");
    assert_eq!(again, envelope);
});
