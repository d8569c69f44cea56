//! The daemon's side of host-API grants (grants.md §1.5, §2.1; wire.md §6.6).
//!
//! plimsolld never holds a credential: the broker process does (see the `broker` crate).
//! A request that names a `grant_profile` meets the grant path twice:
//!
//! 1. At wire.md §6.1 step 5, [`Grants::select`] checks the profile against the broker's
//!    credential-free catalogue (names, `allowed_callers`, `allow_in_sessions`), which this
//!    handle keeps fresh: an unknown profile, a foreign caller and a session-only refusal
//!    are answered here, without a word to the broker.
//! 2. Only once the run is admitted (step 8), [`Grants::open`] asks the broker over its
//!    control socket to open the run's grant; the broker checks again (its registry may
//!    have moved on), mints the credential and makes the profile's routes reachable the way
//!    the provider delivers grants ([`Delivery`], the provider's choice): a per-run Unix
//!    socket (docker, wasm, openshell's relay) or a per-run guard token the `guard` binary
//!    accepts (e2b, dockercloud). So nothing a refused request causes reaches the broker
//!    (issue 12, part 1).
//!
//! The provider hands what the guest needs to it ([`GuestGrant`]), and [`OpenGrant::close`]
//! revokes it once the sandbox is gone (or earlier, [`GuestGrant::end_now`]). An
//! [`OpenGrant`] dropped without a close still closes, in the background, and a close that
//! fails is retried; the broker also revokes every grant 5 s past its deadline on its own,
//! and sweeps its socket directory.
//!
//! Which broker (config.md, [`GrantSource`]): an operator-run one on
//! `PLIMSOLL_BROKER_SOCKET`, a supervised child when only `PLIMSOLL_GRANTS_FILE` is set
//! ([`supervise`]), or none. Only the broker's own health check (`hello` every second, on a
//! connection of its own) and a supervised child's exit mark it down: granted runs are then
//! refused (`permission`) and `/readyz` says not ready until it answers again. One failed
//! open is that run's refusal, nothing more.

mod error;
pub mod host_client;
mod session;
mod supervise;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use broker::control::client::{Client, ControlError};
use broker::control::protocol::{self, Catalogue, OpenRun, Reach, RefusalReason, RunSummary};
use plimsoll::refusal::Refusal;

pub use broker::control::protocol::AllowedRoute as Route;
pub use broker::control::protocol::Delivery;
pub use error::GrantError;
pub use guard::token::GuardToken;
pub use session::SessionSlot;
pub use supervise::GuardChild;

use crate::auth::Principal;
use crate::config::grants::GrantSource;

/// Removes the broker socket directories a killed broker left behind (older than a minute,
/// their socket refusing connections), whichever provider runs; returns how many went. The
/// daemon calls it at startup and from its background loop (providers.md §5.13 step 1).
pub fn reap_stale_socket_dirs() -> usize {
    broker::socket_dirs::reap_stale(
        &std::env::temp_dir(),
        &broker::socket_dirs::BROKER_PREFIXES,
        SystemTime::now(),
    )
}

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
/// How many times a close that failed is tried again, and how far apart.
const CLOSE_RETRIES: u32 = 3;
const CLOSE_RETRY_EVERY: Duration = Duration::from_secs(1);

/// What a granted run's guest is given: where it reaches the grant and what its client
/// library needs. Never the broker's credential.
pub struct GuestGrant {
    /// Where the guest reaches the grant: a socket on the host, or a guard token.
    pub access: GuestAccess,
    /// The JS global's name (`host` by default).
    pub global: String,
    /// The profile's allow list, for the client's advisory check.
    pub allow: Vec<Route>,
    /// The profile's preamble, run after the client library; may be empty.
    pub preamble: String,
    /// The grant's end, shared with the daemon's [`OpenGrant`]; `None` in tests.
    pub(crate) end: Option<Arc<GrantEnd>>,
}

/// Where a guest reaches its grant (grants.md §3).
#[derive(Clone, PartialEq, Eq)]
pub enum GuestAccess {
    /// The grant's `host-api.sock` on the host: the provider mounts it (docker), relays it
    /// (openshell) or calls it from the host (wasm).
    Socket(PathBuf),
    /// A guard token (grants.md §5.4): the guest posts to the guard URL with it in
    /// `X-Plimsoll-Guard`, or the vendor's egress proxy adds it (E2B). A credential for this
    /// grant alone, dead when the run (or session) ends.
    Guard(GuardToken),
}

