//! plimsoll's core library.
#![forbid(unsafe_code)]

pub mod record;
pub mod refusal;
pub mod tier;
pub mod validate;
pub mod wire;

#[cfg(feature = "client")]
pub mod client;

#[cfg(feature = "attest")]
pub mod attest;
