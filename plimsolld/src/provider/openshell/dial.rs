//! The daemon's side of the relay (grants.md §8.7): start `plimsoll-relay` in the sandbox,
//! read what it prints as untrusted, and dial one connection into it through the gateway's
//! `ForwardTcp` for each `need`, joined with a fresh connection to the run's broker socket.
//!
//! Everything the relay prints can be forged by the guest, so every resource it can make the
//! daemon spend is bounded here: a 64-byte line buffer ([`super::lines`]), a need counter
//! that saturates, 18 fixed workers (never a task per line), at most 3 live streams per
//! SSH-session token (the gateway's own limit) with token creation serialized, and a shared
//! back-off (100 ms doubling to 6.4 s) after a refused stream or a dial that carried nothing.
//!
//! One spare stream is dialled ahead of any `need` and parked in the relay (which pairs a
//! guest with a parked dial at once, printing nothing): a guest's connection then costs no
//! gateway round trip and no in-sandbox dial. The spare reaches the broker only once the
//! guest's first bytes arrive, and its use dials the next spare; so at most one stream more
//! than the needs is ever open, and a guest cannot make it more.
//! [`Relay::close`] ends it all: the workers and every connection, then every token revoked
//! (a token can also open an SSH session into the sandbox, so none outlives the run), then
//! the relay itself.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

use super::exec::start_frame;
use super::gateway::{Gateway, GatewayError, WORKSPACE};
use super::lines::{Lines, Word};
use super::proto::v1::exec_sandbox_event::Payload as Event;
use super::proto::v1::tcp_forward_frame::Payload as Frame;
use super::proto::v1::tcp_forward_init::Target;
use super::proto::v1::{
    ExecSandboxEvent, ExecSandboxInput, TcpForwardFrame, TcpForwardInit, TcpRelayTarget,
};

/// The relay binary in the image (the same binary serves the sandbox's cells).
pub const RELAY_BINARY: &str = crate::provider::guest::cell::RELAY_BINARY;
/// How long the relay may take to say `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How many ports are tried when one is taken.
const PORT_ATTEMPTS: usize = 3;
/// The fixed number of workers that dial.
pub const WORKERS: usize = 18;
/// The most live streams per SSH-session token (the gateway allows 3).
pub const PER_TOKEN: u32 = 3;
/// The most needs counted at once (the relay lets at most 256 guests wait).
const MAX_NEEDS: u32 = 256;
/// The back-off's first and longest pauses.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_millis(6_400);
/// The largest data frame sent (the gateway takes up to 64 KiB; plimsoll sends less).
const CHUNK: usize = 32 * 1024;
/// How long a stream may linger after one side ended before it is cancelled.
const LINGER: Duration = Duration::from_secs(2);
/// The bound on revoking a run's tokens.
const REVOKE_BOUND: Duration = Duration::from_secs(10);
/// How long a relay exec may live at most (the run's deadline ends it first).
const RELAY_LIFETIME: Duration = Duration::from_secs(13 * 3600);

/// Why the relay could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The gateway refused the relay's exec.
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    /// It exited (or its stream ended) before saying `ready`.
    #[error("the relay exited before it was ready (exit {exit:?})")]
    Exited { exit: Option<i32> },
    /// It did not say `ready` in time.
    #[error("the relay did not say ready within {READY_TIMEOUT:?}")]
    NotReady,
    /// The granted run's grant came without a socket to relay (openshell asks for socket
    /// delivery; anything else is a broker fault, refused before anything runs).
    #[error("the grant broker gave the run no socket to relay; nothing ran")]
    GrantNotASocket,
}

/// What the relay and its dials tally, for the log and the tests.
#[derive(Debug, Default)]
pub struct Counts {
    /// `need` words read.
    pub needs: AtomicU32,
    /// Streams opened.
    pub dials: AtomicU32,
    /// Streams that carried data.
    pub carried: AtomicU32,
    /// Streams refused, or that carried nothing.
    pub failed: AtomicU32,
    /// Tokens made.
    pub tokens: AtomicU32,
}

// === impl Needs ===

/// The need counter the workers serve: saturating, so a flood costs nothing.
#[derive(Default)]
struct Needs {
    count: Mutex<u32>,
    added: Notify,
}

impl Needs {
    fn add(&self) {
        let mut n = self.count.lock().unwrap_or_else(|e| e.into_inner());
        *n = (*n + 1).min(MAX_NEEDS);
        drop(n);
        self.added.notify_one();
    }

