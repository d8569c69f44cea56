//! Grants in sessions (grants.md §1.5, §3, §5.4; providers.md §9.3).
//!
//! A running sandbox cannot gain a mount (nor, on a hosted VM, a new egress rule), so a
//! session gets one slot at open, a [`SessionSlot`], for its whole life, reached the way the
//! provider delivers grants: a broker socket mounted into the sandbox, or a guard token. The
//! slot serves nothing (503 on the socket, 401 at the guard) except while a call has lent
//! it a grant ([`Grants::lend`]); the grant is closed when the call's code has ended, before
//! the answer, so code a call leaves behind never holds a later call's grant. Only profiles
//! with `allow_in_sessions` may be lent (the broker checks).

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use broker::control::client::Client;
use broker::control::protocol::OpenSession;
use plimsoll::refusal::Refusal;

use super::{Delivery, Grants, GuestAccess, OpenGrant, retry_close, unix_ms};
use crate::auth::Principal;

/// A session's slot at the broker. Close it once the sandbox is gone; dropping it closes it
/// in the background (and the broker removes it 5 s past the session's end on its own).
pub struct SessionSlot {
    id: String,
    client: Client,
    access: GuestAccess,
    delivery: Delivery,
    /// Each lent call gets a guard token of its own instead of the slot's (see
    /// [`Grants::open_session_slot`]).
    call_tokens: bool,
    closed: bool,
}

// === impl SessionSlot ===

impl SessionSlot {
    /// Where the session's guest reaches the grants its calls lend: the socket to mount at
    /// the guest's host-api path, or the session's guard token.
    pub fn access(&self) -> &GuestAccess {
        &self.access
    }

    /// Whether each lent call gets a guard token of its own.
    pub(super) fn call_tokens(&self) -> bool {
        self.call_tokens
    }

    /// The slot id the broker knows it by (never the session id a caller sees).
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// Removes the socket or kills the token (a grant still lent is closed with it); a close
    /// that fails is retried in the background.
    pub async fn close(mut self) {
        self.closed = true;
        if let Err(e) = self.client.close_session(&self.id).await {
            tracing::warn!(error = %e, "could not close a session's grant slot; trying again");
            close_later(self.client.clone(), std::mem::take(&mut self.id));
        }
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        close_later(self.client.clone(), std::mem::take(&mut self.id));
    }
}

/// Closes session slot `id` in the background (see [`retry_close`]).
fn close_later(client: Client, id: String) {
    retry_close("a session's host socket".to_owned(), move || {
        let (client, id) = (client.clone(), id.clone());
        async move { client.close_session(&id).await }
    });
}

// === impl Grants ===

impl Grants {
    /// Opens a session's slot until `deadline`, reached the way the provider delivers grants.
    /// With `call_tokens` (a guard-delivered slot whose provider puts the guard rule on per
    /// call: e2b's `E2B_SESSION_GRANTS=call`), each lent call gets a fresh guard token of
    /// its own, dead when the call's grant closes, so a token seen in one call is useless in
    /// every other. `None` when grants are off, or when the broker is down or refuses
    /// (logged): that session's granted calls are then refused.
    pub async fn open_session_slot(
        &self,
        deadline: SystemTime,
        delivery: Delivery,
        call_tokens: bool,
    ) -> Option<SessionSlot> {
        let live = self.live.as_ref()?;
        if !live.up.load(Ordering::Relaxed) {
            tracing::warn!("session opened without a grant slot: the grant broker is down");
            return None;
        }
        let id = hex::encode(rand::random::<[u8; 16]>());
        let request = OpenSession {
            session: id.clone(),
            deadline_unix_ms: unix_ms(deadline),
            delivery,
        };
        match live.client.open_session(&request).await {
            Ok(Ok(opened)) => {
                let slot = GuestAccess::from_reach(opened.reach).map(|access| SessionSlot {
                    id,
                    client: live.client.clone(),
                    access,
                    delivery,
                    call_tokens: call_tokens && delivery == Delivery::Guard,
                    closed: false,
                });
                if slot.is_none() {
                    tracing::warn!(
                        "session opened without a grant slot: the broker's answer named none"
                    );
                }
                slot
            }
            Ok(Err(refused)) => {
                tracing::warn!(reason = %refused.message, "session opened without a grant slot: the broker refused one");
                None
            }
            // This session's loss only (the health check judges the broker); the broker
            // may have opened the socket before the channel failed, so it is closed by id.
            Err(e) => {
                tracing::warn!(error = %e, "session opened without a grant slot: the broker did not answer");
                close_later(live.client.clone(), id);
                None
            }
        }
    }

    /// Lends `profile`'s grant to the session's slot for one call until `deadline`;
    /// `kept_from_earlier_calls` processes of earlier calls share the sandbox (held stopped),
    /// which the broker's audit line states. The broker refuses a profile without
    /// `allow_in_sessions` (`permission`). Nothing has run on any refusal.
    pub async fn lend(
        &self,
        slot: Option<&SessionSlot>,
        profile: &str,
        principal: &Principal,
        deadline: SystemTime,
        kept_from_earlier_calls: u32,
    ) -> Result<OpenGrant, Refusal> {
        match slot {
            Some(slot) => {
                self.open_as(
                    profile,
                    principal,
                    deadline,
                    slot.delivery,
                    Some(slot),
                    kept_from_earlier_calls,
                )
                .await
            }
            // Grants off (or an anonymous caller) still get the unknown-profile answer.
            None if self.live.is_none() || principal.id.is_none() => {
                Err(super::unavailable(profile))
            }
            None => Err(Refusal::PermissionDenied(format!(
                "grant_profile {profile:?} cannot be lent: this session was opened while the grant broker was unavailable, so it has no grant slot; open a new session; nothing ran"
            ))),
        }
    }
}
