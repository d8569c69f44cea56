//! Every environment variable the broker reads, and the one plimsolld uses to find it.
//!
//! The broker binary reads only these names; `broker --help` lists them. Profiles in the
//! grants file name further variables (`token.env`, `token.secret_env`): those are read
//! from the broker's own environment at each load, never from plimsolld's.

/// Path of the grants file (`spec/grants.md` §1). Required by the broker binary.
pub const GRANTS_FILE: &str = "PLIMSOLL_GRANTS_FILE";

/// Path of the broker's control socket: the broker listens there, plimsolld connects there.
pub const BROKER_SOCKET: &str = "PLIMSOLL_BROKER_SOCKET";

/// Path of the broker's guard socket (optional): with it the broker serves the `guard`
/// binary there and runs and sessions may ask for guard delivery. Named by the guard crate,
/// which reads it too.
pub use guard::env::BROKER_GUARD_SOCKET;

/// Optional PEM file of extra roots trusted for upstream TLS, besides the built-in webpki
/// roots: for an operator's private CA, and for tests.
pub const BROKER_CA_FILE: &str = "PLIMSOLL_BROKER_CA_FILE";

/// The uid docker guests run as (plimsolld's `SANDBOX_GUEST_UID`): besides root and the
/// broker's own uid, the only peer a guest socket answers. Default 61000; a plimsolld that
/// supervises the broker sets it from its own configuration.
pub const BROKER_GUEST_UID: &str = "PLIMSOLL_BROKER_GUEST_UID";

/// Log format on stderr: `json` (the default) or `text`; the name the guard and plimsolld
/// read too.
pub const LOG_FORMAT: &str = guard::env::LOG_FORMAT;

/// Where variables come from: the process environment in the binary, a map in tests.
pub trait Environment {
    /// The variable's value, if set and valid UTF-8.
    fn var(&self, name: &str) -> Option<String>;
}

/// The real process environment. The only place the broker reads it.
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
