//! Session slots: one per session, lent to one run at a time, reached the way the session's
//! provider delivers grants.
//!
//! A running sandbox cannot gain a mount (or a new egress rule), so plimsolld asks for one
//! slot when a session opens and keeps it for the session's life: a socket (in the broker's
//! socket directory, checked like a run socket) or a guard token
//! ([`crate::guard_tokens`]). The slot serves nothing unless a session call has lent its
//! run's grant to it (`OpenRun.slot`): the socket answers 503 `host api grant has ended`
//! (counted nowhere) and the guard 401; while a grant is lent, each request is served by the
//! run lent at the moment it arrives, with exactly a run's checks. Closing the run empties
//! the slot before the run ends, so nothing is served between calls. Route caps in a session
//! are counted once for its whole life ([`SessionCounts`]).
//!
//! This module holds the sessions and their table; opening and closing one, which also
//! touches the runs lent to it, is the run table's ([`crate::runs`]).

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use http::request::Parts;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::time::Instant;

use guard::token::GuardToken;

use crate::control::protocol::{Delivery, RefusalReason, Response};
use crate::guard_tokens::{GuardTokens, Holder, Registration};
use crate::guest_sockets::GuestSockets;
use crate::peer_origin::Peer;
use crate::route_caps::SessionCounts;
use crate::run::Run;
use crate::run_socket::{RunSocket, RunSocketError, Served};

/// Sessions open at once.
pub const MAX_SESSIONS: usize = 1024;
/// Refusal message for a second lend.
const ALREADY_LENT: &str = "the session's slot is already lent";
/// Refusal message for a session that is not open.
pub(crate) const UNKNOWN: &str = "unknown session";

/// What a session's socket serves right now.
enum Slot {
    /// Nothing lent: 503.
    Empty,
    /// This run's grant, lent at this instant.
    Lent(Arc<Run>, Instant),
    /// The session has closed; nothing can be lent again.
    Closed,
}

/// Where a session's slot is reached until the session closes.
enum Home {
    /// Its socket (taken out when removed).
    Socket(Option<RunSocket>),
    /// Its guard token.
    Guard(Registration),
}

/// One open session slot.
pub struct Session {
    /// The slot id plimsolld chose.
    pub id: String,
    delivery: Delivery,
    home: Mutex<Home>,
    slot: Mutex<Slot>,
    counts: Arc<SessionCounts>,
    closed: watch::Sender<bool>,
}

/// What a session's token serves before the session exists: nothing.
struct Nothing;

impl Holder for Nothing {
    fn run_now(&self) -> Option<Arc<Run>> {
        None
    }
}

/// A session's token serves whichever run is lent to the session now.
struct SessionHolder(Weak<Session>);

impl Holder for SessionHolder {
    fn run_now(&self) -> Option<Arc<Run>> {
        self.0.upgrade()?.lent()
    }
}

// === impl Session ===

impl Session {
    fn new(id: String, delivery: Delivery, home: Home) -> Session {
        Session {
            id,
            delivery,
            home: Mutex::new(home),
            slot: Mutex::new(Slot::Empty),
            counts: Arc::default(),
            closed: watch::Sender::new(false),
        }
    }

    /// Binds a new session's socket (serve it with [`RunSocket::serve`]); nothing is lent.
    /// Returns the session, its listener and the socket's absolute path.
    pub fn bind(
        id: String,
        sockets: &GuestSockets,
    ) -> Result<(Arc<Session>, UnixListener, PathBuf), RunSocketError> {
        let (socket, listener) = RunSocket::bind(sockets)?;
        let path = socket.path().to_owned();
        let session = Arc::new(Session::new(
            id,
            Delivery::Socket,
            Home::Socket(Some(socket)),
        ));
        Ok((session, listener, path))
    }

    /// A new session reached through the guard: its token is in `tokens` until the session
    /// closes; nothing is lent.
    pub fn with_guard(id: String, tokens: &Arc<GuardTokens>) -> (Arc<Session>, GuardToken) {
        let (token, registration) = tokens.register(Arc::new(Nothing));
        let hash = registration.hash();
        let session = Arc::new(Session::new(id, Delivery::Guard, Home::Guard(registration)));
        tokens.point(&hash, Arc::new(SessionHolder(Arc::downgrade(&session))));
        (session, token)
    }

    fn slot(&self) -> MutexGuard<'_, Slot> {
        // Every update is a single assignment: a poisoned slot is still consistent.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How the slot reaches the guest.
    pub fn delivery(&self) -> Delivery {
        self.delivery
    }

    /// The route-cap counts every lent run shares.
    pub fn counts(&self) -> Arc<SessionCounts> {
        self.counts.clone()
    }

    /// The run whose grant the socket serves now, if any.
    pub fn lent(&self) -> Option<Arc<Run>> {
        match &*self.slot() {
            Slot::Lent(run, _) => Some(run.clone()),
            Slot::Empty | Slot::Closed => None,
        }
    }

    /// When `run` was lent, while it still is.
    fn lent_at(&self, run: &Arc<Run>) -> Option<Instant> {
        match &*self.slot() {
            Slot::Lent(lent, at) if Arc::ptr_eq(lent, run) => Some(*at),
            Slot::Lent(..) | Slot::Empty | Slot::Closed => None,
        }
    }

