//! plimsolld end to end: one test binary, one module per feature.
//!
//! Every test starts its own `plimsolld` on ephemeral loopback ports (see
//! `plimsoll_tests::Daemon`) and talks to it the way a client would, so tests run in
//! parallel without sharing limiter state. The binary must be built first:
//! `cargo build --workspace --all-targets` (scripts/test does it).
//!
//! The contract is `shared/spec/wire.md` and `config.md`, with one project decision on
//! top: the daemon serves protocol 4, the number the published Python client 0.23.0
//! states.
// A test fails by panicking, with the evidence in the message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod admission;
mod auth;
mod binding;
mod config;
mod limits;
mod metrics;
mod probes;
mod protocol;
mod tls;
mod transport;
mod validation;
