//! The daemon's side of host-API grants (grants.md §1.5, §2.1; wire.md §6.6).
//!
//! plimsolld never holds a credential: the broker process does (see the `broker` crate).
//! For a run that names a `grant_profile`, [`Grants::open`] asks the broker over its
//! control socket to open the run's grant; the broker mints the credential and serves a
//! per-run Unix socket that forwards only the profile's routes. The provider hands that
//! socket to the guest ([`GuestGrant`]), and [`OpenGrant::close`] revokes it once the
//! sandbox is gone. An [`OpenGrant`] dropped without a close still closes, in the
//! background, so no code path leaks an open grant; the broker also revokes every grant
//! 5 s past its deadline on its own.
//!
//! Which broker (config.md, [`GrantSource`]): an operator-run one on
//! `PLIMSOLL_BROKER_SOCKET`, a supervised child when only `PLIMSOLL_GRANTS_FILE` is set
//! ([`supervise`]), or none. A broker that stops answering `hello` is noticed within a
//! second: granted runs are refused (`permission`) and `/readyz` says not ready until it
//! answers again.

pub mod host_client;
mod session;
mod supervise;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use broker::control::client::Client;
use broker::control::protocol::{self, OpenRun, RefusalReason, RunSummary};
use plimsoll::refusal::Refusal;

pub use broker::control::protocol::AllowedRoute as Route;
pub use session::SessionSlot;

use crate::auth::Principal;
use crate::config::grants::GrantSource;

/// The guest's variable naming its socket (grants.md §3); set only in a granted run.
pub const HOST_API_SOCKET: &str = "HOST_API_SOCKET";
/// The longest `grant_profile` accepted (wire.md §6.4, `MaxProfileNameBytes`).
pub const MAX_PROFILE_NAME_BYTES: usize = 128;
/// How often a live broker is asked `hello`.
const HEALTH_EVERY: Duration = Duration::from_secs(1);
/// How often a broker that is down is asked again.
const RETRY_EVERY: Duration = Duration::from_millis(250);
/// How long startup waits for the first `hello`.
const STARTUP_WAIT: Duration = Duration::from_secs(20);

/// Why the grant path could not start. Each ends startup (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// The supervised broker's private directory could not be made.
    #[error("cannot create the broker's private directory {path}: {source}")]
    PrivateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// plimsolld's own path, next to which the broker binary lives, is unknown.
    #[error("cannot find the broker binary next to plimsolld: {0}")]
    BrokerBinary(std::io::Error),
    /// The broker child could not be started.
    #[error("cannot start the broker child {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The broker child exited before it answered (a bad grants file, typically; its own
    /// log line says why).
    #[error("the broker child exited before answering ({status}); see its log line above")]
    ChildExited {
        /// How it exited.
        status: String,
    },
    /// No `hello` within the startup wait.
    #[error("the grant broker did not answer hello within {STARTUP_WAIT:?}: {last}")]
    NoHello {
        /// The last failure.
        last: String,
    },
    /// The broker speaks another control protocol.
    #[error("the grant broker speaks control protocol {got}; this plimsolld speaks {want}")]
    Version {
        /// What it said.
        got: u32,
        /// What this build speaks.
        want: u32,
    },
}

/// What a granted run's guest is given: the socket to call and what its client library
/// needs. Never a credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestGrant {
    /// The run's `host-api.sock` on the host.
    pub socket: PathBuf,
    /// The JS global's name (`host` by default).
    pub global: String,
    /// The profile's allow list, for the client's advisory check.
    pub allow: Vec<Route>,
    /// The profile's preamble, run after the client library; may be empty.
    pub preamble: String,
}

/// The daemon's grant handle: off, or a broker it talks to.
pub struct Grants {
    live: Option<Arc<Live>>,
}

/// A broker in use.
struct Live {
    client: Client,
    up: AtomicBool,
    profiles: AtomicU32,
    child: Option<supervise::Supervisor>,
}

// === impl Grants ===

impl Grants {
    /// Grants off: every named profile is unavailable.
    pub fn off() -> Grants {
        Grants { live: None }
    }

