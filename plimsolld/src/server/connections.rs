//! The listener's connection slots: how many connections may be open, how
//! long each may stay, and which one gives way when the listener is full.
//!
//! A new connection is *anonymous* until one of its requests passes
//! authentication (with auth off, until one reaches the service). An
//! anonymous connection costs the daemon memory and a descriptor and has
//! proven nothing, so it is kept only briefly; an authenticated one gets the
//! spec's idle time (config.md §5). When every slot is taken, the newcomer
//! takes the slot of the connection that matters least (see [`Rank`]); when
//! every connection is an authenticated one with a request in flight, the
//! newcomer is refused: accepted and closed at once, never queued.
//!
//! [`Activity`] is what a connection shares with the table, with the request
//! wrapper that counts its streams, and with the task that drives it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How long an anonymous connection may stay without a request in flight,
/// counted from its accept or its last request's end. Long enough for a TLS
/// handshake and a first request over a slow link; short enough that
/// connections which never send a request (the h2c preface and SETTINGS,
/// then nothing) stop holding memory and slots within seconds.
pub const ANONYMOUS_IDLE: Duration = Duration::from_secs(10);
/// How long an anonymous connection's requests may stay in flight with no
/// new one starting. Anonymous requests are probes and refusals written
/// before any body byte is read; the slowest is `/readyz` (bounded at
/// 10 s). A stream held open past this is a peer that will not read its
/// answer (a zero flow-control window).
pub const ANONYMOUS_STALL: Duration = Duration::from_secs(30);
/// How long an authenticated connection may stay without a request in
/// flight: the spec's idle timeout (config.md §5, wire.md §1.3).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an authenticated connection's requests may stay in flight with
/// no new one starting: the spec's write timeout, above the 5-minute run
/// ceiling (config.md §5).
pub const STALL_TIMEOUT: Duration = Duration::from_secs(6 * 60);

// === impl Activity ===

/// What one connection has done, kept in atomics so the request path never
/// takes a lock.
pub struct Activity {
    opened: Instant,
    /// Requests started and not yet answered to the end.
    open_streams: AtomicUsize,
    authenticated: AtomicBool,
    /// Milliseconds after `opened` of the last request start or end.
    last_activity_ms: AtomicU64,
    /// Milliseconds after `opened` of the last request start.
    last_request_ms: AtomicU64,
    /// Set when the table gave this connection's slot to a newcomer.
    evicted: AtomicBool,
    /// Wakes the connection's task when it is evicted. Nothing else needs to
    /// wake it: see [`Snapshot::check_at`].
    eviction: Notify,
}

/// A snapshot of an [`Activity`], for decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Requests in flight.
    pub open_streams: usize,
    /// Whether a request passed authentication.
    pub authenticated: bool,
    /// The last request start or end (or the accept).
    pub last_activity: Instant,
    /// The last request start (or the accept).
    pub last_request: Instant,
}

impl Activity {
    fn new(now: Instant) -> Activity {
        Activity {
            opened: now,
            open_streams: AtomicUsize::new(0),
            authenticated: AtomicBool::new(false),
            last_activity_ms: AtomicU64::new(0),
            last_request_ms: AtomicU64::new(0),
            evicted: AtomicBool::new(false),
            eviction: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A request started.
    pub fn request_started(&self) {
        let now = self.now_ms();
        self.open_streams.fetch_add(1, Ordering::AcqRel);
        self.last_request_ms.store(now, Ordering::Release);
        self.last_activity_ms.store(now, Ordering::Release);
    }

    /// A request ended: its answer was written to the end, or it was
    /// cancelled.
    pub fn request_ended(&self) {
        self.last_activity_ms
            .store(self.now_ms(), Ordering::Release);
        self.open_streams.fetch_sub(1, Ordering::AcqRel);
    }

    /// A request on this connection passed authentication.
    pub fn authenticated(&self) {
        self.authenticated.store(true, Ordering::Release);
    }

    /// Whether the table gave this connection's slot away.
    pub fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// Resolves once the connection is evicted (at once if it already was).
    pub async fn evicted(&self) {
        self.eviction.notified().await;
    }

    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.eviction.notify_one();
    }

    /// The state as of now.
    pub fn snapshot(&self) -> Snapshot {
        let at = |ms: &AtomicU64| self.opened + Duration::from_millis(ms.load(Ordering::Acquire));
        Snapshot {
            open_streams: self.open_streams.load(Ordering::Acquire),
            authenticated: self.authenticated.load(Ordering::Acquire),
            last_activity: at(&self.last_activity_ms),
            last_request: at(&self.last_request_ms),
        }
    }
}

impl Snapshot {
    /// When the connection is to be closed if nothing else happens.
    pub fn close_at(&self) -> Instant {
        match (self.authenticated, self.open_streams) {
            (false, 0) => self.last_activity + ANONYMOUS_IDLE,
            (false, _) => self.last_request + ANONYMOUS_STALL,
            (true, 0) => self.last_activity + IDLE_TIMEOUT,
            (true, _) => self.last_request + STALL_TIMEOUT,
        }
    }

