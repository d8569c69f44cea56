//! The table of open runs: opening a run's grant, closing it, and revoking it at its deadline
//! when nobody does. Also opening and closing sessions (`runs/sessions.rs`), since closing a
//! session closes the run lent to it.
//!
//! Opening a run reads top to bottom: the checks (`runs/checks.rs`), the run, its home
//! (where the grant is served: a socket of its own, a guard token of its own, or a session's
//! slot it is lent to), entering the table, serving, and the deadline timer that closes it if
//! plimsolld does not.

mod checks;
mod sessions;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use tokio::net::UnixListener;

use crate::audit::{self, CloseReason};
use crate::control::protocol::{
    AllowedRoute, Catalogue, Delivery, Hello, OpenRun, Reach, RefusalReason, Response, RunGrant,
    VERSION,
};
use crate::deadline::{self, DEADLINE_GRACE};
use crate::grants::Profile;
use crate::guard_tokens::{GuardTokens, Registration};
use crate::guest_sockets::GuestSockets;
use crate::registry::SharedRegistry;
use crate::run::Run;
use crate::run_socket::RunSocket;
use crate::session::{self, Session, Sessions};
use crate::upstream::Upstream;

pub(crate) use checks::is_hex_id;

/// Runs open at once.
pub const MAX_RUNS: usize = 4096;

/// Where a run's grant is served.
enum Home {
    /// Its own socket, removed when the run closes.
    Own(RunSocket),
    /// A session's slot, lent until the run closes, and the call's own guard token when
    /// one was asked for (`OpenRun.call_token`), dead when the run closes.
    Lent(Arc<Session>, Option<Registration>),
    /// Its own guard token, dead when the run closes.
    Guard(Registration),
}

// === impl Home ===

impl Home {
    /// Makes `run`'s home: binds its own socket, mints its guard token, or takes the session
    /// slot it is lent to (with a token of the call's own when `call_token`). Returns where
    /// the guest reaches it, and the listener to serve once the run is in the table (for a
    /// socket of its own).
    fn make(
        run: &Arc<Run>,
        delivery: Delivery,
        lent_to: Option<&Arc<Session>>,
        call_token: bool,
        tokens: &Arc<GuardTokens>,
        sockets: &GuestSockets,
    ) -> Result<(Home, Reach, Option<UnixListener>), Response> {
        if let Some(session) = lent_to {
            if call_token {
                // Serves this run only, and only until it has ended (401 after).
                let (token, registration) = tokens.register_run(run);
                let reach = Reach::GuardToken(token.expose().to_owned());
                return Ok((Home::Lent(session.clone(), Some(registration)), reach, None));
            }
            return Ok((Home::Lent(session.clone(), None), Reach::SessionSlot, None));
        }
        match delivery {
            Delivery::Socket => match RunSocket::bind(sockets) {
                Ok((socket, listener)) => {
                    let reach = Reach::Socket(socket.path().to_owned());
                    Ok((Home::Own(socket), reach, Some(listener)))
                }
                Err(error) => {
                    tracing::error!(%error, "run socket not created");
                    Err(Response::refused(
                        RefusalReason::Capacity,
                        "host api socket could not be created",
                    ))
                }
            },
            Delivery::Guard => {
                let (token, registration) = tokens.register_run(run);
                let reach = Reach::GuardToken(token.expose().to_owned());
                Ok((Home::Guard(registration), reach, None))
            }
        }
    }
}

struct Entry {
    run: Arc<Run>,
    home: Home,
}

/// Every open run and session, plus what opening a new run needs.
pub struct Runs {
    registry: Arc<SharedRegistry>,
    upstream: Upstream,
    sockets: Arc<GuestSockets>,
    open: Mutex<HashMap<String, Entry>>,
    sessions: Sessions,
    tokens: Arc<GuardTokens>,
    guard: bool,
}

// === impl Runs ===

