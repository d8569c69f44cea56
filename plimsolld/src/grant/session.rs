//! Grants in sessions (grants.md §1.5, §3; providers.md §9.3).
//!
//! A running container cannot gain a mount, so a session gets one broker socket at open, a
//! [`SessionSlot`], mounted for the session's whole life. The broker answers 503 on it except
//! while a call has lent it a grant ([`Grants::lend`]); the grant is closed when the call's
//! code has ended, before the answer, so code a call leaves behind never holds a later
//! call's grant. Only profiles with `allow_in_sessions` may be lent (the broker checks).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use broker::control::client::Client;
use broker::control::protocol::OpenSession;
use plimsoll::refusal::Refusal;

use super::{Grants, OpenGrant, unix_ms};
use crate::auth::Principal;

/// A session's broker socket. Close it once the sandbox is gone; dropping it closes it in
/// the background (and the broker removes it 5 s past the session's end on its own).
pub struct SessionSlot {
    id: String,
    client: Client,
    socket: PathBuf,
    closed: bool,
}

// === impl SessionSlot ===

impl SessionSlot {
    /// The socket on the host, to mount at the guest's host-api path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Removes the socket (a grant still lent is closed with it).
    pub async fn close(mut self) {
        self.closed = true;
        if let Err(e) = self.client.close_session(&self.id).await {
            tracing::warn!(error = %e, "could not close a session's host socket; the broker removes it at the session's end");
        }
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let id = std::mem::take(&mut self.id);
            handle.spawn(async move {
                if let Err(e) = client.close_session(&id).await {
                    tracing::warn!(error = %e, "could not close a session's host socket");
                }
            });
        }
    }
}

// === impl Grants ===

impl Grants {
    /// Opens a session's socket until `deadline`. `None` when grants are off, or when the
    /// broker is down or refuses (logged): that session's granted calls are then refused.
    pub async fn open_session_slot(&self, deadline: SystemTime) -> Option<SessionSlot> {
        let live = self.live.as_ref()?;
        if !live.up.load(Ordering::Relaxed) {
            tracing::warn!("session opened without a host socket: the grant broker is down");
            return None;
        }
        let id = hex::encode(rand::random::<[u8; 16]>());
        let request = OpenSession {
            session: id.clone(),
            deadline_unix_ms: unix_ms(deadline),
        };
        match live.client.open_session(&request).await {
            Ok(Ok(opened)) => Some(SessionSlot {
                id,
                client: live.client.clone(),
                socket: opened.socket,
                closed: false,
            }),
            Ok(Err(refused)) => {
                tracing::warn!(reason = %refused.message, "session opened without a host socket: the broker refused one");
                None
            }
            Err(e) => {
                live.mark_down(&e.to_string());
                None
            }
        }
    }

    /// Lends `profile`'s grant to the session's socket for one call until `deadline`. The
    /// broker refuses a profile without `allow_in_sessions` (`permission`). Nothing has run
    /// on any refusal.
    pub async fn lend(
        &self,
        slot: Option<&SessionSlot>,
        profile: &str,
        principal: &Principal,
        deadline: SystemTime,
    ) -> Result<OpenGrant, Refusal> {
        match slot {
            Some(slot) => {
                self.open_as(profile, principal, deadline, Some(&slot.id))
                    .await
            }
            // Grants off (or an anonymous caller) still get the unknown-profile answer.
            None if self.live.is_none() || principal.id.is_none() => {
                Err(super::unavailable(profile))
            }
            None => Err(Refusal::PermissionDenied(format!(
                "grant_profile {profile:?} cannot be lent: this session was opened while the grant broker was unavailable, so it has no host socket; open a new session; nothing ran"
            ))),
        }
    }
}
