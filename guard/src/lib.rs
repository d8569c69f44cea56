//! plimsoll's guard: the HTTPS endpoint a hosted microVM (E2B, Docker Cloud) reaches instead
//! of a Unix socket (grants.md §5).
//!
//! A granted run on such a provider has a per-run token ([`token`]) instead of a socket. The
//! guest (or, on E2B, the vendor's egress proxy on its behalf) posts an envelope
//! ([`envelope`]) to the guard URL with the token in `X-Plimsoll-Guard`. The guard holds no
//! credential and no grant: it checks the request in the order of grants.md §5.5, and hands
//! each call to the broker over the broker's guard socket ([`link`]), where the run's route
//! checks, budgets and audit apply exactly as on a run's socket. Tokens live with the broker,
//! so a guard that restarts loses no run.
//!
//! Without the default feature `server` this crate is only what the broker and plimsolld
//! share with the guard: [`env`](mod@env), [`token`], [`envelope`], [`link`] and the paths.
//! With it, the binary's modules, in the order a request meets them: `listener` (accept,
//! TLS, the connection bounds), `handler` (§5.5's steps), with `admission` (per-token
//! counts, turns, decode slots), `broker` (the link's client) and `answer` (every answer the
//! guard writes itself); `config` and `daemon` start and stop it.
#![forbid(unsafe_code)]

pub mod env;
pub mod envelope;
pub mod link;
pub mod token;

#[cfg(feature = "server")]
pub mod admission;
#[cfg(feature = "server")]
pub mod answer;
#[cfg(feature = "server")]
pub mod broker;
#[cfg(feature = "server")]
pub mod config;
#[cfg(feature = "server")]
pub mod daemon;
#[cfg(feature = "server")]
pub mod handler;
#[cfg(feature = "server")]
pub mod listener;
#[cfg(feature = "server")]
pub mod live;
#[cfg(feature = "start")]
pub mod start;
#[cfg(feature = "tls")]
pub mod tls;

/// The guard path for E2B runs (grants.md §5.2).
pub const E2B_PATH: &str = "/v1/e2b/guard";
/// The guard path for Docker Cloud runs (grants.md §5.2).
pub const DOCKERCLOUD_PATH: &str = "/v1/dockercloud/guard";
/// Every path the guard serves; anything else is 404.
pub const PATHS: [&str; 2] = [E2B_PATH, DOCKERCLOUD_PATH];
