//! plimsolld's side of the control channel.
//!
//! A [`Client`] keeps a bounded pool of connections (at most [`POOL_SIZE`], or the size
//! given to [`Client::with_pool_size`]) and reuses them: one request line out, one response
//! line back, then the connection goes back to the pool. A call that finds every connection
//! busy waits up to [`POOL_WAIT`] for one (back-pressure, never a new connection past the
//! bound) and then fails with [`ControlError::Busy`]. A connection that failed is dropped,
//! never reused; one left idle longer than [`IDLE_KEEP`] is closed rather than reused (the
//! broker closes idle ones after a minute). A call on a reused connection that the broker
//! had already closed is retried once on a fresh one. Every call, its connect included, is
//! bounded by [`CALL_TIMEOUT`].
//!
//! Clones share the pool. This is the transport only: the messages are `protocol`'s.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::Semaphore;

use super::protocol::{
    Catalogue, Hello, MAX_LINE_BYTES, OpenRun, OpenSession, Refusal, Request, Response, RunGrant,
    RunSummary, SessionSlot,
};

/// Bound on one control call, connection included (waiting for the pool is not).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections a [`Client`] (and its clones) keeps at most, by default.
pub const POOL_SIZE: usize = 16;
/// How long a call waits for a pooled connection before [`ControlError::Busy`].
pub const POOL_WAIT: Duration = Duration::from_secs(2);
/// An idle connection older than this is closed instead of reused.
pub const IDLE_KEEP: Duration = Duration::from_secs(30);

/// Why a control call failed (as opposed to being refused by the broker's policy).
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket could not be reached: the broker is down or the path is wrong.
    #[error("broker control socket {path}: connect failed: {source}")]
    Connect {
        /// The control socket's path.
        path: PathBuf,
        /// What the connect returned.
        #[source]
        source: std::io::Error,
    },
    /// Writing the request or reading the response failed.
    #[error("broker control socket {path}: {source}")]
    Io {
        /// The control socket's path.
        path: PathBuf,
        /// The I/O failure.
        #[source]
        source: std::io::Error,
    },
    /// The call did not finish within [`CALL_TIMEOUT`].
    #[error("broker control socket {path}: no answer within {CALL_TIMEOUT:?}")]
    Timeout {
        /// The control socket's path.
        path: PathBuf,
    },
    /// The broker closed the connection without answering.
    #[error("broker control socket {path}: closed without an answer")]
    Closed {
        /// The control socket's path.
        path: PathBuf,
    },
    /// The answer was not a valid response line, or not one that fits the request.
    #[error("broker control socket {path}: bad reply: {detail}")]
    BadReply {
        /// The control socket's path.
        path: PathBuf,
        /// What was wrong with it.
        detail: String,
    },
    /// The broker refused a request that has no refusal in its result type (hello, close, close_session).
    #[error("broker refused: {}", .0.message)]
    Refused(Refusal),
    /// Every pooled connection stayed busy for [`POOL_WAIT`].
    #[error("broker control socket {path}: all {size} connections busy for {POOL_WAIT:?}")]
    Busy {
        /// The control socket's path.
        path: PathBuf,
        /// The pool's size.
        size: usize,
    },
}

/// A handle on the broker's control socket with its pool of connections. Cheap to clone;
/// clones share the pool.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    pool: Arc<Pool>,
}

/// The connections of a [`Client`] and its clones.
#[derive(Debug)]
struct Pool {
    size: usize,
    /// One permit per connection that may exist; a call holds one throughout.
    turns: Semaphore,
    idle: Mutex<Vec<Idle>>,
}

/// A connection back in the pool, and since when.
#[derive(Debug)]
struct Idle {
    stream: BufReader<UnixStream>,
    since: Instant,
}

/// How one exchange on a connection failed.
enum Failed {
    /// The broker closed the connection before any byte of an answer: on a reused
    /// connection, it had closed it while idle, and nothing of the request was handled.
    ClosedUnanswered(ControlError),
    /// Anything else.
    Other(ControlError),
}

// === impl Client ===