// === impl GuestAccess ===

impl GuestAccess {
    /// The socket, for a socket-delivered grant.
    pub fn socket(&self) -> Option<&Path> {
        match self {
            GuestAccess::Socket(path) => Some(path),
            GuestAccess::Guard(_) => None,
        }
    }

    /// The guard token, for a guard-delivered grant.
    pub fn guard_token(&self) -> Option<&GuardToken> {
        match self {
            GuestAccess::Guard(token) => Some(token),
            GuestAccess::Socket(_) => None,
        }
    }

    /// What the broker said, as plimsolld keeps it; `None` for a token of the wrong shape or
    /// a reach that names no place of its own.
    fn from_reach(reach: Reach) -> Option<GuestAccess> {
        match reach {
            Reach::Socket(path) => Some(GuestAccess::Socket(path)),
            Reach::GuardToken(text) => GuardToken::from_wire(text).map(GuestAccess::Guard),
            Reach::SessionSlot => None,
        }
    }
}

impl std::fmt::Debug for GuestAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuestAccess::Socket(path) => f.debug_tuple("Socket").field(path).finish(),
            // The token's own Debug never shows it.
            GuestAccess::Guard(token) => f.debug_tuple("Guard").field(token).finish(),
        }
    }
}

// === impl GuestGrant ===

impl GuestGrant {
    /// A grant reached at `access`, with nothing to end (what tests and the startup proofs
    /// hand a provider).
    pub fn new(access: GuestAccess, global: String, allow: Vec<Route>, preamble: String) -> Self {
        GuestGrant {
            access,
            global,
            allow,
            preamble,
            end: None,
        }
    }

    /// The socket, for a socket-delivered grant.
    pub fn socket(&self) -> Option<&Path> {
        self.access.socket()
    }

    /// Ends the grant now, before the daemon would: the socket goes or the guard token dies
    /// (the guard answers 401), and calls in flight are cut. A VM provider calls it once the
    /// guest's code has ended and before the VM is killed, so a process the guest left
    /// behind cannot call during teardown (grants.md §2.1, §10 item 13). Idempotent; the
    /// daemon's own close afterwards only collects the counts.
    pub async fn end_now(&self) {
        if let Some(end) = &self.end {
            end.close().await;
        }
    }
}

impl std::fmt::Debug for GuestGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestGrant")
            .field("access", &self.access)
            .field("global", &self.global)
            .field("allow", &self.allow)
            .field("preamble_bytes", &self.preamble.len())
            .finish()
    }
}

/// A run's grant at the broker, closed exactly once by whichever asks first: the provider
/// ([`GuestGrant::end_now`]) or the daemon ([`OpenGrant::close`]).
pub(crate) struct GrantEnd {
    run: String,
    client: Client,
    opened: Instant,
    summary: tokio::sync::OnceCell<Closed>,
}

/// How a grant's close went.
#[derive(Debug, Clone)]
pub enum Closed {
    /// The broker revoked it and counted its calls.
    Counted(RunSummary),
    /// The broker no longer knew the run: it was gone already (its deadline passed).
    Gone,
    /// The broker could not be asked: the grant may still answer until its deadline (the
    /// close is retried in the background).
    Unconfirmed,
}

impl Closed {
    /// The run's counts, when the broker gave them.
    pub fn summary(self) -> Option<RunSummary> {
        match self {
            Closed::Counted(summary) => Some(summary),
            Closed::Gone | Closed::Unconfirmed => None,
        }
    }
}

// === impl GrantEnd ===

impl GrantEnd {
    /// Closes the run at the broker (once) and says how that went.
    async fn close(&self) -> Closed {
        self.summary
            .get_or_init(|| async {
                match self.client.close(&self.run).await {
                    Ok(summary) => Closed::Counted(summary),
                    Err(ControlError::Refused(_)) => Closed::Gone,
                    Err(e) => {
                        tracing::warn!(
                            run = %self.run,
                            open_ms = self.opened.elapsed().as_millis() as u64,
                            error = %e,
                            "could not close a run's grant; trying again"
                        );
                        close_later(self.client.clone(), self.run.clone());
                        Closed::Unconfirmed
                    }
                }
            })
            .await
            .clone()
    }

