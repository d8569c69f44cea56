//! The warm session pool (`SANDBOX_SESSION_POOL`, providers.md §9.8): session containers made
//! ahead of demand, each started, verified and baselined like an open's, with the
//! interpreters of its language set already running, before any guest code.
//!
//! - A member never ran anyone's code: it is only ever handed to one open, and never comes
//!   back (closing the session removes its container like any other).
//! - A claim reads the cached verified state (no preflight); a member is claimable only when
//!   that state's key matches the one it was made under, it is at most [`MAX_AGE`] old, its
//!   expiry label covers the open's lifetime, its warm relays are attached and its container
//!   reads back as verified. A member that fails is ended, never handed out.
//! - One filler task makes members one at a time (the refill warms what [`demand`] names),
//!   backs off on failures (only the drain cuts a backoff short), and wakes on a claim, a
//!   removal, or every minute.
//! - The drain (SIGTERM) removes every member, and waits for the one being made.
//!
//! The one-shot snippet's container made ahead lives in `docker::pool`; this is the session's.

pub mod demand;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use self::demand::{Demand, LanguageSet};
use super::super::container::unix_now;
use super::super::preflight::Verified;
use super::super::{Inner, not_ready};
use super::{DockerSession, make, read_ptrace_scope, session_seccomp};
use crate::provider::{PoolStatus, ProviderError, SessionOpen, SessionSandbox};

/// The oldest a member may be when claimed; older ones are replaced.
pub const MAX_AGE: Duration = Duration::from_secs(30 * 60);
/// The budget of warming one member's interpreters.
const ADD_BUDGET: Duration = Duration::from_secs(120);
/// The filler's first wait after a failed member, doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The filler looks at the pool at least this often.
const FILL_EVERY: Duration = Duration::from_secs(60);

/// What a member was made under; a claim needs the current state's key to equal it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    image: String,
    runtime: String,
    runsc: bool,
    seccomp: Option<String>,
}

impl Key {
    fn of(inner: &Inner, verified: &Verified) -> Result<Key, ProviderError> {
        let seccomp = session_seccomp(
            &inner.settings,
            verified.seccomp.as_deref(),
            read_ptrace_scope(),
        )?;
        Ok(Key {
            image: verified.project.id.clone(),
            runtime: verified.runtime.name.clone(),
            runsc: verified.runtime.runsc_verified,
            seccomp: seccomp.map(str::to_owned),
        })
    }
}

/// One warm session container.
struct Member {
    session: DockerSession,
    set: LanguageSet,
    born: Instant,
    /// The expiry label, unix seconds.
    expires: u64,
    key: Key,
}

/// The pool's settings, once started.
#[derive(Debug, Clone, Copy)]
struct Sizing {
    size: u32,
    max_lifetime: Duration,
}

#[derive(Default)]
struct State {
    sizing: Option<Sizing>,
    members: Vec<Member>,
    /// Members being made or removed: they count toward the size until done.
    busy: u32,
    demand: Option<Demand>,
    last_move: Option<Instant>,
    closed: bool,
}

