//! The session table's own logic on tokio's paused clock (time moves only when every task
//! waits, so the timeouts are exact and cost no wall time): idle suspend, unclaimed,
//! lifetime, the turn's queue, the owner cap and the slot released only after removal. The
//! sandbox is a recording stand-in; what a real sandbox does is tested end to end in `tests/`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use plimsoll::refusal::Refusal;
use plimsoll::tier::IsolationTier;
use plimsoll::wire::SessionEnd;

use super::*;
use crate::admission::Admission;
use crate::config::admission::Limits;
use crate::metrics::Metrics;
use crate::provider::{
    Description, ProjectPlan, ProjectReport, ProviderError, SessionFault, SessionSandbox,
    SnippetOutcome, SnippetRun, TierEvidence,
};

/// What the stand-in sandboxes were asked to do.
#[derive(Default)]
struct Log {
    suspended: AtomicUsize,
    finished: AtomicUsize,
    opened: AtomicUsize,
    /// How long the provider takes to open a sandbox, in ms.
    open_ms: AtomicU64,
    /// Whether a suspend gives the slot back (as a paused VM does).
    suspend_frees_slot: AtomicBool,
    /// Whether the read-back before a call is refused (after the resume).
    refuse_read_back: AtomicBool,
}

struct Recording(Arc<Log>);

#[async_trait]
impl SessionSandbox for Recording {
    async fn prepare(&mut self) -> Result<(), SessionFault> {
        if self.0.refuse_read_back.load(Ordering::SeqCst) {
            return Err(SessionFault::Refused(Refusal::Environment(
                "the read-back was refused".to_owned(),
            )));
        }
        Ok(())
    }
    async fn snippet(
        &mut self,
        _code: String,
        _timeout: Duration,
        _grant: Option<Arc<crate::grant::GuestGrant>>,
    ) -> Result<SnippetOutcome, SessionFault> {
        Ok(SnippetOutcome::default())
    }
    async fn project(&mut self, _plan: ProjectPlan) -> Result<ProjectReport, SessionFault> {
        Ok(ProjectReport::default())
    }
    async fn sweep(&mut self) -> Result<(), SessionFault> {
        Ok(())
    }
    async fn suspend(&mut self) -> Result<(), SessionFault> {
        self.0.suspended.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn suspend_frees_slot(&self) -> bool {
        self.0.suspend_frees_slot.load(Ordering::SeqCst)
    }
    async fn finish(&mut self) {
        self.0.finished.fetch_add(1, Ordering::SeqCst);
    }
}

struct FakeProvider(Arc<Log>);

#[async_trait]
impl Provider for FakeProvider {
    async fn preflight(&self) -> Result<TierEvidence, ProviderError> {
        unreachable!("the table never preflights")
    }
    async fn prove(&self) -> Result<TierEvidence, ProviderError> {
        unreachable!("the table never proves")
    }
    async fn ready(&self) -> Result<(), String> {
        Ok(())
    }
    fn current_tier(&self) -> IsolationTier {
        IsolationTier::Container
    }
    fn describe(&self) -> Description {
        Description {
            sandbox: "fake",
            supports_sessions: true,
            ..Description::default()
        }
    }
    async fn run_snippet(&self, _run: SnippetRun) -> Result<SnippetOutcome, ProviderError> {
        unreachable!("no single runs here")
    }
    async fn open_session(&self, _open: SessionOpen) -> Result<OpenedSession, ProviderError> {
        self.0.opened.fetch_add(1, Ordering::SeqCst);
        let open_ms = self.0.open_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(open_ms)).await;
        Ok(OpenedSession {
            sandbox: Box::new(Recording(Arc::clone(&self.0))),
            environment: String::new(),
            software_identity: String::new(),
            instance: String::new(),
        })
    }
}

