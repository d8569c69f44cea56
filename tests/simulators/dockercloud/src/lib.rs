//! A stand-in for Docker Cloud Sandboxes, so plimsoll's dockercloud provider can be tested
//! here, where Docker's service cannot be reached.
//!
//! It serves, each on its own loopback port as the real service has its own host:
//! Docker Hub's token exchange ([`auth`]); the Connect management API `docker.sbx.v1`
//! ([`management`]); the undocumented per-sandbox network-policy PUT ([`policy`]); the
//! REST API ([`rest`]); and every sandbox's endpoint, with the Connect process and file
//! services and the REST endpoint routes ([`endpoint`], [`rest_endpoint`]). Each sandbox
//! is a local locked-down container (runsc where docker has it, else runc) with no
//! network; the only way out is the guard host on 443, once a policy PUT allows it
//! ([`egress`]). docs/dockercloud-simulator.md says what is simulated, how faithfully,
//! and against what it was checked.
//!
//! # Using it from a test
//!
//! [`launch::Simulator::start`] runs the built binary and parses its ready line
//! ([`server::Ready`]: every URL, the account's credentials, the images and their
//! digests). [`launch::Simulator::set_faults`] switches [`Faults`] on and off.
#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod connect;
pub mod docker;
pub mod egress;
pub mod endpoint;
pub mod error;
pub mod faults;
pub mod http;
pub mod ids;
pub mod launch;
pub mod lifecycle;
pub mod management;
pub mod options;
pub mod policy;
pub mod protojson;
pub mod rest;
pub mod rest_endpoint;
pub mod server;
pub mod state;
pub mod views;

pub use faults::{Faults, StuckOperation};
pub use options::Options;
