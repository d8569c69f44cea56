//! The link between the guard and the broker: HTTP/2 over the broker's guard socket
//! ([`crate::env::BROKER_GUARD_SOCKET`]), two requests, each naming a token by its SHA-256 in
//! [`TOKEN_SHA256`].
//!
//! - `GET` [`LOOKUP_PATH`]: is the token live now? `204` yes; `401` with
//!   [`VERDICT`]` = `[`UNKNOWN_TOKEN`] no (an unknown token, a run that has ended, a session
//!   slot with nothing lent).
//! - `POST` [`CALL_PATH`], the envelope as the body: the broker decodes it, finds the run the
//!   token serves now and makes the call with every check of grants.md §2.2; the answer is
//!   the call's status, `Content-Type` and body. A token no longer live is `401` with the
//!   verdict header, a bad envelope `400` with [`VERDICT`]` = `[`BAD_ENVELOPE`].
//!
//! The verdict header is how the guard tells the broker's own refusals from an upstream API
//! that happens to answer 401 or 400; nothing else on the link carries it.

/// Path of the token lookup.
pub const LOOKUP_PATH: &str = "/v1/lookup";
/// Path of a call.
pub const CALL_PATH: &str = "/v1/call";
/// Request header: the token's SHA-256, 64 lowercase hex characters.
pub const TOKEN_SHA256: &str = "plimsoll-guard-sha256";
/// Response header on the broker's own refusals.
pub const VERDICT: &str = "plimsoll-guard-verdict";
/// [`VERDICT`]'s value when the token is not live.
pub const UNKNOWN_TOKEN: &str = "unknown-token";
/// [`VERDICT`]'s value when the envelope did not decode.
pub const BAD_ENVELOPE: &str = "bad-envelope";
