//! The session table (wire.md §7, providers.md §9): every live session, who may name it, the
//! caps, and each session's life from open to removal.
//!
//! A session belongs to the principal that opened it; any other caller's id looks exactly
//! like an unknown one. Its admission slot is held for its whole life and released only
//! once the provider reports the sandbox gone. Calls take the session's turn ([`Entry`]);
//! idle, unclaimed and lifetime ends come from one watcher task per session
//! ([`watch`]). A session that ended by itself stays collectable by `CloseSession` for ten
//! minutes, then leaves the table.

mod entry;
pub mod proof;
pub mod terms;
mod watch;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use plimsoll::refusal::Refusal;
use plimsoll::wire::SessionEnd;

pub use entry::{Ended, Entry, Stated, Turn, TurnGuard};

use crate::admission::Admission;
use crate::config::session::SessionConfig;
use crate::grant::SessionSlot;
use crate::provider::{Hold, OpenedSession, Provider, ProviderError, SessionOpen};

/// The refusal of an open at the owner's cap when none of the owner's sessions is idle.
const OWNER_BUSY: &str = "this owner's sessions are all busy or still opening and at the owner's cap; retry when one is idle";

/// How long a session that ended by itself stays collectable.
pub const COLLECTABLE_FOR: Duration = Duration::from_secs(10 * 60);

/// What an open settled on, before the provider is asked.
pub struct OpenTerms {
    /// The principal opening it.
    pub caller: String,
    /// The opaque owner, or "".
    pub owner: String,
    /// The effective lifetime.
    pub lifetime: Duration,
    /// The languages the session will offer.
    pub languages: Vec<String>,
    /// The caller's own daily paid allowance (clients file), if any.
    pub paid_allowance: Option<u64>,
}

/// The session table.
pub struct Sessions {
    config: SessionConfig,
    provider: Arc<dyn Provider>,
    admission: Arc<Admission>,
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    /// Opens past their caps and admission and not yet in the table. The caps count them,
    /// so opens run side by side (a slow provider never makes another caller's open wait),
    /// and the drain waits for them.
    opening: Mutex<Vec<Opening>>,
    /// Wakes the drain when an open leaves `opening`.
    opened: Notify,
    draining: AtomicBool,
}

/// An open in flight, as the caps count it.
struct Opening {
    key: u64,
    caller: String,
    owner: String,
}

/// An open's place in [`Sessions::opening`], given up on drop (opened, failed or abandoned).
struct OpeningGuard<'a> {
    sessions: &'a Sessions,
    key: u64,
}

impl Drop for OpeningGuard<'_> {
    fn drop(&mut self) {
        self.sessions.opening().retain(|o| o.key != self.key);
        self.sessions.opened.notify_waiters();
    }
}

impl Sessions {
    /// An empty table.
    pub fn new(
        config: SessionConfig,
        provider: Arc<dyn Provider>,
        admission: Arc<Admission>,
    ) -> Arc<Sessions> {
        Arc::new(Sessions {
            config,
            provider,
            admission,
            entries: Mutex::new(HashMap::new()),
            opening: Mutex::new(Vec::new()),
            opened: Notify::new(),
            draining: AtomicBool::new(false),
        })
    }

    /// The settings in force.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        // Inserts and removes are single calls, so a poisoned map is still consistent.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn opening(&self) -> MutexGuard<'_, Vec<Opening>> {
        // The same: pushes and removals are single calls.
        self.opening.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Live (not ended) sessions.
    pub fn live(&self) -> usize {
        self.entries()
            .values()
            .filter(|e| e.ended().is_none())
            .count()
    }

