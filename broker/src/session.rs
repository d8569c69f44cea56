//! Session sockets: one `host-api.sock` per docker session, lent to one run at a time.
//!
//! A running container cannot gain a mount, so plimsolld asks for one socket when a session
//! opens (prefix [`SESSION_DIR_PREFIX`], same modes as a run socket) and mounts it for the
//! session's life. The socket answers 503 `host api grant has ended` (counted nowhere)
//! unless a session call has lent its run's grant to it (`OpenRun.slot`); then each request
//! is served by the run lent at the moment it arrives, with exactly a run socket's checks.
//! Closing the run empties the slot before the run ends, so the socket is 503 between calls.
//!
//! Route caps in a session (`spec/grants.md` §2.2 step 5) are counted once for the session's
//! whole life, in [`SessionCounts`], keyed by canonical origin, method and lower-cased path,
//! so two profiles capping the same route of the same API share one count.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::audit::CloseReason;
use crate::control::protocol::{OpenSession, RefusalReason, Response, SessionSocket};
use crate::grants::{Origin, Route};
use crate::run::Run;
use crate::run_socket::RunSocket;
use crate::runs::{DEADLINE_GRACE, Runs, is_hex_id, refused, time_left};

/// Prefix of a session socket's directory (plimsolld's orphan sweep knows it).
pub const SESSION_DIR_PREFIX: &str = crate::control::protocol::SESSION_DIR_PREFIX;
/// Sessions open at once.
pub const MAX_SESSIONS: usize = 1024;
/// Longest a session timer is set for: a deadline further out is held to this, so the
/// timer arithmetic cannot overflow (the session is still closed by plimsolld long before).
const MAX_SESSION_LIFE: Duration = Duration::from_secs(366 * 24 * 3600);
/// Refusal message for a second lend.
const ALREADY_LENT: &str = "the session's socket is already lent";
/// Refusal message for a session that is not open.
const UNKNOWN: &str = "unknown session";

/// Route-cap counts shared by every run lent to one session.
#[derive(Debug, Default)]
pub struct SessionCounts {
    counts: Mutex<HashMap<String, u32>>,
}

// === impl SessionCounts ===

impl SessionCounts {
    /// Charges one call against every `(key, cap)` it matched, all or nothing: refused (and
    /// nothing charged) when any key is already at its cap. A key listed twice (two entries
    /// of one profile differing only in case) is charged once and checked against both caps.
    pub fn charge<'a>(&self, hits: impl IntoIterator<Item = (&'a str, u32)>) -> bool {
        let hits: Vec<(&str, u32)> = hits.into_iter().collect();
        // One increment per entry: the lock is never held across a panic that matters.
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if hits
            .iter()
            .any(|(key, cap)| counts.get(*key).copied().unwrap_or(0) >= *cap)
        {
            return false;
        }
        let mut charged: Vec<&str> = Vec::with_capacity(hits.len());
        for (key, _) in hits {
            if !charged.contains(&key) {
                charged.push(key);
                *counts.entry(key.to_owned()).or_default() += 1;
            }
        }
        true
    }
}

/// A capped route's key in [`SessionCounts`]: canonical origin (scheme and host lower-cased,
/// trailing dot dropped, IPs canonical, default port dropped), method and lower-cased path.
pub fn cap_key(origin: &Origin, route: &Route) -> String {
    let scheme = origin.scheme.to_ascii_lowercase();
    let lowered = origin.host.to_ascii_lowercase();
    let host = lowered.strip_suffix('.').unwrap_or(&lowered);
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let host = match bare.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => match ip.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => format!("[{ip}]"),
        },
        Ok(IpAddr::V4(ip)) => ip.to_string(),
        Err(_) => host.to_owned(),
    };
    let default = match scheme.as_str() {
        "https" => Some(443),
        "http" => Some(80),
        _ => None,
    };
    let port = if default == Some(origin.port) {
        String::new()
    } else {
        format!(":{}", origin.port)
    };
    format!(
        "{scheme}://{host}{port} {} {}",
        route.method().to_ascii_uppercase(),
        route.path().to_ascii_lowercase()
    )
}

/// What a session's socket serves right now.
enum Slot {
    /// Nothing lent: 503.
    Empty,
    /// This run's grant.
    Lent(Arc<Run>),
    /// The session has closed; nothing can be lent again.
    Closed,
}