    async fn take(&self) {
        loop {
            let notified = self.added.notified();
            {
                let mut n = self.count.lock().unwrap_or_else(|e| e.into_inner());
                if *n > 0 {
                    *n -= 1;
                    return;
                }
            }
            notified.await;
        }
    }
}

// === impl Backoff ===

/// The pause every worker keeps after a failure.
#[derive(Default)]
struct Backoff {
    state: Mutex<(Duration, Option<tokio::time::Instant>)>,
}

impl Backoff {
    fn fail(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let next = if s.0.is_zero() {
            BACKOFF_FIRST
        } else {
            (s.0 * 2).min(BACKOFF_MAX)
        };
        *s = (next, Some(tokio::time::Instant::now() + next));
    }

    fn reset(&self) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = (Duration::ZERO, None);
    }

    async fn wait(&self) {
        let until = self.state.lock().unwrap_or_else(|e| e.into_inner()).1;
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
    }
}

// === impl Tokens ===

/// A run's SSH-session tokens, each with the streams it carries.
struct Tokens {
    gateway: Gateway,
    sandbox: String,
    slots: Mutex<Vec<TokenSlot>>,
    /// Serializes token creation; the close takes it to wait for a creation in flight.
    creating: tokio::sync::Mutex<()>,
    /// Set by the close: no token is made after it.
    closing: std::sync::atomic::AtomicBool,
    counts: Arc<Counts>,
}

/// Why a stream got no token.
#[derive(Debug, thiserror::Error)]
enum ClaimError {
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    #[error("the relay is closing")]
    Closing,
}

struct TokenSlot {
    token: String,
    live: u32,
    dropped: bool,
}

impl Tokens {
    fn free(&self) -> Option<String> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slots
            .iter_mut()
            .find(|s| !s.dropped && s.live < PER_TOKEN)?;
        slot.live += 1;
        Some(slot.token.clone())
    }

    /// A token with room for one more stream (made when none has room). The making runs in
    /// a task of its own, holding `creating`: a worker aborted while the gateway answers (the
    /// relay closing) cannot lose a token the gateway made, and the close waits for it before
    /// it revokes them all (grants.md §8.7: every token is revoked).
    async fn claim(self: &Arc<Self>) -> Result<String, ClaimError> {
        if let Some(token) = self.free() {
            return Ok(token);
        }
        let tokens = Arc::clone(self);
        let making = tokio::spawn(async move {
            let _one_at_a_time = tokens.creating.lock().await;
            if tokens.closing.load(Ordering::SeqCst) {
                return Err(ClaimError::Closing);
            }
            if let Some(token) = tokens.free() {
                return Ok(token);
            }
            let made = tokens.gateway.create_ssh_session(&tokens.sandbox).await?;
            tokens.counts.tokens.fetch_add(1, Ordering::Relaxed);
            let mut slots = tokens.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.push(TokenSlot {
                token: made.token.clone(),
                live: 1,
                dropped: false,
            });
            Ok(made.token)
        });
        making.await.unwrap_or(Err(ClaimError::Closing))
    }

    /// Stops token making and waits for one in flight, so that [`Tokens::revoke_all`] after
    /// it sees every token the gateway made.
    async fn stop_making(&self) {
        self.closing.store(true, Ordering::SeqCst);
        drop(self.creating.lock().await);
    }

    /// A stream of `token` ended (the gateway counts it no more).
    fn release(&self, token: &str) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = slots.iter_mut().find(|s| s.token == token) {
            slot.live = slot.live.saturating_sub(1);
        }
    }

    /// The gateway refused `token`: it is not used again (a new one replaces it).
    fn drop_token(&self, token: &str) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = slots.iter_mut().find(|s| s.token == token) {
            slot.dropped = true;
        }
    }

    /// Revokes every token ever made, side by side (one slow revoke does not spend the
    /// others' time), within [`REVOKE_BOUND`]; answers how many were not confirmed.
    async fn revoke_all(&self) -> usize {
        let tokens: Vec<String> = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|s| s.token.clone())
            .collect();
        let revokes = tokens.iter().map(|token| async move {
            let revoked = self.gateway.revoke_ssh_session(token).await;
            if let Err(e) = &revoked {
                tracing::warn!(sandbox = %self.sandbox, error = %e, "could not revoke an SSH-session token");
            }
            revoked.is_ok()
        });
        let all = futures::future::join_all(revokes);
        match tokio::time::timeout(REVOKE_BOUND, all).await {
            Ok(revoked) => revoked.iter().filter(|ok| !**ok).count(),
            Err(_) => tokens.len(),
        }
    }
}

// === impl Relay ===

