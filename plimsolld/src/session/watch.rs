//! One watcher per session (wire.md §7.6, providers.md §9.7): ends it at its lifetime,
//! closes it as `unclaimed` when no request named it before its first idle timeout, and
//! otherwise suspends it after its idle timeout (the next call resumes it).

use std::sync::Arc;

use plimsoll::wire::SessionEnd;
use tokio::time::Instant;

use super::terms::UNCLAIMED_WITHOUT_IDLE;
use super::{Entry, Sessions};

/// What the watcher does next, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Expire,
    Unclaimed,
    Suspend,
}

/// Watches `entry` until it ends.
pub(super) async fn watch(sessions: Arc<Sessions>, entry: Arc<Entry>) {
    loop {
        if entry.ended().is_some() {
            return;
        }
        let (at, _) = next_event(&entry);
        let changed = entry.changed.notified();
        tokio::select! {
            () = tokio::time::sleep_until(at) => {}
            () = changed => continue,
        }
        // Re-read: a call may have used the session since the deadline was computed.
        let (due, next) = next_event(&entry);
        if due > Instant::now() {
            continue;
        }
        match next {
            Next::Expire => {
                sessions.end(
                    &entry,
                    SessionEnd::SESSION_END_EXPIRED,
                    "the session's lifetime passed",
                );
                return;
            }
            Next::Unclaimed => {
                if entry.idle_now() {
                    sessions.end(
                        &entry,
                        SessionEnd::SESSION_END_UNCLAIMED,
                        "no request named the session before its first idle timeout",
                    );
                    return;
                }
            }
            Next::Suspend => suspend(&sessions, &entry).await,
        }
    }
}

/// The next thing due: the expiry, or the idle event when it comes first. While a call holds
/// or waits for the turn no idle event is due (its end wakes the watcher with a new last
/// use); counting one would make the watcher retry the suspend in a loop for the whole call.
fn next_event(entry: &Entry) -> (Instant, Next) {
    let expiry = (entry.stated.expires_at, Next::Expire);
    if !entry.idle_now() {
        return expiry;
    }
    let (last_used, claimed, suspended) = entry.idle_state();
    let idle = entry.stated.idle;
    let idle_event = match (claimed, idle.is_zero(), suspended) {
        (false, true, _) => Some((last_used + UNCLAIMED_WITHOUT_IDLE, Next::Unclaimed)),
        (false, false, _) => Some((last_used + idle, Next::Unclaimed)),
        (true, false, false) => Some((last_used + idle, Next::Suspend)),
        _ => None,
    };
    match idle_event {
        Some(event) if event.0 < expiry.0 => event,
        _ => expiry,
    }
}

/// Pauses the sandbox when nobody holds or waits for the turn; a failure ends the session.
async fn suspend(sessions: &Arc<Sessions>, entry: &Arc<Entry>) {
    let Some(mut turn) = entry.try_turn() else {
        return;
    };
    if entry.ended().is_some() {
        return;
    }
    let Some(sandbox) = turn.sandbox.as_mut() else {
        return;
    };
    // Not cancellable: the watcher is the only one awaiting it.
    match sandbox.suspend().await {
        Ok(()) => {
            entry.set_suspended(true);
            // A stopped sandbox holds no slot; the next call is admitted again.
            if sandbox.suspend_frees_slot() {
                drop(std::mem::take(&mut turn.hold));
            }
        }
        Err(fault) => {
            let (reason, detail) =
                fault.into_end("suspend", "the idle session could not be suspended");
            drop(turn);
            sessions.end(entry, reason, &detail);
        }
    }
}
