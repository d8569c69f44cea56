//! plimsolld, the plimsoll sandbox daemon, as a library: the binary in
//! `main.rs` only reads the configuration and calls [`daemon::run`].
//!
//! Where each concept lives:
//! - [`config`] — every environment variable, parsed and validated once;
//! - [`auth`] — caller credentials and the clients file;
//! - [`server`] — listeners and the request pipeline, one layer per file;
//! - [`service`] — the Connect handlers, each a list of named steps;
//! - [`provider`] — the `Provider` trait and one module per provider;
//! - [`record`] — each answer's run record;
//! - [`metrics`], [`logging`] — what operators see.
#![forbid(unsafe_code)]

pub mod auth;
pub mod clients_tool;
pub mod config;
pub mod daemon;
pub mod logging;
pub mod metrics;
pub mod provider;
pub mod record;
pub mod server;
pub mod service;
