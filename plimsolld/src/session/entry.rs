//! One session in the table: what was stated at open, its life (ended, claimed, last used,
//! suspended, who waits), and its turn — the one lock that serializes calls, the sweep, the
//! suspend and the removal (providers.md §9.2).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use plimsoll::refusal::Refusal;
use plimsoll::tier::IsolationTier;
use plimsoll::wire::{SessionEnd, SoftwareRule};
use tokio::sync::{Notify, OwnedMutexGuard};
use tokio::time::Instant;

use crate::admission::Admission;
use crate::grant::SessionSlot;
use crate::provider::{Hold, SessionFault, SessionSandbox};
use crate::record::Chain;

/// Calls (or a close) that may hold or wait for the turn at once: the holder and one waiter.
const TURN_QUEUE: u32 = 2;

/// Why and how a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The end reason.
    pub reason: SessionEnd,
    /// One sentence for the caller.
    pub detail: String,
}

impl Ended {
    /// The refusal a call on the ended session gets.
    pub fn refusal(&self) -> Refusal {
        Refusal::SessionEnded {
            reason: self.reason,
            detail: self.detail.clone(),
        }
    }
}

/// What the open stated; fixed for the session's life.
#[derive(Debug, Clone)]
pub struct Stated {
    /// 32 lowercase hex; a capability, never logged.
    pub id: String,
    /// SHA-256 of the id.
    pub fingerprint: String,
    /// The principal that opened it; nobody else can name it.
    pub caller: String,
    /// The opaque owner, or "".
    pub owner: String,
    /// The provider id.
    pub sandbox: &'static str,
    /// The tier measured at open.
    pub tier: IsolationTier,
    /// The record's `environment` on every call.
    pub environment: String,
    /// The record's `software_identity` on every call.
    pub software_identity: String,
    /// The record's `instance` on every call.
    pub instance: String,
    /// The record's `policy` on every call.
    pub policy: String,
    /// The open's software rule; every call must restate it.
    pub rule: Option<SoftwareRule>,
    /// Wall-clock expiry, as the open answered it.
    pub expires_unix_ms: i64,
    /// Monotonic expiry.
    pub expires_at: Instant,
    /// The effective idle timeout; zero = never suspend.
    pub idle: Duration,
}

/// The mutable part every task may read without the turn.
#[derive(Debug)]
struct Life {
    ended: Option<Ended>,
    claimed: bool,
    last_used: Instant,
    suspended: bool,
    queued: u32,
    gone: bool,
}

/// What only the turn's holder touches.
pub struct Turn {
    /// The sandbox, until it is removed.
    pub sandbox: Option<Box<dyn SessionSandbox>>,
    /// The session's record chain: each call's record is its next link.
    pub chain: Chain,
    /// The session's admission slot, dropped once the sandbox is gone.
    pub hold: Hold,
    /// The session's broker socket (grants on), closed once the sandbox is gone.
    pub slot: Option<SessionSlot>,
}

/// One session.
pub struct Entry {
    /// What the open stated.
    pub stated: Stated,
    life: Mutex<Life>,
    turn: Arc<tokio::sync::Mutex<Turn>>,
    /// Wakes the session's watcher: a call finished, or the session ended.
    pub(super) changed: Notify,
    /// Wakes whoever waits for the sandbox's removal.
    pub(super) removed: Notify,
    /// Wakes a call in progress when the session ends under it.
    ending: Notify,
}

impl Entry {
    /// A live session holding `sandbox` and `hold`.
    pub fn new(
        stated: Stated,
        sandbox: Box<dyn SessionSandbox>,
        hold: Hold,
        slot: Option<SessionSlot>,
    ) -> Entry {
        Entry {
            stated,
            life: Mutex::new(Life {
                ended: None,
                claimed: false,
                last_used: Instant::now(),
                suspended: false,
                queued: 0,
                gone: false,
            }),
            turn: Arc::new(tokio::sync::Mutex::new(Turn {
                sandbox: Some(sandbox),
                chain: Chain::default(),
                hold,
                slot,
            })),
            changed: Notify::new(),
            removed: Notify::new(),
            ending: Notify::new(),
        }
    }

    fn life(&self) -> MutexGuard<'_, Life> {
        // Every update leaves the fields consistent, so a poisoned lock is still usable.
        self.life.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How it ended, if it did.
    pub fn ended(&self) -> Option<Ended> {
        self.life().ended.clone()
    }

    /// Marks the session ended; returns whether this was the first end (later ends keep the
    /// first reason).
    pub fn mark_ended(&self, reason: SessionEnd, detail: &str) -> bool {
        let first = {
            let mut life = self.life();
            if life.ended.is_some() {
                false
            } else {
                life.ended = Some(Ended {
                    reason,
                    detail: detail.to_owned(),
                });
                true
            }
        };
        self.changed.notify_one();
        self.ending.notify_waiters();
        first
    }

    /// Marks the session ended as [`Entry::mark_ended`] does, but only while no call holds or
    /// waits for its turn, checked in the same step: a call that has just taken the turn is
    /// never cut off, and one that comes after finds the session ended. Returns whether it
    /// ended it.
    pub fn mark_ended_if_idle(&self, reason: SessionEnd, detail: &str) -> bool {
        {
            let mut life = self.life();
            if life.queued != 0 || life.ended.is_some() {
                return false;
            }
            life.ended = Some(Ended {
                reason,
                detail: detail.to_owned(),
            });
        }
        self.changed.notify_one();
        self.ending.notify_waiters();
        true
    }

