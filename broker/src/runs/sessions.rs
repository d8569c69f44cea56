//! Opening and closing a session's socket (see [`crate::session`]): the run table's job,
//! because closing a session also closes the run still lent to it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{Runs, checks, is_hex_id};
use crate::audit::CloseReason;
use crate::control::protocol::{
    Delivery, OpenSession, Reach, RefusalReason, Response, SessionSlot,
};
use crate::deadline::{self, DEADLINE_GRACE, time_left};
use crate::run_socket::RunSocket;
use crate::session::{Session, UNKNOWN};

/// Longest a session timer is set for: a deadline further out is held to this, so the
/// timer arithmetic cannot overflow (the session is still closed by plimsolld long before).
const MAX_SESSION_LIFE: Duration = Duration::from_secs(366 * 24 * 3600);

// === impl Runs ===

impl Runs {
    /// Opens a session's slot: a socket, or a guard token.
    pub fn open_session(self: &Arc<Self>, request: OpenSession) -> Response {
        if !is_hex_id(&request.session) {
            return Response::refused(
                RefusalReason::Request,
                "session id must be 32 lowercase hex characters",
            );
        }
        if self.sessions.get(&request.session).is_some() {
            return Response::refused(RefusalReason::Request, "duplicate session id");
        }
        if let Err(refusal) = checks::check_delivery(request.delivery, self.guard) {
            return refusal;
        }
        let Some(life) = time_left(request.deadline_unix_ms, SystemTime::now()) else {
            return Response::refused(
                RefusalReason::Capacity,
                "the session's deadline has already passed",
            );
        };
        let life = life.min(MAX_SESSION_LIFE);
        let (session, reach, listener) = match request.delivery {
            Delivery::Socket => match Session::bind(request.session.clone(), &self.sockets) {
                Ok((session, listener, path)) => (session, Reach::Socket(path), Some(listener)),
                Err(error) => {
                    tracing::error!(%error, "session socket not created");
                    return Response::refused(
                        RefusalReason::Capacity,
                        "host api socket could not be created",
                    );
                }
            },
            Delivery::Guard => {
                let (session, token) = Session::with_guard(request.session.clone(), &self.tokens);
                (session, Reach::GuardToken(token.expose().to_owned()), None)
            }
        };
        if let Err(refusal) = self.sessions.insert(session.clone()) {
            // Not in the table, so nothing else holds it: its socket or token goes with it.
            session.shut();
            return refusal;
        }
        if let Some(listener) = listener {
            tokio::spawn(RunSocket::serve(
                listener,
                session.clone(),
                self.sockets.peers(),
            ));
        }
        // Fail closed: a session plimsolld forgets (or a plimsolld that dies) still ends.
        let runs = Arc::downgrade(self);
        let watched = session.clone();
        let id = request.session.clone();
        deadline::expire_at(
            tokio::time::Instant::now() + life + DEADLINE_GRACE,
            async move { watched.wait_closed().await },
            async move {
                if let Some(runs) = runs.upgrade() {
                    let _ = runs.close_session(&id, CloseReason::Deadline).await;
                }
            },
        );
        tracing::info!(
            session = request.session.as_str(),
            delivery = ?request.delivery,
            "grant session opened"
        );
        Response::SessionOpened(SessionSlot { reach })
    }

    /// Closes a session: the slot is closed first (no call is served after this), then a run
    /// still lent is closed like `close` would, with `reason` in its audit line.
    pub async fn close_session(&self, id: &str, reason: CloseReason) -> Response {
        let Some(session) = self.sessions.remove(id) else {
            return Response::refused(RefusalReason::Request, UNKNOWN);
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
        let ids = self.sessions.ids();
        let closes = ids
            .iter()
            .map(|id| self.close_session(id, CloseReason::Shutdown));
        futures::future::join_all(closes).await;
    }
}
