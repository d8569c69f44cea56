//! Arbitrary bytes as a guest's call (`METHOD target`) on a run socket: checking and route
//! matching never panic, and whatever passes is safe to send upstream as is.
//!
//! Run with `cargo +nightly fuzz run guest_target` from `broker/fuzz`.
#![no_main]

use std::sync::OnceLock;

use broker::grants::{Route, Target};
use libfuzzer_sys::fuzz_target;

fn routes() -> &'static [Route] {
    static ROUTES: OnceLock<Vec<Route>> = OnceLock::new();
    ROUTES.get_or_init(|| {
        ["GET /items/*", "POST /v2/run", "GET /", "DELETE /a/*/b/*"]
            .iter()
            .map(|r| Route::parse(r).expect("a fixed route parses"))
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (method, raw) = text.split_once(' ').unwrap_or(("GET", text));
    let Ok(target) = Target::check(raw) else {
        return;
    };
    // What passes goes upstream byte for byte: it must be an absolute, decoded, canonical
    // path with nothing a server could read as a query, fragment, escape or traversal.
    assert_eq!(target.as_str(), raw);
    assert!(raw.starts_with('/'));
    assert!(!raw.contains(['?', '#', '%', '\\']));
    assert!(!raw.chars().any(char::is_control));
    assert!(raw == "/" || !raw.ends_with('/'));
    for segment in raw[1..].split('/').filter(|_| raw != "/") {
        assert!(!segment.is_empty(), "empty segment in {raw:?}");
        assert!(!segment.bytes().all(|b| b == b'.'), "dot segment in {raw:?}");
    }
    for route in routes() {
        let exact = route.matches(method, &target, false);
        let folded = route.matches(method, &target, true);
        // Case folding (route caps) only ever widens a match.
        assert!(!exact || folded, "{route} matched {method} {raw} exactly but not folded");
        // A match is on the route's own method.
        if exact {
            assert_eq!(method, route.method());
        }
    }
});
