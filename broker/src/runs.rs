//! The table of open runs: opening a run's grant (checks in the order of the control
//! protocol's semantics), closing it, and revoking it at its deadline when nobody does.
//!
//! A run either has a socket of its own or is lent to a session's socket (`OpenRun.slot`);
//! the session table and its open and close live in [`crate::session`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::audit::{self, CloseReason};
use crate::control::protocol::{
    AllowedRoute, Hello, OpenRun, Refusal, RefusalReason, Response, RunGrant, VERSION,
};
use crate::credential;
use crate::registry::SharedRegistry;
use crate::run::Run;
use crate::run_socket::{DIR_PREFIX, RunSocket};
use crate::session::{self, Session, Sessions};
use crate::upstream::Upstream;

/// A run is revoked this long after its deadline even if never closed.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(5);
/// Runs open at once.
pub const MAX_RUNS: usize = 4096;

/// Where a run's grant is served.
enum Home {
    /// Its own socket, removed when the run closes.
    Own(RunSocket),
    /// A session's socket, lent until the run closes.
    Lent(Arc<Session>),
}

struct Entry {
    run: Arc<Run>,
    home: Home,
}

/// Every open run, plus what opening a new one needs.
pub struct Runs {
    registry: Arc<SharedRegistry>,
    upstream: Upstream,
    open: Mutex<HashMap<String, Entry>>,
    sessions: Sessions,
}

pub(crate) fn refused(reason: RefusalReason, message: impl Into<String>) -> Response {
    Response::Refused(Refusal {
        reason,
        message: message.into(),
    })
}

/// Time left until `deadline_unix_ms` as seen at `now`; `None` once it has passed.
pub(crate) fn time_left(deadline_unix_ms: u64, now: SystemTime) -> Option<Duration> {
    let now_ms = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    deadline_unix_ms
        .checked_sub(now_ms)
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}

/// Run ids and session slot ids are 32 lowercase hex characters.
pub(crate) fn is_hex_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

// === impl Runs ===

impl Runs {
    /// An empty table.
    pub fn new(registry: Arc<SharedRegistry>, upstream: Upstream) -> Arc<Self> {
        Arc::new(Self {
            registry,
            upstream,
            open: Mutex::new(HashMap::new()),
            sessions: Sessions::default(),
        })
    }