    /// Opens a session: caps, admission, a replaced session for the owner's cap, the
    /// broker's socket (`slot`, awaited only once the open is admitted, so a refused open
    /// never reaches the broker), then the provider's sandbox, with the slot's socket
    /// mounted when there is one. `stated` is completed with the id and what the provider
    /// opened. The checks up to the replacement are one step; the awaits after run beside
    /// other opens, which count this one against the caps meanwhile.
    pub async fn open(
        self: &Arc<Self>,
        terms: OpenTerms,
        slot: impl Future<Output = Option<SessionSlot>>,
        stated: impl FnOnce(&OpenedSession) -> Stated,
    ) -> Result<Arc<Entry>, ProviderError> {
        let (permit, paid, _opening) = {
            let mut opening = self.opening();
            if self.draining.load(Ordering::SeqCst) {
                return Err(Refusal::AtCapacity(
                    "the daemon is shutting down and opens no sessions".to_owned(),
                )
                .into());
            }
            let victims = self.check_caps(&terms, &opening)?;
            let permit = self.admission.admit(&terms.caller)?;
            // On a metered provider the session's whole lifetime is reserved (its VM lives
            // that long at most), whatever it is suspended; the VM settles it when it is gone.
            let paid = self
                .admission
                .reserve_paid(&terms.caller, terms.paid_allowance, terms.lifetime)?
                .map(Arc::new);
            if let Some(victims) = victims {
                // The least recently used that is still idle at this instant.
                if !victims.iter().any(|victim| self.replace(victim)) {
                    return Err(Refusal::AtCapacity(OWNER_BUSY.to_owned()).into());
                }
            }
            let key = rand::random::<u64>();
            opening.push(Opening {
                key,
                caller: terms.caller.clone(),
                owner: terms.owner.clone(),
            });
            (
                permit,
                paid,
                OpeningGuard {
                    sessions: self,
                    key,
                },
            )
        };
        let slot = slot.await;
        let opened = self
            .provider
            .open_session(SessionOpen {
                lifetime: terms.lifetime,
                languages: terms.languages.clone(),
                disk_mb: self.config.disk_mb,
                host_socket: slot
                    .as_ref()
                    .and_then(|s| s.access().socket())
                    .map(std::path::Path::to_owned),
                guard_token: slot
                    .as_ref()
                    .and_then(|s| s.access().guard_token().cloned()),
                paid,
            })
            .await?;
        let stated = stated(&opened);
        let entry = Arc::new(Entry::new(stated, opened.sandbox, Hold::new(permit), slot));
        self.entries()
            .insert(entry.stated.id.clone(), Arc::clone(&entry));
        tokio::spawn(watch::watch(Arc::clone(self), Arc::clone(&entry)));
        // A drain that gave up waiting for this open has ended the table without it.
        if self.draining.load(Ordering::SeqCst) {
            self.end(
                &entry,
                SessionEnd::SESSION_END_SHUTDOWN,
                "the daemon is shutting down",
            );
        }
        Ok(entry)
    }

    /// The daemon-wide, per-caller and per-owner caps, counting `opening` (the opens in
    /// flight) with the live sessions. At the owner's cap, answers the owner's idle sessions,
    /// least recently used first, one of which the open replaces; if none is idle, the open
    /// is refused.
    fn check_caps(
        &self,
        terms: &OpenTerms,
        opening: &[Opening],
    ) -> Result<Option<Vec<Arc<Entry>>>, Refusal> {
        let entries = self.entries();
        let live: Vec<&Arc<Entry>> = entries.values().filter(|e| e.ended().is_none()).collect();
        let c = &self.config;
        if live.len() + opening.len() >= c.max_sessions as usize {
            return Err(Refusal::AtCapacity(format!(
                "the daemon holds its maximum of {} sessions; close one or retry later",
                c.max_sessions
            )));
        }
        let mine = live
            .iter()
            .filter(|e| e.stated.caller == terms.caller)
            .count()
            + opening.iter().filter(|o| o.caller == terms.caller).count();
        if c.per_caller > 0 && mine >= c.per_caller as usize {
            return Err(Refusal::AtCapacity(format!(
                "this caller holds its maximum of {} sessions; close one first",
                c.per_caller
            )));
        }
        if c.per_owner == 0 || terms.owner.is_empty() {
            return Ok(None);
        }
        let mut owned: Vec<&Arc<Entry>> = live
            .into_iter()
            .filter(|e| e.stated.owner == terms.owner && e.stated.caller == terms.caller)
            .collect();
        let owned_opening = opening
            .iter()
            .filter(|o| o.owner == terms.owner && o.caller == terms.caller)
            .count();
        if owned.len() + owned_opening < c.per_owner as usize {
            return Ok(None);
        }
        owned.retain(|e| e.idle_now());
        if owned.is_empty() {
            return Err(Refusal::AtCapacity(OWNER_BUSY.to_owned()));
        }
        owned.sort_by_key(|e| e.idle_state().0);
        Ok(Some(owned.into_iter().cloned().collect()))
    }

    /// The caller's session `id`; another caller's id looks unknown.
    pub fn find(&self, id: &str, caller: &str) -> Result<Arc<Entry>, Refusal> {
        self.entries()
            .get(id)
            .filter(|e| e.stated.caller == caller)
            .cloned()
            .ok_or(Refusal::SessionNotFound)
    }

