//! plimsoll's broker: the only process that holds grant credentials.
//!
//! A run that names a `grant_profile` gets, from the broker, a per-run Unix socket on which
//! the guest may call exactly the profile's routes of the operator's API. The broker mints
//! the run's credential, attaches it to each forwarded call, enforces the budgets of
//! `spec/grants.md` §2 and revokes everything when the run closes or its deadline passes.
//! plimsolld talks to it over the control socket ([`control`]).
//!
//! Without the default feature `server` this crate is only [`env`](mod@env) and the control
//! protocol and client: what plimsolld links, with no credential or forwarding code.
//!
//! With `server`, the modules read in the order a run meets them: [`grants`] (the file),
//! [`registry`] and [`reload`] (the current profiles, rotated without a restart),
//! [`runs`] (open and close), [`credential`] (minting), [`run_socket`] (the guest's
//! socket), [`session`] (one socket for a docker session, lent to a run per call), [`run`] (the checks of each call), [`breaker`], [`upstream`], [`trace`] and
//! [`audit`].
#![forbid(unsafe_code)]

pub mod control;
pub mod env;

#[cfg(feature = "server")]
pub mod audit;
#[cfg(feature = "server")]
pub mod breaker;
#[cfg(feature = "server")]
pub mod credential;
#[cfg(feature = "server")]
pub mod daemon;
#[cfg(feature = "server")]
pub mod grants;
#[cfg(feature = "server")]
pub mod registry;
#[cfg(feature = "server")]
pub mod reload;
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