    /// Returns once the session has ended (at once if it already has).
    pub async fn until_ended(&self) -> Ended {
        loop {
            let ending = self.ending.notified();
            tokio::pin!(ending);
            // Registered before the check, so an end between the two is not missed.
            ending.as_mut().enable();
            if let Some(ended) = self.ended() {
                return ended;
            }
            ending.await;
        }
    }

    /// A request named the session: it will not close as unclaimed.
    pub fn claim(&self) {
        self.life().claimed = true;
    }

    /// Whether no call holds or waits for the turn.
    pub fn idle_now(&self) -> bool {
        self.life().queued == 0
    }

    /// When the session was last used, whether it was claimed and whether it is suspended.
    pub fn idle_state(&self) -> (Instant, bool, bool) {
        let life = self.life();
        (life.last_used, life.claimed, life.suspended)
    }

    /// Whether the sandbox is gone.
    pub fn gone(&self) -> bool {
        self.life().gone
    }

    /// Records that the sandbox is gone and wakes whoever waits for it.
    pub fn mark_gone(&self) {
        self.life().gone = true;
        self.removed.notify_waiters();
        self.changed.notify_one();
    }

    /// Waits until the sandbox is gone.
    pub async fn wait_gone(&self) {
        loop {
            let removed = self.removed.notified();
            if self.gone() {
                return;
            }
            removed.await;
        }
    }

    /// Takes the turn for a call or a close: at most one holder and one waiter, else a
    /// capacity refusal; an ended session refuses once the turn is taken.
    pub async fn take_turn(self: &Arc<Self>) -> Result<TurnGuard, Refusal> {
        {
            let mut life = self.life();
            if life.queued >= TURN_QUEUE {
                return Err(Refusal::AtCapacity(
                    "another call is already waiting for this session's turn; retry after it finishes"
                        .to_owned(),
                ));
            }
            life.queued += 1;
        }
        // From here the place in the queue is released on drop, even if this future is.
        let queued = Queued(Arc::clone(self));
        let guard = Arc::clone(&self.turn).lock_owned().await;
        let turn = TurnGuard {
            guard,
            _queued: queued,
        };
        if let Some(ended) = self.ended() {
            return Err(ended.refusal());
        }
        Ok(turn)
    }

    /// Takes the turn for the daemon's own work (suspend) only when nobody holds or waits
    /// for it.
    pub fn try_turn(self: &Arc<Self>) -> Option<OwnedMutexGuard<Turn>> {
        if !self.idle_now() {
            return None;
        }
        Arc::clone(&self.turn).try_lock_owned().ok()
    }

    /// Takes the turn for removal, after any call that holds or waits for it.
    pub async fn turn_for_removal(&self) -> OwnedMutexGuard<Turn> {
        Arc::clone(&self.turn).lock_owned().await
    }

    /// The refusal a call gets once the sandbox is gone: the session's end, or not found.
    pub fn ended_refusal(&self) -> Refusal {
        self.ended()
            .map_or(Refusal::SessionNotFound, |e| e.refusal())
    }

    /// Records a suspend (or a resume).
    pub fn set_suspended(&self, suspended: bool) {
        self.life().suspended = suspended;
    }

    /// Before a call (providers.md §9.2): a sandbox whose suspend gave its slot back is
    /// admitted again, then resumed and proved. A failed resume ends the session; any fault
    /// the session survives (a refused or failed read-back) comes after the resume, so the
    /// sandbox runs again: it keeps the slot and no longer counts as suspended, and the
    /// watcher suspends it again once idle, which gives the slot back. (Left marked
    /// suspended, it was never suspended again and held a slot until its lifetime.)
    pub async fn prepare(
        &self,
        turn: &mut Turn,
        admission: &Arc<Admission>,
    ) -> Result<(), SessionFault> {
        let Some(sandbox) = turn.sandbox.as_mut() else {
            return Err(SessionFault::Refused(self.ended_refusal()));
        };
        if !turn.hold.is_held() {
            turn.hold = Hold::new(admission.admit(&self.stated.caller)?);
        }
        let prepared = sandbox.prepare().await;
        if !matches!(prepared, Err(SessionFault::Ended { .. })) {
            self.set_suspended(false);
        }
        prepared
    }
}

/// A place in the turn's queue; released on drop, when the call is done with the session.
struct Queued(Arc<Entry>);

impl Drop for Queued {
    fn drop(&mut self) {
        {
            let mut life = self.0.life();
            life.queued = life.queued.saturating_sub(1);
            life.last_used = Instant::now();
        }
        self.0.changed.notify_one();
    }
}

/// The session's turn, held by one call (and its sweep) at a time.
pub struct TurnGuard {
    guard: OwnedMutexGuard<Turn>,
    _queued: Queued,
}

impl std::ops::Deref for TurnGuard {
    type Target = Turn;

    fn deref(&self) -> &Turn {
        &self.guard
    }
}

impl std::ops::DerefMut for TurnGuard {
    fn deref_mut(&mut self) -> &mut Turn {
        &mut self.guard
    }
}
