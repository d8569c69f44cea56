//! plimsoll's broker: the only process that holds grant credentials.
//!
//! A run that names a `grant_profile` gets, from the broker, a per-run Unix socket (or, on a
//! hosted microVM, a per-run guard token the `guard` binary accepts) through which the guest
//! may call exactly the profile's routes of the operator's API. The broker mints
//! the run's credential, attaches it to each forwarded call, enforces the budgets of
//! `spec/grants.md` §2 and revokes everything when the run closes or its deadline passes.
//! plimsolld talks to it over the control socket ([`control`]).
//!
//! Without the default feature `server` this crate is only [`env`](mod@env), the control
//! protocol and client, and [`socket_dirs`]: what plimsolld links, with no credential or
//! forwarding code.
//!
//! With `server`, the modules read in the order a run meets them, each using only those
//! below it: [`grants`] (the file), [`registry`] and [`reload`] (the current profiles, rotated
//! without a restart); [`runs`] (the table: a run's open checks, where its grant is served,
//! its close, and sessions' open and close), with [`deadline`] (the timer that closes what
//! plimsolld forgets) and [`credential`] (minting); [`session`] (one slot for a session, a
//! socket or a guard token, lent to a run per call), [`run_socket`] (the guest's socket,
//! serving whatever a [`run_socket::Served`] names, in the directory and to the peers of
//! [`guest_sockets`], each judged by [`peer_origin`]), [`guard_tokens`] (the guard tokens of open runs and sessions) and
//! [`guard_socket`] (where the guard hands on each call); [`run`] (the checks of each call),
//! with [`route_caps`], [`breaker`], [`upstream`] and [`trace`]; then [`audit`].
#![forbid(unsafe_code)]

pub mod control;
pub mod env;
pub mod socket_dirs;

#[cfg(feature = "server")]
pub mod audit;
#[cfg(feature = "server")]
pub mod breaker;
#[cfg(feature = "server")]
pub mod credential;
#[cfg(feature = "server")]
pub mod daemon;
#[cfg(feature = "server")]
pub mod deadline;
#[cfg(feature = "server")]
pub mod grants;
#[cfg(feature = "server")]
pub mod guard_socket;
#[cfg(feature = "server")]
pub mod guard_tokens;
#[cfg(feature = "server")]
pub mod guest_sockets;
#[cfg(feature = "server")]
pub mod peer_origin;
#[cfg(feature = "server")]
pub mod registry;
#[cfg(feature = "server")]
pub mod reload;
#[cfg(feature = "server")]
pub mod route_caps;
#[cfg(feature = "server")]
pub mod run;
#[cfg(feature = "server")]
pub mod run_socket;
#[cfg(feature = "server")]
pub mod runs;
#[cfg(feature = "server")]
pub mod session;
#[cfg(feature = "server")]
pub mod trace;
#[cfg(feature = "server")]
pub mod upstream;
