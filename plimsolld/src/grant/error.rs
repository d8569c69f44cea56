//! Why the grant path could not start: each ends startup (exit 1) with a line that says
//! which part failed.

use std::path::PathBuf;

use broker::control::client::ControlError;

use super::STARTUP_WAIT;

/// Why the grant path could not start. Each ends startup (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// The supervised broker's private directory could not be made.
    #[error("cannot create the broker's private directory {path}: {source}")]
    PrivateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// plimsolld's own path, next to which the broker binary lives, is unknown.
    #[error("cannot find the broker binary next to plimsolld: {0}")]
    BrokerBinary(std::io::Error),
    /// The broker child could not be started.
    #[error("cannot start the broker child {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The broker child exited before it answered (a bad grants file, typically; its own
    /// log line says why).
    #[error("the broker child exited before answering ({status}); see its log line above")]
    ChildExited {
        /// How it exited.
        status: String,
    },
    /// No `hello` within the startup wait.
    #[error("the grant broker did not answer hello within {STARTUP_WAIT:?}: {last}")]
    NoHello {
        /// The last failure.
        last: String,
    },
    /// The broker speaks another control protocol.
    #[error("the grant broker speaks control protocol {got}; this plimsolld speaks {want}")]
    Version {
        /// What it said.
        got: u32,
        /// What this build speaks.
        want: u32,
    },
    /// A guard is configured but the broker serves no guard socket.
    #[error(
        "PLIMSOLL_GUARD_ADDR is set but the grant broker serves no guard socket: start it with \
         PLIMSOLL_BROKER_GUARD_SOCKET (and run the guard binary on that socket)"
    )]
    NoGuardSocket,
    /// The supervised guard child did not start listening.
    #[error("the guard child did not start: {0}")]
    Guard(String),
    /// The broker answered `hello` but not `catalogue`.
    #[error("the grant broker did not send its catalogue: {0}")]
    Catalogue(ControlError),
}
