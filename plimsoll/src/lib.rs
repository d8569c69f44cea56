//! plimsoll's core library.
#![forbid(unsafe_code)]

pub mod record;
pub mod refusal;
pub mod tier;
pub mod validate;
pub mod wire;
