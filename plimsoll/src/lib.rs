//! plimsoll's core library: the protocol's wire types, isolation tiers and
//! floors, the refusal table, request validation, run records, and (with the
//! `client` feature) the Rust client.
//!
//! plimsoll runs untrusted code in a sandbox and paints every answer with how
//! strong that sandbox is. This crate is what the daemon and every Rust caller
//! share, so the two cannot disagree about a digest, a limit or a refusal.
//!
//! # Example
//!
//! Recomputing a run record's digests, as a client does for every answer:
//!
//! ```
//! use plimsoll::record;
//! use plimsoll::tier::{Floor, IsolationTier};
//! use plimsoll::wire::{JavaScriptRun, RunRequest, run_request};
//!
//! let req = RunRequest {
//!     protocol: plimsoll::refusal::PROTOCOL,
//!     minimum_isolation: "process".into(),
//!     payload: Some(run_request::Payload::Javascript(Box::new(JavaScriptRun {
//!         code: "console.log(6*7)".into(),
//!         ..Default::default()
//!     }))),
//!     ..Default::default()
//! };
//! // The daemon checks a request in the order of wire.md §6.1 …
//! plimsoll::validate::check_protocol(req.protocol).unwrap();
//! let floor = plimsoll::validate::check_floor(&req.minimum_isolation).unwrap();
//! assert!(floor.is_met_by(IsolationTier::Process));
//! assert!(!floor.is_met_by(IsolationTier::None));
//! // … and both sides digest it the same way.
//! assert_eq!(record::request_digest(&req).len(), 64);
//! assert!(Floor::parse("none").is_err());
//! ```
//!
//! # Concepts
//!
//! - [`tier`] — [`tier::IsolationTier`] (`none < process < container < kernel < vm`)
//!   and [`tier::Floor`], the weakest tier a caller accepts.
//! - [`refusal`] — every refusal, with its Connect code and `NotDispatched`
//!   reason — the one table both sides use. Only a refusal that provably ran
//!   nothing carries a reason.
//! - [`validate`] — the request limits and rules (wire.md §6), shared by the
//!   daemon and the client.
//! - [`payload`] — one borrowed view of a `Run` or `SessionRun` request: its kind, grant
//!   profile, code and envelope.
//! - [`record`] — request, result and record digests, the software-rule id, the
//!   session fingerprint, and the checks a client makes on every answer.
//! - [`wire`] — the generated protocol messages and service.
//! - `client` (feature `client`): calls a daemon and re-checks every answer.
//! - `attest` (feature `attest`): Ed25519 signatures over records, outside the daemon.
#![forbid(unsafe_code)]

pub mod payload;
pub mod record;
pub mod refusal;
pub mod tier;
pub mod validate;
pub mod wire;

#[cfg(feature = "client")]
pub mod client;

#[cfg(feature = "attest")]
pub mod attest;
