//! The warm session pool (`SANDBOX_SESSION_POOL`, providers.md §9.8): session containers made
//! ahead of demand, each started, verified and baselined like an open's, with the
//! interpreters of its language set already running, before any guest code.
//!
//! - A member never ran anyone's code: it is only ever handed to one open, and never comes
//!   back (closing the session removes its container like any other).
//! - A claim reads the cached verified state (no preflight); a member is claimable only when
//!   that state's key matches the one it was made under, it is at most [`MAX_AGE`] old, its
//!   expiry label covers the open's lifetime, its warm relays are attached, its container
//!   reads back as verified and its agent answers. A member that fails is ended, never handed
//!   out; one docker does not answer about is kept, and the open makes its own container.
//! - A member counts toward the size from the start of its make until it is in the pool, and
//!   from the moment it leaves the pool until it is handed out or its container is gone
//!   ([`Counted`]).
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
use crate::provider::{PoolStatus, ProviderError, SessionFault, SessionOpen, SessionSandbox};

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
    /// Members being made, checked for a claim or removed: they count toward the size until
    /// done. Each is one [`Counted`].
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

/// One unit of [`State::busy`], taken in the same lock as the member leaves (or, for a make,
/// before it starts). It is given back when dropped, however its work ends (a make that
/// fails, is cancelled or panics included), or by [`SessionPool::put`] in the same lock as
/// the member enters the pool: a member never counts twice, nor nowhere.
struct Counted {
    /// `None` once given back.
    pool: Option<Arc<SessionPool>>,
    /// Whether giving it back wakes the filler: a claim or a removal makes room. The
    /// filler's own make does not: that wake would end its failure backoff at once.
    wakes: bool,
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.uncount(self.wakes);
        }
    }
}

/// A member out of the pool, counted until it is handed out or gone.
type Taken = (Member, Counted);

/// What a claim's check of a member found.
enum Check {
    /// Fit to hand out.
    Ready,
    /// Docker did not answer the read-back: nothing is known against the member.
    Unanswered,
    /// Unfit; why, for the log.
    Failed(String),
}

impl SessionPool {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every change is one assignment or push/remove; a poisoned state is still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one member being made, checked or removed; `state` is this pool's, locked.
    fn count(self: &Arc<Self>, state: &mut State, wakes: bool) -> Counted {
        state.busy += 1;
        Counted {
            pool: Some(Arc::clone(self)),
            wakes,
        }
    }

    fn uncount(&self, wakes: bool) {
        {
            let mut state = self.state();
            state.busy = state.busy.saturating_sub(1);
        }
        if wakes {
            self.wake.notify_one();
        }
        self.settled.notify_waiters();
    }