    /// Starts the operator's grant path: nothing, a connection to an external broker, or
    /// a supervised child. Returns once the broker answered `hello`; a broker that never
    /// answers ends startup.
    pub async fn start(source: &GrantSource) -> Result<Grants, GrantError> {
        let (client, child) = match source {
            GrantSource::Off => return Ok(Grants::off()),
            GrantSource::External(socket) => (Client::new(socket.clone()), None),
            GrantSource::Supervised(file) => {
                tracing::warn!(
                    grants_file = %file.display(),
                    "grants: plimsolld supervises a broker child that inherits its environment, \
                     so the grant secrets pass through plimsolld; production runs the broker \
                     on its own and sets PLIMSOLL_BROKER_SOCKET"
                );
                let child = supervise::Supervisor::start()?;
                (Client::new(child.control_socket()), Some(child))
            }
        };
        let hello = first_hello(&client, child.as_ref()).await?;
        if hello.version != protocol::VERSION {
            return Err(GrantError::Version {
                got: hello.version,
                want: protocol::VERSION,
            });
        }
        let live = Arc::new(Live {
            client,
            up: AtomicBool::new(true),
            profiles: AtomicU32::new(hello.profiles),
            child,
        });
        if let Some(child) = &live.child {
            child.on_exit(Arc::downgrade(&live));
        }
        tokio::spawn(watch(Arc::downgrade(&live)));
        tracing::info!(
            broker = %live.client.socket().display(),
            supervised = live.child.is_some(),
            profiles = hello.profiles,
            generation = hello.generation,
            "grant broker answered"
        );
        Ok(Grants { live: Some(live) })
    }

    /// Whether a broker is configured.
    pub fn enabled(&self) -> bool {
        self.live.is_some()
    }

    /// Profiles in the broker's registry at the last `hello` (0 when grants are off).
    pub fn profiles(&self) -> u32 {
        self.live
            .as_ref()
            .map_or(0, |l| l.profiles.load(Ordering::Relaxed))
    }

    /// `/readyz`'s share: not ready while a configured broker does not answer.
    pub fn ready(&self) -> Result<(), String> {
        match &self.live {
            Some(l) if !l.up.load(Ordering::Relaxed) => Err(format!(
                "the grant broker on {} is not answering",
                l.client.socket().display()
            )),
            _ => Ok(()),
        }
    }

    /// Opens the grant of one run: `profile` for `principal` until `deadline`. Every
    /// refusal is a not-dispatched one; nothing has run.
    pub async fn open(
        &self,
        profile: &str,
        principal: &Principal,
        deadline: SystemTime,
    ) -> Result<OpenGrant, Refusal> {
        self.open_as(profile, principal, deadline, None).await
    }

    async fn open_as(
        &self,
        profile: &str,
        principal: &Principal,
        deadline: SystemTime,
        slot: Option<&str>,
    ) -> Result<OpenGrant, Refusal> {
        // Grants off and an anonymous caller get the very answer an unknown profile gets
        // (wire.md §6.6), so nothing about the registry can be learnt from it.
        let (Some(live), Some(principal)) = (&self.live, principal.id.as_deref()) else {
            return Err(unavailable(profile));
        };
        if !live.up.load(Ordering::Relaxed) {
            return Err(broker_down());
        }
        let run = hex::encode(rand::random::<[u8; 16]>());
        let request = OpenRun {
            run: run.clone(),
            principal: principal.to_owned(),
            profile: profile.to_owned(),
            deadline_unix_ms: unix_ms(deadline),
            session: slot.is_some(),
            slot: slot.map(str::to_owned),
        };
        match live.client.open(&request).await {
            Ok(Ok(grant)) => Ok(OpenGrant {
                run,
                client: live.client.clone(),
                guest: Arc::new(GuestGrant {
                    socket: grant.socket,
                    global: grant.global,
                    allow: grant.allow,
                    preamble: grant.preamble,
                }),
                opened: Instant::now(),
                closed: false,
            }),
            Ok(Err(refused)) => Err(refusal(refused)),
            Err(e) => {
                live.mark_down(&e.to_string());
                Err(broker_down())
            }
        }
    }

    /// Stops a supervised broker child (at shutdown, after the drain).
    pub async fn shutdown(&self) {
        if let Some(child) = self.live.as_ref().and_then(|l| l.child.as_ref()) {
            child.stop_and_wait().await;
        }
    }
}

impl Drop for Grants {
    /// A handle dropped without [`Grants::shutdown`] (a startup that failed later) still
    /// stops its child; the supervising task ends it.
    fn drop(&mut self) {
        if let Some(child) = self.live.as_ref().and_then(|l| l.child.as_ref()) {
            child.stop();
        }
    }
}

/// The one place a broker refusal becomes a plimsoll refusal (its Connect code and
/// `NotDispatched` reason then come from `plimsoll::refusal`'s table).
fn refusal(refused: protocol::Refusal) -> Refusal {
    match refused.reason {
        RefusalReason::Permission => Refusal::PermissionDenied(refused.message),
        RefusalReason::Capacity => Refusal::AtCapacity(refused.message),
        RefusalReason::Request => Refusal::InvalidRequest(refused.message),
    }
}

