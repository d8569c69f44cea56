//! The harness of plimsoll's end-to-end tests.
//!
//! Every test in `tests/all/` drives the real `plimsolld` binary over loopback, the way
//! an operator and a client would. Nothing here shares code with the daemon: requests
//! are written as raw HTTP/1.1 bytes ([`http1`]), as h2c frames through hyper's client
//! ([`h2c`]), and protobuf answers are read by a small hand-written decoder
//! ([`protobuf`]), so a bug in the daemon's wire code cannot hide behind the same bug
//! in the test.
//!
//! # Finding the binary
//!
//! The harness builds nothing. It runs `<target>/debug/plimsolld`, where `<target>` is
//! `$CARGO_TARGET_DIR` or the workspace's `target/`, and fails loudly when the file is
//! missing. Build first, as `scripts/test` does:
//!
//! ```text
//! cargo build --workspace --all-targets && cargo test --workspace
//! ```
//!
//! A binary older than the daemon's sources is used anyway, with a warning on stderr.
//!
//! # The pieces
//!
//! - [`Daemon`] starts `plimsolld` with an exact environment (nothing is inherited but
//!   `PATH`), waits for its `plimsolld listening` log line, and exposes the bound
//!   addresses, the log, and SIGTERM. It is killed when dropped.
//! - [`finish`] runs a binary that is expected to exit (help, refused configuration).
//! - [`h2_frames`] writes and reads raw HTTP/2 frames, for clients that must
//!   misbehave (the transport's hostile suite).
//! - [`connect`] builds Connect requests and reads Connect errors and their
//!   `NotDispatched` details.
//! - [`ClientsFile`] writes a caller registry for `PLIMSOLL_CLIENTS_FILE`.
//! - [`test_api`] is an HTTPS API (test CA made at runtime) that records what the broker
//!   forwards to it, for grant tests.
//! - [`sim`] is what the suites of a daemon on a vendor's simulator share ([`e2b`],
//!   [`dockercloud`], [`openshell`]).
//! - [`wasm`] starts `plimsolld` with the wasm provider, compiling the guest once first.
#![forbid(unsafe_code)]
// A test harness fails by panicking, with the evidence in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod connect;
pub mod docker;
pub mod dockercloud;
pub mod e2b;
pub mod h2_frames;
pub mod h2c;
pub mod http1;
pub mod openshell;
pub mod protobuf;
pub mod sim;
pub mod test_api;
pub mod wasm;

mod clients_file;
mod daemon;

pub use clients_file::{ClientsFile, fresh_token};
pub use daemon::{Daemon, Finished, binary, finish, stop};

/// How many rounds a benchmark runs: `PLIMSOLL_BENCH_N` when it parses, else `default`.
pub fn bench_n(default: usize) -> usize {
    std::env::var("PLIMSOLL_BENCH_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}