/// The warm session pool; off until [`SessionPool::start`].
#[derive(Default)]
pub struct SessionPool {
    state: Mutex<State>,
    /// Wakes the filler: a claim, a removal, the drain.
    wake: Notify,
    /// Wakes the drain when a removal or a make finishes.
    settled: Notify,
    claims: AtomicU64,
    misses: AtomicU64,
    filler: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl SessionPool {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every change is one assignment or push/remove; a poisoned state is still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the pool: makes the first member now (its failure is the caller's), then
    /// leaves the rest to the filler.
    pub async fn start(
        self: &Arc<Self>,
        inner: &Arc<Inner>,
        size: u32,
        max_lifetime: Duration,
    ) -> Result<(), ProviderError> {
        {
            let mut state = self.state();
            state.sizing = Some(Sizing { size, max_lifetime });
            state.demand = Some(Demand::new(size));
            state.busy += 1;
        }
        let first = self.make_member(inner, all_languages(inner)).await;
        self.done_busy(false);
        self.put(first?);
        let task = tokio::spawn(fill(Arc::clone(self), Arc::clone(inner)));
        *self.filler.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        Ok(())
    }

    /// The pool now, or `None` when it is off.
    pub fn status(&self) -> Option<PoolStatus> {
        let state = self.state();
        let sizing = state.sizing?;
        Some(PoolStatus {
            size: sizing.size,
            warm: held(&state.members).into_iter().collect(),
            claims: self.claims.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        })
    }

    /// A verified member for `open`, or `None` (the open then makes its own container).
    /// The open counts as demand either way.
    pub async fn claim(
        self: &Arc<Self>,
        inner: &Arc<Inner>,
        open: &SessionOpen,
        expires: u64,
    ) -> Option<DockerSession> {
        let hinted = hint_set(&open.languages, &all_languages(inner));
        {
            let mut state = self.state();
            if state.sizing.is_none() || state.closed {
                return None;
            }
            if let Some(demand) = state.demand.as_mut() {
                demand.count(&hinted);
            }
        }
        // A session with a broker socket needs the mount at create; no member has one.
        let key = match (&open.host_socket, inner.readiness.current()) {
            (None, Some(verified)) => Key::of(inner, &verified).ok(),
            _ => None,
        };
        let Some(key) = key else {
            self.missed();
            return None;
        };
        loop {
            let (chosen, stale) = self.choose(&key, expires, &hinted);
            for member in stale {
                self.remove(member.session, "stale");
            }
            let Some(mut member) = chosen else {
                self.missed();
                return None;
            };
            // The filler replaces what was taken.
            self.wake.notify_one();
            let verified = member.session.warm_alive() && member.session.prepare().await.is_ok();
            if verified {
                self.claims.fetch_add(1, Ordering::Relaxed);
                return Some(member.session);
            }
            tracing::warn!(
                container = %member.session.name,
                "a warm pool member failed its verification at claim; it is ended, not handed out"
            );
            self.remove(member.session, "failed verification");
        }
    }

    /// Takes the best claimable member for `hinted` (most hinted languages warm, then fewest
    /// extra, then oldest), and every stale member.
    fn choose(
        &self,
        key: &Key,
        expires: u64,
        hinted: &LanguageSet,
    ) -> (Option<Member>, Vec<Member>) {
        let mut state = self.state();
        let (fresh, stale): (Vec<Member>, Vec<Member>) = std::mem::take(&mut state.members)
            .into_iter()
            .partition(|m| &m.key == key && m.born.elapsed() <= MAX_AGE && m.expires >= expires);
        state.members = fresh;
        let best = state
            .members
            .iter()
            .enumerate()
            .max_by_key(|(_, m)| {
                let warm = m.set.iter().filter(|l| hinted.contains(l)).count();
                let extra = m.set.len() - warm;
                (warm, std::cmp::Reverse(extra), std::cmp::Reverse(m.born))
            })
            .map(|(i, _)| i);
        let chosen = best.map(|i| state.members.remove(i));
        (chosen, stale)
    }

    fn missed(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds a member, or removes it when the pool closed meanwhile.
    fn put(self: &Arc<Self>, member: Member) {
        let mut state = self.state();
        if state.closed {
            drop(state);
            self.remove(member.session, "the pool is closed");
        } else {
            state.members.push(member);
        }
    }

    /// A make or a removal is done. A removal wakes the filler (it makes room); a make does
    /// not: that wake would end the filler's failure backoff at once.
    fn done_busy(&self, wakes: bool) {
        let mut state = self.state();
        state.busy = state.busy.saturating_sub(1);
        drop(state);
        if wakes {
            self.wake.notify_one();
        }
        self.settled.notify_waiters();
    }

    /// Removes a member's container off the caller's path; it counts toward the size until
    /// it is gone.
    fn remove(self: &Arc<Self>, mut session: DockerSession, why: &'static str) {
        tracing::info!(container = %session.name, why, "removing a warm pool member");
        self.state().busy += 1;
        let pool = Arc::clone(self);
        tokio::spawn(async move {
            session.finish().await;
            pool.done_busy(true);
        });
    }

    /// Makes one member warm for `set`.
    async fn make_member(
        &self,
        inner: &Arc<Inner>,
        set: LanguageSet,
    ) -> Result<Member, ProviderError> {
        let max_lifetime = self
            .state()
            .sizing
            .map_or(Duration::ZERO, |s| s.max_lifetime);
        let verified = inner.readiness.check().await.map_err(not_ready)?;
        let key = Key::of(inner, &verified)?;
        let expires = unix_now() + MAX_AGE.as_secs() + max_lifetime.as_secs() + 1;
        let mut session = make(inner, &verified, expires, None, 0, Some(&set)).await?;
        let warmed = tokio::time::timeout(ADD_BUDGET, session.warm(&set)).await;
        match warmed {
            Ok(Ok(())) => Ok(Member {
                session,
                set,
                born: Instant::now(),
                expires,
                key,
            }),
            failed => {
                session.end_interpreters().await;
                session.finish().await;
                Err(ProviderError::infrastructure(match failed {
                    Ok(Err(e)) => format!("warm pool member: {e}"),
                    _ => format!("warm pool member: not warm within {ADD_BUDGET:?}"),
                }))
            }
        }
    }

    /// The filler's next step: the set to warm, when there is room.
    fn next_set(self: &Arc<Self>, inner: &Inner) -> Option<LanguageSet> {
        let mut state = self.state();
        let sizing = state.sizing?;
        if state.closed {
            return None;
        }
        // Old members are replaced.
        let (fresh, old): (Vec<Member>, Vec<Member>) = std::mem::take(&mut state.members)
            .into_iter()
            .partition(|m| m.born.elapsed() <= MAX_AGE);
        state.members = fresh;
        let counts = held(&state.members);
        let demand = state.demand.clone();
        // The rebalance: the oldest member of a surplus set goes, at most once a minute.
        let now = Instant::now();
        let surplus = demand
            .as_ref()
            .and_then(|d| d.rebalance(&counts, state.last_move, now));
        let mut moved = None;
        if let Some(set) = surplus
            && let Some(i) = state
                .members
                .iter()
                .enumerate()
                .filter(|(_, m)| m.set == set)
                .min_by_key(|(_, m)| m.born)
                .map(|(i, _)| i)
        {
            state.last_move = Some(now);
            moved = Some(state.members.remove(i));
        }
        // What is about to be removed still counts toward the size.
        let leaving = old.len() as u64 + u64::from(moved.is_some());
        let room =
            state.members.len() as u64 + u64::from(state.busy) + leaving < u64::from(sizing.size);
        let set = room.then(|| {
            state.busy += 1;
            demand
                .and_then(|d| d.refill(&held(&state.members)))
                .unwrap_or_else(|| all_languages(inner))
        });
        drop(state);
        for member in old {
            self.remove(member.session, "older than the pool's maximum age");
        }
        if let Some(member) = moved {
            self.remove(
                member.session,
                "rebalanced toward the languages opens ask for",
            );
        }
        set
    }

    /// The filler's wait after a failed make. Only the drain cuts it short: a claim or a
    /// removal makes room but does not make the failure go away, and without the wait a
    /// lasting failure (docker down, a moved tag) would be a loop of makes against docker.
    async fn back_off(&self, wait: Duration) {
        let until = Instant::now() + wait;
        loop {
            let woken = self.wake.notified();
            if self.closed() {
                return;
            }
            tokio::select! {
                () = woken => {}
                () = tokio::time::sleep_until(until) => return,
            }
        }
    }

    /// The drain: no more members; every member is removed, the one being made too, within
    /// `budget`.
    pub async fn drain(&self, budget: Duration) {
        let members = {
            let mut state = self.state();
            if state.sizing.is_none() {
                return;
            }
            state.closed = true;
            std::mem::take(&mut state.members)
        };
        self.wake.notify_one();
        let deadline = tokio::time::Instant::now() + budget;
        let removals = members.into_iter().map(|mut m| async move {
            m.session.finish().await;
        });
        let count = removals.len();
        if tokio::time::timeout_at(deadline, futures::future::join_all(removals))
            .await
            .is_err()
        {
            tracing::warn!("drain: warm pool members still being removed");
        }
        let filler = self.filler.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = filler
            && tokio::time::timeout_at(deadline, task).await.is_err()
        {
            tracing::warn!("drain: the warm pool's filler did not stop in time");
        }
        // Removals started before the drain (claims, rebalancing) finish too.
        loop {
            let settled = self.settled.notified();
            if self.state().busy == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                tracing::warn!(
                    "drain: a warm pool member is still being removed; its expiry label is the backstop"
                );
                break;
            }
        }
        tracing::info!(members = count, "drain: warm pool removed");
    }

    fn closed(&self) -> bool {
        self.state().closed
    }
}

/// The filler: one member at a time while there is room, backing off on failures.
async fn fill(pool: Arc<SessionPool>, inner: Arc<Inner>) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        if pool.closed() {
            return;
        }
        let Some(set) = pool.next_set(&inner) else {
            tokio::select! {
                () = pool.wake.notified() => {}
                () = tokio::time::sleep(FILL_EVERY) => {}
            }
            continue;
        };
        let made = pool.make_member(&inner, set).await;
        pool.done_busy(false);
        match made {
            Ok(member) => {
                backoff = FIRST_BACKOFF;
                pool.put(member);
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "warm pool: a member could not be made");
                pool.back_off(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Members per warm language set.
fn held(members: &[Member]) -> BTreeMap<LanguageSet, u32> {
    let mut counts = BTreeMap::new();
    for member in members {
        *counts.entry(member.set.clone()).or_insert(0) += 1;
    }
    counts
}

/// Every language the project image runs, sorted.
fn all_languages(inner: &Inner) -> LanguageSet {
    let mut languages = inner
        .languages
        .read()
        .map(|l| l.clone())
        .unwrap_or_default();
    languages.sort();
    languages.dedup();
    languages
}

/// The open's hint as a set: the hinted languages the image runs, or all of them when the
/// open named none (or none of those).
fn hint_set(hints: &[String], image: &LanguageSet) -> LanguageSet {
    let mut set: LanguageSet = image
        .iter()
        .filter(|l| hints.contains(l))
        .cloned()
        .collect();
    if set.is_empty() {
        set.clone_from(image);
    }
    set
}

#[cfg(test)]
mod tests;