/// One open session socket.
pub struct Session {
    /// The slot id plimsolld chose.
    pub id: String,
    path: PathBuf,
    socket: Mutex<Option<RunSocket>>,
    slot: Mutex<Slot>,
    counts: Arc<SessionCounts>,
    closed: watch::Sender<bool>,
}

// === impl Session ===

impl Session {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        // Every update is a single assignment: a poisoned slot is still consistent.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The socket's absolute path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The route-cap counts every lent run shares.
    pub fn counts(&self) -> Arc<SessionCounts> {
        self.counts.clone()
    }

    /// The run whose grant the socket serves now, if any.
    pub fn lent(&self) -> Option<Arc<Run>> {
        match &*self.slot() {
            Slot::Lent(run) => Some(run.clone()),
            Slot::Empty | Slot::Closed => None,
        }
    }

    /// Lends `run`'s grant to the socket; refused when one is lent or the session closed.
    pub fn lend(&self, run: Arc<Run>) -> Result<(), &'static str> {
        let mut slot = self.slot();
        match &*slot {
            Slot::Empty => {
                *slot = Slot::Lent(run);
                Ok(())
            }
            Slot::Lent(_) => Err(ALREADY_LENT),
            Slot::Closed => Err(UNKNOWN),
        }
    }

    /// Empties the slot if it still holds `run` (a later lend is left alone).
    pub fn take_back(&self, run: &Arc<Run>) {
        let mut slot = self.slot();
        if matches!(&*slot, Slot::Lent(lent) if Arc::ptr_eq(lent, run)) {
            *slot = Slot::Empty;
        }
    }

    /// Resolves once the session has closed.
    pub async fn wait_closed(&self) {
        let mut rx = self.closed.subscribe();
        let _ = rx.wait_for(|closed| *closed).await;
    }

    /// Closes the session: nothing more is served or lent, connections are told to end and
    /// the socket and its directory are removed. Returns the run still lent, if any.
    fn shut(&self) -> Option<Arc<Run>> {
        let lent = match std::mem::replace(&mut *self.slot(), Slot::Closed) {
            Slot::Lent(run) => Some(run),
            Slot::Empty | Slot::Closed => None,
        };
        self.closed.send_replace(true);
        let socket = self
            .socket
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut socket) = socket {
            socket.remove();
        }
        lent
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
}

/// Checks a lend request before the profile checks: `Err` is the refusal to send.
pub(crate) fn check_slot(
    sessions: &Sessions,
    slot: &str,
    session_call: bool,
) -> Result<Arc<Session>, Response> {
    if !session_call {
        return Err(refused(
            RefusalReason::Request,
            "a slot is only for a session call (session must be true)",
        ));
    }
    let Some(session) = sessions.get(slot) else {
        return Err(refused(RefusalReason::Request, UNKNOWN));
    };
    if session.lent().is_some() {
        return Err(refused(RefusalReason::Request, ALREADY_LENT));
    }
    Ok(session)
}

/// Lends `run` to `session` at the moment the run enters the table.
pub(crate) fn lend(session: &Session, run: Arc<Run>) -> Result<(), Response> {
    session
        .lend(run)
        .map_err(|message| refused(RefusalReason::Request, message))
}

