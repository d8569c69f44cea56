//! The control channel between plimsolld and the broker: newline-delimited JSON over a Unix
//! stream socket. [`protocol`] holds the messages, [`client`] the caller's side, and (with
//! feature `server`) `server` the broker's side.

pub mod client;
pub mod protocol;
#[cfg(feature = "server")]
pub mod server;
