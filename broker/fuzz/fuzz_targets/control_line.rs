//! Arbitrary bytes as one control-protocol line, in either direction: decoding never panics,
//! and whatever decodes encodes to a line that decodes to the same message.
//!
//! Run with `cargo +nightly fuzz run control_line` from `broker/fuzz`.
#![no_main]

use broker::control::protocol::{Request, Response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = serde_json::from_slice::<Request>(data) {
        let line = serde_json::to_string(&request).expect("a request encodes");
        assert!(!line.contains('\n'), "an encoded line holds no newline");
        let again: Request = serde_json::from_str(&line).expect("an encoded request decodes");
        assert_eq!(again, request);
    }
    if let Ok(response) = serde_json::from_slice::<Response>(data) {
        let line = serde_json::to_string(&response).expect("a response encodes");
        assert!(!line.contains('\n'), "an encoded line holds no newline");
        let again: Response = serde_json::from_str(&line).expect("an encoded response decodes");
        assert_eq!(again, response);
    }
});