    /// The open sessions.
    pub(crate) fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    fn table(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // Inserts and removes are single operations: a poisoned table is still consistent.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Answers `hello`.
    pub fn hello(&self) -> Response {
        let registry = self.registry.current();
        Response::Hello(Hello {
            version: VERSION,
            generation: registry.generation(),
            profiles: u32::try_from(registry.len()).unwrap_or(u32::MAX),
        })
    }

    /// Opens a run's grant.
    pub fn open(self: &Arc<Self>, request: OpenRun) -> Response {
        if !is_hex_id(&request.run) {
            return refused(
                RefusalReason::Request,
                "run id must be 32 lowercase hex characters",
            );
        }
        if self.table().contains_key(&request.run) {
            return refused(RefusalReason::Request, "duplicate run id");
        }
        let lent_to = match &request.slot {
            None => None,
            Some(slot) => match session::check_slot(&self.sessions, slot, request.session) {
                Ok(session) => Some(session),
                Err(refusal) => return refusal,
            },
        };
        let registry = self.registry.current();
        let unavailable = format!(
            "grant_profile \"{}\" is not available to this caller",
            request.profile
        );
        // Unknown profile, foreign caller and anonymous caller: one answer, so profile
        // names cannot be enumerated.
        let Some(profile) = registry.get(&request.profile).cloned() else {
            return refused(RefusalReason::Permission, unavailable);
        };
        if !profile.admits(&request.principal) {
            return refused(RefusalReason::Permission, unavailable);
        }
        if request.session && !profile.allow_in_sessions {
            return refused(
                RefusalReason::Permission,
                format!(
                    "grant_profile \"{}\" is not allowed in sessions",
                    request.profile
                ),
            );
        }
        let now = SystemTime::now();
        let Some(budget) = time_left(request.deadline_unix_ms, now) else {
            return refused(
                RefusalReason::Capacity,
                "the run's deadline has already passed",
            );
        };
        let credential = match credential::mint(
            &profile.token,
            &request.principal,
            &profile.scopes,
            budget,
            now,
        ) {
            Ok(credential) => credential,
            Err(error) => {
                return refused(
                    RefusalReason::Permission,
                    format!(
                        "grant_profile \"{}\": the credential could not be issued: {error}",
                        request.profile
                    ),
                );
            }
        };
        // A lent run serves on the session's socket; only a run of its own binds one.
        let (home, listener) = match &lent_to {
            Some(session) => (Home::Lent(session.clone()), None),
            None => match RunSocket::bind(DIR_PREFIX) {
                Ok((socket, listener)) => (Home::Own(socket), Some(listener)),
                Err(error) => {
                    tracing::error!(%error, "run socket not created");
                    return refused(
                        RefusalReason::Capacity,
                        "host api socket could not be created",
                    );
                }
            },
        };
        let socket_path = match &home {
            Home::Own(socket) => socket.path().to_owned(),
            Home::Lent(session) => session.path().to_owned(),
        };
        let deadline = tokio::time::Instant::now() + budget;
        let mut run = Run::new(
            request.run.clone(),
            request.principal.clone(),
            profile.clone(),
            credential,
            deadline,
            self.upstream.clone(),
        );
        if let Some(session) = &lent_to {
            run = run.with_session_counts(session.counts());
        }
        let run = Arc::new(run);
        let grant = RunGrant {
            socket: socket_path,
            global: profile.global.clone(),
            allow: profile
                .allow
                .iter()
                .map(|r| AllowedRoute {
                    m: r.method().to_owned(),
                    p: r.path().to_owned(),
                })
                .collect(),
            preamble: profile.preamble.clone(),
        };
        {
            let mut table = self.table();
            if table.len() >= MAX_RUNS {
                return refused(RefusalReason::Capacity, "the broker has too many open runs");
            }
            if table.contains_key(&request.run) {
                return refused(RefusalReason::Request, "duplicate run id");
            }
            // Lent under the table lock, so a run is in the table exactly while it may be
            // lent (a racing second lend or a closed session is refused here).
            if let Some(session) = &lent_to
                && let Err(refusal) = session::lend(session, run.clone())
            {
                return refusal;
            }
            table.insert(
                request.run.clone(),
                Entry {
                    run: run.clone(),
                    home,
                },
            );
        }
        if let Some(listener) = listener {
            tokio::spawn(RunSocket::serve(listener, run.clone()));
        }
        // Fail closed: a run plimsolld forgets (or a plimsolld that dies) still ends.
        let runs = Arc::downgrade(self);
        let id = request.run.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep_until(deadline + DEADLINE_GRACE) => {
                    if let Some(runs) = runs.upgrade() {
                        let _ = runs.close(&id, CloseReason::Deadline).await;
                    }
                }
                () = run.wait_ended() => {}
            }
        });
        tracing::info!(
            run = request.run.as_str(),
            caller = request.principal.as_str(),
            grant_profile = profile.name.as_str(),
            generation = registry.generation(),
            session = lent_to.as_ref().map(|s| s.id.as_str()),
            "grant run opened"
        );
        Response::Opened(grant)
    }

    /// Closes a run: the socket goes (or the session's slot is emptied) at once, then calls
    /// in flight are cut.
    pub async fn close(&self, id: &str, reason: CloseReason) -> Response {
        let Some(mut entry) = self.table().remove(id) else {
            return refused(RefusalReason::Request, "unknown run");
        };
        match &mut entry.home {
            Home::Own(socket) => socket.remove(),
            // Before the run ends: later calls on the session socket get 503 at once.
            Home::Lent(session) => session.take_back(&entry.run),
        }
        let summary = entry.run.end().await;
        audit::run_closed(&entry.run, &summary, reason);
        Response::Closed(summary)
    }

    /// Closes every run, then every session (shutdown).
    pub async fn close_all(&self) {
        let ids: Vec<String> = self.table().keys().cloned().collect();
        let closes = ids.iter().map(|id| self.close(id, CloseReason::Shutdown));
        futures::future::join_all(closes).await;
        self.close_all_sessions().await;
    }
}
