//! The broker's side of the control channel: a Unix socket only the broker's uid may use
//! (mode 0600), one JSON request per line, one JSON response per line.
//!
//! At most [`MAX_CONNECTIONS`] connections are served at once. A connection beyond them
//! waits (unread, in the order it came) up to [`ADMIT_WAIT`] for one to end, and at most
//! [`MAX_WAITING`] wait; one that gets no turn, or finds the waiting room full, is answered
//! one refusal line, reason `capacity`, and closed. Nothing is dropped without a word.
//! plimsolld's client keeps a small pool of connections (see `client`), so one daemon stays
//! well below the cap; it matters when several daemons share a broker, or one misbehaves.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::protocol::{MAX_LINE_BYTES, Refusal, RefusalReason, Request, Response};
use crate::audit::CloseReason;
use crate::runs::Runs;

/// Control connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// The pause after a failed accept (the process out of descriptors): every listener waits
/// it out rather than spin and starve the runtime's other tasks.
pub const ACCEPT_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);
/// Connections that may wait for a turn beyond [`MAX_CONNECTIONS`].
pub const MAX_WAITING: usize = 64;
/// How long a connection beyond [`MAX_CONNECTIONS`] waits for a turn.
pub const ADMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// The refusal a connection without a turn gets.
const AT_CAPACITY: &str = "the broker's control channel is at capacity; retry shortly";
/// A connection silent this long between requests is closed, freeing its slot.
pub const IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Why the control socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ControlServerError {
    /// Creating the parent directory failed.
    #[error("control socket directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Something that is not a socket is in the way.
    #[error("control socket {path}: exists and is not a socket; refusing to remove it")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Another broker answers on the socket.
    #[error("control socket {path}: another process is listening there")]
    InUse {
        /// The path.
        path: PathBuf,
    },
    /// Binding or setting the mode failed.
    #[error("control socket {path}: {source}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Binds the control socket at `path` with mode 0600.
///
/// The socket is bound under a temporary name, restricted, then renamed into place, so it
/// is never reachable with a wider mode.
pub async fn bind(path: &Path) -> Result<UnixListener, ControlServerError> {
    bind_socket(path, 0o600, 0o700).await
}

/// Binds a socket at `path` with `mode`, creating a missing parent with `dir_mode`; refuses
/// to replace anything but a dead socket. The control socket's rules, for any of the
/// broker's sockets.
pub(crate) async fn bind_socket(
    path: &Path,
    mode: u32,
    dir_mode: u32,
) -> Result<UnixListener, ControlServerError> {
    let bind_err = |source| ControlServerError::Bind {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
        && !parent.exists()
    {
        std::fs::create_dir_all(parent).map_err(|source| ControlServerError::Dir {
            path: parent.to_owned(),
            source,
        })?;
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(dir_mode)).map_err(
            |source| ControlServerError::Dir {
                path: parent.to_owned(),
                source,
            },
        )?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).await.is_ok() {
                return Err(ControlServerError::InUse {
                    path: path.to_owned(),
                });
            }
            std::fs::remove_file(path).map_err(bind_err)?;
        }
        Ok(_) => {
            return Err(ControlServerError::NotASocket {
                path: path.to_owned(),
            });
        }
        Err(_) => {}
    }
    let mut staging = path.as_os_str().to_owned();
    staging.push(format!(".{}.tmp", std::process::id()));
    let staging = PathBuf::from(staging);
    let _ = std::fs::remove_file(&staging);
    let listener = UnixListener::bind(&staging).map_err(bind_err)?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(mode))
        .and_then(|()| std::fs::rename(&staging, path))
        .map_err(|source| {
            let _ = std::fs::remove_file(&staging);
            bind_err(source)
        })?;
    Ok(listener)
}

/// Serves control connections until the task is dropped.
pub async fn serve(listener: UnixListener, runs: Arc<Runs>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let waiting = Arc::new(Semaphore::new(MAX_WAITING));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(ACCEPT_PAUSE).await;
            continue;
        };
        let turn = match slots.clone().try_acquire_owned() {
            Ok(turn) => turn,
            Err(_) => {
                // The waiting room, or a refusal at once.
                let Ok(wait) = waiting.clone().try_acquire_owned() else {
                    refuse(&stream);
                    continue;
                };
                let (runs, slots) = (runs.clone(), slots.clone());
                tokio::spawn(async move {
                    let turn = tokio::time::timeout(ADMIT_WAIT, slots.acquire_owned()).await;
                    drop(wait);
                    match turn {
                        Ok(Ok(turn)) => serve_turn(stream, runs, turn).await,
                        _ => refuse(&stream),
                    }
                });
                continue;
            }
        };
        tokio::spawn(serve_turn(stream, runs.clone(), turn));
    }
}

/// Serves one connection while it holds its turn.
async fn serve_turn(stream: UnixStream, runs: Arc<Runs>, turn: OwnedSemaphorePermit) {
    if let Err(error) = serve_connection(stream, &runs).await {
        tracing::debug!(%error, "control connection ended");
    }
    drop(turn);
}

/// Answers a connection that gets no turn with one `capacity` refusal line, without
/// waiting: a fresh connection's send buffer takes it whole.
fn refuse(stream: &UnixStream) {
    let line = encode(&Response::refused(RefusalReason::Capacity, AT_CAPACITY));
    if stream.try_write(&line).is_err() {
        tracing::debug!("a control connection without a turn closed before its refusal");
    }
    tracing::warn!(
        max = MAX_CONNECTIONS,
        "control connection refused: every turn is taken and the waiting room is full or the wait ran out"
    );
}

async fn serve_connection(stream: UnixStream, runs: &Arc<Runs>) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    loop {
        let mut line = Vec::new();
        let mut limited = (&mut reader).take(MAX_LINE_BYTES as u64 + 1);
        let read = limited.read_until(b'\n', &mut line);
        let Ok(n) = tokio::time::timeout(IDLE_TIMEOUT, read).await else {
            return Ok(());
        };
        let n = n?;
        if n == 0 {
            return Ok(());
        }
        let complete = line.last() == Some(&b'\n');
        if complete {
            line.pop();
        }
        let response = if !complete && line.len() > MAX_LINE_BYTES {
            // Framing is lost: answer once and hang up.
            let answer = encode(&malformed("request line too long"));
            write.write_all(&answer).await?;
            return Ok(());
        } else {
            match serde_json::from_slice::<Request>(&line) {
                Ok(request) => handle(request, runs).await,
                Err(error) => malformed(&format!("malformed request: {error}")),
            }
        };
        write.write_all(&encode(&response)).await?;
        write.flush().await?;
        if !complete {
            return Ok(());
        }
    }
}

async fn handle(request: Request, runs: &Arc<Runs>) -> Response {
    match request {
        Request::Hello => runs.hello(),
        Request::Catalogue => runs.catalogue(),
        Request::Open(open) => runs.open(open),
        Request::Close { run } => runs.close(&run, CloseReason::Closed).await,
        Request::OpenSession(open) => runs.open_session(open),
        Request::CloseSession { session } => {
            runs.close_session(&session, CloseReason::SessionClosed)
                .await
        }
    }
}

fn malformed(message: &str) -> Response {
    Response::Refused(Refusal {
        reason: RefusalReason::Request,
        message: message.to_owned(),
    })
}

fn encode(response: &Response) -> Vec<u8> {
    let mut line = serde_json::to_vec(response).unwrap_or_else(|_| {
        br#"{"status":"refused","reason":"request","message":"unencodable answer"}"#.to_vec()
    });
    line.push(b'\n');
    line
}
