//! plimsoll's core library.
#![forbid(unsafe_code)]

pub mod wire;