    /// When the connection's task should look again: never later than
    /// [`Snapshot::close_at`], whatever happens meanwhile.
    ///
    /// A request's start or end only moves `close_at` later, except that the
    /// end of the last request in flight can move it earlier (from the stall
    /// bound to the idle bound). Checking no later than `last_activity` plus
    /// the idle bound covers that case too: a later end sets `last_activity`
    /// later still. So the request path never has to wake the task, and a
    /// connection with requests in flight is looked at once per idle period.
    pub fn check_at(&self) -> Instant {
        let idle = if self.authenticated {
            IDLE_TIMEOUT
        } else {
            ANONYMOUS_IDLE
        };
        self.close_at().min(self.last_activity + idle)
    }

    /// How readily this connection gives its slot to a newcomer: `None`
    /// for never (authenticated, a request in flight).
    fn rank(&self) -> Option<(Rank, Instant)> {
        match (self.authenticated, self.open_streams) {
            (false, 0) => Some((Rank::AnonymousIdle, self.last_activity)),
            (false, _) => Some((Rank::AnonymousBusy, self.last_request)),
            (true, 0) => Some((Rank::AuthenticatedIdle, self.last_activity)),
            (true, _) => None,
        }
    }
}

/// The order in which connections give way, first to last; within a rank,
/// the one quiet the longest goes first. An anonymous connection with a
/// request in flight goes before an idle authenticated one: its request is
/// a probe or a refusal that the closing grace lets finish, while an
/// authenticated caller would have to reconnect and authenticate again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Rank {
    AnonymousIdle,
    AnonymousBusy,
    AuthenticatedIdle,
}

// === impl Connections ===

/// The connection table of one listener.
pub struct Connections {
    cap: usize,
    table: Mutex<Table>,
    /// Connections admitted whose task has not ended (evicted ones included).
    alive: AtomicUsize,
    /// Notified when `alive` drops to zero.
    emptied: Notify,
}

#[derive(Default)]
/// The live connections, in places that are reused. A place is found by
/// index; the id guards against a place reused since.
struct Table {
    places: Vec<Option<Entry>>,
    free: Vec<usize>,
    live: usize,
    /// Where the next search for a connection to give way starts.
    cursor: usize,
    next_id: u64,
}

struct Entry {
    id: u64,
    activity: Arc<Activity>,
}

impl Table {
    /// The connection that gives way among at most [`EVICTION_SCAN`] places
    /// from the cursor on, round robin: on a small table every connection,
    /// on a huge one a bounded share, so that a newcomer at the cap costs the
    /// accept loop a bounded amount of work.
    fn victim(&mut self) -> Option<usize> {
        let n = self.places.len();
        let mut best: Option<((Rank, Instant), usize)> = None;
        for step in 0..n.min(EVICTION_SCAN) {
            let at = (self.cursor + step) % n;
            let Some(e) = &self.places[at] else { continue };
            if let Some(rank) = e.activity.snapshot().rank()
                && best.is_none_or(|(b, _)| rank < b)
            {
                best = Some((rank, at));
            }
        }
        self.cursor = (self.cursor + n.min(EVICTION_SCAN)) % n.max(1);
        best.map(|(_, at)| at)
    }