impl Client {
    /// A client for the control socket at `socket` with a pool of [`POOL_SIZE`]
    /// connections (nothing is connected yet).
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self::with_pool_size(socket, POOL_SIZE)
    }

    /// A client whose pool holds at most `size` connections (at least 1).
    pub fn with_pool_size(socket: impl Into<PathBuf>, size: usize) -> Self {
        let size = size.max(1);
        Self {
            socket: socket.into(),
            pool: Arc::new(Pool {
                size,
                turns: Semaphore::new(size),
                idle: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The control socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Asks the broker who it is: version, registry generation, profile count.
    pub async fn hello(&self) -> Result<Hello, ControlError> {
        match self.call(&Request::Hello).await? {
            Response::Hello(hello) => Ok(hello),
            Response::Refused(refusal) => Err(ControlError::Refused(refusal)),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The broker's current catalogue of profiles (no credential in it).
    pub async fn catalogue(&self) -> Result<Catalogue, ControlError> {
        match self.call(&Request::Catalogue).await? {
            Response::Catalogue(catalogue) => Ok(catalogue),
            Response::Refused(refusal) => Err(ControlError::Refused(refusal)),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Opens a run's grant. The inner `Err` is the broker's policy refusal, to be passed to
    /// the caller as a not-dispatched refusal; the outer one is a broken channel.
    pub async fn open(&self, run: &OpenRun) -> Result<Result<RunGrant, Refusal>, ControlError> {
        match self.call(&Request::Open(run.clone())).await? {
            Response::Opened(grant) => Ok(Ok(grant)),
            Response::Refused(refusal) => Ok(Err(refusal)),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Closes a run's grant and returns its counts. Closing an unknown run is
    /// [`ControlError::Refused`].
    pub async fn close(&self, run: &str) -> Result<RunSummary, ControlError> {
        let request = Request::Close {
            run: run.to_owned(),
        };
        match self.call(&request).await? {
            Response::Closed(summary) => Ok(summary),
            Response::Refused(refusal) => Err(ControlError::Refused(refusal)),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Opens a session's slot. The inner `Err` is the broker's policy refusal; the outer one
    /// is a broken channel.
    pub async fn open_session(
        &self,
        req: &OpenSession,
    ) -> Result<Result<SessionSlot, Refusal>, ControlError> {
        match self.call(&Request::OpenSession(req.clone())).await? {
            Response::SessionOpened(slot) => Ok(Ok(slot)),
            Response::Refused(refusal) => Ok(Err(refusal)),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Closes a session's slot (and a grant still lent to it). Closing an unknown session is
    /// [`ControlError::Refused`].
    pub async fn close_session(&self, session: &str) -> Result<(), ControlError> {
        let request = Request::CloseSession {
            session: session.to_owned(),
        };
        match self.call(&request).await? {
            Response::SessionClosed => Ok(()),
            Response::Refused(refusal) => Err(ControlError::Refused(refusal)),
            other => Err(self.unexpected(&other)),
        }
    }

    fn unexpected(&self, response: &Response) -> ControlError {
        let kind = match response {
            Response::Hello(_) => "hello",
            Response::Catalogue(_) => "catalogue",
            Response::Opened(_) => "opened",
            Response::Closed(_) => "closed",
            Response::SessionOpened(_) => "session_opened",
            Response::SessionClosed => "session_closed",
            Response::Refused(_) => "refused",
        };
        ControlError::BadReply {
            path: self.socket.clone(),
            detail: format!("unexpected {kind} answer"),
        }
    }

    /// One request and its answer: a turn in the pool (waiting up to [`POOL_WAIT`]), then a
    /// pooled or fresh connection, within [`CALL_TIMEOUT`].
    async fn call(&self, request: &Request) -> Result<Response, ControlError> {
        let busy = || ControlError::Busy {
            path: self.socket.clone(),
            size: self.pool.size,
        };
        let turn = tokio::time::timeout(POOL_WAIT, self.pool.turns.acquire())
            .await
            .map_err(|_| busy())?
            .map_err(|_| busy())?;
        let mut line = serde_json::to_vec(request).map_err(|e| ControlError::BadReply {
            path: self.socket.clone(),
            detail: format!("request not encodable: {e}"),
        })?;
        line.push(b'\n');
        let answer = tokio::time::timeout(CALL_TIMEOUT, self.exchange_pooled(&line)).await;
        drop(turn);
        answer.unwrap_or_else(|_| {
            Err(ControlError::Timeout {
                path: self.socket.clone(),
            })
        })
    }

    /// The exchange on an idle connection if there is one, retried once on a fresh one when
    /// the broker had closed the idle one; otherwise on a fresh connection.
    async fn exchange_pooled(&self, line: &[u8]) -> Result<Response, ControlError> {
        if let Some(mut stream) = self.pool.take_idle() {
            match self.exchange(&mut stream, line).await {
                Ok(response) => {
                    self.pool.put_back(stream);
                    return Ok(response);
                }
                Err(Failed::ClosedUnanswered(_)) => {}
                Err(Failed::Other(e)) => return Err(e),
            }
        }
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| ControlError::Connect {
                    path: self.socket.clone(),
                    source,
                })?;
        let mut stream = BufReader::new(stream);
        match self.exchange(&mut stream, line).await {
            Ok(response) => {
                self.pool.put_back(stream);
                Ok(response)
            }
            Err(Failed::ClosedUnanswered(e) | Failed::Other(e)) => Err(e),
        }
    }

    /// Writes `line` and reads one answer line on `stream`.
    async fn exchange(
        &self,
        stream: &mut BufReader<UnixStream>,
        line: &[u8],
    ) -> Result<Response, Failed> {
        let unanswered = |source: std::io::Error| {
            let error = ControlError::Io {
                path: self.socket.clone(),
                source,
            };
            Failed::ClosedUnanswered(error)
        };
        stream.get_mut().write_all(line).await.map_err(unanswered)?;
        stream.get_mut().flush().await.map_err(unanswered)?;
        let mut answer = Vec::new();
        let mut limited = (&mut *stream).take(MAX_LINE_BYTES as u64 + 1);
        limited
            .read_until(b'\n', &mut answer)
            .await
            .map_err(|source| {
                if answer.is_empty() {
                    unanswered(source)
                } else {
                    Failed::Other(ControlError::Io {
                        path: self.socket.clone(),
                        source,
                    })
                }
            })?;
        if answer.is_empty() {
            return Err(Failed::ClosedUnanswered(ControlError::Closed {
                path: self.socket.clone(),
            }));
        }
        if answer.pop() != Some(b'\n') {
            return Err(Failed::Other(ControlError::BadReply {
                path: self.socket.clone(),
                detail: "answer line unterminated or too long".into(),
            }));
        }
        serde_json::from_slice(&answer).map_err(|e| {
            Failed::Other(ControlError::BadReply {
                path: self.socket.clone(),
                detail: e.to_string(),
            })
        })
    }
}

// === impl Pool ===

impl Pool {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // Pushes and pops only: a poisoned list is still a list of usable connections.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently used idle connection not older than [`IDLE_KEEP`]; older ones are
    /// closed on the way.
    fn take_idle(&self) -> Option<BufReader<UnixStream>> {
        let mut idle = self.idle();
        while let Some(conn) = idle.pop() {
            if conn.since.elapsed() < IDLE_KEEP {
                return Some(conn.stream);
            }
        }
        None
    }

    /// Puts a connection that just answered back (never more than the pool's size).
    fn put_back(&self, stream: BufReader<UnixStream>) {
        let mut idle = self.idle();
        if idle.len() < self.size {
            idle.push(Idle {
                stream,
                since: Instant::now(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::UnixListener;

    /// A fake broker that answers `hello` on every line, counting the connections it got.
    async fn answering(path: &Path) -> Arc<std::sync::atomic::AtomicUsize> {
        let listener = UnixListener::bind(path).unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut lines = BufReader::new(read).lines();
                    while let Ok(Some(_)) = lines.next_line().await {
                        // Slow enough that concurrent calls overlap.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let hello = r#"{"status":"hello","version":4,"generation":1,"profiles":0,"guard":false,"in_flight":0,"catalogue":""}"#;
                        if write
                            .write_all(format!("{hello}\n").as_bytes())
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        accepted
    }

    #[tokio::test]
    async fn calls_reuse_at_most_the_pools_connections() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let accepted = answering(&path).await;
        let client = Client::with_pool_size(&path, 3);
        let calls = (0..30).map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.hello().await.map(|h| h.version) })
        });
        for call in calls {
            assert_eq!(call.await.unwrap().unwrap(), 4);
        }
        let n = accepted.load(std::sync::atomic::Ordering::SeqCst);
        assert!((1..=3).contains(&n), "{n} connections for 30 calls");
    }

    #[tokio::test]
    async fn a_busy_pool_makes_a_call_wait_then_fail_busy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        // Accepts and never answers: every call holds its turn until its own timeout.
        let listener = UnixListener::bind(&path).unwrap();
        let _held = tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                kept.push(stream);
            }
        });
        let client = Client::with_pool_size(&path, 1);
        let first = tokio::spawn({
            let client = client.clone();
            async move { client.hello().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = Instant::now();
        let second = client.hello().await;
        assert!(
            matches!(second, Err(ControlError::Busy { size: 1, .. })),
            "{second:?}"
        );
        assert!(started.elapsed() >= POOL_WAIT, "{:?}", started.elapsed());
        assert!(matches!(
            first.await.unwrap(),
            Err(ControlError::Timeout { .. })
        ));
    }

    #[tokio::test]
    async fn a_pooled_connection_the_broker_closed_is_replaced_unseen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        // Answers one line per connection, then hangs up.
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                if let Ok(Some(_)) = lines.next_line().await {
                    let hello = r#"{"status":"hello","version":4,"generation":7,"profiles":0,"guard":false,"in_flight":0,"catalogue":""}"#;
                    let _ = write.write_all(format!("{hello}\n").as_bytes()).await;
                }
            }
        });
        let client = Client::with_pool_size(&path, 1);
        for _ in 0..3 {
            assert_eq!(client.hello().await.unwrap().generation, 7);
        }
    }
}