    /// Starts the pool: makes the first member now (its failure is the caller's), then
    /// leaves the rest to the filler.
    pub async fn start(
        self: &Arc<Self>,
        inner: &Arc<Inner>,
        size: u32,
        max_lifetime: Duration,
    ) -> Result<(), ProviderError> {
        let counted = {
            let mut state = self.state();
            state.sizing = Some(Sizing { size, max_lifetime });
            state.demand = Some(Demand::new(size));
            self.count(&mut state, false)
        };
        // The make is the pool's task, not this future: a start abandoned at its budget (the
        // caller drops it) must not drop a half-made member, whose container would then
        // outlive the daemon; the make ends by itself, and the drain waits for it and removes
        // what it made.
        let first = tokio::spawn({
            let (pool, inner) = (Arc::clone(self), Arc::clone(inner));
            async move {
                let member = pool.make_member(&inner, all_languages(&inner)).await?;
                pool.put(member, counted);
                Ok::<(), ProviderError>(())
            }
        });
        first.await.map_err(|e| {
            ProviderError::infrastructure(format!("warm pool: the first member's make failed: {e}"))
        })??;
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
            for (member, counted) in stale {
                self.remove(member.session, counted, "stale");
            }
            let Some((mut member, counted)) = chosen else {
                self.missed();
                return None;
            };
            match check(&mut member.session).await {
                Check::Ready => {
                    self.claims.fetch_add(1, Ordering::Relaxed);
                    // Handed out: the filler replaces it.
                    drop(counted);
                    return Some(member.session);
                }
                Check::Unanswered => {
                    // Docker's hiccup is not the member's fault, and the next member would
                    // meet the same: it goes back, and the open makes its own container.
                    tracing::warn!(
                        container = %member.session.name,
                        "docker did not answer a warm pool member's read-back at claim; it stays in the pool"
                    );
                    self.put(member, counted);
                    self.missed();
                    return None;
                }
                Check::Failed(why) => {
                    tracing::warn!(
                        container = %member.session.name,
                        why = %why,
                        "a warm pool member failed its verification at claim; it is ended, not handed out"
                    );
                    self.remove(member.session, counted, "failed verification");
                }
            }
        }
    }

    /// Takes the best claimable member for `hinted` (most hinted languages warm, then fewest
    /// extra, then oldest), and every stale member, each counted until handed out or gone.
    fn choose(
        self: &Arc<Self>,
        key: &Key,
        expires: u64,
        hinted: &LanguageSet,
    ) -> (Option<Taken>, Vec<Taken>) {
        let mut state = self.state();
        let (fresh, stale): (Vec<Member>, Vec<Member>) = std::mem::take(&mut state.members)
            .into_iter()
            .partition(|m| &m.key == key && m.born.elapsed() <= MAX_AGE && m.expires >= expires);
        state.members = fresh;
        let stale = stale
            .into_iter()
            .map(|m| (m, self.count(&mut state, true)))
            .collect();
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
        let chosen = best.map(|i| {
            let member = state.members.remove(i);
            (member, self.count(&mut state, true))
        });
        (chosen, stale)
    }

    fn missed(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds a member (made, or back from a claim), giving back its count in the same lock;
    /// when the pool closed meanwhile it is removed instead.
    fn put(self: &Arc<Self>, member: Member, mut counted: Counted) {
        let mut state = self.state();
        if state.closed {
            drop(state);
            self.remove(member.session, counted, "the pool is closed");
            return;
        }
        state.members.push(member);
        state.busy = state.busy.saturating_sub(1);
        counted.pool = None;
        drop(state);
        self.settled.notify_waiters();
    }

    /// Removes a member's container off the caller's path; it counts toward the size (by
    /// `counted`) until it is gone.
    fn remove(self: &Arc<Self>, mut session: DockerSession, counted: Counted, why: &'static str) {
        tracing::info!(container = %session.name, why, "removing a warm pool member");
        tokio::spawn(async move {
            session.finish().await;
            drop(counted);
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

    /// The filler's next step: the set to warm, counted, when there is room.
    fn next_set(self: &Arc<Self>, inner: &Inner) -> Option<(LanguageSet, Counted)> {
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
        let old: Vec<Taken> = old
            .into_iter()
            .map(|m| (m, self.count(&mut state, true)))
            .collect();
        let moved = moved.map(|m| (m, self.count(&mut state, true)));
        let room = state.members.len() as u64 + u64::from(state.busy) < u64::from(sizing.size);
        let next = room.then(|| {
            let set = demand
                .and_then(|d| d.refill(&held(&state.members)))
                .unwrap_or_else(|| all_languages(inner));
            (set, self.count(&mut state, false))
        });
        drop(state);
        for (member, counted) in old {
            self.remove(member.session, counted, "older than the pool's maximum age");
        }
        if let Some((member, counted)) = moved {
            self.remove(
                member.session,
                counted,
                "rebalanced toward the languages opens ask for",
            );
        }
        next
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
        // Removals started before the drain (claims, rebalancing) finish too, and a first
        // member whose start was abandoned.
        loop {
            let settled = self.settled.notified();
            if self.state().busy == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                tracing::warn!(
                    "drain: a warm pool member is still being made or removed; its expiry label is the backstop"
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

/// A claim's check of `session`, cheapest first: its warm relays, its read-back (docker's
/// inspection), then a round trip to its agent (a dead agent would end the session at its
/// first call). Only docker not answering leaves the member unjudged.
async fn check(session: &mut DockerSession) -> Check {
    if !session.warm_alive() {
        return Check::Failed("a warm interpreter's relay is gone".to_owned());
    }
    match session.prepare().await {
        Ok(()) => {}
        Err(SessionFault::Refused(_)) => return Check::Unanswered,
        Err(e) => return Check::Failed(e.to_string()),
    }
    match session.agent_answers().await {
        Ok(()) => Check::Ready,
        Err(e) => Check::Failed(e.to_string()),
    }
}

/// The filler: one member at a time while there is room, backing off on failures.
async fn fill(pool: Arc<SessionPool>, inner: Arc<Inner>) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        if pool.closed() {
            return;
        }
        let Some((set, counted)) = pool.next_set(&inner) else {
            tokio::select! {
                () = pool.wake.notified() => {}
                () = tokio::time::sleep(FILL_EVERY) => {}
            }
            continue;
        };
        match pool.make_member(&inner, set).await {
            Ok(member) => {
                backoff = FIRST_BACKOFF;
                pool.put(member, counted);
            }
            Err(e) => {
                drop(counted);
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