    fn closed(&self) -> bool {
        self.summary.initialized()
    }
}

/// The daemon's grant handle: off, or a broker it talks to.
pub struct Grants {
    live: Option<Arc<Live>>,
}

/// A broker in use.
struct Live {
    /// Opens and closes, on a pool of connections.
    client: Client,
    /// The health check's own connection, never queued behind opens.
    health: Client,
    up: AtomicBool,
    /// Counts the times `up` was turned off: a health answer read before the broker went
    /// down (its child's exit can be seen first) must not turn it back on.
    downs: AtomicU32,
    profiles: AtomicU32,
    /// The broker's catalogue as of the last health check that saw it change.
    catalogue: RwLock<Arc<Catalogue>>,
    child: Option<supervise::Supervisor>,
    guard: Option<supervise::Supervisor>,
}

// === impl Grants ===

impl Grants {
    /// Grants off: every named profile is unavailable.
    pub fn off() -> Grants {
        Grants { live: None }
    }

    /// Starts the operator's grant path: nothing, a connection to an external broker, or
    /// a supervised child (told `guest_uid`, the uid docker guests run as, if there are
    /// any). Returns once the broker answered `hello` and sent its catalogue; a broker that
    /// never answers ends startup. With `guard` (`PLIMSOLL_GUARD_ADDR` is set), the broker
    /// must serve a guard socket, and a supervised broker gets a supervised guard beside it,
    /// listening before this returns ([`Grants::guard_addr`]).
    pub async fn start(
        source: &GrantSource,
        guest_uid: Option<u32>,
        guard: Option<&GuardChild>,
    ) -> Result<Grants, GrantError> {
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
                let child = supervise::Supervisor::start_broker(guest_uid, guard.is_some())?;
                (Client::new(child.control_socket()), Some(child))
            }
        };
        let health = Client::with_pool_size(client.socket(), 1);
        let hello = first_hello(&health, child.as_ref()).await?;
        if hello.version != protocol::VERSION {
            return Err(GrantError::Version {
                got: hello.version,
                want: protocol::VERSION,
            });
        }
        if guard.is_some() && !hello.guard {
            return Err(GrantError::NoGuardSocket);
        }
        let catalogue = health.catalogue().await.map_err(GrantError::Catalogue)?;
        // The guard goes where the broker goes: supervised beside a supervised broker; an
        // operator-run broker has an operator-run guard.
        let guard_child = match (guard, &child) {
            (Some(settings), Some(broker)) => Some(broker.start_guard(settings).await?),
            _ => None,
        };
        let live = Arc::new(Live {
            client,
            health,
            up: AtomicBool::new(true),
            downs: AtomicU32::new(0),
            profiles: AtomicU32::new(hello.profiles),
            catalogue: RwLock::new(Arc::new(catalogue)),
            child,
            guard: guard_child,
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

    /// The supervised guard's bound address, when plimsolld runs the guard itself.
    pub fn guard_addr(&self) -> Option<String> {
        self.live
            .as_ref()
            .and_then(|l| l.guard.as_ref())
            .and_then(supervise::Supervisor::guard_addr)
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

    /// Step 5 (wire.md §6.6, grants.md §1.5): whether `principal` may name `profile` (in a
    /// session call when `in_session`), judged locally against the broker's catalogue.
    /// Grants off, an anonymous caller, an unknown profile and a foreign caller get the
    /// same answer; a broker that is down refuses every profile. The broker checks again
    /// when the admitted run opens its grant.
    pub fn select(
        &self,
        profile: &str,
        principal: &Principal,
        in_session: bool,
    ) -> Result<(), Refusal> {
        let (Some(live), Some(principal)) = (&self.live, principal.id.as_deref()) else {
            return Err(unavailable(profile));
        };
        if !live.up.load(Ordering::Relaxed) {
            return Err(broker_down());
        }
        let catalogue = live.catalogue();
        let Some(entry) = catalogue.get(profile).filter(|e| e.admits(principal)) else {
            return Err(unavailable(profile));
        };
        if in_session && !entry.allow_in_sessions {
            return Err(Refusal::PermissionDenied(format!(
                "grant_profile {profile:?} is not allowed in sessions"
            )));
        }
        Ok(())
    }

    /// Opens the grant of one admitted run: `profile` for `principal` until `deadline`,
    /// reached the way the provider delivers grants. Every refusal is a not-dispatched one;
    /// nothing has run.
    pub async fn open(
        &self,
        profile: &str,
        principal: &Principal,
        deadline: SystemTime,
        delivery: Delivery,
    ) -> Result<OpenGrant, Refusal> {
        self.open_as(profile, principal, deadline, delivery, None, 0)
            .await
    }

    async fn open_as(
        &self,
        profile: &str,
        principal: &Principal,
        deadline: SystemTime,
        delivery: Delivery,
        slot: Option<&SessionSlot>,
        kept_from_earlier_calls: u32,
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
        let call_token = slot.is_some_and(SessionSlot::call_tokens);
        let request = OpenRun {
            run: run.clone(),
            principal: principal.to_owned(),
            profile: profile.to_owned(),
            deadline_unix_ms: unix_ms(deadline),
            session: slot.is_some(),
            delivery,
            slot: slot.map(|s| s.id().to_owned()),
            kept_from_earlier_calls,
            call_token,
        };
        let mut in_flight = OpenInFlight {
            client: &live.client,
            run: &run,
            armed: true,
        };
        let opened = live.client.open(&request).await;
        // Answered (opened or refused), or never sent (busy): no run is left to close here.
        // A failed channel leaves it armed: the broker may have opened the run before.
        in_flight.armed = !matches!(opened, Ok(_) | Err(ControlError::Busy { .. }));
        drop(in_flight);
        match opened {
            Ok(Ok(grant)) => {
                let end = Arc::new(GrantEnd {
                    run,
                    client: live.client.clone(),
                    opened: Instant::now(),
                    summary: tokio::sync::OnceCell::new(),
                });
                // A lent grant is reached where the session's slot is, unless the call has
                // a token of its own.
                let access = match slot {
                    Some(slot) if !call_token => Some(slot.access().clone()),
                    _ => GuestAccess::from_reach(grant.reach),
                };
                let Some(access) = access else {
                    tokio::spawn(async move { end.close().await });
                    return Err(Refusal::PermissionDenied(
                        "the grant broker answered with an unusable grant; nothing ran".to_owned(),
                    ));
                };
                let guest = GuestGrant {
                    access,
                    global: grant.global,
                    allow: grant.allow,
                    preamble: grant.preamble,
                    end: Some(end.clone()),
                };
                Ok(OpenGrant::new(end, Arc::new(guest)))
            }
            Ok(Err(refused)) => Err(refusal(refused)),
            // Nothing was sent: no connection came free.
            Err(ControlError::Busy { .. }) => Err(Refusal::AtCapacity(
                "the grant broker is busy: no control connection came free; retry shortly; nothing ran"
                    .to_owned(),
            )),
            // This run's refusal only: the health check alone says whether the broker is
            // down. The run was closed by id above (an unknown run is fine).
            Err(e) => {
                tracing::warn!(error = %e, "a run's grant could not be opened; that run is refused");
                Err(Refusal::PermissionDenied(
                    "the grant broker did not answer this run's open; nothing ran".to_owned(),
                ))
            }
        }
    }

    /// Stops a supervised guard child, then a supervised broker child (at shutdown, after
    /// the drain: the guard stays up while runs drain, and goes before the broker).
    pub async fn shutdown(&self) {
        if let Some(guard) = self.live.as_ref().and_then(|l| l.guard.as_ref()) {
            guard.stop_and_wait().await;
        }
        if let Some(child) = self.live.as_ref().and_then(|l| l.child.as_ref()) {
            child.stop_and_wait().await;
        }
    }
}

impl Drop for Grants {
    /// A handle dropped without [`Grants::shutdown`] (a startup that failed later) still
    /// stops its children; the supervising tasks end them.
    fn drop(&mut self) {
        if let Some(live) = &self.live {
            for child in [&live.guard, &live.child].into_iter().flatten() {
                child.stop();
            }
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

/// A run's open at the broker, until its answer: dropped armed (the channel failed, or the
/// caller went away and the open's future with it), it closes the run in the background,
/// since the broker may have opened it and nothing else would close it before its deadline.
struct OpenInFlight<'a> {
    client: &'a Client,
    run: &'a str,
    armed: bool,
}

impl Drop for OpenInFlight<'_> {
    fn drop(&mut self) {
        if self.armed {
            close_later(self.client.clone(), self.run.to_owned());
        }
    }
}

/// Closes run `run` in the background (see [`retry_close`]).
fn close_later(client: Client, run: String) {
    retry_close(format!("run {run}"), move || {
        let (client, run) = (client.clone(), run.clone());
        async move { client.close(&run).await.map(drop) }
    });
}

/// Runs `close` in the background, and [`CLOSE_RETRIES`] more times while the channel
/// fails; a broker that refuses it (an unknown run or session) has closed it already.
fn retry_close<F, Fut>(what: String, close: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), ControlError>> + Send,
{
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async move {
        for attempt in 0..=CLOSE_RETRIES {
            match close().await {
                Ok(()) | Err(ControlError::Refused(_)) => return,
                Err(e) if attempt == CLOSE_RETRIES => {
                    tracing::warn!(closing = %what, error = %e, "could not close a grant; the broker removes it at its deadline");
                }
                Err(_) => tokio::time::sleep(CLOSE_RETRY_EVERY).await,
            }
        }
    });
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

/// Keeps `up` true exactly while the broker answers `hello`, and the catalogue as fresh as
/// the broker's; ends with the daemon.
async fn watch(live: std::sync::Weak<Live>) {
    loop {
        let Some(l) = live.upgrade() else { return };
        let pause = if l.up.load(Ordering::Relaxed) {
            HEALTH_EVERY
        } else {
            RETRY_EVERY
        };
        drop(l);
        tokio::time::sleep(pause).await;
        // The client and the down count are taken together, after the pause, so the hello
        // below is judged against the state it was sent in.
        let Some(l) = live.upgrade() else { return };
        let (client, downs) = (l.health.clone(), l.downs.load(Ordering::SeqCst));
        drop(l);
        let answer = client.hello().await;
        let Some(l) = live.upgrade() else { return };
        match answer {
            Ok(hello) => {
                l.profiles.store(hello.profiles, Ordering::Relaxed);
                // A reload, or another broker process: fetch the catalogue before saying
                // the broker is back, so selection never judges by a stale one.
                if hello.catalogue != l.catalogue().fingerprint {
                    match client.catalogue().await {
                        Ok(catalogue) => l.set_catalogue(catalogue),
                        Err(e) => {
                            l.mark_down(&format!("the catalogue did not come: {e}"));
                            continue;
                        }
                    }
                }
                // Marked down since this hello left (the child exited, or an open saw the
                // channel break): the answer may predate that, and the next check decides.
                if l.downs.load(Ordering::SeqCst) != downs {
                    continue;
                }
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
        self.downs.fetch_add(1, Ordering::SeqCst);
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                reason = why,
                "grant broker not answering: granted runs are refused until it does"
            );
        }
    }

    fn catalogue(&self) -> Arc<Catalogue> {
        // Replaced whole: a poisoned lock still holds a whole catalogue.
        self.catalogue
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_catalogue(&self, catalogue: Catalogue) {
        *self
            .catalogue
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(catalogue);
    }
}

// === impl OpenGrant ===

/// One run's open grant. Close it with [`OpenGrant::close`] once the sandbox is gone;
/// dropping it closes it in the background.
pub struct OpenGrant {
    end: Arc<GrantEnd>,
    guest: Arc<GuestGrant>,
    closed: bool,
}

impl OpenGrant {
    fn new(end: Arc<GrantEnd>, guest: Arc<GuestGrant>) -> OpenGrant {
        OpenGrant {
            end,
            guest,
            closed: false,
        }
    }

    /// What the provider gives the guest.
    pub fn guest(&self) -> Arc<GuestGrant> {
        self.guest.clone()
    }

    /// Revokes the grant (in-flight calls end, the socket goes or the token dies) and says
    /// how that went; [`Closed::Unconfirmed`] when the broker could not be asked (the close
    /// is then retried in the background, and the broker revokes the grant at its deadline
    /// anyway). After [`GuestGrant::end_now`] it only returns what that end found.
    pub async fn close(mut self) -> Closed {
        self.closed = true;
        self.end.close().await
    }
}

impl Drop for OpenGrant {
    fn drop(&mut self) {
        if self.closed || self.end.closed() {
            return;
        }
        // A refusal after the open, a failed run or a dropped task: close anyway.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let end = self.end.clone();
            handle.spawn(async move {
                end.close().await;
            });
        }
    }
}

#[cfg(test)]
mod tests;
