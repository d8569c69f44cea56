//! plimsoll's relay: a small static binary that runs inside an OpenShell sandbox and gives a
//! guest the host API without giving the sandbox a network (grants.md §8.7).
//!
//! The sandbox keeps its deny-all policy. The guest's client library talks HTTP over the Unix
//! socket named by `HOST_API_SOCKET`, exactly as on docker; the relay listens there (the
//! **down** side). plimsolld cannot be dialled from inside, so it dials in: through the
//! gateway's `ForwardTcp` it opens streams to a loopback TCP port the relay listens on (the
//! **up** side), each of which it joins to the run's broker socket on the host. The relay
//! pairs one guest connection with one dialled-in connection and copies bytes both ways. It
//! never reads what it copies.
//!
//! It tells plimsolld what it needs on its stdout, one word a line ([`protocol`]): `ready`
//! once both sides listen, then `need` each time a guest connection finds no dialled-in
//! connection waiting. plimsolld treats every byte it prints as untrusted (the guest runs as
//! the same user and may kill it, or print in its place), so nothing here is a boundary: the
//! broker checks every call.
//!
//! ```text
//! plimsoll-relay <port> <socket>
//! ```
//!
//! `port` is the up side's loopback TCP port (`127.0.0.1`), `socket` the down side's path (it
//! must not exist yet). The relay stops when its stdin ends (plimsolld closes it at the run's
//! end) or when plimsolld cancels its exec, which kills it.
//!
//! The same binary is also a session's cell relay, `plimsoll-relay cell <kernel dir> <work
//! dir>` (see [`cell`]), and a docker session's agent, `plimsoll-relay agent <guest uid>` (see
//! [`agent`]; the only module allowed `unsafe`, for capget/capset).
#![deny(unsafe_code)]

pub mod protocol;

#[cfg(feature = "binary")]
pub mod agent;
#[cfg(feature = "binary")]
pub mod args;
#[cfg(feature = "binary")]
pub mod cell;
#[cfg(feature = "binary")]
pub mod pairing;
#[cfg(feature = "binary")]
pub mod serve;
