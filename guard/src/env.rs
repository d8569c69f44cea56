//! Every environment variable the guard reads, and the one the broker binds for it.
//!
//! The guard binary reads only these names; `guard --help` lists them. Some share a name with
//! a plimsolld setting (the TLS pair, `SANDBOX_MAX_CONCURRENT`, `PLIMSOLL_HARDENED`, the log
//! format) because the guard is that daemon's guard listener run as its own process: an
//! operator gives both processes the same values: plimsolld's table (and the broker's, for
//! the log format) names those from here, and [`GUARD_ADDR`] too.

/// The guard's listener, `host:port` (`:0` picks a free port). Required by the guard binary;
/// plimsolld requires it exactly when a guard URL is set (config.md §2.1).
pub const GUARD_ADDR: &str = "PLIMSOLL_GUARD_ADDR";

/// A file the guard writes its bound address to (`host:port` and a newline) once it listens,
/// and removes when it stops. Optional: how a supervisor or a test learns a `:0` port.
pub const GUARD_ADDR_FILE: &str = "PLIMSOLL_GUARD_ADDR_FILE";

/// Path of the broker's guard socket: the broker listens there (mode 0660), the guard
/// connects there. The only thing the guard can ask the broker is whether a token is live and
/// to make one call with it; it never reaches the control socket.
pub const BROKER_GUARD_SOCKET: &str = "PLIMSOLL_BROKER_GUARD_SOCKET";

/// PEM certificate chain for the guard's TLS; set together with [`TLS_KEY`].
pub const TLS_CERT: &str = "PLIMSOLL_TLS_CERT";

/// PEM private key for the guard's TLS; set together with [`TLS_CERT`].
pub const TLS_KEY: &str = "PLIMSOLL_TLS_KEY";

/// The daemon's run cap, `[1, 1024]`, default 8: the guard decodes at most twice as many
/// bodies at once (grants.md §5.5 step 5).
pub const MAX_CONCURRENT: &str = "SANDBOX_MAX_CONCURRENT";

/// Strict boolean: a guard listener off loopback must serve TLS (config.md §10 rule 3).
pub const HARDENED: &str = "PLIMSOLL_HARDENED";

/// Log format on stderr: `text`, or JSON for anything else.
pub const LOG_FORMAT: &str = "PLIMSOLL_LOG_FORMAT";

/// Every variable the guard binary reads, for its help text.
pub const VARIABLES: &[(&str, &str)] = &[
    (GUARD_ADDR, "listener host:port (required)"),
    (
        BROKER_GUARD_SOCKET,
        "the broker's guard socket, an absolute path (required)",
    ),
    (
        GUARD_ADDR_FILE,
        "file written with the bound address once listening (optional)",
    ),
    (
        TLS_CERT,
        "PEM certificate chain; with the key, TLS with ALPN h2 and http/1.1",
    ),
    (TLS_KEY, "PEM private key"),
    (
        MAX_CONCURRENT,
        "the daemon's run cap (default 8): 2x bodies decode at once",
    ),
    (
        HARDENED,
        "1 or true: refuse a listener off loopback without TLS",
    ),
    (LOG_FORMAT, "json (default) or text"),
];

/// Where variables come from: the process environment in the binary, a map in tests.
pub trait Environment {
    /// The variable's value, if set and valid UTF-8.
    fn var(&self, name: &str) -> Option<String>;
}

/// The real process environment. The only place the guard reads it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnvironment;

impl Environment for ProcessEnvironment {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Environment for std::collections::HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}