/// A run's relay: started, its output read, its dials served, until [`Relay::close`].
pub struct Relay {
    /// Where the guest finds it (`HOST_API_SOCKET`).
    pub socket: String,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
    tokens: Arc<Tokens>,
    /// Keeps the relay's stdin open; dropped at the end.
    stdin: Option<mpsc::Sender<ExecSandboxInput>>,
    counts: Arc<Counts>,
    closed: bool,
}

/// What one relay start produced.
struct Started {
    port: u16,
    socket: String,
    events: Streaming<ExecSandboxEvent>,
    stdin: mpsc::Sender<ExecSandboxInput>,
    lines: Lines,
}

/// Starts the relay in `sandbox` and serves its needs from `broker` (the run's socket on the
/// host) until [`Relay::close`].
pub async fn start(gateway: &Gateway, sandbox: &str, broker: PathBuf) -> Result<Relay, RelayError> {
    let counts = Arc::new(Counts::default());
    let mut last = RelayError::NotReady;
    let mut started = None;
    for _ in 0..PORT_ATTEMPTS {
        match launch(gateway, sandbox).await {
            Ok(s) => {
                started = Some(s);
                break;
            }
            // A port some guest process holds: another port.
            Err(RelayError::Exited {
                exit: Some(relay::protocol::EXIT_CANNOT_LISTEN),
            }) => {
                last = RelayError::Exited {
                    exit: Some(relay::protocol::EXIT_CANNOT_LISTEN),
                }
            }
            Err(e) => return Err(e),
        }
    }
    let Some(Started {
        port,
        socket,
        events,
        stdin,
        lines,
    }) = started
    else {
        return Err(last);
    };
    let needs = Arc::new(Needs::default());
    let backoff = Arc::new(Backoff::default());
    let tokens = Arc::new(Tokens {
        gateway: gateway.clone(),
        sandbox: sandbox.to_owned(),
        slots: Mutex::new(Vec::new()),
        creating: tokio::sync::Mutex::new(()),
        closing: std::sync::atomic::AtomicBool::new(false),
        counts: Arc::clone(&counts),
    });
    let spares = Arc::new(Needs::default());
    spares.add();
    let (stop, stopped) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tasks.spawn(listen(
        events,
        lines,
        Arc::clone(&needs),
        Arc::clone(&counts),
        sandbox.to_owned(),
    ));
    for _ in 0..WORKERS {
        tasks.spawn(work(Worker {
            gateway: gateway.clone(),
            sandbox: sandbox.to_owned(),
            port,
            broker: broker.clone(),
            needs: Arc::clone(&needs),
            spares: Arc::clone(&spares),
            backoff: Arc::clone(&backoff),
            tokens: Arc::clone(&tokens),
            counts: Arc::clone(&counts),
            stopped: stopped.clone(),
        }));
    }
    Ok(Relay {
        socket,
        stop,
        tasks,
        tokens,
        stdin: Some(stdin),
        counts,
        closed: false,
    })
}