fn table(config: SessionConfig, max_concurrent: u32) -> (Arc<Sessions>, Arc<Log>, Arc<Admission>) {
    let log = Arc::new(Log::default());
    let limits = Limits {
        max_concurrent,
        per_key_concurrent: 0,
        rate_per_min: 0,
        rate_burst: 0,
        total_memory_mb: 0,
        per_run_memory_mb: 256,
        clamped: false,
        paid_seconds_per_day: 0,
    };
    let admission = Admission::new(limits, Arc::new(Metrics::default()));
    let provider = Arc::new(FakeProvider(Arc::clone(&log)));
    (
        Sessions::new(config, provider, Arc::clone(&admission)),
        log,
        admission,
    )
}

fn config() -> SessionConfig {
    SessionConfig {
        max_sessions: 4,
        ..SessionConfig::default()
    }
}

async fn open(sessions: &Arc<Sessions>, owner: &str, idle: Duration) -> Arc<Entry> {
    open_for(sessions, owner, idle, Duration::from_secs(60)).await
}

async fn open_for(
    sessions: &Arc<Sessions>,
    owner: &str,
    idle: Duration,
    lifetime: Duration,
) -> Arc<Entry> {
    let id = hex::encode(rand::random::<[u8; 16]>());
    let terms = OpenTerms {
        caller: "c".to_owned(),
        owner: owner.to_owned(),
        lifetime,
        languages: Vec::new(),
        paid_allowance: None,
    };
    let expires_at = tokio::time::Instant::now() + terms.lifetime;
    sessions
        .open(terms, std::future::ready(None), |_| Stated {
            fingerprint: plimsoll::record::session_fingerprint(&id),
            id: id.clone(),
            caller: "c".to_owned(),
            owner: owner.to_owned(),
            sandbox: "fake",
            tier: IsolationTier::Container,
            environment: String::new(),
            software_identity: String::new(),
            instance: String::new(),
            policy: String::new(),
            rule: None,
            expires_unix_ms: 0,
            expires_at,
            idle,
        })
        .await
        .expect("open")
}

/// Lets spawned tasks run.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Waits up to 5 s for `done`.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what} did not happen within 5 s");
}

#[tokio::test(start_paused = true)]
async fn an_unclaimed_session_closes_at_its_first_idle_timeout_and_frees_its_slot() {
    let (sessions, log, admission) = table(config(), 4);
    let entry = open(&sessions, "", Duration::from_millis(200)).await;
    assert_eq!(admission.in_flight(), 1, "the session holds a slot");
    until("the unclaimed end", || admission.in_flight() == 0).await;
    let ended = entry.ended().expect("ended");
    assert_eq!(ended.reason, SessionEnd::SESSION_END_UNCLAIMED);
    assert_eq!(log.finished.load(Ordering::SeqCst), 1);
    assert_eq!(log.suspended.load(Ordering::SeqCst), 0);
    assert_eq!(admission.in_flight(), 0, "released after the removal");
}