// Opening and closing sessions live here rather than in runs.rs: they touch the run table
// only through `Runs::close`.
impl Runs {
    /// Opens a session's socket.
    pub fn open_session(self: &Arc<Self>, request: OpenSession) -> Response {
        if !is_hex_id(&request.session) {
            return refused(
                RefusalReason::Request,
                "session id must be 32 lowercase hex characters",
            );
        }
        if self.sessions().get(&request.session).is_some() {
            return refused(RefusalReason::Request, "duplicate session id");
        }
        let Some(life) = time_left(request.deadline_unix_ms, SystemTime::now()) else {
            return refused(
                RefusalReason::Capacity,
                "the session's deadline has already passed",
            );
        };
        let life = life.min(MAX_SESSION_LIFE);
        let (socket, listener) = match RunSocket::bind(SESSION_DIR_PREFIX) {
            Ok(bound) => bound,
            Err(error) => {
                tracing::error!(%error, "session socket not created");
                return refused(
                    RefusalReason::Capacity,
                    "host api socket could not be created",
                );
            }
        };
        let session = Arc::new(Session {
            id: request.session.clone(),
            path: socket.path().to_owned(),
            socket: Mutex::new(Some(socket)),
            slot: Mutex::new(Slot::Empty),
            counts: Arc::default(),
            closed: watch::Sender::new(false),
        });
        {
            let mut table = self.sessions().table();
            if table.len() >= MAX_SESSIONS {
                return refused(
                    RefusalReason::Capacity,
                    "the broker has too many open sessions",
                );
            }
            if table.contains_key(&request.session) {
                return refused(RefusalReason::Request, "duplicate session id");
            }
            table.insert(request.session.clone(), session.clone());
        }
        tokio::spawn(RunSocket::serve_session(listener, session.clone()));
        // Fail closed: a session plimsolld forgets (or a plimsolld that dies) still ends.
        let runs = Arc::downgrade(self);
        let deadline = tokio::time::Instant::now() + life + DEADLINE_GRACE;
        let watched = session.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    if let Some(runs) = runs.upgrade() {
                        let _ = runs.close_session(&watched.id, CloseReason::Deadline).await;
                    }
                }
                () = watched.wait_closed() => {}
            }
        });
        tracing::info!(session = request.session.as_str(), "grant session opened");
        Response::SessionOpened(SessionSocket {
            socket: session.path().to_owned(),
        })
    }

    /// Closes a session: the slot is closed first (no call is served after this), then a run
    /// still lent is closed like `close` would, with `reason` in its audit line.
    pub async fn close_session(&self, id: &str, reason: CloseReason) -> Response {
        let Some(session) = self.sessions().table().remove(id) else {
            return refused(RefusalReason::Request, UNKNOWN);
        };
        if let Some(run) = session.shut() {
            // The run may be closing concurrently; then that close owns its audit line.
            let _ = self.close(&run.id, reason).await;
        }
        tracing::info!(session = id, end = reason.as_str(), "grant session closed");
        Response::SessionClosed
    }

    /// Closes every session (shutdown).
    pub async fn close_all_sessions(&self) {
        let ids: Vec<String> = self.sessions().table().keys().cloned().collect();
        let closes = ids
            .iter()
            .map(|id| self.close_session(id, CloseReason::Shutdown));
        futures::future::join_all(closes).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(scheme: &str, host: &str, port: u16) -> Origin {
        Origin {
            scheme: scheme.into(),
            host: host.into(),
            port,
        }
    }

    fn route(entry: &str) -> Route {
        Route::parse(entry).unwrap()
    }

    #[test]
    fn cap_keys_are_canonical() {
        let key = cap_key(
            &origin("https", "API.Example.COM.", 443),
            &route("get /Items/*"),
        );
        assert_eq!(key, "https://api.example.com GET /items/*");
        assert_eq!(
            cap_key(
                &origin("https", "api.example.com", 443),
                &route("GET /items/*")
            ),
            key
        );
        assert_eq!(
            cap_key(
                &origin("https", "api.example.com", 8443),
                &route("GET /items/*")
            ),
            "https://api.example.com:8443 GET /items/*"
        );
        assert_eq!(
            cap_key(&origin("http", "[0:0:0:0:0:0:0:1]", 80), &route("POST /a")),
            "http://[::1] POST /a"
        );
        assert_eq!(
            cap_key(&origin("http", "127.0.0.1", 8080), &route("POST /a")),
            "http://127.0.0.1:8080 POST /a"
        );
        assert_ne!(
            cap_key(
                &origin("https", "api.example.com", 443),
                &route("POST /items/*")
            ),
            key
        );
    }

    #[test]
    fn charges_are_all_or_nothing_and_shared() {
        let counts = SessionCounts::default();
        assert!(counts.charge([("a", 2), ("b", 1)]));
        // `b` is full: `a` is not charged either.
        assert!(!counts.charge([("a", 2), ("b", 1)]));
        assert!(counts.charge([("a", 2)]));
        assert!(!counts.charge([("a", 5), ("a", 2)]));
        // A key named twice is charged once.
        assert!(counts.charge([("c", 5), ("c", 5)]));
        assert!(counts.charge([("c", 2)]));
        assert!(!counts.charge([("c", 2)]));
    }

    #[test]
    fn session_ids_are_32_lowercase_hex() {
        assert!(is_hex_id(&"0a".repeat(16)));
        assert!(!is_hex_id(&"0A".repeat(16)));
        assert!(!is_hex_id(&"0a".repeat(15)));
        assert!(!is_hex_id(&"zz".repeat(16)));
    }
}