/// One attempt: a fresh port and socket name, the exec, and its `ready`.
async fn launch(gateway: &Gateway, sandbox: &str) -> Result<Started, RelayError> {
    let port = 20_000 + rand::random::<u16>() % 40_000;
    let socket = format!(
        "/tmp/.plimsoll-host-{}.sock",
        hex::encode(rand::random::<[u8; 6]>())
    );
    let argv = vec![RELAY_BINARY.to_owned(), port.to_string(), socket.clone()];
    let (stdin, rx) = mpsc::channel(1);
    stdin
        .send(start_frame(sandbox, argv, BTreeMap::new(), RELAY_LIFETIME))
        .await
        .map_err(|_| RelayError::Exited { exit: None })?;
    let mut events = gateway.exec(ReceiverStream::new(rx)).await?;
    let mut lines = Lines::default();
    let wait = async {
        loop {
            let event = match events.message().await {
                Ok(Some(event)) => event,
                Ok(None) | Err(_) => return Err(RelayError::Exited { exit: None }),
            };
            match event.payload {
                Some(Event::Stdout(out)) => {
                    let mut ready = false;
                    lines.feed(&out.data, |w| match w {
                        Word::Ready => ready = true,
                        // A need before ready: a guest cannot connect yet; ignored.
                        Word::Need => {}
                    });
                    if ready {
                        return Ok(());
                    }
                }
                Some(Event::Exit(x)) => {
                    return Err(RelayError::Exited {
                        exit: Some(x.exit_code),
                    });
                }
                Some(Event::Stderr(_)) | None => {}
            }
        }
    };
    match tokio::time::timeout(READY_TIMEOUT, wait).await {
        Ok(Ok(())) => Ok(Started {
            port,
            socket,
            events,
            stdin,
            lines,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(RelayError::NotReady),
    }
}

/// Reads the relay's output for the rest of its life: each `need` is one more dial.
async fn listen(
    mut events: Streaming<ExecSandboxEvent>,
    mut lines: Lines,
    needs: Arc<Needs>,
    counts: Arc<Counts>,
    sandbox: String,
) {
    loop {
        match events.message().await {
            Ok(Some(ExecSandboxEvent {
                payload: Some(Event::Stdout(out)),
            })) => lines.feed(&out.data, |w| {
                if w == Word::Need {
                    counts.needs.fetch_add(1, Ordering::Relaxed);
                    needs.add();
                }
            }),
            Ok(Some(ExecSandboxEvent {
                payload: Some(Event::Exit(x)),
            })) => {
                tracing::warn!(%sandbox, exit_code = x.exit_code, "the relay exited; granted calls fail from here");
                return;
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return,
        }
    }
}

/// One worker's share of the dialling.
struct Worker {
    gateway: Gateway,
    sandbox: String,
    port: u16,
    broker: PathBuf,
    needs: Arc<Needs>,
    /// Wants one spare stream (at most one at a time: see the module's comment).
    spares: Arc<Needs>,
    backoff: Arc<Backoff>,
    tokens: Arc<Tokens>,
    counts: Arc<Counts>,
    stopped: watch::Receiver<bool>,
}

async fn work(mut w: Worker) {
    let mut stopped = w.stopped.clone();
    loop {
        let spare = tokio::select! {
            _ = stopped.wait_for(|s| *s) => return,
            () = w.needs.take() => false,
            () = w.spares.take() => true,
        };
        w.backoff.wait().await;
        let dialled = dial(&mut w, spare).await;
        if dialled == Dialled::Carried {
            w.counts.carried.fetch_add(1, Ordering::Relaxed);
            w.backoff.reset();
            continue;
        }
        // Refused, or nothing passed: every worker pauses, and the need (or the spare) comes
        // back, unless a used spare already asked for the next one.
        w.counts.failed.fetch_add(1, Ordering::Relaxed);
        match (dialled, spare) {
            (Dialled::NothingNextAsked, _) => {}
            (_, true) => w.spares.add(),
            (_, false) => w.needs.add(),
        }
        w.backoff.fail();
    }
}

/// How one dial went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialled {
    /// Bytes passed.
    Carried,
    /// The stream could not be opened, or nothing passed.
    Nothing,
    /// A spare got its guest's first bytes (and so asked for the next spare) but nothing
    /// reached the broker.
    NothingNextAsked,
}

/// Opens one stream into the relay and joins it with a broker connection. A `spare` waits
/// parked for its guest's first bytes before it reaches the broker, and then asks for the
/// next spare.
async fn dial(w: &mut Worker, spare: bool) -> Dialled {
    let token = match w.tokens.claim().await {
        Ok(token) => token,
        Err(e) => {
            tracing::debug!(sandbox = %w.sandbox, error = %e, "no SSH-session token");
            return Dialled::Nothing;
        }
    };
    let (tx, rx) = mpsc::channel::<TcpForwardFrame>(4);
    let init = TcpForwardFrame {
        payload: Some(Frame::Init(TcpForwardInit {
            sandbox: w.sandbox.clone(),
            workspace: WORKSPACE.to_owned(),
            service_id: String::new(),
            target: Some(Target::Tcp(TcpRelayTarget {
                host: "127.0.0.1".to_owned(),
                port: u32::from(w.port),
            })),
            authorization_token: token.clone(),
        })),
    };
    if tx.send(init).await.is_err() {
        w.tokens.release(&token);
        return Dialled::Nothing;
    }
    let inbound = match w.gateway.forward_tcp(ReceiverStream::new(rx)).await {
        Ok(inbound) => inbound,
        Err(e) => {
            if matches!(
                e.code(),
                Some(Code::Unauthenticated | Code::PermissionDenied)
            ) {
                w.tokens.drop_token(&token);
            }
            w.tokens.release(&token);
            tracing::debug!(sandbox = %w.sandbox, error = %e, "ForwardTcp refused");
            return Dialled::Nothing;
        }
    };
    w.counts.dials.fetch_add(1, Ordering::Relaxed);
    let mut inbound = inbound;
    let first = if spare {
        match first_data(&mut inbound, w.stopped.clone()).await {
            Some(first) => {
                w.spares.add();
                first
            }
            None => {
                w.tokens.release(&token);
                return Dialled::Nothing;
            }
        }
    } else {
        Vec::new()
    };
    let carried = match UnixStream::connect(&w.broker).await {
        Ok(mut conn) => {
            if !first.is_empty() && conn.write_all(&first).await.is_err() {
                false
            } else {
                join(conn, tx, inbound, w.stopped.clone()).await || !first.is_empty()
            }
        }
        Err(e) => {
            tracing::warn!(broker = %w.broker.display(), error = %e, "cannot reach the run's broker socket");
            false
        }
    };
    // The stream is over for the gateway once `join` returned: give its room back.
    w.tokens.release(&token);
    match (carried, first.is_empty()) {
        (true, _) => Dialled::Carried,
        (false, true) => Dialled::Nothing,
        (false, false) => Dialled::NothingNextAsked,
    }
}

/// A parked spare's first bytes from the guest; `None` when the stream ended first or the run
/// stopped.
async fn first_data(
    inbound: &mut Streaming<TcpForwardFrame>,
    mut stopped: watch::Receiver<bool>,
) -> Option<Vec<u8>> {
    loop {
        tokio::select! {
            _ = stopped.wait_for(|s| *s) => return None,
            message = inbound.message() => match message {
                Ok(Some(TcpForwardFrame { payload: Some(Frame::Data(data)) })) if !data.is_empty() => {
                    return Some(data);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return None,
            },
        }
    }
}

/// Copies between the broker connection and the stream until both directions end (or the
/// run stops); answers whether any byte passed.
async fn join(
    conn: UnixStream,
    tx: mpsc::Sender<TcpForwardFrame>,
    mut inbound: Streaming<TcpForwardFrame>,
    mut stopped: watch::Receiver<bool>,
) -> bool {
    let (mut from_broker, mut to_broker) = conn.into_split();
    let carried = AtomicU32::new(0);
    let up = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from_broker.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    carried.fetch_add(1, Ordering::Relaxed);
                    let frame = TcpForwardFrame {
                        payload: Some(Frame::Data(buf[..n].to_vec())),
                    };
                    if tx.send(frame).await.is_err() {
                        break;
                    }
                }
            }
        }
        // The broker is done: half-close toward the sandbox.
        drop(tx);
    };
    let down = async {
        loop {
            match inbound.message().await {
                Ok(Some(TcpForwardFrame {
                    payload: Some(Frame::Data(data)),
                })) => {
                    if data.is_empty() {
                        continue;
                    }
                    carried.fetch_add(1, Ordering::Relaxed);
                    if to_broker.write_all(&data).await.is_err() {
                        break;
                    }
                }
                Ok(Some(_)) => {}
                // The gateway ended the stream: the sandbox side is done.
                Ok(None) | Err(_) => break,
            }
        }
        let _ = to_broker.shutdown().await;
    };
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    loop {
        tokio::select! {
            () = &mut up, if !up_done => up_done = true,
            () = &mut down, if !down_done => down_done = true,
            _ = stopped.wait_for(|s| *s) => break,
        }
        if up_done && down_done {
            break;
        }
        // One side ended: the other gets a little longer, then the stream is cancelled.
        if up_done || down_done {
            let rest = async {
                if up_done {
                    (&mut down).await
                } else {
                    (&mut up).await
                }
            };
            let _ = tokio::time::timeout(LINGER, rest).await;
            break;
        }
    }
    carried.load(Ordering::Relaxed) > 0
}