/// `time` in Unix milliseconds (0 before the epoch).
fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The answer for an unknown profile, a foreign caller and an anonymous one alike.
pub fn unavailable(profile: &str) -> Refusal {
    Refusal::PermissionDenied(format!(
        "grant_profile {profile:?} is not available to this caller"
    ))
}

fn broker_down() -> Refusal {
    Refusal::PermissionDenied(
        "grants are unavailable right now: the grant broker is not answering; nothing ran"
            .to_owned(),
    )
}

/// Asks `hello` until it answers, the child dies, or [`STARTUP_WAIT`] passes.
async fn first_hello(
    client: &Client,
    child: Option<&supervise::Supervisor>,
) -> Result<protocol::Hello, GrantError> {
    let started = Instant::now();
    loop {
        let last = match client.hello().await {
            Ok(hello) => return Ok(hello),
            Err(e) => e,
        };
        if let Some(status) = child.and_then(supervise::Supervisor::exited) {
            return Err(GrantError::ChildExited { status });
        }
        if started.elapsed() >= STARTUP_WAIT {
            return Err(GrantError::NoHello {
                last: last.to_string(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Keeps `up` true exactly while the broker answers `hello`; ends with the daemon.
async fn watch(live: std::sync::Weak<Live>) {
    loop {
        let Some(l) = live.upgrade() else { return };
        let pause = if l.up.load(Ordering::Relaxed) {
            HEALTH_EVERY
        } else {
            RETRY_EVERY
        };
        let client = l.client.clone();
        drop(l);
        tokio::time::sleep(pause).await;
        let answer = client.hello().await;
        let Some(l) = live.upgrade() else { return };
        match answer {
            Ok(hello) => {
                l.profiles.store(hello.profiles, Ordering::Relaxed);
                if !l.up.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        profiles = hello.profiles,
                        generation = hello.generation,
                        "grant broker answers again; granted runs resume"
                    );
                }
            }
            Err(e) => l.mark_down(&e.to_string()),
        }
    }
}

// === impl Live ===

impl Live {
    /// Refuses granted runs until the broker answers `hello` again.
    fn mark_down(&self, why: &str) {
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                reason = why,
                "grant broker not answering: granted runs are refused until it does"
            );
        }
    }
}

// === impl OpenGrant ===

/// One run's open grant. Close it with [`OpenGrant::close`] once the sandbox is gone;
/// dropping it closes it in the background.
pub struct OpenGrant {
    run: String,
    client: Client,
    guest: Arc<GuestGrant>,
    opened: Instant,
    closed: bool,
}

impl OpenGrant {
    /// What the provider gives the guest.
    pub fn guest(&self) -> Arc<GuestGrant> {
        self.guest.clone()
    }

    /// Revokes the grant (in-flight calls end, the socket goes) and returns its counts,
    /// or `None` when the broker could not say (it then revokes at the deadline itself).
    pub async fn close(mut self) -> Option<RunSummary> {
        self.closed = true;
        match self.client.close(&self.run).await {
            Ok(summary) => Some(summary),
            Err(e) => {
                tracing::warn!(
                    run = %self.run,
                    open_ms = self.opened.elapsed().as_millis() as u64,
                    error = %e,
                    "could not close a run's grant; the broker revokes it at its deadline"
                );
                None
            }
        }
    }
}

impl Drop for OpenGrant {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        // A refusal after the open, a failed run or a dropped task: close anyway.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let run = std::mem::take(&mut self.run);
            handle.spawn(async move {
                if let Err(e) = client.close(&run).await {
                    tracing::warn!(run = %run, error = %e, "could not close a run's grant");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_refusals_keep_their_reason() {
        let of = |reason| {
            refusal(protocol::Refusal {
                reason,
                message: "m".into(),
            })
            .code_and_reason()
            .1
            .as_str()
        };
        assert_eq!(of(RefusalReason::Permission), "permission");
        assert_eq!(of(RefusalReason::Capacity), "capacity");
        assert_eq!(of(RefusalReason::Request), "request");
    }

    #[tokio::test]
    async fn without_a_broker_a_profile_is_unavailable_with_the_same_text() {
        let grants = Grants::off();
        let caller = Principal {
            id: Some("alice".into()),
            scopes: vec!["*".into()],
        };
        let err = grants
            .open("inv", &caller, SystemTime::now())
            .await
            .err()
            .unwrap();
        assert_eq!(
            err.to_string(),
            unavailable("inv").to_string(),
            "the unknown-profile answer"
        );
        assert!(grants.ready().is_ok());
        assert_eq!(grants.profiles(), 0);
    }
}
