//! plimsolld, the plimsoll sandbox daemon, as a library: the binary in
//! `main.rs` only reads the configuration and calls [`daemon::run`].
//!
//! Where each concept lives:
//! - [`config`] — every environment variable, parsed and validated once;
//! - [`auth`] — caller credentials and the clients file;
//! - [`grant`] — host-API grants: the broker's control client and the guest client library;
//! - [`admission`] — run caps, per-caller caps and rate limits; sheds, never queues;
//! - [`server`] — listeners and the request pipeline, one layer per file;
//! - [`service`] — the Connect handlers, each a list of named steps;
//! - [`provider`] — the `Provider` trait and one module per provider;
//! - [`session`] — the session table: caps, turns, idle, lifetime, ends;
//! - [`record`] — each answer's run record;
//! - [`metrics`], [`logging`] — what operators see.
// `deny`, not `forbid`: the one `unsafe` call (loading the cached compiled wasm guest,
// `provider/wasm/cache.rs`) is allowed on its own small function.
#![deny(unsafe_code)]

pub mod admission;
pub mod auth;
pub mod clients_tool;
pub mod config;
pub mod daemon;
pub mod grant;
pub mod logging;
pub mod metrics;
pub mod provider;
pub mod record;
pub mod server;
pub mod service;
pub mod session;
