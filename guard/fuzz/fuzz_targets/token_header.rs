//! Arbitrary bytes as an `X-Plimsoll-Guard` header value and as the link's hash header
//! (grants.md §5.4, §5.5 step 2): reading never panics, only a `crg_` token of the exact shape
//! is hashed, and a hash read from hex writes back to the same hex.
//!
//! Run with `cargo +nightly fuzz run token_header` from `guard/fuzz`.
#![no_main]

use guard::token::{TokenHash, well_formed};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let hashed = TokenHash::of_presented(data);
    assert_eq!(hashed.is_some(), well_formed(data));
    if hashed.is_some() {
        assert!(data.len() == 68 && data.starts_with(b"crg_"));
    }
    if let Some(hash) = TokenHash::from_hex(data) {
        assert_eq!(hash.to_hex().as_bytes(), data);
    }
});
