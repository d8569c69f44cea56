//! The broker's side of the control channel: a Unix socket only the broker's uid may use
//! (mode 0600), one JSON request per line, one JSON response per line.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

use super::protocol::{MAX_LINE_BYTES, Refusal, RefusalReason, Request, Response};
use crate::audit::CloseReason;
use crate::runs::Runs;

/// Control connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
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
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o700)).map_err(
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
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))
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
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let runs = runs.clone();
        tokio::spawn(async move {
            if let Err(error) = serve_connection(stream, &runs).await {
                tracing::debug!(%error, "control connection ended");
            }
            drop(permit);
        });
    }
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
