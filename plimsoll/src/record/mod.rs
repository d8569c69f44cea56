//! Run records: the integrity evidence that accompanies every answer (`spec/records.md`).
//!
//! A record states what ran (digests of the request as received and the result as sent),
//! where (provider, tier, environment, policy, software, instance), when (a wall-clock start
//! and a monotonic duration) and, for a session call, its place in the session's hash chain.
//! Its own digest, `record_sha256`, covers all of that. The daemon holds no signing key:
//! records are digests and a chain, and signatures are added outside the daemon.
//!
//! # Example
//!
//! The daemon seals a record from the digests and a [`Stamp`]; the client recomputes both
//! digests and checks the record against the response:
//!
//! ```
//! use std::time::Duration;
//! use plimsoll::record::{self, Stamp};
//! use plimsoll::wire::{JavaScriptResult, JavaScriptRun, RunRequest, RunResponse};
//!
//! let request = RunRequest {
//!     protocol: 4,
//!     minimum_isolation: "container".into(),
//!     payload: Some(JavaScriptRun { code: "console.log(6*7)".into(), ..Default::default() }.into()),
//!     ..Default::default()
//! };
//!
//! // Daemon side: hash the request as received and the answer as it will be sent.
//! let mut response = RunResponse {
//!     sandbox: "docker".into(),
//!     isolation: "container".into(),
//!     result: Some(JavaScriptResult { stdout: b"42\n".to_vec(), ..Default::default() }.into()),
//!     ..Default::default()
//! };
//! record::canonicalize_response(&mut response);
//! let stamp = Stamp {
//!     provider: response.sandbox.clone(),
//!     isolation: response.isolation.clone(),
//!     started_unix_ms: 1_790_000_000_000,
//!     elapsed: Duration::from_millis(12),
//!     ..Default::default()
//! };
//! let sealed = record::seal(record::request_digest(&request), record::result_digest(&response), stamp);
//! response.record = sealed.into();
//!
//! // Client side: everything the record states that the caller can recompute.
//! let checked = record::check_single(&record::request_digest(&request), None, &response)?;
//! assert_eq!(checked.version, record::RECORD_VERSION);
//! assert_eq!(checked.ended_unix_ms, 1_790_000_000_012);
//! # Ok::<(), record::RecordError>(())
//! ```
//!
//! # Tour
//!
//! - [`request_digest`], [`session_request_digest`], [`result_digest`], [`record_digest`] and
//!   [`session_fingerprint`]: the digests of `records.md` §4 and §7, each lowercase hex.
//! - [`software_rule_id`] and [`rule_allows`]: the rule id a record states and whether a rule
//!   admits an identity.
//! - [`repair_utf8`], [`canonical_nan`] and [`canonicalize_response`]: settle an answer before
//!   hashing it, so clients recompute the same digest from what they decode.
//! - [`seal`] and [`seal_unanswered`]: build a version-[`RECORD_VERSION`] record from a
//!   [`Stamp`].
//! - [`check`], [`check_single`], [`check_unanswered`] and [`check_chain`]: what a client
//!   verifies, failing with a [`RecordError`] that names the field that differs.
//!
//! # Versions
//!
//! Every version's digest can be computed (1: no software fields; 2: + software identity and
//! rule id; 3: + `unanswered`; 4: + `instance`), but the daemon emits, and the checks accept,
//! only [`RECORD_VERSION`], for answered and unanswered calls alike. This follows the
//! published client `plimsoll-client` 0.23.0 (protocol 4), which supersedes the version 2 / 3
//! split that `records.md` §3 describes.

mod digest;
mod repair;
mod rule;
mod seal;
mod verify;

#[cfg(test)]
mod tests;

pub use digest::{
    record_digest, request_digest, result_digest, session_fingerprint, session_request_digest,
};
pub use repair::{CANONICAL_NAN_BITS, canonical_nan, canonicalize_response, repair_utf8};
pub use rule::{rule_allows, software_rule_id};
pub use seal::{Stamp, seal, seal_unanswered};
pub use verify::{RecordError, check, check_chain, check_single, check_unanswered, valid_instance};

/// The record version the daemon emits on every answer and the checks require: 4.
///
/// Version 4 covers, in order: `request_sha256`, `result_sha256`, `unanswered`, `provider`,
/// `isolation`, `environment`, `policy`, `software_identity`, `software_rule_id`, `instance`,
/// `started_unix_ms`, `ended_unix_ms`, `session`, `sequence`, `previous_sha256`, under the
/// domain `plimsoll.run-record.v4`.
pub const RECORD_VERSION: u32 = 4;

/// The Connect codes an unanswered call's record may state: every code except `ok`.
pub const UNANSWERED_CODES: [&str; 16] = [
    "canceled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
];