    /// Ends `entry` (if it is not ended already) and removes its sandbox off the caller's
    /// path; the slot is released once the sandbox is gone. The entry stays collectable for
    /// [`COLLECTABLE_FOR`].
    pub fn end(self: &Arc<Self>, entry: &Arc<Entry>, reason: SessionEnd, detail: &str) {
        if entry.mark_ended(reason, detail) {
            self.remove_later(entry);
        }
    }

    /// Ends `entry` as replaced under the owner's cap, only if it is idle at this instant;
    /// answers whether it did.
    fn replace(self: &Arc<Self>, entry: &Arc<Entry>) -> bool {
        let replaced = entry.mark_ended_if_idle(
            SessionEnd::SESSION_END_REPLACED,
            "the owner's session cap was reached and a newer session replaced this one",
        );
        if replaced {
            self.remove_later(entry);
        }
        replaced
    }

    /// Removes an ended entry's sandbox off the caller's path; it stays collectable for
    /// [`COLLECTABLE_FOR`].
    fn remove_later(self: &Arc<Self>, entry: &Arc<Entry>) {
        let sessions = Arc::clone(self);
        let entry = Arc::clone(entry);
        tokio::spawn(async move {
            remove_sandbox(&entry).await;
            tokio::time::sleep(COLLECTABLE_FOR).await;
            sessions.forget(&entry);
        });
    }

    /// Closes `entry`: ends it as closed (unless it ended already), waits until its sandbox
    /// is gone, and removes it from the table. Returns the turn's final chain position and
    /// how it ended.
    pub async fn close(&self, entry: &Arc<Entry>) -> Result<(u64, String, Ended), Refusal> {
        let turn = match entry.take_turn().await {
            Ok(turn) => Some(turn),
            // Ended: still collectable; wait for the removal below.
            Err(Refusal::SessionEnded { .. }) => None,
            Err(other) => return Err(other),
        };
        entry.mark_ended(SessionEnd::SESSION_END_CLOSED, "closed by CloseSession");
        drop(turn);
        let (sequence, last) = remove_sandbox(entry).await;
        self.forget(entry);
        let ended = entry.ended().unwrap_or(Ended {
            reason: SessionEnd::SESSION_END_CLOSED,
            detail: String::new(),
        });
        Ok((sequence, last, ended))
    }

    fn forget(&self, entry: &Arc<Entry>) {
        let mut entries = self.entries();
        if entries
            .get(&entry.stated.id)
            .is_some_and(|e| Arc::ptr_eq(e, entry))
        {
            entries.remove(&entry.stated.id);
        }
    }

    /// The drain (providers.md §9.7): refuse new opens, wait for opens in flight, end every
    /// session as `shutdown`, and wait up to `budget` for the removals. An open still in
    /// flight when the budget is spent ends its own session as it lands.
    pub async fn drain(self: &Arc<Self>, budget: Duration) {
        {
            // Under the lock the opens check the flag in, so every open that saw it unset
            // is already in `opening`.
            let _opening = self.opening();
            self.draining.store(true, Ordering::SeqCst);
        }
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            // Registered before the check, so an open leaving between the two is not missed.
            opened.as_mut().enable();
            if self.opening().is_empty() {
                break;
            }
            if tokio::time::timeout_at(deadline, opened).await.is_err() {
                tracing::warn!("drain: a session open is still in flight; it ends as it lands");
                break;
            }
        }
        let all: Vec<Arc<Entry>> = self.entries().values().cloned().collect();
        for entry in &all {
            self.end(
                entry,
                SessionEnd::SESSION_END_SHUTDOWN,
                "the daemon is shutting down",
            );
        }
        for entry in &all {
            if tokio::time::timeout_at(deadline, entry.wait_gone())
                .await
                .is_err()
            {
                tracing::warn!(
                    "drain: a session sandbox is still being removed; the orphan sweep of the next start removes it"
                );
                break;
            }
        }
        if !all.is_empty() {
            tracing::info!(sessions = all.len(), "drain: sessions ended");
        }
    }
}

/// Removes the session's sandbox once the turn is free (after any call and its sweep), then
/// drops its admission slot. Returns the chain's final position. Idempotent.
async fn remove_sandbox(entry: &Entry) -> (u64, String) {
    let mut turn = entry.turn_for_removal().await;
    if let Some(mut sandbox) = turn.sandbox.take() {
        sandbox.finish().await;
        if let Some(slot) = turn.slot.take() {
            slot.close().await;
        }
        drop(std::mem::take(&mut turn.hold));
        entry.mark_gone();
    }
    (turn.chain.sequence, turn.chain.last_record.clone())
}
