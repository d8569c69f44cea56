//! plimsolld's side of the control channel.
//!
//! Each call opens its own connection, writes one request line, reads one response line and
//! closes: simple, and a broker that restarts between calls costs nothing. Every call is
//! bounded by [`CALL_TIMEOUT`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::protocol::{
    Hello, MAX_LINE_BYTES, OpenRun, OpenSession, Refusal, Request, Response, RunGrant, RunSummary,
    SessionSocket,
};

/// Bound on one control call, connection included.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

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
}

/// A handle on the broker's control socket. Cheap to clone; holds no connection.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

// === impl Client ===

impl Client {
    /// A client for the control socket at `socket` (nothing is connected yet).
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
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

    /// Opens a session's socket. The inner `Err` is the broker's policy refusal; the outer
    /// one is a broken channel.
    pub async fn open_session(
        &self,
        req: &OpenSession,
    ) -> Result<Result<SessionSocket, Refusal>, ControlError> {
        match self.call(&Request::OpenSession(req.clone())).await? {
            Response::SessionOpened(socket) => Ok(Ok(socket)),
            Response::Refused(refusal) => Ok(Err(refusal)),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Closes a session's socket (and a grant still lent to it). Closing an unknown session
    /// is [`ControlError::Refused`].
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

    async fn call(&self, request: &Request) -> Result<Response, ControlError> {
        match tokio::time::timeout(CALL_TIMEOUT, self.exchange(request)).await {
            Ok(result) => result,
            Err(_) => Err(ControlError::Timeout {
                path: self.socket.clone(),
            }),
        }
    }

    async fn exchange(&self, request: &Request) -> Result<Response, ControlError> {
        let io = |source| ControlError::Io {
            path: self.socket.clone(),
            source,
        };
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| ControlError::Connect {
                    path: self.socket.clone(),
                    source,
                })?;
        let mut line = serde_json::to_vec(request).map_err(|e| ControlError::BadReply {
            path: self.socket.clone(),
            detail: format!("request not encodable: {e}"),
        })?;
        line.push(b'\n');
        let (read, mut write) = stream.into_split();
        write.write_all(&line).await.map_err(io)?;
        write.flush().await.map_err(io)?;
        let mut reader = BufReader::new(read).take(MAX_LINE_BYTES as u64 + 1);
        let mut answer = Vec::new();
        reader.read_until(b'\n', &mut answer).await.map_err(io)?;
        if answer.is_empty() {
            return Err(ControlError::Closed {
                path: self.socket.clone(),
            });
        }
        if answer.pop() != Some(b'\n') {
            return Err(ControlError::BadReply {
                path: self.socket.clone(),
                detail: "answer line unterminated or too long".into(),
            });
        }
        serde_json::from_slice(&answer).map_err(|e| ControlError::BadReply {
            path: self.socket.clone(),
            detail: e.to_string(),
        })
    }
}