#[tokio::test(start_paused = true)]
async fn a_claimed_idle_session_is_suspended_once_and_expires_at_its_lifetime() {
    let (sessions, log, _) = table(config(), 4);
    let entry = open_for(
        &sessions,
        "",
        Duration::from_millis(100),
        Duration::from_millis(900),
    )
    .await;
    entry.claim();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        log.suspended.load(Ordering::SeqCst),
        1,
        "suspended once, not again"
    );
    assert!(entry.ended().is_none());
    until("the expiry", || log.finished.load(Ordering::SeqCst) == 1).await;
    assert_eq!(
        entry.ended().map(|e| e.reason),
        Some(SessionEnd::SESSION_END_EXPIRED)
    );
    assert_eq!(log.finished.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn one_call_may_wait_for_the_turn_and_a_third_is_refused() {
    let (sessions, _, _) = table(config(), 4);
    let entry = open(&sessions, "", Duration::ZERO).await;
    let held = entry.take_turn().await.expect("first");
    let waiting = {
        let entry = Arc::clone(&entry);
        tokio::spawn(async move { entry.take_turn().await.map(drop) })
    };
    settle().await;
    assert!(matches!(
        entry.take_turn().await.map(drop),
        Err(Refusal::AtCapacity(_))
    ));
    drop(held);
    assert!(
        waiting.await.expect("task").is_ok(),
        "the waiter got the turn"
    );
}

#[tokio::test(start_paused = true)]
async fn the_owner_cap_replaces_the_idle_session_and_refuses_when_all_are_busy() {
    let caps = SessionConfig {
        per_owner: 1,
        ..config()
    };
    let (sessions, _, _) = table(caps, 4);
    let first = open(&sessions, "o", Duration::ZERO).await;
    let second = open(&sessions, "o", Duration::ZERO).await;
    settle().await;
    assert_eq!(
        first.ended().map(|e| e.reason),
        Some(SessionEnd::SESSION_END_REPLACED)
    );
    let _busy = second.take_turn().await.expect("turn");
    let third = refused_open(&sessions, "o").await;
    assert!(matches!(
        third,
        Err(ProviderError::Refused(Refusal::AtCapacity(_)))
    ));
}

#[tokio::test(start_paused = true)]
async fn the_drain_refuses_opens_and_removes_every_sandbox() {
    let (sessions, log, admission) = table(config(), 4);
    let a = open(&sessions, "", Duration::ZERO).await;
    let _b = open(&sessions, "", Duration::ZERO).await;
    sessions.drain(Duration::from_secs(5)).await;
    assert_eq!(log.finished.load(Ordering::SeqCst), 2);
    assert_eq!(admission.in_flight(), 0);
    assert_eq!(
        a.ended().map(|e| e.reason),
        Some(SessionEnd::SESSION_END_SHUTDOWN)
    );
    let refused = refused_open(&sessions, "").await;
    assert!(matches!(
        refused,
        Err(ProviderError::Refused(Refusal::AtCapacity(_)))
    ));
    assert_eq!(log.opened.load(Ordering::SeqCst), 2);
}

/// Opens `n` sessions for owner "" at once, each taking the provider 1 s.
fn slow_opens(
    sessions: &Arc<Sessions>,
    log: &Log,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Arc<Entry>>> {
    log.open_ms.store(1000, Ordering::SeqCst);
    (0..n)
        .map(|_| {
            let sessions = Arc::clone(sessions);
            tokio::spawn(async move { open(&sessions, "", Duration::ZERO).await })
        })
        .collect()
}

/// An open for `owner` that must be refused before the broker or the provider is asked.
fn refused_open(
    sessions: &Arc<Sessions>,
    owner: &str,
) -> impl Future<Output = Result<Arc<Entry>, ProviderError>> {
    sessions.open(
        OpenTerms {
            caller: "c".to_owned(),
            owner: owner.to_owned(),
            lifetime: Duration::from_secs(60),
            languages: Vec::new(),
            paid_allowance: None,
        },
        async { unreachable!("a refused open never asks the broker for a socket") },
        |_| unreachable!("refused before the provider is asked"),
    )
}

#[tokio::test(start_paused = true)]
async fn opens_run_side_by_side_and_the_caps_count_those_in_flight() {
    let caps = SessionConfig {
        max_sessions: 2,
        ..config()
    };
    let (sessions, log, admission) = table(caps, 4);
    let started = tokio::time::Instant::now();
    let opens = slow_opens(&sessions, &log, 2);
    settle().await;
    assert_eq!(
        log.opened.load(Ordering::SeqCst),
        2,
        "the second open reached the provider while the first was still opening"
    );
    assert_eq!(
        admission.in_flight(),
        2,
        "each open holds its slot from the start"
    );
    assert!(
        matches!(
            refused_open(&sessions, "").await,
            Err(ProviderError::Refused(Refusal::AtCapacity(_)))
        ),
        "the daemon's cap counts the opens in flight"
    );
    for open in opens {
        assert!(open.await.expect("task").ended().is_none());
    }
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "two 1 s opens took {:?}",
        started.elapsed()
    );
    assert_eq!(sessions.live(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_drain_waits_for_an_open_in_flight_and_ends_its_session() {
    let (sessions, log, admission) = table(config(), 4);
    let opens = slow_opens(&sessions, &log, 1);
    settle().await;
    sessions.drain(Duration::from_secs(5)).await;
    assert_eq!(
        log.finished.load(Ordering::SeqCst),
        1,
        "removed within the drain"
    );
    assert_eq!(admission.in_flight(), 0);
    for open in opens {
        let entry = open.await.expect("task");
        assert_eq!(
            entry.ended().map(|e| e.reason),
            Some(SessionEnd::SESSION_END_SHUTDOWN)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_open_landing_after_the_drain_gave_up_ends_its_own_session() {
    let (sessions, log, admission) = table(config(), 4);
    let opens = slow_opens(&sessions, &log, 1);
    settle().await;
    sessions.drain(Duration::from_millis(200)).await;
    assert_eq!(log.finished.load(Ordering::SeqCst), 0, "still opening");
    for open in opens {
        let entry = open.await.expect("task");
        assert_eq!(
            entry.ended().map(|e| e.reason),
            Some(SessionEnd::SESSION_END_SHUTDOWN)
        );
    }
    until("the removal", || log.finished.load(Ordering::SeqCst) == 1).await;
    assert_eq!(admission.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_replacement_never_ends_a_session_whose_turn_is_taken() {
    let (sessions, _, _) = table(config(), 4);
    let entry = open(&sessions, "o", Duration::ZERO).await;
    let turn = entry.take_turn().await.expect("turn");
    assert!(!entry.mark_ended_if_idle(SessionEnd::SESSION_END_REPLACED, "test"));
    assert!(entry.ended().is_none(), "the call's session lives on");
    drop(turn);
    assert!(entry.mark_ended_if_idle(SessionEnd::SESSION_END_REPLACED, "test"));
    assert!(matches!(
        entry.take_turn().await.map(drop),
        Err(Refusal::SessionEnded { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_resumed_session_whose_read_back_is_refused_is_suspended_again_and_frees_its_slot() {
    let (sessions, log, admission) = table(config(), 4);
    log.suspend_frees_slot.store(true, Ordering::SeqCst);
    let entry = open(&sessions, "", Duration::from_millis(100)).await;
    entry.claim();
    let suspends = || log.suspended.load(Ordering::SeqCst);
    until("the first suspend", || suspends() == 1).await;
    assert_eq!(admission.in_flight(), 0, "the suspend gave the slot back");
    log.refuse_read_back.store(true, Ordering::SeqCst);
    {
        let mut turn = entry.take_turn().await.expect("turn");
        let prepared = entry.prepare(&mut turn, &admission).await;
        assert!(matches!(prepared, Err(SessionFault::Refused(_))));
        assert_eq!(admission.in_flight(), 1, "the resumed sandbox holds a slot");
    }
    until("the second suspend", || suspends() == 2).await;
    assert_eq!(admission.in_flight(), 0, "the second suspend gave it back");
    assert!(
        entry.ended().is_none(),
        "a refused read-back keeps the session"
    );
}

/// A call longer than the idle timeout: the watcher waits for its end instead of retrying
/// the suspend. A watcher that retried would never let the paused clock move (a task is
/// always ready), so the scenario runs on its own thread under a wall-clock bound.
#[test]
fn a_call_longer_than_the_idle_timeout_leaves_the_watcher_waiting() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let (sessions, log, _) = table(config(), 4);
            let entry = open(&sessions, "", Duration::from_millis(100)).await;
            entry.claim();
            let turn = entry.take_turn().await.expect("turn");
            tokio::time::sleep(Duration::from_secs(30)).await;
            assert_eq!(log.suspended.load(Ordering::SeqCst), 0, "not while it runs");
            drop(turn);
            until("the suspend after the call", || {
                log.suspended.load(Ordering::SeqCst) == 1
            })
            .await;
        });
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("the paused clock moved through the call: the watcher waited");
}