    fn remove(&mut self, at: usize) -> Option<Entry> {
        let entry = self.places.get_mut(at)?.take()?;
        self.free.push(at);
        self.live -= 1;
        Some(entry)
    }

    fn insert(&mut self, entry: Entry) -> usize {
        self.live += 1;
        match self.free.pop() {
            Some(at) => {
                self.places[at] = Some(entry);
                at
            }
            None => {
                self.places.push(Some(entry));
                self.places.len() - 1
            }
        }
    }
}

/// How many connections a newcomer at the cap looks at, at most, for one to
/// give way (see [`Table::victim`]).
const EVICTION_SCAN: usize = 1024;

/// What [`Connections::admit`] decided.
pub enum Admission {
    /// The connection has a slot (perhaps one given up by another).
    Admitted(Slot),
    /// Every slot is held by an authenticated connection with a request in
    /// flight: close the newcomer at once.
    Refused,
}

impl Connections {
    /// A table of at most `cap` connections (at least 1).
    pub fn new(cap: usize) -> Arc<Connections> {
        Arc::new(Connections {
            cap: cap.max(1),
            table: Mutex::new(Table {
                places: Vec::new(),
                free: Vec::new(),
                live: 0,
                cursor: 0,
                next_id: 0,
            }),
            alive: AtomicUsize::new(0),
            emptied: Notify::new(),
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // A poisoned lock only means a panic elsewhere mid-update; the map
        // itself is always consistent between statements.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Finds a slot for a connection accepted now.
    pub fn admit(self: &Arc<Self>) -> Admission {
        let mut t = self.table();
        let took_over = t.live >= self.cap;
        if took_over {
            match t.victim().and_then(|at| t.remove(at)) {
                Some(gone) => gone.activity.evict(),
                None => return Admission::Refused,
            }
        }
        let id = t.next_id;
        t.next_id += 1;
        let activity = Arc::new(Activity::new(Instant::now()));
        let place = t.insert(Entry {
            id,
            activity: activity.clone(),
        });
        self.alive.fetch_add(1, Ordering::AcqRel);
        Admission::Admitted(Slot {
            table: self.clone(),
            place,
            id,
            activity,
            took_over,
        })
    }

    /// Waits until every admitted connection's task has ended.
    pub async fn emptied(&self) {
        loop {
            let notified = self.emptied.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.alive.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

// === impl Slot ===

/// One admitted connection's place in the table; dropping it frees the place.
pub struct Slot {
    table: Arc<Connections>,
    place: usize,
    id: u64,
    activity: Arc<Activity>,
    took_over: bool,
}

impl Slot {
    /// Whether another connection gave this one its slot.
    pub fn took_over(&self) -> bool {
        self.took_over
    }

    /// The connection's activity.
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            // An evicted connection's place is gone already, perhaps reused.
            let mut t = self.table.table();
            if t.places
                .get(self.place)
                .is_some_and(|e| e.as_ref().is_some_and(|e| e.id == self.id))
            {
                t.remove(self.place);
            }
        }
        if self.table.alive.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.table.emptied.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(authenticated: bool, open_streams: usize, activity: u64, request: u64) -> Snapshot {
        let base = Instant::now();
        Snapshot {
            open_streams,
            authenticated,
            last_activity: base + Duration::from_secs(activity),
            last_request: base + Duration::from_secs(request),
        }
    }

    #[test]
    fn each_kind_of_connection_gets_its_own_deadline() {
        let s = snap(false, 0, 5, 3);
        assert_eq!(s.close_at(), s.last_activity + ANONYMOUS_IDLE);
        let s = snap(false, 2, 5, 3);
        assert_eq!(s.close_at(), s.last_request + ANONYMOUS_STALL);
        let s = snap(true, 0, 5, 3);
        assert_eq!(s.close_at(), s.last_activity + IDLE_TIMEOUT);
        let s = snap(true, 1, 5, 3);
        assert_eq!(s.close_at(), s.last_request + STALL_TIMEOUT);
    }

    #[test]
    fn no_activity_moves_the_close_before_the_last_check_time() {
        // (authenticated, open streams, last activity, last request) before and after
        // any request start, end or authentication; times only move forward.
        let states = [
            (false, 0, 5, 5),
            (false, 1, 6, 6),
            (false, 0, 7, 6),
            (true, 1, 8, 8),
            (true, 0, 300, 8),
            (true, 2, 301, 301),
            (true, 0, 302, 301),
        ];
        for (i, a) in states.iter().enumerate() {
            let before = snap(a.0, a.1, a.2, a.3);
            for b in &states[i..] {
                let after = Snapshot {
                    open_streams: b.1,
                    authenticated: b.0,
                    last_activity: before.last_activity + Duration::from_secs(b.2 - a.2),
                    last_request: before.last_request + Duration::from_secs(b.3 - a.3),
                };
                assert!(
                    before.check_at() <= after.close_at(),
                    "{a:?} then {b:?}: checked too late"
                );
            }
        }
    }

    #[test]
    fn anonymous_idle_goes_first_and_authenticated_busy_never() {
        let ranks: Vec<_> = [
            snap(true, 0, 1, 1),
            snap(false, 1, 1, 1),
            snap(false, 0, 9, 9),
            snap(true, 3, 0, 0),
        ]
        .iter()
        .map(Snapshot::rank)
        .collect();
        assert_eq!(ranks[3], None);
        let mut order: Vec<_> = (0..3).collect();
        order.sort_by_key(|&i| ranks[i]);
        assert_eq!(order, vec![2, 1, 0]);
    }

    #[tokio::test]
    async fn a_full_table_evicts_the_longest_quiet_anonymous_connection() {
        let table = Connections::new(2);
        let Admission::Admitted(first) = table.admit() else {
            panic!("room for the first");
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let Admission::Admitted(second) = table.admit() else {
            panic!("room for the second");
        };
        second.activity().authenticated();
        let Admission::Admitted(third) = table.admit() else {
            panic!("the anonymous first gives way");
        };
        assert!(first.activity().is_evicted());
        assert!(third.took_over() && !second.took_over());
        assert!(!second.activity().is_evicted());
        // Both remaining are busy and authenticated: the next is refused.
        for s in [&second, &third] {
            s.activity().authenticated();
            s.activity().request_started();
        }
        assert!(matches!(table.admit(), Admission::Refused));
        // A request ends: that connection is now the one to give way.
        third.activity().request_ended();
        assert!(matches!(table.admit(), Admission::Admitted(_)));
        assert!(third.activity().is_evicted());
    }

    #[tokio::test]
    async fn a_huge_table_looks_at_a_bounded_window_round_robin() {
        let cap = 3 * EVICTION_SCAN;
        let table = Connections::new(cap);
        let slots: Vec<Slot> = (0..cap)
            .map(|_| match table.admit() {
                Admission::Admitted(s) => s,
                Admission::Refused => panic!("room"),
            })
            .collect();
        // Only the last window holds connections that may give way.
        for s in &slots[..2 * EVICTION_SCAN] {
            s.activity().authenticated();
            s.activity().request_started();
        }
        // The first two searches see only busy connections; the third finds one.
        assert!(matches!(table.admit(), Admission::Refused));
        assert!(matches!(table.admit(), Admission::Refused));
        let Admission::Admitted(_newcomer) = table.admit() else {
            panic!("the third window has idle connections");
        };
        assert_eq!(
            slots.iter().filter(|s| s.activity().is_evicted()).count(),
            1
        );
        assert!(slots[2 * EVICTION_SCAN].activity().is_evicted());
    }

    #[tokio::test]
    async fn the_table_empties_when_every_slot_is_dropped() {
        let table = Connections::new(1);
        let Admission::Admitted(a) = table.admit() else {
            panic!("room");
        };
        let Admission::Admitted(b) = table.admit() else {
            panic!("a gives way");
        };
        drop(a);
        let waiting = tokio::spawn({
            let table = table.clone();
            async move { table.emptied().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("emptied resolves")
            .expect("task");
    }
}
