//! Arbitrary bytes as a grants file: loading never panics, and every profile that loads
//! keeps the promises route matching relies on.
//!
//! Run with `cargo +nightly fuzz run grants_file` from `broker/fuzz`.
#![no_main]

use std::collections::HashMap;
use std::path::Path;

use broker::grants::{self, Route, Target};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let env: HashMap<String, String> = HashMap::from([
        (
            "SECRET".to_owned(),
            "0123456789abcdef0123456789abcdef".to_owned(),
        ),
        ("TOKEN".to_owned(), "tok".to_owned()),
    ]);
    // preamble_file is anchored at a directory that does not exist: nothing is read.
    let Ok(profiles) = grants::parse(
        data,
        Path::new("fuzz.json"),
        Path::new("/nonexistent"),
        &env,
    ) else {
        return;
    };
    for profile in &profiles {
        for route in &profile.allow {
            // A loaded route's template is itself a valid route that parses back equal.
            let again = Route::parse(route.template()).expect("a loaded route re-parses");
            assert_eq!(&again, route);
            // A template without `*` is a valid target and matches itself.
            if !route.has_wildcard() {
                let target = Target::check(route.path()).expect("a literal route is a target");
                assert!(route.matches(route.method(), &target, false));
            }
        }
    }
    // Any UTF-8 input as a target: accepted targets never carry a query or an escape.
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(target) = Target::check(text)
    {
        let raw = target.as_str();
        assert!(raw.starts_with('/') && !raw.contains(['?', '#', '%', '\\']));
    }
});