impl Relay {
    /// What the relay and its dials tallied so far.
    #[allow(dead_code)] // for sessions on openshell (issue 17, item 2)
    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Ends the relay (grants.md §8.7 step 6): the workers and every connection first, then
    /// every token revoked, then the relay's exec cancelled.
    pub async fn close(mut self) {
        self.closed = true;
        self.stop.send_replace(true);
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        self.tokens.stop_making().await;
        let failed = self.tokens.revoke_all().await;
        drop(self.stdin.take());
        let c = &self.counts;
        tracing::debug!(
            sandbox = %self.tokens.sandbox,
            needs = c.needs.load(Ordering::Relaxed),
            dials = c.dials.load(Ordering::Relaxed),
            carried = c.carried.load(Ordering::Relaxed),
            failed = c.failed.load(Ordering::Relaxed),
            tokens = c.tokens.load(Ordering::Relaxed),
            revoke_failed = failed,
            "relay closed"
        );
    }
}

impl Drop for Relay {
    /// A relay dropped without [`Relay::close`] still stops and revokes, in the background.
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        self.stop.send_replace(true);
        self.tasks.abort_all();
        let tokens = Arc::clone(&self.tokens);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                tokens.stop_making().await;
                tokens.revoke_all().await;
            });
        }
    }
}
