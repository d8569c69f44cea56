//! Starting `plimsolld` with the wasm provider (`SANDBOX_PROVIDER=wasm`).

use std::sync::OnceLock;
use std::time::Duration;

use crate::{Daemon, fresh_token};

/// The first start on a machine compiles the guest (tens of seconds in a debug build,
/// longer than [`Daemon::start`] waits); [`warm_cache`] pays for it once, with this much
/// patience.
pub const FIRST_START_TIMEOUT: Duration = Duration::from_secs(300);

/// Starts one wasm daemon and waits for it to listen, so that the compiled guest is in
/// the cache before the tests start their own daemons (whose start waits only 30 s).
/// Runs once per test binary; the warm-up daemon is killed as soon as it listens.
pub fn warm_cache() {
    static WARM: OnceLock<()> = OnceLock::new();
    WARM.get_or_init(|| {
        let warm_up = Daemon::start_within(
            &[
                ("SANDBOX_PROVIDER", "wasm"),
                ("PLIMSOLL_INSECURE", "1"),
                ("PLIMSOLL_METRICS_ADDR", "off"),
            ],
            FIRST_START_TIMEOUT,
        );
        drop(warm_up);
    });
}

/// A wasm daemon (after [`warm_cache`]) with `env` on top of [`Daemon::start`]'s.
pub fn wasm_daemon(env: &[(&str, &str)]) -> Daemon {
    warm_cache();
    let mut full = vec![("SANDBOX_PROVIDER", "wasm")];
    full.extend_from_slice(env);
    Daemon::start(&full)
}

/// A [`wasm_daemon`] with one fresh shared token and no rate limit, `env` on top; returns
/// the daemon and its token.
pub fn wasm_daemon_with_token(env: &[(&str, &str)]) -> (Daemon, String) {
    let token = fresh_token();
    let mut full = vec![
        ("PLIMSOLL_TOKEN", token.as_str()),
        ("SANDBOX_RATE_PER_MIN", "0"),
    ];
    full.extend_from_slice(env);
    (wasm_daemon(&full), token)
}