impl Runs {
    /// An empty table whose guest sockets live in `sockets`. `guard`: the broker serves a
    /// guard socket, so runs and sessions may ask for guard delivery.
    pub fn new(
        registry: Arc<SharedRegistry>,
        upstream: Upstream,
        sockets: Arc<GuestSockets>,
        guard: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            registry,
            upstream,
            sockets,
            open: Mutex::new(HashMap::new()),
            sessions: Sessions::default(),
            tokens: Arc::default(),
            guard,
        })
    }

    /// The guard tokens of open runs and sessions (the guard socket serves them).
    pub fn guard_tokens(&self) -> Arc<GuardTokens> {
        self.tokens.clone()
    }

    fn table(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // Inserts and removes are single operations: a poisoned table is still consistent.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Answers `hello`.
    pub fn hello(&self) -> Response {
        let registry = self.registry.current();
        let in_flight = self.table().values().map(|e| e.run.in_flight()).sum();
        Response::Hello(Hello {
            version: VERSION,
            generation: registry.generation(),
            profiles: u32::try_from(registry.len()).unwrap_or(u32::MAX),
            guard: self.guard,
            in_flight,
            catalogue: registry.catalogue().fingerprint.clone(),
        })
    }

    /// Answers `catalogue`.
    pub fn catalogue(&self) -> Response {
        Response::Catalogue(Catalogue::clone(&self.registry.current().catalogue()))
    }

    /// Opens a run's grant.
    pub fn open(self: &Arc<Self>, request: OpenRun) -> Response {
        match self.try_open(&request) {
            Ok(grant) => Response::Opened(grant),
            Err(refusal) => refusal,
        }
    }

    fn try_open(self: &Arc<Self>, request: &OpenRun) -> Result<RunGrant, Response> {
        let registry = self.registry.current();
        // 1. The checks; the credential is minted last.
        let already_open = self.table().contains_key(&request.run);
        let admitted = checks::admit(
            request,
            already_open,
            self.guard,
            &self.sessions,
            &registry,
            SystemTime::now(),
        )?;
        // 2. The run, and where its grant is served.
        let deadline = tokio::time::Instant::now() + admitted.budget;
        let mut run = Run::new(
            request.run.clone(),
            request.principal.clone(),
            admitted.profile.clone(),
            admitted.credential,
            deadline,
            self.upstream.clone(),
        );
        if let Some(session) = &admitted.lent_to {
            run = run
                .with_session_counts(session.counts())
                .with_kept_from_earlier_calls(request.kept_from_earlier_calls);
        }
        let run = Arc::new(run);
        let (home, reach, listener) = Home::make(
            &run,
            request.delivery,
            admitted.lent_to.as_ref(),
            request.call_token,
            &self.tokens,
            &self.sockets,
        )?;
        let grant = grant(reach, &admitted.profile);
        // 3. Into the table, then served.
        self.insert(&request.run, run.clone(), home)?;
        if let Some(listener) = listener {
            tokio::spawn(RunSocket::serve(
                listener,
                run.clone(),
                self.sockets.peers(),
            ));
        }
        // 4. Fail closed: a run plimsolld forgets (or a plimsolld that dies) still ends.
        let runs = Arc::downgrade(self);
        let id = request.run.clone();
        let ended = run.clone();
        deadline::expire_at(
            deadline + DEADLINE_GRACE,
            async move { ended.wait_ended().await },
            async move {
                if let Some(runs) = runs.upgrade() {
                    let _ = runs.close(&id, CloseReason::Deadline).await;
                }
            },
        );
        tracing::info!(
            run = request.run.as_str(),
            caller = request.principal.as_str(),
            grant_profile = admitted.profile.name.as_str(),
            generation = registry.generation(),
            session = admitted.lent_to.as_ref().map(|s| s.id.as_str()),
            delivery = ?request.delivery,
            "grant run opened"
        );
        Ok(grant)
    }

    /// Puts the run in the table; a lent run is lent under the same lock, so a run is in the
    /// table exactly while it may be lent (a racing second lend or a closed session is
    /// refused here).
    fn insert(&self, id: &str, run: Arc<Run>, home: Home) -> Result<(), Response> {
        let mut table = self.table();
        if table.len() >= MAX_RUNS {
            return Err(Response::refused(
                RefusalReason::Capacity,
                "the broker has too many open runs",
            ));
        }
        if table.contains_key(id) {
            return Err(Response::refused(
                RefusalReason::Request,
                "duplicate run id",
            ));
        }
        if let Home::Lent(session, _) = &home {
            session::lend(session, run.clone())?;
        }
        table.insert(id.to_owned(), Entry { run, home });
        Ok(())
    }

    /// Closes a run: the socket goes (or the token dies, or the session's slot is emptied) at
    /// once, then calls in flight are cut.
    pub async fn close(&self, id: &str, reason: CloseReason) -> Response {
        let Some(mut entry) = self.table().remove(id) else {
            return Response::refused(RefusalReason::Request, "unknown run");
        };
        match &mut entry.home {
            Home::Own(socket) => socket.remove(),
            // Before the run ends: later calls on the session's slot are refused at once.
            Home::Lent(session, call_token) => {
                if let Some(token) = call_token {
                    token.revoke();
                }
                session.take_back(&entry.run);
            }
            // Before the run ends: the guard answers 401 from here on.
            Home::Guard(registration) => registration.revoke(),
        }
        let summary = entry.run.end().await;
        audit::run_closed(&entry.run, &summary, reason);
        Response::Closed(summary)
    }

    /// Removes what lies in the socket directory without an open run or session owning it
    /// (a socket whose removal failed, say); returns how many went.
    pub fn sweep_sockets(&self) -> usize {
        let mut open: HashSet<PathBuf> = self
            .table()
            .values()
            .filter_map(|e| match &e.home {
                Home::Own(socket) => Some(socket.path().to_owned()),
                Home::Lent(..) | Home::Guard(_) => None,
            })
            .collect();
        open.extend(self.sessions.paths());
        self.sockets.sweep(&open, SystemTime::now())
    }

    /// Closes every run, then every session (shutdown).
    pub async fn close_all(&self) {
        let ids: Vec<String> = self.table().keys().cloned().collect();
        let closes = ids.iter().map(|id| self.close(id, CloseReason::Shutdown));
        futures::future::join_all(closes).await;
        self.close_all_sessions().await;
    }
}

/// What plimsolld hands the guest: where the grant is reached and what its client library
/// needs.
fn grant(reach: Reach, profile: &Profile) -> RunGrant {
    RunGrant {
        reach,
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
    }
}