    /// Lends `run`'s grant to the socket; refused when one is lent or the session closed.
    pub fn lend(&self, run: Arc<Run>) -> Result<(), &'static str> {
        let mut slot = self.slot();
        match &*slot {
            Slot::Empty => {
                *slot = Slot::Lent(run, Instant::now());
                Ok(())
            }
            Slot::Lent(..) => Err(ALREADY_LENT),
            Slot::Closed => Err(UNKNOWN),
        }
    }

    /// Empties the slot if it still holds `run` (a later lend is left alone).
    pub fn take_back(&self, run: &Arc<Run>) {
        let mut slot = self.slot();
        if matches!(&*slot, Slot::Lent(lent, _) if Arc::ptr_eq(lent, run)) {
            *slot = Slot::Empty;
        }
    }

    /// Resolves once the session has closed.
    pub async fn wait_closed(&self) {
        let mut rx = self.closed.subscribe();
        let _ = rx.wait_for(|closed| *closed).await;
    }

    /// Its socket's absolute path while it has one (never for guard delivery).
    fn socket_path(&self) -> Option<PathBuf> {
        match &*self.home.lock().unwrap_or_else(PoisonError::into_inner) {
            Home::Socket(Some(socket)) => Some(socket.path().to_owned()),
            Home::Socket(None) | Home::Guard(_) => None,
        }
    }

    /// Closes the session: nothing more is served or lent, connections are told to end, the
    /// socket and its directory are removed or the token dies. Returns the run still lent, if
    /// any.
    pub(crate) fn shut(&self) -> Option<Arc<Run>> {
        let lent = match std::mem::replace(&mut *self.slot(), Slot::Closed) {
            Slot::Lent(run, _) => Some(run),
            Slot::Empty | Slot::Closed => None,
        };
        self.closed.send_replace(true);
        match &mut *self.home.lock().unwrap_or_else(PoisonError::into_inner) {
            Home::Socket(socket) => {
                if let Some(mut socket) = socket.take() {
                    socket.remove();
                }
            }
            Home::Guard(registration) => registration.revoke(),
        }
        lent
    }
}

/// A session's socket: whichever run is lent when a request arrives, until the session
/// closes.
impl Served for Arc<Session> {
    fn run_for(&self, _request: &Parts) -> Option<Arc<Run>> {
        self.lent()
    }

    /// Only while plimsolld holds processes of earlier calls (issue 12, part 4): with none
    /// kept, the call has the sandbox to itself and its own orphans are served too. A run
    /// no longer lent is left to its own checks.
    fn outside_call(&self, run: &Arc<Run>, peer: &Peer) -> bool {
        run.kept_from_earlier_calls() > 0
            && self
                .lent_at(run)
                .is_some_and(|lent_at| peer.outside_call(lent_at))
    }

    fn closed(&self) -> impl Future<Output = ()> + Send {
        self.wait_closed()
    }
}

/// The table of open sessions.
#[derive(Default)]
pub struct Sessions {
    open: Mutex<HashMap<String, Arc<Session>>>,
}

// === impl Sessions ===

impl Sessions {
    fn table(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        // Inserts and removes are single operations: a poisoned table is still consistent.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The open session `id`.
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.table().get(id).cloned()
    }

    /// Adds `session`; refused when the table is full or its id is open already.
    pub fn insert(&self, session: Arc<Session>) -> Result<(), Response> {
        let mut table = self.table();
        if table.len() >= MAX_SESSIONS {
            return Err(Response::refused(
                RefusalReason::Capacity,
                "the broker has too many open sessions",
            ));
        }
        if table.contains_key(&session.id) {
            return Err(Response::refused(
                RefusalReason::Request,
                "duplicate session id",
            ));
        }
        table.insert(session.id.clone(), session);
        Ok(())
    }

    /// Takes session `id` out of the table.
    pub fn remove(&self, id: &str) -> Option<Arc<Session>> {
        self.table().remove(id)
    }

    /// The ids of every open session.
    pub fn ids(&self) -> Vec<String> {
        self.table().keys().cloned().collect()
    }

    /// The socket of every open session.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.table()
            .values()
            .filter_map(|s| s.socket_path())
            .collect()
    }
}

/// Checks a lend request before the profile checks: `Err` is the refusal to send.
pub(crate) fn check_slot(
    sessions: &Sessions,
    slot: &str,
    session_call: bool,
    delivery: Delivery,
) -> Result<Arc<Session>, Response> {
    if !session_call {
        return Err(Response::refused(
            RefusalReason::Request,
            "a slot is only for a session call (session must be true)",
        ));
    }
    let Some(session) = sessions.get(slot) else {
        return Err(Response::refused(RefusalReason::Request, UNKNOWN));
    };
    if session.delivery() != delivery {
        return Err(Response::refused(
            RefusalReason::Request,
            "the lend names another delivery than the session's slot",
        ));
    }
    if session.lent().is_some() {
        return Err(Response::refused(RefusalReason::Request, ALREADY_LENT));
    }
    Ok(session)
}

/// Lends `run` to `session` at the moment the run enters the table.
pub(crate) fn lend(session: &Session, run: Arc<Run>) -> Result<(), Response> {
    session
        .lend(run)
        .map_err(|message| Response::refused(RefusalReason::Request, message))
}
